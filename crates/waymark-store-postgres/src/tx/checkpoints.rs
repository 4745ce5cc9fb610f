//! `CheckpointsTx` on PostgreSQL: the checkpoint chain. An append locks the task before it reads
//! the chain head, then writes the checkpoint and its event (after the transaction's claim) in
//! one statement.

use async_trait::async_trait;
use waymark_store::*;
use waymark_store_sql as sql;

use super::{PgTx, db_err};
use crate::CLAIM_KEYS;
use crate::rows::*;

#[async_trait]
impl CheckpointsTx for PgTx {
    async fn insert_checkpoint(&mut self, c: &CheckpointRow) -> Result<()> {
        self.insert("checkpoints", sql::checkpoints::insert_checkpoint(c))
            .await
    }

    async fn last_checkpoint(&mut self, task_id: &str) -> Result<Option<CheckpointRow>> {
        let q = sql::checkpoints::last_checkpoint(task_id);
        self.one(q.query(), checkpoint_row).await
    }

    async fn append_context(&mut self, task_id: &str, attempt_id: &str) -> Result<AppendContext> {
        // Two statements instead of three. The task is locked by a statement of its own: under
        // READ COMMITTED a statement's snapshot is taken before it waits for a row lock, so a
        // chain head read in the locking statement could predate the append that held the
        // lock. The statement after it sees every commit made before the lock was granted.
        let Some(task) = self.task(task_id).await? else {
            return Ok(AppendContext::default());
        };
        let r = sqlx::query(
            "SELECT a.*, c.sequence AS c_sequence, c.digest AS c_digest
             FROM (SELECT 1) one
             LEFT JOIN attempts a ON a.id = $2
             LEFT JOIN LATERAL (SELECT sequence, digest FROM checkpoints WHERE task_id = $1
                                ORDER BY sequence DESC LIMIT 1) c ON true",
        )
        .bind(task_id)
        .bind(attempt_id)
        .fetch_one(&mut *self.tx)
        .await
        .map_err(db_err)?;
        let attempt = match get::<Option<String>>(&r, "id")? {
            Some(_) => Some(attempt_row(&r)?),
            None => None,
        };
        let head = match get::<Option<i64>>(&r, "c_sequence")? {
            Some(sequence) => Some(ChainHead {
                sequence,
                digest: get(&r, "c_digest")?,
            }),
            None => None,
        };
        Ok(AppendContext {
            task: Some(task),
            attempt,
            head,
        })
    }

    async fn insert_checkpoint_with_event(
        &mut self,
        c: &CheckpointRow,
        e: &NewEvent,
    ) -> Result<i64> {
        // One round trip for what `insert_checkpoint` and `append_event` make in two. The
        // event's row is built from a join with the claim's row, so its cursor is drawn after
        // the claim is held (crate docs, "Readers never pass …"); claiming again in a
        // transaction that already did is harmless. A checkpoint that exists returns no row
        // from `cp`, and then nothing is claimed and no event is written.
        let cursor: Option<i64> = sqlx::query_scalar(concat!(
            "WITH cp AS (
               INSERT INTO checkpoints (task_id, sequence, attempt_id, fence, body, prev_digest,
                 digest, created_at)
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING RETURNING 1),
             claim AS MATERIALIZED (
               SELECT pg_advisory_xact_lock_shared($9 + ",
            crate::drawn!(),
            ") FROM cp, events_cursor_seq),
             ev AS (
               INSERT INTO events (task_id, owner_id, kind, data, at)
               SELECT $10, $11, $12, $13, $14 FROM claim
               RETURNING cursor)
             SELECT ev.cursor FROM ev",
        ))
        .bind(&c.task_id)
        .bind(c.sequence)
        .bind(&c.attempt_id)
        .bind(c.fence)
        .bind(&c.body)
        .bind(&c.prev_digest)
        .bind(&c.digest)
        .bind(c.created_at)
        .bind(CLAIM_KEYS)
        .bind(&e.task_id)
        .bind(&e.owner_id)
        .bind(e.kind.as_str())
        .bind(&e.data)
        .bind(e.at)
        .fetch_optional(&mut *self.tx)
        .await
        .map_err(db_err)?;
        let Some(cursor) = cursor else {
            return Err(StoreError::Conflict(
                "checkpoints: a row with the same key exists".into(),
            ));
        };
        self.claimed = true;
        self.note_appended(cursor);
        Ok(cursor)
    }

    async fn list_checkpoints(&mut self, task_id: &str) -> Result<Vec<CheckpointRow>> {
        let q = sql::checkpoints::list_checkpoints(task_id);
        self.all(q.query(), checkpoint_row).await
    }
}
