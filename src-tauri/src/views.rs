//! What the UI sees: the shapes the TypeScript bindings are generated from. The wire types of
//! `waymark-proto` stay free of UI concerns (and of `specta`), so this is the one boundary
//! that converts — times become unix milliseconds, states their wire spelling, and a few
//! facts the screens need (an approval asked at an older plan revision, whether an artifact
//! is a diff) are decided here once rather than in every component.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use specta::Type;
use waymark_companion::{
    InboxItem, OutboxEntry, OutboxStatus, Stage, StageStatus, ThreadDetail, ThreadRow,
};
use waymark_proto::*;

fn ms(t: chrono::DateTime<chrono::Utc>) -> i64 {
    t.timestamp_millis()
}

/// Counts cross as JSON numbers (below 2^53, SPEC §9); saturate rather than wrap.
fn count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A plan step as progress shows it.
#[derive(Debug, Clone, Serialize, Type)]
pub struct StageView {
    /// Plan step id.
    pub step: String,
    /// For people.
    pub title: String,
    /// Where it stands.
    pub status: StageStatus,
    /// Verified when done.
    pub verified: bool,
}

impl From<Stage> for StageView {
    fn from(s: Stage) -> Self {
        StageView {
            step: s.step,
            title: s.title,
            status: s.status,
            verified: s.verified,
        }
    }
}

/// Limits and spend; the bar compares what is known, never a guess.
#[derive(Debug, Clone, Serialize, Type)]
pub struct BudgetView {
    /// Wall-clock limit.
    pub max_wall_seconds: Option<i64>,
    /// Token limit.
    pub max_tokens: Option<i64>,
    /// Money limit (USD).
    pub max_cost_usd: Option<f64>,
    /// Seconds since the task was created (until it ended, for a finished one).
    pub elapsed_seconds: i64,
    /// Tokens reported.
    pub used_tokens: i64,
    /// Money reported (USD).
    pub used_cost_usd: f64,
}

/// A task.
#[derive(Debug, Clone, Serialize, Type)]
pub struct TaskView {
    /// `task_…`.
    pub id: String,
    /// Short name.
    pub title: String,
    /// The goal and its acceptance.
    pub goal: String,
    /// Agent runtime.
    pub runtime: Option<String>,
    /// Where the task stands.
    pub state: TaskState,
    /// Whether the state is terminal.
    pub terminal: bool,
    /// Plan revision (approvals are bound to it).
    pub plan_revision: i64,
    /// Fence of the newest attempt.
    pub fence: i64,
    /// Budget and spend.
    pub budget: BudgetView,
    /// Repository.
    pub repo: Option<String>,
    /// Commit.
    pub commit: Option<String>,
    /// How the last attempt summed up.
    pub outcome_summary: Option<String>,
    /// The machine whose runner runs it (`mch_…`), for a run started through a runner.
    pub machine_id: Option<String>,
    /// Created (unix ms).
    pub created_at: i64,
    /// Last change (unix ms).
    pub updated_at: i64,
}

impl TaskView {
    /// The task as it stands at `now`: its budget's elapsed time runs until `now`, or until it
    /// ended.
    pub fn at(t: Task, now: chrono::DateTime<chrono::Utc>) -> Self {
        let terminal = t.state.is_terminal();
        let end = if terminal { t.updated_at } else { now };
        TaskView {
            budget: BudgetView {
                max_wall_seconds: t.budget.max_wall_seconds.map(count),
                max_tokens: t.budget.max_tokens.map(count),
                max_cost_usd: t.budget.max_cost_usd,
                elapsed_seconds: (end - t.created_at).num_seconds().max(0),
                used_tokens: count(t.usage.tokens),
                used_cost_usd: t.usage.cost_usd,
            },
            id: t.id,
            title: t.title,
            goal: t.goal,
            runtime: t.runtime,
            state: t.state,
            terminal,
            plan_revision: t.plan_revision,
            fence: t.fence,
            repo: t.materials.repo,
            commit: t.materials.commit,
            outcome_summary: t.outcome_summary,
            machine_id: t.machine_id,
            created_at: ms(t.created_at),
            updated_at: ms(t.updated_at),
        }
    }
}

/// A completed step in a checkpoint.
#[derive(Debug, Clone, Serialize, Type)]
pub struct CompletedStepView {
    /// Plan step id.
    pub step: String,
    /// Digests of what it produced.
    pub artifact_digests: Vec<String>,
    /// Verified.
    pub verified: bool,
}

/// The step in flight at a checkpoint.
#[derive(Debug, Clone, Serialize, Type)]
pub struct PendingStepView {
    /// Plan step id.
    pub step: String,
    /// Intent digest.
    pub intent_digest: Option<String>,
    /// Idempotency key.
    pub idempotency_key: Option<String>,
    /// The approval it waits for.
    pub approval_id: Option<String>,
}

/// An effect's status as a checkpoint saw it.
#[derive(Debug, Clone, Serialize, Type)]
pub struct EffectRefView {
    /// `eff_…`.
    pub effect_id: String,
    /// Status then.
    pub status: EffectStatus,
}

/// A checkpoint of the timeline.
#[derive(Debug, Clone, Serialize, Type)]
pub struct CheckpointView {
    /// 1, 2, 3…
    pub sequence: i64,
    /// Writer.
    pub attempt_id: String,
    /// Writer's fence.
    pub fence: i64,
    /// Why it was written.
    pub reason: String,
    /// Plan revision followed.
    pub plan_revision: i64,
    /// Steps done.
    pub completed_steps: Vec<CompletedStepView>,
    /// Step in flight.
    pub pending_step: Option<PendingStepView>,
    /// Effect statuses.
    pub effects: Vec<EffectRefView>,
    /// A line for people.
    pub summary: Option<String>,
    /// Materials version.
    pub commit: Option<String>,
    /// Digest of this link.
    pub digest: String,
    /// Digest of the previous link.
    pub prev_digest: Option<String>,
    /// Written at (unix ms).
    pub created_at: i64,
}

