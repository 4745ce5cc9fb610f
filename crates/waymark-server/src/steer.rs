//! Devices and signed steer commands (SPEC §5): pairing, device read sessions, the command
//! ledger with compare-and-set on the plan revision, and the control stream that carries
//! applied commands to the worker. Every command passes the same verification path —
//! signature, device, clock — before anything reads the task.

use std::collections::HashSet;
use std::convert::Infallible;

use axum::Json as Out;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use futures::Stream;
use serde_json::{Value, json};
use waymark_proto::digest::{canonical_json, sha256_hex};
use waymark_proto::signing;
use waymark_proto::*;
use waymark_store::*;

use crate::auth::{CallerKind, WorkerCaller, new_secret, secret_hash};
use crate::domain::core::{emit, record_refusal, task_for};
use crate::domain::decisions::close_decision;
use crate::domain::tasks::validate_plan;
use crate::error::{ApiError, ApiResult};
use crate::extract::Json;
use crate::{AppState, convert, now_ms};

type Tx = Box<dyn StoreTx>;

/// How far in the future a device clock may be.
const SKEW_MS: i64 = 5 * 60 * 1000;
/// The longest a signed command stays valid (it may wait in an offline outbox).
const MAX_LIFETIME_MS: i64 = 7 * 24 * 3600 * 1000;
/// Device read sessions last this long.
const SESSION_MS: i64 = 15 * 60 * 1000;

/// Normalises a pairing code: case, dashes, spaces and look-alikes do not matter.
pub fn normalize_code(code: &str) -> String {
    code.chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| match c.to_ascii_uppercase() {
            'O' => '0',
            'I' | 'L' => '1',
            other => other,
        })
        .collect()
}

/// What the store keeps of a pairing code.
pub fn code_hash(code: &str) -> String {
    sha256_hex(normalize_code(code).as_bytes())
}

fn device_wire(d: &DeviceRow, user: &str) -> Device {
    Device {
        id: d.id.clone(),
        user: user.to_owned(),
        name: d.name.clone(),
        scopes: serde_json::from_value(d.scopes.clone()).unwrap_or_default(),
        public_key: d.public_key.clone(),
        created_at: convert::dt(d.created_at),
        revoked_at: d.revoked_at.map(convert::dt),
    }
}

#[utoipa::path(post, path = "/v1/devices/pair", tag = "device", request_body = PairDevice, security(()),
    responses((status = 201, body = Device), (status = 401, body = Problem), (status = 410, body = Problem)))]
pub(crate) async fn pair(
    State(st): State<AppState>,
    Json(req): Json<PairDevice>,
) -> ApiResult<(StatusCode, Out<Device>)> {
    let name = req.name.trim();
    if name.is_empty() || name.len() > 100 {
        return Err(ApiError::new(
            ErrorCode::ValidationFailed,
            "`name` must be 1–100 characters",
        ));
    }
    let key = signing::public_key(&req.public_key).map_err(|e| {
        ApiError::new(
            ErrorCode::ValidationFailed,
            format!("`public_key`: {e} (32 bytes, base64url)"),
        )
    })?;
    let mut tx = st.store.write().await?;
    let refuse = |code: ErrorCode, detail: &str| ApiError::new(code, detail.to_owned());
    let Some(mut pairing) = tx.pairing(&code_hash(&req.code)).await? else {
        drop(tx);
        let e = refuse(
            ErrorCode::PairingCodeInvalid,
            "no such pairing code — check it, or ask for a new one with `waymark admin pair --user NAME`",
        );
        record_refusal(
            &st,
            "device:unpaired",
            "device.pair",
            None,
            e.code().as_str(),
            &e.problem.detail,
        )
        .await;
        return Err(e);
    };
    let user = tx
        .user_by_id(&pairing.user_id)
        .await?
        .map(|u| u.name)
        .unwrap_or_default();
    let err = if pairing.used_at.is_some() {
        Some(refuse(
            ErrorCode::PairingCodeUsed,
            &format!(
                "this pairing code was used already — ask for a new one with `waymark admin pair --user {user}`"
            ),
        ))
    } else if pairing.expires_at <= now_ms() {
        Some(refuse(
            ErrorCode::PairingCodeExpired,
            &format!(
                "pairing code expired — ask for a new one with `waymark admin pair --user {user}`"
            ),
        ))
    } else {
        None
    };
    if let Some(e) = err {
        drop(tx);
        record_refusal(
            &st,
            "device:unpaired",
            "device.pair",
            None,
            e.code().as_str(),
            &e.problem.detail,
        )
        .await;
        return Err(e);
    }
    let device = DeviceRow {
        id: ids::device(),
        user_id: pairing.user_id.clone(),
        name: name.to_owned(),
        public_key: signing::public_key_b64(&key),
        scopes: pairing.scopes.clone(),
        created_at: now_ms(),
        revoked_at: None,
    };
    match tx.insert_device(&device).await {
        Err(StoreError::Conflict(_)) => {
            return Err(ApiError::new(
                ErrorCode::ValidationFailed,
                "this public key is already paired; generate a new key",
            ));
        }
        r => r?,
    }
    pairing.used_at = Some(now_ms());
    pairing.device_id = Some(device.id.clone());
    tx.update_pairing(&pairing).await?;
    tx.commit().await?;
    Ok((StatusCode::CREATED, Out(device_wire(&device, &user))))
}

