//! Control commands: what a worker must see of applied commands, numbered per task in the
//! order they applied, until it acknowledges them (heartbeat reply and control stream).

use waymark_proto::*;
use waymark_store::*;

use crate::Context;
use crate::convert;
use crate::core::{Tx, emit};
use crate::error::ApiResult;

/// Control commands a worker has not acknowledged, and acknowledges the ones it reports.
pub async fn exchange_controls(
    tx: &mut Tx,
    task: &TaskRow,
    attempt_id: &str,
    acknowledged: &[String],
) -> ApiResult<Vec<ControlCommand>> {
    let now = tx.now;
    for id in acknowledged {
        if tx.ack_control(&task.id, id, now, attempt_id).await? {
            let ack = CommandAck {
                command_id: id.clone(),
                task_id: task.id.clone(),
                attempt_id: attempt_id.to_owned(),
                at: tx.now_utc(),
            };
            emit(tx, task, EventKind::CommandAcknowledged, ack).await?;
        }
    }
    Ok(tx
        .pending_controls(&task.id)
        .await?
        .iter()
        .map(convert::control)
        .collect())
}

/// The task's unacknowledged commands, in order, and the attempt as it stands (a stream ends
/// once its attempt is no longer active).
pub async fn pending(
    st: &Context,
    task_id: &str,
    attempt_id: &str,
) -> Result<(Vec<ControlCommand>, Option<AttemptRow>), StoreError> {
    let mut tx = Tx::read(st).await?;
    let pending = tx.pending_controls(task_id).await?;
    let attempt = tx.attempt(attempt_id).await?;
    let pending = pending.iter().map(convert::control).collect();
    Ok((pending, attempt))
}
