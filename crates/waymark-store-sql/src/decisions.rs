//! `DecisionsTx`'s statements: decisions, and the escalation policies and delegations that say
//! who answers them. All of them are the same on both backends.

use waymark_store::{DecisionRow, DelegationRow, EscalationPolicy};

use crate::{Insert, Statement, insert};

pub fn insert_decision(d: &DecisionRow) -> Insert<'_> {
    insert!(
        "INSERT INTO decisions (id, task_id, kind, status, step, question, options,
           default_option, intent, intent_digest, effect_id, plan_revision, risky, expires_at,
           created_at, outcome, durability, delivery, editable, runtime_deadline,
           escalation, escalate_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18,
           $19, $20, $21, $22)"
    )
    .bind(&d.id)
    .bind(&d.task_id)
    .bind(d.kind.as_str())
    .bind(d.status.as_str())
    .bind(&d.step)
    .bind(&d.question)
    .json(&d.options)
    .bind(&d.default_option)
    .opt_json(d.intent.as_ref())
    .bind(&d.intent_digest)
    .bind(&d.effect_id)
    .bind(d.plan_revision)
    .bind(d.risky)
    .bind(d.expires_at)
    .bind(d.created_at)
    .opt_json(d.outcome.as_ref())
    .bind(d.durability.map(|x| x.as_str()))
    .opt_json(d.delivery.as_ref())
    .bind(&d.editable)
    .opt_json(d.runtime_deadline.as_ref())
    .opt_json(d.escalation.as_ref())
    .bind(d.escalate_at)
}

pub fn decision(id: &str) -> Statement<'_> {
    Statement::new("SELECT * FROM decisions WHERE id = $1").bind(id)
}

pub fn update_decision(d: &DecisionRow) -> Statement<'_> {
    Statement::new(
        "UPDATE decisions SET status = $1, expires_at = $2, outcome = $3, delivery = $4,
           escalation = $5, escalate_at = $6, durability = $7, runtime_deadline = $8
         WHERE id = $9",
    )
    .bind(d.status.as_str())
    .bind(d.expires_at)
    .opt_json(d.outcome.as_ref())
    .opt_json(d.delivery.as_ref())
    .opt_json(d.escalation.as_ref())
    .bind(d.escalate_at)
    .bind(d.durability.map(|x| x.as_str()))
    .opt_json(d.runtime_deadline.as_ref())
    .bind(&d.id)
}

pub fn list_decisions(task_id: &str) -> Statement<'_> {
    Statement::new("SELECT * FROM decisions WHERE task_id = $1 ORDER BY created_at, id")
        .bind(task_id)
}

pub fn due_decisions(now_ms: i64) -> Statement<'static> {
    Statement::new(
        "SELECT * FROM decisions WHERE status = 'pending' AND expires_at <= $1
         ORDER BY expires_at, id",
    )
    .bind(now_ms)
}

pub fn due_escalations(now_ms: i64) -> Statement<'static> {
    Statement::new(
        "SELECT * FROM decisions WHERE status = 'pending' AND escalate_at <= $1
         ORDER BY escalate_at, id",
    )
    .bind(now_ms)
}

pub fn escalation_policy(user_id: &str) -> Statement<'_> {
    Statement::new("SELECT policy FROM escalation_policies WHERE user_id = $1").bind(user_id)
}

pub fn put_escalation_policy<'a>(
    user_id: &'a str,
    policy: &EscalationPolicy,
    now_ms: i64,
) -> Statement<'a> {
    Statement::new(
        "INSERT INTO escalation_policies (user_id, policy, updated_at) VALUES ($1, $2, $3)
         ON CONFLICT (user_id) DO UPDATE SET policy = excluded.policy,
           updated_at = excluded.updated_at",
    )
    .bind(user_id)
    .json(policy)
    .bind(now_ms)
}

pub fn delete_escalation_policy(user_id: &str) -> Statement<'_> {
    Statement::new("DELETE FROM escalation_policies WHERE user_id = $1").bind(user_id)
}

/// Writes no row for a delegation that exists.
pub fn put_delegation(d: &DelegationRow) -> Statement<'_> {
    Statement::new(
        "INSERT INTO delegations (owner_id, delegate_id, created_at, accepted_at)
         VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
    )
    .bind(&d.owner_id)
    .bind(&d.delegate_id)
    .bind(d.created_at)
    .bind(d.accepted_at)
}

pub fn accept_delegation<'a>(owner_id: &'a str, delegate_id: &'a str, at: i64) -> Statement<'a> {
    Statement::new(
        "UPDATE delegations SET accepted_at = $1
         WHERE owner_id = $2 AND delegate_id = $3 AND accepted_at IS NULL",
    )
    .bind(at)
    .bind(owner_id)
    .bind(delegate_id)
}

pub fn delete_delegation<'a>(owner_id: &'a str, delegate_id: &'a str) -> Statement<'a> {
    Statement::new("DELETE FROM delegations WHERE owner_id = $1 AND delegate_id = $2")
        .bind(owner_id)
        .bind(delegate_id)
}

/// `None` matches every owner (delegate).
pub fn delegations<'a>(owner_id: Option<&'a str>, delegate_id: Option<&'a str>) -> Statement<'a> {
    Statement::new(
        "SELECT * FROM delegations WHERE (CAST($1 AS TEXT) IS NULL OR owner_id = $1)
           AND (CAST($2 AS TEXT) IS NULL OR delegate_id = $2)
         ORDER BY created_at, owner_id, delegate_id",
    )
    .bind(owner_id)
    .bind(delegate_id)
}

pub fn pending_decision_count(task_id: &str) -> Statement<'_> {
    Statement::new("SELECT COUNT(*) FROM decisions WHERE task_id = $1 AND status = 'pending'")
        .bind(task_id)
}
