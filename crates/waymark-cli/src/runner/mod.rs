//! `waymark runner`: the hands on one machine. A small supervisor that asks the control plane
//! for its machine's work (asking is its heartbeat), starts and resumes the runtimes wired to
//! Waymark, reports each process's end, and stops runs that were cancelled. It is a client of
//! the control plane and decides nothing of recovery itself; the one rule it keeps is its
//! owner's: no run starts outside the directories allowed here, whatever a signed command says.
//! `install` writes a systemd user unit that runs it.

mod acp;
mod claude;
mod codex;
mod inhibit;
mod openclaw;
mod service;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Subcommand};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::mpsc;
use waymark_proto::*;

use crate::output::{CliResult, Exit, Failure, emit};

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct RunnerArgs {
    #[command(subcommand)]
    action: Option<Action>,
    #[command(flatten)]
    opts: RunnerOpts,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Write a systemd user unit that runs this runner, and start it (`--no-start`: write only).
    Install {
        #[command(flatten)]
        opts: Box<RunnerOpts>,
        /// Write the unit and its environment file; do not enable or start it.
        #[arg(long)]
        no_start: bool,
    },
    /// Stop the systemd user unit and remove it (runs in progress keep going; revive them by
    /// running the runner again).
    Uninstall,
}

/// What a runner runs with.
#[derive(Debug, Clone, Args)]
pub(crate) struct RunnerOpts {
    /// The control plane's URL.
    #[arg(long, env = "WAYMARK_SERVER", default_value = crate::DEFAULT_SERVER)]
    server: String,
    /// Trust only the server certificate with this fingerprint (`sha256:…`).
    #[arg(long, env = waymark_worker::SERVER_FP_ENV)]
    server_fp: Option<String>,
    /// This machine's runner token (`waymark admin runner-token --machine NAME`).
    #[arg(long, env = "WAYMARK_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// A directory runs may use (and any directory under it); repeat for more. Nothing is
    /// allowed unless named here: a signed command cannot widen it.
    #[arg(long = "allow", value_name = "DIR")]
    allow: Vec<PathBuf>,
    /// The machine's name, checked against the token's (optional).
    #[arg(long)]
    name: Option<String>,
    /// Where the runner keeps its state, logs and the runtimes' settings (default: the XDG
    /// state dir, `~/.local/state/waymark/runner`).
    #[arg(long, env = "WAYMARK_RUNNER_STATE")]
    state_dir: Option<PathBuf>,
    /// The Claude Code binary (default: `claude` on the PATH).
    #[arg(long, env = "WAYMARK_CLAUDE")]
    claude: Option<PathBuf>,
    /// The Codex binary (default: `codex` on the PATH); runs go through this binary's Codex
    /// adapter, which starts `codex app-server`.
    #[arg(long, env = "WAYMARK_CODEX")]
    codex: Option<PathBuf>,
    /// The Gemini CLI binary (default: `gemini` on the PATH); runs go through this binary's
    /// ACP adapter, which starts `gemini --acp`.
    #[arg(long, env = "WAYMARK_GEMINI")]
    gemini: Option<PathBuf>,
    /// The OpenCode binary (default: `opencode` on the PATH); `opencode acp` through this
    /// binary's ACP adapter.
    #[arg(long, env = "WAYMARK_OPENCODE")]
    opencode: Option<PathBuf>,
    /// The GitHub Copilot CLI binary (default: `copilot` on the PATH); `copilot --acp` through
    /// this binary's ACP adapter.
    #[arg(long, env = "WAYMARK_COPILOT")]
    copilot: Option<PathBuf>,
    /// The Hermes Agent binary (default: `hermes` on the PATH); `hermes acp` through this
    /// binary's ACP adapter.
    #[arg(long, env = "WAYMARK_HERMES")]
    hermes: Option<PathBuf>,
    /// The OpenClaw gateway runs may be started on (`ws://127.0.0.1:18789`), a service its
    /// owner runs: each run is a session of its own there, followed by this binary's OpenClaw
    /// adapter. Without it OpenClaw is not offered.
    #[arg(long, env = "WAYMARK_OPENCLAW_GATEWAY", value_name = "URL")]
    openclaw_gateway: Option<String>,
    /// The gateway's shared token (its `gateway.auth.token`), when it has one.
    #[arg(long, env = "OPENCLAW_GATEWAY_TOKEN", hide_env_values = true)]
    openclaw_token: Option<String>,
    /// The OpenClaw agent whose sessions the runs are.
    #[arg(long, default_value = "main", value_name = "ID")]
    openclaw_agent: String,
    /// The OpenClaw binary, for its version (default: `openclaw` on the PATH).
    #[arg(long, env = "WAYMARK_OPENCLAW")]
    openclaw: Option<PathBuf>,
    /// How long a held approval waits for an answer before Claude Code decides alone (seconds;
    /// a `claude -p` run denies then). The card offers to make it wait durably instead.
    #[arg(long, default_value_t = 600)]
    approval_timeout: u64,
    /// Keep the machine awake while a run is active (logind's sleep lock, through
    /// `systemd-inhibit`); off by default, and shown on the Machines screen.
    #[arg(long, env = "WAYMARK_INHIBIT_SLEEP")]
    inhibit_sleep: bool,
}

/// How often the runtimes' own rules are read again.
const OWN_RULES_EVERY: Duration = Duration::from_secs(30);

pub(crate) async fn run(args: RunnerArgs, json: bool) -> CliResult {
    match args.action {
        Some(Action::Install { opts, no_start }) => service::install(&opts, no_start, json),
        Some(Action::Uninstall) => service::uninstall(json),
        None => Runner::new(args.opts).await?.run(json).await,
    }
}

fn default_state_dir() -> PathBuf {
    directories::ProjectDirs::from("dev", "waymark", "waymark")
        .and_then(|d| d.state_dir().map(Path::to_path_buf))
        .unwrap_or_else(|| {
            std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("."))
                .join(".local/state/waymark")
        })
        .join("runner")
}

