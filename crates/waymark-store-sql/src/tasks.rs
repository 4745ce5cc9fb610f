//! `TasksTx`'s statements: tasks, their sessions and their attempts. Each backend keeps its own
//! the listing of several owners' tasks (`json_each` against `ANY`) and PostgreSQL its row lock
//! (`FOR UPDATE`) on a write transaction's `task`.

use std::sync::LazyLock;

use waymark_store::{AttemptRow, SessionRow, TaskRow, TaskState};

use crate::{Insert, Statement, insert};

pub fn insert_task(t: &TaskRow) -> Insert<'_> {
    insert!(
        "INSERT INTO tasks (id, owner_id, title, goal, runtime, state, plan, plan_revision,
           budget, usage, materials, session_id, fence, outcome_summary, created_at, updated_at,
           parent_id, external_key, machine_id)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18,
           $19)"
    )
    .bind(&t.id)
    .bind(&t.owner_id)
    .bind(&t.title)
    .bind(&t.goal)
    .bind(&t.runtime)
    .bind(t.state.as_str())
    .json(&t.plan)
    .bind(t.plan_revision)
    .json(&t.budget)
    .json(&t.usage)
    .json(&t.materials)
    .bind(&t.session_id)
    .bind(t.fence)
    .bind(&t.outcome_summary)
    .bind(t.created_at)
    .bind(t.updated_at)
    .bind(&t.parent_id)
    .bind(&t.external_key)
    .bind(&t.machine_id)
}

/// The task, unlocked.
pub fn task(id: &str) -> Statement<'_> {
    Statement::new("SELECT * FROM tasks WHERE id = $1").bind(id)
}

pub fn update_task(t: &TaskRow) -> Statement<'_> {
    Statement::new(
        "UPDATE tasks SET title = $1, goal = $2, runtime = $3, state = $4, plan = $5,
           plan_revision = $6, budget = $7, usage = $8, materials = $9, fence = $10,
           outcome_summary = $11, updated_at = $12, parent_id = $13
         WHERE id = $14",
    )
    .bind(&t.title)
    .bind(&t.goal)
    .bind(&t.runtime)
    .bind(t.state.as_str())
    .json(&t.plan)
    .bind(t.plan_revision)
    .json(&t.budget)
    .json(&t.usage)
    .json(&t.materials)
    .bind(t.fence)
    .bind(&t.outcome_summary)
    .bind(t.updated_at)
    .bind(&t.parent_id)
    .bind(&t.id)
}

pub fn task_by_external_key<'a>(
    owner_id: &'a str,
    runtime: &'a str,
    key: &'a str,
) -> Statement<'a> {
    Statement::new("SELECT * FROM tasks WHERE owner_id = $1 AND runtime = $2 AND external_key = $3")
        .bind(owner_id)
        .bind(runtime)
        .bind(key)
}

pub fn insert_session(s: &SessionRow) -> Insert<'_> {
    insert!("INSERT INTO sessions (id, task_id, parent_id, created_at) VALUES ($1, $2, $3, $4)")
        .bind(&s.id)
        .bind(&s.task_id)
        .bind(&s.parent_id)
        .bind(s.created_at)
}

pub fn session(id: &str) -> Statement<'_> {
    Statement::new("SELECT * FROM sessions WHERE id = $1").bind(id)
}

pub fn insert_attempt(a: &AttemptRow) -> Insert<'_> {
    insert!(
        "INSERT INTO attempts (id, task_id, worker, fence, expires_at, state, manifest_digest,
           started_at, ended_at, outcome, released)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"
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
    .opt_json(a.released.as_ref())
}

pub fn attempt(id: &str) -> Statement<'_> {
    Statement::new("SELECT * FROM attempts WHERE id = $1").bind(id)
}

pub fn update_attempt(a: &AttemptRow) -> Statement<'_> {
    Statement::new(
        "UPDATE attempts SET expires_at = $1, state = $2, ended_at = $3, outcome = $4,
           released = $5
         WHERE id = $6",
    )
    .bind(a.expires_at)
    .bind(a.state.as_str())
    .bind(a.ended_at)
    .bind(a.outcome.map(|x| x.as_str()))
    .opt_json(a.released.as_ref())
    .bind(&a.id)
}

/// Active attempts whose lease ran out, on tasks a sweep may act on.
pub fn expired_leases(now_ms: i64) -> Statement<'static> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT a.* FROM attempts a JOIN tasks t ON t.id = a.task_id
             WHERE a.state = 'active' AND a.expires_at <= $1
               AND t.state IN ({})
             ORDER BY a.expires_at, a.id",
            TaskState::lease_sweepable_sql()
        )
    });
    Statement::new(SQL.as_str()).bind(now_ms)
}

pub fn list_attempts(task_id: &str) -> Statement<'_> {
    Statement::new("SELECT * FROM attempts WHERE task_id = $1 ORDER BY fence").bind(task_id)
}
