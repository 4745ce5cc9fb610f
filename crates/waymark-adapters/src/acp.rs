//! The ACP adapter: runs an Agent Client Protocol agent (Zed's JSON-RPC over stdio) as a child
//! process and is its client, so one ACP session becomes one task whose tool calls are effects
//! and whose permission requests are approvals answered from the inbox (`docs/adapters/acp.md`).
//! Hermes Agent's live control is this adapter with runtime `hermes`.
//!
//! ACP holds a permission request only while the connection lives, and says nothing when it has
//! taken an answer: the answer counts once the agent next speaks of that tool call (or the turn
//! ends), and an agent that exits first leaves its open approvals expired, never approved.
//!
//! What must hold for every tool call a permission request asked about: it is linked to that
//! request (agents differ in whether the request carries the call's own id: Hermes asks under
//! `perm-check-N` about the `tc-…` it announced just before, Gemini CLI under the id it uses
//! later), and unless the answer allowed it, its effect is closed as not run (`failed`) —
//! never left `intended`, nor `confirmed` by an agent that "completes" a refused call. An agent
//! that ends a call whose approval is still open has stopped waiting (Hermes' fixed 60 s): the
//! approval closes expired then, never to show open after the agent decided.

mod agent;
mod options;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;
use waymark_proto::{
    ApprovalDurability, AskedRuntimeDeadline, CheckpointBody, Decision, DecisionKind,
    DecisionStatus, EffectRef, EffectStatus, FinishOutcome, NewMessage, RuntimeFallback,
};
use waymark_worker::tree::TreeRecorder;
use waymark_worker::{
    Client, ControlState, EffectCtx, EffectDone, ProviderError, ProviderStatus, Reconciler, Run,
    chosen_option,
};

use self::agent::Agent;
use self::options::Answer;
use crate::bridge::{self, SessionSpec};
use crate::jsonrpc::{Incoming, Peer, RequestId, RpcError};

/// The ACP protocol version this client speaks.
const PROTOCOL_VERSION: i64 = 1;
/// How long the agent may take to answer `initialize` and `session/new`.
const HANDSHAKE: Duration = Duration::from_secs(60);
/// How long the agent may take to end a turn after `session/cancel`.
const CANCEL_GRACE: Duration = Duration::from_secs(10);
/// How long a voided approval waits for the cancel or replan that voided it to arrive.
const VOID_GRACE: Duration = Duration::from_secs(2);
/// How long the effects of a turn may take to be recorded after it ends.
const EFFECT_SETTLE: Duration = Duration::from_secs(30);
/// How quiet the connection must be after `session/load` answered before the replayed
/// history counts as over, and the longest the replay may go on after the answer.
const REPLAY_QUIET: Duration = Duration::from_millis(300);
const REPLAY_MAX: Duration = Duration::from_secs(5);
/// Longest message text recorded (the control plane takes up to 1 MiB).
const MAX_TEXT: usize = 256 * 1024;
/// How long Hermes waits for an answer to a permission request before it denies on its own
/// (`acp_adapter/permissions.py`, `timeout=60.0`, fixed in 0.19: its config does not change it).
pub const HERMES_PERMISSION_WAIT: Duration = Duration::from_secs(60);

/// `waymark adapters acp`: run one prompt turn of an ACP agent under the control plane.
#[derive(Debug, Clone, clap::Args)]
pub struct AcpArgs {
    /// The agent's command line, run with `sh -c` (e.g. `hermes acp`, `gemini --acp`).
    #[arg(long)]
    pub agent_cmd: String,
    /// The session's working directory (default: the current one).
    #[arg(long)]
    pub cwd: Option<PathBuf>,
    /// What to ask the agent (with `--session`: the message of the new turn in the loaded
    /// session). `-` (in `waymark adapters acp`): read it from stdin.
    #[arg(long)]
    pub prompt: String,
    /// The runtime recorded on the task (`hermes` also maps Hermes' own permission options).
    #[arg(long, default_value = "acp")]
    pub runtime: String,
    /// The task's title (default: the prompt's first line).
    #[arg(long)]
    pub title: Option<String>,
    /// The worker name recorded on the attempt.
    #[arg(long, default_value = "waymark-acp")]
    pub worker: String,
    /// Seconds an approval stays open before its default (deny) applies (server default: an
    /// hour). For runtime `hermes` the approval also carries Hermes' own fixed wait of 60 s as
    /// its runtime deadline, which comes first unless this is shorter.
    #[arg(long)]
    pub approval_expires_in: Option<u64>,
    /// A run a runner started: its task, and the session to go on with.
    #[command(flatten)]
    pub bind: AcpBinding,
}

/// How a runner binds the adapter to the run it started: the task `start_run` made, a new
/// session whose id is kept on the machine (where the agent keeps the session), or that session
/// loaded again for a revive or a follow-up.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct AcpBinding {
    /// Mirror the session into this existing task (the one a runner's `start_run` made) instead
    /// of finding or creating one by the session's id. A turn that ends well then releases the
    /// attempt (the task stays open, so a follow-up or a revive goes on in the same session),
    /// and an agent that dies mid-turn leaves the attempt to the runner's report (recovery).
    #[arg(long, value_name = "TASK")]
    pub task: Option<String>,
    /// Load this session (`session/load`, where the agent offers `loadSession`) and prompt in
    /// it, instead of opening a new one.
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,
    /// Write a new session's id to this file as soon as the agent names it, before the first
    /// prompt (whole or not at all), so a later `--session` finds it.
    #[arg(long, value_name = "PATH")]
    pub session_file: Option<PathBuf>,
    /// Start the agent no earlier than this moment (RFC 3339; at most two minutes ahead). A
    /// runner sets it where the agent would otherwise damage the session it is to load (Gemini
    /// CLI, see `docs/runner.md`).
    #[arg(long, value_name = "TIME")]
    pub not_before: Option<chrono::DateTime<chrono::Utc>>,
}

/// Why the adapter could not run the session, or the session did not end well.
#[derive(Debug, thiserror::Error)]
pub enum AcpError {
    /// The agent could not be started.
    #[error("cannot start the agent `{command}`: {reason} — check `--agent-cmd`")]
    Spawn {
        /// The command line.
        command: String,
        /// Why.
        reason: String,
    },
    /// The working directory is unusable.
    #[error("the working directory `{path}` cannot be used: {reason} — check `--cwd`")]
    Cwd {
        /// The directory.
        path: String,
        /// Why.
        reason: String,
    },
    /// The agent refused or failed a step of the protocol.
    #[error("the agent failed `{step}`: {source}")]
    Agent {
        /// The method.
        step: &'static str,
        /// The JSON-RPC failure.
        #[source]
        source: RpcError,
    },
    /// The agent answered without what the protocol requires.
    #[error("the agent answered `{step}` without {what}")]
    Protocol {
        /// The method.
        step: &'static str,
        /// What was missing.
        what: &'static str,
    },
    /// The agent did not answer in time.
    #[error("the agent did not answer `{step}` within {seconds} s")]
    Timeout {
        /// The method.
        step: &'static str,
        /// The bound.
        seconds: u64,
    },
    /// The agent went away in the middle of the turn (recorded as a failed attempt).
    #[error("the agent exited before the turn ended: {0}")]
    AgentExited(String),
    /// The control plane refused or could not be reached.
    #[error("the control plane: {0}")]
    ControlPlane(#[from] waymark_worker::Error),
    /// The adapter was stopped before the session started.
    #[error("stopped before the session started")]
    Stopped,
    /// `--session` names a session the agent cannot load.
    #[error(
        "the agent does not offer `session/load` (no `loadSession` capability): session `{0}` cannot be taken up again"
    )]
    CannotLoad(String),
    /// `session/load` answered, but took up no session (nothing answered, nothing replayed).
    #[error(
        "the agent holds no session `{0}` (its `session/load` answered nothing and replayed nothing)"
    )]
    NoSuchSession(String),
    /// `--session-file` could not be written.
    #[error("cannot record the session's id in `{path}`: {reason}")]
    SessionFile {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
}

