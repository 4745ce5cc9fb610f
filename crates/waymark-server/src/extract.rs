//! Request extractors that refuse bad input with problem+json and a clear reason: a JSON body
//! (size limit, media type, syntax versus shape) and a bounded raw body.

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use waymark_proto::ErrorCode;

use crate::error::{ApiError, HttpError};
use crate::state::AppState;

/// A JSON body: at most `max_json_bytes`, `application/json`, deserialised strictly.
pub(crate) struct Json<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for Json<T> {
    type Rejection = HttpError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        json_of(req, state).await.map(Json).map_err(HttpError)
    }
}

/// A request's JSON body, checked as [`Json`] says.
async fn json_of<T: DeserializeOwned>(req: Request, state: &AppState) -> Result<T, ApiError> {
    let ct = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let mime = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if mime != "application/json" && !mime.ends_with("+json") {
        return Err(ApiError::new(
            ErrorCode::UnsupportedMediaType,
            format!("expected `Content-Type: application/json`, got `{ct}`"),
        ));
    }
    let bytes = read_limited(
        req.into_body(),
        state.config.max_json_bytes,
        state.config.body_timeout,
    )
    .await?;
    parse_json(&bytes)
}

/// A query string, deserialised strictly; a bad one is a 400 `bad_request` problem (axum's own
/// rejection is plain text, which the OpenAPI document does not promise — found by
/// `scripts/api-fuzz`).
pub(crate) struct Query<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Query<T> {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Query(q)| Query(q))
            .map_err(|e| HttpError(ApiError::new(ErrorCode::BadRequest, e.body_text())))
    }
}

/// Parses JSON, telling a syntax error (400 `malformed_json`) from a wrong shape (422
/// `validation_failed`), with serde's line and column.
pub(crate) fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| {
        ApiError::new(
            ErrorCode::MalformedJson,
            format!("the body is not valid JSON: {e}"),
        )
    })?;
    whole_floats_as_integers(&mut value);
    if has_nul(&value) {
        return Err(ApiError::new(
            ErrorCode::ValidationFailed,
            "strings may not contain NUL (U+0000) characters",
        ));
    }
    serde_json::from_value(value)
        .map_err(|e| ApiError::new(ErrorCode::ValidationFailed, e.to_string()))
}

/// `2.0` is the integer 2 to JSON Schema (and so to the OpenAPI document), and RFC 8785 writes
/// it `2`; serde takes only the second spelling for an integer field. Whole numbers a double
/// carries exactly (within ±2^53) are read as integers, so a body the document admits is not
/// refused for its spelling.
fn whole_floats_as_integers(v: &mut serde_json::Value) {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    match v {
        serde_json::Value::Number(n) => {
            if let Some(f) = n.as_f64().filter(|_| n.is_f64())
                && f.fract() == 0.0
                && f.abs() <= EXACT
            {
                *n = serde_json::Number::from(f as i64);
            }
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(whole_floats_as_integers),
        serde_json::Value::Object(o) => o.values_mut().for_each(whole_floats_as_integers),
        _ => {}
    }
}

/// NUL cannot be stored by every backend (PostgreSQL text), so no backend takes it.
fn has_nul(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::String(s) => s.contains('\0'),
        serde_json::Value::Array(a) => a.iter().any(has_nul),
        serde_json::Value::Object(o) => o.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
        _ => false,
    }
}

/// Reads a whole body, refusing more than `limit` bytes with 413, and a body that has not
/// arrived within `timeout` (a slow or stalled client) with 408.
pub(crate) async fn read_limited(
    body: Body,
    limit: usize,
    timeout: std::time::Duration,
) -> Result<Bytes, ApiError> {
    let read = tokio::time::timeout(timeout, axum::body::to_bytes(body, limit))
        .await
        .map_err(|_| {
            ApiError::new(
                ErrorCode::RequestTimeout,
                format!(
                    "the body did not arrive within {} s; send it faster, or raise `serve --body-timeout`",
                    timeout.as_secs_f64()
                ),
            )
        })?;
    read.map_err(|e| {
        let inner = e.into_inner();
        if inner
            .downcast_ref::<http_body_util::LengthLimitError>()
            .is_some()
        {
            ApiError::new(
                ErrorCode::PayloadTooLarge,
                format!("the body is larger than this route accepts ({limit} bytes)"),
            )
            .with("limit_bytes", limit)
        } else {
            ApiError::new(
                ErrorCode::BadRequest,
                format!("could not read the body: {inner}"),
            )
        }
    })
}
