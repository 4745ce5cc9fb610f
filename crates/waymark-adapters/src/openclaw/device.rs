//! The adapter's OpenClaw device identity: an Ed25519 key kept in a file (created `0600` on
//! first use), the connect signature over the gateway's nonce, and the device token the gateway
//! issues once the device is paired, kept beside the key.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use ed25519_dalek::{Signer, SigningKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Why the device key or its token file cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("device key `{path}`: {reason}")]
pub struct KeyError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong and what to do.
    pub reason: String,
}

/// The adapter's device key.
#[derive(Debug)]
pub struct DeviceKey {
    key: SigningKey,
    path: PathBuf,
}

#[derive(Serialize, Deserialize)]
struct KeyFile {
    version: u32,
    algorithm: String,
    /// The 32-byte Ed25519 seed, base64.
    seed: String,
    /// For people: the id the gateway knows the device by.
    #[serde(default)]
    device_id: String,
    /// For people: the public key as sent in `connect`.
    #[serde(default)]
    public_key: String,
}

/// What fields the connect signature covers (OpenClaw's `v3` device-auth payload).
#[derive(Debug, Clone)]
pub struct AuthPayload<'a> {
    /// [`DeviceKey::device_id`].
    pub device_id: &'a str,
    /// `connect.params.client.id`.
    pub client_id: &'a str,
    /// `connect.params.client.mode`.
    pub client_mode: &'a str,
    /// `operator`.
    pub role: &'a str,
    /// The scopes asked for, in the order sent.
    pub scopes: &'a [String],
    /// `device.signedAt`, ms since the epoch.
    pub signed_at_ms: i64,
    /// The token sent in `auth` (the gateway token, else the device token, else empty).
    pub token: &'a str,
    /// The nonce of the gateway's `connect.challenge`.
    pub nonce: &'a str,
    /// `connect.params.client.platform`.
    pub platform: &'a str,
    /// `connect.params.client.deviceFamily` (empty when not sent).
    pub device_family: &'a str,
}

impl AuthPayload<'_> {
    /// The exact bytes signed: `v3|deviceId|clientId|clientMode|role|scope,scope|signedAtMs|
    /// token|nonce|platform|deviceFamily` (platform and family lower-cased), as OpenClaw's
    /// `buildDeviceAuthPayloadV3` builds them.
    pub fn to_bytes(&self) -> Vec<u8> {
        [
            "v3",
            self.device_id,
            self.client_id,
            self.client_mode,
            self.role,
            &self.scopes.join(","),
            &self.signed_at_ms.to_string(),
            self.token,
            self.nonce,
            &self.platform.trim().to_ascii_lowercase(),
            &self.device_family.trim().to_ascii_lowercase(),
        ]
        .join("|")
        .into_bytes()
    }
}

impl DeviceKey {
    /// Loads the key at `path`, or creates it (parent directories too, the file `0600`).
    pub fn load_or_create(path: &Path) -> Result<DeviceKey, KeyError> {
        let err = |reason: String| KeyError {
            path: path.to_owned(),
            reason,
        };
        match std::fs::read(path) {
            Ok(bytes) => {
                let file: KeyFile = serde_json::from_slice(&bytes).map_err(|e| {
                    err(format!(
                        "not a Waymark OpenClaw device key ({e}); move it away to create a new one (the gateway then needs to pair the new device)"
                    ))
                })?;
                if file.version != 1 || file.algorithm != "ed25519" {
                    return Err(err(format!(
                        "version {} / algorithm `{}` is not known here (want 1 / `ed25519`)",
                        file.version, file.algorithm
                    )));
                }
                let seed: [u8; 32] = STANDARD
                    .decode(file.seed.trim())
                    .ok()
                    .and_then(|s| s.try_into().ok())
                    .ok_or_else(|| err("`seed` is not 32 bytes of base64".into()))?;
                warn_if_readable(path);
                Ok(DeviceKey {
                    key: SigningKey::from_bytes(&seed),
                    path: path.to_owned(),
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let key = SigningKey::generate(&mut rand::rngs::OsRng);
                let device = DeviceKey {
                    key,
                    path: path.to_owned(),
                };
                let file = KeyFile {
                    version: 1,
                    algorithm: "ed25519".into(),
                    seed: STANDARD.encode(device.key.to_bytes()),
                    device_id: device.device_id(),
                    public_key: device.public_key(),
                };
                let text = serde_json::to_vec_pretty(&file).map_err(|e| err(e.to_string()))?;
                write_private(path, &text, true).map_err(|e| err(e.to_string()))?;
                tracing::info!(path = %path.display(), device = %device.device_id(), "created the OpenClaw device key");
                Ok(device)
            }
            Err(e) => Err(err(format!("cannot read it: {e}"))),
        }
    }

    /// The id the gateway knows this device by: the hex SHA-256 of the raw public key (how
    /// OpenClaw fingerprints device keys).
    pub fn device_id(&self) -> String {
        hex::encode(Sha256::digest(self.key.verifying_key().to_bytes()))
    }

    /// The raw public key, base64url without padding (as `connect.params.device.publicKey`).
    pub fn public_key(&self) -> String {
        URL_SAFE_NO_PAD.encode(self.key.verifying_key().to_bytes())
    }

    /// Signs the payload; the signature is base64url without padding.
    pub fn sign(&self, payload: &AuthPayload<'_>) -> String {
        URL_SAFE_NO_PAD.encode(self.key.sign(&payload.to_bytes()).to_bytes())
    }

    /// Where the key lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file beside the key that keeps the gateways' device tokens.
    pub fn token_path(&self) -> PathBuf {
        let mut name = self.path.file_name().unwrap_or_default().to_os_string();
        name.push(".device-tokens");
        self.path.with_file_name(name)
    }

    /// The device token `gateway` issued earlier, if any.
    pub fn device_token(&self, gateway: &str) -> Option<String> {
        let bytes = std::fs::read(self.token_path()).ok()?;
        let file: TokenFile = serde_json::from_slice(&bytes).ok()?;
        file.tokens.get(gateway).map(|t| t.device_token.clone())
    }

    /// Keeps (or, with `None`, forgets) the device token `gateway` issued.
    pub fn store_device_token(
        &self,
        gateway: &str,
        token: Option<&StoredToken>,
    ) -> Result<(), KeyError> {
        let path = self.token_path();
        let mut file: TokenFile = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        match token {
            Some(t) => file.tokens.insert(gateway.to_owned(), t.clone()),
            None => file.tokens.remove(gateway),
        };
        let text = serde_json::to_vec_pretty(&file).map_err(|e| KeyError {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        write_private(&path, &text, false).map_err(|e| KeyError {
            path: path.clone(),
            reason: format!("cannot write it: {e}"),
        })
    }
}

/// A device token as the gateway issued it in `hello-ok.auth`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StoredToken {
    /// The token.
    pub device_token: String,
    /// The role it is for.
    #[serde(default)]
    pub role: String,
    /// The scopes it grants.
    #[serde(default)]
    pub scopes: Vec<String>,
    /// When it was issued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issued_at_ms: Option<i64>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct TokenFile {
    /// By gateway URL.
    tokens: BTreeMap<String, StoredToken>,
}

/// Writes a file readable by its owner only; `create_new` refuses to replace one.
fn write_private(path: &Path, bytes: &[u8], create_new: bool) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(".tmp");
    let tmp = path.with_file_name(tmp_name);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let target = if create_new { path } else { tmp.as_path() };
    if create_new {
        options.create_new(true);
    }
    let mut f = options.open(target)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    if !create_new {
        std::fs::rename(&tmp, path)?;
    }
    Ok(())
}

fn warn_if_readable(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = std::fs::metadata(path)
            && meta.permissions().mode() & 0o077 != 0
        {
            tracing::warn!(
                path = %path.display(),
                "the OpenClaw device key is readable by others; `chmod 600` it"
            );
        }
    }
    #[cfg(not(unix))]
    let _ = path;
}

#[cfg(test)]
mod tests {
    use ed25519_dalek::{Signature, VerifyingKey};