/// A command whose signature, device and clock checked out.
struct Verified {
    device: DeviceRow,
    user: UserRow,
    command: SteerCommand,
    body_digest: String,
}

/// A refusal before or after verification.
struct Rejection {
    reason: RejectReason,
    detail: String,
}

fn reject(reason: RejectReason, detail: impl Into<String>) -> Rejection {
    Rejection {
        reason,
        detail: detail.into(),
    }
}

/// The one verification path of every signed envelope: algorithm, shape, device, revocation,
/// signature over the canonical bytes received, then the clock.
async fn verify_envelope(st: &AppState, env: &SignedEnvelope) -> Result<Verified, Rejection> {
    if env.signature.alg != signing::ALG {
        return Err(reject(
            RejectReason::UnsupportedAlg,
            format!(
                "signature algorithm `{}` is not `ed25519`",
                env.signature.alg
            ),
        ));
    }
    let command: SteerCommand = serde_json::from_value(env.command.clone()).map_err(|e| {
        reject(
            RejectReason::InvalidCommand,
            format!("the command is not well-formed: {e}"),
        )
    })?;
    let lookup = async {
        let mut tx = st.store.read().await?;
        let device = tx.device(&env.signature.key_id).await?;
        let user = match &device {
            Some(d) => tx.user_by_id(&d.user_id).await?,
            None => None,
        };
        Ok::<_, StoreError>((device, user))
    };
    let (device, user) = lookup.await.map_err(|e| {
        tracing::error!(error = %e, "device lookup failed");
        reject(
            RejectReason::InvalidCommand,
            "the server could not look up the device; retry",
        )
    })?;
    let (Some(device), Some(user)) = (device, user) else {
        return Err(reject(
            RejectReason::UnknownDevice,
            format!(
                "no device `{}` — pair it with `waymark pair`",
                env.signature.key_id
            ),
        ));
    };
    if command.device_id != env.signature.key_id {
        return Err(reject(
            RejectReason::DeviceMismatch,
            "`command.device_id` differs from `signature.key_id`",
        ));
    }
    if device.revoked_at.is_some() {
        return Err(reject(
            RejectReason::DeviceRevoked,
            format!("device `{}` was revoked", device.id),
        ));
    }
    let key = signing::public_key(&device.public_key).map_err(|_| {
        reject(
            RejectReason::BadSignature,
            "the device's stored key is unusable",
        )
    })?;
    signing::verify(env, &key).map_err(|e| match e {
        signing::SigningError::InexactNumber => reject(
            RejectReason::InvalidCommand,
            format!("{e}; keep integers within ±9007199254740991"),
        ),
        e => reject(
            RejectReason::BadSignature,
            format!("{e}: the command was changed or not signed by this device"),
        ),
    })?;
    let now = now_ms();
    let issued = command.issued_at.timestamp_millis();
    let expires = command.expires_at.timestamp_millis();
    if issued > now + SKEW_MS {
        return Err(reject(
            RejectReason::ClockSkew,
            "`issued_at` is in the future: check the device's clock",
        ));
    }
    if expires <= now {
        return Err(reject(
            RejectReason::Expired,
            "the command expired before it arrived; decide again",
        ));
    }
    if expires - issued > MAX_LIFETIME_MS {
        return Err(reject(
            RejectReason::LifetimeTooLong,
            "a command may live at most 7 days",
        ));
    }
    if command.command_id.trim().is_empty() || command.command_id.len() > 128 {
        return Err(reject(
            RejectReason::InvalidCommand,
            "`command_id` must be 1–128 characters",
        ));
    }
    let body_digest = sha256_hex(&canonical_json(&env.command).unwrap_or_default());
    Ok(Verified {
        device,
        user,
        command,
        body_digest,
    })
}

fn result(status: CommandStatus, command_id: &str, detail: impl Into<String>) -> CommandResult {
    CommandResult {
        status,
        command_id: command_id.to_owned(),
        task_id: None,
        operation: None,
        reason: None,
        detail: detail.into(),
        based_on_revision: None,
        plan_revision: None,
        task_state: None,
        cursor: None,
        original: None,
    }
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

fn required_scope(op: Operation) -> &'static str {
    match op {
        Operation::Approve | Operation::Deny => "approve",
        Operation::OpenSession => "view",
        _ => "steer",
    }
}

