//! The one error the UI sees: a stable code to branch on and the companion's message, which
//! already says what to do. Causes stay in the log.

use serde::Serialize;
use specta::Type;
use waymark_companion::Error;

/// A command failed.
#[derive(Debug, Clone, Serialize, Type, thiserror::Error)]
#[error("{message}")]
pub struct AppError {
    /// `unreachable` (the command may be queued), `refused`, `not_paired`, `keychain`,
    /// `not_found`, `invalid`, `blob_missing`, `mirror`, `embedded`.
    pub code: String,
    /// For people: what happened and what to do.
    pub message: String,
}

impl AppError {
    /// An error with a code.
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        AppError {
            code: code.into(),
            message: message.into(),
        }
    }
}

impl From<Error> for AppError {
    fn from(e: Error) -> Self {
        let code = match &e {
            Error::Unreachable(_) => "unreachable",
            Error::CertificateMismatch { .. } => "certificate_mismatch",
            Error::Refused { .. } => "refused",
            Error::Protocol(_) => "protocol",
            Error::CursorExpired => "cursor_expired",
            Error::NotPaired => "not_paired",
            Error::NoKeychain(_) | Error::NoDeviceKey(_) => "keychain",
            Error::Mirror(_) => "mirror",
            Error::NotFound(_) => "not_found",
            Error::Invalid(_) => "invalid",
            Error::BlobMissing(_) => "blob_missing",
        };
        AppError::new(code, e.to_string())
    }
}

/// What every command returns.
pub type AppResult<T> = Result<T, AppError>;
