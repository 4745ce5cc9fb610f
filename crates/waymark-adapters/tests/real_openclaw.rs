//! The OpenClaw adapter against the REAL OpenClaw gateway (`openclaw@2026.9.6` from npm, run
//! by the Node 24 it needs, both installed by `scripts/setup-debian` under
//! `$WAYMARK_RUNTIMES_DIR/openclaw`, default `~/.cache/waymark-runtimes/openclaw`), a fake
//! model API (`support::fake_model`), a real control plane in-process, and a phone answering
//! with signed commands. A turn is run with `openclaw agent --message …`; the model asks to
//! `touch` a file; the exec approval must reach the inbox as a decision offering what the
//! gateway allows; approving runs the command (the file appears, the effect is confirmed with
//! a receipt), denying does not.
//!
//! The test fails — never skips — when the runtime is not installed. The gateway takes 25–45 s
//! to be ready; everything started here is killed when the test ends, passing or not.

mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::fake_model::{self, FakeModel, Turn};
use support::openclaw_gateway::*;
use support::{ControlPlane, Phone, within};
use tokio_util::sync::CancellationToken;
use waymark_adapters::openclaw::{self, OpenClawArgs, OpenClawError};
use waymark_proto::{
    Decision, DecisionKind, DecisionStatus, DeliveryState, EffectStatus, Operation, TaskDetail,
    TaskState,
};

/// OpenClaw's default agent and its main session.
const SESSION: &str = "agent:main:main";

// ---- waiting on the control plane -------------------------------------------------------------

async fn detail(cp: &ControlPlane, task: &str) -> TaskDetail {
    cp.detail(task).await
}

/// The pending exec approval for `command` that is not among `seen`.
async fn new_approval(
    cp: &ControlPlane,
    task: &str,
    command: &str,
    seen: &[String],
    context: impl Fn() -> String,
) -> Decision {
    within(
        TURN,
        &format!("an approval for `{command}` in the inbox"),
        context,
        || async {
            detail(cp, task).await.decisions.into_iter().find(|d| {
                d.status == DecisionStatus::Pending
                    && !seen.contains(&d.id)
                    && d.intent
                        .as_ref()
                        .is_some_and(|i| i["request"]["command"] == command)
            })
        },
    )
    .await
}

async fn answer(
    phone: &Phone,
    cp: &ControlPlane,
    task: &str,
    d: &Decision,
    op: Operation,
    option: Option<&str>,
) {
    let revision = detail(cp, task).await.task.plan_revision;
    let mut args = json!({"decision_id": d.id, "intent_digest": d.intent_digest});
    if let Some(o) = option {
        args["option"] = json!(o);
    }
    phone.command(task, revision, op, args).await;
}

/// The decision, once OpenClaw has taken the answer.
async fn acknowledged(cp: &ControlPlane, task: &str, id: &str) -> Decision {
    within(
        Duration::from_secs(30),
        "the answer acknowledged by OpenClaw",
        String::new,
        || async {
            detail(cp, task)
                .await
                .decisions
                .into_iter()
                .find(|d| d.id == id)
                .filter(|d| {
                    d.delivery
                        .as_ref()
                        .is_some_and(|x| x.state == DeliveryState::Acknowledged)
                })
        },
    )
    .await
}

/// The settled effect of the exec the approval was for.
async fn settled_effect(
    cp: &ControlPlane,
    task: &str,
    approval: &Decision,
) -> waymark_proto::Effect {
    let request = &approval.intent.as_ref().unwrap()["request"];
    let key = format!(
        "{SESSION}:{}:{}",
        request["runId"]
            .as_str()
            .expect("the request names its run"),
        request["toolCallId"]
            .as_str()
            .expect("the request names its tool call"),
    );
    within(
        Duration::from_secs(30),
        &format!("the effect `{key}` settled"),
        String::new,
        || async {
            detail(cp, task)
                .await
                .effects
                .into_iter()
                .find(|e| e.idempotency_key == key && e.status.is_terminal())
        },
    )
    .await
}

