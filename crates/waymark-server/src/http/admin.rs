//! The admin's routes over HTTP: resolve a decision, prune the event log, read the audit log
//! and a task's command ledger. Each needs the admin token.

use axum::Json as Out;
use axum::extract::{Path, State};
use serde::Deserialize;
use waymark_proto::*;

use crate::auth::{Caller, CallerKind, WorkerCaller};
use crate::domain::commands::LedgerEntry;
use crate::domain::reads::AuditEntry;
use crate::domain::retention::Pruned;
use crate::domain::{commands, decisions, reads, retention};
use crate::error::{ApiError, ApiResult};
use crate::extract::{Json, Query};
use crate::state::AppState;

pub(crate) fn admin_only(caller: &Caller) -> Result<(), ApiError> {
    if caller.kind == CallerKind::Admin {
        Ok(())
    } else {
        Err(ApiError::new(
            ErrorCode::Forbidden,
            "this route needs the admin token",
        ))
    }
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

#[utoipa::path(post, path = "/v1/admin/events/prune", tag = "admin", responses((status = 200, body = Pruned)))]
pub(crate) async fn admin_prune(
    State(st): State<AppState>,
    caller: Caller,
) -> ApiResult<Out<Pruned>> {
    admin_only(&caller)?;
    Ok(Out(retention::prune(&st).await?))
}

/// `?task=…&limit=…`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub(crate) struct AuditQuery {
    /// Only this task's entries.
    task: Option<String>,
    /// At most this many (default 100, at most 1000).
    limit: Option<i64>,
}

#[utoipa::path(get, path = "/v1/admin/audit", tag = "admin", params(AuditQuery),
    responses((status = 200, body = Vec<AuditEntry>)))]
pub(crate) async fn admin_audit(
    State(st): State<AppState>,
    caller: Caller,
    Query(q): Query<AuditQuery>,
) -> ApiResult<Out<Vec<AuditEntry>>> {
    admin_only(&caller)?;
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    Ok(Out(reads::audit(&st, q.task.as_deref(), limit).await?))
}

#[utoipa::path(get, path = "/v1/admin/tasks/{task}/commands", tag = "admin", params(("task" = String, Path, pattern = r"^task_[0-9a-f]{32}$")),
    responses((status = 200, body = Vec<LedgerEntry>)))]
pub(crate) async fn admin_ledger(
    State(st): State<AppState>,
    caller: crate::auth::Caller,
    Path(task_id): Path<String>,
) -> ApiResult<Out<Vec<LedgerEntry>>> {
    admin_only(&caller)?;
    Ok(Out(commands::ledger(&st, &task_id).await?))
}
