//! Events the shell sends the UI. They carry no data the UI could trust over the mirror: they
//! say "read again", or where to go.

use serde::{Deserialize, Serialize};
use specta::Type;
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
