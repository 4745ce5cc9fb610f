//! The companion's core, shared by the `waymark` terminal client and the app: a local SQLite
//! mirror of the threads a person may see, a sync engine (snapshot, then the event stream from
//! a cursor), an outbox of commands signed on this device and delivered exactly once, device
//! keys in the OS keychain, and the notification policy. It never imports axum or tauri.

mod api;
pub mod keystore;
pub mod mirror;
pub mod notify;
mod steer;
pub mod touched;

use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::Utc;
use ed25519_dalek::SigningKey;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::sync::{Mutex, watch};
use waymark_proto::*;

pub use api::decode_events;
pub use keystore::{Backend, Keystore};
pub use mirror::{InboxItem, Mirror, OutboxEntry, Stage, ThreadDetail, ThreadRow};
pub use steer::Seen;
pub use touched::{Look, Touched};

use crate::api::Api;

/// Why a companion operation failed. Messages say what to do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server cannot be reached (the operation may be queued).
    #[error("cannot reach the server — {0}")]
    Unreachable(String),
    /// The server presented a TLS certificate other than the one pinned when pairing.
    #[error(
        "the server's certificate does not match the one paired ({pinned}); it presented {presented} — nothing was sent. If the server's certificate was replaced on purpose, pair again with a new link from `waymark admin pair`"
    )]
    CertificateMismatch {
        /// The pinned fingerprint (`sha256:<hex>`).
        pinned: String,
        /// What the server presented.
        presented: String,
    },
    /// The server refused (a stable code and its reason).
    #[error("{detail} ({code})")]
    Refused {
        /// The stable code.
        code: String,
        /// Why.
        detail: String,
    },
    /// The server answered something this client does not understand.
    #[error("{0}")]
    Protocol(String),
    /// The event cursor is older than the server keeps; a new snapshot follows.
    #[error("the event cursor expired; re-snapshotting")]
    CursorExpired,
    /// This machine is not paired.
    #[error(
        "this machine is not paired with a server — run `waymark pair LINK` with a link from `waymark admin pair`"
    )]
    NotPaired,
    /// No usable OS keychain.
    #[error(
        "no usable OS keychain ({0}) — start a Secret Service (e.g. gnome-keyring) or use the kernel keyring (`keyctl session`); on a headless host where you accept a key file, set WAYMARK_KEYSTORE=file-insecure"
    )]
    NoKeychain(String),
    /// The device key is missing from the keychain.
    #[error("the device key is not in {0} — pair this machine again with `waymark pair`")]
    NoDeviceKey(String),
    /// The mirror database failed.
    #[error("the local mirror: {0}")]
    Mirror(String),
    /// Not in the mirror.
    #[error("{0}")]
    NotFound(String),
    /// Bad input from the person.
    #[error("{0}")]
    Invalid(String),
    /// A blob is not cached and the server is unreachable.
    #[error(
        "`{0}` is not in the offline cache and the server cannot be reached — it will be fetched when you are back online"
    )]
    BlobMissing(String),
}

/// The companion's data dir: `$WAYMARK_HOME`, else the XDG data dir (`~/.local/share/waymark-companion`).
pub fn default_home() -> PathBuf {
    if let Some(h) = std::env::var_os("WAYMARK_HOME") {
        return PathBuf::from(h);
    }
    directories::ProjectDirs::from("dev", "waymark", "waymark-companion")
        .map(|d| d.data_dir().to_path_buf())
        .unwrap_or_else(|| PathBuf::from(".waymark-companion"))
}

/// The link between this device and its server.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LinkHealth {
    /// A stream is open.
    pub connected: bool,
    /// Since when the engine has been trying to reconnect (unix ms).
    pub reconnecting_since: Option<i64>,
    /// Server time of the last event applied (unix ms).
    pub last_event_at: Option<i64>,
    /// When the mirror last caught up (unix ms).
    pub last_sync_at: Option<i64>,
    /// The last call reached the server.
    pub server_reachable: bool,
    /// The last error, for people.
    pub last_error: Option<String>,
}

/// What a sync did.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SyncReport {
    /// Events applied.
    pub events: usize,
    /// A full snapshot was taken (first sync, or the cursor expired).
    pub snapshot: bool,
    /// Queued commands delivered, with their results.
    pub delivered: Vec<OutboxEntry>,
    /// Blobs fetched for offline review.
    pub prefetched: usize,
    /// The cursor the mirror is current to.
    pub cursor: i64,
}

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

/// Called with every batch of events applied while following.
type OnBatch<'a> = Option<&'a (dyn Fn(&[Event]) + Sync)>;

