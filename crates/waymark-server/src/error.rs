//! A refusal of the rules answered over HTTP: rendered as `application/problem+json` with its
//! status, and a `Retry-After` when it says when to try again. The refusal itself
//! (`ApiError`) is the rules' (`waymark_domain::error`), which know no HTTP; `HttpError` is its
//! answer.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use waymark_proto::Problem;

pub use waymark_domain::error::ApiError;

/// A handler's result: what it answers, or a refusal of the rules answered as a problem.
pub type ApiResult<T> = Result<T, HttpError>;

/// A refusal of the rules, answered over HTTP.
#[derive(Debug)]
pub struct HttpError(pub ApiError);

impl From<ApiError> for HttpError {
    fn from(e: ApiError) -> Self {
        HttpError(e)
    }
}

impl From<waymark_store::StoreError> for HttpError {
    fn from(e: waymark_store::StoreError) -> Self {
        HttpError(e.into())
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        problem_response(&self.0.problem)
    }
}

/// Renders a problem document.
pub fn problem_response(problem: &Problem) -> Response {
    let status = StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = serde_json::to_vec(problem).unwrap_or_default();
    let mut res = (status, body).into_response();
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    if let Some(ms) = problem
        .context
        .get("retry_after_ms")
        .and_then(|v| v.as_u64())
    {
        let secs = ms.div_ceil(1000).max(1);
        if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
            res.headers_mut().insert(header::RETRY_AFTER, v);
        }
    }
    res
}
