//! Recovery (SPEC §4): the lease sweeper, admission checks when a worker resumes a task,
//! reconciliation of non-terminal effects from what their providers say, compensation tasks,
//! and the record of released resources. The control plane decides what happens after a crash
//! by reconciling effects — never by re-running the last prompt.

use serde_json::json;
use waymark_proto::*;
use waymark_store::*;

use crate::Context;
use crate::caller::Caller;
use crate::checkpoints::verify_chain;
use crate::convert;
use crate::core::*;
use crate::decisions::open_decision;
use crate::error::{ApiError, ApiResult};
use crate::fences::fenced_attempt;

/// How long a recovery decision waits for a person.
pub const RECOVERY_EXPIRY_MS: i64 = 7 * 24 * 3600 * 1000;

/// Moves tasks whose worker's lease ran out to `recovery_candidate`. One replica sweeps at a
/// time; each task changes in its own transaction under its lock, re-checked there.
pub async fn sweep_leases(st: &Context) -> ApiResult<usize> {
    let now = st.now_ms();
    let expired = Tx::read(st).await?.expired_leases(now).await?;
    if expired.is_empty() {
        return Ok(0);
    }
    let mut claim = Tx::read(st).await?;
    if !claim.try_claim("sweep-leases").await? {
        return Ok(0);
    }
    let mut n = 0;
    for a in expired {
        let mut tx = Tx::write(st).await?;
        let Some(mut task) = tx.task(&a.task_id).await? else {
            continue;
        };
        let still = tx.attempt(&a.id).await?.is_some_and(|x| {
            x.state == AttemptState::Active && x.expires_at <= now && x.fence == task.fence
        });
        if !still || !task.state.lease_sweepable() {
            continue;
        }
        task.state = TaskState::RecoveryCandidate;
        task.updated_at = tx.now;
        tx.update_task(&task).await?;
        emit_task(&mut tx, &task, EventKind::TaskUpdated).await?;
        tx.commit().await?;
        tracing::info!(task = %task.id, attempt = %a.id, "lease expired: task is a recovery candidate");
        n += 1;
    }
    drop(claim);
    Ok(n)
}

pub fn outcome_option(d: &DecisionRow) -> Option<String> {
    d.outcome.as_ref().and_then(|o| o.option.clone())
}

/// The working tree the newest checkpoint that recorded one saw (a runner's runs record it
/// after each call that changed it).
pub fn recorded_tree(checkpoints: &[CheckpointRow]) -> Option<WorkingTree> {
    checkpoints.iter().rev().find_map(|c| {
        serde_json::from_value::<CheckpointBody>(c.body.clone())
            .ok()?
            .materials?
            .tree
    })
}

/// The admission checks of a resumed task. Empty when admitted.
/// Whether a person said "resume anyway" to the newest admission card since the last attempt
/// started: admitted once, whatever the checks say.
pub fn resumed_anyway(decisions: &[DecisionRow], attempts: &[AttemptRow]) -> bool {
    let last_start = attempts.iter().map(|a| a.started_at).max().unwrap_or(0);
    decisions
        .iter()
        .rev()
        .find(|d| d.kind == DecisionKind::Recovery && d.effect_id.is_none())
        .is_some_and(|d| {
            d.status == DecisionStatus::Resolved
                && outcome_option(d).as_deref() == Some("resume_anyway")
                && d.created_at >= last_start
        })
}