/// The adapter on `home`'s gateway, its device key in `scratch`; running until the returned
/// token is cancelled.
fn spawn_adapter(
    home: &Home,
    cp: &ControlPlane,
    scratch: &std::path::Path,
) -> (
    tokio::task::JoinHandle<Result<(), OpenClawError>>,
    CancellationToken,
) {
    let shutdown = CancellationToken::new();
    let adapter = tokio::spawn(openclaw::run(
        OpenClawArgs {
            gateway: home.url(),
            gateway_token: Some(GATEWAY_TOKEN.into()),
            device_key: Some(scratch.join("device.json")),
            client_id: "gateway-client".into(),
            client_mode: "backend".into(),
            task: None,
            session_key: None,
            message: None,
            turn_key: None,
            cwd: None,
        },
        cp.client.clone(),
        shutdown.clone(),
    ));
    (adapter, shutdown)
}

/// Cancels the adapter; it must stop within 20 s, and well.
async fn stop_adapter(
    adapter: tokio::task::JoinHandle<Result<(), OpenClawError>>,
    shutdown: CancellationToken,
) {
    shutdown.cancel();
    let res = tokio::time::timeout(Duration::from_secs(20), adapter)
        .await
        .expect("the adapter stops")
        .unwrap();
    assert!(res.is_ok(), "{res:?}");
}

/// Makes the session with a first turn that runs no tool, then runs the adapter on the gateway
/// and waits until it mirrors the session (it is connected as an approver): with no approver
/// connected the gateway denies an exec at once. Returns the adapter, its shutdown, the task.
async fn warm_up_and_connect(
    rt: &Runtime,
    home: &Home,
    gw: &Gateway,
    cp: &ControlPlane,
    scratch: &std::path::Path,
) -> (
    tokio::task::JoinHandle<Result<(), OpenClawError>>,
    CancellationToken,
    String,
) {
    let log = || gw.log_tail();
    // A first turn that runs no tool makes the session, so that the adapter, once connected,
    // finds it (`sessions.list`) and the test knows it is connected as an approver before a
    // turn asks for approval (with no approver connected the gateway denies at once).
    let warm = AgentTurn::start(rt, home, "warm-up", "hello");
    warm.finish(gw).await;

    let (adapter, shutdown) = spawn_adapter(home, cp, scratch);
    let task = within(
        Duration::from_secs(60),
        "the adapter to mirror the session (it is connected)",
        log,
        || async { cp.tasks_of("openclaw", SESSION).await.into_iter().next() },
    )
    .await;
    // The warm-up turn's ledger entry is read after the sessions: the backfill is under way.
    within(
        Duration::from_secs(30),
        "the task ledger noted",
        log,
        || async {
            detail(cp, &task)
                .await
                .messages
                .iter()
                .any(|m| m.text.starts_with("OpenClaw task `"))
                .then_some(())
        },
    )
    .await;
    assert!(!adapter.is_finished(), "the adapter runs: {:?}", adapter);
    (adapter, shutdown, task)
}

