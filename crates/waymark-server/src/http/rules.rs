//! Standing rules over HTTP: `GET /v1/rules` lists them. They are made and revoked by signed
//! commands (`add_rule`, `revoke_rule` at `POST /v1/commands`); the rules are in
//! `crate::domain::rules`.

use axum::Json as Out;
use axum::extract::State;
use waymark_proto::*;

use crate::auth::Caller;
use crate::domain::rules;
use crate::error::ApiResult;
use crate::extract::Query;
use crate::state::AppState;

/// Whose rules: an admin names the user; a device means its own.
#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
pub(crate) struct RulesQuery {
    /// The user (admin tokens only; a device's session means its own user).
    user: Option<String>,
}

#[utoipa::path(get, path = "/v1/rules", tag = "device", params(RulesQuery),
    responses((status = 200, body = RuleList, description = "The user's standing rules, newest first, live and ended, with their uses; a delegate sees only their own"),
              (status = 403, body = Problem, description = "A worker token, or a device naming a user"),
              (status = 404, body = Problem, description = "No such user (admin)")))]
pub(crate) async fn list(
    State(st): State<AppState>,
    caller: Caller,
    Query(q): Query<RulesQuery>,
) -> ApiResult<Out<RuleList>> {
    Ok(Out(rules::list(&st, &caller, q.user).await?))
}