/// The directories allowed, each resolved (symlinks followed), so a path is checked against
/// where it really leads.
fn allowed_dirs(allow: &[PathBuf]) -> Result<Vec<PathBuf>, Failure> {
    if allow.is_empty() {
        return Err(Failure::new(
            Exit::Usage,
            "nothing_allowed",
            "name at least one directory runs may use: `--allow ~/src` (repeat for more)",
        ));
    }
    allow
        .iter()
        .map(|d| {
            let real = d.canonicalize().map_err(|e| {
                Failure::new(
                    Exit::Usage,
                    "bad_allow",
                    format!("--allow {}: {e}", d.display()),
                )
            })?;
            if !real.is_dir() {
                return Err(Failure::new(
                    Exit::Usage,
                    "bad_allow",
                    format!("--allow {}: not a directory", d.display()),
                ));
            }
            Ok(real)
        })
        .collect()
}

/// Whether the runner may run in `dir`: it exists, and where it really leads (symlinks
/// followed, `..` resolved) is one of the allowed directories or under one.
pub(crate) fn check_directory(dir: &str, allowed: &[PathBuf]) -> Result<PathBuf, String> {
    let p = Path::new(dir);
    if !p.is_absolute() {
        return Err(format!("`{dir}` is not an absolute path"));
    }
    let real = p
        .canonicalize()
        .map_err(|e| format!("`{dir}` cannot be used here: {e}"))?;
    if !real.is_dir() {
        return Err(format!("`{dir}` is not a directory"));
    }
    if !allowed.iter().any(|a| real.starts_with(a)) {
        return Err(format!(
            "`{dir}` is outside the directories this machine allows ({})",
            allowed
                .iter()
                .map(|a| a.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Ok(real)
}

/// What the runner keeps across its own restarts: the runtime processes it started (so it
/// finds them again, alive or gone) and the work items it acted on (so a resent item is never
/// acted on twice).
#[derive(Debug, Default, Serialize, Deserialize)]
struct State {
    runs: BTreeMap<String, RunRecord>,
    done: VecDeque<Acted>,
    /// The directory of each run started or resumed here, newest last: where its working tree
    /// is read when its process ends, for admission on the revive.
    #[serde(default)]
    dirs: VecDeque<(String, PathBuf)>,
}

/// A work item acted on, and what the runner reported of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Acted {
    work: String,
    state: WorkState,
    detail: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct RunRecord {
    pid: u32,
    /// The process's start time in clock ticks since boot (`/proc/PID/stat`), so a reused pid
    /// is not taken for it.
    start_ticks: u64,
}

/// The most work ids kept as done.
const DONE_KEPT: usize = 1000;

impl State {
    fn load(path: &Path) -> State {
        std::fs::read(path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    fn save(&self, path: &Path) -> std::io::Result<()> {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(self)?)?;
        std::fs::rename(tmp, path)
    }

    fn remember_dir(&mut self, task: &str, dir: &Path) {
        self.dirs.retain(|(t, _)| t != task);
        self.dirs.push_back((task.to_owned(), dir.to_owned()));
        while self.dirs.len() > DONE_KEPT {
            self.dirs.pop_front();
        }
    }

    fn dir_of(&self, task: &str) -> Option<&Path> {
        self.dirs
            .iter()
            .rev()
            .find(|(t, _)| t == task)
            .map(|(_, d)| d.as_path())
    }

    fn acted(&mut self, a: Acted) {
        if !self.done.iter().any(|d| d.work == a.work) {
            self.done.push_back(a);
        }
        while self.done.len() > DONE_KEPT {
            self.done.pop_front();
        }
    }
}

/// The variable every runtime process a runner starts carries: its task. A runner killed after
/// it started a run and before it saved it finds the run again by it ([`marked_runs`]).
const RUN_MARK: &str = "WAYMARK_RUNNER_TASK";

/// The variable that names the runner a run's processes belong to (its state directory). Two
/// runners of one user on one machine — two control planes, two test suites — each take up and
/// end only their own runs: without it, a restarted runner adopted another's run and, when that
/// run ended, killed the next process of its task as a leftover.
const RUNNER_MARK: &str = "WAYMARK_RUNNER_STATE";

/// The marks process `pid` carries: its task and its runner. Another user's processes cannot
/// be read: only this user's are found.
fn marks_of(pid: u32) -> Option<(String, String)> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let (task, runner) = (format!("{RUN_MARK}="), format!("{RUNNER_MARK}="));
    let (mut t, mut r) = (None, None);
    for v in environ
        .split(|b| *b == 0)
        .filter_map(|v| std::str::from_utf8(v).ok())
    {
        if let Some(x) = v.strip_prefix(&task) {
            t = Some(x.to_owned());
        } else if let Some(x) = v.strip_prefix(&runner) {
            r = Some(x.to_owned());
        }
    }
    t.zip(r)
}

/// The live process group leaders of this user that carry the marks of `runner`'s runs: (task,
/// the process).
fn marked_runs(runner: &str) -> Vec<(String, RunRecord)> {
    let mut found = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in dir.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // The process group is the third field after the command's closing parenthesis.
        let Some(rest) = stat.rfind(')').and_then(|i| stat.get(i + 2..)) else {
            continue;
        };
        if rest.split(' ').nth(2).and_then(|g| g.parse::<u32>().ok()) != Some(pid) {
            continue;
        }
        let Some((task, by)) = marks_of(pid) else {
            continue;
        };
        if let (true, Some(start_ticks)) = (by == runner, process_start(pid)) {
            found.push((task, RunRecord { pid, start_ticks }));
        }
    }
    found
}

/// Ends (`SIGKILL`) every process still alive that `runner`'s run of `task` started, wherever it
/// went: a shell command outlives its agent's `-9` (OpenCode, Copilot CLI and Hermes Agent run
/// commands outside their process group, Hermes in a session of its own), and would go on acting
/// with nobody to report it. Found by the marks every process of the run inherits. How many.
async fn end_leftovers(task: &str, runner: &str) -> usize {
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let left: Vec<String> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|pid| *pid != me && process_start(*pid).is_some())
        .filter(|pid| marks_of(*pid).is_some_and(|(t, r)| t == task && r == runner))
        .map(|pid| pid.to_string())
        .collect();
    if left.is_empty() {
        return 0;
    }
    let _ = tokio::process::Command::new("kill")
        .arg("-KILL")
        .args(&left)
        .stderr(std::process::Stdio::null())
        .status()
        .await;
    left.len()
}

/// The start time of process `pid` (ticks since boot), if it is alive and not a zombie.
fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: fields follow the last `)`.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    if fields.first() == Some(&"Z") {
        return None;
    }
    fields.get(19)?.parse().ok()
}

/// The HTTP side: the control plane's runner routes, with this machine's token.
#[derive(Clone)]
struct Conn {
    http: reqwest::Client,
    server: String,
    token: String,
}

#[derive(Debug)]
enum CallError {
    /// The server could not be reached (or answered 5xx): try again.
    Unreachable(String),
    /// The server refused (4xx): retrying does not help.
    Refused(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Unreachable(e) | CallError::Refused(e) => f.write_str(e),
        }
    }
}

