//! `CheckpointsTx` on SQLite: the checkpoint chain. An append reads what it checks in one join,
//! to hold the one writer connection briefly.

use async_trait::async_trait;
use waymark_store::*;
use waymark_store_sql::{self as sql, Statement};

use super::SqliteTx;
use crate::rows::*;

#[async_trait]
impl CheckpointsTx for SqliteTx {
    async fn insert_checkpoint(&mut self, c: &CheckpointRow) -> Result<()> {
        self.insert(sql::checkpoints::insert_checkpoint(c))
    }

    async fn insert_checkpoint_with_event(
        &mut self,
        c: &CheckpointRow,
        e: &NewEvent,
    ) -> Result<i64> {
        // A checkpoint that exists fails the first statement (`Conflict`) and no event is
        // written.
        self.insert(sql::checkpoints::insert_checkpoint(c))?;
        self.append_event(e).await
    }

    async fn last_checkpoint(&mut self, task_id: &str) -> Result<Option<CheckpointRow>> {
        let q = sql::checkpoints::last_checkpoint(task_id);
        self.one(q, checkpoint_row)
    }

    async fn append_context(&mut self, task_id: &str, attempt_id: &str) -> Result<AppendContext> {
        // One statement instead of three, while the one writer connection is held.
        let q = Statement::new(
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
        .bind(attempt_id);
        Ok(self.one(q, append_context)?.unwrap_or_default())
    }

    async fn list_checkpoints(&mut self, task_id: &str) -> Result<Vec<CheckpointRow>> {
        let q = sql::checkpoints::list_checkpoints(task_id);
        self.all(q, checkpoint_row)
    }
}

/// What an append checks, from `append_context`'s join.
fn append_context(r: &rusqlite::Row<'_>) -> Result<AppendContext> {
    let attempt = match get::<Option<String>>(r, "a_id")? {
        Some(_) => Some(attempt_at(r, "a_")?),
        None => None,
    };
    let head = match get::<Option<i64>>(r, "c_sequence")? {
        Some(sequence) => Some(ChainHead {
            sequence,
            digest: get(r, "c_digest")?,
        }),
        None => None,
    };
    Ok(AppendContext {
        task: Some(task_row(r)?),
        attempt,
        head,
    })
}