impl From<Checkpoint> for CheckpointView {
    fn from(c: Checkpoint) -> Self {
        let b = c.body;
        CheckpointView {
            sequence: c.sequence,
            attempt_id: c.attempt_id,
            fence: c.fence,
            reason: b.reason,
            plan_revision: b.plan_revision,
            completed_steps: b
                .completed_steps
                .into_iter()
                .map(|s| CompletedStepView {
                    step: s.step,
                    artifact_digests: s.artifact_digests,
                    verified: s.verified,
                })
                .collect(),
            pending_step: b.pending_step.map(|p| PendingStepView {
                step: p.step,
                intent_digest: p.intent_digest,
                idempotency_key: p.idempotency_key,
                approval_id: p.approval_id,
            }),
            effects: b
                .effects
                .into_iter()
                .map(|e| EffectRefView {
                    effect_id: e.effect_id,
                    status: e.status,
                })
                .collect(),
            summary: b.summary,
            commit: b.materials.and_then(|m| m.commit),
            digest: c.digest,
            prev_digest: c.prev_digest,
            created_at: ms(c.created_at),
        }
    }
}

/// A change in the outside world.
#[derive(Debug, Clone, Serialize, Type)]
pub struct EffectView {
    /// `eff_…`.
    pub id: String,
    /// Kind of change.
    pub kind: String,
    /// Plan step.
    pub step: Option<String>,
    /// Provider resource.
    pub resource_id: Option<String>,
    /// The provider's dedup key.
    pub idempotency_key: String,
    /// The intent as declared.
    pub intent: Value,
    /// Its digest.
    pub intent_digest: String,
    /// Where the effect stands (`unknown` is never guessed).
    pub status: EffectStatus,
    /// The provider's receipt.
    pub receipt: Option<Value>,
    /// Why it needs reconciliation.
    pub flag: Option<String>,
    /// Writer's fence.
    pub fence: i64,
    /// Last change (unix ms).
    pub updated_at: i64,
}

impl From<Effect> for EffectView {
    fn from(e: Effect) -> Self {
        EffectView {
            id: e.id,
            kind: e.kind,
            step: e.step,
            resource_id: e.resource_id,
            idempotency_key: e.idempotency_key,
            intent: e.intent,
            intent_digest: e.intent_digest,
            status: e.status,
            receipt: e.receipt,
            flag: e.flag,
            fence: e.fence,
            updated_at: ms(e.updated_at),
        }
    }
}

/// One option of a decision and what it gives up.
#[derive(Debug, Clone, Serialize, Type)]
pub struct OptionView {
    /// Option id.
    pub id: String,
    /// For people.
    pub label: String,
    /// What choosing it gives up.
    pub gives_up: String,
    /// What it costs.
    pub cost: Option<String>,
}

/// How a decision was closed.
#[derive(Debug, Clone, Serialize, Type)]
pub struct OutcomeView {
    /// The option that applied.
    pub option: Option<String>,
    /// Free text.
    pub text: Option<String>,
    /// Who decided.
    pub by: String,
    /// When (unix ms).
    pub at: i64,
    /// The intent approved in place of the one asked, when the person edited it.
    pub edited_intent: Option<Value>,
}

/// An approval, question, budget choice or recovery decision.
#[derive(Debug, Clone, Serialize, Type)]
pub struct DecisionView {
    /// `dec_…`.
    pub id: String,
    /// Its task.
    pub task_id: String,
    /// Approval, question, budget or recovery.
    pub kind: DecisionKind,
    /// Pending, resolved, expired or void.
    pub status: DecisionStatus,
    /// Plan step.
    pub step: Option<String>,
    /// What is asked.
    pub question: String,
    /// The choices.
    pub options: Vec<OptionView>,
    /// Applies on expiry.
    pub default_option: Option<String>,
    /// The intent in full (approvals).
    pub intent: Option<Value>,
    /// Its digest.
    pub intent_digest: Option<String>,
    /// The effect it allows.
    pub effect_id: Option<String>,
    /// Plan revision it is bound to.
    pub plan_revision: i64,
    /// Confirm twice.
    pub risky: bool,
    /// When the default applies (unix ms).
    pub expires_at: i64,
    /// Asked at (unix ms).
    pub created_at: i64,
    /// The outcome.
    pub outcome: Option<OutcomeView>,
    /// For approvals a runtime holds: how long it holds them.
    pub durability: Option<ApprovalDurability>,
    /// For answered runtime approvals: `pending` (not yet taken), `acknowledged`, `lost`.
    pub delivery: Option<String>,
    /// What the runtime said when it took (or lost) the answer.
    pub delivery_detail: Option<String>,
    /// Where the runtime takes an edited intent: the JSON pointer of the part a person may
    /// change before approving (`approve_edited`).
    pub editable: Option<String>,
    /// How far it has reached each device, oldest step first.
    pub deliveries: Vec<DeliveryView>,
    /// What happens if nobody answers, and when (`Decision::closing`).
    pub closing: ClosingView,
    /// The runtime can be asked to wait for the answer across its own exit instead of
    /// deciding at its deadline (Claude Code `defer` in `claude -p`): the card offers it.
    pub can_wait: bool,
    /// Where it stands in the user's escalation policy, when there is one.
    pub escalation: Option<EscalationStateView>,
}

/// Where a decision stands in its user's escalation policy.
#[derive(Debug, Clone, Serialize, Type)]
pub struct EscalationStateView {
    /// The devices notified so far, by name, first step first.
    pub notified: Vec<String>,
    /// The names of who is next in line.
    pub next_devices: Vec<String>,
    /// When they are (unix ms).
    pub next_at: Option<i64>,
    /// The step is due but held by quiet hours until then (unix ms).
    pub held_until: Option<i64>,
    /// Why it stopped, e.g. `opened on laptop`.
    pub stopped: Option<String>,
    /// Reminders sent so far.
    pub reminded: u32,
    /// When the next reminder is due (unix ms).
    pub next_reminder_at: Option<i64>,
}

