//! Delegation over HTTP: whom a user offers their decisions to, and the delegate's answer to
//! the offer. The rules are in `waymark_domain::delegations`.

use axum::Json as Out;
use axum::extract::{Path, State};
use waymark_proto::*;

use super::escalation::PolicyQuery;
use crate::auth::Caller;
use crate::domain::delegations;
use crate::error::ApiResult;
use crate::extract::Query;
use crate::state::AppState;

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
