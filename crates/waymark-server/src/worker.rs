//! The worker side of API v1: tasks, attempts and leases, checkpoints, effects, approvals and
//! decisions, artifacts, test receipts, messages, usage, finish. Every fenced write checks the
//! fence inside the transaction that writes, and every state change appends its event there.

use axum::Json as Out;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use waymark_proto::digest::{DigestError, check_exact, checkpoint_digest, json_digest, sha256_hex};
use waymark_proto::*;
use waymark_store::*;

use crate::auth::{Caller, CallerKind, WorkerCaller};
use crate::error::{ApiError, ApiResult};
use crate::extract::{Json, Query, read_limited};
use crate::{AppState, convert, now_ms};

type Tx = Box<dyn StoreTx>;

/// Loads a task the caller may access; others' tasks look absent.
pub(crate) async fn task_for(tx: &mut Tx, caller: &Caller, id: &str) -> ApiResult<TaskRow> {
    match tx.task(id).await? {
        Some(t) if caller.may_access(&t.owner_id) => Ok(t),
        _ => Err(ApiError::not_found("task", id)),
    }
}

/// The wire form of a task (with its owner's name).
pub(crate) async fn task_wire(tx: &mut Tx, t: &TaskRow) -> ApiResult<Task> {
    let owner = tx
        .user_by_id(&t.owner_id)
        .await?
        .map(|u| u.name)
        .unwrap_or_default();
    Ok(convert::task(t, &owner)?)
}

/// Appends an event for a task in the current transaction.
pub(crate) async fn emit(
    tx: &mut Tx,
    task: &TaskRow,
    kind: EventKind,
    data: impl Serialize,
) -> ApiResult<i64> {
    let data = serde_json::to_value(data).map_err(|e| {
        tracing::error!(error = %e, "event data does not serialise");
        ApiError::new(
            ErrorCode::Internal,
            "the server could not record the change",
        )
    })?;
    Ok(tx
        .append_event(&NewEvent {
            task_id: task.id.clone(),
            owner_id: task.owner_id.clone(),
            kind: kind.as_str().to_owned(),
            data,
            at: now_ms(),
        })
        .await?)
}

pub(crate) async fn emit_task(tx: &mut Tx, task: &TaskRow, kind: EventKind) -> ApiResult<i64> {
    let wire = task_wire(tx, task).await?;
    emit(tx, task, kind, wire).await
}

/// Records a refusal in the audit log, in its own transaction (the refused one rolled back).
pub(crate) async fn audit_refusal(st: &AppState, caller: &Caller, action: &str, err: &ApiError) {
    if !err.is_refusal() {
        return;
    }
    let code = err.code().as_str();
    record_refusal(
        st,
        &caller.actor(),
        action,
        err.task_id.as_deref(),
        code,
        &err.problem.detail,
    )
    .await;
}

/// Writes an audit entry (and counts the refusal) in its own transaction.
pub(crate) async fn record_refusal(
    st: &AppState,
    actor: &str,
    action: &str,
    task_id: Option<&str>,
    code: &str,
    detail: &str,
) {
    st.metrics.refusal_code(code);
    let row = AuditRow {
        at: now_ms(),
        actor: actor.to_owned(),
        action: action.to_owned(),
        task_id: task_id.map(str::to_owned),
        code: code.to_owned(),
        detail: detail.to_owned(),
    };
    let res = async {
        let mut tx = st.store.write().await?;
        tx.insert_audit(&row).await?;
        tx.commit().await
    }
    .await;
    if let Err(e) = res {
        tracing::error!(error = %e, "could not record a refusal in the audit log");
    }
}

/// Runs a write and audits it when refused.
pub(crate) async fn audited<T>(
    st: &AppState,
    caller: &Caller,
    action: &str,
    f: impl std::future::Future<Output = ApiResult<T>>,
) -> ApiResult<T> {
    let res = f.await;
    if let Err(e) = &res {
        audit_refusal(st, caller, action, e).await;
    }
    res
}

/// The fence check every write gateway makes: the attempt belongs to the task, carries the
/// task's newest fence, is still active, and its lease has not run out.
pub(crate) fn check_fence(
    task: &TaskRow,
    attempt: &AttemptRow,
    fence: i64,
    now: i64,
) -> ApiResult<()> {
    let refuse = |code: ErrorCode, detail: String| {
        Err(ApiError::new(code, detail)
            .with("current_fence", task.fence)
            .with("your_fence", fence)
            .on_task(&task.id))
    };
    if attempt.task_id != task.id {
        return Err(ApiError::not_found("attempt", &attempt.id).on_task(&task.id));
    }
    if fence != attempt.fence {
        return refuse(
            ErrorCode::Fenced,
            format!(
                "fence {fence} is not the fence of attempt `{}` ({})",
                attempt.id, attempt.fence
            ),
        );
    }
    if fence < task.fence {
        return refuse(
            ErrorCode::Fenced,
            format!(
                "fence {fence} is stale: a newer attempt holds this task with fence {}; stop writing",
                task.fence
            ),
        );
    }
    match attempt.state.as_str() {
        "active" => {}
        "finished" => {
            return refuse(
                ErrorCode::AttemptClosed,
                format!("attempt `{}` has finished", attempt.id),
            );
        }
        other => {
            return refuse(
                ErrorCode::Fenced,
                format!("attempt `{}` was {other}; stop writing", attempt.id),
            );
        }
    }
    if attempt.expires_at <= now {
        return refuse(
            ErrorCode::LeaseExpired,
            format!(
                "the lease of attempt `{}` expired; start a new attempt to continue",
                attempt.id
            ),
        );
    }
    Ok(())
}

pub(crate) async fn fenced_attempt(
    tx: &mut Tx,
    task: &TaskRow,
    attempt_id: &str,
    fence: i64,
) -> ApiResult<AttemptRow> {
    let attempt = tx
        .attempt(attempt_id)
        .await?
        .ok_or_else(|| ApiError::not_found("attempt", attempt_id).on_task(&task.id))?;
    check_fence(task, &attempt, fence, now_ms())?;
    Ok(attempt)
}

/// For writes where fencing is optional (adapters without leases): both fields or neither.
async fn optional_fence(
    tx: &mut Tx,
    task: &TaskRow,
    attempt_id: &Option<String>,
    fence: Option<i64>,
) -> ApiResult<()> {
    match (attempt_id, fence) {
        (None, None) => Ok(()),
        (Some(a), Some(f)) => fenced_attempt(tx, task, a, f).await.map(drop),
        _ => Err(invalid("give both `attempt_id` and `fence`, or neither")),
    }
}

