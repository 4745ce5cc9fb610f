//! `CheckpointsTx`'s statements: the checkpoint chain. An append's context is each backend's own
//! (one join on SQLite, a row lock on PostgreSQL), and so is its insert with an event on
//! PostgreSQL (one CTE with the transaction's claim); SQLite runs the two inserts here.

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
