//! A user's escalation policy over HTTP: who is notified in what order, and quiet hours. The
//! rules are in `waymark_domain::escalation`.

use axum::Json as Out;
use axum::extract::State;
use waymark_proto::*;

use crate::auth::Caller;
use crate::domain::escalation;
use crate::error::ApiResult;
use crate::extract::{Json, Query};
use crate::state::AppState;

/// Whose escalation policy or delegates: an admin names the user; a device means its own.
#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
pub(crate) struct PolicyQuery {
    /// The user (admin tokens only; a device's session means its own user).
    pub(crate) user: Option<String>,
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
