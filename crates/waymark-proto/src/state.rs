//! The state machines of Task, Attempt, Effect and Decision. Legal transitions are decided
//! here, once, so every store backend and client agrees on them.

/// A string that names no value of the enum it was parsed as.
#[derive(Debug, Clone, thiserror::Error)]
#[error("unknown {kind} `{value}`")]
pub struct UnknownValue {
    /// The enum's name.
    pub kind: &'static str,
    /// What was given.
    pub value: String,
}

str_enum! {
    /// Where a task stands (SPEC §2).
    pub enum TaskState {
        Queued => "queued",
        Running => "running",
        WaitingApproval => "waiting_approval",
        WaitingHuman => "waiting_human",
        Paused => "paused",
        RecoveryCandidate => "recovery_candidate",
        NeedsHuman => "needs_human",
        Verifying => "verifying",
        Completed => "completed",
        PartiallyDelivered => "partially_delivered",
        Cancelled => "cancelled",
        Failed => "failed",
    }
}

impl TaskState {
    /// The states in which a task whose live lease ran out becomes `recovery_candidate`: a
    /// worker was running it or waiting on a person. Never while paused or cancelled, nor when
    /// it already waits for recovery. The one list: the lease sweeper checks it and both store
    /// backends select by it (`lease_sweepable_sql`).
    pub const LEASE_SWEEPABLE: [TaskState; 5] = [
        TaskState::Queued,
        TaskState::Running,
        TaskState::Verifying,
        TaskState::WaitingApproval,
        TaskState::WaitingHuman,
    ];

    /// Whether the lease sweeper takes a task in this state ([`TaskState::LEASE_SWEEPABLE`]).
    pub fn lease_sweepable(self) -> bool {
        Self::LEASE_SWEEPABLE.contains(&self)
    }

    /// [`TaskState::LEASE_SWEEPABLE`] as an SQL list of string literals, for `state IN (…)`.
    pub fn lease_sweepable_sql() -> String {
        Self::LEASE_SWEEPABLE
            .iter()
            .map(|s| format!("'{}'", s.as_str()))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Terminal states never change again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Completed
                | TaskState::PartiallyDelivered
                | TaskState::Cancelled
                | TaskState::Failed
        )
    }
}

str_enum! {
    /// The life of one execution try.
    pub enum AttemptState {
        /// Holds (or held, until it expires) the task's lease.
        Active => "active",
        /// Ended by its worker through `finish`.
        Finished => "finished",
        /// Its lease ran out and a newer attempt took the task over.
        Superseded => "superseded",
        /// Its lease was revoked (cancel, take-over).
        Revoked => "revoked",
    }
}

str_enum! {
    /// An external effect's reconciliation status (SPEC §2, §4).
    pub enum EffectStatus {
        Intended => "intended",
        InProgress => "in_progress",
        Confirmed => "confirmed",
        Failed => "failed",
        FailedCompensable => "failed_compensable",
        Unknown => "unknown",
        Compensated => "compensated",
    }
}

impl EffectStatus {
    /// `confirmed`, `failed` and `compensated` are final.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            EffectStatus::Confirmed | EffectStatus::Failed | EffectStatus::Compensated
        )
    }

    /// Whether a worker may move an effect from `self` to `next`. The same status is not a
    /// transition (callers treat a repeat as idempotent when the receipt matches).
    ///
    /// `unknown` only leaves through a report of what the provider says: the server never
    /// resolves it on its own.
    pub fn can_become(self, next: EffectStatus) -> bool {
        use EffectStatus::*;
        match self {
            Intended => matches!(
                next,
                InProgress | Confirmed | Failed | FailedCompensable | Unknown
            ),
            InProgress => matches!(next, Confirmed | Failed | FailedCompensable | Unknown),
            Unknown => matches!(next, InProgress | Confirmed | Failed | FailedCompensable),
            FailedCompensable => matches!(next, Compensated | Failed),
            Confirmed | Failed | Compensated => false,
        }
    }
}

str_enum! {
    /// What a decision asks a person.
    pub enum DecisionKind {
        /// Approve or deny one intent, bound to its digest and the plan revision.
        Approval => "approval",
        /// A free question with optional options.
        Question => "question",
        /// A budget threshold was reached: options say what each gives up.
        Budget => "budget",
        /// Recovery needs a human (admission failed, an effect is unknown).
        Recovery => "recovery",
    }
}

str_enum! {
    /// How long the runtime behind an approval keeps it open (docs/adapters.md).
    pub enum ApprovalDurability {
        /// The runtime waits across process exits (Claude Code `defer` + resume).
        Durable => "durable",
        /// Open only while the adapter's connection lives (Codex, ACP, OpenClaw).
        ConnectionBound => "connection_bound",
        /// A hook that fails open: on timeout the runtime proceeds with its own prompt.
        FailOpenHook => "fail_open_hook",
    }
}

str_enum! {
    /// What the runtime behind an approval does on its own when its deadline passes first.
    pub enum RuntimeFallback {
        /// It refuses the call (Hermes' fixed wait, OpenClaw's approval expiry): nothing runs.
        Denies => "denies",
        /// It asks in its own prompt (a Claude Code hook that times out; `claude -p` denies).
        AsksItself => "asks_itself",
    }
}

str_enum! {
    /// Whether the runtime has taken the answer to an approval.
    pub enum DeliveryState {
        /// Answered here; the runtime has not confirmed it yet.
        Pending => "pending",
        /// The runtime confirmed it acted on the answer.
        Acknowledged => "acknowledged",
        /// The runtime went away before it took the answer; it did not act on it.
        Lost => "lost",
    }
}

