//! Signed steer commands (SPEC §5): the ledger that applies a command id once, compare-and-set
//! on the plan revision, and what each operation changes — pause, resume, cancel, replan,
//! take-over, and the answers to decisions bound to their digest and revision.

use chrono::Utc;
use serde_json::{Value, json};
use waymark_proto::*;
use waymark_store::*;

use crate::Context;
use crate::convert;
use crate::core::{Tx, emit, record_refusal};
use crate::decisions::{
    amend_effect, approval_grants, checked_edit, close_decision, defer_to_runtime,
    pending_decision_named,
};
use crate::devices::{
    Rejection, Verified, has_scope, reject, required_scope, result, verify_envelope,
};
use crate::error::{ApiError, ApiResult};
use crate::tasks::validate_plan;
use crate::{delegations, deliveries, machines, rules};

/// Verifies and applies a signed command, once: the ledger answers a repeat `duplicate` with
/// the first result. Refusals and conflicts are audited; the result says which.
pub async fn submit(st: &Context, env: &SignedEnvelope) -> ApiResult<CommandResult> {
    let command_id = env
        .command
        .get("command_id")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let task_hint = env
        .command
        .get("task_id")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let v = match verify_envelope(st, env).await {
        Ok(v) => v,
        Err(r) => {
            // Not recorded in the ledger: an unverified sender must not squat a command id.
            record_refusal(
                st,
                &format!("device:{}", env.signature.key_id),
                "command.submit",
                task_hint.as_deref(),
                r.reason.as_str(),
                &r.detail,
            )
            .await;
            let mut res = result(CommandStatus::Rejected, &command_id, r.detail);
            res.reason = Some(r.reason);
            res.task_id = task_hint;
            return Ok(res);
        }
    };
    // The device's own bucket is charged only once its signature verified: an unverified
    // `key_id` names nobody, and charging it would let anyone drain a real device's bucket
    // (or grow the limiter with made-up keys). Unverified callers meet the address limit.
    st.rate_limit(&format!("device:{}", v.device.id))?;
    let res = apply(st, env, v).await?;
    if res.status == CommandStatus::Rejected || res.status == CommandStatus::Conflict {
        let code = res.reason.map_or("conflict", RejectReason::as_str);
        record_refusal(
            st,
            &format!("device:{}", env.signature.key_id),
            "command.submit",
            res.task_id.as_deref(),
            code,
            &res.detail,
        )
        .await;
    }
    Ok(res)
}

/// Applies a verified command in one transaction: ledger row, task change, control command
/// and event commit together or not at all.
pub async fn apply(st: &Context, env: &SignedEnvelope, v: Verified) -> ApiResult<CommandResult> {
    // A new plan is checked before the write transaction opens: however large, it never
    // holds up anyone else's write.
    let plan = new_plan(&v.command);
    let mut tx = Tx::write(st).await?;
    let cmd = &v.command;
    if let Some(prev) = tx.command(&cmd.command_id).await? {
        if prev.body_digest == v.body_digest {
            let original: CommandResult = serde_json::from_value(prev.result)
                .unwrap_or_else(|_| result(CommandStatus::Rejected, &cmd.command_id, "unreadable"));
            let mut res = result(
                CommandStatus::Duplicate,
                &cmd.command_id,
                "this command was delivered before; it was applied once",
            );
            res.task_id = original.task_id.clone();
            res.operation = original.operation;
            res.original = Some(Box::new(original));
            return Ok(res);
        }
        let mut res = result(
            CommandStatus::Rejected,
            &cmd.command_id,
            "this command id was used before with a different body; sign a new command",
        );
        res.reason = Some(RejectReason::CommandIdReused);
        res.task_id = cmd.task_id.clone();
        return Ok(res);
    }
    let mut res = result(CommandStatus::Applied, &cmd.command_id, "");
    res.operation = Some(cmd.operation);
    res.task_id = cmd.task_id.clone();
    res.based_on_revision = cmd.expected_plan_revision;
    let outcome = decide(&mut tx, &v, plan, &mut res).await?;
    match outcome {
        Ok(()) => {}
        Err(r) => {
            res.status = CommandStatus::Rejected;
            res.reason = Some(r.reason);
            res.detail = r.detail;
        }
    }
    let task = match &cmd.task_id {
        Some(id) => match tx.task(id).await? {
            Some(t) if steers(&mut tx, &t, &v.user.id).await?.is_some() => Some(t),
            _ => None,
        },
        None => None,
    };
    if let Some(task) = task {
        res.plan_revision = Some(task.plan_revision);
        res.task_state = Some(task.state);
        if res.status == CommandStatus::Applied {
            emit(&mut tx, &task, EventKind::CommandApplied, &res).await?;
            let wire = crate::core::task_wire(&mut tx, &task).await?;
            res.cursor = Some(emit(&mut tx, &task, EventKind::TaskUpdated, wire).await?);
        }
    }
    let now = tx.now;
    tx.insert_command(&CommandRow {
        command_id: cmd.command_id.clone(),
        task_id: cmd.task_id.clone(),
        device_id: v.device.id.clone(),
        body_digest: v.body_digest.clone(),
        operation: cmd.operation,
        envelope: serde_json::to_value(env).unwrap_or_default(),
        status: res.status,
        result: serde_json::to_value(&res).unwrap_or_default(),
        created_at: now,
    })
    .await?;
    // Staged before the commit, marked after it: a stream woken by the commit waits for the
    // mark, and a failed commit (or a request gone first) marks them aborted.
    let staged = st.handoffs.stage(
        cmd.task_id.as_deref().unwrap_or_default(),
        std::mem::take(&mut tx.controls),
    );
    tx.commit().await?;
    staged.committed();
    Ok(res)
}

