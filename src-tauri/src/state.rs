//! What the shell keeps between commands: the companion (mirror, sync, outbox), which mode
//! the app runs in, the embedded control plane when there is one, and the few bits of UI
//! state that belong to the process rather than the mirror (mute, the demo's last words).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use waymark_companion::Companion;

use crate::views::StatusView;

/// How the app reaches its control plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Deciding (the embedded control plane is starting).
    Starting,
    /// A control plane in this process, paired as a local device.
    Embedded,
    /// A server elsewhere (paired with a link or code).
    Remote,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Mode::Starting => "starting",
            Mode::Embedded => "embedded",
            Mode::Remote => "remote",
        }
    }
}

/// The shared state every command and background task sees.
pub struct Shared {
    /// The core.
    pub companion: Arc<Companion>,
    mode: Mutex<Mode>,
    /// The embedded control plane, when running.
    pub embedded: tokio::sync::Mutex<Option<crate::embedded::Embedded>>,
    /// Notifications are muted until (unix ms; 0 when not muted).
    muted_until: AtomicI64,
    /// The last moment the mirror was known current: the stream was open (unix ms; 0 never).
    live_at: AtomicI64,
    /// The embedded demo agent's last progress line.
    demo: Mutex<Option<String>>,
    /// Why the app cannot sync, when the sync engine gave up (e.g. no keychain).
    fatal: Mutex<Option<String>>,
    /// Wakes the sync loop after pairing, so it follows the new identity.
    pub repaired: Notify,
    /// The desktop notification shown for each decision still open, so it is withdrawn when
    /// the decision closes.
    pub shown: Shown,
}

impl Shared {
    /// Shared state over an opened companion.
    pub fn new(companion: Companion) -> Self {
        Shared {
            companion: Arc::new(companion),
            mode: Mutex::new(Mode::Starting),
            embedded: tokio::sync::Mutex::new(None),
            muted_until: AtomicI64::new(0),
            live_at: AtomicI64::new(0),
            demo: Mutex::new(None),
            fatal: Mutex::new(None),
            repaired: Notify::new(),
            shown: Shown::default(),
        }
    }

    /// The mode.
    pub fn mode(&self) -> Mode {
        *self.mode.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the mode.
    pub fn set_mode(&self, m: Mode) {
        *self.mode.lock().unwrap_or_else(|e| e.into_inner()) = m;
    }

    /// Whether notifications are muted now.
    pub fn muted(&self) -> bool {
        self.muted_until.load(Ordering::Relaxed) > chrono::Utc::now().timestamp_millis()
    }

    /// Mutes for `minutes` (0 unmutes).
    pub fn mute_for(&self, minutes: i64) {
        let until = if minutes > 0 {
            chrono::Utc::now().timestamp_millis() + minutes * 60_000
        } else {
            0
        };
        self.muted_until.store(until, Ordering::Relaxed);
    }

    /// Notes that the stream is (or was until now) open, so the mirror is current to now.
    pub fn mark_live(&self) {
        self.live_at
            .store(chrono::Utc::now().timestamp_millis(), Ordering::Relaxed);
    }

    /// Records the demo agent's progress.
    pub fn set_demo(&self, line: String) {
        *self.demo.lock().unwrap_or_else(|e| e.into_inner()) = Some(line);
    }

    /// Records (or clears) why syncing stopped.
    pub fn set_fatal(&self, why: Option<String>) {
        *self.fatal.lock().unwrap_or_else(|e| e.into_inner()) = why;
    }

    /// The status bar and offline banner's facts.
    pub async fn status(&self) -> Result<StatusView, waymark_companion::Error> {
        let c = &self.companion;
        let id = c.identity().await?;
        let h = c.health().borrow().clone();
        let queued = c
            .mirror()
            .outbox(None)
            .await?
            .iter()
            .filter(|e| e.status == waymark_companion::OutboxStatus::Queued)
            .count() as i64;
        let pending = c.mirror().inbox().await?.len() as i64;
        let muted = self.muted_until.load(Ordering::Relaxed);
        let fatal = self.fatal.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let keystore = id
            .as_ref()
            .and_then(|_| c.keystore().ok())
            .map(|k| k.backend().describe().to_owned());
        Ok(StatusView {
            mode: self.mode().as_str().into(),
            paired: id.is_some(),
            server: id.as_ref().map(|i| i.server.clone()),
            device_id: id.as_ref().map(|i| i.device_id.clone()),
            user: id.as_ref().map(|i| i.user.clone()),
            scopes: id.map(|i| i.scopes).unwrap_or_default(),
            connected: h.connected,
            server_reachable: h.server_reachable,
            last_sync_at: if h.connected {
                Some(chrono::Utc::now().timestamp_millis())
            } else {
                let live = self.live_at.load(Ordering::Relaxed);
                h.last_sync_at.max((live > 0).then_some(live))
            },
            last_event_at: h.last_event_at,
            reconnecting_since: h.reconnecting_since,
            last_error: fatal.or(h.last_error),
            queued,
            pending_decisions: pending,
            muted_until: (muted > chrono::Utc::now().timestamp_millis()).then_some(muted),
            demo: self.demo.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            keystore,
        })
    }
}

/// The handle commands get.
pub type AppState = Arc<Shared>;

/// The desktop notification shown for each open decision (its id on the notification
/// server).
#[derive(Debug, Default)]
pub struct Shown(std::sync::Mutex<std::collections::HashMap<String, u32>>);

impl Shown {
    /// Remembers the notification shown for a decision (a newer one replaces it).
    pub fn remember(&self, decision: String, notification: u32) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(decision, notification);
    }

    /// Forgets, and returns, the notifications of the decisions among `decisions` that are no
    /// longer open (each `(id, open)`).
    pub fn take_closed<'a>(
        &self,
        decisions: impl IntoIterator<Item = (&'a str, bool)>,
    ) -> Vec<(String, u32)> {
        let mut shown = self.0.lock().unwrap_or_else(|e| e.into_inner());
        decisions
            .into_iter()
            .filter(|(_, open)| !open)
            .filter_map(|(id, _)| shown.remove_entry(id))
            .collect()
    }
}