/// Runs one session: starts the agent, opens an ACP session (its id is the task's external
/// key), sends the prompt and mirrors the turn until the agent ends it, a person cancels, or
/// `shutdown` fires. A replan cancels the turn and prompts again with the new instructions.
/// Returns `Ok` once the end of a turn that the agent completed (or a person cancelled) is
/// recorded; an agent that exits or fails mid-turn is recorded as a failed attempt and
/// returned as an error.
pub async fn run(
    args: AcpArgs,
    client: Client,
    shutdown: CancellationToken,
) -> Result<(), AcpError> {
    let cwd = match &args.cwd {
        Some(p) => p.clone(),
        None => std::env::current_dir().map_err(|e| AcpError::Cwd {
            path: ".".into(),
            reason: e.to_string(),
        })?,
    };
    let cwd = std::fs::canonicalize(&cwd).map_err(|e| AcpError::Cwd {
        path: cwd.display().to_string(),
        reason: e.to_string(),
    })?;
    if let Some(at) = args.bind.not_before {
        let wait = (at - chrono::Utc::now())
            .to_std()
            .unwrap_or_default()
            .min(Duration::from_secs(120));
        if !wait.is_zero() {
            tracing::info!(
                seconds = wait.as_secs_f64(),
                "waiting before the agent starts (--not-before)"
            );
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = shutdown.cancelled() => return Err(AcpError::Stopped),
            }
        }
    }
    let (agent, peer, incoming) =
        Agent::spawn(&args.agent_cmd, &cwd).map_err(|e| AcpError::Spawn {
            command: args.agent_cmd.clone(),
            reason: e.to_string(),
        })?;
    let result = session(&args, client, shutdown, &cwd, peer, incoming).await;
    match agent.close().await {
        Some(status) => tracing::info!(%status, "the agent exited"),
        None => tracing::info!("the agent was killed"),
    }
    result
}

/// One request of the handshake, bounded in time and by `shutdown`.
async fn handshake(
    peer: &Peer,
    step: &'static str,
    params: Value,
    shutdown: &CancellationToken,
) -> Result<Value, AcpError> {
    tokio::select! {
        r = tokio::time::timeout(HANDSHAKE, peer.request(step, params)) => match r {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(source)) => Err(AcpError::Agent { step, source }),
            Err(_) => Err(AcpError::Timeout { step, seconds: HANDSHAKE.as_secs() }),
        },
        () = shutdown.cancelled() => Err(AcpError::Stopped),
    }
}

async fn session(
    args: &AcpArgs,
    client: Client,
    shutdown: CancellationToken,
    cwd: &std::path::Path,
    peer: Peer,
    incoming: mpsc::Receiver<Incoming>,
) -> Result<(), AcpError> {
    let init = handshake(
        &peer,
        "initialize",
        json!({
            "protocolVersion": PROTOCOL_VERSION,
            "clientCapabilities": {"fs": {"readTextFile": false, "writeTextFile": false}},
        }),
        &shutdown,
    )
    .await?;
    if let Some(v) = init.get("protocolVersion").and_then(Value::as_i64)
        && v != PROTOCOL_VERSION
    {
        tracing::warn!(
            agent = v,
            ours = PROTOCOL_VERSION,
            "the agent speaks another ACP version"
        );
    }
    let mut incoming = incoming;
    // A session taken up again, or — for a runner's run whose agent no longer has it — a new
    // one, saying why (the resume note that is the turn's text tells it what the record holds).
    let mut lost = None;
    let session_id = match &args.bind.session {
        Some(id) => {
            let loaded = if init["agentCapabilities"]["loadSession"].as_bool() != Some(true) {
                Err(AcpError::CannotLoad(id.clone()))
            } else {
                load(&peer, &mut incoming, id, cwd, &shutdown).await
            };
            match loaded {
                Ok(replayed) => {
                    tracing::info!(session = %id, replayed, "ACP session loaded");
                    id.clone()
                }
                Err(AcpError::Stopped) => return Err(AcpError::Stopped),
                Err(e) if args.bind.task.is_some() => {
                    tracing::warn!(session = %id, error = %e, "the session cannot be loaded; a new one takes over");
                    lost = Some(format!(
                        "{} could not take up its session `{id}` again ({e}): the run goes on in a new session, told what the record holds",
                        args.runtime
                    ));
                    new_session(args, &peer, cwd, &shutdown).await?
                }
                Err(e) => return Err(e),
            }
        }
        None => new_session(args, &peer, cwd, &shutdown).await?,
    };
    let title = args
        .title
        .clone()
        .unwrap_or_else(|| default_title(&args.prompt, &args.runtime));
    let spec = SessionSpec {
        runtime: args.runtime.clone(),
        key: session_id.clone(),
        title: clip(&title, 200),
        goal: clip(&args.prompt, 20_000),
    };
    let run = match &args.bind.task {
        // A runner's run: the attempt a killed adapter held was revoked by the runner's report
        // of its end; a follow-up finds it released.
        Some(task) => bridge::start(&client, task, &args.worker, Duration::from_secs(60)).await?,
        None => bridge::attach(&client, &spec, &args.worker, Duration::from_secs(5)).await?,
    };
    if args.bind.task.is_some() {
        expire_earlier_approvals(&client, &run).await;
    }
    tracing::info!(session = %session_id, task = %run.task_id(), attempt = %run.attempt().id, "ACP session attached");
    // A runner's run records its working tree as it goes (from the start, then after each
    // call that changed it), for the admission of a revive.
    let tree = args
        .bind
        .task
        .is_some()
        .then(|| Arc::new(TreeRecorder::new(cwd.to_path_buf())));
    if let Some(t) = &tree {
        t.after_call(&run).await;
    }
    let (decided_tx, decided_rx) = mpsc::channel(64);
    let mut s = Session {
        peer,
        run: Arc::new(run),
        tree,
        session_id,
        runtime: args.runtime.clone(),
        bound: args.bind.task.is_some(),
        expires_in: args.approval_expires_in.map(Duration::from_secs),
        started: tokio::time::Instant::now(),
        buffer: None,
        tools: HashMap::new(),
        tool_seq: 0,
        effects: JoinSet::new(),
        pending: HashMap::new(),
        answered: HashMap::new(),
        decided_tx,
        decided_rx,
    };
    if let Some(why) = lost {
        s.record(vec![NewMessage {
            role: "system".into(),
            text: why,
        }])
        .await;
    }
    s.drive(incoming, args.prompt.clone(), shutdown).await
}

/// Why an approval an earlier adapter left pending expires when its session is taken up again.
const EARLIER_CONNECTION: &str = "the agent connection that asked is gone (its adapter ended \
     without answering); the agent asks again if it still wants to";

