//! Signed steer commands over HTTP (SPEC §5): `POST /v1/commands`, answered with the command's
//! result on every status. The rules are in `waymark_domain::commands`.

use axum::Json as Out;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::response::Response;
use waymark_proto::*;

use crate::domain::commands;
use crate::error::ApiResult;
use crate::extract::Json;
use crate::limits::AddressLimited;
use crate::state::AppState;

pub(crate) fn http_status(r: &CommandResult) -> StatusCode {
    match (r.status, r.reason) {
        (CommandStatus::Applied | CommandStatus::Duplicate, _) => StatusCode::OK,
        (CommandStatus::Conflict, _) => StatusCode::CONFLICT,
        (
            CommandStatus::Rejected,
            Some(
                RejectReason::UnknownDevice
                | RejectReason::DeviceMismatch
                | RejectReason::DeviceRevoked
                | RejectReason::BadSignature
                | RejectReason::UnsupportedAlg
                | RejectReason::NotYourTask
                | RejectReason::MissingScope,
            ),
        ) => StatusCode::FORBIDDEN,
        (CommandStatus::Rejected, _) => StatusCode::UNPROCESSABLE_ENTITY,
    }
}

/// A signed steer command. Most name a task; `start_run` names the new one; `add_rule`
/// (`args.rule`: a `RuleSpec`; `args.rule_id`: optional, chosen by the device;
/// `args.confirm_risky`: the rule's digest again, required when it sets `allow_risky`) and
/// `revoke_rule` (`args.rule_id`) name none: a rule is the signing device's user's.
#[utoipa::path(post, path = "/v1/commands", tag = "device", request_body = SignedEnvelope, security(()),
    responses((status = 200, body = CommandResult, description = "`applied` or `duplicate`"),
              (status = 409, body = CommandResult, description = "`conflict`: the plan moved on"),
              (status = 403, body = CommandResult, description = "`rejected`: signature, device, ownership or scope"),
              (status = 422, body = CommandResult, description = "`rejected`: expired, reused id, stale approval…")))]
pub(crate) async fn submit(
    State(st): State<AppState>,
    _: AddressLimited,
    Json(env): Json<SignedEnvelope>,
) -> ApiResult<Response> {
    let res = commands::submit(&st, &env).await?;
    Ok((http_status(&res), Out(res)).into_response())
}