fn has_scope(device: &DeviceRow, scope: &str) -> bool {
    device
        .scopes
        .as_array()
        .is_some_and(|a| a.iter().any(|s| s == scope))
}

#[utoipa::path(post, path = "/v1/devices/{device}/session", tag = "device", request_body = SignedEnvelope, security(()),
    params(("device" = String, Path)),
    responses((status = 201, body = DeviceSession), (status = 403, body = CommandResult)))]
pub(crate) async fn open_session(
    State(st): State<AppState>,
    Path(device_id): Path<String>,
    Json(env): Json<SignedEnvelope>,
) -> ApiResult<Response> {
    let refused = |st: AppState, r: Rejection, id: String| async move {
        record_refusal(
            &st,
            &format!("device:{id}"),
            "device.session",
            None,
            r.reason.as_str(),
            &r.detail,
        )
        .await;
        let mut res = result(CommandStatus::Rejected, "", r.detail);
        res.reason = Some(r.reason);
        res.operation = Some(Operation::OpenSession);
        Ok((http_status(&res), Out(res)).into_response())
    };
    let v = match verify_envelope(&st, &env).await {
        Ok(v) => v,
        Err(r) => return refused(st.clone(), r, device_id).await,
    };
    if v.device.id != device_id || v.command.operation != Operation::OpenSession {
        let r = reject(
            RejectReason::InvalidCommand,
            "a session is opened by an `open_session` command signed by this device",
        );
        return refused(st.clone(), r, device_id).await;
    }
    if !has_scope(&v.device, "view") {
        return refused(
            st.clone(),
            reject(
                RejectReason::MissingScope,
                "the device lacks the `view` scope",
            ),
            device_id,
        )
        .await;
    }
    let mut tx = st.store.write().await?;
    if tx.command(&v.command.command_id).await?.is_some() {
        drop(tx);
        return refused(
            st.clone(),
            reject(
                RejectReason::CommandIdReused,
                "this `open_session` was used already; sign a new one",
            ),
            device_id,
        )
        .await;
    }
    let token = new_secret(CallerKind::Device);
    let expires_at = now_ms() + SESSION_MS;
    tx.insert_device_session(&DeviceSessionRow {
        token_hash: secret_hash(&token),
        device_id: v.device.id.clone(),
        created_at: now_ms(),
        expires_at,
    })
    .await?;
    let mut res = result(
        CommandStatus::Applied,
        &v.command.command_id,
        "session opened",
    );
    res.operation = Some(Operation::OpenSession);
    tx.insert_command(&CommandRow {
        command_id: v.command.command_id.clone(),
        task_id: None,
        device_id: v.device.id.clone(),
        body_digest: v.body_digest,
        operation: Operation::OpenSession.as_str().into(),
        envelope: serde_json::to_value(&env).unwrap_or_default(),
        status: "applied".into(),
        result: serde_json::to_value(&res).unwrap_or_default(),
        created_at: now_ms(),
    })
    .await?;
    tx.commit().await?;
    Ok((
        StatusCode::CREATED,
        Out(DeviceSession {
            token,
            expires_at: convert::dt(expires_at),
        }),
    )
        .into_response())
}

#[utoipa::path(post, path = "/v1/commands", tag = "device", request_body = SignedEnvelope, security(()),
    responses((status = 200, body = CommandResult, description = "`applied` or `duplicate`"),
              (status = 409, body = CommandResult, description = "`conflict`: the plan moved on"),
              (status = 403, body = CommandResult, description = "`rejected`: signature, device, ownership or scope"),
              (status = 422, body = CommandResult, description = "`rejected`: expired, reused id, stale approval…")))]
pub(crate) async fn submit(
    State(st): State<AppState>,
    Json(env): Json<SignedEnvelope>,
) -> ApiResult<Response> {
    st.rate_limit(&format!("device:{}", env.signature.key_id))?;
    let command_id = env
        .command
        .get("command_id")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let task_hint = env
        .command
        .get("task_id")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let v = match verify_envelope(&st, &env).await {
        Ok(v) => v,
        Err(r) => {
            // Not recorded in the ledger: an unverified sender must not squat a command id.
            record_refusal(
                &st,
                &format!("device:{}", env.signature.key_id),
                "command.submit",
                task_hint.as_deref(),
                r.reason.as_str(),
                &r.detail,
            )
            .await;
            let mut res = result(CommandStatus::Rejected, &command_id, r.detail);
            res.reason = Some(r.reason);
            res.task_id = task_hint;
            return Ok((http_status(&res), Out(res)).into_response());
        }
    };
    let res = apply(&st, &env, v).await?;
    if res.status == CommandStatus::Rejected || res.status == CommandStatus::Conflict {
        let code = res.reason.map_or("conflict", RejectReason::as_str);
        record_refusal(
            &st,
            &format!("device:{}", env.signature.key_id),
            "command.submit",
            res.task_id.as_deref(),
            code,
            &res.detail,
        )
        .await;
    }
    Ok((http_status(&res), Out(res)).into_response())
}