/// `session/new` in `cwd`; its id is written to `--session-file` before the first prompt.
async fn new_session(
    args: &AcpArgs,
    peer: &Peer,
    cwd: &std::path::Path,
    shutdown: &CancellationToken,
) -> Result<String, AcpError> {
    let new = handshake(
        peer,
        "session/new",
        json!({"cwd": cwd.display().to_string(), "mcpServers": []}),
        shutdown,
    )
    .await?;
    let id = new
        .get("sessionId")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty() && !s.contains(char::is_whitespace))
        .ok_or(AcpError::Protocol {
            step: "session/new",
            what: "a `sessionId`",
        })?
        .to_owned();
    if let Some(path) = &args.bind.session_file {
        write_session_file(path, &id).map_err(|e| AcpError::SessionFile {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
    }
    Ok(id)
}

/// `session/load`: the agent replays the session's history as `session/update` notifications
/// before it answers. That history is already in the record (or was lost with a killed
/// adapter, and the resume note says what counts): it is read and dropped, never mirrored again,
/// and read while the load runs so a long history cannot fill the connection's queue. Returns
/// how many notifications were replayed.
async fn load(
    peer: &Peer,
    incoming: &mut mpsc::Receiver<Incoming>,
    session_id: &str,
    cwd: &std::path::Path,
    shutdown: &CancellationToken,
) -> Result<u64, AcpError> {
    let params =
        json!({"sessionId": session_id, "cwd": cwd.display().to_string(), "mcpServers": []});
    let request = handshake(peer, "session/load", params, shutdown);
    tokio::pin!(request);
    let mut replayed = 0u64;
    loop {
        tokio::select! {
            r = &mut request => {
                let answer = r?;
                // ACP asks for the history before the answer, but Gemini CLI 0.61 streams it
                // without waiting (`session.streamHistory(...)` is not awaited before it
                // answers), so its replay goes on around and after the answer: what comes
                // until the connection has been quiet a moment belongs to it too.
                let until = tokio::time::Instant::now() + REPLAY_MAX;
                while let Ok(Some(m)) =
                    tokio::time::timeout_at(until.min(tokio::time::Instant::now() + REPLAY_QUIET), incoming.recv()).await
                {
                    replayed += drop_replayed(peer, m).await;
                }
                if !holds_session(&answer, replayed) {
                    return Err(AcpError::NoSuchSession(session_id.to_owned()));
                }
                return Ok(replayed);
            }
            Some(m) = incoming.recv() => replayed += drop_replayed(peer, m).await,
        }
    }
}

/// Whether a load's answer took up a session: an agent that holds none may still answer with
/// success — Hermes 0.19 answers `{}` for an id it does not know, then refuses every prompt —
/// so an empty answer with nothing replayed is no session. (A session it holds answers with
/// its modes and models, and replays at least the prompt it began with.)
fn holds_session(answer: &Value, replayed: u64) -> bool {
    replayed > 0 || !answer.as_object().is_some_and(Map::is_empty)
}

/// One message that came during `session/load`: a notification is history (counted); a request
/// is refused (a permission asked during a replay belongs to no turn of ours).
async fn drop_replayed(peer: &Peer, m: Incoming) -> u64 {
    match m {
        Incoming::Notification { .. } => 1,
        Incoming::Request { id, method, .. } => {
            let answer = if method == "session/request_permission" {
                peer.respond(&id, cancelled()).await
            } else {
                peer.respond_error(
                    &id,
                    -32601,
                    &format!("`{method}` is not offered while a session loads"),
                )
                .await
            };
            if let Err(e) = answer {
                tracing::debug!(error = %e, "answering a request during the load");
            }
            0
        }
    }
}

/// An ACP agent holds a permission request only while its connection lives: what an earlier
/// adapter of this task left pending (it was killed) nobody can answer any more. Expired, never
/// approved; the agent asks again if it still wants the call.
async fn expire_earlier_approvals(client: &Client, run: &Run) {
    let detail = match client.task(run.task_id()).await {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the task's earlier approvals");
            return;
        }
    };
    for d in detail.decisions.iter().filter(|d| {
        d.kind == DecisionKind::Approval
            && d.status == DecisionStatus::Pending
            && d.durability == Some(ApprovalDurability::ConnectionBound)
    }) {
        match run.expire_decision(&d.id, EARLIER_CONNECTION).await {
            Ok(_) => {
                tracing::info!(decision = %d.id, "expired an approval an earlier connection held")
            }
            Err(e) => {
                tracing::warn!(decision = %d.id, error = %e, "cannot expire an approval an earlier connection held")
            }
        }
    }
}

/// Records a new session's id for a later `--session`: written whole or not at all (a
/// temporary file renamed over it), so a kill mid-write never leaves half an id.
fn write_session_file(path: &std::path::Path, id: &str) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, format!("{id}\n"))?;
    std::fs::rename(tmp, path)
}

impl Session {
    /// The deadline the agent enforces itself: Hermes denies after its fixed wait. Other ACP
    /// agents keep a request open as long as the connection lives.
    fn runtime_deadline(&self) -> Option<AskedRuntimeDeadline> {
        (self.runtime == "hermes").then(|| AskedRuntimeDeadline {
            runtime: "Hermes".into(),
            in_seconds: HERMES_PERMISSION_WAIT.as_secs(),
            then: RuntimeFallback::Denies,
        })
    }
}

fn default_title(prompt: &str, runtime: &str) -> String {
    let line = prompt.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    let line = line.trim();
    if line.is_empty() {
        return format!("{runtime} session");
    }
    let mut t: String = line.chars().take(80).collect();
    if line.chars().count() > 80 {
        t.push('…');
    }
    t
}

fn clip(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}\n[… clipped from {} bytes]", &text[..end], text.len())
}

/// An approval waiting for a person.
#[derive(Debug)]
struct Pending {
    rpc_id: RequestId,
    /// The tool call it is for: the request's own `toolCallId`, or the pending tool call the
    /// agent announced just before (Hermes asks under `perm-check-N`, not the tool call's id).
    tool_call_id: Option<String>,
    /// The request's `toolCall`, for an effect when the call never ran.
    tool_call: Value,
    answers: HashMap<String, Answer>,
    waiter: JoinHandle<()>,
}

/// An answer written to the agent that it has not yet shown it took.
#[derive(Debug)]
struct Answered {
    rpc_id: RequestId,
    tool_call_id: Option<String>,
}

/// How a tool call ended, as the agent reported it.
#[derive(Debug, Clone)]
enum ToolEnd {
    Completed(Value),
    Failed(String),
    Unknown(String),
}

/// A tool call of the turn: what the agent said of it so far, and once it left `pending`, the
/// channel its effect waits on.
#[derive(Debug, Default)]
struct Tool {
    fields: Map<String, Value>,
    end: Option<watch::Sender<Option<ToolEnd>>>,
    /// The order the agent announced it in (a permission request is linked to the newest).
    seq: u64,
    /// The approval that asked for it.
    approval: Option<String>,
}

/// A past tool call cannot be asked about: ACP has no such request.
struct NotAskable;

impl Reconciler for NotAskable {
    async fn query(&self, _ctx: &EffectCtx) -> ProviderStatus {
        ProviderStatus::Unknown {
            reason: "an ACP agent cannot be asked about a tool call of an earlier connection"
                .into(),
        }
    }
}

/// Why a turn was interrupted from our side.
#[derive(Debug, Clone, PartialEq)]
enum Interrupt {
    Replan(String),
    Cancelled,
    Lost,
    Shutdown,
}

type Decided = (String, waymark_worker::Result<Decision>);

struct Session {
    peer: Peer,
    run: Arc<Run>,
    session_id: String,
    runtime: String,
    /// A runner's run (`--task`): a turn that ends well releases the attempt, and an agent
    /// that dies leaves the attempt for the runner's report to recover.
    bound: bool,
    expires_in: Option<Duration>,
    /// When the session started (the turn's wall time is reported with its usage).
    started: tokio::time::Instant,
    /// Message chunks not yet recorded: (role, text).
    buffer: Option<(String, String)>,
    tools: HashMap<String, Tool>,
    /// How many tool calls the session announced (`Tool::seq`).
    tool_seq: u64,
    effects: JoinSet<Option<EffectRef>>,
    /// A runner's run: records the working tree after each call.
    tree: Option<Arc<TreeRecorder>>,
    /// By decision id.
    pending: HashMap<String, Pending>,
    /// By decision id.
    answered: HashMap<String, Answered>,
    decided_tx: mpsc::Sender<Decided>,
    decided_rx: mpsc::Receiver<Decided>,
}

