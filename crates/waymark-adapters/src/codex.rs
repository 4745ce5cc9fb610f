//! The Codex adapter: a client of `codex app-server` (JSON-RPC over stdio) that mirrors each
//! thread into a task, turns into checkpoints and items into effects, routes Codex's approval
//! requests to people's devices and answers in Codex's words, and turns a person's replan or
//! cancel into `turn/steer` or `turn/interrupt` (`docs/adapters/codex.md`).

mod approval;
mod command;
mod items;
mod plan;
mod question;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::process::Child;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;
use waymark_proto::{
    ApprovalDurability, CheckpointBody, CompletedStep, DecisionKind, DecisionStatus, EffectRef,
    FinishOutcome, NewMessage,
};
use waymark_worker::tree::TreeRecorder;
use waymark_worker::{Client, ControlState, Run};

use crate::bridge::{self, SessionSpec};
use crate::jsonrpc::{Dialect, Incoming, Peer, RpcError};
use approval::Closed;
pub use plan::IMPLEMENT;

/// The runtime name tasks carry.
pub const RUNTIME: &str = "codex";

/// Why a pending approval expires when the app-server goes away.
pub const CONNECTION_CLOSED: &str =
    "the Codex app-server connection closed; the turn will ask again";

/// Why an approval an earlier attempt left pending expires when the thread is attached again.
const EARLIER_CONNECTION: &str = "the Codex app-server that asked is gone (its adapter ended \
     without answering); Codex asks again if it still wants to";

/// Why pending approvals expire when the adapter stops.
const ADAPTER_STOPPED: &str = "the Waymark Codex adapter stopped; Codex will ask again";

/// Why a pending approval expires when a pause interrupts its turn.
const PAUSED: &str = "paused in Waymark: the Codex turn was interrupted before an answer; \
     after resume, Codex asks again if it still wants to";

/// The prompt of the turn that continues a thread paused in the middle of a turn.
pub const RESUME_PROMPT: &str = "Continue from where you left off.";

/// How long teardown waits for approvals and effects to settle.
const SETTLE: Duration = Duration::from_secs(10);

/// Control changes queued for the adapter's loop at most. A thread's watcher waits while the
/// queue is full (its run's control state is a watch, so the changes that arrive meanwhile
/// collapse into the newest, which is sent when there is room): backpressure, nothing lost.
const EVENTS_QUEUED: usize = 64;

/// `waymark adapters codex`: follow Codex threads through `codex app-server`.
#[derive(Debug, Clone, clap::Args)]
pub struct CodexArgs {
    /// How to start the app-server; split into words like a shell would (quotes, backslashes),
    /// without one: for pipes or variables give `sh -c '…'`.
    #[arg(long, value_name = "CMD", default_value = "codex app-server")]
    pub app_server_cmd: String,
    /// Working directory of the app-server and of a new thread (default: the current one).
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<PathBuf>,
    /// Start a new thread with this prompt as its first turn; the adapter ends when the turn
    /// ends. `-` (in `waymark adapters codex`): read it from stdin.
    #[arg(long, value_name = "TEXT")]
    pub prompt: Option<String>,
    /// Attach to an existing thread (`thread/resume`); repeat for several.
    #[arg(long = "thread", value_name = "ID")]
    pub threads: Vec<String>,
    /// With one `--thread` (and no `--prompt`): after resuming it, start a turn with this text;
    /// the adapter ends when that turn ends, as with `--prompt`. `-`: read it from stdin.
    #[arg(long, value_name = "TEXT")]
    pub message: Option<String>,
    /// Mirror the one thread (`--prompt`'s or `--thread`'s) into this existing task instead of
    /// finding or creating one by the thread's id — the task a runner's `start_run` made. A
    /// turn that completes then releases the attempt (the task stays open, so a follow-up or a
    /// revive resumes the same thread) instead of completing the task.
    #[arg(long, value_name = "TASK")]
    pub task: Option<String>,
    /// Write the new thread's id to this file as soon as Codex names it, before its first
    /// turn, so a later `--thread` resume finds it (the runner keeps it in its state dir).
    #[arg(long, value_name = "PATH")]
    pub thread_file: Option<PathBuf>,
    /// How often the app-server may be restarted after it exits before the adapter gives up.
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub max_restarts: u32,
    /// The worker name attempts carry.
    #[arg(long, value_name = "NAME", default_value = "codex-adapter")]
    pub worker: String,
    /// Run the `--prompt` (or `--message`) turn in Codex's Plan mode: Codex plans, asking its
    /// questions in the inbox, and proposes a plan, which comes to the inbox to approve ("Yes,
    /// implement this plan": Codex implements it in Default mode) or to send back with
    /// feedback (another planning turn).
    #[arg(long)]
    pub plan: bool,
}

impl CodexArgs {
    /// Arguments that start `codex app-server` with everything else at its default.
    pub fn new() -> Self {
        CodexArgs {
            app_server_cmd: "codex app-server".into(),
            cwd: None,
            prompt: None,
            threads: Vec::new(),
            message: None,
            task: None,
            thread_file: None,
            max_restarts: 5,
            worker: "codex-adapter".into(),
            plan: false,
        }
    }
}

impl Default for CodexArgs {
    fn default() -> Self {
        Self::new()
    }
}

/// Why the adapter stopped.
#[derive(Debug, thiserror::Error)]
pub enum CodexError {
    /// Neither a prompt nor a thread to follow.
    #[error(
        "nothing to follow: give `--prompt TEXT` to start a thread, or `--thread ID` to attach to one"
    )]
    NothingToDo,
    /// Options that do not go together.
    #[error("{0}")]
    Options(&'static str),
    /// The app-server command line does not parse.
    #[error("`--app-server-cmd {cmd}`: {reason}")]
    Command {
        /// The command line.
        cmd: String,
        /// What is wrong with it.
        reason: String,
    },
    /// `--cwd` names no usable directory.
    #[error("the working directory `{path}` cannot be used: {reason} — check `--cwd`")]
    Cwd {
        /// What was given.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The app-server could not be started.
    #[error(
        "cannot start the Codex app-server with `{cmd}`: {reason} — is `codex` installed and on PATH? (or pass `--app-server-cmd`)"
    )]
    Spawn {
        /// The command line.
        cmd: String,
        /// The operating system's answer.
        reason: String,
    },
    /// A call to the app-server failed.
    #[error("the Codex app-server: {0}")]
    Rpc(#[from] RpcError),
    /// The app-server answered without something it must send.
    #[error("the Codex app-server answered `{method}` without {missing}")]
    Protocol {
        /// The call.
        method: String,
        /// What was missing.
        missing: String,
    },
    /// The control plane refused or could not be reached.
    #[error("the control plane: {0}")]
    Worker(#[from] waymark_worker::Error),
    /// The app-server kept exiting.
    #[error(
        "the Codex app-server exited {restarts} time(s) after a restart; gave up — see its log, or raise `--max-restarts`"
    )]
    GaveUp {
        /// Restarts tried.
        restarts: u32,
    },
}