/// Applies a verified command in one transaction: ledger row, task change, control command
/// and event commit together or not at all.
async fn apply(st: &AppState, env: &SignedEnvelope, v: Verified) -> ApiResult<CommandResult> {
    let mut tx = st.store.write().await?;
    let cmd = &v.command;
    if let Some(prev) = tx.command(&cmd.command_id).await? {
        if prev.body_digest == v.body_digest {
            let original: CommandResult = serde_json::from_value(prev.result)
                .unwrap_or_else(|_| result(CommandStatus::Rejected, &cmd.command_id, "unreadable"));
            let mut res = result(
                CommandStatus::Duplicate,
                &cmd.command_id,
                "this command was delivered before; it was applied once",
            );
            res.task_id = original.task_id.clone();
            res.operation = original.operation;
            res.original = Some(Box::new(original));
            return Ok(res);
        }
        let mut res = result(
            CommandStatus::Rejected,
            &cmd.command_id,
            "this command id was used before with a different body; sign a new command",
        );
        res.reason = Some(RejectReason::CommandIdReused);
        res.task_id = cmd.task_id.clone();
        return Ok(res);
    }
    let mut res = result(CommandStatus::Applied, &cmd.command_id, "");
    res.operation = Some(cmd.operation);
    res.task_id = cmd.task_id.clone();
    res.based_on_revision = cmd.expected_plan_revision;
    let outcome = decide(&mut tx, &v, &mut res).await?;
    match outcome {
        Ok(()) => {}
        Err(r) => {
            res.status = CommandStatus::Rejected;
            res.reason = Some(r.reason);
            res.detail = r.detail;
        }
    }
    let task = match &cmd.task_id {
        Some(id) => tx.task(id).await?.filter(|t| t.owner_id == v.user.id),
        None => None,
    };
    if let Some(task) = task {
        res.plan_revision = Some(task.plan_revision);
        res.task_state = task.state.parse().ok();
        if res.status == CommandStatus::Applied {
            emit(&mut tx, &task, EventKind::CommandApplied, &res).await?;
            let wire = crate::domain::core::task_wire(&mut tx, &task).await?;
            res.cursor = Some(emit(&mut tx, &task, EventKind::TaskUpdated, wire).await?);
        }
    }
    tx.insert_command(&CommandRow {
        command_id: cmd.command_id.clone(),
        task_id: cmd.task_id.clone(),
        device_id: v.device.id.clone(),
        body_digest: v.body_digest.clone(),
        operation: cmd.operation.as_str().into(),
        envelope: serde_json::to_value(env).unwrap_or_default(),
        status: serde_json::to_value(res.status)
            .ok()
            .and_then(|s| s.as_str().map(str::to_owned))
            .unwrap_or_default(),
        result: serde_json::to_value(&res).unwrap_or_default(),
        created_at: now_ms(),
    })
    .await?;
    tx.commit().await?;
    Ok(res)
}

