//! The Codex adapter against the REAL Codex (`@openai/codex@0.169.0` from npm, installed by
//! `scripts/setup-debian` under `$WAYMARK_RUNTIMES_DIR/codex`, default
//! `~/.cache/waymark-runtimes/codex`): its `codex app-server`, started and driven by the
//! adapter, with a private `CODEX_HOME` pointed only at a fake Responses API
//! (`support::fake_responses`), a real control plane in-process, and a phone answering with
//! signed commands. In each turn the model asks `exec_command` to `touch` a file outside the
//! sandbox, which makes Codex ask for approval; the approval must reach the inbox offering both
//! denials. Approve runs the command (the file appears; the effect is confirmed with a
//! receipt). "Deny, let the turn go on" does not run it and Codex finishes the turn with its
//! answer. "Deny and stop the turn" interrupts the turn. Pause interrupts the turn and holds
//! (the approval expires); resume continues the thread with a new turn. Further tests kill the
//! app-server under a pending approval, and have Codex change a file (approve writes it, deny
//! does not).
//!
//! The test fails — never skips — when the runtime is not installed. Each turn is one
//! `waymark adapters codex --prompt …` run (one thread, one task); the app-server it starts is
//! killed when the adapter ends or, should the test fail, when the adapter task is dropped.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;
use support::fake_model::{self, Turn};
use support::fake_responses::{self, FakeResponses, text_of};
use support::real_acp::within;
use support::{ControlPlane, Phone};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use waymark_adapters::codex::{self, CodexArgs, CodexError, RESUME_PROMPT};
use waymark_proto::{
    Decision, DecisionKind, DecisionStatus, DeliveryState, Effect, EffectStatus, Operation,
    TaskDetail, TaskState,
};

/// The version `scripts/setup-debian` installs and this test was written against.
const CODEX_VERSION: &str = "0.169.0";
/// How long one turn may take end to end (model calls, approval, the command).
const TURN: Duration = Duration::from_secs(60);

// ---- the installed runtime -------------------------------------------------------------------

/// The native `codex` binary of the installed `@openai/codex-linux-x64` (run directly, not
/// through npm's Node launcher, so that killing the adapter's child kills Codex), or a failure
/// that says how to install it.
fn codex_binary() -> PathBuf {
    let base = std::env::var_os("WAYMARK_RUNTIMES_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/waymark-runtimes"))
        })
        .expect("neither WAYMARK_RUNTIMES_DIR nor HOME is set: cannot find the real Codex");
    let dir = base.join("codex");
    let stamp = std::fs::read_to_string(dir.join("installed")).unwrap_or_default();
    let vendor = dir.join("node_modules/@openai/codex-linux-x64/vendor");
    let binary = std::fs::read_dir(&vendor)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin/codex"))
        .find(|p| p.exists());
    match binary {
        Some(b) if stamp.trim() == format!("@openai/codex@{CODEX_VERSION}") => b,
        _ => panic!(
            "the real Codex {CODEX_VERSION} is not installed in `{}` (installed: `{}`; native binary under `{}`: {}) — \
             run `scripts/setup-debian`, which installs it there (set WAYMARK_RUNTIMES_DIR to use another place)",
            dir.display(),
            stamp.trim(),
            vendor.display(),
            if vendor.exists() {
                "none"
            } else {
                "the directory is missing"
            },
        ),
    }
}

