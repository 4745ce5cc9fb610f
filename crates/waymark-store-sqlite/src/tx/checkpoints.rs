//! `CheckpointsTx` on SQLite: the checkpoint chain. An append reads what it checks in one join and
//! writes the checkpoint with its event in one query, to hold the one writer connection briefly.

use async_trait::async_trait;
use waymark_store::*;
use waymark_store_sql as sql;

use super::SqliteTx;
use crate::rows::*;

#[async_trait]
impl CheckpointsTx for SqliteTx {
    async fn insert_checkpoint(&mut self, c: &CheckpointRow) -> Result<()> {
        self.insert(sql::checkpoints::insert_checkpoint(c)).await
    }

    async fn insert_checkpoint_with_event(
        &mut self,
        c: &CheckpointRow,
        e: &NewEvent,
    ) -> Result<i64> {
        // Both statements in one query, so one round trip to the connection's thread while
        // the writer is held. SQLite runs them in order and stops at the first error: a
        // checkpoint that exists fails the first (`Conflict`) and no event is written. The
        // event's `RETURNING` row is the query's only row. (The column lists are those of
        // `insert_checkpoint` and `append_event`.)
        let cursor: i64 = sqlx::query_scalar(
            "INSERT INTO checkpoints (task_id, sequence, attempt_id, fence, body, prev_digest,
               digest, created_at)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?);
             INSERT INTO events (task_id, owner_id, kind, data, at) VALUES (?, ?, ?, ?, ?)
             RETURNING cursor",
        )
        .bind(&c.task_id)
        .bind(c.sequence)
        .bind(&c.attempt_id)
        .bind(c.fence)
        .bind(json_text(&c.body))
        .bind(&c.prev_digest)
        .bind(&c.digest)
        .bind(c.created_at)
        .bind(&e.task_id)
        .bind(&e.owner_id)
        .bind(e.kind.as_str())
        .bind(json_text(&e.data))
        .bind(e.at)
        .fetch_one(self.db())
        .await
        .map_err(backend)?;
        self.appended = Some(cursor);
        Ok(cursor)
    }

    async fn last_checkpoint(&mut self, task_id: &str) -> Result<Option<CheckpointRow>> {
        let q = sql::checkpoints::last_checkpoint(task_id);
        self.one(q.query(), checkpoint_row).await
    }

    async fn append_context(&mut self, task_id: &str, attempt_id: &str) -> Result<AppendContext> {
        // One statement instead of three: on the writer, every statement is a round trip to
        // the connection's thread made while the connection is held.
        let row = sqlx::query(
            "SELECT t.*,
               a.id AS a_id, a.task_id AS a_task_id, a.worker AS a_worker, a.fence AS a_fence,
               a.expires_at AS a_expires_at, a.state AS a_state,
               a.manifest_digest AS a_manifest_digest, a.started_at AS a_started_at,
               a.ended_at AS a_ended_at, a.outcome AS a_outcome, a.released AS a_released,
               c.sequence AS c_sequence, c.digest AS c_digest
             FROM tasks t
             LEFT JOIN attempts a ON a.id = ?2
             LEFT JOIN (SELECT sequence, digest FROM checkpoints WHERE task_id = ?1
                        ORDER BY sequence DESC LIMIT 1) c ON 1
             WHERE t.id = ?1",
        )
        .bind(task_id)
        .bind(attempt_id)
        .fetch_optional(self.db())
        .await
        .map_err(backend)?;
        let Some(r) = row else {
            return Ok(AppendContext::default());
        };
        let attempt = match get::<Option<String>>(&r, "a_id")? {
            Some(_) => Some(attempt_at(&r, "a_")?),
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
            task: Some(task_row(&r)?),
            attempt,
            head,
        })
    }

    async fn list_checkpoints(&mut self, task_id: &str) -> Result<Vec<CheckpointRow>> {
        let q = sql::checkpoints::list_checkpoints(task_id);
        self.all(q.query(), checkpoint_row).await
    }
}
