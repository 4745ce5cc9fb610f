//! What the scenarios share: an in-process control plane and deploy service, a plain HTTP
//! client that reports exactly what the server answered (so "acknowledged" means a 2xx the
//! runner saw, not what an SDK retried into), the event log read over SSE, a black-holing TCP
//! proxy, and the checks every task must pass whatever happened to it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use eventsource_stream::Eventsource;
use futures::StreamExt;
use reqwest::{Method, StatusCode};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use waymark_proto::{AttemptState, EffectStatus, Event, TaskDetail};
use waymark_server::{Config, DataDir, Running};
use waymark_worker::deploy_service::DeployClient;

/// The user every chaos task belongs to (devices pair as this user too).
pub(crate) const USER: &str = "chaos";

/// A bearer-token HTTP client of one server that hands back status and body as they came.
#[derive(Debug, Clone)]
pub(crate) struct Http {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Http {
    pub(crate) fn new(base: &str, token: &str, timeout: Duration) -> anyhow::Result<Self> {
        Ok(Http {
            http: reqwest::Client::builder()
                .timeout(timeout)
                .connect_timeout(Duration::from_secs(2))
                .build()?,
            base: base.trim_end_matches('/').to_owned(),
            token: token.to_owned(),
        })
    }

    /// Sends once. `Err` only when no HTTP answer came back (the write may or may not have
    /// landed); any status is `Ok`.
    pub(crate) async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> reqwest::Result<(StatusCode, Value)> {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token);
        if let Some(b) = body {
            req = req.json(b);
        }
        let res = req.send().await?;
        let status = res.status();
        let bytes = res.bytes().await?;
        let value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        Ok((status, value))
    }

    pub(crate) async fn post(
        &self,
        path: &str,
        body: &Value,
    ) -> reqwest::Result<(StatusCode, Value)> {
        self.send(Method::POST, path, Some(body)).await
    }

    /// [`Http::post`] with an owned path, for closures that build it.
    pub(crate) async fn post_owned(
        &self,
        path: String,
        body: &Value,
    ) -> reqwest::Result<(StatusCode, Value)> {
        self.post(&path, body).await
    }

    /// [`Http::patch`] with an owned path.
    pub(crate) async fn patch_owned(
        &self,
        path: String,
        body: &Value,
    ) -> reqwest::Result<(StatusCode, Value)> {
        self.patch(&path, body).await
    }

    pub(crate) async fn patch(
        &self,
        path: &str,
        body: &Value,
    ) -> reqwest::Result<(StatusCode, Value)> {
        self.send(Method::PATCH, path, Some(body)).await
    }

    /// A read that must succeed.
    pub(crate) async fn get(&self, path: &str) -> anyhow::Result<Value> {
        let (s, v) = self
            .send(Method::GET, path, None)
            .await
            .with_context(|| format!("GET {path}"))?;
        if !s.is_success() {
            bail!("GET {path} answered {s}: {v}");
        }
        Ok(v)
    }

    /// `GET /v1/tasks/{task}`, typed: a body that does not parse is not a valid state.
    pub(crate) async fn detail(&self, task: &str) -> anyhow::Result<TaskDetail> {
        let v = self.get(&format!("/v1/tasks/{task}")).await?;
        serde_json::from_value(v).with_context(|| format!("task {task} is not a valid TaskDetail"))
    }

    /// Whether the server answers `/healthz`.
    pub(crate) async fn healthy(&self) -> bool {
        matches!(self.send(Method::GET, "/healthz", None).await, Ok((s, _)) if s.is_success())
    }

    /// The newest event cursor.
    pub(crate) async fn cursor(&self) -> anyhow::Result<i64> {
        let v = self.get("/healthz").await?;
        v["cursor"].as_i64().context("/healthz has no cursor")
    }