pub(crate) fn invalid(detail: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::ValidationFailed, detail)
}

/// A 422 for a request field that has no exact canonical form: it names the field and, for an
/// integer beyond ±(2^53 − 1), where in it the integer is (`pointer`, into the request body).
fn not_exact(field: &str, e: DigestError) -> ApiError {
    match e {
        DigestError::NotPlainJson => invalid(format!("`{field}` is not plain JSON")),
        DigestError::InexactNumber { pointer, value } => invalid(format!(
            "`{field}` holds the integer {value} (at `/{field}{pointer}`), beyond ±(2^53 − 1): digests are taken over canonical JSON, which cannot carry it exactly — send it as a string"
        ))
        .with("pointer", format!("/{field}{pointer}")),
    }
}

/// The digest of a request field, or a 422 saying why it has none.
fn field_digest(field: &str, value: &Value) -> ApiResult<String> {
    json_digest(value).map_err(|e| not_exact(field, e))
}

fn check_text(field: &str, value: &str, max: usize, required: bool) -> ApiResult<()> {
    if required && value.trim().is_empty() {
        return Err(invalid(format!("`{field}` must not be empty")));
    }
    if value.len() > max {
        return Err(invalid(format!("`{field}` is longer than {max} bytes")));
    }
    Ok(())
}

fn refuse_terminal(task: &TaskRow) -> ApiResult<()> {
    if task
        .state
        .parse::<TaskState>()
        .is_ok_and(TaskState::is_terminal)
    {
        return Err(ApiError::new(
            ErrorCode::TaskTerminal,
            format!("task `{}` is {}", task.id, task.state),
        )
        .with("state", &task.state)
        .on_task(&task.id));
    }
    Ok(())
}

pub(crate) fn to_value<T: Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

pub(crate) fn validate_plan(plan: &[PlanStep]) -> ApiResult<()> {
    let mut seen = std::collections::HashSet::new();
    for s in plan {
        check_text("plan[].id", &s.id, 128, true)?;
        check_text("plan[].title", &s.title, 1000, false)?;
        if !seen.insert(s.id.as_str()) {
            return Err(invalid(format!("plan step `{}` appears twice", s.id)));
        }
    }
    for s in plan {
        for d in &s.depends_on {
            if !seen.contains(d.as_str()) {
                return Err(invalid(format!(
                    "plan step `{}` depends on unknown step `{d}`",
                    s.id
                )));
            }
        }
    }
    // Kahn's algorithm: the plan must be a DAG.
    let mut indegree: std::collections::HashMap<&str, usize> = plan
        .iter()
        .map(|s| (s.id.as_str(), s.depends_on.len()))
        .collect();
    let mut ready: Vec<&str> = indegree
        .iter()
        .filter(|(_, n)| **n == 0)
        .map(|(k, _)| *k)
        .collect();
    let mut done = 0;
    while let Some(id) = ready.pop() {
        done += 1;
        for s in plan.iter().filter(|s| s.depends_on.iter().any(|d| d == id)) {
            let n = indegree.get_mut(s.id.as_str()).expect("known step");
            *n -= 1;
            if *n == 0 {
                ready.push(&s.id);
            }
        }
    }
    if done != plan.len() {
        return Err(invalid("the plan's dependencies form a cycle"));
    }
    Ok(())
}

fn validate_budget(b: &Budget) -> ApiResult<()> {
    if b.max_cost_usd.is_some_and(|c| !c.is_finite() || c < 0.0) {
        return Err(invalid(
            "`budget.max_cost_usd` must be a non-negative number",
        ));
    }
    Ok(())
}

pub(crate) type Created<T> = (StatusCode, Out<Written<T>>);

pub(crate) fn created<T>(cursor: i64, value: T) -> Created<T> {
    (StatusCode::CREATED, Out(Written { cursor, value }))
}

#[utoipa::path(post, path = "/v1/tasks", tag = "worker", request_body = CreateTask,
    responses((status = 201, body = Task, description = "created; the body also carries `cursor`"),
              (status = 200, body = Task, description = "a task with this `runtime` and `external_key` exists already"),
              (status = 422, body = Problem)))]
pub(crate) async fn create_task(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Json(req): Json<CreateTask>,
) -> ApiResult<Created<Task>> {
    check_text("title", &req.title, 200, true)?;
    check_text("goal", &req.goal, 20_000, false)?;
    validate_plan(&req.plan)?;
    validate_budget(&req.budget)?;
    if let Some(key) = &req.external_key {
        check_text("external_key", key, 300, true)?;
        if req.runtime.is_none() {
            return Err(invalid(
                "`external_key` needs `runtime`: keys are per runtime",
            ));
        }
    }
    if let Some(found) = existing_task(&st, &caller, &req.runtime, &req.external_key).await? {
        return Ok(found);
    }
    let now = now_ms();
    let task_id = ids::task();
    let session_id = ids::session();
    let row = TaskRow {
        id: task_id.clone(),
        owner_id: caller.user_id.clone(),
        title: req.title,
        goal: req.goal,
        runtime: req.runtime,
        state: TaskState::Queued.as_str().into(),
        plan: to_value(&req.plan),
        plan_revision: 1,
        budget: to_value(&req.budget),
        usage: to_value(&Usage::default()),
        materials: to_value(&req.materials),
        session_id: session_id.clone(),
        fence: 0,
        outcome_summary: None,
        created_at: now,
        updated_at: now,
        parent_id: None,
        external_key: req.external_key,
    };
    let mut tx = st.store.write().await?;
    if let Err(e) = tx.insert_task(&row).await {
        // Another request created the same runtime key in the meantime: that task is the one.
        // It may sit in the same group commit, not yet visible to readers (SQLite): this write
        // transaction sees it, and its commit answers once that task is durable. Where a failed
        // statement ends the transaction (PostgreSQL), the other one had to commit before this
        // insert could fail, so a fresh read finds it.
        if let Ok(Some(found)) =
            existing_task_in(&mut tx, &caller, &row.runtime, &row.external_key).await
        {
            tx.commit().await?;
            return Ok(found);
        }
        drop(tx);
        if let Some(found) = existing_task(&st, &caller, &row.runtime, &row.external_key).await? {
            return Ok(found);
        }
        return Err(e.into());
    }
    tx.insert_session(&SessionRow {
        id: session_id,
        task_id,
        parent_id: None,
        created_at: now,
    })
    .await?;
    let task = task_wire(&mut tx, &row).await?;
    let cursor = emit(&mut tx, &row, EventKind::TaskCreated, &task).await?;
    tx.commit().await?;
    st.metrics.tasks_created.inc();
    Ok(created(cursor, task))
}

