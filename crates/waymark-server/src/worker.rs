//! The worker side of API v1 over HTTP: tasks, attempts and leases, checkpoints, effects,
//! approvals and decisions, artifacts, test receipts, messages, usage, finish. Each handler
//! parses, authorises and answers; the rules are in `crate::domain`.

use axum::Json as Out;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use waymark_proto::*;

use crate::auth::WorkerCaller;
use crate::domain::core::Made;
use crate::domain::evidence::{ArtifactQuery, MessagesAppended};
use crate::domain::{checkpoints, decisions, effects, evidence, leases, tasks};
use crate::error::ApiResult;
use crate::extract::{Json, Query, read_limited};
use crate::state::AppState;

/// `201 Created` for a new row, `200 OK` for one found again; the body carries the cursor.
pub(crate) type Created<T> = (StatusCode, Out<Written<T>>);

/// What a write made, as HTTP answers it.
pub(crate) fn made<T>(m: Made<T>) -> Created<T> {
    let status = if m.new {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    (
        status,
        Out(Written {
            cursor: m.cursor,
            value: m.value,
        }),
    )
}

#[utoipa::path(post, path = "/v1/tasks", tag = "worker", request_body = CreateTask,
    responses((status = 201, body = Task, description = "created; the body also carries `cursor`"),
              (status = 200, body = Task, description = "a task with this `runtime` and `external_key` exists already"),
              (status = 422, body = Problem)))]
pub(crate) async fn create_task(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Json(req): Json<CreateTask>,
) -> ApiResult<Created<Task>> {
    Ok(made(tasks::create_task(&st, &caller, req).await?))
}

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

#[utoipa::path(post, path = "/v1/tasks/{task}/checkpoints", tag = "worker", request_body = AppendCheckpoint,
    params(("task" = String, Path, pattern = r"^task_[0-9a-f]{32}$")),
    responses((status = 201, body = Checkpoint), (status = 409, body = Problem, description = "`sequence_conflict`, `fenced`, `lease_expired`")))]
pub(crate) async fn append_checkpoint(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path(task_id): Path<String>,
    Json(req): Json<AppendCheckpoint>,
) -> ApiResult<Created<Checkpoint>> {
    Ok(made(
        checkpoints::append_checkpoint(&st, &caller, task_id, req).await?,
    ))
}

#[utoipa::path(post, path = "/v1/tasks/{task}/effects", tag = "worker", request_body = DeclareEffect,
    params(("task" = String, Path, pattern = r"^task_[0-9a-f]{32}$")),
    responses((status = 201, body = EffectDeclared, description = "declared"),
              (status = 200, body = EffectDeclared, description = "the same key and body were declared before"),
              (status = 422, body = Problem, description = "`idempotency_mismatch`")))]
pub(crate) async fn declare_effect(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path(task_id): Path<String>,
    Json(req): Json<DeclareEffect>,
) -> ApiResult<Created<EffectDeclared>> {
    Ok(made(
        effects::declare_effect(&st, &caller, task_id, req).await?,
    ))
}

#[utoipa::path(patch, path = "/v1/effects/{effect}", tag = "worker", request_body = UpdateEffect,
    params(("effect" = String, Path, pattern = r"^eff_[0-9a-f]{32}$")),
    responses((status = 200, body = Effect), (status = 409, body = Problem, description = "`illegal_transition`, `fenced`")))]
pub(crate) async fn update_effect(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path(effect_id): Path<String>,
    Json(req): Json<UpdateEffect>,
) -> ApiResult<Out<Written<Effect>>> {
    Ok(Out(
        effects::update_effect(&st, &caller, effect_id, req).await?
    ))
}

#[utoipa::path(post, path = "/v1/tasks/{task}/approvals", tag = "worker", request_body = RequestApproval,
    params(("task" = String, Path, pattern = r"^task_[0-9a-f]{32}$")),
    responses((status = 201, body = Decision), (status = 422, body = Problem)))]
pub(crate) async fn request_approval(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path(task_id): Path<String>,
    Json(req): Json<RequestApproval>,
) -> ApiResult<Created<Decision>> {
    Ok(made(
        decisions::request_approval(&st, &caller, task_id, req, false).await?,
    ))
}

#[utoipa::path(post, path = "/v1/tasks/{task}/decisions", tag = "worker", request_body = RequestDecision,
    params(("task" = String, Path, pattern = r"^task_[0-9a-f]{32}$")),
    responses((status = 201, body = Decision), (status = 422, body = Problem)))]
pub(crate) async fn request_decision(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path(task_id): Path<String>,
    Json(req): Json<RequestDecision>,
) -> ApiResult<Created<Decision>> {
    Ok(made(
        decisions::request_decision(&st, &caller, task_id, req).await?,
    ))
}

