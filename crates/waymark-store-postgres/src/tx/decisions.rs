//! `DecisionsTx` on PostgreSQL: decisions, and the escalation policies and delegations that say
//! who answers them.

use async_trait::async_trait;
use serde_json::Value;
use waymark_store::*;
use waymark_store_sql as sql;

use super::{PgTx, db_err};
use crate::rows::*;

#[async_trait]
impl DecisionsTx for PgTx {
    async fn insert_decision(&mut self, d: &DecisionRow) -> Result<()> {
        self.insert("decisions", sql::decisions::insert_decision(d))
            .await
    }

    async fn decision(&mut self, id: &str) -> Result<Option<DecisionRow>> {
        self.one(sql::decisions::decision(id).query(), decision_row)
            .await
    }

    async fn update_decision(&mut self, d: &DecisionRow) -> Result<()> {
        self.exec(sql::decisions::update_decision(d).query())
            .await
            .map(drop)
    }

    async fn list_decisions(&mut self, task_id: &str) -> Result<Vec<DecisionRow>> {
        self.all(
            sql::decisions::list_decisions(task_id).query(),
            decision_row,
        )
        .await
    }

    async fn due_decisions(&mut self, now_ms: i64) -> Result<Vec<DecisionRow>> {
        self.all(sql::decisions::due_decisions(now_ms).query(), decision_row)
            .await
    }

    async fn due_escalations(&mut self, now_ms: i64) -> Result<Vec<DecisionRow>> {
        self.all(
            sql::decisions::due_escalations(now_ms).query(),
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
        let q = sql::decisions::put_escalation_policy(user_id, policy, now_ms);
        self.exec(q.query()).await.map(drop)
    }

    async fn delete_escalation_policy(&mut self, user_id: &str) -> Result<bool> {
        let q = sql::decisions::delete_escalation_policy(user_id);
        Ok(self.exec(q.query()).await? > 0)
    }

    async fn put_delegation(&mut self, d: &DelegationRow) -> Result<()> {
        self.exec(sql::decisions::put_delegation(d).query())
            .await
            .map(drop)
    }

    async fn accept_delegation(
        &mut self,
        owner_id: &str,
        delegate_id: &str,
        at: i64,
    ) -> Result<bool> {
        let q = sql::decisions::accept_delegation(owner_id, delegate_id, at);
        Ok(self.exec(q.query()).await? > 0)
    }

    async fn delete_delegation(&mut self, owner_id: &str, delegate_id: &str) -> Result<bool> {
        let q = sql::decisions::delete_delegation(owner_id, delegate_id);
        Ok(self.exec(q.query()).await? > 0)
    }

    async fn delegations(
        &mut self,
        owner_id: Option<&str>,
        delegate_id: Option<&str>,
    ) -> Result<Vec<DelegationRow>> {
        let q = sql::decisions::delegations(owner_id, delegate_id);
        self.all(q.query(), delegation_row).await
    }

    async fn pending_decision_count(&mut self, task_id: &str) -> Result<i64> {
        sql::decisions::pending_decision_count(task_id)
            .query_scalar()
            .fetch_one(&mut *self.tx)
            .await
            .map_err(db_err)
    }
}