impl Session {
    async fn drive(
        &mut self,
        mut incoming: mpsc::Receiver<Incoming>,
        first_prompt: String,
        shutdown: CancellationToken,
    ) -> Result<(), AcpError> {
        let mut control = self.run.control();
        let mut seen_revision = self.run.plan_revision();
        let lost = self.run.cancelled();
        let mut closed = false;
        let mut text = first_prompt;
        loop {
            self.record(vec![NewMessage {
                role: "user".into(),
                text: clip(&text, MAX_TEXT),
            }])
            .await;
            let peer = self.peer.clone();
            let params = json!({
                "sessionId": self.session_id,
                "prompt": [{"type": "text", "text": text}],
            });
            let prompt = async move { peer.request("session/prompt", params).await };
            tokio::pin!(prompt);
            let grace = tokio::time::sleep(Duration::from_secs(86_400 * 365));
            tokio::pin!(grace);
            let mut interrupt: Option<Interrupt> = None;
            let mut overdue = false;
            let answer = loop {
                tokio::select! {
                    biased;
                    msg = incoming.recv(), if !closed => match msg {
                        Some(m) => self.on_incoming(m).await,
                        None => closed = true,
                    },
                    Some((id, d)) = self.decided_rx.recv() => self.on_decided(&id, d).await,
                    r = &mut prompt => break r,
                    Ok(()) = control.changed(), if interrupt.is_none() => {
                        let state = control.borrow_and_update().clone();
                        if state.cancelled {
                            interrupt = Some(Interrupt::Cancelled);
                        } else if state.plan_revision > seen_revision {
                            seen_revision = state.plan_revision;
                            match state.instructions.filter(|i| !i.trim().is_empty()) {
                                Some(i) => interrupt = Some(Interrupt::Replan(i)),
                                None => tracing::info!(
                                    revision = seen_revision,
                                    "a replan without instructions; the turn goes on"
                                ),
                            }
                        }
                        if let Some(why) = &interrupt {
                            self.interrupt_turn(why).await;
                            grace.as_mut().reset(tokio::time::Instant::now() + CANCEL_GRACE);
                        }
                    }
                    () = lost.cancelled(), if interrupt.is_none() => {
                        let why = if control.borrow().cancelled { Interrupt::Cancelled } else { Interrupt::Lost };
                        self.interrupt_turn(&why).await;
                        interrupt = Some(why);
                        grace.as_mut().reset(tokio::time::Instant::now() + CANCEL_GRACE);
                    }
                    () = shutdown.cancelled(), if interrupt.is_none() => {
                        self.interrupt_turn(&Interrupt::Shutdown).await;
                        interrupt = Some(Interrupt::Shutdown);
                        grace.as_mut().reset(tokio::time::Instant::now() + CANCEL_GRACE);
                    }
                    () = &mut grace, if interrupt.is_some() => {
                        overdue = true;
                        break Err(RpcError::Closed("session/prompt".into()));
                    }
                }
            };
            // What the agent sent before its answer is already queued: take it first.
            while let Ok(m) = incoming.try_recv() {
                self.on_incoming(m).await;
            }
            while let Ok((id, d)) = self.decided_rx.try_recv() {
                self.on_decided(&id, d).await;
            }
            self.flush().await;
            match self.end_turn(answer, interrupt, overdue).await? {
                Some(next) => text = next,
                None => return Ok(()),
            }
        }
    }

