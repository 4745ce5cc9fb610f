//! The companion's core, shared by the `waymark` terminal client and the app: a local SQLite
//! mirror of the threads a person may see, a sync engine (snapshot, then the event stream from
//! a cursor), an outbox of commands signed on this device and delivered exactly once, device
//! keys in the OS keychain, and the notification policy. It never imports axum or tauri.

mod api;
pub mod keystore;
pub mod mirror;
pub mod notify;
mod pairing;
mod receipts;
mod rules;
mod steer;
mod sync;
pub mod touched;

use std::path::{Path, PathBuf};

use tokio::sync::{Mutex, watch};

pub use api::decode_events;
pub use keystore::{Backend, Keystore};
pub use mirror::{
    InboxItem, Mirror, OutboxEntry, OutboxStatus, Stage, StageStatus, ThreadDetail, ThreadRow,
};
pub use pairing::{Identity, PairingLink, parse_pairing_link};
pub use rules::NewRule;
pub use steer::{Seen, StartRun, edited_intent};
pub use sync::{LinkHealth, SyncReport};
pub use touched::{Look, Touched};

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

/// How long a signed command stays valid (it may wait in the outbox).
const COMMAND_LIFETIME: chrono::Duration = chrono::Duration::hours(24);

/// The companion: mirror, sync, outbox.
pub struct Companion {
    home: PathBuf,
    keystore_choice: Option<String>,
    mirror: Mirror,
    session: Mutex<Option<(String, i64)>>,
    health: watch::Sender<LinkHealth>,
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
        // Under the user's escalation policy a decision notifies only the devices its steps
        // reached so far; a later step reaching this one raises it then. Another user's task
        // (they delegated their decisions to this one) notifies only the decisions a step of
        // theirs sent here, and says whose it is.
        let identity = self.identity().await?;
        let me = identity.as_ref().map(|i| i.device_id.as_str());
        let foreign = identity
            .as_ref()
            .is_some_and(|i| !thread.task.owner.is_empty() && thread.task.owner != i.user);
        let mut out = Vec::new();
        for mut n in notify::for_thread_with(&thread, &stats) {
            let decision = n
                .decision_id
                .as_deref()
                .and_then(|id| thread.decisions.iter().find(|d| d.id == id));
            let reaches = match (decision, me) {
                (Some(d), Some(me)) if foreign => notify::reaches_delegate(d, me),
                (Some(d), Some(me)) => notify::reaches(d, me),
                (None, _) => !foreign,
                (Some(_), None) => true,
            };
            if !reaches {
                continue;
            }
            if foreign {
                n.title = format!("For {}: {}", thread.task.owner, n.title);
            }
            // A reminder is shown again, once per reminder.
            if let (Some(d), Some(me)) = (decision, me)
                && let Some(r) = notify::reminder_for(d, me)
            {
                n.key = format!("{}:reminder:{r}", n.key);
                n.title = format!("Reminder: {}", n.title);
            }
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
                    .put_blob(sha256, &data, sync::BLOB_CACHE_BYTES)
                    .await?;
                Ok(data)
            }
            Err(Error::Unreachable(_)) => Err(Error::BlobMissing(sha256.to_owned())),
            Err(e) => Err(e),
        }
    }
}
