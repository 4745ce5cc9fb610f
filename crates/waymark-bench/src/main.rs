//! `waymark-bench`: the speed claims of issue 11, each measured against a baseline in the same
//! run on the same machine, so the ratios hold on a noisy one. Prints a table, or JSON with
//! `--json`. Targets are reported, not asserted: a benchmark informs, a test decides.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde::Serialize;
use serde_json::{Value, json};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{Connection, SqliteConnection};
use waymark_server::{Config, DataDir, Running};

mod phone;

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
    /// Run only these benchmarks (checkpoints, steer, catch-up, fan-out).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
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
        ..Config::default()
    }
}

struct Server {
    _dir: tempfile::TempDir,
    run: Running,
    worker: String,
    http: reqwest::Client,
}

async fn server(config: Config) -> Result<Server> {
    let dir = tempfile::tempdir()?;
    let run =
        waymark_server::start(&DataDir::new(dir.path()), "127.0.0.1:0".parse()?, config).await?;
    let store = run.state.store.clone();
    waymark_server::admin::add_user(&*store, "bench").await?;
    let (worker, _) =
        waymark_server::admin::create_worker_token(&*store, "bench", Some("bench")).await?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .build()?;
    Ok(Server {
        _dir: dir,
        run,
        worker,
        http,
    })
}

impl Server {
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
        let (rate, mut lat) = timed_clients(workers, per, |client, seq| {
            let (task, att) = &tasks[client];
            let path = format!("/v1/tasks/{task}/checkpoints");
            let req = json!({"attempt_id": att, "fence": 1, "sequence": seq, "body": body(seq)});
            let s = &s;
            async move { s.post(&path, &req).await }
        })
        .await?;

