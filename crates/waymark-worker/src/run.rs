//! One attempt at a task, as the agent author holds it: the lease kept alive in the
//! background, control commands turned into a cancellation token and a watchable state (and
//! whether the control stream that brings them is connected, a watchable fact too: a health
//! display reads it, and a test waits on it rather than sleeping until it is probably so),
//! and every fenced write (checkpoints, receipts, decisions, finish) carrying the attempt's
//! fence.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use eventsource_stream::Eventsource;
use futures::StreamExt;
use reqwest::Method;
use serde_json::Value;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use waymark_proto::digest::json_digest;
use waymark_proto::state::Operation;
use waymark_proto::*;

use crate::client::{Client, Payload, Resend, problem_of};
use crate::error::{Error, Result};

/// How long one decision long-poll waits before asking again.
const DECISION_POLL: Duration = Duration::from_secs(30);

/// How to start an attempt.
#[derive(Debug, Clone)]
pub struct AttemptOptions {
    /// The worker's name, for people and audit.
    pub worker: String,
    /// Lease length; the heartbeat renews it every third of it.
    pub lease: Duration,
    /// Digest of the worker's manifest (model, tool versions, config).
    pub manifest_digest: Option<String>,
    /// When another attempt holds a live lease, wait up to this long for it to expire
    /// instead of failing with [`Error::LeaseHeld`] at once.
    pub wait_for_lease: Option<Duration>,
    /// What the worker works on now (e.g. the commit it checked out); a resume whose
    /// materials changed needs a person (admission).
    pub materials: Option<Materials>,
}

impl AttemptOptions {
    /// A worker named `worker` with a 30 s lease.
    pub fn new(worker: impl Into<String>) -> Self {
        AttemptOptions {
            worker: worker.into(),
            lease: Duration::from_secs(30),
            manifest_digest: None,
            wait_for_lease: None,
            materials: None,
        }
    }

    /// Sets the lease length.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Sets the manifest digest.
    pub fn manifest_digest(mut self, digest: impl Into<String>) -> Self {
        self.manifest_digest = Some(digest.into());
        self
    }

    /// States what the worker works on now (checked against the last checkpoint on resume).
    pub fn materials(mut self, materials: Materials) -> Self {
        self.materials = Some(materials);
        self
    }

    /// Waits up to `bound` for a live lease of another attempt to expire.
    pub fn wait_for_lease(mut self, bound: Duration) -> Self {
        self.wait_for_lease = Some(bound);
        self
    }
}

/// What the people steering the task want, as the worker has heard it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ControlState {
    /// Claim no new step until resumed ([`Run::wait_if_paused`]).
    pub paused: bool,
    /// The run was cancelled or taken over; stop.
    pub cancelled: bool,
    /// The newest plan revision heard of.
    pub plan_revision: i64,
    /// Instructions of the newest replan.
    pub instructions: Option<String>,
}

/// Why the attempt can no longer write.
#[derive(Debug, Clone)]
enum Lost {
    Fenced(String),
    Lease(String),
    Cancelled,
}

impl Lost {
    fn error(&self) -> Error {
        match self {
            Lost::Fenced(detail) => Error::Fenced {
                detail: detail.clone(),
            },
            Lost::Lease(detail) => Error::LeaseLost {
                detail: detail.clone(),
            },
            Lost::Cancelled => Error::Cancelled,
        }
    }
}

#[derive(Debug, Default)]
struct Acks {
    pending: Vec<String>,
    seen: HashSet<String>,
    /// The newest command (by the server's `seq`) whose pause, resume or replan took effect:
    /// an older one arriving late is acknowledged but changes nothing.
    applied_seq: i64,
}

/// What the attempt and its background tasks share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) client: Client,
    pub(crate) attempt: Attempt,
    lease: Duration,
    cancel: CancellationToken,
    stop: CancellationToken,
    lost: Mutex<Option<Lost>>,
    control: watch::Sender<ControlState>,
    /// Whether the control stream is connected now (see [`Run::control_connected`]).
    connected: watch::Sender<bool>,
    acks: Mutex<Acks>,
    beat_now: Notify,
    heartbeating: AtomicBool,
}

impl Shared {
    fn lose(&self, why: Lost) {
        let cancelled = matches!(why, Lost::Cancelled);
        {
            let mut lost = self.lost.lock().unwrap_or_else(|e| e.into_inner());
            if lost.is_none() {
                tracing::info!(attempt = %self.attempt.id, reason = ?why, "the attempt stops");
                *lost = Some(why);
            }
        }
        if cancelled {
            self.control.send_modify(|s| s.cancelled = true);
        }
        self.cancel.cancel();
    }