impl From<Escalation> for EscalationStateView {
    fn from(e: Escalation) -> Self {
        let mut notified: Vec<String> = Vec::new();
        for n in e.notified {
            if !notified.contains(&n.device_name) {
                notified.push(n.device_name);
            }
        }
        EscalationStateView {
            notified,
            next_devices: e
                .next
                .as_ref()
                .map(|n| n.devices.clone())
                .unwrap_or_default(),
            next_at: e.next.as_ref().map(|n| ms(n.at)),
            held_until: e.held_until.map(ms),
            stopped: e.stopped,
            reminded: e.reminded,
            next_reminder_at: e.next_reminder.map(ms),
        }
    }
}

/// A user's escalation policy, as the settings screen edits it (`EscalationPolicy`).
#[derive(Debug, Clone, Serialize, Deserialize, Type)]
pub struct EscalationPolicyView {
    /// The steps, in order.
    pub steps: Vec<EscalationStepView>,
    /// Quiet hours, if any.
    pub quiet_hours: Option<QuietHoursView>,
    /// Reminders of unanswered decisions, if any.
    #[serde(default)]
    pub reminders: Option<RemindersView>,
}

/// Reminders: every so many minutes after the last notification, at most so many times.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, Type)]
pub struct RemindersView {
    /// Minutes between the last notification and a reminder (at least 5).
    pub every_minutes: u32,
    /// Reminders per decision (1–12).
    pub at_most: u32,
}

/// One step: minutes after the step before, and the device ids and people it notifies.
#[derive(Debug, Clone, Serialize, Deserialize, Type)]
pub struct EscalationStepView {
    /// Minutes after the step before (the first: after the decision opens).
    pub after_minutes: u32,
    /// Device ids.
    pub devices: Vec<String>,
    /// People (user names) this user delegates to; each of their devices is notified.
    pub people: Vec<String>,
}

/// Who may answer this user's decisions, and whose this user may answer (`Delegates`).
#[derive(Debug, Clone, Serialize, Type)]
pub struct DelegatesView {
    /// This user.
    pub user: String,
    /// Who may read this user's tasks and answer their decisions.
    pub delegates: Vec<DelegationView>,
    /// Whose decisions this user may answer.
    pub delegated_by: Vec<DelegationView>,
}

/// One person in a delegation, and whether the delegate accepted it.
#[derive(Debug, Clone, Serialize, Type)]
pub struct DelegationView {
    /// Their user name.
    pub user: String,
    /// When the owner offered it (unix ms).
    pub since: i64,
    /// `offered`: the delegate has not answered and sees nothing yet; `accepted`: in force.
    pub state: DelegationState,
    /// When the delegate accepted (unix ms).
    pub accepted_at: Option<i64>,
}

impl From<Delegates> for DelegatesView {
    fn from(d: Delegates) -> Self {
        let view = |v: Vec<Delegation>| {
            v.into_iter()
                .map(|x| DelegationView {
                    user: x.user,
                    since: x.since.timestamp_millis(),
                    state: x.state,
                    accepted_at: x.accepted_at.map(|t| t.timestamp_millis()),
                })
                .collect()
        };
        DelegatesView {
            user: d.user,
            delegates: view(d.delegates),
            delegated_by: view(d.delegated_by),
        }
    }
}

/// Quiet hours: `from`–`to` (`HH:MM`, local) in an IANA time zone.
#[derive(Debug, Clone, Serialize, Deserialize, Type)]
pub struct QuietHoursView {
    /// Start.
    pub from: String,
    /// End (exclusive).
    pub to: String,
    /// IANA time zone.
    pub time_zone: String,
}

impl From<EscalationPolicy> for EscalationPolicyView {
    fn from(p: EscalationPolicy) -> Self {
        EscalationPolicyView {
            steps: p
                .steps
                .into_iter()
                .map(|s| EscalationStepView {
                    after_minutes: s.after_minutes,
                    devices: s.devices,
                    people: s.people,
                })
                .collect(),
            quiet_hours: p.quiet_hours.map(|q| QuietHoursView {
                from: q.from,
                to: q.to,
                time_zone: q.time_zone,
            }),
            reminders: p.reminders.map(|r| RemindersView {
                every_minutes: r.every_minutes,
                at_most: r.at_most,
            }),
        }
    }
}

impl From<EscalationPolicyView> for EscalationPolicy {
    fn from(p: EscalationPolicyView) -> Self {
        EscalationPolicy {
            steps: p
                .steps
                .into_iter()
                .map(|s| EscalationStep {
                    after_minutes: s.after_minutes,
                    devices: s.devices,
                    people: s.people,
                })
                .collect(),
            quiet_hours: p.quiet_hours.map(|q| QuietHours {
                from: q.from,
                to: q.to,
                time_zone: q.time_zone,
            }),
            reminders: p.reminders.map(|r| Reminders {
                every_minutes: r.every_minutes,
                at_most: r.at_most,
            }),
        }
    }
}

/// What happens to an open decision if nobody answers: the earlier of the runtime's own
/// deadline and Waymark's expiry.
#[derive(Debug, Clone, Serialize, Type)]
pub struct ClosingView {
    /// When (unix ms).
    pub at: i64,
    /// The runtime that decides then (`Hermes`, `Claude Code`), or none: Waymark's default.
    pub runtime: Option<String>,
    /// What happens.
    pub then: ClosingThenView,
    /// The option Waymark applies (`then` = `default`).
    pub option: Option<String>,
}

