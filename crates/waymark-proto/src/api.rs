//! Request and response bodies of HTTP API v1 (SPEC §9).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::state::{
    ApprovalDurability, AttemptState, DecisionKind, DecisionStatus, DeliveryState, EffectStatus,
    FinishOutcome, Operation, RuntimeFallback, TaskState,
};

/// Whether an approval's option grants the call (`approve`, `approve_…`), refuses it (`deny`,
/// `deny_…`), or is no approval option at all (`None`: `approvex`, `denylist`, `approve_`).
/// The one definition: the server, the SDK, the adapters and the companion ask this, and the
/// UI's `optionGrants` follows the same case table (`ui/src/web/fixtures/option-grants.json`,
/// which both sides' tests read).
pub fn option_grants(option: &str) -> Option<bool> {
    match option {
        "approve" => Some(true),
        "deny" => Some(false),
        o if o.len() > "approve_".len() && o.starts_with("approve_") => Some(true),
        o if o.len() > "deny_".len() && o.starts_with("deny_") => Some(false),
        _ => None,
    }
}

/// One step of a task's plan (a DAG through `depends_on`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct PlanStep {
    /// Unique within the plan, e.g. `deploy_staging`.
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = r"^[^\x00]*[^\s\x00][^\x00]*$"
    )]
    pub id: String,
    /// What the step does, for people.
    #[serde(default)]
    #[schema(max_length = 1000)]
    pub title: String,
    /// Steps that must complete first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<String>,
}

/// Time and cost limits. Absent limits are unlimited.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct Budget {
    /// Wall-clock seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_wall_seconds: Option<u64>,
    /// Model tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Money, in US dollars.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_usd: Option<f64>,
    /// Fractions of a limit at which a budget decision opens (default `[0.8, 1.0]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thresholds: Option<Vec<f64>>,
    /// The choices a budget decision offers, each saying what it gives up (default: run only
    /// the relevant tests / continue the full suite / stop and deliver the patch).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<DecisionOption>,
    /// The option that applies when nobody answers (default `deliver_patch`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_option: Option<String>,
    /// How long a budget decision waits (default 15 minutes, at most 30 days).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision_seconds: Option<u64>,
}

/// Spend reported so far.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct Usage {
    /// Model tokens.
    pub tokens: u64,
    /// Money, in US dollars.
    pub cost_usd: f64,
    /// Wall-clock seconds the workers reported.
    pub wall_seconds: u64,
}

/// What the task works on, so recovery can tell whether it changed (e.g. repo and commit).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct Materials {
    /// Repository, path or URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo: Option<String>,
    /// Commit or version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// The working tree as its host saw it (a runner's runs: after each call and when the
    /// runtime ended), so a revive can tell a tree someone changed meanwhile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree: Option<WorkingTree>,
}

/// A git working tree as its host saw it: the commit checked out and what differs from it.
/// Hashes, never contents: the control plane learns which files changed, not what is in them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct WorkingTree {
    /// `HEAD`'s commit (none in a repository without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 64)]
    pub commit: Option<String>,
    /// sha256 of the commit and every changed path with its content's hash: equal digests,
    /// equal trees (as far as git sees them: ignored files are not looked at).
    #[schema(max_length = 64)]
    pub digest: String,
    /// Changed paths (tracked or not, against `commit`, from the repository's root) and a
    /// short hash of each one's content, or `deleted`; at most [`WorkingTree::MAX_PATHS`].
    #[serde(default)]
    pub changed: std::collections::BTreeMap<String, String>,
    /// More paths changed than `changed` holds (the digest covers them all).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

impl WorkingTree {
    /// How many changed paths a tree lists.
    pub const MAX_PATHS: usize = 200;

    /// What differs from `was` (the tree at the last checkpoint) in this tree, for people:
    /// `None` when they are the same.
    pub fn differences_from(&self, was: &WorkingTree) -> Option<String> {
        if self.digest == was.digest {
            return None;
        }
        let short = |c: &Option<String>| {
            c.as_deref()
                .map_or_else(|| "no commit".to_owned(), |c| c.chars().take(12).collect())
        };
        let mut parts = Vec::new();
        if self.commit != was.commit {
            parts.push(format!(
                "HEAD moved from {} to {}",
                short(&was.commit),
                short(&self.commit)
            ));
        }
        let mut paths: Vec<&str> = Vec::new();
        for (path, hash) in &self.changed {
            if was.changed.get(path) != Some(hash) {
                paths.push(path);
            }
        }
        for path in was.changed.keys() {
            if !self.changed.contains_key(path) {
                paths.push(path);
            }
        }
        paths.sort_unstable();
        paths.dedup();
        const NAMED: usize = 8;
        if !paths.is_empty() {
            let mut named = paths
                .iter()
                .take(NAMED)
                .map(|p| format!("`{p}`"))
                .collect::<Vec<_>>()
                .join(", ");
            if paths.len() > NAMED {
                named.push_str(&format!(" and {} more", paths.len() - NAMED));
            }
            parts.push(format!(
                "{} {} changed",
                named,
                if paths.len() == 1 { "has" } else { "have" }
            ));
        } else if self.commit == was.commit {
            // Both lists full, or one was cut: the digests alone tell.
            parts.push("files beyond the listed ones changed".to_owned());
        }
        Some(format!(
            "the working tree is not as the last checkpoint left it: {}",
            parts.join("; ")
        ))
    }
}

/// `POST /v1/tasks`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTask {
    /// Short name.
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = r"^[^\x00]*[^\s\x00][^\x00]*$"
    )]
    pub title: String,
    /// The goal and its acceptance criteria.
    #[serde(default)]
    #[schema(max_length = 20000)]
    pub goal: String,
    /// The agent runtime, e.g. `claude-code`, `codex`, `waymark-demo`.
    #[serde(default)]
    pub runtime: Option<String>,
    /// Limits.
    #[serde(default)]
    pub budget: Budget,
    /// The plan's steps.
    #[serde(default)]
    pub plan: Vec<PlanStep>,
    /// What the task works on.
    #[serde(default)]
    pub materials: Materials,
    /// The runtime's own id for this work (a Claude Code session, a Codex thread). Creating a
    /// task again with the same `runtime` and key returns the existing task (200).
    #[serde(default)]
    #[schema(
        min_length = 1,
        max_length = 300,
        pattern = r"^[^\x00]*[^\s\x00][^\x00]*$"
    )]
    pub external_key: Option<String>,
}

/// A task: the goal and its acceptance (SPEC §2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct Task {
    /// `task_…`.
    #[schema(pattern = r"^task_[0-9a-f]{32}$")]
    pub id: String,
    /// The user who owns it.
    pub owner: String,
    /// Short name.
    pub title: String,
    /// The goal.
    pub goal: String,
    /// The agent runtime.
    pub runtime: Option<String>,
    /// The runtime's own id for this work (see `CreateTask::external_key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_key: Option<String>,
    /// Where it stands.
    pub state: TaskState,
    /// The plan's steps.
    pub plan: Vec<PlanStep>,
    /// Increases with every replan; approvals are bound to it.
    #[schema(minimum = 1)]
    pub plan_revision: i64,
    /// Limits.
    pub budget: Budget,
    /// Spend so far.
    pub usage: Usage,
    /// What it works on.
    pub materials: Materials,
    /// The task's session (conversation and context).
    #[schema(pattern = r"^ses_[0-9a-f]{32}$")]
    pub session_id: String,
    /// The fence of the newest attempt (0 before the first).
    #[schema(minimum = 0)]
    pub fence: i64,
    /// The summary the last attempt finished with.
    pub outcome_summary: Option<String>,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
    /// For a compensation task: the task whose effect it compensates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = r"^task_[0-9a-f]{32}$")]
    pub parent_id: Option<String>,
    /// The machine whose runner runs it (`start_run`, or a runtime its runner started).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = r"^mch_[0-9a-f]{32}$")]
    pub machine_id: Option<String>,
}

/// `POST /v1/tasks/{task}/attempts`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartAttempt {
    /// The worker's name, for people and audit.
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = r"^[^\x00]*[^\s\x00][^\x00]*$"
    )]
    pub worker: String,
    /// Requested lease length in seconds; clamped to the server's bounds (default 30).
    #[serde(default)]
    pub lease_seconds: Option<u32>,
    /// Digest of the worker's manifest (model, tool versions, config).
    #[serde(default)]
    pub manifest_digest: Option<String>,
    /// What the worker works on now (e.g. the repository commit it checked out); resuming a
    /// task whose materials changed needs a person.
    #[serde(default)]
    pub materials: Option<Materials>,
}