/// Checks and applies one operation. Everything is checked before anything is written, so a
/// rejection leaves the task untouched.
async fn decide(
    tx: &mut Tx,
    v: &Verified,
    res: &mut CommandResult,
) -> ApiResult<Result<(), Rejection>> {
    let cmd = &v.command;
    if cmd.operation == Operation::OpenSession {
        return Ok(Err(reject(
            RejectReason::WrongOperation,
            "open a session with `POST /v1/devices/{device}/session`",
        )));
    }
    let Some(task_id) = &cmd.task_id else {
        return Ok(Err(reject(
            RejectReason::InvalidCommand,
            "`task_id` is required",
        )));
    };
    let Some(mut task) = tx.task(task_id).await?.filter(|t| t.owner_id == v.user.id) else {
        return Ok(Err(reject(
            RejectReason::NotYourTask,
            format!("no task `{task_id}` of user `{}`", v.user.name),
        )));
    };
    let scope = required_scope(cmd.operation);
    if !has_scope(&v.device, scope) {
        return Ok(Err(reject(
            RejectReason::MissingScope,
            format!(
                "`{}` needs the `{scope}` scope; pair with it",
                cmd.operation
            ),
        )));
    }
    let state: TaskState = task.state.parse().unwrap_or(TaskState::Running);
    if state.is_terminal() {
        return Ok(Err(reject(
            RejectReason::TaskTerminal,
            format!("the task is {state}"),
        )));
    }
    // Compare-and-set on the plan revision. Pause is the exception: stopping is always safe.
    if cmd.operation != Operation::Pause {
        let Some(expected) = cmd.expected_plan_revision else {
            return Ok(Err(reject(
                RejectReason::InvalidCommand,
                "`expected_plan_revision` is required",
            )));
        };
        if expected != task.plan_revision {
            res.status = CommandStatus::Conflict;
            res.detail = format!(
                "the plan moved on: you decided at revision {expected}, it is now at revision {}; review and decide again",
                task.plan_revision
            );
            return Ok(Ok(()));
        }
    }
    let now = now_ms();
    let by = format!("user:{}", v.user.name);
    let mut control: Option<Value> = None;
    match cmd.operation {
        Operation::Pause => {
            task.state = TaskState::Paused.as_str().into();
            control = Some(json!({}));
            res.detail = match cmd.expected_plan_revision {
                Some(e) if e != task.plan_revision => format!(
                    "paused; you decided at revision {e} and met revision {} — pause applies regardless",
                    task.plan_revision
                ),
                _ => "paused: no new step starts; nothing is rolled back".into(),
            };
        }
        Operation::Resume => {
            if state != TaskState::Paused {
                return Ok(Err(reject(
                    RejectReason::InvalidState,
                    format!("the task is {state}, not paused"),
                )));
            }
            task.state = resumed_state(tx, &task).await?.as_str().into();
            control = Some(json!({}));
            res.detail = "resumed".into();
        }
        Operation::Cancel => {
            task.state = TaskState::Cancelled.as_str().into();
            task.outcome_summary = Some(format!("cancelled by {by}"));
            revoke_attempts(tx, &task, now).await?;
            let mut flagged = Vec::new();
            for mut e in tx.list_effects(&task.id).await? {
                let s: EffectStatus = e.status.parse().unwrap_or(EffectStatus::Unknown);
                if !s.is_terminal() && s != EffectStatus::FailedCompensable {
                    e.flag =
                        Some("cancelled while under way: reconcile before anything else".into());
                    e.updated_at = now;
                    tx.update_effect(&e).await?;
                    emit(tx, &task, EventKind::EffectUpdated, convert::effect(&e)?).await?;
                    flagged.push(e.id.clone());
                }
            }
            void_decisions(tx, &task.id, false, &by).await?;
            control = Some(json!({"effects_to_reconcile": flagged}));
            res.detail = if flagged.is_empty() {
                "cancelled: the lease is revoked and the worker told to stop".into()
            } else {
                format!(
                    "cancelled: the lease is revoked; {} effect(s) under way are flagged for reconciliation",
                    flagged.len()
                )
            };
        }
        Operation::Replan | Operation::SuspendAndReplan => {
            if let Some(plan) = cmd.args.get("plan") {
                let steps: Vec<PlanStep> = match serde_json::from_value(plan.clone()) {
                    Ok(s) => s,
                    Err(e) => {
                        return Ok(Err(reject(
                            RejectReason::InvalidCommand,
                            format!("`args.plan`: {e}"),
                        )));
                    }
                };
                if let Err(e) = validate_plan(&steps) {
                    return Ok(Err(reject(
                        RejectReason::InvalidCommand,
                        e.problem.detail.clone(),
                    )));
                }
                task.plan = serde_json::to_value(steps).unwrap_or_default();
            }
            let instructions = cmd
                .args
                .get("instructions")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            task.plan_revision += 1;
            for mut e in tx.list_effects(&task.id).await? {
                if e.status == EffectStatus::Intended.as_str() && e.flag.is_none() {
                    e.flag = Some(format!(
                        "superseded by plan revision {}: declare it again under the new plan",
                        task.plan_revision
                    ));
                    e.updated_at = now;
                    tx.update_effect(&e).await?;
                    emit(tx, &task, EventKind::EffectUpdated, convert::effect(&e)?).await?;
                }
            }
            let voided = void_decisions(tx, &task.id, true, &by).await?;
            if matches!(state, TaskState::WaitingApproval | TaskState::WaitingHuman)
                && tx.pending_decision_count(&task.id).await? == 0
            {
                task.state = TaskState::Running.as_str().into();
            }
            control =
                Some(json!({"instructions": instructions, "scope": cmd.scope, "plan": task.plan}));
            res.detail = format!(
                "plan revision {} with new instructions; {voided} pending approval(s) void",
                task.plan_revision
            );
        }
        Operation::Approve
        | Operation::Deny
        | Operation::AnswerQuestion
        | Operation::ChooseOption => {
            let out = answer(tx, &task, cmd, &by, now).await?;
            if let Err(r) = out {
                return Ok(Err(r));
            }
            res.detail = "answered".into();
            // close_decision may have moved the task back to running.
            task = tx.task(&task.id).await?.unwrap_or(task);
        }
        Operation::TakeOver => {
            revoke_attempts(tx, &task, now).await?;
            task.state = TaskState::Paused.as_str().into();
            control = Some(json!({"new_owner": by}));
            res.detail = format!("{by} holds control; the agent's attempt is fenced off");
        }
        Operation::OpenSession => unreachable!("handled above"),
    }
    task.updated_at = now;
    tx.update_task(&task).await?;
    if let Some(args) = control {
        tx.insert_control(&ControlRow {
            command_id: cmd.command_id.clone(),
            task_id: task.id.clone(),
            operation: cmd.operation.as_str().into(),
            args,
            plan_revision: task.plan_revision,
            applied_at: now,
            acknowledged_at: None,
            acknowledged_by: None,
            seq: 0,
        })
        .await?;
    }
    Ok(Ok(()))
}