/// How a user stands to a task they steer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Its owner: every operation.
    Owner,
    /// The owner delegated their decisions to this user, who accepted: answers only.
    Delegate,
}

/// Whether `user_id` may steer `task`, and as whom; `None`: not at all. The delegation is read
/// in the command's own transaction, so one ended before it is refused.
async fn steers(tx: &mut Tx, task: &TaskRow, user_id: &str) -> ApiResult<Option<Role>> {
    if task.owner_id == user_id {
        return Ok(Some(Role::Owner));
    }
    Ok(delegations::delegated(tx, &task.owner_id, user_id)
        .await?
        .then_some(Role::Delegate))
}

/// The operations a delegate may sign: answers to a decision.
fn answers_a_decision(op: Operation) -> bool {
    matches!(
        op,
        Operation::Approve
            | Operation::Deny
            | Operation::AnswerQuestion
            | Operation::ChooseOption
            | Operation::Defer
    )
}

/// The plan a replan brings (`args.plan`), parsed and validated; `None` when it brings none.
fn new_plan(cmd: &SteerCommand) -> Option<Result<Vec<PlanStep>, Rejection>> {
    if !matches!(
        cmd.operation,
        Operation::Replan | Operation::SuspendAndReplan
    ) {
        return None;
    }
    let plan = cmd.args.get("plan")?;
    Some(
        serde_json::from_value::<Vec<PlanStep>>(plan.clone())
            .map_err(|e| reject(RejectReason::InvalidCommand, format!("`args.plan`: {e}")))
            .and_then(|steps| match validate_plan(&steps) {
                Ok(()) => Ok(steps),
                Err(e) => Err(reject(
                    RejectReason::InvalidCommand,
                    e.problem.detail.clone(),
                )),
            }),
    )
}

