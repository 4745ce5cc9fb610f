//! `TasksTx` on SQLite: tasks, their sessions and their attempts, which leases and fences are
//! checked against.

use async_trait::async_trait;
use waymark_store::*;
use waymark_store_sql as sql;

use super::{SqliteTx, json_list};
use crate::rows::*;

#[async_trait]
impl TasksTx for SqliteTx {
    async fn insert_task(&mut self, t: &TaskRow) -> Result<()> {
        self.insert(sql::tasks::insert_task(t)).await
    }

    async fn task(&mut self, id: &str) -> Result<Option<TaskRow>> {
        self.one(sql::tasks::task(id).query(), task_row).await
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
        match owners {
            Some([o]) => {
                self.all(
                    sqlx::query(
                        "SELECT * FROM tasks WHERE owner_id = ? ORDER BY created_at DESC, id DESC",
                    )
                    .bind(o),
                    task_row,
                )
                .await
            }
            Some(os) => {
                self.all(
                    sqlx::query(
                        "SELECT * FROM tasks WHERE owner_id IN (SELECT value FROM json_each(?))
                         ORDER BY created_at DESC, id DESC",
                    )
                    .bind(json_list(os)),
                    task_row,
                )
                .await
            }
            None => {
                self.all(
                    sqlx::query("SELECT * FROM tasks ORDER BY created_at DESC, id DESC"),
                    task_row,
                )
                .await
            }
        }
    }

    async fn insert_session(&mut self, s: &SessionRow) -> Result<()> {
        self.insert(sql::tasks::insert_session(s)).await
    }

    async fn session(&mut self, id: &str) -> Result<Option<SessionRow>> {
        self.one(sql::tasks::session(id).query(), session_row).await
    }

    async fn insert_attempt(&mut self, a: &AttemptRow) -> Result<()> {
        self.insert(sql::tasks::insert_attempt(a)).await
    }

    async fn attempt(&mut self, id: &str) -> Result<Option<AttemptRow>> {
        self.one(sql::tasks::attempt(id).query(), attempt_row).await
    }

    async fn update_attempt(&mut self, a: &AttemptRow) -> Result<()> {
        self.exec(sql::tasks::update_attempt(a).query())
            .await
            .map(drop)
    }

    async fn list_attempts(&mut self, task_id: &str) -> Result<Vec<AttemptRow>> {
        self.all(sql::tasks::list_attempts(task_id).query(), attempt_row)
            .await
    }

    async fn expired_leases(&mut self, now_ms: i64) -> Result<Vec<AttemptRow>> {
        self.all(sql::tasks::expired_leases(now_ms).query(), attempt_row)
            .await
    }
}
