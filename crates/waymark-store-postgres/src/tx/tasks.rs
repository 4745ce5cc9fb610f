//! `TasksTx` on PostgreSQL: tasks, their sessions and their attempts. A write transaction's `task`
//! locks the row (`FOR UPDATE`), which serialises every rule on a task across replicas.

use async_trait::async_trait;
use waymark_store::*;
use waymark_store_sql as sql;

use super::PgTx;
use crate::rows::*;

#[async_trait]
impl TasksTx for PgTx {
    async fn insert_task(&mut self, t: &TaskRow) -> Result<()> {
        self.insert("tasks", sql::tasks::insert_task(t)).await
    }

    async fn task(&mut self, id: &str) -> Result<Option<TaskRow>> {
        // In a write transaction the task row is locked until commit: every read-check-write
        // on a task (lease, fence, sequence, plan revision) serialises across replicas.
        let q = if self.is_write() {
            sqlx::query("SELECT * FROM tasks WHERE id = $1 FOR UPDATE").bind(id)
        } else {
            sql::tasks::task(id).query()
        };
        self.one(q, task_row).await
    }

    async fn update_task(&mut self, t: &TaskRow) -> Result<()> {
        self.exec(sql::tasks::update_task(t).query())
            .await
            .map(drop)
    }

    async fn task_by_external_key(
        &mut self,
        owner_id: &str,
        runtime: &str,
        key: &str,
    ) -> Result<Option<TaskRow>> {
        let q = sql::tasks::task_by_external_key(owner_id, runtime, key);
        self.one(q.query(), task_row).await
    }

    async fn list_tasks(&mut self, owners: Option<&[String]>) -> Result<Vec<TaskRow>> {
        self.all(
            sqlx::query(
                "SELECT * FROM tasks WHERE ($1::text[] IS NULL OR owner_id = ANY($1))
                 ORDER BY created_at DESC, id DESC",
            )
            .bind(owners),
            task_row,
        )
        .await
    }

    async fn insert_session(&mut self, s: &SessionRow) -> Result<()> {
        self.insert("sessions", sql::tasks::insert_session(s)).await
    }

    async fn session(&mut self, id: &str) -> Result<Option<SessionRow>> {
        self.one(sql::tasks::session(id).query(), session_row).await
    }

    async fn insert_attempt(&mut self, a: &AttemptRow) -> Result<()> {
        self.insert("attempts", sql::tasks::insert_attempt(a)).await
    }

    async fn attempt(&mut self, id: &str) -> Result<Option<AttemptRow>> {
        self.one(sql::tasks::attempt(id).query(), attempt_row).await
    }

    async fn update_attempt(&mut self, a: &AttemptRow) -> Result<()> {
        self.exec(sql::tasks::update_attempt(a).query())
            .await
            .map(drop)
    }

    async fn expired_leases(&mut self, now_ms: i64) -> Result<Vec<AttemptRow>> {
        self.all(sql::tasks::expired_leases(now_ms).query(), attempt_row)
            .await
    }

    async fn list_attempts(&mut self, task_id: &str) -> Result<Vec<AttemptRow>> {
        self.all(sql::tasks::list_attempts(task_id).query(), attempt_row)
            .await
    }
}
