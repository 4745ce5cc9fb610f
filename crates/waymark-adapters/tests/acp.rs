//! The ACP adapter against the fake ACP agent (`waymark-fake-acp`, scenarios in
//! `fixtures/acp/`) and a real control plane; approvals are answered the way the companion
//! answers them, with a paired device's signed commands.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use support::{ControlPlane, Phone, eventually};
use tokio_util::sync::CancellationToken;
use waymark_adapters::acp::{self, AcpArgs, AcpError};
use waymark_proto::{
    DecisionStatus, DeliveryState, EffectStatus, FinishOutcome, Operation, TaskDetail,
};

struct World {
    cp: ControlPlane,
    phone: Phone,
}

impl World {
    async fn start() -> World {
        let cp = ControlPlane::start("acp").await;
        let phone = cp.phone().await;
        World { cp, phone }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.cp.dir.path().join(name)
    }

    /// The adapter's arguments for a scenario, recording what the fake agent receives.
    fn args(&self, scenario: &str, runtime: &str) -> AcpArgs {
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/acp")
            .join(scenario);
        AcpArgs {
            agent_cmd: format!(
                "'{}' --scenario '{}' --record '{}' --gate '{}'",
                env!("CARGO_BIN_EXE_waymark-fake-acp"),
                fixture.display(),
                self.path("received.jsonl").display(),
                self.path("gate").display(),
            ),
            cwd: Some(self.cp.dir.path().to_owned()),
            prompt: "clean up the build and run the tests".into(),
            runtime: runtime.into(),
            title: None,
            worker: "acp-test".into(),
            approval_expires_in: None,
            bind: Default::default(),
        }
    }

