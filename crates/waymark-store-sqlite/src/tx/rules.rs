//! `RulesTx` on SQLite: a user's standing rules and their use counts.

use async_trait::async_trait;
use waymark_store::*;
use waymark_store_sql as sql;

use super::SqliteTx;
use crate::rows::*;

#[async_trait]
impl RulesTx for SqliteTx {
    async fn insert_rule(&mut self, r: &RuleRow) -> Result<()> {
        self.insert(sql::rules::insert_rule(r))
    }

    async fn rule(&mut self, id: &str) -> Result<Option<RuleRow>> {
        self.one(sql::rules::rule(id), rule_row)
    }

    async fn list_rules(
        &mut self,
        owner_id: &str,
        live_at: Option<i64>,
        limit: i64,
    ) -> Result<Vec<RuleRow>> {
        let q = sql::rules::list_rules(owner_id, live_at, limit);
        self.all(q, rule_row)
    }

    async fn revoke_rule(&mut self, id: &str, at: i64, device_id: &str) -> Result<bool> {
        let n = self.exec(sql::rules::revoke_rule(id, at, device_id))?;
        Ok(n == 1)
    }

    async fn count_rule_use(&mut self, id: &str, at: i64) -> Result<()> {
        self.exec(sql::rules::count_rule_use(id, at)).map(drop)
    }
}