/// Follows Codex threads until `shutdown` fires (or, with `--prompt`, until its turn ends):
/// starts the app-server, starts or resumes the threads, mirrors them, and restarts the
/// app-server (resuming every thread) when it exits, up to `--max-restarts` times.
pub async fn run(
    args: CodexArgs,
    client: Client,
    shutdown: CancellationToken,
) -> Result<(), CodexError> {
    if args.prompt.is_none() && args.threads.is_empty() {
        return Err(CodexError::NothingToDo);
    }
    check_options(&args)?;
    // A missing directory makes the spawn fail with the same "not found" as a missing `codex`:
    // say which it is.
    if let Some(dir) = &args.cwd {
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(CodexError::Cwd {
                    path: dir.display().to_string(),
                    reason: "it is not a directory".into(),
                });
            }
            Err(e) => {
                return Err(CodexError::Cwd {
                    path: dir.display().to_string(),
                    reason: e.to_string(),
                });
            }
        }
    }
    let (events, events_rx) = mpsc::channel(EVENTS_QUEUED);
    let mut adapter = Adapter {
        cwd: args.cwd.clone().or_else(|| std::env::current_dir().ok()),
        args,
        client,
        shutdown,
        threads: HashMap::new(),
        events,
        events_rx,
        prompted: None,
        finishing: HashMap::new(),
        end: None,
    };
    let mut conn = adapter.connect().await?;
    if let Err(e) = adapter.setup(&mut conn).await {
        adapter.teardown(conn, ADAPTER_STOPPED).await;
        return Err(e);
    }
    adapter.follow(conn).await
}

/// `--message` and `--task` each concern exactly one thread.
fn check_options(args: &CodexArgs) -> Result<(), CodexError> {
    let threads: HashSet<&String> = args.threads.iter().collect();
    let followed = threads.len() + usize::from(args.prompt.is_some());
    if args.message.is_some() && (args.prompt.is_some() || threads.len() != 1) {
        return Err(CodexError::Options(
            "`--message` starts a turn in the one `--thread` it resumes: give exactly one `--thread` and no `--prompt`",
        ));
    }
    if args.task.is_some() && followed != 1 {
        return Err(CodexError::Options(
            "`--task` binds one thread to the task: give `--prompt` or one `--thread`, not both",
        ));
    }
    Ok(())
}

/// What the adapter's loop hears besides the app-server.
#[derive(Debug)]
enum Event {
    /// A thread's control state changed (replan, cancel, pause).
    Control { thread: String, state: ControlState },
    /// A thread's run stopped (cancelled, fenced, lease lost).
    Stopped { thread: String },
    /// A person answered the plan a Plan-mode turn proposed (`decision`: the approval, to
    /// acknowledge once the turn it starts is under way).
    Plan {
        thread: String,
        answer: plan::Answer,
        decision: Option<String>,
    },
}

/// Why serving a connection ended.
#[derive(Debug)]
enum End {
    Shutdown,
    Done,
    Closed,
}

/// A followed thread: one task, one attempt.
struct Thread {
    run: Arc<Run>,
    active_turn: Option<String>,
    seen_revision: i64,
    /// Tokens the task already holds for this thread (usage is reported as deltas of Codex's
    /// running total).
    reported_tokens: u64,
    /// The newest `turn/diff/updated` per turn.
    diffs: HashMap<String, String>,
    /// Effects recorded per turn, for the turn's checkpoint.
    effects: HashMap<String, Vec<JoinHandle<Option<EffectRef>>>>,
    /// A runner's run: records the working tree after each item.
    tree: Option<Arc<TreeRecorder>>,
    last_message: Option<String>,
    stopping: bool,
    /// Paused in Waymark (the control state as last seen).
    paused: bool,
    /// The turn a pause interrupted: resume starts a new turn to continue the thread.
    held: Option<String>,
    /// The thread's model, as Codex named it (a collaboration mode is set with it).
    model: Option<String>,
    /// Turns run in Codex's Plan mode (`--plan`, until a plan is approved).
    planning: bool,
    /// The plan the active turn proposed (its `plan` item).
    proposed: Option<String>,
    /// The plan approval being asked, if any.
    asking: Option<JoinHandle<()>>,
    watcher: JoinHandle<()>,
}

impl Drop for Thread {
    fn drop(&mut self) {
        self.watcher.abort();
        if let Some(a) = &self.asking {
            a.abort();
        }
    }
}

/// One app-server process and what is in flight on it.
struct Conn {
    child: Child,
    peer: Peer,
    incoming: mpsc::Receiver<Incoming>,
    closed: Closed,
    /// Approvals by JSON-RPC request id (as JSON text).
    approvals: HashMap<String, approval::Handle>,
    /// Items under way by `threadId:turnId:itemId`.
    items: HashMap<String, items::Pending>,
    /// Approval requests by the `threadId:turnId:itemId` they guard, until the item ends.
    asked: HashMap<String, approval::Asked>,
    /// Approval and steer tasks.
    tasks: JoinSet<()>,
}

impl Conn {
    /// How an item Codex never reported the end of ended: not run when its approval was
    /// still unanswered or refused (`not_run` says why), else unknown (`unknown` says why) —
    /// never guessed.
    fn unfinished(&self, key: &str, not_run: &str, unknown: &str) -> items::Outcome {
        match self.asked.get(key) {
            Some(a) if a.certainly_not_run() => {
                items::Outcome::Failed(format!("not run: {not_run}"))
            }
            _ => items::Outcome::Unknown(unknown.to_owned()),
        }
    }

    /// Ends every item still under way, the connection being over.
    fn end_items(&mut self, not_run: &str, unknown: &str) {
        for (key, p) in std::mem::take(&mut self.items) {
            let _ = p.done.send(self.unfinished(&key, not_run, unknown));
        }
        self.asked.clear();
    }
}

struct Adapter {
    args: CodexArgs,
    cwd: Option<PathBuf>,
    client: Client,
    shutdown: CancellationToken,
    threads: HashMap<String, Thread>,
    events: mpsc::Sender<Event>,
    events_rx: mpsc::Receiver<Event>,
    /// The thread `--prompt` started; its turn's end ends the adapter.
    prompted: Option<String>,
    /// How each thread's attempt finishes, when not released.
    finishing: HashMap<String, (FinishOutcome, String)>,
    end: Option<End>,
}

/// `s` cut to at most `max` bytes, on a character boundary.
fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max.saturating_sub(1);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

fn str_of<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter().try_fold(v, |v, k| v.get(*k))?.as_str()
}

fn text_input(text: &str) -> Value {
    json!([{"type": "text", "text": text}])
}

impl Adapter {
    /// Starts the app-server and does the handshake.
    async fn connect(&self) -> Result<Conn, CodexError> {
        let started = command::start(&self.args.app_server_cmd, self.cwd.as_deref())?;
        let (peer, incoming) = Peer::start(started.stdout, started.stdin, Dialect::NoVersion);
        let mut conn = Conn {
            child: started.child,
            peer,
            incoming,
            closed: Closed::default(),
            approvals: HashMap::new(),
            items: HashMap::new(),
            asked: HashMap::new(),
            tasks: JoinSet::new(),
        };
        let hello = conn
            .peer
            .request(
                "initialize",
                json!({
                    "clientInfo": {"name": "waymark", "title": "Waymark", "version": env!("CARGO_PKG_VERSION")},
                    "capabilities": {"experimentalApi": true},
                }),
            )
            .await;
        let hello = match hello {
            Ok(h) => h,
            Err(e) => {
                let _ = conn.child.kill().await;
                return Err(e.into());
            }
        };
        tracing::info!(user_agent = ?hello.get("userAgent"), "Codex app-server ready");
        conn.peer.notify("initialized", Value::Null).await?;
        Ok(conn)
    }

