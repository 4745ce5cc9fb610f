//! Attempts over HTTP: start one (take the lease), keep it alive, finish it, report what it
//! released, and its control stream — the applied commands a worker follows. The rules are in
//! `waymark_domain::{leases, recovery, controls}`.

use std::collections::HashSet;
use std::convert::Infallible;

use axum::Json as Out;
use axum::extract::{Path, State};
use axum::response::IntoResponse;
use axum::response::Response;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures::Stream;
use serde_json::json;
use waymark_proto::*;

use super::{Created, made};
use crate::auth::WorkerCaller;
use crate::domain::core::{Tx, task_for};
use crate::domain::{controls, leases, recovery};
use crate::error::{ApiError, ApiResult};
use crate::extract::Json;
use crate::state::AppState;

#[utoipa::path(post, path = "/v1/tasks/{task}/attempts", tag = "worker", request_body = StartAttempt,
    params(("task" = String, Path, pattern = r"^task_[0-9a-f]{32}$")),
    responses((status = 201, body = Attempt), (status = 409, body = Problem, description = "`lease_held`, `task_terminal`")))]
pub(crate) async fn start_attempt(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path(task_id): Path<String>,
    Json(req): Json<StartAttempt>,
) -> ApiResult<Created<Attempt>> {
    Ok(made(
        leases::start_attempt(&st, &caller, task_id, req).await?,
    ))
}

#[utoipa::path(post, path = "/v1/attempts/{attempt}/heartbeat", tag = "worker", request_body = Heartbeat,
    params(("attempt" = String, Path, pattern = r"^att_[0-9a-f]{32}$")),
    responses((status = 200, body = HeartbeatReply), (status = 409, body = Problem, description = "`fenced`, `lease_expired`, `attempt_closed`")))]
pub(crate) async fn heartbeat(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path(attempt_id): Path<String>,
    Json(req): Json<Heartbeat>,
) -> ApiResult<Out<HeartbeatReply>> {
    Ok(Out(leases::heartbeat(&st, &caller, attempt_id, req).await?))
}

#[utoipa::path(post, path = "/v1/attempts/{attempt}/finish", tag = "worker", request_body = FinishAttempt,
    params(("attempt" = String, Path, pattern = r"^att_[0-9a-f]{32}$")),
    responses((status = 200, body = Attempt), (status = 409, body = Problem, description = "`fenced`, `lease_expired`, `attempt_closed`")))]
pub(crate) async fn finish(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path(attempt_id): Path<String>,
    Json(req): Json<FinishAttempt>,
) -> ApiResult<Out<Written<Attempt>>> {
    Ok(Out(leases::finish(&st, &caller, attempt_id, req).await?))
}

#[utoipa::path(post, path = "/v1/attempts/{attempt}/released", tag = "worker", request_body = ReportReleased,
    params(("attempt" = String, Path, pattern = r"^att_[0-9a-f]{32}$")),
    responses((status = 200, body = Attempt), (status = 409, body = Problem, description = "`fenced`")))]
pub(crate) async fn released(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path(attempt_id): Path<String>,
    Json(req): Json<ReportReleased>,
) -> ApiResult<Out<Written<Attempt>>> {
    Ok(Out(recovery::released(&st, &caller, attempt_id, req).await?))
}

#[utoipa::path(get, path = "/v1/attempts/{attempt}/control", tag = "worker", params(("attempt" = String, Path, pattern = r"^att_[0-9a-f]{32}$")),
    responses((status = 200, content_type = "text/event-stream",
               description = "SSE: `event: control` with a ControlCommand until acknowledged (by heartbeat); `event: revoked` when the attempt loses the task")))]
pub(crate) async fn control_stream(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path(attempt_id): Path<String>,
) -> ApiResult<Response> {
    let mut tx = Tx::read(&st).await?;
    let attempt = tx
        .attempt(&attempt_id)
        .await?
        .ok_or_else(|| ApiError::not_found("attempt", &attempt_id))?;
    task_for(&mut tx, &caller, &attempt.task_id).await?;
    drop(tx);
    let slot = st.open_stream(caller.stream_credential())?;
    let stream = control_events(st.clone(), attempt.task_id, attempt_id, slot);
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(st.config.keep_alive))
        .into_response())
}

fn control_events(
    st: AppState,
    task_id: String,
    attempt_id: String,
    slot: crate::streams::StreamSlot,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    async_stream::stream! {
        let _slot = slot;
        let mut watch = st.cursor_watch();
        let mut stopping = st.stopping.subscribe();
        let mut sent: HashSet<String> = HashSet::new();
        // The highest `seq` this stream has shown or read pending: a command handed over in
        // memory is shown at once only when it is the next one.
        let mut last_seq: Option<i64> = None;
        loop {
            watch.borrow_and_update();
            let Ok((pending, attempt)) = controls::pending(&st, &task_id, &attempt_id).await else { break };
            for c in pending {
                last_seq = last_seq.max(Some(c.seq));
                if sent.insert(c.command_id.clone()) {
                    yield Ok(control_event(&c));
                }
            }
            match attempt {
                Some(a) if a.state == AttemptState::Active => {}
                Some(a) => {
                    yield Ok(SseEvent::default().event("revoked").data(json!({"attempt_id": a.id, "state": a.state}).to_string()));
                    break;
                }
                None => break,
            }
            tokio::select! {
                r = watch.changed() => if r.is_err() { break },
                _ = stopping.wait_for(|s| *s) => break,
            }
            // Woken by a commit: the command it carried, if applied here and next, without
            // the read (which follows all the same, for everything else).
            if let Some(l) = last_seq
                && let Some(h) = st.handoffs.latest(&task_id)
                && h.command.seq == l + 1
                && !sent.contains(&h.command.command_id)
                && h.committed().await
            {
                last_seq = Some(h.command.seq);
                sent.insert(h.command.command_id.clone());
                st.metrics.controls_handed_over.inc();
                yield Ok(control_event(&h.command));
            }
        }
    }
}

fn control_event(c: &ControlCommand) -> SseEvent {
    let data = serde_json::to_string(c).unwrap_or_default();
    SseEvent::default()
        .event("control")
        .id(c.command_id.clone())
        .data(data)
}
