//! The adapter's state machine: gateway sessions ↔ tasks, exec approvals ↔ decisions, tool
//! calls ↔ effects, and the people's answers and steering going back. One loop owns the state;
//! background tasks (decision long-polls, expiry timers, control watchers, effects) report to
//! it through a channel, so nothing is shared but the runs.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::{Mutex, mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use waymark_proto::{
    ApprovalDurability, AskedRuntimeDeadline, Decision, DecisionKind, DecisionStatus,
    DeliveryState, FinishOutcome, NewMessage, RuntimeFallback, TaskState,
};
use waymark_worker::{Client, ControlState, ProviderError, ProviderStatus, Reconciler, Run};

use super::OpenClawError;
use super::device::{DeviceKey, StoredToken};
use super::gateway::{
    ClientInfo, Conn, Credentials, Frame, GatewayError, HandshakeError, Lost, now_ms,
};
use crate::bridge::{self, Choice, SessionSpec};

/// The runtime name on tasks.
pub(super) const RUNTIME: &str = "openclaw";
/// The worker name on attempts.
const WORKER: &str = "openclaw-adapter";
/// How long to wait for a previous adapter's lease on a session's task.
const WAIT_FOR_LEASE: Duration = Duration::from_secs(40);
/// Deadline of one gateway request.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Deadline of the WebSocket and `connect` handshakes.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(15);
/// Our decision outlives the gateway's own expiry by this much, so that the adapter (not the
/// server's default) closes it when the gateway times out.
const EXPIRY_GRACE: Duration = Duration::from_secs(30);
/// After `exec.approval.resolve` answers ok, how long to wait for `exec.approval.resolved`
/// before counting the ok answer itself as the acknowledgement.
const RESOLVED_EVENT_GRACE: Duration = Duration::from_secs(2);
/// Retry an attach that failed for a passing reason after this long.
const ATTACH_RETRY: Duration = Duration::from_secs(10);
/// Pages of `tasks.list` read per backfill at most.
const MAX_LEDGER_PAGES: usize = 50;
/// Reports from background tasks queued for the loop at most. A background task waits while
/// the queue is full (backpressure: the loop is busy with the gateway), so nothing is dropped
/// and the queue does not grow; a control watcher meanwhile collapses replans into the newest.
const INTERNAL_QUEUED: usize = 256;

/// What the adapter was started with, resolved.
#[derive(Debug, Clone)]
pub(super) struct Settings {
    /// Following one run (`--task`) rather than mirroring every session.
    pub(super) bound: Option<Bound>,
    pub(super) gateway: String,
    pub(super) gateway_token: Option<String>,
    pub(super) client: ClientInfo,
}

/// One runner's run: the task `start_run` made, the gateway session it runs in, and the turn
/// to send into it.
#[derive(Debug, Clone)]
pub(super) struct Bound {
    pub(super) task: String,
    pub(super) key: String,
    pub(super) message: String,
    pub(super) turn_key: String,
    pub(super) cwd: Option<std::path::PathBuf>,
}

/// Where the bound run's turn is.
#[derive(Debug, Clone, PartialEq)]
enum Turn {
    /// Not sent yet (or its sending was cut off before the gateway answered: sent again with
    /// the same idempotency key, so it is one turn).
    Unsent,
    /// The gateway accepted it as `run_id`, on the gateway process `boot`.
    Running {
        run_id: String,
        boot: Option<String>,
    },
    /// Over, as the gateway said (`ok`, `error`, `aborted`…): what to say of it.
    Over(String),
    /// Never run: the gateway refused it, or the run could not go on — why.
    Refused(String),
}

/// The statuses a turn has while it is not over (`agent.wait` and the send methods answer
/// them; a send again while it runs is `in_flight`).
const TURN_UNDER_WAY: [&str; 6] = [
    "timeout",
    "pending",
    "accepted",
    "started",
    "in_flight",
    "queued",
];

/// How long a bound run's adapter lets its tool calls' records settle at the turn's end.
const SETTLE: Duration = Duration::from_secs(10);

/// How often the bound run's turn is asked after (`agent.wait` with no wait).
const TURN_POLL: Duration = Duration::from_secs(1);

/// A session's place in the adapter.
enum Slot {
    /// Mirrored: its task runs as our attempt.
    Live(Box<Session>),
    /// A person cancelled its task: the gateway is told to abort it (once), then it is left.
    Cancelled { abort_sent: bool },
    /// Not mirrored (its task is finished, paused or held elsewhere); tried again at
    /// `retry_at` if set.
    Detached {
        reason: String,
        retry_at: Option<Instant>,
    },
}

struct Session {
    run: Arc<Run>,
    /// Ledger entries noted on the task: OpenClaw task id → status.
    ledger: HashMap<String, String>,
    /// Tool calls under way: effect key → where their end goes.
    tools: HashMap<String, oneshot::Sender<Ended>>,
    /// A replan's instructions still to send.
    steer: Option<(i64, String)>,
}

/// How a tool call ended, as OpenClaw reported it: `{result}` as the receipt, or what went
/// wrong.
type ToolEnd = Result<Value, String>;

/// What the adapter learnt of a tool call's end.
#[derive(Debug)]
enum Ended {
    /// OpenClaw reported it.
    Reported(ToolEnd),
    /// OpenClaw never will, and nobody can say whether it ran: why.
    Unknown(String),
}

/// An exec approval the gateway holds and we mirror.
struct Approval {
    run: Arc<Run>,
    decision_id: String,
    /// The tool call it guards: (session key, effect key), from the request.
    tool: Option<(String, String)>,
    expires_at_ms: i64,
    state: ApprovalState,
}

#[derive(Debug, Clone, PartialEq)]
enum ApprovalState {
    /// Waiting for a person.
    Open,
    /// A person answered; the gateway is to be told `decision` (`allow-once`…).
    Answered {
        decision: String,
        /// A resolve frame went out at least once (it may have arrived).
        sent: bool,
        /// The gateway answered the resolve `ok`.
        confirmed: bool,
    },
}

/// What became of an exec request the adapter was asked to bring to the inbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Asked {
    /// A decision is open for it.
    Opened,
    /// Not brought to the inbox (not ours to ask, or the control plane could not be asked);
    /// OpenClaw keeps it.
    Left,
    /// The run that asked is over (cancelled, revoked, finished): it must not run.
    RunOver,
}

/// Whether opening a decision failed because the run itself is over.
fn run_is_over(e: &waymark_worker::Error) -> bool {
    matches!(
        e,
        waymark_worker::Error::Cancelled | waymark_worker::Error::Fenced { .. }
    ) || e.code() == Some(waymark_proto::ErrorCode::TaskTerminal)
}

/// What background tasks report to the loop.
#[derive(Debug)]
enum Internal {
    DecisionClosed {
        approval_id: String,
        decision: Box<Decision>,
    },
    GatewayExpired {
        approval_id: String,
        decision_id: String,
    },
    ResolveGrace {
        approval_id: String,
        decision_id: String,
    },
    Steer {
        key: String,
        attempt_id: String,
        revision: i64,
        text: String,
    },
    RunEnded {
        key: String,
        attempt_id: String,
    },
}

enum End {
    Stop,
    Lost(Lost),
    /// The bound run's turn is over: hand the task back open and exit.
    TurnOver,
}

pub(super) struct Adapter {
    settings: Settings,
    key: DeviceKey,
    client: Client,
    sessions: HashMap<String, Slot>,
    approvals: HashMap<String, Approval>,
    /// Approval ids whose decision is closed for good: never opened again. Each is kept until
    /// the gateway's own expiry of the approval has passed (after which it is not opened
    /// anyway), so the set holds only approvals the gateway might still list.
    closed: HashMap<String, i64>,
    tx: mpsc::Sender<Internal>,
    rx: mpsc::Receiver<Internal>,
    background: JoinSet<()>,
    /// Tool calls being mirrored (and working trees being recorded): a bound run's adapter
    /// lets them settle before it hands the task back.
    mirrors: JoinSet<()>,
    /// The bound run's turn (unused when mirroring every session).
    turn: Turn,
    /// The gateway process the connection is on (`hello-ok`'s `server.bootId`): a turn
    /// accepted by another one is gone.
    boot: Option<String>,
    /// Records the bound run's working tree after each tool call.
    tree: Option<Arc<waymark_worker::tree::TreeRecorder>>,
}

impl Adapter {
    pub(super) fn new(settings: Settings, key: DeviceKey, client: Client) -> Adapter {
        let (tx, rx) = mpsc::channel(INTERNAL_QUEUED);
        let tree = settings
            .bound
            .as_ref()
            .and_then(|b| b.cwd.clone())
            .map(|d| Arc::new(waymark_worker::tree::TreeRecorder::new(d)));
        Adapter {
            tree,
            turn: Turn::Unsent,
            boot: None,
            settings,
            key,
            client,
            sessions: HashMap::new(),
            approvals: HashMap::new(),
            closed: HashMap::new(),
            tx,
            rx,
            background: JoinSet::new(),
            mirrors: JoinSet::new(),
        }
    }