impl Conn {
    async fn call<T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
        timeout: Duration,
    ) -> Result<T, CallError> {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.server))
            .bearer_auth(&self.token)
            .timeout(timeout);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let res = req
            .send()
            .await
            .map_err(|e| CallError::Unreachable(format!("{}: {e}", self.server)))?;
        let status = res.status();
        if status.is_success() {
            return res
                .json()
                .await
                .map_err(|e| CallError::Unreachable(format!("unreadable answer: {e}")));
        }
        let problem: serde_json::Value = res.json().await.unwrap_or_default();
        let detail = problem["detail"].as_str().unwrap_or("").to_owned();
        let msg = format!("{path}: {status} {detail}");
        if status.is_server_error() {
            Err(CallError::Unreachable(msg))
        } else {
            Err(CallError::Refused(msg))
        }
    }

    async fn poll(self, wait: u64) -> Result<WorkList, CallError> {
        self.call(
            reqwest::Method::GET,
            &format!("/v1/runner/work?wait={wait}"),
            None,
            Duration::from_secs(wait + 15),
        )
        .await
    }

    async fn report(
        &self,
        work: &str,
        state: WorkState,
        detail: Option<String>,
    ) -> Result<Work, CallError> {
        self.call(
            reqwest::Method::POST,
            &format!("/v1/runner/work/{work}"),
            Some(json!(ReportWork { state, detail })),
            Duration::from_secs(15),
        )
        .await
    }

    async fn exited(&self, task: &str, e: &RunExited) -> Result<ExitHandled, CallError> {
        self.call(
            reqwest::Method::POST,
            &format!("/v1/runner/tasks/{task}/exited"),
            Some(json!(e)),
            Duration::from_secs(15),
        )
        .await
    }
}

/// A runtime process this runner watches: its own child (waited on by a task of its own) or
/// one it found alive after a restart (looked at every second).
#[derive(Debug)]
struct Live {
    pid: u32,
    /// A child of this runner (its end arrives on the exit channel); else adopted.
    child: bool,
}

/// A request for the machine's work, in flight.
type Poll =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<WorkList, CallError>> + Send>>;

/// A runtime process's end, from the task that waited on it: the task and how it ended.
type Ended = (String, RunExited);

struct Runner {
    conn: Conn,
    allowed: Vec<PathBuf>,
    state_dir: PathBuf,
    /// What this runner's runs carry in [`RUNNER_MARK`]: its state directory, resolved.
    mark: String,
    state: State,
    claude: Option<claude::Claude>,
    codex: Option<codex::Codex>,
    /// The ACP agents found (Gemini CLI, OpenCode, Copilot CLI, Hermes Agent).
    acp: Vec<acp::AcpAgent>,
    /// The OpenClaw gateway runs start on, when one was named.
    openclaw: Option<openclaw::OpenClaw>,
    approval_timeout: u64,
    server_fp: Option<String>,
    name: Option<String>,
    live: HashMap<String, Live>,
    exits: (mpsc::UnboundedSender<Ended>, mpsc::UnboundedReceiver<Ended>),
    inhibitor: inhibit::Inhibitor,
    /// The runtimes' own rules on this machine, as last read.
    own_rules: Vec<waymark_proto::RuntimeRule>,
    /// Whether the control plane has `own_rules` (false after a report failed).
    own_rules_reported: bool,
}

