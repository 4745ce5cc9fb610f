//! Waymark's wire contract: every type that crosses a process boundary (HTTP bodies, SSE
//! events, error documents), the state machines of the four objects, and the digests that
//! bind them. No I/O lives here, so adapters and clients can depend on it cheaply.

#[macro_use]
mod macros;

pub mod api;
pub mod digest;
pub mod error;
pub mod event;
pub mod followup;
pub mod ids;
pub mod machine;
pub mod rules;
pub mod signing;
pub mod sse;
pub mod state;
pub mod steer;

pub use api::*;
pub use error::{ErrorCode, Problem};
pub use event::{ACCESS_OWNER, Event, EventKind};
pub use followup::*;
pub use machine::*;
pub use rules::*;
pub use state::{
    ApprovalDurability, AttemptState, DecisionKind, DecisionStatus, DeliveryState, DeliveryStep,
    EffectStatus, FinishOutcome, FollowupState, Operation, PushKind, RuntimeFallback, TaskState,
};
pub use steer::*;

/// Largest integer a JSON number carries exactly (SPEC §9: sequences, fences, revisions and
/// cursors stay below it).
pub const MAX_SAFE_INTEGER: i64 = (1 << 53) - 1;