/// The task a runtime adapter created before for the same runtime id, answered as `200`.
async fn existing_task(
    st: &AppState,
    caller: &Caller,
    runtime: &Option<String>,
    key: &Option<String>,
) -> ApiResult<Option<Created<Task>>> {
    if runtime.is_none() || key.is_none() {
        return Ok(None);
    }
    let mut tx = st.store.read().await?;
    existing_task_in(&mut tx, caller, runtime, key).await
}

/// [`existing_task`] in a given transaction.
async fn existing_task_in(
    tx: &mut Tx,
    caller: &Caller,
    runtime: &Option<String>,
    key: &Option<String>,
) -> ApiResult<Option<Created<Task>>> {
    let (Some(runtime), Some(key)) = (runtime, key) else {
        return Ok(None);
    };
    let Some(row) = tx
        .task_by_external_key(&caller.user_id, runtime, key)
        .await?
    else {
        return Ok(None);
    };
    let task = task_wire(tx, &row).await?;
    let cursor = tx.max_cursor().await?;
    Ok(Some((
        StatusCode::OK,
        Out(Written {
            cursor,
            value: task,
        }),
    )))
}

fn lease_ms(st: &AppState, requested: Option<u32>) -> i64 {
    let c = &st.config;
    let want = requested
        .map(|s| std::time::Duration::from_secs(s.into()))
        .unwrap_or(c.lease_default);
    want.clamp(c.lease_min, c.lease_max).as_millis() as i64
}

#[utoipa::path(post, path = "/v1/tasks/{task}/attempts", tag = "worker", request_body = StartAttempt,
    params(("task" = String, Path)),
    responses((status = 201, body = Attempt), (status = 409, body = Problem, description = "`lease_held`, `task_terminal`")))]
pub(crate) async fn start_attempt(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path(task_id): Path<String>,
    Json(req): Json<StartAttempt>,
) -> ApiResult<Created<Attempt>> {
    check_text("worker", &req.worker, 128, true)?;
    audited(&st, &caller, "attempt.start", async {
        let mut tx = st.store.write().await?;
        let mut task = task_for(&mut tx, &caller, &task_id).await?;
        refuse_terminal(&task)?;
        let now = now_ms();
        let mut cursor = 0;
        let live = tx
            .list_attempts(&task.id)
            .await?
            .into_iter()
            .any(|a| a.state == AttemptState::Active.as_str() && a.expires_at > now);
        if !live {
            let reasons = crate::recovery::admission(&mut tx, &task, &req).await?;
            if !reasons.is_empty() {
                let refusal = crate::recovery::refuse_admission(&mut tx, task, &reasons).await?;
                tx.commit().await?;
                return Err(refusal);
            }
        }
        for mut prev in tx.list_attempts(&task.id).await? {
            if prev.state != AttemptState::Active.as_str() {
                continue;
            }
            if prev.expires_at > now {
                return Err(ApiError::new(
                    ErrorCode::LeaseHeld,
                    format!(
                        "attempt `{}` of worker `{}` holds the lease until {}",
                        prev.id,
                        prev.worker,
                        convert::dt(prev.expires_at).to_rfc3339()
                    ),
                )
                .with("attempt_id", &prev.id)
                .with("expires_at", convert::dt(prev.expires_at))
                .on_task(&task.id));
            }
            prev.state = AttemptState::Superseded.as_str().into();
            prev.ended_at = Some(now);
            tx.update_attempt(&prev).await?;
            emit(
                &mut tx,
                &task,
                EventKind::AttemptEnded,
                convert::attempt(&prev)?,
            )
            .await?;
        }
        let attempt = AttemptRow {
            id: ids::attempt(),
            task_id: task.id.clone(),
            worker: req.worker.clone(),
            fence: task.fence + 1,
            expires_at: now + lease_ms(&st, req.lease_seconds),
            state: AttemptState::Active.as_str().into(),
            manifest_digest: req.manifest_digest.clone(),
            started_at: now,
            ended_at: None,
            outcome: None,
            released: None,
        };
        tx.insert_attempt(&attempt).await?;
        task.fence = attempt.fence;
        let state: TaskState = task.state.parse().unwrap_or(TaskState::Queued);
        if matches!(
            state,
            TaskState::Queued
                | TaskState::RecoveryCandidate
                | TaskState::NeedsHuman
                | TaskState::Verifying
        ) {
            task.state = TaskState::Running.as_str().into();
        }
        task.updated_at = now;
        tx.update_task(&task).await?;
        let wire = convert::attempt(&attempt)?;
        cursor = cursor.max(emit(&mut tx, &task, EventKind::AttemptStarted, &wire).await?);
        cursor = cursor.max(emit_task(&mut tx, &task, EventKind::TaskUpdated).await?);
        tx.commit().await?;
        Ok(created(cursor, wire))
    })
    .await
}

#[utoipa::path(post, path = "/v1/attempts/{attempt}/heartbeat", tag = "worker", request_body = Heartbeat,
    params(("attempt" = String, Path)),
    responses((status = 200, body = HeartbeatReply), (status = 409, body = Problem, description = "`fenced`, `lease_expired`, `attempt_closed`")))]
pub(crate) async fn heartbeat(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path(attempt_id): Path<String>,
    Json(req): Json<Heartbeat>,
) -> ApiResult<Out<HeartbeatReply>> {
    audited(&st, &caller, "attempt.heartbeat", async {
        let mut tx = st.store.write().await?;
        let mut attempt = tx
            .attempt(&attempt_id)
            .await?
            .ok_or_else(|| ApiError::not_found("attempt", &attempt_id))?;
        let task = task_for(&mut tx, &caller, &attempt.task_id).await?;
        if let Err(e) = check_fence(&task, &attempt, req.fence, now_ms()) {
            // A revoked worker still reports what it saw (e.g. the cancel that revoked it):
            // record the acknowledgements, then refuse the renewal.
            if attempt.fence == req.fence && !req.acknowledged.is_empty() {
                crate::steer::exchange_controls(&mut tx, &task, &attempt.id, &req.acknowledged)
                    .await?;
                tx.commit().await?;
            }
            return Err(e);
        }
        attempt.expires_at = now_ms() + lease_ms(&st, req.lease_seconds);
        tx.update_attempt(&attempt).await?;
        let commands =
            crate::steer::exchange_controls(&mut tx, &task, &attempt.id, &req.acknowledged).await?;
        tx.commit().await?;
        Ok(Out(HeartbeatReply {
            expires_at: convert::dt(attempt.expires_at),
            task_state: task.state.parse().unwrap_or(TaskState::Running),
            plan_revision: task.plan_revision,
            commands,
        }))
    })
    .await
}