    /// Every line the fake agent received, parsed.
    fn received(&self) -> Vec<Value> {
        std::fs::read_to_string(self.path("received.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The task of an ACP session, once the adapter has created it.
    async fn task_of(&self, runtime: &str, session: &str) -> String {
        self.cp.task_of(runtime, session).await
    }

    async fn detail(&self, task: &str) -> TaskDetail {
        self.cp.detail(task).await
    }

    /// A signed device command, submitted as the companion does; returns the HTTP status and
    /// the command result.
    async fn submit(&self, task: &str, op: Operation, args: Value) -> (u16, Value) {
        let revision = self.detail(task).await.task.plan_revision;
        self.phone.submit(task, revision, op, args).await
    }

    /// A signed device command that must apply.
    async fn command(&self, task: &str, op: Operation, args: Value) -> Value {
        let revision = self.detail(task).await.task.plan_revision;
        self.phone.command(task, revision, op, args).await
    }

    /// Answers the task's one pending approval from the paired device.
    async fn answer(&self, task: &str, op: Operation, option: Option<&str>) -> String {
        let d = eventually("a pending approval", || async {
            self.detail(task)
                .await
                .decisions
                .into_iter()
                .find(|d| d.status == DecisionStatus::Pending)
        })
        .await;
        let mut args = json!({"decision_id": d.id, "intent_digest": d.intent_digest});
        if let Some(o) = option {
            args["option"] = json!(o);
        }
        self.command(task, op, args).await;
        d.id
    }
}

fn start(world: &World, args: AcpArgs) -> tokio::task::JoinHandle<Result<(), AcpError>> {
    let client = world.cp.client.clone();
    tokio::spawn(async move { acp::run(args, client, CancellationToken::new()).await })
}

async fn ended(h: tokio::task::JoinHandle<Result<(), AcpError>>) -> Result<(), AcpError> {
    tokio::time::timeout(Duration::from_secs(30), h)
        .await
        .expect("the adapter ends")
        .unwrap()
}

#[tokio::test]
async fn acp_deny_from_a_device_reaches_the_agent_as_its_deny_option() {
    let w = World::start().await;
    let adapter = start(&w, w.args("permission-deny.json", "acp"));
    let task = w.task_of("acp", "sess-deny").await;
    let decision = w.answer(&task, Operation::Deny, None).await;
    ended(adapter).await.unwrap();

    // The agent received exactly the answer ACP defines, with its own option id.
    let answer = w
        .received()
        .into_iter()
        .find(|m| m["id"] == 5 && m.get("method").is_none())
        .expect("the agent got an answer to request 5");
    assert_eq!(
        answer,
        json!({"jsonrpc":"2.0","id":5,"result":{"outcome":{"outcome":"selected","optionId":"deny"}}})
    );

    let detail = w.detail(&task).await;
    let d = detail.decisions.iter().find(|d| d.id == decision).unwrap();
    assert_eq!(d.status, DecisionStatus::Resolved);
    assert_eq!(d.durability.map(|x| x.as_str()), Some("connection_bound"));
    let ids: Vec<&str> = d.options.iter().map(|o| o.id.as_str()).collect();
    assert_eq!(ids, ["approve", "approve_always", "deny"]);
    // Acknowledged by the agent's next word about that tool call.
    let delivery = d.delivery.as_ref().expect("a delivery state");
    assert_eq!(delivery.state, DeliveryState::Acknowledged);
    assert!(
        delivery.detail.as_deref().unwrap().contains("call-rm"),
        "{delivery:?}"
    );
    // The refused tool call is closed as not run (by the answer, before the agent's own
    // report of it), linked to its approval; the turn ended the attempt.
    let e = detail
        .effects
        .iter()
        .find(|e| e.idempotency_key == "sess-deny:call-rm")
        .unwrap();
    assert_eq!(e.status, EffectStatus::Failed);
    assert_eq!(
        e.receipt.as_ref().unwrap()["error"],
        "not run: the approval was answered `deny`"
    );
    assert_eq!(e.intent["approval"], decision.as_str());
    assert_eq!(detail.attempts[0].outcome, Some(FinishOutcome::Completed));
    let texts: Vec<&str> = detail.messages.iter().map(|m| m.text.as_str()).collect();
    assert!(
        texts.contains(&"I will delete the build directory."),
        "{texts:?}"
    );
    assert!(texts.contains(&"Understood; build/ stays."), "{texts:?}");
}

#[tokio::test]
async fn hermes_approve_session_selects_allow_session_and_the_tool_call_becomes_an_effect() {
    let w = World::start().await;
    let adapter = start(&w, w.args("hermes-allow-session.json", "hermes"));
    let task = w.task_of("hermes", "20260901_101500_ab12").await;
    let decision = w
        .answer(&task, Operation::Approve, Some("approve_session"))
        .await;
    ended(adapter).await.unwrap();

    let answer = w
        .received()
        .into_iter()
        .find(|m| m["id"] == 1 && m.get("method").is_none())
        .unwrap();
    assert_eq!(
        answer,
        json!({"jsonrpc":"2.0","id":1,"result":{"outcome":{"outcome":"selected","optionId":"allow_session"}}})
    );
    let detail = w.detail(&task).await;
    let d = detail.decisions.iter().find(|d| d.id == decision).unwrap();
    let ids: Vec<&str> = d.options.iter().map(|o| o.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "approve",
            "approve_session",
            "approve_always",
            "deny",
            "deny_always"
        ]
    );
    assert_eq!(
        d.outcome.as_ref().unwrap().option.as_deref(),
        Some("approve_session")
    );
    // Hermes asked under `perm-check-1` about the `tc-…` call it had just announced: its
    // completion acknowledges the answer, and the effect names the approval.
    let delivery = d.delivery.as_ref().unwrap();
    assert_eq!(delivery.state, DeliveryState::Acknowledged);
    assert!(
        delivery
            .detail
            .as_deref()
            .unwrap()
            .contains("tc-27db43bd501e"),
        "{delivery:?}"
    );
    // Hermes' own 60 s wait is the approval's deadline, not the server's hour: shown as
    // Hermes', and ours closes it a grace after (the adapter reports what Hermes did first).
    let r = d.runtime_deadline.as_ref().expect("Hermes' deadline");
    let deadline = (r.at - d.created_at).num_milliseconds();
    assert!((59_000..=60_000).contains(&deadline), "{deadline} ms");
    let ours = (d.expires_at - d.created_at).num_milliseconds();
    assert!((64_000..=65_000).contains(&ours), "{ours} ms");

    let e = detail
        .effects
        .iter()
        .find(|e| e.idempotency_key == "20260901_101500_ab12:tc-27db43bd501e")
        .unwrap();
    assert_eq!(e.status, EffectStatus::Confirmed);
    assert_eq!(e.kind, "tool_call:execute");
    assert_eq!(e.intent["approval"], decision.as_str());
    assert_eq!(e.intent["title"], "terminal: pytest -x");
    assert!(
        e.receipt
            .as_ref()
            .unwrap()
            .to_string()
            .contains("exit_code:** 0"),
        "{:?}",
        e.receipt
    );
    assert_eq!(detail.task.runtime.as_deref(), Some("hermes"));
    // The turn's usage, as Hermes reports it (`totalTokens`).
    assert_eq!(detail.task.usage.tokens, 30);
    // Hermes keeps the session: the attempt is released so the state.db mirror can add to it.
    assert_eq!(detail.attempts[0].outcome, Some(FinishOutcome::Released));
}

#[tokio::test]
async fn acp_agent_exit_with_a_pending_approval_expires_it_never_approved() {
    let w = World::start().await;
    let adapter = start(&w, w.args("agent-exits.json", "acp"));
    let task = w.task_of("acp", "sess-exit").await;
    let decision = eventually("the approval", || async {
        w.detail(&task)
            .await
            .decisions
            .into_iter()
            .find(|d| d.status == DecisionStatus::Pending)
    })
    .await;
    std::fs::write(w.path("gate"), b"open").unwrap();
    let err = ended(adapter).await.unwrap_err();
    assert!(matches!(err, AcpError::AgentExited(_)), "{err}");

    let detail = w.detail(&task).await;
    let d = detail
        .decisions
        .iter()
        .find(|d| d.id == decision.id)
        .unwrap();
    assert_eq!(d.status, DecisionStatus::Expired);
    let outcome = d.outcome.as_ref().unwrap();
    assert_eq!(outcome.option, None, "no option applies: {outcome:?}");
    assert_eq!(outcome.by, "runtime");
    assert!(
        outcome
            .text
            .as_deref()
            .unwrap()
            .contains("ACP approvals do not survive it")
    );
    assert!(d.delivery.is_none());
    // A person who answers now is refused: the approval is closed.
    let (status, res) = w
        .submit(
            &task,
            Operation::Approve,
            json!({"decision_id": d.id, "intent_digest": d.intent_digest}),
        )
        .await;
    assert_ne!(status, 200, "{res}");
    assert_eq!(res["status"], "rejected", "{res}");
    assert_eq!(detail.attempts[0].outcome, Some(FinishOutcome::Failed));
}

#[tokio::test]
async fn acp_replan_cancels_the_turn_and_prompts_again_with_the_instructions() {
    let w = World::start().await;
    let adapter = start(&w, w.args("replan.json", "acp"));
    let task = w.task_of("acp", "sess-replan").await;
    eventually("the first turn under way", || async {
        w.detail(&task)
            .await
            .messages
            .iter()
            .any(|m| m.text == "Starting on the parser.")
            .then_some(())
    })
    .await;
    let revision = w.detail(&task).await.task.plan_revision;
    let instructions = "fix the lexer first; leave the parser alone";
    w.command(
        &task,
        Operation::Replan,
        json!({"instructions": instructions}),
    )
    .await;
    ended(adapter).await.unwrap();

    let received = w.received();
    let methods: Vec<&str> = received
        .iter()
        .filter_map(|m| m["method"].as_str())
        .collect();
    assert_eq!(
        methods,
        [
            "initialize",
            "session/new",
            "session/prompt",
            "session/cancel",
            "session/prompt"
        ]
    );
    let cancel = received
        .iter()
        .find(|m| m["method"] == "session/cancel")
        .unwrap();
    assert_eq!(cancel["params"], json!({"sessionId": "sess-replan"}));
    assert!(cancel.get("id").is_none(), "a notification: {cancel}");
    let second = received
        .iter()
        .filter(|m| m["method"] == "session/prompt")
        .nth(1)
        .unwrap();
    assert_eq!(
        second["params"]["prompt"],
        json!([{"type": "text", "text": instructions}])
    );

    let detail = w.detail(&task).await;
    assert_eq!(detail.task.plan_revision, revision + 1);
    assert_eq!(detail.attempts.len(), 1);
    assert_eq!(detail.attempts[0].outcome, Some(FinishOutcome::Completed));
    let texts: Vec<&str> = detail.messages.iter().map(|m| m.text.as_str()).collect();
    assert!(texts.contains(&instructions), "{texts:?}");
    assert!(
        texts.contains(&"Fixing the lexer first, as asked."),
        "{texts:?}"
    );
    let reasons: Vec<&str> = detail
        .checkpoints
        .iter()
        .map(|c| c.body.reason.as_str())
        .collect();
    assert_eq!(reasons, ["replan", "turn_ended"]);
}

#[tokio::test]
async fn acp_tool_calls_become_effects_with_receipts_and_the_turn_end_finishes_the_attempt() {
    let w = World::start().await;
    let adapter = start(&w, w.args("tools.json", "acp"));
    let task = w.task_of("acp", "sess-tools").await;
    ended(adapter).await.unwrap();

    let detail = w.detail(&task).await;
    let read = detail
        .effects
        .iter()
        .find(|e| e.idempotency_key == "sess-tools:call-read")
        .unwrap();
    assert_eq!(read.status, EffectStatus::Confirmed);
    assert_eq!(read.kind, "tool_call:read");
    assert_eq!(read.intent["locations"][0]["path"], "/repo/config.toml");
    let receipt = read.receipt.as_ref().unwrap();
    assert_eq!(receipt["content"][0]["content"]["text"], "port = 8080");
    assert_eq!(receipt["rawOutput"]["bytes"], 12);
    let fetch = detail
        .effects
        .iter()
        .find(|e| e.idempotency_key == "sess-tools:call-fetch")
        .unwrap();
    assert_eq!(fetch.status, EffectStatus::Failed);
    assert_eq!(
        fetch.receipt.as_ref().unwrap()["error"],
        "dns error: example.invalid"
    );

    let last = detail.checkpoints.last().unwrap();
    assert_eq!(last.body.reason, "turn_ended");
    let mut statuses: Vec<EffectStatus> = last.body.effects.iter().map(|r| r.status).collect();
    statuses.sort_by_key(|s| s.as_str());
    assert_eq!(statuses, [EffectStatus::Confirmed, EffectStatus::Failed]);
    assert_eq!(detail.attempts[0].outcome, Some(FinishOutcome::Completed));
    assert_eq!(detail.task.state.as_str(), "completed");
    let texts: Vec<(&str, &str)> = detail
        .messages
        .iter()
        .map(|m| (m.role.as_str(), m.text.as_str()))
        .collect();
    assert_eq!(texts[0], ("user", "clean up the build and run the tests"));
    assert!(texts.contains(&(
        "assistant",
        "plan:\n- [in_progress] read the config\n- [pending] fetch the schema"
    )));
    assert!(texts.contains(&(
        "assistant",
        "The port is 8080; the schema could not be fetched."
    )));
}

#[tokio::test]
async fn acp_cancel_sends_session_cancel_and_answers_the_open_request_cancelled() {
    let w = World::start().await;
    let adapter = start(&w, w.args("cancel.json", "acp"));
    let task = w.task_of("acp", "sess-cancel").await;
    let decision = eventually("the approval", || async {
        w.detail(&task)
            .await
            .decisions
            .into_iter()
            .find(|d| d.status == DecisionStatus::Pending)
    })
    .await;
    w.command(&task, Operation::Cancel, json!({})).await;
    ended(adapter).await.unwrap();

    let received = w.received();
    let cancel = received
        .iter()
        .position(|m| m["method"] == "session/cancel")
        .expect("session/cancel sent");
    let answer = received
        .iter()
        .position(|m| m["id"] == 3 && m.get("method").is_none())
        .expect("request 3 answered");
    assert!(cancel < answer, "ACP: cancel first, then the open requests");
    assert_eq!(
        received[answer],
        json!({"jsonrpc":"2.0","id":3,"result":{"outcome":{"outcome":"cancelled"}}})
    );
    let detail = w.detail(&task).await;
    assert_eq!(detail.task.state.as_str(), "cancelled");
    let d = detail
        .decisions
        .iter()
        .find(|d| d.id == decision.id)
        .unwrap();
    assert_eq!(d.status, DecisionStatus::Void);
    assert!(d.delivery.is_none(), "never reported approved: {d:?}");
}

#[tokio::test]
async fn hermes_that_stops_waiting_closes_the_approval_expired_and_the_call_as_not_run() {
    let w = World::start().await;
    let adapter = start(&w, w.args("hermes-timeout.json", "hermes"));
    let task = w.task_of("hermes", "20260901_111500_cd34").await;
    let pending = eventually("the approval", || async {
        w.detail(&task)
            .await
            .decisions
            .into_iter()
            .find(|d| d.status == DecisionStatus::Pending)
    })
    .await;
    // People are shown Hermes' own deadline, not ours: it denies after its fixed 60 s.
    let deadline = pending.runtime_deadline.clone().expect("Hermes' deadline");
    assert_eq!(deadline.runtime, "Hermes");
    assert_eq!(deadline.then, waymark_proto::RuntimeFallback::Denies);
    assert_eq!((deadline.at - pending.created_at).num_seconds(), 60);
    assert_eq!(pending.closing().runtime.as_deref(), Some("Hermes"));
    // Hermes' 60 s pass (the gate): it denies on its own and reports the call ended.
    std::fs::write(w.path("gate"), b"open").unwrap();
    ended(adapter).await.unwrap();

    let detail = w.detail(&task).await;
    let d = detail
        .decisions
        .iter()
        .find(|d| d.id == pending.id)
        .unwrap();
    assert_eq!(
        d.status,
        DecisionStatus::Expired,
        "closed as Hermes decided, never left open: {d:?}"
    );
    assert_eq!(d.outcome.as_ref().unwrap().option, None, "{d:?}");
    let e = detail
        .effects
        .iter()
        .find(|e| e.intent["approval"] == d.id.as_str())
        .expect("the call names its approval");
    assert_eq!(
        e.status,
        EffectStatus::Failed,
        "not run, though Hermes reports it completed: {e:?}"
    );
    assert!(
        e.receipt.as_ref().unwrap()["error"]
            .as_str()
            .unwrap()
            .contains("stopped waiting"),
        "{e:?}"
    );
    // The request was answered once (cancelled), after Hermes had moved on.
    let answers: Vec<Value> = w
        .received()
        .into_iter()
        .filter(|m| m["id"] == 1 && m.get("method").is_none())
        .collect();
    assert_eq!(
        answers,
        [json!({"jsonrpc":"2.0","id":1,"result":{"outcome":{"outcome":"cancelled"}}})]
    );
}

/// GitHub Copilot CLI 1.0.102's own frames (recorded from `copilot --acp`, run `deny`): the call
/// is titled with the model's description, so the approval names the command beside it; the
/// denial reaches Copilot as its `reject_once`; the call is closed as not run although Copilot
/// reports it only in `rawOutput`; the turn's usage is recorded.
#[tokio::test]
async fn copilot_recorded_denial_names_the_command_and_closes_the_call_as_not_run() {
    let w = World::start().await;
    let adapter = start(&w, w.args("copilot-deny.json", "copilot"));
    let task = w
        .task_of("copilot", "bc7e2746-7105-4a70-80e1-c7f53c8e5e2a")
        .await;
    let decision = w.answer(&task, Operation::Deny, None).await;
    ended(adapter).await.unwrap();

    let answer = w
        .received()
        .into_iter()
        .find(|m| m["id"] == 0 && m.get("method").is_none())
        .expect("Copilot got an answer to request 0");
    assert_eq!(
        answer["result"],
        json!({"outcome": {"outcome": "selected", "optionId": "reject_once"}})
    );
    let detail = w.detail(&task).await;
    let d = detail.decisions.iter().find(|d| d.id == decision).unwrap();
    assert!(
        d.question.contains("Create the file the user asked for")
            && d.question.contains("touch /tmp/cp/work/deny"),
        "the card says what runs, not only the model's description: {}",
        d.question
    );
    let e = detail
        .effects
        .iter()
        .find(|e| e.idempotency_key.ends_with(":call_1"))
        .expect("the call's effect");
    assert_eq!(e.status, EffectStatus::Failed);
    assert_eq!(
        e.receipt.as_ref().unwrap()["error"],
        "not run: the approval was answered `deny`"
    );
    assert_eq!(detail.task.usage.tokens, 15, "the turn's usage");
}

/// OpenCode 1.18.33's own frames (recorded from `opencode acp`, run `deny`): its call is
/// reported running before it asks, the denial reaches OpenCode as its `reject`, and the call is
/// closed as not run (never confirmed) with the turn's usage recorded.
#[tokio::test]
async fn opencode_recorded_denial_reaches_it_as_reject_and_the_call_is_not_run() {
    let w = World::start().await;
    let adapter = start(&w, w.args("opencode-deny.json", "opencode"));
    let task = w
        .task_of("opencode", "ses_dcc5a40ffffeaGWjFziwnlhxjP")
        .await;
    let decision = w.answer(&task, Operation::Deny, None).await;
    ended(adapter).await.unwrap();

    let answer = w
        .received()
        .into_iter()
        .find(|m| m["id"] == 0 && m.get("method").is_none())
        .expect("OpenCode got an answer to request 0");
    assert_eq!(
        answer["result"],
        json!({"outcome": {"outcome": "selected", "optionId": "reject"}})
    );
    let detail = w.detail(&task).await;
    let d = detail.decisions.iter().find(|d| d.id == decision).unwrap();
    assert!(
        d.question.contains("touch /tmp/oc/work/deny"),
        "{}",
        d.question
    );
    let e = detail
        .effects
        .iter()
        .find(|e| e.idempotency_key.ends_with(":call_1"))
        .expect("the call's effect");
    assert_eq!(e.status, EffectStatus::Failed, "{e:?}");
    assert_eq!(
        e.receipt.as_ref().unwrap()["error"],
        "not run: the approval was answered `deny`"
    );
    assert_eq!(detail.task.usage.tokens, 15, "the turn's usage");
}