/// One execution try, and its lease.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct Attempt {
    /// `att_…`.
    #[schema(pattern = r"^att_[0-9a-f]{32}$")]
    pub id: String,
    /// Its task.
    #[schema(pattern = r"^task_[0-9a-f]{32}$")]
    pub task_id: String,
    /// The worker's name.
    pub worker: String,
    /// Fencing token: every write of this attempt carries it.
    #[schema(minimum = 1)]
    pub fence: i64,
    /// When the lease runs out unless renewed (server clock).
    pub expires_at: DateTime<Utc>,
    /// Where it stands.
    pub state: AttemptState,
    /// Digest of the worker's manifest.
    pub manifest_digest: Option<String>,
    /// Start time.
    pub started_at: DateTime<Utc>,
    /// End time.
    pub ended_at: Option<DateTime<Utc>>,
    /// How it ended.
    pub outcome: Option<FinishOutcome>,
    /// Temporary resources (worktrees, tokens) the worker reported released.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub released: Vec<String>,
}

/// `POST /v1/attempts/{attempt}/heartbeat`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Heartbeat {
    /// The attempt's fence.
    #[schema(minimum = 1)]
    pub fence: i64,
    /// New lease length in seconds (default: the server's default).
    #[serde(default)]
    pub lease_seconds: Option<u32>,
    /// Control commands the worker has seen (by `command_id`); they stop being redelivered
    /// and their senders see them acknowledged.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub acknowledged: Vec<String>,
}

/// A control command for the worker (pause, resume, cancel, replan, take-over), delivered
/// on the heartbeat reply and on `GET /v1/attempts/{attempt}/control` (SSE `event: control`)
/// until the worker acknowledges it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ControlCommand {
    /// The steer command's id.
    pub command_id: String,
    /// The operation.
    pub operation: Operation,
    /// Its arguments (e.g. `{"instructions": "…"}` for a replan).
    #[schema(value_type = Object)]
    pub args: Value,
    /// The plan revision after it applied.
    pub plan_revision: i64,
    /// When it applied.
    pub applied_at: DateTime<Utc>,
    /// The order in which the task's commands applied (1, 2, …): a command with a lower `seq`
    /// than one already applied is older, however late it arrives. 0 from a server that does
    /// not number them.
    #[serde(default)]
    pub seq: i64,
}

/// Reply to a heartbeat.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct HeartbeatReply {
    /// The renewed lease's end.
    pub expires_at: DateTime<Utc>,
    /// The task's state when the reply was made. A command the worker applied after that may
    /// already have changed it, so pause and resume are taken from `commands` and the
    /// control stream, never from this field.
    pub task_state: TaskState,
    /// The task's plan revision.
    pub plan_revision: i64,
    /// Commands the worker has not acknowledged yet, in the order they applied.
    pub commands: Vec<ControlCommand>,
}

/// A fenced write's credentials: which attempt, with which fence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Fencing {
    /// The writing attempt.
    pub attempt_id: String,
    /// Its fence.
    pub fence: i64,
}

/// A plan step completed, with what it produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct CompletedStep {
    /// Plan step id.
    pub step: String,
    /// sha256 of the artifacts it produced.
    #[serde(default)]
    pub artifact_digests: Vec<String>,
    /// Whether its output was verified (e.g. tests passed).
    #[serde(default)]
    pub verified: bool,
}

/// The step in flight when the checkpoint was written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct PendingStep {
    /// Plan step id.
    pub step: String,
    /// Digest of the intended effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intent_digest: Option<String>,
    /// Idempotency key of the intended effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// The approval it waits for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<String>,
}

/// An effect's status as the checkpoint saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct EffectRef {
    /// `eff_…`.
    pub effect_id: String,
    /// Its status then.
    pub status: EffectStatus,
}

/// What a checkpoint records (SPEC §3). Secrets and raw private content never go here:
/// digests and references do.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(deny_unknown_fields)]
pub struct CheckpointBody {
    /// Why it was written: `effect_boundary`, `human_wait`, `step_completed`, `handover`,
    /// `compaction`, or the agent's own word.
    #[serde(default)]
    pub reason: String,
    /// The plan revision the worker follows.
    #[serde(default)]
    #[schema(minimum = -9007199254740991_i64, maximum = 9007199254740991_i64)]
    pub plan_revision: i64,
    /// Digest of the worker's manifest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_digest: Option<String>,
    /// Steps done, with artifacts and verification.
    #[serde(default)]
    pub completed_steps: Vec<CompletedStep>,
    /// The step in flight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_step: Option<PendingStep>,
    /// Effect statuses.
    #[serde(default)]
    pub effects: Vec<EffectRef>,
    /// Budget left, as the worker sees it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_remaining: Option<Budget>,
    /// Materials version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub materials: Option<Materials>,
    /// A line for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
}

/// `POST /v1/tasks/{task}/checkpoints`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AppendCheckpoint {
    /// The writing attempt.
    #[schema(pattern = r"^att_[0-9a-f]{32}$")]
    pub attempt_id: String,
    /// Its fence.
    #[schema(minimum = 1)]
    pub fence: i64,
    /// Must be the last sequence + 1 (the first is 1).
    #[schema(minimum = 1, maximum = 9007199254740991_i64)]
    pub sequence: i64,
    /// Content.
    pub body: CheckpointBody,
}

/// A stored checkpoint, a link of the task's hash chain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct Checkpoint {
    /// Its task.
    #[schema(pattern = r"^task_[0-9a-f]{32}$")]
    pub task_id: String,
    /// 1, 2, 3… without gaps.
    #[schema(minimum = 1)]
    pub sequence: i64,
    /// The attempt that wrote it.
    pub attempt_id: String,
    /// That attempt's fence.
    pub fence: i64,
    /// Content.
    pub body: CheckpointBody,
    /// The previous link's digest (`None` for the first).
    #[schema(pattern = r"^sha256:[0-9a-f]{64}$")]
    pub prev_digest: Option<String>,
    /// `sha256:` over this checkpoint and `prev_digest`.
    #[schema(pattern = r"^sha256:[0-9a-f]{64}$")]
    pub digest: String,
    /// Server time.
    pub created_at: DateTime<Utc>,
}

/// The result of verifying a task's checkpoint chain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct ChainStatus {
    /// `true` when every link recomputes and points at its predecessor.
    pub intact: bool,
    /// How many checkpoints were checked.
    pub checked: i64,
    /// The first sequence that fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broken_at: Option<i64>,
    /// Why it fails, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `POST /v1/tasks/{task}/effects`: declare an intent.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DeclareEffect {
    /// The writing attempt.
    #[schema(pattern = r"^att_[0-9a-f]{32}$")]
    pub attempt_id: String,
    /// Its fence.
    #[schema(minimum = 1)]
    pub fence: i64,
    /// Unique per task; passed to the provider so a repeat is recognised.
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00]*[^\s\x00][^\x00]*$"
    )]
    pub idempotency_key: String,
    /// What kind of change, e.g. `deploy`, `http.post`, `git.push`.
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = r"^[^\x00]*[^\s\x00][^\x00]*$"
    )]
    pub kind: String,
    /// The plan step it belongs to.
    #[serde(default)]
    pub step: Option<String>,
    /// The provider's resource, when known.
    #[serde(default)]
    pub resource_id: Option<String>,
    /// What will be done: target, parameters, digests. No secrets.
    #[schema(value_type = Object)]
    pub intent: Value,
}

/// A change in the outside world.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct Effect {
    /// `eff_…`.
    #[schema(pattern = r"^eff_[0-9a-f]{32}$")]
    pub id: String,
    /// Its task.
    #[schema(pattern = r"^task_[0-9a-f]{32}$")]
    pub task_id: String,
    /// The key the provider dedups on.
    pub idempotency_key: String,
    /// Kind of change.
    pub kind: String,
    /// Plan step.
    pub step: Option<String>,
    /// Provider resource.
    pub resource_id: Option<String>,
    /// The intent as declared.
    #[schema(value_type = Object)]
    pub intent: Value,
    /// `sha256:` of the intent's canonical JSON.
    #[schema(pattern = r"^sha256:[0-9a-f]{64}$")]
    pub intent_digest: String,
    /// Reconciliation status.
    pub status: EffectStatus,
    /// The provider's receipt, once there is one.
    #[schema(value_type = Option<Object>)]
    pub receipt: Option<Value>,
    /// The attempt that last wrote it.
    pub attempt_id: String,
    /// That attempt's fence.
    pub fence: i64,
    /// Declared at.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
    /// Why it needs reconciliation or may no longer start (cancel, replan).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flag: Option<String>,
}

