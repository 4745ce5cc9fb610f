//! Checkpoint appends on PostgreSQL, with one, two and four replicas sharing the database,
//! against the same rows inserted raw into the same database (one statement per row, `workers`
//! rows per commit, as the SQLite baseline); with what each append costs: the replicas' CPU,
//! PostgreSQL's CPU (its processes' user and system time) and the WAL it writes — the inputs of
//! the model in `docs/scale.md`. The database is the throwaway test cluster of
//! `scripts/postgres-test-server` (or `WAYMARK_TEST_DATABASE_URL`): a fresh database per
//! measurement, dropped after it.

use std::time::Instant;

use anyhow::{Context, Result};
use serde_json::json;
use sqlx::{Connection, PgConnection};
use waymark_store_postgres::testing::with_database;

use crate::{Figure, Server, bench_config, body, serve, settle_disk, timed_clients};

/// The test server's URL: `WAYMARK_TEST_DATABASE_URL`, else what the script prints.
async fn test_server() -> Result<String> {
    if let Some(url) = std::env::var("WAYMARK_TEST_DATABASE_URL")
        .ok()
        .filter(|u| !u.is_empty())
    {
        return Ok(url);
    }
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/postgres-test-server"
    );
    let out = tokio::process::Command::new("bash")
        .arg(script)
        .output()
        .await
        .with_context(|| format!("running {script}"))?;
    anyhow::ensure!(
        out.status.success(),
        "{script} could not start PostgreSQL (install it with `apt-get install -y postgresql`, or set WAYMARK_TEST_DATABASE_URL): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?.trim().to_owned())
}

pub(crate) async fn postgres(quick: bool, out: &mut Vec<Figure>) -> Result<()> {
    let base = test_server().await?;
    let pinned = Pinned::split();
    if let Some(p) = &pinned {
        eprintln!(
            "postgres: PostgreSQL on cores {}, the replicas and clients on {}",
            p.database, p.bench
        );
    }
    let pid = std::process::id();
    for replicas in [1usize, 2, 4] {
        let db = format!("waymark_bench_{pid}_{replicas}");
        in_database(&base, &db, async |url| {
            appends(&url, replicas, quick, out).await
        })
        .await?;
    }
    // The database a network away: the same appends through a proxy that delays every byte
    // by `AWAY` each way (`Delayed`), as a database on another machine would.
    let mut one = None;
    for replicas in [1usize, 2, 4] {
        let db = format!("waymark_bench_{pid}_away_{replicas}");
        let rate = in_database(&base, &db, async |url| away(&url, replicas, quick).await).await?;
        let base_rate = *one.get_or_insert(rate);
        let target = match replicas {
            1 => "reported (the database 1 ms away each way)".to_owned(),
            2 => "ratio ≥ 1.6 (baseline: one replica, the database as far)".to_owned(),
            _ => "reported (baseline: one replica, the database as far)".to_owned(),
        };
        out.push(Figure {
            bench: "postgres".into(),
            measure: format!(
                "appends/s, 64 workers, {replicas} replica(s), the database {AWAY:?} away each way"
            ),
            value: rate,
            unit: "/s".into(),
            baseline: (replicas > 1).then_some(base_rate),
            ratio: (replicas > 1).then_some(rate / base_rate),
            target,
            met: (replicas == 2).then_some(rate / base_rate >= 1.6),
        });
    }
    drop(pinned);
    Ok(())
}

/// A database of its own for one measurement on the server at `base`: created, handed to
/// `measure` by its URL, and dropped after it, whether it succeeded or not.
async fn in_database<T>(
    base: &str,
    name: &str,
    measure: impl AsyncFnOnce(String) -> Result<T>,
) -> Result<T> {
    let mut admin = PgConnection::connect(base).await?;
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut admin)
        .await?;
    let res = measure(with_database(base, name)).await;
    sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .execute(&mut admin)
        .await?;
    res
}

/// How far away the database is in the `away` pass, each way. (tokio's timers count whole
/// milliseconds, so this is the shortest delay the proxy can add.)
const AWAY: std::time::Duration = std::time::Duration::from_millis(1);

