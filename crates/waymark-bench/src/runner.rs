//! The runner's two figures (issue 30), with the real Claude Code (installed by
//! `scripts/setup-debian`) against the fake Anthropic API of the CLI's tests, so the model's own
//! time is not what is measured:
//!
//! * **revive**: a run killed with `-9` together with its runner; the runner started again →
//!   the resumed runtime's first model request. Baseline: the bare `claude -p --resume` of the
//!   same session → its first model request (what a person typing the resume at the laptop
//!   gets, without Waymark's part: the runner's start, the exit report, recovery, the work item);
//! * **deferred answer**: an approval deferred from a device (Claude Code exits, the call
//!   waits durably), then approved there → the tool running. Baseline: the same approval answered
//!   on a live run, whose hook is held open → the tool running.
//!
//! Needs `waymark` beside this binary (`cargo build --release -p waymark-cli`) and the real
//! Claude Code; says so and measures nothing otherwise.

#[path = "../../waymark-cli/tests/real_claude_code/fake_anthropic.rs"]
#[allow(dead_code)]
mod fake_anthropic;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use fake_anthropic::{FakeAnthropic, Turn};
use serde_json::{Value, json};
use waymark_proto::Operation;
use waymark_store::{DecisionRow, EffectRow};

use crate::{Device, Figure, Server, pair, percentile, server};

/// The version `scripts/setup-debian` installs.
const CLAUDE_CODE_VERSION: &str = "2.1.328";

/// How often a wait looks again (a figure's resolution; the figures are seconds).
const LOOK: Duration = Duration::from_millis(5);

pub(crate) async fn runner(quick: bool, out: &mut Vec<Figure>) -> Result<()> {
    let (Some(claude), Some(waymark)) = (claude_binary(), waymark_binary()) else {
        eprintln!(
            "runner: skipped — needs the real Claude Code {CLAUDE_CODE_VERSION} (scripts/setup-debian) and `waymark` beside this binary (cargo build --release -p waymark-cli)"
        );
        return Ok(());
    };
    let rounds = if quick { 1 } else { 3 };
    let mut w = World::new(claude, waymark, rounds).await?;
    let mut revive = Vec::new();
    let mut bare = Vec::new();
    let mut deferred = Vec::new();
    let mut live = Vec::new();
    for i in 0..rounds {
        let (a, b) = w.revive(i).await.with_context(|| format!("revive {i}"))?;
        revive.push(a);
        bare.push(b);
        let (a, b) = w.answers(i).await.with_context(|| format!("answers {i}"))?;
        deferred.push(a);
        live.push(b);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        percentile(v, 50.0)
    };
    let (r, b) = (median(&mut revive), median(&mut bare));
    out.push(Figure {
        bench: "runner".into(),
        measure: "restart → resumed Claude Code's 1st request".into(),
        value: r,
        unit: "ms".into(),
        baseline: Some(b),
        ratio: Some(r / b),
        target: "beside `claude -p --resume` (median)".into(),
        met: None,
    });
    let (d, l) = (median(&mut deferred), median(&mut live));
    out.push(Figure {
        bench: "runner".into(),
        measure: "deferred answer → the tool runs".into(),
        value: d,
        unit: "ms".into(),
        baseline: Some(l),
        ratio: Some(d / l),
        target: "beside a live run's approval (median)".into(),
        met: None,
    });
    Ok(())
}

fn claude_binary() -> Option<PathBuf> {
    let base = std::env::var_os("WAYMARK_RUNTIMES_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/waymark-runtimes"))
        })?;
    let dir = base.join("claude-code");
    let bin = dir.join("node_modules/@anthropic-ai/claude-code-linux-x64/claude");
    let stamp = std::fs::read_to_string(dir.join("installed")).unwrap_or_default();
    (bin.exists() && stamp.contains(&format!("@anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}")))
        .then_some(bin)
}

fn waymark_binary() -> Option<PathBuf> {
    std::env::var_os("WAYMARK_BIN")
        .map(PathBuf::from)
        .or_else(|| Some(std::env::current_exe().ok()?.parent()?.join("waymark")))
        .filter(|p| p.exists())
}