/// Reply to a declaration: the effect, and whether this call created it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EffectDeclared {
    /// `false` when the key was already declared with the same body.
    pub created: bool,
    /// The effect.
    pub effect: Effect,
}

/// `PATCH /v1/effects/{effect}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateEffect {
    /// The writing attempt.
    #[schema(pattern = r"^att_[0-9a-f]{32}$")]
    pub attempt_id: String,
    /// Its fence.
    #[schema(minimum = 1)]
    pub fence: i64,
    /// The new status.
    pub status: EffectStatus,
    /// The provider's receipt.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub receipt: Option<Value>,
    /// The provider's resource id, once known.
    #[serde(default)]
    pub resource_id: Option<String>,
}

/// One option of a decision; it says what choosing it gives up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct DecisionOption {
    /// Stable id, e.g. `approve`, `relevant_tests`.
    pub id: String,
    /// For people.
    pub label: String,
    /// What this option gives up.
    #[serde(default)]
    pub gives_up: String,
    /// What it costs, e.g. `+20 min, ~$1.40`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<String>,
}

/// A question in several parts, each answered by choosing among labelled choices (one, or
/// several when `multi_select`) or in the person's own words (`free_text`): what Claude Code's
/// `AskUserQuestion` asks, and any worker may ask the same. Answered with `answer_question`
/// and `args.answers`, bound to the form's digest (`intent_digest`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(deny_unknown_fields)]
pub struct QuestionForm {
    /// The questions, in order.
    #[schema(min_items = 1, max_items = 8)]
    pub questions: Vec<FormQuestion>,
}

/// One question of a [`QuestionForm`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(deny_unknown_fields)]
pub struct FormQuestion {
    /// Stable id within the form (`q1`, …): the key of its answer.
    #[schema(min_length = 1, max_length = 64)]
    pub id: String,
    /// The question, in full.
    #[schema(min_length = 1, max_length = 2000)]
    pub question: String,
    /// A short tag for it (Claude Code's `header`, at most a few words).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    /// The choices; empty for a question answered only in words.
    #[serde(default)]
    #[schema(max_items = 16)]
    pub choices: Vec<FormChoice>,
    /// Several choices may be chosen.
    #[serde(default)]
    pub multi_select: bool,
    /// The person may answer in their own words instead (Claude Code's "Other").
    #[serde(default)]
    pub free_text: bool,
}

/// One choice of a [`FormQuestion`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(deny_unknown_fields)]
pub struct FormChoice {
    /// What is chosen, as the agent will be told it; unique within its question.
    #[schema(min_length = 1, max_length = 500)]
    pub label: String,
    /// What choosing it means.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// The answer to one [`FormQuestion`]: the labels chosen, and/or the person's own words.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(deny_unknown_fields)]
pub struct FormAnswer {
    /// Labels of the chosen choices (one at most unless the question is `multi_select`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chosen: Vec<String>,
    /// The person's own words (only where the question takes `free_text`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

/// `POST /v1/tasks/{task}/approvals`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RequestApproval {
    /// The requesting attempt (optional for adapters without leases).
    #[serde(default)]
    #[schema(pattern = r"^att_[0-9a-f]{32}$")]
    pub attempt_id: Option<String>,
    /// Its fence.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub fence: Option<i64>,
    /// Plan step.
    #[serde(default)]
    pub step: Option<String>,
    /// The effect it would allow.
    #[serde(default)]
    #[schema(pattern = r"^eff_[0-9a-f]{32}$")]
    pub effect_id: Option<String>,
    /// What will be done, in full (target, commit, artifact digests). No secrets.
    #[schema(value_type = Object)]
    pub intent: Value,
    /// `sha256:` of the intent's canonical JSON; the server checks it.
    #[serde(default)]
    #[schema(pattern = r"^sha256:[0-9a-f]{64}$")]
    pub intent_digest: Option<String>,
    /// The question, for people.
    #[schema(
        min_length = 1,
        max_length = 2000,
        pattern = r"^[^\x00]*[^\s\x00][^\x00]*$"
    )]
    pub summary: String,
    /// Seconds until the default applies (default 3600).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 2592000)]
    pub expires_in_seconds: Option<u64>,
    /// `deny` (the default) or `approve`.
    #[serde(default)]
    #[schema(pattern = r"^(approve|deny)$")]
    pub default_option: Option<String>,
    /// Marks an approval the UI must confirm twice.
    #[serde(default)]
    pub risky: bool,
    /// How long the runtime keeps the approval open; set by runtime adapters, whose answers
    /// count only once the runtime acknowledges them (`…/delivery`).
    #[serde(default)]
    pub durability: Option<ApprovalDurability>,
    /// The runtime's own choices. Empty means `approve` and `deny`; otherwise it must hold
    /// both, and further ids start with `approve_` (they grant) or `deny_` (they refuse).
    #[serde(default)]
    pub options: Vec<DecisionOption>,
    /// Where the runtime takes a changed intent (Claude Code's `updatedInput`): the JSON
    /// pointer (RFC 6901) of the part a person may edit before approving, e.g. `/input`.
    /// Absent: the intent is approved or denied as asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = r"^(/[^/]*)+$")]
    pub editable: Option<String>,
    /// The deadline the runtime enforces itself and what it does then (Hermes denies after
    /// 60 s, a Claude Code hook asks in its own prompt). Where it comes before
    /// `expires_in_seconds`, the approval closes then, as the runtime decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_deadline: Option<AskedRuntimeDeadline>,
    /// The directory the call runs in, as the runtime reports it (Claude Code's `cwd`), where
    /// the intent does not say: standing rules match their `directory` against it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 4096)]
    pub cwd: Option<String>,
}

/// The deadline an adapter reports for the runtime holding an approval, relative to now (so
/// the two clocks need not agree).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AskedRuntimeDeadline {
    /// The runtime, as people call it: `Hermes`, `Claude Code`, `OpenClaw`.
    #[schema(
        min_length = 1,
        max_length = 64,
        pattern = r"^[^\x00]*[^\s\x00][^\x00]*$"
    )]
    pub runtime: String,
    /// Seconds from now until the runtime decides on its own.
    #[schema(minimum = 0, maximum = 2592000)]
    pub in_seconds: u64,
    /// What it does then.
    pub then: RuntimeFallback,
}

/// When the runtime holding an approval decides on its own, and what it does then.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct RuntimeDeadline {
    /// The runtime, as people call it.
    pub runtime: String,
    /// When.
    pub at: DateTime<Utc>,
    /// What it does then.
    pub then: RuntimeFallback,
    /// The runtime can be asked to wait for the answer across its own exit instead (Claude
    /// Code `defer` in a `claude -p` run): a signed `defer` command switches the approval to a
    /// durable wait, and this deadline no longer applies.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub can_wait: bool,
}

/// What happens to an open decision if nobody answers, and when: the earlier of the runtime's
/// own deadline and Waymark's expiry (`Decision::closing`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Closing {
    /// When.
    pub at: DateTime<Utc>,
    /// The runtime that decides then, or `None` when Waymark's default applies.
    pub runtime: Option<String>,
    /// What happens.
    pub then: ClosingThen,
}

/// What happens when a decision's deadline passes unanswered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ClosingThen {
    /// The runtime refuses the call: nothing runs.
    RuntimeDenies,
    /// The runtime asks in its own prompt.
    RuntimeAsksItself,
    /// Waymark applies this option.
    Default(String),
    /// No default: the decision closes unanswered and the task waits for a person.
    NoDefault,
}

