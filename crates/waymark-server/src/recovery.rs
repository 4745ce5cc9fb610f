//! Recovery over HTTP: a worker's reconciliation reports and the resources it released. The
//! rules (lease sweeper, admission, reconciliation, compensation) are in
//! `crate::domain::recovery`.

use axum::Json as Out;
use axum::extract::{Path, State};
use waymark_proto::*;

use crate::auth::WorkerCaller;
use crate::domain::recovery;
use crate::error::ApiResult;
use crate::extract::Json;
use crate::state::AppState;

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