    /// Every event after `after` up to (at least) `through`, read from `GET /v1/events` as a
    /// client mirror reads it.
    pub(crate) async fn events(&self, after: i64, through: i64) -> anyhow::Result<Vec<Event>> {
        let mut out = Vec::new();
        if through <= after {
            return Ok(out);
        }
        let res = reqwest::Client::new()
            .get(format!("{}/v1/events", self.base))
            .query(&[("after", after.to_string())])
            .bearer_auth(&self.token)
            .send()
            .await
            .context("GET /v1/events")?;
        if !res.status().is_success() {
            bail!("GET /v1/events answered {}", res.status());
        }
        let mut stream = res.bytes_stream().eventsource();
        let read = async {
            while let Some(ev) = stream.next().await {
                let ev = ev.context("reading the event stream")?;
                if ev.event == "cursor_expired" {
                    bail!("the event stream said cursor_expired: {}", ev.data);
                }
                let event: Event = serde_json::from_str(&ev.data)
                    .with_context(|| format!("an event that does not parse: {}", ev.data))?;
                let at = event.cursor;
                out.push(event);
                if at >= through {
                    return Ok(());
                }
            }
            bail!("the event stream ended before cursor {through}")
        };
        tokio::time::timeout(Duration::from_secs(30), read)
            .await
            .context("the event stream did not reach the server's cursor in 30 s")??;
        Ok(out)
    }
}

/// A control plane and a deploy service in this process, for the scenarios that crash
/// workers rather than the server.
pub(crate) struct Env {
    _dir: tempfile::TempDir,
    pub(crate) server: Running,
    pub(crate) deploy: DeployClient,
    deploy_task: tokio::task::JoinHandle<std::io::Result<()>>,
    /// A worker token of [`USER`].
    pub(crate) worker_token: String,
}

impl Env {
    pub(crate) async fn start() -> anyhow::Result<Env> {
        let dir = tempfile::tempdir().context("a temporary dir")?;
        let data = DataDir::new(dir.path().join("server"));
        let config = Config {
            tick: Duration::from_millis(100),
            ..Config::default()
        };
        let server = waymark_server::start(&data, "127.0.0.1:0".parse()?, config).await?;
        let store = server.state.store.clone();
        waymark_server::admin::add_user(&*store, USER).await?;
        let (worker_token, _) =
            waymark_server::admin::create_worker_token(&*store, "chaos-worker", Some(USER)).await?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let deploy_url = format!("http://{}", listener.local_addr()?);
        let state: PathBuf = dir.path().join("deploys.json");
        let deploy_task = tokio::spawn(waymark_worker::deploy_service::serve(listener, state));
        let deploy = DeployClient::new(&deploy_url)?;
        Ok(Env {
            _dir: dir,
            server,
            deploy,
            deploy_task,
            worker_token,
        })
    }

    pub(crate) fn url(&self) -> String {
        self.server.url()
    }

    /// The admin's plain client.
    pub(crate) fn admin(&self) -> anyhow::Result<Http> {
        Http::new(
            &self.url(),
            &self.server.admin_token,
            Duration::from_secs(10),
        )
    }

    /// A worker's plain client.
    pub(crate) fn worker_http(&self) -> anyhow::Result<Http> {
        Http::new(&self.url(), &self.worker_token, Duration::from_secs(10))
    }

    /// A worker SDK client of `url` (the server, or a proxy in front of it).
    pub(crate) fn sdk(&self, url: &str) -> anyhow::Result<waymark_worker::Client> {
        Ok(waymark_worker::Client::new(url, self.worker_token.clone())?)
    }

    pub(crate) async fn stop(self) {
        self.deploy_task.abort();
        let _ = self.server.shutdown().await;
    }
}