    /// Resumes `--thread`s and starts the `--prompt` thread and turn.
    async fn setup(&mut self, conn: &mut Conn) -> Result<(), CodexError> {
        let mut seen = HashSet::new();
        for id in self.args.threads.clone() {
            if !seen.insert(id.clone()) {
                continue;
            }
            let res = conn
                .peer
                .request("thread/resume", json!({"threadId": id}))
                .await?;
            let preview = str_of(&res, &["thread", "preview"]).unwrap_or("").trim();
            let title = if preview.is_empty() {
                format!("Codex thread {id}")
            } else {
                format!("Codex: {}", preview.lines().next().unwrap_or(preview))
            };
            self.attach(&id, &title, preview).await?;
            self.named_model(&id, &res);
            if let Some(message) = self.args.message.clone() {
                self.prompted = Some(id.clone());
                self.start_planned_turn(conn, &id, &message).await?;
            }
        }
        if let Some(prompt) = self.args.prompt.clone() {
            let mut params = json!({});
            if let Some(cwd) = &self.cwd {
                params["cwd"] = cwd.display().to_string().into();
            }
            let res = conn.peer.request("thread/start", params).await?;
            let id = str_of(&res, &["thread", "id"])
                .ok_or_else(|| CodexError::Protocol {
                    method: "thread/start".into(),
                    missing: "`thread.id`".into(),
                })?
                .to_owned();
            if let Some(path) = &self.args.thread_file
                && let Err(e) = write_thread_file(path, &id)
            {
                tracing::warn!(thread = %id, path = %path.display(), error = %e, "cannot record the thread's id; a later resume will not find it");
            }
            let first = prompt.lines().next().unwrap_or(&prompt);
            self.attach(&id, &format!("Codex: {first}"), &prompt)
                .await?;
            self.named_model(&id, &res);
            self.prompted = Some(id.clone());
            self.start_planned_turn(conn, &id, &prompt).await?;
        }
        Ok(())
    }

    /// Keeps the model `thread/start` or `thread/resume` named for the thread.
    fn named_model(&mut self, id: &str, res: &Value) {
        if let (Some(m), Some(t)) = (str_of(res, &["model"]), self.threads.get_mut(id)) {
            t.model = Some(m.to_owned());
        }
    }

    /// The first turn of `--prompt` or `--message`: in Plan mode with `--plan`.
    async fn start_planned_turn(
        &mut self,
        conn: &Conn,
        id: &str,
        text: &str,
    ) -> Result<(), CodexError> {
        if !self.args.plan {
            return self.start_turn(conn, id, text, None).await;
        }
        if let Some(t) = self.threads.get_mut(id) {
            t.planning = true;
        }
        self.start_turn(conn, id, text, Some(plan::PLAN)).await
    }

    /// `turn/start` with `text` in a followed thread, in collaboration `mode` when one is given
    /// (else the thread's mode stays as it was); the turn becomes its active one.
    async fn start_turn(
        &mut self,
        conn: &Conn,
        id: &str,
        text: &str,
        mode: Option<&str>,
    ) -> Result<(), CodexError> {
        let mut params = json!({"threadId": id, "input": text_input(text)});
        if let Some(mode) = mode {
            let model = self
                .threads
                .get(id)
                .and_then(|t| t.model.clone())
                .ok_or_else(|| CodexError::Protocol {
                    method: "thread/start".into(),
                    missing: "the thread's `model` (a collaboration mode is set with it)".into(),
                })?;
            params["collaborationMode"] = plan::collaboration(mode, &model);
        }
        let res = conn.peer.request("turn/start", params).await?;
        if let (Some(turn), Some(t)) = (str_of(&res, &["turn", "id"]), self.threads.get_mut(id)) {
            t.active_turn = Some(turn.to_owned());
        }
        Ok(())
    }

    /// Finds or creates the thread's task and starts its attempt.
    async fn attach(&mut self, id: &str, title: &str, goal: &str) -> Result<(), CodexError> {
        if self.threads.contains_key(id) {
            return Ok(());
        }
        let spec = SessionSpec {
            runtime: RUNTIME.into(),
            key: id.to_owned(),
            title: clip(title, 160),
            goal: clip(goal, 10_000),
        };
        let wait = Duration::from_secs(60);
        let run = match &self.args.task {
            Some(task) => bridge::start(&self.client, task, &self.args.worker, wait).await?,
            None => bridge::attach(&self.client, &spec, &self.args.worker, wait).await?,
        };
        let run = Arc::new(run);
        let detail = self.client.task(run.task_id()).await?;
        let reported_tokens = detail.task.usage.tokens;
        // Codex holds an approval only while the connection that asked lives, and this attempt
        // started because the one before it ended: what that one left pending (its adapter was
        // killed) nobody can answer any more. Expired, never approved; Codex asks again. A
        // runner's run keeps its command approvals: when Codex asks for the same command again,
        // the card the person has answers it (`approval::earlier_decision`), and what is not
        // asked again expires when the turn ends.
        let keeps = self.args.task.is_some();
        for d in detail.decisions.iter().filter(|d| {
            d.kind == DecisionKind::Approval
                && d.status == DecisionStatus::Pending
                && d.durability == Some(ApprovalDurability::ConnectionBound)
                && !(keeps
                    && d.intent
                        .as_ref()
                        .is_some_and(|i| i["method"] == approval::COMMAND_APPROVAL))
        }) {
            match run.expire_decision(&d.id, EARLIER_CONNECTION).await {
                Ok(_) => {
                    tracing::info!(thread = id, decision = %d.id, "expired an approval an earlier connection held")
                }
                Err(e) => {
                    tracing::warn!(thread = id, decision = %d.id, error = %e, "cannot expire an approval an earlier connection held")
                }
            }
        }
        tracing::info!(thread = id, task = run.task_id(), attempt = %run.attempt().id, "following the thread");
        // A runner's run records its working tree as it goes (from here, then after each
        // item that changed it), for the admission of a revive.
        let tree = match (&self.args.task, &self.cwd) {
            (Some(_), Some(cwd)) => Some(Arc::new(TreeRecorder::new(cwd.clone()))),
            _ => None,
        };
        if let Some(t) = &tree {
            t.after_call(&run).await;
        }
        let watcher = tokio::spawn(watch_run(run.clone(), id.to_owned(), self.events.clone()));
        self.threads.insert(
            id.to_owned(),
            Thread {
                tree,
                seen_revision: run.plan_revision(),
                run,
                active_turn: None,
                reported_tokens,
                diffs: HashMap::new(),
                effects: HashMap::new(),
                last_message: None,
                stopping: false,
                paused: false,
                held: None,
                model: None,
                planning: false,
                proposed: None,
                asking: None,
                watcher,
            },
        );
        Ok(())
    }