#[utoipa::path(post, path = "/v1/tasks/{task}/checkpoints", tag = "worker", request_body = AppendCheckpoint,
    params(("task" = String, Path)),
    responses((status = 201, body = Checkpoint), (status = 409, body = Problem, description = "`sequence_conflict`, `fenced`, `lease_expired`")))]
pub(crate) async fn append_checkpoint(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path(task_id): Path<String>,
    Json(req): Json<AppendCheckpoint>,
) -> ApiResult<Created<Checkpoint>> {
    if !(1..=MAX_SAFE_INTEGER).contains(&req.sequence) {
        return Err(invalid("`sequence` must be at least 1"));
    }
    // The chain link must say exactly what it covers.
    check_exact(&to_value(&req.body)).map_err(|e| not_exact("body", e))?;
    audited(&st, &caller, "checkpoint.append", async {
        let mut tx = st.store.write().await?;
        let task = task_for(&mut tx, &caller, &task_id).await?;
        fenced_attempt(&mut tx, &task, &req.attempt_id, req.fence).await?;
        let last = tx.last_checkpoint(&task.id).await?;
        let last_seq = last.as_ref().map_or(0, |c| c.sequence);
        let sequence_conflict = || {
            ApiError::new(
                ErrorCode::SequenceConflict,
                format!(
                    "sequence {} is not the next one: the last checkpoint is {last_seq}; reload and retry with {}",
                    req.sequence,
                    last_seq + 1
                ),
            )
            .with("current_sequence", last_seq)
            .on_task(&task.id)
        };
        if req.sequence != last_seq + 1 {
            return Err(sequence_conflict());
        }
        let mut body = to_value(&req.body);
        st.config.redaction.json(&mut body);
        let prev = last.map(|c| c.digest);
        let row = CheckpointRow {
            task_id: task.id.clone(),
            sequence: req.sequence,
            attempt_id: req.attempt_id.clone(),
            fence: req.fence,
            digest: checkpoint_digest(&task.id, req.sequence, &req.attempt_id, req.fence, &body, prev.as_deref()),
            body,
            prev_digest: prev,
            created_at: now_ms(),
        };
        match tx.insert_checkpoint(&row).await {
            Err(StoreError::Conflict(_)) => return Err(sequence_conflict()),
            r => r?,
        }
        let wire = convert::checkpoint(&row);
        let cursor = emit(&mut tx, &task, EventKind::CheckpointAppended, &wire).await?;
        tx.commit().await?;
        st.metrics.checkpoints.inc();
        Ok(created(cursor, wire))
    })
    .await
}

#[utoipa::path(post, path = "/v1/tasks/{task}/effects", tag = "worker", request_body = DeclareEffect,
    params(("task" = String, Path)),
    responses((status = 201, body = EffectDeclared, description = "declared"),
              (status = 200, body = EffectDeclared, description = "the same key and body were declared before"),
              (status = 422, body = Problem, description = "`idempotency_mismatch`")))]
pub(crate) async fn declare_effect(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path(task_id): Path<String>,
    Json(req): Json<DeclareEffect>,
) -> ApiResult<(StatusCode, Out<Written<EffectDeclared>>)> {
    check_text("idempotency_key", &req.idempotency_key, 256, true)?;
    check_text("kind", &req.kind, 128, true)?;
    audited(&st, &caller, "effect.declare", async {
        let mut tx = st.store.write().await?;
        let task = task_for(&mut tx, &caller, &task_id).await?;
        refuse_terminal(&task)?;
        fenced_attempt(&mut tx, &task, &req.attempt_id, req.fence).await?;
        let declaration = json!({
            "kind": req.kind, "step": req.step, "resource_id": req.resource_id, "intent": req.intent,
        });
        let intent_digest = field_digest("intent", &req.intent)?;
        let body_digest = json_digest(&declaration).map_err(|e| not_exact("intent", e))?;
        if let Some(existing) = tx.effect_by_key(&task.id, &req.idempotency_key).await? {
            if existing.body_digest != body_digest {
                return Err(ApiError::new(
                    ErrorCode::IdempotencyMismatch,
                    format!(
                        "idempotency key `{}` was declared with a different body (effect `{}`); use a new key for a different change",
                        req.idempotency_key, existing.id
                    ),
                )
                .with("effect_id", &existing.id)
                .on_task(&task.id));
            }
            let cursor = tx.max_cursor().await?;
            let effect = convert::effect(&existing)?;
            return Ok((StatusCode::OK, Out(Written { cursor, value: EffectDeclared { created: false, effect } })));
        }
        if task.state == TaskState::Paused.as_str() {
            return Err(ApiError::new(
                ErrorCode::TaskPaused,
                "the task is paused: no new effect may start until it is resumed",
            )
            .on_task(&task.id));
        }
        let now = now_ms();
        let row = EffectRow {
            id: ids::effect(),
            task_id: task.id.clone(),
            idempotency_key: req.idempotency_key.clone(),
            body_digest,
            kind: req.kind.clone(),
            step: req.step.clone(),
            resource_id: req.resource_id.clone(),
            intent: req.intent.clone(),
            intent_digest,
            status: EffectStatus::Intended.as_str().into(),
            receipt: None,
            attempt_id: req.attempt_id.clone(),
            fence: req.fence,
            created_at: now,
            updated_at: now,
            flag: None,
        };
        match tx.insert_effect(&row).await {
            Err(StoreError::Conflict(_)) => {
                return Err(ApiError::new(ErrorCode::IdempotencyMismatch, "the idempotency key was taken concurrently; retry")
                    .on_task(&task.id));
            }
            r => r?,
        }
        let effect = convert::effect(&row)?;
        let cursor = emit(&mut tx, &task, EventKind::EffectDeclared, &effect).await?;
        tx.commit().await?;
        Ok((StatusCode::CREATED, Out(Written { cursor, value: EffectDeclared { created: true, effect } })))
    })
    .await
}

#[utoipa::path(patch, path = "/v1/effects/{effect}", tag = "worker", request_body = UpdateEffect,
    params(("effect" = String, Path)),
    responses((status = 200, body = Effect), (status = 409, body = Problem, description = "`illegal_transition`, `fenced`")))]