/// What happens when a decision's deadline passes unanswered.
#[derive(Debug, Clone, Copy, Serialize, Type)]
#[serde(rename_all = "snake_case")]
pub enum ClosingThenView {
    /// The runtime refuses the call.
    RuntimeDenies,
    /// The runtime asks in its own prompt.
    RuntimeAsksItself,
    /// Waymark applies the default option.
    Default,
    /// No default: it closes unanswered.
    NoDefault,
}

impl From<Closing> for ClosingView {
    fn from(c: Closing) -> Self {
        let (then, option) = match c.then {
            ClosingThen::RuntimeDenies => (ClosingThenView::RuntimeDenies, None),
            ClosingThen::RuntimeAsksItself => (ClosingThenView::RuntimeAsksItself, None),
            ClosingThen::Default(o) => (ClosingThenView::Default, Some(o)),
            ClosingThen::NoDefault => (ClosingThenView::NoDefault, None),
        };
        ClosingView {
            at: ms(c.at),
            runtime: c.runtime,
            then,
            option,
        }
    }
}

/// One step a decision reached on one device.
#[derive(Debug, Clone, Serialize, Type)]
pub struct DeliveryView {
    /// The device.
    pub device_id: String,
    /// Its name.
    pub device_name: String,
    /// Pushed, fetched, shown, opened or answered.
    pub step: DeliveryStep,
    /// When (unix ms).
    pub at: i64,
    /// What the server or the device said.
    pub detail: Option<String>,
}

impl From<Decision> for DecisionView {
    fn from(d: Decision) -> Self {
        let closing = d.closing().into();
        DecisionView {
            closing,
            can_wait: d.runtime_deadline.as_ref().is_some_and(|r| r.can_wait),
            escalation: d.escalation.clone().map(Into::into),
            id: d.id,
            task_id: d.task_id,
            kind: d.kind,
            status: d.status,
            step: d.step,
            question: d.question,
            options: d
                .options
                .into_iter()
                .map(|o| OptionView {
                    id: o.id,
                    label: o.label,
                    gives_up: o.gives_up,
                    cost: o.cost,
                })
                .collect(),
            default_option: d.default_option,
            intent: d.intent,
            intent_digest: d.intent_digest,
            effect_id: d.effect_id,
            plan_revision: d.plan_revision,
            risky: d.risky,
            expires_at: ms(d.expires_at),
            created_at: ms(d.created_at),
            outcome: d.outcome.map(|o| OutcomeView {
                option: o.option,
                text: o.text,
                by: o.by,
                at: ms(o.at),
                edited_intent: o.edited_intent,
            }),
            durability: d.durability,
            delivery: d.delivery.as_ref().map(|x| x.state.as_str().to_owned()),
            delivery_detail: d.delivery.and_then(|x| x.detail),
            editable: d.editable,
            deliveries: {
                let mut v: Vec<DeliveryView> = d
                    .deliveries
                    .into_iter()
                    .map(|x| DeliveryView {
                        device_id: x.device_id,
                        device_name: x.device_name,
                        step: x.step,
                        at: ms(x.at),
                        detail: x.detail,
                    })
                    .collect();
                v.sort_by(|a, b| (a.at, &a.device_id).cmp(&(b.at, &b.device_id)));
                v
            },
        }
    }
}

/// A content-addressed artifact.
#[derive(Debug, Clone, Serialize, Type)]
pub struct ArtifactView {
    /// `art_…`.
    pub id: String,
    /// Hex sha256.
    pub sha256: String,
    /// File name.
    pub name: String,
    /// Media type.
    pub media_type: String,
    /// Bytes.
    pub size: i64,
    /// Plan step.
    pub step: Option<String>,
    /// A unified diff (shown in the diff viewer).
    pub is_diff: bool,
    /// Uploaded (unix ms).
    pub created_at: i64,
}

impl From<Artifact> for ArtifactView {
    fn from(a: Artifact) -> Self {
        ArtifactView {
            is_diff: a.media_type.contains("diff")
                || a.name.ends_with(".diff")
                || a.name.ends_with(".patch"),
            id: a.id,
            sha256: a.sha256,
            name: a.name,
            media_type: a.media_type,
            size: a.size,
            step: a.step,
            created_at: ms(a.created_at),
        }
    }
}

/// Totals of a test run.
#[derive(Debug, Clone, Serialize, Type)]
pub struct TotalsView {
    /// Cases.
    pub tests: i64,
    /// Passed.
    pub passed: i64,
    /// Failed assertions.
    pub failures: i64,
    /// Errors.
    pub errors: i64,
    /// Skipped.
    pub skipped: i64,
}

/// A failed case.
#[derive(Debug, Clone, Serialize, Type)]
pub struct FailureView {
    /// Suite.
    pub suite: String,
    /// Class or module.
    pub classname: String,
    /// Case.
    pub name: String,
    /// `failure` or `error`.
    pub kind: String,
    /// The message.
    pub message: String,
}

/// A parsed test receipt.
#[derive(Debug, Clone, Serialize, Type)]
pub struct ReceiptView {
    /// `rcpt_…`.
    pub id: String,
    /// Plan step.
    pub step: Option<String>,
    /// The command that ran.
    pub command: String,
    /// Its exit code.
    pub exit_code: i32,
    /// Commit tested.
    pub commit: Option<String>,
    /// Totals.
    pub totals: TotalsView,
    /// Failures with messages.
    pub failures: Vec<FailureView>,
    /// Seconds.
    pub duration_seconds: f64,
    /// Exit 0 and nothing failed.
    pub passed: bool,
    /// sha256 of the raw JUnit XML.
    pub junit_sha256: String,
    /// Recorded (unix ms).
    pub created_at: i64,
}