    /// Serves connections until the end, restarting the app-server when it exits.
    async fn follow(mut self, mut conn: Conn) -> Result<(), CodexError> {
        let mut restarts = 0;
        loop {
            match self.serve(&mut conn).await {
                End::Shutdown | End::Done => {
                    self.teardown(conn, ADAPTER_STOPPED).await;
                    return Ok(());
                }
                End::Closed => {}
            }
            tracing::warn!("the Codex app-server connection closed");
            self.lose(&mut conn).await;
            if self.threads.is_empty() {
                return Ok(());
            }
            conn = loop {
                if restarts >= self.args.max_restarts {
                    self.release_all().await;
                    return Err(CodexError::GaveUp { restarts });
                }
                let pause =
                    Duration::from_millis(250 << restarts.min(5)).min(Duration::from_secs(5));
                restarts += 1;
                tokio::select! {
                    _ = self.shutdown.cancelled() => {
                        self.release_all().await;
                        return Ok(());
                    }
                    _ = tokio::time::sleep(pause) => {}
                }
                match self.connect().await {
                    Ok(c) => break c,
                    Err(e) => {
                        tracing::warn!(error = %e, restart = restarts, "cannot restart the Codex app-server")
                    }
                }
            };
            tracing::info!(
                restart = restarts,
                "Codex app-server restarted; resuming threads"
            );
            self.resume_all(&conn).await;
        }
    }