pub(crate) async fn update_effect(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path(effect_id): Path<String>,
    Json(req): Json<UpdateEffect>,
) -> ApiResult<Out<Written<Effect>>> {
    audited(&st, &caller, "effect.update", async {
        let mut tx = st.store.write().await?;
        let mut effect = tx
            .effect(&effect_id)
            .await?
            .ok_or_else(|| ApiError::not_found("effect", &effect_id))?;
        let task = task_for(&mut tx, &caller, &effect.task_id).await?;
        fenced_attempt(&mut tx, &task, &req.attempt_id, req.fence).await?;
        let from: EffectStatus = effect
            .status
            .parse()
            .map_err(|_| ApiError::new(ErrorCode::Internal, "corrupt effect status"))?;
        let to = req.status;
        let illegal = |detail: String| {
            Err(ApiError::new(ErrorCode::IllegalTransition, detail)
                .with("status", from)
                .with("requested", to)
                .on_task(&task.id))
        };
        if from == to {
            let same_receipt = req.receipt.is_none() || req.receipt == effect.receipt;
            if same_receipt
                && req
                    .resource_id
                    .as_ref()
                    .is_none_or(|r| Some(r) == effect.resource_id.as_ref())
            {
                // A repeated report: applied once already.
                let cursor = tx.max_cursor().await?;
                return Ok(Out(Written {
                    cursor,
                    value: convert::effect(&effect)?,
                }));
            }
            if from.is_terminal() {
                return illegal(format!(
                    "effect `{}` is already {from} with a different receipt",
                    effect.id
                ));
            }
        } else if !from.can_become(to) {
            return illegal(format!(
                "effect `{}` cannot move from {from} to {to}",
                effect.id
            ));
        }
        effect.status = to.as_str().into();
        if req.receipt.is_some() {
            effect.receipt = req.receipt.clone();
        }
        if req.resource_id.is_some() {
            effect.resource_id = req.resource_id.clone();
        }
        effect.attempt_id = req.attempt_id.clone();
        effect.fence = req.fence;
        effect.updated_at = now_ms();
        tx.update_effect(&effect).await?;
        let wire = convert::effect(&effect)?;
        let cursor = emit(&mut tx, &task, EventKind::EffectUpdated, &wire).await?;
        tx.commit().await?;
        Ok(Out(Written {
            cursor,
            value: wire,
        }))
    })
    .await
}

fn expiry_ms(st: &AppState, seconds: Option<u64>) -> ApiResult<i64> {
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
    Ok(now_ms() + want.as_millis() as i64)
}

/// Moves a task into a waiting state when a decision opens.
fn wait_state(task: &mut TaskRow, waiting: TaskState) {
    let state: TaskState = task.state.parse().unwrap_or(TaskState::Running);
    if matches!(
        state,
        TaskState::Queued
            | TaskState::Running
            | TaskState::Verifying
            | TaskState::WaitingHuman
            | TaskState::WaitingApproval
    ) {
        task.state = waiting.as_str().into();
    }
}

pub(crate) async fn open_decision(
    tx: &mut Tx,
    mut task: TaskRow,
    row: DecisionRow,
) -> ApiResult<Created<Decision>> {
    tx.insert_decision(&row).await?;
    let waiting = if row.kind == "approval" {
        TaskState::WaitingApproval
    } else {
        TaskState::WaitingHuman
    };
    wait_state(&mut task, waiting);
    task.updated_at = now_ms();
    tx.update_task(&task).await?;
    let wire = convert::decision(&row)?;
    let cursor = emit(tx, &task, EventKind::DecisionRequested, &wire).await?;
    let cursor = cursor.max(emit_task(tx, &task, EventKind::TaskUpdated).await?);
    Ok(created(cursor, wire))
}

/// An approval's options: `approve` and `deny`, or a runtime's own choices, which must keep
/// both and name the others `approve_…` (they grant) or `deny_…` (they refuse).
fn approval_options(given: &[DecisionOption]) -> ApiResult<Vec<DecisionOption>> {
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

/// Whether an approval option grants (`approve`, `approve_…`) or refuses (`deny`, `deny_…`).
pub(crate) fn approval_grants(option: &str) -> Option<bool> {
    match option {
        "approve" => Some(true),
        "deny" => Some(false),
        o if o.starts_with("approve_") && o.len() > 8 => Some(true),
        o if o.starts_with("deny_") && o.len() > 5 => Some(false),
        _ => None,
    }
}

#[utoipa::path(post, path = "/v1/tasks/{task}/approvals", tag = "worker", request_body = RequestApproval,
    params(("task" = String, Path)),
    responses((status = 201, body = Decision), (status = 422, body = Problem)))]
pub(crate) async fn request_approval(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path(task_id): Path<String>,
    Json(req): Json<RequestApproval>,
) -> ApiResult<Created<Decision>> {
    check_text("summary", &req.summary, 2000, true)?;
    let digest = field_digest("intent", &req.intent)?;
    if let Some(given) = &req.intent_digest
        && *given != digest
    {
        return Err(invalid(format!(
            "`intent_digest` {given} does not match the intent's canonical JSON ({digest})"
        ))
        .with("expected", &digest));
    }
    let default = req.default_option.clone().unwrap_or_else(|| "deny".into());
    if default != "approve" && default != "deny" {
        return Err(invalid(
            "`default_option` of an approval is `approve` or `deny`",
        ));
    }
    let options = approval_options(&req.options)?;
    let expires_at = expiry_ms(&st, req.expires_in_seconds)?;
    audited(&st, &caller, "approval.request", async {
        let mut tx = st.store.write().await?;
        let task = task_for(&mut tx, &caller, &task_id).await?;
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
            kind: DecisionKind::Approval.as_str().into(),
            status: DecisionStatus::Pending.as_str().into(),
            step: req.step.clone(),
            question: req.summary.clone(),
            options: to_value(&options),
            default_option: Some(default),
            intent: Some(req.intent.clone()),
            intent_digest: Some(digest),
            effect_id: req.effect_id.clone(),
            plan_revision: task.plan_revision,
            risky: req.risky,
            expires_at,
            created_at: now_ms(),
            outcome: None,
            durability: req.durability.map(|d| d.as_str().to_owned()),
            delivery: None,
        };
        let out = open_decision(&mut tx, task, row).await?;
        tx.commit().await?;
        Ok(out)
    })
    .await
}

#[utoipa::path(post, path = "/v1/tasks/{task}/decisions", tag = "worker", request_body = RequestDecision,
    params(("task" = String, Path)),
    responses((status = 201, body = Decision), (status = 422, body = Problem)))]