/// Checks and applies one operation. Everything is checked before anything is written, so a
/// rejection leaves the task untouched. `plan` is what [`new_plan`] made of the command.
pub async fn decide(
    tx: &mut Tx,
    v: &Verified,
    plan: Option<Result<Vec<PlanStep>, Rejection>>,
    res: &mut CommandResult,
) -> ApiResult<Result<(), Rejection>> {
    let cmd = &v.command;
    if cmd.operation == Operation::OpenSession {
        return Ok(Err(reject(
            RejectReason::WrongOperation,
            "open a session with `POST /v1/devices/{device}/session`",
        )));
    }
    if cmd.operation == Operation::StartRun {
        return Ok(match machines::start_run(tx, v).await? {
            Ok(detail) => {
                res.detail = detail;
                Ok(())
            }
            Err(r) => Err(r),
        });
    }
    if matches!(cmd.operation, Operation::AddRule | Operation::RevokeRule) {
        let out = if cmd.operation == Operation::AddRule {
            rules::add_rule(tx, v).await?
        } else {
            rules::revoke_rule(tx, v).await?
        };
        return Ok(out.map(|detail| res.detail = detail));
    }
    let Some(task_id) = &cmd.task_id else {
        return Ok(Err(reject(
            RejectReason::InvalidCommand,
            "`task_id` is required",
        )));
    };
    let found = tx.task(task_id).await?;
    let role = match &found {
        Some(t) => steers(tx, t, &v.user.id).await?,
        None => None,
    };
    let (Some(mut task), Some(role)) = (found, role) else {
        return Ok(Err(reject(
            RejectReason::NotYourTask,
            format!("no task `{task_id}` of user `{}`", v.user.name),
        )));
    };
    if role == Role::Delegate && !answers_a_decision(cmd.operation) {
        return Ok(Err(reject(
            RejectReason::NotYourTask,
            format!(
                "`{}` stays with the task's owner; a delegate answers its decisions (approve, deny, answer, choose an option)",
                cmd.operation
            ),
        )));
    }
    let scope = required_scope(cmd.operation);
    if !has_scope(&v.device, scope) {
        return Ok(Err(reject(
            RejectReason::MissingScope,
            format!(
                "`{}` needs the `{scope}` scope; pair with it",
                cmd.operation
            ),
        )));
    }
    let state: TaskState = task.state;
    if state.is_terminal() {
        return Ok(Err(reject(
            RejectReason::TaskTerminal,
            format!("the task is {state}"),
        )));
    }
    // Compare-and-set on the plan revision. Pause is the exception: stopping is always safe.
    if cmd.operation != Operation::Pause {
        let Some(expected) = cmd.expected_plan_revision else {
            return Ok(Err(reject(
                RejectReason::InvalidCommand,
                "`expected_plan_revision` is required",
            )));
        };
        if expected != task.plan_revision {
            res.status = CommandStatus::Conflict;
            res.detail = format!(
                "the plan moved on: you decided at revision {expected}, it is now at revision {}; review and decide again",
                task.plan_revision
            );
            return Ok(Ok(()));
        }
    }
    let now = tx.now;
    let by = format!("user:{}", v.user.name);
    let mut control: Option<Value> = None;
    match cmd.operation {
        Operation::Pause => {
            task.state = TaskState::Paused;
            control = Some(json!({}));
            res.detail = match cmd.expected_plan_revision {
                Some(e) if e != task.plan_revision => format!(
                    "paused; you decided at revision {e} and met revision {} — pause applies regardless",
                    task.plan_revision
                ),
                _ => "paused: no new step starts; nothing is rolled back".into(),
            };
        }
        Operation::Resume => {
            if state != TaskState::Paused {
                return Ok(Err(reject(
                    RejectReason::InvalidState,
                    format!("the task is {state}, not paused"),
                )));
            }
            task.state = resumed_state(tx, &task).await?;
            control = Some(json!({}));
            res.detail = "resumed".into();
            // A runner's run that stopped at the pause goes on in its session.
            if machines::after_resume(tx, &task, &v.user.name).await? {
                res.detail = "resumed: its machine's runner resumes the session".into();
            }
        }
        Operation::Cancel => {
            task.state = TaskState::Cancelled;
            task.outcome_summary = Some(format!("cancelled by {by}"));
            revoke_attempts(tx, &task, now).await?;
            let mut flagged = Vec::new();
            for mut e in tx.list_effects(&task.id).await? {
                let s: EffectStatus = e.status;
                if !s.is_terminal() && s != EffectStatus::FailedCompensable {
                    e.flag =
                        Some("cancelled while under way: reconcile before anything else".into());
                    e.updated_at = now;
                    tx.update_effect(&e).await?;
                    emit(tx, &task, EventKind::EffectUpdated, convert::effect(&e)).await?;
                    flagged.push(e.id.clone());
                }
            }
            void_decisions(tx, &task.id, false, &by).await?;
            machines::queue_stop(tx, &task).await?;
            control = Some(json!({"effects_to_reconcile": flagged}));
            res.detail = if flagged.is_empty() {
                "cancelled: the lease is revoked and the worker told to stop".into()
            } else {
                format!(
                    "cancelled: the lease is revoked; {} effect(s) under way are flagged for reconciliation",
                    flagged.len()
                )
            };
        }
        Operation::Replan | Operation::SuspendAndReplan => {
            match plan {
                Some(Ok(steps)) => task.plan = steps,
                Some(Err(r)) => return Ok(Err(r)),
                None => {}
            }
            let instructions = cmd
                .args
                .get("instructions")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            task.plan_revision += 1;
            for mut e in tx.list_effects(&task.id).await? {
                if e.status == EffectStatus::Intended && e.flag.is_none() {
                    e.flag = Some(format!(
                        "superseded by plan revision {}: declare it again under the new plan",
                        task.plan_revision
                    ));
                    e.updated_at = now;
                    tx.update_effect(&e).await?;
                    emit(tx, &task, EventKind::EffectUpdated, convert::effect(&e)).await?;
                }
            }
            let voided = void_decisions(tx, &task.id, true, &by).await?;
            if matches!(state, TaskState::WaitingApproval | TaskState::WaitingHuman)
                && tx.pending_decision_count(&task.id).await? == 0
            {
                task.state = TaskState::Running;
            }
            control =
                Some(json!({"instructions": instructions, "scope": cmd.scope, "plan": task.plan}));
            res.detail = format!(
                "plan revision {} with new instructions; {voided} pending approval(s) void",
                task.plan_revision
            );
        }
        Operation::Approve
        | Operation::Deny
        | Operation::AnswerQuestion
        | Operation::ChooseOption => {
            let out = answer(tx, &task, cmd, &by, now).await?;
            if let Err(r) = out {
                return Ok(Err(r));
            }
            res.detail = "answered".into();
            // close_decision may have moved the task back to running.
            task = tx.task(&task.id).await?.unwrap_or(task);
        }
        Operation::Defer => match defer_to_runtime(tx, &task, cmd, now).await? {
            Ok(detail) => res.detail = detail,
            Err(r) => return Ok(Err(r)),
        },
        Operation::TakeOver => {
            revoke_attempts(tx, &task, now).await?;
            task.state = TaskState::Paused;
            control = Some(json!({"new_owner": by}));
            res.detail = format!("{by} holds control; the agent's attempt is fenced off");
        }
        Operation::OpenSession
        | Operation::StartRun
        | Operation::AddRule
        | Operation::RevokeRule => unreachable!("handled above"),
    }
    task.updated_at = now;
    tx.update_task(&task).await?;
    if let Some(args) = control {
        let mut row = ControlRow {
            command_id: cmd.command_id.clone(),
            task_id: task.id.clone(),
            operation: cmd.operation,
            args,
            plan_revision: task.plan_revision,
            applied_at: now,
            acknowledged_at: None,
            acknowledged_by: None,
            seq: 0,
        };
        row.seq = tx.insert_control(&row).await?;
        let command = convert::control(&row);
        tx.controls.push(command);
    }
    Ok(Ok(()))
}

