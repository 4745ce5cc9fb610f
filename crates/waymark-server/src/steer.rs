//! Devices and signed steer commands over HTTP (SPEC §5): pairing, device read sessions,
//! `POST /v1/commands`, the admin's view of the ledger, and the control stream that carries
//! applied commands to the worker. The rules are in `crate::domain::{devices, commands,
//! controls}`.

use std::collections::HashSet;
use std::convert::Infallible;

use axum::Json as Out;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde_json::json;
use waymark_proto::*;

use crate::auth::WorkerCaller;
use crate::domain::commands::{self, LedgerEntry};
use crate::domain::controls;
use crate::domain::core::{Tx, task_for};
use crate::domain::devices;
use crate::error::{ApiError, ApiResult};
use crate::extract::Json;
use crate::limits::AddressLimited;
use crate::state::AppState;

pub use crate::admin::{create_pairing, list_devices, revoke_device};
pub use crate::domain::devices::{code_hash, normalize_code, pairing_key};

#[utoipa::path(post, path = "/v1/devices/pair", tag = "device", request_body = PairDevice, security(()),
    responses((status = 201, body = Device), (status = 401, body = Problem), (status = 410, body = Problem)))]
pub(crate) async fn pair(
    State(st): State<AppState>,
    _: AddressLimited,
    Json(req): Json<PairDevice>,
) -> ApiResult<(StatusCode, Out<Device>)> {
    let device = devices::pair(&st, req).await?;
    Ok((StatusCode::CREATED, Out(device)))
}

fn http_status(r: &CommandResult) -> StatusCode {
    match (r.status, r.reason) {
        (CommandStatus::Applied | CommandStatus::Duplicate, _) => StatusCode::OK,
        (CommandStatus::Conflict, _) => StatusCode::CONFLICT,
        (
            CommandStatus::Rejected,
            Some(
                RejectReason::UnknownDevice
                | RejectReason::DeviceMismatch
                | RejectReason::DeviceRevoked
                | RejectReason::BadSignature
                | RejectReason::UnsupportedAlg
                | RejectReason::NotYourTask
                | RejectReason::MissingScope,
            ),
        ) => StatusCode::FORBIDDEN,
        (CommandStatus::Rejected, _) => StatusCode::UNPROCESSABLE_ENTITY,
    }
}

#[utoipa::path(post, path = "/v1/devices/{device}/session", tag = "device", request_body = SignedEnvelope, security(()),
    params(("device" = String, Path, pattern = r"^dev_[0-9a-f]{32}$")),
    responses((status = 201, body = DeviceSession), (status = 403, body = CommandResult)))]
pub(crate) async fn open_session(
    State(st): State<AppState>,
    _: AddressLimited,
    Path(device_id): Path<String>,
    Json(env): Json<SignedEnvelope>,
) -> ApiResult<Response> {
    Ok(match devices::open_session(&st, &device_id, &env).await? {
        Ok(session) => (StatusCode::CREATED, Out(session)).into_response(),
        Err(refused) => (http_status(&refused), Out(refused)).into_response(),
    })
}

/// A signed steer command. Most name a task; `start_run` names the new one; `add_rule`
/// (`args.rule`: a `RuleSpec`; `args.rule_id`: optional, chosen by the device;
/// `args.confirm_risky`: the rule's digest again, required when it sets `allow_risky`) and
/// `revoke_rule` (`args.rule_id`) name none: a rule is the signing device's user's.
#[utoipa::path(post, path = "/v1/commands", tag = "device", request_body = SignedEnvelope, security(()),
    responses((status = 200, body = CommandResult, description = "`applied` or `duplicate`"),
              (status = 409, body = CommandResult, description = "`conflict`: the plan moved on"),
              (status = 403, body = CommandResult, description = "`rejected`: signature, device, ownership or scope"),
              (status = 422, body = CommandResult, description = "`rejected`: expired, reused id, stale approval…")))]
pub(crate) async fn submit(
    State(st): State<AppState>,
    _: AddressLimited,
    Json(env): Json<SignedEnvelope>,
) -> ApiResult<Response> {
    let res = commands::submit(&st, &env).await?;
    Ok((http_status(&res), Out(res)).into_response())
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

#[utoipa::path(get, path = "/v1/admin/tasks/{task}/commands", tag = "admin", params(("task" = String, Path, pattern = r"^task_[0-9a-f]{32}$")),
    responses((status = 200, body = Vec<LedgerEntry>)))]
pub(crate) async fn admin_ledger(
    State(st): State<AppState>,
    caller: crate::auth::Caller,
    Path(task_id): Path<String>,
) -> ApiResult<Out<Vec<LedgerEntry>>> {
    crate::reads::admin_only(&caller)?;
    Ok(Out(commands::ledger(&st, &task_id).await?))
}
