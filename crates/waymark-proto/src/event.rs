//! The event log's wire form. Every state change appends one event, in the same transaction,
//! with a global cursor; SSE carries them with `id:` = cursor.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What changed. The event's `data` holds the changed object in full, so a mirror can apply
/// events idempotently without a second read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub enum EventKind {
    /// `data`: the `Task`.
    #[serde(rename = "task.created")]
    TaskCreated,
    /// `data`: the `Task` (state, plan, revision, usage or outcome changed).
    #[serde(rename = "task.updated")]
    TaskUpdated,
    /// `data`: the `Attempt`.
    #[serde(rename = "attempt.started")]
    AttemptStarted,
    /// `data`: the `Attempt` (finished, superseded or revoked).
    #[serde(rename = "attempt.ended")]
    AttemptEnded,
    /// `data`: the `Attempt` (e.g. resources it reported released).
    #[serde(rename = "attempt.updated")]
    AttemptUpdated,
    /// `data`: the `Checkpoint`.
    #[serde(rename = "checkpoint.appended")]
    CheckpointAppended,
    /// `data`: the `Effect`.
    #[serde(rename = "effect.declared")]
    EffectDeclared,
    /// `data`: the `Effect`.
    #[serde(rename = "effect.updated")]
    EffectUpdated,
    /// `data`: the `Decision`.
    #[serde(rename = "decision.requested")]
    DecisionRequested,
    /// `data`: the `Decision` (resolved, expired or void).
    #[serde(rename = "decision.closed")]
    DecisionClosed,
    /// `data`: the `Decision` (the runtime took, or lost, its answer).
    #[serde(rename = "decision.updated")]
    DecisionUpdated,
    /// `data`: the `Artifact`.
    #[serde(rename = "artifact.added")]
    ArtifactAdded,
    /// `data`: the `TestReceipt`.
    #[serde(rename = "test_receipt.added")]
    TestReceiptAdded,
    /// `data`: `{"messages": [Message…]}`.
    #[serde(rename = "messages.appended")]
    MessagesAppended,
    /// `data`: the `CommandResult` of an applied steer command.
    #[serde(rename = "command.applied")]
    CommandApplied,
    /// `data`: `FollowupFired` (its message was delivered into the task's session).
    #[serde(rename = "followup.fired")]
    FollowupFired,
    /// `data`: the `CommandAck` (the worker saw the command).
    #[serde(rename = "command.acknowledged")]
    CommandAcknowledged,
    /// `data`: the `DeviceDelivery` (a decision reached one more step on a device).
    #[serde(rename = "decision.delivered")]
    DecisionDelivered,
    /// `data`: the `Decision`, its `escalation` moved on: a step notified its devices, was held
    /// by quiet hours, or escalation stopped because someone opened it.
    #[serde(rename = "decision.escalated")]
    DecisionEscalated,
    /// Never sent on a stream: the server's word to its own streams (on every replica, through
    /// the log they all follow) that some users' access changed — a device was revoked, a
    /// delegation was accepted, declined or ended — so their streams re-read it at once.
    /// Kept under the owner [`ACCESS_OWNER`]; `data`: `{"users": [user id…]}`.
    #[serde(rename = "access.changed")]
    AccessChanged,
}

/// The owner of [`EventKind::AccessChanged`] events: no user's id (those begin `usr_`), so no
/// owner's stream, push or page ever carries one.
pub const ACCESS_OWNER: &str = "~access";

impl EventKind {
    /// The wire spelling, also the SSE `event:` name.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::TaskCreated => "task.created",
            EventKind::TaskUpdated => "task.updated",
            EventKind::AttemptStarted => "attempt.started",
            EventKind::AttemptEnded => "attempt.ended",
            EventKind::AttemptUpdated => "attempt.updated",
            EventKind::CheckpointAppended => "checkpoint.appended",
            EventKind::EffectDeclared => "effect.declared",
            EventKind::EffectUpdated => "effect.updated",
            EventKind::DecisionRequested => "decision.requested",
            EventKind::DecisionClosed => "decision.closed",
            EventKind::DecisionUpdated => "decision.updated",
            EventKind::ArtifactAdded => "artifact.added",
            EventKind::TestReceiptAdded => "test_receipt.added",
            EventKind::MessagesAppended => "messages.appended",
            EventKind::CommandApplied => "command.applied",
            EventKind::FollowupFired => "followup.fired",
            EventKind::CommandAcknowledged => "command.acknowledged",
            EventKind::DecisionDelivered => "decision.delivered",
            EventKind::DecisionEscalated => "decision.escalated",
            EventKind::AccessChanged => "access.changed",
        }
    }
}

impl std::str::FromStr for EventKind {
    type Err = crate::state::UnknownValue;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        serde_json::from_value(serde_json::Value::String(s.to_owned())).map_err(|_| {
            crate::state::UnknownValue {
                kind: "EventKind",
                value: s.to_owned(),
            }
        })
    }
}

/// One entry of the event log.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct Event {
    /// Global, strictly increasing position in the log.
    pub cursor: i64,
    /// The task it concerns.
    pub task_id: String,
    /// What changed.
    pub kind: EventKind,
    /// Server time of the change.
    pub at: DateTime<Utc>,
    /// The changed object (see `kind`).
    #[schema(value_type = Object)]
    pub data: serde_json::Value,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_spelling_matches_serde() {
        for k in [
            EventKind::TaskCreated,
            EventKind::MessagesAppended,
            EventKind::DecisionClosed,
            EventKind::AccessChanged,
        ] {
            assert_eq!(serde_json::to_value(k).unwrap(), k.as_str());
            assert_eq!(k.as_str().parse::<EventKind>().unwrap(), k);
        }
    }
}
