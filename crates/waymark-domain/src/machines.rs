//! Machines and their runners (the hands): a runner registers what its machine has and allows,
//! asks for its work (which is its heartbeat), and reports what became of each item; a signed
//! `start_run` addresses a new run to a machine; when a runtime process ends mid-run, the task
//! goes through recovery — calls in flight become cards, admission is checked, and only then is
//! a resume addressed to the machine. Follow-ups and answers to deferred approvals resume the
//! runtime the same way. The runner decides nothing of this: it is a client, and its host's
//! allow-list is the one thing it checks itself.

use std::path::Path;

use serde_json::{Value, json};
use waymark_proto::*;
use waymark_store::*;

use crate::Context;
use crate::caller::Caller;
use crate::convert;
use crate::core::*;
use crate::devices::{Rejection, Verified, has_scope, reject};
use crate::error::{ApiError, ApiResult};
use crate::recovery::{self, admission, freeze, refuse_admission, resumed_anyway};

/// Longest prompt a `start_run` carries.
const MAX_PROMPT_CHARS: usize = 20_000;

/// The machine a runner's token speaks for, or a refusal for any other caller.
fn runner_machine(caller: &Caller) -> ApiResult<&str> {
    caller.machine.as_deref().ok_or_else(|| {
        ApiError::new(
            ErrorCode::Forbidden,
            "only a runner's token reaches the runner routes; make one with `waymark admin runner-token --machine NAME`",
        )
    })
}

/// Whether the machine was heard from within [`MACHINE_OFFLINE_AFTER_MS`] of `now`.
fn online(m: &MachineRow, now: i64) -> bool {
    m.last_seen_at
        .is_some_and(|at| now - at < MACHINE_OFFLINE_AFTER_MS)
}

/// The wire form of a machine, its online state read against `now`.
fn machine_wire(m: &MachineRow, owner: &str, active: Vec<String>, now: i64) -> Machine {
    let info = convert::machine_info(m);
    let online = online(m, now);
    Machine {
        id: m.id.clone(),
        name: m.name.clone(),
        owner: owner.to_owned(),
        online,
        last_seen_at: m.last_seen_at.map(convert::dt),
        offline_since: m
            .last_seen_at
            .filter(|_| !online)
            .map(|at| convert::dt(at + MACHINE_OFFLINE_AFTER_MS)),
        runtimes: info
            .as_ref()
            .map(|i| i.runtimes.clone())
            .unwrap_or_default(),
        directories: info
            .as_ref()
            .map(|i| i.directories.clone())
            .unwrap_or_default(),
        runner_version: info.as_ref().map(|i| i.runner_version.clone()),
        inhibits_sleep: info.is_some_and(|i| i.inhibits_sleep),
        active_tasks: active,
    }
}

async fn wire(tx: &mut Tx, m: &MachineRow) -> ApiResult<Machine> {
    let owner = tx
        .user_by_id(&m.owner_id)
        .await?
        .map(|u| u.name)
        .unwrap_or_default();
    let active = tx
        .machine_tasks(&m.id)
        .await?
        .into_iter()
        .filter(|t| !t.state.is_terminal())
        .map(|t| t.id)
        .collect();
    Ok(machine_wire(m, &owner, active, tx.now))
}

/// `GET /v1/machines`: the caller's machines (a runner: its own).
pub async fn list(st: &Context, caller: &Caller) -> ApiResult<MachineList> {
    let mut tx = Tx::read(st).await?;
    let rows = tx.list_machines(caller.owner_filter()).await?;
    let mut machines = Vec::with_capacity(rows.len());
    for m in rows {
        if caller.machine.as_ref().is_some_and(|id| *id != m.id) {
            continue;
        }
        machines.push(wire(&mut tx, &m).await?);
    }
    Ok(MachineList { machines })
}

/// Whether `dir` is an absolute path in plain form: no `.` or `..` components, no empty
/// segment, no NUL — so "under an allowed directory" can be decided on the text.
fn plain_absolute(dir: &str) -> bool {
    if dir == "/" {
        return true;
    }
    dir.strip_prefix('/').is_some_and(|rest| {
        !dir.contains('\0')
            && rest
                .split('/')
                .all(|seg| !seg.is_empty() && seg != "." && seg != "..")
    })
}

/// Whether `dir` is `root` or under it (both plain absolute paths).
pub fn is_under(dir: &str, root: &str) -> bool {
    Path::new(dir).starts_with(Path::new(root))
}