// ---- the test ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_openclaw_exec_approvals_reach_the_inbox_and_the_answer_decides_whether_it_runs() {
    let started = Instant::now();
    let rt = runtime();
    let cp = ControlPlane::start("alice-openclaw").await;
    let phone = cp.phone().await;

    let scratch = tempfile::tempdir().unwrap();
    let approved_file = scratch.path().join("approved");
    let denied_file = scratch.path().join("denied");
    let approved_cmd = format!("touch {}", approved_file.display());
    let denied_cmd = format!("touch {}", denied_file.display());
    let model = FakeModel::start(vec![
        Turn {
            prompt: "waymark turn one".into(),
            command: approved_cmd.clone(),
            answer: "Created the file.".into(),
        },
        Turn {
            prompt: "waymark turn two".into(),
            command: denied_cmd.clone(),
            answer: "The command was not run.".into(),
        },
    ])
    .await;
    let home = Home::new(&model.base_url, fake_model::MODEL);
    let gw = Gateway::start(&rt, &home).await;
    let log = || gw.log_tail();

    let (adapter, shutdown, task) = warm_up_and_connect(&rt, &home, &gw, &cp, scratch.path()).await;
    eprintln!("adapter connected at {:?}", started.elapsed());

    // ---- turn one: approved -------------------------------------------------------------
    let turn = AgentTurn::start(&rt, &home, "one", "waymark turn one: make the file");
    let d = new_approval(&cp, &task, &approved_cmd, &[], || {
        format!("{}\n-- agent --\n{}", log(), turn.output())
    })
    .await;
    eprintln!("approval one in the inbox at {:?}", started.elapsed());
    assert_eq!(d.kind, DecisionKind::Approval);
    assert_eq!(
        d.durability,
        Some(waymark_proto::ApprovalDurability::ConnectionBound)
    );
    // OpenClaw 2026.9.6 lists `allow-always` unavailable for this command: not offered.
    let request = d.intent.as_ref().unwrap()["request"].clone();
    assert_eq!(
        request["allowedDecisions"],
        json!(["allow-once", "deny"]),
        "{request}"
    );
    assert_eq!(
        d.options.iter().map(|o| o.id.as_str()).collect::<Vec<_>>(),
        ["approve", "deny"]
    );
    assert!(
        d.question
            .starts_with(&format!("OpenClaw wants to run `{approved_cmd}`")),
        "{}",
        d.question
    );
    assert!(!approved_file.exists(), "nothing runs before the answer");

    answer(&phone, &cp, &task, &d, Operation::Approve, Some("approve")).await;
    let out = turn.finish(&gw).await;
    eprintln!("turn one done at {:?}", started.elapsed());
    assert!(out.contains("Created the file."), "{out}");
    assert!(approved_file.exists(), "the approved command ran");
    let d = acknowledged(&cp, &task, &d.id).await;
    assert_eq!(waymark_worker::chosen_option(&d), Some("approve"));
    assert!(
        d.delivery
            .clone()
            .unwrap()
            .detail
            .unwrap()
            .starts_with("exec.approval.resolved: allow-once"),
    );
    let effect = settled_effect(&cp, &task, &d).await;
    assert_eq!(effect.kind, "openclaw.exec");
    assert_eq!(effect.status, EffectStatus::Confirmed, "{effect:?}");
    assert_eq!(effect.intent["args"]["command"], approved_cmd);
    let receipt = effect
        .receipt
        .clone()
        .expect("a confirmed effect has a receipt");
    assert_eq!(receipt["result"]["details"]["exitCode"], 0, "{receipt}");
    assert_eq!(
        receipt["result"]["details"]["status"], "completed",
        "{receipt}"
    );

    // ---- turn two: denied ---------------------------------------------------------------
    let turn = AgentTurn::start(&rt, &home, "two", "waymark turn two: make the other file");
    let d2 = new_approval(&cp, &task, &denied_cmd, std::slice::from_ref(&d.id), || {
        format!("{}\n-- agent --\n{}", log(), turn.output())
    })
    .await;
    eprintln!("approval two in the inbox at {:?}", started.elapsed());
    assert_eq!(
        d2.options.iter().map(|o| o.id.as_str()).collect::<Vec<_>>(),
        ["approve", "deny"]
    );
    answer(&phone, &cp, &task, &d2, Operation::Deny, None).await;
    let out = turn.finish(&gw).await;
    eprintln!("turn two done at {:?}", started.elapsed());
    assert!(out.contains("The command was not run."), "{out}");
    assert!(!denied_file.exists(), "the denied command did not run");
    let d2 = acknowledged(&cp, &task, &d2.id).await;
    assert!(
        d2.delivery
            .clone()
            .unwrap()
            .detail
            .unwrap()
            .starts_with("exec.approval.resolved: deny"),
    );
    let effect = settled_effect(&cp, &task, &d2).await;
    assert_eq!(effect.status, EffectStatus::Failed, "{effect:?}");
    let receipt = effect.receipt.clone().unwrap_or(Value::Null);
    assert!(
        receipt.to_string().contains("Exec denied"),
        "the failure says OpenClaw denied it: {receipt}"
    );
    // The model was told: the tool result after the denial says so.
    let told = model.requests().iter().any(|r| {
        r["messages"].as_array().is_some_and(|ms| {
            ms.iter()
                .any(|m| m["role"] == "tool" && m["content"].to_string().contains("Exec denied"))
        })
    });
    assert!(told, "the model saw the denial");

    stop_adapter(adapter, shutdown).await;
    eprintln!("all done at {:?}", started.elapsed());
    drop(gw);
}