/// A private Codex: its own `CODEX_HOME` (and `HOME`), pointed at the fake model only, and a
/// workspace.
struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new(model: &FakeResponses) -> Home {
        let dir = tempfile::tempdir().unwrap();
        for d in ["codex-home", "work"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        // What each setting is for: docs/adapters/codex.md.
        let config = format!(
            r#"model = "{model}"
model_provider = "fake"
approval_policy = "on-request"
sandbox_mode = "workspace-write"

[model_providers.fake]
name = "fake"
base_url = "{url}"
wire_api = "responses"
env_key = "WAYMARK_FAKE_MODEL_KEY"
request_max_retries = 0
stream_max_retries = 0
"#,
            model = fake_model::MODEL,
            url = model.base_url,
        );
        std::fs::write(dir.path().join("codex-home/config.toml"), config).unwrap();
        Home { dir }
    }

    fn work(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    /// `--app-server-cmd`: `env` sets the private homes and execs Codex (no shell stays between).
    /// With `WAYMARK_RECORD_FIXTURES=DIR`, `waymark-record-stdio` runs in front of it and writes
    /// every line of the run to `DIR/codex-<name>.jsonl` (`waymark-fake-codex --convert` makes a
    /// fast test's scenario of it).
    fn app_server_cmd(&self, codex: &Path, name: &str) -> String {
        let home = self.dir.path().join("codex-home");
        let cmd = format!(
            "env CODEX_HOME='{h}' HOME='{h}' WAYMARK_FAKE_MODEL_KEY=dummy '{c}' app-server",
            h = home.display(),
            c = codex.display()
        );
        match std::env::var_os("WAYMARK_RECORD_FIXTURES").filter(|d| !d.is_empty()) {
            Some(dir) => {
                std::fs::create_dir_all(&dir).unwrap();
                let out = PathBuf::from(dir).join(format!("codex-{name}.jsonl"));
                let _ = std::fs::remove_file(&out);
                format!(
                    "'{}' --out '{}' -- {cmd}",
                    env!("CARGO_BIN_EXE_waymark-record-stdio"),
                    out.display()
                )
            }
            None => cmd,
        }
    }
}

/// One adapter run with `--prompt`; aborted (so its app-server is killed) when dropped.
struct Adapter {
    handle: Option<JoinHandle<Result<(), CodexError>>>,
    shutdown: CancellationToken,
}

impl Adapter {
    fn start(cp: &ControlPlane, home: &Home, codex: &Path, prompt: &str) -> Adapter {
        Self::start_with(cp, home, codex, prompt, false)
    }

    /// With `plan`: the prompt's turn runs in Codex's Plan mode (`--plan`).
    fn start_with(
        cp: &ControlPlane,
        home: &Home,
        codex: &Path,
        prompt: &str,
        plan: bool,
    ) -> Adapter {
        let shutdown = CancellationToken::new();
        // The run's name: its prompt up to the colon ("waymark turn one: …" → "turn-one").
        let name = prompt
            .split(':')
            .next()
            .unwrap_or(prompt)
            .trim_start_matches("waymark ")
            .replace(' ', "-");
        let args = CodexArgs {
            app_server_cmd: home.app_server_cmd(codex, &name),
            cwd: Some(home.work()),
            prompt: Some(prompt.into()),
            plan,
            ..CodexArgs::new()
        };
        let handle = tokio::spawn(codex::run(args, cp.client.clone(), shutdown.clone()));
        Adapter {
            handle: Some(handle),
            shutdown,
        }
    }

    fn running(&self) -> bool {
        self.handle.as_ref().is_some_and(|h| !h.is_finished())
    }

    /// Waits for the adapter to end by itself (its turn ended).
    async fn ended(mut self) {
        let handle = self.handle.take().unwrap();
        let res = tokio::time::timeout(TURN, handle)
            .await
            .expect("the adapter ends when its turn ends")
            .unwrap();
        assert!(res.is_ok(), "{res:?}");
    }
}

impl Drop for Adapter {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(h) = self.handle.take() {
            h.abort();
        }
    }
}

// ---- waiting on the control plane -------------------------------------------------------------