/// `PUT /v1/runner/machine`: what the runner found and what its owner allowed there.
pub async fn register(st: &Context, caller: &Caller, req: RegisterMachine) -> ApiResult<Machine> {
    let id = runner_machine(caller)?.to_owned();
    if req.runtimes.len() > 32 || req.directories.len() > 64 {
        return Err(invalid("at most 32 runtimes and 64 directories"));
    }
    for r in &req.runtimes {
        check_text("runtimes[].runtime", &r.runtime, 64, true)?;
        if let Some(v) = &r.version {
            check_text("runtimes[].version", v, 200, false)?;
        }
    }
    for d in &req.directories {
        if d.len() > 4096 || !plain_absolute(d) {
            return Err(invalid(format!(
                "`{}` is not an absolute directory in plain form (no `.`, `..` or trailing `/`)",
                clip(d, 200)
            )));
        }
    }
    check_text("runner_version", &req.runner_version, 64, true)?;
    let mut req = req;
    crate::rules::check_runtime_rules(&mut req.runtime_rules)?;
    let mut tx = Tx::write(st).await?;
    let mut m = tx
        .machine(&id)
        .await?
        .ok_or_else(|| ApiError::not_found("machine", &id))?;
    m.info = to_value(&req);
    m.registered_at = Some(tx.now);
    m.last_seen_at = Some(tx.now);
    tx.update_machine(&m).await?;
    let out = wire(&mut tx, &m).await?;
    let row = note(
        &tx,
        caller,
        "machine.register",
        None,
        "registered",
        &format!(
            "runtimes: {}; directories: {}; the runtimes' own rules: {}",
            req.runtimes
                .iter()
                .map(|r| r.runtime.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            req.directories.join(", "),
            req.runtime_rules.len()
        ),
    );
    tx.insert_audit(&row).await?;
    tx.commit().await?;
    Ok(out)
}

/// An audit entry for something done (not refused), for the change's own transaction.
fn note(
    tx: &Tx,
    caller: &Caller,
    action: &str,
    task: Option<&str>,
    code: &str,
    detail: &str,
) -> AuditRow {
    audit_row(tx.now, &caller.actor(), action, task, code, detail)
}

/// The machine's open work, and the runs the control plane believes are under way there
/// (runs its runner started whose attempt holds the lease): the runner reports those it is
/// not running. Asking is the machine's heartbeat.
pub async fn open_work(st: &Context, caller: &Caller) -> ApiResult<WorkList> {
    let id = runner_machine(caller)?.to_owned();
    let mut tx = Tx::write(st).await?;
    let mut m = tx
        .machine(&id)
        .await?
        .ok_or_else(|| ApiError::not_found("machine", &id))?;
    m.last_seen_at = Some(tx.now);
    tx.update_machine(&m).await?;
    let work = tx
        .open_work(&id)
        .await?
        .iter()
        .map(work_wire)
        .collect::<ApiResult<Vec<_>>>()?;
    let mut running = Vec::new();
    for t in tx.machine_tasks(&id).await? {
        if t.state.is_terminal() {
            continue;
        }
        let attempts = tx.list_attempts(&t.id).await?;
        let work = tx.task_work(&t.id).await?;
        if run_of(&work).is_none() {
            continue;
        }
        // Running: it holds an attempt, or its runner started it and it has not reached us yet
        // (a runner that lost it — killed before it saved it — reports it gone).
        let live = attempts.iter().any(|a| a.state == AttemptState::Active);
        let waits = matches!(t.state, TaskState::Paused | TaskState::NeedsHuman);
        if live || (!waits && unreached(&work, &attempts).is_some()) {
            running.push(t.id);
        }
    }
    tx.commit().await?;
    Ok(WorkList { work, running })
}

/// Whether the machine has open work: the one read a waiting work request repeats.
pub async fn has_work(st: &Context, caller: &Caller) -> ApiResult<bool> {
    let id = runner_machine(caller)?;
    Ok(!Tx::read(st).await?.open_work(id).await?.is_empty())
}

fn work_wire(w: &WorkRow) -> ApiResult<Work> {
    let run: RunSpec = serde_json::from_value(w.args.get("run").cloned().unwrap_or_default())
        .map_err(|e| {
            ApiError::new(
                ErrorCode::Internal,
                format!("a stored work item is unreadable: {e}"),
            )
        })?;
    let resume: Option<ResumeSpec> = w
        .args
        .get("resume")
        .cloned()
        .and_then(|r| serde_json::from_value(r).ok());
    Ok(Work {
        id: w.id.clone(),
        task_id: w.task_id.clone(),
        kind: w.kind,
        state: w.state,
        run,
        resume,
        created_at: convert::dt(w.created_at),
        detail: w.detail.clone(),
    })
}

/// `POST /v1/runner/work/{work}`: the runner took an item, did it, refused it or failed.
pub async fn report(
    st: &Context,
    caller: &Caller,
    work_id: &str,
    req: ReportWork,
) -> ApiResult<Work> {
    let id = runner_machine(caller)?.to_owned();
    if let Some(d) = &req.detail {
        check_text("detail", d, 2000, false)?;
    }
    let mut tx = Tx::write(st).await?;
    let mut w = tx
        .work(work_id)
        .await?
        .filter(|w| w.machine_id == id)
        .ok_or_else(|| ApiError::not_found("work", work_id))?;
    if w.state == req.state {
        return work_wire(&w);
    }
    let legal = match (w.state, req.state) {
        (WorkState::Pending, WorkState::Taken) => true,
        (WorkState::Pending | WorkState::Taken, s) => {
            matches!(s, WorkState::Done | WorkState::Refused | WorkState::Failed)
        }
        _ => false,
    };
    if !legal {
        return Err(ApiError::new(
            ErrorCode::IllegalTransition,
            format!(
                "the work item is {}; it cannot become {}",
                w.state, req.state
            ),
        )
        .with("state", w.state.as_str()));
    }
    let Some(mut task) = tx.task(&w.task_id).await? else {
        return Err(ApiError::not_found("task", &w.task_id));
    };
    w.state = req.state;
    w.detail = req.detail.clone();
    w.updated_at = tx.now;
    tx.update_work(&w).await?;
    let machine = tx.machine(&id).await?.map(|m| m.name).unwrap_or_default();
    let detail = req.detail.clone().unwrap_or_default();
    let action = format!("runner.{}", w.kind);
    match req.state {
        WorkState::Refused | WorkState::Failed => {
            let what = if req.state == WorkState::Refused {
                "refused"
            } else {
                "could not"
            };
            let text = format!("{machine} {what} to {} the run: {detail}", w.kind);
            say(&mut tx, &task, "system", text.clone()).await?;
            // A run that never started has failed; one that could not resume needs a person.
            let then = match w.kind {
                WorkKind::Start => Some(TaskState::Failed),
                WorkKind::Resume => Some(TaskState::NeedsHuman),
                WorkKind::Stop => None,
            };
            if let Some(state) = then.filter(|_| !task.state.is_terminal()) {
                task.state = state;
                task.outcome_summary = Some(text.clone());
                task.updated_at = tx.now;
                tx.update_task(&task).await?;
                emit_task(&mut tx, &task, EventKind::TaskUpdated).await?;
            }
            let row = note(
                &tx,
                caller,
                &action,
                Some(&task.id),
                req.state.as_str(),
                &text,
            );
            tx.insert_audit(&row).await?;
        }
        WorkState::Done => {
            let text = match w.kind {
                WorkKind::Start => format!("{machine} started the run"),
                WorkKind::Resume => format!("{machine} resumed the run"),
                WorkKind::Stop => format!("{machine} stopped the run"),
            };
            say(&mut tx, &task, "system", text).await?;
            let row = note(&tx, caller, &action, Some(&task.id), "done", &detail);
            tx.insert_audit(&row).await?;
        }
        _ => {}
    }
    let out = work_wire(&w)?;
    tx.commit().await?;
    Ok(out)
}

/// The run a task was started with (its first `start` item among `work`, the task's items),
/// if a runner started it.
fn run_of(work: &[WorkRow]) -> Option<RunSpec> {
    let start = work.iter().find(|w| w.kind == WorkKind::Start)?;
    serde_json::from_value(start.args.get("run").cloned()?).ok()
}

/// Addresses a resume of the task's runtime session to its machine, once: an open resume not
/// yet taken is replaced by one carrying both messages. `None`: the task was not started by a
/// runner (nothing to resume there).
pub async fn queue_resume(
    tx: &mut Tx,
    task: &TaskRow,
    reason: &str,
    message: Option<String>,
) -> ApiResult<Option<String>> {
    let Some(machine_id) = task.machine_id.clone() else {
        return Ok(None);
    };
    if task.state.is_terminal() {
        return Ok(None);
    }
    let work = tx.task_work(&task.id).await?;
    let Some(run) = run_of(&work) else {
        return Ok(None);
    };
    let mut message = message;
    for mut w in work {
        if w.kind == WorkKind::Resume && w.state == WorkState::Pending {
            let earlier: Option<ResumeSpec> = w
                .args
                .get("resume")
                .cloned()
                .and_then(|r| serde_json::from_value(r).ok());
            if let Some(old) = earlier.and_then(|r| r.message) {
                message = Some(match message {
                    Some(m) => format!("{old}\n\n{m}"),
                    None => old,
                });
            }
            w.state = WorkState::Void;
            w.detail = Some("replaced by a newer resume".into());
            w.updated_at = tx.now;
            tx.update_work(&w).await?;
        }
    }
    let id = ids::work();
    let now = tx.now;
    tx.insert_work(&WorkRow {
        id: id.clone(),
        machine_id,
        task_id: task.id.clone(),
        kind: WorkKind::Resume,
        args: json!({
            "run": run,
            "resume": ResumeSpec { reason: reason.to_owned(), message },
        }),
        state: WorkState::Pending,
        detail: None,
        created_at: now,
        updated_at: now,
    })
    .await?;
    Ok(Some(id))
}

/// After an answer to a durable (deferred) approval: the runtime waits for it across its own
/// exit, so the run is resumed on its machine — nobody touches the host.
pub async fn after_durable_answer(tx: &mut Tx, task_id: &str) -> ApiResult<()> {
    // Most deferred answers are for runs no runner started: nothing more to read for those.
    let Some(task) = tx.task(task_id).await?.filter(|t| t.machine_id.is_some()) else {
        return Ok(());
    };
    let live = tx
        .list_attempts(task_id)
        .await?
        .iter()
        .any(|a| a.state == AttemptState::Active && a.expires_at > tx.now);
    if !live {
        queue_resume(tx, &task, "answered", None).await?;
    }
    Ok(())
}

/// After a person resumed a paused task: a runner's run that stopped at the pause (its
/// runtime let go of the attempt at the next hook) is resumed in its session, told why.
/// Whether a resume was addressed.
pub async fn after_resume(tx: &mut Tx, task: &TaskRow, by: &str) -> ApiResult<bool> {
    if task.machine_id.is_none() {
        return Ok(false);
    }
    let live = tx
        .list_attempts(&task.id)
        .await?
        .iter()
        .any(|a| a.state == AttemptState::Active && a.expires_at > tx.now);
    if live {
        // Still running: its next hook finds the task resumed.
        return Ok(false);
    }
    let message = format!(
        "{by} paused this run and has resumed it now. Go on from where you stopped; the tool call you were about to make when the pause came did not run."
    );
    Ok(queue_resume(tx, task, "resumed", Some(message))
        .await?
        .is_some())
}

/// After a recovery card was answered: once none is left pending and the task may go on, the
/// run is revived on its machine with the note of what is done, pending and unknown.
pub async fn after_recovery_answer(tx: &mut Tx, task_id: &str) -> ApiResult<()> {
    let Some(task) = tx.task(task_id).await? else {
        return Ok(());
    };
    if task.machine_id.is_none() || task.state.is_terminal() {
        return Ok(());
    }
    let pending = tx
        .list_decisions(task_id)
        .await?
        .into_iter()
        .any(|d| d.kind == DecisionKind::Recovery && d.status == DecisionStatus::Pending);
    if pending {
        return Ok(());
    }
    let note = resume_note(tx, &task, "a person answered the recovery questions").await?;
    queue_resume(tx, &task, "revive", Some(note)).await?;
    Ok(())
}

/// `POST /v1/runner/tasks/{task}/exited`: the task's runtime process ended. A run that ended
/// cleanly (no attempt holds its lease) needs nothing. A run cut off mid-turn goes through
/// recovery: its attempt is revoked (a new attempt and fence come with the resume), a call in
/// flight becomes a card and is never re-run blindly, admission is checked, and only then is a
/// resume with a note from the record addressed to the machine.
pub async fn exited(
    st: &Context,
    caller: &Caller,
    task_id: String,
    req: RunExited,
) -> ApiResult<ExitHandled> {
    runner_machine(caller)?;
    if let Some(d) = &req.detail {
        check_text("detail", d, 2000, false)?;
    }
    let mut tx = Tx::write(st).await?;
    let mut task = task_for(&mut tx, caller, &task_id).await?;
    if run_of(&tx.task_work(&task.id).await?).is_none() {
        return Err(invalid(
            "this runner did not start the task: only the runs it started are recovered through it",
        ));
    }
    let mut how = match (req.code, req.signal) {
        (_, Some(s)) => format!("signal {s}"),
        (Some(c), None) => format!("exit status {c}"),
        (None, None) => req.detail.clone().unwrap_or_else(|| "gone".into()),
    };
    if let (Some(d), true) = (&req.detail, req.code.is_some() || req.signal.is_some()) {
        // What the runner adds to an exit: e.g. that what the run had started outside its
        // process group was still running, and was ended.
        how = format!("{how}; {d}");
    }
    let now = tx.now;
    let mut cut = false;
    for mut a in tx.list_attempts(&task.id).await? {
        if a.state == AttemptState::Active {
            a.state = AttemptState::Revoked;
            a.ended_at = Some(now);
            tx.update_attempt(&a).await?;
            emit(
                &mut tx,
                &task,
                EventKind::AttemptEnded,
                convert::attempt(&a),
            )
            .await?;
            cut = true;
        }
    }
    if !cut && task.state != TaskState::RecoveryCandidate {
        if let Some(handled) = ended_before_reaching_us(&mut tx, caller, &task, &how).await? {
            tx.commit().await?;
            return Ok(handled);
        }
        tx.commit().await?;
        return Ok(ExitHandled {
            action: "nothing".into(),
            detail: format!("the run had ended ({how}); nothing to recover"),
        });
    }
    if task.state.is_terminal() {
        tx.commit().await?;
        return Ok(ExitHandled {
            action: "nothing".into(),
            detail: format!("the task is {}", task.state),
        });
    }
    // What the tree shows, beside each call in doubt: changed since the last call recorded,
    // or as it was left.
    let tree_now = match (
        recovery::recorded_tree(&tx.list_checkpoints(&task.id).await?),
        &req.tree,
    ) {
        (Some(was), Some(now)) => Some(
            now.differences_from(&was)
                .unwrap_or_else(|| "the working tree is as the last checkpoint left it".to_owned()),
        ),
        _ => None,
    };
    let mut frozen = Vec::new();
    let decisions = tx.list_decisions(&task.id).await?;
    for mut e in tx.list_effects(&task.id).await? {
        if !matches!(e.status, EffectStatus::Intended | EffectStatus::InProgress)
            || e.flag.is_some()
        {
            continue;
        }
        let waited = decisions.iter().find(|d| {
            d.effect_id.as_deref() == Some(e.id.as_str())
                && d.kind == DecisionKind::Approval
                && d.status == DecisionStatus::Pending
        });
        if let Some(d) = waited {
            // It waited for a person: it never ran. The approval stays; the resumed run asks
            // for the call again and is answered from it. A runtime that held it only on its
            // connection (Codex) asks under a new item, so this one is closed as not run.
            if d.durability == Some(ApprovalDurability::ConnectionBound) {
                e.status = EffectStatus::Failed;
                e.receipt = Some(serde_json::json!({
                    "error": format!("not run: the runtime process ended ({how}) while the call waited for a person's answer; the answer still decides when the run asks again"),
                }));
                e.updated_at = now;
                tx.update_effect(&e).await?;
                emit(
                    &mut tx,
                    &task,
                    EventKind::EffectUpdated,
                    convert::effect(&e),
                )
                .await?;
            }
            continue;
        }
        e.status = EffectStatus::Unknown;
        e.flag = Some(format!(
            "the runtime process ended ({how}) while this call was under way: whether it ran is unknown; a person decides"
        ));
        e.updated_at = now;
        tx.update_effect(&e).await?;
        emit(
            &mut tx,
            &task,
            EventKind::EffectUpdated,
            convert::effect(&e),
        )
        .await?;
        let mut evidence = format!(
            "the runtime process ended ({how}) after the call started and before it reported back"
        );
        if let Some(t) = &tree_now {
            evidence.push_str("; ");
            evidence.push_str(t);
        }
        frozen.push(freeze(&mut tx, &e, Some(&evidence)).await?);
    }
    say(
        &mut tx,
        &task,
        "system",
        format!("the runtime process ended mid-run ({how})"),
    )
    .await?;
    let actor_note = |tx: &Tx, code: &str, detail: &str| {
        note(tx, caller, "runner.exited", Some(&task_id), code, detail)
    };
    if !frozen.is_empty() {
        task = tx.task(&task.id).await?.unwrap_or(task);
        task.state = TaskState::NeedsHuman;
        task.updated_at = now;
        tx.update_task(&task).await?;
        emit_task(&mut tx, &task, EventKind::TaskUpdated).await?;
        let detail = format!(
            "{} call(s) were under way when the runtime ended ({how}); nothing is re-run until a person says whether they happened",
            frozen.len()
        );
        let row = actor_note(&tx, "needs_human", &detail);
        tx.insert_audit(&row).await?;
        tx.commit().await?;
        return Ok(ExitHandled {
            action: "needs_human".into(),
            detail,
        });
    }
    if task.state == TaskState::Paused {
        // Stopped at the pause (or died while paused): nothing to revive until a person
        // resumes it, and then the session goes on (`after_resume`).
        let detail = format!(
            "the runtime ended ({how}) while the task is paused; it is resumed when a person resumes the task"
        );
        let row = actor_note(&tx, "paused", &detail);
        tx.insert_audit(&row).await?;
        tx.commit().await?;
        return Ok(ExitHandled {
            action: "nothing".into(),
            detail,
        });
    }
    let req_attempt = StartAttempt {
        worker: caller.name.clone(),
        lease_seconds: None,
        manifest_digest: None,
        materials: req.tree.clone().map(|tree| Materials {
            tree: Some(tree),
            ..Materials::default()
        }),
    };
    let mut reasons = admission(&mut tx, &task, &req_attempt).await?;
    if let Some(changed) = runtime_changed(&mut tx, &task).await? {
        reasons.push(changed);
    }
    if !reasons.is_empty() {
        let _ = refuse_admission(&mut tx, task, &reasons).await?;
        let detail = format!("admission failed: {}", reasons.join("; "));
        let row = actor_note(&tx, "needs_human", &detail);
        tx.insert_audit(&row).await?;
        tx.commit().await?;
        return Ok(ExitHandled {
            action: "needs_human".into(),
            detail,
        });
    }
    let note_text = resume_note(
        &mut tx,
        &task,
        &format!("the runtime process ended ({how})"),
    )
    .await?;
    // A run its runner started, of a task that has not ended (both checked above): the
    // resume is addressed.
    queue_resume(&mut tx, &task, "revive", Some(note_text)).await?;
    task.state = TaskState::Queued;
    task.updated_at = now;
    tx.update_task(&task).await?;
    emit_task(&mut tx, &task, EventKind::TaskUpdated).await?;
    let detail = format!("the run is resumed on its machine ({how})");
    let row = actor_note(&tx, "resume", &detail);
    tx.insert_audit(&row).await?;
    tx.commit().await?;
    Ok(ExitHandled {
        action: "resume".into(),
        detail,
    })
}

/// How often a run may end before it reaches the control plane (its first hook, its adapter's
/// attempt) before a person is asked instead of starting it once more.
const TRIES_BEFORE_REACHING_US: usize = 3;

/// The newest start or resume a runner carried out whose runtime has not reached the control
/// plane since (no attempt started after it), when no other start or resume is open.
fn unreached<'a>(work: &'a [WorkRow], attempts: &[AttemptRow]) -> Option<&'a WorkRow> {
    let runs = |w: &&WorkRow| matches!(w.kind, WorkKind::Start | WorkKind::Resume);
    if work
        .iter()
        .filter(runs)
        .any(|w| matches!(w.state, WorkState::Pending | WorkState::Taken))
    {
        return None;
    }
    let newest = work
        .iter()
        .filter(runs)
        .filter(|w| w.state == WorkState::Done)
        .max_by_key(|w| w.created_at)?;
    let reached = attempts.iter().map(|a| a.started_at).max();
    reached
        .is_none_or(|at| at < newest.created_at)
        .then_some(newest)
}