    /// Connects, mirrors and reconnects until `shutdown`; a refused `connect` ends it.
    pub(super) async fn run(mut self, shutdown: CancellationToken) -> Result<(), OpenClawError> {
        let mut backoff = Backoff::default();
        let mut dropped_device_token = false;
        let result = loop {
            if shutdown.is_cancelled() {
                break Ok(());
            }
            let creds = Credentials {
                gateway_token: self.settings.gateway_token.clone(),
                device_token: self.key.device_token(&self.settings.gateway),
            };
            let connected = tokio::select! {
                _ = shutdown.cancelled() => break Ok(()),
                r = self.connect(&creds) => r,
            };
            let mut conn = match connected {
                Ok(c) => c,
                Err(HandshakeError::Refused(e))
                    if creds.device_token.is_some() && !dropped_device_token =>
                {
                    tracing::warn!(error = %e, "the gateway refused the stored device token; forgetting it and connecting again");
                    dropped_device_token = true;
                    if let Err(e) = self.key.store_device_token(&self.settings.gateway, None) {
                        break Err(e.into());
                    }
                    continue;
                }
                Err(HandshakeError::Refused(e)) => break Err(self.refused(e)),
                Err(HandshakeError::Unavailable(e)) => {
                    // A gateway started again listens before it serves: the pause it asks
                    // for, else the backoff's. The device token stays: nothing was refused.
                    let pause = e
                        .retry_after()
                        .map_or_else(|| backoff.next(), |p| p.clamp(MIN_RETRY_AFTER, MAX_PAUSE));
                    tracing::info!(gateway = %self.settings.gateway, reason = %e, ?pause, "the OpenClaw gateway is not taking connections yet; trying again");
                    if self.idle(pause, &shutdown).await {
                        break Ok(());
                    }
                    continue;
                }
                Err(HandshakeError::Lost(Lost(why))) => {
                    let pause = backoff.next();
                    tracing::warn!(gateway = %self.settings.gateway, reason = %why, ?pause, "cannot connect to the OpenClaw gateway; trying again");
                    if self.idle(pause, &shutdown).await {
                        break Ok(());
                    }
                    continue;
                }
            };
            backoff.reset();
            dropped_device_token = false;
            tracing::info!(gateway = %self.settings.gateway, "connected to the OpenClaw gateway");
            match self.serve(&mut conn, &shutdown).await {
                End::Stop | End::TurnOver => {
                    conn.close().await;
                    break Ok(());
                }
                End::Lost(Lost(why)) => {
                    let pause = backoff.next();
                    tracing::warn!(reason = %why, ?pause, "the OpenClaw gateway connection was lost; pending approvals stay open while the gateway holds them; reconnecting");
                    if self.idle(pause, &shutdown).await {
                        break Ok(());
                    }
                }
            }
        };
        let result = match (result, &self.turn) {
            // Cut off under a restarted gateway: the attempt is left to the runner's report.
            (Ok(()), Turn::Running { .. }) if self.turn_lost() => Err(OpenClawError::TurnLost(
                "the OpenClaw gateway restarted during the turn".into(),
            )),
            (Ok(()), Turn::Refused(why)) => Err(OpenClawError::TurnRefused(why.clone())),
            (r, _) => r,
        };
        match &result {
            Err(OpenClawError::TurnLost(why)) => {
                tracing::warn!(%why, "leaving the attempt for the runner to revive the run");
                self.background.abort_all();
            }
            _ => self.stop().await,
        }
        result
    }

    /// Whether the bound run's turn was accepted by a gateway process that is gone.
    fn turn_lost(&self) -> bool {
        matches!(&self.turn, Turn::Running { boot: Some(b), .. } if self.boot.as_ref().is_some_and(|now| now != b))
    }

    fn refused(&self, e: GatewayError) -> OpenClawError {
        let text = format!("{} {}", e.code, e.message).to_ascii_lowercase();
        let hint = if text.contains("pair") {
            let request = e
                .details
                .as_ref()
                .and_then(|d| d.get("requestId"))
                .and_then(Value::as_str)
                .map_or_else(|| "<requestId>".to_owned(), str::to_owned);
            format!(
                "approve it on the gateway host (`openclaw devices list`, then `openclaw devices approve {request}`) and run the adapter again"
            )
        } else if text.contains("signature") {
            "the device signature did not verify: check this host's clock and that `--device-key` is the key the gateway paired".to_owned()
        } else if text.contains("token") || text.contains("unauthorized") {
            "check `--gateway-token` (the gateway's `gateway.auth.token`)".to_owned()
        } else if text.contains("protocol") {
            "this adapter speaks gateway protocol 4: upgrade OpenClaw or the adapter".to_owned()
        } else {
            "see the gateway's log for why".to_owned()
        };
        OpenClawError::Refused {
            code: e.code,
            message: e.message,
            device_id: self.key.device_id(),
            hint,
        }
    }

    async fn connect(&mut self, creds: &Credentials) -> Result<Conn, HandshakeError> {
        let mut conn = Conn::open(&self.settings.gateway, HANDSHAKE_TIMEOUT)
            .await
            .map_err(HandshakeError::Lost)?;
        let hello = conn
            .handshake(&self.key, &self.settings.client, creds, HANDSHAKE_TIMEOUT)
            .await?;
        self.boot = hello
            .pointer("/server/bootId")
            .and_then(Value::as_str)
            .map(str::to_owned);
        if let Some(auth) = hello.get("auth")
            && let Ok(token) = serde_json::from_value::<StoredToken>(auth.clone())
            && creds.device_token.as_deref() != Some(token.device_token.as_str())
        {
            match self
                .key
                .store_device_token(&self.settings.gateway, Some(&token))
            {
                Ok(()) => {
                    tracing::info!(path = %self.key.token_path().display(), "kept the device token the gateway issued")
                }
                Err(e) => tracing::warn!(error = %e, "cannot keep the device token"),
            }
        }
        Ok(conn)
    }

    /// Waits out `pause` while still handling what background tasks report; true on shutdown.
    async fn idle(&mut self, pause: Duration, shutdown: &CancellationToken) -> bool {
        let until = Instant::now() + pause;
        loop {
            self.tidy();
            tokio::select! {
                _ = shutdown.cancelled() => return true,
                _ = tokio::time::sleep_until(until) => return false,
                Some(m) = self.rx.recv() => {
                    // Without a connection nothing can be lost.
                    let _ = self.on_internal(None, m).await;
                }
            }
        }
    }

    async fn serve(&mut self, conn: &mut Conn, shutdown: &CancellationToken) -> End {
        if let Err(l) = self.backfill(conn).await {
            return End::Lost(l);
        }
        let mut poll = tokio::time::interval(TURN_POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            self.tidy();
            if self.turn_lost() {
                return End::Stop;
            }
            // Over once what the gateway sent before it said so is handled (the turn's last
            // message comes before `agent.wait` answers that it ended).
            if matches!(self.turn, Turn::Over(_) | Turn::Refused(_)) && conn.buffered.is_empty() {
                return End::TurnOver;
            }
            if let Some(f) = conn.buffered.pop_front() {
                if let Err(l) = self.on_frame(conn, f).await {
                    return End::Lost(l);
                }
                continue;
            }
            if std::mem::take(&mut conn.overflowed) {
                // Events were dropped: what they said is read back, and the `seq` they took
                // is not a gap to backfill for again.
                conn.last_seq = None;
                if let Err(l) = self.backfill(conn).await {
                    return End::Lost(l);
                }
                continue;
            }
            let bound = self.settings.bound.is_some();
            let step = tokio::select! {
                _ = shutdown.cancelled() => {
                    // The runner ends a cancelled run with `SIGTERM`: its turn is aborted in
                    // the gateway first, where it would otherwise go on.
                    if bound && let Err(l) = self.abort_if_cancelled(conn).await {
                        return End::Lost(l);
                    }
                    return End::Stop;
                }
                _ = poll.tick(), if bound => self.check_turn(conn).await,
                f = conn.recv() => match f {
                    Ok(f) => self.on_frame(conn, f).await,
                    Err(l) => Err(l),
                },
                Some(m) = self.rx.recv() => self.on_internal(Some(conn), m).await,
            };
            if let Err(l) = step {
                return End::Lost(l);
            }
        }
    }