    /// Records how the turn ended. Returns the next prompt when a replan asks for one.
    async fn end_turn(
        &mut self,
        answer: Result<Value, RpcError>,
        interrupt: Option<Interrupt>,
        overdue: bool,
    ) -> Result<Option<String>, AcpError> {
        let gone = match &answer {
            Err(RpcError::Closed(_) | RpcError::Io(_)) => Some(if overdue {
                format!(
                    "the agent did not end the turn within {} s of `session/cancel`",
                    CANCEL_GRACE.as_secs()
                )
            } else {
                "the agent process exited".to_owned()
            }),
            _ => None,
        };
        if let Some(why) = &gone {
            self.connection_lost(why).await;
        }
        // A runner's run cut off (its agent died, or the adapter is being stopped with the
        // machine): the calls still open stay in progress and the attempt stays as it is, for
        // the runner's report of the end — the control plane revokes the attempt, gives each
        // open call a recovery card and resumes the session. Recorded here as `unknown`, a
        // call would escape its card.
        let cut_off = gone.clone().or_else(|| {
            matches!(interrupt, Some(Interrupt::Shutdown))
                .then(|| "the adapter was stopped mid-turn".to_owned())
        });
        if self.bound
            && let Some(why) = cut_off
        {
            self.flush().await;
            // What is known is recorded (calls closed as not run, calls that ended); the calls
            // in doubt — open, their end never said — stay as they are, for their cards.
            let in_doubt = self
                .tools
                .values()
                .filter(|t| t.end.as_ref().is_some_and(|tx| tx.borrow().is_none()))
                .count();
            let deadline = tokio::time::Instant::now() + EFFECT_SETTLE;
            while self.effects.len() > in_doubt {
                match tokio::time::timeout_at(deadline, self.effects.join_next()).await {
                    Ok(Some(_)) => {}
                    _ => break,
                }
            }
            self.effects.abort_all();
            tracing::warn!(%why, in_doubt, "the run is left to its runner's report");
            return Err(AcpError::AgentExited(why));
        }
        if gone.is_none() {
            self.acknowledge_all("the prompt turn ended after the answer")
                .await;
            // A request still open when the turn ended is moot for the agent.
            for (id, p) in std::mem::take(&mut self.pending) {
                p.waiter.abort();
                let _ = self.peer.respond(&p.rpc_id, cancelled()).await;
                let reason = "the agent ended its turn before an answer";
                self.not_run(p.tool_call_id.as_deref(), &p.tool_call, reason);
                if let Err(e) = self.run.expire_decision(&id, reason).await {
                    tracing::debug!(error = %e, decision = %id, "approval not expired");
                }
            }
        }
        let stop = answer
            .as_ref()
            .ok()
            .and_then(|v| v.get("stopReason"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        if let Ok(v) = &answer {
            self.report_usage(v).await;
        }
        let refs = self
            .settle_tools("the turn ended before the agent said how the tool call ended")
            .await;
        match interrupt {
            Some(Interrupt::Replan(instructions)) if gone.is_none() => {
                self.record(vec![NewMessage {
                    role: "system".into(),
                    text: format!(
                        "turn cancelled for a replan (plan revision {}); prompting the agent again with the new instructions",
                        self.run.plan_revision()
                    ),
                }])
                .await;
                self.checkpoint("replan", refs, "the turn was cancelled for a replan")
                    .await;
                if let Err(e) = self.run.wait_if_paused().await {
                    tracing::warn!(error = %e, "the attempt ended while paused");
                    return Ok(None);
                }
                Ok(Some(instructions))
            }
            Some(Interrupt::Lost) => {
                tracing::warn!(
                    "the attempt lost its lease or was fenced off; the agent is stopped"
                );
                Err(AcpError::ControlPlane(waymark_worker::Error::LeaseLost {
                    detail: "the attempt's lease was lost while the ACP turn ran".into(),
                }))
            }
            Some(Interrupt::Cancelled) => {
                // The cancel revoked the attempt: the finish is refused, and that is expected.
                if let Err(e) = self
                    .run
                    .finish(
                        FinishOutcome::Cancelled,
                        Some("cancelled by a person".into()),
                    )
                    .await
                {
                    tracing::debug!(error = %e, "finishing a cancelled attempt");
                }
                Ok(None)
            }
            Some(Interrupt::Shutdown) => {
                self.finish(
                    FinishOutcome::Failed,
                    "the adapter shut down mid-turn; an ACP session does not outlive its client"
                        .into(),
                )
                .await;
                Ok(None)
            }
            Some(Interrupt::Replan(_)) | None => {
                if let Some(why) = gone {
                    self.finish(
                        FinishOutcome::Failed,
                        format!("{why} before the turn ended"),
                    )
                    .await;
                    return Err(AcpError::AgentExited(why));
                }
                if let Err(source) = answer {
                    self.finish(
                        FinishOutcome::Failed,
                        format!("the agent failed the prompt: {source}"),
                    )
                    .await;
                    return Err(AcpError::Agent {
                        step: "session/prompt",
                        source,
                    });
                }
                self.checkpoint("turn_ended", refs, &format!("the turn ended with `{stop}`"))
                    .await;
                let (outcome, summary) = match outcome_of(&stop) {
                    // A Hermes session outlives the ACP connection (state.db keeps it open,
                    // `hermes --resume` goes on with it): the attempt is released, so the
                    // mirror of state.db can add to this same task what it sees later.
                    // A runner's run: the session stays with the agent, for a follow-up or
                    // a revive.
                    (FinishOutcome::Completed, summary) if self.bound => (
                        FinishOutcome::Released,
                        format!("{summary}; the session stays open for what comes next"),
                    ),
                    (FinishOutcome::Completed, summary) if self.runtime == "hermes" => (
                        FinishOutcome::Released,
                        format!("{summary}; Hermes keeps the session, which its mirror follows"),
                    ),
                    other => other,
                };
                self.finish(outcome, summary).await;
                Ok(None)
            }
        }
    }

    async fn on_incoming(&mut self, msg: Incoming) {
        match msg {
            Incoming::Notification { method, params } => match method.as_str() {
                "session/update" => self.on_update(&params).await,
                "$/cancel_request" => self.on_withdrawn(&params["requestId"]).await,
                _ => tracing::debug!(%method, "an agent notification this client ignores"),
            },
            Incoming::Request { id, method, params } => {
                if method == "session/request_permission" {
                    self.on_permission(id, params).await;
                } else {
                    let _ = self
                        .peer
                        .respond_error(
                            &id,
                            -32601,
                            &format!(
                                "`{method}` is not offered: this client has no file system or terminal capability"
                            ),
                        )
                        .await;
                }
            }
        }
    }

    async fn on_update(&mut self, params: &Value) {
        let u = &params["update"];
        match u.get("sessionUpdate").and_then(Value::as_str) {
            Some("agent_message_chunk") => self.chunk("assistant", &text_of(&u["content"])).await,
            Some("user_message_chunk") => self.chunk("user", &text_of(&u["content"])).await,
            Some("tool_call" | "tool_call_update") => {
                self.flush().await;
                self.on_tool(u).await;
            }
            Some("plan") => {
                self.flush().await;
                let mut text = String::from("plan:");
                for e in u["entries"]
                    .as_array()
                    .map(Vec::as_slice)
                    .unwrap_or_default()
                {
                    text.push_str(&format!(
                        "\n- [{}] {}",
                        e["status"].as_str().unwrap_or("pending"),
                        e["content"].as_str().unwrap_or("")
                    ));
                }
                self.record(vec![NewMessage {
                    role: "assistant".into(),
                    text: clip(&text, MAX_TEXT),
                }])
                .await;
            }
            other => {
                tracing::debug!(update = ?other, "a session update this client does not mirror")
            }
        }
    }

    /// Buffers a message chunk; a chunk of another role records what was buffered first.
    async fn chunk(&mut self, role: &str, text: &str) {
        if self.buffer.as_ref().is_some_and(|(r, _)| r != role) {
            self.flush().await;
        }
        self.buffer
            .get_or_insert_with(|| (role.to_owned(), String::new()))
            .1
            .push_str(text);
    }

    async fn flush(&mut self) {
        if let Some((role, text)) = self.buffer.take()
            && !text.trim().is_empty()
        {
            self.record(vec![NewMessage {
                role,
                text: clip(&text, MAX_TEXT),
            }])
            .await;
        }
    }

    async fn record(&self, messages: Vec<NewMessage>) {
        if let Err(e) = self.run.messages(messages).await {
            tracing::warn!(error = %e, "recording messages failed");
        }
    }

    async fn on_tool(&mut self, u: &Value) {
        let Some(id) = u.get("toolCallId").and_then(Value::as_str) else {
            tracing::warn!(update = %u, "a tool call without `toolCallId`; ignored");
            return;
        };
        // The agent speaking of this tool call after our answer is its acknowledgement.
        let kind = u["sessionUpdate"].as_str().unwrap_or("tool_call");
        self.acknowledge_tool(id, kind).await;
        let tool = match self.tools.entry(id.to_owned()) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                self.tool_seq += 1;
                e.insert(Tool {
                    seq: self.tool_seq,
                    ..Tool::default()
                })
            }
        };
        if let Some(fields) = u.as_object() {
            for (k, v) in fields {
                if k != "sessionUpdate" && !v.is_null() {
                    tool.fields.insert(k.clone(), v.clone());
                }
            }
        }
        let status = tool
            .fields
            .get("status")
            .and_then(Value::as_str)
            .unwrap_or("pending")
            .to_owned();
        if matches!(status.as_str(), "completed" | "failed")
            && let Some(decision) = tool.approval.clone()
            && self.pending.contains_key(&decision)
        {
            self.gave_up_waiting(&decision, id).await;
        }
        if self.tools.get(id).is_some_and(|t| t.end.is_none()) && status != "pending" {
            self.start_effect(id);
        }
        let Some(tool) = self.tools.get(id) else {
            return;
        };
        let end = match status.as_str() {
            "completed" => Some(ToolEnd::Completed(json!({
                "status": "completed",
                "content": tool.fields.get("content"),
                "rawOutput": tool.fields.get("rawOutput"),
            }))),
            "failed" => Some(ToolEnd::Failed(
                tool_text(&tool.fields)
                    .or_else(|| raw_output_text(&tool.fields))
                    .unwrap_or_else(|| "the agent reported it failed".into()),
            )),
            _ => None,
        };
        if let (Some(end), Some(tx)) = (end, &tool.end) {
            // The first end counts: a call closed as not run stays so, whatever the agent
            // reports of it afterwards (Hermes "completes" a denied call with its refusal).
            end_once(tx, end);
        }
    }

    /// The agent ended a tool call whose approval is still open: it stopped waiting and decided
    /// on its own (Hermes denies after its fixed 60 s and reports the call "completed" with
    /// its refusal). The approval closes as expired now, never to be answered into the void,
    /// and the call is closed as not run.
    async fn gave_up_waiting(&mut self, decision_id: &str, tool_call_id: &str) {
        let Some(p) = self.pending.remove(decision_id) else {
            return;
        };
        p.waiter.abort();
        let _ = self.peer.respond(&p.rpc_id, cancelled()).await;
        let reason = format!(
            "{} stopped waiting for the answer and decided on its own",
            self.runtime
        );
        tracing::info!(decision = decision_id, tool_call = tool_call_id, "{reason}");
        self.not_run(Some(tool_call_id), &p.tool_call, &reason);
        if let Err(e) = self.run.expire_decision(decision_id, &reason).await {
            tracing::debug!(error = %e, decision = %decision_id, "approval not expired");
        }
    }

