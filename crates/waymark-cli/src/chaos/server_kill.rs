//! `server-kill`: a real `waymark serve` child, writers appending checkpoints, declaring and
//! patching effects and posting messages, and a `kill -9` at a random moment (once or twice
//! per run). After the restart on the same address and data dir, everything the server
//! acknowledged with a 2xx must be there, sequences contiguous, the chain intact, and the
//! event log must hold every acknowledged write's event in strictly increasing cursor order.
//!
//! The writers use plain HTTP, not the SDK: a write counts as acknowledged only when this
//! runner saw the 2xx, and nothing is retried behind its back.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use rand::Rng;
use rand::rngs::StdRng;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use waymark_proto::EffectStatus;
use waymark_server::DataDir;

use super::RunReport;
use super::env::{Acked, Http, TaskCheck, check_events, check_task, check_valid, code};

/// Writers per run.
const WRITERS: usize = 3;

/// A `waymark serve` child process.
struct Server {
    child: Child,
}

impl Server {
    /// Starts `waymark serve` on `addr` over `data`, retrying while the address is still
    /// taken by the process just killed.
    async fn spawn(data: &Path, addr: SocketAddr) -> anyhow::Result<Server> {
        let exe = std::env::current_exe().context("cannot find this program to start `serve`")?;
        let mut last = String::new();
        for _ in 0..50 {
            let mut child = Command::new(&exe)
                .args([
                    "serve",
                    "--json",
                    "--listen",
                    &addr.to_string(),
                    "--data-dir",
                ])
                .arg(data)
                .env("WAYMARK_LOG", "error")
                .env_remove("WAYMARK_DATABASE_URL")
                .env_remove("WAYMARK_LISTEN")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .context("cannot start `waymark serve`")?;
            let stdout = child.stdout.take().context("piped")?;
            let mut line = String::new();
            let read = tokio::time::timeout(
                Duration::from_secs(20),
                BufReader::new(stdout).read_line(&mut line),
            )
            .await;
            if matches!(read, Ok(Ok(n)) if n > 0) && line.contains("listening") {
                return Ok(Server { child });
            }
            let _ = child.start_kill();
            let _ = child.wait().await;
            // With `--json` a refusal to start is a JSON line on stdout.
            last = line;
            if !last.contains("addr_in_use") && !last.contains("in use") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("`waymark serve` did not start on {addr}: {}", last.trim())
    }

    /// `kill -9`: `Child::start_kill` sends SIGKILL on Unix.
    async fn kill9(mut self) -> anyhow::Result<()> {
        self.child.start_kill().context("SIGKILL")?;
        self.child
            .wait()
            .await
            .context("waiting for the killed server")?;
        Ok(())
    }
}

/// What the writers share: the acknowledged writes, by task.
type Ledger = Arc<Mutex<BTreeMap<String, Acked>>>;

fn ack(ledger: &Ledger, task: &str, f: impl FnOnce(&mut Acked)) {
    let mut l = ledger.lock().unwrap_or_else(|e| e.into_inner());
    let a = l.entry(task.to_owned()).or_default();
    a.count += 1;
    f(a);
}

fn cursor_of(v: &Value) -> Option<i64> {
    v["cursor"].as_i64()
}

/// One writer: a task of its own, one attempt with a lease longer than the run, then
/// checkpoints, effects and messages as fast as the server answers, until told to stop.
struct Writer {
    http: Http,
    n: usize,
    stop: Arc<AtomicBool>,
    ledger: Ledger,
}

impl Writer {
    /// Waits until the server answers again (it was killed); `false` when told to stop first.
    async fn wait_up(&self) -> bool {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while tokio::time::Instant::now() < deadline {
            if self.http.healthy().await {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        false
    }

    /// Sends a write until an HTTP answer comes back, waiting out restarts.
    async fn answer<F, Fut>(&self, send: F) -> anyhow::Result<(reqwest::StatusCode, Value)>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = reqwest::Result<(reqwest::StatusCode, Value)>>,
    {
        for _ in 0..20 {
            match send().await {
                Ok((s, _)) if s.is_server_error() => {}
                Ok(r) => return Ok(r),
                Err(_) => {}
            }
            if !self.wait_up().await {
                bail!("the server did not come back");
            }
        }
        bail!("no answer after 20 tries")
    }

    async fn next_sequence(&self, task: &str) -> anyhow::Result<i64> {
        for _ in 0..20 {
            if let Ok(d) = self.http.detail(task).await {
                return Ok(d.checkpoints.last().map_or(0, |c| c.sequence) + 1);
            }
            self.wait_up().await;
        }
        bail!("cannot read {task} back")
    }

    async fn run(self) -> anyhow::Result<()> {
        let create =
            json!({"title": format!("chaos writer {}", self.n), "goal": "survive kill -9"});
        // Not idempotent: a create whose answer was lost leaves an orphan task, which is
        // checked for validity with the others.
        let (s, v) = self.answer(|| self.http.post("/v1/tasks", &create)).await?;
        if s != reqwest::StatusCode::CREATED {
            bail!("creating a task answered {s}: {v}");
        }
        let task = v["id"].as_str().context("a task without id")?.to_owned();
        ack(&self.ledger, &task, |a| {
            a.events.extend(cursor_of(&v).map(|c| (c, "task.created")))
        });
        let start = json!({"worker": format!("chaos-writer-{}", self.n), "lease_seconds": 600});
        let path = format!("/v1/tasks/{task}/attempts");
        let (s, v) = self.answer(|| self.http.post(&path, &start)).await?;
        let (attempt, fence) = if s == reqwest::StatusCode::CREATED {
            ack(&self.ledger, &task, |a| {
                a.events.extend(cursor_of(&v).map(|c| (c, "task.updated")))
            });
            (
                v["id"]
                    .as_str()
                    .context("an attempt without id")?
                    .to_owned(),
                v["fence"].as_i64().context("an attempt without fence")?,
            )
        } else if code(&v) == "lease_held" {
            // The first start landed but its answer was lost in the kill: it is ours.
            let d = self.http.detail(&task).await?;
            let a = d.attempts.last().context("lease held by no attempt")?;
            (a.id.clone(), a.fence)
        } else {
            bail!("starting an attempt answered {s}: {v}");
        };

        let mut seq = 1;
        let mut i = 0;
        while !self.stop.load(Ordering::SeqCst) {
            i += 1;
            // A checkpoint: compare-and-set on the sequence.
            let body = json!({"attempt_id": attempt, "fence": fence, "sequence": seq,
                "body": {"reason": "step_completed", "plan_revision": 1, "summary": format!("writer {} step {i}", self.n)}});
            match self
                .http
                .post(&format!("/v1/tasks/{task}/checkpoints"), &body)
                .await
            {
                Ok((s, v)) if s == reqwest::StatusCode::CREATED => {
                    let digest = v["digest"].as_str().unwrap_or_default().to_owned();
                    ack(&self.ledger, &task, |a| {
                        a.checkpoints.insert(seq, digest);
                        a.events
                            .extend(cursor_of(&v).map(|c| (c, "checkpoint.appended")));
                    });
                    seq += 1;
                }
                Ok((s, v)) if code(&v) == "sequence_conflict" || s.is_server_error() => {
                    // An earlier write landed without its answer: reload, never skip.
                    self.wait_up().await;
                    seq = self.next_sequence(&task).await?;
                }
                Ok((s, v)) => bail!("checkpoint #{seq} of {task} answered {s}: {v}"),
                Err(_) => {
                    if !self.wait_up().await {
                        break;
                    }
                    seq = self.next_sequence(&task).await?;
                }
            }

            // Every other step an effect, declared then moved to in_progress and confirmed;
            // each of these writes is idempotent, so it is resent until answered.
            if i % 2 == 0 {
                let key = format!("w{}-e{i}", self.n);
                let declare = json!({"attempt_id": attempt, "fence": fence, "idempotency_key": key,
                    "kind": "deploy", "intent": {"target": "staging", "n": i}});
                let (s, v) = self
                    .answer(|| {
                        self.http
                            .post_owned(format!("/v1/tasks/{task}/effects"), &declare)
                    })
                    .await?;
                if !s.is_success() {
                    bail!("declaring {key} answered {s}: {v}");
                }
                let effect = v["effect"]["id"]
                    .as_str()
                    .context("no effect id")?
                    .to_owned();
                let created = v["created"].as_bool() == Some(true);
                ack(&self.ledger, &task, |a| {
                    a.effects.insert(effect.clone(), EffectStatus::Intended);
                    if created {
                        a.events
                            .extend(cursor_of(&v).map(|c| (c, "effect.declared")));
                    }
                });
                for (status, receipt) in [
                    (EffectStatus::InProgress, Value::Null),
                    (EffectStatus::Confirmed, json!({"deploy_id": key})),
                ] {
                    let patch = json!({"attempt_id": attempt, "fence": fence, "status": status,
                        "receipt": if receipt.is_null() { None } else { Some(receipt) }});
                    let (s, v) = self
                        .answer(|| {
                            self.http
                                .patch_owned(format!("/v1/effects/{effect}"), &patch)
                        })
                        .await?;
                    if !s.is_success() {
                        bail!("moving {effect} to {status} answered {s}: {v}");
                    }
                    // A resend of a write that had landed answers with the newest cursor,
                    // not its own event: only the status is checked then.
                    ack(&self.ledger, &task, |a| {
                        a.effects.insert(effect.clone(), status);
                    });
                }
            }

            // A message: not idempotent, so an unanswered one is left unacknowledged.
            let text = format!("writer {} message {i}", self.n);
            let body = json!({"attempt_id": attempt, "fence": fence,
                "messages": [{"role": "assistant", "text": text}]});
            match self
                .http
                .post(&format!("/v1/tasks/{task}/messages"), &body)
                .await
            {
                Ok((s, v)) if s == reqwest::StatusCode::CREATED => {
                    let mseq = v["messages"][0]["seq"].as_i64().context("no message seq")?;
                    ack(&self.ledger, &task, |a| {
                        a.messages.insert(mseq, text);
                        a.events
                            .extend(cursor_of(&v).map(|c| (c, "messages.appended")));
                    });
                }
                Ok((s, _)) if s.is_server_error() => {}
                Ok((s, v)) => bail!("a message to {task} answered {s}: {v}"),
                Err(_) => {
                    if !self.wait_up().await {
                        break;
                    }
                }
            }
        }
        Ok(())
    }
}

/// Opens the data dir before the server does and makes a worker token. Boxed where its
/// borrows are concrete: rustc cannot prove it `Send` inside `tokio::spawn` (rust#110338).
fn worker_token(
    data: std::path::PathBuf,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<String>> + Send>> {
    Box::pin(async move {
        let dir = DataDir::new(data);
        let store = dir.open().await?;
        waymark_server::admin::add_user(&store, super::env::USER).await?;
        let (token, _) = waymark_server::admin::create_worker_token(
            &store,
            "chaos-writer",
            Some(super::env::USER),
        )
        .await?;
        Ok(token)
    })
}

/// One run: start, write, kill -9 (1–2 times) and restart, write a little more, verify.
pub(crate) async fn run(rng: &mut StdRng) -> anyhow::Result<RunReport> {
    let dir = tempfile::tempdir().context("a temporary dir")?;
    let data = dir.path().join("data");
    let token = worker_token(data.clone()).await?;
    let addr: SocketAddr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .context("picking a free port")?;
    let mut server = Server::spawn(&data, addr).await?;
    let base = format!("http://{addr}");
    let admin_token = std::fs::read_to_string(DataDir::new(&data).admin_token_file())
        .context("reading admin.token")?
        .trim()
        .to_owned();

    let ledger: Ledger = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for n in 0..WRITERS {
        let w = Writer {
            http: Http::new(&base, &token, Duration::from_secs(5))?,
            n,
            stop: stop.clone(),
            ledger: ledger.clone(),
        };
        writers.push(tokio::spawn(w.run()));
    }

    let kills: u64 = rng.gen_range(1..=2);
    for _ in 0..kills {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(150..700))).await;
        server.kill9().await?;
        tokio::time::sleep(Duration::from_millis(rng.gen_range(0..150))).await;
        server = Server::spawn(&data, addr).await?;
    }
    tokio::time::sleep(Duration::from_millis(rng.gen_range(100..400))).await;
    stop.store(true, Ordering::SeqCst);

    let mut report = RunReport::default();
    report.figures.kills = kills;
    for w in writers {
        match tokio::time::timeout(Duration::from_secs(60), w).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => return Err(e.context("a writer failed")),
            Ok(Err(e)) => bail!("a writer panicked: {e}"),
            Err(_) => bail!("a writer did not stop within 60 s"),
        }
    }

    // Verify against the restarted server.
    let admin = Http::new(&base, &admin_token, Duration::from_secs(10))?;
    let acked = ledger.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut check = TaskCheck::default();
    for (task, a) in &acked {
        report.figures.writes_acknowledged += a.count;
        match admin.detail(task).await {
            Ok(d) => check.merge(check_task(&d, a)),
            Err(e) => check.lost(format!("task {task}: {e:#}")),
        }
    }
    // Tasks whose creation was never acknowledged are checked too: every task is valid.
    let snapshot = admin.get("/v1/snapshot").await?;
    for t in snapshot["tasks"].as_array().into_iter().flatten() {
        let id = t["id"].as_str().unwrap_or_default();
        if !acked.contains_key(id) {
            match admin.detail(id).await {
                Ok(d) => check.merge(check_valid(&d)),
                Err(e) => check.invalid(format!("{e:#}")),
            }
        }
    }
    let through = admin.cursor().await?;
    let events = admin.events(0, through).await?;
    check.merge(check_events(&events, &acked));
    report.absorb(check);
    server.kill9().await?;
    Ok(report)
}