impl Runner {
    async fn new(opts: RunnerOpts) -> Result<Runner, Failure> {
        let token = opts.token.clone().filter(|t| !t.is_empty()).ok_or_else(|| {
            Failure::new(
                Exit::Usage,
                "no_token",
                "a runner needs its machine's token: `--token` or $WAYMARK_TOKEN (on the control plane's host: `waymark admin runner-token --machine NAME`)",
            )
        })?;
        let server = opts.server.trim_end_matches('/').to_owned();
        if !(server.starts_with("http://") || server.starts_with("https://")) {
            return Err(Failure::new(
                Exit::Usage,
                "bad_server",
                format!("--server `{server}` must start with http:// or https://"),
            ));
        }
        let allowed = allowed_dirs(&opts.allow)?;
        let state_dir = opts.state_dir.clone().unwrap_or_else(default_state_dir);
        std::fs::create_dir_all(state_dir.join("logs"))
            .and_then(|()| std::fs::create_dir_all(state_dir.join("claude")))
            .and_then(|()| std::fs::create_dir_all(state_dir.join("codex")))
            .and_then(|()| std::fs::create_dir_all(state_dir.join("acp")))
            .and_then(|()| std::fs::create_dir_all(state_dir.join("openclaw")))
            .map_err(|e| {
                Failure::new(
                    Exit::Usage,
                    "bad_state_dir",
                    format!("cannot use {}: {e}", state_dir.display()),
                )
            })?;
        private_dir(&state_dir);
        let mut http = reqwest::Client::builder().no_proxy();
        if let Some(fp) = &opts.server_fp {
            let tls = waymark_tls_pin::client_config(fp)
                .map_err(|e| Failure::new(Exit::Usage, "bad_pin", format!("--server-fp: {e}")))?;
            http = http.use_preconfigured_tls(tls);
        }
        let http = http
            .build()
            .map_err(|e| Failure::new(Exit::Usage, "client", e.to_string()))?;
        let claude = claude::Claude::find(opts.claude.as_deref()).await;
        let codex = codex::Codex::find(opts.codex.as_deref()).await;
        let mut acp = Vec::new();
        for (kind, explicit) in [
            (acp::Kind::Gemini, &opts.gemini),
            (acp::Kind::OpenCode, &opts.opencode),
            (acp::Kind::Copilot, &opts.copilot),
            (acp::Kind::Hermes, &opts.hermes),
        ] {
            acp.extend(acp::AcpAgent::find(kind, explicit.as_deref()).await);
        }
        if let Some(g) = &opts.openclaw_gateway
            && !(g.starts_with("ws://") || g.starts_with("wss://"))
        {
            return Err(Failure::new(
                Exit::Usage,
                "bad_openclaw_gateway",
                format!(
                    "--openclaw-gateway `{g}` must start with ws:// (the gateway's WebSocket URL, e.g. ws://127.0.0.1:18789)"
                ),
            ));
        }
        let openclaw = openclaw::OpenClaw::find(
            opts.openclaw_gateway.as_deref(),
            opts.openclaw_token.clone(),
            &opts.openclaw_agent,
            opts.openclaw.as_deref(),
        )
        .await;
        Ok(Runner {
            conn: Conn {
                http,
                server,
                token,
            },
            allowed,
            state: State::load(&state_dir.join("state.json")),
            mark: std::fs::canonicalize(&state_dir)
                .unwrap_or_else(|_| state_dir.clone())
                .to_string_lossy()
                .into_owned(),
            state_dir,
            claude,
            codex,
            acp,
            openclaw,
            approval_timeout: opts.approval_timeout.clamp(5, 86_400),
            server_fp: opts.server_fp,
            name: opts.name,
            live: HashMap::new(),
            exits: mpsc::unbounded_channel(),
            inhibitor: inhibit::Inhibitor::new(opts.inhibit_sleep),
            own_rules: Vec::new(),
            own_rules_reported: true,
        })
    }

    fn save(&self) {
        if let Err(e) = self.state.save(&self.state_dir.join("state.json")) {
            tracing::error!(error = %e, "cannot save the runner's state");
        }
    }

    fn registration(&self) -> RegisterMachine {
        let claude = self.claude.iter().map(|c| MachineRuntime {
            runtime: "claude-code".into(),
            version: c.version.clone(),
        });
        let codex = self.codex.iter().map(|c| MachineRuntime {
            runtime: waymark_adapters::codex::RUNTIME.into(),
            version: c.version.clone(),
        });
        let acp = self.acp.iter().map(|a| MachineRuntime {
            runtime: a.runtime.into(),
            version: a.version.clone(),
        });
        let openclaw = self.openclaw.iter().map(|o| MachineRuntime {
            runtime: "openclaw".into(),
            version: o.version.clone(),
        });
        RegisterMachine {
            runtimes: claude.chain(codex).chain(acp).chain(openclaw).collect(),
            directories: self
                .allowed
                .iter()
                .map(|d| d.to_string_lossy().into_owned())
                .collect(),
            runner_version: env!("CARGO_PKG_VERSION").into(),
            inhibits_sleep: self.inhibitor.enabled(),
            runtime_rules: self.own_rules.clone(),
        }
    }

    /// Reads the runtimes' own rules again; whether they changed since last read.
    async fn read_own_rules(&mut self) -> bool {
        let Some(places) = waymark_adapters::own_rules::Places::of_this_user(self.allowed.clone())
        else {
            return false;
        };
        let read = tokio::task::spawn_blocking(move || waymark_adapters::own_rules::read(&places))
            .await
            .unwrap_or_default();
        if read == self.own_rules {
            return false;
        }
        self.own_rules = read;
        true
    }

    /// The runtimes found, for people.
    fn found(&self) -> String {
        let version = |v: &Option<String>| v.clone().unwrap_or_else(|| "(version unknown)".into());
        let mut found = Vec::new();
        if let Some(c) = &self.claude {
            found.push(format!("Claude Code {}", version(&c.version)));
        }
        if let Some(c) = &self.codex {
            found.push(format!("Codex {}", version(&c.version)));
        }
        for a in &self.acp {
            found.push(format!("{} {}", a.name, version(&a.version)));
        }
        if let Some(o) = &self.openclaw {
            found.push(format!("OpenClaw {} on {}", version(&o.version), o.gateway));
        }
        if found.is_empty() {
            return "no runtime found (Claude Code: `claude` not on the PATH, --claude PATH; Codex: `codex` not on the PATH, --codex PATH; Gemini CLI, OpenCode, Copilot CLI, Hermes Agent: `gemini`, `opencode`, `copilot`, `hermes` not on the PATH, --gemini/--opencode/--copilot/--hermes PATH; OpenClaw: --openclaw-gateway URL)".into();
        }
        found.join(", ")
    }