    /// On every (re)connect and after a `seq` gap: sessions, the task ledger and pending
    /// approvals, then the subscriptions, then whatever is owed to the gateway.
    async fn backfill(&mut self, conn: &mut Conn) -> Result<(), Lost> {
        tracing::debug!("backfilling from the gateway");
        match conn.call("sessions.list", json!({}), CALL_TIMEOUT).await? {
            Ok(v) => {
                for row in rows(&v, "sessions") {
                    if let Some(key) = str_of(&row, &["key", "sessionKey"]) {
                        self.session(&key, Some(&row)).await;
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "`sessions.list` failed; sessions are mirrored as their events come")
            }
        }
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_LEDGER_PAGES {
            let params = cursor.as_ref().map_or(json!({}), |c| json!({"cursor": c}));
            match conn.call("tasks.list", params, CALL_TIMEOUT).await? {
                Ok(v) => {
                    for entry in rows(&v, "tasks") {
                        self.on_ledger(&entry).await;
                    }
                    cursor = v
                        .get("nextCursor")
                        .and_then(Value::as_str)
                        .map(str::to_owned);
                    if cursor.is_none() {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "`tasks.list` failed; the task ledger is not mirrored this time");
                    break;
                }
            }
        }
        match conn
            .call("exec.approval.list", json!({}), CALL_TIMEOUT)
            .await?
        {
            Ok(v) => {
                let listed = rows(&v, "approvals");
                let ids: HashSet<String> =
                    listed.iter().filter_map(|a| str_of(a, &["id"])).collect();
                for a in &listed {
                    self.on_requested(a).await;
                }
                let gone: Vec<String> = self
                    .approvals
                    .keys()
                    .filter(|id| !ids.contains(*id))
                    .cloned()
                    .collect();
                for id in gone {
                    self.close_gone(&id, "OpenClaw no longer holds it (it timed out or was answered while the adapter was away)").await;
                }
            }
            // Without the list, an approval the gateway no longer holds would stay open in
            // the inbox until its own expiry: when the gateway says a retry may work, the
            // connection is dropped and the backfill runs again on the next one.
            Err(e) if e.is_transient() => {
                return Err(Lost(format!(
                    "`exec.approval.list` failed ({e}); reconnecting to list them again"
                )));
            }
            Err(e) => {
                tracing::warn!(error = %e, "`exec.approval.list` failed; pending approvals are not backfilled")
            }
        }
        if let Err(e) = conn
            .call("sessions.subscribe", json!({}), CALL_TIMEOUT)
            .await?
        {
            tracing::warn!(error = %e, "`sessions.subscribe` failed");
        }
        // A runner's run is followed from the start, before its session exists in the gateway:
        // its turn's messages and tools are subscribed to before the turn is sent.
        if let Some(b) = self.settings.bound.clone() {
            self.session(&b.key, None).await;
        }
        let live: Vec<String> = self
            .sessions
            .iter()
            .filter(|(_, s)| matches!(s, Slot::Live(_)))
            .map(|(k, _)| k.clone())
            .collect();
        for key in live {
            if let Err(e) = conn
                .call(
                    "sessions.messages.subscribe",
                    json!({"key": key}),
                    CALL_TIMEOUT,
                )
                .await?
            {
                tracing::debug!(error = %e, %key, "`sessions.messages.subscribe` failed");
            }
        }
        self.send_owed(conn).await?;
        self.check_turn(conn).await
    }

    /// The bound run's turn: sent once its session is followed, then asked after while it
    /// runs (`agent.wait` without waiting), until it is over.
    async fn check_turn(&mut self, conn: &mut Conn) -> Result<(), Lost> {
        let Some(b) = self.settings.bound.clone() else {
            return Ok(());
        };
        match self.sessions.get(&b.key) {
            Some(Slot::Live(_)) => {}
            Some(Slot::Detached {
                reason,
                retry_at: None,
            }) => {
                self.turn = if self.turn == Turn::Unsent {
                    Turn::Refused(format!("the run cannot go on: {reason}"))
                } else {
                    Turn::Over(reason.clone())
                };
                return Ok(());
            }
            Some(Slot::Cancelled { abort_sent: true }) => {
                self.turn = Turn::Over("aborted".into());
                return Ok(());
            }
            Some(Slot::Cancelled { abort_sent: false }) => return Ok(()),
            // Not attached yet (a previous lease is waited out, or a passing failure).
            _ => {
                self.session(&b.key, None).await;
                return Ok(());
            }
        }
        match self.turn.clone() {
            Turn::Unsent => {
                // The first turn makes the session, in the run's directory (`sessions.create`
                // keeps it as the session's working directory; `agent` takes none); later
                // turns go into it (`chat.send`). Making it again would reset its history.
                let exists = matches!(
                    conn.call("sessions.describe", json!({"key": b.key}), CALL_TIMEOUT)
                        .await?,
                    Ok(v) if v.get("session").is_some_and(Value::is_object)
                );
                let (method, params) = if exists {
                    (
                        "chat.send",
                        json!({
                            "sessionKey": b.key,
                            "message": b.message,
                            "idempotencyKey": b.turn_key,
                            "deliver": false,
                        }),
                    )
                } else {
                    let mut p = json!({
                        "key": b.key,
                        "message": b.message,
                        "idempotencyKey": b.turn_key,
                    });
                    if let Some(cwd) = &b.cwd {
                        p["cwd"] = json!(cwd);
                    }
                    ("sessions.create", p)
                };
                match conn.call(method, params, CALL_TIMEOUT).await? {
                    Ok(v) => {
                        if let Some(e) = v.get("runError").filter(|e| !e.is_null()) {
                            let why = str_of(e, &["message"]).unwrap_or_else(|| e.to_string());
                            tracing::warn!(%method, error = %why, "the gateway made the session but did not start the turn");
                            self.turn = Turn::Refused(why);
                            return Ok(());
                        }
                        let status = str_of(&v, &["status"]).unwrap_or_default();
                        let run_id = str_of(&v, &["runId"]).unwrap_or_else(|| b.turn_key.clone());
                        tracing::info!(key = %b.key, %method, %run_id, %status, "sent the run's turn");
                        self.turn =
                            if status.is_empty() || TURN_UNDER_WAY.contains(&status.as_str()) {
                                Turn::Running {
                                    run_id,
                                    boot: self.boot.clone(),
                                }
                            } else {
                                Turn::Over(status)
                            };
                    }
                    // Sent again at the next poll, with the same key.
                    Err(e) if e.is_transient() => {
                        tracing::warn!(%method, error = %e, "the gateway cannot take the turn yet; trying again")
                    }
                    Err(e) => {
                        tracing::warn!(%method, error = %e, "the gateway refused the turn");
                        self.turn = Turn::Refused(e.to_string());
                    }
                }
            }
            Turn::Running { run_id, .. } => {
                match conn
                    .call(
                        "agent.wait",
                        json!({"runId": run_id, "timeoutMs": 0}),
                        CALL_TIMEOUT,
                    )
                    .await?
                {
                    Ok(v) => {
                        let status = str_of(&v, &["status"]).unwrap_or_default();
                        if !TURN_UNDER_WAY.contains(&status.as_str()) {
                            let what = match str_of(&v, &["error", "stopReason"]) {
                                Some(why) => format!("{status}: {why}"),
                                None => status,
                            };
                            tracing::info!(key = %b.key, %run_id, %what, "the run's turn is over");
                            self.turn = Turn::Over(what);
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "`agent.wait` failed; asking again"),
                }
            }
            Turn::Over(_) | Turn::Refused(_) => {}
        }
        Ok(())
    }

    /// When the bound run's task was cancelled: its turn is aborted in the gateway.
    async fn abort_if_cancelled(&mut self, conn: &mut Conn) -> Result<(), Lost> {
        let Some(b) = self.settings.bound.clone() else {
            return Ok(());
        };
        if matches!(
            self.sessions.get(&b.key),
            Some(Slot::Cancelled { abort_sent: true })
        ) {
            return Ok(());
        }
        if let Ok(d) = self.client.task(&b.task).await
            && d.task.state == TaskState::Cancelled
        {
            self.send_abort(conn, &b.key).await?;
        }
        Ok(())
    }

    /// Re-sends answers, steers and aborts the gateway has not taken yet (an answer is
    /// idempotent by approval id: a second one for a settled approval is refused, not applied).
    async fn send_owed(&mut self, conn: &mut Conn) -> Result<(), Lost> {
        let answers: Vec<String> = self
            .approvals
            .iter()
            .filter(|(_, a)| {
                matches!(
                    a.state,
                    ApprovalState::Answered {
                        confirmed: false,
                        ..
                    }
                )
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in answers {
            self.send_resolve(conn, &id).await?;
        }
        let keys: Vec<String> = self.sessions.keys().cloned().collect();
        for key in keys {
            match self.sessions.get(&key) {
                Some(Slot::Live(s)) if s.steer.is_some() => self.send_steer(conn, &key).await?,
                Some(Slot::Cancelled { abort_sent: false }) => self.send_abort(conn, &key).await?,
                _ => {}
            }
        }
        Ok(())
    }

    async fn on_frame(&mut self, conn: &mut Conn, frame: Frame) -> Result<(), Lost> {
        let Frame::Event {
            event,
            payload,
            seq,
        } = frame
        else {
            return Ok(());
        };
        let mut gap = false;
        if let Some(seq) = seq {
            if let Some(last) = conn.last_seq
                && seq != last + 1
            {
                tracing::warn!(last, seq, "events were missed (seq gap); backfilling");
                gap = true;
            }
            conn.last_seq = Some(seq);
        }
        match event.as_str() {
            "exec.approval.requested" => {
                self.on_requested(&payload).await;
            }
            "exec.approval.resolved" => self.on_resolved(&payload).await,
            "session.tool" => self.on_tool(&payload).await,
            "session.message" => self.on_message(&payload).await,
            "task" => {
                let entry = payload.get("task").cloned().unwrap_or(payload);
                self.on_ledger(&entry).await;
            }
            "sessions.changed" => {
                if let Some(key) = str_of(&payload, &["key", "sessionKey"]) {
                    self.session(&key, Some(&payload)).await;
                }
            }
            "shutdown" => {
                tracing::info!(payload = %payload, "the gateway is shutting down; reconnecting after")
            }
            "tick" | "connect.challenge" => {}
            other => tracing::trace!(event = other, "gateway event not mirrored"),
        }
        if gap {
            self.backfill(conn).await?;
        }
        Ok(())
    }

    async fn on_internal(&mut self, conn: Option<&mut Conn>, m: Internal) -> Result<(), Lost> {
        match m {
            Internal::DecisionClosed {
                approval_id,
                decision,
            } => self.on_decision(conn, &approval_id, *decision).await?,
            Internal::GatewayExpired {
                approval_id,
                decision_id,
            } => {
                if self
                    .approvals
                    .get(&approval_id)
                    .is_some_and(|a| a.decision_id == decision_id)
                {
                    self.close_gone(&approval_id, "it timed out in OpenClaw")
                        .await;
                }
            }
            Internal::ResolveGrace {
                approval_id,
                decision_id,
            } => {
                let confirmed = self.approvals.get(&approval_id).is_some_and(|a| {
                    a.decision_id == decision_id
                        && matches!(
                            a.state,
                            ApprovalState::Answered {
                                confirmed: true,
                                ..
                            }
                        )
                });
                if confirmed && let Some(a) = self.close(&approval_id) {
                    report(
                        &a,
                        DeliveryState::Acknowledged,
                        "`exec.approval.resolve` answered ok (no `exec.approval.resolved` event came)",
                    )
                    .await;
                }
            }
            Internal::Steer {
                key,
                attempt_id,
                revision,
                text,
            } => {
                if let Some(Slot::Live(s)) = self.sessions.get_mut(&key)
                    && s.run.attempt().id == attempt_id
                {
                    s.steer = Some((revision, text));
                    if let Some(conn) = conn {
                        self.send_steer(conn, &key).await?;
                    }
                }
            }
            Internal::RunEnded { key, attempt_id } => {
                self.on_run_ended(conn, &key, &attempt_id).await?
            }
        }
        Ok(())
    }

    // ---- sessions -------------------------------------------------------------------------

    /// The session's run, attaching it (task found by its key, attempt started) on first
    /// sight; `None` when it is not mirrored.
    async fn session(&mut self, key: &str, row: Option<&Value>) -> Option<Arc<Run>> {
        // Following one run: only its session. Mirroring: every session but runners' runs,
        // which their own adapters follow.
        let bound = self.settings.bound.clone();
        match &bound {
            Some(b) if b.key != key => return None,
            None if super::is_run_session(key) => {
                tracing::trace!(%key, "a Waymark runner's run: its own adapter follows it");
                return None;
            }
            _ => {}
        }
        match self.sessions.get(key) {
            Some(Slot::Live(s)) => return Some(s.run.clone()),
            Some(Slot::Detached {
                retry_at: Some(at), ..
            }) if *at <= Instant::now() => {}
            Some(Slot::Detached { reason, .. }) => {
                tracing::debug!(%key, %reason, "session not mirrored");
                return None;
            }
            Some(Slot::Cancelled { .. }) => return None,
            None => {}
        }
        let title = row
            .and_then(|r| str_of(r, &["label", "displayName", "derivedTitle", "title"]))
            .unwrap_or_else(|| format!("OpenClaw session {key}"));
        let goal = row
            .and_then(|r| str_of(r, &["agentId"]))
            .map(|a| format!("OpenClaw agent `{a}`, session `{key}`"))
            .unwrap_or_default();
        let spec = SessionSpec {
            runtime: RUNTIME.into(),
            key: key.to_owned(),
            title,
            goal,
        };
        let attached = match &bound {
            Some(b) => bridge::start(&self.client, &b.task, WORKER, WAIT_FOR_LEASE).await,
            None => bridge::attach(&self.client, &spec, WORKER, WAIT_FOR_LEASE).await,
        };
        let run = match attached {
            Ok(run) => Arc::new(run),
            Err(e) => {
                let retry_at = match &e {
                    waymark_worker::Error::Refused { .. } => None,
                    _ => Some(Instant::now() + ATTACH_RETRY),
                };
                tracing::warn!(%key, error = %e, "cannot mirror this OpenClaw session");
                self.sessions.insert(
                    key.to_owned(),
                    Slot::Detached {
                        reason: e.to_string(),
                        retry_at,
                    },
                );
                return None;
            }
        };
        tracing::info!(%key, task = %run.task_id(), attempt = %run.attempt().id, "mirroring an OpenClaw session");
        // A runner's run records its working tree from the start (then after each tool call),
        // for the admission of a revive.
        if let Some(t) = &self.tree {
            t.after_call(&run).await;
        }
        let mut session = Session {
            run: run.clone(),
            ledger: HashMap::new(),
            tools: HashMap::new(),
            steer: None,
        };
        match self.client.task(run.task_id()).await {
            Ok(detail) => {
                for m in &detail.messages {
                    if let Some((id, status)) = parse_ledger_note(&m.text) {
                        session.ledger.insert(id, status);
                    }
                }
                self.adopt_decisions(&run, &detail.decisions);
            }
            Err(e) => {
                tracing::warn!(%key, error = %e, "cannot read the task back; earlier approvals are matched by the gateway's list only")
            }
        }
        self.background
            .spawn(watch_control(run.clone(), key.to_owned(), self.tx.clone()));
        self.sessions
            .insert(key.to_owned(), Slot::Live(Box::new(session)));
        Some(run)
    }

    /// Picks up the approvals an earlier adapter process opened on this task, so a restart
    /// neither duplicates nor forgets them.
    fn adopt_decisions(&mut self, run: &Arc<Run>, decisions: &[Decision]) {
        let mut newest: HashMap<String, &Decision> = HashMap::new();
        for d in decisions {
            if d.kind != DecisionKind::Approval {
                continue;
            }
            if let Some(id) = d.intent.as_ref().and_then(approval_id_of) {
                newest.insert(id, d);
            }
        }
        for (id, d) in newest {
            if self.approvals.contains_key(&id) {
                continue;
            }
            let expires_at_ms = d
                .intent
                .as_ref()
                .and_then(|i| i.get("expiresAtMs"))
                .and_then(Value::as_i64)
                .unwrap_or(0);
            let state = match d.status {
                DecisionStatus::Pending => ApprovalState::Open,
                DecisionStatus::Resolved
                    if d.delivery
                        .as_ref()
                        .is_some_and(|x| x.state == DeliveryState::Pending) =>
                {
                    ApprovalState::Answered {
                        decision: gateway_decision(waymark_worker::chosen_option(d)).into(),
                        sent: true,
                        confirmed: false,
                    }
                }
                // A void decision is opened again if the gateway still lists the approval.
                DecisionStatus::Void => continue,
                _ => {
                    self.closed.insert(id, closed_until(expires_at_ms));
                    continue;
                }
            };
            tracing::info!(approval = %id, decision = %d.id, ?state, "picked up an approval opened earlier");
            let open = state == ApprovalState::Open;
            self.approvals.insert(
                id.clone(),
                Approval {
                    run: run.clone(),
                    decision_id: d.id.clone(),
                    tool: d
                        .intent
                        .as_ref()
                        .and_then(|i| i.get("request"))
                        .and_then(guarded_tool),
                    expires_at_ms,
                    state,
                },
            );
            self.spawn_timers(&id, open);
        }
    }

    async fn on_run_ended(
        &mut self,
        conn: Option<&mut Conn>,
        key: &str,
        attempt_id: &str,
    ) -> Result<(), Lost> {
        let Some(Slot::Live(s)) = self.sessions.get(key) else {
            return Ok(());
        };
        if s.run.attempt().id != attempt_id {
            return Ok(());
        }
        let task_id = s.run.task_id().to_owned();
        let asking: Vec<(String, i64)> = self
            .approvals
            .iter()
            .filter(|(_, a)| a.run.task_id() == task_id && a.state == ApprovalState::Open)
            .map(|(id, a)| (id.clone(), a.expires_at_ms))
            .collect();
        // Its approvals and tool calls die with the attempt; a new attempt adopts them again.
        self.approvals.retain(|_, a| a.run.task_id() != task_id);
        let state = self.client.task(&task_id).await.map(|d| d.task.state);
        let slot = match state {
            Ok(TaskState::Cancelled) => {
                tracing::info!(%key, task = %task_id, "the task was cancelled; aborting the OpenClaw session");
                Slot::Cancelled { abort_sent: false }
            }
            // A runner's run stops at a pause: its turn is aborted (the session is kept, and
            // the resume sends the next turn into it), as a cancel's is.
            Ok(TaskState::Paused) if self.settings.bound.is_some() => {
                tracing::info!(%key, task = %task_id, "the task was paused; stopping the run's turn");
                Slot::Cancelled { abort_sent: false }
            }
            Ok(s) if s.is_terminal() || s == TaskState::Paused => Slot::Detached {
                reason: format!("the task is {s}"),
                retry_at: None,
            },
            // The lease was lost (the adapter stalled): attach again on the next sign of life.
            _ => Slot::Detached {
                reason: "the attempt's lease was lost".into(),
                retry_at: Some(Instant::now()),
            },
        };
        let abort = matches!(slot, Slot::Cancelled { .. });
        self.sessions.insert(key.to_owned(), slot);
        if abort && let Some(conn) = conn {
            self.send_abort(conn, key).await?;
            for (id, expires_at_ms) in asking {
                self.deny_cancelled(conn, &id, expires_at_ms).await?;
            }
        }
        Ok(())
    }

    /// Denies in OpenClaw an exec request of a cancelled run: nothing of a cancelled run may
    /// run, whether or not the session's abort reached the run that asked (a turn the gateway
    /// was still starting is not among the runs `sessions.abort` finds). Its decision was
    /// voided by the cancel; no delivery is reported on it.
    async fn deny_cancelled(
        &mut self,
        conn: &mut Conn,
        id: &str,
        expires_at_ms: i64,
    ) -> Result<(), Lost> {
        self.approvals.remove(id);
        self.closed
            .insert(id.to_owned(), closed_until(expires_at_ms));
        let params = json!({"id": id, "decision": "deny"});
        match conn
            .call("exec.approval.resolve", params, CALL_TIMEOUT)
            .await?
        {
            Ok(_) => {
                tracing::info!(approval = %id, "the run was cancelled; denied its exec request in OpenClaw")
            }
            // The abort closed it first, or it timed out: either way it does not run.
            Err(e) => {
                tracing::debug!(approval = %id, error = %e, "the cancelled run's exec request was already closed")
            }
        }
        Ok(())
    }

    async fn send_steer(&mut self, conn: &mut Conn, key: &str) -> Result<(), Lost> {
        let Some(Slot::Live(s)) = self.sessions.get(key) else {
            return Ok(());
        };
        let Some((revision, text)) = s.steer.clone() else {
            return Ok(());
        };
        let idempotency_key = format!("waymark:{}:r{revision}", s.run.task_id());
        let res = conn
            .call(
                "sessions.steer",
                json!({"key": key, "message": text, "idempotencyKey": idempotency_key}),
                CALL_TIMEOUT,
            )
            .await?;
        match res {
            Ok(_) => tracing::info!(%key, revision, "steered the OpenClaw session"),
            Err(e) => {
                tracing::warn!(%key, revision, error = %e, "the gateway refused `sessions.steer`")
            }
        }
        if let Some(Slot::Live(s)) = self.sessions.get_mut(key)
            && s.steer.as_ref().is_some_and(|(r, _)| *r == revision)
        {
            s.steer = None;
        }
        Ok(())
    }

    /// The key of the session followed for `task_id`'s run, while it is followed.
    fn followed_key_of(&self, task_id: &str) -> Option<String> {
        self.sessions.iter().find_map(|(key, slot)| match slot {
            Slot::Live(s) if s.run.task_id() == task_id => Some(key.clone()),
            _ => None,
        })
    }

    async fn send_abort(&mut self, conn: &mut Conn, key: &str) -> Result<(), Lost> {
        let res = conn
            .call("sessions.abort", json!({"key": key}), CALL_TIMEOUT)
            .await?;
        match res {
            Ok(v) => tracing::info!(%key, status = %v, "aborted the OpenClaw session"),
            Err(e) => tracing::warn!(%key, error = %e, "the gateway refused `sessions.abort`"),
        }
        self.sessions
            .insert(key.to_owned(), Slot::Cancelled { abort_sent: true });
        Ok(())
    }

    // ---- approvals ------------------------------------------------------------------------

    /// `exec.approval.requested`, or one row of `exec.approval.list`. Says whether the
    /// approval was opened, and when it was not because the run is over.
    async fn on_requested(&mut self, payload: &Value) -> Asked {
        let Some(id) = str_of(payload, &["id"]) else {
            tracing::warn!(%payload, "an exec approval without an id; ignored");
            return Asked::Left;
        };
        if self.approvals.contains_key(&id) || self.closed.contains_key(&id) {
            return Asked::Left;
        }
        if let Some(kind) = str_of(payload, &["approvalKind"])
            && kind != "exec"
        {
            tracing::debug!(approval = %id, %kind, "not an exec approval; left to OpenClaw");
            return Asked::Left;
        }
        let request = payload.get("request").cloned().unwrap_or(Value::Null);
        let expires_at_ms = payload
            .get("expiresAtMs")
            .and_then(Value::as_i64)
            .unwrap_or_else(|| now_ms() + 120_000);
        let remaining = expires_at_ms - now_ms();
        if remaining <= 0 {
            tracing::info!(approval = %id, "already timed out in OpenClaw; not opened");
            return Asked::Left;
        }
        let key = str_of(&request, &["sessionKey"])
            .unwrap_or_else(|| format!("gateway:{}", self.settings.gateway));
        let Some(run) = self.session(&key, None).await else {
            tracing::info!(approval = %id, session = %key, "the session is not mirrored; the approval is left to OpenClaw");
            return Asked::Left;
        };
        let intent = json!({
            "runtime": RUNTIME,
            "approval": "exec",
            "id": id,
            "request": request,
            "createdAtMs": payload.get("createdAtMs").cloned().unwrap_or(Value::Null),
            "expiresAtMs": expires_at_ms,
        });
        let command = str_of(&request, &["command"])
            .or_else(|| {
                str_of(
                    request.get("systemRunPlan").unwrap_or(&Value::Null),
                    &["commandText"],
                )
            })
            .unwrap_or_else(|| "a command".into());
        let mut summary = format!("OpenClaw wants to run `{command}`");
        if let Some(cwd) = str_of(&request, &["cwd"]) {
            summary.push_str(&format!(" in `{cwd}`"));
        }
        if let Some(agent) = str_of(&request, &["agentId"]) {
            summary.push_str(&format!(" (agent `{agent}`)"));
        }
        let choices = choices_for(&request);
        let expires_in = Duration::from_millis(remaining as u64) + EXPIRY_GRACE;
        match bridge::open_approval(
            &run,
            intent,
            &summary,
            ApprovalDurability::ConnectionBound,
            &choices,
            Some(expires_in),
            // The gateway expires it on its own; the command does not run.
            Some(AskedRuntimeDeadline {
                runtime: "OpenClaw".into(),
                in_seconds: (remaining as u64).div_ceil(1000),
                then: RuntimeFallback::Denies,
            }),
        )
        .await
        {
            Ok(d) => {
                tracing::info!(approval = %id, decision = %d.id, "opened an approval for an OpenClaw exec request");
                self.approvals.insert(
                    id.clone(),
                    Approval {
                        run,
                        decision_id: d.id,
                        tool: guarded_tool(&request),
                        expires_at_ms,
                        state: ApprovalState::Open,
                    },
                );
                self.spawn_timers(&id, true);
                Asked::Opened
            }
            Err(e) if run_is_over(&e) => {
                tracing::info!(approval = %id, error = %e, "the run is over; the approval is not opened");
                Asked::RunOver
            }
            Err(e) => {
                tracing::warn!(approval = %id, error = %e, "cannot open the approval; it is left to OpenClaw");
                Asked::Left
            }
        }
    }

    /// Starts the decision long-poll (when `wait`) and the gateway-expiry timer of an approval.
    fn spawn_timers(&mut self, id: &str, wait: bool) {
        let Some(a) = self.approvals.get(id) else {
            return;
        };
        if wait {
            let (run, decision_id, approval_id, tx) = (
                a.run.clone(),
                a.decision_id.clone(),
                id.to_owned(),
                self.tx.clone(),
            );
            self.background.spawn(async move {
                match run.await_decision(&decision_id).await {
                    Ok(decision) => {
                        let _ = tx
                            .send(Internal::DecisionClosed {
                                approval_id,
                                decision: Box::new(decision),
                            })
                            .await;
                    }
                    Err(e) => tracing::debug!(decision = %decision_id, error = %e, "stopped waiting for a decision"),
                }
            });
        }
        // A little after the gateway's expiry, so its own `resolved` lands first if it comes.
        let at = Instant::now()
            + Duration::from_millis((a.expires_at_ms - now_ms()).max(0) as u64)
            + Duration::from_millis(500);
        let (decision_id, approval_id, tx) =
            (a.decision_id.clone(), id.to_owned(), self.tx.clone());
        self.background.spawn(async move {
            tokio::time::sleep_until(at).await;
            let _ = tx
                .send(Internal::GatewayExpired {
                    approval_id,
                    decision_id,
                })
                .await;
        });
    }

    async fn on_decision(
        &mut self,
        conn: Option<&mut Conn>,
        id: &str,
        d: Decision,
    ) -> Result<(), Lost> {
        let Some(a) = self
            .approvals
            .get_mut(id)
            .filter(|a| a.decision_id == d.id && a.state == ApprovalState::Open)
        else {
            return Ok(());
        };
        match d.status {
            DecisionStatus::Resolved => {
                let decision = gateway_decision(waymark_worker::chosen_option(&d));
                tracing::info!(approval = %id, decision, "a person answered; resolving it in OpenClaw");
                a.state = ApprovalState::Answered {
                    decision: decision.into(),
                    sent: false,
                    confirmed: false,
                };
                if let Some(conn) = conn {
                    self.send_resolve(conn, id).await?;
                }
            }
            DecisionStatus::Void => {
                // A replan voided it, but OpenClaw still waits: ask again under the new plan.
                let Some(a) = self.approvals.remove(id) else {
                    return Ok(());
                };
                if a.expires_at_ms > now_ms()
                    && let Some(intent) = d.intent.clone()
                {
                    let payload = json!({
                        "id": id,
                        "request": intent.get("request").cloned().unwrap_or(Value::Null),
                        "createdAtMs": intent.get("createdAtMs").cloned().unwrap_or(Value::Null),
                        "expiresAtMs": a.expires_at_ms,
                    });
                    if self.on_requested(&payload).await == Asked::RunOver
                        && let Some(conn) = conn
                    {
                        // Voided by a cancel, not a replan. The run's turn is aborted first, as
                        // when its attempt ends (which may come after this): denied first, the
                        // turn would end on the refusal and the abort find nothing to stop —
                        // seen under load, where the void outran the attempt's end.
                        if let Some(key) = self.followed_key_of(a.run.task_id()) {
                            self.send_abort(conn, &key).await?;
                        }
                        self.deny_cancelled(conn, id, a.expires_at_ms).await?;
                    }
                }
            }
            // Expired by the server's default (the adapter was away past the grace): the
            // gateway times it out on its own.
            _ => {
                self.close(id);
            }
        }
        Ok(())
    }

    async fn send_resolve(&mut self, conn: &mut Conn, id: &str) -> Result<(), Lost> {
        let Some(a) = self.approvals.get_mut(id) else {
            return Ok(());
        };
        let ApprovalState::Answered { decision, sent, .. } = &mut a.state else {
            return Ok(());
        };
        *sent = true;
        // The params are closed (`{id, decision, reviewer?, grantExpiresInDays?}`): an
        // `idempotencyKey` is refused. The approval id makes it idempotent anyway.
        let params = json!({"id": id, "decision": decision.clone()});
        let decision_id = a.decision_id.clone();
        match conn
            .call("exec.approval.resolve", params, CALL_TIMEOUT)
            .await?
        {
            Ok(_) => {
                if let Some(a) = self.approvals.get_mut(id)
                    && let ApprovalState::Answered { confirmed, .. } = &mut a.state
                {
                    *confirmed = true;
                }
                // The gateway broadcasts `exec.approval.resolved` before it answers; when it
                // is not among the frames already read, give it a moment.
                let seen = conn.buffered.iter().any(|f| {
                    matches!(f, Frame::Event { event, payload, .. }
                        if event == "exec.approval.resolved"
                            && payload.get("id").and_then(Value::as_str) == Some(id))
                });
                if !seen {
                    let (tx, approval_id) = (self.tx.clone(), id.to_owned());
                    self.background.spawn(async move {
                        tokio::time::sleep(RESOLVED_EVENT_GRACE).await;
                        let _ = tx
                            .send(Internal::ResolveGrace {
                                approval_id,
                                decision_id,
                            })
                            .await;
                    });
                }
            }
            Err(e) => {
                if let Some(a) = self.close(id) {
                    report(
                        &a,
                        DeliveryState::Lost,
                        &format!("OpenClaw refused the answer: {e}"),
                    )
                    .await;
                }
            }
        }
        Ok(())
    }

    async fn on_resolved(&mut self, payload: &Value) {
        let Some(id) = str_of(payload, &["id"]) else {
            return;
        };
        let Some(a) = self.close(&id) else {
            return;
        };
        let decision = str_of(payload, &["decision"]).unwrap_or_else(|| "?".into());
        let resolved_by = str_of(payload, &["resolvedBy"]);
        let by = resolved_by
            .as_deref()
            .map(|b| format!(" by {b}"))
            .unwrap_or_default();
        match &a.state {
            ApprovalState::Open => {
                // OpenClaw 2026.9.6 closes the approvals of a run it aborted (a steer, an
                // abort) itself, as `deny` by `approval-scope-closed`: nobody answered it.
                let reason = if resolved_by.as_deref() == Some(SCOPE_CLOSED) {
                    format!(
                        "OpenClaw closed it: the run that asked ended before anyone answered ({decision}{by})"
                    )
                } else {
                    format!(
                        "answered in OpenClaw itself ({decision}{by}) before anyone answered here"
                    )
                };
                match a.run.expire_decision(&a.decision_id, &reason).await {
                    Ok(_) => tracing::info!(approval = %id, %reason, "expired our approval"),
                    Err(e) => {
                        tracing::warn!(approval = %id, error = %e, "cannot expire the approval")
                    }
                }
            }
            ApprovalState::Answered { decision: ours, .. } if *ours == decision => {
                report(
                    &a,
                    DeliveryState::Acknowledged,
                    &format!("exec.approval.resolved: {decision}{by}"),
                )
                .await;
            }
            ApprovalState::Answered { .. } => {
                report(
                    &a,
                    DeliveryState::Lost,
                    &format!("OpenClaw took another answer first: {decision}{by}"),
                )
                .await;
            }
        }
    }

    /// The gateway no longer holds the approval (timed out, or gone from its list).
    async fn close_gone(&mut self, id: &str, why: &str) {
        let Some(a) = self.close(id) else {
            return;
        };
        // Its exec will never be reported, and whether it ran cannot be asked: the approval
        // may have been answered in OpenClaw itself while the adapter was away (or, when the
        // gateway restarted, died unanswered with it — which the adapter cannot tell apart).
        if let Some((session, effect)) = &a.tool
            && let Some(Slot::Live(s)) = self.sessions.get_mut(session)
            && let Some(tx) = s.tools.remove(effect)
        {
            let _ = tx.send(Ended::Unknown(format!(
                "{why}; OpenClaw will not report this call's end, and whether it ran cannot be asked"
            )));
        }
        match &a.state {
            ApprovalState::Open => {
                if let Err(e) = a.run.expire_decision(&a.decision_id, why).await {
                    tracing::warn!(approval = %id, error = %e, "cannot expire the approval");
                } else {
                    tracing::info!(approval = %id, reason = why, "expired our approval");
                }
            }
            ApprovalState::Answered { .. } => {
                report(
                    &a,
                    DeliveryState::Lost,
                    &format!("{why}; it never confirmed our answer"),
                )
                .await;
            }
        }
    }

    /// Forgets an approval for good.
    fn close(&mut self, id: &str) -> Option<Approval> {
        let a = self.approvals.remove(id)?;
        self.closed
            .insert(id.to_owned(), closed_until(a.expires_at_ms));
        Some(a)
    }

    /// Drops finished background tasks and closed approvals the gateway no longer holds.
    fn tidy(&mut self) {
        bridge::reap(&mut self.background);
        bridge::reap(&mut self.mirrors);
        let now = now_ms();
        self.closed.retain(|_, until| *until > now);
    }

    // ---- mirroring --------------------------------------------------------------------------

    /// `session.tool`: a tool call starts or ends; an effect keyed
    /// `sessionKey:runId:toolCallId` ([`ToolEvent::read`]).
    async fn on_tool(&mut self, payload: &Value) {
        let Some(ev) = ToolEvent::read(payload) else {
            tracing::debug!(%payload, "a tool event without session or call id");
            return;
        };
        let effect_key = ev.effect_key();
        let Some(run) = self.session(&ev.key, None).await else {
            return;
        };
        let Some(Slot::Live(s)) = self.sessions.get_mut(&ev.key) else {
            return;
        };
        match ev.end {
            None => {
                if s.tools.contains_key(&effect_key) {
                    return;
                }
                let (tx, rx) = oneshot::channel();
                s.tools.insert(effect_key.clone(), tx);
                let intent = tool_intent(&ev.name, &ev.key, &ev.run_id, &ev.call, ev.args.as_ref());
                self.mirrors
                    .spawn(mirror_tool(run, effect_key, ev.name, intent, rx));
            }
            Some(end) => {
                if let Some(t) = &self.tree {
                    let (t, run) = (t.clone(), run.clone());
                    self.mirrors.spawn(async move { t.after_call(&run).await });
                }
                if let Some(tx) = s.tools.remove(&effect_key) {
                    let _ = tx.send(Ended::Reported(end));
                } else {
                    // The start was missed (or seen by an earlier adapter): record the end.
                    let (tx, rx) = oneshot::channel();
                    let _ = tx.send(Ended::Reported(end));
                    let intent = tool_intent(&ev.name, &ev.key, &ev.run_id, &ev.call, None);
                    self.mirrors
                        .spawn(mirror_tool(run, effect_key, ev.name, intent, rx));
                }
            }
        }
    }

    /// `session.message` → a message on the session's task.
    async fn on_message(&mut self, p: &Value) {
        let Some(key) = str_of(p, &["sessionKey", "key"]) else {
            return;
        };
        let msg = p.get("message").unwrap_or(p);
        let role = match str_of(msg, &["role"]).as_deref() {
            Some(r @ ("user" | "assistant" | "system" | "tool")) => r.to_owned(),
            Some("toolResult") => "tool".to_owned(),
            _ => "assistant".to_owned(),
        };
        let text = message_text(msg);
        if text.trim().is_empty() {
            return;
        }
        let Some(run) = self.session(&key, None).await else {
            return;
        };
        if let Err(e) = run.messages(vec![NewMessage { role, text }]).await {
            tracing::warn!(%key, error = %e, "cannot mirror a session message");
        }
    }

    /// A task-ledger entry → a status note on its session's task, once per status.
    async fn on_ledger(&mut self, entry: &Value) {
        let (Some(id), Some(key)) = (
            str_of(entry, &["id", "taskId"]),
            str_of(entry, &["sessionKey", "parentSessionKey"]),
        ) else {
            return;
        };
        let status = str_of(entry, &["status"]).unwrap_or_else(|| "unknown".into());
        let Some(run) = self.session(&key, None).await else {
            return;
        };
        let Some(Slot::Live(s)) = self.sessions.get_mut(&key) else {
            return;
        };
        if s.ledger.get(&id) == Some(&status) {
            return;
        }
        let text = ledger_note(&id, &status, entry);
        match run
            .messages(vec![NewMessage {
                role: "system".into(),
                text,
            }])
            .await
        {
            Ok(_) => {
                s.ledger.insert(id, status);
            }
            Err(e) => tracing::warn!(%key, error = %e, "cannot note a task-ledger entry"),
        }
    }

    /// Hands every session back (the task stays open for the next adapter).
    async fn stop(&mut self) {
        // A bound run's turn is over: what it called has ended and is being recorded.
        if self.settings.bound.is_some() {
            let settled = tokio::time::timeout(SETTLE, async {
                while self.mirrors.join_next().await.is_some() {}
            })
            .await;
            if settled.is_err() {
                tracing::warn!("tool calls were still being recorded when the adapter stopped");
            }
        }
        self.mirrors.abort_all();
        self.background.abort_all();
        for (key, slot) in self.sessions.drain() {
            let Slot::Live(s) = slot else {
                continue;
            };
            if let Turn::Refused(why) = &self.turn {
                let text = format!("OpenClaw did not run the turn: {why}");
                if let Err(e) = s
                    .run
                    .messages(vec![NewMessage {
                        role: "system".into(),
                        text,
                    }])
                    .await
                {
                    tracing::warn!(%key, error = %e, "cannot say why the turn did not run");
                }
            }
            let note = match &self.turn {
                Turn::Over(how) if self.settings.bound.is_some() => format!(
                    "the OpenClaw turn ended ({how}); the session stays open in OpenClaw for what comes next"
                ),
                Turn::Refused(why) => format!(
                    "the OpenClaw turn did not run ({why}); the session stays open in OpenClaw"
                ),
                _ => "the OpenClaw adapter stopped; the session goes on in OpenClaw".to_owned(),
            };
            if let Err(e) = s.run.finish(FinishOutcome::Released, Some(note)).await {
                tracing::debug!(%key, error = %e, "cannot hand the session back");
            }
        }
    }
}

/// How long a closed approval's id is remembered: past the gateway's expiry (plus grace) it is
/// not opened again anyway; an unknown expiry is remembered for a day.
fn closed_until(expires_at_ms: i64) -> i64 {
    if expires_at_ms > 0 {
        expires_at_ms + EXPIRY_GRACE.as_millis() as i64
    } else {
        now_ms() + 24 * 3600 * 1000
    }
}

/// Reports what the gateway did with an answer (logged when the control plane refuses).
async fn report(a: &Approval, state: DeliveryState, detail: &str) {
    let res = match state {
        DeliveryState::Acknowledged => bridge::acknowledge(&a.run, &a.decision_id, detail).await,
        _ => bridge::lost(&a.run, &a.decision_id, detail).await,
    };
    match res {
        Ok(()) => {
            tracing::info!(decision = %a.decision_id, %state, detail, "reported the delivery")
        }
        Err(e) => {
            tracing::warn!(decision = %a.decision_id, error = %e, "cannot report the delivery")
        }
    }
}

/// Follows a session's control state: a replan's instructions become a steer, a cancel (or a
/// lost lease) ends the mirror.
async fn watch_control(run: Arc<Run>, key: String, tx: mpsc::Sender<Internal>) {
    let attempt_id = run.attempt().id.clone();
    forward_control(
        run.control(),
        run.cancelled(),
        run.plan_revision(),
        key,
        attempt_id,
        tx,
    )
    .await;
}

/// A `Steer` for each replan with new instructions, then `RunEnded` when `cancel` fires. While
/// the loop's queue is full this waits, and replans made meanwhile collapse into the newest.
async fn forward_control(
    mut rx: watch::Receiver<ControlState>,
    cancel: CancellationToken,
    revision: i64,
    key: String,
    attempt_id: String,
    tx: mpsc::Sender<Internal>,
) {
    let mut last: (i64, Option<String>) = (revision, None);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => {
                let _ = tx.send(Internal::RunEnded { key, attempt_id }).await;
                return;
            }
            r = rx.changed() => {
                if r.is_err() {
                    return;
                }
                let s = rx.borrow_and_update().clone();
                if let Some(text) = s.instructions.filter(|t| !t.trim().is_empty()) {
                    let now = (s.plan_revision, Some(text.clone()));
                    if now != last {
                        last = now;
                        let steer = Internal::Steer {
                            key: key.clone(),
                            attempt_id: attempt_id.clone(),
                            revision: s.plan_revision,
                            text,
                        };
                        if tx.send(steer).await.is_err() {
                            return;
                        }
                    }
                }
            }
        }
    }
}

/// A `session.tool` event, read.
#[derive(Debug, Clone, PartialEq)]
struct ToolEvent {
    key: String,
    run_id: String,
    call: String,
    name: String,
    args: Option<Value>,
    /// `None` while it runs; its end: `{result}` as the receipt, or what went wrong.
    end: Option<ToolEnd>,
}

impl ToolEvent {
    /// The gateway nests the call's fields under `data` (`{runId, stream: "tool", data:
    /// {phase, name, toolCallId, args | result, isError}, sessionKey, …}`, as recorded in
    /// `fixtures/openclaw/real/`); fields at the top level are read too. `None` without a
    /// session key or call id.
    fn read(payload: &Value) -> Option<ToolEvent> {
        let p = match payload.get("data") {
            Some(d) if d.is_object() => d,
            _ => payload,
        };
        let field = |names: &[&str]| str_of(payload, names).or_else(|| str_of(p, names));
        let key = field(&["sessionKey"])?;
        let call = str_of(p, &["toolCallId", "callId", "id"])?;
        let run_id = field(&["runId"]).unwrap_or_else(|| "-".into());
        let name = str_of(p, &["name", "tool", "toolName"]).unwrap_or_else(|| "tool".into());
        let phase = str_of(p, &["phase", "state", "status"]).unwrap_or_else(|| "start".into());
        let end = match phase.as_str() {
            "start" | "started" | "running" | "update" | "progress" => None,
            "error" | "failed" => Some(Err(
                str_of(p, &["error", "message"]).unwrap_or_else(|| "the tool failed".into())
            )),
            _ => {
                let failed = p.get("isError").and_then(Value::as_bool).unwrap_or(false);
                let result = p
                    .get("result")
                    .or_else(|| p.get("output"))
                    .cloned()
                    .unwrap_or(Value::Null);
                Some(if failed {
                    Err(result_text(&result))
                } else {
                    Ok(json!({"result": result}))
                })
            }
        };
        Some(ToolEvent {
            key,
            run_id,
            call,
            name,
            args: p.get("args").or(p.get("input")).cloned(),
            end,
        })
    }

    fn effect_key(&self) -> String {
        format!("{}:{}:{}", self.key, self.run_id, self.call)
    }
}

/// Who OpenClaw names as resolving the approvals of a run that ended (aborted by a steer or an
/// abort) before they were answered.
const SCOPE_CLOSED: &str = "approval-scope-closed";

/// The tool call an exec approval request guards, `(sessionKey, sessionKey:runId:toolCallId)` —
/// the key its `session.tool` events give its effect.
fn guarded_tool(request: &Value) -> Option<(String, String)> {
    let session = str_of(request, &["sessionKey"])?;
    let run = str_of(request, &["runId"])?;
    let call = str_of(request, &["toolCallId"])?;
    let effect = format!("{session}:{run}:{call}");
    Some((session, effect))
}

/// The tool call's end, read once by whichever of the call or the reconciler asks first.
#[derive(Clone)]
struct ToolOutcome(Arc<Mutex<Option<oneshot::Receiver<Ended>>>>);

impl ToolOutcome {
    /// Waits for the end; pends forever if the adapter stops first (the effect then stays
    /// `in_progress` for the next adapter to finish).
    async fn wait(&self) -> Option<Ended> {
        let rx = self.0.lock().await.take()?;
        match rx.await {
            Ok(end) => Some(end),
            Err(_) => std::future::pending().await,
        }
    }
}

impl Reconciler for ToolOutcome {
    async fn query(&self, _ctx: &waymark_worker::EffectCtx) -> ProviderStatus {
        match self.wait().await {
            Some(Ended::Reported(Ok(receipt))) => ProviderStatus::Confirmed(receipt),
            Some(Ended::Reported(Err(reason))) => ProviderStatus::Failed {
                compensable: false,
                reason,
            },
            Some(Ended::Unknown(reason)) => ProviderStatus::Unknown { reason },
            None => ProviderStatus::Unknown {
                reason: "OpenClaw's report of the tool's end was already used".into(),
            },
        }
    }
}

async fn mirror_tool(
    run: Arc<Run>,
    key: String,
    name: String,
    intent: Value,
    rx: oneshot::Receiver<Ended>,
) {
    let outcome = ToolOutcome(Arc::new(Mutex::new(Some(rx))));
    let call = outcome.clone();
    let res = run
        .effect(key.clone(), format!("openclaw.{name}"), intent)
        .run(&outcome, |_ctx| async move {
            match call.wait().await {
                Some(Ended::Reported(Ok(receipt))) => Ok(receipt),
                Some(Ended::Reported(Err(reason))) => Err(ProviderError::Failed {
                    compensable: false,
                    reason,
                }),
                Some(Ended::Unknown(reason)) => Err(ProviderError::Unknown { reason }),
                None => Err(ProviderError::Unknown {
                    reason: "OpenClaw's report of the tool's end was already used".into(),
                }),
            }
        })
        .await;
    match res {
        Ok(done) => tracing::debug!(%key, effect = %done.effect.id, "tool call mirrored"),
        Err(e) => tracing::info!(%key, error = %e, "tool call mirrored as not confirmed"),
    }
}

fn tool_intent(name: &str, key: &str, run_id: &str, call: &str, args: Option<&Value>) -> Value {
    let mut intent = json!({
        "runtime": RUNTIME,
        "tool": name,
        "sessionKey": key,
        "runId": run_id,
        "toolCallId": call,
    });
    if let Some(args) = args {
        intent["args"] = args.clone();
    }
    intent
}

/// The gateway's word for our option.
fn gateway_decision(option: Option<&str>) -> &'static str {
    match option {
        Some("approve") => "allow-once",
        Some("approve_always") => "allow-always",
        // `deny`, and anything we did not offer, refuses.
        _ => "deny",
    }
}

/// The approval id an intent of ours carries.
fn approval_id_of(intent: &Value) -> Option<String> {
    if intent.get("runtime").and_then(Value::as_str) != Some(RUNTIME)
        || intent.get("approval").and_then(Value::as_str) != Some("exec")
    {
        return None;
    }
    str_of(intent, &["id"])
}

/// The options offered for an exec approval: the gateway's `allowedDecisions` in its order,
/// less its `unavailableDecisions` (`allow-always` is unavailable for many commands, and the
/// gateway refuses it then). A request that names neither (an older gateway) offers all three
/// less the unavailable. Decisions this adapter has no option for are left out.
fn choices_for(request: &Value) -> Vec<Choice> {
    let list = |field: &str| -> Option<Vec<String>> {
        request.get(field).and_then(Value::as_array).map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
    };
    let unavailable = list("unavailableDecisions").unwrap_or_default();
    let allowed = list("allowedDecisions")
        .filter(|a| !a.is_empty())
        .unwrap_or_else(|| GATEWAY_DECISIONS.map(str::to_owned).to_vec());
    let mut choices = Vec::new();
    for decision in allowed {
        if unavailable.contains(&decision) {
            continue;
        }
        let choice = match decision.as_str() {
            "allow-once" => Choice::new("approve", "Allow once"),
            "allow-always" => Choice {
                id: "approve_always".into(),
                label: "Allow always".into(),
                gives_up: "OpenClaw adds the command to its allowlist and will not ask again"
                    .into(),
            },
            "deny" => Choice::new("deny", "Deny"),
            other => {
                tracing::debug!(decision = other, "a decision this adapter does not offer");
                continue;
            }
        };
        if !choices.iter().any(|c: &Choice| c.id == choice.id) {
            choices.push(choice);
        }
    }
    choices
}

/// The gateway's decisions, in the order offered when a request does not list its own.
const GATEWAY_DECISIONS: [&str; 3] = ["allow-once", "allow-always", "deny"];

/// The note a ledger entry leaves on the task; [`parse_ledger_note`] reads it back.
fn ledger_note(id: &str, status: &str, entry: &Value) -> String {
    let kind = str_of(entry, &["kind"])
        .map(|k| format!(" ({k})"))
        .unwrap_or_default();
    let mut text = format!("OpenClaw task `{id}`{kind}: {status}");
    if let Some(title) = str_of(entry, &["title", "label"]) {
        text.push_str(&format!(" — {title}"));
    }
    if let Some(child) = str_of(entry, &["childSessionKey"]) {
        text.push_str(&format!("; child session `{child}`"));
    }
    if let Some(run) = str_of(entry, &["runId"]) {
        text.push_str(&format!("; run `{run}`"));
    }
    text
}

fn parse_ledger_note(text: &str) -> Option<(String, String)> {
    let rest = text.strip_prefix("OpenClaw task `")?;
    let (id, rest) = rest.split_once('`')?;
    let rest = match rest.strip_prefix(" (") {
        Some(r) => r.split_once(')')?.1,
        None => rest,
    };
    let status = rest.strip_prefix(": ")?;
    let status = status.split([' ', ';']).next().filter(|s| !s.is_empty())?;
    Some((id.to_owned(), status.to_owned()))
}

/// What a failed tool's result says: a string as it is, the text parts of `{content: [..]}`
/// (how the gateway reports an exec that was denied or failed), else the JSON.
fn result_text(result: &Value) -> String {
    if let Some(s) = result.as_str() {
        return s.to_owned();
    }
    let text = message_text(result);
    if text.trim().is_empty() {
        result.to_string()
    } else {
        text
    }
}

/// A message's text: `text`, or `content` as a string or as parts with `text`.
fn message_text(msg: &Value) -> String {
    if let Some(t) = msg.get("text").and_then(Value::as_str) {
        return t.to_owned();
    }
    match msg.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str).or(p.as_str()))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// The rows of a list answer: the answer itself when it is an array, else its `field`.
