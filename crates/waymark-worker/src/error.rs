//! The SDK's one error type. Callers branch on the variant (a fenced worker stops, a sequence
//! conflict reloads, an unknown effect waits for a person); messages say what to do.

use waymark_proto::{ErrorCode, Problem};

/// Why an SDK call did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A newer attempt holds the task (or this one was revoked): stop writing.
    #[error("fenced off: {detail} — a newer attempt holds the task; stop this worker")]
    Fenced {
        /// The server's explanation.
        detail: String,
    },
    /// The checkpoint's sequence was not the last one plus one.
    #[error("checkpoint sequence conflict: {detail} — reload the task before writing again")]
    SequenceConflict {
        /// The last sequence the server holds, when it said.
        current: Option<i64>,
        /// The server's explanation.
        detail: String,
    },
    /// This attempt's lease ran out or the attempt was closed.
    #[error("the lease was lost: {detail} — start a new attempt to continue")]
    LeaseLost {
        /// The server's explanation.
        detail: String,
    },
    /// Another attempt holds a live lease on the task.
    #[error("{detail} — wait for it to expire or finish, then start again")]
    LeaseHeld {
        /// The attempt holding it.
        attempt_id: Option<String>,
        /// When its lease ends.
        expires_at: Option<chrono::DateTime<chrono::Utc>>,
        /// The server's explanation.
        detail: String,
    },
    /// The run was cancelled by a person (or the attempt revoked).
    #[error("the run was cancelled — stop work; effects already under way stay recorded")]
    Cancelled,
    /// An effect's outcome cannot be known; it stays `unknown` until a person or a reconciler
    /// says what the provider did.
    #[error(
        "effect `{idempotency_key}` is unknown: {reason} — do not retry; check the provider with this key, then record what it says"
    )]
    EffectUnknown {
        /// The effect.
        effect_id: String,
        /// Its idempotency key.
        idempotency_key: String,
        /// Why it cannot be known.
        reason: String,
    },
    /// The provider said the effect failed; it was recorded `failed` (or `failed_compensable`).
    #[error("effect `{idempotency_key}` failed: {reason}")]
    EffectFailed {
        /// The effect.
        effect_id: String,
        /// Its idempotency key.
        idempotency_key: String,
        /// Whether a compensation is needed.
        compensable: bool,
        /// The provider's reason.
        reason: String,
    },
    /// The server refused the call for another reason.
    #[error("the control plane refused: {problem}")]
    Refused {
        /// The problem document.
        problem: Box<Problem>,
    },
    /// The connection broke or the reply was not what API v1 answers.
    #[error("talking to the control plane failed: {0}")]
    Transport(String),
    /// The server presented a TLS certificate other than the pinned one; nothing was sent.
    #[error(
        "the control plane's certificate does not match the pinned one ({pinned}); it presented {presented} — nothing was sent. If its certificate was replaced on purpose, pin the new fingerprint (the `TLS:` line `waymark serve` prints) with `{env}` or `--server-fp`",
        env = waymark_tls_pin::SERVER_FP_ENV
    )]
    CertificateMismatch {
        /// The pin (`sha256:<hex>`).
        pinned: String,
        /// The fingerprint of the certificate the server presented.
        presented: String,
    },
    /// The client's configuration cannot be used (a malformed pin, a pin for a plain-HTTP URL).
    #[error("{0}")]
    Config(String),
    /// The server could not be reached at all.
    #[error(
        "cannot reach the control plane at {url}: {reason} — is `waymark serve` running there?"
    )]
    Unreachable {
        /// Where.
        url: String,
        /// Why.
        reason: String,
    },
}

impl Error {
    /// The error a problem document stands for.
    pub(crate) fn from_problem(problem: Problem) -> Self {
        let detail = problem.detail.clone();
        match problem.code {
            ErrorCode::Fenced => Error::Fenced { detail },
            ErrorCode::SequenceConflict => Error::SequenceConflict {
                current: problem
                    .context
                    .get("current_sequence")
                    .and_then(|v| v.as_i64()),
                detail,
            },
            ErrorCode::LeaseExpired | ErrorCode::AttemptClosed => Error::LeaseLost { detail },
            ErrorCode::LeaseHeld => Error::LeaseHeld {
                attempt_id: problem
                    .context
                    .get("attempt_id")
                    .and_then(|v| v.as_str())
                    .map(str::to_owned),
                expires_at: problem
                    .context
                    .get("expires_at")
                    .and_then(|v| serde_json::from_value(v.clone()).ok()),
                detail,
            },
            _ => Error::Refused {
                problem: Box::new(problem),
            },
        }
    }

    /// The problem's code, when the server refused with one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Error::Fenced { .. } => Some(ErrorCode::Fenced),
            Error::SequenceConflict { .. } => Some(ErrorCode::SequenceConflict),
            Error::LeaseHeld { .. } => Some(ErrorCode::LeaseHeld),
            Error::Refused { problem } => Some(problem.code),
            _ => None,
        }
    }

    /// Whether the call may be repeated unchanged (the request may not have arrived).
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            Error::Unreachable { .. } | Error::Transport(_) => true,
            Error::Refused { problem } => problem.code == ErrorCode::Unavailable,
            _ => false,
        }
    }
}

/// SDK result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
