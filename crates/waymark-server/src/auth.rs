//! Who is calling. Bearer credentials are random secrets stored only as their sha256; the
//! admin credential is created on first start and written to the data dir (mode 0600). The
//! caller itself is the rules' (`domain::caller`); this reads it from a request.

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;
use waymark_proto::ErrorCode;
use waymark_store::TokenKind;

pub(crate) use crate::domain::caller::visible_owners;
pub use crate::domain::caller::{Caller, CallerKind, new_secret, secret_hash};
use crate::error::{ApiError, HttpError};
pub use crate::known_tokens::TOKEN_CACHE_MS;
use crate::state::AppState;

/// A caller that may use the worker API (admin or worker token, not a device session).
#[derive(Debug, Clone)]
pub struct WorkerCaller(pub Caller);

impl FromRequestParts<AppState> for Caller {
    type Rejection = HttpError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        caller_of(parts, state).await.map_err(HttpError)
    }
}

/// Who sends a request, from its bearer token (a worker or admin token, or a device session).
async fn caller_of(parts: &Parts, state: &AppState) -> Result<Caller, ApiError> {
    let header = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::Unauthorized,
                "missing `Authorization: Bearer <token>`; workers get a token from `waymark admin worker-token`",
            )
        })?;
    let secret = header
        .strip_prefix("Bearer ")
        .or_else(|| header.strip_prefix("bearer "))
        .map(str::trim)
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::Unauthorized,
                "the Authorization header must be `Bearer <token>`",
            )
        })?;
    if secret.starts_with("wmk_s_") {
        let mut tx = state.store.read().await?;
        let caller = device_caller(&mut tx, secret, state.now_ms()).await?;
        state.rate_limit(&caller.credential)?;
        return Ok(caller);
    }
    let hash = secret_hash(secret);
    let now = state.now_ms();
    let token = match state.tokens.get(&hash, now) {
        Some(token) => Some(token),
        None => {
            let token = state.store.read().await?.token_by_hash(&hash).await?;
            if let Some(t) = &token {
                state.tokens.keep(&hash, t, now);
            }
            token
        }
    };
    let Some(token) = token.filter(|t| t.revoked_at.is_none()) else {
        return Err(ApiError::new(
            ErrorCode::Unauthorized,
            "unknown or revoked token",
        ));
    };
    let kind = match token.kind {
        TokenKind::Admin => CallerKind::Admin,
        TokenKind::Worker => CallerKind::Worker,
    };
    let credential = format!("token:{}", token.id);
    if kind == CallerKind::Worker {
        state.rate_limit(&credential)?;
    }
    Ok(Caller {
        kind,
        session_expires_at: None,
        machine: token.machine_id,
        name: token.name,
        owners: vec![token.user_id.clone()],
        user_id: token.user_id,
        credential,
    })
}

async fn device_caller(
    tx: &mut Box<dyn waymark_store::StoreTx>,
    secret: &str,
    now_ms: i64,
) -> Result<Caller, ApiError> {
    let expired = || {
        ApiError::new(
            ErrorCode::Unauthorized,
            "the device session is unknown or expired; open a new one with a signed `open_session`",
        )
    };
    let session = tx
        .device_session(&secret_hash(secret))
        .await?
        .ok_or_else(expired)?;
    if session.expires_at <= now_ms {
        return Err(expired());
    }
    let device = tx.device(&session.device_id).await?.ok_or_else(expired)?;
    if device.revoked_at.is_some() {
        return Err(ApiError::new(
            ErrorCode::Unauthorized,
            "this device was revoked; pair it again",
        ));
    }
    let owners = visible_owners(&mut **tx, &device.user_id).await?;
    Ok(Caller {
        kind: CallerKind::Device,
        session_expires_at: Some(session.expires_at),
        credential: format!("device:{}", device.id),
        name: device.id,
        user_id: device.user_id,
        owners,
        machine: None,
    })
}

impl FromRequestParts<AppState> for WorkerCaller {
    type Rejection = HttpError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let caller = Caller::from_request_parts(parts, state).await?;
        if caller.kind == CallerKind::Device {
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                "device sessions read; they write only through signed commands (`POST /v1/commands`)",
            )
            .into());
        }
        Ok(WorkerCaller(caller))
    }
}