        // What HTTP alone allows on this machine: the same clients and request count, each a
        // `GET /healthz` (no credential; one read of the log head, no write). An append can
        // only be slower.
        settle_disk().await;
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
        out.push(Figure {
            bench: "checkpoints".into(),
            measure: format!("HTTP ceiling: GET /healthz/s, {workers} client(s)"),
            value: ceiling,
            unit: "/s".into(),
            baseline: None,
            ratio: Some(rate / ceiling),
            target: "reported (ratio: appends/s over it)".into(),
            met: None,
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
        let target = if workers == 64 {
            "ratio ≥ 0.5"
        } else {
            "reported"
        };
        out.push(Figure {
            bench: "checkpoints".into(),
            measure: format!("appends/s, {workers} worker(s), HTTP"),
            value: rate,
            unit: "/s".into(),
            baseline: Some(raw),
            ratio: Some(ratio),
            target: target.into(),
            met: (workers == 64).then_some(ratio >= 0.5),
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
    let s = server(bench_config()).await?;
    let live = if quick { 100 } else { 1000 };
    for _ in 0..live {
        s.task_with_attempt().await?;
    }
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
    let mut lat = Vec::with_capacity(rounds);
    for i in 0..rounds {
        let op = if i % 2 == 0 {
            waymark_proto::Operation::Pause
        } else {
            waymark_proto::Operation::Resume
        };
        let want_paused = i % 2 == 0;
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
    lat.sort_by(f64::total_cmp);
    out.push(Figure {
        bench: "steer".into(),
        measure: format!("accepted → observed p50 ({live} live tasks)"),
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
        measure: format!("accepted → observed p99 ({live} live tasks)"),
        value: p99,
        unit: "ms".into(),
        baseline: None,
        ratio: None,
        target: "p99 ≤ 25 ms".into(),
        met: Some(p99 <= 25.0),
    });
    Ok(())
}

/// N events from cursor 0 into the companion's mirror, against a raw batched insert.
async fn catch_up(quick: bool, out: &mut Vec<Figure>) -> Result<()> {
    let s = server(bench_config()).await?;
    let n: i64 = if quick { 5_000 } else { 100_000 };
    let (task, att) = s.task_with_attempt().await?;
    // Fill the log through the real write path, 500 checkpoints per request batch.
    let per_task = 2_000i64;
    let mut tasks = vec![(task, att)];
    while (tasks.len() as i64) * per_task < n {
        tasks.push(s.task_with_attempt().await?);
    }
    // Fill the log through the real write path: tasks in parallel, each in sequence order.
    let fills = tasks.iter().enumerate().map(|(i, (task, att))| {
        let s = &s;
        let m = (n - i as i64 * per_task).clamp(0, per_task);
        async move {
            for seq in 1..=m {
                let body =
                    json!({"attempt_id": att, "fence": 1, "sequence": seq, "body": body(seq)});
                s.post(&format!("/v1/tasks/{task}/checkpoints"), &body)
                    .await?;
            }
            Ok::<_, anyhow::Error>(())
        }
    });
    for r in futures::future::join_all(fills).await {
        r?;
    }
    let home = tempfile::tempdir()?;
    let c = waymark_companion::Companion::open_with_keystore(home.path(), "file-insecure").await?;
    let scopes = vec!["view".to_owned()];
    let (code, _) =
        waymark_server::steer::create_pairing(&*s.run.state.store, "bench", &scopes, 600_000)
            .await?;
    c.pair(&s.run.url(), &code, "bench").await?;
    c.mirror().set_meta("cursor", "0").await?;
    settle_disk().await;
    let start = Instant::now();
    let r = c.sync_once().await?;
    let secs = start.elapsed().as_secs_f64();
    let rate = r.events as f64 / secs;

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
        target: "ratio ≥ 0.5".into(),
        met: Some(ratio >= 0.5),
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

/// N SSE subscribers; one write; delivery latency to each.
async fn fan_out(quick: bool, out: &mut Vec<Figure>) -> Result<()> {
    let s = server(bench_config()).await?;
    let subscribers = if quick { 200 } else { 1000 };
    let (task, att) = s.task_with_attempt().await?;
    let admin = s.run.admin_token.clone();
    let url = format!("{}/v1/events", s.run.url());
    let head: i64 = s
        .http
        .get(format!("{}/healthz", s.run.url()))
        .send()
        .await?
        .json::<Value>()
        .await?["cursor"]
        .as_i64()
        .unwrap_or(0);
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<()>(subscribers);
    let mut handles = Vec::new();
    for _ in 0..subscribers {
        let (http, url, admin, ready) =
            (s.http.clone(), url.clone(), admin.clone(), ready_tx.clone());
        handles.push(tokio::spawn(async move {
            let res = http
                .get(format!("{url}?after={head}"))
                .bearer_auth(admin)
                .send()
                .await?;
            let mut stream = res.bytes_stream().eventsource();
            ready.send(()).await.ok();
            let ev = tokio::time::timeout(Duration::from_secs(30), stream.next()).await?;
            let _ = ev.context("stream ended")??;
            Ok::<Instant, anyhow::Error>(Instant::now())
        }));
    }
    for _ in 0..subscribers {
        ready_rx.recv().await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let sent = Instant::now();
    s.post(
        &format!("/v1/tasks/{task}/checkpoints"),
        &json!({"attempt_id": att, "fence": 1, "sequence": 1, "body": body(1)}),
    )
    .await?;
    let mut lat = Vec::new();
    for h in handles {
        let at = h.await??;
        lat.push(at.duration_since(sent).as_secs_f64() * 1000.0);
    }
    lat.sort_by(f64::total_cmp);
    let p99 = percentile(&lat, 0.99);
    out.push(Figure {
        bench: "fan-out".into(),
        measure: format!("delivery p99 to {subscribers} SSE subscribers"),
        value: p99,
        unit: "ms".into(),
        baseline: None,
        ratio: None,
        target: "p99 ≤ 100 ms".into(),
        met: Some(p99 <= 100.0),
    });
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let want = |name: &str| args.only.is_empty() || args.only.iter().any(|o| o == name);
    let mut out = Vec::new();
    if want("checkpoints") {
        checkpoints(args.quick, &mut out)
            .await
            .context("checkpoints")?;
    }
    if want("steer") {
        steer(args.quick, &mut out).await.context("steer")?;
    }
    if want("catch-up") {
        catch_up(args.quick, &mut out).await.context("catch-up")?;
    }
    if want("fan-out") {
        fan_out(args.quick, &mut out).await.context("fan-out")?;
    }
    if want("phone") {
        phone::phone(args.quick, &mut out).await.context("phone")?;
    }
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
