//! Who is calling. Bearer credentials are random secrets stored only as their sha256; the
//! admin credential is created on first start and written to the data dir (mode 0600).

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;
use base64::Engine;
use rand::RngCore;
use waymark_proto::{ErrorCode, digest::sha256_hex};
use waymark_store::TokenKind;

use crate::error::ApiError;
use crate::state::AppState;

/// The kind of credential.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallerKind {
    /// Whoever runs the host: sees and resolves everything.
    Admin,
    /// An agent or adapter, acting for its user.
    Worker,
    /// A paired device with a read session: reads its user's tasks; steers only with signed
    /// commands.
    Device,
}

/// An authenticated caller.
#[derive(Debug, Clone)]
pub struct Caller {
    /// Admin or worker.
    pub kind: CallerKind,
    /// The credential's name (the worker's name).
    pub name: String,
    /// The user it acts for; tasks it creates belong to this user.
    pub user_id: String,
    /// The credential, as limits count it: `token:<id>` or `device:<id>`.
    pub credential: String,
    /// Whose tasks it sees: its user first, then (a device) the owners who delegated their
    /// decisions to that user and whose delegation that user accepted, as the store said when
    /// the request was authenticated.
    pub owners: Vec<String>,
    /// When a device's read session ends (unix ms); `None` for tokens. A stream it opened ends
    /// then too.
    pub session_expires_at: Option<i64>,
    /// A runner's token: the machine it speaks for. It reaches only that machine's tasks (the
    /// ones it creates are that machine's), and the runner routes of that machine.
    pub machine: Option<String>,
}

/// A caller that may use the worker API (admin or worker token, not a device session).
#[derive(Debug, Clone)]
pub struct WorkerCaller(pub Caller);

impl Caller {
    /// The credential its streams count against (`None`: the admin, counted only in all).
    pub(crate) fn stream_credential(&self) -> Option<&str> {
        (self.kind != CallerKind::Admin).then_some(&*self.credential)
    }

    /// `None` for the admin (sees every owner), else the users whose tasks are visible: its
    /// own, and for a device those delegated to its user.
    pub fn owner_filter(&self) -> Option<&[String]> {
        match self.kind {
            CallerKind::Admin => None,
            CallerKind::Worker | CallerKind::Device => Some(&self.owners),
        }
    }

    /// Whether this caller may see a task of `owner_id`. Only a device sees others' tasks
    /// (delegated to it), and a device writes only through signed commands, which check the
    /// delegation's limits themselves; a worker sees and writes its own user's.
    pub fn may_access(&self, owner_id: &str) -> bool {
        self.kind == CallerKind::Admin || self.owners.iter().any(|o| o == owner_id)
    }

    /// Whether this caller may see `task`: its owner's, and for a runner only its machine's.
    pub fn may_access_task(&self, task: &waymark_store::TaskRow) -> bool {
        self.may_access(&task.owner_id)
            && self
                .machine
                .as_ref()
                .is_none_or(|m| task.machine_id.as_ref() == Some(m))
    }

    /// Refuses a runner's token where it would read beyond its machine's tasks (the event
    /// stream and blobs span every task of its user).
    pub(crate) fn not_a_runner(&self, what: &str) -> Result<(), ApiError> {
        match &self.machine {
            Some(_) => Err(ApiError::new(
                ErrorCode::Forbidden,
                format!(
                    "a runner's token reaches only its machine's tasks, not {what}; the runner reads its work at `/v1/runner/work`"
                ),
            )),
            None => Ok(()),
        }
    }

    /// How the audit log names this caller.
    pub fn actor(&self) -> String {
        match self.kind {
            CallerKind::Admin => "admin".to_owned(),
            CallerKind::Worker => format!("worker:{}", self.name),
            CallerKind::Device => format!("device:{}", self.name),
        }
    }
}

/// A fresh secret with a readable prefix (`wmk_a_…` admin, `wmk_w_…` worker).
pub fn new_secret(kind: CallerKind) -> String {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    let tag = match kind {
        CallerKind::Admin => "a",
        CallerKind::Worker => "w",
        CallerKind::Device => "s",
    };
    format!(
        "wmk_{tag}_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

/// What the store keeps of a secret.
pub fn secret_hash(secret: &str) -> String {
    sha256_hex(secret.as_bytes())
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
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
}

/// Worker and admin tokens already read, by the hash of their secret, so a request does not
/// open a read transaction to find its credential.
///
/// What makes this right: a row is kept for [`TOKEN_CACHE_MS`] of the server's clock at most,
/// then read again. A revocation (`waymark admin token revoke`, which may run on any replica
/// or none) is therefore seen everywhere within that time, and the revoking command waits that
/// long before it says the token is revoked. Unknown secrets are not kept: a token created
/// after a miss is found at once. Device sessions are not kept here; they are read on every
/// request.
pub(crate) struct KnownTokens {
    rows: std::sync::RwLock<std::collections::HashMap<String, (waymark_store::TokenRow, i64)>>,
}

/// Most tokens kept; past it the set starts over (a host has a handful).
const KNOWN_TOKENS: usize = 1024;

/// How long a token row read is trusted before it is read again (server clock, ms): the
/// longest a revoked token still works on a replica that had just read it.
pub const TOKEN_CACHE_MS: i64 = 2_000;

impl KnownTokens {
    pub(crate) fn new() -> Self {
        KnownTokens {
            rows: std::sync::RwLock::new(std::collections::HashMap::new()),
        }
    }

    fn get(&self, hash: &str, now_ms: i64) -> Option<waymark_store::TokenRow> {
        self.rows
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(hash)
            .filter(|(_, read_at)| now_ms - read_at < TOKEN_CACHE_MS)
            .map(|(row, _)| row.clone())
    }

    fn keep(&self, hash: &str, token: &waymark_store::TokenRow, now_ms: i64) {
        let mut rows = self.rows.write().unwrap_or_else(|p| p.into_inner());
        if rows.len() >= KNOWN_TOKENS {
            rows.clear();
        }
        rows.insert(hash.to_owned(), (token.clone(), now_ms));
    }
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

/// A user's own id, then the owners who delegated their decisions to them — delegations they
/// accepted only: an offer not yet answered shows them nothing.
pub(crate) async fn visible_owners(
    tx: &mut dyn waymark_store::StoreTx,
    user_id: &str,
) -> Result<Vec<String>, waymark_store::StoreError> {
    let mut owners = vec![user_id.to_owned()];
    owners.extend(
        tx.delegations(None, Some(user_id))
            .await?
            .into_iter()
            .filter(waymark_store::DelegationRow::accepted)
            .map(|d| d.owner_id),
    );
    Ok(owners)
}

impl FromRequestParts<AppState> for WorkerCaller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let caller = Caller::from_request_parts(parts, state).await?;
        if caller.kind == CallerKind::Device {
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                "device sessions read; they write only through signed commands (`POST /v1/commands`)",
            ));
        }
        Ok(WorkerCaller(caller))
    }
}