impl From<TestReceipt> for ReceiptView {
    fn from(r: TestReceipt) -> Self {
        ReceiptView {
            id: r.id,
            step: r.step,
            command: r.command,
            exit_code: r.exit_code,
            commit: r.commit,
            totals: TotalsView {
                tests: count(r.totals.tests),
                passed: count(r.totals.passed),
                failures: count(r.totals.failures),
                errors: count(r.totals.errors),
                skipped: count(r.totals.skipped),
            },
            failures: r
                .failures
                .into_iter()
                .map(|f| FailureView {
                    suite: f.suite,
                    classname: f.classname,
                    name: f.name,
                    kind: f.kind,
                    message: f.message,
                })
                .collect(),
            duration_seconds: r.duration_seconds,
            passed: r.passed,
            junit_sha256: r.junit_sha256,
            created_at: ms(r.created_at),
        }
    }
}

/// A session message.
#[derive(Debug, Clone, Serialize, Type)]
pub struct MessageView {
    /// Position.
    pub seq: i64,
    /// Role.
    pub role: String,
    /// Text.
    pub text: String,
    /// Recorded (unix ms).
    pub created_at: i64,
}

impl From<Message> for MessageView {
    fn from(m: Message) -> Self {
        MessageView {
            seq: m.seq,
            role: m.role,
            text: m.text,
            created_at: ms(m.created_at),
        }
    }
}

/// An execution try.
#[derive(Debug, Clone, Serialize, Type)]
pub struct AttemptView {
    /// `att_…`.
    pub id: String,
    /// Worker name.
    pub worker: String,
    /// Fence.
    pub fence: i64,
    /// Active, finished, superseded, revoked…
    pub state: AttemptState,
    /// Outcome.
    pub outcome: Option<String>,
    /// Started (unix ms).
    pub started_at: i64,
    /// Ended (unix ms).
    pub ended_at: Option<i64>,
    /// Lease end (unix ms).
    pub expires_at: i64,
}

impl From<Attempt> for AttemptView {
    fn from(a: Attempt) -> Self {
        AttemptView {
            id: a.id,
            worker: a.worker,
            fence: a.fence,
            state: a.state,
            outcome: a.outcome.map(|o| o.as_str().into()),
            started_at: ms(a.started_at),
            ended_at: a.ended_at.map(ms),
            expires_at: ms(a.expires_at),
        }
    }
}

/// A command signed on this device and where it stands.
#[derive(Debug, Clone, Serialize, Type)]
pub struct OutboxView {
    /// The command.
    pub command_id: String,
    /// Its task.
    pub task_id: String,
    /// Operation.
    pub operation: Operation,
    /// Plan revision the person saw.
    pub based_on_revision: Option<i64>,
    /// Where it stands.
    pub status: OutboxStatus,
    /// The server's words.
    pub detail: Option<String>,
    /// The plan revision the server met.
    pub met_revision: Option<i64>,
    /// For a conflict or rejection: what changed.
    pub what_changed: Option<String>,
    /// Signed (unix ms).
    pub created_at: i64,
    /// Answered (unix ms).
    pub delivered_at: Option<i64>,
    /// Seen by the agent (unix ms).
    pub acknowledged_at: Option<i64>,
}

impl From<OutboxEntry> for OutboxView {
    fn from(e: OutboxEntry) -> Self {
        OutboxView {
            detail: e.result.as_ref().map(|r| r.detail.clone()),
            met_revision: e.result.as_ref().and_then(|r| r.plan_revision),
            command_id: e.command_id,
            task_id: e.task_id,
            operation: e.operation,
            based_on_revision: e.based_on_revision,
            status: e.status,
            what_changed: e.what_changed,
            created_at: e.created_at,
            delivered_at: e.delivered_at,
            acknowledged_at: e.acknowledged_at,
        }
    }
}

/// A thread in the list.
#[derive(Debug, Clone, Serialize, Type)]
pub struct ThreadRowView {
    /// The task.
    pub task: TaskView,
    /// Decisions waiting.
    pub pending_decisions: i64,
    /// Effects with an unknown outcome.
    pub unknown_effects: i64,
    /// Newest checkpoint.
    pub last_checkpoint: Option<CheckpointView>,
    /// Plan stages.
    pub stages: Vec<StageView>,
    /// Pinned for offline review.
    pub pinned: bool,
    /// Whose task it is, when not this device's user's (they delegated their decisions).
    pub on_behalf_of: Option<String>,
}

impl ThreadRowView {
    /// The row for `me` (this device's user) at `now`: another owner's thread says whose it is.
    pub fn for_user(r: ThreadRow, me: Option<&str>, now: chrono::DateTime<chrono::Utc>) -> Self {
        let on_behalf_of = me
            .filter(|me| !r.task.owner.is_empty() && r.task.owner != *me)
            .map(|_| r.task.owner.clone());
        ThreadRowView {
            on_behalf_of,
            task: TaskView::at(r.task, now),
            pending_decisions: r.pending_decisions,
            unknown_effects: r.unknown_effects,
            last_checkpoint: r.last_checkpoint.map(Into::into),
            stages: r.stages.into_iter().map(Into::into).collect(),
            pinned: r.pinned,
        }
    }
}

/// A pending decision with its evidence.
#[derive(Debug, Clone, Serialize, Type)]
pub struct InboxItemView {
    /// The decision.
    pub decision: DecisionView,
    /// Its task's title.
    pub task_title: String,
    /// Whose task it is, when not this device's user's (they delegated their decisions).
    pub on_behalf_of: Option<String>,
    /// The task's plan revision now.
    pub plan_revision: i64,
    /// Asked at an older plan revision than the task has now (answering would conflict).
    pub stale: bool,
    /// Diffs of the task.
    pub diffs: Vec<ArtifactView>,
    /// Test receipts, newest last.
    pub receipts: Vec<ReceiptView>,
}

impl InboxItemView {
    /// The card for `me` (this device's user): another owner's decision says whose it is.
    pub fn for_user(i: InboxItem, me: Option<&str>) -> Self {
        let on_behalf_of = me
            .filter(|me| !i.task_owner.is_empty() && i.task_owner != *me)
            .map(|_| i.task_owner.clone());
        InboxItemView {
            on_behalf_of,
            ..i.into()
        }
    }
}

