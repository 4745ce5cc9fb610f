//! The companion's core, shared by the `waymark` terminal client and the app: a local SQLite
//! mirror of the threads a person may see, a sync engine (snapshot, then the event stream from
//! a cursor), an outbox of commands signed on this device and delivered exactly once, device
//! keys in the OS keychain, and the notification policy. It never imports axum or tauri.

mod api;
mod companion;
mod error;
pub mod keystore;
pub mod mirror;
pub mod notify;
mod pairing;
mod receipts;
mod rules;
mod steer;
mod sync;
pub mod touched;

pub use api::decode_events;
pub use companion::{Companion, LinkHealth, default_home};
pub use error::Error;
pub use keystore::{Backend, Keystore};
pub use mirror::{
    InboxItem, Mirror, OutboxEntry, OutboxStatus, Stage, StageStatus, ThreadDetail, ThreadRow,
};
pub use pairing::{Identity, PairingLink, parse_pairing_link};
pub use rules::NewRule;
pub use steer::{Seen, StartRun, edited_intent};
pub use sync::SyncReport;
pub use touched::{Look, Touched};
