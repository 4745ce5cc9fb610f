//! The generic ACP adapter against the REAL GitHub Copilot CLI (`@github/copilot@1.0.102` from
//! npm, installed by `scripts/setup-debian` under `$WAYMARK_RUNTIMES_DIR/copilot`, default
//! `~/.cache/waymark-runtimes/copilot`): `copilot --acp`, started by the adapter as
//! `waymark adapters acp --runtime copilot --agent-cmd …` starts it, offline
//! (`COPILOT_OFFLINE=true`: no GitHub sign-in, telemetry or update) with a private home and its
//! "bring your own key" provider pointed only at a fake OpenAI-compatible model
//! (`support::fake_model`, shape [`Shape::BASH`]), a real control plane in-process, and a phone
//! answering with signed commands. In each turn the model asks Copilot's `bash` tool to `touch` a
//! file in the session's directory; Copilot asks its client; the request must reach the inbox as
//! a pending approval with Copilot's options. Approve runs the command (the file appears, the
//! effect is confirmed with Copilot's receipt, the model's answer is mirrored); deny does not.
//!
//! The test fails — never skips — when the runtime is not installed. Each turn is one adapter
//! run (one ACP session, one task); the agent it starts is killed when the adapter ends or,
//! should the test fail, when the adapter is dropped.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use support::fake_model::{self, BASH_DESCRIPTION, FakeModel, Shape, Turn};
use support::real_acp::{
    self, Adapter, answer, installed_binary, messages, new_task, pending_approval, quoted,
};
use support::{ControlPlane, Phone};
use waymark_adapters::acp::AcpArgs;
use waymark_proto::{
    Decision, DecisionKind, DeliveryState, Effect, EffectStatus, FinishOutcome, Operation,
    TaskDetail,
};

/// The version `scripts/setup-debian` installs and this test was written against.
const COPILOT_VERSION: &str = "1.0.102";
const RUNTIME: &str = "copilot";
/// How long one turn may take end to end (start-up, model calls, approval, the command).
const TURN: Duration = Duration::from_secs(150);

/// The native binary of `@github/copilot-linux-x64`, run directly (not through npm's Node
/// launcher) so that killing the adapter's child kills Copilot.
fn copilot_binary() -> PathBuf {
    installed_binary(
        "copilot",
        &format!("@github/copilot@{COPILOT_VERSION}"),
        "node_modules/@github/copilot-linux-x64/copilot",
    )
}

/// A private Copilot: its own home (`COPILOT_HOME` under it), the fake model as its provider
/// (what each setting is for: docs/adapters/copilot.md), and a workspace.
struct Home<'a> {
    dir: &'a tempfile::TempDir,
    base_url: String,
}