impl Closing {
    /// One line for people: "Hermes will deny in 0:42", "Claude Code will ask in its own
    /// prompt in 9:55", "deny applies in 59:12: the call does not run".
    pub fn describe(&self, now: DateTime<Utc>) -> String {
        if self.at <= now {
            return match (&self.runtime, &self.then) {
                (Some(r), ClosingThen::RuntimeDenies) => format!("{r} has denied it"),
                (Some(r), ClosingThen::RuntimeAsksItself) => {
                    format!("{r} has stopped waiting and asks in its own prompt")
                }
                (_, ClosingThen::Default(o)) => format!("{o} applies now"),
                (_, _) => "expired with no default: the task waits for a person".into(),
            };
        }
        self.sentence(&format!("in {}", countdown((self.at - now).num_seconds())))
    }

    /// The same line with the time of day instead of a countdown, for what stays on screen
    /// (a notification): "Hermes will deny at 14:02 UTC".
    pub fn describe_at(&self) -> String {
        self.sentence(&format!("at {}", self.at.format("%H:%M UTC")))
    }

    fn sentence(&self, when: &str) -> String {
        match (&self.runtime, &self.then) {
            (Some(r), ClosingThen::RuntimeDenies) => format!("{r} will deny {when}"),
            (Some(r), ClosingThen::RuntimeAsksItself) => {
                format!("{r} will ask in its own prompt {when}")
            }
            (_, ClosingThen::Default(o)) if option_grants(o) == Some(false) => {
                format!("{o} applies {when}: the call does not run")
            }
            (_, ClosingThen::Default(o)) => format!("{o} applies {when}"),
            (_, _) => format!("expires {when} with no default: the task waits for a person"),
        }
    }
}

/// `0:42`, `9:55`, `1:02:03`: a countdown, never negative.
pub fn countdown(seconds: i64) -> String {
    let s = seconds.max(0);
    let (h, m, s) = (s / 3600, s / 60 % 60, s % 60);
    if h > 0 {
        format!("{h}:{m:02}:{s:02}")
    } else {
        format!("{m}:{s:02}")
    }
}

/// The kinds of decision `POST /v1/tasks/{task}/decisions` opens: a [`DecisionKind`] other than
/// `approval`. Only the OpenAPI document names it.
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
#[allow(dead_code)]
enum AskedKind {
    /// A question for a person.
    Question,
    /// A budget choice.
    Budget,
    /// What recovery does next.
    Recovery,
}

/// `POST /v1/tasks/{task}/decisions`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RequestDecision {
    /// The requesting attempt.
    #[serde(default)]
    #[schema(pattern = r"^att_[0-9a-f]{32}$")]
    pub attempt_id: Option<String>,
    /// Its fence.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub fence: Option<i64>,
    /// `question`, `budget` or `recovery` (approvals have their own route, which binds the
    /// intent digest).
    #[schema(value_type = AskedKind)]
    pub kind: DecisionKind,
    /// Plan step.
    #[serde(default)]
    pub step: Option<String>,
    /// What is asked.
    #[schema(
        min_length = 1,
        max_length = 4000,
        pattern = r"^[^\x00]*[^\s\x00][^\x00]*$"
    )]
    pub question: String,
    /// The choices; empty for a free-text question.
    #[serde(default)]
    pub options: Vec<DecisionOption>,
    /// The option that applies on expiry.
    #[serde(default)]
    pub default_option: Option<String>,
    /// Seconds until the default applies (default 3600).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 2592000)]
    pub expires_in_seconds: Option<u64>,
    /// For a `question` in parts: the form; `options` then stays empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub form: Option<QuestionForm>,
}

/// How a decision was closed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct DecisionOutcome {
    /// The chosen option (absent for a void decision).
    pub option: Option<String>,
    /// A free-text answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Who decided: `user:<name>`, `admin`, `rule:<id>` (a standing rule), `runtime`, or
    /// `default` on expiry.
    pub by: String,
    /// When.
    pub at: DateTime<Utc>,
    /// For an approval edited before it was approved: the intent approved instead of the one
    /// asked (which stays the decision's `intent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub edited_intent: Option<Value>,
    /// `sha256:` of `edited_intent`'s canonical JSON, as the person signed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = r"^sha256:[0-9a-f]{64}$")]
    pub edited_intent_digest: Option<String>,
    /// For a question in parts: each question's answer, by question id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answers: Option<std::collections::BTreeMap<String, FormAnswer>>,
    /// For an approval a standing rule answered (`by` is then `rule:<id>`): the rule and its
    /// digest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<crate::rules::RuleRef>,
}

/// An approval, question, budget choice or recovery decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct Decision {
    /// `dec_…`.
    #[schema(pattern = r"^dec_[0-9a-f]{32}$")]
    pub id: String,
    /// Its task.
    #[schema(pattern = r"^task_[0-9a-f]{32}$")]
    pub task_id: String,
    /// What it asks.
    pub kind: DecisionKind,
    /// Where it stands.
    pub status: DecisionStatus,
    /// Plan step.
    pub step: Option<String>,
    /// What is asked.
    pub question: String,
    /// The choices.
    pub options: Vec<DecisionOption>,
    /// Applies on expiry.
    pub default_option: Option<String>,
    /// For approvals: the intent in full.
    #[schema(value_type = Option<Object>)]
    pub intent: Option<Value>,
    /// For approvals: its digest.
    #[schema(pattern = r"^sha256:[0-9a-f]{64}$")]
    pub intent_digest: Option<String>,
    /// For approvals: the effect it allows.
    #[schema(pattern = r"^eff_[0-9a-f]{32}$")]
    pub effect_id: Option<String>,
    /// The plan revision it is bound to.
    pub plan_revision: i64,
    /// Confirm twice in the UI.
    pub risky: bool,
    /// When the default applies.
    pub expires_at: DateTime<Utc>,
    /// Asked at.
    pub created_at: DateTime<Utc>,
    /// The outcome, once closed.
    pub outcome: Option<DecisionOutcome>,
    /// For approvals held by a runtime: how long it keeps them open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durability: Option<ApprovalDurability>,
    /// For answered approvals held by a runtime: whether it has taken the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<Delivery>,
    /// For approvals whose runtime takes a changed intent: the JSON pointer of the part a
    /// person may edit before approving (`approve` with `args.edited_intent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub editable: Option<String>,
    /// How far it has reached each device, step by step (reads fill it; `decision.delivered`
    /// events add to it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deliveries: Vec<crate::steer::DeviceDelivery>,
    /// For approvals held by a runtime with a deadline of its own: when it decides, and how.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_deadline: Option<RuntimeDeadline>,
    /// Where it stands in its user's escalation policy, when the user has one: who has been
    /// notified, who is next and when, or why it stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escalation: Option<Escalation>,
    /// For a question in parts: the form (its digest is `intent_digest`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub form: Option<QuestionForm>,
}

/// `PUT /v1/escalation`: a user's escalation policy — who is notified of a new decision, in
/// what order, and when nobody is woken for what can wait. Without one, every device with a
/// push channel is notified at once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(deny_unknown_fields)]
pub struct EscalationPolicy {
    /// The steps, in order. The first is notified when a decision opens (after its
    /// `after_minutes`, usually 0); each next one that many minutes after the one before,
    /// unless someone has opened the decision meanwhile. At the decision's deadline its stated
    /// default applies (or the runtime decides), as without a policy.
    #[schema(min_items = 1, max_items = 8)]
    pub steps: Vec<EscalationStep>,
    /// When non-urgent notifications wait: a step due inside them is held until they end.
    /// Urgent decisions (risky, or closing before the quiet hours end) still escalate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quiet_hours: Option<QuietHours>,
    /// Reminders of a decision nobody has answered yet: the devices notified so far are
    /// notified again, never sooner than `every_minutes` after the last notification, at most
    /// `at_most` times. Quiet hours hold them like steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reminders: Option<Reminders>,
}

/// How an unanswered decision is reminded (`EscalationPolicy::reminders`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(deny_unknown_fields)]
pub struct Reminders {
    /// Minutes from the last notification (a step or a reminder) to the next reminder.
    #[schema(minimum = 5, maximum = 10080)]
    pub every_minutes: u32,
    /// Reminders per decision, at most.
    #[schema(minimum = 1, maximum = 12)]
    pub at_most: u32,
}