impl From<InboxItem> for InboxItemView {
    fn from(i: InboxItem) -> Self {
        InboxItemView {
            stale: i.decision.plan_revision != i.plan_revision,
            decision: i.decision.into(),
            on_behalf_of: None,
            task_title: i.task_title,
            plan_revision: i.plan_revision,
            diffs: i.diffs.into_iter().map(Into::into).collect(),
            receipts: i.receipts.into_iter().map(Into::into).collect(),
        }
    }
}

/// A thread in full.
#[derive(Debug, Clone, Serialize, Type)]
pub struct ThreadDetailView {
    /// The task.
    pub task: TaskView,
    /// Plan stages.
    pub stages: Vec<StageView>,
    /// Attempts, oldest first.
    pub attempts: Vec<AttemptView>,
    /// Checkpoint timeline.
    pub checkpoints: Vec<CheckpointView>,
    /// Effects, `unknown` first.
    pub effects: Vec<EffectView>,
    /// Decisions, newest first.
    pub decisions: Vec<DecisionView>,
    /// Artifacts.
    pub artifacts: Vec<ArtifactView>,
    /// Test receipts.
    pub receipts: Vec<ReceiptView>,
    /// Messages.
    pub messages: Vec<MessageView>,
    /// Commands this device sent about it.
    pub outbox: Vec<OutboxView>,
}

fn all<T, U: From<T>>(v: Vec<T>) -> Vec<U> {
    v.into_iter().map(Into::into).collect()
}

impl ThreadDetailView {
    /// The thread as it stands at `now` (its task's elapsed time).
    pub fn at(d: ThreadDetail, now: chrono::DateTime<chrono::Utc>) -> Self {
        ThreadDetailView {
            task: TaskView::at(d.task, now),
            stages: all(d.stages),
            attempts: all(d.attempts),
            checkpoints: all(d.checkpoints),
            effects: all(d.effects),
            decisions: all(d.decisions),
            artifacts: all(d.artifacts),
            receipts: all(d.receipts),
            messages: all(d.messages),
            outbox: all(d.outbox),
        }
    }
}

/// An artifact's text for the viewers.
#[derive(Debug, Clone, Serialize, Type)]
pub struct ArtifactText {
    /// UTF-8 (lossy) content, cut at the viewer's limit.
    pub text: String,
    /// Bytes in full.
    pub size: i64,
    /// Cut short.
    pub truncated: bool,
}

/// A paired device.
#[derive(Debug, Clone, Serialize, Type)]
pub struct DeviceView {
    /// `dev_…`.
    pub id: String,
    /// Its user.
    pub user: String,
    /// Its name.
    pub name: String,
    /// Scopes.
    pub scopes: Vec<String>,
    /// This device.
    pub this_device: bool,
    /// Paired (unix ms); unknown for this device in remote mode.
    pub created_at: Option<i64>,
    /// Revoked (unix ms).
    pub revoked_at: Option<i64>,
    /// Last heard from by the server (unix ms), where the server says.
    pub last_seen_at: Option<i64>,
    /// Not heard from for long: never shown as connected.
    pub stale: bool,
}

impl DeviceView {
    /// A device as the server lists it.
    pub fn of(d: Device, this: &str) -> DeviceView {
        DeviceView {
            this_device: d.id == this,
            id: d.id,
            user: d.user,
            name: d.name,
            scopes: d.scopes,
            created_at: Some(ms(d.created_at)),
            revoked_at: d.revoked_at.map(ms),
            last_seen_at: d.last_seen_at.map(ms),
            stale: d.stale,
        }
    }
}

/// The app's link to its control plane, for the banner and the status bar.
#[derive(Debug, Clone, Serialize, Type)]
pub struct StatusView {
    /// `embedded` (in-process control plane), `remote`, or `starting`.
    pub mode: String,
    /// Paired with a server.
    pub paired: bool,
    /// The server.
    pub server: Option<String>,
    /// This device.
    pub device_id: Option<String>,
    /// Its user.
    pub user: Option<String>,
    /// Scopes.
    pub scopes: Vec<String>,
    /// An event stream is open.
    pub connected: bool,
    /// The last call reached the server.
    pub server_reachable: bool,
    /// The mirror last caught up (unix ms).
    pub last_sync_at: Option<i64>,
    /// Server time of the last event applied (unix ms).
    pub last_event_at: Option<i64>,
    /// Reconnecting since (unix ms).
    pub reconnecting_since: Option<i64>,
    /// The last error, for people.
    pub last_error: Option<String>,
    /// Commands waiting in the outbox.
    pub queued: i64,
    /// Decisions waiting.
    pub pending_decisions: i64,
    /// Notifications muted until (unix ms).
    pub muted_until: Option<i64>,
    /// The embedded demo agent's last words.
    pub demo: Option<String>,
    /// Where the device key lives.
    pub keystore: Option<String>,
}

/// How a decision is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Type)]
#[serde(rename_all = "snake_case")]
pub enum DecideOp {
    /// Approve an approval.
    Approve,
    /// Deny an approval.
    Deny,
    /// Choose an option (budget, recovery).
    Choose,
    /// Answer a question with text.
    Answer,
    /// Ask the runtime to wait for the answer across its exit (Claude Code `defer`).
    Wait,
}

/// What a decision's card showed when the person answered it: the command is signed with
/// exactly this, so a plan that moved on meanwhile is a conflict, never a silent re-sign.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Type)]
pub struct SeenView {
    /// The task's plan revision on the card.
    pub plan_revision: i64,
    /// The intent digest on the card (approvals).
    pub intent_digest: Option<String>,
}

impl From<SeenView> for waymark_companion::Seen {
    fn from(s: SeenView) -> Self {
        waymark_companion::Seen {
            plan_revision: s.plan_revision,
            intent_digest: s.intent_digest,
        }
    }
}