pub async fn admission(tx: &mut Tx, task: &TaskRow, req: &StartAttempt) -> ApiResult<Vec<String>> {
    let checkpoints = tx.list_checkpoints(&task.id).await?;
    let attempts = tx.list_attempts(&task.id).await?;
    if checkpoints.is_empty() && attempts.is_empty() {
        return Ok(Vec::new());
    }
    let decisions = tx.list_decisions(&task.id).await?;
    if resumed_anyway(&decisions, &attempts) {
        return Ok(Vec::new());
    }
    let mut reasons = Vec::new();
    let chain = verify_chain(&checkpoints);
    if !chain.intact {
        reasons.push(format!(
            "the checkpoint chain is broken at #{}: {}",
            chain.broken_at.unwrap_or(0),
            chain.reason.unwrap_or_default()
        ));
    }
    let last: Option<CheckpointBody> = checkpoints
        .last()
        .and_then(|c| serde_json::from_value(c.body.clone()).ok());
    let recorded_manifest = last
        .as_ref()
        .and_then(|b| b.manifest_digest.clone())
        .or_else(|| {
            attempts
                .iter()
                .rev()
                .find_map(|a| a.manifest_digest.clone())
        });
    if let (Some(was), Some(now)) = (&recorded_manifest, &req.manifest_digest)
        && was != now
    {
        reasons.push(format!(
            "the worker's manifest changed (model, tools or config): it was {was}, it is {now}"
        ));
    }
    let recorded_materials = last
        .as_ref()
        .and_then(|b| b.materials.clone())
        .unwrap_or_else(|| task.materials.clone());
    if let (Some(was), Some(now)) = (
        recorded_materials.commit.as_ref(),
        req.materials.as_ref().and_then(|m| m.commit.as_ref()),
    ) && was != now
    {
        reasons.push(format!(
            "the materials changed: the checkpoint was written at {was}, the worker has {now}"
        ));
    }
    if let (Some(was), Some(now)) = (
        recorded_tree(&checkpoints),
        req.materials.as_ref().and_then(|m| m.tree.as_ref()),
    ) && let Some(differs) = now.differences_from(&was)
    {
        reasons.push(differs);
    }
    let now = tx.now;
    // A pending step written under an older plan revision was superseded by a replan: the
    // worker follows the new plan, so that step's approval is no reason to stop.
    let current_plan = last
        .as_ref()
        .is_none_or(|b| b.plan_revision == 0 || b.plan_revision >= task.plan_revision);
    if let Some(id) = last
        .as_ref()
        .filter(|_| current_plan)
        .and_then(|b| b.pending_step.as_ref())
        .and_then(|p| p.approval_id.clone())
    {
        match decisions.iter().find(|d| d.id == id) {
            None => reasons.push(format!(
                "the approval `{id}` the checkpoint waits on does not exist"
            )),
            Some(d) if d.status == DecisionStatus::Void || d.status == DecisionStatus::Expired => {
                reasons.push(format!(
                    "the approval `{id}` is {}; the agent must ask again",
                    d.status
                ));
            }
            Some(d) if d.plan_revision != task.plan_revision => reasons.push(format!(
                "the approval `{id}` was given at plan revision {}, the plan is at {}",
                d.plan_revision, task.plan_revision
            )),
            Some(d) if d.status == DecisionStatus::Pending && d.expires_at <= now => {
                reasons.push(format!("the approval `{id}` has expired"));
            }
            Some(d)
                if d.status == DecisionStatus::Resolved
                    && outcome_option(d).as_deref() == Some("approve")
                    && d.expires_at <= now =>
            {
                reasons.push(format!("the approval `{id}` has expired"));
            }
            _ => {}
        }
    }
    let (budget, usage) = (&task.budget, &task.usage);
    let mut spent = Vec::new();
    if budget.max_tokens.is_some_and(|m| usage.tokens >= m) {
        spent.push(format!(
            "{} of {} tokens",
            usage.tokens,
            budget.max_tokens.unwrap_or(0)
        ));
    }
    if budget.max_cost_usd.is_some_and(|m| usage.cost_usd >= m) {
        spent.push(format!(
            "${:.2} of ${:.2}",
            usage.cost_usd,
            budget.max_cost_usd.unwrap_or(0.0)
        ));
    }
    if budget
        .max_wall_seconds
        .is_some_and(|m| usage.wall_seconds >= m)
    {
        spent.push(format!(
            "{}s of {}s",
            usage.wall_seconds,
            budget.max_wall_seconds.unwrap_or(0)
        ));
    }
    if !spent.is_empty() {
        reasons.push(format!("the budget is spent: {}", spent.join(", ")));
    }
    Ok(reasons)
}

