//! The ACP adapter against the REAL Gemini CLI (`@google/gemini-cli@0.61.0` from npm, installed
//! by `scripts/setup-debian` under `$WAYMARK_RUNTIMES_DIR/gemini`, default
//! `~/.cache/waymark-runtimes/gemini`) run as `gemini --acp`, a fake Gemini API
//! (`support::fake_model`, reached through `GOOGLE_GEMINI_BASE_URL` with gateway auth), a real
//! control plane in-process, and a phone answering with signed commands.
//!
//! Two sessions each ask `run_shell_command` to `touch` a file: the permission request must
//! reach the inbox with Gemini CLI's own options; approving runs the command (the file
//! appears, the effect is confirmed and names its approval), rejecting does not — and, though
//! Gemini CLI says nothing more of a rejected call, its effect is closed as not run. The
//! turn's usage is recorded.
//!
//! The frames are written to `$WAYMARK_RECORD_DIR` when it is set (how `fixtures/acp/real/`
//! was recorded). The test fails — never skips — when the runtime is not installed; every
//! process it started is killed when it ends, passing or not.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;
use support::fake_model::{FakeModel, Turn};
use support::{ControlPlane, Phone, within};
use tokio_util::sync::CancellationToken;
use waymark_adapters::acp::{self, AcpArgs, AcpError};
use waymark_proto::{Decision, DecisionStatus, EffectStatus, Operation, TaskDetail};

/// The version `scripts/setup-debian` installs and this test was written against.
const GEMINI_VERSION: &str = "0.61.0";
/// The model named on the command line: with a model given, Gemini CLI skips its router's
/// side question ("auto" asks a classifier model first).
const MODEL: &str = "gemini-2.5-flash";
/// How long one turn may take end to end.
const TURN: Duration = Duration::from_secs(120);

/// `node_modules/.bin/gemini` of the install, or a failure that says how to install it.
fn gemini_bin() -> PathBuf {
    let base = std::env::var_os("WAYMARK_RUNTIMES_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/waymark-runtimes"))
        })
        .expect("neither WAYMARK_RUNTIMES_DIR nor HOME is set: cannot find the real Gemini CLI");
    let dir = base.join("gemini");
    let bin = dir.join("node_modules/.bin/gemini");
    let stamp = std::fs::read_to_string(dir.join("installed")).unwrap_or_default();
    assert!(
        bin.exists() && stamp.contains(&format!("@google/gemini-cli@{GEMINI_VERSION}")),
        "the real Gemini CLI {GEMINI_VERSION} is not installed in `{}` (installed: `{}`) — \
         run `scripts/setup-debian`, which installs it there \
         (set WAYMARK_RUNTIMES_DIR to use another place)",
        dir.display(),
        stamp.trim(),
    );
    bin
}

