//! Attempts and their leases: starting one (fence + 1, admission on resume), renewing it with
//! the worker's acknowledgements, finishing it.

use waymark_proto::*;
use waymark_store::*;

use crate::Context;
use crate::caller::Caller;
use crate::convert;
use crate::core::{
    Made, Tx, audited, check_text, created, emit, emit_task, refuse_terminal, task_for,
};
use crate::decisions::close_decision;
use crate::error::{ApiError, ApiResult};
use crate::fences::check_fence;

/// The lease granted for a requested length, within the configured bounds.
pub fn lease_ms(st: &Context, requested: Option<u32>) -> i64 {
    let c = &st.config;
    let want = requested
        .map(|s| std::time::Duration::from_secs(s.into()))
        .unwrap_or(c.lease_default);
    want.clamp(c.lease_min, c.lease_max).as_millis() as i64
}

/// Starts an attempt: fence + 1, the lease; an expired one is superseded, a live one refuses
/// (`lease_held`); a resume passes admission first.
pub async fn start_attempt(
    st: &Context,
    caller: &Caller,
    task_id: String,
    req: StartAttempt,
) -> ApiResult<Made<Attempt>> {
    check_text("worker", &req.worker, 128, true)?;
    audited(st, caller, "attempt.start", async {
        let mut tx = Tx::write(st).await?;
        let mut task = task_for(&mut tx, caller, &task_id).await?;
        refuse_terminal(&task)?;
        let now = tx.now;
        let mut cursor = 0;
        let live = tx
            .list_attempts(&task.id)
            .await?
            .into_iter()
            .any(|a| a.state == AttemptState::Active && a.expires_at > now);
        if !live {
            let reasons = crate::recovery::admission(&mut tx, &task, &req).await?;
            if !reasons.is_empty() {
                let refusal = crate::recovery::refuse_admission(&mut tx, task, &reasons).await?;
                tx.commit().await?;
                return Err(refusal);
            }
        }
        for mut prev in tx.list_attempts(&task.id).await? {
            if prev.state != AttemptState::Active {
                continue;
            }
            if prev.expires_at > now {
                return Err(ApiError::new(
                    ErrorCode::LeaseHeld,
                    format!(
                        "attempt `{}` of worker `{}` holds the lease until {}",
                        prev.id,
                        prev.worker,
                        convert::dt(prev.expires_at).to_rfc3339()
                    ),
                )
                .with("attempt_id", &prev.id)
                .with("expires_at", convert::dt(prev.expires_at))
                .on_task(&task.id));
            }
            prev.state = AttemptState::Superseded;
            prev.ended_at = Some(now);
            tx.update_attempt(&prev).await?;
            emit(
                &mut tx,
                &task,
                EventKind::AttemptEnded,
                convert::attempt(&prev),
            )
            .await?;
        }
        let attempt = AttemptRow {
            id: ids::attempt(),
            task_id: task.id.clone(),
            worker: req.worker.clone(),
            fence: task.fence + 1,
            expires_at: now + lease_ms(st, req.lease_seconds),
            state: AttemptState::Active,
            manifest_digest: req.manifest_digest.clone(),
            started_at: now,
            ended_at: None,
            outcome: None,
            released: None,
        };
        tx.insert_attempt(&attempt).await?;
        task.fence = attempt.fence;
        let state: TaskState = task.state;
        if matches!(
            state,
            TaskState::Queued
                | TaskState::RecoveryCandidate
                | TaskState::NeedsHuman
                | TaskState::Verifying
        ) {
            task.state = TaskState::Running;
        }
        task.updated_at = now;
        tx.update_task(&task).await?;
        let wire = convert::attempt(&attempt);
        cursor = cursor.max(emit(&mut tx, &task, EventKind::AttemptStarted, &wire).await?);
        cursor = cursor.max(emit_task(&mut tx, &task, EventKind::TaskUpdated).await?);
        tx.commit().await?;
        Ok(created(cursor, wire))
    })
    .await
}