/// A runtime that ended after its runner started (or resumed) it and before it reached the
/// control plane — killed before its first hook, or failing at once — left no attempt to revoke
/// and nothing under way: nothing ran under the record, so the run is started again the same
/// way (a `start` when it never reached us at all, else a `resume` with the note), up to
/// [`TRIES_BEFORE_REACHING_US`] times in a row; then a person decides. `None` when the run did
/// reach us after its newest start or resume (a clean end), or when nothing waits on it.
async fn ended_before_reaching_us(
    tx: &mut Tx,
    caller: &Caller,
    task: &TaskRow,
    how: &str,
) -> ApiResult<Option<ExitHandled>> {
    if task.state.is_terminal() || matches!(task.state, TaskState::Paused | TaskState::NeedsHuman) {
        return Ok(None);
    }
    let work = tx.task_work(&task.id).await?;
    let attempts = tx.list_attempts(&task.id).await?;
    if unreached(&work, &attempts).is_none() {
        return Ok(None);
    }
    let runs = |w: &&WorkRow| matches!(w.kind, WorkKind::Start | WorkKind::Resume);
    let reached = attempts.iter().map(|a| a.started_at).max();
    let Some(run) = run_of(&work) else {
        return Ok(None);
    };
    let tries = work
        .iter()
        .filter(runs)
        .filter(|w| w.state == WorkState::Done && reached.is_none_or(|at| w.created_at > at))
        .count();
    let mut task = task.clone();
    let now = tx.now;
    if tries >= TRIES_BEFORE_REACHING_US {
        let detail = format!(
            "the runtime ended before its session reached Waymark {tries} times in a row (last: {how}); nothing ran under the record — see the runner's log on its machine, then resume the task to try again"
        );
        say(tx, &task, "system", detail.clone()).await?;
        task.state = TaskState::NeedsHuman;
        task.outcome_summary = Some(detail.clone());
        task.updated_at = now;
        tx.update_task(&task).await?;
        emit_task(tx, &task, EventKind::TaskUpdated).await?;
        let row = note(
            tx,
            caller,
            "runner.exited",
            Some(&task.id),
            "needs_human",
            &detail,
        );
        tx.insert_audit(&row).await?;
        return Ok(Some(ExitHandled {
            action: "needs_human".into(),
            detail,
        }));
    }
    let detail = format!(
        "the runtime ended ({how}) before its session reached Waymark; nothing ran under the record, so it is started again (try {} of {TRIES_BEFORE_REACHING_US})",
        tries + 1
    );
    say(tx, &task, "system", detail.clone()).await?;
    if reached.is_none() {
        // It never reached us: the same start again, with the same session key the hooks find
        // the task by (a runner whose runtime already keeps that session resumes it instead).
        let machine_id = task.machine_id.clone().unwrap_or_default();
        tx.insert_work(&WorkRow {
            id: ids::work(),
            machine_id,
            task_id: task.id.clone(),
            kind: WorkKind::Start,
            args: json!({ "run": run }),
            state: WorkState::Pending,
            detail: None,
            created_at: now,
            updated_at: now,
        })
        .await?;
    } else {
        let note_text =
            resume_note(tx, &task, &format!("the runtime process ended ({how})")).await?;
        queue_resume(tx, &task, "revive", Some(note_text)).await?;
    }
    let row = note(
        tx,
        caller,
        "runner.exited",
        Some(&task.id),
        "restart",
        &detail,
    );
    tx.insert_audit(&row).await?;
    Ok(Some(ExitHandled {
        action: "restart".into(),
        detail,
    }))
}

