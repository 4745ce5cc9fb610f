//! Devices and signed steer commands on the wire (SPEC §5, §9): pairing, the command and its
//! signed envelope, and the command ledger's answers.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::state::{Operation, TaskState};

/// A steer command: versioned, signed, applied by compare-and-set on the plan revision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(deny_unknown_fields)]
pub struct SteerCommand {
    /// UUIDv7, chosen by the device; the same id is applied once.
    pub command_id: String,
    /// The task it steers (absent for `open_session`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// The plan revision the person saw when they decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_plan_revision: Option<i64>,
    /// What to do.
    pub operation: Operation,
    /// Plan steps it concerns (e.g. the steps a replan suspends).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scope: Vec<String>,
    /// Operation arguments: `decision_id`, `intent_digest`, `option`, `text`, `instructions`,
    /// `plan`.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    #[schema(value_type = Object)]
    pub args: Value,
    /// `user:<name>`.
    pub issued_by: String,
    /// The signing device (must equal the signature's `key_id`).
    pub device_id: String,
    /// When it was signed (device clock).
    pub issued_at: DateTime<Utc>,
    /// After this it is refused.
    pub expires_at: DateTime<Utc>,
}

/// The signature over a command's RFC 8785 canonical bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(deny_unknown_fields)]
pub struct Signature {
    /// `ed25519`.
    pub alg: String,
    /// The device id.
    pub key_id: String,
    /// base64url (no padding) of the 64-byte signature.
    pub sig: String,
}

/// What a device sends: `{"command": {...}, "signature": {...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignedEnvelope {
    /// The command, exactly as signed. Servers verify over the canonical form of the JSON they
    /// received, so fields they do not know cannot slip past the signature.
    #[schema(value_type = SteerCommand)]
    pub command: Value,
    /// The signature.
    pub signature: Signature,
}

str_enum! {
    /// How a command ended.
    pub enum CommandStatus {
        /// Applied now.
        Applied => "applied",
        /// This id was seen before with the same body; `original` is its result.
        Duplicate => "duplicate",
        /// The plan moved on: nothing was applied; the current revision and state are given.
        Conflict => "conflict",
        /// Refused; `reason` says why.
        Rejected => "rejected",
    }
}

/// Why a command was refused. Stable codes; each refusal is audited with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(rename_all = "snake_case")]
pub enum RejectReason {
    /// `signature.alg` is not `ed25519`.
    UnsupportedAlg,
    /// No device with this key id.
    UnknownDevice,
    /// `command.device_id` differs from `signature.key_id`.
    DeviceMismatch,
    /// The device was revoked.
    DeviceRevoked,
    /// The signature does not verify over the command's canonical bytes.
    BadSignature,
    /// `expires_at` has passed.
    Expired,
    /// `issued_at` is in the future beyond the allowed skew.
    ClockSkew,
    /// `expires_at` is too far after `issued_at`.
    LifetimeTooLong,
    /// The command id was used before with a different body.
    CommandIdReused,
    /// The command is not well-formed (missing task, bad args, wrong shape).
    InvalidCommand,
    /// The task does not exist or belongs to another user.
    NotYourTask,
    /// The device lacks the scope the operation needs.
    MissingScope,
    /// The task has finished.
    TaskTerminal,
    /// The decision is not pending.
    DecisionClosed,
    /// The approval has expired.
    ApprovalExpired,
    /// The approval was asked at an older plan revision.
    ApprovalSuperseded,
    /// The intent digest differs from the one the approval binds.
    DigestMismatch,
    /// The operation does not fit the decision (e.g. `approve` on a question).
    WrongOperation,
    /// The operation is not valid in the task's current state (e.g. resume when running).
    InvalidState,
    /// `start_run` names no machine of the user.
    UnknownMachine,
    /// `start_run` asks what the machine does not allow or lack: a directory outside its
    /// allowed ones, or a runtime it does not have.
    NotAllowedOnMachine,
}