/// Where a resumed task goes: back to waiting if decisions are open, running if a worker
/// holds a live lease, else queued for one.
pub async fn resumed_state(tx: &mut Tx, task: &TaskRow) -> ApiResult<TaskState> {
    let decisions = tx.list_decisions(&task.id).await?;
    let pending: Vec<_> = decisions
        .iter()
        .filter(|d| d.status == DecisionStatus::Pending)
        .collect();
    if pending.iter().any(|d| d.kind == DecisionKind::Approval) {
        return Ok(TaskState::WaitingApproval);
    }
    if !pending.is_empty() {
        return Ok(TaskState::WaitingHuman);
    }
    let now = tx.now;
    let live = tx
        .list_attempts(&task.id)
        .await?
        .iter()
        .any(|a| a.state == AttemptState::Active && a.expires_at > now);
    Ok(if live {
        TaskState::Running
    } else {
        TaskState::Queued
    })
}

pub async fn revoke_attempts(tx: &mut Tx, task: &TaskRow, now: i64) -> ApiResult<()> {
    for mut a in tx.list_attempts(&task.id).await? {
        if a.state == AttemptState::Active {
            a.state = AttemptState::Revoked;
            a.ended_at = Some(now);
            tx.update_attempt(&a).await?;
            emit(tx, task, EventKind::AttemptEnded, convert::attempt(&a)).await?;
        }
    }
    Ok(())
}

/// Voids pending decisions (only approvals when `approvals_only`). Returns how many.
pub async fn void_decisions(
    tx: &mut Tx,
    task_id: &str,
    approvals_only: bool,
    by: &str,
) -> ApiResult<usize> {
    let mut n = 0;
    for mut d in tx.list_decisions(task_id).await? {
        if d.status != DecisionStatus::Pending
            || (approvals_only && d.kind != DecisionKind::Approval)
        {
            continue;
        }
        let text = if approvals_only {
            "void: the plan was revised; the agent must ask again"
        } else {
            "void: the task was cancelled"
        };
        let outcome = DecisionOutcome {
            option: None,
            text: Some(text.into()),
            by: by.to_owned(),
            at: tx.now_utc(),
            edited_intent: None,
            edited_intent_digest: None,
            answers: None,
            rule: None,
        };
        close_decision(tx, &mut d, DecisionStatus::Void, outcome).await?;
        n += 1;
    }
    Ok(n)
}

