//! Events the shell sends the UI, and the one place that sends them. They carry no data the UI
//! could trust over the mirror: they say "read again", or where to go.

use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use specta::Type;
use tauri::{AppHandle, Manager};
use tauri_specta::Event;

/// The mirror changed: re-read what is on screen.
#[derive(Debug, Clone, Serialize, Deserialize, Type, Event)]
pub struct MirrorChanged {}

/// The link, outbox, mute or demo status changed: re-read the status.
#[derive(Debug, Clone, Serialize, Deserialize, Type, Event)]
pub struct StatusChanged {}

/// Go to a route (from the tray, a notification or a deep link).
#[derive(Debug, Clone, Serialize, Deserialize, Type, Event)]
pub struct Navigate {
    /// `/inbox`, `/inbox/{decision}`, `/threads/{task}`, `/pairing`.
    pub route: String,
    /// An action to confirm on arrival (`approve` of a risky approval).
    pub confirm: Option<String>,
    /// A pairing link to put in the form (never paired without the person's click).
    pub link: Option<String>,
}

/// Tells the UI to re-read the mirror and the status (after a command changed the outbox).
pub fn nudge(app: &AppHandle) {
    let _ = MirrorChanged {}.emit(app);
    let _ = StatusChanged {}.emit(app);
}

/// Tells the UI to re-read the status (the link, the outbox, mute, the demo).
pub fn status_changed(app: &AppHandle) {
    let _ = StatusChanged {}.emit(app);
}

/// Tells the UI to re-read what is on screen.
pub fn mirror_changed(app: &AppHandle) {
    let _ = MirrorChanged {}.emit(app);
}

/// Where the UI should go when it next asks: a link or an action that came before it was
/// listening (managed by the app beside its state).
#[derive(Debug, Default)]
pub struct Pending(Mutex<Option<Navigate>>);

impl Pending {
    /// Takes the remembered destination.
    pub fn take(&self) -> Option<Navigate> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// Shows the main window and sends the UI to `route` (remembered until the UI asks, in case
/// it is not listening yet).
pub fn navigate(app: &AppHandle, route: &str, confirm: Option<String>) {
    send(
        app,
        Navigate {
            route: route.into(),
            confirm,
            link: None,
        },
    );
}

/// Shows the main window and sends the UI where `n` says (remembered, as [`navigate`]).
pub fn send(app: &AppHandle, n: Navigate) {
    if let Some(w) = app.get_webview_window("main") {
        let _ = w.unminimize();
        let _ = w.show();
        let _ = w.set_focus();
    }
    if let Some(p) = app.try_state::<Pending>() {
        *p.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(n.clone());
    }
    let _ = n.emit(app);
}