/// Records a failed admission: the task needs a person, through one recovery decision.
pub async fn refuse_admission(
    tx: &mut Tx,
    task: TaskRow,
    reasons: &[String],
) -> ApiResult<ApiError> {
    let existing = tx.list_decisions(&task.id).await?.into_iter().find(|d| {
        d.kind == DecisionKind::Recovery
            && d.effect_id.is_none()
            && d.status == DecisionStatus::Pending
    });
    let decision_id = match existing {
        Some(d) => d.id,
        None => {
            let options = vec![
                DecisionOption {
                    id: "resume_anyway".into(),
                    label: "Resume anyway".into(),
                    gives_up: format!("the checks that failed: {}", reasons.join("; ")),
                    cost: None,
                },
                DecisionOption {
                    id: "replan".into(),
                    label: "Replan".into(),
                    gives_up: "the current plan; pending approvals become void".into(),
                    cost: None,
                },
                DecisionOption {
                    id: "cancel".into(),
                    label: "Cancel the task".into(),
                    gives_up: "the task; effects under way are reconciled first".into(),
                    cost: None,
                },
            ];
            let row = DecisionRow {
                id: ids::decision(),
                task_id: task.id.clone(),
                kind: DecisionKind::Recovery,
                status: DecisionStatus::Pending,
                step: None,
                question: format!(
                    "Resuming “{}” needs you: {}",
                    task.title,
                    reasons.join("; ")
                ),
                options,
                default_option: None,
                intent: None,
                intent_digest: None,
                effect_id: None,
                plan_revision: task.plan_revision,
                risky: false,
                expires_at: tx.now + RECOVERY_EXPIRY_MS,
                created_at: tx.now,
                outcome: None,
                durability: None,
                delivery: None,
                editable: None,
                runtime_deadline: None,
                escalation: None,
                escalate_at: None,
            };
            let id = row.id.clone();
            let mut t = task.clone();
            t.state = TaskState::NeedsHuman;
            tx.update_task(&t).await?;
            let _ = open_decision(tx, t, row).await?;
            id
        }
    };
    let mut t = tx.task(&task.id).await?.unwrap_or(task);
    t.state = TaskState::NeedsHuman;
    t.updated_at = tx.now;
    tx.update_task(&t).await?;
    emit_task(tx, &t, EventKind::TaskUpdated).await?;
    Ok(ApiError::new(
        ErrorCode::AdmissionFailed,
        format!(
            "the task cannot resume without a person: {}",
            reasons.join("; ")
        ),
    )
    .with("reasons", reasons)
    .with("decision_id", &decision_id)
    .on_task(&t.id))
}

pub async fn reconcile(
    st: &Context,
    caller: &Caller,
    task_id: String,
    req: Reconcile,
) -> ApiResult<Reconciled> {
    if req.reports.is_empty() || req.reports.len() > 1000 {
        return Err(invalid("send between 1 and 1000 reports"));
    }
    audited(st, caller, "effects.reconcile", async {
        let mut tx = Tx::write(st).await?;
        let task = task_for(&mut tx, caller, &task_id).await?;
        fenced_attempt(&mut tx, &task, &req.attempt_id, req.fence).await?;
        let mut actions = Vec::with_capacity(req.reports.len());
        for r in &req.reports {
            let mut e = tx
                .effect(&r.effect_id)
                .await?
                .filter(|e| e.task_id == task.id)
                .ok_or_else(|| {
                    invalid(format!("`{}` is not an effect of this task", r.effect_id))
                })?;
            let from: EffectStatus = e.status;
            if from.is_terminal() {
                actions.push(ReconcileAction {
                    effect_id: e.id.clone(),
                    action: "recorded".into(),
                    status: from,
                    decision_id: None,
                    compensation_task_id: None,
                });
                continue;
            }
            let mut action = ReconcileAction {
                effect_id: e.id.clone(),
                action: String::new(),
                status: from,
                decision_id: None,
                compensation_task_id: None,
            };
            match r.provider_status {
                ProviderStatus::NotStarted => {
                    e.status = EffectStatus::Intended;
                    e.flag = None;
                    action.action = "continue".into();
                }
                ProviderStatus::Confirmed => {
                    e.status = EffectStatus::Confirmed;
                    e.receipt = r.receipt.clone().or(e.receipt.take());
                    e.flag = None;
                    action.action = "recorded".into();
                }
                ProviderStatus::InProgress => {
                    e.status = EffectStatus::InProgress;
                    action.action = "wait".into();
                }
                ProviderStatus::Failed => {
                    e.status = EffectStatus::Failed;
                    e.receipt = r.receipt.clone().or(e.receipt.take());
                    action.action = "failed".into();
                }
                ProviderStatus::Unknown => {
                    e.status = EffectStatus::Unknown;
                    e.flag = Some(
                        "frozen: the provider cannot say whether it happened; a person decides"
                            .into(),
                    );
                    action.action = "frozen".into();
                    action.decision_id = Some(freeze(&mut tx, &e, r.detail.as_deref()).await?);
                }
                ProviderStatus::FailedCompensable => {
                    e.status = EffectStatus::FailedCompensable;
                    e.receipt = r.receipt.clone().or(e.receipt.take());
                    let comp = compensation_task(&mut tx, &task, &e).await?;
                    e.flag = Some(format!(
                        "compensation task `{comp}` opened, with its own approval"
                    ));
                    action.action = "compensate".into();
                    action.compensation_task_id = Some(comp);
                }
            }
            e.attempt_id = req.attempt_id.clone();
            e.fence = req.fence;
            e.updated_at = tx.now;
            tx.update_effect(&e).await?;
            let current = tx.task(&task.id).await?.unwrap_or_else(|| task.clone());
            emit(
                &mut tx,
                &current,
                EventKind::EffectUpdated,
                convert::effect(&e),
            )
            .await?;
            action.status = e.status;
            actions.push(action);
        }
        tx.commit().await?;
        Ok(Reconciled { actions })
    })
    .await
}

