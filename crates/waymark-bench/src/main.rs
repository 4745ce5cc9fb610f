//! `waymark-bench`: the speed claims of issue 11, each measured against a baseline in the same
//! run on the same machine, so the ratios hold on a noisy one. Prints a table, or JSON with
//! `--json`. Targets are reported, not asserted: a benchmark informs, a test decides.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use futures::StreamExt;
use serde::Serialize;
use serde_json::{Value, json};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{Connection, SqliteConnection};
use waymark_server::{Config, DataDir, Running};

mod approval;
mod child;
mod phone;
mod postgres;
mod runner;
mod soak;
mod suite;
mod sys;

#[derive(Debug, Parser)]
#[command(
    name = "waymark-bench",
    about = "Measure Waymark against baselines in the same run"
)]
struct Args {
    /// Smaller sizes (seconds, for CI and a first look).
    #[arg(long)]
    quick: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Run only these benchmarks (checkpoints, postgres, steer, catch-up, fan-out, phone,
    /// approval (an approval's round trip, stage by stage, app and web companion),
    /// suite — the logged `scripts/test` runs; runner — the real Claude Code under `waymark
    /// runner`, only when named).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Events the catch-up bench streams into the mirror (default 1,000,000; 5,000 with
    /// `--quick`): to tell what the size does from what the rest does.
    #[arg(long)]
    catch_up_events: Option<i64>,
    /// The soak instead of the benchmarks (issue 32; not in CI): steady mixed load for
    /// `--soak-minutes`, sampled each minute, printed as a table and drawn as a PNG.
    #[arg(long)]
    soak: bool,
    /// How long the soak runs.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    soak_minutes: u64,
    /// Where the soak draws its plot (its samples go beside it, as JSON).
    #[arg(long)]
    soak_out: Option<std::path::PathBuf>,
    #[command(subcommand)]
    child: Option<ChildMode>,
}

/// What the bench runs in a child process of its own (see `child`); not for people.
#[derive(Debug, clap::Subcommand)]
enum ChildMode {
    #[command(hide = true)]
    Subscribers,
    #[command(hide = true)]
    CatchUp,
}

/// One line of the report.
#[derive(Debug, Serialize)]
struct Figure {
    bench: String,
    measure: String,
    value: f64,
    unit: String,
    baseline: Option<f64>,
    ratio: Option<f64>,
    target: String,
    met: Option<bool>,
}

/// The defaults, with the per-credential rate limit lifted: every request of a benchmark
/// comes from one worker token, and the limit (1,000/s) would measure itself instead of the
/// store.
fn bench_config() -> Config {
    Config {
        rate_per_second: 1_000_000,
        rate_burst: 1_000_000,
        address_rate_per_second: 1_000_000,
        address_rate_burst: 1_000_000,
        ..Config::default()
    }
}

struct Server {
    _dir: tempfile::TempDir,
    run: Running,
    worker: String,
    http: reqwest::Client,
    /// The server's own runtime (see [`server_runtime`]), shut down when the server goes.
    rt: Option<tokio::runtime::Runtime>,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// The server runs on a runtime of its own, with as many threads as the bench's, named
/// [`sys::SERVER_THREADS`]: so the CPU the server spends is told apart from the clients' (the
/// clients must not be what limits a figure), and the clients never queue behind its tasks.
fn server_runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(std::thread::available_parallelism().map_or(2, |n| n.get()))
        .thread_name(sys::SERVER_THREADS)
        .enable_all()
        .build()?)
}

async fn server(config: Config) -> Result<Server> {
    serve(config, None, None).await
}

