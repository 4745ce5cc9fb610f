//! Decisions and approvals: opened bound to an intent digest and a plan revision, closed once
//! (answered, expired to their default, voided), and — for approvals a runtime holds — the
//! runtime's own delivery and expiry.

use serde_json::{Value, json};
use waymark_proto::*;
use waymark_store::*;

use crate::Context;
use crate::caller::{Caller, CallerKind};
use crate::convert;
use crate::core::{
    Made, Tx, audited, check_intent, check_text, created, emit, emit_task, field_digest, invalid,
    refuse_terminal, task_for, to_value,
};
use crate::devices::{Rejection, reject};
use crate::error::{ApiError, ApiResult};
use crate::fences::optional_fence;
use crate::{escalation, rules};

/// How long after a runtime's own deadline its adapter has to report what the runtime did
/// before the expiry sweep closes the approval as the runtime would have.
pub const RUNTIME_REPORT_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// When a decision asked at `now` for `seconds` (the default when none) expires, or why it may
/// not wait that long.
pub fn expiry_ms(st: &Context, now: i64, seconds: Option<u64>) -> ApiResult<i64> {
    let c = &st.config;
    let want = seconds
        .map(std::time::Duration::from_secs)
        .unwrap_or(c.decision_expiry_default);
    if want.is_zero() || want > c.decision_expiry_max {
        return Err(invalid(format!(
            "`expires_in_seconds` must be between 1 and {}",
            c.decision_expiry_max.as_secs()
        )));
    }
    Ok(now + want.as_millis() as i64)
}

/// Moves a task into a waiting state when a decision opens.
pub fn wait_state(task: &mut TaskRow, waiting: TaskState) -> ApiResult<()> {
    let state: TaskState = task.state;
    if matches!(
        state,
        TaskState::Queued
            | TaskState::Running
            | TaskState::Verifying
            | TaskState::WaitingHuman
            | TaskState::WaitingApproval
    ) {
        task.state = waiting;
    }
    Ok(())
}

pub async fn open_decision(
    tx: &mut Tx,
    mut task: TaskRow,
    mut row: DecisionRow,
) -> ApiResult<Made<Decision>> {
    escalation::start(tx, &task.owner_id, &mut row).await?;
    tx.insert_decision(&row).await?;
    let waiting = if row.kind == DecisionKind::Approval {
        TaskState::WaitingApproval
    } else {
        TaskState::WaitingHuman
    };
    wait_state(&mut task, waiting)?;
    task.updated_at = tx.now;
    tx.update_task(&task).await?;
    let wire = convert::decision(&row)?;
    let cursor = emit(tx, &task, EventKind::DecisionRequested, &wire).await?;
    let cursor = cursor.max(emit_task(tx, &task, EventKind::TaskUpdated).await?);
    Ok(created(cursor, wire))
}

/// An approval's options: `approve` and `deny`, or a runtime's own choices, which must keep
/// both and name the others `approve_…` (they grant) or `deny_…` (they refuse).
pub fn approval_options(given: &[DecisionOption]) -> ApiResult<Vec<DecisionOption>> {
    if given.is_empty() {
        return Ok(vec![
            DecisionOption {
                id: "approve".into(),
                label: "Approve".into(),
                gives_up: String::new(),
                cost: None,
            },
            DecisionOption {
                id: "deny".into(),
                label: "Deny".into(),
                gives_up: "the step does not run; the agent reports instead".into(),
                cost: None,
            },
        ]);
    }
    let mut seen = std::collections::HashSet::new();
    for o in given {
        check_text("options[].id", &o.id, 64, true)?;
        check_text("options[].label", &o.label, 500, true)?;
        if !seen.insert(o.id.as_str()) {
            return Err(invalid(format!("option `{}` appears twice", o.id)));
        }
        if approval_grants(&o.id).is_none() {
            return Err(invalid(format!(
                "approval option `{}` must be `approve`, `deny`, `approve_…` or `deny_…`",
                o.id
            )));
        }
    }
    if !seen.contains("approve") || !seen.contains("deny") {
        return Err(invalid(
            "an approval's options must include `approve` and `deny`",
        ));
    }
    Ok(given.to_vec())
}

/// Whether an approval option grants (`approve`, `approve_…`) or refuses (`deny`, `deny_…`):
/// [`waymark_proto::option_grants`].
pub fn approval_grants(option: &str) -> Option<bool> {
    waymark_proto::option_grants(option)
}