/// Renews the lease and exchanges control commands: records what the worker acknowledged, answers
/// what it has not.
pub async fn heartbeat(
    st: &Context,
    caller: &Caller,
    attempt_id: String,
    req: Heartbeat,
) -> ApiResult<HeartbeatReply> {
    audited(st, caller, "attempt.heartbeat", async {
        let mut tx = Tx::write(st).await?;
        let mut attempt = tx
            .attempt(&attempt_id)
            .await?
            .ok_or_else(|| ApiError::not_found("attempt", &attempt_id))?;
        let task = task_for(&mut tx, caller, &attempt.task_id).await?;
        if let Err(e) = check_fence(&task, &attempt, req.fence, tx.now) {
            // A revoked worker still reports what it saw (e.g. the cancel that revoked it):
            // record the acknowledgements, then refuse the renewal.
            if attempt.fence == req.fence && !req.acknowledged.is_empty() {
                crate::controls::exchange_controls(&mut tx, &task, &attempt.id, &req.acknowledged)
                    .await?;
                tx.commit().await?;
            }
            return Err(e);
        }
        attempt.expires_at = tx.now + lease_ms(st, req.lease_seconds);
        tx.update_attempt(&attempt).await?;
        let commands =
            crate::controls::exchange_controls(&mut tx, &task, &attempt.id, &req.acknowledged)
                .await?;
        tx.commit().await?;
        Ok(HeartbeatReply {
            expires_at: convert::dt(attempt.expires_at),
            task_state: task.state,
            plan_revision: task.plan_revision,
            commands,
        })
    })
    .await
}

/// Ends an attempt with its outcome; the task moves on accordingly.
pub async fn finish(
    st: &Context,
    caller: &Caller,
    attempt_id: String,
    req: FinishAttempt,
) -> ApiResult<Written<Attempt>> {
    if let Some(s) = &req.summary {
        check_text("summary", s, 20_000, false)?;
    }
    audited(st, caller, "attempt.finish", async {
        let mut tx = Tx::write(st).await?;
        let mut attempt = tx
            .attempt(&attempt_id)
            .await?
            .ok_or_else(|| ApiError::not_found("attempt", &attempt_id))?;
        let mut task = task_for(&mut tx, caller, &attempt.task_id).await?;
        let now = tx.now;
        check_fence(&task, &attempt, req.fence, now)?;
        attempt.state = AttemptState::Finished;
        attempt.ended_at = Some(now);
        attempt.outcome = Some(req.outcome);
        if !req.released.is_empty() {
            attempt.released = Some(req.released.clone());
        }
        tx.update_attempt(&attempt).await?;
        // A paused task stays paused when its runtime lets go (a person paused it; only a
        // person resumes it).
        let next = match (req.outcome, task.state) {
            (FinishOutcome::Released, TaskState::Paused) => TaskState::Paused,
            (o, _) => o.task_state(),
        };
        task.state = next;
        if req.summary.is_some() {
            task.outcome_summary = req.summary.clone();
        }
        task.updated_at = now;
        tx.update_task(&task).await?;
        if next.is_terminal() {
            for mut d in tx.list_decisions(&task.id).await? {
                if d.status == DecisionStatus::Pending {
                    let outcome = DecisionOutcome {
                        option: None,
                        text: Some(format!("the task ended {next}")),
                        by: "server".into(),
                        at: tx.now_utc(),
                        edited_intent: None,
                        edited_intent_digest: None,
                        answers: None,
                        rule: None,
                    };
                    close_decision(&mut tx, &mut d, DecisionStatus::Void, outcome).await?;
                }
            }
        }
        let wire = convert::attempt(&attempt);
        emit(&mut tx, &task, EventKind::AttemptEnded, &wire).await?;
        let cursor = emit_task(&mut tx, &task, EventKind::TaskUpdated).await?;
        tx.commit().await?;
        Ok(Written {
            cursor,
            value: wire,
        })
    })
    .await
}