/// The gateway is killed while an exec approval waits in the inbox, and started again (the
/// approvals of OpenClaw are the gateway's, not the connection's: the adapter learns they are
/// gone only from the gateway's list once it reconnects). The approval closes expired by the
/// runtime with no option; the exec it guarded becomes `unknown` (the adapter cannot tell a
/// gateway that died with it from one answered in OpenClaw meanwhile), never left
/// `in_progress`; a late approve is refused; the command never ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_openclaw_gateway_killed_under_a_pending_approval_expires_it() {
    let started = Instant::now();
    let rt = runtime();
    let cp = ControlPlane::start("alice-openclaw").await;
    let phone = cp.phone().await;
    let scratch = tempfile::tempdir().unwrap();
    let file = scratch.path().join("killed");
    let command = format!("touch {}", file.display());
    let model = FakeModel::start(vec![Turn {
        prompt: "waymark turn killed".into(),
        command: command.clone(),
        answer: "This answer never comes.".into(),
    }])
    .await;
    let home = Home::new(&model.base_url, fake_model::MODEL);
    let gw = Gateway::start(&rt, &home).await;
    let (adapter, shutdown, task) = warm_up_and_connect(&rt, &home, &gw, &cp, scratch.path()).await;
    let turn = AgentTurn::start(&rt, &home, "killed", "waymark turn killed: make the file");
    let d = new_approval(&cp, &task, &command, &[], || {
        format!("{}\n-- agent --\n{}", gw.log_tail(), turn.output())
    })
    .await;
    eprintln!("approval in the inbox at {:?}", started.elapsed());
    let request = d.intent.as_ref().unwrap()["request"].clone();
    let key = format!(
        "{SESSION}:{}:{}",
        request["runId"].as_str().unwrap(),
        request["toolCallId"].as_str().unwrap()
    );
    let (closed, _, gw) = support::a_dropped_connection_expires_the_approval(
        &cp,
        &phone,
        &task,
        &d,
        GATEWAY_READY,
        async {
            drop(gw);
            drop(turn);
            Gateway::start(&rt, &home).await
        },
        |e| e.idempotency_key == key,
        support::CallAfterDrop::Unknown,
    )
    .await;
    assert!(
        closed
            .outcome
            .unwrap()
            .text
            .unwrap()
            .starts_with("OpenClaw no longer holds it"),
    );
    assert!(!file.exists(), "the command never ran");
    assert!(
        !adapter.is_finished(),
        "the adapter reconnected and runs on"
    );
    stop_adapter(adapter, shutdown).await;
    eprintln!("all done at {:?}", started.elapsed());
    drop(gw);
}