    /// Registers, waiting for the control plane while it cannot be reached.
    async fn register(&self) -> Result<Machine, Failure> {
        let mut wait = Duration::from_millis(500);
        let mut said = false;
        loop {
            match self.put_registration().await {
                Ok(m) => return Ok(m),
                Err(CallError::Refused(e)) => {
                    return Err(Failure::new(Exit::Refused, "refused", e));
                }
                Err(CallError::Unreachable(e)) => {
                    if !said {
                        eprintln!("waiting for the control plane ({e}) …");
                        said = true;
                    }
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(30));
                }
            }
        }
    }

    async fn run(mut self, json: bool) -> CliResult {
        self.read_own_rules().await;
        let machine = self.register().await?;
        if let Some(n) = &self.name
            && *n != machine.name
        {
            return Err(Failure::new(
                Exit::Refused,
                "wrong_machine",
                format!(
                    "--name {n}, but this token is the runner token of `{}`",
                    machine.name
                ),
            ));
        }
        self.adopt();
        emit(
            json,
            &json!({"machine": machine, "state_dir": self.state_dir}),
            || {
                format!(
                    "runner of {} ({}): {}\n  allows: {}\n  state:  {}",
                    machine.name,
                    machine.owner,
                    self.found(),
                    machine.directories.join(", "),
                    self.state_dir.display()
                )
            },
        );
        let mut backoff = Duration::from_millis(500);
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        // The runtimes' own rules are read again now and then, and reported when they changed.
        let mut reread = tokio::time::interval_at(
            tokio::time::Instant::now() + OWN_RULES_EVERY,
            OWN_RULES_EVERY,
        );
        // The request in flight outlives the other branches (a tick, a run's end): dropped, a
        // long poll would start over and never answer. The first one does not wait, so a run
        // cut off while the runner was away is reported at once.
        let mut next = Some((tokio::time::Instant::now(), 0));
        let mut inflight: Option<Poll> = None;
        loop {
            let poll = inflight.get_or_insert_with(|| {
                let (at, wait) = next
                    .take()
                    .unwrap_or((tokio::time::Instant::now(), RUNNER_POLL_SECONDS));
                let conn = self.conn.clone();
                Box::pin(async move {
                    tokio::time::sleep_until(at).await;
                    conn.poll(wait).await
                })
            });
            tokio::select! {
                res = poll => {
                    inflight = None;
                    let now = tokio::time::Instant::now();
                    match res {
                        Ok(list) => {
                            backoff = Duration::from_millis(500);
                            if self.handle(list).await {
                                // Only items that must wait (a resume while its run is live):
                                // ask again in a while, or when a run ends.
                                next = Some((now + Duration::from_secs(2), 0));
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot reach the control plane; retrying");
                            next = Some((now + backoff, 0));
                            backoff = (backoff * 2).min(Duration::from_secs(30));
                        }
                    }
                }
                Some((task, how)) = self.exits.1.recv() => {
                    self.ended(&task, how).await;
                    // A resume that waited for this run may go now.
                    inflight = None;
                    next = Some((tokio::time::Instant::now(), 0));
                }
                _ = tick.tick() => self.look_at_adopted().await,
                _ = reread.tick() => {
                    if self.read_own_rules().await || !self.own_rules_reported {
                        self.report_own_rules().await;
                    }
                }
                _ = tokio::signal::ctrl_c() => {
                    eprintln!("runner stopping; runs in progress keep going and are found again when it starts");
                    return Ok(());
                }
            }
            // Awake while a run is under way (when its owner asked for it).
            self.inhibitor.hold(!self.live.is_empty()).await;
        }
    }

    /// `PUT /v1/runner/machine` with what the runner found now.
    async fn put_registration(&self) -> Result<Machine, CallError> {
        self.conn
            .call(
                reqwest::Method::PUT,
                "/v1/runner/machine",
                Some(json!(self.registration())),
                Duration::from_secs(15),
            )
            .await
    }

    /// Reports the own rules read last (a registration like the first); a failure is tried
    /// again at the next read.
    async fn report_own_rules(&mut self) {
        match self.put_registration().await {
            Ok(_) => {
                self.own_rules_reported = true;
                tracing::info!(
                    rules = self.own_rules.len(),
                    "reported the runtimes' own rules"
                );
            }
            Err(e) => {
                self.own_rules_reported = false;
                tracing::warn!(error = %e, "cannot report the runtimes' own rules; trying again later");
            }
        }
    }

    /// Runs the runner started before it restarted: alive ones are watched again, gone ones
    /// are reported when the control plane next lists them as running.
    fn adopt(&mut self) {
        // A run the runner started just before it was killed, before it could save it: found
        // by the mark its process group leader carries.
        for (task, r) in marked_runs(&self.mark) {
            self.state.runs.entry(task).or_insert(r);
        }
        let runs: Vec<(String, RunRecord)> = self.state.runs.clone().into_iter().collect();
        for (task, r) in runs {
            if process_start(r.pid) == Some(r.start_ticks) {
                self.live.insert(
                    task,
                    Live {
                        pid: r.pid,
                        child: false,
                    },
                );
            } else {
                self.state.runs.remove(&task);
            }
        }
        self.save();
    }

    async fn look_at_adopted(&mut self) {
        let gone: Vec<String> = self
            .live
            .iter()
            .filter(|(t, l)| {
                !l.child
                    && self
                        .state
                        .runs
                        .get(*t)
                        .is_none_or(|r| process_start(l.pid) != Some(r.start_ticks))
            })
            .map(|(t, _)| t.clone())
            .collect();
        for task in gone {
            let how = RunExited {
                code: None,
                signal: None,
                detail: Some("ended while the runner was not watching it".into()),
                tree: None,
            };
            self.ended(&task, how).await;
        }
    }

    /// A runtime process ended: forget it, and tell the control plane, which decides whether
    /// the run needs recovering.
    async fn ended(&mut self, task: &str, mut how: RunExited) {
        self.live.remove(task);
        self.state.runs.remove(task);
        self.save();
        if how.code != Some(0) {
            let n = end_leftovers(task, &self.mark).await;
            if n > 0 {
                tracing::warn!(task, n, "ended what the run had started and left running");
                let said =
                    format!("{n} process(es) it had started were still running and were ended");
                how.detail = Some(match how.detail.take() {
                    Some(d) => format!("{d}; {said}"),
                    None => said,
                });
            }
        }
        if let Some(dir) = self.state.dir_of(task) {
            how.tree = waymark_worker::tree::snapshot(dir).await;
        }
        match self.conn.exited(task, &how).await {
            Ok(h) => tracing::info!(task, action = %h.action, "{}", h.detail),
            // Not reported now: the control plane lists the task as running until it is.
            Err(e) => tracing::warn!(task, error = %e, "cannot report a run's end yet"),
        }
    }

    /// Acts on the machine's open work. `true` when an item must wait (a resume while its run
    /// is live): the next request then waits a little instead of being answered at once.
    async fn handle(&mut self, list: WorkList) -> bool {
        tracing::debug!(work = list.work.len(), running = ?list.running, "polled");
        for task in &list.running {
            if self.live.contains_key(task) {
                continue;
            }
            let how = RunExited {
                code: None,
                signal: None,
                detail: Some(
                    "not running on this machine: the runner found no process for it (the machine restarted, or the runtime ended while the runner was away)".into(),
                ),
                tree: None,
            };
            self.ended(task, how).await;
        }
        let mut waits = false;
        for w in list.work {
            // Acted on before (the report was lost, or the runner restarted): say it again,
            // never do it again.
            if let Some(a) = self.state.done.iter().find(|a| a.work == w.id).cloned() {
                let _ = self.conn.report(&w.id, a.state, a.detail).await;
                continue;
            }
            if self.live.contains_key(&w.task_id) && w.kind != WorkKind::Stop {
                // A resume waits for the live run to end (Claude Code takes no second process
                // on one session); the item stays pending until then.
                waits = true;
                continue;
            }
            if w.state == WorkState::Pending
                && let Err(e) = self.conn.report(&w.id, WorkState::Taken, None).await
            {
                tracing::warn!(work = %w.id, error = %e, "cannot take a work item");
                continue;
            }
            let (state, detail) = match self.act(&w).await {
                Ok(detail) => (WorkState::Done, Some(detail)),
                Err(Refusal::NotAllowed(why)) => (WorkState::Refused, Some(why)),
                Err(Refusal::Failed(why)) => (WorkState::Failed, Some(why)),
            };
            self.state.acted(Acted {
                work: w.id.clone(),
                state,
                detail: detail.clone(),
            });
            self.save();
            if let Err(e) = self.conn.report(&w.id, state, detail.clone()).await {
                tracing::warn!(work = %w.id, error = %e, "cannot report a work item yet");
            } else {
                tracing::info!(work = %w.id, kind = %w.kind, %state, detail = detail.as_deref().unwrap_or(""), "work item");
            }
        }
        waits
    }

    async fn act(&mut self, w: &Work) -> Result<String, Refusal> {
        match w.kind {
            WorkKind::Stop => Ok(self.stop(&w.task_id).await),
            WorkKind::Start | WorkKind::Resume => {
                let (name, dir, mut child) = self.spawn(w)?;
                self.state.remember_dir(&w.task_id, &dir);
                let pid = child.id().unwrap_or(0);
                let start_ticks = process_start(pid).unwrap_or(0);
                self.state
                    .runs
                    .insert(w.task_id.clone(), RunRecord { pid, start_ticks });
                self.live
                    .insert(w.task_id.clone(), Live { pid, child: true });
                let tx = self.exits.0.clone();
                let task = w.task_id.clone();
                tokio::spawn(async move {
                    let how = match child.wait().await {
                        Ok(status) => {
                            use std::os::unix::process::ExitStatusExt;
                            RunExited {
                                code: status.code(),
                                signal: status.signal(),
                                detail: None,
                                tree: None,
                            }
                        }
                        Err(e) => RunExited {
                            code: None,
                            signal: None,
                            detail: Some(format!("cannot wait for it: {e}")),
                            tree: None,
                        },
                    };
                    let _ = tx.send((task, how));
                });
                let what = match (&w.kind, &w.resume) {
                    (WorkKind::Start, _) => "started".to_owned(),
                    (_, Some(r)) => format!("resumed ({})", r.reason),
                    _ => "resumed".to_owned(),
                };
                Ok(format!("{name} {what} in {} (pid {pid})", dir.display()))
            }
        }
    }

    /// Starts or resumes the runtime a work item names, in a directory its owner allowed here:
    /// the runtime's name for people, the directory (resolved), and its process.
    fn spawn(&self, w: &Work) -> Result<(&'static str, PathBuf, tokio::process::Child), Refusal> {
        let dir = || check_directory(&w.run.directory, &self.allowed).map_err(Refusal::NotAllowed);
        match w.run.runtime.as_str() {
            "claude-code" => {
                let Some(claude) = &self.claude else {
                    return Err(Refusal::NotAllowed(
                        "Claude Code is not installed on this machine (no `claude` on the runner's PATH; `--claude PATH`)".into(),
                    ));
                };
                let dir = dir()?;
                let spawn = claude::Spawn {
                    server: &self.conn.server,
                    token: &self.conn.token,
                    server_fp: self.server_fp.as_deref(),
                    state_dir: &self.state_dir,
                    mark: &self.mark,
                    approval_timeout: self.approval_timeout,
                };
                let child = spawn
                    .start(claude, w, &dir)
                    .map_err(|e| Refusal::Failed(format!("Claude Code did not start: {e}")))?;
                Ok(("Claude Code", dir, child))
            }
            waymark_adapters::codex::RUNTIME => {
                let Some(codex) = &self.codex else {
                    return Err(Refusal::NotAllowed(
                        "Codex is not installed on this machine (no `codex` on the runner's PATH; `--codex PATH`)".into(),
                    ));
                };
                let dir = dir()?;
                let (args, text) = codex::adapter_args(codex, w, &dir, &self.state_dir)
                    .map_err(|e| Refusal::Failed(format!("Codex did not start: {e}")))?;
                let child = self
                    .adapter(w, args, text, &dir, Vec::new())
                    .map_err(|e| Refusal::Failed(format!("Codex did not start: {e}")))?;
                Ok(("Codex", dir, child))
            }
            "openclaw" => {
                let Some(oc) = &self.openclaw else {
                    return Err(Refusal::NotAllowed(
                        "OpenClaw is not offered on this machine (its runner names no gateway: `--openclaw-gateway ws://…`)".into(),
                    ));
                };
                let dir = dir()?;
                let (args, text, env) = openclaw::adapter_args(oc, w, &dir, &self.state_dir);
                let child = self
                    .adapter(w, args, text, &dir, env)
                    .map_err(|e| Refusal::Failed(format!("OpenClaw did not start: {e}")))?;
                Ok(("OpenClaw", dir, child))
            }
            runtime if acp::Kind::of(runtime).is_some() => {
                let kind = acp::Kind::of(runtime).unwrap_or(acp::Kind::Gemini);
                let Some(agent) = self.acp.iter().find(|a| a.runtime == runtime) else {
                    return Err(Refusal::NotAllowed(format!(
                        "{} is not installed on this machine (no `{}` on the runner's PATH; `--{} PATH`)",
                        kind.name(),
                        kind.command(),
                        kind.command()
                    )));
                };
                let dir = dir()?;
                let failed =
                    |e: String| Refusal::Failed(format!("{} did not start: {e}", agent.name));
                let (args, text) =
                    acp::adapter_args(agent, w, &dir, &self.state_dir).map_err(failed)?;
                let env =
                    acp::extra_env(agent, &self.state_dir).map_err(|e| failed(e.to_string()))?;
                let child = self.adapter(w, args, text, &dir, env).map_err(failed)?;
                Ok((agent.name, dir, child))
            }
            other => Err(Refusal::NotAllowed(format!(
                "this runner starts {}, not `{other}`",
                RUNNER_RUNTIMES.join(", ")
            ))),
        }
    }

    /// Starts this binary's adapter for a runtime it drives (Codex, ACP agents) in `dir`, with
    /// the machine's token, the turn's text on stdin (never on a command line another user can
    /// read), its output in the run's log, in a process group of its own: a stop ends the
    /// adapter and the runtime it started, and the runner's own end does not end the run.
    fn adapter(
        &self,
        w: &Work,
        args: Vec<std::ffi::OsString>,
        text: String,
        dir: &Path,
        env: Vec<(&'static str, std::ffi::OsString)>,
    ) -> Result<tokio::process::Child, String> {
        use tokio::io::AsyncWriteExt;
        let bin = crate::adapters::this_binary().map_err(|f| f.message)?;
        let log = run_log(&self.state_dir, &w.task_id).map_err(|e| e.to_string())?;
        let mut cmd = tokio::process::Command::new(bin);
        cmd.args(args)
            .current_dir(dir)
            .env("WAYMARK_TOKEN", &self.conn.token)
            .env("WAYMARK_SERVER", &self.conn.server)
            .envs(env)
            .env(RUN_MARK, &w.task_id)
            .env(RUNNER_MARK, &self.mark)
            .stdin(std::process::Stdio::piped())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .process_group(0);
        if let Some(fp) = &self.server_fp {
            cmd.env(waymark_worker::SERVER_FP_ENV, fp);
        }
        let mut child = cmd.spawn().map_err(|e| e.to_string())?;
        if let Some(mut stdin) = child.stdin.take() {
            tokio::spawn(async move {
                let _ = stdin.write_all(text.as_bytes()).await;
                let _ = stdin.shutdown().await;
            });
        }
        Ok(child)
    }

    /// Ends a run's process tree: `SIGTERM` to its group, `SIGKILL` after a grace.
    async fn stop(&mut self, task: &str) -> String {
        let Some(l) = self.live.get(task) else {
            return "no process was running for it".into();
        };
        let group = format!("-{}", l.pid);
        let _ = tokio::process::Command::new("kill")
            .args(["-TERM", "--", &group])
            .status()
            .await;
        for _ in 0..100 {
            if process_start(l.pid).is_none() {
                let n = end_leftovers(task, &self.mark).await;
                return if n > 0 {
                    format!(
                        "ended its process (pid {}) and {n} it had started outside it",
                        l.pid
                    )
                } else {
                    format!("ended its process (pid {})", l.pid)
                };
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = tokio::process::Command::new("kill")
            .args(["-KILL", "--", &group])
            .status()
            .await;
        let _ = end_leftovers(task, &self.mark).await;
        format!("killed its process (pid {}) after a 10 s grace", l.pid)
    }
}

enum Refusal {
    /// Outside what the owner allowed here.
    NotAllowed(String),
    /// Allowed, and it did not work.
    Failed(String),
}

/// `name` in a directory of the PATH, if one has it.
fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// `s` as one word of a command line split like a shell would (the adapters' `--agent-cmd`
/// and `--app-server-cmd`): quoted when it needs to be.
fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+:@%=,".contains(c))
    {
        return s.to_owned();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The runtime's own id (a Codex thread, an ACP session) an adapter recorded in `path` for a
/// later resume: one word, or nothing.
fn recorded_id(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let id = text.trim();
    (!id.is_empty() && !id.contains(char::is_whitespace)).then(|| id.to_owned())
}

/// A runtime's version from its `--version` (`None`: it does not run).
async fn version_of(bin: &Path) -> Option<Option<String>> {
    let out = tokio::process::Command::new(bin)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .ok()?;
    Some(version_in(&String::from_utf8_lossy(&out.stdout)))
}

/// The first word that starts with a digit (or `v` and a digit), without the `v` and a
/// sentence's full stop: `2.1.328 (Claude Code)`, `codex-cli 0.169.0`, `GitHub Copilot CLI
/// 1.0.102.`, `Hermes Agent v0.19.0 (2026.7.20)`.
fn version_in(text: &str) -> Option<String> {
    text.split_whitespace()
        .map(|w| {
            w.strip_prefix('v')
                .filter(|r| r.starts_with(|c: char| c.is_ascii_digit()))
                .unwrap_or(w)
        })
        .find(|w| w.starts_with(|c: char| c.is_ascii_digit()))
        .map(|w| w.trim_end_matches(['.', ',']).to_owned())
}

/// A run's log, `<state dir>/logs/<task>.log`, appended to by every start and resume.
fn run_log(state_dir: &Path, task: &str) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(state_dir.join("logs").join(format!("{task}.log")))
}

/// The runner's files hold its runs' settings and logs: its owner's only.
fn private_dir(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
}

#[cfg(test)]
mod tests {
    use super::*;
    use waymark_proto::{ResumeSpec, RunSpec, WorkState};

    /// A work item of `runtime`'s, for the runtimes' argument tests: a start, or a resume with
    /// `message`.
    pub(crate) fn work_item(runtime: &str, kind: WorkKind, message: Option<&str>) -> Work {
        Work {
            id: "wrk_1".into(),
            task_id: "task_1".into(),
            kind,
            state: WorkState::Pending,
            run: RunSpec {
                runtime: runtime.into(),
                directory: "/src/app".into(),
                prompt: "make the test pass".into(),
                session_key: "0190-key".into(),
                gate: None,
                runtime_version: None,
                plan: false,
            },
            resume: (kind == WorkKind::Resume).then(|| ResumeSpec {
                reason: "revive".into(),
                message: message.map(str::to_owned),
            }),
            created_at: chrono::Utc::now(),
            detail: None,
        }
    }

    #[test]
    fn only_directories_under_an_allowed_one_are_used_wherever_a_link_leads() {
        let root = tempfile::tempdir().unwrap();
        let allowed = root.path().join("src");
        let outside = root.path().join("secrets");
        std::fs::create_dir_all(allowed.join("app")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, allowed.join("link")).unwrap();
        let allow = allowed_dirs(std::slice::from_ref(&allowed)).unwrap();
        let ok = check_directory(allowed.join("app").to_str().unwrap(), &allow).unwrap();
        assert!(ok.ends_with("src/app"));
        for bad in [
            outside.to_str().unwrap().to_owned(),
            format!("{}/app/../../secrets", allowed.display()),
            allowed.join("link").to_str().unwrap().to_owned(),
            allowed.join("missing").to_str().unwrap().to_owned(),
            "relative/dir".to_owned(),
        ] {
            let err = check_directory(&bad, &allow).unwrap_err();
            assert!(!err.is_empty(), "{bad} must be refused");
        }
        assert_eq!(
            allowed_dirs(&[]).err().map(|f| f.code),
            Some("nothing_allowed")
        );
    }

    #[test]
    fn a_binary_path_is_one_word_of_a_command_line() {
        assert_eq!(shell_word("/usr/bin/codex"), "/usr/bin/codex");
        assert_eq!(shell_word("/opt/a b/codex"), "'/opt/a b/codex'");
        assert_eq!(shell_word("/opt/it's/codex"), r"'/opt/it'\''s/codex'");
    }

    #[test]
    fn a_runtime_version_is_the_first_word_with_a_digit() {
        assert_eq!(
            version_in("2.1.328 (Claude Code)\n").as_deref(),
            Some("2.1.328")
        );
        assert_eq!(
            version_in("codex-cli 0.169.0\n").as_deref(),
            Some("0.169.0")
        );
        assert_eq!(
            version_in("GitHub Copilot CLI 1.0.102.\n").as_deref(),
            Some("1.0.102")
        );
        assert_eq!(
            version_in("Hermes Agent v0.19.0 (2026.7.20)\n").as_deref(),
            Some("0.19.0")
        );
        assert_eq!(version_in("opencode 1.18.33").as_deref(), Some("1.18.33"));
        assert_eq!(version_in("no version here, vim"), None);
    }

    #[tokio::test]
    async fn what_a_run_started_outside_its_group_is_ended_with_it_and_nothing_else() {
        let sleep = |task: &str, runner: &str, setsid: bool| {
            let mut cmd = std::process::Command::new(if setsid { "setsid" } else { "sleep" });
            if setsid {
                cmd.arg("sleep");
            }
            cmd.arg("60")
                .env(RUN_MARK, task)
                .env(RUNNER_MARK, runner)
                .spawn()
                .unwrap()
        };
        // A command its agent started in a session of its own, as Hermes Agent does.
        let mut theirs = sleep("task_left_behind", "/state/mine", true);
        let mut other = sleep("task_still_running", "/state/mine", false);
        // The same task's id under another runner (another control plane's, another suite's).
        let mut elsewhere = sleep("task_left_behind", "/state/another", false);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while marks_of(theirs.id()).is_none() {
            assert!(
                std::time::Instant::now() < deadline,
                "setsid never ran sleep"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(end_leftovers("task_left_behind", "/state/mine").await, 1);
        let status = theirs.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9), "{status:?}");
        assert!(
            other.try_wait().unwrap().is_none(),
            "another run's process lives on"
        );
        assert!(
            elsewhere.try_wait().unwrap().is_none(),
            "another runner's process lives on"
        );
        assert_eq!(end_leftovers("task_left_behind", "/state/mine").await, 0);
        for mut c in [other, elsewhere] {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    #[test]
    fn a_process_start_time_tells_a_live_process_from_a_reused_pid() {
        let me = std::process::id();
        let t = process_start(me).expect("this process is alive");
        assert_eq!(
            process_start(me),
            Some(t),
            "the same process, the same start"
        );
        assert!(process_start(u32::MAX - 1).is_none());
    }

    #[test]
    fn a_marked_process_group_leader_is_found_by_its_task_and_only_by_its_runner() {
        use std::os::unix::process::CommandExt;
        let leader = |runner: &str| {
            std::process::Command::new("sleep")
                .arg("30")
                .env(RUN_MARK, "task_marked")
                .env(RUNNER_MARK, runner)
                .process_group(0)
                .spawn()
                .unwrap()
        };
        let mut child = leader("/state/mine");
        let mut theirs = leader("/state/another");
        let found = marked_runs("/state/mine");
        for c in [&mut child, &mut theirs] {
            let _ = c.kill();
            let _ = c.wait();
        }
        assert!(
            found.iter().all(|(_, r)| r.pid != theirs.id()),
            "another runner's run is not taken up"
        );
        let (task, r) = found
            .into_iter()
            .find(|(_, r)| r.pid == child.id())
            .expect("the marked process is found");
        assert_eq!(task, "task_marked");
        assert!(r.start_ticks > 0);
        assert!(
            marked_runs("/state/mine")
                .iter()
                .all(|(_, r)| r.pid != child.id()),
            "a process that ended is not found"
        );
    }

    #[test]
    fn the_state_keeps_the_newest_done_items_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let mut s = State::default();
        let acted = |i: usize| Acted {
            work: format!("wrk_{i}"),
            state: WorkState::Refused,
            detail: Some("outside".into()),
        };
        for i in 0..(DONE_KEPT + 5) {
            s.acted(acted(i));
        }
        s.acted(acted(7));
        s.save(&path).unwrap();
        let back = State::load(&path);
        assert_eq!(back.done.len(), DONE_KEPT);
        assert_eq!(
            back.done.front(),
            Some(&acted(5)),
            "what was reported is kept"
        );
        assert!(
            State::load(&dir.path().join("missing.json"))
                .runs
                .is_empty()
        );
    }
}
