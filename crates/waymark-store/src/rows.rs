//! Storage rows. Times are unix milliseconds (server clock); structured columns are JSON;
//! states, statuses, kinds and operations are the domain's enums, and the JSON columns the
//! rules read are the wire types they hold, so a backend that reads a value it does not know
//! says so (`StoreError::Corrupt`) instead of passing a string or a default on. Columns kept
//! as `Value` are kept exactly as given: intents and checkpoint bodies are digested as sent,
//! event data is whatever its event says.

use serde_json::Value;
pub use waymark_proto::{
    ApprovalDurability, AttemptState, CatchUp, CommandStatus, DecisionKind, DecisionStatus,
    DeliveryStep, EffectStatus, EventKind, FinishOutcome, FollowupState, Operation, PushKind,
    RuleAnswer, TaskState, WorkKind, WorkState,
};
pub use waymark_proto::{
    Budget, DecisionOption, DecisionOutcome, Delivery, Escalation, EscalationPolicy, Materials,
    PlanStep, RuntimeDeadline, Usage,
};

/// What a bearer token is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenKind {
    /// The operator's token: every route.
    Admin,
    /// A worker's token: the worker routes, as its user.
    Worker,
}

impl TokenKind {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            TokenKind::Admin => "admin",
            TokenKind::Worker => "worker",
        }
    }
}

impl std::str::FromStr for TokenKind {
    type Err = waymark_proto::state::UnknownValue;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "admin" => Ok(TokenKind::Admin),
            "worker" => Ok(TokenKind::Worker),
            other => Err(waymark_proto::state::UnknownValue {
                kind: "TokenKind",
                value: other.to_owned(),
            }),
        }
    }
}

/// A person who owns tasks.
#[derive(Debug, Clone, PartialEq)]
pub struct UserRow {
    pub id: String,
    pub name: String,
    pub created_at: i64,
}

/// A user who lets another read their tasks and answer their decisions (issue 19: the second
/// person an escalation reaches) — once that other user accepted (issue 32): until then it is
/// an offer, and gives the delegate nothing.
#[derive(Debug, Clone, PartialEq)]
pub struct DelegationRow {
    pub owner_id: String,
    pub delegate_id: String,
    /// When the owner offered it.
    pub created_at: i64,
    /// When the delegate accepted; `None`: an offer still waiting for them.
    pub accepted_at: Option<i64>,
}

impl DelegationRow {
    /// Whether the delegate accepted it: only then may they read or answer anything of the
    /// owner's.
    pub fn accepted(&self) -> bool {
        self.accepted_at.is_some()
    }
}

/// A bearer credential, stored as the sha256 of its secret.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenRow {
    pub id: String,
    pub kind: TokenKind,
    pub name: String,
    pub user_id: String,
    pub secret_hash: String,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
    /// A runner's token: the machine it speaks for (it reaches only that machine's tasks).
    pub machine_id: Option<String>,
}

/// A task.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskRow {
    pub id: String,
    pub owner_id: String,
    pub title: String,
    pub goal: String,
    pub runtime: Option<String>,
    pub state: TaskState,
    /// The plan's steps.
    pub plan: Vec<PlanStep>,
    pub plan_revision: i64,
    pub budget: Budget,
    /// Spend reported so far.
    pub usage: Usage,
    pub materials: Materials,
    pub session_id: String,
    /// The newest attempt's fence (0 before the first).
    pub fence: i64,
    pub outcome_summary: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
    /// For a compensation task: the task whose effect it compensates.
    pub parent_id: Option<String>,
    /// The runtime's own id for this work; unique per owner and runtime.
    pub external_key: Option<String>,
    /// The machine whose runner runs it; set when the task is created, never changed.
    pub machine_id: Option<String>,
}

/// A session (conversation and context) of a task.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRow {
    pub id: String,
    pub task_id: String,
    pub parent_id: Option<String>,
    pub created_at: i64,
}

/// An attempt and its lease.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptRow {
    pub id: String,
    pub task_id: String,
    pub worker: String,
    pub fence: i64,
    pub expires_at: i64,
    pub state: AttemptState,
    pub manifest_digest: Option<String>,
    pub started_at: i64,
    pub ended_at: Option<i64>,
    pub outcome: Option<FinishOutcome>,
    /// Temporary resources the worker reported released (`None`: none reported).
    pub released: Option<Vec<String>>,
}

/// A link of a task's checkpoint chain.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointRow {
    pub task_id: String,
    pub sequence: i64,
    pub attempt_id: String,
    pub fence: i64,
    /// JSON checkpoint body.
    pub body: Value,
    pub prev_digest: Option<String>,
    pub digest: String,
    pub created_at: i64,
}

/// The newest link of a task's chain: what the next checkpoint follows.
#[derive(Debug, Clone, PartialEq)]
pub struct ChainHead {
    pub sequence: i64,
    pub digest: String,
}