/// The Codex task not among `seen` (each run starts a new thread, so a new task).
async fn new_task(cp: &ControlPlane, seen: &mut Vec<String>) -> String {
    let task = within(TURN, "a new Codex task", || async {
        let (status, snap) = cp.admin_get("/v1/snapshot").await;
        assert_eq!(status, 200, "{snap}");
        snap["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.get("task").unwrap_or(t))
            .filter(|t| t["runtime"] == "codex")
            .filter_map(|t| t["id"].as_str())
            .find(|id| !seen.iter().any(|s| s == id))
            .map(str::to_owned)
    })
    .await;
    seen.push(task.clone());
    task
}

async fn detail(cp: &ControlPlane, task: &str) -> TaskDetail {
    cp.detail(task).await
}

async fn pending_approval(cp: &ControlPlane, task: &str) -> Decision {
    within(TURN, "a pending approval in the inbox", || async {
        detail(cp, task)
            .await
            .decisions
            .into_iter()
            .find(|d| d.status == DecisionStatus::Pending)
    })
    .await
}

async fn answer(
    phone: &Phone,
    cp: &ControlPlane,
    task: &str,
    d: &Decision,
    op: Operation,
    option: &str,
) {
    let revision = detail(cp, task).await.task.plan_revision;
    let args = json!({"decision_id": d.id, "intent_digest": d.intent_digest, "option": option});
    phone.command(task, revision, op, args).await;
}

async fn steer(phone: &Phone, cp: &ControlPlane, task: &str, op: Operation) {
    let revision = detail(cp, task).await.task.plan_revision;
    phone.command(task, revision, op, json!({})).await;
}

/// The command item's effect, once settled.
async fn settled_effect(cp: &ControlPlane, task: &str) -> Effect {
    within(TURN, "the command's effect settled", || async {
        detail(cp, task)
            .await
            .effects
            .into_iter()
            .find(|e| e.kind == "codex.commandExecution" && e.status.is_terminal())
    })
    .await
}

/// What every approval of these turns looks like in the inbox.
fn check_offer(d: &Decision, command: &str) {
    assert_eq!(d.kind, DecisionKind::Approval);
    assert_eq!(
        d.durability,
        Some(waymark_proto::ApprovalDurability::ConnectionBound)
    );
    let params = &d.intent.as_ref().unwrap()["params"];
    // Codex 0.169: strings and an object mixed, no `decline` listed.
    let listed = &params["availableDecisions"];
    assert_eq!(listed[0], "accept", "{listed}");
    assert!(
        listed[1]["acceptWithExecpolicyAmendment"].is_object(),
        "{listed}"
    );
    assert_eq!(listed[2], "cancel", "{listed}");
    assert!(!listed.to_string().contains("\"decline\""), "{listed}");
    let options: Vec<(&str, &str)> = d
        .options
        .iter()
        .map(|o| (o.id.as_str(), o.label.as_str()))
        .collect();
    let rule = format!(
        "Approve and always allow `touch {}`",
        command.trim_start_matches("touch ")
    );
    assert_eq!(
        options,
        [
            ("approve", "Approve"),
            ("approve_rule", rule.as_str()),
            ("deny", "Deny, let the turn go on"),
            ("deny_cancel", "Deny and stop the turn"),
        ]
    );
    assert!(d.question.contains(command), "{}", d.question);
    assert!(
        d.question.contains("waymark test:"),
        "the justification is shown: {}",
        d.question
    );
}

fn last_assistant(d: &TaskDetail) -> Option<String> {
    d.messages
        .iter()
        .rev()
        .find(|m| m.role == "assistant")
        .map(|m| m.text.clone())
}

// ---- the test ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_codex_command_approvals_reach_the_inbox_and_each_answer_does_what_it_says() {
    let started = Instant::now();
    let codex = codex_binary();
    let cp = ControlPlane::start("alice-codex").await;
    let phone = cp.phone().await;
    let scratch = tempfile::tempdir().unwrap();
    let file = |name: &str| scratch.path().join(name);
    let cmd = |name: &str| format!("touch {}", file(name).display());
    let model = FakeResponses::start(vec![
        Turn {
            prompt: "waymark turn one".into(),
            command: cmd("approved"),
            answer: "Created the file.".into(),
        },
        Turn {
            prompt: "waymark turn two".into(),
            command: cmd("declined"),
            answer: "The command was not run; going on without it.".into(),
        },
        Turn {
            prompt: "waymark turn three".into(),
            command: cmd("cancelled"),
            answer: "This answer never comes.".into(),
        },
        Turn {
            prompt: "waymark turn four".into(),
            command: cmd("paused"),
            answer: "Continued after the pause.".into(),
        },
    ])
    .await;
    let home = Home::new(&model);
    let mut seen = Vec::new();

    // ---- turn one: approved -------------------------------------------------------------
    let adapter = Adapter::start(&cp, &home, &codex, "waymark turn one: make the file");
    let task = new_task(&cp, &mut seen).await;
    let d = pending_approval(&cp, &task).await;
    eprintln!("approval one in the inbox at {:?}", started.elapsed());
    check_offer(&d, &cmd("approved"));
    assert!(!file("approved").exists(), "nothing runs before the answer");
    let asked = Instant::now();
    answer(&phone, &cp, &task, &d, Operation::Approve, "approve").await;
    within(TURN, "the approved command to run", || async {
        file("approved").exists().then_some(())
    })
    .await;
    eprintln!("approve → file exists in {:?}", asked.elapsed());
    adapter.ended().await;
    let t = detail(&cp, &task).await;
    let d = t.decisions.iter().find(|x| x.id == d.id).unwrap();
    assert_eq!(waymark_worker::chosen_option(d), Some("approve"));
    let delivery = d.delivery.clone().unwrap();
    assert_eq!(delivery.state, DeliveryState::Acknowledged);
    assert!(delivery.detail.unwrap().contains("serverRequest/resolved"));
    let effect = settled_effect(&cp, &task).await;
    assert_eq!(effect.status, EffectStatus::Confirmed, "{effect:?}");
    let receipt = effect
        .receipt
        .clone()
        .expect("a confirmed effect has a receipt");
    assert_eq!(receipt["exitCode"], 0, "{receipt}");
    assert_eq!(receipt["status"], "completed", "{receipt}");
    assert_eq!(t.task.state, TaskState::Completed, "{:?}", t.task);
    assert_eq!(last_assistant(&t).as_deref(), Some("Created the file."));
    eprintln!("turn one done at {:?}", started.elapsed());

    // ---- turn two: deny, let the turn go on (`decline`) ---------------------------------
    let adapter = Adapter::start(&cp, &home, &codex, "waymark turn two: make the other file");
    let task = new_task(&cp, &mut seen).await;
    let d = pending_approval(&cp, &task).await;
    check_offer(&d, &cmd("declined"));
    answer(&phone, &cp, &task, &d, Operation::Deny, "deny").await;
    adapter.ended().await;
    assert!(
        !file("declined").exists(),
        "the declined command did not run"
    );
    let t = detail(&cp, &task).await;
    let dd = t.decisions.iter().find(|x| x.id == d.id).unwrap();
    assert_eq!(waymark_worker::chosen_option(dd), Some("deny"));
    assert_eq!(
        dd.delivery.as_ref().unwrap().state,
        DeliveryState::Acknowledged
    );
    let effect = settled_effect(&cp, &task).await;
    assert_eq!(effect.status, EffectStatus::Failed, "{effect:?}");
    assert!(
        effect.receipt.as_ref().unwrap()["error"]
            .as_str()
            .unwrap()
            .starts_with("declined")
    );
    // The turn went on: the model was told, and answered.
    assert_eq!(t.task.state, TaskState::Completed, "{:?}", t.task);
    assert_eq!(
        last_assistant(&t).as_deref(),
        Some("The command was not run; going on without it.")
    );
    let told = model.requests().iter().any(|r| {
        r["input"].as_array().is_some_and(|items| {
            items.iter().any(|i| {
                i["type"] == "function_call_output"
                    && i["output"].to_string().contains("rejected by user")
            })
        })
    });
    assert!(told, "the model saw the refusal");
    eprintln!("turn two done at {:?}", started.elapsed());

    // ---- turn three: deny and stop the turn (`cancel`) ----------------------------------
    let adapter = Adapter::start(&cp, &home, &codex, "waymark turn three: make a third file");
    let task = new_task(&cp, &mut seen).await;
    let d = pending_approval(&cp, &task).await;
    check_offer(&d, &cmd("cancelled"));
    answer(&phone, &cp, &task, &d, Operation::Deny, "deny_cancel").await;
    adapter.ended().await;
    assert!(
        !file("cancelled").exists(),
        "the cancelled command did not run"
    );
    let t = detail(&cp, &task).await;
    let dd = t.decisions.iter().find(|x| x.id == d.id).unwrap();
    assert_eq!(waymark_worker::chosen_option(dd), Some("deny_cancel"));
    assert!(
        t.checkpoints.iter().any(|c| c
            .body
            .summary
            .as_deref()
            .is_some_and(|s| s.ends_with("was interrupted"))),
        "the turn ended interrupted: {:?}",
        t.checkpoints
            .iter()
            .map(|c| &c.body.summary)
            .collect::<Vec<_>>()
    );
    assert_ne!(t.task.state, TaskState::Completed, "{:?}", t.task);
    assert!(
        !t.messages
            .iter()
            .any(|m| m.text.contains("This answer never comes.")),
        "the turn stopped before the model answered"
    );
    eprintln!("turn three done at {:?}", started.elapsed());

    // ---- turn four: pause interrupts and holds, resume continues ------------------------
    let adapter = Adapter::start(&cp, &home, &codex, "waymark turn four: make a fourth file");
    let task = new_task(&cp, &mut seen).await;
    let d = pending_approval(&cp, &task).await;
    check_offer(&d, &cmd("paused"));
    let paused_at = Instant::now();
    steer(&phone, &cp, &task, Operation::Pause).await;
    let expired = within(TURN, "the approval expired by the pause", || async {
        detail(&cp, &task)
            .await
            .decisions
            .into_iter()
            .find(|x| x.id == d.id && x.status == DecisionStatus::Expired)
    })
    .await;
    let t = within(TURN, "the interrupted turn's checkpoint", || async {
        let t = detail(&cp, &task).await;
        t.checkpoints
            .iter()
            .any(|c| {
                c.body
                    .summary
                    .as_deref()
                    .is_some_and(|s| s.contains("interrupted by a pause"))
            })
            .then_some(t)
    })
    .await;
    eprintln!("pause → turn interrupted in {:?}", paused_at.elapsed());
    assert!(
        format!("{:?}", expired.outcome).contains("paused in Waymark"),
        "{:?}",
        expired.outcome
    );
    assert!(
        t.messages
            .iter()
            .any(|m| m.role == "system" && m.text.contains("was interrupted"))
    );
    // Held: the adapter keeps the thread; nothing runs and the model is not asked again.
    let asked_before = model.requests().len();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(adapter.running(), "a paused thread is held, not ended");
    assert_eq!(model.requests().len(), asked_before);
    assert!(!file("paused").exists());
    steer(&phone, &cp, &task, Operation::Resume).await;
    adapter.ended().await;
    let continued = model.requests().iter().skip(asked_before).any(|r| {
        r["input"]
            .as_array()
            .and_then(|i| i.last())
            .is_some_and(|m| text_of(m).contains(RESUME_PROMPT))
    });
    assert!(
        continued,
        "resume started a turn in the same thread: {:?}",
        model.requests().len()
    );
    let t = detail(&cp, &task).await;
    assert_eq!(
        last_assistant(&t).as_deref(),
        Some("Continued after the pause.")
    );
    assert_eq!(t.task.state, TaskState::Completed, "{:?}", t.task);
    assert!(!file("paused").exists(), "the paused command never ran");
    // Codex ended the interrupted turn without a word about the command (no item/completed),
    // but its approval was never answered: the effect is closed as not run, not `unknown`.
    let effect = settled_effect(&cp, &task).await;
    assert_eq!(effect.status, EffectStatus::Failed, "{effect:?}");
    let why = effect.receipt.as_ref().unwrap()["error"].to_string();
    assert!(
        why.contains("not run: the turn was interrupted before its approval was answered"),
        "{why}"
    );
    eprintln!("all done at {:?}", started.elapsed());
}

