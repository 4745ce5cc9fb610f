//! Devices: pairing by a one-time code, read sessions, revocation, and the one verification
//! path every signed envelope takes — algorithm, shape, device, revocation, signature over the
//! canonical bytes received, then the clock — before anything reads a task.

use waymark_proto::digest::{canonical_json, sha256_hex};
use waymark_proto::signing;
use waymark_proto::*;
use waymark_store::*;

use crate::Context;
use crate::caller::{CallerKind, new_secret, secret_hash};
use crate::convert;
use crate::core::{Tx, record_refusal, shared_secret};
use crate::error::{ApiError, ApiResult};

/// How far in the future a device clock may be.
pub const SKEW_MS: i64 = 5 * 60 * 1000;

/// The longest a signed command stays valid (it may wait in an offline outbox).
pub const MAX_LIFETIME_MS: i64 = 7 * 24 * 3600 * 1000;

/// Device read sessions last this long.
pub const SESSION_MS: i64 = 15 * 60 * 1000;

/// Normalises a pairing code: case, dashes, spaces and look-alikes do not matter.
pub fn normalize_code(code: &str) -> String {
    code.chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| match c.to_ascii_uppercase() {
            'O' => '0',
            'I' | 'L' => '1',
            other => other,
        })
        .collect()
}

/// The server secret pairing codes are hashed with.
const PAIRING_KEY: &str = "pairing-code-key";

