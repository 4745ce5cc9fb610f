//! `FollowupsTx` on PostgreSQL: scheduled follow-ups, and the runs that make each nominal time fire
//! once.

use async_trait::async_trait;
use waymark_store::*;

use super::PgTx;
use crate::rows::*;

#[async_trait]
impl FollowupsTx for PgTx {
    async fn insert_followup(&mut self, f: &FollowupRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO followups (id, task_id, schedule, time_zone, catch_up, message, state,
                   next_run_at, last_run_at, runs, missed, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
            )
            .bind(&f.id)
            .bind(&f.task_id)
            .bind(&f.schedule)
            .bind(&f.time_zone)
            .bind(f.catch_up.as_str())
            .bind(&f.message)
            .bind(f.state.as_str())
            .bind(f.next_run_at)
            .bind(f.last_run_at)
            .bind(f.runs)
            .bind(f.missed)
            .bind(f.created_at),
        )
        .await
        .map(drop)
    }

    async fn followup(&mut self, id: &str) -> Result<Option<FollowupRow>> {
        self.one(
            sqlx::query("SELECT * FROM followups WHERE id = $1").bind(id),
            followup_row,
        )
        .await
    }

    async fn update_followup(&mut self, f: &FollowupRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "UPDATE followups SET state = $1, next_run_at = $2, last_run_at = $3, runs = $4,
                   missed = $5
                 WHERE id = $6",
            )
            .bind(f.state.as_str())
            .bind(f.next_run_at)
            .bind(f.last_run_at)
            .bind(f.runs)
            .bind(f.missed)
            .bind(&f.id),
        )
        .await
        .map(drop)
    }

    async fn due_followups(&mut self, now_ms: i64) -> Result<Vec<FollowupRow>> {
        self.all(
            sqlx::query(
                "SELECT * FROM followups WHERE state = 'active' AND next_run_at <= $1
                 ORDER BY next_run_at, id",
            )
            .bind(now_ms),
            followup_row,
        )
        .await
    }

    async fn list_followups(&mut self, task_id: &str) -> Result<Vec<FollowupRow>> {
        self.all(
            sqlx::query("SELECT * FROM followups WHERE task_id = $1 ORDER BY created_at, id")
                .bind(task_id),
            followup_row,
        )
        .await
    }

    async fn insert_followup_run(
        &mut self,
        followup_id: &str,
        nominal_at: i64,
        ran_at: i64,
        missed: i64,
    ) -> Result<bool> {
        let n = self
            .exec(
                sqlx::query(
                    "INSERT INTO followup_runs (followup_id, nominal_at, ran_at, missed)
                     VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
                )
                .bind(followup_id)
                .bind(nominal_at)
                .bind(ran_at)
                .bind(missed),
            )
            .await?;
        Ok(n == 1)
    }
}