/// A TCP proxy that can black-hole traffic: while the gate is shut nothing is read from
/// either side, so requests already sent sit in socket buffers and arrive once it opens —
/// what a worker's buffered writes look like after a partition heals.
pub(crate) struct Proxy {
    pub(crate) url: String,
    gate: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub(crate) async fn start(upstream: SocketAddr) -> anyhow::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let gate = watch::channel(true).0;
        let rx = gate.subscribe();
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                tokio::spawn(Self::connection(inbound, upstream, rx.clone()));
            }
        });
        Ok(Proxy { url, gate, task })
    }

    /// Starts black-holing.
    pub(crate) fn partition(&self) {
        self.gate.send_replace(false);
    }

    /// Lets everything through again, the held bytes first.
    pub(crate) fn heal(&self) {
        self.gate.send_replace(true);
    }

    async fn connection(inbound: TcpStream, upstream: SocketAddr, mut gate: watch::Receiver<bool>) {
        if gate.wait_for(|open| *open).await.is_err() {
            return;
        }
        let Ok(outbound) = TcpStream::connect(upstream).await else {
            return;
        };
        let (ri, wi) = inbound.into_split();
        let (ro, wo) = outbound.into_split();
        tokio::join!(Self::pipe(ri, wo, gate.clone()), Self::pipe(ro, wi, gate));
    }

    async fn pipe(
        mut from: impl AsyncReadExt + Unpin,
        mut to: impl AsyncWriteExt + Unpin,
        mut gate: watch::Receiver<bool>,
    ) {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            if gate.wait_for(|open| *open).await.is_err() {
                return;
            }
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => {
                    let _ = to.shutdown().await;
                    return;
                }
                Ok(n) => n,
            };
            // Read just as the partition began: hold it until it heals.
            if gate.wait_for(|open| *open).await.is_err() {
                return;
            }
            if to.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Writes the server acknowledged for one task, to be found again afterwards.
#[derive(Debug, Default, Clone)]
pub(crate) struct Acked {
    /// Sequence → digest.
    pub(crate) checkpoints: BTreeMap<i64, String>,
    /// Effect id → the newest status acknowledged.
    pub(crate) effects: BTreeMap<String, EffectStatus>,
    /// Message seq → text.
    pub(crate) messages: BTreeMap<i64, String>,
    /// Cursors of acknowledged writes that made their own event, with the event's kind.
    pub(crate) events: Vec<(i64, &'static str)>,
    /// How many writes were acknowledged (creates and attempt starts too).
    pub(crate) count: u64,
}

/// What checking a task found.
#[derive(Debug, Default)]
pub(crate) struct TaskCheck {
    pub(crate) lost: u64,
    pub(crate) invalid: u64,
    pub(crate) notes: Vec<String>,
}

impl TaskCheck {
    pub(crate) fn lost(&mut self, note: String) {
        self.lost += 1;
        self.notes.push(format!("lost: {note}"));
    }

    pub(crate) fn invalid(&mut self, note: String) {
        self.invalid += 1;
        self.notes.push(format!("invalid state: {note}"));
    }