/// What the store keeps of a pairing code: HMAC-SHA256 under a server secret, so a copy of
/// the pairings table does not let anyone try the 2^40 codes offline.
pub fn code_hash(key: &[u8], code: &str) -> String {
    use hmac::Mac;
    let mut mac =
        hmac::Hmac::<sha2::Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(normalize_code(code).as_bytes());
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The key of [`code_hash`], made once and shared by every replica through the store.
pub async fn pairing_key(store: &dyn Store) -> Result<Vec<u8>, StoreError> {
    let key = shared_secret(store, PAIRING_KEY, || {
        Ok::<_, StoreError>(signing::b64(&rand::random::<[u8; 32]>()))
    })
    .await?;
    signing::unb64(&key, "pairing key").map_err(|e| StoreError::Corrupt(e.to_string()))
}

/// Records a refused pairing in the audit log (its own transaction) with what was really
/// wrong, and returns the one answer every refused code gets: unknown, used and expired look
/// alike to the caller, so a guessed or leaked code tells nothing (not whose it was, nor that
/// it existed).
async fn refused_pairing(st: &Context, why: ErrorCode, detail: &str) -> ApiError {
    record_refusal(
        st,
        "device:unpaired",
        "device.pair",
        None,
        why.as_str(),
        detail,
    )
    .await;
    ApiError::new(
        ErrorCode::PairingCodeInvalid,
        "this pairing code is unknown, used or expired — check it, or ask for a new one with `waymark admin pair --user NAME`",
    )
}

/// Pairs a device by a one-time code: its public key becomes the key its commands are
/// verified with; the code is used up. Refusals are audited.
pub async fn pair(st: &Context, req: PairDevice) -> ApiResult<Device> {
    let name = req.name.trim();
    if name.is_empty() || name.len() > 100 {
        return Err(ApiError::new(
            ErrorCode::ValidationFailed,
            "`name` must be 1–100 characters",
        ));
    }
    let key = signing::public_key(&req.public_key).map_err(|e| {
        ApiError::new(
            ErrorCode::ValidationFailed,
            format!("`public_key`: {e} (32 bytes, base64url)"),
        )
    })?;
    let code_key = pairing_key(&*st.store).await?;
    let mut tx = Tx::write(st).await?;
    let Some(mut pairing) = tx.pairing(&code_hash(&code_key, &req.code)).await? else {
        drop(tx);
        let why = ErrorCode::PairingCodeInvalid;
        return Err(refused_pairing(st, why, "no such pairing code").await);
    };
    let user = tx
        .user_by_id(&pairing.user_id)
        .await?
        .map(|u| u.name)
        .unwrap_or_default();
    let err = if pairing.used_at.is_some() {
        Some((
            ErrorCode::PairingCodeUsed,
            format!("a code of `{user}` used already"),
        ))
    } else if pairing.expires_at <= tx.now {
        Some((
            ErrorCode::PairingCodeExpired,
            format!("a code of `{user}` expired"),
        ))
    } else {
        None
    };
    if let Some((why, detail)) = err {
        drop(tx);
        return Err(refused_pairing(st, why, &detail).await);
    }
    let device = DeviceRow {
        last_seen_at: Some(tx.now),
        id: ids::device(),
        user_id: pairing.user_id.clone(),
        name: name.to_owned(),
        public_key: signing::public_key_b64(&key),
        scopes: pairing.scopes.clone(),
        created_at: tx.now,
        revoked_at: None,
    };
    match tx.insert_device(&device).await {
        Err(StoreError::Conflict(_)) => {
            return Err(ApiError::new(
                ErrorCode::ValidationFailed,
                "this public key is already paired; generate a new key",
            ));
        }
        r => r?,
    }
    pairing.used_at = Some(tx.now);
    pairing.device_id = Some(device.id.clone());
    tx.update_pairing(&pairing).await?;
    tx.commit().await?;
    Ok(convert::device(&device, &user))
}

/// A command whose signature, device and clock checked out.
pub struct Verified {
    pub device: DeviceRow,
    pub user: UserRow,
    pub command: SteerCommand,
    pub body_digest: String,
}

/// A refusal before or after verification.
pub struct Rejection {
    pub reason: RejectReason,
    pub detail: String,
}

pub fn reject(reason: RejectReason, detail: impl Into<String>) -> Rejection {
    Rejection {
        reason,
        detail: detail.into(),
    }
}

/// The one verification path of every signed envelope: algorithm, shape, device, revocation,
/// signature over the canonical bytes received, then the clock.
pub async fn verify_envelope(st: &Context, env: &SignedEnvelope) -> Result<Verified, Rejection> {
    if env.signature.alg != signing::ALG {
        return Err(reject(
            RejectReason::UnsupportedAlg,
            format!(
                "signature algorithm `{}` is not `ed25519`",
                env.signature.alg
            ),
        ));
    }
    let command: SteerCommand = serde_json::from_value(env.command.clone()).map_err(|e| {
        reject(
            RejectReason::InvalidCommand,
            format!("the command is not well-formed: {e}"),
        )
    })?;
    let lookup = async {
        let mut tx = Tx::read(st).await?;
        let device = tx.device(&env.signature.key_id).await?;
        let user = match &device {
            Some(d) => tx.user_by_id(&d.user_id).await?,
            None => None,
        };
        Ok::<_, StoreError>((device, user))
    };
    let (device, user) = lookup.await.map_err(|e| {
        tracing::error!(error = %e, "device lookup failed");
        reject(
            RejectReason::InvalidCommand,
            "the server could not look up the device; retry",
        )
    })?;
    let (Some(device), Some(user)) = (device, user) else {
        return Err(reject(
            RejectReason::UnknownDevice,
            format!(
                "no device `{}` — pair it with `waymark pair`",
                env.signature.key_id
            ),
        ));
    };
    if command.device_id != env.signature.key_id {
        return Err(reject(
            RejectReason::DeviceMismatch,
            "`command.device_id` differs from `signature.key_id`",
        ));
    }
    if device.revoked_at.is_some() {
        return Err(reject(
            RejectReason::DeviceRevoked,
            format!("device `{}` was revoked", device.id),
        ));
    }
    let key = signing::public_key(&device.public_key).map_err(|_| {
        reject(
            RejectReason::BadSignature,
            "the device's stored key is unusable",
        )
    })?;
    signing::verify(env, &key).map_err(|e| match e {
        signing::SigningError::InexactNumber => reject(
            RejectReason::InvalidCommand,
            format!("{e}; keep integers within ±9007199254740991"),
        ),
        e => reject(
            RejectReason::BadSignature,
            format!("{e}: the command was changed or not signed by this device"),
        ),
    })?;
    let now = st.now_ms();
    let issued = command.issued_at.timestamp_millis();
    let expires = command.expires_at.timestamp_millis();
    if issued > now + SKEW_MS {
        return Err(reject(
            RejectReason::ClockSkew,
            "`issued_at` is in the future: check the device's clock",
        ));
    }
    if expires <= now {
        return Err(reject(
            RejectReason::Expired,
            "the command expired before it arrived; decide again",
        ));
    }
    if expires - issued > MAX_LIFETIME_MS {
        return Err(reject(
            RejectReason::LifetimeTooLong,
            "a command may live at most 7 days",
        ));
    }
    if command.command_id.trim().is_empty() || command.command_id.len() > 128 {
        return Err(reject(
            RejectReason::InvalidCommand,
            "`command_id` must be 1–128 characters",
        ));
    }
    let body_digest = sha256_hex(&canonical_json(&env.command).unwrap_or_default());
    Ok(Verified {
        device,
        user,
        command,
        body_digest,
    })
}

pub fn result(status: CommandStatus, command_id: &str, detail: impl Into<String>) -> CommandResult {
    CommandResult {
        status,
        command_id: command_id.to_owned(),
        task_id: None,
        operation: None,
        reason: None,
        detail: detail.into(),
        based_on_revision: None,
        plan_revision: None,
        task_state: None,
        cursor: None,
        original: None,
    }
}

pub fn required_scope(op: Operation) -> &'static str {
    match op {
        Operation::Approve
        | Operation::Deny
        | Operation::Defer
        | Operation::AddRule
        | Operation::RevokeRule => "approve",
        Operation::OpenSession => "view",
        _ => "steer",
    }
}