/// The app-server is killed while its command approval waits in the inbox: the approval
/// expires by the runtime with no option, the command (which waited on it) is closed as not
/// run, and a late approve is refused. The adapter restarts the app-server and resumes the
/// thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_codex_killed_under_a_pending_approval_expires_it_and_the_command_did_not_run() {
    let started = Instant::now();
    let codex = codex_binary();
    let cp = ControlPlane::start("alice-codex").await;
    let phone = cp.phone().await;
    let scratch = tempfile::tempdir().unwrap();
    let file = scratch.path().join("killed");
    let command = format!("touch {}", file.display());
    let model = FakeResponses::start(vec![Turn {
        prompt: "waymark turn killed".into(),
        command: command.clone(),
        answer: "This answer never comes.".into(),
    }])
    .await;
    let home = Home::new(&model);
    let adapter = Adapter::start(&cp, &home, &codex, "waymark turn killed: make the file");
    let task = new_task(&cp, &mut Vec::new()).await;
    let d = pending_approval(&cp, &task).await;
    check_offer(&d, &command);
    let codex_home = format!(
        "CODEX_HOME={}",
        home.dir.path().join("codex-home").display()
    );
    let (closed, effect, ()) = support::a_dropped_connection_expires_the_approval(
        &cp,
        &phone,
        &task,
        &d,
        TURN,
        async { support::kill_processes_with_env(&codex_home) },
        |e| e.kind == "codex.commandExecution",
        // Codex runs the command only on an accept, and its app-server is gone.
        support::CallAfterDrop::NotRun,
    )
    .await;
    assert_eq!(
        closed.outcome.unwrap().text.as_deref(),
        Some(codex::CONNECTION_CLOSED)
    );
    assert!(
        effect.receipt.unwrap()["error"]
            .to_string()
            .contains("connection closed before its approval was answered")
    );
    assert!(!file.exists(), "the command never ran");
    // The adapter restarts the app-server and resumes the thread; the same attempt goes on.
    let t = within(TURN, "the thread resumed on a new app-server", || async {
        let t = detail(&cp, &task).await;
        t.messages
            .iter()
            .any(|m| m.text == "the Codex app-server restarted; the thread was resumed")
            .then_some(t)
    })
    .await;
    assert_eq!(t.attempts.len(), 1, "{:?}", t.attempts);
    assert!(adapter.running());
    drop(adapter);
    support::kill_processes_with_env(&codex_home);
    eprintln!("done at {:?}", started.elapsed());
}

