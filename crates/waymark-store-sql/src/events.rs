//! `EventsTx`'s statements: the event log and the audit log. Each backend keeps its own the
//! reads of several owners (`json_each` against `ANY`), the newest cursor and the pruned mark
//! (`MAX` against `GREATEST`), and what an append does around its insert (PostgreSQL's cursor
//! lock).

use waymark_store::{AuditRow, NewEvent};

use crate::Statement;

/// Returns the event's `cursor`.
pub fn append_event(e: &NewEvent) -> Statement<'_> {
    Statement::new(
        "INSERT INTO events (task_id, owner_id, kind, data, at) VALUES ($1, $2, $3, $4, $5)
         RETURNING cursor",
    )
    .bind(&e.task_id)
    .bind(&e.owner_id)
    .bind(e.kind.as_str())
    .json(&e.data)
    .bind(e.at)
}

pub fn owner_events_after(owner_id: &str, cursor: i64, limit: i64) -> Statement<'_> {
    Statement::new(
        "SELECT * FROM events WHERE owner_id = $1 AND cursor > $2 ORDER BY cursor LIMIT $3",
    )
    .bind(owner_id)
    .bind(cursor)
    .bind(limit)
}

pub fn events_after(cursor: i64, limit: i64) -> Statement<'static> {
    Statement::new("SELECT * FROM events WHERE cursor > $1 ORDER BY cursor LIMIT $2")
        .bind(cursor)
        .bind(limit)
}

pub fn pruned_through() -> Statement<'static> {
    Statement::new("SELECT pruned_through FROM event_retention WHERE id = 1")
}

pub fn delete_events_through(cursor: i64) -> Statement<'static> {
    Statement::new("DELETE FROM events WHERE cursor <= $1").bind(cursor)
}

pub fn insert_audit(a: &AuditRow) -> Statement<'_> {
    Statement::new(
        "INSERT INTO audit (at, actor, action, task_id, code, detail)
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(a.at)
    .bind(&a.actor)
    .bind(&a.action)
    .bind(&a.task_id)
    .bind(&a.code)
    .bind(&a.detail)
}

pub fn list_audit(task_id: Option<&str>, limit: i64) -> Statement<'_> {
    Statement::new(
        "SELECT * FROM audit WHERE (CAST($1 AS TEXT) IS NULL OR task_id = $1)
         ORDER BY id DESC LIMIT $2",
    )
    .bind(task_id)
    .bind(limit)
}

pub fn delete_audit_before(before: i64) -> Statement<'static> {
    Statement::new("DELETE FROM audit WHERE at < $1").bind(before)
}

pub fn delete_audit_over(keep: i64) -> Statement<'static> {
    Statement::new("DELETE FROM audit WHERE id <= (SELECT COALESCE(MAX(id), 0) FROM audit) - $1")
        .bind(keep)
}