/// Where a resumed task goes: back to waiting if decisions are open, running if a worker
/// holds a live lease, else queued for one.
async fn resumed_state(tx: &mut Tx, task: &TaskRow) -> ApiResult<TaskState> {
    let decisions = tx.list_decisions(&task.id).await?;
    let pending: Vec<_> = decisions.iter().filter(|d| d.status == "pending").collect();
    if pending.iter().any(|d| d.kind == "approval") {
        return Ok(TaskState::WaitingApproval);
    }
    if !pending.is_empty() {
        return Ok(TaskState::WaitingHuman);
    }
    let now = now_ms();
    let live = tx
        .list_attempts(&task.id)
        .await?
        .iter()
        .any(|a| a.state == "active" && a.expires_at > now);
    Ok(if live {
        TaskState::Running
    } else {
        TaskState::Queued
    })
}

async fn revoke_attempts(tx: &mut Tx, task: &TaskRow, now: i64) -> ApiResult<()> {
    for mut a in tx.list_attempts(&task.id).await? {
        if a.state == AttemptState::Active.as_str() {
            a.state = AttemptState::Revoked.as_str().into();
            a.ended_at = Some(now);
            tx.update_attempt(&a).await?;
            emit(tx, task, EventKind::AttemptEnded, convert::attempt(&a)?).await?;
        }
    }
    Ok(())
}

/// Voids pending decisions (only approvals when `approvals_only`). Returns how many.
async fn void_decisions(
    tx: &mut Tx,
    task_id: &str,
    approvals_only: bool,
    by: &str,
) -> ApiResult<usize> {
    let mut n = 0;
    for mut d in tx.list_decisions(task_id).await? {
        if d.status != "pending" || (approvals_only && d.kind != "approval") {
            continue;
        }
        let text = if approvals_only {
            "void: the plan was revised; the agent must ask again"
        } else {
            "void: the task was cancelled"
        };
        let outcome = DecisionOutcome {
            option: None,
            text: Some(text.into()),
            by: by.to_owned(),
            at: Utc::now(),
        };
        close_decision(tx, &mut d, DecisionStatus::Void, outcome).await?;
        n += 1;
    }
    Ok(n)
}

