//! Fences and leases as every fenced write checks them: the attempt belongs to the task,
//! carries its newest fence, is active, and its lease has not run out.

use waymark_proto::*;
use waymark_store::*;

use crate::core::{Tx, invalid};
use crate::error::{ApiError, ApiResult};

/// The fence check every write gateway makes: the attempt belongs to the task, carries the
/// task's newest fence, is still active, and its lease has not run out.
pub fn check_fence(task: &TaskRow, attempt: &AttemptRow, fence: i64, now: i64) -> ApiResult<()> {
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

pub async fn fenced_attempt(
    tx: &mut Tx,
    task: &TaskRow,
    attempt_id: &str,
    fence: i64,
) -> ApiResult<AttemptRow> {
    let attempt = tx.attempt(attempt_id).await?;
    fenced(task, attempt_id, attempt, fence, tx.now)
}

/// The attempt loaded by `attempt_id`, if it passes [`check_fence`].
pub fn fenced(
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
pub async fn optional_fence(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{attempt, task};

    fn code(r: ApiResult<()>) -> ErrorCode {
        r.expect_err("refused").code()
    }

    #[test]
    fn the_newest_live_attempt_writes_until_its_lease_runs_out() {
        assert!(check_fence(&task(), &attempt(), 2, 999).is_ok());
        assert_eq!(
            code(check_fence(&task(), &attempt(), 2, 1_000)),
            ErrorCode::LeaseExpired
        );
    }

    #[test]
    fn a_fence_not_the_attempts_or_older_than_the_tasks_is_fenced() {
        assert_eq!(
            code(check_fence(&task(), &attempt(), 3, 0)),
            ErrorCode::Fenced
        );
        let mut old = attempt();
        old.fence = 1;
        let refused = check_fence(&task(), &old, 1, 0).unwrap_err();
        assert_eq!(refused.code(), ErrorCode::Fenced);
        assert_eq!(refused.problem.context["current_fence"], 2);
        assert_eq!(refused.problem.context["your_fence"], 1);
        assert_eq!(refused.task_id.as_deref(), Some("task_1"));
    }

    #[test]
    fn an_ended_attempt_writes_nothing() {
        let mut a = attempt();
        a.state = AttemptState::Finished;
        assert_eq!(
            code(check_fence(&task(), &a, 2, 0)),
            ErrorCode::AttemptClosed
        );
        for state in [AttemptState::Revoked, AttemptState::Superseded] {
            a.state = state;
            assert_eq!(code(check_fence(&task(), &a, 2, 0)), ErrorCode::Fenced);
        }
    }

    #[test]
    fn another_tasks_attempt_is_not_found() {
        let mut a = attempt();
        a.task_id = "task_2".into();
        assert_eq!(code(check_fence(&task(), &a, 2, 0)), ErrorCode::NotFound);
        assert_eq!(
            fenced(&task(), "att_9", None, 2, 0).unwrap_err().code(),
            ErrorCode::NotFound
        );
    }
}