fn rows(v: &Value, field: &str) -> Vec<Value> {
    v.as_array()
        .or_else(|| v.get(field).and_then(Value::as_array))
        .cloned()
        .unwrap_or_default()
}

/// The first of `fields` that is a non-empty string.
fn str_of(v: &Value, fields: &[&str]) -> Option<String> {
    fields
        .iter()
        .filter_map(|f| v.get(*f).and_then(Value::as_str))
        .find(|s| !s.is_empty())
        .map(str::to_owned)
}

/// Pauses between reconnects to the gateway: from 250 ms, doubling up to 30 s, each with
/// jitter so many adapters do not reconnect in step (backon's exponential backoff).
struct Backoff(backon::ExponentialBackoff);

/// The longest pause between two connects.
const MAX_PAUSE: Duration = Duration::from_secs(30);

/// The shortest pause a gateway's `retryAfterMs` is taken to ask for (OpenClaw's own client
/// waits at least as long after a "gateway starting").
const MIN_RETRY_AFTER: Duration = Duration::from_millis(100);

impl Default for Backoff {
    fn default() -> Self {
        use backon::BackoffBuilder;
        Backoff(
            backon::ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(250))
                .with_max_delay(MAX_PAUSE)
                .with_jitter()
                .without_max_times()
                .build(),
        )
    }
}

