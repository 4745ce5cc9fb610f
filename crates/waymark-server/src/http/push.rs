//! Push over HTTP: the server's VAPID key (a device's channels are under `devices`). What is
//! pushed, when, and what a failure does are in `waymark_domain::push`.

use axum::Json as Out;
use axum::extract::State;
use waymark_proto::*;

use crate::domain::push;
use crate::error::ApiResult;
use crate::state::AppState;

#[utoipa::path(get, path = "/v1/push/vapid", tag = "device", security(()), responses((status = 200, body = VapidKey)))]
pub(crate) async fn vapid(State(st): State<AppState>) -> ApiResult<Out<VapidKey>> {
    Ok(Out(push::vapid(&st).await?))
}
