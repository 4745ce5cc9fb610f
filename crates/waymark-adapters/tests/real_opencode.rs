//! The generic ACP adapter against the REAL OpenCode (`opencode-ai@1.18.33` from npm, installed
//! by `scripts/setup-debian` under `$WAYMARK_RUNTIMES_DIR/opencode`, default
//! `~/.cache/waymark-runtimes/opencode`): `opencode acp`, started by the adapter as
//! `waymark adapters acp --runtime opencode --agent-cmd …` starts it, with a private home and
//! config pointed only at a fake OpenAI-compatible model (`support::fake_model`, shape
//! [`Shape::BASH`]), a real control plane in-process, and a phone answering with signed
//! commands. In each turn the model asks OpenCode's `bash` tool to `touch` a file in the
//! session's directory; OpenCode (`permission.bash = "ask"`) asks its client; the request must
//! reach the inbox as a pending approval with OpenCode's options. Approve runs the command (the
//! file appears, the effect is confirmed with OpenCode's receipt, the model's answer is
//! mirrored); deny does not (the effect fails with OpenCode's reason).
//!
//! The test fails — never skips — when the runtime is not installed. Each turn is one adapter
//! run (one ACP session, one task); the agent it starts is killed when the adapter ends or,
//! should the test fail, when the adapter is dropped.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use support::fake_model::{self, FakeModel, Shape, Turn};
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
const OPENCODE_VERSION: &str = "1.18.33";
const RUNTIME: &str = "opencode";
/// How long one turn may take end to end (start-up ~5 s, model calls, approval, the command).
const TURN: Duration = Duration::from_secs(150);

fn opencode_binary() -> PathBuf {
    installed_binary(
        "opencode",
        &format!("opencode-ai@{OPENCODE_VERSION}"),
        "node_modules/opencode-linux-x64/bin/opencode",
    )
}

/// A private OpenCode: its own home, XDG directories and config (what each setting is for:
/// docs/adapters/opencode.md), and a workspace.
struct Home<'a> {
    dir: &'a tempfile::TempDir,
}

impl<'a> Home<'a> {
    fn new(dir: &'a tempfile::TempDir, model: &FakeModel) -> Home<'a> {
        std::fs::create_dir_all(dir.path().join("work")).unwrap();
        let config = serde_json::json!({
            "$schema": "https://opencode.ai/config.json",
            "model": format!("fake/{}", fake_model::MODEL),
            "small_model": format!("fake/{}", fake_model::MODEL),
            "autoupdate": false,
            "share": "disabled",
            "provider": {
                "fake": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "Waymark fake model",
                    "options": {"baseURL": model.base_url, "apiKey": "dummy"},
                    "models": {fake_model::MODEL: {"name": "fake model"}},
                },
            },
            "permission": {"bash": "ask"},
        });
        std::fs::write(
            dir.path().join("opencode.json"),
            serde_json::to_string_pretty(&config).unwrap(),
        )
        .unwrap();
        Home { dir }
    }