/// approve / deny / answer_question / choose_option: bound to the decision id, and for
/// approvals to the intent digest and the plan revision.
async fn answer(
    tx: &mut Tx,
    task: &TaskRow,
    cmd: &SteerCommand,
    by: &str,
    now: i64,
) -> ApiResult<Result<(), Rejection>> {
    let Some(decision_id) = cmd.args.get("decision_id").and_then(Value::as_str) else {
        return Ok(Err(reject(
            RejectReason::InvalidCommand,
            "`args.decision_id` is required",
        )));
    };
    let Some(mut d) = tx
        .decision(decision_id)
        .await?
        .filter(|d| d.task_id == task.id)
    else {
        return Ok(Err(reject(
            RejectReason::InvalidCommand,
            format!("no decision `{decision_id}` on this task"),
        )));
    };
    if d.status != "pending" {
        return Ok(Err(reject(
            RejectReason::DecisionClosed,
            format!("the decision is {}", d.status),
        )));
    }
    if d.expires_at <= now {
        return Ok(Err(reject(
            RejectReason::ApprovalExpired,
            "the decision expired; its default applies",
        )));
    }
    let is_approval = d.kind == "approval";
    let (option, text) = match cmd.operation {
        Operation::Approve | Operation::Deny => {
            if !is_approval {
                return Ok(Err(reject(
                    RejectReason::WrongOperation,
                    "approve and deny answer approvals; use `choose_option` or `answer_question`",
                )));
            }
            if d.plan_revision != task.plan_revision {
                return Ok(Err(reject(
                    RejectReason::ApprovalSuperseded,
                    format!(
                        "the approval was asked at plan revision {}, the plan is at {}; the agent must ask again",
                        d.plan_revision, task.plan_revision
                    ),
                )));
            }
            let given = cmd.args.get("intent_digest").and_then(Value::as_str);
            if given != d.intent_digest.as_deref() {
                return Ok(Err(reject(
                    RejectReason::DigestMismatch,
                    "the intent digest you approved is not the one the agent asked about",
                )));
            }
            let grant = cmd.operation == Operation::Approve;
            // A runtime's own choice (`approve_session`, `deny_always`) rides on approve/deny,
            // so it stays bound to the digest and the revision like the plain answer.
            let opt = match cmd.args.get("option").and_then(Value::as_str) {
                None => if grant { "approve" } else { "deny" }.to_owned(),
                Some(o) => {
                    let options: Vec<DecisionOption> =
                        serde_json::from_value(d.options.clone()).unwrap_or_default();
                    if !options.iter().any(|x| x.id == o)
                        || crate::domain::decisions::approval_grants(o) != Some(grant)
                    {
                        return Ok(Err(reject(
                            RejectReason::InvalidCommand,
                            format!(
                                "`{o}` is not a{} option of this approval",
                                if grant { " granting" } else { " refusing" }
                            ),
                        )));
                    }
                    o.to_owned()
                }
            };
            (
                Some(opt),
                cmd.args
                    .get("text")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
            )
        }
        Operation::ChooseOption => {
            if is_approval {
                return Ok(Err(reject(
                    RejectReason::WrongOperation,
                    "answer approvals with `approve` or `deny`",
                )));
            }
            let Some(opt) = cmd.args.get("option").and_then(Value::as_str) else {
                return Ok(Err(reject(
                    RejectReason::InvalidCommand,
                    "`args.option` is required",
                )));
            };
            let options: Vec<DecisionOption> =
                serde_json::from_value(d.options.clone()).unwrap_or_default();
            if !options.iter().any(|o| o.id == opt) {
                return Ok(Err(reject(
                    RejectReason::InvalidCommand,
                    format!("`{opt}` is not an option of this decision"),
                )));
            }
            (Some(opt.to_owned()), None)
        }
        _ => {
            if is_approval {
                return Ok(Err(reject(
                    RejectReason::WrongOperation,
                    "answer approvals with `approve` or `deny`",
                )));
            }
            let Some(text) = cmd
                .args
                .get("text")
                .and_then(Value::as_str)
                .filter(|t| !t.trim().is_empty())
            else {
                return Ok(Err(reject(
                    RejectReason::InvalidCommand,
                    "`args.text` is required",
                )));
            };
            (
                cmd.args
                    .get("option")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                Some(text.to_owned()),
            )
        }
    };
    let outcome = DecisionOutcome {
        option,
        text,
        by: by.to_owned(),
        at: Utc::now(),
    };
    close_decision(tx, &mut d, DecisionStatus::Resolved, outcome).await?;
    Ok(Ok(()))
}

fn control_wire(c: &ControlRow) -> ControlCommand {
    ControlCommand {
        command_id: c.command_id.clone(),
        operation: c.operation.parse().unwrap_or(Operation::Pause),
        args: c.args.clone(),
        plan_revision: c.plan_revision,
        applied_at: convert::dt(c.applied_at),
        seq: c.seq,
    }
}

/// Control commands a worker has not acknowledged, and acknowledges the ones it reports.
pub(crate) async fn exchange_controls(
    tx: &mut Tx,
    task: &TaskRow,
    attempt_id: &str,
    acknowledged: &[String],
) -> ApiResult<Vec<ControlCommand>> {
    for id in acknowledged {
        if tx.ack_control(&task.id, id, now_ms(), attempt_id).await? {
            let ack = CommandAck {
                command_id: id.clone(),
                task_id: task.id.clone(),
                attempt_id: attempt_id.to_owned(),
                at: Utc::now(),
            };
            emit(tx, task, EventKind::CommandAcknowledged, ack).await?;
        }
    }
    Ok(tx
        .pending_controls(&task.id)
        .await?
        .iter()
        .map(control_wire)
        .collect())
}

#[utoipa::path(get, path = "/v1/attempts/{attempt}/control", tag = "worker", params(("attempt" = String, Path)),
    responses((status = 200, content_type = "text/event-stream",
               description = "SSE: `event: control` with a ControlCommand until acknowledged (by heartbeat); `event: revoked` when the attempt loses the task")))]
pub(crate) async fn control_stream(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path(attempt_id): Path<String>,
) -> ApiResult<Response> {
    let mut tx = st.store.read().await?;
    let attempt = tx
        .attempt(&attempt_id)
        .await?
        .ok_or_else(|| ApiError::not_found("attempt", &attempt_id))?;
    task_for(&mut tx, &caller, &attempt.task_id).await?;
    drop(tx);
    let slot = st.open_stream(&caller)?;
    let stream = controls(st.clone(), attempt.task_id, attempt_id, slot);
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(st.config.keep_alive))
        .into_response())
}