pub(crate) async fn request_decision(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path(task_id): Path<String>,
    Json(req): Json<RequestDecision>,
) -> ApiResult<Created<Decision>> {
    check_text("question", &req.question, 4000, true)?;
    if req.kind == DecisionKind::Approval {
        return Err(invalid(
            "ask for approvals with `POST /v1/tasks/{task}/approvals`, which binds the intent digest",
        ));
    }
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
    let expires_at = expiry_ms(&st, req.expires_in_seconds)?;
    audited(&st, &caller, "decision.request", async {
        let mut tx = st.store.write().await?;
        let task = task_for(&mut tx, &caller, &task_id).await?;
        refuse_terminal(&task)?;
        optional_fence(&mut tx, &task, &req.attempt_id, req.fence).await?;
        let row = DecisionRow {
            id: ids::decision(),
            task_id: task.id.clone(),
            kind: req.kind.as_str().into(),
            status: DecisionStatus::Pending.as_str().into(),
            step: req.step.clone(),
            question: req.question.clone(),
            options: to_value(&req.options),
            default_option: req.default_option.clone(),
            intent: None,
            intent_digest: None,
            effect_id: None,
            plan_revision: task.plan_revision,
            risky: false,
            expires_at,
            created_at: now_ms(),
            outcome: None,
            durability: None,
            delivery: None,
        };
        let out = open_decision(&mut tx, task, row).await?;
        tx.commit().await?;
        Ok(out)
    })
    .await
}

/// Closes a pending decision with an outcome, and lets the task run again when nothing else
/// waits. Returns the newest cursor written.
pub(crate) async fn close_decision(
    tx: &mut Tx,
    decision: &mut DecisionRow,
    status: DecisionStatus,
    outcome: DecisionOutcome,
) -> ApiResult<i64> {
    decision.status = status.as_str().into();
    if decision.durability.is_some() && status == DecisionStatus::Resolved {
        // Answered here; it counts once the runtime's adapter reports the runtime took it.
        decision.delivery = Some(to_value(&Delivery {
            state: DeliveryState::Pending,
            detail: None,
            at: outcome.at,
        }));
    }
    decision.outcome = Some(to_value(&outcome));
    tx.update_decision(decision).await?;
    let mut task = tx
        .task(&decision.task_id)
        .await?
        .ok_or_else(|| ApiError::new(ErrorCode::Internal, "decision without task"))?;
    let wire = convert::decision(decision)?;
    let mut cursor = emit(tx, &task, EventKind::DecisionClosed, &wire).await?;
    if decision.kind == DecisionKind::Recovery.as_str() && status == DecisionStatus::Resolved {
        return Ok(
            cursor.max(crate::recovery::after_recovery_decision(tx, decision, &outcome).await?)
        );
    }
    let waiting = matches!(task.state.as_str(), "waiting_approval" | "waiting_human");
    if waiting && tx.pending_decision_count(&task.id).await? == 0 {
        task.state = TaskState::Running.as_str().into();
        task.updated_at = now_ms();
        tx.update_task(&task).await?;
        cursor = emit_task(tx, &task, EventKind::TaskUpdated).await?;
    }
    Ok(cursor)
}

#[utoipa::path(post, path = "/v1/admin/decisions/{decision}/resolve", tag = "admin", request_body = ResolveDecision,
    params(("decision" = String, Path)),
    responses((status = 200, body = Decision), (status = 409, body = Problem, description = "`decision_closed`, `revision_conflict`")))]
pub(crate) async fn admin_resolve(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path(decision_id): Path<String>,
    Json(req): Json<ResolveDecision>,
) -> ApiResult<Out<Written<Decision>>> {
    if caller.kind != CallerKind::Admin {
        return Err(ApiError::new(
            ErrorCode::Forbidden,
            "resolving decisions here needs the admin token",
        ));
    }
    audited(&st, &caller, "decision.resolve", async {
        let mut tx = st.store.write().await?;
        let mut d = tx
            .decision(&decision_id)
            .await?
            .ok_or_else(|| ApiError::not_found("decision", &decision_id))?;
        let task = task_for(&mut tx, &caller, &d.task_id).await?;
        if d.status != DecisionStatus::Pending.as_str() {
            return Err(ApiError::new(
                ErrorCode::DecisionClosed,
                format!("decision `{}` is {}", d.id, d.status),
            )
            .with("status", &d.status)
            .on_task(&task.id));
        }
        if d.expires_at <= now_ms() {
            return Err(ApiError::new(
                ErrorCode::DecisionClosed,
                format!("decision `{}` has expired", d.id),
            )
            .on_task(&task.id));
        }
        if d.kind == "approval" && d.plan_revision != task.plan_revision {
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
        let options: Vec<DecisionOption> =
            serde_json::from_value(d.options.clone()).unwrap_or_default();
        match &req.option {
            Some(o) if !options.iter().any(|x| &x.id == o) => {
                return Err(invalid(format!("`{o}` is not an option of this decision")));
            }
            None if !options.is_empty() => {
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
            at: chrono::Utc::now(),
        };
        let cursor = close_decision(&mut tx, &mut d, DecisionStatus::Resolved, outcome).await?;
        tx.commit().await?;
        Ok(Out(Written {
            cursor,
            value: convert::decision(&d)?,
        }))
    })
    .await
}

#[utoipa::path(post, path = "/v1/tasks/{task}/decisions/{decision}/delivery", tag = "worker", request_body = ReportDelivery,
    params(("task" = String, Path), ("decision" = String, Path)),
    responses((status = 200, body = Decision),
              (status = 409, body = Problem, description = "`decision_closed`: not an answered runtime approval, or its delivery was reported otherwise"),
              (status = 422, body = Problem)))]
pub(crate) async fn report_delivery(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path((task_id, decision_id)): Path<(String, String)>,
    Json(req): Json<ReportDelivery>,
) -> ApiResult<Out<Written<Decision>>> {
    if req.state == DeliveryState::Pending {
        return Err(invalid("report `acknowledged` or `lost`"));
    }
    if let Some(d) = &req.detail {
        check_text("detail", d, 2000, false)?;
    }
    audited(&st, &caller, "decision.delivery", async {
        let mut tx = st.store.write().await?;
        let task = task_for(&mut tx, &caller, &task_id).await?;
        optional_fence(&mut tx, &task, &req.attempt_id, req.fence).await?;
        let mut d = runtime_decision(&mut tx, &task, &decision_id).await?;
        let current: Option<Delivery> = d
            .delivery
            .as_ref()
            .and_then(|v| serde_json::from_value(v.clone()).ok());
        match current.map(|c| c.state) {
            Some(DeliveryState::Pending) => {}
            Some(s) if s == req.state => {
                let cursor = tx.max_cursor().await?;
                return Ok(Out(Written {
                    cursor,
                    value: convert::decision(&d)?,
                }));
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
                .with("status", &d.status)
                .on_task(&task.id));
            }
        }
        d.delivery = Some(to_value(&Delivery {
            state: req.state,
            detail: req.detail.clone(),
            at: chrono::Utc::now(),
        }));
        tx.update_decision(&d).await?;
        let wire = convert::decision(&d)?;
        let cursor = emit(&mut tx, &task, EventKind::DecisionUpdated, &wire).await?;
        tx.commit().await?;
        Ok(Out(Written {
            cursor,
            value: wire,
        }))
    })
    .await
}