/// A server, a paired device, a runner token, the fake model and a project directory.
struct World {
    server: Server,
    device: Device,
    token: String,
    machine: String,
    model: FakeAnthropic,
    dir: tempfile::TempDir,
    claude: PathBuf,
    waymark: PathBuf,
}

/// A `waymark runner` child, killed when dropped.
struct RunnerChild(std::process::Child);

impl Drop for RunnerChild {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl World {
    async fn new(claude: PathBuf, waymark: PathBuf, rounds: usize) -> Result<World> {
        let dir = tempfile::tempdir()?;
        for d in ["home/.claude", "project", "tmp", "state"] {
            std::fs::create_dir_all(dir.path().join(d))?;
        }
        let project = dir.path().join("project").canonicalize()?;
        let mut turns = Vec::new();
        for i in 0..rounds {
            for what in ["revive", "deferred", "live"] {
                turns.push(Turn {
                    prompt: format!("bench {what} {i}"),
                    command: format!(
                        "echo ran >> {}",
                        project.join(format!("{what}-{i}")).display()
                    ),
                    answer: format!("{what} {i} finished."),
                });
            }
        }
        let model = FakeAnthropic::start(turns).await;
        let server = server(crate::bench_config()).await?;
        let store = server.run.state.store.clone();
        let (token, machine, _) =
            waymark_server::admin::create_runner_token(&*store, "bench-laptop", Some("bench"))
                .await?;
        let device = pair(&server).await?;
        Ok(World {
            server,
            device,
            token,
            machine: machine.id,
            model,
            dir,
            claude,
            waymark,
        })
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    /// What Claude Code runs with: a private home, the fake model, no telemetry or updates.
    fn claude_env(&self) -> Vec<(&'static str, std::ffi::OsString)> {
        vec![
            ("HOME", self.path("home").into()),
            ("CLAUDE_CONFIG_DIR", self.path("home/.claude").into()),
            ("TMPDIR", self.path("tmp").into()),
            ("ANTHROPIC_BASE_URL", self.model.base_url.clone().into()),
            ("ANTHROPIC_API_KEY", "dummy".into()),
            ("DISABLE_TELEMETRY", "1".into()),
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".into()),
            ("DISABLE_AUTOUPDATER", "1".into()),
        ]
    }

    /// Starts `waymark runner` and waits until it asked the control plane for work (it is
    /// registered and heard from).
    async fn start_runner(&self) -> Result<RunnerChild> {
        let since = chrono::Utc::now().timestamp_millis();
        let child = self.spawn_runner()?;
        self.until("the runner is heard from", || async {
            let m = self
                .server
                .run
                .state
                .store
                .read()
                .await?
                .machine(&self.machine)
                .await?;
            Ok(m.and_then(|m| m.last_seen_at).is_some_and(|at| at >= since))
        })
        .await?;
        Ok(child)
    }

    fn spawn_runner(&self) -> Result<RunnerChild> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path("runner.log"))?;
        let child = std::process::Command::new(&self.waymark)
            .args(["runner", "--server", &self.server.run.url(), "--allow"])
            .arg(self.path("project"))
            .arg("--claude")
            .arg(&self.claude)
            .arg("--state-dir")
            .arg(self.path("state"))
            .args(["--approval-timeout", "300"])
            .env("WAYMARK_TOKEN", &self.token)
            .env("WAYMARK_LOG", "info")
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .envs(self.claude_env())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("start `waymark runner`")?;
        Ok(RunnerChild(child))
    }

    /// Signs `start_run` on the device; the new task's id.
    async fn start_run(&self, prompt: &str, gate: Option<&str>) -> Result<String> {
        let task = waymark_proto::ids::task();
        let mut args = json!({
            "machine": "bench-laptop",
            "runtime": "claude-code",
            "directory": self.path("project").canonicalize()?.to_string_lossy(),
            "prompt": prompt,
        });
        if let Some(g) = gate {
            args["gate"] = g.into();
        }
        let r = self.submit(&task, None, Operation::StartRun, args).await?;
        anyhow::ensure!(r["status"] == "applied", "start_run: {r}");
        Ok(task)
    }