    /// Records a refusal that ends the attempt.
    pub(crate) fn note(&self, e: &Error) {
        match e {
            Error::Fenced { detail } => self.lose(Lost::Fenced(detail.clone())),
            Error::LeaseLost { detail } => self.lose(Lost::Lease(detail.clone())),
            _ => {}
        }
    }

    pub(crate) fn check_live(&self) -> Result<()> {
        match &*self.lost.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(l) => Err(l.error()),
            None => Ok(()),
        }
    }

    fn lost_error(&self) -> Error {
        self.check_live().err().unwrap_or(Error::Cancelled)
    }

    fn on_command(&self, cmd: ControlCommand) {
        let stale = {
            let mut acks = self.acks.lock().unwrap_or_else(|e| e.into_inner());
            if !acks.seen.insert(cmd.command_id.clone()) {
                return;
            }
            acks.pending.push(cmd.command_id.clone());
            let stale = cmd.seq > 0 && cmd.seq <= acks.applied_seq;
            acks.applied_seq = acks.applied_seq.max(cmd.seq);
            stale
        };
        tracing::info!(command = %cmd.command_id, operation = %cmd.operation, seq = cmd.seq, stale, "control command");
        self.control.send_modify(|s| {
            s.plan_revision = s.plan_revision.max(cmd.plan_revision);
            match cmd.operation {
                // Cancel and take-over end the attempt whenever they arrive: nothing undoes them.
                Operation::Cancel | Operation::TakeOver => s.cancelled = true,
                // A newer command already decided these.
                _ if stale => {}
                Operation::Pause => s.paused = true,
                Operation::Resume => s.paused = false,
                Operation::Replan | Operation::SuspendAndReplan => {
                    s.instructions = cmd
                        .args
                        .get("instructions")
                        .and_then(Value::as_str)
                        .map(str::to_owned);
                }
                _ => {}
            }
        });
        match cmd.operation {
            Operation::Cancel => self.lose(Lost::Cancelled),
            Operation::TakeOver => {
                self.lose(Lost::Fenced("a person took the task over".to_owned()))
            }
            _ => {}
        }
        // Acknowledge promptly rather than at the next regular beat.
        self.beat_now.notify_one();
    }

    /// A heartbeat reply was computed when its transaction ran, which may be before a command
    /// the worker has since applied from the control stream (seen: a reply made before a
    /// Resume arrived after it and paused the worker for good). So a reply brings only its
    /// commands — applied in `seq` order with everything else — and what only grows (the plan
    /// revision) or cannot be undone (cancellation); never the task's pause state.
    fn on_reply(&self, reply: HeartbeatReply) {
        for cmd in reply.commands {
            self.on_command(cmd);
        }
        self.control
            .send_modify(|s| s.plan_revision = s.plan_revision.max(reply.plan_revision));
        if reply.task_state == TaskState::Cancelled {
            self.lose(Lost::Cancelled);
        }
    }

    fn lease_seconds(&self) -> u32 {
        self.lease.as_secs().clamp(1, u32::MAX.into()) as u32
    }
}

/// Renews the lease every third of it, and at once after a control command arrives.
async fn heartbeat_loop(shared: Arc<Shared>) {
    let every = (shared.lease / 3).max(Duration::from_millis(200));
    let path = format!("/v1/attempts/{}/heartbeat", shared.attempt.id);
    // After a failed heartbeat the next comes sooner: waiting a whole third again could let a
    // busy moment of the server or the network cost the lease.
    let mut wait = every;
    loop {
        tokio::select! {
            _ = shared.stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
            _ = shared.beat_now.notified() => {}
        }
        if !shared.heartbeating.load(Ordering::SeqCst) {
            return;
        }
        let acknowledged = std::mem::take(
            &mut shared
                .acks
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pending,
        );
        let body = Heartbeat {
            fence: shared.attempt.fence,
            lease_seconds: Some(shared.lease_seconds()),
            acknowledged: acknowledged.clone(),
        };
        let Ok(payload) = Payload::json(&body) else {
            return;
        };
        let began = tokio::time::Instant::now();
        let res = tokio::select! {
            _ = shared.stop.cancelled() => return,
            r = shared.client.call::<HeartbeatReply>(Method::POST, &path, &[], payload, Resend::Always, None) => r,
        };
        // The next renewal is due a third of the lease after this one began, not after it
        // ended: a server slow to commit (a busy disk) must not stretch the gap past the lease.
        wait = every.saturating_sub(began.elapsed());
        match res {
            Ok(reply) => shared.on_reply(reply),
            Err(e @ (Error::Fenced { .. } | Error::LeaseLost { .. })) => {
                tracing::warn!(attempt = %shared.attempt.id, error = %e, "heartbeat refused");
                shared.note(&e);
                return;
            }
            Err(e) => {
                let mut acks = shared.acks.lock().unwrap_or_else(|e| e.into_inner());
                acks.pending.splice(0..0, acknowledged);
                tracing::warn!(attempt = %shared.attempt.id, error = %e, "heartbeat failed; trying again");
                wait = wait.min((every / 4).max(Duration::from_millis(100)));
            }
        }
    }
}