#[utoipa::path(post, path = "/v1/tasks/{task}/decisions/{decision}/expire", tag = "worker", request_body = ExpireDecision,
    params(("task" = String, Path), ("decision" = String, Path)),
    responses((status = 200, body = Decision),
              (status = 409, body = Problem, description = "`decision_closed`"),
              (status = 422, body = Problem)))]
pub(crate) async fn expire_decision(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path((task_id, decision_id)): Path<(String, String)>,
    Json(req): Json<ExpireDecision>,
) -> ApiResult<Out<Written<Decision>>> {
    check_text("reason", &req.reason, 2000, true)?;
    audited(&st, &caller, "decision.expire", async {
        let mut tx = st.store.write().await?;
        let task = task_for(&mut tx, &caller, &task_id).await?;
        optional_fence(&mut tx, &task, &req.attempt_id, req.fence).await?;
        let mut d = runtime_decision(&mut tx, &task, &decision_id).await?;
        if d.status != DecisionStatus::Pending.as_str() {
            return Err(ApiError::new(
                ErrorCode::DecisionClosed,
                format!("decision `{}` is {}", d.id, d.status),
            )
            .with("status", &d.status)
            .on_task(&task.id));
        }
        // No option applies: the runtime decides on its own, and nothing is reported approved.
        let outcome = DecisionOutcome {
            option: None,
            text: Some(req.reason.clone()),
            by: "runtime".into(),
            at: chrono::Utc::now(),
        };
        let cursor = close_decision(&mut tx, &mut d, DecisionStatus::Expired, outcome).await?;
        tx.commit().await?;
        Ok(Out(Written {
            cursor,
            value: convert::decision(&d)?,
        }))
    })
    .await
}

/// A decision of this task that a runtime holds (it has a durability class).
async fn runtime_decision(
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

/// Query of an artifact upload (the body is the raw content).
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub(crate) struct ArtifactQuery {
    /// File name.
    name: String,
    /// Plan step.
    step: Option<String>,
    /// The writing attempt.
    attempt_id: Option<String>,
    /// Its fence.
    fence: Option<i64>,
}

#[utoipa::path(post, path = "/v1/tasks/{task}/artifacts", tag = "worker",
    params(("task" = String, Path), ArtifactQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "the raw content; its media type in `Content-Type`"),
    responses((status = 201, body = Artifact), (status = 413, body = Problem)))]
pub(crate) async fn upload_artifact(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path(task_id): Path<String>,
    Query(q): Query<ArtifactQuery>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Created<Artifact>> {
    check_text("name", &q.name, 255, true)?;
    let media_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/octet-stream")
        .to_owned();
    let bytes = read_limited(body, st.config.max_blob_bytes, st.config.body_timeout).await?;
    let sha = sha256_hex(&bytes);
    audited(&st, &caller, "artifact.upload", async {
        let mut tx = st.store.write().await?;
        let task = task_for(&mut tx, &caller, &task_id).await?;
        optional_fence(&mut tx, &task, &q.attempt_id, q.fence).await?;
        tx.put_blob(&sha, &bytes).await?;
        let row = ArtifactRow {
            id: ids::artifact(),
            task_id: task.id.clone(),
            sha256: sha.clone(),
            name: q.name.clone(),
            media_type: media_type.clone(),
            size: bytes.len() as i64,
            step: q.step.clone(),
            created_at: now_ms(),
        };
        tx.insert_artifact(&row).await?;
        let wire = convert::artifact(&row);
        let cursor = emit(&mut tx, &task, EventKind::ArtifactAdded, &wire).await?;
        tx.commit().await?;
        Ok(created(cursor, wire))
    })
    .await
}

#[utoipa::path(post, path = "/v1/tasks/{task}/test-receipts", tag = "worker", request_body = SubmitTestReceipt,
    params(("task" = String, Path)),
    responses((status = 201, body = TestReceipt), (status = 422, body = Problem, description = "not JUnit XML")))]
pub(crate) async fn submit_test_receipt(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path(task_id): Path<String>,
    Json(req): Json<SubmitTestReceipt>,
) -> ApiResult<Created<TestReceipt>> {
    check_text("command", &req.command, 4000, true)?;
    if req.junit_xml.len() > st.config.max_blob_bytes {
        return Err(ApiError::new(
            ErrorCode::PayloadTooLarge,
            "`junit_xml` is larger than the artifact limit",
        ));
    }
    let parsed = crate::junit::parse(&req.junit_xml)
        .map_err(|e| invalid(format!("`junit_xml` is not JUnit XML: {e}")))?;
    audited(&st, &caller, "test_receipt.submit", async {
        let mut tx = st.store.write().await?;
        let task = task_for(&mut tx, &caller, &task_id).await?;
        fenced_attempt(&mut tx, &task, &req.attempt_id, req.fence).await?;
        let now = now_ms();
        let sha = sha256_hex(req.junit_xml.as_bytes());
        tx.put_blob(&sha, req.junit_xml.as_bytes()).await?;
        let receipt_id = ids::receipt();
        let artifact = ArtifactRow {
            id: ids::artifact(),
            task_id: task.id.clone(),
            sha256: sha.clone(),
            name: format!("junit-{receipt_id}.xml"),
            media_type: "application/xml".into(),
            size: req.junit_xml.len() as i64,
            step: req.step.clone(),
            created_at: now,
        };
        tx.insert_artifact(&artifact).await?;
        emit(
            &mut tx,
            &task,
            EventKind::ArtifactAdded,
            convert::artifact(&artifact),
        )
        .await?;
        let passed = req.exit_code == 0 && parsed.totals.failures == 0 && parsed.totals.errors == 0;
        let row = ReceiptRow {
            id: receipt_id,
            task_id: task.id.clone(),
            step: req.step.clone(),
            command: req.command.clone(),
            exit_code: req.exit_code.into(),
            commit: req.commit.clone(),
            totals: to_value(&parsed.totals),
            failures: to_value(&parsed.failures),
            duration_seconds: parsed.duration_seconds,
            passed,
            junit_sha256: sha,
            created_at: now,
        };
        tx.insert_receipt(&row).await?;
        let wire = convert::receipt(&row)?;
        let cursor = emit(&mut tx, &task, EventKind::TestReceiptAdded, &wire).await?;
        tx.commit().await?;
        Ok(created(cursor, wire))
    })
    .await
}

