//! `DecisionsTx` on PostgreSQL: decisions, and the escalation policies and delegations that say
//! who answers them.

use async_trait::async_trait;
use serde_json::Value;
use sqlx::types::Json;
use waymark_store::*;

use super::{PgTx, db_err};
use crate::rows::*;

#[async_trait]
impl DecisionsTx for PgTx {
    async fn insert_decision(&mut self, d: &DecisionRow) -> Result<()> {
        self.insert(
            "decisions",
            sqlx::query(
                "INSERT INTO decisions (id, task_id, kind, status, step, question, options,
                   default_option, intent, intent_digest, effect_id, plan_revision, risky, expires_at,
                   created_at, outcome, durability, delivery, editable, runtime_deadline,
                   escalation, escalate_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20,
                   $21, $22)
                 ON CONFLICT DO NOTHING",
            )
            .bind(&d.id)
            .bind(&d.task_id)
            .bind(d.kind.as_str())
            .bind(d.status.as_str())
            .bind(&d.step)
            .bind(&d.question)
            .bind(Json(&d.options))
            .bind(&d.default_option)
            .bind(&d.intent)
            .bind(&d.intent_digest)
            .bind(&d.effect_id)
            .bind(d.plan_revision)
            .bind(d.risky)
            .bind(d.expires_at)
            .bind(d.created_at)
            .bind(d.outcome.as_ref().map(Json))
            .bind(d.durability.map(|x| x.as_str()))
            .bind(d.delivery.as_ref().map(Json))
            .bind(&d.editable)
            .bind(d.runtime_deadline.as_ref().map(Json))
            .bind(d.escalation.as_ref().map(Json))
            .bind(d.escalate_at),
        )
        .await
    }

    async fn decision(&mut self, id: &str) -> Result<Option<DecisionRow>> {
        self.one(
            sqlx::query("SELECT * FROM decisions WHERE id = $1").bind(id),
            decision_row,
        )
        .await
    }

    async fn update_decision(&mut self, d: &DecisionRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "UPDATE decisions SET status = $1, expires_at = $2, outcome = $3, delivery = $4,
                   escalation = $5, escalate_at = $6, durability = $7, runtime_deadline = $8
                 WHERE id = $9",
            )
            .bind(d.status.as_str())
            .bind(d.expires_at)
            .bind(d.outcome.as_ref().map(Json))
            .bind(d.delivery.as_ref().map(Json))
            .bind(d.escalation.as_ref().map(Json))
            .bind(d.escalate_at)
            .bind(d.durability.map(|x| x.as_str()))
            .bind(d.runtime_deadline.as_ref().map(Json))
            .bind(&d.id),
        )
        .await
        .map(drop)
    }

    async fn list_decisions(&mut self, task_id: &str) -> Result<Vec<DecisionRow>> {
        self.all(
            sqlx::query("SELECT * FROM decisions WHERE task_id = $1 ORDER BY created_at, id")
                .bind(task_id),
            decision_row,
        )
        .await
    }

    async fn due_decisions(&mut self, now_ms: i64) -> Result<Vec<DecisionRow>> {
        self.all(
            sqlx::query(
                "SELECT * FROM decisions WHERE status = 'pending' AND expires_at <= $1
                 ORDER BY expires_at, id",
            )
            .bind(now_ms),
            decision_row,
        )
        .await
    }

    async fn due_escalations(&mut self, now_ms: i64) -> Result<Vec<DecisionRow>> {
        self.all(
            sqlx::query(
                "SELECT * FROM decisions WHERE status = 'pending' AND escalate_at <= $1
                 ORDER BY escalate_at, id",
            )
            .bind(now_ms),
            decision_row,
        )
        .await
    }

    async fn escalation_policy(&mut self, user_id: &str) -> Result<Option<EscalationPolicy>> {
        let value: Option<Value> =
            sqlx::query_scalar("SELECT policy FROM escalation_policies WHERE user_id = $1")
                .bind(user_id)
                .fetch_optional(&mut *self.tx)
                .await
                .map_err(db_err)?;
        value
            .map(|v| decode_json_value("escalation_policies.policy", v))
            .transpose()
    }

    async fn put_escalation_policy(
        &mut self,
        user_id: &str,
        policy: &EscalationPolicy,
        now_ms: i64,
    ) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO escalation_policies (user_id, policy, updated_at) VALUES ($1, $2, $3)
                 ON CONFLICT (user_id) DO UPDATE SET policy = excluded.policy,
                   updated_at = excluded.updated_at",
            )
            .bind(user_id)
            .bind(Json(policy))
            .bind(now_ms),
        )
        .await
        .map(drop)
    }

    async fn delete_escalation_policy(&mut self, user_id: &str) -> Result<bool> {
        self.exec(sqlx::query("DELETE FROM escalation_policies WHERE user_id = $1").bind(user_id))
            .await
            .map(|n| n > 0)
    }

    async fn put_delegation(&mut self, d: &DelegationRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO delegations (owner_id, delegate_id, created_at, accepted_at)
                 VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
            )
            .bind(&d.owner_id)
            .bind(&d.delegate_id)
            .bind(d.created_at)
            .bind(d.accepted_at),
        )
        .await
        .map(drop)
    }

    async fn accept_delegation(
        &mut self,
        owner_id: &str,
        delegate_id: &str,
        at: i64,
    ) -> Result<bool> {
        self.exec(
            sqlx::query(
                "UPDATE delegations SET accepted_at = $1
                 WHERE owner_id = $2 AND delegate_id = $3 AND accepted_at IS NULL",
            )
            .bind(at)
            .bind(owner_id)
            .bind(delegate_id),
        )
        .await
        .map(|n| n > 0)
    }

    async fn delete_delegation(&mut self, owner_id: &str, delegate_id: &str) -> Result<bool> {
        self.exec(
            sqlx::query("DELETE FROM delegations WHERE owner_id = $1 AND delegate_id = $2")
                .bind(owner_id)
                .bind(delegate_id),
        )
        .await
        .map(|n| n > 0)
    }

    async fn delegations(
        &mut self,
        owner_id: Option<&str>,
        delegate_id: Option<&str>,
    ) -> Result<Vec<DelegationRow>> {
        self.all(
            sqlx::query(
                "SELECT * FROM delegations WHERE ($1::text IS NULL OR owner_id = $1)
                   AND ($2::text IS NULL OR delegate_id = $2)
                 ORDER BY created_at, owner_id, delegate_id",
            )
            .bind(owner_id)
            .bind(delegate_id),
            delegation_row,
        )
        .await
    }

    async fn pending_decision_count(&mut self, task_id: &str) -> Result<i64> {
        sqlx::query_scalar(
            "SELECT COUNT(*) FROM decisions WHERE task_id = $1 AND status = 'pending'",
        )
        .bind(task_id)
        .fetch_one(&mut *self.tx)
        .await
        .map_err(db_err)
    }
}