/// Follows `GET /v1/attempts/{attempt}/control`, reconnecting when it drops (a dropped stream
/// is not a cancel). A server without the route leaves control to the heartbeat replies.
async fn control_loop(shared: Arc<Shared>) {
    let path = format!("/v1/attempts/{}/control", shared.attempt.id);
    let reconnects = || {
        ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(250))
            .with_max_delay(Duration::from_secs(5))
            .with_jitter()
            .without_max_times()
            .build()
    };
    let mut pauses = reconnects();
    loop {
        if shared.stop.is_cancelled() || shared.cancel.is_cancelled() {
            return;
        }
        let res = tokio::select! {
            _ = shared.stop.cancelled() => return,
            r = shared.client.send(Method::GET, &path, &[], &Payload::None, Some(Duration::from_secs(24 * 3600))) => r,
        };
        match res {
            Err(e) => tracing::debug!(error = %e, "control stream: cannot connect; retrying"),
            Ok(r) if r.status() == reqwest::StatusCode::NOT_FOUND => {
                tracing::debug!(
                    "this control plane has no control stream; commands arrive with heartbeats"
                );
                return;
            }
            Ok(r) if !r.status().is_success() => {
                let status = r.status();
                let bytes = r.bytes().await.unwrap_or_default();
                let e = problem_of(status, &bytes);
                tracing::debug!(error = %e, "control stream refused");
                if matches!(e, Error::Fenced { .. } | Error::LeaseLost { .. }) {
                    shared.note(&e);
                    return;
                }
            }
            Ok(r) => {
                pauses = reconnects();
                let _connected = Connected::new(&shared.connected);
                let mut bound = waymark_proto::sse::EventBound::default();
                let mut events = r
                    .bytes_stream()
                    .map(move |chunk| match chunk {
                        Ok(b) => bound.check(&b).map(|()| b).map_err(|e| e.to_string()),
                        Err(e) => Err(e.to_string()),
                    })
                    .eventsource();
                loop {
                    let next = tokio::select! {
                        _ = shared.stop.cancelled() => return,
                        n = events.next() => n,
                    };
                    match next {
                        Some(Ok(ev)) if ev.event == "control" => {
                            match serde_json::from_str::<ControlCommand>(&ev.data) {
                                Ok(cmd) => shared.on_command(cmd),
                                Err(e) => {
                                    tracing::warn!(error = %e, "control stream: not a control command")
                                }
                            }
                        }
                        Some(Ok(ev)) if ev.event == "revoked" => {
                            shared.lose(Lost::Fenced(format!(
                                "attempt `{}` was revoked",
                                shared.attempt.id
                            )));
                            return;
                        }
                        Some(Ok(_)) => {}
                        Some(Err(e)) => {
                            tracing::debug!(error = %e, "control stream broke; reconnecting");
                            break;
                        }
                        None => break,
                    }
                }
            }
        }
        let pause = pauses.next().unwrap_or(Duration::from_secs(5));
        tokio::select! {
            _ = shared.stop.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
    }
}

/// Says the control stream is connected while it lives: from the server's `200` until the
/// stream ends or breaks (then the loop reconnects), or the run stops.
struct Connected<'a>(&'a watch::Sender<bool>);

impl<'a> Connected<'a> {
    fn new(connected: &'a watch::Sender<bool>) -> Self {
        connected.send_replace(true);
        Connected(connected)
    }
}

impl Drop for Connected<'_> {
    fn drop(&mut self) {
        self.0.send_replace(false);
    }
}

