//! `TasksTx` on SQLite: tasks, their sessions and their attempts, which leases and fences are
//! checked against.

use std::sync::LazyLock;

use async_trait::async_trait;
use waymark_store::*;

use super::{SqliteTx, json_list};
use crate::rows::*;

#[async_trait]
impl TasksTx for SqliteTx {
    async fn insert_task(&mut self, t: &TaskRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO tasks (id, owner_id, title, goal, runtime, state, plan, plan_revision,
                   budget, usage, materials, session_id, fence, outcome_summary, created_at, updated_at, parent_id,
                   external_key, machine_id)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(&t.id)
            .bind(&t.owner_id)
            .bind(&t.title)
            .bind(&t.goal)
            .bind(&t.runtime)
            .bind(t.state.as_str())
            .bind(json_text(&t.plan))
            .bind(t.plan_revision)
            .bind(json_text(&t.budget))
            .bind(json_text(&t.usage))
            .bind(json_text(&t.materials))
            .bind(&t.session_id)
            .bind(t.fence)
            .bind(&t.outcome_summary)
            .bind(t.created_at)
            .bind(t.updated_at)
            .bind(&t.parent_id)
            .bind(&t.external_key)
            .bind(&t.machine_id),
        )
        .await
        .map(drop)
    }

    async fn task(&mut self, id: &str) -> Result<Option<TaskRow>> {
        self.one(
            sqlx::query("SELECT * FROM tasks WHERE id = ?").bind(id),
            task_row,
        )
        .await
    }

    async fn update_task(&mut self, t: &TaskRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "UPDATE tasks SET title = ?, goal = ?, runtime = ?, state = ?, plan = ?,
                   plan_revision = ?, budget = ?, usage = ?, materials = ?, fence = ?,
                   outcome_summary = ?, updated_at = ?, parent_id = ?
                 WHERE id = ?",
            )
            .bind(&t.title)
            .bind(&t.goal)
            .bind(&t.runtime)
            .bind(t.state.as_str())
            .bind(json_text(&t.plan))
            .bind(t.plan_revision)
            .bind(json_text(&t.budget))
            .bind(json_text(&t.usage))
            .bind(json_text(&t.materials))
            .bind(t.fence)
            .bind(&t.outcome_summary)
            .bind(t.updated_at)
            .bind(&t.parent_id)
            .bind(&t.id),
        )
        .await
        .map(drop)
    }

    async fn task_by_external_key(
        &mut self,
        owner_id: &str,
        runtime: &str,
        key: &str,
    ) -> Result<Option<TaskRow>> {
        self.one(
            sqlx::query(
                "SELECT * FROM tasks WHERE owner_id = ? AND runtime = ? AND external_key = ?",
            )
            .bind(owner_id)
            .bind(runtime)
            .bind(key),
            task_row,
        )
        .await
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
        self.exec(
            sqlx::query(
                "INSERT INTO sessions (id, task_id, parent_id, created_at) VALUES (?, ?, ?, ?)",
            )
            .bind(&s.id)
            .bind(&s.task_id)
            .bind(&s.parent_id)
            .bind(s.created_at),
        )
        .await
        .map(drop)
    }

    async fn session(&mut self, id: &str) -> Result<Option<SessionRow>> {
        self.one(
            sqlx::query("SELECT * FROM sessions WHERE id = ?").bind(id),
            session_row,
        )
        .await
    }

    async fn insert_attempt(&mut self, a: &AttemptRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO attempts (id, task_id, worker, fence, expires_at, state, manifest_digest,
                   started_at, ended_at, outcome, released)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(&a.id)
            .bind(&a.task_id)
            .bind(&a.worker)
            .bind(a.fence)
            .bind(a.expires_at)
            .bind(a.state.as_str())
            .bind(&a.manifest_digest)
            .bind(a.started_at)
            .bind(a.ended_at)
            .bind(a.outcome.map(|x| x.as_str()))
            .bind(a.released.as_ref().map(json_text)),
        )
        .await
        .map(drop)
    }

    async fn attempt(&mut self, id: &str) -> Result<Option<AttemptRow>> {
        self.one(
            sqlx::query("SELECT * FROM attempts WHERE id = ?").bind(id),
            attempt_row,
        )
        .await
    }

    async fn update_attempt(&mut self, a: &AttemptRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "UPDATE attempts SET expires_at = ?, state = ?, ended_at = ?, outcome = ?, released = ?
                 WHERE id = ?",
            )
            .bind(a.expires_at)
            .bind(a.state.as_str())
            .bind(a.ended_at)
            .bind(a.outcome.map(|x| x.as_str()))
            .bind(a.released.as_ref().map(json_text))
            .bind(&a.id),
        )
        .await
        .map(drop)
    }

    async fn list_attempts(&mut self, task_id: &str) -> Result<Vec<AttemptRow>> {
        self.all(
            sqlx::query("SELECT * FROM attempts WHERE task_id = ? ORDER BY fence").bind(task_id),
            attempt_row,
        )
        .await
    }

    async fn expired_leases(&mut self, now_ms: i64) -> Result<Vec<AttemptRow>> {
        static SQL: LazyLock<String> = LazyLock::new(|| {
            format!(
                "SELECT a.* FROM attempts a JOIN tasks t ON t.id = a.task_id
                 WHERE a.state = 'active' AND a.expires_at <= ?
                   AND t.state IN ({})
                 ORDER BY a.expires_at, a.id",
                TaskState::lease_sweepable_sql()
            )
        });
        self.all(sqlx::query(SQL.as_str()).bind(now_ms), attempt_row)
            .await
    }
}