    /// Declares the tool call's effect, which waits for the call's end.
    fn start_effect(&mut self, id: &str) {
        let Some(tool) = self.tools.get_mut(id) else {
            return;
        };
        if tool.end.is_some() {
            return;
        }
        let (tx, rx) = watch::channel(None);
        tool.end = Some(tx);
        let key = format!("{}:{id}", self.session_id);
        let effect_kind = format!(
            "tool_call:{}",
            tool.fields
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or("other")
        );
        let intent = json!({
            "toolCallId": id,
            "title": tool.fields.get("title"),
            "kind": tool.fields.get("kind"),
            "rawInput": tool.fields.get("rawInput"),
            "locations": tool.fields.get("locations"),
            "approval": tool.approval,
        });
        let run = self.run.clone();
        let tree = self.tree.clone();
        self.effects.spawn(async move {
            let res = run
                .effect(key.clone(), effect_kind, intent)
                .run(&NotAskable, move |_ctx| wait_for_end(rx))
                .await;
            if let Some(t) = tree {
                t.after_call(&run).await;
            }
            effect_ref(&key, res)
        });
    }

    /// The tool call a permission request is for: the one its `toolCallId` names, else the
    /// newest one the agent announced that is still `pending` and asked for by no other
    /// request (Hermes announces `tc-…`, then asks under `perm-check-N`).
    fn tool_asked_about(&self, asked: Option<&str>) -> Option<String> {
        if let Some(id) = asked
            && self.tools.contains_key(id)
        {
            return Some(id.to_owned());
        }
        let waiting = self
            .tools
            .iter()
            .filter(|(_, t)| t.end.is_none() && t.approval.is_none())
            .filter(|(_, t)| {
                t.fields
                    .get("status")
                    .and_then(Value::as_str)
                    .unwrap_or("pending")
                    == "pending"
            })
            .max_by_key(|(_, t)| t.seq)
            .map(|(id, _)| id.clone());
        waiting.or_else(|| asked.map(str::to_owned))
    }

    /// A tool call whose approval was denied, expired or withdrawn: its effect is closed as
    /// not run (`failed`, never left `intended`), declared from the request when the agent
    /// never announced the call (Gemini CLI sends nothing more of a rejected call).
    fn not_run(&mut self, id: Option<&str>, request: &Value, reason: &str) {
        let Some(id) = id else {
            return;
        };
        if !self.tools.contains_key(id) {
            self.tool_seq += 1;
            let mut fields = request.as_object().cloned().unwrap_or_default();
            fields.insert("toolCallId".into(), json!(id));
            self.tools.insert(
                id.to_owned(),
                Tool {
                    fields,
                    seq: self.tool_seq,
                    ..Tool::default()
                },
            );
        }
        self.start_effect(id);
        if let Some(tx) = self.tools.get(id).and_then(|t| t.end.as_ref()) {
            let end = ToolEnd::Failed(format!("not run: {reason}"));
            end_once(tx, end);
        }
    }

    /// Ends every tool call still open with `unknown`, waits for the effects to be recorded,
    /// and returns their statuses.
    async fn settle_tools(&mut self, reason: &str) -> Vec<EffectRef> {
        for (_, tool) in self.tools.drain() {
            if let Some(tx) = tool.end {
                tx.send_if_modified(|e| {
                    if e.is_none() {
                        *e = Some(ToolEnd::Unknown(reason.to_owned()));
                        true
                    } else {
                        false
                    }
                });
            }
        }
        let mut refs = Vec::new();
        let deadline = tokio::time::Instant::now() + EFFECT_SETTLE;
        loop {
            match tokio::time::timeout_at(deadline, self.effects.join_next()).await {
                Ok(Some(Ok(Some(r)))) => refs.push(r),
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(_) => {
                    tracing::warn!("effects still being recorded after the turn; left to finish");
                    break;
                }
            }
        }
        refs
    }