/// Checkpoint appends by 64 workers over `replicas` replicas whose connections to the database
/// go through [`Delayed`]: appends/s.
async fn away(url: &str, replicas: usize, quick: bool) -> Result<f64> {
    let per = if quick { 5 } else { 30 };
    let proxy = Delayed::start(url, AWAY).await?;
    let set = Replicas::start(&proxy.url, replicas).await?;
    let (rate, _) = set.append(per).await?;
    drop(set);
    drop(proxy);
    Ok(rate)
}

/// `replicas` replicas on the database at `url`, and a task with an attempt for each of
/// [`WORKERS`] workers: worker `i` talks to replica `i % replicas`, for its setup as for what
/// it measures.
struct Replicas {
    servers: Vec<Server>,
    tasks: Vec<(String, String)>,
}

/// The concurrent workers of every pass.
const WORKERS: usize = 64;

impl Replicas {
    async fn start(url: &str, replicas: usize) -> Result<Replicas> {
        let mut servers = vec![serve(bench_config(), Some(url), None).await?];
        for _ in 1..replicas {
            let worker = servers[0].worker.clone();
            servers.push(serve(bench_config(), Some(url), Some(worker)).await?);
        }
        let mut set = Replicas {
            servers,
            tasks: Vec::new(),
        };
        for i in 0..WORKERS {
            let task = set.at(i).task_with_attempt().await?;
            set.tasks.push(task);
        }
        Ok(set)
    }

    fn at(&self, worker: usize) -> &Server {
        &self.servers[worker % self.servers.len()]
    }

    /// Every worker appends `per` checkpoints, one after another.
    async fn append(&self, per: usize) -> Result<(f64, Vec<f64>)> {
        timed_clients(WORKERS, per, |client, seq| {
            let (task, att) = &self.tasks[client];
            let path = format!("/v1/tasks/{task}/checkpoints");
            let req = json!({"attempt_id": att, "fence": 1, "sequence": seq, "body": body(seq)});
            let s = self.at(client);
            async move { s.post(&path, &req).await }
        })
        .await
    }
}

/// A TCP proxy on loopback in front of the database that holds every chunk of bytes for a
/// fixed delay before passing it on, each way, without holding up the chunks behind it: what
/// a network between the replicas and the database adds to each round trip.
struct Delayed {
    url: String,
    task: tokio::task::JoinHandle<()>,
}

impl Delayed {
    async fn start(url: &str, delay: std::time::Duration) -> Result<Delayed> {
        let parsed = url::Url::parse(url).context("the database URL")?;
        let upstream = format!(
            "{}:{}",
            parsed
                .host_str()
                .context("the database URL names no host")?,
            parsed.port().unwrap_or(5432)
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let mut near = parsed.clone();
        near.set_host(Some("127.0.0.1"))?;
        near.set_port(Some(port))
            .map_err(|()| anyhow::anyhow!("cannot set the proxy's port"))?;
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::join!(pump(cr, sw, delay), pump(sr, cw, delay));
                });
            }
        });
        Ok(Delayed {
            url: near.to_string(),
            task,
        })
    }
}

impl Drop for Delayed {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies `from` to `to`, each chunk `delay` after it was read.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: std::time::Duration,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let reading = async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = from.read(&mut buf).await {
            if n == 0
                || tx
                    .send((tokio::time::Instant::now() + delay, buf[..n].to_vec()))
                    .is_err()
            {
                break;
            }
        }
    };
    let writing = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reading, writing);
}

/// The database on its own cores: PostgreSQL's processes on the upper half of the machine's
/// cores (backends started later inherit it from the postmaster), this process — the replicas
/// and their clients — on the lower half, through `taskset`; as they were when dropped. On a
/// machine of one core, or without `taskset`, nothing is pinned.
struct Pinned {
    database: String,
    bench: String,
    all: String,
}

impl Pinned {
    fn split() -> Option<Pinned> {
        let cores = std::thread::available_parallelism().ok()?.get();
        if cores < 2 {
            return None;
        }
        let half = cores / 2;
        let pinned = Pinned {
            database: format!("{half}-{}", cores - 1),
            bench: format!("0-{}", half - 1),
            all: format!("0-{}", cores - 1),
        };
        pinned
            .apply(&pinned.database, &pinned.bench)
            .then_some(pinned)
    }