str_enum! {
    /// How far a decision has reached one device, step by step (each recorded once, when first
    /// seen): the push service took a push for it, the device fetched it, showed it in a
    /// notification, a person opened it, and answered it from that device.
    pub enum DeliveryStep {
        /// A push about it was accepted by the device's push service.
        Pushed => "pushed",
        /// The device fetched it (its mirror or its notification read it).
        Fetched => "fetched",
        /// The device showed it in a notification.
        Shown => "shown",
        /// A person opened it on the device (its card, or its notification).
        Opened => "opened",
        /// It was answered from the device.
        Answered => "answered",
    }
}

str_enum! {
    /// Where a decision stands.
    pub enum DecisionStatus {
        Pending => "pending",
        /// A person (or an admin) answered.
        Resolved => "resolved",
        /// Nobody answered in time; the stated default applied.
        Expired => "expired",
        /// A newer plan revision or a cancel made it moot.
        Void => "void",
    }
}

str_enum! {
    /// What a signed steer command asks (SPEC §5).
    pub enum Operation {
        /// Stop claiming new steps; keep the checkpoint. Always applies.
        Pause => "pause",
        /// Continue after a pause.
        Resume => "resume",
        /// Revoke the lease, stop the runner, reconcile effects.
        Cancel => "cancel",
        /// Suspend the run and replan: new plan revision, old approvals void.
        SuspendAndReplan => "suspend_and_replan",
        /// Replan: new plan revision, old approvals void.
        Replan => "replan",
        /// Answer a question decision.
        AnswerQuestion => "answer_question",
        /// Approve an approval (bound to its intent digest and plan revision).
        Approve => "approve",
        /// Deny an approval.
        Deny => "deny",
        /// Choose an option of a decision (budget and others).
        ChooseOption => "choose_option",
        /// Ask the runtime holding an approval to wait for the answer across its own exit
        /// (Claude Code `defer` in `claude -p`), where its `runtime_deadline.can_wait` says it
        /// can: the approval stays open, durably. Bound like `approve` (digest, revision).
        Defer => "defer",
        /// A new owner takes control; the old one is fenced off.
        TakeOver => "take_over",
        /// Not a steer: a signed request for a read session token.
        OpenSession => "open_session",
        /// Start a run of a runtime on one of the user's machines (`args`: `machine`,
        /// `runtime`, `directory`, `prompt`, optional `title` and `gate`); `task_id` is the new
        /// task's id, chosen by the device, so a resend is a duplicate.
        StartRun => "start_run",
        /// Make a standing rule (`args.rule`: a `RuleSpec`; `args.confirm_risky`: the rule's
        /// digest again, required when it allows risky calls). No `task_id`: the rule is the
        /// signing device's user's, and answers their approvals that match it until it
        /// expires or is revoked.
        AddRule => "add_rule",
        /// End a standing rule at once (`args.rule_id`); the next approval no longer meets it.
        RevokeRule => "revoke_rule",
    }
}

str_enum! {
    /// How a worker ends an attempt.
    pub enum FinishOutcome {
        /// The task's goal is met and verified.
        Completed => "completed",
        /// Part of the goal was delivered; the summary says what was and was not verified.
        PartiallyDelivered => "partially_delivered",
        /// The task failed.
        Failed => "failed",
        /// The task was cancelled.
        Cancelled => "cancelled",
        /// The attempt hands the task back (e.g. a worker shutting down); the task stays open.
        Released => "released",
    }
}

impl FinishOutcome {
    /// The task state this outcome leads to.
    pub fn task_state(self) -> TaskState {
        match self {
            FinishOutcome::Completed => TaskState::Completed,
            FinishOutcome::PartiallyDelivered => TaskState::PartiallyDelivered,
            FinishOutcome::Failed => TaskState::Failed,
            FinishOutcome::Cancelled => TaskState::Cancelled,
            FinishOutcome::Released => TaskState::Queued,
        }
    }
}

str_enum! {
    /// Whether a follow-up still runs.
    pub enum FollowupState {
        /// Scheduled: it runs at its next time.
        Active => "active",
        /// Finished (a one-off that ran, or cancelled with its task); it runs no more.
        Done => "done",
    }
}

str_enum! {
    /// How a device is reached when it is not connected.
    pub enum PushKind {
        /// Web Push (RFC 8030 with VAPID, RFC 8292; aes128gcm payloads, RFC 8291).
        WebPush => "web_push",
        /// A plain HTTP endpoint (UnifiedPush, e.g. a self-hosted ntfy).
        UnifiedPush => "unified_push",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spelling_round_trips() {
        for s in TaskState::ALL {
            assert_eq!(s.as_str().parse::<TaskState>().unwrap(), *s);
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
        for s in EffectStatus::ALL {
            assert_eq!(s.as_str().parse::<EffectStatus>().unwrap(), *s);
        }
        assert!("deployed".parse::<EffectStatus>().is_err());
    }

    #[test]
    fn terminal_effects_never_move() {
        for from in EffectStatus::ALL.iter().filter(|s| s.is_terminal()) {
            for to in EffectStatus::ALL {
                assert!(!from.can_become(*to), "{from} -> {to}");
            }
        }
    }

    #[test]
    fn unknown_is_left_only_by_a_report() {
        assert!(EffectStatus::Unknown.can_become(EffectStatus::Confirmed));
        assert!(!EffectStatus::Unknown.can_become(EffectStatus::Intended));
        assert!(!EffectStatus::Unknown.can_become(EffectStatus::Compensated));
    }
}
