//! The Codex adapter against a real control plane (in-process, on a real port) and a fake
//! `codex app-server` over real stdio (`waymark-fake-codex`, scenarios in
//! `fixtures/codex/`). People answer from a paired device with signed commands, as the
//! companion does; what the Codex side received is read back from the fake's record.

mod support;

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use support::{ControlPlane, Phone, eventually};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use waymark_adapters::codex::{self, CONNECTION_CLOSED, CodexArgs, CodexError};
use waymark_proto::{
    Decision, DecisionKind, DecisionStatus, DeliveryState, EffectStatus, Operation, TaskDetail,
    TaskState,
};

const FAKE: &str = env!("CARGO_BIN_EXE_waymark-fake-codex");

fn fixture(name: &str) -> String {
    format!("{}/fixtures/codex/{name}.jsonl", env!("CARGO_MANIFEST_DIR"))
}

/// What a scenario recorded from the real Codex (`fixtures/codex/recorded/`, converted by
/// `waymark-fake-codex --convert`) is about: its thread, and its approval request's turn, item
/// and request id — read from the scenario, so that recording it again needs no edit here.
struct Recorded {
    thread: String,
    turn: String,
    item: String,
    request: Value,
}

impl Recorded {
    fn of(name: &str) -> Recorded {
        let steps: Vec<Value> = std::fs::read_to_string(fixture(name))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let thread = steps
            .iter()
            .find(|s| s["expect"] == "thread/start")
            .and_then(|s| s["reply"]["thread"]["id"].as_str())
            .expect("the recording starts a thread")
            .to_owned();
        let asked = steps
            .iter()
            .map(|s| &s["send"])
            .find(|m| {
                m["method"]
                    .as_str()
                    .is_some_and(|m| m.ends_with("/requestApproval"))
            })
            .expect("the recording has an approval request");
        Recorded {
            thread,
            turn: asked["params"]["turnId"].as_str().unwrap().to_owned(),
            item: asked["params"]["itemId"].as_str().unwrap().to_owned(),
            request: asked["id"].clone(),
        }
    }

    /// The effect key of the item the approval guarded.
    fn item_key(&self) -> String {
        format!("{}:{}:{}", self.thread, self.turn, self.item)
    }
}

struct World {
    cp: ControlPlane,
    phone: Phone,
}

impl World {
    async fn start() -> World {
        let cp = ControlPlane::start("codex-adapter").await;
        let phone = cp.phone().await;
        World { cp, phone }
    }

    fn fake(&self, name: &str) -> Fake {
        let dir = self.cp.dir.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        Fake { dir }
    }

    fn args(&self, fake: &Fake, scenarios: &[&str]) -> CodexArgs {
        let mut cmd = format!("'{FAKE}' --record '{}'", fake.record().display());
        for s in scenarios {
            cmd.push_str(&format!(" --scenario '{}'", fixture(s)));
        }
        CodexArgs {
            app_server_cmd: cmd,
            cwd: Some(self.cp.dir.path().to_path_buf()),
            ..CodexArgs::new()
        }
    }

    fn start_adapter(&self, args: CodexArgs) -> Adapter {
        let shutdown = CancellationToken::new();
        let handle = tokio::spawn(codex::run(args, self.cp.client.clone(), shutdown.clone()));
        Adapter { handle, shutdown }
    }

    /// The task the adapter made for a Codex thread, once it exists.
    async fn task_of(&self, thread: &str) -> String {
        eventually(&format!("a task for thread {thread}"), || async move {
            self.tasks_of(thread).await.into_iter().next()
        })
        .await
    }

    /// Every task whose runtime key is the thread's id.
    async fn tasks_of(&self, thread: &str) -> Vec<String> {
        self.cp.tasks_of("codex", thread).await
    }

    async fn detail(&self, task: &str) -> TaskDetail {
        self.cp.detail(task).await
    }

