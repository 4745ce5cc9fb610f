//! `CheckpointsTx`'s statements: the checkpoint chain. An append (its context and its insert with
//! an event) is each backend's own: one join and one multi-statement query on SQLite, a row lock
//! and one CTE with the cursor lock and `pg_notify` on PostgreSQL.

use waymark_store::CheckpointRow;

use crate::{Insert, Statement, insert};

pub fn insert_checkpoint(c: &CheckpointRow) -> Insert<'_> {
    insert!(
        "INSERT INTO checkpoints (task_id, sequence, attempt_id, fence, body, prev_digest,
           digest, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
    )
    .bind(&c.task_id)
    .bind(c.sequence)
    .bind(&c.attempt_id)
    .bind(c.fence)
    .json(&c.body)
    .bind(&c.prev_digest)
    .bind(&c.digest)
    .bind(c.created_at)
}

pub fn last_checkpoint(task_id: &str) -> Statement<'_> {
    Statement::new("SELECT * FROM checkpoints WHERE task_id = $1 ORDER BY sequence DESC LIMIT 1")
        .bind(task_id)
}

pub fn list_checkpoints(task_id: &str) -> Statement<'_> {
    Statement::new("SELECT * FROM checkpoints WHERE task_id = $1 ORDER BY sequence").bind(task_id)
}