pub fn has_scope(device: &DeviceRow, scope: &str) -> bool {
    device.scopes.iter().any(|s| s == scope)
}

/// Opens a device read session from a signed `open_session`: `Ok(Err(result))` is a refusal
/// (audited), said as a command result.
pub async fn open_session(
    st: &Context,
    device_id: &str,
    env: &SignedEnvelope,
) -> ApiResult<Result<DeviceSession, CommandResult>> {
    let refused = |st: Context, r: Rejection, id: String| async move {
        record_refusal(
            &st,
            &format!("device:{id}"),
            "device.session",
            None,
            r.reason.as_str(),
            &r.detail,
        )
        .await;
        let mut res = result(CommandStatus::Rejected, "", r.detail);
        res.reason = Some(r.reason);
        res.operation = Some(Operation::OpenSession);
        Ok(Err(res))
    };
    let v = match verify_envelope(st, env).await {
        Ok(v) => v,
        Err(r) => return refused(st.clone(), r, device_id.to_owned()).await,
    };
    st.rate_limit(&format!("device:{}", v.device.id))?;
    if v.device.id != device_id || v.command.operation != Operation::OpenSession {
        let r = reject(
            RejectReason::InvalidCommand,
            "a session is opened by an `open_session` command signed by this device",
        );
        return refused(st.clone(), r, device_id.to_owned()).await;
    }
    if !has_scope(&v.device, "view") {
        return refused(
            st.clone(),
            reject(
                RejectReason::MissingScope,
                "the device lacks the `view` scope",
            ),
            device_id.to_owned(),
        )
        .await;
    }
    let mut tx = Tx::write(st).await?;
    if tx.command(&v.command.command_id).await?.is_some() {
        drop(tx);
        return refused(
            st.clone(),
            reject(
                RejectReason::CommandIdReused,
                "this `open_session` was used already; sign a new one",
            ),
            device_id.to_owned(),
        )
        .await;
    }
    let token = new_secret(CallerKind::Device);
    let now = tx.now;
    let expires_at = now + SESSION_MS;
    // Heard from now: a device that opens read sessions is not stale.
    let mut device = v.device.clone();
    device.last_seen_at = Some(now);
    tx.update_device(&device).await?;
    tx.insert_device_session(&DeviceSessionRow {
        token_hash: secret_hash(&token),
        device_id: v.device.id.clone(),
        created_at: now,
        expires_at,
    })
    .await?;
    let mut res = result(
        CommandStatus::Applied,
        &v.command.command_id,
        "session opened",
    );
    res.operation = Some(Operation::OpenSession);
    tx.insert_command(&CommandRow {
        command_id: v.command.command_id.clone(),
        task_id: None,
        device_id: v.device.id.clone(),
        body_digest: v.body_digest,
        operation: Operation::OpenSession,
        envelope: serde_json::to_value(env).unwrap_or_default(),
        status: CommandStatus::Applied,
        result: serde_json::to_value(&res).unwrap_or_default(),
        created_at: now,
    })
    .await?;
    tx.commit().await?;
    Ok(Ok(DeviceSession {
        token,
        expires_at: convert::dt(expires_at),
    }))
}