/// Whether the runtime on the run's machine is another version than the one the run started
/// with (the runner registers what it finds each time it starts: an upgrade shows there). A
/// session resumed by another version may not take up its own state the same way, so a person
/// decides. `None` when either version is unknown.
async fn runtime_changed(tx: &mut Tx, task: &TaskRow) -> ApiResult<Option<String>> {
    let Some(run) = run_of(&tx.task_work(&task.id).await?) else {
        return Ok(None);
    };
    let Some(was) = run.runtime_version else {
        return Ok(None);
    };
    let (decisions, attempts) = (
        tx.list_decisions(&task.id).await?,
        tx.list_attempts(&task.id).await?,
    );
    if resumed_anyway(&decisions, &attempts) {
        return Ok(None);
    }
    let Some(machine) = task.machine_id.as_deref() else {
        return Ok(None);
    };
    let Some(m) = tx.machine(machine).await? else {
        return Ok(None);
    };
    let now = convert::machine_info(&m).and_then(|i| {
        i.runtimes
            .into_iter()
            .find(|r| r.runtime == run.runtime)
            .and_then(|r| r.version)
    });
    Ok(now.filter(|v| *v != was).map(|now| {
        format!(
            "{} was {was} when the run started and is {now} on {} now",
            run.runtime, m.name
        )
    }))
}