/// How long a signed command stays valid (it may wait in the outbox).
const COMMAND_LIFETIME: chrono::Duration = chrono::Duration::hours(24);
/// Cached blobs are capped at this many bytes (least recently used go first).
pub const BLOB_CACHE_BYTES: i64 = 256 << 20;

/// Most events applied to the mirror in one transaction while catching up (a live stream
/// applies what it has after 30 ms without a new event).
const APPLY_BATCH: usize = 2048;

/// A batch being applied to the mirror while the stream is read on; it hands the batch back.
type Writing = tokio::task::JoinHandle<Result<Vec<Event>, Error>>;

/// The companion: mirror, sync, outbox.
pub struct Companion {
    home: PathBuf,
    keystore_choice: Option<String>,
    mirror: Mirror,
    session: Mutex<Option<(String, i64)>>,
    health: watch::Sender<LinkHealth>,
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
fn check_pin(server: &str, pin: &str) -> Result<String, Error> {
    let pin = waymark_tls_pin::parse_pin(pin).map_err(|e| Error::Invalid(e.to_string()))?;
    if !server.starts_with("https://") {
        return Err(Error::Invalid(format!(
            "the link pins a TLS certificate but its server `{server}` is not `https://` — ask for a new link"
        )));
    }
    Ok(pin)
}

impl Companion {
    /// Opens the companion in `home` (created if needed).
    pub async fn open(home: &Path) -> Result<Self, Error> {
        std::fs::create_dir_all(home)
            .map_err(|e| Error::Invalid(format!("cannot create {}: {e}", home.display())))?;
        let mirror = Mirror::open(&home.join("mirror.db")).await?;
        Ok(Companion {
            home: home.to_path_buf(),
            keystore_choice: None,
            mirror,
            session: Mutex::new(None),
            health: watch::channel(LinkHealth::default()).0,
        })
    }

    /// Opens the companion with a named credential store instead of `WAYMARK_KEYSTORE` (see
    /// [`Keystore::open_with`]).
    pub async fn open_with_keystore(home: &Path, choice: &str) -> Result<Self, Error> {
        let mut c = Self::open(home).await?;
        c.keystore_choice = Some(choice.to_owned());
        Ok(c)
    }

    /// The mirror (the UI's queries answer from it alone).
    pub fn mirror(&self) -> &Mirror {
        &self.mirror
    }

    /// Link health, updated as the sync engine runs.
    pub fn health(&self) -> watch::Receiver<LinkHealth> {
        self.health.subscribe()
    }

    /// The paired identity, if any.
    pub async fn identity(&self) -> Result<Option<Identity>, Error> {
        Ok(self
            .mirror
            .meta("identity")
            .await?
            .and_then(|s| serde_json::from_str(&s).ok()))
    }

