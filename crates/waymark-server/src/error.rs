//! The one API error: a stable code, a safe message, an HTTP status, rendered as
//! `application/problem+json`. Causes are logged, never sent.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use waymark_proto::{ErrorCode, Problem};
use waymark_store::StoreError;

/// An error answered to an API client.
#[derive(Debug)]
pub struct ApiError {
    /// What the client sees (boxed: errors travel through every `Result`).
    pub problem: Box<Problem>,
    /// The task it concerns, for the audit log.
    pub task_id: Option<String>,
}

impl ApiError {
    /// An error with a code and a human detail.
    pub fn new(code: ErrorCode, detail: impl Into<String>) -> Self {
        ApiError {
            problem: Box::new(Problem::new(code, detail)),
            task_id: None,
        }
    }

    /// Adds a fact the client can act on.
    pub fn with(mut self, key: &str, value: impl serde::Serialize) -> Self {
        *self.problem =
            std::mem::replace(&mut *self.problem, Problem::new(ErrorCode::Internal, ""))
                .with(key, value);
        self
    }

    /// Names the task, for the audit log.
    pub fn on_task(mut self, task_id: &str) -> Self {
        self.task_id = Some(task_id.to_owned());
        self
    }

    /// The stable code.
    pub fn code(&self) -> ErrorCode {
        self.problem.code
    }

    /// A refusal worth an audit entry: a write the rules turned down, not a malformed call.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self.code(),
            ErrorCode::Fenced
                | ErrorCode::LeaseExpired
                | ErrorCode::LeaseHeld
                | ErrorCode::AttemptClosed
                | ErrorCode::SequenceConflict
                | ErrorCode::IdempotencyMismatch
                | ErrorCode::IllegalTransition
                | ErrorCode::TaskTerminal
                | ErrorCode::RevisionConflict
                | ErrorCode::DecisionClosed
                | ErrorCode::AdmissionFailed
                | ErrorCode::TaskPaused
                | ErrorCode::Forbidden
        )
    }

    pub(crate) fn not_found(what: &str, id: &str) -> Self {
        ApiError::new(ErrorCode::NotFound, format!("no {what} `{id}`"))
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Busy(_) => {
                tracing::warn!(error = %e, "storage busy");
                ApiError::new(ErrorCode::Unavailable, "storage is busy; retry shortly")
            }
            // Nothing was written: the client keeps what it sent and sends it again (the
            // worker SDK and the companions retry a 503), so nothing acknowledged is lost.
            StoreError::Full(_) => {
                tracing::error!(error = %e, "the database's disk is full: writes are refused until space is freed");
                ApiError::new(
                    ErrorCode::Unavailable,
                    "the server's disk is full: nothing was written; send it again once space is freed",
                )
                .with("retry_after_ms", 5_000)
            }
            StoreError::Io(_) => {
                tracing::error!(error = %e, "the database's disk failed a write");
                ApiError::new(
                    ErrorCode::Unavailable,
                    "the server's disk failed to write (an I/O error): nothing was acknowledged; send it again shortly",
                )
                .with("retry_after_ms", 5_000)
            }
            other => {
                tracing::error!(error = %other, "storage failure");
                ApiError::new(
                    ErrorCode::Internal,
                    "the server could not complete the request",
                )
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        problem_response(&self.problem)
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

/// API result.
pub type ApiResult<T> = Result<T, ApiError>;