impl RejectReason {
    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        REASONS
            .iter()
            .find(|(r, _)| *r == self)
            .map_or("invalid_command", |(_, n)| *n)
    }
}

const REASONS: &[(RejectReason, &str)] = &[
    (RejectReason::UnsupportedAlg, "unsupported_alg"),
    (RejectReason::UnknownDevice, "unknown_device"),
    (RejectReason::DeviceMismatch, "device_mismatch"),
    (RejectReason::DeviceRevoked, "device_revoked"),
    (RejectReason::BadSignature, "bad_signature"),
    (RejectReason::Expired, "expired"),
    (RejectReason::ClockSkew, "clock_skew"),
    (RejectReason::LifetimeTooLong, "lifetime_too_long"),
    (RejectReason::CommandIdReused, "command_id_reused"),
    (RejectReason::InvalidCommand, "invalid_command"),
    (RejectReason::NotYourTask, "not_your_task"),
    (RejectReason::MissingScope, "missing_scope"),
    (RejectReason::TaskTerminal, "task_terminal"),
    (RejectReason::DecisionClosed, "decision_closed"),
    (RejectReason::ApprovalExpired, "approval_expired"),
    (RejectReason::ApprovalSuperseded, "approval_superseded"),
    (RejectReason::DigestMismatch, "digest_mismatch"),
    (RejectReason::WrongOperation, "wrong_operation"),
    (RejectReason::InvalidState, "invalid_state"),
    (RejectReason::UnknownMachine, "unknown_machine"),
    (RejectReason::NotAllowedOnMachine, "not_allowed_on_machine"),
];

/// The ledger's answer to a command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct CommandResult {
    /// Applied, duplicate, conflict or rejected.
    pub status: CommandStatus,
    /// The command.
    pub command_id: String,
    /// The task (when known).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// The operation (when it parsed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<Operation>,
    /// Why it was rejected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<RejectReason>,
    /// For people: what happened and what to do.
    pub detail: String,
    /// The plan revision the command was based on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub based_on_revision: Option<i64>,
    /// The task's plan revision now (after applying, or met on conflict).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan_revision: Option<i64>,
    /// The task's state now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_state: Option<TaskState>,
    /// The event cursor of the change (applied only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<i64>,
    /// For a duplicate: the first delivery's result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(no_recursion)]
    pub original: Option<Box<CommandResult>>,
}

/// `POST /v1/devices/pair`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PairDevice {
    /// The one-time code from `waymark admin pair` (dashes and case ignored).
    pub code: String,
    /// The device's Ed25519 public key, base64url (32 bytes). The private half never leaves
    /// the device.
    pub public_key: String,
    /// A name for people, e.g. `alice's phone`.
    pub name: String,
}

/// A paired device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct Device {
    /// `dev_…`; also the signature `key_id`.
    pub id: String,
    /// Its user.
    pub user: String,
    /// Its name.
    pub name: String,
    /// `view`, `steer`, `approve`.
    pub scopes: Vec<String>,
    /// base64url public key.
    pub public_key: String,
    /// Paired at.
    pub created_at: DateTime<Utc>,
    /// Revoked at.
    pub revoked_at: Option<DateTime<Utc>>,
    /// When it was last heard from (a read session opened, a receipt posted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen_at: Option<DateTime<Utc>>,
    /// Not heard from for longer than the server's `device_stale_after`: shown stale, never
    /// connected.
    #[serde(default)]
    pub stale: bool,
}

/// One step a decision reached on one device (`decision.delivered`; a decision's `deliveries`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct DeviceDelivery {
    /// The decision.
    #[schema(pattern = r"^dec_[0-9a-f]{32}$")]
    pub decision_id: String,
    /// The device.
    pub device_id: String,
    /// Its name, for people.
    pub device_name: String,
    /// The step reached.
    pub step: crate::state::DeliveryStep,
    /// When it was first reached.
    pub at: DateTime<Utc>,
    /// What the server or the device said (e.g. the push service's status).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// One receipt a device posts about a decision: `fetched`, `shown` or `opened`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(deny_unknown_fields)]