    async fn on_permission(&mut self, rpc_id: RequestId, params: Value) {
        let tool_call = &params["toolCall"];
        let asked = tool_call.get("toolCallId").and_then(Value::as_str);
        let tool_call_id = self.tool_asked_about(asked);
        let mapped = options::map(&params["options"], &self.runtime);
        let summary = permission_summary(&self.runtime, tool_call);
        let opened = bridge::open_approval(
            &self.run,
            params.clone(),
            &clip(&summary, 1900),
            ApprovalDurability::ConnectionBound,
            &mapped.choices,
            self.expires_in,
            self.runtime_deadline(),
        )
        .await;
        let decision = match opened {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "the approval could not be opened; the request is answered cancelled");
                let _ = self.peer.respond(&rpc_id, cancelled()).await;
                self.not_run(
                    tool_call_id.as_deref(),
                    tool_call,
                    "the approval could not be opened",
                );
                return;
            }
        };
        tracing::info!(decision = %decision.id, tool_call = ?tool_call_id, asked = ?asked, "permission request awaiting a person");
        if let Some(id) = &tool_call_id {
            match self.tools.get_mut(id) {
                Some(t) => t.approval = Some(decision.id.clone()),
                None => {
                    // Asked before announced (Gemini CLI): what the request says of the call
                    // is all there may ever be.
                    self.tool_seq += 1;
                    let mut fields = tool_call.as_object().cloned().unwrap_or_default();
                    fields.remove("status");
                    self.tools.insert(
                        id.clone(),
                        Tool {
                            fields,
                            seq: self.tool_seq,
                            approval: Some(decision.id.clone()),
                            ..Tool::default()
                        },
                    );
                }
            }
        }
        let tool_call = tool_call.clone();
        let run = self.run.clone();
        let tx = self.decided_tx.clone();
        let id = decision.id.clone();
        let waiter = tokio::spawn(async move {
            let r = run.await_decision(&id).await;
            let _ = tx.send((id, r)).await;
        });
        self.pending.insert(
            decision.id,
            Pending {
                rpc_id,
                tool_call_id,
                tool_call,
                answers: mapped.answers,
                waiter,
            },
        );
    }

    async fn on_decided(&mut self, decision_id: &str, result: waymark_worker::Result<Decision>) {
        let Some(p) = self.pending.remove(decision_id) else {
            return;
        };
        let d = match result {
            Ok(d) => d,
            Err(
                waymark_worker::Error::Cancelled
                | waymark_worker::Error::Fenced { .. }
                | waymark_worker::Error::LeaseLost { .. },
            ) => {
                // The run is ending: the interrupt answers it, after `session/cancel`.
                self.pending.insert(decision_id.to_owned(), p);
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, decision = decision_id, "waiting for the decision failed; the request is answered cancelled");
                let _ = self.peer.respond(&p.rpc_id, cancelled()).await;
                self.not_run(
                    p.tool_call_id.as_deref(),
                    &p.tool_call,
                    "waiting for the approval failed",
                );
                return;
            }
        };
        if d.status == DecisionStatus::Void && self.interrupt_coming(&d).await {
            // A cancel or a replan voided it: ACP wants `session/cancel` before the answer,
            // and the interrupt sends both in that order.
            self.pending.insert(decision_id.to_owned(), p);
            return;
        }
        let answer = chosen_option(&d)
            .and_then(|o| p.answers.get(o))
            .cloned()
            .unwrap_or(Answer::Cancel);
        let body = match &answer {
            Answer::Select(option) => {
                json!({"outcome": {"outcome": "selected", "optionId": option}})
            }
            Answer::Cancel => cancelled(),
        };
        tracing::info!(decision = decision_id, status = %d.status, ?answer, "answering the agent");
        let wrote = self.peer.respond(&p.rpc_id, body).await;
        let allowed = matches!(&answer, Answer::Select(_))
            && chosen_option(&d).and_then(waymark_proto::option_grants) == Some(true);
        if !allowed {
            let reason = match d.status {
                DecisionStatus::Expired => "the approval expired".to_owned(),
                DecisionStatus::Void => "the approval was voided".to_owned(),
                _ => format!(
                    "the approval was answered `{}`",
                    chosen_option(&d).unwrap_or("cancelled")
                ),
            };
            self.not_run(p.tool_call_id.as_deref(), &p.tool_call, &reason);
        }
        if d.status != DecisionStatus::Resolved {
            return;
        }
        match wrote {
            Ok(()) => {
                self.answered.insert(
                    decision_id.to_owned(),
                    Answered {
                        rpc_id: p.rpc_id,
                        tool_call_id: p.tool_call_id,
                    },
                );
            }
            Err(e) => {
                let detail = format!("writing the answer to the agent failed: {e}");
                if let Err(e) = bridge::lost(&self.run, decision_id, &detail).await {
                    tracing::warn!(error = %e, "reporting a lost answer failed");
                }
            }
        }
    }

    /// Whether the command that voided `d` will interrupt the turn (a cancel, or a replan with
    /// instructions). The decision can arrive before the command does, so wait a little.
    async fn interrupt_coming(&self, d: &Decision) -> bool {
        let mut control = self.run.control();
        let coming = |s: &ControlState| {
            s.cancelled
                || (s.plan_revision > d.plan_revision
                    && s.instructions
                        .as_deref()
                        .is_some_and(|i| !i.trim().is_empty()))
        };
        tokio::time::timeout(VOID_GRACE, control.wait_for(coming))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// `$/cancel_request`: the agent withdrew a request (e.g. its own approval timeout).
    async fn on_withdrawn(&mut self, request_id: &Value) {
        let pending = self
            .pending
            .iter()
            .find(|(_, p)| &p.rpc_id == request_id)
            .map(|(id, _)| id.clone());
        if let Some(id) = pending {
            let p = self.pending.remove(&id).expect("found above");
            p.waiter.abort();
            self.not_run(
                p.tool_call_id.as_deref(),
                &p.tool_call,
                "the agent withdrew its permission request",
            );
            let _ = self
                .peer
                .respond_error(&p.rpc_id, -32800, "request cancelled")
                .await;
            if let Err(e) = self
                .run
                .expire_decision(&id, "the agent withdrew its permission request")
                .await
            {
                tracing::warn!(error = %e, "expiring a withdrawn approval failed");
            }
            return;
        }
        let answered = self
            .answered
            .iter()
            .find(|(_, a)| &a.rpc_id == request_id)
            .map(|(id, _)| id.clone());
        if let Some(id) = answered {
            self.answered.remove(&id);
            let detail = "the agent withdrew the request before it took the answer";
            if let Err(e) = bridge::lost(&self.run, &id, detail).await {
                tracing::warn!(error = %e, "reporting a lost answer failed");
            }
        }
    }

    async fn acknowledge_tool(&mut self, tool_call_id: &str, update: &str) {
        let ids: Vec<String> = self
            .answered
            .iter()
            .filter(|(_, a)| a.tool_call_id.as_deref() == Some(tool_call_id))
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            self.answered.remove(&id);
            let detail = format!("the agent sent `{update}` for `{tool_call_id}` after the answer");
            if let Err(e) = bridge::acknowledge(&self.run, &id, &detail).await {
                tracing::warn!(error = %e, "acknowledging an answer failed");
            }
        }
    }

    async fn acknowledge_all(&mut self, detail: &str) {
        for (id, _) in std::mem::take(&mut self.answered) {
            if let Err(e) = bridge::acknowledge(&self.run, &id, detail).await {
                tracing::warn!(error = %e, "acknowledging an answer failed");
            }
        }
    }

    /// The agent is gone: open approvals expire (no option applies), answers it never took are
    /// lost.
    async fn connection_lost(&mut self, why: &str) {
        for (id, p) in std::mem::take(&mut self.pending) {
            p.waiter.abort();
            self.not_run(
                p.tool_call_id.as_deref(),
                &p.tool_call,
                &format!("{why} before the approval was answered"),
            );
            let reason = format!("{why}; ACP approvals do not survive it");
            if let Err(e) = self.run.expire_decision(&id, &reason).await {
                tracing::warn!(error = %e, decision = %id, "expiring an approval failed");
            }
        }
        for (id, _) in std::mem::take(&mut self.answered) {
            let detail = format!("{why} before it acknowledged the answer");
            if let Err(e) = bridge::lost(&self.run, &id, &detail).await {
                tracing::warn!(error = %e, "reporting a lost answer failed");
            }
        }
    }

    /// `session/cancel`, then — as ACP asks of a client that cancels — every open permission
    /// request of the turn answered `cancelled`; their approvals close without an option.
    async fn interrupt_turn(&mut self, why: &Interrupt) {
        tracing::info!(?why, "cancelling the ACP turn");
        if let Err(e) = self
            .peer
            .notify("session/cancel", json!({"sessionId": self.session_id}))
            .await
        {
            tracing::warn!(error = %e, "sending `session/cancel` failed");
        }
        let reason = match why {
            Interrupt::Replan(_) => "the turn was cancelled for a replan",
            Interrupt::Cancelled => "the task was cancelled",
            Interrupt::Lost => "the attempt lost its lease",
            Interrupt::Shutdown => "the adapter shut down; ACP approvals do not survive it",
        };
        for (id, p) in std::mem::take(&mut self.pending) {
            p.waiter.abort();
            let _ = self.peer.respond(&p.rpc_id, cancelled()).await;
            self.not_run(p.tool_call_id.as_deref(), &p.tool_call, reason);
            // A replan or a cancel already voided it; then this is refused, as it should be.
            if let Err(e) = self.run.expire_decision(&id, reason).await {
                tracing::debug!(error = %e, decision = %id, "approval not expired");
            }
        }
    }

    /// Records the turn's token usage from the prompt's answer (`usage`, ACP's
    /// `{inputTokens, outputTokens, totalTokens, …}`, which Hermes and Gemini CLI send) with
    /// the session's wall time so far. Nothing is reported when the agent sends no usage.
    async fn report_usage(&mut self, answer: &Value) {
        let Some(tokens) = tokens_of(answer) else {
            return;
        };
        let wall = self.started.elapsed().as_secs();
        self.started = tokio::time::Instant::now();
        if let Err(e) = self.run.usage(tokens, 0.0, wall).await {
            tracing::warn!(error = %e, "reporting the turn's usage failed");
        }
    }

    async fn checkpoint(&self, reason: &str, effects: Vec<EffectRef>, summary: &str) {
        let body = CheckpointBody {
            reason: reason.into(),
            plan_revision: self.run.plan_revision(),
            effects,
            summary: Some(format!("ACP session `{}`: {summary}", self.session_id)),
            ..CheckpointBody::default()
        };
        if let Err(e) = self.run.checkpoint(body).await {
            tracing::warn!(error = %e, "writing the checkpoint failed");
        }
    }

    async fn finish(&self, outcome: FinishOutcome, summary: String) {
        if let Err(e) = self.run.finish(outcome, Some(summary)).await {
            tracing::warn!(error = %e, "finishing the attempt failed");
        }
    }
}