impl Backoff {
    fn next(&mut self) -> Duration {
        self.0.next().unwrap_or(MAX_PAUSE)
    }

    fn reset(&mut self) {
        *self = Backoff::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openclaw::recorded;

    /// What a long-lived adapter keeps does not grow with what it has seen: finished
    /// background tasks are dropped, and a closed approval is forgotten once the gateway's
    /// expiry (plus grace) has passed, after which it would not be opened again anyway.
    #[tokio::test]
    async fn tidying_keeps_only_running_tasks_and_approvals_the_gateway_may_still_list() {
        let dir = tempfile::tempdir().unwrap();
        let settings = Settings {
            bound: None,
            gateway: "ws://127.0.0.1:1".into(),
            gateway_token: None,
            client: ClientInfo {
                id: "gateway-client".into(),
                mode: "backend".into(),
                display_name: "test".into(),
                version: "0".into(),
                platform: "linux".into(),
            },
        };
        let key = DeviceKey::load_or_create(&dir.path().join("device.json")).unwrap();
        let client = Client::new("http://127.0.0.1:1", "wmk_w_x").unwrap();
        let mut a = Adapter::new(settings, key, client);
        for _ in 0..500 {
            a.background.spawn(async {});
        }
        let (release, wait) = oneshot::channel::<()>();
        a.background.spawn(async move {
            let _ = wait.await;
        });
        let now = now_ms();
        a.closed.insert("gone".into(), closed_until(now - 60_000));
        a.closed
            .insert("still listed".into(), closed_until(now + 60_000));
        a.closed.insert("unknown expiry".into(), closed_until(0));
        tokio::time::sleep(Duration::from_millis(50)).await;
        a.tidy();
        assert_eq!(a.background.len(), 1, "only the running task is kept");
        let mut kept: Vec<&str> = a.closed.keys().map(String::as_str).collect();
        kept.sort();
        assert_eq!(kept, ["still listed", "unknown expiry"]);
        release.send(()).unwrap();
    }

    /// The loop's queue is bounded: a watcher whose reports find it full waits (the queue
    /// does not grow), replans made meanwhile collapse into the newest, and the end of the run
    /// is delivered after the queue drains.
    #[tokio::test]
    async fn a_full_queue_holds_the_watcher_back_and_nothing_is_lost() {
        let (control_tx, control_rx) = watch::channel(ControlState {
            plan_revision: 1,
            ..ControlState::default()
        });
        let cancel = CancellationToken::new();
        let (tx, mut rx) = mpsc::channel(3);
        let watcher = tokio::spawn(forward_control(
            control_rx,
            cancel.clone(),
            1,
            "agent:main:main".into(),
            "att_1".into(),
            tx,
        ));
        for rev in 2..=300 {
            control_tx.send_modify(|s| {
                s.plan_revision = rev;
                s.instructions = Some(format!("step {rev}"));
            });
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(rx.len(), 3, "the queue holds its bound and no more");
        assert!(!watcher.is_finished(), "the watcher waits for room");

        // The newest replan arrives once the loop reads again.
        let mut steers = Vec::new();
        while steers.last() != Some(&300) {
            match tokio::time::timeout(Duration::from_secs(5), rx.recv())
                .await
                .expect("the newest replan arrives")
                .expect("the channel is open")
            {
                Internal::Steer { revision, text, .. } => {
                    assert_eq!(text, format!("step {revision}"));
                    steers.push(revision);
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(steers.len() < 299, "replans collapsed: {steers:?}");
        assert!(steers.windows(2).all(|w| w[0] < w[1]), "{steers:?}");

        // A later replan, then the end: both arrive, in order.
        control_tx.send_modify(|s| {
            s.plan_revision = 301;
            s.instructions = Some("step 301".into());
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        cancel.cancel();
        let mut tail = Vec::new();
        loop {
            let m = tokio::time::timeout(Duration::from_secs(5), rx.recv())
                .await
                .expect("the end arrives")
                .expect("the channel is open");
            if let Internal::RunEnded { key, attempt_id } = &m {
                assert_eq!(
                    (key.as_str(), attempt_id.as_str()),
                    ("agent:main:main", "att_1")
                );
                break;
            }
            tail.push(m);
        }
        assert!(
            matches!(tail.as_slice(), [Internal::Steer { revision: 301, .. }]),
            "{tail:?}"
        );
        watcher.await.unwrap();
    }

    #[test]
    fn ledger_notes_read_back_as_id_and_status() {
        let entry = json!({"id":"task_7","status":"running","kind":"subagent","sessionKey":"agent:main:main","childSessionKey":"agent:main:subagent:x","runId":"run_5"});
        let note = ledger_note("task_7", "running", &entry);
        assert_eq!(
            note,
            "OpenClaw task `task_7` (subagent): running; child session `agent:main:subagent:x`; run `run_5`"
        );
        assert_eq!(
            parse_ledger_note(&note),
            Some(("task_7".into(), "running".into()))
        );
        assert_eq!(
            parse_ledger_note("OpenClaw task `t`: timed_out — nightly"),
            Some(("t".into(), "timed_out".into()))
        );
        assert_eq!(parse_ledger_note("hello"), None);
    }

    #[test]
    fn a_real_exec_approval_offers_only_the_decisions_the_gateway_allows() {
        let requested = recorded("approve: exec.approval.requested");
        let request = &requested["payload"]["request"];
        assert_eq!(request["unavailableDecisions"], json!(["allow-always"]));
        let ids: Vec<String> = choices_for(request).into_iter().map(|c| c.id).collect();
        assert_eq!(
            ids,
            ["approve", "deny"],
            "no `allow-always` when it is unavailable"
        );
        // The gateway refuses it, as recorded.
        let refusal = recorded("refusal of allow-always");
        assert_eq!(
            refusal["error"]["details"]["reason"],
            "APPROVAL_ALLOW_ALWAYS_UNAVAILABLE"
        );

        // A listed row carries the same request.
        let listed = recorded("deny: exec.approval.list while pending");
        let row = &listed["payload"][0];
        let ids: Vec<String> = choices_for(&row["request"])
            .into_iter()
            .map(|c| c.id)
            .collect();
        assert_eq!(ids, ["approve", "deny"]);

        // When it is allowed it is offered, in the gateway's order; unknown words are skipped;
        // a request that lists nothing (an older gateway) offers all three.
        let all = json!({"allowedDecisions": ["deny", "allow-always", "allow-once", "ask-later"]});
        let ids: Vec<String> = choices_for(&all).into_iter().map(|c| c.id).collect();
        assert_eq!(ids, ["deny", "approve_always", "approve"]);
        let old = json!({"command": "ls", "unavailableDecisions": ["allow-always"]});
        let ids: Vec<String> = choices_for(&old).into_iter().map(|c| c.id).collect();
        assert_eq!(ids, ["approve", "deny"]);
        let ids: Vec<String> = choices_for(&json!({})).into_iter().map(|c| c.id).collect();
        assert_eq!(ids, ["approve", "approve_always", "deny"]);
    }

    #[test]
    fn real_tool_events_nest_their_fields_under_data() {
        let start = ToolEvent::read(&recorded("approve: session.tool start")["payload"]).unwrap();
        assert_eq!(start.key, "agent:main:main");
        assert_eq!(start.run_id, "a941cd77-4645-494f-83ef-8393cb2c9af3");
        assert_eq!(start.call, "call_1");
        assert_eq!(start.name, "exec");
        assert_eq!(
            start.args,
            Some(json!({"command": "touch /tmp/ocx/work/touched"}))
        );
        assert_eq!(start.end, None);
        assert_eq!(
            start.effect_key(),
            "agent:main:main:a941cd77-4645-494f-83ef-8393cb2c9af3:call_1"
        );

        let done = ToolEvent::read(&recorded("approve: session.tool result")["payload"]).unwrap();
        assert_eq!(
            done.effect_key(),
            start.effect_key(),
            "the end finds its start"
        );
        let Some(Ok(receipt)) = done.end else {
            panic!("{:?}", done.end)
        };
        assert_eq!(receipt["result"]["details"]["exitCode"], 0);
        assert_eq!(receipt["result"]["content"][0]["text"], "(no output)");

        let denied = ToolEvent::read(&recorded("deny: session.tool result")["payload"]).unwrap();
        let Some(Err(reason)) = denied.end else {
            panic!("{:?}", denied.end)
        };
        assert!(
            reason.starts_with(
                "Exec denied (gateway id=83befa82-a3b2-452b-8b1c-e350026bad35, user-denied)"
            ),
            "{reason}"
        );

        // Flat fields (what the fake gateway used to send) still read.
        let flat = json!({"sessionKey": "k", "runId": "r", "toolCallId": "c", "name": "exec", "phase": "result", "result": "ok"});
        let flat = ToolEvent::read(&flat).unwrap();
        assert_eq!(flat.effect_key(), "k:r:c");
        assert_eq!(flat.end, Some(Ok(json!({"result": "ok"}))));
        assert_eq!(ToolEvent::read(&json!({"data": {"phase": "start"}})), None);
    }

    #[test]
    fn our_options_map_to_the_gateway_words() {
        assert_eq!(gateway_decision(Some("approve")), "allow-once");
        assert_eq!(gateway_decision(Some("approve_always")), "allow-always");
        assert_eq!(gateway_decision(Some("deny")), "deny");
        assert_eq!(gateway_decision(None), "deny");
    }

    #[test]
    fn backoff_grows_jittered_and_is_capped() {
        // Jitter adds up to the delay itself: [d, 2d).
        let mut b = Backoff::default();
        let first = b.next();
        assert!(first >= Duration::from_millis(250) && first < Duration::from_millis(500));
        for _ in 0..20 {
            assert!(b.next() < Duration::from_secs(60));
        }
        assert!(b.next() >= Duration::from_secs(30));
        b.reset();
        assert!(b.next() < Duration::from_millis(500));
    }

    #[test]
    fn message_text_takes_strings_and_parts() {
        assert_eq!(message_text(&json!({"text": "hi"})), "hi");
        assert_eq!(message_text(&json!({"content": "yo"})), "yo");
        assert_eq!(
            message_text(
                &json!({"content": [{"type":"text","text":"a"},{"type":"image"},{"type":"text","text":"b"}]})
            ),
            "a\nb"
        );
    }
}