    async fn require_identity(&self) -> Result<(Identity, Api), Error> {
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
    async fn token(&self, id: &Identity, api: &Api) -> Result<String, Error> {
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

    fn set_health(&self, f: impl FnOnce(&mut LinkHealth)) {
        self.health.send_modify(f);
    }

    async fn resnapshot(&self, api: &Api, token: &str) -> Result<i64, Error> {
        let snap: Snapshot = api.get(token, "/v1/snapshot").await?;
        let mut threads = Vec::with_capacity(snap.tasks.len());
        for t in &snap.tasks {
            threads.push(
                api.get::<TaskDetail>(token, &format!("/v1/tasks/{}", t.task.id))
                    .await?,
            );
        }
        self.mirror.replace_all(snap.cursor, &threads).await?;
        Ok(snap.cursor)
    }

    /// One sync: deliver the outbox, then bring the mirror up to the stream's head (a fresh
    /// snapshot when there is no cursor or it expired), then prefetch blobs for offline review.
    pub async fn sync_once(&self) -> Result<SyncReport, Error> {
        let r = self.sync_inner(None).await;
        self.after_sync(&r);
        r
    }

    fn after_sync(&self, r: &Result<SyncReport, Error>) {
        let now = Utc::now().timestamp_millis();
        match r {
            Ok(_) => self.set_health(|h| {
                h.server_reachable = true;
                h.reconnecting_since = None;
                h.last_sync_at = Some(now);
                h.last_error = None;
            }),
            Err(e) => self.set_health(|h| {
                h.connected = false;
                h.server_reachable = !matches!(e, Error::Unreachable(_));
                h.reconnecting_since.get_or_insert(now);
                h.last_error = Some(e.to_string());
            }),
        }
    }

    /// Streams events until the stream has been idle for `idle`, or forever with `None`
    /// passed as `follow` (then `on_batch` sees every applied batch).
    async fn sync_inner(&self, follow: OnBatch<'_>) -> Result<SyncReport, Error> {
        let (id, api) = self.require_identity().await?;
        let token = self.token(&id, &api).await?;
        let mut report = SyncReport {
            delivered: self.deliver_outbox().await?,
            ..Default::default()
        };
        let mut cursor = match self.mirror.cursor().await? {
            Some(c) => c,
            None => {
                report.snapshot = true;
                self.resnapshot(&api, &token).await?
            }
        };
        // Where the log stands now: once the stream has passed it, a short pause means caught
        // up (otherwise, e.g. when the newest events are another user's, the longer one does).
        let head = match follow {
            Some(_) => None,
            None => api
                .get::<Health>(&token, "/healthz")
                .await
                .ok()
                .map(|h| h.cursor),
        };
        loop {
            match self
                .stream(&api, &token, cursor, head, follow, &mut report)
                .await
            {
                Err(Error::CursorExpired) => {
                    report.snapshot = true;
                    cursor = self.resnapshot(&api, &token).await?;
                }
                other => {
                    other?;
                    break;
                }
            }
        }
        report.prefetched = self.prefetch(&api, &token).await?;
        report.cursor = self.mirror.cursor().await?.unwrap_or(cursor);
        // Commands the stream showed acknowledged are reflected in the outbox entries.
        let ids: Vec<String> = report
            .delivered
            .iter()
            .map(|e| e.command_id.clone())
            .collect();
        report.delivered = self
            .mirror
            .outbox(None)
            .await?
            .into_iter()
            .filter(|e| ids.contains(&e.command_id))
            .collect();
        Ok(report)
    }

    async fn stream(
        &self,
        api: &Api,
        token: &str,
        after: i64,
        head: Option<i64>,
        follow: OnBatch<'_>,
        report: &mut SyncReport,
    ) -> Result<(), Error> {
        let mut events = Box::pin(api.events(token, after).await?);
        self.set_health(|h| {
            h.connected = true;
            h.server_reachable = true;
            h.reconnecting_since = None;
        });
        let idle = if follow.is_some() {
            Duration::from_secs(3600 * 24 * 365)
        } else {
            Duration::from_millis(400)
        };
        let mut batch: Vec<Event> = Vec::new();
        // The previous batch, written to the mirror while the next one is read.
        let mut writing: Option<Writing> = None;
        let mut seen = after;
        loop {
            let pending = !batch.is_empty() || writing.is_some();
            let wait = if pending || head.is_some_and(|h| seen >= h) {
                Duration::from_millis(30)
            } else {
                idle
            };
            match tokio::time::timeout(wait, events.next()).await {
                Ok(Some(Ok(ev))) => {
                    seen = seen.max(ev.cursor);
                    batch.push(ev);
                    if batch.len() < APPLY_BATCH {
                        continue;
                    }
                    // A full batch while catching up: write it while the stream is read on,
                    // one batch in flight at a time so they apply in order.
                    self.written(&mut writing, follow, report).await?;
                    let batch = std::mem::take(&mut batch);
                    let mirror = self.mirror.clone();
                    writing = Some(tokio::spawn(async move {
                        mirror.apply(&batch).await.map(|()| batch)
                    }));
                }
                Ok(Some(Err(e))) => {
                    self.written(&mut writing, follow, report).await?;
                    self.flush(&mut batch, follow, report).await?;
                    return Err(e);
                }
                Ok(None) => {
                    self.written(&mut writing, follow, report).await?;
                    self.flush(&mut batch, follow, report).await?;
                    return Err(Error::Unreachable(
                        "the server closed the event stream".into(),
                    ));
                }
                // The stream paused: apply what came, and after a whole quiet wait, stop.
                Err(_) => {
                    self.written(&mut writing, follow, report).await?;
                    self.flush(&mut batch, follow, report).await?;
                    if !pending {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// Waits for the batch being written, then reports it.
    async fn written(
        &self,
        writing: &mut Option<Writing>,
        follow: OnBatch<'_>,
        report: &mut SyncReport,
    ) -> Result<(), Error> {
        let Some(w) = writing.take() else {
            return Ok(());
        };
        let batch = w
            .await
            .map_err(|e| Error::Mirror(format!("writing to the mirror stopped: {e}")))??;
        self.applied(&batch, follow, report);
        Ok(())
    }

    async fn flush(
        &self,
        batch: &mut Vec<Event>,
        follow: OnBatch<'_>,
        report: &mut SyncReport,
    ) -> Result<(), Error> {
        if batch.is_empty() {
            return Ok(());
        }
        self.mirror.apply(batch).await?;
        self.applied(batch, follow, report);
        batch.clear();
        Ok(())
    }

    fn applied(&self, batch: &[Event], follow: OnBatch<'_>, report: &mut SyncReport) {
        report.events += batch.len();
        let last = batch.last().map(|e| e.at.timestamp_millis());
        self.set_health(|h| h.last_event_at = last);
        if let Some(f) = follow {
            f(batch);
        }
    }

    async fn prefetch(&self, api: &Api, token: &str) -> Result<usize, Error> {
        let mut n = 0;
        for (sha, _) in self.mirror.blobs_to_prefetch().await? {
            let data = api.blob(token, &sha).await?;
            self.mirror.put_blob(&sha, &data, BLOB_CACHE_BYTES).await?;
            n += 1;
        }
        Ok(n)
    }

    /// Follows the server: streams events into the mirror until `stop` fires, reconnecting
    /// with jittered exponential backoff; a dropped connection is never a cancel.
    pub async fn follow(
        &self,
        stop: watch::Receiver<bool>,
        on_batch: &(dyn Fn(&[Event]) + Sync),
    ) -> Result<(), Error> {
        let mut stop = stop;
        let mut backoff = Duration::from_millis(250);
        loop {
            let run = self.sync_inner(Some(on_batch));
            let r = tokio::select! {
                r = run => r,
                _ = stop.wait_for(|s| *s) => return Ok(()),
            };
            self.after_sync(&r);
            match r {
                Err(Error::NotPaired) => return Err(Error::NotPaired),
                Err(e @ (Error::NoKeychain(_) | Error::NoDeviceKey(_) | Error::Mirror(_))) => {
                    return Err(e);
                }
                Err(Error::Refused { code, detail })
                    if code == "device_revoked" || code == "unknown_device" =>
                {
                    return Err(Error::Refused { code, detail });
                }
                Ok(_) => backoff = Duration::from_millis(250),
                Err(e) => tracing::info!(error = %e, "sync interrupted; reconnecting"),
            }
            *self.session.lock().await = None;
            let jitter =
                rand::Rng::gen_range(&mut rand::thread_rng(), 0..=backoff.as_millis() as u64 / 2);
            let wait = backoff + Duration::from_millis(jitter);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.wait_for(|s| *s) => return Ok(()),
            }
            backoff = (backoff * 2).min(Duration::from_secs(30));
        }
    }

    /// The notifications a thread deserves now, from the mirror alone: decisions with their
    /// intent, outputs (with the diff stat of cached diffs) and verification; a finished task
    /// with what it delivered. With `dedup`, each is returned once per device.
    pub async fn notifications(
        &self,
        task_id: &str,
        dedup: bool,
    ) -> Result<Vec<notify::Notification>, Error> {
        let Some(thread) = self.mirror.thread(task_id).await? else {
            return Ok(Vec::new());
        };
        let mut stats = Vec::new();
        for a in &thread.artifacts {
            let is_diff = a.media_type.contains("diff")
                || a.name.ends_with(".diff")
                || a.name.ends_with(".patch");
            if is_diff && let Some(bytes) = self.mirror.blob(&a.sha256).await? {
                stats.push((
                    a.sha256.clone(),
                    notify::diff_stat(&String::from_utf8_lossy(&bytes)),
                ));
            }
        }
        let mut out = Vec::new();
        for n in notify::for_thread_with(&thread, &stats) {
            if !dedup || self.mirror.first_notification(&n.key).await? {
                out.push(n);
            }
        }
        Ok(out)
    }

    /// A blob from the cache, else from the server (then cached).
    pub async fn blob(&self, sha256: &str) -> Result<Vec<u8>, Error> {
        if let Some(b) = self.mirror.blob(sha256).await? {
            return Ok(b);
        }
        let (id, api) = self.require_identity().await?;
        let fetched = async {
            let token = self.token(&id, &api).await?;
            api.blob(&token, sha256).await
        }
        .await;
        match fetched {
            Ok(data) => {
                self.mirror
                    .put_blob(sha256, &data, BLOB_CACHE_BYTES)
                    .await?;
                Ok(data)
            }
            Err(Error::Unreachable(_)) => Err(Error::BlobMissing(sha256.to_owned())),
            Err(e) => Err(e),
        }
    }
}