/// The `exec_command` that makes Codex apply a patch: `apply_patch` with the patch as a here
/// document, which Codex 0.169 takes over as a file change of its own (it offers no
/// `apply_patch` tool to a model it has no metadata for). The file is outside the workspace,
/// so Codex asks before writing it.
fn add_file_patch(path: &Path, line: &str) -> String {
    format!(
        "apply_patch <<'EOF'\n*** Begin Patch\n*** Add File: {}\n+{line}\n*** End Patch\nEOF\n",
        path.display()
    )
}

/// File changes run for real: the model has Codex add a file outside the workspace; the
/// approval (`item/fileChange/requestApproval`) reaches the inbox naming the path, with the
/// change (its diff) in the intent; approve writes the file, deny does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_codex_file_change_approvals_carry_the_diff_and_approve_writes_the_file_and_deny_does_not()
 {
    let started = Instant::now();
    let codex = codex_binary();
    let cp = ControlPlane::start("alice-codex").await;
    let phone = cp.phone().await;
    let scratch = tempfile::tempdir().unwrap();
    let approved = scratch.path().join("approved.txt");
    let denied = scratch.path().join("denied.txt");
    let model = FakeResponses::start(vec![
        Turn {
            prompt: "waymark patch one".into(),
            command: add_file_patch(&approved, "written after approval"),
            answer: "Added the file.".into(),
        },
        Turn {
            prompt: "waymark patch two".into(),
            command: add_file_patch(&denied, "never written"),
            answer: "The change was refused; going on without it.".into(),
        },
    ])
    .await;
    let home = Home::new(&model);
    let mut seen = Vec::new();
    let check = |d: &Decision, path: &Path, line: &str| {
        assert_eq!(d.kind, DecisionKind::Approval);
        let intent = d.intent.as_ref().unwrap();
        assert_eq!(
            intent["method"], "item/fileChange/requestApproval",
            "{intent}"
        );
        let change = &intent["item"]["changes"][0];
        assert_eq!(change["path"], path.display().to_string(), "{intent}");
        assert_eq!(change["kind"]["type"], "add", "{intent}");
        assert_eq!(
            change["diff"],
            format!("{line}\n"),
            "the diff is shown: {intent}"
        );
        assert!(
            d.question
                .starts_with(&format!("Codex wants to change 1 file: {}", path.display())),
            "{}",
            d.question
        );
        let ids: Vec<&str> = d.options.iter().map(|o| o.id.as_str()).collect();
        assert!(
            ids.contains(&"approve") && ids.contains(&"deny") && ids.contains(&"deny_cancel"),
            "{ids:?}"
        );
        let deny = d.options.iter().find(|o| o.id == "deny").unwrap();
        assert!(
            deny.gives_up.contains("the change does not happen"),
            "{deny:?}"
        );
    };
    let file_effect = |task: String| {
        let cp = &cp;
        async move {
            within(TURN, "the file change's effect settled", || async {
                detail(cp, &task)
                    .await
                    .effects
                    .into_iter()
                    .find(|e| e.kind == "codex.fileChange" && e.status.is_terminal())
            })
            .await
        }
    };

    // ---- approved: the file is written -------------------------------------------------
    let adapter = Adapter::start(&cp, &home, &codex, "waymark patch one: add the file");
    let task = new_task(&cp, &mut seen).await;
    let d = pending_approval(&cp, &task).await;
    eprintln!(
        "file-change approval in the inbox at {:?}",
        started.elapsed()
    );
    check(&d, &approved, "written after approval");
    assert!(!approved.exists(), "nothing is written before the answer");
    let asked = Instant::now();
    answer(&phone, &cp, &task, &d, Operation::Approve, "approve").await;
    within(TURN, "the approved file written", || async {
        approved.exists().then_some(())
    })
    .await;
    eprintln!("approve → file written in {:?}", asked.elapsed());
    adapter.ended().await;
    assert_eq!(
        std::fs::read_to_string(&approved).unwrap(),
        "written after approval\n"
    );
    let effect = file_effect(task.clone()).await;
    assert_eq!(effect.status, EffectStatus::Confirmed, "{effect:?}");
    assert_eq!(
        effect.receipt.as_ref().unwrap()["paths"][0],
        approved.display().to_string()
    );
    let t = detail(&cp, &task).await;
    let dd = t.decisions.iter().find(|x| x.id == d.id).unwrap();
    assert_eq!(
        dd.delivery.as_ref().unwrap().state,
        DeliveryState::Acknowledged
    );
    assert_eq!(last_assistant(&t).as_deref(), Some("Added the file."));

    // ---- denied: nothing is written, the turn goes on ------------------------------------
    let adapter = Adapter::start(&cp, &home, &codex, "waymark patch two: add another file");
    let task = new_task(&cp, &mut seen).await;
    let d = pending_approval(&cp, &task).await;
    check(&d, &denied, "never written");
    answer(&phone, &cp, &task, &d, Operation::Deny, "deny").await;
    adapter.ended().await;
    assert!(!denied.exists(), "the denied change was not written");
    let effect = file_effect(task.clone()).await;
    assert_eq!(effect.status, EffectStatus::Failed, "{effect:?}");
    let t = detail(&cp, &task).await;
    assert_eq!(
        last_assistant(&t).as_deref(),
        Some("The change was refused; going on without it.")
    );
    eprintln!("file changes done at {:?}", started.elapsed());
}