/// Reply to appending messages.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub(crate) struct MessagesAppended {
    /// The stored messages.
    messages: Vec<Message>,
}

#[utoipa::path(post, path = "/v1/tasks/{task}/messages", tag = "worker", request_body = AppendMessages,
    params(("task" = String, Path)),
    responses((status = 201, body = MessagesAppended)))]
pub(crate) async fn append_messages(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path(task_id): Path<String>,
    Json(req): Json<AppendMessages>,
) -> ApiResult<Created<MessagesAppended>> {
    if req.messages.is_empty() || req.messages.len() > 1000 {
        return Err(invalid("send between 1 and 1000 messages"));
    }
    for m in &req.messages {
        check_text("messages[].role", &m.role, 32, true)?;
        check_text("messages[].text", &m.text, 1 << 20, false)?;
    }
    audited(&st, &caller, "messages.append", async {
        let mut tx = st.store.write().await?;
        let task = task_for(&mut tx, &caller, &task_id).await?;
        optional_fence(&mut tx, &task, &req.attempt_id, req.fence).await?;
        let now = now_ms();
        let mut out = Vec::with_capacity(req.messages.len());
        for m in &req.messages {
            let mut row = MessageRow {
                session_id: task.session_id.clone(),
                task_id: task.id.clone(),
                seq: 0,
                role: m.role.clone(),
                text: st.config.redaction.text(&m.text).0,
                created_at: now,
            };
            row.seq = tx.insert_message(&row).await?;
            out.push(convert::message(&row));
        }
        let value = MessagesAppended { messages: out };
        let cursor = emit(&mut tx, &task, EventKind::MessagesAppended, &value).await?;
        tx.commit().await?;
        Ok(created(cursor, value))
    })
    .await
}

#[utoipa::path(post, path = "/v1/tasks/{task}/usage", tag = "worker", request_body = ReportUsage,
    params(("task" = String, Path)),
    responses((status = 200, body = UsageReported)))]
pub(crate) async fn report_usage(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path(task_id): Path<String>,
    Json(req): Json<ReportUsage>,
) -> ApiResult<Out<Written<UsageReported>>> {
    if !req.cost_usd.is_finite() || req.cost_usd < 0.0 {
        return Err(invalid("`cost_usd` must be a non-negative number"));
    }
    audited(&st, &caller, "usage.report", async {
        let mut tx = st.store.write().await?;
        let mut task = task_for(&mut tx, &caller, &task_id).await?;
        optional_fence(&mut tx, &task, &req.attempt_id, req.fence).await?;
        let mut usage: Usage = serde_json::from_value(task.usage.clone()).unwrap_or_default();
        usage.tokens = usage.tokens.saturating_add(req.tokens);
        usage.cost_usd += req.cost_usd;
        usage.wall_seconds = usage.wall_seconds.saturating_add(req.wall_seconds);
        task.usage = to_value(&usage);
        task.updated_at = now_ms();
        tx.update_task(&task).await?;
        let mut cursor = emit_task(&mut tx, &task, EventKind::TaskUpdated).await?;
        let budget_decision = match crate::budget::crossed(&mut tx, &task).await? {
            Some(row) => {
                let (_, Out(w)) = open_decision(&mut tx, task.clone(), row).await?;
                cursor = cursor.max(w.cursor);
                Some(w.value)
            }
            None => None,
        };
        let task = tx.task(&task.id).await?.unwrap_or(task);
        let wire = task_wire(&mut tx, &task).await?;
        tx.commit().await?;
        Ok(Out(Written {
            cursor,
            value: UsageReported {
                task: wire,
                budget_decision,
            },
        }))
    })
    .await
}

#[utoipa::path(post, path = "/v1/attempts/{attempt}/finish", tag = "worker", request_body = FinishAttempt,
    params(("attempt" = String, Path)),
    responses((status = 200, body = Attempt), (status = 409, body = Problem, description = "`fenced`, `lease_expired`, `attempt_closed`")))]
pub(crate) async fn finish(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path(attempt_id): Path<String>,
    Json(req): Json<FinishAttempt>,
) -> ApiResult<Out<Written<Attempt>>> {
    if let Some(s) = &req.summary {
        check_text("summary", s, 20_000, false)?;
    }
    audited(&st, &caller, "attempt.finish", async {
        let mut tx = st.store.write().await?;
        let mut attempt = tx
            .attempt(&attempt_id)
            .await?
            .ok_or_else(|| ApiError::not_found("attempt", &attempt_id))?;
        let mut task = task_for(&mut tx, &caller, &attempt.task_id).await?;
        check_fence(&task, &attempt, req.fence, now_ms())?;
        let now = now_ms();
        attempt.state = AttemptState::Finished.as_str().into();
        attempt.ended_at = Some(now);
        attempt.outcome = Some(req.outcome.as_str().into());
        if !req.released.is_empty() {
            attempt.released = Some(to_value(&req.released));
        }
        tx.update_attempt(&attempt).await?;
        let next = req.outcome.task_state();
        task.state = next.as_str().into();
        if req.summary.is_some() {
            task.outcome_summary = req.summary.clone();
        }
        task.updated_at = now;
        tx.update_task(&task).await?;
        if next.is_terminal() {
            for mut d in tx.list_decisions(&task.id).await? {
                if d.status == DecisionStatus::Pending.as_str() {
                    let outcome = DecisionOutcome {
                        option: None,
                        text: Some(format!("the task ended {next}")),
                        by: "server".into(),
                        at: chrono::Utc::now(),
                    };
                    close_decision(&mut tx, &mut d, DecisionStatus::Void, outcome).await?;
                }
            }
        }
        let wire = convert::attempt(&attempt)?;
        emit(&mut tx, &task, EventKind::AttemptEnded, &wire).await?;
        let cursor = emit_task(&mut tx, &task, EventKind::TaskUpdated).await?;
        tx.commit().await?;
        Ok(Out(Written {
            cursor,
            value: wire,
        }))
    })
    .await
}