/// What a checkpoint append checks, loaded together (`StoreTx::append_context`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AppendContext {
    pub task: Option<TaskRow>,
    /// The attempt named by the append, whichever task it belongs to.
    pub attempt: Option<AttemptRow>,
    /// `None` before the task's first checkpoint.
    pub head: Option<ChainHead>,
}

/// An external effect.
#[derive(Debug, Clone, PartialEq)]
pub struct EffectRow {
    pub id: String,
    pub task_id: String,
    pub idempotency_key: String,
    /// Digest of the declaration (kind, step, resource, intent) to tell a repeat from a misuse.
    pub body_digest: String,
    pub kind: String,
    pub step: Option<String>,
    pub resource_id: Option<String>,
    pub intent: Value,
    pub intent_digest: String,
    pub status: EffectStatus,
    pub receipt: Option<Value>,
    pub attempt_id: String,
    pub fence: i64,
    pub created_at: i64,
    pub updated_at: i64,
    /// Set when the effect needs reconciliation or lost its capability (cancel, replan).
    pub flag: Option<String>,
}

/// An approval or decision.
#[derive(Debug, Clone, PartialEq)]
pub struct DecisionRow {
    pub id: String,
    pub task_id: String,
    pub kind: DecisionKind,
    pub status: DecisionStatus,
    pub step: Option<String>,
    pub question: String,
    pub options: Vec<DecisionOption>,
    pub default_option: Option<String>,
    pub intent: Option<Value>,
    pub intent_digest: Option<String>,
    pub effect_id: Option<String>,
    pub plan_revision: i64,
    pub risky: bool,
    pub expires_at: i64,
    pub created_at: i64,
    /// How it was closed, once it is.
    pub outcome: Option<DecisionOutcome>,
    /// For approvals held by a runtime: how the runtime holds it.
    pub durability: Option<ApprovalDurability>,
    /// Whether the runtime took the answer.
    pub delivery: Option<Delivery>,
    /// The JSON pointer of the intent's part a person may edit before approving.
    pub editable: Option<String>,
    /// When the runtime holding it decides on its own, and how.
    pub runtime_deadline: Option<RuntimeDeadline>,
    /// Where it stands in its user's escalation policy.
    pub escalation: Option<Escalation>,
    /// When its escalation moves next (unix ms); `None` when it will not.
    pub escalate_at: Option<i64>,
}

/// An artifact's metadata; the bytes are a blob.
#[derive(Debug, Clone, PartialEq)]
pub struct ArtifactRow {
    pub id: String,
    pub task_id: String,
    pub sha256: String,
    pub name: String,
    pub media_type: String,
    pub size: i64,
    pub step: Option<String>,
    pub created_at: i64,
}

/// A parsed test receipt.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceiptRow {
    pub id: String,
    pub task_id: String,
    pub step: Option<String>,
    pub command: String,
    pub exit_code: i64,
    pub commit: Option<String>,
    /// JSON totals.
    pub totals: Value,
    /// JSON array of failures.
    pub failures: Value,
    pub duration_seconds: f64,
    pub passed: bool,
    pub junit_sha256: String,
    pub created_at: i64,
}

/// A session message. `seq` is assigned on insert.
#[derive(Debug, Clone, PartialEq)]
pub struct MessageRow {
    pub session_id: String,
    pub task_id: String,
    pub seq: i64,
    pub role: String,
    pub text: String,
    pub created_at: i64,
}

/// An event to append.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    pub task_id: String,
    /// The task owner, so streams can filter by user.
    pub owner_id: String,
    pub kind: EventKind,
    pub data: Value,
    pub at: i64,
}

/// A stored event.
#[derive(Debug, Clone, PartialEq)]
pub struct EventRow {
    pub cursor: i64,
    pub task_id: String,
    pub owner_id: String,
    pub kind: EventKind,
    pub data: Value,
    pub at: i64,
}

/// An audit entry: refusals and security-relevant facts.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditRow {
    pub at: i64,
    /// Who: `worker:<name>`, `admin`, `device:<id>`.
    pub actor: String,
    /// What was attempted, e.g. `checkpoint.append`.
    pub action: String,
    pub task_id: Option<String>,
    /// The refusal's code, e.g. `fenced`.
    pub code: String,
    pub detail: String,
}

/// A paired device and its public key.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceRow {
    pub id: String,
    pub user_id: String,
    pub name: String,
    /// base64url Ed25519 public key.
    pub public_key: String,
    /// What it may do (`read`, `steer`, `approve`…).
    pub scopes: Vec<String>,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
    /// When it was last heard from (a read session, a receipt).
    pub last_seen_at: Option<i64>,
}

