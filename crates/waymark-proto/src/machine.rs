//! Machines and their runners on the wire: what a `waymark runner` reports of the machine it
//! supervises, what people read of it (`GET /v1/machines`), and the work the control plane
//! addresses to it — start a run, resume one (revive, follow-up, deferred answer), stop one.
//! The runner is a client of the control plane: it does what a work item says, within what its
//! owner allowed on that machine, and reports what happened.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Runtimes a runner can start (the `runtime` of `start_run`).
pub const RUNNER_RUNTIMES: &[&str] = &[
    "claude-code",
    "codex",
    "gemini",
    "opencode",
    "copilot",
    "hermes",
    "openclaw",
];

/// Runtimes a run can start in plan mode (`args.plan` of `start_run`).
pub const PLAN_RUNTIMES: &[&str] = &["claude-code", "codex"];

/// How long a machine counts as online after it was last heard from (ms): a runner asks for
/// work every [`RUNNER_POLL_SECONDS`] at most, so three missed polls make it offline.
pub const MACHINE_OFFLINE_AFTER_MS: i64 = 60_000;

/// The longest a runner's work request waits for work before it answers empty (seconds).
pub const RUNNER_POLL_SECONDS: u64 = 20;

str_enum! {
    /// What a work item asks a runner to do.
    pub enum WorkKind {
        /// Start the runtime for a new task (`start_run`).
        Start => "start",
        /// Resume the task's runtime session: after a crash or a sleep, for a follow-up, or
        /// once a deferred approval is answered (`args.reason`).
        Resume => "resume",
        /// End the task's runtime process (cancel).
        Stop => "stop",
    }
}

str_enum! {
    /// Where a work item stands.
    pub enum WorkState {
        /// Addressed to the machine, not yet taken.
        Pending => "pending",
        /// The runner took it and is acting on it.
        Taken => "taken",
        /// Done: the runtime was started, resumed or stopped.
        Done => "done",
        /// The runner refused it (outside what its owner allowed there); `detail` says why.
        Refused => "refused",
        /// The runner tried and could not (the runtime failed to start); `detail` says why.
        Failed => "failed",
        /// Overtaken before it was taken (the task was cancelled, or a newer item replaced it).
        Void => "void",
    }
}

/// A runtime a runner found on its machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(deny_unknown_fields)]
pub struct MachineRuntime {
    /// `claude-code`, …
    #[schema(min_length = 1, max_length = 64)]
    pub runtime: String,
    /// Its version, as the runtime reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 200)]
    pub version: Option<String>,
}

/// `PUT /v1/runner/machine`: what the runner found and what its owner allowed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RegisterMachine {
    /// The runtimes found, with versions.
    #[schema(max_items = 32)]
    pub runtimes: Vec<MachineRuntime>,
    /// The directories a run may use (absolute paths; a run may use any directory under one).
    #[schema(max_items = 64)]
    pub directories: Vec<String>,
    /// The runner's version.
    #[schema(max_length = 64)]
    pub runner_version: String,
    /// Whether the runner holds a sleep inhibitor while a run is active.
    #[serde(default)]
    pub inhibits_sleep: bool,
    /// The runtimes' own rules found in their files on the machine (read again, and
    /// reported again when they change).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(max_items = 500)]
    pub runtime_rules: Vec<crate::rules::RuntimeRule>,
}

/// A machine, as people see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct Machine {
    /// `mch_…`.
    #[schema(pattern = r"^mch_[0-9a-f]{32}$")]
    pub id: String,
    /// Its name (`laptop`).
    pub name: String,
    /// The user whose runs it starts.
    pub owner: String,
    /// Heard from within the last minute (server clock).
    pub online: bool,
    /// When it was last heard from (absent: never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen_at: Option<DateTime<Utc>>,
    /// Since when it is offline: a minute after it was last heard from (absent: online, or
    /// never heard from).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offline_since: Option<DateTime<Utc>>,
    /// The runtimes its runner found.
    pub runtimes: Vec<MachineRuntime>,
    /// The directories its owner allowed runs in.
    pub directories: Vec<String>,
    /// The runner's version (absent: it never registered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_version: Option<String>,
    /// Whether the runner holds a sleep inhibitor while a run is active.
    pub inhibits_sleep: bool,
    /// Its tasks that have not ended.
    pub active_tasks: Vec<String>,
}

/// `GET /v1/machines`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct MachineList {
    /// Newest first.
    pub machines: Vec<Machine>,
}

/// One work item addressed to a machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Work {
    /// `wrk_…`.
    #[schema(pattern = r"^wrk_[0-9a-f]{32}$")]
    pub id: String,
    /// The task it is for.
    pub task_id: String,
    /// What to do.
    pub kind: WorkKind,
    /// Where it stands.
    pub state: WorkState,
    /// What to do it with.
    pub run: RunSpec,
    /// For `resume`: why, and what to tell the runtime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<ResumeSpec>,
    /// When it was addressed.
    pub created_at: DateTime<Utc>,
    /// The runner's report, for a refused or failed item.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// The run a work item concerns, as it was signed by the person who started it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunSpec {
    /// `claude-code`, …
    pub runtime: String,
    /// The working directory (absolute).
    pub directory: String,
    /// The first prompt.
    pub prompt: String,
    /// The runtime's own session id, chosen by the control plane so the runtime's hooks find
    /// the task (Claude Code `--session-id`).
    pub session_key: String,
    /// Tools whose calls need an approval (a regex of tool names, Claude Code `--gate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<String>,
    /// The runtime's version on the machine when the run started, as its runner reported it: a
    /// revive on another version needs a person (admission).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_version: Option<String>,
    /// Plan first: the run starts in the runtime's plan mode, so it reads and plans, and asks
    /// for the plan's approval (a plan card) before it changes anything — Claude Code
    /// `--permission-mode plan`, Codex's Plan mode. Only where the runtime has one (`args.plan`
    /// of `start_run`). A revive resumes in the runtime's default mode.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub plan: bool,
}

/// Why a run is resumed, and what the runtime is told.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResumeSpec {
    /// `revive` (the process died), `follow_up` (its time came) or `answered` (a deferred
    /// approval was answered).
    pub reason: String,
    /// The message the resumed session receives (absent: the runtime's own "continue").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// `GET /v1/runner/work`: the machine's open work, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WorkList {
    /// Items pending or taken (a taken item is given again until it is reported: a runner
    /// that restarts finds what it was doing).
    pub work: Vec<Work>,
    /// The machine's tasks an attempt holds the lease of: the runner reports each one whose
    /// runtime it is not running (`exited`), so a run cut off by a crash or a reboot is found.
    pub running: Vec<String>,
}

/// `POST /v1/runner/work/{work}`: what became of a work item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReportWork {
    /// `taken`, `done`, `refused` or `failed`.
    pub state: WorkState,
    /// Why (refused or failed), or what was done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 2000)]
    pub detail: Option<String>,
}

/// `POST /v1/runner/tasks/{task}/exited`: the task's runtime process ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunExited {
    /// Its exit status, when it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<i32>,
    /// The signal that ended it, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// What the runner saw (e.g. "not running after the runner restarted").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 2000)]
    pub detail: Option<String>,
    /// The run's working tree as the runner sees it now, checked against the one the last
    /// checkpoint recorded before the run is revived.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree: Option<crate::WorkingTree>,
}

/// The answer to [`RunExited`]: what the control plane does about it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ExitHandled {
    /// `nothing` (the run had ended cleanly), `resume` (a resume was addressed to the
    /// machine), `needs_human` (a call was in flight, or admission failed: a card asks).
    pub action: String,
    /// For people.
    pub detail: String,
}
