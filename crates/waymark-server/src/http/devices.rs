//! Devices over HTTP, every `/v1/devices/*` route: a user's devices (last heard from,
//! stale), pairing, a device's read session, the receipts it posts about the decisions it
//! fetched, showed and opened, and its push channels. The rules are in
//! `waymark_domain::{devices, deliveries, push}`.

use axum::Json as Out;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::response::Response;
use waymark_proto::*;

use super::commands::http_status;
use crate::auth::Caller;
use crate::domain::{deliveries, devices, push};
use crate::error::ApiResult;
use crate::extract::Json;
use crate::limits::AddressLimited;
use crate::state::AppState;

#[utoipa::path(get, path = "/v1/devices", tag = "device",
    responses((status = 200, body = Vec<Device>, description = "The caller's user's devices (the admin: all), oldest first")))]
pub(crate) async fn list(
    State(st): State<AppState>,
    caller: Caller,
) -> ApiResult<Out<Vec<Device>>> {
    Ok(Out(deliveries::list_devices(&st, &caller).await?))
}

#[utoipa::path(post, path = "/v1/devices/pair", tag = "device", request_body = PairDevice, security(()),
    responses((status = 201, body = Device), (status = 401, body = Problem), (status = 410, body = Problem)))]
pub(crate) async fn pair(
    State(st): State<AppState>,
    _: AddressLimited,
    Json(req): Json<PairDevice>,
) -> ApiResult<(StatusCode, Out<Device>)> {
    let device = devices::pair(&st, req).await?;
    Ok((StatusCode::CREATED, Out(device)))
}

#[utoipa::path(post, path = "/v1/devices/{device}/session", tag = "device", request_body = SignedEnvelope, security(()),
    params(("device" = String, Path, pattern = r"^dev_[0-9a-f]{32}$")),
    responses((status = 201, body = DeviceSession), (status = 403, body = CommandResult)))]
pub(crate) async fn open_session(
    State(st): State<AppState>,
    _: AddressLimited,
    Path(device_id): Path<String>,
    Json(env): Json<SignedEnvelope>,
) -> ApiResult<Response> {
    Ok(match devices::open_session(&st, &device_id, &env).await? {
        Ok(session) => (StatusCode::CREATED, Out(session)).into_response(),
        Err(refused) => (http_status(&refused), Out(refused)).into_response(),
    })
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

#[utoipa::path(post, path = "/v1/devices/{device}/push", tag = "device", operation_id = "register", request_body = RegisterPush,
    params(("device" = String, Path, pattern = r"^dev_[0-9a-f]{32}$")),
    responses((status = 201, body = PushChannel), (status = 422, body = Problem)))]
pub(crate) async fn register_push(
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

#[utoipa::path(get, path = "/v1/devices/{device}/push", tag = "device", operation_id = "list", params(("device" = String, Path, pattern = r"^dev_[0-9a-f]{32}$")),
    responses((status = 200, body = Vec<PushChannel>)))]
pub(crate) async fn list_push(
    State(st): State<AppState>,
    caller: Caller,
    Path(device_id): Path<String>,
) -> ApiResult<Out<Vec<PushChannel>>> {
    Ok(Out(push::list(&st, &caller, device_id).await?))
}