    /// Reads the connection and the threads' control until one of them ends it.
    async fn serve(&mut self, conn: &mut Conn) -> End {
        loop {
            bridge::reap(&mut conn.tasks);
            if let Some(end) = self.end.take() {
                return end;
            }
            if self.threads.is_empty() {
                return End::Done;
            }
            tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => return End::Shutdown,
                Some(ev) = self.events_rx.recv() => self.on_event(conn, ev).await,
                msg = conn.incoming.recv() => match msg {
                    None => return End::Closed,
                    Some(Incoming::Request { id, method, params }) => self.on_request(conn, id, method, params).await,
                    Some(Incoming::Notification { method, params }) => self.on_notification(conn, &method, &params).await,
                },
            }
        }
    }

    /// The thread a message is about.
    fn thread_of(&self, params: &Value) -> Option<String> {
        let id = str_of(params, &["threadId"])
            .or_else(|| str_of(params, &["thread", "id"]))
            .map(str::to_owned);
        match id {
            Some(id) => self.threads.contains_key(&id).then_some(id),
            // Some notifications leave it out; with one thread there is no doubt.
            None if self.threads.len() == 1 => self.threads.keys().next().cloned(),
            None => None,
        }
    }

    async fn on_event(&mut self, conn: &mut Conn, ev: Event) {
        match ev {
            Event::Control { thread, state } => {
                if state.cancelled {
                    self.stop_thread(conn, &thread).await;
                    return;
                }
                let Some(t) = self.threads.get_mut(&thread) else {
                    return;
                };
                match (state.paused, t.paused) {
                    (true, false) => self.pause(conn, &thread).await,
                    (false, true) => self.resume(conn, &thread),
                    _ => {}
                }
                let Some(t) = self.threads.get_mut(&thread) else {
                    return;
                };
                if state.plan_revision <= t.seen_revision {
                    return;
                }
                t.seen_revision = state.plan_revision;
                if let Some(text) = state.instructions.filter(|i| !i.trim().is_empty()) {
                    self.steer(conn, &thread, text);
                }
            }
            Event::Stopped { thread } => {
                let Some(t) = self.threads.get(&thread) else {
                    return;
                };
                match t.run.wait_if_paused().await {
                    Err(waymark_worker::Error::LeaseLost { detail }) => {
                        tracing::error!(
                            thread,
                            detail,
                            "the lease of the thread's attempt was lost; no longer following it"
                        );
                        self.threads.remove(&thread);
                        if self.prompted.as_deref() == Some(thread.as_str()) {
                            self.end = Some(End::Done);
                        }
                    }
                    // Cancelled, revoked or taken over: stop the turn.
                    _ => self.stop_thread(conn, &thread).await,
                }
            }
            Event::Plan {
                thread,
                answer,
                decision,
            } => self.on_plan_answer(conn, &thread, answer, decision).await,
        }
    }

    /// The answer to "Implement this plan?": a turn in Default mode that implements it, another
    /// planning turn with the feedback, or the end of the run with the thread in Plan mode.
    async fn on_plan_answer(
        &mut self,
        conn: &mut Conn,
        thread: &str,
        answer: plan::Answer,
        decision: Option<String>,
    ) {
        let Some(t) = self.threads.get_mut(thread) else {
            return;
        };
        t.asking = None;
        let run = t.run.clone();
        let (text, mode, what) = match answer {
            plan::Answer::Implement => (
                IMPLEMENT.to_owned(),
                plan::DEFAULT,
                "the plan was approved: Codex implements it in Default mode",
            ),
            plan::Answer::Revise(feedback) => (
                feedback,
                plan::PLAN,
                "the plan was sent back with feedback: Codex plans again",
            ),
            plan::Answer::Stop(why) => {
                say(&run, "system", why.clone()).await;
                self.end_prompted(thread, "planned", why, None);
                return;
            }
        };
        if let Some(t) = self.threads.get_mut(thread) {
            t.planning = mode == plan::PLAN;
        }
        let started = self.start_turn(conn, thread, &text, Some(mode)).await;
        let Some(d) = decision else { return };
        let reported = match &started {
            Ok(()) => {
                say(&run, "system", what.to_owned()).await;
                bridge::acknowledge(&run, &d, "turn/start").await
            }
            Err(e) => {
                let why =
                    format!("Codex did not start the turn that follows the plan's answer: {e}");
                say(&run, "system", why.clone()).await;
                let r = bridge::lost(&run, &d, &why).await;
                self.end_prompted(thread, "failed", why, None);
                r
            }
        };
        if let Err(e) = reported {
            tracing::warn!(thread, decision = %d, error = %e, "cannot report the delivery of the plan's answer");
        }
    }

    /// A replan with instructions: steer the active turn, or start a turn when none runs.
    fn steer(&mut self, conn: &mut Conn, thread: &str, text: String) {
        let Some(t) = self.threads.get(thread) else {
            return;
        };
        let peer = conn.peer.clone();
        let run = t.run.clone();
        let thread = thread.to_owned();
        let turn = t.active_turn.clone();
        conn.tasks.spawn(async move {
            let res = match &turn {
                Some(turn) => {
                    peer.request(
                        "turn/steer",
                        json!({"threadId": thread, "input": text_input(&text), "expectedTurnId": turn}),
                    )
                    .await
                }
                None => {
                    peer.request(
                        "turn/start",
                        json!({"threadId": thread, "input": text_input(&text)}),
                    )
                    .await
                }
            };
            match res {
                Ok(_) => tracing::info!(thread, turn = ?turn, "the replan's instructions went to Codex"),
                Err(e) => {
                    let what = match &turn {
                        Some(turn) => format!("Codex did not take the new instructions into turn `{turn}` (turn/steer): {e}"),
                        None => format!("Codex did not start a turn with the new instructions: {e}"),
                    };
                    tracing::warn!(thread, "{what}");
                    if let Err(e) = run.messages(vec![NewMessage { role: "system".into(), text: clip(&what, 4000) }]).await {
                        tracing::warn!(thread, error = %e, "cannot report the refused steer");
                    }
                }
            }
        });
    }

    /// Paused: interrupt the active turn (`turn/interrupt`) and hold. An approval pending in
    /// that turn expires (Codex drops it with the turn, and its item, never answered, is
    /// closed as not run when the turn ends); the attempt stays open.
    async fn pause(&mut self, conn: &mut Conn, thread: &str) {
        let Some(t) = self.threads.get_mut(thread) else {
            return;
        };
        t.paused = true;
        let Some(turn) = t.active_turn.clone() else {
            let note = "paused in Waymark; no Codex turn was running, so nothing was interrupted";
            tracing::info!(thread, "{note}");
            say(&t.run, "system", note.into()).await;
            return;
        };
        t.held = Some(turn.clone());
        let run = t.run.clone();
        let prefix = format!("{thread}:{turn}:");
        for h in conn
            .approvals
            .values()
            .filter(|h| h.item_key.starts_with(&prefix))
        {
            h.withdrawn.close(PAUSED);
        }
        let res = tokio::time::timeout(
            Duration::from_secs(10),
            conn.peer.request(
                "turn/interrupt",
                json!({"threadId": thread, "turnId": turn}),
            ),
        )
        .await;
        let note = match res {
            Ok(Ok(_)) => format!(
                "paused in Waymark: Codex turn `{turn}` was interrupted; resume continues the thread with a new turn"
            ),
            Ok(Err(e)) => {
                format!("paused in Waymark, but Codex refused to interrupt turn `{turn}`: {e}")
            }
            Err(_) => format!(
                "paused in Waymark, but Codex did not answer the interrupt of turn `{turn}`"
            ),
        };
        tracing::info!(thread, turn, "{note}");
        say(&run, "system", note).await;
    }

    /// Resumed: when a pause interrupted a turn, a new turn ([`RESUME_PROMPT`]) continues the
    /// thread; else nothing was stopped and nothing is started.
    fn resume(&mut self, conn: &mut Conn, thread: &str) {
        let Some(t) = self.threads.get_mut(thread) else {
            return;
        };
        t.paused = false;
        let Some(held) = t.held.take() else {
            return;
        };
        let peer = conn.peer.clone();
        let run = t.run.clone();
        let thread = thread.to_owned();
        conn.tasks.spawn(async move {
            let res = peer
                .request(
                    "turn/start",
                    json!({"threadId": thread, "input": text_input(RESUME_PROMPT)}),
                )
                .await;
            let note = match res {
                Ok(r) => format!(
                    "resumed in Waymark: Codex continues the thread in turn `{}` (turn `{held}` was interrupted by the pause)",
                    str_of(&r, &["turn", "id"]).unwrap_or("?")
                ),
                Err(e) => format!("resumed in Waymark, but Codex did not start a turn to continue the thread: {e}"),
            };
            tracing::info!(thread, "{note}");
            say(&run, "system", note).await;
        });
    }

    /// Cancelled (or revoked): interrupt the active turn and finish the attempt as cancelled.
    async fn stop_thread(&mut self, conn: &mut Conn, thread: &str) {
        let Some(t) = self.threads.get_mut(thread) else {
            return;
        };
        if t.stopping {
            return;
        }
        t.stopping = true;
        if let Some(turn) = t.active_turn.clone() {
            let res = tokio::time::timeout(
                Duration::from_secs(10),
                conn.peer.request(
                    "turn/interrupt",
                    json!({"threadId": thread, "turnId": turn}),
                ),
            )
            .await;
            match res {
                Ok(Ok(_)) => tracing::info!(thread, turn, "turn interrupted"),
                Ok(Err(e)) => {
                    tracing::warn!(thread, turn, error = %e, "Codex refused to interrupt the turn")
                }
                Err(_) => tracing::warn!(thread, turn, "Codex did not answer turn/interrupt"),
            }
        }
        let Some(t) = self.threads.remove(thread) else {
            return;
        };
        // The cancel revoked the attempt, so the server usually refuses this; it is said anyway
        // for a control plane that leaves the attempt open.
        if let Err(e) = t
            .run
            .finish(
                FinishOutcome::Cancelled,
                Some("cancelled; the Codex turn was interrupted".into()),
            )
            .await
        {
            tracing::debug!(thread, error = %e, "finishing the cancelled attempt");
        }
        if self.prompted.as_deref() == Some(thread) {
            self.end = Some(End::Done);
        }
    }

    async fn on_request(&mut self, conn: &mut Conn, id: Value, method: String, params: Value) {
        let thread = self.thread_of(&params);
        match (method.as_str(), thread) {
            (approval::COMMAND_APPROVAL | approval::FILE_CHANGE_APPROVAL, Some(thread)) => {
                let t = &self.threads[&thread];
                let turn = str_of(&params, &["turnId"])
                    .map(str::to_owned)
                    .or_else(|| t.active_turn.clone())
                    .unwrap_or_default();
                let item = str_of(&params, &["itemId"]).unwrap_or_default();
                let item_key = format!("{thread}:{turn}:{item}");
                let resolved = CancellationToken::new();
                let item_done = CancellationToken::new();
                let withdrawn = Closed::default();
                let sent = approval::Sent::default();
                conn.asked.insert(
                    item_key.clone(),
                    approval::Asked {
                        sent: sent.clone(),
                        resolved: resolved.clone(),
                    },
                );
                let job = approval::Job {
                    run: t.run.clone(),
                    peer: conn.peer.clone(),
                    request_id: id.clone(),
                    method,
                    item: conn.items.get(&item_key).map(|p| p.item.clone()),
                    effect: conn.items.get(&item_key).map(|p| p.effect.clone()),
                    adopt: self.args.task.is_some(),
                    params,
                    closed: conn.closed.clone(),
                    resolved: resolved.clone(),
                    item_done: item_done.clone(),
                    withdrawn: withdrawn.clone(),
                    sent,
                };
                conn.approvals.insert(
                    id.to_string(),
                    approval::Handle {
                        item_key,
                        resolved,
                        item_done,
                        withdrawn,
                    },
                );
                conn.tasks.spawn(approval::carry(job));
            }
            (question::USER_INPUT, Some(thread)) => {
                let t = &self.threads[&thread];
                let turn = str_of(&params, &["turnId"])
                    .map(str::to_owned)
                    .or_else(|| t.active_turn.clone())
                    .unwrap_or_default();
                let item = str_of(&params, &["itemId"]).unwrap_or_default();
                let resolved = CancellationToken::new();
                let withdrawn = Closed::default();
                conn.approvals.insert(
                    id.to_string(),
                    approval::Handle {
                        item_key: format!("{thread}:{turn}:{item}"),
                        resolved: resolved.clone(),
                        item_done: CancellationToken::new(),
                        withdrawn: withdrawn.clone(),
                    },
                );
                conn.tasks.spawn(question::carry(question::Job {
                    run: t.run.clone(),
                    peer: conn.peer.clone(),
                    request_id: id,
                    params,
                    closed: conn.closed.clone(),
                    resolved,
                    withdrawn,
                }));
            }
            (approval::COMMAND_APPROVAL | approval::FILE_CHANGE_APPROVAL, None) => {
                tracing::warn!(%id, "an approval request for a thread not followed here; declining");
                let _ = conn.peer.respond(&id, json!({"decision": "decline"})).await;
            }
            (other, thread) => {
                tracing::warn!(
                    method = other,
                    "a request the Codex adapter does not handle; refusing"
                );
                let _ = conn
                    .peer
                    .respond_error(
                        &id,
                        -32601,
                        &format!("`{other}` is not handled by the Waymark Codex adapter"),
                    )
                    .await;
                if let Some(t) = thread.and_then(|t| self.threads.get(&t)) {
                    let note = format!(
                        "Codex asked `{other}`, which the Waymark adapter does not handle; it was refused"
                    );
                    say(&t.run, "system", note).await;
                }
            }
        }
    }

    async fn on_notification(&mut self, conn: &mut Conn, method: &str, params: &Value) {
        if method == "serverRequest/resolved" {
            if let Some(h) = params
                .get("requestId")
                .and_then(|id| conn.approvals.remove(&id.to_string()))
            {
                h.resolved.cancel();
            }
            return;
        }
        let Some(thread) = self.thread_of(params) else {
            tracing::trace!(method, "not about a followed thread");
            return;
        };
        match method {
            "turn/started" => {
                if let (Some(turn), Some(t)) = (
                    str_of(params, &["turn", "id"]),
                    self.threads.get_mut(&thread),
                ) {
                    t.active_turn = Some(turn.to_owned());
                }
            }
            "turn/completed" => self.on_turn_completed(conn, &thread, params).await,
            "turn/diff/updated" => {
                if let (Some(turn), Some(diff), Some(t)) = (
                    str_of(params, &["turnId"]),
                    str_of(params, &["diff"]),
                    self.threads.get_mut(&thread),
                ) {
                    t.diffs.insert(turn.to_owned(), diff.to_owned());
                }
            }
            "turn/plan/updated" => {
                let mut text = String::from("Plan updated");
                if let Some(e) = str_of(params, &["explanation"]).filter(|e| !e.is_empty()) {
                    text.push_str(": ");
                    text.push_str(e);
                }
                for step in params
                    .get("plan")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let mark = match str_of(step, &["status"]) {
                        Some("completed") => "[x]",
                        Some("inProgress") => "[~]",
                        _ => "[ ]",
                    };
                    text.push_str(&format!(
                        "\n{mark} {}",
                        str_of(step, &["step"]).unwrap_or("")
                    ));
                }
                say(&self.threads[&thread].run, "assistant", text).await;
            }
            "thread/tokenUsage/updated" => {
                let total = params
                    .get("tokenUsage")
                    .and_then(|u| u.get("total"))
                    .and_then(|t| t.get("totalTokens"))
                    .and_then(Value::as_u64);
                let Some(total) = total else { return };
                let Some(t) = self.threads.get_mut(&thread) else {
                    return;
                };
                if total > t.reported_tokens {
                    match t.run.usage(total - t.reported_tokens, 0.0, 0).await {
                        Ok(_) => t.reported_tokens = total,
                        Err(e) => tracing::warn!(thread, error = %e, "cannot report token usage"),
                    }
                }
            }
            "item/started" => self.on_item_started(conn, &thread, params),
            "item/completed" => self.on_item_completed(conn, &thread, params).await,
            "error" => {
                let msg = str_of(params, &["error", "message"])
                    .or_else(|| str_of(params, &["error"]))
                    .unwrap_or("an error without a message");
                let retry = if params.get("willRetry").and_then(Value::as_bool) == Some(true) {
                    " (Codex retries)"
                } else {
                    ""
                };
                say(
                    &self.threads[&thread].run,
                    "system",
                    format!("Codex error{retry}: {msg}"),
                )
                .await;
            }
            _ => tracing::trace!(method, "notification not mirrored"),
        }
    }

    fn item_key(&self, thread: &str, params: &Value) -> Option<(String, Value)> {
        let item = params.get("item")?.clone();
        let id = str_of(&item, &["id"])?;
        let turn = str_of(params, &["turnId"])
            .map(str::to_owned)
            .or_else(|| self.threads.get(thread)?.active_turn.clone())
            .unwrap_or_default();
        Some((format!("{thread}:{turn}:{id}"), item))
    }

    /// Starts an effect for an item that changes something.
    fn on_item_started(&mut self, conn: &mut Conn, thread: &str, params: &Value) {
        let Some((key, item)) = self.item_key(thread, params) else {
            return;
        };
        let Some(kind) = item
            .get("type")
            .and_then(Value::as_str)
            .and_then(items::effect_kind)
        else {
            return;
        };
        if conn.items.contains_key(&key) {
            return;
        }
        let (done, rx) = oneshot::channel();
        let (declared, effect) = watch::channel(None);
        let intent = items::intent(&item);
        conn.items
            .insert(key.clone(), items::Pending { done, item, effect });
        self.spawn_effect(thread, &key, kind, intent, rx, declared);
    }

    fn spawn_effect(
        &mut self,
        thread: &str,
        key: &str,
        kind: &'static str,
        intent: Value,
        rx: oneshot::Receiver<items::Outcome>,
        declared: watch::Sender<Option<String>>,
    ) {
        let Some(t) = self.threads.get_mut(thread) else {
            return;
        };
        let turn = key.split(':').nth(1).unwrap_or_default().to_owned();
        let handle = tokio::spawn(items::record(
            t.run.clone(),
            key.to_owned(),
            kind,
            intent,
            rx,
            t.tree.clone(),
            declared,
        ));
        t.effects.entry(turn).or_default().push(handle);
    }

    async fn on_item_completed(&mut self, conn: &mut Conn, thread: &str, params: &Value) {
        let Some((key, item)) = self.item_key(thread, params) else {
            return;
        };
        for h in conn.approvals.values().filter(|h| h.item_key == key) {
            h.item_done.cancel();
        }
        conn.asked.remove(&key);
        let item_type = item.get("type").and_then(Value::as_str).unwrap_or("");
        match item_type {
            "agentMessage" => {
                let text = str_of(&item, &["text"]).unwrap_or("").to_owned();
                if text.is_empty() {
                    return;
                }
                let Some(t) = self.threads.get_mut(thread) else {
                    return;
                };
                t.last_message = Some(text.clone());
                say(&t.run, "assistant", text).await;
            }
            "plan" => {
                let text = str_of(&item, &["text"]).unwrap_or("").trim().to_owned();
                let Some(t) = self.threads.get_mut(thread) else {
                    return;
                };
                if text.is_empty() {
                    return;
                }
                say(&t.run, "assistant", format!("Proposed plan:\n{text}")).await;
                t.proposed = Some(text);
            }
            "userMessage" => {
                let text: Vec<&str> = item
                    .get("content")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|c| str_of(c, &["text"]))
                    .collect();
                if !text.is_empty() {
                    say(&self.threads[thread].run, "user", text.join("\n")).await;
                }
            }
            t => {
                let Some(kind) = items::effect_kind(t) else {
                    return;
                };
                let outcome = items::outcome(&item);
                match conn.items.remove(&key) {
                    Some(p) => {
                        let _ = p.done.send(outcome);
                    }
                    None => {
                        // Started before we followed the thread: declare and close it at once.
                        let (done, rx) = oneshot::channel();
                        let _ = done.send(outcome);
                        let (declared, _) = watch::channel(None);
                        self.spawn_effect(thread, &key, kind, items::intent(&item), rx, declared);
                    }
                }
            }
        }
    }

    /// A turn ended: its checkpoint (effects, the turn's diff as an artifact); with
    /// `--prompt`, the end of the adapter.
    async fn on_turn_completed(&mut self, conn: &mut Conn, thread: &str, params: &Value) {
        let Some(turn) = str_of(params, &["turn", "id"]).map(str::to_owned) else {
            return;
        };
        let status = str_of(params, &["turn", "status"])
            .unwrap_or("completed")
            .to_owned();
        let error = str_of(params, &["turn", "error", "message"]).map(str::to_owned);
        let prefix = format!("{thread}:{turn}:");
        let open: Vec<String> = conn
            .items
            .keys()
            .filter(|k| k.starts_with(&prefix))
            .cloned()
            .collect();
        let why = if status == "interrupted" {
            "the turn was interrupted before its approval was answered"
        } else {
            "the turn ended before its approval was answered"
        };
        for key in open {
            if let Some(p) = conn.items.remove(&key) {
                let _ = p.done.send(conn.unfinished(
                    &key,
                    why,
                    "the turn ended before Codex reported the item's end",
                ));
            }
        }
        conn.asked.retain(|k, _| !k.starts_with(&prefix));
        let Some(t) = self.threads.get_mut(thread) else {
            return;
        };
        if t.active_turn.as_deref() == Some(turn.as_str()) {
            t.active_turn = None;
        }
        // Interrupted by a pause: the thread is held, not over.
        let held = status == "interrupted" && t.held.as_deref() == Some(turn.as_str());
        let run = t.run.clone();
        let handles = t.effects.remove(&turn).unwrap_or_default();
        let diff = t.diffs.remove(&turn).filter(|d| !d.trim().is_empty());
        if self.args.task.is_some() {
            approval::expire_unasked(&run).await;
        }
        let last_message = t.last_message.clone();
        let mut effects = Vec::new();
        for h in handles {
            if let Ok(Ok(Some(r))) = tokio::time::timeout(SETTLE, h).await {
                effects.push(r);
            }
        }
        let mut digests = Vec::new();
        if let Some(diff) = diff {
            match run
                .artifact(
                    &format!("turn-{turn}.diff"),
                    "text/x-diff",
                    diff.into_bytes(),
                    None,
                )
                .await
            {
                Ok(a) => digests.push(a.sha256),
                Err(e) => tracing::warn!(thread, turn, error = %e, "cannot upload the turn's diff"),
            }
        }
        let summary = match (status.as_str(), &error) {
            ("completed", _) => format!("Codex completed turn {turn}"),
            ("interrupted", _) if held => {
                format!("turn {turn} was interrupted by a pause; resume continues the thread")
            }
            ("interrupted", _) => format!("turn {turn} was interrupted"),
            (s, Some(e)) => format!("turn {turn} {s}: {e}"),
            (s, None) => format!("turn {turn} ended {s}"),
        };
        let completed_steps = if status == "completed" {
            vec![CompletedStep {
                step: turn.clone(),
                artifact_digests: digests,
                verified: false,
            }]
        } else {
            Vec::new()
        };
        let body = CheckpointBody {
            reason: "turn_completed".into(),
            plan_revision: run.plan_revision(),
            completed_steps,
            effects,
            summary: Some(clip(&summary, 1000)),
            ..CheckpointBody::default()
        };
        if let Err(e) = run.checkpoint(body).await {
            tracing::warn!(thread, turn, error = %e, "cannot write the turn's checkpoint");
        }
        let Some(t) = self.threads.get_mut(thread) else {
            return;
        };
        let proposed = t.proposed.take();
        if let (true, "completed", Some(plan)) = (t.planning, status.as_str(), proposed) {
            // Codex asks "Implement this plan?" here: so does the inbox, and the run goes on
            // with the answer.
            let cwd = self.cwd.as_ref().map(|c| c.display().to_string());
            t.asking = Some(tokio::spawn(plan::ask(
                run.clone(),
                thread.to_owned(),
                plan,
                turn.clone(),
                cwd,
                self.events.clone(),
            )));
            return;
        }
        if !held {
            self.end_prompted(thread, &status, summary, last_message);
        }
    }

    /// The `--prompt` (or `--message`) thread's run is over: the adapter ends, and the attempt
    /// finishes as the turn's `status` says.
    fn end_prompted(
        &mut self,
        thread: &str,
        status: &str,
        summary: String,
        last_message: Option<String>,
    ) {
        if self.prompted.as_deref() == Some(thread) {
            let finish = match status {
                // A runner's run stays open for what comes next (a follow-up, a revive).
                "completed" if self.args.task.is_some() => (
                    FinishOutcome::Released,
                    last_message.unwrap_or_else(|| summary.clone()),
                ),
                "completed" => (
                    FinishOutcome::Completed,
                    last_message.unwrap_or_else(|| summary.clone()),
                ),
                "failed" => (FinishOutcome::Failed, summary),
                // A plan left unapproved: the task stays open, as the thread does in Codex.
                "planned" => (FinishOutcome::Released, summary),
                _ => (
                    FinishOutcome::Released,
                    format!("{summary} in Codex; the thread stays open there"),
                ),
            };
            self.finishing
                .insert(thread.to_owned(), (finish.0, clip(&finish.1, 10_000)));
            self.end = Some(End::Done);
        }
    }

    /// The app-server went away: pending approvals expire, answered ones not yet taken are
    /// lost; items under way are closed as not run when their approval was still unanswered
    /// (Codex cannot have run them), else become unknown; turns are over.
    async fn lose(&mut self, conn: &mut Conn) {
        conn.closed.close(CONNECTION_CLOSED);
        // The approvals settle first, so that what was sent to Codex is final.
        settle(&mut conn.tasks).await;
        conn.end_items(
            "the Codex app-server connection closed before its approval was answered",
            "the Codex app-server connection closed while the item ran",
        );
        match tokio::time::timeout(Duration::from_secs(2), conn.child.wait()).await {
            Ok(Ok(status)) => tracing::warn!(%status, "the Codex app-server exited"),
            _ => {
                let _ = conn.child.kill().await;
            }
        }
        for t in self.threads.values_mut() {
            t.active_turn = None;
        }
    }

    /// After a restart: `thread/resume` every followed thread.
    async fn resume_all(&mut self, conn: &Conn) {
        for (id, t) in &self.threads {
            let note = match conn
                .peer
                .request("thread/resume", json!({"threadId": id}))
                .await
            {
                Ok(_) => "the Codex app-server restarted; the thread was resumed".to_owned(),
                Err(e) => {
                    format!("the Codex app-server restarted; resuming the thread failed: {e}")
                }
            };
            tracing::info!(thread = %id, "{note}");
            say(&t.run, "system", note).await;
        }
    }

    /// The end: approvals still open expire, attempts finish (released unless a turn's end
    /// decided otherwise), the app-server stops.
    async fn teardown(&mut self, mut conn: Conn, why: &str) {
        // Stop Codex first, so calls still waiting on it fail at once.
        let _ = conn.child.kill().await;
        conn.closed.close(why);
        settle(&mut conn.tasks).await;
        conn.end_items(
            "the adapter stopped Codex before its approval was answered",
            "the adapter stopped before Codex reported the item's end",
        );
        self.release_all().await;
    }

    /// Finishes every attempt: as a turn's end decided, else released (the task stays open).
    async fn release_all(&mut self) {
        for (id, mut t) in std::mem::take(&mut self.threads) {
            for h in t.effects.drain().flat_map(|(_, v)| v) {
                let _ = tokio::time::timeout(SETTLE, h).await;
            }
            let (outcome, summary) = self.finishing.remove(&id).unwrap_or((
                FinishOutcome::Released,
                "the Waymark Codex adapter stopped; the thread stays in Codex and can be attached again".into(),
            ));
            match t.run.finish(outcome, Some(summary)).await {
                Ok(_) => tracing::info!(thread = %id, %outcome, "attempt finished"),
                Err(e) => tracing::warn!(thread = %id, error = %e, "cannot finish the attempt"),
            }
        }
    }
}