pub struct DeviceReceipt {
    /// The decision.
    #[schema(pattern = r"^dec_[0-9a-f]{32}$")]
    pub decision_id: String,
    /// `fetched`, `shown` or `opened` (`pushed` and `answered` the server records itself).
    pub step: crate::state::DeliveryStep,
}

/// `POST /v1/devices/{device}/receipts` (the device's read session): how far decisions have
/// reached it. Each step is recorded once; repeats are fine.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(deny_unknown_fields)]
pub struct PostReceipts {
    /// At most 200.
    #[schema(max_items = 200)]
    pub receipts: Vec<DeviceReceipt>,
}

/// The answer to `POST /v1/devices/{device}/receipts`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct ReceiptsRecorded {
    /// Steps recorded now (repeats are not counted).
    pub recorded: usize,
    /// The cursor of the last event written (or the head, when nothing was new).
    pub cursor: i64,
}

/// A read session for a device.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct DeviceSession {
    /// Bearer token for reads (`wmk_s_…`).
    pub token: String,
    /// When it stops working.
    pub expires_at: DateTime<Utc>,
}

/// A command acknowledged by the worker (`command.acknowledged` event data).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct CommandAck {
    /// The command.
    pub command_id: String,
    /// Its task.
    pub task_id: String,
    /// The attempt that saw it.
    pub attempt_id: String,
    /// When.
    pub at: DateTime<Utc>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_spelling_matches_serde() {
        for (r, name) in REASONS {
            assert_eq!(serde_json::to_value(r).unwrap(), *name);
            assert_eq!(r.as_str(), *name);
        }
    }
}

/// `POST /v1/devices/{device}/push`: where to reach this device when it is not connected.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RegisterPush {
    /// `web_push` (RFC 8030 with VAPID, RFC 8292, and aes128gcm payloads, RFC 8291) or
    /// `unified_push` (a plain HTTP endpoint, e.g. a self-hosted ntfy).
    pub kind: String,
    /// The push service's endpoint URL.
    pub endpoint: String,
    /// Web Push subscription keys.
    #[serde(default)]
    pub keys: Option<PushKeys>,
}

/// A Web Push subscription's keys (base64url).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PushKeys {
    /// The client's P-256 public key.
    pub p256dh: String,
    /// The 16-byte authentication secret.
    pub auth: String,
}

/// A push channel and its delivery record: failures stay visible.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PushChannel {
    /// `push_…`.
    pub id: String,
    /// Its device.
    pub device_id: String,
    /// `web_push` or `unified_push`.
    pub kind: String,
    /// The endpoint.
    pub endpoint: String,
    /// Pushes sent.
    pub delivered: i64,
    /// Delivery attempts.
    pub attempts: i64,
    /// Failed attempts.
    pub failures: i64,
    /// The last failure, for people.
    pub last_error: Option<String>,
    /// The last attempt.
    pub last_attempt_at: Option<DateTime<Utc>>,
    /// The next retry (after failures).
    pub next_attempt_at: DateTime<Utc>,
    /// Given up on (the push service said the subscription is gone).
    pub revoked_at: Option<DateTime<Utc>>,
}

/// `GET /v1/push/vapid`: the server's VAPID public key (browsers' `applicationServerKey`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct VapidKey {
    /// Uncompressed P-256 point, base64url.
    pub public_key: String,
}

/// What a push carries by default: no content, only what to fetch over the device's
/// authenticated session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PushPayload {
    /// Format version (1).
    pub v: u32,
    /// The event kind, e.g. `decision.requested`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The task to open.
    pub task_id: String,
    /// The event's cursor: sync at least this far.
    pub cursor: i64,
    /// `decision.closed` only: the decision that closed, so the device withdraws its
    /// notification for it (tagged with this id) — sent only to devices it was pushed to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = r"^dec_[0-9a-f]{32}$")]
    pub decision_id: Option<String>,
}