    async fn approval(&self, task: &str, pred: impl Fn(&Decision) -> bool) -> Decision {
        let pred = &pred;
        eventually("the approval", || async move {
            self.detail(task)
                .await
                .decisions
                .into_iter()
                .find(|d| d.kind == DecisionKind::Approval && pred(d))
        })
        .await
    }

    /// A signed command from alice's phone, as the companion sends it; must apply.
    async fn command(&self, task: &str, operation: Operation, args: Value) {
        let revision = self.detail(task).await.task.plan_revision;
        self.phone.command(task, revision, operation, args).await;
    }

    async fn answer(&self, d: &Decision, operation: Operation, option: Option<&str>) {
        let mut args = json!({"decision_id": d.id, "intent_digest": d.intent_digest});
        if let Some(o) = option {
            args["option"] = o.into();
        }
        self.command(&d.task_id, operation, args).await;
    }
}

struct Adapter {
    handle: JoinHandle<Result<(), CodexError>>,
    shutdown: CancellationToken,
}

impl Adapter {
    /// Waits for the adapter to end on its own.
    async fn ended(self) -> Result<(), CodexError> {
        tokio::time::timeout(Duration::from_secs(30), self.handle)
            .await
            .expect("the adapter did not end")
            .unwrap()
    }

    /// Stops it as Ctrl-C would.
    async fn stop(self) -> Result<(), CodexError> {
        self.shutdown.cancel();
        self.ended().await
    }
}

/// The fake app-server's record and signal files.
struct Fake {
    dir: PathBuf,
}

impl Fake {
    fn record(&self) -> PathBuf {
        self.dir.join("record.jsonl")
    }