    async fn submit(
        &self,
        task: &str,
        revision: Option<i64>,
        op: Operation,
        args: Value,
    ) -> Result<Value> {
        let now = chrono::Utc::now();
        let cmd = waymark_proto::SteerCommand {
            command_id: waymark_proto::ids::command(),
            task_id: Some(task.to_owned()),
            expected_plan_revision: revision,
            operation: op,
            scope: vec![],
            args,
            issued_by: "user:bench".into(),
            device_id: self.device.id.clone(),
            issued_at: now,
            expires_at: now + chrono::Duration::minutes(5),
        };
        let env = waymark_proto::signing::sign(&cmd, &self.device.key)?;
        Ok(self
            .server
            .http
            .post(format!("{}/v1/commands", self.server.run.url()))
            .json(&env)
            .send()
            .await?
            .json()
            .await?)
    }

    /// Answers decision `d` with `op`, bound to what it asked.
    async fn answer(&self, d: &DecisionRow, op: Operation) -> Result<()> {
        let args = json!({"decision_id": d.id, "intent_digest": d.intent_digest});
        let r = self
            .submit(&d.task_id, Some(d.plan_revision), op, args)
            .await?;
        anyhow::ensure!(r["status"] == "applied", "{op:?}: {r}");
        Ok(())
    }

    async fn effects(&self, task: &str) -> Result<Vec<EffectRow>> {
        Ok(self
            .server
            .run
            .state
            .store
            .read()
            .await?
            .list_effects(task)
            .await?)
    }

    async fn decisions(&self, task: &str) -> Result<Vec<DecisionRow>> {
        Ok(self
            .server
            .run
            .state
            .store
            .read()
            .await?
            .list_decisions(task)
            .await?)
    }

    /// The task's pending decision, once there is one (up to two minutes).
    async fn pending_approval(&self, task: &str, what: &str) -> Result<DecisionRow> {
        let find = || async {
            Ok::<_, anyhow::Error>(
                self.decisions(task)
                    .await?
                    .into_iter()
                    .find(|d| d.status == waymark_proto::DecisionStatus::Pending),
            )
        };
        self.until(what, || async { Ok(find().await?.is_some()) })
            .await?;
        find().await?.with_context(|| what.to_owned())
    }