/// The attempt's outcome for an ACP stop reason.
fn outcome_of(stop: &str) -> (FinishOutcome, String) {
    match stop {
        "end_turn" => (FinishOutcome::Completed, "the agent ended its turn".into()),
        "max_tokens" | "max_turn_requests" => (
            FinishOutcome::PartiallyDelivered,
            format!("the agent stopped at its limit (`{stop}`); nothing was verified"),
        ),
        "refusal" => (FinishOutcome::Failed, "the agent refused".into()),
        "cancelled" => (
            FinishOutcome::Cancelled,
            "the agent reports the turn cancelled".into(),
        ),
        other => (
            FinishOutcome::PartiallyDelivered,
            format!("the turn ended with a stop reason this adapter does not know: `{other}`"),
        ),
    }
}

/// The tokens a prompt's answer reports: `usage.totalTokens`, else input + output (+ thought)
/// tokens (Hermes 0.19), else Gemini CLI 0.61's `_meta.quota.token_count` (input + output);
/// `None` when it reports none.
fn tokens_of(answer: &Value) -> Option<u64> {
    let Some(usage) = answer.get("usage").filter(|u| u.is_object()) else {
        let count = answer.pointer("/_meta/quota/token_count")?;
        let n = |k: &str| count.get(k).and_then(Value::as_u64);
        let (input, output) = (n("input_tokens"), n("output_tokens"));
        return (input.is_some() || output.is_some())
            .then(|| input.unwrap_or(0) + output.unwrap_or(0));
    };
    let n = |k: &str| usage.get(k).and_then(Value::as_u64);
    n("totalTokens").or_else(|| {
        let parts = [n("inputTokens"), n("outputTokens"), n("thoughtTokens")];
        parts
            .iter()
            .any(Option::is_some)
            .then(|| parts.iter().flatten().sum())
    })
}

fn cancelled() -> Value {
    json!({"outcome": {"outcome": "cancelled"}})
}

/// Records how a tool call ended unless an end is already recorded: the first end counts.
fn end_once(tx: &watch::Sender<Option<ToolEnd>>, end: ToolEnd) {
    tx.send_if_modified(|e| {
        if e.is_some() {
            return false;
        }
        *e = Some(end);
        true
    });
}

/// Waits for the agent to say how a tool call ended.
async fn wait_for_end(mut rx: watch::Receiver<Option<ToolEnd>>) -> Result<Value, ProviderError> {
    let end = rx
        .wait_for(Option::is_some)
        .await
        .ok()
        .and_then(|e| e.clone());
    match end {
        Some(ToolEnd::Completed(receipt)) => Ok(receipt),
        Some(ToolEnd::Failed(reason)) => Err(ProviderError::Failed {
            compensable: false,
            reason,
        }),
        Some(ToolEnd::Unknown(reason)) => Err(ProviderError::Unknown { reason }),
        None => Err(ProviderError::Unknown {
            reason: "the adapter stopped following the tool call".into(),
        }),
    }
}

fn effect_ref(key: &str, res: waymark_worker::Result<EffectDone>) -> Option<EffectRef> {
    match res {
        Ok(done) => Some(EffectRef {
            effect_id: done.effect.id,
            status: done.effect.status,
        }),
        Err(waymark_worker::Error::EffectFailed {
            effect_id,
            compensable,
            ..
        }) => Some(EffectRef {
            effect_id,
            status: if compensable {
                EffectStatus::FailedCompensable
            } else {
                EffectStatus::Failed
            },
        }),
        Err(waymark_worker::Error::EffectUnknown { effect_id, .. }) => Some(EffectRef {
            effect_id,
            status: EffectStatus::Unknown,
        }),
        Err(e) => {
            tracing::warn!(error = %e, key, "recording a tool call's effect failed");
            None
        }
    }
}

/// The text of a content block (`{type: "text", text}`; others are named).
fn text_of(content: &Value) -> String {
    match content.get("type").and_then(Value::as_str) {
        Some("text") => content["text"].as_str().unwrap_or("").to_owned(),
        Some("resource_link") => format!("[link: {}]", content["uri"].as_str().unwrap_or("")),
        Some(other) => format!("[{other}]"),
        None => String::new(),
    }
}

/// The approval's question: the call's title, and its command when the title does not show it
/// (GitHub Copilot CLI titles a shell call with the model's description).
fn permission_summary(runtime: &str, tool_call: &Value) -> String {
    let title = tool_call
        .get("title")
        .and_then(Value::as_str)
        .filter(|t| !t.trim().is_empty());
    let command = tool_call
        .pointer("/rawInput/command")
        .and_then(Value::as_str)
        .filter(|c| !c.trim().is_empty());
    match (title, command) {
        (Some(t), Some(c)) if !t.contains(c) => format!("{runtime}: {t} — `{c}`"),
        (Some(t), _) => format!("{runtime}: {t}"),
        (None, Some(c)) => format!("{runtime} asks to run `{c}`"),
        (None, None) => format!("{runtime} asks permission for a tool call"),
    }
}

/// A failure's reason in `rawOutput` when the update has no `content` (Copilot CLI:
/// `{message, code}`; OpenCode: `{error}`).
fn raw_output_text(fields: &Map<String, Value>) -> Option<String> {
    let raw = fields.get("rawOutput")?;
    ["message", "error"]
        .iter()
        .find_map(|k| raw.get(*k).and_then(Value::as_str))
        .filter(|t| !t.trim().is_empty())
        .map(str::to_owned)
}

/// The text of a tool call's content (`[{type: "content", content: {type: "text", …}}]`).
fn tool_text(fields: &Map<String, Value>) -> Option<String> {
    let text: Vec<String> = fields
        .get("content")?
        .as_array()?
        .iter()
        .map(|c| text_of(&c["content"]))
        .filter(|t| !t.is_empty())
        .collect();
    (!text.is_empty()).then(|| text.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_reasons_map_to_outcomes() {
        assert_eq!(outcome_of("end_turn").0, FinishOutcome::Completed);
        assert_eq!(
            outcome_of("max_tokens").0,
            FinishOutcome::PartiallyDelivered
        );
        assert_eq!(outcome_of("refusal").0, FinishOutcome::Failed);
        assert_eq!(outcome_of("cancelled").0, FinishOutcome::Cancelled);
        assert_eq!(outcome_of("sideways").0, FinishOutcome::PartiallyDelivered);
    }

    #[test]
    fn usage_is_read_as_hermes_and_gemini_cli_send_it() {
        // Recorded: fixtures/acp/real/hermes-0.19.0-approve.out.jsonl, gemini-0.61.0-*.out.jsonl.
        let hermes = json!({"stopReason": "end_turn", "usage": {"cachedReadTokens": 0, "inputTokens": 20, "outputTokens": 10, "thoughtTokens": 0, "totalTokens": 30}});
        assert_eq!(tokens_of(&hermes), Some(30));
        let parts = json!({"usage": {"inputTokens": 20, "outputTokens": 10}});
        assert_eq!(tokens_of(&parts), Some(30));
        let gemini = json!({"stopReason": "end_turn", "_meta": {"quota": {"token_count": {"input_tokens": 20, "output_tokens": 10}, "model_usage": []}}});
        assert_eq!(tokens_of(&gemini), Some(30));
        assert_eq!(tokens_of(&json!({"stopReason": "end_turn"})), None);
    }

    #[test]
    fn titles_come_from_the_prompt() {
        assert_eq!(
            default_title("\n  fix the parser\nthen test", "acp"),
            "fix the parser"
        );
        assert_eq!(default_title("   ", "hermes"), "hermes session");
        assert_eq!(default_title(&"x".repeat(100), "acp").chars().count(), 81);
    }
}
