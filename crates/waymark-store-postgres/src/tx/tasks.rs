//! `TasksTx` on PostgreSQL: tasks, their sessions and their attempts. A write transaction's `task`
//! locks the row (`FOR UPDATE`), which serialises every rule on a task across replicas.

use std::sync::LazyLock;

use async_trait::async_trait;
use sqlx::types::Json;
use waymark_store::*;

use super::PgTx;
use crate::rows::*;

#[async_trait]
impl TasksTx for PgTx {
    async fn insert_task(&mut self, t: &TaskRow) -> Result<()> {
        self.insert(
            "tasks",
            sqlx::query(
                "INSERT INTO tasks (id, owner_id, title, goal, runtime, state, plan, plan_revision,
                   budget, usage, materials, session_id, fence, outcome_summary, created_at, updated_at, parent_id,
                   external_key, machine_id)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)
                 ON CONFLICT DO NOTHING",
            )
            .bind(&t.id)
            .bind(&t.owner_id)
            .bind(&t.title)
            .bind(&t.goal)
            .bind(&t.runtime)
            .bind(t.state.as_str())
            .bind(Json(&t.plan))
            .bind(t.plan_revision)
            .bind(Json(&t.budget))
            .bind(Json(&t.usage))
            .bind(Json(&t.materials))
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
    }

    async fn task(&mut self, id: &str) -> Result<Option<TaskRow>> {
        // In a write transaction the task row is locked until commit: every read-check-write
        // on a task (lease, fence, sequence, plan revision) serialises across replicas.
        let sql = if self.is_write() {
            "SELECT * FROM tasks WHERE id = $1 FOR UPDATE"
        } else {
            "SELECT * FROM tasks WHERE id = $1"
        };
        self.one(sqlx::query(sql).bind(id), task_row).await
    }

    async fn update_task(&mut self, t: &TaskRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "UPDATE tasks SET title = $1, goal = $2, runtime = $3, state = $4, plan = $5,
                   plan_revision = $6, budget = $7, usage = $8, materials = $9, fence = $10,
                   outcome_summary = $11, updated_at = $12, parent_id = $13
                 WHERE id = $14",
            )
            .bind(&t.title)
            .bind(&t.goal)
            .bind(&t.runtime)
            .bind(t.state.as_str())
            .bind(Json(&t.plan))
            .bind(t.plan_revision)
            .bind(Json(&t.budget))
            .bind(Json(&t.usage))
            .bind(Json(&t.materials))
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
                "SELECT * FROM tasks WHERE owner_id = $1 AND runtime = $2 AND external_key = $3",
            )
            .bind(owner_id)
            .bind(runtime)
            .bind(key),
            task_row,
        )
        .await
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
        self.insert(
            "sessions",
            sqlx::query(
                "INSERT INTO sessions (id, task_id, parent_id, created_at) VALUES ($1, $2, $3, $4)
                 ON CONFLICT DO NOTHING",
            )
            .bind(&s.id)
            .bind(&s.task_id)
            .bind(&s.parent_id)
            .bind(s.created_at),
        )
        .await
    }

    async fn session(&mut self, id: &str) -> Result<Option<SessionRow>> {
        self.one(
            sqlx::query("SELECT * FROM sessions WHERE id = $1").bind(id),
            session_row,
        )
        .await
    }

    async fn insert_attempt(&mut self, a: &AttemptRow) -> Result<()> {
        self.insert(
            "attempts",
            sqlx::query(
                "INSERT INTO attempts (id, task_id, worker, fence, expires_at, state, manifest_digest,
                   started_at, ended_at, outcome, released)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) ON CONFLICT DO NOTHING",
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
            .bind(a.released.as_ref().map(Json)),
        )
        .await
    }

    async fn attempt(&mut self, id: &str) -> Result<Option<AttemptRow>> {
        self.one(
            sqlx::query("SELECT * FROM attempts WHERE id = $1").bind(id),
            attempt_row,
        )
        .await
    }

    async fn update_attempt(&mut self, a: &AttemptRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "UPDATE attempts SET expires_at = $1, state = $2, ended_at = $3, outcome = $4,
                   released = $5
                 WHERE id = $6",
            )
            .bind(a.expires_at)
            .bind(a.state.as_str())
            .bind(a.ended_at)
            .bind(a.outcome.map(|x| x.as_str()))
            .bind(a.released.as_ref().map(Json))
            .bind(&a.id),
        )
        .await
        .map(drop)
    }

    async fn expired_leases(&mut self, now_ms: i64) -> Result<Vec<AttemptRow>> {
        static SQL: LazyLock<String> = LazyLock::new(|| {
            format!(
                "SELECT a.* FROM attempts a JOIN tasks t ON t.id = a.task_id
                 WHERE a.state = 'active' AND a.expires_at <= $1
                   AND t.state IN ({})
                 ORDER BY a.expires_at, a.id",
                TaskState::lease_sweepable_sql()
            )
        });
        self.all(sqlx::query(SQL.as_str()).bind(now_ms), attempt_row)
            .await
    }

    async fn list_attempts(&mut self, task_id: &str) -> Result<Vec<AttemptRow>> {
        self.all(
            sqlx::query("SELECT * FROM attempts WHERE task_id = $1 ORDER BY fence").bind(task_id),
            attempt_row,
        )
        .await
    }
}