/// approve / deny / answer_question / choose_option: bound to the decision id, and for
/// approvals to the intent digest and the plan revision.
pub async fn answer(
    tx: &mut Tx,
    task: &TaskRow,
    cmd: &SteerCommand,
    by: &str,
    now: i64,
) -> ApiResult<Result<(), Rejection>> {
    let mut d = match pending_decision_named(tx, task, cmd).await? {
        Ok(d) => d,
        Err(r) => return Ok(Err(r)),
    };
    if d.expires_at <= now {
        return Ok(Err(reject(
            RejectReason::ApprovalExpired,
            "the decision expired; its default applies",
        )));
    }
    let is_approval = d.kind == DecisionKind::Approval;
    let mut edit = None;
    let mut answers = None;
    let form = convert::form_of(&d)?;
    let (option, text) = match cmd.operation {
        Operation::AnswerQuestion if form.is_some() => {
            let form = form.as_ref().expect("checked");
            match form_answers(&d, form, &cmd.args) {
                Ok(a) => {
                    let text = form.summary(&a);
                    answers = Some(a);
                    (None, Some(text))
                }
                Err((reason, why)) => return Ok(Err(reject(reason, why))),
            }
        }
        Operation::ChooseOption if form.is_some() => {
            return Ok(Err(reject(
                RejectReason::WrongOperation,
                "this question is a form: answer it with `answer_question` and `args.answers`",
            )));
        }
        Operation::Approve | Operation::Deny => {
            if !is_approval {
                return Ok(Err(reject(
                    RejectReason::WrongOperation,
                    "approve and deny answer approvals; use `choose_option` or `answer_question`",
                )));
            }
            if d.plan_revision != task.plan_revision {
                return Ok(Err(reject(
                    RejectReason::ApprovalSuperseded,
                    format!(
                        "the approval was asked at plan revision {}, the plan is at {}; the agent must ask again",
                        d.plan_revision, task.plan_revision
                    ),
                )));
            }
            let given = cmd.args.get("intent_digest").and_then(Value::as_str);
            if given != d.intent_digest.as_deref() {
                return Ok(Err(reject(
                    RejectReason::DigestMismatch,
                    "the intent digest you approved is not the one the agent asked about",
                )));
            }
            let grant = cmd.operation == Operation::Approve;
            // A runtime's own choice (`approve_session`, `deny_always`) rides on approve/deny,
            // so it stays bound to the digest and the revision like the plain answer.
            let opt = match cmd.args.get("option").and_then(Value::as_str) {
                None => if grant { "approve" } else { "deny" }.to_owned(),
                Some(o) => {
                    if !d.options.iter().any(|x| x.id == o) || approval_grants(o) != Some(grant) {
                        return Ok(Err(reject(
                            RejectReason::InvalidCommand,
                            format!(
                                "`{o}` is not a{} option of this approval",
                                if grant { " granting" } else { " refusing" }
                            ),
                        )));
                    }
                    o.to_owned()
                }
            };
            if let Some(e) = cmd.args.get("edited_intent") {
                if !grant {
                    return Ok(Err(reject(
                        RejectReason::InvalidCommand,
                        "an edited intent goes with `approve`; a denial runs nothing",
                    )));
                }
                let signed = cmd.args.get("edited_intent_digest").and_then(Value::as_str);
                match checked_edit(&d, e, signed) {
                    Ok(x) => edit = x,
                    Err((reason, why)) => return Ok(Err(reject(reason, why))),
                }
            }
            (
                Some(opt),
                cmd.args
                    .get("text")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
            )
        }
        Operation::ChooseOption => {
            if is_approval {
                return Ok(Err(reject(
                    RejectReason::WrongOperation,
                    "answer approvals with `approve` or `deny`",
                )));
            }
            let Some(opt) = cmd.args.get("option").and_then(Value::as_str) else {
                return Ok(Err(reject(
                    RejectReason::InvalidCommand,
                    "`args.option` is required",
                )));
            };
            if !d.options.iter().any(|o| o.id == opt) {
                return Ok(Err(reject(
                    RejectReason::InvalidCommand,
                    format!("`{opt}` is not an option of this decision"),
                )));
            }
            (Some(opt.to_owned()), None)
        }
        _ => {
            if is_approval {
                return Ok(Err(reject(
                    RejectReason::WrongOperation,
                    "answer approvals with `approve` or `deny`",
                )));
            }
            let Some(text) = cmd
                .args
                .get("text")
                .and_then(Value::as_str)
                .filter(|t| !t.trim().is_empty())
            else {
                return Ok(Err(reject(
                    RejectReason::InvalidCommand,
                    "`args.text` is required",
                )));
            };
            (
                cmd.args
                    .get("option")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                Some(text.to_owned()),
            )
        }
    };
    let outcome = DecisionOutcome {
        option,
        text,
        by: by.to_owned(),
        at: tx.now_utc(),
        edited_intent: edit.as_ref().map(|(e, _)| e.clone()),
        edited_intent_digest: edit.as_ref().map(|(_, x)| x.clone()),
        answers,
        rule: None,
    };
    if let Some((edited, digest)) = &edit {
        amend_effect(tx, task, &d, edited, digest).await?;
    }
    close_decision(tx, &mut d, DecisionStatus::Resolved, outcome).await?;
    if let Some(device) = tx.device(&cmd.device_id).await? {
        deliveries::record(tx, task, &d, &device, DeliveryStep::Answered, None).await?;
    }
    // A runner's run goes on by itself: a deferred approval's runtime is resumed with the
    // answer, and once the last recovery card is answered the run is revived.
    if d.durability == Some(ApprovalDurability::Durable) {
        machines::after_durable_answer(tx, &task.id).await?;
    } else if d.kind == DecisionKind::Recovery {
        machines::after_recovery_answer(tx, &task.id).await?;
    }
    Ok(Ok(()))
}