    /// Every line it received so far, as `{"run", "line", "message"}`.
    fn received(&self) -> Vec<Value> {
        std::fs::read_to_string(self.record())
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The first received message `pred` accepts, once it arrives.
    async fn wait_for(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let pred = &pred;
        eventually(what, || async move {
            self.received().into_iter().find(|e| pred(&e["message"]))
        })
        .await
    }

    /// Every received message with this method, in order.
    fn calls(&self, method: &str) -> Vec<Value> {
        self.received()
            .into_iter()
            .filter(|e| e["message"]["method"] == method)
            .collect()
    }

    /// Lets a `wait_file` step go on.
    fn signal(&self, name: &str) {
        std::fs::write(self.dir.join(name), b"").unwrap();
    }
}

/// The answer (not a request) the fake received for its request `id`.
/// The answer (not a request) to the fake's request `id`, as the scenario names it.
fn is_answer_to_id(id: Value) -> impl Fn(&Value) -> bool {
    move |m: &Value| m.get("method").is_none() && m["id"] == id
}

fn is_answer_to(id: i64) -> impl Fn(&Value) -> bool {
    move |m| m.get("method").is_none() && m["id"] == id
}

/// One HTTP/1.1 exchange with the control plane (this crate has no HTTP client dependency).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_approval_from_a_phone_reaches_codex_as_accept_for_session_and_counts_once_resolved()
{
    let w = &World::start().await;
    let fake = w.fake("approve");
    let adapter = w.start_adapter(CodexArgs {
        prompt: Some("install the dependencies and fix the cart total".into()),
        ..w.args(&fake, &["approve"])
    });
    let task = w.task_of("thr_approve").await;
    let pending = w
        .approval(&task, |d| d.status == DecisionStatus::Pending)
        .await;
    let offered: Vec<&str> = pending.options.iter().map(|o| o.id.as_str()).collect();
    assert_eq!(
        offered,
        ["approve", "approve_session", "deny", "deny_cancel"]
    );
    assert!(pending.options.iter().all(|o| !o.gives_up.is_empty()));
    assert_eq!(
        pending.question,
        "Codex wants to run `npm install` in /repo — needs network"
    );
    assert_eq!(
        pending.intent.as_ref().unwrap()["params"]["itemId"],
        "call_1"
    );

    w.answer(&pending, Operation::Approve, Some("approve_session"))
        .await;
    let answer = fake
        .wait_for("the answer to request 61", is_answer_to(61))
        .await;
    assert_eq!(
        answer["message"],
        json!({"id": 61, "result": {"decision": "acceptForSession"}})
    );
    assert!(!answer["line"].as_str().unwrap().contains("jsonrpc"));

    // Answered here, but Codex has not said it took the answer: not counted yet.
    let answered = w
        .approval(&task, |d| d.status == DecisionStatus::Resolved)
        .await;
    assert_eq!(
        answered.outcome.as_ref().unwrap().option.as_deref(),
        Some("approve_session")
    );
    assert_eq!(
        answered.delivery.as_ref().unwrap().state,
        DeliveryState::Pending
    );

    fake.signal("release-resolved");
    let delivered = w
        .approval(&task, |d| {
            d.delivery
                .as_ref()
                .is_some_and(|x| x.state != DeliveryState::Pending)
        })
        .await;
    let delivery = delivered.delivery.unwrap();
    assert_eq!(delivery.state, DeliveryState::Acknowledged);
    assert_eq!(delivery.detail.as_deref(), Some("serverRequest/resolved"));

    // The turn's end ends a prompted run, completed.
    adapter.ended().await.unwrap();
    let d = w.detail(&task).await;
    assert_eq!(d.task.state, TaskState::Completed);
    assert_eq!(d.task.external_key.as_deref(), Some("thr_approve"));
    let turn_start = &fake.calls("turn/start")[0]["message"]["params"];
    assert_eq!(
        *turn_start,
        json!({"threadId": "thr_approve", "input": [{"type": "text", "text": "install the dependencies and fix the cart total"}]})
    );

    // Items became effects under `threadId:turnId:itemId`, closed with Codex's receipt.
    let effect = |key: &str| {
        d.effects
            .iter()
            .find(|e| e.idempotency_key == key)
            .unwrap_or_else(|| panic!("no effect {key} in {:#?}", d.effects))
    };
    let cmd = effect("thr_approve:turn_a1:call_1");
    assert_eq!(cmd.kind, "codex.commandExecution");
    assert_eq!(cmd.status, EffectStatus::Confirmed);
    assert_eq!(
        cmd.intent,
        json!({"command": "npm install", "cwd": "/repo"})
    );
    let receipt = cmd.receipt.as_ref().unwrap();
    assert_eq!(receipt["exitCode"], 0);
    assert_eq!(receipt["status"], "completed");
    let patch = effect("thr_approve:turn_a1:patch_1");
    assert_eq!(patch.status, EffectStatus::Confirmed);
    assert_eq!(
        patch.receipt.as_ref().unwrap()["paths"],
        json!(["src/cart.js"])
    );

    // The turn's checkpoint carries the effects and the turn's diff as an artifact.
    let cp = d.checkpoints.last().unwrap();
    assert_eq!(cp.body.reason, "turn_completed");
    assert_eq!(cp.body.effects.len(), 2);
    let diff = d
        .artifacts
        .iter()
        .find(|a| a.name == "turn-turn_a1.diff")
        .unwrap();
    assert_eq!(diff.media_type, "text/x-diff");
    assert_eq!(cp.body.completed_steps[0].step, "turn_a1");
    assert_eq!(
        cp.body.completed_steps[0].artifact_digests,
        std::slice::from_ref(&diff.sha256)
    );

    // Messages, plan and usage.
    let texts: Vec<&str> = d.messages.iter().map(|m| m.text.as_str()).collect();
    assert!(
        texts.contains(&"Installed the dependencies and fixed the cart total."),
        "{texts:?}"
    );
    assert!(
        texts.iter().any(|t| t
            .starts_with("Plan updated: install, then fix the total\n[x] install dependencies")),
        "{texts:?}"
    );
    assert_eq!(d.task.usage.tokens, 1500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
/// Replays the real Codex 0.169 declining a command (`recorded/turn-two.jsonl`, recorded by
/// `real_codex.rs`).
async fn codex_denial_from_a_phone_reaches_codex_as_decline() {
    let w = &World::start().await;
    let fake = w.fake("deny");
    let rec = Recorded::of("recorded/turn-two");
    let adapter = w.start_adapter(CodexArgs {
        prompt: Some("make the other file".into()),
        ..w.args(&fake, &["recorded/turn-two"])
    });
    let task = w.task_of(&rec.thread).await;
    let pending = w
        .approval(&task, |d| d.status == DecisionStatus::Pending)
        .await;
    // As Codex 0.169 lists them: no `decline`, yet both denials are offered, and the rule.
    let offered: Vec<&str> = pending.options.iter().map(|o| o.id.as_str()).collect();
    assert_eq!(offered, ["approve", "approve_rule", "deny", "deny_cancel"]);
    let labels: Vec<&str> = pending.options.iter().map(|o| o.label.as_str()).collect();
    assert_eq!(
        labels[2..],
        ["Deny, let the turn go on", "Deny and stop the turn"]
    );

    w.answer(&pending, Operation::Deny, None).await;
    let answer = fake
        .wait_for(
            "the answer to the request",
            is_answer_to_id(rec.request.clone()),
        )
        .await;
    assert_eq!(
        answer["message"],
        json!({"id": rec.request, "result": {"decision": "decline"}})
    );
    adapter.ended().await.unwrap();

    let d = w.detail(&task).await;
    let decision = d.decisions.iter().find(|x| x.id == pending.id).unwrap();
    assert_eq!(decision.status, DecisionStatus::Resolved);
    assert_eq!(
        decision.outcome.as_ref().unwrap().option.as_deref(),
        Some("deny")
    );
    assert_eq!(
        decision.delivery.as_ref().unwrap().state,
        DeliveryState::Acknowledged
    );
    let effect = d
        .effects
        .iter()
        .find(|e| e.idempotency_key == rec.item_key())
        .unwrap();
    assert_eq!(effect.status, EffectStatus::Failed);
    assert!(
        effect.receipt.as_ref().unwrap()["error"]
            .as_str()
            .unwrap()
            .starts_with("declined"),
        "{:?}",
        effect.receipt
    );
}

/// Replays the real Codex 0.169 asking to add a file outside the workspace
/// (`recorded/patch-one.jsonl`, recorded by `real_codex.rs`): the file-change approval names
/// the path and carries the diff; approve reaches Codex as `accept`, and the change's effect
/// is confirmed with its path once Codex completes the item.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_file_change_approval_carries_the_diff_and_approve_reaches_codex_as_accept() {
    let w = &World::start().await;
    let fake = w.fake("patch");
    let rec = Recorded::of("recorded/patch-one");
    let adapter = w.start_adapter(CodexArgs {
        prompt: Some("add the file".into()),
        ..w.args(&fake, &["recorded/patch-one"])
    });
    let task = w.task_of(&rec.thread).await;
    let pending = w
        .approval(&task, |d| d.status == DecisionStatus::Pending)
        .await;
    let intent = pending.intent.clone().unwrap();
    assert_eq!(intent["method"], "item/fileChange/requestApproval");
    let change = &intent["item"]["changes"][0];
    let path = change["path"].as_str().unwrap();
    assert!(path.ends_with("/approved.txt"), "{intent}");
    assert_eq!(change["diff"], "written after approval\n", "{intent}");
    assert!(
        pending
            .question
            .starts_with(&format!("Codex wants to change 1 file: {path}")),
        "{}",
        pending.question
    );
    w.answer(&pending, Operation::Approve, Some("approve"))
        .await;
    let answer = fake
        .wait_for(
            "the answer to the request",
            is_answer_to_id(rec.request.clone()),
        )
        .await;
    assert_eq!(
        answer["message"],
        json!({"id": rec.request, "result": {"decision": "accept"}})
    );
    adapter.ended().await.unwrap();
    let d = w.detail(&task).await;
    let effect = d
        .effects
        .iter()
        .find(|e| e.idempotency_key == rec.item_key())
        .unwrap();
    assert_eq!(effect.kind, "codex.fileChange");
    assert_eq!(effect.status, EffectStatus::Confirmed, "{effect:?}");
    assert_eq!(effect.receipt.as_ref().unwrap()["paths"][0], path);
    assert_eq!(
        d.decisions[0].delivery.as_ref().unwrap().state,
        DeliveryState::Acknowledged
    );
    assert_eq!(d.task.state, TaskState::Completed);
}

/// Pause interrupts the running turn and holds (the pending approval expires and is never
/// answered in Codex; the `--prompt` run does not end); resume starts a new turn in the thread.
/// Replays the real Codex 0.169 (`recorded/turn-four.jsonl`, recorded by `real_codex.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_pause_interrupts_the_turn_and_holds_and_resume_continues_the_thread() {
    let w = &World::start().await;
    let fake = w.fake("pause");
    let rec = Recorded::of("recorded/turn-four");
    let adapter = w.start_adapter(CodexArgs {
        prompt: Some("make a fourth file".into()),
        ..w.args(&fake, &["recorded/turn-four"])
    });
    let task = w.task_of(&rec.thread).await;
    let pending = w
        .approval(&task, |d| d.status == DecisionStatus::Pending)
        .await;
    w.command(&task, Operation::Pause, json!({})).await;
    let interrupt = fake
        .wait_for("turn/interrupt", |m| m["method"] == "turn/interrupt")
        .await;
    assert_eq!(
        interrupt["message"]["params"],
        json!({"threadId": rec.thread, "turnId": rec.turn})
    );
    let expired = w
        .approval(&task, |d| {
            d.id == pending.id && d.status == DecisionStatus::Expired
        })
        .await;
    assert!(
        format!("{:?}", expired.outcome).contains("paused in Waymark"),
        "{:?}",
        expired.outcome
    );
    eventually("the interrupted turn's checkpoint", || async {
        w.detail(&task)
            .await
            .checkpoints
            .iter()
            .any(|c| {
                c.body
                    .summary
                    .as_deref()
                    .is_some_and(|s| s.contains("interrupted by a pause"))
            })
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!adapter.handle.is_finished(), "a paused run is held");
    assert_eq!(
        fake.calls("turn/start").len(),
        1,
        "nothing started while paused"
    );

    w.command(&task, Operation::Resume, json!({})).await;
    adapter.ended().await.unwrap();
    let starts = fake.calls("turn/start");
    assert_eq!(starts.len(), 2);
    assert_eq!(
        starts[1]["message"]["params"],
        json!({"threadId": rec.thread, "input": [{"type": "text", "text": codex::RESUME_PROMPT}]})
    );
    assert!(
        fake.received()
            .iter()
            .all(|e| !is_answer_to_id(rec.request.clone())(&e["message"])),
        "the dropped request is never answered"
    );
    let d = w.detail(&task).await;
    assert_eq!(d.task.state, TaskState::Completed);
    assert!(
        d.messages
            .iter()
            .any(|m| m.text == "Continued after the pause.")
    );
    // Codex ended the interrupted turn without a word about the command (no item/completed),
    // but its approval was never answered: it certainly did not run.
    let effect = d
        .effects
        .iter()
        .find(|e| e.idempotency_key == rec.item_key())
        .unwrap();
    assert_eq!(effect.status, EffectStatus::Failed, "{effect:?}");
    let why = effect.receipt.as_ref().unwrap()["error"].to_string();
    assert!(
        why.contains("not run: the turn was interrupted before its approval was answered"),
        "{why}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_connection_loss_expires_the_pending_approval_and_resumes_the_thread() {
    let w = &World::start().await;
    let fake = w.fake("lost");
    let adapter = w.start_adapter(CodexArgs {
        prompt: Some("raise the retry count".into()),
        ..w.args(&fake, &["lost-1", "lost-2"])
    });
    let task = w.task_of("thr_lost").await;
    let pending = w
        .approval(&task, |d| d.status == DecisionStatus::Pending)
        .await;
    assert_eq!(
        pending.question,
        "Codex wants to change 1 file: config.toml"
    );
    // The app-server exits before anyone answers.
    fake.signal("approval-seen");

    // It is restarted, the thread resumed, and the retried turn completes.
    adapter.ended().await.unwrap();
    let resumed = fake.calls("thread/resume");
    assert_eq!(resumed.len(), 1, "{resumed:?}");
    assert_eq!(resumed[0]["run"], 1);
    assert_eq!(
        resumed[0]["message"]["params"],
        json!({"threadId": "thr_lost"})
    );
    assert_eq!(fake.calls("initialize").len(), 2);
    assert!(
        fake.received()
            .iter()
            .all(|e| e["message"]["id"] != 62 || e["message"].get("method").is_some()),
        "request 62 died with its app-server; nothing may answer it"
    );

    let d = w.detail(&task).await;
    let decision = d.decisions.iter().find(|x| x.id == pending.id).unwrap();
    assert_eq!(decision.status, DecisionStatus::Expired);
    let outcome = decision.outcome.as_ref().unwrap();
    assert_eq!(
        outcome.option, None,
        "expired with no option: never approved"
    );
    assert_eq!(outcome.text.as_deref(), Some(CONNECTION_CLOSED));
    assert!(decision.delivery.is_none());
    // The app-server died with the change's approval unanswered: Codex cannot have applied
    // it, so it is closed as not run (not left `unknown`).
    let effect = d
        .effects
        .iter()
        .find(|e| e.idempotency_key == "thr_lost:turn_l1:patch_9")
        .unwrap();
    assert_eq!(effect.status, EffectStatus::Failed, "{effect:?}");
    let why = effect.receipt.as_ref().unwrap()["error"].to_string();
    assert!(
        why.contains("not run: the Codex app-server connection closed before its approval"),
        "{why}"
    );
    assert_eq!(d.task.state, TaskState::Completed);
    assert_eq!(
        d.attempts.len(),
        1,
        "the same attempt follows the resumed thread"
    );
    assert!(
        d.messages
            .iter()
            .any(|m| m.text == "the Codex app-server restarted; the thread was resumed")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_replan_steers_the_active_turn_and_cancel_interrupts_it() {
    let w = &World::start().await;
    let fake = w.fake("steer");
    let adapter = w.start_adapter(CodexArgs {
        prompt: Some("make the checkout tests pass".into()),
        ..w.args(&fake, &["steer"])
    });
    let task = w.task_of("thr_steer").await;
    // The turn has started once Codex was asked for it.
    fake.wait_for("turn/start", |m| m["method"] == "turn/start")
        .await;

    w.command(
        &task,
        Operation::Replan,
        json!({"instructions": "fix the failing test first, leave the refactor"}),
    )
    .await;
    let steer = fake
        .wait_for("turn/steer", |m| m["method"] == "turn/steer")
        .await;
    assert_eq!(
        steer["message"]["params"],
        json!({"threadId": "thr_steer", "expectedTurnId": "turn_s1",
               "input": [{"type": "text", "text": "fix the failing test first, leave the refactor"}]})
    );

    // Codex refuses the second steer: the refusal is told on the thread, not swallowed.
    w.command(
        &task,
        Operation::Replan,
        json!({"instructions": "also update the changelog"}),
    )
    .await;
    let task_id = task.as_str();
    let refusal = eventually("the refused steer on the thread", || async move {
        w.detail(task_id)
            .await
            .messages
            .into_iter()
            .find(|m| m.text.contains("the active turn is not steerable"))
    })
    .await;
    assert_eq!(refusal.role, "system");
    assert!(refusal.text.contains("turn_s1"), "{}", refusal.text);
    let steers = fake.calls("turn/steer");
    assert_eq!(steers.len(), 2);
    assert_eq!(steers[1]["message"]["params"]["expectedTurnId"], "turn_s1");

    w.command(&task, Operation::Cancel, json!({})).await;
    let interrupt = fake
        .wait_for("turn/interrupt", |m| m["method"] == "turn/interrupt")
        .await;
    assert_eq!(
        interrupt["message"]["params"],
        json!({"threadId": "thr_steer", "turnId": "turn_s1"})
    );
    adapter.ended().await.unwrap();
    assert_eq!(w.detail(&task).await.task.state, TaskState::Cancelled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_approval_resolved_in_codex_itself_expires_here() {
    let w = &World::start().await;
    let fake = w.fake("elsewhere");
    let adapter = w.start_adapter(CodexArgs {
        prompt: Some("push the fix".into()),
        ..w.args(&fake, &["elsewhere"])
    });
    let task = w.task_of("thr_else").await;
    let pending = w
        .approval(&task, |d| d.status == DecisionStatus::Pending)
        .await;
    // No availableDecisions: every Codex decision is offered.
    assert_eq!(pending.options.len(), 4);
    fake.signal("approval-seen");

    let expired = w
        .approval(&task, |d| d.status != DecisionStatus::Pending)
        .await;
    assert_eq!(expired.status, DecisionStatus::Expired);
    let outcome = expired.outcome.unwrap();
    assert_eq!(outcome.option, None);
    assert!(
        outcome.text.unwrap().contains("serverRequest/resolved"),
        "the reason says Codex resolved it"
    );
    adapter.ended().await.unwrap();
    assert!(
        !fake
            .received()
            .iter()
            .any(|e| is_answer_to(91)(&e["message"])),
        "nothing may answer a request Codex already resolved"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_reattaching_a_thread_finds_its_task() {
    let w = &World::start().await;
    let first = w.fake("attach-1");
    let adapter = w.start_adapter(CodexArgs {
        threads: vec!["thr_attach".into()],
        ..w.args(&first, &["attach"])
    });
    let task = w.task_of("thr_attach").await;
    let key = "thr_attach:turn_t1:call_3";
    let task_id = task.as_str();
    eventually("the command's effect", || async move {
        w.detail(task_id)
            .await
            .effects
            .into_iter()
            .find(|e| e.idempotency_key == key && e.status == EffectStatus::Confirmed)
    })
    .await;
    adapter.stop().await.unwrap();
    let d = w.detail(&task).await;
    assert_eq!(d.task.title, "Codex: fix the flaky checkout test");
    assert_eq!(d.task.state, TaskState::Queued, "released, not finished");
    assert_eq!(
        first.calls("thread/resume")[0]["message"]["params"],
        json!({"threadId": "thr_attach"})
    );

    // Attaching the same thread again continues the same task with a new attempt.
    let second = w.fake("attach-2");
    let adapter = w.start_adapter(CodexArgs {
        threads: vec!["thr_attach".into()],
        ..w.args(&second, &["attach"])
    });
    second
        .wait_for("thread/resume", |m| m["method"] == "thread/resume")
        .await;
    let d = eventually("the second attempt", || async move {
        Some(w.detail(task_id).await).filter(|d| d.attempts.len() == 2)
    })
    .await;
    assert_eq!(d.attempts[1].fence, 2);
    adapter.stop().await.unwrap();
    assert_eq!(w.tasks_of("thr_attach").await, std::slice::from_ref(&task));
    let d = w.detail(&task).await;
    assert_eq!(
        d.effects
            .iter()
            .filter(|e| e.idempotency_key == key)
            .count(),
        1,
        "the item seen again is the same effect"
    );
}

/// The fake app-server itself, driven over its stdio: its inbox is bounded, so a client that
/// writes faster than the scenario moves is held back by the pipe (and loses nothing); the
/// messages it keeps for later steps are bounded too, and past the bound it fails saying the
/// scenario does not match.
mod fake_bounds {
    use std::path::Path;
    use std::process::Stdio;
    use std::time::Duration;

    use tokio::io::AsyncWriteExt;

    fn start(dir: &Path, steps: &[&str]) -> tokio::process::Child {
        let scenario = dir.join("scenario.jsonl");
        std::fs::write(&scenario, steps.join("\n")).unwrap();
        tokio::process::Command::new(super::FAKE)
            .arg("--record")
            .arg(dir.join("record.jsonl"))
            .arg("--scenario")
            .arg(&scenario)
            .arg("--step-timeout")
            .arg("30")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap()
    }

    fn line(i: usize) -> String {
        format!(
            "{{\"method\":\"noise\",\"params\":{{\"i\":{i},\"pad\":\"{}\"}}}}\n",
            "x".repeat(400)
        )
    }

    fn recorded(dir: &Path) -> usize {
        std::fs::read_to_string(dir.join("record.jsonl"))
            .unwrap_or_default()
            .lines()
            .count()
    }

    #[tokio::test]
    async fn a_client_faster_than_the_scenario_is_held_back_and_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut fake = start(
            dir.path(),
            &[r#"{"wait_file": "go"}"#, r#"{"expect": "last"}"#],
        );
        let mut stdin = fake.stdin.take().unwrap();
        // 900 lines of ~450 bytes: more than the pipe and the inbox hold together.
        let writer = tokio::spawn(async move {
            for i in 0..900 {
                stdin.write_all(line(i).as_bytes()).await.unwrap();
            }
            stdin.write_all(b"{\"method\":\"last\"}\n").await.unwrap();
            stdin
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!writer.is_finished(), "the writer was not held back");
        let read_so_far = recorded(dir.path());
        assert!(
            read_so_far < 901,
            "the fake read ahead of its steps: {read_so_far}"
        );

        std::fs::write(dir.path().join("go"), "").unwrap();
        let stdin = tokio::time::timeout(Duration::from_secs(20), writer)
            .await
            .expect("the writer goes on once the scenario moves")
            .unwrap();
        drop(stdin);
        let out = tokio::time::timeout(Duration::from_secs(20), fake.wait_with_output())
            .await
            .expect("the fake ends when its stdin closes")
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(recorded(dir.path()), 901, "every line was recorded");
    }

    #[tokio::test]
    async fn past_its_bound_of_kept_messages_the_fake_fails_saying_why() {
        let dir = tempfile::tempdir().unwrap();
        let mut fake = start(dir.path(), &[r#"{"expect": "never-sent"}"#]);
        let mut stdin = fake.stdin.take().unwrap();
        let writer = tokio::spawn(async move {
            for i in 0..1100 {
                if stdin.write_all(line(i).as_bytes()).await.is_err() {
                    return;
                }
            }
        });
        let out = tokio::time::timeout(Duration::from_secs(20), fake.wait_with_output())
            .await
            .expect("the fake fails at once, not at the step timeout")
            .unwrap();
        writer.abort();
        assert_eq!(out.status.code(), Some(3));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("more than 1024 messages arrived that no step wanted"),
            "{err}"
        );
    }
}

#[tokio::test]
async fn a_missing_working_directory_is_named_not_blamed_on_codex() {
    let w = &World::start().await;
    let fake = w.fake("cwd");
    let missing = w.cp.dir.path().join("no-such-dir");
    let err = codex::run(
        CodexArgs {
            prompt: Some("fix it".into()),
            cwd: Some(missing.clone()),
            ..w.args(&fake, &["approve"])
        },
        w.cp.client.clone(),
        CancellationToken::new(),
    )
    .await
    .expect_err("a missing directory is refused")
    .to_string();
    assert!(
        err.contains(&missing.display().to_string()) && err.contains("--cwd"),
        "{err}"
    );
    assert!(!err.contains("installed and on PATH"), "{err}");
}