/// A private Gemini CLI: its own HOME (settings with telemetry, usage statistics and updates
/// off), pointed at the fake model only. Dropping it kills every process still running with
/// this HOME.
struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new() -> Home {
        let dir = tempfile::tempdir().unwrap();
        let home = Home { dir };
        for d in [".gemini", "work", "tmp", "frames"] {
            std::fs::create_dir_all(home.path(d)).unwrap();
        }
        let settings = json!({
            "privacy": {"usageStatisticsEnabled": false},
            "telemetry": {"enabled": false},
            "general": {"disableAutoUpdate": true, "disableUpdateNag": true},
        });
        std::fs::write(
            home.path(".gemini/settings.json"),
            serde_json::to_vec_pretty(&settings).unwrap(),
        )
        .unwrap();
        home
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `gemini --acp` under this home, its frames copied to `frames/<name>.{in,out}.jsonl`.
    fn agent_cmd(&self, bin: &Path, model: &FakeModel, name: &str) -> String {
        let q = |p: PathBuf| format!("'{}'", p.display());
        let base = model.base_url.trim_end_matches("/v1");
        format!(
            "tee {in_} | env HOME={home} TMPDIR={tmp} GOOGLE_GEMINI_BASE_URL={base} GEMINI_API_KEY=dummy \
             NO_COLOR=1 {bin} --acp -m {MODEL} 2>>{err} | tee {out}",
            in_ = q(self.path(&format!("frames/{name}.in.jsonl"))),
            out = q(self.path(&format!("frames/{name}.out.jsonl"))),
            err = q(self.path(&format!("frames/{name}.stderr"))),
            home = q(self.dir.path().to_owned()),
            tmp = q(self.path("tmp")),
            bin = q(bin.to_owned()),
        )
    }

    fn stderr(&self, name: &str) -> String {
        let text = std::fs::read_to_string(self.path(&format!("frames/{name}.stderr")))
            .unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Copies the frames to `$WAYMARK_RECORD_DIR` when set.
    fn record(&self, name: &str) {
        let Some(dir) = std::env::var_os("WAYMARK_RECORD_DIR") else {
            return;
        };
        let dir = PathBuf::from(dir);
        std::fs::create_dir_all(&dir).unwrap();
        for side in ["in", "out"] {
            let from = self.path(&format!("frames/{name}.{side}.jsonl"));
            let _ = std::fs::copy(&from, dir.join(format!("gemini-{name}.{side}.jsonl")));
        }
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        let needle = format!("HOME={}", self.dir.path().display());
        support::kill_processes_with_env(&needle);
    }
}

fn dump(d: &TaskDetail) -> String {
    format!(
        "messages: {:#?}\neffects: {:#?}\ndecisions: {:#?}",
        d.messages
            .iter()
            .map(|m| format!("{}: {}", m.role, m.text))
            .collect::<Vec<_>>(),
        d.effects
            .iter()
            .map(|e| (&e.idempotency_key, e.status, &e.intent, &e.receipt))
            .collect::<Vec<_>>(),
        d.decisions
            .iter()
            .map(|d| (&d.id, d.status, &d.outcome))
            .collect::<Vec<_>>(),
    )
}

fn start_turn(
    cp: &ControlPlane,
    home: &Home,
    bin: &Path,
    model: &FakeModel,
    name: &str,
    prompt: &str,
) -> tokio::task::JoinHandle<Result<(), AcpError>> {
    let args = AcpArgs {
        agent_cmd: home.agent_cmd(bin, model, name),
        cwd: Some(home.path("work")),
        prompt: prompt.into(),
        runtime: "gemini".into(),
        title: None,
        worker: "waymark-acp".into(),
        approval_expires_in: None,
        bind: Default::default(),
    };
    tokio::spawn(acp::run(args, cp.client.clone(), CancellationToken::new()))
}

/// The task of the newest Gemini session and its pending approval.
async fn new_approval(
    cp: &ControlPlane,
    known: &[String],
    context: impl Fn() -> String,
) -> (String, Decision) {
    within(
        TURN,
        "a Gemini CLI approval in the inbox",
        context,
        || async {
            let (_, snap) = cp.admin_get("/v1/snapshot").await;
            let tasks: Vec<String> = snap["tasks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.get("task").unwrap_or(t))
                .filter(|t| t["runtime"] == "gemini")
                .map(|t| t["id"].as_str().unwrap().to_owned())
                .filter(|id| !known.contains(id))
                .collect();
            for task in tasks {
                if let Some(d) = cp
                    .detail(&task)
                    .await
                    .decisions
                    .into_iter()
                    .find(|d| d.status == DecisionStatus::Pending)
                {
                    return Some((task, d));
                }
            }
            None
        },
    )
    .await
}

async fn answer(phone: &Phone, cp: &ControlPlane, task: &str, d: &Decision, op: Operation) {
    let revision = cp.detail(task).await.task.plan_revision;
    let args = json!({"decision_id": d.id, "intent_digest": d.intent_digest});
    phone.command(task, revision, op, args).await;
}

async fn ended(h: tokio::task::JoinHandle<Result<(), AcpError>>, home: &Home, name: &str) {
    match tokio::time::timeout(TURN, h).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => panic!("the adapter failed: {e}\n{}", home.stderr(name)),
        Ok(Err(e)) => panic!("the adapter panicked: {e}"),
        Err(_) => panic!(
            "the turn did not end within {TURN:?}\n{}",
            home.stderr(name)
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_gemini_cli_approvals_reach_the_inbox_and_a_rejected_call_is_closed_as_not_run() {
    let started = Instant::now();
    let bin = gemini_bin();
    let cp = ControlPlane::start("alice-gemini").await;
    let phone = cp.phone().await;
    let scratch = tempfile::tempdir().unwrap();
    let approved_file = scratch.path().join("approved");
    let denied_file = scratch.path().join("denied");
    let model = FakeModel::start(vec![
        Turn {
            prompt: "waymark turn one".into(),
            command: format!("touch {}", approved_file.display()),
            answer: "Created the file.".into(),
        },
        Turn {
            prompt: "waymark turn two".into(),
            command: format!("touch {}", denied_file.display()),
            answer: "The command was not run.".into(),
        },
    ])
    .await;
    let home = Home::new();

    // ---- turn one: approved ----
    let one = start_turn(
        &cp,
        &home,
        &bin,
        &model,
        "one",
        "waymark turn one: make the file",
    );
    let (task_one, d) = new_approval(&cp, &[], || home.stderr("one")).await;
    let inbox_at = started.elapsed();
    let ids: Vec<&str> = d.options.iter().map(|o| o.id.as_str()).collect();
    assert!(
        ids.contains(&"approve") && ids.contains(&"deny"),
        "Gemini CLI's options map to ours: {ids:?}"
    );
    let approved_at = Instant::now();
    answer(&phone, &cp, &task_one, &d, Operation::Approve).await;
    ended(one, &home, "one").await;
    let turn_one = approved_at.elapsed();
    home.record("one");
    assert!(approved_file.exists(), "the approved command ran");
    let detail = cp.detail(&task_one).await;
    let effect = detail
        .effects
        .iter()
        .find(|e| e.intent["approval"] == d.id.as_str())
        .unwrap_or_else(|| panic!("the tool call names its approval\n{}", dump(&detail)));
    assert_eq!(effect.status, EffectStatus::Confirmed, "{}", dump(&detail));
    assert!(effect.receipt.is_some());
    assert!(
        detail.task.usage.tokens > 0,
        "the turn's usage is recorded: {:?}",
        detail.task.usage
    );
    assert!(
        detail
            .messages
            .iter()
            .any(|m| m.role == "assistant" && m.text.contains("Created the file.")),
        "{}",
        dump(&detail)
    );

    // ---- turn two: rejected ----
    let two = start_turn(
        &cp,
        &home,
        &bin,
        &model,
        "two",
        "waymark turn two: make the other file",
    );
    let (task_two, d2) =
        new_approval(&cp, std::slice::from_ref(&task_one), || home.stderr("two")).await;
    answer(&phone, &cp, &task_two, &d2, Operation::Deny).await;
    ended(two, &home, "two").await;
    home.record("two");
    assert!(!denied_file.exists(), "the rejected command did not run");
    let detail = cp.detail(&task_two).await;
    let effect = detail
        .effects
        .iter()
        .find(|e| e.intent["approval"] == d2.id.as_str())
        .unwrap_or_else(|| panic!("the rejected call leaves an effect\n{}", dump(&detail)));
    assert_eq!(
        effect.status,
        EffectStatus::Failed,
        "closed as not run\n{}",
        dump(&detail)
    );
    assert!(
        effect.receipt.as_ref().unwrap()["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("not run")),
        "{:?}",
        effect.receipt
    );
    eprintln!(
        "approval in the inbox at {inbox_at:?}; approved turn ended {turn_one:?} after the answer; all done in {:?}",
        started.elapsed()
    );
}

/// Gemini CLI is killed while its shell permission waits in the inbox: the approval expires
/// by the runtime with no option, the call is closed as not run, a late approve is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_gemini_cli_killed_under_a_pending_permission_expires_it_and_the_call_did_not_run() {
    let bin = gemini_bin();
    let cp = ControlPlane::start("alice-gemini").await;
    let phone = cp.phone().await;
    let scratch = tempfile::tempdir().unwrap();
    let file = scratch.path().join("killed");
    let model = FakeModel::start(vec![Turn {
        prompt: "waymark turn killed".into(),
        command: format!("touch {}", file.display()),
        answer: "This answer never comes.".into(),
    }])
    .await;
    let home = Home::new();
    let args = AcpArgs {
        agent_cmd: home.agent_cmd(&bin, &model, "killed"),
        cwd: Some(home.path("work")),
        prompt: "waymark turn killed: make the file".into(),
        runtime: "gemini".into(),
        title: None,
        worker: "waymark-acp".into(),
        approval_expires_in: None,
        bind: Default::default(),
    };
    let env = format!("HOME={}", home.dir.path().display());
    let kill = || {
        support::kill_processes_with_env(&env);
        // The recording `tee`s and their shell, which hold the adapter's pipe.
        support::kill_processes_naming(&home.dir.path().display().to_string());
    };
    support::real_acp::killed_under_a_pending_approval(
        &cp,
        &phone,
        args,
        kill,
        &file,
        TURN,
        |d, _| {
            let ids: Vec<&str> = d.options.iter().map(|o| o.id.as_str()).collect();
            assert!(ids.contains(&"approve") && ids.contains(&"deny"), "{ids:?}");
        },
    )
    .await;
}