impl<'a> Home<'a> {
    fn new(dir: &'a tempfile::TempDir, model: &FakeModel) -> Home<'a> {
        std::fs::create_dir_all(dir.path().join("work")).unwrap();
        Home {
            dir,
            base_url: model.base_url.clone(),
        }
    }

    fn work(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    /// `--agent-cmd`: `env -i` gives Copilot only the private home and the switches (no
    /// GitHub token of the machine's environment leaks in) and execs it (no shell stays between).
    fn agent_cmd(&self, copilot: &Path) -> String {
        let h = self.dir.path();
        [
            "exec env -i PATH=/usr/local/bin:/usr/bin:/bin".to_owned(),
            format!("HOME={}", quoted(h)),
            format!("COPILOT_HOME={}", quoted(&h.join(".copilot"))),
            "COPILOT_OFFLINE=true".into(),
            format!("COPILOT_PROVIDER_BASE_URL={}", self.base_url),
            "COPILOT_PROVIDER_TYPE=openai".into(),
            "COPILOT_PROVIDER_API_KEY=dummy".into(),
            format!("COPILOT_MODEL={}", fake_model::MODEL),
            "COPILOT_AUTO_UPDATE=false".into(),
            quoted(copilot),
            "--acp".into(),
            "--no-auto-update".into(),
            "--disable-client-telemetry".into(),
        ]
        .join(" ")
    }

    fn args(&self, copilot: &Path, prompt: &str) -> AcpArgs {
        AcpArgs {
            agent_cmd: self.agent_cmd(copilot),
            cwd: Some(self.work()),
            prompt: prompt.into(),
            runtime: RUNTIME.into(),
            title: None,
            worker: "alice-copilot".into(),
            approval_expires_in: None,
            bind: Default::default(),
        }
    }
}

/// What every approval of these turns looks like in the inbox.
fn check_offer(d: &Decision, session: &str, command: &str) {
    assert_eq!(d.kind, DecisionKind::Approval);
    assert_eq!(
        d.durability,
        Some(waymark_proto::ApprovalDurability::ConnectionBound)
    );
    let options: Vec<(&str, &str)> = d
        .options
        .iter()
        .map(|o| (o.id.as_str(), o.label.as_str()))
        .collect();
    // Copilot 1.0: allow once / always allow / deny, with ACP kinds.
    assert_eq!(
        options,
        [
            ("approve", "Allow once"),
            ("approve_always", "Always allow"),
            ("deny", "Deny"),
        ]
    );
    let params = &d.intent.as_ref().unwrap();
    assert_eq!(params["sessionId"], session, "{params}");
    assert_eq!(
        params["toolCall"]["rawInput"]["command"], command,
        "{params}"
    );
    assert_eq!(
        params["toolCall"]["rawInput"]["commands"],
        serde_json::json!([command]),
        "{params}"
    );
    assert_eq!(params["toolCall"]["kind"], "execute", "{params}");
    // Copilot titles the call with the model's `description`, not the command.
    assert_eq!(params["toolCall"]["title"], BASH_DESCRIPTION, "{params}");
}

/// The turn's shell call, once settled.
async fn command_effect(cp: &ControlPlane, task: &str, command: &str) -> Effect {
    real_acp::within(TURN, "the command's effect settled", || async {
        cp.detail(task).await.effects.into_iter().find(|e| {
            e.kind == "tool_call:execute"
                && e.intent["rawInput"]["command"] == command
                && e.status.is_terminal()
        })
    })
    .await
}

fn chosen(t: &TaskDetail, d: &Decision) -> Decision {
    t.decisions.iter().find(|x| x.id == d.id).unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_copilot_bash_permission_reaches_the_inbox_and_approve_runs_it_and_deny_does_not() {
    let started = Instant::now();
    let copilot = copilot_binary();
    let cp = ControlPlane::start("alice-copilot").await;
    let phone: Phone = cp.phone().await;
    // The files are made in the session's own directory (a temp dir).
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str| dir.path().join("work").join(name);
    let cmd = |name: &str| format!("touch {}", file(name).display());
    let model = FakeModel::start_with(
        vec![
            Turn {
                prompt: "waymark turn one".into(),
                command: cmd("approved"),
                answer: "Created the file.".into(),
            },
            Turn {
                prompt: "waymark turn two".into(),
                command: cmd("denied"),
                answer: "This answer never comes: Copilot ends the turn on a denial.".into(),
            },
        ],
        Shape::BASH,
    )
    .await;
    let home = Home::new(&dir, &model);
    let mut seen = Vec::new();
    // What the ACP adapter does not yet do for Copilot, checked last so that everything
    // else is proven first (docs/adapters/copilot.md, "What the adapter still lacks").
    let mut lacking: Vec<String> = Vec::new();

    // ---- turn one: approved -------------------------------------------------------------
    let prompt = "waymark turn one: make the file";
    let adapter = Adapter::start(&cp, home.args(&copilot, prompt));
    let (task, session) = new_task(&cp, RUNTIME, &mut seen, TURN).await;
    assert!(
        uuid_like(&session),
        "Copilot's session id is a UUID: {session}"
    );
    let d = pending_approval(&cp, &task, TURN).await;
    eprintln!("approval one in the inbox at {:?}", started.elapsed());
    check_offer(&d, &session, &cmd("approved"));
    if !d.question.contains(&cmd("approved")) {
        lacking.push(format!(
            "the inbox card names the command a person approves: the question is {:?} (Copilot's \
             title is the model's description; the command is only in `toolCall.rawInput.command`)",
            d.question
        ));
    }
    assert!(!file("approved").exists(), "nothing runs before the answer");
    let asked = Instant::now();
    answer(&phone, &cp, &task, &d, Operation::Approve, "approve").await;
    real_acp::within(TURN, "the approved command to run", || async {
        file("approved").exists().then_some(())
    })
    .await;
    eprintln!("approve → file exists in {:?}", asked.elapsed());
    adapter.ended(TURN).await.expect("turn one ends well");
    let t = cp.detail(&task).await;
    let dd = chosen(&t, &d);
    assert_eq!(waymark_worker::chosen_option(&dd), Some("approve"));
    assert_eq!(
        dd.delivery.as_ref().unwrap().state,
        DeliveryState::Acknowledged,
        "{:?}",
        dd.delivery
    );
    let effect = command_effect(&cp, &task, &cmd("approved")).await;
    assert_eq!(effect.status, EffectStatus::Confirmed, "{effect:?}");
    assert!(
        effect.idempotency_key.starts_with(&format!("{session}:")),
        "{}",
        effect.idempotency_key
    );
    let receipt = effect
        .receipt
        .clone()
        .expect("a confirmed effect has a receipt");
    assert_eq!(
        receipt["rawOutput"]["contents"][0]["exitCode"], 0,
        "{receipt}"
    );
    assert_eq!(
        messages(&t),
        [
            ("user".to_owned(), prompt.to_owned()),
            ("assistant".to_owned(), "Created the file.".to_owned()),
        ]
    );
    assert_eq!(t.attempts.len(), 1);
    assert_eq!(t.attempts[0].outcome, Some(FinishOutcome::Completed));
    // The model was really asked, with Copilot's `bash` tool offered, and saw the result.
    let requests = model.requests();
    assert!(
        requests.iter().any(|r| r["tools"]
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t["function"]["name"] == "bash"))),
        "Copilot offered its bash tool"
    );
    assert!(
        requests.iter().any(|r| r["messages"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"))),
        "the command's result went back to the model"
    );
    eprintln!("turn one done at {:?}", started.elapsed());
    if t.task.usage.tokens == 0 {
        lacking.push(
            "turn one's token usage, which Copilot reported in its answer to `session/prompt` \
             (`usage: {inputTokens, outputTokens, totalTokens, …}`), is recorded on the task"
                .into(),
        );
    }

    // ---- turn two: denied ---------------------------------------------------------------
    let prompt = "waymark turn two: make the other file";
    let asked_before = model.requests().len();
    let adapter = Adapter::start(&cp, home.args(&copilot, prompt));
    let (task, session) = new_task(&cp, RUNTIME, &mut seen, TURN).await;
    let d = pending_approval(&cp, &task, TURN).await;
    check_offer(&d, &session, &cmd("denied"));
    answer(&phone, &cp, &task, &d, Operation::Deny, "deny").await;
    adapter.ended(TURN).await.expect("turn two ends well");
    assert!(!file("denied").exists(), "the denied command did not run");
    let t = cp.detail(&task).await;
    let dd = chosen(&t, &d);
    assert_eq!(waymark_worker::chosen_option(&dd), Some("deny"));
    assert_eq!(
        dd.delivery.as_ref().unwrap().state,
        DeliveryState::Acknowledged
    );
    let effect = command_effect(&cp, &task, &cmd("denied")).await;
    assert_eq!(effect.status, EffectStatus::Failed, "{effect:?}");
    // Closed as not run by the denial, whatever Copilot reports afterwards (its failure update
    // carries only `rawOutput.message`: "The user rejected this tool call.").
    let reason = effect.receipt.as_ref().unwrap()["error"].to_string();
    assert!(
        reason.contains("not run") && reason.contains("deny"),
        "the denied call's effect says it was not run and why: {reason}"
    );
    // Copilot 1.0 ends the turn on a denial without asking the model again, saying so itself.
    assert_eq!(t.attempts[0].outcome, Some(FinishOutcome::Completed));
    assert_eq!(
        messages(&t),
        [
            ("user".to_owned(), prompt.to_owned()),
            (
                "assistant".to_owned(),
                "Info: Operation cancelled by user".to_owned()
            ),
        ]
    );
    assert_eq!(
        model.requests().len() - asked_before,
        1,
        "one model call in turn two: the one that asked for bash"
    );
    eprintln!("turn two done at {:?}", started.elapsed());

    assert!(
        lacking.is_empty(),
        "Copilot runs through the ACP adapter, but the adapter does not yet:\n- {}",
        lacking.join("\n- ")
    );
}

fn uuid_like(s: &str) -> bool {
    s.len() == 36 && s.chars().filter(|c| *c == '-').count() == 4
}

/// Copilot CLI is killed while its bash permission waits in the inbox: the approval expires
/// by the runtime with no option, the call is closed as not run, a late approve is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_copilot_killed_under_a_pending_permission_expires_it_and_the_call_did_not_run() {
    let copilot = copilot_binary();
    let cp = ControlPlane::start("alice-copilot").await;
    let phone = cp.phone().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("work").join("killed");
    let command = format!("touch {}", file.display());
    let model = FakeModel::start_with(
        vec![Turn {
            prompt: "waymark turn killed".into(),
            command: command.clone(),
            answer: "This answer never comes.".into(),
        }],
        Shape::BASH,
    )
    .await;
    let home = Home::new(&dir, &model);
    let env = format!("COPILOT_HOME={}", dir.path().join(".copilot").display());
    real_acp::killed_under_a_pending_approval(
        &cp,
        &phone,
        home.args(&copilot, "waymark turn killed: make the file"),
        || support::kill_processes_with_env(&env),
        &file,
        TURN,
        |d, session| check_offer(d, session, &command),
    )
    .await;
    support::kill_processes_with_env(&env);
}
