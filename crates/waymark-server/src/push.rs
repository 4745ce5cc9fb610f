//! Push over HTTP: the server's VAPID key, and a device's push channels. What is pushed, when,
//! and what a failure does are in `crate::domain::push`.

use axum::Json as Out;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use waymark_proto::*;

use crate::auth::Caller;
use crate::domain::push;
use crate::error::ApiResult;
use crate::extract::Json;
use crate::state::AppState;

#[utoipa::path(get, path = "/v1/push/vapid", tag = "device", security(()), responses((status = 200, body = VapidKey)))]
pub(crate) async fn vapid(State(st): State<AppState>) -> ApiResult<Out<VapidKey>> {
    Ok(Out(push::vapid(&st).await?))
}

#[utoipa::path(post, path = "/v1/devices/{device}/push", tag = "device", request_body = RegisterPush,
    params(("device" = String, Path, pattern = r"^dev_[0-9a-f]{32}$")),
    responses((status = 201, body = PushChannel), (status = 422, body = Problem)))]
pub(crate) async fn register(
    State(st): State<AppState>,
    caller: Caller,
    Path(device_id): Path<String>,
    Json(req): Json<RegisterPush>,
) -> ApiResult<(StatusCode, Out<PushChannel>)> {
    Ok((
        StatusCode::CREATED,
        Out(push::register(&st, &caller, device_id, req).await?),
    ))
}

#[utoipa::path(get, path = "/v1/devices/{device}/push", tag = "device", params(("device" = String, Path, pattern = r"^dev_[0-9a-f]{32}$")),
    responses((status = 200, body = Vec<PushChannel>)))]
pub(crate) async fn list(
    State(st): State<AppState>,
    caller: Caller,
    Path(device_id): Path<String>,
) -> ApiResult<Out<Vec<PushChannel>>> {
    Ok(Out(push::list(&st, &caller, device_id).await?))
}
