//! `TasksTx` on SQLite: tasks, their sessions and their attempts, which leases and fences are
//! checked against.

use async_trait::async_trait;
use waymark_store::*;
use waymark_store_sql::{self as sql, Statement};

use super::SqliteTx;
use crate::rows::*;

#[async_trait]
impl TasksTx for SqliteTx {
    async fn insert_task(&mut self, t: &TaskRow) -> Result<()> {
        self.insert(sql::tasks::insert_task(t))
    }

    async fn task(&mut self, id: &str) -> Result<Option<TaskRow>> {
        self.one(sql::tasks::task(id), task_row)
    }

    async fn update_task(&mut self, t: &TaskRow) -> Result<()> {
        self.exec(sql::tasks::update_task(t)).map(drop)
    }

    async fn task_by_external_key(
        &mut self,
        owner_id: &str,
        runtime: &str,
        key: &str,
    ) -> Result<Option<TaskRow>> {
        let q = sql::tasks::task_by_external_key(owner_id, runtime, key);
        self.one(q, task_row)
    }

    async fn list_tasks(&mut self, owners: Option<&[String]>) -> Result<Vec<TaskRow>> {
        match owners {
            Some([o]) => self.all(
                Statement::new(
                    "SELECT * FROM tasks WHERE owner_id = ? ORDER BY created_at DESC, id DESC",
                )
                .bind(o),
                task_row,
            ),
            Some(os) => self.all(
                Statement::new(
                    "SELECT * FROM tasks WHERE owner_id IN (SELECT value FROM json_each(?))
                         ORDER BY created_at DESC, id DESC",
                )
                .json(os),
                task_row,
            ),
            None => self.all(
                Statement::new("SELECT * FROM tasks ORDER BY created_at DESC, id DESC"),
                task_row,
            ),
        }
    }

    async fn insert_session(&mut self, s: &SessionRow) -> Result<()> {
        self.insert(sql::tasks::insert_session(s))
    }

    async fn session(&mut self, id: &str) -> Result<Option<SessionRow>> {
        self.one(sql::tasks::session(id), session_row)
    }

    async fn insert_attempt(&mut self, a: &AttemptRow) -> Result<()> {
        self.insert(sql::tasks::insert_attempt(a))
    }

    async fn attempt(&mut self, id: &str) -> Result<Option<AttemptRow>> {
        self.one(sql::tasks::attempt(id), attempt_row)
    }

    async fn update_attempt(&mut self, a: &AttemptRow) -> Result<()> {
        self.exec(sql::tasks::update_attempt(a)).map(drop)
    }

    async fn list_attempts(&mut self, task_id: &str) -> Result<Vec<AttemptRow>> {
        self.all(sql::tasks::list_attempts(task_id), attempt_row)
    }

    async fn expired_leases(&mut self, now_ms: i64) -> Result<Vec<AttemptRow>> {
        self.all(sql::tasks::expired_leases(now_ms), attempt_row)
    }
}