/// What a resumed runtime is told, from the record — never the old chat summary alone: what
/// is done (confirmed calls, not to be repeated), what failed or was not run, what a person
/// vouched for, and what is still pending.
pub async fn resume_note(tx: &mut Tx, task: &TaskRow, why: &str) -> ApiResult<String> {
    let mut done = Vec::new();
    let mut not_run = Vec::new();
    let mut pending = Vec::new();
    for e in tx.list_effects(&task.id).await? {
        let what = describe(&e.intent);
        match e.status {
            EffectStatus::Confirmed => done.push(what),
            EffectStatus::Failed | EffectStatus::FailedCompensable => not_run.push(what),
            EffectStatus::Intended | EffectStatus::InProgress | EffectStatus::Unknown => {
                pending.push(what)
            }
            _ => {}
        }
    }
    let last = tx.last_checkpoint(&task.id).await?;
    let mut out = format!(
        "Waymark: this session was interrupted ({why}) and is resumed now. From Waymark's record:"
    );
    let list = |title: &str, items: &[String], out: &mut String| {
        if items.is_empty() {
            return;
        }
        out.push_str(&format!("\n{title}:"));
        for i in items.iter().take(50) {
            out.push_str(&format!("\n- {i}"));
        }
        if items.len() > 50 {
            out.push_str(&format!("\n- … and {} more", items.len() - 50));
        }
    };
    list(
        "Done — these calls ran and are confirmed; do not run them again",
        &done,
        &mut out,
    );
    list(
        "Did not run (denied, failed or not started)",
        &not_run,
        &mut out,
    );
    list(
        "Not finished — check before relying on them",
        &pending,
        &mut out,
    );
    if done.is_empty() && not_run.is_empty() && pending.is_empty() {
        out.push_str("\nNo tool call was recorded yet.");
    }
    if let Some(c) = last {
        out.push_str(&format!("\nLast checkpoint: #{}.", c.sequence));
    }
    out.push_str("\nContinue the task from where it stands.");
    Ok(out)
}