    pub(crate) fn merge(&mut self, other: TaskCheck) {
        self.lost += other.lost;
        self.invalid += other.invalid;
        self.notes.extend(other.notes);
    }
}

/// Every acknowledged write of `acked` is in `d`, and `d` is a state the rules allow.
pub(crate) fn check_task(d: &TaskDetail, acked: &Acked) -> TaskCheck {
    let mut c = check_valid(d);
    let task = &d.task.id;
    for (seq, digest) in &acked.checkpoints {
        match d.checkpoints.iter().find(|x| x.sequence == *seq) {
            None => c.lost(format!("checkpoint #{seq} of {task}")),
            Some(x) if &x.digest != digest => c.lost(format!(
                "checkpoint #{seq} of {task} was acknowledged as {digest}, it is now {}",
                x.digest
            )),
            Some(_) => {}
        }
    }
    for (id, acked_status) in &acked.effects {
        match d.effects.iter().find(|e| &e.id == id) {
            None => c.lost(format!("effect {id} of {task}")),
            // The newest acknowledged status, or one a later (unacknowledged) write moved on to.
            Some(e) if e.status != *acked_status && !acked_status.can_become(e.status) => {
                c.lost(format!(
                    "effect {id} of {task} was acknowledged {acked_status}, it is now {}",
                    e.status
                ))
            }
            Some(_) => {}
        }
    }
    for (seq, text) in &acked.messages {
        match d.messages.iter().find(|m| m.seq == *seq) {
            Some(m) if &m.text == text => {}
            Some(m) => c.lost(format!(
                "message #{seq} of {task} was acknowledged as {text:?}, it is now {:?}",
                m.text
            )),
            None => c.lost(format!("message #{seq} of {task}")),
        }
    }
    c
}

/// The state rules every task obeys whatever happened: checkpoint sequences contiguous from
/// 1, the chain intact, one live attempt at most, the task's fence the newest attempt's,
/// message sequences contiguous, a confirmed effect has its receipt.
pub(crate) fn check_valid(d: &TaskDetail) -> TaskCheck {
    let mut c = TaskCheck::default();
    let task = &d.task.id;
    for (i, cp) in d.checkpoints.iter().enumerate() {
        if cp.sequence != i as i64 + 1 {
            c.invalid(format!(
                "{task}: checkpoint sequences are not contiguous from 1 (position {} holds #{})",
                i + 1,
                cp.sequence
            ));
            break;
        }
    }
    if !d.chain.intact || d.chain.checked != d.checkpoints.len() as i64 {
        c.invalid(format!(
            "{task}: the checkpoint chain does not verify ({} of {} checked, broken at {:?}: {})",
            d.chain.checked,
            d.checkpoints.len(),
            d.chain.broken_at,
            d.chain.reason.as_deref().unwrap_or("")
        ));
    }
    let active = d
        .attempts
        .iter()
        .filter(|a| a.state == AttemptState::Active)
        .count();
    if active > 1 {
        c.invalid(format!("{task}: {active} attempts are active at once"));
    }
    if let Some(max) = d.attempts.iter().map(|a| a.fence).max()
        && max != d.task.fence
    {
        c.invalid(format!(
            "{task}: the task's fence is {}, its newest attempt's is {max}",
            d.task.fence
        ));
    }
    if d.task.state.is_terminal() && active > 0 {
        c.invalid(format!(
            "{task}: {} yet an attempt is still active",
            d.task.state
        ));
    }
    if d.checkpoints.iter().any(|cp| cp.fence > d.task.fence) {
        c.invalid(format!(
            "{task}: a checkpoint carries a fence from the future"
        ));
    }
    for (i, m) in d.messages.iter().enumerate() {
        if m.seq != i as i64 + 1 {
            c.invalid(format!(
                "{task}: message sequences are not contiguous from 1"
            ));
            break;
        }
    }
    for e in &d.effects {
        if e.status == EffectStatus::Confirmed && e.receipt.is_none() {
            c.invalid(format!(
                "{task}: effect {} is confirmed without a receipt",
                e.id
            ));
        }
    }
    c
}

/// Checks the event log: cursors strictly increase, and every acknowledged write's event is
/// there, about its task and of its kind.
pub(crate) fn check_events(events: &[Event], acked: &BTreeMap<String, Acked>) -> TaskCheck {
    let mut c = TaskCheck::default();
    for w in events.windows(2) {
        if w[1].cursor <= w[0].cursor {
            c.invalid(format!(
                "event cursors do not strictly increase: {} then {}",
                w[0].cursor, w[1].cursor
            ));
        }
    }
    let by_cursor: BTreeMap<i64, &Event> = events.iter().map(|e| (e.cursor, e)).collect();
    for (task, a) in acked {
        for (cursor, kind) in &a.events {
            match by_cursor.get(cursor) {
                None => c.lost(format!(
                    "event {cursor} ({kind} of {task}) is not in the event log"
                )),
                Some(e) if e.task_id != *task || e.kind.as_str() != *kind => c.lost(format!(
                    "event {cursor} was acknowledged as {kind} of {task}, the log has {} of {}",
                    e.kind.as_str(),
                    e.task_id
                )),
                Some(_) => {}
            }
        }
    }
    c
}

/// A problem document's `code`.
pub(crate) fn code(v: &Value) -> &str {
    v["code"].as_str().unwrap_or("")
}
