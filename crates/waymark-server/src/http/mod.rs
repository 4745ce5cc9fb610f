//! The HTTP face of API v1, one file per resource: each handler parses, authorises, calls
//! one rule of `waymark_domain` and answers. What every file shares is here: the answer to a
//! write (`made`), the health check, and the answers for unknown routes and methods.

pub(crate) mod admin;
pub(crate) mod attempts;
pub(crate) mod blobs;
pub(crate) mod claude_code;
pub(crate) mod commands;
pub(crate) mod decisions;
pub(crate) mod delegates;
pub(crate) mod devices;
pub(crate) mod effects;
pub(crate) mod escalation;
pub(crate) mod events;
pub(crate) mod followups;
pub(crate) mod metrics;
pub(crate) mod openapi;
pub(crate) mod push;
pub(crate) mod rules;
pub(crate) mod runner;
pub(crate) mod tasks;
pub(crate) mod webapp;

use axum::Json as Out;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use waymark_proto::*;

use crate::domain::core::{Made, Tx};
use crate::error::{ApiError, ApiResult, HttpError};
use crate::state::AppState;

/// `201 Created` for a new row, `200 OK` for one found again; the body carries the cursor.
pub(crate) type Created<T> = (StatusCode, Out<Written<T>>);

/// What a write made, as HTTP answers it.
pub(crate) fn made<T>(m: Made<T>) -> Created<T> {
    let status = if m.new {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    (
        status,
        Out(Written {
            cursor: m.cursor,
            value: m.value,
        }),
    )
}

#[utoipa::path(get, path = "/healthz", tag = "ops", security(()), responses((status = 200, body = Health)))]
pub(crate) async fn healthz(State(st): State<AppState>) -> ApiResult<Out<Health>> {
    let cursor = Tx::read(&st).await?.max_cursor().await?;
    Ok(Out(Health {
        status: "ok".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        cursor,
    }))
}

pub(crate) async fn not_found(uri: Uri) -> HttpError {
    HttpError(ApiError::new(
        ErrorCode::NotFound,
        format!("no route `{}`; see `/v1/openapi.json`", uri.path()),
    ))
}

pub(crate) async fn method_not_allowed(uri: Uri) -> HttpError {
    HttpError(ApiError::new(
        ErrorCode::MethodNotAllowed,
        format!("`{}` does not take this method", uri.path()),
    ))
}