    fn work(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    /// `--agent-cmd`: `env -i` gives OpenCode only the private homes and switches (no key or
    /// token of the machine's environment leaks in) and execs it (no shell stays between).
    fn agent_cmd(&self, opencode: &Path) -> String {
        let h = self.dir.path();
        let var = |name: &str, sub: &str| format!("{name}={}", quoted(&h.join(sub)));
        [
            "exec env -i PATH=/usr/local/bin:/usr/bin:/bin".to_owned(),
            var("HOME", ""),
            var("XDG_CONFIG_HOME", "config"),
            var("XDG_DATA_HOME", "data"),
            var("XDG_CACHE_HOME", "cache"),
            var("XDG_STATE_HOME", "state"),
            var("OPENCODE_CONFIG", "opencode.json"),
            "OPENCODE_DISABLE_AUTOUPDATE=1".into(),
            "OPENCODE_DISABLE_MODELS_FETCH=1".into(),
            "OPENCODE_DISABLE_LSP_DOWNLOAD=1".into(),
            "OPENCODE_DISABLE_SHARE=1".into(),
            "OPENCODE_DISABLE_DEFAULT_PLUGINS=1".into(),
            "OPENCODE_DISABLE_CLAUDE_CODE=1".into(),
            quoted(opencode),
            "acp".into(),
        ]
        .join(" ")
    }

    fn args(&self, opencode: &Path, prompt: &str) -> AcpArgs {
        AcpArgs {
            agent_cmd: self.agent_cmd(opencode),
            cwd: Some(self.work()),
            prompt: prompt.into(),
            runtime: RUNTIME.into(),
            title: None,
            worker: "alice-opencode".into(),
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
    // OpenCode 1.18: once / always / reject, with ACP kinds.
    assert_eq!(
        options,
        [
            ("approve", "Allow once"),
            ("approve_always", "Always allow"),
            ("deny", "Reject"),
        ]
    );
    // OpenCode titles the call with the command itself.
    assert_eq!(d.question, format!("opencode: {command}"));
    let params = &d.intent.as_ref().unwrap();
    assert_eq!(params["sessionId"], session, "{params}");
    assert_eq!(
        params["toolCall"]["rawInput"]["command"], command,
        "{params}"
    );
    assert_eq!(params["toolCall"]["kind"], "execute", "{params}");
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
async fn real_opencode_bash_permission_reaches_the_inbox_and_approve_runs_it_and_deny_does_not() {
    let started = Instant::now();
    let opencode = opencode_binary();
    let cp = ControlPlane::start("alice-opencode").await;
    let phone: Phone = cp.phone().await;
    // The files are made in the session's own directory (a temp dir): a path outside it would
    // first raise OpenCode's separate `external_directory` permission (docs/adapters/opencode.md).
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
                answer: "This answer never comes: OpenCode ends the turn on a rejection.".into(),
            },
        ],
        Shape::BASH,
    )
    .await;
    let home = Home::new(&dir, &model);
    let mut seen = Vec::new();
    // What the ACP adapter does not yet do for OpenCode, checked last so that everything
    // else is proven first (docs/adapters/opencode.md, "What the adapter still lacks").
    let mut lacking: Vec<String> = Vec::new();

    // ---- turn one: approved -------------------------------------------------------------
    let prompt = "waymark turn one: make the file";
    let adapter = Adapter::start(&cp, home.args(&opencode, prompt));
    let (task, session) = new_task(&cp, RUNTIME, &mut seen, TURN).await;
    assert!(
        session.starts_with("ses_"),
        "OpenCode's session id: {session}"
    );
    let d = pending_approval(&cp, &task, TURN).await;
    eprintln!("approval one in the inbox at {:?}", started.elapsed());
    check_offer(&d, &session, &cmd("approved"));
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
    assert_eq!(receipt["rawOutput"]["metadata"]["exit"], 0, "{receipt}");
    assert_eq!(
        messages(&t),
        [
            ("user".to_owned(), prompt.to_owned()),
            ("assistant".to_owned(), "Created the file.".to_owned()),
        ]
    );
    assert_eq!(t.attempts.len(), 1);
    assert_eq!(t.attempts[0].outcome, Some(FinishOutcome::Completed));
    // The model was really asked, with OpenCode's `bash` tool offered, and saw the result.
    let asked_with_bash = model.requests().iter().any(|r| {
        r["tools"]
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t["function"]["name"] == "bash"))
    });
    assert!(asked_with_bash, "OpenCode offered its bash tool");
    eprintln!("turn one done at {:?}", started.elapsed());
    if t.task.usage.tokens == 0 {
        lacking.push(
            "turn one's token usage, which OpenCode reported in its answer to `session/prompt` \
             (`usage: {inputTokens, outputTokens, totalTokens}`), is recorded on the task"
                .into(),
        );
    }

    // ---- turn two: denied ---------------------------------------------------------------
    let prompt = "waymark turn two: make the other file";
    let asked_before = model.requests().len();
    let adapter = Adapter::start(&cp, home.args(&opencode, prompt));
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
    let reason = effect.receipt.as_ref().unwrap()["error"].to_string();
    // Closed as not run by the denial (the first end recorded stands; OpenCode's own report,
    // "rejected permission", comes after it).
    assert!(
        reason.contains("not run") && reason.contains("deny"),
        "the denied call's effect says it was not run and why: {reason}"
    );
    // OpenCode 1.18 ends the turn on a rejection without asking the model again.
    assert_eq!(t.attempts[0].outcome, Some(FinishOutcome::Completed));
    assert!(
        !t.messages.iter().any(|m| m.text.contains("never comes")),
        "{:?}",
        messages(&t)
    );
    let after_denial = model.requests()[asked_before..]
        .iter()
        .filter(|r| r["tools"].as_array().is_some_and(|t| !t.is_empty()))
        .count();
    assert_eq!(
        after_denial, 1,
        "one model call in turn two: the one that asked for bash"
    );
    eprintln!("turn two done at {:?}", started.elapsed());

    assert!(
        lacking.is_empty(),
        "OpenCode runs through the ACP adapter, but the adapter does not yet:\n- {}",
        lacking.join("\n- ")
    );
}

/// OpenCode is killed while its bash permission waits in the inbox: the approval expires by
/// the runtime with no option, the call is closed as not run, a late approve is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_opencode_killed_under_a_pending_permission_expires_it_and_the_call_did_not_run() {
    let opencode = opencode_binary();
    let cp = ControlPlane::start("alice-opencode").await;
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
    let env = format!(
        "OPENCODE_CONFIG={}",
        dir.path().join("opencode.json").display()
    );
    real_acp::killed_under_a_pending_approval(
        &cp,
        &phone,
        home.args(&opencode, "waymark turn killed: make the file"),
        || support::kill_processes_with_env(&env),
        &file,
        TURN,
        |d, session| check_offer(d, session, &command),
    )
    .await;
    support::kill_processes_with_env(&env);
}