/// One step of an escalation policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(deny_unknown_fields)]
pub struct EscalationStep {
    /// Minutes after the step before (the first: after the decision opens).
    #[schema(minimum = 0, maximum = 10080)]
    pub after_minutes: u32,
    /// The user's devices notified at this step (`dev_…`).
    #[serde(default)]
    #[schema(max_items = 16)]
    pub devices: Vec<String>,
    /// People this user shares decisions with (`GET /v1/delegates`), by user name: every live
    /// device of theirs is notified at this step. A step notifies at least one device or person.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(max_items = 8)]
    pub people: Vec<String>,
}

/// `GET /v1/delegates`: who may read this user's tasks and answer their decisions, and whose
/// this user may answer. A delegate answers with their own signed device commands (approve,
/// deny, answer, choose an option); pausing, resuming, cancelling, replanning and taking over
/// stay with the owner. A delegation is an offer until its delegate accepts it
/// (`POST /v1/delegations/{owner}/accept`); only then does it let them in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct Delegates {
    /// The user these lists are about.
    pub user: String,
    /// Who may answer this user's decisions, or is asked to (`state`).
    pub delegates: Vec<Delegation>,
    /// Whose decisions this user may answer, or is asked to (`state`: an offer waiting for
    /// this user's answer).
    pub delegated_by: Vec<Delegation>,
}

/// One person in a delegation, since when, and whether the delegate accepted it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct Delegation {
    /// The other user's name.
    pub user: String,
    /// When the owner offered it.
    pub since: DateTime<Utc>,
    /// Offered (the delegate sees and answers nothing yet) or accepted. Absent from servers
    /// older than consent, where every delegation was in force.
    #[serde(default = "DelegationState::older_server")]
    pub state: DelegationState,
    /// When the delegate accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted_at: Option<DateTime<Utc>>,
}

str_enum! {
    /// Where a delegation stands: the delegate is asked first (issue 32).
    pub enum DelegationState {
        /// The owner offered it; the delegate has not answered. They see none of the owner's
        /// tasks, answer none of their decisions, and escalation steps naming them skip them.
        Offered => "offered",
        /// The delegate accepted: they read the owner's tasks and answer their decisions.
        Accepted => "accepted",
    }
}

impl DelegationState {
    /// What a `Delegation` without a state meant: a server before consent put every delegation
    /// in force at once.
    fn older_server() -> Self {
        DelegationState::Accepted
    }
}

/// Quiet hours, in a time zone: `from` 22:00 `to` 07:00 spans midnight.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(deny_unknown_fields)]
pub struct QuietHours {
    /// Start, `HH:MM`, local time.
    #[schema(pattern = r"^([01][0-9]|2[0-3]):[0-5][0-9]$")]
    pub from: String,
    /// End, `HH:MM`, local time (exclusive).
    #[schema(pattern = r"^([01][0-9]|2[0-3]):[0-5][0-9]$")]
    pub to: String,
    /// An IANA time zone, e.g. `Europe/Berlin`.
    #[schema(min_length = 1, max_length = 64)]
    pub time_zone: String,
}

/// Where a decision stands in its user's escalation policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct Escalation {
    /// Every device notified so far, with its step and when.
    #[serde(default)]
    pub notified: Vec<EscalationNotice>,
    /// Who is next in line, and when — absent once the last step is reached or it stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<EscalationNext>,
    /// The step is due but held by quiet hours until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_until: Option<DateTime<Utc>>,
    /// Why it stopped escalating, e.g. `opened on alice's laptop`. Reminders go on until it
    /// is answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
    /// Reminders sent so far.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reminded: u32,
    /// When the next reminder is due (quiet hours may hold it longer); absent when the policy
    /// has none or all were sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_reminder: Option<DateTime<Utc>>,
    /// The policy it follows, as it was when the decision opened (a later change does not
    /// move decisions already open).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<EscalationPolicy>,
}

/// A device an escalation step notified.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct EscalationNotice {
    /// The device.
    pub device_id: String,
    /// Its name; a device of another person (a step's `people`) is named with them,
    /// `phone (bob)`.
    pub device_name: String,
    /// The person whose device it is, when it is not the decision owner's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub person: Option<String>,
    /// The step that notified it (for a reminder: the last step reached).
    pub step: u32,
    /// Set for a reminder: which one (1, 2, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reminder: Option<u32>,
    /// When.
    pub at: DateTime<Utc>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The next step of an escalation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct EscalationNext {
    /// Its index.
    pub step: u32,
    /// When it is due (quiet hours may hold it longer).
    pub at: DateTime<Utc>,
    /// The names of the devices and people it notifies.
    pub devices: Vec<String>,
}

impl Escalation {
    /// One line for people: "notified laptop · next: alice's phone at 12:10 UTC", "held by quiet
    /// hours until 07:00 UTC", "stopped: opened on laptop".
    pub fn describe(&self) -> String {
        let mut names: Vec<&str> = Vec::new();
        for n in &self.notified {
            if !names.contains(&n.device_name.as_str()) {
                names.push(&n.device_name);
            }
        }
        let mut parts = vec![if names.is_empty() {
            "no device notified yet".to_owned()
        } else {
            format!("notified {}", names.join(", "))
        }];
        if let Some(h) = self.held_until {
            parts.push(format!(
                "held by quiet hours until {}",
                h.format("%H:%M UTC")
            ));
        }
        match (&self.stopped, &self.next) {
            (Some(why), _) => parts.push(format!("stopped: {why}")),
            (None, Some(n)) => parts.push(format!(
                "next: {} at {}",
                n.devices.join(", "),
                n.at.format("%H:%M UTC")
            )),
            (None, None) => parts.push("no one else in line".into()),
        }
        if self.reminded > 0 {
            parts.push(format!("reminded {}×", self.reminded));
        }
        if let Some(at) = self.next_reminder {
            parts.push(format!("next reminder at {}", at.format("%H:%M UTC")));
        }
        parts.join(" · ")
    }
}

impl Decision {
    /// What happens if nobody answers, and when: the runtime's own deadline where it comes
    /// first (or at the same moment: the runtime acts, whatever Waymark records), else
    /// Waymark's expiry and default. A fail-open hook's expiry is the runtime's even when an
    /// older server recorded no deadline.
    pub fn closing(&self) -> Closing {
        if let Some(r) = &self.runtime_deadline
            && r.at <= self.expires_at
        {
            return Closing {
                at: r.at,
                runtime: Some(r.runtime.clone()),
                then: match r.then {
                    RuntimeFallback::Denies => ClosingThen::RuntimeDenies,
                    RuntimeFallback::AsksItself => ClosingThen::RuntimeAsksItself,
                },
            };
        }
        if self.durability == Some(ApprovalDurability::FailOpenHook) {
            return Closing {
                at: self.expires_at,
                runtime: Some("Claude Code".into()),
                then: ClosingThen::RuntimeAsksItself,
            };
        }
        Closing {
            at: self.expires_at,
            runtime: None,
            then: match &self.default_option {
                Some(o) => ClosingThen::Default(o.clone()),
                None => ClosingThen::NoDefault,
            },
        }
    }
}

/// Whether a runtime has taken an answer, as its adapter reported.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct Delivery {
    /// Where it stands.
    pub state: DeliveryState,
    /// What the runtime said, e.g. `serverRequest/resolved`, `PostToolUse ran`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// When it was reported.
    pub at: DateTime<Utc>,
}

/// `POST /v1/tasks/{task}/decisions/{decision}/delivery`: an adapter reports whether the
/// runtime took the answer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReportDelivery {
    /// The reporting attempt.
    #[serde(default)]
    #[schema(pattern = r"^att_[0-9a-f]{32}$")]
    pub attempt_id: Option<String>,
    /// Its fence.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub fence: Option<i64>,
    /// `acknowledged` or `lost`.
    pub state: DeliveryState,
    /// What the runtime said.
    #[serde(default)]
    #[schema(max_length = 2000)]
    pub detail: Option<String>,
}

/// `POST /v1/tasks/{task}/decisions/{decision}/expire`: the runtime dropped a pending
/// decision (its connection closed, its hook timed out). Nothing is reported approved.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExpireDecision {
    /// The reporting attempt.
    #[serde(default)]
    #[schema(pattern = r"^att_[0-9a-f]{32}$")]
    pub attempt_id: Option<String>,
    /// Its fence.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub fence: Option<i64>,
    /// Why, for people: "the Codex connection closed; the turn will ask again".
    #[schema(
        min_length = 1,
        max_length = 2000,
        pattern = r"^[^\x00]*[^\s\x00][^\x00]*$"
    )]
    pub reason: String,
}

