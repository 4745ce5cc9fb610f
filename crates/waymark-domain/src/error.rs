//! The one refusal of the rules: a stable code and a safe message as a problem document (its
//! status is the code's, decided in `waymark-proto`). Causes are logged, never sent. How it is
//! answered over HTTP is the `error` module's.

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

    pub fn not_found(what: &str, id: &str) -> Self {
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

/// API result.
pub type ApiResult<T> = Result<T, ApiError>;
