//! Checkpoints: appended by compare-and-set on the sequence, hash-chained, redacted.

use waymark_proto::digest::{check_exact, checkpoint_digest};
use waymark_proto::*;
use waymark_store::*;

use crate::Context;
use crate::caller::Caller;
use crate::convert;
use crate::core::{
    Made, Tx, audited, created, invalid, new_event, not_exact, to_value, visible_task,
};
use crate::error::{ApiError, ApiResult};
use crate::fences::fenced;

/// Appends a checkpoint by compare-and-set on the sequence (`last + 1`), linked to the chain,
/// redacted.
pub async fn append_checkpoint(
    st: &Context,
    caller: &Caller,
    task_id: String,
    req: AppendCheckpoint,
) -> ApiResult<Made<Checkpoint>> {
    if !(1..=MAX_SAFE_INTEGER).contains(&req.sequence) {
        return Err(invalid("`sequence` must be at least 1"));
    }
    // The chain link must say exactly what it covers.
    check_exact(&to_value(&req.body)).map_err(|e| not_exact("body", e))?;
    audited(st, caller, "checkpoint.append", async {
        let mut tx = Tx::write(st).await?;
        // The task, the attempt and the chain's head in one load (one statement on SQLite),
        // checked in the order `task_for` and `fenced_attempt` check them.
        let ctx = tx.append_context(&task_id, &req.attempt_id).await?;
        let task = visible_task(caller, &task_id, ctx.task)?;
        fenced(&task, &req.attempt_id, ctx.attempt, req.fence, tx.now)?;
        let last_seq = ctx.head.as_ref().map_or(0, |c| c.sequence);
        let sequence_conflict = || {
            ApiError::new(
                ErrorCode::SequenceConflict,
                format!(
                    "sequence {} is not the next one: the last checkpoint is {last_seq}; reload and retry with {}",
                    req.sequence,
                    last_seq + 1
                ),
            )
            .with("current_sequence", last_seq)
            .on_task(&task.id)
        };
        if req.sequence != last_seq + 1 {
            return Err(sequence_conflict());
        }
        let mut body = to_value(&req.body);
        st.config.redaction.json(&mut body);
        let prev = ctx.head.map(|c| c.digest);
        let row = CheckpointRow {
            task_id: task.id.clone(),
            sequence: req.sequence,
            attempt_id: req.attempt_id.clone(),
            fence: req.fence,
            digest: checkpoint_digest(&task.id, req.sequence, &req.attempt_id, req.fence, &body, prev.as_deref()),
            body,
            prev_digest: prev,
            created_at: tx.now,
        };
        let wire = convert::checkpoint(&row);
        let event = new_event(&tx, &task, EventKind::CheckpointAppended, &wire)?;
        let cursor = match tx.insert_checkpoint_with_event(&row, &event).await {
            Err(StoreError::Conflict(_)) => return Err(sequence_conflict()),
            r => r?,
        };
        tx.commit().await?;
        st.metrics.checkpoints.inc();
        Ok(created(cursor, wire))
    })
    .await
}

/// Verifies a task's hash chain: contiguous sequences from 1, each link pointing at its
/// predecessor and recomputing to its stored digest.
pub fn verify_chain(rows: &[CheckpointRow]) -> ChainStatus {
    let mut prev: Option<&str> = None;
    for (i, c) in rows.iter().enumerate() {
        let broken = |reason: String| ChainStatus {
            intact: false,
            checked: i as i64 + 1,
            broken_at: Some(c.sequence),
            reason: Some(reason),
        };
        if c.sequence != i as i64 + 1 {
            return broken(format!("expected sequence {}, found {}", i + 1, c.sequence));
        }
        if c.prev_digest.as_deref() != prev {
            return broken(format!(
                "checkpoint {} points at {:?}, but its predecessor's digest is {:?}",
                c.sequence, c.prev_digest, prev
            ));
        }
        let want = checkpoint_digest(
            &c.task_id,
            c.sequence,
            &c.attempt_id,
            c.fence,
            &c.body,
            prev,
        );
        if want != c.digest {
            return broken(format!(
                "checkpoint {} does not match its digest: its content was changed after it was written",
                c.sequence
            ));
        }
        prev = Some(&c.digest);
    }
    ChainStatus {
        intact: true,
        checked: rows.len() as i64,
        broken_at: None,
        reason: None,
    }
}
