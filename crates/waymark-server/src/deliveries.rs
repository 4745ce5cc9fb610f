//! Proof of delivery over HTTP: a user's devices (last heard from, stale), the receipts a
//! device posts about the decisions it fetched, showed and opened, and the user's escalation
//! policy (who is notified in what order), and whom the user delegates decisions to. The rules
//! are in `crate::domain::{deliveries, delegations, escalation}`.

use axum::Json as Out;
use axum::extract::{Path, State};
use waymark_proto::*;

use crate::auth::Caller;
use crate::domain::{delegations, deliveries, escalation};
use crate::error::ApiResult;
use crate::extract::{Json, Query};
use crate::state::AppState;

#[utoipa::path(get, path = "/v1/devices", tag = "device",
    responses((status = 200, body = Vec<Device>, description = "The caller's user's devices (the admin: all), oldest first")))]
pub(crate) async fn list(
    State(st): State<AppState>,
    caller: Caller,
) -> ApiResult<Out<Vec<Device>>> {
    Ok(Out(deliveries::list_devices(&st, &caller).await?))
}

#[utoipa::path(post, path = "/v1/devices/{device}/receipts", tag = "device", request_body = PostReceipts,
    params(("device" = String, Path, pattern = r"^dev_[0-9a-f]{32}$")),
    responses((status = 200, body = ReceiptsRecorded), (status = 422, body = Problem)))]
pub(crate) async fn receipts(
    State(st): State<AppState>,
    caller: Caller,
    Path(device_id): Path<String>,
    Json(req): Json<PostReceipts>,
) -> ApiResult<Out<ReceiptsRecorded>> {
    Ok(Out(
        deliveries::post_receipts(&st, &caller, device_id, req).await?
    ))
}

/// Whose escalation policy or delegates: an admin names the user; a device means its own.
#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
pub(crate) struct PolicyQuery {
    /// The user (admin tokens only; a device's session means its own user).
    user: Option<String>,
}

#[utoipa::path(get, path = "/v1/escalation", tag = "device", params(PolicyQuery),
    responses((status = 200, body = EscalationPolicy), (status = 404, body = Problem, description = "No policy: every device with a push channel is notified at once")))]
pub(crate) async fn get_escalation(
    State(st): State<AppState>,
    caller: Caller,
    Query(q): Query<PolicyQuery>,
) -> ApiResult<Out<EscalationPolicy>> {
    Ok(Out(escalation::get_policy(&st, &caller, q.user).await?))
}

#[utoipa::path(put, path = "/v1/escalation", tag = "device", params(PolicyQuery), request_body = EscalationPolicy,
    responses((status = 200, body = EscalationPolicy, description = "Set; decisions opened from now on follow it"), (status = 404, body = Problem, description = "No such user (admin)"), (status = 422, body = Problem)))]
pub(crate) async fn put_escalation(
    State(st): State<AppState>,
    caller: Caller,
    Query(q): Query<PolicyQuery>,
    Json(policy): Json<EscalationPolicy>,
) -> ApiResult<Out<EscalationPolicy>> {
    Ok(Out(
        escalation::put_policy(&st, &caller, q.user, policy).await?
    ))
}

#[utoipa::path(delete, path = "/v1/escalation", tag = "device", params(PolicyQuery),
    responses((status = 204, description = "Removed: every device is notified at once again"), (status = 404, body = Problem)))]
pub(crate) async fn delete_escalation(
    State(st): State<AppState>,
    caller: Caller,
    Query(q): Query<PolicyQuery>,
) -> ApiResult<axum::http::StatusCode> {
    escalation::delete_policy(&st, &caller, q.user).await?;
    Ok(axum::http::StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/v1/delegates", tag = "device", params(PolicyQuery),
    responses((status = 200, body = Delegates, description = "Who may answer this user's decisions, and whose this user may answer"), (status = 404, body = Problem, description = "No such user (admin)")))]
pub(crate) async fn list_delegates(
    State(st): State<AppState>,
    caller: Caller,
    Query(q): Query<PolicyQuery>,
) -> ApiResult<Out<Delegates>> {
    Ok(Out(delegations::list(&st, &caller, q.user).await?))
}

#[utoipa::path(put, path = "/v1/delegates/{delegate}", tag = "device", params(("delegate" = String, Path, min_length = 1, max_length = 64, description = "The user offered to read this user's tasks and answer their decisions, once they accept"), PolicyQuery),
    responses((status = 200, body = Delegates, description = "Offered: the delegate sees nothing until they accept (again: nothing changed)"), (status = 404, body = Problem, description = "No such user"), (status = 422, body = Problem, description = "Oneself, or too many delegates")))]
pub(crate) async fn add_delegate(
    State(st): State<AppState>,
    caller: Caller,
    Path(delegate): Path<String>,
    Query(q): Query<PolicyQuery>,
) -> ApiResult<Out<Delegates>> {
    Ok(Out(delegations::add(&st, &caller, q.user, delegate).await?))
}

#[utoipa::path(delete, path = "/v1/delegates/{delegate}", tag = "device", params(("delegate" = String, Path, min_length = 1, max_length = 64), PolicyQuery),
    responses((status = 200, body = Delegates, description = "Ended: they no longer see this user's tasks (an offer not yet accepted is taken back)"), (status = 404, body = Problem, description = "No such user, or no such delegation")))]
pub(crate) async fn remove_delegate(
    State(st): State<AppState>,
    caller: Caller,
    Path(delegate): Path<String>,
    Query(q): Query<PolicyQuery>,
) -> ApiResult<Out<Delegates>> {
    Ok(Out(
        delegations::remove(&st, &caller, q.user, delegate).await?
    ))
}

#[utoipa::path(post, path = "/v1/delegations/{owner}/accept", tag = "device", params(("owner" = String, Path, min_length = 1, max_length = 64, description = "The user who offered this user their decisions"), PolicyQuery),
    responses((status = 200, body = Delegates, description = "Accepted: this user now reads the owner's tasks and answers their decisions (again: nothing changed)"), (status = 404, body = Problem, description = "No such user, or no offer from them")))]
pub(crate) async fn accept_delegation(
    State(st): State<AppState>,
    caller: Caller,
    Path(owner): Path<String>,
    Query(q): Query<PolicyQuery>,
) -> ApiResult<Out<Delegates>> {
    Ok(Out(delegations::accept(&st, &caller, q.user, owner).await?))
}

#[utoipa::path(post, path = "/v1/delegations/{owner}/decline", tag = "device", params(("owner" = String, Path, min_length = 1, max_length = 64, description = "The user who offered this user their decisions"), PolicyQuery),
    responses((status = 200, body = Delegates, description = "Declined (or, accepted before, left): gone from both lists"), (status = 404, body = Problem, description = "No such user, or no offer from them")))]
pub(crate) async fn decline_delegation(
    State(st): State<AppState>,
    caller: Caller,
    Path(owner): Path<String>,
    Query(q): Query<PolicyQuery>,
) -> ApiResult<Out<Delegates>> {
    Ok(Out(delegations::decline(&st, &caller, q.user, owner).await?))
}