/// Records a thread's id for a later resume: written whole or not at all (a temporary file
/// renamed over it), so a kill mid-write never leaves half an id.
fn write_thread_file(path: &std::path::Path, id: &str) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, format!("{id}\n"))?;
    std::fs::rename(tmp, path)
}

/// Waits (bounded) for approval and steer tasks to settle after their connection ended.
async fn settle(tasks: &mut JoinSet<()>) {
    let all = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(SETTLE, all).await.is_err() {
        tracing::warn!("approvals did not settle in time; abandoning them");
        tasks.abort_all();
    }
}

/// Appends one session message; a failure is logged, not fatal.
async fn say(run: &Run, role: &str, text: String) {
    let msg = NewMessage {
        role: role.into(),
        text: clip(&text, 16_000),
    };
    if let Err(e) = run.messages(vec![msg]).await {
        tracing::warn!(task = run.task_id(), error = %e, "cannot append a message");
    }
}

/// Forwards a run's control changes, and its end, to the adapter's loop.
async fn watch_run(run: Arc<Run>, thread: String, events: mpsc::Sender<Event>) {
    forward_control(run.control(), run.cancelled(), thread, events).await;
}

/// The newest control state on every change, then `Stopped` when `stopped` fires. While the
/// loop's queue is full this waits; changes meanwhile collapse into the newest state.
async fn forward_control(
    mut control: watch::Receiver<ControlState>,
    stopped: CancellationToken,
    thread: String,
    events: mpsc::Sender<Event>,
) {
    loop {
        tokio::select! {
            changed = control.changed() => {
                if changed.is_err() {
                    return;
                }
                let state = control.borrow_and_update().clone();
                if events.send(Event::Control { thread: thread.clone(), state }).await.is_err() {
                    return;
                }
            }
            _ = stopped.cancelled() => {
                // Let a cancel's control change arrive first, so it reads as a cancel.
                let state = control.borrow_and_update().clone();
                let _ = events.send(Event::Control { thread: thread.clone(), state }).await;
                let _ = events.send(Event::Stopped { thread }).await;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_and_a_task_each_concern_exactly_one_thread() {
        let args = |prompt: Option<&str>, threads: &[&str], message: bool, task: bool| CodexArgs {
            prompt: prompt.map(str::to_owned),
            threads: threads.iter().map(|t| (*t).to_owned()).collect(),
            message: message.then(|| "look again".to_owned()),
            task: task.then(|| "task_1".to_owned()),
            ..CodexArgs::new()
        };
        for ok in [
            args(Some("fix it"), &[], false, true),
            args(None, &["thr_1"], true, true),
            args(None, &["thr_1", "thr_1"], true, true),
            args(None, &["thr_1", "thr_2", "thr_1"], false, false),
            args(None, &["thr_1", "thr_2"], false, false),
            args(Some("fix it"), &["thr_1"], false, false),
        ] {
            assert!(check_options(&ok).is_ok(), "{ok:?}");
        }
        for bad in [
            args(None, &["thr_1", "thr_2"], true, false),
            args(Some("fix it"), &["thr_1"], true, false),
            args(Some("fix it"), &["thr_1"], false, true),
            args(None, &["thr_1", "thr_2"], false, true),
            args(None, &["thr_1", "thr_2", "thr_1"], true, false),
        ] {
            assert!(
                matches!(check_options(&bad), Err(CodexError::Options(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_thread_file_holds_the_whole_id_and_replaces_an_older_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("codex/task_1.thread");
        write_thread_file(&path, "thr_old").unwrap();
        write_thread_file(&path, "019a-thread").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "019a-thread\n");
        assert!(!path.with_extension("tmp").exists());
    }

    fn revision(ev: &Event) -> Option<i64> {
        match ev {
            Event::Control { state, .. } => Some(state.plan_revision),
            Event::Stopped { .. } | Event::Plan { .. } => None,
        }
    }

    /// The watcher's queue is bounded: with nobody reading, it fills to its bound and the
    /// watcher waits (no growth); the changes made meanwhile collapse into the newest, which
    /// arrives once the loop reads again, and the end is never dropped.
    #[tokio::test]
    async fn a_full_queue_holds_the_watcher_back_and_the_newest_state_still_arrives() {
        let (control_tx, control_rx) = watch::channel(ControlState::default());
        let stopped = CancellationToken::new();
        let (tx, mut rx) = mpsc::channel(2);
        let forwarder = tokio::spawn(forward_control(
            control_rx,
            stopped.clone(),
            "thr_1".into(),
            tx.clone(),
        ));
        for rev in 1..=200 {
            control_tx.send_modify(|s| {
                s.plan_revision = rev;
                s.instructions = Some(format!("instructions {rev}"));
            });
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(rx.len(), 2, "the queue holds its bound and no more");
        assert!(!forwarder.is_finished(), "the watcher waits for room");

        let mut seen = Vec::new();
        let newest = loop {
            let ev = tokio::time::timeout(Duration::from_secs(5), rx.recv())
                .await
                .expect("the newest state arrives")
                .expect("the channel is open");
            let rev = revision(&ev).expect("a control change");
            seen.push(rev);
            if rev == 200 {
                break ev;
            }
        };
        assert!(seen.len() < 200, "changes collapsed: {seen:?}");
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "in order: {seen:?}");
        let Event::Control { state, thread } = newest else {
            unreachable!()
        };
        assert_eq!(thread, "thr_1");
        assert_eq!(state.instructions.as_deref(), Some("instructions 200"));

        // A cancel on a full queue: the watcher waits, then delivers the cancel and the end.
        tx.send(Event::Stopped {
            thread: "filler".into(),
        })
        .await
        .unwrap();
        tx.send(Event::Stopped {
            thread: "filler".into(),
        })
        .await
        .unwrap();
        control_tx.send_modify(|s| s.cancelled = true);
        stopped.cancel();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(rx.len(), 2);
        let mut rest = Vec::new();
        loop {
            let ev = tokio::time::timeout(Duration::from_secs(5), rx.recv())
                .await
                .expect("the end arrives")
                .unwrap();
            let end = matches!(&ev, Event::Stopped { thread } if thread == "thr_1");
            rest.push(ev);
            if end {
                break;
            }
        }
        let n = rest.len();
        assert!(
            matches!(&rest[n - 2], Event::Control { state, .. } if state.cancelled),
            "the cancel reads as a cancel before the end: {rest:?}"
        );
        forwarder.await.unwrap();
    }
}