/// One step a decision reached on one device, recorded once.
#[derive(Debug, Clone, PartialEq)]
pub struct DeliveryRow {
    pub decision_id: String,
    pub device_id: String,
    pub step: DeliveryStep,
    pub at: i64,
    pub detail: Option<String>,
}

/// A one-time pairing code, stored as the sha256 of its normalised form.
#[derive(Debug, Clone, PartialEq)]
pub struct PairingRow {
    pub code_hash: String,
    pub user_id: String,
    /// What it may do (`read`, `steer`, `approve`…).
    pub scopes: Vec<String>,
    pub created_at: i64,
    pub expires_at: i64,
    pub used_at: Option<i64>,
    pub device_id: Option<String>,
}

/// A device's short-lived read session.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceSessionRow {
    pub token_hash: String,
    pub device_id: String,
    pub created_at: i64,
    pub expires_at: i64,
}

/// A ledger entry: a verified command and the result it got.
#[derive(Debug, Clone, PartialEq)]
pub struct CommandRow {
    pub command_id: String,
    pub task_id: Option<String>,
    pub device_id: String,
    /// sha256 of the command's canonical JSON: a repeat must match it.
    pub body_digest: String,
    pub operation: Operation,
    /// JSON of the signed envelope, kept as evidence.
    pub envelope: Value,
    pub status: CommandStatus,
    /// JSON of the result.
    pub result: Value,
    pub created_at: i64,
}

/// A command a worker must see, until it acknowledges it.
#[derive(Debug, Clone, PartialEq)]
pub struct ControlRow {
    pub command_id: String,
    pub task_id: String,
    pub operation: Operation,
    pub args: Value,
    pub plan_revision: i64,
    pub applied_at: i64,
    pub acknowledged_at: Option<i64>,
    pub acknowledged_by: Option<String>,
    /// The order in which the task's commands applied (1, 2, …): assigned by the store on
    /// insert (the value given is ignored), so a worker can tell a newer command from an older
    /// one however each reaches it.
    pub seq: i64,
}

/// A follow-up.
#[derive(Debug, Clone, PartialEq)]
pub struct FollowupRow {
    pub id: String,
    pub task_id: String,
    /// JSON schedule.
    pub schedule: Value,
    pub time_zone: String,
    pub catch_up: CatchUp,
    pub message: String,
    pub state: FollowupState,
    pub next_run_at: Option<i64>,
    pub last_run_at: Option<i64>,
    pub runs: i64,
    pub missed: i64,
    pub created_at: i64,
}

/// A device's push channel; it follows the event log from its own cursor.
#[derive(Debug, Clone, PartialEq)]
pub struct PushChannelRow {
    pub id: String,
    pub device_id: String,
    pub user_id: String,
    pub kind: PushKind,
    pub endpoint: String,
    /// Web Push subscription keys (base64url).
    pub p256dh: Option<String>,
    pub auth: Option<String>,
    /// The last event delivered (or skipped as not worth a push).
    pub cursor: i64,
    pub attempts: i64,
    pub delivered: i64,
    pub failures: i64,
    pub consecutive_failures: i64,
    pub last_error: Option<String>,
    pub last_attempt_at: Option<i64>,
    pub next_attempt_at: i64,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
}

/// A machine with a runner: what its runner last reported, and when it was last heard from.
#[derive(Debug, Clone, PartialEq)]
pub struct MachineRow {
    pub id: String,
    pub owner_id: String,
    /// Unique per owner.
    pub name: String,
    /// JSON: the runner's last `RegisterMachine` (runtimes, directories, version).
    pub info: Value,
    pub registered_at: Option<i64>,
    pub last_seen_at: Option<i64>,
    pub created_at: i64,
}

/// A standing rule (issue 31 §2): a user's signed answer to the approvals that match it.
#[derive(Debug, Clone, PartialEq)]
pub struct RuleRow {
    pub id: String,
    pub owner_id: String,
    /// The device that signed `add_rule`.
    pub device_id: String,
    /// The `add_rule` command.
    pub command_id: String,
    /// JSON: the rule as signed (`RuleSpec`), `expires_at` filled in.
    pub spec: Value,
    /// `sha256:` of `spec`'s canonical JSON.
    pub digest: String,
    /// Also in `spec`; a column so that deny rules can be read first.
    pub answer: RuleAnswer,
    pub created_at: i64,
    pub expires_at: i64,
    pub revoked_at: Option<i64>,
    /// The device that revoked it.
    pub revoked_by: Option<String>,
    /// How many approvals it answered.
    pub uses: i64,
    pub last_used_at: Option<i64>,
}

/// A work item addressed to a machine's runner.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkRow {
    pub id: String,
    pub machine_id: String,
    pub task_id: String,
    pub kind: WorkKind,
    /// JSON: `{"run": RunSpec, "resume": ResumeSpec?}`.
    pub args: Value,
    pub state: WorkState,
    pub detail: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}