/// How to ask for an approval.
#[derive(Debug, Clone, Default)]
pub struct ApprovalOptions {
    /// The plan step it guards.
    pub step: Option<String>,
    /// The effect it would allow, if already declared.
    pub effect_id: Option<String>,
    /// When the default applies (server default: one hour).
    pub expires_in: Option<Duration>,
    /// `deny` (the server's default) or `approve`.
    pub default_option: Option<String>,
    /// The UI confirms twice.
    pub risky: bool,
    /// For runtime adapters: how long the runtime holds the approval. The answer then counts
    /// only once [`Run::report_delivery`] says the runtime took it.
    pub durability: Option<ApprovalDurability>,
    /// The runtime's own choices (must hold `approve` and `deny`; others are `approve_…` or
    /// `deny_…`). Empty: approve and deny.
    pub choices: Vec<DecisionOption>,
    /// For runtimes that take a changed intent: the JSON pointer of the part a person may
    /// edit before approving. Follow [`approved_intent`], not the intent asked, once approved.
    pub editable: Option<String>,
    /// For runtimes with a deadline of their own (Hermes denies after 60 s): when and how the
    /// runtime decides unanswered. The approval closes then as the runtime decided, and people
    /// are shown that deadline, not ours.
    pub runtime_deadline: Option<AskedRuntimeDeadline>,
    /// The directory the call runs in, where the intent does not say: the user's standing
    /// rules match their directory against it.
    pub cwd: Option<String>,
}

/// The option a closed decision ended with (`None` while pending, or when void).
pub fn chosen_option(decision: &Decision) -> Option<&str> {
    decision.outcome.as_ref().and_then(|o| o.option.as_deref())
}

/// The intent a person approved: the one asked, or their edit of it. `None` unless the
/// decision closed with a granting option.
pub fn approved_intent(decision: &Decision) -> Option<&Value> {
    let outcome = decision.outcome.as_ref()?;
    let option = outcome.option.as_deref()?;
    let grants = waymark_proto::option_grants(option) == Some(true);
    if decision.status != DecisionStatus::Resolved || !grants {
        return None;
    }
    outcome.edited_intent.as_ref().or(decision.intent.as_ref())
}

#[derive(Debug, Default)]
struct ChainHead {
    sequence: i64,
    digest: Option<String>,
}

/// An attempt in progress. Dropping it stops the heartbeat (the lease then runs out).
#[derive(Debug)]
pub struct Run {
    pub(crate) shared: Arc<Shared>,
    chain: Mutex<ChainHead>,
    resumed_from: Option<Checkpoint>,
    plan_revision_at_start: i64,
}

impl Drop for Run {
    fn drop(&mut self) {
        self.shared.stop.cancel();
    }
}

impl Client {
    /// Starts an attempt on a task (a new one, or one to resume): acquires the lease, loads the
    /// task's last checkpoint so [`Run::checkpoint`] continues the chain, and starts the
    /// heartbeat.
    pub async fn start_attempt(&self, task_id: &str, options: AttemptOptions) -> Result<Run> {
        Run::start(self.clone(), task_id, options).await
    }
}

impl Run {
    pub(crate) async fn start(
        client: Client,
        task_id: &str,
        options: AttemptOptions,
    ) -> Result<Run> {
        let req = StartAttempt {
            worker: options.worker.clone(),
            lease_seconds: Some(options.lease.as_secs().clamp(1, u32::MAX.into()) as u32),
            manifest_digest: options.manifest_digest.clone(),
            materials: options.materials.clone(),
        };
        let deadline = options
            .wait_for_lease
            .map(|w| tokio::time::Instant::now() + w);
        let path = format!("/v1/tasks/{task_id}/attempts");
        let attempt: Attempt = loop {
            let res = client
                .call(
                    Method::POST,
                    &path,
                    &[],
                    Payload::json(&req)?,
                    Resend::IfUndelivered,
                    None,
                )
                .await;
            match res {
                Ok(a) => break a,
                Err(Error::LeaseHeld {
                    expires_at: Some(until),
                    ..
                }) if deadline.is_some_and(|d| tokio::time::Instant::now() < d) => {
                    let left = (until - chrono::Utc::now())
                        .to_std()
                        .unwrap_or_default()
                        .max(Duration::from_millis(100));
                    let wake = (tokio::time::Instant::now() + left + Duration::from_millis(100))
                        .min(deadline.expect("checked above"));
                    tracing::info!(task = %task_id, until = %until, "another attempt holds the lease; waiting for it to expire");
                    tokio::time::sleep_until(wake).await;
                }
                Err(e) => return Err(e),
            }
        };
        let detail = client.task(task_id).await?;
        let last = detail.checkpoints.last().cloned();
        let control = ControlState {
            paused: detail.task.state == TaskState::Paused,
            cancelled: false,
            plan_revision: detail.task.plan_revision,
            instructions: None,
        };
        let run = Run::new(client, attempt, options.lease, control, last);
        tokio::spawn(heartbeat_loop(run.shared.clone()));
        tokio::spawn(control_loop(run.shared.clone()));
        Ok(run)
    }