#[utoipa::path(post, path = "/v1/admin/decisions/{decision}/resolve", tag = "admin", request_body = ResolveDecision,
    params(("decision" = String, Path, pattern = r"^dec_[0-9a-f]{32}$")),
    responses((status = 200, body = Decision), (status = 409, body = Problem, description = "`decision_closed`, `revision_conflict`")))]
pub(crate) async fn admin_resolve(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path(decision_id): Path<String>,
    Json(req): Json<ResolveDecision>,
) -> ApiResult<Out<Written<Decision>>> {
    Ok(Out(decisions::admin_resolve(
        &st,
        &caller,
        decision_id,
        req,
    )
    .await?))
}

#[utoipa::path(post, path = "/v1/tasks/{task}/decisions/{decision}/delivery", tag = "worker", request_body = ReportDelivery,
    params(("task" = String, Path, pattern = r"^task_[0-9a-f]{32}$"), ("decision" = String, Path, pattern = r"^dec_[0-9a-f]{32}$")),
    responses((status = 200, body = Decision),
              (status = 409, body = Problem, description = "`decision_closed`: not an answered runtime approval, or its delivery was reported otherwise"),
              (status = 422, body = Problem)))]
pub(crate) async fn report_delivery(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path((task_id, decision_id)): Path<(String, String)>,
    Json(req): Json<ReportDelivery>,
) -> ApiResult<Out<Written<Decision>>> {
    Ok(Out(decisions::report_delivery(
        &st,
        &caller,
        task_id,
        decision_id,
        req,
    )
    .await?))
}

#[utoipa::path(post, path = "/v1/tasks/{task}/decisions/{decision}/expire", tag = "worker", request_body = ExpireDecision,
    params(("task" = String, Path, pattern = r"^task_[0-9a-f]{32}$"), ("decision" = String, Path, pattern = r"^dec_[0-9a-f]{32}$")),
    responses((status = 200, body = Decision),
              (status = 409, body = Problem, description = "`decision_closed`"),
              (status = 422, body = Problem)))]
pub(crate) async fn expire_decision(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path((task_id, decision_id)): Path<(String, String)>,
    Json(req): Json<ExpireDecision>,
) -> ApiResult<Out<Written<Decision>>> {
    Ok(Out(decisions::expire_held(
        &st,
        &caller,
        task_id,
        decision_id,
        req,
    )
    .await?))
}

#[utoipa::path(post, path = "/v1/tasks/{task}/artifacts", tag = "worker",
    params(("task" = String, Path, pattern = r"^task_[0-9a-f]{32}$"), ArtifactQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "the raw content; its media type in `Content-Type`"),
    responses((status = 201, body = Artifact), (status = 413, body = Problem)))]
pub(crate) async fn upload_artifact(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path(task_id): Path<String>,
    Query(q): Query<ArtifactQuery>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Created<Artifact>> {
    let media_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/octet-stream")
        .to_owned();
    let bytes = read_limited(body, st.config.max_blob_bytes, st.config.body_timeout).await?;
    Ok(made(
        evidence::upload_artifact(&st, &caller, task_id, q, media_type, &bytes).await?,
    ))
}

#[utoipa::path(post, path = "/v1/tasks/{task}/test-receipts", tag = "worker", request_body = SubmitTestReceipt,
    params(("task" = String, Path, pattern = r"^task_[0-9a-f]{32}$")),
    responses((status = 201, body = TestReceipt), (status = 422, body = Problem, description = "not JUnit XML")))]
pub(crate) async fn submit_test_receipt(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path(task_id): Path<String>,
    Json(req): Json<SubmitTestReceipt>,
) -> ApiResult<Created<TestReceipt>> {
    Ok(made(
        evidence::submit_test_receipt(&st, &caller, task_id, req).await?,
    ))
}

#[utoipa::path(post, path = "/v1/tasks/{task}/messages", tag = "worker", request_body = AppendMessages,
    params(("task" = String, Path, pattern = r"^task_[0-9a-f]{32}$")),
    responses((status = 201, body = MessagesAppended)))]
pub(crate) async fn append_messages(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path(task_id): Path<String>,
    Json(req): Json<AppendMessages>,
) -> ApiResult<Created<MessagesAppended>> {
    Ok(made(
        evidence::append_messages(&st, &caller, task_id, req).await?,
    ))
}

#[utoipa::path(post, path = "/v1/tasks/{task}/usage", tag = "worker", request_body = ReportUsage,
    params(("task" = String, Path, pattern = r"^task_[0-9a-f]{32}$")),
    responses((status = 200, body = UsageReported)))]
pub(crate) async fn report_usage(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path(task_id): Path<String>,
    Json(req): Json<ReportUsage>,
) -> ApiResult<Out<Written<UsageReported>>> {
    Ok(Out(
        evidence::report_usage(&st, &caller, task_id, req).await?
    ))
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
