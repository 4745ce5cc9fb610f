//! Fences and leases as every fenced write checks them: the attempt belongs to the task,
//! carries its newest fence, is active, and its lease has not run out.

use waymark_proto::*;
use waymark_store::*;

use crate::domain::core::{Tx, invalid};
use crate::error::{ApiError, ApiResult};

/// The fence check every write gateway makes: the attempt belongs to the task, carries the
/// task's newest fence, is still active, and its lease has not run out.
pub(crate) fn check_fence(
    task: &TaskRow,
    attempt: &AttemptRow,
    fence: i64,
    now: i64,
) -> ApiResult<()> {
    let refuse = |code: ErrorCode, detail: String| {
        Err(ApiError::new(code, detail)
            .with("current_fence", task.fence)
            .with("your_fence", fence)
            .on_task(&task.id))
    };
    if attempt.task_id != task.id {
        return Err(ApiError::not_found("attempt", &attempt.id).on_task(&task.id));
    }
    if fence != attempt.fence {
        return refuse(
            ErrorCode::Fenced,
            format!(
                "fence {fence} is not the fence of attempt `{}` ({})",
                attempt.id, attempt.fence
            ),
        );
    }
    if fence < task.fence {
        return refuse(
            ErrorCode::Fenced,
            format!(
                "fence {fence} is stale: a newer attempt holds this task with fence {}; stop writing",
                task.fence
            ),
        );
    }
    match attempt.state {
        AttemptState::Active => {}
        AttemptState::Finished => {
            return refuse(
                ErrorCode::AttemptClosed,
                format!("attempt `{}` has finished", attempt.id),
            );
        }
        other => {
            return refuse(
                ErrorCode::Fenced,
                format!("attempt `{}` was {other}; stop writing", attempt.id),
            );
        }
    }
    if attempt.expires_at <= now {
        return refuse(
            ErrorCode::LeaseExpired,
            format!(
                "the lease of attempt `{}` expired; start a new attempt to continue",
                attempt.id
            ),
        );
    }
    Ok(())
}

pub(crate) async fn fenced_attempt(
    tx: &mut Tx,
    task: &TaskRow,
    attempt_id: &str,
    fence: i64,
) -> ApiResult<AttemptRow> {
    let attempt = tx.attempt(attempt_id).await?;
    fenced(task, attempt_id, attempt, fence, tx.now)
}

/// The attempt loaded by `attempt_id`, if it passes [`check_fence`].
pub(crate) fn fenced(
    task: &TaskRow,
    attempt_id: &str,
    attempt: Option<AttemptRow>,
    fence: i64,
    now: i64,
) -> ApiResult<AttemptRow> {
    let attempt =
        attempt.ok_or_else(|| ApiError::not_found("attempt", attempt_id).on_task(&task.id))?;
    check_fence(task, &attempt, fence, now)?;
    Ok(attempt)
}

/// For writes where fencing is optional (adapters without leases): both fields or neither.
pub(crate) async fn optional_fence(
    tx: &mut Tx,
    task: &TaskRow,
    attempt_id: &Option<String>,
    fence: Option<i64>,
) -> ApiResult<()> {
    match (attempt_id, fence) {
        (None, None) => Ok(()),
        (Some(a), Some(f)) => fenced_attempt(tx, task, a, f).await.map(drop),
        _ => Err(invalid("give both `attempt_id` and `fence`, or neither")),
    }
}