/// An adapter started together with its gateway, as a service manager starts both, meets
/// the gateway still starting: 2026.9.6 listens seconds before it serves, and meanwhile answers
/// every `connect` "gateway starting" (`UNAVAILABLE`, retryable) and closes. The adapter is
/// started the moment the port takes a TCP connection, so it connects in that window. It waits
/// the window out and connects: it runs on, and the session of a first turn is mirrored. It
/// used to take the answer for a refusal and end at once (with no device token yet).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_openclaw_an_adapter_started_with_its_gateway_waits_until_it_serves() {
    let started = Instant::now();
    let rt = runtime();
    let cp = ControlPlane::start("alice-openclaw").await;
    let scratch = tempfile::tempdir().unwrap();
    let model = FakeModel::start(Vec::new()).await;
    let home = Home::new(&model.base_url, fake_model::MODEL);
    let mut gw = Gateway::spawn(&rt, &home);
    within(
        GATEWAY_READY,
        "the gateway's port to take connections",
        || gw.log_tail(),
        || async {
            tokio::net::TcpStream::connect(("127.0.0.1", home.port))
                .await
                .ok()
                .map(drop)
        },
    )
    .await;
    let listening = started.elapsed();
    let (adapter, shutdown) = spawn_adapter(&home, &cp, scratch.path());
    let ready = Gateway::wait_ready(&mut gw).await;
    eprintln!("listening at {listening:?}, ready {ready:?} later");
    assert!(!adapter.is_finished(), "the adapter waited: {adapter:?}");
    let warm = AgentTurn::start(&rt, &home, "first", "hello");
    warm.finish(&gw).await;
    within(
        Duration::from_secs(60),
        "the adapter to mirror the first turn's session",
        || gw.log_tail(),
        || async { cp.tasks_of("openclaw", SESSION).await.into_iter().next() },
    )
    .await;
    assert!(!adapter.is_finished(), "the adapter runs on: {adapter:?}");
    stop_adapter(adapter, shutdown).await;
    eprintln!("all done at {:?}", started.elapsed());
}

