//! Stable error codes and the `application/problem+json` document (RFC 9457) that carries
//! them. Clients branch on `code`; `detail` is for people.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

macro_rules! codes {
    ($($(#[$m:meta])* $variant:ident => ($s:literal, $status:literal, $title:literal)),* $(,)?) => {
        /// A stable, machine-readable reason. New codes may be added; none is renamed.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
        #[serde(rename_all = "snake_case")]
        pub enum ErrorCode { $($(#[$m])* $variant),* }

        impl ErrorCode {
            /// Every code.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant),*];
            /// The wire spelling.
            pub fn as_str(self) -> &'static str { match self { $(ErrorCode::$variant => $s),* } }
            /// The HTTP status this code is answered with.
            pub fn status(self) -> u16 { match self { $(ErrorCode::$variant => $status),* } }
            /// A short, fixed title.
            pub fn title(self) -> &'static str { match self { $(ErrorCode::$variant => $title),* } }
        }
    };
}

codes! {
    /// The body is not JSON, or not the JSON this route takes.
    MalformedJson => ("malformed_json", 400, "malformed JSON body"),
    /// A field is present but its value is not acceptable.
    ValidationFailed => ("validation_failed", 422, "invalid request"),
    /// A query parameter or header is wrong.
    BadRequest => ("bad_request", 400, "bad request"),
    /// No credential, or one the server does not know.
    Unauthorized => ("unauthorized", 401, "authentication required"),
    /// The credential is valid but may not do this.
    Forbidden => ("forbidden", 403, "not allowed"),
    /// No such object (or not one this caller may see).
    NotFound => ("not_found", 404, "not found"),
    /// The body is larger than this route accepts.
    PayloadTooLarge => ("payload_too_large", 413, "payload too large"),
    /// The body's media type is not accepted here.
    UnsupportedMediaType => ("unsupported_media_type", 415, "unsupported media type"),
    /// Another attempt holds a live lease on the task.
    LeaseHeld => ("lease_held", 409, "task is leased by another attempt"),
    /// The caller's lease has run out; start a new attempt.
    LeaseExpired => ("lease_expired", 409, "lease expired"),
    /// The write carries a fence older than the task's current one.
    Fenced => ("fenced", 409, "stale fence"),
    /// The attempt has already finished or been revoked.
    AttemptClosed => ("attempt_closed", 409, "attempt is no longer active"),
    /// A checkpoint's sequence is not the last one plus one.
    SequenceConflict => ("sequence_conflict", 409, "checkpoint sequence conflict"),
    /// The idempotency key was used before with a different body.
    IdempotencyMismatch => ("idempotency_mismatch", 422, "idempotency key reused with a different body"),
    /// The requested status change is not a legal transition.
    IllegalTransition => ("illegal_transition", 409, "illegal state transition"),
    /// The task has reached a terminal state.
    TaskTerminal => ("task_terminal", 409, "task is finished"),
    /// The decision is no longer pending.
    DecisionClosed => ("decision_closed", 409, "decision is closed"),
    /// The plan revision moved on.
    RevisionConflict => ("revision_conflict", 409, "plan revision conflict"),
    /// A resumed attempt failed its admission checks; a person decides (see `decision_id`).
    AdmissionFailed => ("admission_failed", 409, "recovery needs a person"),
    /// The task is paused: no new step or effect may start until it is resumed.
    TaskPaused => ("task_paused", 409, "task is paused"),
    /// No pairing code like this one.
    PairingCodeInvalid => ("pairing_code_invalid", 401, "unknown pairing code"),
    /// The pairing code has expired.
    PairingCodeExpired => ("pairing_code_expired", 410, "pairing code expired"),
    /// The pairing code was used already.
    PairingCodeUsed => ("pairing_code_used", 409, "pairing code already used"),
    /// Too many requests from this credential; retry after `retry_after_ms`.
    RateLimited => ("rate_limited", 429, "too many requests"),
    /// This credential has as many event or control streams open as it may; close one.
    TooManyStreams => ("too_many_streams", 429, "too many open streams"),
    /// The client took too long to send its request.
    RequestTimeout => ("request_timeout", 408, "request timed out"),
    /// The event cursor is older than the server's retention: re-snapshot.
    CursorExpired => ("cursor_expired", 410, "event cursor expired"),
    /// The route exists but not with this method.
    MethodNotAllowed => ("method_not_allowed", 405, "method not allowed"),
    /// Something failed inside the server; the cause is in its log.
    Internal => ("internal", 500, "internal error"),
    /// The server cannot serve this right now (e.g. storage busy); retry later.
    Unavailable => ("unavailable", 503, "temporarily unavailable"),
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// An `application/problem+json` document.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Problem {
    /// A URI naming the problem type: `urn:waymark:error:<code>`.
    #[serde(rename = "type")]
    pub type_: String,
    /// Fixed per code.
    pub title: String,
    /// The HTTP status.
    pub status: u16,
    /// The stable code clients branch on.
    pub code: ErrorCode,
    /// What happened and what to do, for people.
    pub detail: String,
    /// Facts a client can act on (e.g. `current_sequence`, `current_fence`).
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    #[schema(value_type = Object)]
    pub context: serde_json::Map<String, serde_json::Value>,
}

impl Problem {
    /// A problem for `code` with a human detail.
    pub fn new(code: ErrorCode, detail: impl Into<String>) -> Self {
        Problem {
            type_: format!("urn:waymark:error:{}", code.as_str()),
            title: code.title().to_owned(),
            status: code.status(),
            code,
            detail: detail.into(),
            context: serde_json::Map::new(),
        }
    }

    /// Adds a context fact.
    pub fn with(mut self, key: &str, value: impl Serialize) -> Self {
        self.context.insert(
            key.to_owned(),
            serde_json::to_value(value).unwrap_or_default(),
        );
        self
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.detail)
    }
}

impl std::error::Error for Problem {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_serialize_as_their_spelling() {
        for c in ErrorCode::ALL {
            assert_eq!(serde_json::to_value(c).unwrap(), c.as_str());
            assert!((400..600).contains(&c.status()));
        }
    }
}
