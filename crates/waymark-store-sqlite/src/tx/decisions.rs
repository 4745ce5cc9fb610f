//! `DecisionsTx` on SQLite: decisions, and the escalation policies and delegations that say who
//! answers them.

use async_trait::async_trait;
use waymark_store::*;

use super::SqliteTx;
use crate::rows::*;

#[async_trait]
impl DecisionsTx for SqliteTx {
    async fn insert_decision(&mut self, d: &DecisionRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO decisions (id, task_id, kind, status, step, question, options,
                   default_option, intent, intent_digest, effect_id, plan_revision, risky, expires_at,
                   created_at, outcome, durability, delivery, editable, runtime_deadline,
                   escalation, escalate_at)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(&d.id)
            .bind(&d.task_id)
            .bind(d.kind.as_str())
            .bind(d.status.as_str())
            .bind(&d.step)
            .bind(&d.question)
            .bind(json_text(&d.options))
            .bind(&d.default_option)
            .bind(d.intent.as_ref().map(json_text))
            .bind(&d.intent_digest)
            .bind(&d.effect_id)
            .bind(d.plan_revision)
            .bind(d.risky)
            .bind(d.expires_at)
            .bind(d.created_at)
            .bind(d.outcome.as_ref().map(json_text))
            .bind(d.durability.map(|x| x.as_str()))
            .bind(d.delivery.as_ref().map(json_text))
            .bind(&d.editable)
            .bind(d.runtime_deadline.as_ref().map(json_text))
            .bind(d.escalation.as_ref().map(json_text))
            .bind(d.escalate_at),
        )
        .await
        .map(drop)
    }

    async fn decision(&mut self, id: &str) -> Result<Option<DecisionRow>> {
        self.one(
            sqlx::query("SELECT * FROM decisions WHERE id = ?").bind(id),
            decision_row,
        )
        .await
    }

    async fn update_decision(&mut self, d: &DecisionRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "UPDATE decisions SET status = ?, expires_at = ?, outcome = ?, delivery = ?,
                   escalation = ?, escalate_at = ?, durability = ?, runtime_deadline = ?
                 WHERE id = ?",
            )
            .bind(d.status.as_str())
            .bind(d.expires_at)
            .bind(d.outcome.as_ref().map(json_text))
            .bind(d.delivery.as_ref().map(json_text))
            .bind(d.escalation.as_ref().map(json_text))
            .bind(d.escalate_at)
            .bind(d.durability.map(|x| x.as_str()))
            .bind(d.runtime_deadline.as_ref().map(json_text))
            .bind(&d.id),
        )
        .await
        .map(drop)
    }

    async fn list_decisions(&mut self, task_id: &str) -> Result<Vec<DecisionRow>> {
        self.all(
            sqlx::query("SELECT * FROM decisions WHERE task_id = ? ORDER BY created_at, id")
                .bind(task_id),
            decision_row,
        )
        .await
    }

    async fn due_decisions(&mut self, now_ms: i64) -> Result<Vec<DecisionRow>> {
        self.all(
            sqlx::query(
                "SELECT * FROM decisions WHERE status = 'pending' AND expires_at <= ?
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
                "SELECT * FROM decisions WHERE status = 'pending' AND escalate_at <= ?
                 ORDER BY escalate_at, id",
            )
            .bind(now_ms),
            decision_row,
        )
        .await
    }

    async fn escalation_policy(&mut self, user_id: &str) -> Result<Option<EscalationPolicy>> {
        let text: Option<String> =
            sqlx::query_scalar("SELECT policy FROM escalation_policies WHERE user_id = ?")
                .bind(user_id)
                .fetch_optional(self.db())
                .await
                .map_err(backend)?;
        text.map(|t| decode_json("escalation_policies.policy", &t))
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
                "INSERT INTO escalation_policies (user_id, policy, updated_at) VALUES (?, ?, ?)
                 ON CONFLICT (user_id) DO UPDATE SET policy = excluded.policy,
                   updated_at = excluded.updated_at",
            )
            .bind(user_id)
            .bind(json_text(policy))
            .bind(now_ms),
        )
        .await
        .map(drop)
    }

    async fn delete_escalation_policy(&mut self, user_id: &str) -> Result<bool> {
        self.exec(sqlx::query("DELETE FROM escalation_policies WHERE user_id = ?").bind(user_id))
            .await
            .map(|n| n > 0)
    }

    async fn put_delegation(&mut self, d: &DelegationRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO delegations (owner_id, delegate_id, created_at, accepted_at)
                 VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
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
                "UPDATE delegations SET accepted_at = ?
                 WHERE owner_id = ? AND delegate_id = ? AND accepted_at IS NULL",
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
            sqlx::query("DELETE FROM delegations WHERE owner_id = ? AND delegate_id = ?")
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
                "SELECT * FROM delegations WHERE (?1 IS NULL OR owner_id = ?1)
                   AND (?2 IS NULL OR delegate_id = ?2)
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
            "SELECT COUNT(*) FROM decisions WHERE task_id = ? AND status = 'pending'",
        )
        .bind(task_id)
        .fetch_one(self.db())
        .await
        .map_err(backend)
    }
}