    /// Sets the cores of every PostgreSQL process and of every thread of this one.
    fn apply(&self, database: &str, bench: &str) -> bool {
        let set = |args: &[&str]| {
            std::process::Command::new("taskset")
                .args(args)
                .stdout(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        let mut ok = set(&["-a", "-p", "-c", bench, &std::process::id().to_string()]);
        for pid in postgres_pids() {
            ok &= set(&["-p", "-c", database, &pid]);
        }
        ok
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        self.apply(&self.all, &self.all);
    }
}

async fn appends(url: &str, replicas: usize, quick: bool, out: &mut Vec<Figure>) -> Result<()> {
    let (workers, per) = (WORKERS, if quick { 10 } else { 60 });
    let mut set = Replicas::start(url, replicas).await?;
    settle_disk().await;
    let (rate, append) = costs(url, workers * per, || set.append(per)).await?;
    // A heartbeat (every agent renews its lease every 10 s by default): a write that appends
    // no event, so it claims no place in the log.
    settle_disk().await;
    let (beat_rate, beat) = costs(url, workers * per, || {
        timed_clients(workers, per, |client, _| {
            let (_, att) = &set.tasks[client];
            let path = format!("/v1/attempts/{att}/heartbeat");
            let s = set.at(client);
            async move { s.post(&path, &json!({"fence": 1})).await }
        })
    })
    .await?;
    let tasks = std::mem::take(&mut set.tasks);
    drop(set);
    let rows = [("appends", append), ("heartbeats", beat)];
    for (what, c) in rows {
        for (measure, value, unit) in [
            ("the replicas' CPU", c.replicas_us, "µs"),
            ("PostgreSQL's CPU", c.postgres_us, "µs"),
            ("WAL", c.wal_bytes, "B"),
        ] {
            out.push(Figure {
                bench: "postgres".into(),
                measure: format!("{measure} per one of the {what}, {replicas} replica(s)"),
                value,
                unit: unit.into(),
                baseline: None,
                ratio: None,
                target: "reported (docs/scale.md's inputs)".into(),
                met: None,
            });
        }
    }
    out.push(Figure {
        bench: "postgres".into(),
        measure: format!("heartbeats/s, {workers} workers, {replicas} replica(s)"),
        value: beat_rate,
        unit: "/s".into(),
        baseline: None,
        ratio: None,
        target: "reported (docs/scale.md's inputs)".into(),
        met: None,
    });

    // Baseline: the same rows inserted raw into the same database.
    let mut c = PgConnection::connect(url).await?;
    sqlx::query(
        "CREATE TABLE bench_raw (task_id TEXT, sequence BIGINT, body JSONB, digest TEXT,
           PRIMARY KEY (task_id, sequence))",
    )
    .execute(&mut c)
    .await?;
    settle_disk().await;
    let start = Instant::now();
    for seq in 1..=per as i64 {
        let mut tx = c.begin().await?;
        for (task, _) in &tasks {
            insert_raw(&mut tx, task, seq).await?;
        }
        tx.commit().await?;
    }
    let raw = (workers * per) as f64 / start.elapsed().as_secs_f64();
    // A second reference (reported): one row per commit, one commit after another — what a
    // database allows when each commit must finish before the next starts, as event-writing
    // transactions did under the cursor lock before the horizon (`docs/scale.md`).
    sqlx::query("TRUNCATE bench_raw").execute(&mut c).await?;
    settle_disk().await;
    let serial_rows = (workers * per / 4).max(64);
    let start = Instant::now();
    for (i, seq) in (0..serial_rows).zip(1i64..) {
        let mut tx = c.begin().await?;
        insert_raw(&mut tx, &tasks[i % workers].0, seq).await?;
        tx.commit().await?;
    }
    let serial = serial_rows as f64 / start.elapsed().as_secs_f64();
    let _ = c.close().await;
    let ratio = rate / raw;
    out.push(Figure {
        bench: "postgres".into(),
        measure: format!("appends/s, {workers} workers, {replicas} replica(s)"),
        value: rate,
        unit: "/s".into(),
        baseline: Some(raw),
        ratio: Some(ratio),
        target: "ratio ≥ 0.3 (baseline: raw inserts, same rows, same database)".into(),
        met: Some(ratio >= 0.3),
    });
    out.push(Figure {
        bench: "postgres".into(),
        measure: format!("the same, against serial commits ({replicas} replica(s))"),
        value: rate,
        unit: "/s".into(),
        baseline: Some(serial),
        ratio: Some(rate / serial),
        target: "reported (baseline: one row a commit, one commit after another)".into(),
        met: None,
    });
    Ok(())
}

/// One baseline row: what an append writes, inserted raw.
async fn insert_raw(c: &mut PgConnection, task: &str, seq: i64) -> Result<()> {
    sqlx::query("INSERT INTO bench_raw VALUES ($1, $2, $3::jsonb, $4)")
        .bind(task)
        .bind(seq)
        .bind(body(seq).to_string())
        .bind("0".repeat(71))
        .execute(c)
        .await?;
    Ok(())
}

/// The WAL position, in bytes since the cluster began.
async fn wal_lsn(c: &mut PgConnection) -> Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint")
            .fetch_one(c)
            .await?,
    )
}