    /// Waits up to two minutes for `check`, looking every [`LOOK`].
    async fn until<F, Fut>(&self, what: &str, mut check: F) -> Result<()>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<bool>>,
    {
        let deadline = Instant::now() + Duration::from_secs(120);
        while !check().await? {
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(self.path("runner.log")).unwrap_or_default();
                let tail: String = log.lines().rev().take(20).collect::<Vec<_>>().join("\n");
                bail!("{what}: not within 120 s; the runner's log ends:\n{tail}");
            }
            tokio::time::sleep(LOOK).await;
        }
        Ok(())
    }

    /// The pid of the runtime process the runner started for `task` (its state file).
    fn runtime_pid(&self, task: &str) -> Option<i32> {
        let s: Value =
            serde_json::from_str(&std::fs::read_to_string(self.path("state/state.json")).ok()?)
                .ok()?;
        s["runs"][task]["pid"]
            .as_i64()
            .and_then(|p| i32::try_from(p).ok())
    }

    /// Round `i` of the revive figure: (through the runner, the bare resume) in ms.
    async fn revive(&mut self, i: usize) -> Result<(f64, f64)> {
        let marker = self.path(&format!("project/revive-{i}"));
        let mut runner = self.start_runner().await?;
        // The call runs, and the model's answer after it is held: the run is cut off after a
        // confirmed call, before its turn ends.
        self.model.hold_after_results(true);
        let task = self
            .start_run(&format!("bench revive {i}"), Some("Bash"))
            .await?;
        let d = self.pending_approval(&task, "the call's approval").await?;
        self.answer(&d, Operation::Approve).await?;
        self.until("the call is confirmed", || async {
            Ok(marker.exists()
                && self
                    .effects(&task)
                    .await?
                    .iter()
                    .any(|e| e.status == waymark_proto::EffectStatus::Confirmed))
        })
        .await?;
        let pid = self.runtime_pid(&task).context("the runtime's pid")?;
        let _ = rustix::process::kill_process_group(
            rustix::process::Pid::from_raw(pid).context("a pid")?,
            rustix::process::Signal::KILL,
        );
        let _ = runner.0.kill();
        let _ = runner.0.wait();
        drop(runner);
        self.model.hold_after_results(false);

        // Measured: the runner's start → the resumed Claude Code asks the model.
        let before = self.model.requests().len();
        let t0 = Instant::now();
        let runner = self.start_runner().await?;
        self.until("the resumed run asks the model", || async {
            Ok(self.model.requests().len() > before)
        })
        .await?;
        let through = t0.elapsed().as_secs_f64() * 1000.0;
        let session = {
            let tx = self.server.run.state.store.read().await;
            tx?.task(&task).await?.and_then(|t| t.external_key)
        }
        .context("the run's session")?;
        self.until("the revived run ends", || async {
            Ok(self.runtime_pid(&task).is_none())
        })
        .await?;
        drop(runner);

        // Baseline: the bare resume of that session, typed at the laptop.
        let before = self.model.requests().len();
        let t0 = Instant::now();
        let mut bare = tokio::process::Command::new(&self.claude)
            .args(["-p", "--resume", &session, "--output-format", "json"])
            .current_dir(self.path("project"))
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .envs(self.claude_env())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .context("start the bare `claude -p --resume`")?;
        if let Some(mut stdin) = bare.stdin.take() {
            use tokio::io::AsyncWriteExt;
            stdin
                .write_all(b"Continue from where you left off.")
                .await?;
        }
        self.until("the bare resume asks the model", || async {
            Ok(self.model.requests().len() > before)
        })
        .await?;
        let baseline = t0.elapsed().as_secs_f64() * 1000.0;
        let _ = bare.wait().await;
        Ok((through, baseline))
    }

    /// Round `i` of the answer figure: (a deferred approval, a live one) answered → the tool
    /// runs, in ms.
    async fn answers(&mut self, i: usize) -> Result<(f64, f64)> {
        let runner = self.start_runner().await?;
        // Deferred: the person lets Claude Code wait; it exits; later they approve.
        let marker = self.path(&format!("project/deferred-{i}"));
        let task = self
            .start_run(&format!("bench deferred {i}"), Some("Bash"))
            .await?;
        let d = self
            .pending_approval(&task, "the deferred run's approval")
            .await?;
        self.answer(&d, Operation::Defer).await?;
        self.until("Claude Code exits with the call deferred", || async {
            Ok(self.runtime_pid(&task).is_none())
        })
        .await?;
        let d = self
            .pending_approval(&task, "the deferred approval")
            .await?;
        let t0 = Instant::now();
        self.answer(&d, Operation::Approve).await?;
        self.until("the deferred call runs", || async { Ok(marker.exists()) })
            .await?;
        let deferred = t0.elapsed().as_secs_f64() * 1000.0;
        self.until("the deferred run ends", || async {
            Ok(self.runtime_pid(&task).is_none())
        })
        .await?;

        // Live: the hook is held open while the person decides.
        let marker = self.path(&format!("project/live-{i}"));
        let task = self
            .start_run(&format!("bench live {i}"), Some("Bash"))
            .await?;
        let d = self
            .pending_approval(&task, "the live run's approval")
            .await?;
        let t0 = Instant::now();
        self.answer(&d, Operation::Approve).await?;
        self.until("the live call runs", || async { Ok(marker.exists()) })
            .await?;
        let live = t0.elapsed().as_secs_f64() * 1000.0;
        self.until("the live run ends", || async {
            Ok(self.runtime_pid(&task).is_none())
        })
        .await?;
        drop(runner);
        Ok((deferred, live))
    }
}