/// A form question's answers from a signed command: bound to the form's digest (the questions
/// and choices the person was shown), and checked against the form.
pub fn form_answers(
    d: &DecisionRow,
    form: &QuestionForm,
    args: &Value,
) -> Result<std::collections::BTreeMap<String, FormAnswer>, (RejectReason, String)> {
    let given = args.get("intent_digest").and_then(Value::as_str);
    if given.is_none() || given != d.intent_digest.as_deref() {
        return Err((
            RejectReason::DigestMismatch,
            "`args.intent_digest` must be the digest of the questions you were shown (the decision's `intent_digest`)".into(),
        ));
    }
    let Some(raw) = args.get("answers") else {
        return Err((
            RejectReason::InvalidCommand,
            "`args.answers` is required: each question's id with `chosen` labels and/or `text`"
                .into(),
        ));
    };
    let answers: std::collections::BTreeMap<String, FormAnswer> =
        serde_json::from_value(raw.clone()).map_err(|e| {
            (
                RejectReason::InvalidCommand,
                format!("`args.answers` is not a map of answers: {e}"),
            )
        })?;
    form.check_answers(&answers)
        .map_err(|e| (RejectReason::InvalidCommand, e))?;
    Ok(answers)
}

/// A ledger entry as the admin sees it: the signed envelope is the evidence.
#[derive(Debug, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct LedgerEntry {
    command_id: String,
    device_id: String,
    operation: Operation,
    status: CommandStatus,
    envelope: SignedEnvelope,
    result: CommandResult,
    at: chrono::DateTime<Utc>,
}

/// A task's command ledger, oldest first: the signed envelopes are the evidence.
pub async fn ledger(st: &Context, task_id: &str) -> ApiResult<Vec<LedgerEntry>> {
    let rows = Tx::read(st).await?.list_commands(task_id).await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        out.push(LedgerEntry {
            command_id: r.command_id,
            device_id: r.device_id,
            operation: r.operation,
            status: r.status,
            envelope: serde_json::from_value(r.envelope).map_err(|e| {
                ApiError::new(ErrorCode::Internal, format!("corrupt ledger entry: {e}"))
            })?,
            result: serde_json::from_value(r.result).map_err(|e| {
                ApiError::new(ErrorCode::Internal, format!("corrupt ledger entry: {e}"))
            })?,
            at: convert::dt(r.created_at),
        });
    }
    Ok(out)
}
