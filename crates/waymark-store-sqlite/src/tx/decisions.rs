//! `DecisionsTx` on SQLite: decisions, and the escalation policies and delegations that say who
//! answers them.

use async_trait::async_trait;
use waymark_store::*;
use waymark_store_sql as sql;

use super::SqliteTx;
use crate::rows::*;

#[async_trait]
impl DecisionsTx for SqliteTx {
    async fn insert_decision(&mut self, d: &DecisionRow) -> Result<()> {
        self.insert(sql::decisions::insert_decision(d))
    }

    async fn decision(&mut self, id: &str) -> Result<Option<DecisionRow>> {
        self.one(sql::decisions::decision(id), decision_row)
    }

    async fn update_decision(&mut self, d: &DecisionRow) -> Result<()> {
        self.exec(sql::decisions::update_decision(d)).map(drop)
    }

    async fn list_decisions(&mut self, task_id: &str) -> Result<Vec<DecisionRow>> {
        self.all(sql::decisions::list_decisions(task_id), decision_row)
    }

    async fn due_decisions(&mut self, now_ms: i64) -> Result<Vec<DecisionRow>> {
        self.all(sql::decisions::due_decisions(now_ms), decision_row)
    }

    async fn due_escalations(&mut self, now_ms: i64) -> Result<Vec<DecisionRow>> {
        self.all(sql::decisions::due_escalations(now_ms), decision_row)
    }

    async fn escalation_policy(&mut self, user_id: &str) -> Result<Option<EscalationPolicy>> {
        let text: Option<String> = self.scalar_opt(sql::decisions::escalation_policy(user_id))?;
        text.map(|t| decode_json("escalation_policies.policy", &t))
            .transpose()
    }

    async fn put_escalation_policy(
        &mut self,
        user_id: &str,
        policy: &EscalationPolicy,
        now_ms: i64,
    ) -> Result<()> {
        let q = sql::decisions::put_escalation_policy(user_id, policy, now_ms);
        self.exec(q).map(drop)
    }

    async fn delete_escalation_policy(&mut self, user_id: &str) -> Result<bool> {
        let q = sql::decisions::delete_escalation_policy(user_id);
        Ok(self.exec(q)? > 0)
    }

    async fn put_delegation(&mut self, d: &DelegationRow) -> Result<()> {
        self.exec(sql::decisions::put_delegation(d)).map(drop)
    }

    async fn accept_delegation(
        &mut self,
        owner_id: &str,
        delegate_id: &str,
        at: i64,
    ) -> Result<bool> {
        let q = sql::decisions::accept_delegation(owner_id, delegate_id, at);
        Ok(self.exec(q)? > 0)
    }

    async fn delete_delegation(&mut self, owner_id: &str, delegate_id: &str) -> Result<bool> {
        let q = sql::decisions::delete_delegation(owner_id, delegate_id);
        Ok(self.exec(q)? > 0)
    }

    async fn delegations(
        &mut self,
        owner_id: Option<&str>,
        delegate_id: Option<&str>,
    ) -> Result<Vec<DelegationRow>> {
        let q = sql::decisions::delegations(owner_id, delegate_id);
        self.all(q, delegation_row)
    }

    async fn pending_decision_count(&mut self, task_id: &str) -> Result<i64> {
        self.scalar(sql::decisions::pending_decision_count(task_id))
    }
}