/// Admin resolution of a decision (until devices answer them with signed commands).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResolveDecision {
    /// The chosen option.
    #[serde(default)]
    pub option: Option<String>,
    /// A free-text answer.
    #[serde(default)]
    pub text: Option<String>,
}

/// A content-addressed artifact attached to a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct Artifact {
    /// `art_…`.
    #[schema(pattern = r"^art_[0-9a-f]{32}$")]
    pub id: String,
    /// Its task.
    #[schema(pattern = r"^task_[0-9a-f]{32}$")]
    pub task_id: String,
    /// Hex sha256 of the content (`GET /v1/blobs/{sha256}`).
    #[schema(pattern = r"^[0-9a-f]{64}$")]
    pub sha256: String,
    /// File name, e.g. `fix.diff`.
    pub name: String,
    /// Media type, e.g. `text/x-diff`.
    pub media_type: String,
    /// Bytes.
    #[schema(minimum = 0)]
    pub size: i64,
    /// Plan step.
    pub step: Option<String>,
    /// Uploaded at.
    pub created_at: DateTime<Utc>,
}

/// `POST /v1/tasks/{task}/test-receipts`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitTestReceipt {
    /// The writing attempt.
    #[schema(pattern = r"^att_[0-9a-f]{32}$")]
    pub attempt_id: String,
    /// Its fence.
    #[schema(minimum = 1)]
    pub fence: i64,
    /// Plan step.
    #[serde(default)]
    pub step: Option<String>,
    /// The command that ran, e.g. `cargo nextest run`.
    #[schema(
        min_length = 1,
        max_length = 4000,
        pattern = r"^[^\x00]*[^\s\x00][^\x00]*$"
    )]
    pub command: String,
    /// Its exit code.
    pub exit_code: i32,
    /// The commit tested.
    #[serde(default)]
    pub commit: Option<String>,
    /// The JUnit XML the runner wrote.
    pub junit_xml: String,
}

/// Totals of a test run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct TestTotals {
    /// Test cases.
    pub tests: u64,
    /// Failed assertions.
    pub failures: u64,
    /// Errors (the test could not run to an assertion).
    pub errors: u64,
    /// Skipped.
    pub skipped: u64,
    /// Passed.
    pub passed: u64,
}

/// One failed or errored test case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct TestFailure {
    /// Suite name.
    pub suite: String,
    /// Class or module.
    pub classname: String,
    /// Case name.
    pub name: String,
    /// `failure` or `error`.
    pub kind: String,
    /// The failure message.
    pub message: String,
}

/// A parsed test receipt: a fact about a run, not a claim in a transcript.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct TestReceipt {
    /// `rcpt_…`.
    #[schema(pattern = r"^rcpt_[0-9a-f]{32}$")]
    pub id: String,
    /// Its task.
    #[schema(pattern = r"^task_[0-9a-f]{32}$")]
    pub task_id: String,
    /// Plan step.
    pub step: Option<String>,
    /// The command.
    pub command: String,
    /// Its exit code.
    pub exit_code: i32,
    /// The commit tested.
    pub commit: Option<String>,
    /// Totals.
    pub totals: TestTotals,
    /// Failed and errored cases.
    pub failures: Vec<TestFailure>,
    /// Sum of the suites' times.
    pub duration_seconds: f64,
    /// `true` when the exit code is 0 and nothing failed or errored.
    pub passed: bool,
    /// sha256 of the raw XML, kept as an artifact.
    #[schema(pattern = r"^[0-9a-f]{64}$")]
    pub junit_sha256: String,
    /// Recorded at.
    pub created_at: DateTime<Utc>,
}

/// A message to append to the task's session.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewMessage {
    /// `user`, `assistant`, `system`, `tool`.
    #[schema(
        min_length = 1,
        max_length = 32,
        pattern = r"^[^\x00]*[^\s\x00][^\x00]*$"
    )]
    pub role: String,
    /// The text.
    #[schema(max_length = 1048576)]
    pub text: String,
}

/// `POST /v1/tasks/{task}/messages`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AppendMessages {
    /// The writing attempt, when a worker writes.
    #[serde(default)]
    #[schema(pattern = r"^att_[0-9a-f]{32}$")]
    pub attempt_id: Option<String>,
    /// Its fence.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub fence: Option<i64>,
    /// The messages, in order.
    #[schema(min_items = 1, max_items = 1000)]
    pub messages: Vec<NewMessage>,
}

/// A session message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct Message {
    /// The session.
    pub session_id: String,
    /// Position in the session, from 1.
    pub seq: i64,
    /// Role.
    pub role: String,
    /// Text.
    pub text: String,
    /// Recorded at.
    pub created_at: DateTime<Utc>,
}

/// `POST /v1/tasks/{task}/usage`: spend since the last report (deltas, not totals).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReportUsage {
    /// The writing attempt.
    #[serde(default)]
    #[schema(pattern = r"^att_[0-9a-f]{32}$")]
    pub attempt_id: Option<String>,
    /// Its fence.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub fence: Option<i64>,
    /// Tokens used.
    #[serde(default)]
    pub tokens: u64,
    /// Money spent.
    #[serde(default)]
    #[schema(minimum = 0.0)]
    pub cost_usd: f64,
    /// Wall seconds worked.
    #[serde(default)]
    pub wall_seconds: u64,
}

/// `POST /v1/attempts/{attempt}/finish`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FinishAttempt {
    /// The attempt's fence.
    #[schema(minimum = 1)]
    pub fence: i64,
    /// How it ends.
    pub outcome: FinishOutcome,
    /// What was delivered, and what was and was not verified.
    #[serde(default)]
    #[schema(max_length = 20000)]
    pub summary: Option<String>,
    /// Temporary resources released (worktrees, tokens), reported for the record.
    #[serde(default)]
    pub released: Vec<String>,
}

/// A task's session: conversation and context.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct Session {
    /// `ses_…`.
    #[schema(pattern = r"^ses_[0-9a-f]{32}$")]
    pub id: String,
    /// Its task.
    pub task_id: String,
    /// The session it continues, if any (lineage).
    pub parent_id: Option<String>,
    /// Created at.
    pub created_at: DateTime<Utc>,
}

/// A task as lists show it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct TaskSummary {
    /// The task.
    #[serde(flatten)]
    pub task: Task,
    /// Decisions waiting for a person.
    pub pending_decisions: i64,
    /// The newest checkpoint's sequence (0 when none).
    pub last_sequence: i64,
}

/// `GET /v1/snapshot`: the visible tasks, current to `cursor`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct Snapshot {
    /// Stream events after this cursor to stay current.
    pub cursor: i64,
    /// The tasks.
    pub tasks: Vec<TaskSummary>,
}

/// `GET /v1/tasks/{task}`: the whole thread.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct TaskDetail {
    /// Current to this cursor.
    pub cursor: i64,
    /// The task.
    pub task: Task,
    /// Its session.
    pub session: Session,
    /// Attempts, oldest first.
    pub attempts: Vec<Attempt>,
    /// Checkpoints, by sequence.
    pub checkpoints: Vec<Checkpoint>,
    /// Whether the checkpoint chain verifies.
    pub chain: ChainStatus,
    /// Effects.
    pub effects: Vec<Effect>,
    /// Approvals and decisions.
    pub decisions: Vec<Decision>,
    /// Artifacts.
    pub artifacts: Vec<Artifact>,
    /// Test receipts.
    pub test_receipts: Vec<TestReceipt>,
    /// Session messages.
    pub messages: Vec<Message>,
}

/// Reply of every write that changed state: the cursor of its event, so a client knows its
/// write is mirrored once its stream passes it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Written<T> {
    /// Event cursor of the change.
    pub cursor: i64,
    /// The changed object.
    #[serde(flatten)]
    pub value: T,
}

/// `GET /healthz`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct Health {
    /// `ok`.
    pub status: String,
    /// Server version.
    pub version: String,
    /// Newest event cursor.
    pub cursor: i64,
}

/// What a provider says about an effect when a resumed worker asks it by idempotency key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProviderStatus {
    /// The provider never saw the key: safe to run under the current lease.
    NotStarted,
    /// Done: record it and move on; never resend.
    Confirmed,
    /// Still running at the provider: wait and poll, never submit twice.
    InProgress,
    /// The provider cannot say: freeze the branch, a person or reconciler decides.
    Unknown,
    /// Failed and needs compensating: a compensation task with its own approval.
    FailedCompensable,
    /// Failed, nothing to undo.
    Failed,
}