// ---- Plan mode: Codex's question and its plan, answered on the phone -------------------------

/// The newest pending decision not among `seen`.
async fn next_pending(cp: &ControlPlane, task: &str, seen: &[String]) -> Decision {
    within(TURN, "a new pending decision in the inbox", || async {
        detail(cp, task)
            .await
            .decisions
            .into_iter()
            .find(|d| d.status == DecisionStatus::Pending && !seen.contains(&d.id))
    })
    .await
}

/// The first request the model got after `from` whose newest prompt says `text`.
async fn request_saying(model: &FakeResponses, from: usize, text: &str) -> serde_json::Value {
    within(TURN, &format!("the model to be told `{text}`"), || async {
        model
            .requests()
            .into_iter()
            .skip(from)
            .find(|r| fake_responses::last_prompt(r).contains(text))
    })
    .await
}

/// In Plan mode the real Codex offers its `request_user_input` tool: the question reaches the
/// inbox as a form (choices with their descriptions, own words allowed as Codex's "Other"),
/// the answer chosen on the phone is what the model receives as the tool's output, the plan
/// it then proposes reaches the inbox in Codex's words, feedback sent back makes it plan
/// again (still in Plan mode), and approval makes it implement the plan in Default mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_codex_plan_mode_asks_its_question_and_its_plan_on_the_phone() {
    let codex = codex_binary();
    let cp = ControlPlane::start("alice-codex-plan").await;
    let phone = cp.phone().await;
    let model = FakeResponses::start_planner().await;
    let home = Home::new(&model);
    let adapter = Adapter::start_with(
        &cp,
        &home,
        &codex,
        "waymark plan: add a cache to the service",
        true,
    );
    let task = new_task(&cp, &mut Vec::new()).await;

    // The question, as a form.
    let q = next_pending(&cp, &task, &[]).await;
    assert_eq!(q.kind, DecisionKind::Question);
    assert_eq!(
        q.question,
        "Codex asks: Which database should the cache use?"
    );
    let form = q.form.clone().expect("Codex's question is asked as a form");
    let part = &form.questions[0];
    assert_eq!(
        (part.id.as_str(), part.header.as_deref()),
        ("db", Some("Database"))
    );
    let labels: Vec<(&str, Option<&str>)> = part
        .choices
        .iter()
        .map(|c| (c.label.as_str(), c.description.as_deref()))
        .collect();
    assert_eq!(
        labels,
        [
            ("SQLite (Recommended)", Some("a file next to the service")),
            ("PostgreSQL", Some("the server the service already uses")),
        ]
    );
    assert!(
        part.free_text,
        "Codex offers its own \"Other\" (isOther) on every question"
    );
    // A choice that is not offered is refused, and nothing reaches Codex.
    let revision = detail(&cp, &task).await.task.plan_revision;
    let (_, refused) = phone
        .submit(
            &task,
            revision,
            Operation::AnswerQuestion,
            json!({"decision_id": q.id, "intent_digest": q.intent_digest, "answers": {"db": {"chosen": ["MySQL"]}}}),
        )
        .await;
    assert_eq!(refused["status"], "rejected", "{refused}");
    phone
        .command(
            &task,
            revision,
            Operation::AnswerQuestion,
            json!({"decision_id": q.id, "intent_digest": q.intent_digest, "answers": {"db": {"chosen": ["PostgreSQL"]}}}),
        )
        .await;
    let told = within(TURN, "the answer to reach the model", || async {
        model.requests().into_iter().find_map(|r| {
            r["input"]
                .as_array()?
                .iter()
                .find(|i| i["type"] == "function_call_output")
                .map(|i| i["output"].clone())
        })
    })
    .await;
    let told: serde_json::Value = serde_json::from_str(told.as_str().unwrap()).unwrap();
    assert_eq!(
        told,
        json!({"answers": {"db": {"answers": ["PostgreSQL"]}}}),
        "the model receives the choice as Codex's own terminal would send it"
    );

    // The plan, in Codex's words; sent back with feedback.
    let p1 = next_pending(&cp, &task, std::slice::from_ref(&q.id)).await;
    assert_eq!(p1.kind, DecisionKind::Approval);
    let plan = p1.intent.as_ref().unwrap()["plan"].as_str().unwrap();
    assert!(
        plan.starts_with("# Cache plan") && plan.contains("add a cache to the service"),
        "{plan}"
    );
    let options: Vec<&str> = p1.options.iter().map(|o| o.label.as_str()).collect();
    assert_eq!(
        options,
        ["Yes, implement this plan", "No, stay in Plan mode"]
    );
    let before = model.requests().len();
    let revision = detail(&cp, &task).await.task.plan_revision;
    phone
        .command(
            &task,
            revision,
            Operation::Deny,
            json!({"decision_id": p1.id, "intent_digest": p1.intent_digest, "text": "Use Redis instead"}),
        )
        .await;
    let again = request_saying(&model, before, "Use Redis instead").await;
    assert_eq!(
        fake_responses::mode(&again),
        Some("plan"),
        "the feedback is a planning turn: Codex is still in Plan mode"
    );

    // The revised plan, approved: Codex implements it in Default mode.
    let p2 = next_pending(&cp, &task, &[q.id.clone(), p1.id.clone()]).await;
    let plan = p2.intent.as_ref().unwrap()["plan"].as_str().unwrap();
    assert!(plan.contains("Use Redis instead"), "{plan}");
    let before = model.requests().len();
    let revision = detail(&cp, &task).await.task.plan_revision;
    phone
        .command(
            &task,
            revision,
            Operation::Approve,
            json!({"decision_id": p2.id, "intent_digest": p2.intent_digest}),
        )
        .await;
    let implement = request_saying(&model, before, codex::IMPLEMENT).await;
    assert_eq!(
        fake_responses::mode(&implement),
        Some("default"),
        "the approved plan is implemented in Default mode"
    );
    adapter.ended().await;
    let t = detail(&cp, &task).await;
    assert_eq!(t.task.state, TaskState::Completed, "{:?}", t.task);
    assert_eq!(last_assistant(&t).as_deref(), Some("Implemented the plan."));
    for id in [&p1.id, &p2.id] {
        let d = t.decisions.iter().find(|d| &d.id == id).unwrap();
        assert_eq!(
            d.delivery.as_ref().map(|x| x.state),
            Some(DeliveryState::Acknowledged),
            "each plan answer was taken by the turn it started: {d:?}"
        );
    }
}