/// A tool call in a line: its tool and its command or input, cut short. Claude Code's hooks
/// record `{tool, input}`; the ACP adapter `{title, kind, rawInput}` (the title is the agent's
/// own line for the call, e.g. Gemini CLI's command).
fn describe(intent: &Value) -> String {
    let tool = intent
        .get("tool")
        .or_else(|| intent.get("kind"))
        .and_then(Value::as_str)
        .unwrap_or("call");
    let input = intent
        .get("input")
        .or_else(|| intent.get("rawInput").filter(|v| !v.is_null()));
    if input.is_none()
        && let Some(title) = intent.get("title").and_then(Value::as_str)
    {
        return clip(&format!("{tool}: {title}"), 300);
    }
    let detail = input
        .and_then(|i| i.get("command").and_then(Value::as_str).map(str::to_owned))
        .or_else(|| input.map(|i| i.to_string()))
        .unwrap_or_else(|| intent.to_string());
    clip(&format!("{tool}: {detail}"), 300)
}

/// `start_run`, checked and applied inside the command's transaction: the new task (its id
/// chosen by the device) on the named machine, and the `start` item for its runner. Refused
/// when the machine is not the user's, lacks the runtime, or was not allowed the directory.
pub async fn start_run(tx: &mut Tx, v: &Verified) -> ApiResult<Result<String, Rejection>> {
    let cmd = &v.command;
    let bad = |d: String| Ok(Err(reject(RejectReason::InvalidCommand, d)));
    let Some(task_id) = cmd.task_id.clone() else {
        return bad("`task_id` is required: the new task's id, chosen by the device (`task_` and 32 hex digits)".into());
    };
    let well_formed = task_id.strip_prefix("task_").is_some_and(|h| {
        h.len() == 32
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    });
    if !well_formed {
        return bad(format!(
            "`task_id` `{}` is not `task_` and 32 lower-case hex digits",
            clip(&task_id, 80)
        ));
    }
    if !has_scope(&v.device, "steer") {
        return Ok(Err(reject(
            RejectReason::MissingScope,
            "`start_run` needs the `steer` scope; pair with it",
        )));
    }
    let arg = |k: &str| cmd.args.get(k).and_then(Value::as_str).map(str::trim);
    let (Some(machine), Some(runtime), Some(directory), Some(prompt)) = (
        arg("machine"),
        arg("runtime"),
        arg("directory"),
        arg("prompt"),
    ) else {
        return bad(
            "`start_run` needs `args.machine`, `args.runtime`, `args.directory` and `args.prompt`"
                .into(),
        );
    };
    if prompt.is_empty() || prompt.chars().count() > MAX_PROMPT_CHARS {
        return bad(format!(
            "`args.prompt` must be 1 to {MAX_PROMPT_CHARS} characters"
        ));
    }
    let title = arg("title")
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .unwrap_or_else(|| clip(prompt.lines().next().unwrap_or(prompt), 80));
    if title.chars().count() > 200 {
        return bad("`args.title` must be at most 200 characters".into());
    }
    let gate = arg("gate").filter(|g| !g.is_empty()).map(str::to_owned);
    if let Some(g) = &gate
        && (g.len() > 200 || regex::Regex::new(&format!("^(?:{g})$")).is_err())
    {
        return bad("`args.gate` must be a regex of tool names of at most 200 characters".into());
    }
    let plan = match cmd.args.get("plan") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return bad("`args.plan` is true or false".into()),
    };
    if plan && !PLAN_RUNTIMES.contains(&runtime) {
        return bad(format!(
            "`args.plan`: plan first is for {}; `{}` has no plan mode a runner can start it in",
            PLAN_RUNTIMES.join(" and "),
            clip(runtime, 64)
        ));
    }
    if tx.task(&task_id).await?.is_some() {
        return bad(format!(
            "a task `{task_id}` exists; a new run needs a new id"
        ));
    }
    let found = match tx.machine_by_name(&v.user.id, machine).await? {
        Some(m) => Some(m),
        None => tx
            .machine(machine)
            .await?
            .filter(|m| m.owner_id == v.user.id),
    };
    let Some(m) = found else {
        return Ok(Err(reject(
            RejectReason::UnknownMachine,
            format!(
                "no machine `{}` of user `{}`; `GET /v1/machines` lists them",
                clip(machine, 80),
                v.user.name
            ),
        )));
    };
    let Some(info) = convert::machine_info(&m) else {
        return Ok(Err(reject(
            RejectReason::NotAllowedOnMachine,
            format!(
                "{}'s runner has never registered; start `waymark runner` there",
                m.name
            ),
        )));
    };
    if !RUNNER_RUNTIMES.contains(&runtime) {
        return Ok(Err(reject(
            RejectReason::NotAllowedOnMachine,
            format!(
                "a runner starts {} so far, not `{}`",
                RUNNER_RUNTIMES.join(", "),
                clip(runtime, 64)
            ),
        )));
    }
    if !info.runtimes.iter().any(|r| r.runtime == runtime) {
        let has: Vec<&str> = info.runtimes.iter().map(|r| r.runtime.as_str()).collect();
        return Ok(Err(reject(
            RejectReason::NotAllowedOnMachine,
            format!(
                "{} has no {runtime} (it has: {})",
                m.name,
                if has.is_empty() {
                    "none".into()
                } else {
                    has.join(", ")
                }
            ),
        )));
    }
    if !plain_absolute(directory) || !info.directories.iter().any(|d| is_under(directory, d)) {
        return Ok(Err(reject(
            RejectReason::NotAllowedOnMachine,
            format!(
                "{} does not allow runs in `{}` (allowed: {})",
                m.name,
                clip(directory, 300),
                if info.directories.is_empty() {
                    "none".into()
                } else {
                    info.directories.join(", ")
                }
            ),
        )));
    }
    let now = tx.now;
    let session_key = uuid::Uuid::now_v7().to_string();
    let session_id = ids::session();
    let row = TaskRow {
        id: task_id.clone(),
        owner_id: v.user.id.clone(),
        title,
        goal: prompt.to_owned(),
        runtime: Some(runtime.to_owned()),
        state: TaskState::Queued,
        plan: Vec::new(),
        plan_revision: 1,
        budget: Budget::default(),
        usage: Usage::default(),
        materials: Materials::default(),
        session_id: session_id.clone(),
        fence: 0,
        outcome_summary: None,
        created_at: now,
        updated_at: now,
        parent_id: None,
        external_key: Some(session_key.clone()),
        machine_id: Some(m.id.clone()),
    };
    tx.insert_task(&row).await?;
    tx.insert_session(&SessionRow {
        id: session_id,
        task_id: task_id.clone(),
        parent_id: None,
        created_at: now,
    })
    .await?;
    let wire = task_wire(tx, &row).await?;
    emit(tx, &row, EventKind::TaskCreated, &wire).await?;
    let runtime_version = info
        .runtimes
        .iter()
        .find(|r| r.runtime == runtime)
        .and_then(|r| r.version.clone());
    let run = RunSpec {
        runtime: runtime.to_owned(),
        directory: directory.to_owned(),
        prompt: prompt.to_owned(),
        session_key,
        gate,
        runtime_version,
        plan,
    };
    tx.insert_work(&WorkRow {
        id: ids::work(),
        machine_id: m.id.clone(),
        task_id: task_id.clone(),
        kind: WorkKind::Start,
        args: json!({"run": run}),
        state: WorkState::Pending,
        detail: None,
        created_at: now,
        updated_at: now,
    })
    .await?;
    Ok(Ok(format!(
        "addressed to {}: {runtime} in {directory}{}",
        m.name,
        if online(&m, now) {
            ""
        } else {
            " (the machine is offline: it starts when its runner is back)"
        }
    )))
}