/// One effect's reconciliation report.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProviderReport {
    /// The effect.
    #[schema(pattern = r"^eff_[0-9a-f]{32}$")]
    pub effect_id: String,
    /// What the provider says.
    pub provider_status: ProviderStatus,
    /// The provider's receipt, when it has one.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub receipt: Option<Value>,
    /// For people.
    #[serde(default)]
    pub detail: Option<String>,
}

/// `POST /v1/tasks/{task}/reconciliation`: what the providers say about non-terminal effects.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Reconcile {
    /// The resuming attempt.
    #[schema(pattern = r"^att_[0-9a-f]{32}$")]
    pub attempt_id: String,
    /// Its fence.
    #[schema(minimum = 1)]
    pub fence: i64,
    /// One report per effect.
    #[schema(min_items = 1, max_items = 1000)]
    pub reports: Vec<ProviderReport>,
}

/// What the control plane decided for one effect (SPEC §4).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ReconcileAction {
    /// The effect.
    pub effect_id: String,
    /// `continue` (run it now), `recorded` (confirmed, do not resend), `wait` (poll, do not
    /// resubmit), `frozen` (a person decides), `compensate` (a compensation task was opened),
    /// `failed`.
    pub action: String,
    /// The effect's status now.
    pub status: EffectStatus,
    /// The decision opened for a person (`frozen`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision_id: Option<String>,
    /// The compensation task (`compensate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compensation_task_id: Option<String>,
}

/// Reply to a reconciliation.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Reconciled {
    /// One action per report.
    pub actions: Vec<ReconcileAction>,
}

/// `POST /v1/attempts/{attempt}/released`: a worker (also a revoked one) reports the temporary
/// resources it let go.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReportReleased {
    /// The attempt's own fence.
    #[schema(minimum = 1)]
    pub fence: i64,
    /// What was released, e.g. `worktree:/tmp/w1`, `token:deploy-staging`.
    #[schema(min_items = 1, max_items = 1000)]
    pub resources: Vec<String>,
}

/// Reply to a usage report: the task, and the budget decision this report opened, if any.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct UsageReported {
    /// The task with its new totals.
    #[serde(flatten)]
    pub task: Task,
    /// Opened because a threshold was crossed; the worker waits for it and follows the choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_decision: Option<Decision>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn approval(runtime_deadline: serde_json::Value, durability: &str) -> Decision {
        serde_json::from_value(serde_json::json!({
            "id": "dec_1", "task_id": "task_1", "kind": "approval", "status": "pending",
            "step": null, "question": "run it?", "options": [], "default_option": "deny",
            "intent": {}, "intent_digest": null, "effect_id": null, "plan_revision": 1,
            "risky": false, "expires_at": "2026-12-02T12:10:00Z",
            "created_at": "2026-12-02T12:00:00Z", "outcome": null,
            "durability": durability, "runtime_deadline": runtime_deadline,
        }))
        .unwrap()
    }

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn the_earlier_deadline_is_said_with_who_decides_and_how() {
        let hermes = approval(
            serde_json::json!({"runtime": "Hermes", "at": "2026-12-02T12:01:00Z", "then": "denies"}),
            "connection_bound",
        );
        let c = hermes.closing();
        assert_eq!(c.at, at("2026-12-02T12:01:00Z"));
        assert_eq!(
            c.describe(at("2026-12-02T12:00:18Z")),
            "Hermes will deny in 0:42"
        );
        assert_eq!(
            c.describe(at("2026-12-02T12:01:00Z")),
            "Hermes has denied it"
        );
        assert_eq!(c.describe_at(), "Hermes will deny at 12:01 UTC");

        // Ours first: our default, and what it means.
        let later = approval(
            serde_json::json!({"runtime": "OpenClaw", "at": "2026-12-02T13:00:00Z", "then": "denies"}),
            "connection_bound",
        );
        assert_eq!(
            later.closing().describe(at("2026-12-02T12:00:00Z")),
            "deny applies in 10:00: the call does not run"
        );

        // A hook recorded before runtime deadlines existed is still Claude Code's.
        let hook = approval(serde_json::Value::Null, "fail_open_hook");
        assert_eq!(
            hook.closing().describe(at("2026-12-02T11:00:00Z")),
            "Claude Code will ask in its own prompt in 1:10:00"
        );
    }

    #[test]
    fn a_countdown_never_goes_negative() {
        assert_eq!(countdown(-5), "0:00");
        assert_eq!(countdown(42), "0:42");
        assert_eq!(countdown(595), "9:55");
        assert_eq!(countdown(3723), "1:02:03");
    }
}

/// Most questions in one form, and choices in one question.
pub const FORM_MAX_QUESTIONS: usize = 8;
/// See [`FORM_MAX_QUESTIONS`].
pub const FORM_MAX_CHOICES: usize = 16;

impl QuestionForm {
    /// Whether the form can be asked: 1 to 8 questions with unique ids, each with text, at
    /// most 16 choices with unique non-empty labels, and some way to answer it.
    pub fn check(&self) -> Result<(), String> {
        let n = self.questions.len();
        if n == 0 || n > FORM_MAX_QUESTIONS {
            return Err(format!(
                "a form has 1 to {FORM_MAX_QUESTIONS} questions, not {n}"
            ));
        }
        let mut ids = std::collections::HashSet::new();
        for q in &self.questions {
            if q.id.trim().is_empty() || q.id.len() > 64 {
                return Err("every question needs an id of 1 to 64 characters".into());
            }
            if !ids.insert(q.id.as_str()) {
                return Err(format!("question id `{}` appears twice", q.id));
            }
            if q.question.trim().is_empty() || q.question.len() > 2000 {
                return Err(format!(
                    "question `{}` needs a text of 1 to 2000 characters",
                    q.id
                ));
            }
            if q.choices.len() > FORM_MAX_CHOICES {
                return Err(format!(
                    "question `{}` has {} choices; at most {FORM_MAX_CHOICES}",
                    q.id,
                    q.choices.len()
                ));
            }
            if q.choices.is_empty() && !q.free_text {
                return Err(format!(
                    "question `{}` has no choices and takes no text: it cannot be answered",
                    q.id
                ));
            }
            let mut labels = std::collections::HashSet::new();
            for c in &q.choices {
                if c.label.trim().is_empty() || c.label.len() > 500 {
                    return Err(format!(
                        "question `{}`: every choice needs a label of 1 to 500 characters",
                        q.id
                    ));
                }
                if !labels.insert(c.label.as_str()) {
                    return Err(format!(
                        "question `{}`: choice `{}` appears twice",
                        q.id, c.label
                    ));
                }
            }
        }
        Ok(())
    }

    /// Whether `answers` answer this form: every question answered, none unknown; chosen
    /// labels are the question's own, one at most unless it is multi-select, never twice;
    /// words only where the question takes them, and never empty. Says what is wrong.
    pub fn check_answers(
        &self,
        answers: &std::collections::BTreeMap<String, FormAnswer>,
    ) -> Result<(), String> {
        if let Some(id) = answers
            .keys()
            .find(|k| !self.questions.iter().any(|q| &q.id == *k))
        {
            return Err(format!("`{id}` is not a question of this form"));
        }
        for q in &self.questions {
            let Some(a) = answers.get(&q.id) else {
                return Err(format!("question `{}` is not answered", q.id));
            };
            let mut seen = std::collections::HashSet::new();
            for c in &a.chosen {
                if !q.choices.iter().any(|x| &x.label == c) {
                    return Err(format!("`{c}` is not a choice of question `{}`", q.id));
                }
                if !seen.insert(c.as_str()) {
                    return Err(format!("`{c}` is chosen twice in question `{}`", q.id));
                }
            }
            if a.chosen.len() > 1 && !q.multi_select {
                return Err(format!(
                    "question `{}` takes one choice, not {}",
                    q.id,
                    a.chosen.len()
                ));
            }
            match a.text.as_deref() {
                Some(_) if !q.free_text => {
                    return Err(format!(
                        "question `{}` takes only its choices, not words of your own",
                        q.id
                    ));
                }
                Some(t) if t.trim().is_empty() => {
                    return Err(format!("the words for question `{}` are empty", q.id));
                }
                Some(t) if t.len() > 4000 => {
                    return Err(format!(
                        "the words for question `{}` are over 4000 characters",
                        q.id
                    ));
                }
                _ => {}
            }
            if a.chosen.is_empty() && a.text.is_none() {
                return Err(format!(
                    "question `{}` is not answered: choose {} or write an answer",
                    q.id,
                    if q.multi_select {
                        "at least one"
                    } else {
                        "one"
                    }
                ));
            }
            if !q.multi_select && !a.chosen.is_empty() && a.text.is_some() {
                return Err(format!(
                    "question `{}` takes one answer: a choice or your own words, not both",
                    q.id
                ));
            }
        }
        Ok(())
    }