/// A server on SQLite in a fresh data dir, or on the PostgreSQL database at `database_url`
/// (a replica: several may share it). A user `bench` and a worker token are made unless
/// `worker` is given (a second replica of the same database).
async fn serve(
    config: Config,
    database_url: Option<&str>,
    worker: Option<String>,
) -> Result<Server> {
    let dir = tempfile::tempdir()?;
    let rt = server_runtime()?;
    let data = DataDir::new(dir.path());
    let url = database_url.map(str::to_owned);
    // Started on the server's runtime (its tasks are spawned there); through a blocking
    // thread because `start`'s future is not `Send` (sqlx's migrator).
    let handle = rt.handle().clone();
    let run = tokio::task::spawn_blocking(move || {
        handle.block_on(async move {
            let addr = "127.0.0.1:0".parse()?;
            let run = match url {
                None => waymark_server::start(&data, addr, config).await?,
                Some(url) => {
                    let store =
                        std::sync::Arc::new(waymark_store_postgres::PgStore::connect(&url).await?);
                    waymark_server::start_with_store(&data, store, addr, config).await?
                }
            };
            Ok::<_, anyhow::Error>(run)
        })
    })
    .await??;
    let store = run.state.store.clone();
    let worker = match worker {
        Some(w) => w,
        None => {
            waymark_server::admin::add_user(&*store, "bench").await?;
            waymark_server::admin::create_worker_token(&*store, "bench", Some("bench"))
                .await?
                .0
        }
    };
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .build()?;
    Ok(Server {
        _dir: dir,
        run,
        worker,
        http,
        rt: Some(rt),
    })
}

impl Server {
    /// The server's data dir.
    fn dir(&self) -> &std::path::Path {
        self._dir.path()
    }

    async fn post(&self, path: &str, body: &Value) -> Result<Value> {
        let res = self
            .http
            .post(format!("{}{path}", self.run.url()))
            .bearer_auth(&self.worker)
            .json(body)
            .send()
            .await?;
        let status = res.status();
        let v: Value = res.json().await?;
        anyhow::ensure!(status.is_success(), "{path}: {status} {v}");
        Ok(v)
    }

    async fn task_with_attempt(&self) -> Result<(String, String)> {
        let t = self.post("/v1/tasks", &json!({"title": "bench"})).await?;
        let task = t["id"].as_str().context("task id")?.to_owned();
        let a = self
            .post(
                &format!("/v1/tasks/{task}/attempts"),
                &json!({"worker": "bench", "lease_seconds": 3600}),
            )
            .await?;
        Ok((task, a["id"].as_str().context("attempt id")?.to_owned()))
    }
}

/// Flushes what earlier phases left in the page cache before a timed phase starts, so one
/// phase's write-back does not land in the next one's fsyncs (the baselines run right after
/// the measured paths, on the same disk).
async fn settle_disk() {
    let _ = tokio::process::Command::new("sync").status().await;
    tokio::time::sleep(Duration::from_millis(100)).await;
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn body(seq: i64) -> Value {
    json!({"reason": "step_completed", "summary": format!("step {seq}"), "completed_steps": [{"step": "fix", "verified": true, "artifact_digests": ["0".repeat(64)]}]})
}

/// A raw durable SQLite: the same pragmas the control plane uses.
async fn raw_sqlite(path: &std::path::Path) -> Result<SqliteConnection> {
    let mut c = SqliteConnection::connect_with(
        &SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full),
    )
    .await?;
    sqlx::query("CREATE TABLE IF NOT EXISTS checkpoints (task_id TEXT, sequence INTEGER, body TEXT, digest TEXT, PRIMARY KEY (task_id, sequence))")
        .execute(&mut c)
        .await?;
    Ok(c)
}