/// An approval's intent as a person edited it before approving, checked: the runtime takes a
/// changed intent (`editable`), only that part changed (and kept its JSON type), and the digest
/// the person signed is the edited intent's. `Ok(None)`: the edit changed nothing.
pub fn checked_edit(
    d: &DecisionRow,
    edited: &Value,
    signed_digest: Option<&str>,
) -> Result<Option<(Value, String)>, (RejectReason, String)> {
    let bad = |why: String| Err((RejectReason::InvalidCommand, why));
    let (Some(pointer), Some(original)) = (d.editable.as_deref(), d.intent.as_ref()) else {
        return bad(
            "this runtime takes the intent only as asked: approve or deny it, or deny with a note"
                .into(),
        );
    };
    let Some(part) = edited.pointer(pointer) else {
        return bad(format!("`args.edited_intent` has nothing at `{pointer}`"));
    };
    let was = original.pointer(pointer).unwrap_or(&Value::Null);
    if std::mem::discriminant(part) != std::mem::discriminant(was) {
        return bad(format!(
            "`args.edited_intent{pointer}` must stay a JSON {} like the one asked",
            json_type(was)
        ));
    }
    let mut rest = edited.clone();
    if let Some(slot) = rest.pointer_mut(pointer) {
        *slot = was.clone();
    }
    if rest != *original {
        return bad(format!(
            "only `{pointer}` of the intent may be edited; the rest must stay as asked"
        ));
    }
    let digest = match waymark_proto::digest::json_digest(edited) {
        Ok(x) => x,
        Err(e) => return bad(format!("`args.edited_intent`: {e}")),
    };
    if signed_digest != Some(digest.as_str()) {
        return Err((
            RejectReason::DigestMismatch,
            format!("`args.edited_intent_digest` must be the edited intent's digest ({digest})"),
        ));
    }
    if edited == original {
        return Ok(None);
    }
    Ok(Some((edited.clone(), digest)))
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Gives an approved edit to the effect the approval allows, while it has not started: the
/// effect then records what will run. The decision keeps the intent asked.
pub async fn amend_effect(
    tx: &mut Tx,
    task: &TaskRow,
    d: &DecisionRow,
    edited: &Value,
    digest: &str,
) -> ApiResult<()> {
    let Some(effect_id) = d.effect_id.as_deref() else {
        return Ok(());
    };
    let Some(mut effect) = tx.effect(effect_id).await? else {
        return Ok(());
    };
    if effect.status != EffectStatus::Intended {
        return Ok(());
    }
    effect.intent = edited.clone();
    effect.intent_digest = digest.to_owned();
    effect.updated_at = tx.now;
    tx.update_effect(&effect).await?;
    let wire = convert::effect(&effect);
    emit(tx, task, EventKind::EffectUpdated, &wire).await?;
    Ok(())
}

/// Closes a pending decision with an outcome, and lets the task run again when nothing else
/// waits. Returns the newest cursor written.
pub async fn close_decision(
    tx: &mut Tx,
    decision: &mut DecisionRow,
    status: DecisionStatus,
    outcome: DecisionOutcome,
) -> ApiResult<i64> {
    decision.status = status;
    if decision.durability.is_some() && status == DecisionStatus::Resolved {
        // Answered here; it counts once the runtime's adapter reports the runtime took it.
        decision.delivery = Some(Delivery {
            state: DeliveryState::Pending,
            detail: None,
            at: outcome.at,
        });
    }
    decision.outcome = Some(outcome.clone());
    tx.update_decision(decision).await?;
    let mut task = tx
        .task(&decision.task_id)
        .await?
        .ok_or_else(|| ApiError::new(ErrorCode::Internal, "decision without task"))?;
    let wire = convert::decision(decision)?;
    let mut cursor = emit(tx, &task, EventKind::DecisionClosed, &wire).await?;
    if decision.kind == DecisionKind::Recovery && status == DecisionStatus::Resolved {
        return Ok(cursor.max(after_recovery_decision(tx, decision, &outcome).await?));
    }
    let waiting = matches!(
        task.state,
        TaskState::WaitingApproval | TaskState::WaitingHuman
    );
    if waiting && tx.pending_decision_count(&task.id).await? == 0 {
        task.state = TaskState::Running;
        task.updated_at = tx.now;
        tx.update_task(&task).await?;
        cursor = emit_task(tx, &task, EventKind::TaskUpdated).await?;
    }
    Ok(cursor)
}

/// A decision of this task that a runtime holds (it has a durability class).
pub async fn runtime_decision(
    tx: &mut Tx,
    task: &TaskRow,
    decision_id: &str,
) -> ApiResult<DecisionRow> {
    let d = tx
        .decision(decision_id)
        .await?
        .filter(|d| d.task_id == task.id)
        .ok_or_else(|| ApiError::not_found("decision", decision_id))?;
    if d.durability.is_none() {
        return Err(invalid(format!(
            "decision `{}` is not held by a runtime (it was asked without `durability`)",
            d.id
        )));
    }
    Ok(d)
}

/// How long a deferred approval waits: the runtime waits across its own exit (Claude Code keeps
/// a deferred session for 30 days), so only a person's silence for a day closes it.
pub const DEFERRED_EXPIRY: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// The runtime's own deadline as recorded on a decision it holds, checked; `expires_at` is
/// moved to it (plus the grace for its adapter to report first): the runtime acts then
/// whatever we record, and the decision closes then — by its adapter, which saw what the
/// runtime did, or a little later by the sweep, the same way (`closed_by_runtime`).
fn runtime_deadline(
    st: &Context,
    r: &AskedRuntimeDeadline,
    can_wait: bool,
    now: i64,
    expires_at: &mut i64,
) -> ApiResult<RuntimeDeadline> {
    check_text("runtime_deadline.runtime", &r.runtime, 64, true)?;
    if r.in_seconds > st.config.decision_expiry_max.as_secs() {
        return Err(invalid(format!(
            "`runtime_deadline.in_seconds` must be at most {}",
            st.config.decision_expiry_max.as_secs()
        )));
    }
    let at = now + r.in_seconds as i64 * 1000;
    *expires_at = (*expires_at).min(at + RUNTIME_REPORT_GRACE.as_millis() as i64);
    Ok(RuntimeDeadline {
        runtime: r.runtime.clone(),
        at: chrono::DateTime::from_timestamp_millis(at).unwrap_or_default(),
        then: r.then,
        can_wait,
    })
}

/// Opens an approval bound to the intent digest and the plan revision. `can_wait`: the
/// runtime holding it can be asked to wait durably instead of deciding at its deadline (only
/// the adapter that holds it, which answers the runtime, says so; `defer_to_runtime`).
pub async fn request_approval(
    st: &Context,
    caller: &Caller,
    task_id: String,
    req: RequestApproval,
    can_wait: bool,
) -> ApiResult<Made<Decision>> {
    check_text("summary", &req.summary, 2000, true)?;
    check_intent(&req.intent)?;
    let digest = field_digest("intent", &req.intent)?;
    if let Some(given) = &req.intent_digest
        && *given != digest
    {
        return Err(invalid(format!(
            "`intent_digest` {given} does not match the intent's canonical JSON ({digest})"
        ))
        .with("expected", &digest));
    }
    let mut default = req.default_option.clone().unwrap_or_else(|| "deny".into());
    if default != "approve" && default != "deny" {
        return Err(invalid(
            "`default_option` of an approval is `approve` or `deny`",
        ));
    }
    // The server's policy decides too: a worker can make an approval risky, never less.
    let by_policy = st.config.risk.matches(&req.intent).map(str::to_owned);
    let risky = req.risky || by_policy.is_some();
    if let Some(pattern) = &by_policy {
        tracing::info!(task = %task_id, %pattern, "an approval is risky by the server's policy");
        // Nobody answering must never run it, whatever the worker asked for.
        default = "deny".into();
    }
    if req.risky && default == "approve" {
        return Err(invalid(
            "a risky approval may not default to `approve`: nobody answering must never run it",
        ));
    }
    let options = approval_options(&req.options)?;
    let now = st.now_ms();
    let mut expires_at = expiry_ms(st, now, req.expires_in_seconds)?;
    let runtime_deadline = req
        .runtime_deadline
        .as_ref()
        .map(|r| runtime_deadline(st, r, can_wait, now, &mut expires_at))
        .transpose()?;
    if let Some(p) = &req.editable
        && (!p.starts_with('/') || p.len() > 200 || req.intent.pointer(p).is_none())
    {
        return Err(invalid(format!(
            "`editable` `{p}` must be a JSON pointer (RFC 6901) to a part of the intent, e.g. `/input`"
        )));
    }
    audited(st, caller, "approval.request", async {
        let mut tx = Tx::write(st).await?;
        let task = task_for(&mut tx, caller, &task_id).await?;
        refuse_terminal(&task)?;
        optional_fence(&mut tx, &task, &req.attempt_id, req.fence).await?;
        if let Some(e) = &req.effect_id
            && tx.effect(e).await?.is_none_or(|x| x.task_id != task.id)
        {
            return Err(invalid(format!(
                "`effect_id` `{e}` is not an effect of this task"
            )));
        }
        let row = DecisionRow {
            id: ids::decision(),
            task_id: task.id.clone(),
            kind: DecisionKind::Approval,
            status: DecisionStatus::Pending,
            step: req.step.clone(),
            question: req.summary.clone(),
            options,
            default_option: Some(default),
            intent: Some(req.intent.clone()),
            intent_digest: Some(digest),
            effect_id: req.effect_id.clone(),
            plan_revision: task.plan_revision,
            risky,
            expires_at,
            created_at: now,
            outcome: None,
            durability: req.durability,
            delivery: None,
            editable: req.editable.clone(),
            runtime_deadline,
            escalation: None,
            escalate_at: None,
        };
        // The owner's standing rules answer first; a ruled approval asks nobody.
        let ruled =
            rules::answer_by_rule(&mut tx, &task, &req.intent, req.cwd.as_deref(), risky).await?;
        let out = match ruled {
            Some(outcome) => open_ruled(&mut tx, &task, row, outcome).await?,
            None => open_decision(&mut tx, task, row).await?,
        };
        tx.commit().await?;
        Ok(out)
    })
    .await
}

/// Records an approval a standing rule answered as it opens: born closed with the rule's
/// outcome, so it is listed in the task but never waits, never escalates and is never pushed
/// (only `decision.closed` is written, which no notification follows). A runtime holding it
/// still has to take the answer (`delivery: pending`), as after any answer.
async fn open_ruled(
    tx: &mut Tx,
    task: &TaskRow,
    mut row: DecisionRow,
    outcome: DecisionOutcome,
) -> ApiResult<Made<Decision>> {
    row.status = DecisionStatus::Resolved;
    if row.durability.is_some() {
        row.delivery = Some(Delivery {
            state: DeliveryState::Pending,
            detail: None,
            at: outcome.at,
        });
    }
    row.outcome = Some(outcome);
    tx.insert_decision(&row).await?;
    let wire = convert::decision(&row)?;
    let cursor = emit(tx, task, EventKind::DecisionClosed, &wire).await?;
    Ok(created(cursor, wire))
}

/// Opens a question or a choice with its options and what each gives up.
pub async fn request_decision(
    st: &Context,
    caller: &Caller,
    task_id: String,
    req: RequestDecision,
) -> ApiResult<Made<Decision>> {
    request_decision_with(st, caller, task_id, req, Asked::default()).await
}

/// What a runtime's adapter adds to a question it brings to the inbox: what the runtime asked
/// in its own words (kept in the intent beside the form, so the answer is bound to both), the
/// tool call that asked, and how long the runtime waits.
#[derive(Debug, Default)]
pub struct Asked {
    /// The runtime's own request (`{runtime, tool, input}`).
    pub context: Option<Value>,
    /// The effect of the tool call that asks.
    pub effect_id: Option<String>,
    /// How the runtime holds it.
    pub durability: Option<ApprovalDurability>,
    /// When the runtime stops waiting, and what it does then.
    pub runtime_deadline: Option<AskedRuntimeDeadline>,
}

/// A form question's intent: the runtime's request with the form beside it; its digest binds
/// the answer to exactly the questions and choices shown.
fn form_intent(form: &QuestionForm, context: Option<&Value>) -> Value {
    let mut intent = match context {
        Some(Value::Object(m)) => Value::Object(m.clone()),
        _ => json!({}),
    };
    intent["form"] = to_value(form);
    intent
}

/// [`request_decision`], with what a runtime's adapter adds.
pub async fn request_decision_with(
    st: &Context,
    caller: &Caller,
    task_id: String,
    req: RequestDecision,
    asked: Asked,
) -> ApiResult<Made<Decision>> {
    check_text("question", &req.question, 4000, true)?;
    if req.kind == DecisionKind::Approval {
        return Err(invalid(
            "ask for approvals with `POST /v1/tasks/{task}/approvals`, which binds the intent digest",
        ));
    }
    let (intent, intent_digest) = match &req.form {
        Some(form) => {
            if req.kind != DecisionKind::Question {
                return Err(invalid("only a `question` takes a `form`"));
            }
            if !req.options.is_empty() || req.default_option.is_some() {
                return Err(invalid(
                    "a question with a `form` has no `options` or `default_option`: its choices are in the form, and nobody answering answers nothing",
                ));
            }
            form.check().map_err(invalid)?;
            let intent = form_intent(form, asked.context.as_ref());
            check_intent(&intent)?;
            let digest = field_digest("intent", &intent)?;
            (Some(intent), Some(digest))
        }
        None => (None, None),
    };
    let now = st.now_ms();
    let mut ids_seen = std::collections::HashSet::new();
    for o in &req.options {
        check_text("options[].id", &o.id, 64, true)?;
        check_text("options[].label", &o.label, 500, true)?;
        if !ids_seen.insert(o.id.as_str()) {
            return Err(invalid(format!("option `{}` appears twice", o.id)));
        }
    }
    if req.kind == DecisionKind::Budget && req.options.iter().any(|o| o.gives_up.trim().is_empty())
    {
        return Err(invalid(
            "every budget option must say what it gives up (`gives_up`)",
        ));
    }
    if let Some(d) = &req.default_option
        && !ids_seen.contains(d.as_str())
    {
        return Err(invalid(format!(
            "`default_option` `{d}` is not one of the options"
        )));
    }
    let mut expires_at = expiry_ms(st, now, req.expires_in_seconds)?;
    let runtime_deadline = asked
        .runtime_deadline
        .as_ref()
        .map(|r| runtime_deadline(st, r, false, now, &mut expires_at))
        .transpose()?;
    audited(st, caller, "decision.request", async {
        let mut tx = Tx::write(st).await?;
        let task = task_for(&mut tx, caller, &task_id).await?;
        refuse_terminal(&task)?;
        optional_fence(&mut tx, &task, &req.attempt_id, req.fence).await?;
        let row = DecisionRow {
            id: ids::decision(),
            task_id: task.id.clone(),
            kind: req.kind,
            status: DecisionStatus::Pending,
            step: req.step.clone(),
            question: req.question.clone(),
            options: req.options.clone(),
            default_option: req.default_option.clone(),
            intent: intent.clone(),
            intent_digest: intent_digest.clone(),
            effect_id: asked.effect_id.clone(),
            plan_revision: task.plan_revision,
            risky: false,
            expires_at,
            created_at: now,
            outcome: None,
            durability: asked.durability,
            delivery: None,
            editable: None,
            runtime_deadline: runtime_deadline.clone(),
            escalation: None,
            escalate_at: None,
        };
        let out = open_decision(&mut tx, task, row).await?;
        tx.commit().await?;
        Ok(out)
    })
    .await
}

/// Resolves a decision with the admin token (hosts without devices, the demo).
pub async fn admin_resolve(
    st: &Context,
    caller: &Caller,
    decision_id: String,
    req: ResolveDecision,
) -> ApiResult<Written<Decision>> {
    if caller.kind != CallerKind::Admin {
        return Err(ApiError::new(
            ErrorCode::Forbidden,
            "resolving decisions here needs the admin token",
        ));
    }
    audited(st, caller, "decision.resolve", async {
        let mut tx = Tx::write(st).await?;
        let mut d = tx
            .decision(&decision_id)
            .await?
            .ok_or_else(|| ApiError::not_found("decision", &decision_id))?;
        let task = task_for(&mut tx, caller, &d.task_id).await?;
        if d.status != DecisionStatus::Pending {
            return Err(ApiError::new(
                ErrorCode::DecisionClosed,
                format!("decision `{}` is {}", d.id, d.status),
            )
            .with("status", d.status)
            .on_task(&task.id));
        }
        if d.expires_at <= tx.now {
            return Err(ApiError::new(
                ErrorCode::DecisionClosed,
                format!("decision `{}` has expired", d.id),
            )
            .on_task(&task.id));
        }
        if d.kind == DecisionKind::Approval && d.plan_revision != task.plan_revision {
            return Err(ApiError::new(
                ErrorCode::RevisionConflict,
                format!(
                    "the approval was asked at plan revision {}, the plan is now at {}",
                    d.plan_revision, task.plan_revision
                ),
            )
            .with("current_revision", task.plan_revision)
            .on_task(&task.id));
        }
        match &req.option {
            Some(o) if !d.options.iter().any(|x| &x.id == o) => {
                return Err(invalid(format!("`{o}` is not an option of this decision")));
            }
            None if !d.options.is_empty() => {
                return Err(invalid("choose one of the decision's options"));
            }
            None if req.text.as_deref().is_none_or(|t| t.trim().is_empty()) => {
                return Err(invalid("answer with `text`"));
            }
            _ => {}
        }
        let outcome = DecisionOutcome {
            option: req.option.clone(),
            text: req.text.clone(),
            by: "admin".into(),
            at: tx.now_utc(),
            edited_intent: None,
            edited_intent_digest: None,
            answers: None,
            rule: None,
        };
        let cursor = close_decision(&mut tx, &mut d, DecisionStatus::Resolved, outcome).await?;
        tx.commit().await?;
        Ok(Written {
            cursor,
            value: convert::decision(&d)?,
        })
    })
    .await
}

/// Records that the runtime took (or lost) the answer to an approval it holds.
pub async fn report_delivery(
    st: &Context,
    caller: &Caller,
    task_id: String,
    decision_id: String,
    req: ReportDelivery,
) -> ApiResult<Written<Decision>> {
    if req.state == DeliveryState::Pending {
        return Err(invalid("report `acknowledged` or `lost`"));
    }
    if let Some(d) = &req.detail {
        check_text("detail", d, 2000, false)?;
    }
    audited(st, caller, "decision.delivery", async {
        let mut tx = Tx::write(st).await?;
        let task = task_for(&mut tx, caller, &task_id).await?;
        optional_fence(&mut tx, &task, &req.attempt_id, req.fence).await?;
        let mut d = runtime_decision(&mut tx, &task, &decision_id).await?;
        match d.delivery.as_ref().map(|c| c.state) {
            Some(DeliveryState::Pending) => {}
            Some(s) if s == req.state => {
                let cursor = tx.max_cursor().await?;
                return Ok(Written {
                    cursor,
                    value: convert::decision(&d)?,
                });
            }
            Some(s) => {
                return Err(ApiError::new(
                    ErrorCode::DecisionClosed,
                    format!("the runtime's delivery of this answer was already reported {s}"),
                )
                .on_task(&task.id));
            }
            None => {
                return Err(ApiError::new(
                    ErrorCode::DecisionClosed,
                    format!(
                        "decision `{}` is {}; only an answered approval has a delivery to report",
                        d.id, d.status
                    ),
                )
                .with("status", d.status)
                .on_task(&task.id));
            }
        }
        d.delivery = Some(Delivery {
            state: req.state,
            detail: req.detail.clone(),
            at: tx.now_utc(),
        });
        tx.update_decision(&d).await?;
        if req.state == DeliveryState::Acknowledged {
            tx.stage("taken", d.created_at);
        }
        let wire = convert::decision(&d)?;
        let cursor = emit(&mut tx, &task, EventKind::DecisionUpdated, &wire).await?;
        tx.commit().await?;
        Ok(Written {
            cursor,
            value: wire,
        })
    })
    .await
}

/// Closes an approval a runtime held and dropped (connection closed, hook timed out): expired with
/// no option, never approved.
pub async fn expire_held(
    st: &Context,
    caller: &Caller,
    task_id: String,
    decision_id: String,
    req: ExpireDecision,
) -> ApiResult<Written<Decision>> {
    check_text("reason", &req.reason, 2000, true)?;
    audited(st, caller, "decision.expire", async {
        let mut tx = Tx::write(st).await?;
        let task = task_for(&mut tx, caller, &task_id).await?;
        optional_fence(&mut tx, &task, &req.attempt_id, req.fence).await?;
        let mut d = runtime_decision(&mut tx, &task, &decision_id).await?;
        if d.status != DecisionStatus::Pending {
            return Err(ApiError::new(
                ErrorCode::DecisionClosed,
                format!("decision `{}` is {}", d.id, d.status),
            )
            .with("status", d.status)
            .on_task(&task.id));
        }
        // No option applies: the runtime decides on its own, and nothing is reported approved.
        let outcome = DecisionOutcome {
            option: None,
            text: Some(req.reason.clone()),
            by: "runtime".into(),
            at: tx.now_utc(),
            edited_intent: None,
            edited_intent_digest: None,
            answers: None,
            rule: None,
        };
        let cursor = close_decision(&mut tx, &mut d, DecisionStatus::Expired, outcome).await?;
        tx.commit().await?;
        Ok(Written {
            cursor,
            value: convert::decision(&d)?,
        })
    })
    .await
}

/// What a resolved recovery decision does: resume, pause for a replan, cancel, or settle an
/// effect whose outcome was unknown.
pub async fn after_recovery_decision(
    tx: &mut Tx,
    d: &DecisionRow,
    outcome: &DecisionOutcome,
) -> ApiResult<i64> {
    let Some(mut task) = tx.task(&d.task_id).await? else {
        return Ok(0);
    };
    let option = outcome.option.as_deref().unwrap_or("");
    let now = tx.now;
    if let Some(effect_id) = &d.effect_id
        && let Some(mut e) = tx.effect(effect_id).await?
    {
        match option {
            "mark_confirmed" => {
                e.status = EffectStatus::Confirmed;
                e.receipt = Some(json!({"confirmed_by": outcome.by, "note": outcome.text}));
                e.flag = None;
            }
            "mark_not_started" => {
                e.status = EffectStatus::Intended;
                e.flag = None;
            }
            _ => {}
        }
        e.updated_at = now;
        tx.update_effect(&e).await?;
        emit(tx, &task, EventKind::EffectUpdated, convert::effect(&e)).await?;
    }
    match option {
        "cancel" => {
            task.state = TaskState::Cancelled;
            task.outcome_summary = Some(format!("cancelled by {} during recovery", outcome.by));
        }
        "replan" => task.state = TaskState::Paused,
        _ if tx.pending_decision_count(&task.id).await? > 0 => {}
        _ => task.state = TaskState::RecoveryCandidate,
    }
    task.updated_at = now;
    tx.update_task(&task).await?;
    emit_task(tx, &task, EventKind::TaskUpdated).await
}

/// Why an approval a fail-open hook held was closed without an answer, whoever closed it
/// (the hook's own wait, or the expiry sweep): the same words either way. Only Claude Code's
/// hooks hold approvals this way.
pub const HOOK_TIMED_OUT: &str = "the hook's timeout came first; Claude Code decides without Waymark: `claude -p` denies the call, an interactive session asks in its own prompt";

/// How an approval whose deadline the runtime holds closes at its expiry: as the runtime
/// decided, never with our stated default, which would be a claim about what happened (and a
/// hook still holding it would pass it on as an answer). A fail-open hook (Claude Code) asks in
/// its own prompt — no option, the same close as the hook's own timeout, whichever comes
/// first; a runtime that denies (Hermes, OpenClaw) is said to have denied. Either way no option
/// is recorded, as when the runtime's adapter closes it (`expire`): nothing here chose one.
/// Returns the outcome's words; `None`: Waymark's expiry came first, and its default applies.
pub fn closed_by_runtime(d: &DecisionRow) -> Option<String> {
    let reached = d
        .runtime_deadline
        .as_ref()
        .filter(|r| r.at.timestamp_millis() <= d.expires_at);
    match reached {
        // First: the sweep and the hook's own wait race for the same instant (the hook holds
        // until the deadline it gave), and either must say the same.
        _ if d.durability == Some(ApprovalDurability::FailOpenHook) => Some(HOOK_TIMED_OUT.into()),
        Some(r) if r.then == RuntimeFallback::Denies => Some(format!(
            "{}'s own deadline came first: {} denied the call; nothing ran",
            r.runtime, r.runtime
        )),
        Some(r) => Some(format!(
            "{}'s own deadline came first: {} asks in its own prompt",
            r.runtime, r.runtime
        )),
        None => None,
    }
}

/// Applies the default of every pending decision whose expiry has passed. Returns how many.
/// One replica at a time sweeps; each decision closes in its own transaction, under its
/// task's lock, re-checked there — so a decision expires once even with several replicas,
/// and an answer that commits first wins.
pub async fn expire_due(st: &Context) -> ApiResult<usize> {
    let now = st.now_ms();
    let due = Tx::read(st).await?.due_decisions(now).await?;
    if due.is_empty() {
        return Ok(0);
    }
    let mut claim = Tx::read(st).await?;
    if !claim.try_claim("expire-decisions").await? {
        return Ok(0);
    }
    let mut n = 0;
    for d in due {
        if expire_overdue(st, &d.id).await? {
            n += 1;
        }
    }
    drop(claim);
    Ok(n)
}

/// Expires one decision if it is still pending and due. Returns whether it did.
pub async fn expire_overdue(st: &Context, id: &str) -> ApiResult<bool> {
    let mut tx = Tx::write(st).await?;
    let Some(task_id) = tx.decision(id).await?.map(|d| d.task_id) else {
        return Ok(false);
    };
    // Lock the task first (PostgreSQL: every task lock before the first event).
    tx.task(&task_id).await?;
    let Some(mut d) = tx.decision(id).await? else {
        return Ok(false);
    };
    if d.status != DecisionStatus::Pending || d.expires_at > tx.now {
        return Ok(false);
    }
    let outcome = match closed_by_runtime(&d) {
        Some(text) => DecisionOutcome {
            option: None,
            text: Some(text),
            by: "runtime".into(),
            at: tx.now_utc(),
            edited_intent: None,
            edited_intent_digest: None,
            answers: None,
            rule: None,
        },
        None => DecisionOutcome {
            option: d.default_option.clone(),
            text: None,
            by: "default".into(),
            at: tx.now_utc(),
            edited_intent: None,
            edited_intent_digest: None,
            answers: None,
            rule: None,
        },
    };
    close_decision(&mut tx, &mut d, DecisionStatus::Expired, outcome).await?;
    tx.commit().await?;
    Ok(true)
}

/// The pending decision of `task` a command names in `args.decision_id`, or why not.
pub async fn pending_decision_named(
    tx: &mut Tx,
    task: &TaskRow,
    cmd: &SteerCommand,
) -> ApiResult<Result<DecisionRow, Rejection>> {
    let Some(decision_id) = cmd.args.get("decision_id").and_then(Value::as_str) else {
        return Ok(Err(reject(
            RejectReason::InvalidCommand,
            "`args.decision_id` is required",
        )));
    };
    let Some(d) = tx
        .decision(decision_id)
        .await?
        .filter(|d| d.task_id == task.id)
    else {
        return Ok(Err(reject(
            RejectReason::InvalidCommand,
            format!("no decision `{decision_id}` on this task"),
        )));
    };
    if d.status != DecisionStatus::Pending {
        return Ok(Err(reject(
            RejectReason::DecisionClosed,
            format!("the decision is {}", d.status),
        )));
    }
    Ok(Ok(d))
}

/// `defer`: the person asks the runtime holding a pending approval to wait for the answer across
/// its own exit instead of deciding at its deadline — bound like `approve` to the decision's
/// intent digest (the revision is checked by the caller). The approval becomes `durable`, its
/// runtime deadline goes, and it expires only after `DEFERRED_EXPIRY`; the adapter holding it
/// (`claude_code::gate_tool`) sees the change and answers the runtime `defer`.
pub async fn defer_to_runtime(
    tx: &mut Tx,
    task: &TaskRow,
    cmd: &SteerCommand,
    now: i64,
) -> ApiResult<Result<String, Rejection>> {
    let mut d = match pending_decision_named(tx, task, cmd).await? {
        Ok(d) => d,
        Err(r) => return Ok(Err(r)),
    };
    if cmd.args.get("intent_digest").and_then(Value::as_str) != d.intent_digest.as_deref() {
        return Ok(Err(reject(
            RejectReason::DigestMismatch,
            "the intent digest you saw is not the one the agent asked about",
        )));
    }
    let Some(deadline) = d.runtime_deadline.clone().filter(|r| r.can_wait) else {
        return Ok(Err(reject(
            RejectReason::WrongOperation,
            "this approval's runtime cannot wait for the answer across its exit; approve or deny it",
        )));
    };
    if deadline.at.timestamp_millis() <= now || d.expires_at <= now {
        return Ok(Err(reject(
            RejectReason::ApprovalExpired,
            format!("{} has already decided on its own", deadline.runtime),
        )));
    }
    d.durability = Some(ApprovalDurability::Durable);
    d.runtime_deadline = None;
    d.expires_at = now + DEFERRED_EXPIRY.as_millis() as i64;
    tx.update_decision(&d).await?;
    emit(tx, task, EventKind::DecisionUpdated, convert::decision(&d)?).await?;
    Ok(Ok(format!(
        "{} waits for the answer: its run stops here; resume it once you decided",
        deadline.runtime
    )))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::fixtures::approval;

    fn editable() -> DecisionRow {
        let mut d = approval(json!({"tool": "Bash", "input": {"command": "rm -rf build"}}));
        d.editable = Some("/input/command".into());
        d
    }

    fn signed(v: &Value) -> String {
        waymark_proto::digest::json_digest(v).unwrap()
    }

    #[test]
    fn an_edit_of_the_editable_part_signed_as_edited_is_taken() {
        let edited = json!({"tool": "Bash", "input": {"command": "rm -rf build/tmp"}});
        let (intent, digest) = checked_edit(&editable(), &edited, Some(&signed(&edited)))
            .unwrap()
            .expect("changed");
        assert_eq!(intent, edited);
        assert_eq!(digest, signed(&edited));
        // The same intent as asked is no edit.
        let same = editable().intent.unwrap();
        assert_eq!(
            checked_edit(&editable(), &same, Some(&signed(&same))),
            Ok(None)
        );
    }

    #[test]
    fn an_edit_elsewhere_of_another_type_or_signed_otherwise_is_refused() {
        let reason = |d: &DecisionRow, e: Value, digest: Option<String>| {
            checked_edit(d, &e, digest.as_deref()).unwrap_err().0
        };
        let other_part = json!({"tool": "Write", "input": {"command": "rm -rf build"}});
        assert_eq!(
            reason(&editable(), other_part.clone(), Some(signed(&other_part))),
            RejectReason::InvalidCommand
        );
        let retyped = json!({"tool": "Bash", "input": {"command": ["rm"]}});
        assert_eq!(
            reason(&editable(), retyped.clone(), Some(signed(&retyped))),
            RejectReason::InvalidCommand
        );
        let missing = json!({"tool": "Bash", "input": {}});
        assert_eq!(
            reason(&editable(), missing.clone(), Some(signed(&missing))),
            RejectReason::InvalidCommand
        );
        let edited = json!({"tool": "Bash", "input": {"command": "ls"}});
        assert_eq!(
            reason(
                &editable(),
                edited.clone(),
                Some(signed(&json!({"other": 1})))
            ),
            RejectReason::DigestMismatch
        );
        assert_eq!(
            reason(&editable(), edited.clone(), None),
            RejectReason::DigestMismatch
        );
        // A runtime that takes the intent only as asked takes no edit at all.
        let fixed = approval(json!({"tool": "Bash", "input": {"command": "rm -rf build"}}));
        assert_eq!(
            reason(&fixed, edited.clone(), Some(signed(&edited))),
            RejectReason::InvalidCommand
        );
    }

    #[test]
    fn a_runtimes_deadline_closes_as_the_runtime_decided() {
        let mut d = approval(json!({"tool": "Bash"}));
        assert_eq!(
            closed_by_runtime(&d),
            None,
            "no deadline: our default applies"
        );
        let deadline = |at_ms: i64, then| RuntimeDeadline {
            runtime: "Hermes".into(),
            at: chrono::DateTime::from_timestamp_millis(at_ms).unwrap(),
            then,
            can_wait: false,
        };
        d.runtime_deadline = Some(deadline(20_000, RuntimeFallback::Denies));
        assert_eq!(closed_by_runtime(&d), None, "our expiry (10 s) comes first");
        d.runtime_deadline = Some(deadline(5_000, RuntimeFallback::Denies));
        assert!(
            closed_by_runtime(&d)
                .unwrap()
                .contains("Hermes denied the call")
        );
        d.runtime_deadline = Some(deadline(5_000, RuntimeFallback::AsksItself));
        assert!(
            closed_by_runtime(&d)
                .unwrap()
                .contains("asks in its own prompt")
        );
        // A Claude Code hook that held it: the hook's words, whoever closes it first (a
        // headless run's hook gives a deadline that denies).
        d.durability = Some(ApprovalDurability::FailOpenHook);
        for then in [RuntimeFallback::Denies, RuntimeFallback::AsksItself] {
            d.runtime_deadline = Some(deadline(5_000, then));
            assert_eq!(closed_by_runtime(&d).as_deref(), Some(HOOK_TIMED_OUT));
        }
    }
}