/// A steer from the Steer panel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Type)]
#[serde(rename_all = "snake_case")]
pub enum SteerOp {
    /// Stop claiming new steps.
    Pause,
    /// Continue after a pause.
    Resume,
    /// Revoke the lease and stop.
    Cancel,
    /// Suspend and replan with instructions.
    Replan,
    /// Take control; the old owner is fenced off.
    TakeOver,
}

impl SteerOp {
    /// The wire operation; a replan that names steps to suspend is `suspend_and_replan`.
    pub fn operation(self, suspends_steps: bool) -> Operation {
        match self {
            SteerOp::Pause => Operation::Pause,
            SteerOp::Resume => Operation::Resume,
            SteerOp::Cancel => Operation::Cancel,
            SteerOp::Replan if suspends_steps => Operation::SuspendAndReplan,
            SteerOp::Replan => Operation::Replan,
            SteerOp::TakeOver => Operation::TakeOver,
        }
    }
}

/// What a manual sync did.
#[derive(Debug, Clone, Serialize, Type)]
pub struct SyncView {
    /// Events applied.
    pub events: i64,
    /// A fresh snapshot was taken.
    pub snapshot: bool,
    /// Queued commands delivered.
    pub delivered: Vec<OutboxView>,
    /// The cursor the mirror is current to.
    pub cursor: i64,
}

impl From<waymark_companion::SyncReport> for SyncView {
    fn from(r: waymark_companion::SyncReport) -> Self {
        SyncView {
            events: r.events as i64,
            snapshot: r.snapshot,
            delivered: all(r.delivered),
            cursor: r.cursor,
        }
    }
}

/// A runtime a machine's runner can start.
#[derive(Debug, Clone, Serialize, Type)]
pub struct MachineRuntimeView {
    /// `claude-code`, …
    pub runtime: String,
    /// As the runtime reports it.
    pub version: Option<String>,
}

/// One of the user's machines, as its runner last reported it.
#[derive(Debug, Clone, Serialize, Type)]
pub struct MachineView {
    /// `mch_…`.
    pub id: String,
    /// Its name (`laptop`).
    pub name: String,
    /// Heard from within the last minute (server clock).
    pub online: bool,
    /// Last heard from (unix ms; absent: never).
    pub last_seen_at: Option<i64>,
    /// Offline since (unix ms; absent: online, or never heard from).
    pub offline_since: Option<i64>,
    /// The runtimes it can start.
    pub runtimes: Vec<MachineRuntimeView>,
    /// The directories its owner allowed runs in (a run may use one below them).
    pub directories: Vec<String>,
    /// Whether its runner keeps the machine awake while a run is active.
    pub inhibits_sleep: bool,
    /// Its tasks that have not ended.
    pub active_tasks: Vec<String>,
    /// Its runner's version (absent: never registered).
    pub runner_version: Option<String>,
}

impl From<Machine> for MachineView {
    fn from(m: Machine) -> Self {
        MachineView {
            id: m.id,
            name: m.name,
            online: m.online,
            last_seen_at: m.last_seen_at.map(ms),
            offline_since: m.offline_since.map(ms),
            runtimes: m
                .runtimes
                .into_iter()
                .map(|r| MachineRuntimeView {
                    runtime: r.runtime,
                    version: r.version,
                })
                .collect(),
            directories: m.directories,
            inhibits_sleep: m.inhibits_sleep,
            active_tasks: m.active_tasks,
            runner_version: m.runner_version,
        }
    }
}

/// A run the person asks to start on a machine (signed as `start_run`).
#[derive(Debug, Clone, Deserialize, Type)]
pub struct StartRunView {
    /// The machine's name or id.
    pub machine: String,
    /// One of the machine's runtimes.
    pub runtime: String,
    /// An absolute directory at or below one the machine allows.
    pub directory: String,
    /// The first prompt.
    pub prompt: String,
    /// The task's title (default: the prompt's first line).
    pub title: Option<String>,
    /// Tools whose calls need an approval (a regex of tool names; default: the runtime's).
    pub gate: Option<String>,
    /// Plan first: the runtime starts in its plan mode and asks for the plan's approval before
    /// it changes anything (Claude Code, Codex).
    pub plan: bool,
}

/// A started (or queued) run: its new task and the signed command.
#[derive(Debug, Clone, Serialize, Type)]
pub struct StartedRunView {
    /// The new task's id, chosen on this device.
    pub task_id: String,
    /// The command in the outbox.
    pub command: OutboxView,
}

/// A standing rule as the Rules screen lists it: what it matches, flat, with its answer, its
/// expiry and how often it answered.
#[derive(Debug, Clone, Serialize, Type)]
pub struct RuleView {
    /// `rul_…`.
    pub id: String,
    /// `sha256:` of the rule as signed.
    pub digest: String,
    /// The device that signed it (`alice's phone`).
    pub device_name: String,
    /// The runtime it is limited to (absent: any).
    pub runtime: Option<String>,
    /// The machine it is limited to, by name (absent: any).
    pub machine: Option<String>,
    /// The directory (a glob) it covers, and everything under it (absent: any).
    pub directory: Option<String>,
    /// The tool, as the runtime names it (absent: any).
    pub tool: Option<String>,
    /// The pattern over the call's command or path (absent: any input).
    pub pattern: Option<String>,
    /// How `pattern` reads.
    pub pattern_kind: Option<PatternKind>,
    /// `allow` or `deny`.
    pub answer: RuleAnswer,
    /// Why, as its signer wrote it.
    pub note: Option<String>,
    /// It may allow calls marked risky (confirmed twice when made).
    pub allow_risky: bool,
    /// Made at (unix ms).
    pub created_at: i64,
    /// Stops answering at (unix ms).
    pub expires_at: i64,
    /// Revoked at (unix ms).
    pub revoked_at: Option<i64>,
    /// Approvals it answered.
    pub uses: i64,
    /// It last answered one at (unix ms).
    pub last_used_at: Option<i64>,
    /// Neither revoked nor expired, by the server's clock when listed.
    pub live: bool,
}

