//! Tasks over HTTP: create one (or find it again by its runtime key), read one (with its
//! chain verified), and what a worker adds to it — checkpoints, artifacts, test receipts,
//! messages, usage and reconciliation reports. The rules are in `waymark_domain::{tasks,
//! checkpoints, evidence, recovery}`.

use axum::Json as Out;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, header};
use waymark_proto::*;

use super::{Created, made};
use crate::auth::{Caller, WorkerCaller};
use crate::domain::evidence::{ArtifactQuery, MessagesAppended};
use crate::domain::{checkpoints, evidence, reads, recovery, tasks};
use crate::error::ApiResult;
use crate::extract::{Json, Query, read_limited};
use crate::state::AppState;

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

#[utoipa::path(get, path = "/v1/tasks/{task}", tag = "read", params(("task" = String, Path, pattern = r"^task_[0-9a-f]{32}$")),
    responses((status = 200, body = TaskDetail), (status = 404, body = Problem)))]
pub(crate) async fn task_detail(
    State(st): State<AppState>,
    caller: Caller,
    Path(task_id): Path<String>,
) -> ApiResult<Out<TaskDetail>> {
    Ok(Out(reads::task_detail(&st, &caller, task_id).await?))
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

#[utoipa::path(post, path = "/v1/tasks/{task}/reconciliation", tag = "worker", request_body = Reconcile,
    params(("task" = String, Path, pattern = r"^task_[0-9a-f]{32}$")),
    responses((status = 200, body = Reconciled), (status = 409, body = Problem, description = "`fenced`, `lease_expired`")))]
pub(crate) async fn reconcile(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path(task_id): Path<String>,
    Json(req): Json<Reconcile>,
) -> ApiResult<Out<Reconciled>> {
    Ok(Out(recovery::reconcile(&st, &caller, task_id, req).await?))
}
