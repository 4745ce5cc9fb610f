//! Blobs over HTTP: artifacts' bytes by their sha256, to those who may see a task holding them.

use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::IntoResponse;
use axum::response::Response;
use waymark_proto::digest::is_sha256_hex;
use waymark_proto::*;

use crate::auth::Caller;
use crate::domain::core::Tx;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

#[utoipa::path(get, path = "/v1/blobs/{sha256}", tag = "read", params(("sha256" = String, Path, pattern = r"^[0-9a-f]{64}$", description = "64 lower-case hex digits")),
    responses((status = 200, content_type = "application/octet-stream", body = Vec<u8>), (status = 400, body = Problem, description = "not a sha256 hex digest"), (status = 404, body = Problem)))]
pub(crate) async fn blob(
    State(st): State<AppState>,
    caller: Caller,
    Path(sha): Path<String>,
) -> ApiResult<Response> {
    caller.not_a_runner("blobs")?;
    if !is_sha256_hex(&sha) {
        return Err(ApiError::new(
            ErrorCode::BadRequest,
            "a blob is named by 64 lower-case hex digits (sha256)",
        )
        .into());
    }
    let mut tx = Tx::read(&st).await?;
    if !tx.blob_visible(&sha, caller.owner_filter()).await? {
        return Err(ApiError::not_found("blob", &sha).into());
    }
    let data = tx
        .blob(&sha)
        .await?
        .ok_or_else(|| ApiError::not_found("blob", &sha))?;
    let mut res = (StatusCode::OK, data).into_response();
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    if let Ok(v) = HeaderValue::from_str(&format!("\"{sha}\"")) {
        h.insert(header::ETAG, v);
    }
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, max-age=31536000, immutable"),
    );
    Ok(res)
}