impl From<Rule> for RuleView {
    fn from(r: Rule) -> Self {
        let m = r.matches;
        RuleView {
            id: r.id,
            digest: r.digest,
            device_name: r.device_name,
            runtime: m.runtime,
            machine: m.machine,
            directory: m.directory,
            tool: m.tool,
            pattern_kind: m.input.as_ref().map(|i| i.kind),
            pattern: m.input.map(|i| i.pattern),
            answer: r.answer,
            note: r.note,
            allow_risky: r.allow_risky,
            created_at: ms(r.created_at),
            expires_at: ms(r.expires_at),
            revoked_at: r.revoked_at.map(ms),
            uses: r.uses,
            last_used_at: r.last_used_at.map(ms),
            live: r.live,
        }
    }
}

/// The Rules screen's list: the user's rules and, beside them, the runtimes' own rules their
/// machines' runners read.
#[derive(Debug, Clone, Serialize, Type)]
pub struct RulesView {
    pub rules: Vec<RuleView>,
    pub runtime_rules: Vec<RuntimeRuleView>,
}

impl From<RuleList> for RulesView {
    fn from(l: RuleList) -> Self {
        RulesView {
            rules: l.rules.into_iter().map(Into::into).collect(),
            runtime_rules: l.runtime_rules.into_iter().map(Into::into).collect(),
        }
    }
}

/// A runtime's own rule (Claude Code's `permissions.allow`, a Codex `prefix_rule`, …), flat,
/// with the user's rules it works against.
#[derive(Debug, Clone, Serialize, Type)]
pub struct RuntimeRuleView {
    /// The machine whose runner read it.
    pub machine: String,
    /// `claude-code`, `codex`, …
    pub runtime: String,
    /// The file it is in.
    pub source: String,
    /// As the file writes it.
    pub text: String,
    /// `allow` (runs unasked), `deny` (refused unasked) or `ask`.
    pub effect: OwnEffect,
    /// The tool it covers (absent: every tool).
    pub tool: Option<String>,
    /// The calls' command or path it covers, as a Waymark glob (absent: all).
    pub pattern: Option<String>,
    /// The directory it holds in (absent: everywhere).
    pub directory: Option<String>,
    /// When the runner last reported it (unix ms).
    pub reported_at: Option<i64>,
    /// The user's live rules it works against.
    pub conflicts: Vec<RuleConflictView>,
}

/// A Waymark rule and a runtime's rule with different answers for the same calls.
#[derive(Debug, Clone, Serialize, Type)]
pub struct RuleConflictView {
    /// `rul_…`.
    pub rule_id: String,
    /// What happens, for people.
    pub says: String,
}

impl From<ListedRuntimeRule> for RuntimeRuleView {
    fn from(l: ListedRuntimeRule) -> Self {
        let r = l.rule;
        RuntimeRuleView {
            machine: l.machine,
            runtime: r.runtime,
            source: r.source,
            text: r.text,
            effect: r.effect,
            tool: r.matches.tool,
            pattern: r.matches.input.map(|i| i.pattern),
            directory: r.matches.directory,
            reported_at: l.reported_at.map(ms),
            conflicts: l
                .conflicts
                .into_iter()
                .map(|c| RuleConflictView {
                    rule_id: c.rule_id,
                    says: c.says,
                })
                .collect(),
        }
    }
}

/// A rule the person asks to make (signed as `add_rule`). Blank parts match anything.
#[derive(Debug, Clone, Deserialize, Type)]
pub struct NewRuleView {
    /// Only this runtime's calls.
    pub runtime: Option<String>,
    /// Only calls on this machine (by name).
    pub machine: Option<String>,
    /// Only calls in this absolute directory (a glob) or under it.
    pub directory: Option<String>,
    /// Only this tool.
    pub tool: Option<String>,
    /// Only calls whose command or path matches.
    pub pattern: Option<String>,
    /// How `pattern` reads.
    pub pattern_kind: PatternKind,
    /// `allow` or `deny`.
    pub answer: RuleAnswer,
    /// Days it lives, 1 to 90.
    pub days: u32,
    /// Why.
    pub note: Option<String>,
    /// Also allow calls marked risky…
    pub allow_risky: bool,
    /// …confirmed a second time by the person.
    pub confirmed_risky: bool,
}

impl NewRuleView {
    /// The rule to sign, expiring `days` after `now` in whole seconds (as the terminal signs
    /// it: the signed time reads the same in every client).
    pub fn into_new_rule(self, now: chrono::DateTime<chrono::Utc>) -> waymark_companion::NewRule {
        let blank = |o: Option<String>| o.map(|t| t.trim().to_owned()).filter(|t| !t.is_empty());
        let pattern = self.pattern.filter(|p| !p.trim().is_empty());
        waymark_companion::NewRule {
            spec: RuleSpec {
                matches: RuleMatch {
                    runtime: blank(self.runtime),
                    machine: blank(self.machine),
                    directory: blank(self.directory),
                    tool: blank(self.tool),
                    input: pattern.map(|pattern| InputPattern {
                        kind: self.pattern_kind,
                        pattern,
                    }),
                },
                answer: self.answer,
                expires_at: chrono::DateTime::from_timestamp(
                    now.timestamp() + i64::from(self.days) * 86_400,
                    0,
                ),
                note: blank(self.note),
                allow_risky: self.allow_risky,
            },
            confirmed_risky: self.confirmed_risky,
        }
    }
}

/// A rule made: its id and the server's words for it.
#[derive(Debug, Clone, Serialize, Type)]
pub struct RuleAddedView {
    /// `rul_…`, chosen on this device.
    pub rule_id: String,
    /// What the server made (`rule rul_…: allow tool Bash … until …`).
    pub detail: String,
}