    /// The attempt's state, without its background tasks (`start` spawns them).
    fn new(
        client: Client,
        attempt: Attempt,
        lease: Duration,
        control: ControlState,
        last: Option<Checkpoint>,
    ) -> Run {
        let plan_revision_at_start = control.plan_revision;
        let shared = Arc::new(Shared {
            client,
            attempt,
            lease,
            cancel: CancellationToken::new(),
            stop: CancellationToken::new(),
            lost: Mutex::new(None),
            control: watch::channel(control).0,
            connected: watch::channel(false).0,
            acks: Mutex::new(Acks::default()),
            beat_now: Notify::new(),
            heartbeating: AtomicBool::new(true),
        });
        Run {
            chain: Mutex::new(ChainHead {
                sequence: last.as_ref().map_or(0, |c| c.sequence),
                digest: last.as_ref().map(|c| c.digest.clone()),
            }),
            resumed_from: last,
            plan_revision_at_start,
            shared,
        }
    }

    /// The task.
    pub fn task_id(&self) -> &str {
        &self.shared.attempt.task_id
    }

    /// The attempt as the server granted it.
    pub fn attempt(&self) -> &Attempt {
        &self.shared.attempt
    }

    /// The fence every write of this attempt carries.
    pub fn fence(&self) -> i64 {
        self.shared.attempt.fence
    }

    /// The client this run talks through.
    pub fn client(&self) -> &Client {
        &self.shared.client
    }

    /// The task's newest checkpoint when this attempt started (`None` for a fresh task): where
    /// a resumed worker picks up.
    pub fn resumed_from(&self) -> Option<&Checkpoint> {
        self.resumed_from.as_ref()
    }

    /// The plan revision when this attempt started.
    pub fn plan_revision(&self) -> i64 {
        self.shared
            .control
            .borrow()
            .plan_revision
            .max(self.plan_revision_at_start)
    }

    /// The sequence of the newest checkpoint this run knows of.
    pub fn last_sequence(&self) -> i64 {
        self.chain
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .sequence
    }

    /// Fires when the run must stop: cancelled, taken over, fenced off or its lease lost.
    /// Select on it around long work.
    pub fn cancelled(&self) -> CancellationToken {
        self.shared.cancel.clone()
    }

    /// What the people steering the task want; changes as commands arrive.
    pub fn control(&self) -> watch::Receiver<ControlState> {
        self.shared.control.subscribe()
    }

    /// Whether the control stream is connected now, and every change: while it is, a
    /// person's pause, resume, replan or cancel reaches the run as soon as it applies;
    /// otherwise it comes with the next heartbeat (every third of the lease), and the stream
    /// is being reconnected — or the control plane has none. For a worker's health display
    /// (is live steering up?), and for tests that must steer a run already listening.
    pub fn control_connected(&self) -> watch::Receiver<bool> {
        self.shared.connected.subscribe()
    }

    /// At a step boundary: returns at once unless paused, else when resumed. Fails when the
    /// run is cancelled or its lease lost meanwhile.
    pub async fn wait_if_paused(&self) -> Result<()> {
        let mut rx = self.control();
        loop {
            self.shared.check_live()?;
            if !rx.borrow_and_update().paused {
                return Ok(());
            }
            tokio::select! {
                _ = self.shared.cancel.cancelled() => return Err(self.shared.lost_error()),
                r = rx.changed() => if r.is_err() { return Err(self.shared.lost_error()) },
            }
        }
    }

    /// Stops renewing the lease, which then runs out: what a partitioned or hung worker
    /// looks like to the control plane. For tests and demos; [`Run::finish`] stops it too.
    pub fn stop_heartbeat(&self) {
        self.shared.heartbeating.store(false, Ordering::SeqCst);
    }

    /// Runs a fenced write: refuses locally once the attempt is known to be over, and learns
    /// from the server's refusals.
    pub(crate) async fn fenced<T>(
        &self,
        write: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        self.shared.check_live()?;
        let res = write.await;
        if let Err(e) = &res {
            self.shared.note(e);
        }
        res
    }

