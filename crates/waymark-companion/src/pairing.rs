//! Pairing: this machine becomes a device of a server — a pairing link or code, the device
//! key created in the keychain, the server's certificate pin kept with the identity — and the
//! device's read sessions, opened with a signed `open_session`.

use chrono::Utc;
use ed25519_dalek::SigningKey;
use serde::{Deserialize, Serialize};
use waymark_proto::*;

use crate::api::Api;
use crate::companion::Companion;
use crate::error::Error;
use crate::keystore::Keystore;

/// Who this device is.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Identity {
    /// The server.
    pub server: String,
    /// The device id.
    pub device_id: String,
    /// Its user.
    pub user: String,
    /// Its scopes.
    pub scopes: Vec<String>,
    /// The server's TLS certificate fingerprint (`sha256:<hex>`) from the pairing link: only
    /// that certificate is trusted. `None`: the public CAs are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin: Option<String>,
}

/// What a pairing link carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PairingLink {
    /// The server's base URL.
    pub server: String,
    /// The one-time pairing code.
    pub code: String,
    /// The server certificate's fingerprint (`fp=sha256:<hex>`), when the link pins it.
    pub pin: Option<String>,
}

/// Parses `waymark://pair?server=…&code=…[&fp=sha256:…]` (or an `http(s)://…?code=…` URL).
pub fn parse_pairing_link(link: &str) -> Result<PairingLink, Error> {
    let url = url::Url::parse(link.trim()).map_err(|_| {
        Error::Invalid(format!(
            "`{link}` is not a pairing link like `waymark://pair?server=…&code=…`"
        ))
    })?;
    let get = |k: &str| {
        url.query_pairs()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.into_owned())
    };
    let code = get("code").ok_or_else(|| Error::Invalid("the link has no `code`".into()))?;
    let server = match url.scheme() {
        "waymark" => {
            get("server").ok_or_else(|| Error::Invalid("the link has no `server`".into()))?
        }
        "http" | "https" => {
            format!("{}://{}", url.scheme(), url.host_str().unwrap_or_default())
                + &url.port().map(|p| format!(":{p}")).unwrap_or_default()
        }
        other => return Err(Error::Invalid(format!("unsupported link scheme `{other}`"))),
    };
    let pin = get("fp").map(|fp| check_pin(&server, &fp)).transpose()?;
    Ok(PairingLink { server, code, pin })
}

/// A pin is a fingerprint, and means something only for an `https://` server.
pub(crate) fn check_pin(server: &str, pin: &str) -> Result<String, Error> {
    let pin = waymark_tls_pin::parse_pin(pin).map_err(|e| Error::Invalid(e.to_string()))?;
    if !server.starts_with("https://") {
        return Err(Error::Invalid(format!(
            "the link pins a TLS certificate but its server `{server}` is not `https://` — ask for a new link"
        )));
    }
    Ok(pin)
}

impl Companion {
    /// The paired identity, if any.
    pub async fn identity(&self) -> Result<Option<Identity>, Error> {
        Ok(self
            .mirror
            .meta("identity")
            .await?
            .and_then(|s| serde_json::from_str(&s).ok()))
    }

    pub(crate) async fn require_identity(&self) -> Result<(Identity, Api), Error> {
        let id = self.identity().await?.ok_or(Error::NotPaired)?;
        let api = Api::new(&id.server, id.pin.as_deref())?;
        Ok((id, api))
    }

    /// The credential store holding this device's key.
    pub fn keystore(&self) -> Result<Keystore, Error> {
        match &self.keystore_choice {
            Some(c) => Keystore::open_with(&self.home, c),
            None => Keystore::open(&self.home),
        }
    }

    /// Pairs this machine: generates the device key, keeps it in the keychain, registers the
    /// public half with the one-time code.
    pub async fn pair(&self, server: &str, code: &str, name: &str) -> Result<Identity, Error> {
        self.pair_pinned(server, code, None, name).await
    }

    /// Pairs this machine with the server of a pairing link, pinning its certificate when
    /// the link carries a fingerprint.
    pub async fn pair_link(&self, link: &PairingLink, name: &str) -> Result<Identity, Error> {
        self.pair_pinned(&link.server, &link.code, link.pin.as_deref(), name)
            .await
    }

    /// [`Companion::pair`], trusting only the certificate with fingerprint `pin` (`sha256:…`)
    /// from now on, when given.
    pub async fn pair_pinned(
        &self,
        server: &str,
        code: &str,
        pin: Option<&str>,
        name: &str,
    ) -> Result<Identity, Error> {
        let pin = pin.map(|p| check_pin(server, p)).transpose()?;
        let keystore = self.keystore()?;
        let key = SigningKey::generate(&mut rand::rngs::OsRng);
        let api = Api::new(server, pin.as_deref())?;
        let device = api
            .pair(&PairDevice {
                code: code.to_owned(),
                public_key: signing::public_key_b64(&key.verifying_key()),
                name: name.to_owned(),
            })
            .await?;
        keystore.save(&device.id, &key)?;
        if let Some(old) = self.identity().await? {
            let _ = keystore.delete(&old.device_id);
        }
        let identity = Identity {
            server: api.base().to_owned(),
            device_id: device.id,
            user: device.user,
            scopes: device.scopes,
            pin,
        };
        self.mirror
            .set_meta(
                "identity",
                &serde_json::to_string(&identity).unwrap_or_default(),
            )
            .await?;
        *self.session.lock().await = None;
        Ok(identity)
    }

    /// A read token, opening a session with a signed `open_session` when needed.
    pub(crate) async fn token(&self, id: &Identity, api: &Api) -> Result<String, Error> {
        let mut guard = self.session.lock().await;
        let now = Utc::now().timestamp_millis();
        if let Some((t, exp)) = guard.as_ref()
            && *exp > now + 30_000
        {
            return Ok(t.clone());
        }
        let keystore = self.keystore()?;
        let cmd = SteerCommand {
            command_id: ids::command(),
            task_id: None,
            expected_plan_revision: None,
            operation: Operation::OpenSession,
            scope: vec![],
            args: serde_json::Value::Null,
            issued_by: format!("user:{}", id.user),
            device_id: id.device_id.clone(),
            issued_at: Utc::now(),
            expires_at: Utc::now() + chrono::Duration::minutes(2),
        };
        let env = self.sign(&keystore, id, &cmd)?;
        let s = api.open_session(&id.device_id, &env).await?;
        *guard = Some((s.token.clone(), s.expires_at.timestamp_millis()));
        Ok(s.token)
    }
}