/// The runtimes' own rules (issue 31 §2): a rules file as a person (or Codex's "always")
/// writes it, read by Waymark's reader, decides each command as the real Codex's
/// `execpolicy check` does — the strictest matching rule, forbidden over prompt over allow,
/// and no decision where no rule matches.
#[test]
fn real_codex_decides_each_command_as_waymark_reads_its_rules() {
    let home = tempfile::tempdir().unwrap();
    let rules = home.path().join(".codex/rules/default.rules");
    std::fs::create_dir_all(rules.parent().unwrap()).unwrap();
    std::fs::write(
        &rules,
        r#"# as Codex 0.169 takes it
prefix_rule(
    pattern = ["npm", "test"],
    decision = "allow",
    justification = "tests are safe",
    match = [["npm", "test"], "npm test --watch"],
    not_match = ["npm install"],
)
prefix_rule(pattern = ["git", ["push", "fetch"]], decision = "prompt")
prefix_rule(pattern = ['rm', "-rf"], decision = "forbidden", justification = "never rm -rf")
prefix_rule(pattern = ["git"])
prefix_rule(pattern = ["cargo", ["build", "test"], "--release"], decision = "prompt")
"#,
    )
    .unwrap();
    let read = waymark_adapters::own_rules::read(&waymark_adapters::own_rules::Places {
        home: home.path().into(),
        allowed: vec![],
        etc: home.path().join("etc"),
    });
    assert_eq!(read.len(), 7, "{read:#?}");
    // Waymark's reading: a rule's glob is its words and a `*`; it covers a command whose words
    // start with those words.
    let ours = |cmd: &str| -> Option<&'static str> {
        let words: Vec<&str> = cmd.split_whitespace().collect();
        read.iter()
            .filter(|r| {
                let pattern = &r.matches.input.as_ref().unwrap().pattern;
                let prefix: Vec<&str> = pattern.trim_end_matches('*').split_whitespace().collect();
                words.starts_with(&prefix)
            })
            .map(|r| match r.effect {
                waymark_proto::OwnEffect::Deny => "forbidden",
                waymark_proto::OwnEffect::Ask => "prompt",
                waymark_proto::OwnEffect::Allow => "allow",
            })
            .max_by_key(|d| ["allow", "prompt", "forbidden"].iter().position(|x| x == d))
    };
    let codex = codex_binary();
    for cmd in [
        "npm test --watch",
        "npm install",
        "git push origin main",
        "git fetch",
        "git status",
        "rm -rf /",
        "rm -r x",
        "cargo test --release",
        "cargo build",
        "ls -la",
    ] {
        let out = std::process::Command::new(&codex)
            .current_dir(home.path())
            .env("CODEX_HOME", home.path().join(".codex"))
            .args(["execpolicy", "check", "--rules"])
            .arg(&rules)
            .args(cmd.split_whitespace())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{cmd}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let said: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let theirs = said["decision"].as_str();
        assert_eq!(ours(cmd), theirs, "`{cmd}`: Codex said {said}");
    }
}