    pub(crate) async fn post<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &impl serde::Serialize,
        resend: Resend,
    ) -> Result<T> {
        let payload = Payload::json(body)?;
        self.fenced(
            self.shared
                .client
                .call(Method::POST, path, &[], payload, resend, None),
        )
        .await
    }

    /// Appends a checkpoint with the next sequence; the server links it into the hash chain.
    /// A concurrent writer makes it fail with [`Error::SequenceConflict`]: reload, don't skip.
    pub async fn checkpoint(&self, body: CheckpointBody) -> Result<Checkpoint> {
        let (sequence, prev) = {
            let head = self.chain.lock().unwrap_or_else(|e| e.into_inner());
            (head.sequence + 1, head.digest.clone())
        };
        let req = AppendCheckpoint {
            attempt_id: self.shared.attempt.id.clone(),
            fence: self.fence(),
            sequence,
            body,
        };
        let cp: Checkpoint = self
            .post(
                &format!("/v1/tasks/{}/checkpoints", self.task_id()),
                &req,
                Resend::IfUndelivered,
            )
            .await?;
        if cp.prev_digest != prev {
            tracing::warn!(
                sequence,
                "the checkpoint links to a predecessor this worker did not write"
            );
        }
        let mut head = self.chain.lock().unwrap_or_else(|e| e.into_inner());
        head.sequence = cp.sequence;
        head.digest = Some(cp.digest.clone());
        Ok(cp)
    }

    /// Uploads an artifact (content-addressed by the server).
    pub async fn artifact(
        &self,
        name: &str,
        media_type: &str,
        bytes: Vec<u8>,
        step: Option<&str>,
    ) -> Result<Artifact> {
        let mut query = vec![
            ("name", name.to_owned()),
            ("attempt_id", self.shared.attempt.id.clone()),
            ("fence", self.fence().to_string()),
        ];
        if let Some(s) = step {
            query.push(("step", s.to_owned()));
        }
        let payload = Payload::Raw {
            bytes,
            media_type: media_type.to_owned(),
        };
        self.fenced(self.shared.client.call(
            Method::POST,
            &format!("/v1/tasks/{}/artifacts", self.task_id()),
            &query,
            payload,
            Resend::IfUndelivered,
            None,
        ))
        .await
    }

    /// Submits a test run's JUnit XML; the server parses it into a receipt.
    pub async fn test_receipt(
        &self,
        step: Option<&str>,
        command: &str,
        exit_code: i32,
        commit: Option<&str>,
        junit_xml: String,
    ) -> Result<TestReceipt> {
        let req = SubmitTestReceipt {
            attempt_id: self.shared.attempt.id.clone(),
            fence: self.fence(),
            step: step.map(str::to_owned),
            command: command.to_owned(),
            exit_code,
            commit: commit.map(str::to_owned),
            junit_xml,
        };
        self.post(
            &format!("/v1/tasks/{}/test-receipts", self.task_id()),
            &req,
            Resend::IfUndelivered,
        )
        .await
    }

    /// Appends session messages.
    pub async fn messages(&self, messages: Vec<NewMessage>) -> Result<Vec<Message>> {
        #[derive(serde::Deserialize)]
        struct Reply {
            messages: Vec<Message>,
        }
        let req = AppendMessages {
            attempt_id: Some(self.shared.attempt.id.clone()),
            fence: Some(self.fence()),
            messages,
        };
        let reply: Reply = self
            .post(
                &format!("/v1/tasks/{}/messages", self.task_id()),
                &req,
                Resend::IfUndelivered,
            )
            .await?;
        Ok(reply.messages)
    }

    /// Appends one assistant message.
    pub async fn say(&self, text: impl Into<String>) -> Result<()> {
        self.messages(vec![NewMessage {
            role: "assistant".into(),
            text: text.into(),
        }])
        .await
        .map(drop)
    }

    /// Reports spend since the last report (deltas). The reply carries the task's new totals
    /// and, when this report crossed a budget threshold, the budget decision it opened: wait
    /// for it with [`Run::budget_choice`] and follow the option chosen.
    pub async fn usage(
        &self,
        tokens: u64,
        cost_usd: f64,
        wall_seconds: u64,
    ) -> Result<UsageReported> {
        let req = ReportUsage {
            attempt_id: Some(self.shared.attempt.id.clone()),
            fence: Some(self.fence()),
            tokens,
            cost_usd,
            wall_seconds,
        };
        self.post(
            &format!("/v1/tasks/{}/usage", self.task_id()),
            &req,
            Resend::IfUndelivered,
        )
        .await
    }

    /// Opens an approval of `intent` (bound to its digest and the current plan revision)
    /// without waiting for it.
    pub async fn open_approval(
        &self,
        intent: Value,
        summary: &str,
        options: ApprovalOptions,
    ) -> Result<Decision> {
        let req = RequestApproval {
            attempt_id: Some(self.shared.attempt.id.clone()),
            fence: Some(self.fence()),
            step: options.step,
            effect_id: options.effect_id,
            // An intent without an exact digest (an integer beyond ±(2^53 − 1)) is sent
            // without one: the server refuses it with a 422 that says where the integer is.
            intent_digest: json_digest(&intent).ok(),
            intent,
            summary: summary.to_owned(),
            expires_in_seconds: options.expires_in.map(|d| d.as_secs().max(1)),
            default_option: options.default_option,
            risky: options.risky,
            durability: options.durability,
            options: options.choices,
            editable: options.editable,
            runtime_deadline: options.runtime_deadline,
            cwd: options.cwd,
        };
        self.post(
            &format!("/v1/tasks/{}/approvals", self.task_id()),
            &req,
            Resend::IfUndelivered,
        )
        .await
    }

    /// Asks for approval of `intent` and waits for the answer (or the default on expiry).
    pub async fn request_approval(
        &self,
        intent: Value,
        summary: &str,
        options: ApprovalOptions,
    ) -> Result<Decision> {
        let d = self.open_approval(intent, summary, options).await?;
        self.await_decision(&d.id).await
    }

    /// Opens a question or budget decision without waiting for it.
    pub async fn open_decision(&self, mut req: RequestDecision) -> Result<Decision> {
        req.attempt_id = Some(self.shared.attempt.id.clone());
        req.fence = Some(self.fence());
        self.post(
            &format!("/v1/tasks/{}/decisions", self.task_id()),
            &req,
            Resend::IfUndelivered,
        )
        .await
    }

    /// Asks a question or a budget choice and waits for the answer (or the default).
    pub async fn decision(&self, req: RequestDecision) -> Result<Decision> {
        let d = self.open_decision(req).await?;
        self.await_decision(&d.id).await
    }

    /// Waits for the person's choice on a budget decision (or the stated default once it
    /// expires) and returns the closed decision; [`chosen_option`] says what to do. Call it at
    /// a step boundary, with no effect in progress: the lease stays renewed while it waits,
    /// and nothing outside changes until the choice is known. A decision already closed is
    /// returned as it is.
    pub async fn budget_choice(&self, decision: &Decision) -> Result<Decision> {
        if decision.status != DecisionStatus::Pending {
            return Ok(decision.clone());
        }
        self.await_decision(&decision.id).await
    }

    /// Long-polls a decision until it is no longer pending. The lease stays renewed while it
    /// waits; a cancel ends the wait with [`Error::Cancelled`].
    pub async fn await_decision(&self, decision_id: &str) -> Result<Decision> {
        loop {
            self.shared.check_live()?;
            let d = tokio::select! {
                _ = self.shared.cancel.cancelled() => return Err(self.shared.lost_error()),
                r = self.shared.client.decision(self.task_id(), decision_id, DECISION_POLL) => r?,
            };
            if d.status != DecisionStatus::Pending {
                return Ok(d);
            }
        }
    }

    /// Reports whether the runtime took the answer to an approval it holds (`acknowledged`)
    /// or went away before it did (`lost`). Until then the approval shows as answered, not
    /// as approved.
    pub async fn report_delivery(
        &self,
        decision_id: &str,
        state: DeliveryState,
        detail: Option<String>,
    ) -> Result<Decision> {
        let req = ReportDelivery {
            attempt_id: Some(self.shared.attempt.id.clone()),
            fence: Some(self.fence()),
            state,
            detail,
        };
        self.post(
            &format!(
                "/v1/tasks/{}/decisions/{decision_id}/delivery",
                self.task_id()
            ),
            &req,
            Resend::IfUndelivered,
        )
        .await
    }

    /// Closes a pending decision the runtime dropped (its connection closed, its hook timed
    /// out) as expired, with no option applied.
    pub async fn expire_decision(&self, decision_id: &str, reason: &str) -> Result<Decision> {
        let req = ExpireDecision {
            attempt_id: Some(self.shared.attempt.id.clone()),
            fence: Some(self.fence()),
            reason: reason.to_owned(),
        };
        self.post(
            &format!(
                "/v1/tasks/{}/decisions/{decision_id}/expire",
                self.task_id()
            ),
            &req,
            Resend::IfUndelivered,
        )
        .await
    }

    /// Ends the attempt with an outcome and stops the heartbeat.
    pub async fn finish(&self, outcome: FinishOutcome, summary: Option<String>) -> Result<Attempt> {
        self.finish_releasing(outcome, summary, Vec::new()).await
    }

    /// Ends the attempt and reports the temporary resources it released (worktrees, tokens).
    pub async fn finish_releasing(
        &self,
        outcome: FinishOutcome,
        summary: Option<String>,
        released: Vec<String>,
    ) -> Result<Attempt> {
        let req = FinishAttempt {
            fence: self.fence(),
            outcome,
            summary,
            released,
        };
        let res = self
            .shared
            .client
            .call(
                Method::POST,
                &format!("/v1/attempts/{}/finish", self.shared.attempt.id),
                &[],
                Payload::json(&req)?,
                Resend::IfUndelivered,
                None,
            )
            .await;
        self.shared.stop.cancel();
        if let Err(e) = &res {
            self.shared.note(e);
        }
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run() -> Run {
        let attempt = Attempt {
            id: "att_1".into(),
            task_id: "task_1".into(),
            worker: "w".into(),
            fence: 1,
            expires_at: chrono::Utc::now(),
            state: AttemptState::Active,
            manifest_digest: None,
            started_at: chrono::Utc::now(),
            ended_at: None,
            outcome: None,
            released: vec![],
        };
        let client = Client::new("http://127.0.0.1:9", "token").unwrap();
        let control = ControlState {
            plan_revision: 1,
            ..ControlState::default()
        };
        Run::new(client, attempt, Duration::from_secs(30), control, None)
    }

    fn command(id: &str, operation: Operation, seq: i64) -> ControlCommand {
        ControlCommand {
            command_id: id.into(),
            operation,
            args: serde_json::json!({}),
            plan_revision: 1,
            applied_at: chrono::Utc::now(),
            seq,
        }
    }

    fn reply(task_state: TaskState, commands: Vec<ControlCommand>) -> HeartbeatReply {
        HeartbeatReply {
            expires_at: chrono::Utc::now(),
            task_state,
            plan_revision: 1,
            commands,
        }
    }

    /// Resolves at once, or not within the (paused) clock's next step.
    async fn returns_at_once(run: &Run) -> bool {
        tokio::time::timeout(Duration::from_millis(1), run.wait_if_paused())
            .await
            .is_ok_and(|r| r.is_ok())
    }

    #[tokio::test(start_paused = true)]
    async fn a_reply_computed_before_a_resume_does_not_pause_again() {
        let run = run();
        let shared = &run.shared;
        shared.on_command(command("c_pause", Operation::Pause, 1));
        assert!(run.control().borrow().paused);
        assert!(!returns_at_once(&run).await, "paused: waits");
        shared.on_command(command("c_resume", Operation::Resume, 2));
        // The heartbeat's transaction ran before the Resume applied: it still says paused and
        // still carries the (already applied) Pause.
        shared.on_reply(reply(
            TaskState::Paused,
            vec![command("c_pause", Operation::Pause, 1)],
        ));
        assert!(
            !run.control().borrow().paused,
            "the stale reply paused again"
        );
        assert!(
            returns_at_once(&run).await,
            "wait_if_paused must return at once"
        );
        let acks = shared.acks.lock().unwrap().pending.clone();
        assert_eq!(acks, vec!["c_pause", "c_resume"], "each acknowledged once");
    }

    #[tokio::test(start_paused = true)]
    async fn an_older_command_first_seen_after_a_newer_one_changes_nothing() {
        let run = run();
        let shared = &run.shared;
        // The stream brought the Resume (seq 2); a reply then brings the Pause (seq 1) the
        // worker had not seen.
        shared.on_command(command("c_resume", Operation::Resume, 2));
        shared.on_reply(reply(
            TaskState::Running,
            vec![command("c_pause", Operation::Pause, 1)],
        ));
        assert!(!run.control().borrow().paused);
        assert!(returns_at_once(&run).await);
        let acks = shared.acks.lock().unwrap().pending.clone();
        assert_eq!(
            acks,
            vec!["c_resume", "c_pause"],
            "the stale one is still acknowledged"
        );

        // The same for instructions: the newest replan's stay.
        let mut newer = command("c_replan_2", Operation::Replan, 4);
        newer.args = serde_json::json!({"instructions": "newer"});
        let mut older = command("c_replan_1", Operation::Replan, 3);
        older.args = serde_json::json!({"instructions": "older"});
        shared.on_command(newer);
        shared.on_command(older);
        assert_eq!(
            run.control().borrow().instructions.as_deref(),
            Some("newer")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_pause_from_a_reply_still_pauses_and_a_cancel_still_cancels() {
        let run = run();
        let shared = &run.shared;
        shared.on_reply(reply(
            TaskState::Paused,
            vec![command("c_pause", Operation::Pause, 1)],
        ));
        assert!(
            run.control().borrow().paused,
            "a pause carried by a reply applies"
        );
        // A stale cancel is still a cancel: nothing undoes it.
        shared.on_command(command("c_resume", Operation::Resume, 3));
        shared.on_command(command("c_cancel", Operation::Cancel, 2));
        assert!(run.control().borrow().cancelled);
        assert!(matches!(run.wait_if_paused().await, Err(Error::Cancelled)));
    }
}