    use super::*;

    #[test]
    fn the_key_is_created_private_and_loads_back_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys/openclaw.json");
        let a = DeviceKey::load_or_create(&path).unwrap();
        let b = DeviceKey::load_or_create(&path).unwrap();
        assert_eq!(a.device_id(), b.device_id());
        assert_eq!(a.device_id().len(), 64);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        std::fs::write(&path, b"{}").unwrap();
        let e = DeviceKey::load_or_create(&path).unwrap_err();
        assert!(e.to_string().contains("not a Waymark"), "{e}");
    }

    #[test]
    fn the_signature_covers_the_nonce() {
        let dir = tempfile::tempdir().unwrap();
        let key = DeviceKey::load_or_create(&dir.path().join("k.json")).unwrap();
        let id = key.device_id();
        let scopes = vec!["operator.read".to_owned(), "operator.write".to_owned()];
        let payload = AuthPayload {
            device_id: &id,
            client_id: "gateway-client",
            client_mode: "backend",
            role: "operator",
            scopes: &scopes,
            signed_at_ms: 1_737_264_000_100,
            token: "tok",
            nonce: "n-123",
            platform: "Linux",
            device_family: "",
        };
        assert_eq!(
            String::from_utf8(payload.to_bytes()).unwrap(),
            format!(
                "v3|{id}|gateway-client|backend|operator|operator.read,operator.write|1737264000100|tok|n-123|linux|"
            )
        );
        let sig = key.sign(&payload);
        let pk: [u8; 32] = URL_SAFE_NO_PAD
            .decode(key.public_key())
            .unwrap()
            .try_into()
            .unwrap();
        let vk = VerifyingKey::from_bytes(&pk).unwrap();
        let sig = Signature::from_slice(&URL_SAFE_NO_PAD.decode(sig).unwrap()).unwrap();
        vk.verify_strict(&payload.to_bytes(), &sig).unwrap();
        let other = AuthPayload {
            nonce: "n-124",
            ..payload
        };
        assert!(vk.verify_strict(&other.to_bytes(), &sig).is_err());
    }

    #[test]
    fn device_tokens_are_kept_per_gateway_beside_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let key = DeviceKey::load_or_create(&dir.path().join("k.json")).unwrap();
        assert_eq!(key.device_token("ws://a"), None);
        let t = StoredToken {
            device_token: "dt-1".into(),
            role: "operator".into(),
            scopes: vec![],
            issued_at_ms: None,
        };
        key.store_device_token("ws://a", Some(&t)).unwrap();
        assert_eq!(key.device_token("ws://a").as_deref(), Some("dt-1"));
        assert_eq!(key.device_token("ws://b"), None);
        assert_eq!(key.token_path(), dir.path().join("k.json.device-tokens"));
        key.store_device_token("ws://a", None).unwrap();
        assert_eq!(key.device_token("ws://a"), None);
    }
}
