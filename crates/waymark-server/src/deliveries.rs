//! Proof of delivery over HTTP: a user's devices (last heard from, stale) and the receipts a
//! device posts about the decisions it fetched, showed and opened. The rules are in
//! `crate::domain::deliveries`.

use axum::Json as Out;
use axum::extract::{Path, State};
use waymark_proto::*;

use crate::auth::Caller;
use crate::domain::deliveries;
use crate::error::ApiResult;
use crate::extract::Json;
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
