//! Approvals and decisions over HTTP: a worker asks, waits for the answer (a long-poll),
//! reports its runtime's delivery and closes what its runtime dropped. The rules are in
//! `waymark_domain::decisions`.

use std::time::Duration;

use axum::Json as Out;
use axum::extract::{Path, State};
use serde::Deserialize;
use waymark_proto::*;

use super::{Created, made};
use crate::auth::{Caller, WorkerCaller};
use crate::convert;
use crate::domain::core::{Tx, task_for};
use crate::domain::decisions::expire_overdue;
use crate::domain::{decisions, deliveries};
use crate::error::{ApiError, ApiResult};
use crate::extract::{Json, Query};
use crate::state::AppState;

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

/// `?wait=30s`: how long to hold the request open for an outcome.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub(crate) struct WaitQuery {
    /// A duration (`30s`, `2m`) or seconds; at most the server's bound (60 s).
    wait: Option<String>,
}

fn parse_wait(st: &AppState, q: &WaitQuery) -> ApiResult<Duration> {
    let Some(w) = q.wait.as_deref() else {
        return Ok(Duration::ZERO);
    };
    let d = w
        .parse::<u64>()
        .map(Duration::from_secs)
        .or_else(|_| humantime::parse_duration(w))
        .map_err(|_| {
            ApiError::new(
                ErrorCode::BadRequest,
                format!("`wait={w}` is not a duration like `30s`"),
            )
        })?;
    Ok(d.min(st.config.max_wait))
}

#[utoipa::path(get, path = "/v1/tasks/{task}/decisions/{decision}", tag = "worker",
    params(("task" = String, Path, pattern = r"^task_[0-9a-f]{32}$"), ("decision" = String, Path, pattern = r"^dec_[0-9a-f]{32}$"), WaitQuery),
    responses((status = 200, body = Decision)))]
pub(crate) async fn get_decision(
    State(st): State<AppState>,
    caller: Caller,
    Path((task_id, decision_id)): Path<(String, String)>,
    Query(q): Query<WaitQuery>,
) -> ApiResult<Out<Decision>> {
    let deadline = tokio::time::Instant::now() + parse_wait(&st, &q)?;
    let mut watch = st.cursor_watch();
    // Counted in `waymark_decision_waits` from its first wait until it answers; by then the
    // watch above is subscribed, so any answer committed later wakes it.
    let mut waiting = None;
    loop {
        watch.borrow_and_update();
        let mut tx = Tx::read(&st).await?;
        let task = task_for(&mut tx, &caller, &task_id).await?;
        let d = tx
            .decision(&decision_id)
            .await?
            .filter(|d| d.task_id == task.id)
            .ok_or_else(|| ApiError::not_found("decision", &decision_id))?;
        drop(tx);
        let pending = d.status == DecisionStatus::Pending;
        let now = st.now_ms();
        if pending && d.expires_at <= now {
            expire_overdue(&st, &d.id).await?;
            continue;
        }
        if !pending || tokio::time::Instant::now() >= deadline {
            let mut wire = [convert::decision(&d)?];
            deliveries::attach(&mut Tx::read(&st).await?, &mut wire).await?;
            let [wire] = wire;
            return Ok(Out(wire));
        }
        let until_expiry = Duration::from_millis((d.expires_at - now).max(0) as u64);
        let wake = deadline.min(tokio::time::Instant::now() + until_expiry);
        waiting.get_or_insert_with(|| st.metrics.decision_wait());
        tokio::select! {
            _ = tokio::time::sleep_until(wake) => {}
            r = watch.changed() => { if r.is_err() { return Ok(Out(convert::decision(&d)?)); } }
        }
    }
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
