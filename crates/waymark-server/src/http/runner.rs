//! Machines and runners over HTTP: people list machines; a runner (its token names its
//! machine) registers, waits for its work, reports each item, and says when a runtime process
//! ended. The rules are in `crate::domain::machines`.

use std::time::Duration;

use axum::Json as Out;
use axum::extract::{Path, State};
use serde::Deserialize;
use utoipa::IntoParams;
use waymark_proto::*;

use crate::auth::{Caller, WorkerCaller};
use crate::domain::machines;
use crate::error::ApiResult;
use crate::extract::{Json, Query};
use crate::state::AppState;

#[utoipa::path(get, path = "/v1/machines", tag = "read",
    responses((status = 200, body = MachineList)))]
pub(crate) async fn list(
    State(st): State<AppState>,
    caller: Caller,
) -> ApiResult<Out<MachineList>> {
    Ok(Out(machines::list(&st, &caller).await?))
}

#[utoipa::path(put, path = "/v1/runner/machine", tag = "runner", request_body = RegisterMachine,
    responses((status = 200, body = Machine), (status = 403, body = Problem), (status = 422, body = Problem)))]
pub(crate) async fn register(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Json(req): Json<RegisterMachine>,
) -> ApiResult<Out<Machine>> {
    Ok(Out(machines::register(&st, &caller, req).await?))
}

/// `GET /v1/runner/work`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct WorkQuery {
    /// Seconds to wait for work when there is none (0 to 20; default 0).
    #[param(minimum = 0, maximum = 20)]
    wait: Option<u64>,
}

#[utoipa::path(get, path = "/v1/runner/work", tag = "runner", params(WorkQuery),
    responses((status = 200, body = WorkList), (status = 403, body = Problem)))]
pub(crate) async fn work(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Query(q): Query<WorkQuery>,
) -> ApiResult<Out<WorkList>> {
    // Asking is the machine's heartbeat; then it waits, woken by every commit (and at least
    // every 2 s, for commits another replica made while this one's watch was quiet).
    let first = machines::open_work(&st, &caller).await?;
    let wait = Duration::from_secs(q.wait.unwrap_or(0).min(RUNNER_POLL_SECONDS));
    if !first.work.is_empty() || wait.is_zero() {
        return Ok(Out(first));
    }
    let deadline = tokio::time::Instant::now() + wait;
    let mut cursor = st.store.cursor_watch();
    let mut stopping = st.stopping.subscribe();
    loop {
        let slice = deadline
            .saturating_duration_since(tokio::time::Instant::now())
            .min(Duration::from_secs(2));
        if slice.is_zero() {
            return Ok(Out(first));
        }
        tokio::select! {
            _ = cursor.changed() => {}
            _ = tokio::time::sleep(slice) => {}
            _ = stopping.changed() => return Ok(Out(first)),
        }
        if machines::has_work(&st, &caller).await? {
            return Ok(Out(machines::open_work(&st, &caller).await?));
        }
    }
}

#[utoipa::path(post, path = "/v1/runner/work/{work}", tag = "runner", request_body = ReportWork,
    params(("work" = String, Path, pattern = r"^wrk_[0-9a-f]{32}$")),
    responses((status = 200, body = Work), (status = 404, body = Problem), (status = 409, body = Problem)))]
pub(crate) async fn report(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path(id): Path<String>,
    Json(req): Json<ReportWork>,
) -> ApiResult<Out<Work>> {
    Ok(Out(machines::report(&st, &caller, &id, req).await?))
}

#[utoipa::path(post, path = "/v1/runner/tasks/{task}/exited", tag = "runner", request_body = RunExited,
    params(("task" = String, Path, pattern = r"^task_[0-9a-f]{32}$")),
    responses((status = 200, body = ExitHandled), (status = 404, body = Problem)))]
pub(crate) async fn exited(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path(task): Path<String>,
    Json(req): Json<RunExited>,
) -> ApiResult<Out<ExitHandled>> {
    Ok(Out(machines::exited(&st, &caller, task, req).await?))
}
