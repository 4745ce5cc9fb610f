//! Follow-ups over HTTP: "do this later" for a task, and a look at the next nominal runs. The
//! rules are in `crate::domain::followups`.

use axum::Json as Out;
use axum::extract::{Path, State};
use waymark_proto::*;

use crate::auth::{Caller, WorkerCaller};
use crate::domain::followups;
use crate::domain::followups::NextQuery;
use crate::error::ApiResult;
use crate::extract::{Json, Query};
use crate::http::{Created, made};
use crate::state::AppState;

#[utoipa::path(post, path = "/v1/tasks/{task}/followups", tag = "worker", request_body = CreateFollowup,
    params(("task" = String, Path, pattern = r"^task_[0-9a-f]{32}$")),
    responses((status = 201, body = Followup), (status = 422, body = Problem)))]
pub(crate) async fn create(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path(task_id): Path<String>,
    Json(req): Json<CreateFollowup>,
) -> ApiResult<Created<Followup>> {
    Ok(made(followups::create(&st, &caller, task_id, req).await?))
}

#[utoipa::path(get, path = "/v1/followups/{followup}", tag = "read",
    params(("followup" = String, Path, pattern = r"^fup_[0-9a-f]{32}$"), NextQuery),
    responses((status = 200, body = FollowupPlan), (status = 404, body = Problem)))]
pub(crate) async fn get(
    State(st): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    Query(q): Query<NextQuery>,
) -> ApiResult<Out<FollowupPlan>> {
    Ok(Out(followups::get(&st, &caller, id, q).await?))
}