/// Opens (once per effect) the decision a person makes about an effect nobody can vouch for.
pub async fn freeze(tx: &mut Tx, e: &EffectRow, detail: Option<&str>) -> ApiResult<String> {
    if let Some(d) = tx.list_decisions(&e.task_id).await?.into_iter().find(|d| {
        d.effect_id.as_deref() == Some(e.id.as_str())
            && d.kind == DecisionKind::Recovery
            && d.status == DecisionStatus::Pending
    }) {
        return Ok(d.id);
    }
    let task = tx
        .task(&e.task_id)
        .await?
        .ok_or_else(|| ApiError::new(ErrorCode::Internal, "effect without task"))?;
    let options = vec![
        DecisionOption {
            id: "mark_confirmed".into(),
            label: "It happened".into(),
            gives_up: "nothing is re-sent; you vouch for the outcome".into(),
            cost: None,
        },
        DecisionOption {
            id: "mark_not_started".into(),
            label: "It did not happen".into(),
            gives_up: "certainty: if it did happen, running it again may duplicate it".into(),
            cost: None,
        },
        DecisionOption {
            id: "cancel".into(),
            label: "Cancel the task".into(),
            gives_up: "the rest of the task".into(),
            cost: None,
        },
    ];
    let row = DecisionRow {
        id: ids::decision(),
        task_id: e.task_id.clone(),
        kind: DecisionKind::Recovery,
        status: DecisionStatus::Pending,
        step: e.step.clone(),
        question: format!(
            "Did the {} `{}` happen? The provider cannot say{}",
            e.kind,
            e.idempotency_key,
            detail.map(|d| format!(" ({d})")).unwrap_or_default()
        ),
        options,
        default_option: None,
        intent: Some(e.intent.clone()),
        intent_digest: Some(e.intent_digest.clone()),
        effect_id: Some(e.id.clone()),
        plan_revision: task.plan_revision,
        risky: true,
        expires_at: tx.now + RECOVERY_EXPIRY_MS,
        created_at: tx.now,
        outcome: None,
        durability: None,
        delivery: None,
        editable: None,
        runtime_deadline: None,
        escalation: None,
        escalate_at: None,
    };
    let id = row.id.clone();
    let _ = open_decision(tx, task, row).await?;
    Ok(id)
}

