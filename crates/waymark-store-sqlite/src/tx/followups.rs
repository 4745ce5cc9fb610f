//! `FollowupsTx` on SQLite: scheduled follow-ups, and the runs that make each nominal time fire
//! once.

use async_trait::async_trait;
use waymark_store::*;
use waymark_store_sql as sql;

use super::SqliteTx;
use crate::rows::*;

#[async_trait]
impl FollowupsTx for SqliteTx {
    async fn insert_followup(&mut self, f: &FollowupRow) -> Result<()> {
        self.exec(sql::followups::insert_followup(f)).map(drop)
    }

    async fn followup(&mut self, id: &str) -> Result<Option<FollowupRow>> {
        self.one(sql::followups::followup(id), followup_row)
    }

    async fn update_followup(&mut self, f: &FollowupRow) -> Result<()> {
        self.exec(sql::followups::update_followup(f)).map(drop)
    }

    async fn due_followups(&mut self, now_ms: i64) -> Result<Vec<FollowupRow>> {
        self.all(sql::followups::due_followups(now_ms), followup_row)
    }

    async fn list_followups(&mut self, task_id: &str) -> Result<Vec<FollowupRow>> {
        self.all(sql::followups::list_followups(task_id), followup_row)
    }

    async fn insert_followup_run(
        &mut self,
        followup_id: &str,
        nominal_at: i64,
        ran_at: i64,
        missed: i64,
    ) -> Result<bool> {
        let q = sql::followups::insert_followup_run(followup_id, nominal_at, ran_at, missed);
        Ok(self.exec(q)? == 1)
    }
}