/// `clients` concurrent clients each making `per` requests in turn (`one(client, 1..=per)`):
/// the requests per second over all, and each request's latency in ms.
async fn timed_clients<F, Fut>(clients: usize, per: usize, one: F) -> Result<(f64, Vec<f64>)>
where
    F: Fn(usize, i64) -> Fut,
    Fut: std::future::Future<Output = Result<Value>>,
{
    let start = Instant::now();
    let one = &one;
    let results = futures::future::join_all((0..clients).map(|client| async move {
        let mut l = Vec::with_capacity(per);
        for seq in 1..=per as i64 {
            let t = Instant::now();
            one(client, seq).await?;
            l.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        Ok::<_, anyhow::Error>(l)
    }))
    .await;
    let rate = (clients * per) as f64 / start.elapsed().as_secs_f64();
    let mut lat = Vec::with_capacity(clients * per);
    for r in results {
        lat.extend(r?);
    }
    Ok((rate, lat))
}

/// CPU µs per request since `before` (from [`sys::cpu_split`]): (server, clients).
pub(crate) fn cpu_per_request(before: (u64, u64), requests: usize) -> (f64, f64) {
    let now = sys::cpu_split();
    let per = |a: u64, b: u64| a.saturating_sub(b) as f64 / 1000.0 / requests as f64;
    (per(now.0, before.0), per(now.1, before.1))
}

/// The share of one core the clients used: CPU µs per request times requests per second.
fn client_cores(client_us: f64, rate: f64) -> f64 {
    client_us * rate / 1e6
}

/// Checkpoint appends over HTTP (1 and 64 workers) against raw batched inserts of the same rows,
/// and single-writer latency against one raw durable commit.
async fn checkpoints(quick: bool, out: &mut Vec<Figure>) -> Result<()> {
    let s = server(bench_config()).await?;
    for (workers, per) in [
        (1usize, if quick { 200 } else { 2000 }),
        (64usize, if quick { 10 } else { 60 }),
    ] {
        let mut tasks = Vec::new();
        for _ in 0..workers {
            tasks.push(s.task_with_attempt().await?);
        }
        settle_disk().await;
        let cpu = sys::cpu_split();
        let (rate, mut lat) = timed_clients(workers, per, |client, seq| {
            let (task, att) = &tasks[client];
            let path = format!("/v1/tasks/{task}/checkpoints");
            let req = json!({"attempt_id": att, "fence": 1, "sequence": seq, "body": body(seq)});
            let s = &s;
            async move { s.post(&path, &req).await }
        })
        .await?;
        let append_cpu = cpu_per_request(cpu, workers * per);

        // What HTTP alone allows on this machine: the same clients and request count, each a
        // `GET /healthz` (no credential; one read of the log head, no write). An append can
        // only be slower.
        settle_disk().await;
        let cpu = sys::cpu_split();
        let (ceiling, mut round_trips) = timed_clients(workers, per, |_, _| async {
            s.http
                .get(format!("{}/healthz", s.run.url()))
                .send()
                .await?
                .error_for_status()?
                .bytes()
                .await?;
            Ok(Value::Null)
        })
        .await?;
        let ceiling_cpu = cpu_per_request(cpu, workers * per);
        for (what, (server, clients), r) in [
            ("appends", append_cpu, rate),
            ("GET /healthz", ceiling_cpu, ceiling),
        ] {
            out.push(Figure {
                bench: "checkpoints".into(),
                measure: format!("client CPU µs/request, {what}, {workers} client(s)"),
                value: clients,
                unit: "µs".into(),
                baseline: Some(server),
                ratio: Some(clients / server),
                target: format!(
                    "reported (baseline: the server's; the clients' one thread {:.0}% busy)",
                    100.0 * client_cores(clients, r)
                ),
                met: None,
            });
        }
        let of_ceiling = rate / ceiling;
        out.push(Figure {
            bench: "checkpoints".into(),
            measure: format!("appends/s ÷ GET /healthz/s, {workers} client(s)"),
            value: rate,
            unit: "/s".into(),
            baseline: Some(ceiling),
            ratio: Some(of_ceiling),
            target: if workers == 64 {
                "ratio ≥ 0.5 (baseline: the HTTP ceiling, same clients)".into()
            } else {
                "reported (baseline: the HTTP ceiling, same clients)".into()
            },
            met: (workers == 64).then_some(of_ceiling >= 0.5),
        });

        // Baseline: the same rows, inserted raw in batches of `workers` per durable commit.
        let dir = tempfile::tempdir()?;
        let mut c = raw_sqlite(&dir.path().join("raw.db")).await?;
        settle_disk().await;
        let start = Instant::now();
        for seq in 1..=per as i64 {
            let mut tx = c.begin().await?;
            for (task, _) in &tasks {
                sqlx::query("INSERT INTO checkpoints VALUES (?, ?, ?, ?)")
                    .bind(task)
                    .bind(seq)
                    .bind(body(seq).to_string())
                    .bind("0".repeat(71))
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
        }
        let raw = (workers * per) as f64 / start.elapsed().as_secs_f64();
        let ratio = rate / raw;
        out.push(Figure {
            bench: "checkpoints".into(),
            measure: format!("appends/s, {workers} worker(s), HTTP"),
            value: rate,
            unit: "/s".into(),
            baseline: Some(raw),
            ratio: Some(ratio),
            target: "reported (baseline: raw batched durable inserts)".into(),
            met: None,
        });
        if workers == 1 {
            lat.sort_by(f64::total_cmp);
            // Baseline: one raw durable single-row commit.
            let mut one = Vec::new();
            for i in 0..200i64 {
                let t = Instant::now();
                let mut tx = c.begin().await?;
                sqlx::query("INSERT INTO checkpoints VALUES ('single', ?, '{}', 'd')")
                    .bind(i)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                one.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            one.sort_by(f64::total_cmp);
            round_trips.sort_by(f64::total_cmp);
            let (p50, raw50) = (percentile(&lat, 0.5), percentile(&one, 0.5));
            let http50 = percentile(&round_trips, 0.5);
            out.push(Figure {
                bench: "checkpoints".into(),
                measure: "HTTP round trip p50 (GET /healthz)".into(),
                value: http50,
                unit: "ms".into(),
                baseline: Some(raw50),
                ratio: Some(http50 / raw50),
                target: "reported (against one raw durable commit)".into(),
                met: None,
            });
            let floor = http50 + raw50;
            out.push(Figure {
                bench: "checkpoints".into(),
                measure: "single-writer p50 ÷ (HTTP p50 + raw commit p50)".into(),
                value: p50,
                unit: "ms".into(),
                baseline: Some(floor),
                ratio: Some(p50 / floor),
                target: "ratio ≤ 1.3".into(),
                met: Some(p50 <= 1.3 * floor),
            });
            out.push(Figure {
                bench: "checkpoints".into(),
                measure: "single-writer latency p50".into(),
                value: p50,
                unit: "ms".into(),
                baseline: Some(raw50),
                ratio: Some(p50 / raw50),
                target: "within 1.5× of one raw durable commit".into(),
                met: Some(p50 <= 1.5 * raw50),
            });
        }
    }
    Ok(())
}

struct Device {
    id: String,
    key: ed25519_dalek::SigningKey,
}

async fn pair(s: &Server) -> Result<Device> {
    let scopes = vec!["view".to_owned(), "steer".to_owned(), "approve".to_owned()];
    let (code, _) =
        waymark_server::steer::create_pairing(&*s.run.state.store, "bench", &scopes, 600_000)
            .await?;
    let key = ed25519_dalek::SigningKey::generate(&mut rand::rngs::OsRng);
    let v = s
        .http
        .post(format!("{}/v1/devices/pair", s.run.url()))
        .json(&json!({"code": code, "name": "bench", "public_key": waymark_proto::signing::public_key_b64(&key.verifying_key())}))
        .send()
        .await?
        .json::<Value>()
        .await?;
    Ok(Device {
        id: v["id"].as_str().context("device id")?.to_owned(),
        key,
    })
}

fn command(d: &Device, task: &str, op: waymark_proto::Operation) -> Result<Value> {
    let now = chrono::Utc::now();
    let cmd = waymark_proto::SteerCommand {
        command_id: waymark_proto::ids::command(),
        task_id: Some(task.to_owned()),
        expected_plan_revision: Some(1),
        operation: op,
        scope: vec![],
        args: Value::Null,
        issued_by: "user:bench".into(),
        device_id: d.id.clone(),
        issued_at: now,
        expires_at: now + chrono::Duration::minutes(5),
    };
    Ok(serde_json::to_value(waymark_proto::signing::sign(
        &cmd, &d.key,
    )?)?)
}

/// Signed command accepted → the worker observes it through the SDK, with many live tasks.
async fn steer(quick: bool, out: &mut Vec<Figure>) -> Result<()> {
    let (live, watching) = if quick { (100, 50) } else { (10_000, 1_000) };
    sys::raise_nofile(watching as u64 + 1024)?;
    let s = server(streams_config(watching)).await?;
    futures::stream::iter(0..live)
        .map(|_| s.task_with_attempt())
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>>>()?;
    let t = s.post("/v1/tasks", &json!({"title": "steered"})).await?;
    let task = t["id"].as_str().context("task")?.to_owned();
    let client = waymark_worker::Client::new(&s.run.url(), s.worker.clone())?;
    let run = client
        .start_attempt(
            &task,
            waymark_worker::AttemptOptions::new("bench").lease(Duration::from_secs(600)),
        )
        .await?;
    let mut control = run.control();
    let d = pair(&s).await?;
    let rounds = if quick { 40 } else { 200 };
    // Three times: with nobody watching (the baseline), with the people watching reading every
    // event as it comes, then with them connected but not reading. On this machine their
    // reading shares the server's two cores (in a real deployment it runs on their phones and
    // laptops); the last pass, in which the server still writes every event to every stream,
    // tells the server's own part.
    for watched in [None, Some(true), Some(false)] {
        let reading = watched == Some(true);
        let from = head(&s).await?;
        let watchers = match watched {
            Some(reading) => Some(subscribers(&s, watching, reading).await?),
            None => None,
        };
        let mut lat = Vec::with_capacity(rounds);
        for i in 0..rounds {
            let want_paused = i % 2 == 0;
            let op = if want_paused {
                waymark_proto::Operation::Pause
            } else {
                waymark_proto::Operation::Resume
            };
            let env = command(&d, &task, op)?;
            let res = s
                .http
                .post(format!("{}/v1/commands", s.run.url()))
                .json(&env)
                .send()
                .await?;
            let accepted = Instant::now();
            let v: Value = res.json().await?;
            anyhow::ensure!(v["status"] == "applied", "{v}");
            tokio::time::timeout(
                Duration::from_secs(10),
                control.wait_for(|c| c.paused == want_paused),
            )
            .await
            .context("the worker never saw the command")??;
            lat.push(accepted.elapsed().as_secs_f64() * 1000.0);
        }
        let events = head(&s).await? - from;
        if let Some(mut watchers) = watchers {
            // Their streams were served on the people's lane, apart from the control path.
            let on_lane = s.run.state.metrics.people_lane_connections.get();
            anyhow::ensure!(
                on_lane >= watching as u64,
                "only {on_lane} of {watching} event streams were served on the people's lane"
            );
            watchers.close();
            let seen: child::Seen = serde_json::from_str(&watchers.line().await?)?;
            // The next pass subscribes as many again: wait until the server has closed these
            // (on the people's lane, which runs after everything else).
            streams_closed(&s).await?;
            // Reading, not merely connected: the commands' events reached them.
            anyhow::ensure!(
                !reading || seen.events >= (watching * rounds / 2) as u64,
                "the {watching} subscribers read only {} events during {rounds} commands",
                seen.events
            );
        }
        lat.sort_by(f64::total_cmp);
        let live = match watched {
            None => format!("{live} live tasks, nobody watching"),
            Some(true) => format!("{live} live tasks, {watching} subscribers reading"),
            Some(false) => format!("the same, {events} events unread"),
        };
        out.push(Figure {
            bench: "steer".into(),
            measure: format!("accepted → observed p50 ({live})"),
            value: percentile(&lat, 0.5),
            unit: "ms".into(),
            baseline: None,
            ratio: None,
            target: "reported".into(),
            met: None,
        });
        let p99 = percentile(&lat, 0.99);
        out.push(Figure {
            bench: "steer".into(),
            measure: format!("accepted → observed p99 ({live})"),
            value: p99,
            unit: "ms".into(),
            baseline: None,
            ratio: None,
            target: match watched {
                None | Some(true) => "p99 ≤ 5 ms".into(),
                Some(false) => {
                    "reported (the server's part: it writes them all, nobody reads)".into()
                }
            },
            met: (watched != Some(false)).then_some(p99 <= 5.0),
        });
    }
    Ok(())
}

/// N events from cursor 0 into the companion's mirror, against a raw batched insert.
async fn catch_up(quick: bool, events: Option<i64>, out: &mut Vec<Figure>) -> Result<()> {
    let s = server(Config {
        event_retention: 10_000_000,
        ..bench_config()
    })
    .await?;
    let n: i64 = events.unwrap_or(if quick { 5_000 } else { 1_000_000 });
    anyhow::ensure!(n >= 2, "--catch-up-events: at least 2");
    let per_task = 2_000i64;
    let mut tasks = Vec::new();
    while (tasks.len() as i64) * per_task < n {
        tasks.push(s.task_with_attempt().await?);
    }
    // Each task's first checkpoint through the real write path; its event is the template of
    // the rest, which are appended through the store (the HTTP path would take minutes for a
    // million): the same events, as the append writes them, 10,000 to a transaction.
    let from = head(&s).await?;
    for (task, att) in &tasks {
        let req = json!({"attempt_id": att, "fence": 1, "sequence": 1, "body": body(1)});
        s.post(&format!("/v1/tasks/{task}/checkpoints"), &req)
            .await?;
    }
    let store = s.run.state.store.clone();
    let template = {
        let mut tx = store.read().await?;
        tx.events_after(from, 1_000, None)
            .await?
            .into_iter()
            .find(|e| e.kind == waymark_proto::EventKind::CheckpointAppended)
            .context("the first checkpoint's event")?
    };
    // Made a transaction's worth at a time: a million at once would be a gigabyte of the
    // bench's own memory, counted in the next bench's server RSS.
    let events = tasks.iter().enumerate().flat_map(|(i, (task, att))| {
        let m = (n - i as i64 * per_task).clamp(0, per_task);
        (2..=m).map(move |seq| (task, att, seq))
    });
    let mut events = events.peekable();
    while events.peek().is_some() {
        let mut tx = store.write().await?;
        for (task, att, seq) in events.by_ref().take(10_000) {
            let mut data = template.data.clone();
            data["task_id"] = json!(task);
            data["attempt_id"] = json!(att);
            data["sequence"] = json!(seq);
            data["body"] = body(seq);
            tx.append_event(&waymark_store::NewEvent {
                task_id: task.clone(),
                owner_id: template.owner_id.clone(),
                kind: template.kind,
                data,
                at: template.at,
            })
            .await?;
        }
        tx.commit().await?;
    }
    let home = tempfile::tempdir()?;
    let scopes = vec!["view".to_owned()];
    let (code, _) =
        waymark_server::steer::create_pairing(&*s.run.state.store, "bench", &scopes, 600_000)
            .await?;
    settle_disk().await;
    // The companion catches up in a child process of its own: its peak memory is its own.
    let mut companion = child::Child::start(
        "catch-up",
        &child::CatchUp {
            url: s.run.url(),
            code,
            home: home.path().to_owned(),
        },
    )
    .await?;
    let ready = companion.line().await?;
    anyhow::ensure!(ready == "ready", "catch-up: {ready}");
    let r: child::CaughtUp = serde_json::from_str(&companion.line().await?)?;
    let rate = r.events as f64 / r.secs;
    out.push(Figure {
        bench: "catch-up".into(),
        measure: format!("companion peak RSS, {} events", r.events),
        value: r.peak_rss as f64 / (1 << 20) as f64,
        unit: "MB".into(),
        baseline: None,
        ratio: None,
        target: "≤ 100 MB (VmHWM of the process catching up)".into(),
        met: Some(r.peak_rss <= 100 << 20),
    });

    let dir = tempfile::tempdir()?;
    let mut raw = raw_sqlite(&dir.path().join("raw.db")).await?;
    settle_disk().await;
    let start = Instant::now();
    let rows = r.events as i64;
    let mut seq = 0;
    while seq < rows {
        let mut tx = raw.begin().await?;
        for _ in 0..256 {
            seq += 1;
            if seq > rows {
                break;
            }
            sqlx::query("INSERT INTO checkpoints VALUES ('t', ?, ?, ?)")
                .bind(seq)
                .bind(body(seq).to_string())
                .bind("d")
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
    }
    let raw_rate = rows as f64 / start.elapsed().as_secs_f64();
    let ratio = rate / raw_rate;
    out.push(Figure {
        bench: "catch-up".into(),
        measure: format!("{} events from cursor 0 into the mirror", r.events),
        value: rate,
        unit: "events/s".into(),
        baseline: Some(raw_rate),
        ratio: Some(ratio),
        target: "ratio ≥ 1.0 (baseline: raw, one statement per row, 256 per commit)".into(),
        met: Some(ratio >= 1.0),
    });

    // A second, stronger reference (reported only): the same rows written the way the mirror
    // writes them, 256 rows per statement and 2,048 per commit, with nothing in between — what
    // is left of the mirror's time beyond it is the stream (server read, JSON, SSE, parsing).
    let dir = tempfile::tempdir()?;
    let mut raw = raw_sqlite(&dir.path().join("raw.db")).await?;
    settle_disk().await;
    let start = Instant::now();
    let all: Vec<i64> = (1..=rows).collect();
    for commit in all.chunks(2048) {
        let mut tx = raw.begin().await?;
        for chunk in commit.chunks(256) {
            let mut q = sqlx::QueryBuilder::<sqlx::Sqlite>::new("INSERT INTO checkpoints ");
            q.push_values(chunk, |mut b, seq| {
                b.push_bind("t")
                    .push_bind(*seq)
                    .push_bind(body(*seq).to_string())
                    .push_bind("d");
            });
            q.build().execute(&mut *tx).await?;
        }
        tx.commit().await?;
    }
    let bulk_rate = rows as f64 / start.elapsed().as_secs_f64();
    out.push(Figure {
        bench: "catch-up".into(),
        measure: "the same, against 256-row statements".into(),
        value: rate,
        unit: "events/s".into(),
        baseline: Some(bulk_rate),
        ratio: Some(rate / bulk_rate),
        target: "reported".into(),
        met: None,
    });
    Ok(())
}

/// The config of a bench with many streams: the stream and connection caps above them.
fn streams_config(streams: usize) -> Config {
    Config {
        max_streams: streams + 64,
        max_connections: streams + 1024,
        ..bench_config()
    }
}

/// Waits until the server has no event stream open (its `waymark_sse_subscribers` gauge).
async fn streams_closed(s: &Server) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = s
            .http
            .get(format!("{}/metrics", s.run.url()))
            .send()
            .await?
            .text()
            .await?;
        let open = text
            .lines()
            .find_map(|l| l.strip_prefix("waymark_sse_subscribers "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .context("no waymark_sse_subscribers gauge in /metrics")?;
        if open == 0.0 {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{open} event streams still open a minute after their subscribers left"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Where the event log stands.
async fn head(s: &Server) -> Result<i64> {
    Ok(s.http
        .get(format!("{}/healthz", s.run.url()))
        .send()
        .await?
        .json::<Value>()
        .await?["cursor"]
        .as_i64()
        .unwrap_or(0))
}

/// `n` SSE subscribers of every event after the head, in a child process (see `child`);
/// returns once all are connected.
async fn subscribers(s: &Server, n: usize, drain: bool) -> Result<child::Child> {
    let mut c = child::Child::start(
        "subscribers",
        &child::Subscribers {
            url: s.run.url(),
            token: s.run.admin_token.clone(),
            after: head(s).await?,
            n,
            drain,
        },
    )
    .await?;
    let ready = c.line().await?;
    anyhow::ensure!(ready == "ready", "subscribers: {ready}");
    Ok(c)
}

/// N SSE subscribers (in a child process, so that the server's memory and sockets are its
/// own); one write; delivery latency to each, and the server's resident memory.
async fn fan_out(quick: bool, out: &mut Vec<Figure>) -> Result<()> {
    let n = if quick { 200 } else { 10_000 };
    sys::raise_nofile(n as u64 + 1024)?;
    let s = server(streams_config(n)).await?;
    let (task, att) = s.task_with_attempt().await?;
    let (before, _) = sys::rss("self")?;
    let mut subs = subscribers(&s, n, false).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (connected, _) = sys::rss("self")?;
    let sent = child::unix_ns();
    s.post(
        &format!("/v1/tasks/{task}/checkpoints"),
        &json!({"attempt_id": att, "fence": 1, "sequence": 1, "body": body(1)}),
    )
    .await?;
    let seen: child::Seen = serde_json::from_str(&subs.line().await?)?;
    let (after, peak) = sys::rss("self")?;
    anyhow::ensure!(
        seen.first.len() == n,
        "{} of {n} subscribers answered",
        seen.first.len()
    );
    let mut lat: Vec<f64> = seen
        .first
        .iter()
        .map(|at| at.saturating_sub(sent) as f64 / 1e6)
        .collect();
    lat.sort_by(f64::total_cmp);
    let p99 = percentile(&lat, 0.99);
    let target_ms = if n >= 10_000 { 250.0 } else { 100.0 };
    out.push(Figure {
        bench: "fan-out".into(),
        measure: format!("delivery p99 to {n} SSE subscribers"),
        value: p99,
        unit: "ms".into(),
        baseline: None,
        ratio: None,
        target: format!("p99 ≤ {target_ms} ms"),
        met: Some(p99 <= target_ms),
    });
    let mb = |b: u64| b as f64 / (1 << 20) as f64;
    out.push(Figure {
        bench: "fan-out".into(),
        measure: format!("server RSS, {n} subscribers connected"),
        value: mb(connected.max(after)),
        unit: "MB".into(),
        baseline: Some(mb(before)),
        ratio: Some(connected.max(after) as f64 / before as f64),
        target: format!(
            "reported (baseline: before they connected; peak {:.0} MB; {:.1} KB a subscriber)",
            mb(peak),
            (connected.max(after).saturating_sub(before)) as f64 / 1024.0 / n as f64
        ),
        met: None,
    });
    Ok(())
}

fn main() -> Result<()> {
    let args = Args::parse();
    match args.child {
        // The children work as the real clients do, on a multi-threaded runtime.
        Some(ChildMode::Subscribers) => {
            tokio::runtime::Runtime::new()?.block_on(child::subscribers())
        }
        Some(ChildMode::CatchUp) => tokio::runtime::Runtime::new()?.block_on(child::catch_up()),
        // The bench's own clients share one thread, so that they cost as little as they can
        // and never compete with the server's runtime for more than one core (their CPU is
        // measured: `cpu_split`).
        None => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(bench(args)),
    }
}

async fn bench(args: Args) -> Result<()> {
    eprintln!("load average at start: {:.2}", sys::load());
    if args.soak {
        let out = args.soak_out.clone().unwrap_or_else(soak::default_out);
        return soak::soak(args.soak_minutes, &out).await.context("soak");
    }
    let want = |name: &str| args.only.is_empty() || args.only.iter().any(|o| o == name);
    let mut out = Vec::new();
    // First, while the process holds nothing of the other benches: its server RSS is the
    // process's.
    if want("fan-out") {
        fan_out(args.quick, &mut out).await.context("fan-out")?;
    }
    if want("checkpoints") {
        checkpoints(args.quick, &mut out)
            .await
            .context("checkpoints")?;
    }
    if want("postgres") {
        postgres::postgres(args.quick, &mut out)
            .await
            .context("postgres")?;
    }
    if want("steer") {
        steer(args.quick, &mut out).await.context("steer")?;
    }
    if want("catch-up") {
        catch_up(args.quick, args.catch_up_events, &mut out)
            .await
            .context("catch-up")?;
    }
    if want("phone") {
        phone::phone(args.quick, &mut out).await.context("phone")?;
    }
    if want("approval") {
        approval::approval(args.quick, &mut out)
            .await
            .context("approval")?;
    }
    // Only when asked: it drives the real Claude Code for a minute or more.
    if args.only.iter().any(|o| o == "runner") {
        runner::runner(args.quick, &mut out)
            .await
            .context("runner")?;
    }
    if want("suite") {
        suite::suite(&mut out).context("suite")?;
    }
    eprintln!("load average at end: {:.2}", sys::load());
    if args.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "{:<12} {:<46} {:>12} {:>12} {:>7}  target",
        "bench", "measure", "value", "baseline", "ratio"
    );
    for f in &out {
        let mark = match f.met {
            Some(true) => "✓",
            Some(false) => "✗",
            None => " ",
        };
        println!(
            "{:<12} {:<46} {:>9.2} {:<2} {:>12} {:>7}  {mark} {}",
            f.bench,
            f.measure,
            f.value,
            f.unit,
            f.baseline
                .map(|b| format!("{b:.2}"))
                .unwrap_or_else(|| "-".into()),
            f.ratio
                .map(|r| format!("{r:.2}"))
                .unwrap_or_else(|| "-".into()),
            f.target
        );
    }
    Ok(())
}