/// A new task that compensates a failed effect, owned by the same user, with its own approval.
pub async fn compensation_task(tx: &mut Tx, parent: &TaskRow, e: &EffectRow) -> ApiResult<String> {
    let now = tx.now;
    let id = ids::task();
    let session_id = ids::session();
    let row = TaskRow {
        id: id.clone(),
        owner_id: parent.owner_id.clone(),
        title: format!(
            "Compensate: {} `{}` of “{}”",
            e.kind, e.idempotency_key, parent.title
        ),
        goal: format!(
            "Undo the partial {} of task `{}` (effect `{}`, resource {}), then verify.",
            e.kind,
            parent.id,
            e.id,
            e.resource_id.as_deref().unwrap_or("unknown")
        ),
        runtime: parent.runtime.clone(),
        state: TaskState::Queued,
        plan: vec![PlanStep {
            id: "compensate".into(),
            title: format!("compensate the {}", e.kind),
            depends_on: Vec::new(),
        }],
        plan_revision: 1,
        budget: parent.budget.clone(),
        usage: Usage::default(),
        materials: parent.materials.clone(),
        session_id: session_id.clone(),
        fence: 0,
        outcome_summary: None,
        created_at: now,
        updated_at: now,
        parent_id: Some(parent.id.clone()),
        external_key: None,
        machine_id: parent.machine_id.clone(),
    };
    tx.insert_task(&row).await?;
    tx.insert_session(&SessionRow {
        id: session_id,
        task_id: id.clone(),
        parent_id: None,
        created_at: now,
    })
    .await?;
    let wire = task_wire(tx, &row).await?;
    emit(tx, &row, EventKind::TaskCreated, &wire).await?;
    let intent = json!({
        "compensates": {"task_id": parent.id, "effect_id": e.id, "idempotency_key": e.idempotency_key,
                        "kind": e.kind, "resource_id": e.resource_id, "receipt": e.receipt},
    });
    let approval = DecisionRow {
        id: ids::decision(),
        task_id: id.clone(),
        kind: DecisionKind::Approval,
        status: DecisionStatus::Pending,
        step: Some("compensate".into()),
        question: format!("Compensate the failed {} `{}`?", e.kind, e.idempotency_key),
        options: vec![
            DecisionOption {
                id: "approve".into(),
                label: "Approve".into(),
                gives_up: String::new(),
                cost: None,
            },
            DecisionOption {
                id: "deny".into(),
                label: "Deny".into(),
                gives_up: "the partial change stays as it is".into(),
                cost: None,
            },
        ],
        default_option: Some("deny".into()),
        // An intent the server built from stored values; one it cannot digest exactly has none.
        intent_digest: digest::json_digest(&intent).ok(),
        intent: Some(intent),
        effect_id: None,
        plan_revision: 1,
        risky: true,
        expires_at: now + RECOVERY_EXPIRY_MS,
        created_at: now,
        outcome: None,
        durability: None,
        delivery: None,
        editable: None,
        runtime_deadline: None,
        escalation: None,
        escalate_at: None,
    };
    let _ = open_decision(tx, row, approval).await?;
    Ok(id)
}

pub async fn released(
    st: &Context,
    caller: &Caller,
    attempt_id: String,
    req: ReportReleased,
) -> ApiResult<Written<Attempt>> {
    if req.resources.is_empty()
        || req.resources.len() > 1000
        || req.resources.iter().any(|r| r.is_empty() || r.len() > 1000)
    {
        return Err(invalid(
            "report between 1 and 1000 non-empty resource names",
        ));
    }
    audited(st, caller, "attempt.released", async {
        let mut tx = Tx::write(st).await?;
        let mut a = tx
            .attempt(&attempt_id)
            .await?
            .ok_or_else(|| ApiError::not_found("attempt", &attempt_id))?;
        let task = task_for(&mut tx, caller, &a.task_id).await?;
        // Any state: a revoked or superseded worker still reports what it let go — but only
        // with its own fence.
        if req.fence != a.fence {
            return Err(ApiError::new(
                ErrorCode::Fenced,
                format!("fence {} is not the fence of attempt `{}`", req.fence, a.id),
            )
            .on_task(&task.id));
        }
        let mut list = a.released.take().unwrap_or_default();
        for r in &req.resources {
            if !list.contains(r) {
                list.push(r.clone());
            }
        }
        a.released = Some(list);
        tx.update_attempt(&a).await?;
        let wire = convert::attempt(&a);
        let cursor = emit(&mut tx, &task, EventKind::AttemptUpdated, &wire).await?;
        tx.commit().await?;
        Ok(Written {
            cursor,
            value: wire,
        })
    })
    .await
}
