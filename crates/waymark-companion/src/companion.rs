//! The companion itself: the mirror in its home, the device's session with its server and the
//! link's health; the sync engine, the outbox, pairing, receipts, rules and notifications add
//! their operations to it from their own modules.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tokio::sync::{Mutex, watch};

use crate::error::Error;
use crate::mirror::Mirror;

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
pub(crate) const COMMAND_LIFETIME: chrono::Duration = chrono::Duration::hours(24);

/// The companion: mirror, sync, outbox.
pub struct Companion {
    pub(crate) home: PathBuf,
    pub(crate) keystore_choice: Option<String>,
    pub(crate) mirror: Mirror,
    /// The read session's token and when it expires (unix ms).
    pub(crate) session: Mutex<Option<(String, i64)>>,
    pub(crate) health: watch::Sender<LinkHealth>,
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
}