/// When a machine task is cancelled: its runner ends the runtime's process tree.
pub async fn queue_stop(tx: &mut Tx, task: &TaskRow) -> ApiResult<()> {
    let Some(machine_id) = task.machine_id.clone() else {
        return Ok(());
    };
    let work = tx.task_work(&task.id).await?;
    let Some(run) = run_of(&work) else {
        return Ok(());
    };
    for mut w in work {
        if w.state == WorkState::Pending {
            w.state = WorkState::Void;
            w.detail = Some("the task was cancelled".into());
            w.updated_at = tx.now;
            tx.update_work(&w).await?;
        }
    }
    let now = tx.now;
    tx.insert_work(&WorkRow {
        id: ids::work(),
        machine_id,
        task_id: task.id.clone(),
        kind: WorkKind::Stop,
        args: json!({"run": run}),
        state: WorkState::Pending,
        detail: None,
        created_at: now,
        updated_at: now,
    })
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_is_described_from_claude_codes_and_acps_intents() {
        let claude = serde_json::json!({"tool": "Bash", "input": {"command": "npm test"}});
        assert_eq!(describe(&claude), "Bash: npm test");
        let gemini = serde_json::json!({
            "toolCallId": "run_shell_command-1", "title": "touch done.txt", "kind": "execute",
            "rawInput": null, "locations": [], "approval": "dec_1",
        });
        assert_eq!(describe(&gemini), "execute: touch done.txt");
        let hermes = serde_json::json!({
            "title": "terminal: ls", "kind": "execute",
            "rawInput": {"command": "ls", "description": "list"},
        });
        assert_eq!(describe(&hermes), "execute: ls");
    }

    #[test]
    fn a_directory_is_allowed_only_under_an_allowed_one_in_plain_form() {
        assert!(plain_absolute("/home/a/src"));
        assert!(plain_absolute("/"));
        for bad in [
            "src",
            "/home/a/../b",
            "/home/./a",
            "/home//a",
            "/home/a/",
            "",
            "/a\0b",
        ] {
            assert!(!plain_absolute(bad), "{bad:?}");
        }
        assert!(is_under("/home/a/src/x", "/home/a/src"));
        assert!(is_under("/home/a/src", "/home/a/src"));
        assert!(
            !is_under("/home/a/srcx", "/home/a/src"),
            "a sibling with the same prefix"
        );
        assert!(!is_under("/home/a", "/home/a/src"));
    }
}