fn controls(
    st: AppState,
    task_id: String,
    attempt_id: String,
    slot: crate::limits::StreamSlot,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    async_stream::stream! {
        let _slot = slot;
        let mut watch = st.cursor_watch();
        let mut stopping = st.stopping.subscribe();
        let mut sent: HashSet<String> = HashSet::new();
        loop {
            watch.borrow_and_update();
            let read = async {
                let mut tx = st.store.read().await?;
                let pending = tx.pending_controls(&task_id).await?;
                let attempt = tx.attempt(&attempt_id).await?;
                Ok::<_, StoreError>((pending, attempt))
            }.await;
            let Ok((pending, attempt)) = read else { break };
            for c in pending {
                if sent.insert(c.command_id.clone()) {
                    let data = serde_json::to_string(&control_wire(&c)).unwrap_or_default();
                    yield Ok(SseEvent::default().event("control").id(c.command_id.clone()).data(data));
                }
            }
            match attempt {
                Some(a) if a.state == AttemptState::Active.as_str() => {}
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
        }
    }
}

/// `waymark admin pair`: a one-time code for `user` with `scopes`, valid for `ttl_ms`.
pub async fn create_pairing(
    store: &dyn Store,
    user: &str,
    scopes: &[String],
    ttl_ms: i64,
) -> Result<(String, i64), crate::AdminError> {
    use rand::Rng;
    const ALPHABET: &[u8] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
    for s in scopes {
        if !["view", "steer", "approve"].contains(&s.as_str()) {
            return Err(crate::AdminError::InvalidScope(s.clone()));
        }
    }
    let user = store
        .read()
        .await?
        .user_by_name(user)
        .await?
        .ok_or_else(|| crate::AdminError::UnknownUser(user.to_owned()))?;
    let mut rng = rand::rngs::OsRng;
    let raw: String = (0..8)
        .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
        .collect();
    let code = format!("{}-{}", &raw[..4], &raw[4..]);
    let now = now_ms();
    let mut tx = store.write().await?;
    tx.insert_pairing(&PairingRow {
        code_hash: code_hash(&code),
        user_id: user.id,
        scopes: json!(scopes),
        created_at: now,
        expires_at: now + ttl_ms,
        used_at: None,
        device_id: None,
    })
    .await?;
    tx.commit().await?;
    Ok((code, now + ttl_ms))
}

/// `waymark admin device list`.
pub async fn list_devices(store: &dyn Store) -> Result<Vec<Device>, crate::AdminError> {
    let mut tx = store.read().await?;
    let mut out = Vec::new();
    for d in tx.list_devices(None).await? {
        let user = tx
            .user_by_id(&d.user_id)
            .await?
            .map(|u| u.name)
            .unwrap_or_default();
        out.push(device_wire(&d, &user));
    }
    Ok(out)
}

/// `waymark admin device revoke`: immediate; later sessions and commands are refused.
pub async fn revoke_device(store: &dyn Store, id: &str) -> Result<Device, crate::AdminError> {
    let mut tx = store.write().await?;
    let mut d = tx
        .device(id)
        .await?
        .ok_or_else(|| crate::AdminError::UnknownDevice(id.to_owned()))?;
    if d.revoked_at.is_none() {
        d.revoked_at = Some(now_ms());
        tx.update_device(&d).await?;
    }
    let user = tx
        .user_by_id(&d.user_id)
        .await?
        .map(|u| u.name)
        .unwrap_or_default();
    tx.commit().await?;
    Ok(device_wire(&d, &user))
}

/// A ledger entry as the admin sees it: the signed envelope is the evidence.
#[derive(Debug, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub(crate) struct LedgerEntry {
    command_id: String,
    device_id: String,
    operation: String,
    status: String,
    envelope: SignedEnvelope,
    result: CommandResult,
    at: chrono::DateTime<Utc>,
}

#[utoipa::path(get, path = "/v1/admin/tasks/{task}/commands", tag = "admin", params(("task" = String, Path)),
    responses((status = 200, body = Vec<LedgerEntry>)))]
pub(crate) async fn admin_ledger(
    State(st): State<AppState>,
    caller: crate::auth::Caller,
    Path(task_id): Path<String>,
) -> ApiResult<Out<Vec<LedgerEntry>>> {
    crate::reads::admin_only(&caller)?;
    let rows = st.store.read().await?.list_commands(&task_id).await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        out.push(LedgerEntry {
            command_id: r.command_id,
            device_id: r.device_id,
            operation: r.operation,
            status: r.status,
            envelope: serde_json::from_value(r.envelope).map_err(|e| {
                ApiError::new(ErrorCode::Internal, format!("corrupt ledger entry: {e}"))
            })?,
            result: serde_json::from_value(r.result).map_err(|e| {
                ApiError::new(ErrorCode::Internal, format!("corrupt ledger entry: {e}"))
            })?,
            at: convert::dt(r.created_at),
        });
    }
    Ok(Out(out))
}