/// Every PostgreSQL process on the machine (`postgres` and its backends), by `/proc/<pid>/stat`:
/// its pid and the fields after its name. The bench's cluster is the only one the test machine
/// runs.
fn postgres_procs() -> Vec<(String, Vec<String>)> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|p| std::fs::read_to_string(p.path().join("stat")).ok())
        .filter_map(|stat| {
            // `pid (comm) state ppid …`
            let (head, rest) = stat.rsplit_once(") ")?;
            let (pid, comm) = head.split_once(" (")?;
            comm.starts_with("postgres").then(|| {
                (
                    pid.to_owned(),
                    rest.split_whitespace().map(str::to_owned).collect(),
                )
            })
        })
        .collect()
}

fn postgres_pids() -> Vec<String> {
    postgres_procs().into_iter().map(|(pid, _)| pid).collect()
}

/// User and system CPU so far of every PostgreSQL process, in clock ticks (the 14th and 15th
/// fields of `stat`, the 12th and 13th after the name).
fn postgres_cpu_ticks() -> u64 {
    postgres_procs()
        .iter()
        .filter_map(|(_, fields)| {
            let ticks = |i: usize| fields.get(i)?.parse::<u64>().ok();
            Some(ticks(11)? + ticks(12)?)
        })
        .sum()
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 on Linux).
fn ticks_per_second() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse().ok())
        .unwrap_or(100.0)
}

/// What one request of a measured phase cost.
struct Costs {
    /// The replicas' CPU (their runtimes' threads in this process), µs.
    replicas_us: f64,
    /// PostgreSQL's processes' CPU, µs.
    postgres_us: f64,
    /// WAL written, bytes.
    wal_bytes: f64,
}

/// Runs a phase of `requests` requests and measures it: its rate, and what a request cost.
async fn costs<F, Fut>(url: &str, requests: usize, phase: F) -> Result<(f64, Costs)>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<(f64, Vec<f64>)>>,
{
    let mut probe = PgConnection::connect(url).await?;
    let wal_before = wal_lsn(&mut probe).await?;
    let pg_before = postgres_cpu_ticks();
    let cpu_before = crate::sys::cpu_split();
    let (rate, _) = phase().await?;
    let (replicas_us, _) = crate::cpu_per_request(cpu_before, requests);
    let postgres_us = postgres_cpu_ticks().saturating_sub(pg_before) as f64 * 1e6
        / ticks_per_second()
        / requests as f64;
    let wal_bytes = (wal_lsn(&mut probe).await? - wal_before) as f64 / requests as f64;
    let _ = probe.close().await;
    Ok((
        rate,
        Costs {
            replicas_us,
            postgres_us,
            wal_bytes,
        },
    ))
}