/// A person's replan and cancel reach the real gateway, whose params for them are closed like
/// `exec.approval.resolve`'s. With a turn under way (its exec waiting for approval), a replan
/// with instructions is sent as `sessions.steer`: OpenClaw 2026.9.6 aborts the running run (the
/// `openclaw agent` that started it ends "aborted"; our approval for it is void and not asked
/// again) and starts one with the instructions — the model is asked with them, and its exec
/// asks anew. A cancel is sent as `sessions.abort`: the gateway aborts that run too, nothing
/// runs, and nothing waits in the inbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_openclaw_replan_steers_the_running_session_and_cancel_aborts_it() {
    let started = Instant::now();
    let rt = runtime();
    let cp = ControlPlane::start("alice-openclaw").await;
    let phone = cp.phone().await;
    let scratch = tempfile::tempdir().unwrap();
    let first = scratch.path().join("first");
    let steered = scratch.path().join("steered");
    let first_cmd = format!("touch {}", first.display());
    let steered_cmd = format!("touch {}", steered.display());
    let model = FakeModel::start(vec![
        Turn {
            prompt: "waymark turn steer".into(),
            command: first_cmd.clone(),
            answer: "This answer never comes.".into(),
        },
        Turn {
            prompt: "waymark steered instructions".into(),
            command: steered_cmd.clone(),
            answer: "Nor this one.".into(),
        },
    ])
    .await;
    let home = Home::new(&model.base_url, fake_model::MODEL);
    let gw = Gateway::start(&rt, &home).await;
    let (adapter, shutdown, task) = warm_up_and_connect(&rt, &home, &gw, &cp, scratch.path()).await;
    let mut turn = AgentTurn::start(&rt, &home, "steer", "waymark turn steer: make a file");
    let agent_out = turn.out.clone();
    let agent_said = || strip_ansi(&std::fs::read_to_string(&agent_out).unwrap_or_default());
    let context = || format!("{}\n-- agent --\n{}", gw.log_tail(), agent_said());
    let d = new_approval(&cp, &task, &first_cmd, &[], context).await;
    eprintln!("approval in the inbox at {:?}", started.elapsed());

    // ---- replan: steered ----------------------------------------------------------------------
    let instructions = "waymark steered instructions: make the steered file instead";
    let revision = detail(&cp, &task).await.task.plan_revision;
    let steered_at = Instant::now();
    phone
        .command(
            &task,
            revision,
            Operation::Replan,
            json!({"instructions": instructions}),
        )
        .await;
    let d2 = new_approval(
        &cp,
        &task,
        &steered_cmd,
        std::slice::from_ref(&d.id),
        context,
    )
    .await;
    eprintln!(
        "replan → the steered run's approval in the inbox in {:?}",
        steered_at.elapsed()
    );
    assert!(
        model
            .requests()
            .iter()
            .any(|r| r.to_string().contains(instructions)),
        "the model was asked with the instructions"
    );
    let ended = tokio::time::timeout(TURN, turn.child.wait()).await;
    assert!(
        matches!(ended, Ok(Ok(s)) if !s.success()) && agent_said().contains("aborted"),
        "the steer aborted the run `openclaw agent` waited on: {ended:?}\n{}",
        context()
    );
    // The replan voided the approval; OpenClaw still held it at that moment, so it was asked
    // again under the new plan, and closed when the steer aborted its run — by OpenClaw, with
    // no option, never approved. Nothing of the first run waits in the inbox.
    let firsts = within(
        TURN,
        "the first run's approvals closed",
        context,
        || async {
            let t = detail(&cp, &task).await;
            let firsts: Vec<Decision> = t
                .decisions
                .into_iter()
                .filter(|x| x.question.contains(&first_cmd))
                .collect();
            firsts
                .iter()
                .all(|x| x.status != DecisionStatus::Pending)
                .then_some(firsts)
        },
    )
    .await;
    assert_eq!(firsts[0].status, DecisionStatus::Void, "{firsts:?}");
    for again in &firsts[1..] {
        let out = again.outcome.clone().unwrap();
        assert_eq!(again.status, DecisionStatus::Expired, "{again:?}");
        assert_eq!((out.option, out.by.as_str()), (None, "runtime"));
        assert!(
            out.text
                .unwrap()
                .starts_with("OpenClaw closed it: the run that asked ended"),
            "{again:?}"
        );
    }

    // ---- cancel: aborted ----------------------------------------------------------------------
    assert!(!gw.log_text().contains("aborted: rpc"), "{}", gw.log_tail());
    let revision = detail(&cp, &task).await.task.plan_revision;
    let log_before = gw.log_text().len();
    let cancelled_at = Instant::now();
    phone
        .command(&task, revision, Operation::Cancel, json!({}))
        .await;
    // What the gateway logs once the cancel reached it: `sessions.abort` (an RPC) aborting the
    // session's run — a turn still queued fails with "queued turn aborted: rpc", a run under
    // way ends with `stopReason=rpc` — or, where the cancel voided the run's pending exec
    // request first, the adapter denying that request (`exec.approval.resolve`), after which
    // the abort may find no run left to abort. Either way nothing of the run runs (below).
    within(TURN, "the gateway aborting the run", context, || async {
        let log = gw.log_text();
        let after = log.get(log_before..).unwrap_or_default();
        (after.contains("aborted: rpc")
            || after.contains("stopReason=rpc")
            || after.contains("exec.approval.resolve"))
        .then_some(())
    })
    .await;
    eprintln!("cancel → the run aborted in {:?}", cancelled_at.elapsed());
    let t = detail(&cp, &task).await;
    assert_eq!(t.task.state, TaskState::Cancelled, "{:?}", t.task);
    let d2 = t.decisions.iter().find(|x| x.id == d2.id).unwrap();
    assert_eq!(d2.status, DecisionStatus::Void, "{d2:?}");
    assert!(!first.exists() && !steered.exists(), "nothing ran");
    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(20), adapter).await;
    eprintln!("all done at {:?}", started.elapsed());
    drop(gw);
}