    /// One question's answer as the agent is told it: the chosen labels and the person's
    /// words, joined with `, `.
    pub fn answer_text(answer: &FormAnswer) -> String {
        let mut parts: Vec<&str> = answer.chosen.iter().map(String::as_str).collect();
        if let Some(t) = answer.text.as_deref() {
            parts.push(t.trim());
        }
        parts.join(", ")
    }

    /// The answers in words, question by question (`Database: SQLite; Tests: unit, e2e`).
    pub fn summary(&self, answers: &std::collections::BTreeMap<String, FormAnswer>) -> String {
        self.questions
            .iter()
            .filter_map(|q| {
                let a = answers.get(&q.id)?;
                let tag = q.header.as_deref().unwrap_or(&q.question);
                Some(format!("{tag}: {}", Self::answer_text(a)))
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

#[cfg(test)]
mod form_tests {
    use super::*;
    use std::collections::BTreeMap;

    fn form() -> QuestionForm {
        let choice = |l: &str| FormChoice {
            label: l.into(),
            description: None,
        };
        QuestionForm {
            questions: vec![
                FormQuestion {
                    id: "q1".into(),
                    question: "Which database?".into(),
                    header: Some("Database".into()),
                    choices: vec![choice("Postgres"), choice("SQLite")],
                    multi_select: false,
                    free_text: true,
                },
                FormQuestion {
                    id: "q2".into(),
                    question: "Which tests?".into(),
                    header: None,
                    choices: vec![choice("unit"), choice("e2e")],
                    multi_select: true,
                    free_text: false,
                },
            ],
        }
    }

    /// A question's id, the labels chosen, and the words given.
    type Given<'a> = (&'a str, &'a [&'a str], Option<&'a str>);

    fn answers(pairs: &[Given]) -> BTreeMap<String, FormAnswer> {
        pairs
            .iter()
            .map(|(id, chosen, text)| {
                (
                    id.to_string(),
                    FormAnswer {
                        chosen: chosen.iter().map(|c| c.to_string()).collect(),
                        text: text.map(str::to_owned),
                    },
                )
            })
            .collect()
    }

    #[test]
    fn good_answers_pass_and_read_back_in_words() {
        let f = form();
        f.check().unwrap();
        let a = answers(&[("q1", &["SQLite"], None), ("q2", &["unit", "e2e"], None)]);
        f.check_answers(&a).unwrap();
        assert_eq!(f.summary(&a), "Database: SQLite; Which tests?: unit, e2e");
        let own = answers(&[("q1", &[], Some("DuckDB")), ("q2", &["e2e"], None)]);
        f.check_answers(&own).unwrap();
        assert_eq!(QuestionForm::answer_text(&own["q1"]), "DuckDB");
    }

    #[test]
    fn each_bad_answer_is_refused_with_its_reason() {
        let f = form();
        let cases: &[(&[Given], &str)] = &[
            (
                &[("q1", &["SQLite"], None)],
                "question `q2` is not answered",
            ),
            (
                &[("q1", &["MySQL"], None), ("q2", &["unit"], None)],
                "`MySQL` is not a choice of question `q1`",
            ),
            (
                &[
                    ("q1", &["SQLite", "Postgres"], None),
                    ("q2", &["unit"], None),
                ],
                "question `q1` takes one choice, not 2",
            ),
            (
                &[
                    ("q1", &["SQLite"], None),
                    ("q2", &["unit"], Some("and more")),
                ],
                "takes only its choices",
            ),
            (
                &[("q1", &[], Some("  ")), ("q2", &["unit"], None)],
                "are empty",
            ),
            (
                &[("q1", &[], None), ("q2", &["unit"], None)],
                "choose one or write an answer",
            ),
            (
                &[("q1", &["SQLite"], None), ("q2", &["unit", "unit"], None)],
                "chosen twice",
            ),
            (
                &[
                    ("q1", &["SQLite"], None),
                    ("q2", &["unit"], None),
                    ("q9", &[], None),
                ],
                "`q9` is not a question of this form",
            ),
            (
                &[
                    ("q1", &["SQLite"], Some("or DuckDB")),
                    ("q2", &["unit"], None),
                ],
                "not both",
            ),
        ];
        for (given, why) in cases {
            let err = f.check_answers(&answers(given)).unwrap_err();
            assert!(err.contains(why), "{given:?}: {err}");
        }
    }

    #[test]
    fn a_form_that_cannot_be_answered_is_refused() {
        let mut f = form();
        f.questions[1].choices.clear();
        assert!(f.check().unwrap_err().contains("cannot be answered"));
        let mut f = form();
        f.questions[1].id = "q1".into();
        assert!(f.check().unwrap_err().contains("appears twice"));
        assert!(QuestionForm { questions: vec![] }.check().is_err());
    }
}

#[cfg(test)]
mod tree_tests {
    use super::WorkingTree;

    fn tree(commit: &str, changed: &[(&str, &str)], digest: &str) -> WorkingTree {
        WorkingTree {
            commit: Some(commit.into()),
            digest: digest.into(),
            changed: changed
                .iter()
                .map(|(p, h)| ((*p).to_owned(), (*h).to_owned()))
                .collect(),
            truncated: false,
        }
    }

    #[test]
    fn the_same_tree_has_no_differences() {
        let a = tree("abc", &[("src/a.rs", "11")], "d1");
        assert_eq!(a.differences_from(&a.clone()), None);
    }

    #[test]
    fn differences_name_the_moved_head_and_each_path_changed_added_or_restored() {
        let was = tree(
            "0123456789abcdef",
            &[("src/a.rs", "11"), ("notes.md", "22")],
            "d1",
        );
        let now = tree(
            "fedcba9876543210",
            &[("src/a.rs", "33"), ("new.txt", "44")],
            "d2",
        );
        let said = now.differences_from(&was).unwrap();
        assert_eq!(
            said,
            "the working tree is not as the last checkpoint left it: HEAD moved from \
             0123456789ab to fedcba987654; `new.txt`, `notes.md`, `src/a.rs` have changed"
        );
        let one = tree("0123456789abcdef", &[("src/a.rs", "11")], "d3");
        assert!(
            one.differences_from(&was)
                .unwrap()
                .ends_with("`notes.md` has changed"),
            "a change undone is a change"
        );
    }

    #[test]
    fn many_paths_are_counted_and_a_cut_list_still_tells_by_digest() {
        let was = tree("c", &[], "d1");
        let many: Vec<(String, String)> =
            (0..12).map(|i| (format!("f{i:02}"), "h".into())).collect();
        let refs: Vec<(&str, &str)> = many.iter().map(|(p, h)| (p.as_str(), h.as_str())).collect();
        let said = tree("c", &refs, "d2").differences_from(&was).unwrap();
        assert!(said.ends_with("`f07` and 4 more have changed"), "{said}");
        let cut = WorkingTree {
            truncated: true,
            ..tree("c", &[], "d3")
        };
        assert!(
            cut.differences_from(&was)
                .unwrap()
                .ends_with("files beyond the listed ones changed")
        );
    }
}

#[cfg(test)]
mod option_tests {
    #[test]
    fn every_case_of_the_shared_table_grants_refuses_or_is_no_option() {
        let table: serde_json::Value = serde_json::from_str(include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../ui/src/web/fixtures/option-grants.json"
        )))
        .unwrap();
        let cases = table["cases"].as_array().unwrap();
        assert!(cases.len() > 10);
        for case in cases {
            let option = case[0].as_str().unwrap();
            assert_eq!(
                super::option_grants(option),
                case[1].as_bool(),
                "`{option}`"
            );
        }
    }
}
