//! `waymark-bench --soak` (issue 32): an hour (`--soak-minutes`) of steady mixed load on one
//! control plane, sampling each minute what could grow. The load: 64 workers (the worker SDK,
//! each with its control stream) appending a checkpoint a second and starting a new task every
//! five minutes; 1,000 event-stream subscribers reading every event (a child process, so their
//! sockets and memory are not the server's); two companions (the desktop app's engine)
//! following the stream and answering an approval opened every 10 s; two phones whose push
//! channels point at a push service on loopback; follow-ups firing every minute. The event log
//! keeps 100,000 events, so retention works during the hour.
//!
//! Each minute: the bench process's resident memory (the server and the in-process clients)
//! and the subscribers' apart, the process's open files, the database and its WAL, the events
//! kept, and the minute's p99 of a checkpoint append and of an approval's round trip (opened →
//! the answer reached the worker). Printed as a table, drawn as a PNG, kept as JSON. Not in CI.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::Serialize;
use serde_json::{Value, json};
use waymark_proto::{CheckpointBody, FinishOutcome, Operation};

use crate::{Device, Server, child, pair, percentile, serve, streams_config, sys};

const WORKERS: usize = 64;
const SUBSCRIBERS: usize = 1_000;
const CHECKPOINTS_PER_TASK: i64 = 300;
const APPROVAL_EVERY: Duration = Duration::from_secs(10);
const EVENTS_KEPT: i64 = 100_000;

/// What the load counts as it goes; each minute's sample takes its share.
#[derive(Default)]
struct Load {
    appends: AtomicU64,
    append_ms: Mutex<Vec<f64>>,
    approval_ms: Mutex<Vec<f64>>,
    pushes: Arc<AtomicU64>,
    errors: AtomicU64,
    last_error: Mutex<Option<String>>,
    stop: AtomicBool,
}

impl Load {
    fn failed(&self, what: &str, e: impl std::fmt::Display) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(format!("{what}: {e}"));
    }

    fn take(v: &Mutex<Vec<f64>>) -> Vec<f64> {
        let mut v = std::mem::take(&mut *v.lock().unwrap_or_else(|p| p.into_inner()));
        v.sort_by(f64::total_cmp);
        v
    }
}

/// One minute's figures.
#[derive(Debug, Serialize)]
struct Sample {
    minute: u64,
    appends: u64,
    append_p99_ms: f64,
    approvals: usize,
    approval_p99_ms: f64,
    pushes: u64,
    followups_fired: i64,
    server_rss_mb: f64,
    subscribers_rss_mb: f64,
    open_files: usize,
    db_mb: f64,
    wal_mb: f64,
    events_kept: i64,
    errors: u64,
}

pub(crate) async fn soak(minutes: u64, out: &Path) -> Result<()> {
    sys::raise_nofile(SUBSCRIBERS as u64 + 1024)?;
    let s = Arc::new(
        serve(
            waymark_server::Config {
                push_allow: vec!["127.0.0.0/8".parse()?],
                event_retention: EVENTS_KEPT,
                ..streams_config(SUBSCRIBERS + 2 * WORKERS)
            },
            None,
            None,
        )
        .await?,
    );
    let url = s.run.url();
    let load = Arc::new(Load::default());
    let pushes = crate::approval::push_service_counting(load.pushes.clone()).await?;

    // 1,000 subscribers reading every event.
    let mut subs = crate::subscribers(&s, SUBSCRIBERS, true).await?;
    let subs_pid = subs.pid().context("the subscribers' process id")?;

    // Two phones with push channels, two companions following and answering.
    for n in 0..2 {
        let d = pair(&s).await?;
        register_push(&s, &d, &format!("{pushes}/push/phone{n}")).await?;
    }
    let scopes = vec!["view".to_owned(), "steer".to_owned(), "approve".to_owned()];
    let homes = [tempfile::tempdir()?, tempfile::tempdir()?];
    let mut apps = Vec::new();
    let (stop_follow, follow_stopped) = tokio::sync::watch::channel(false);
    let mut followers = Vec::new();
    for (n, home) in homes.iter().enumerate() {
        let app = Arc::new(
            waymark_companion::Companion::open_with_keystore(home.path(), "file-insecure").await?,
        );
        let (code, _) =
            waymark_server::steer::create_pairing(&*s.run.state.store, "bench", &scopes, 600_000)
                .await?;
        app.pair(&url, &code, &format!("laptop {n}")).await?;
        let (a, stopped) = (app.clone(), follow_stopped.clone());
        followers.push(tokio::spawn(
            async move { a.follow(stopped, &|_| {}).await },
        ));
        apps.push(app);
    }

    // Follow-ups firing every minute on tasks of their own.
    let mut followups = Vec::new();
    for n in 0..4 {
        let t = s
            .post("/v1/tasks", &json!({"title": format!("follow-up {n}")}))
            .await?;
        let task = t["id"].as_str().context("task")?;
        let f = s
            .post(
                &format!("/v1/tasks/{task}/followups"),
                &json!({"schedule": {"every": "PT1M"}, "message": "check the build again"}),
            )
            .await?;
        followups.push(f["id"].as_str().context("follow-up id")?.to_owned());
    }

    let client = waymark_worker::Client::new(&url, s.worker.clone())?;
    let mut tasks = Vec::new();
    for n in 0..WORKERS {
        tasks.push(tokio::spawn(worker(client.clone(), load.clone(), n)));
    }
    tasks.push(tokio::spawn(approvals(
        client.clone(),
        apps.clone(),
        load.clone(),
    )));

    let data_dir = s.dir().to_path_buf();
    let mut samples = Vec::new();
    let mut fired_before = followups_fired(&s, &followups).await?;
    let start = Instant::now();
    eprintln!(
        "soak: {minutes} min — {WORKERS} workers, {SUBSCRIBERS} subscribers, 2 companions, 2 phones, 4 follow-ups"
    );
    for minute in 1..=minutes {
        tokio::time::sleep_until((start + Duration::from_secs(60 * minute)).into()).await;
        let appends = load.appends.swap(0, Ordering::Relaxed);
        let append = Load::take(&load.append_ms);
        let approval = Load::take(&load.approval_ms);
        let fired = followups_fired(&s, &followups).await?;
        let (rss, _) = sys::rss("self")?;
        let (subs_rss, _) = sys::rss(&subs_pid.to_string())?;
        let (pruned, max) = {
            let mut tx = s.run.state.store.read().await?;
            (tx.pruned_through().await?, tx.max_cursor().await?)
        };
        let sample = Sample {
            minute,
            appends,
            append_p99_ms: percentile(&append, 0.99),
            approvals: approval.len(),
            approval_p99_ms: percentile(&approval, 0.99),
            pushes: load.pushes.swap(0, Ordering::Relaxed),
            followups_fired: fired - fired_before,
            server_rss_mb: mb(rss),
            subscribers_rss_mb: mb(subs_rss),
            open_files: std::fs::read_dir("/proc/self/fd")?.count(),
            db_mb: mb(size(&data_dir.join("waymark.db"))),
            wal_mb: mb(size(&data_dir.join("waymark.db-wal"))),
            events_kept: max - pruned,
            errors: load.errors.load(Ordering::Relaxed),
        };
        fired_before = fired;
        eprintln!("{}", row(&sample));
        samples.push(sample);
    }
    load.stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(30), t).await;
    }
    let _ = stop_follow.send(true);
    for f in followers {
        let _ = f.await;
    }
    subs.close();
    let seen: child::Seen = serde_json::from_str(&subs.line().await?)?;

    println!("{}", header());
    for smp in &samples {
        println!("{}", row(smp));
    }
    println!(
        "subscribers read {} events in all; {} errors{}",
        seen.events,
        load.errors.load(Ordering::Relaxed),
        load.last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|e| format!(" (last: {e})"))
            .unwrap_or_default()
    );
    std::fs::write(
        out.with_extension("json"),
        serde_json::to_string_pretty(&samples)?,
    )?;
    plot(&samples, out)?;
    println!(
        "drawn in {} (samples in {})",
        out.display(),
        out.with_extension("json").display()
    );
    Ok(())
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn size(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

fn header() -> String {
    format!(
        "{:>4} {:>8} {:>9} {:>5} {:>10} {:>6} {:>4} {:>9} {:>9} {:>6} {:>8} {:>7} {:>8} {:>5}",
        "min",
        "appends",
        "app p99",
        "appr",
        "appr p99",
        "pushes",
        "fup",
        "RSS MB",
        "subs MB",
        "fds",
        "db MB",
        "wal MB",
        "events",
        "errs"
    )
}

fn row(s: &Sample) -> String {
    format!(
        "{:>4} {:>8} {:>9.2} {:>5} {:>10.2} {:>6} {:>4} {:>9.1} {:>9.1} {:>6} {:>8.1} {:>7.1} {:>8} {:>5}",
        s.minute,
        s.appends,
        s.append_p99_ms,
        s.approvals,
        s.approval_p99_ms,
        s.pushes,
        s.followups_fired,
        s.server_rss_mb,
        s.subscribers_rss_mb,
        s.open_files,
        s.db_mb,
        s.wal_mb,
        s.events_kept,
        s.errors
    )
}

/// A worker: a task at a time, a checkpoint a second, a new task every
/// [`CHECKPOINTS_PER_TASK`].
async fn worker(client: waymark_worker::Client, load: Arc<Load>, n: usize) {
    // Spread over the first second, so the appends do not come in one burst.
    tokio::time::sleep(Duration::from_millis((n as u64 * 1000) / WORKERS as u64)).await;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !load.stop.load(Ordering::Relaxed) {
        let task = match client
            .create_task(&serde_json::from_value(json!({"title": format!("soak {n}")})).unwrap())
            .await
        {
            Ok(t) => t,
            Err(e) => {
                load.failed("creating a task", e);
                tick.tick().await;
                continue;
            }
        };
        let run = match client
            .start_attempt(
                &task.id,
                waymark_worker::AttemptOptions::new("soak").lease(Duration::from_secs(600)),
            )
            .await
        {
            Ok(r) => r,
            Err(e) => {
                load.failed("starting an attempt", e);
                tick.tick().await;
                continue;
            }
        };
        for seq in 1..=CHECKPOINTS_PER_TASK {
            tick.tick().await;
            if load.stop.load(Ordering::Relaxed) {
                break;
            }
            let t = Instant::now();
            let body = CheckpointBody {
                reason: "step_completed".into(),
                summary: Some(format!("step {seq} of worker {n}")),
                ..Default::default()
            };
            match run.checkpoint(body).await {
                Ok(_) => {
                    load.appends.fetch_add(1, Ordering::Relaxed);
                    load.append_ms
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(t.elapsed().as_secs_f64() * 1000.0);
                }
                Err(e) => load.failed("a checkpoint", e),
            }
        }
        if let Err(e) = run
            .finish(FinishOutcome::Completed, Some("soaked".into()))
            .await
        {
            load.failed("finishing", e);
        }
    }
}

/// An approval every [`APPROVAL_EVERY`], answered by the companions in turn as soon as their
/// mirror has it; its round trip is opened → the worker has the answer.
async fn approvals(
    client: waymark_worker::Client,
    apps: Vec<Arc<waymark_companion::Companion>>,
    load: Arc<Load>,
) {
    let run = async {
        let task = client
            .create_task(&serde_json::from_value(json!({"title": "approvals"}))?)
            .await?;
        let run = client
            .start_attempt(
                &task.id,
                waymark_worker::AttemptOptions::new("soak").lease(Duration::from_secs(600)),
            )
            .await?;
        Ok::<_, anyhow::Error>(run)
    };
    let run = match run.await {
        Ok(r) => r,
        Err(e) => {
            load.failed("the approvals' task", e);
            return;
        }
    };
    let mut tick = tokio::time::interval(APPROVAL_EVERY);
    let mut n = 0usize;
    while !load.stop.load(Ordering::Relaxed) {
        tick.tick().await;
        n += 1;
        let app = &apps[n % apps.len()];
        let round = async {
            let t = Instant::now();
            let d = run
                .open_approval(
                    json!({"tool": "deploy", "target": "staging", "build": n}),
                    &format!("deploy build {n} to staging?"),
                    waymark_worker::ApprovalOptions::default(),
                )
                .await?;
            let until = Instant::now() + Duration::from_secs(30);
            let mirrored = loop {
                if let Some(m) = app.mirror().decision(&d.id).await? {
                    break m;
                }
                if Instant::now() > until {
                    bail!("the companion's mirror never received decision {}", d.id);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            };
            let seen = waymark_companion::Seen {
                plan_revision: mirrored.plan_revision,
                intent_digest: mirrored.intent_digest.clone(),
            };
            app.answer(&d.id, Operation::Approve, None, None, &seen)
                .await?;
            let done = tokio::time::timeout(Duration::from_secs(30), run.await_decision(&d.id))
                .await
                .context("the answer never reached the worker")??;
            anyhow::ensure!(
                done.status == waymark_proto::DecisionStatus::Resolved,
                "not answered: {:?}",
                done.status
            );
            Ok::<_, anyhow::Error>(t.elapsed().as_secs_f64() * 1000.0)
        };
        match round.await {
            Ok(ms) => load
                .approval_ms
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(ms),
            Err(e) => load.failed("an approval", e),
        }
    }
}

/// Registers a UnifiedPush channel for a device, with a read session of its own.
async fn register_push(s: &Server, d: &Device, endpoint: &str) -> Result<()> {
    let now = chrono::Utc::now();
    let open = waymark_proto::SteerCommand {
        command_id: waymark_proto::ids::command(),
        task_id: None,
        expected_plan_revision: None,
        operation: Operation::OpenSession,
        scope: vec![],
        args: Value::Null,
        issued_by: "user:bench".into(),
        device_id: d.id.clone(),
        issued_at: now,
        expires_at: now + chrono::Duration::minutes(1),
    };
    let env = waymark_proto::signing::sign(&open, &d.key)?;
    let res = s
        .http
        .post(format!("{}/v1/devices/{}/session", s.run.url(), d.id))
        .json(&env)
        .send()
        .await?;
    let v: Value = res.json().await?;
    let token = v["token"].as_str().context("a session token")?;
    let res = s
        .http
        .post(format!("{}/v1/devices/{}/push", s.run.url(), d.id))
        .bearer_auth(token)
        .json(&json!({"kind": "unified_push", "endpoint": endpoint}))
        .send()
        .await?;
    anyhow::ensure!(
        res.status().is_success(),
        "registering a push channel: {} {}",
        res.status(),
        res.text().await.unwrap_or_default()
    );
    Ok(())
}

/// Runs delivered so far by the follow-ups, summed.
async fn followups_fired(s: &Server, ids: &[String]) -> Result<i64> {
    let mut runs = 0;
    for id in ids {
        let v: Value = s
            .http
            .get(format!("{}/v1/followups/{id}", s.run.url()))
            .bearer_auth(&s.worker)
            .send()
            .await?
            .json()
            .await?;
        runs += v["followup"]["runs"]
            .as_i64()
            .with_context(|| format!("follow-up {id}: {v}"))?;
    }
    Ok(runs)
}

/// Four panels, one line per measure, minute by minute.
fn plot(samples: &[Sample], out: &Path) -> Result<()> {
    use plotters::prelude::*;
    let font = std::fs::read(FONT)
        .with_context(|| format!("reading the plot's font {FONT} (Debian: fonts-dejavu-core)"))?;
    let font: &'static [u8] = Box::leak(font.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, font)
        .map_err(|_| anyhow::anyhow!("the font {FONT} could not be read"))?;
    let root = BitMapBackend::new(out, (1400, 1000)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((2, 2));
    let x = |s: &Sample| s.minute as f64;
    type Line<'a> = (&'a str, Box<dyn Fn(&Sample) -> f64>, RGBColor);
    let groups: [(&str, &str, Vec<Line>); 4] = [
        (
            "resident memory",
            "MB",
            vec![
                (
                    "server + clients (bench process)",
                    Box::new(|s: &Sample| s.server_rss_mb),
                    BLUE,
                ),
                (
                    "1,000 subscribers (child)",
                    Box::new(|s: &Sample| s.subscribers_rss_mb),
                    RED,
                ),
            ],
        ),
        (
            "open files and events kept",
            "count (events ÷ 100)",
            vec![
                (
                    "open files",
                    Box::new(|s: &Sample| s.open_files as f64),
                    BLUE,
                ),
                (
                    "events kept ÷ 100",
                    Box::new(|s: &Sample| s.events_kept as f64 / 100.0),
                    RED,
                ),
            ],
        ),
        (
            "database on disk",
            "MB",
            vec![
                ("database", Box::new(|s: &Sample| s.db_mb), BLUE),
                ("WAL", Box::new(|s: &Sample| s.wal_mb), RED),
            ],
        ),
        (
            "p99 of the minute",
            "ms",
            vec![
                (
                    "checkpoint append",
                    Box::new(|s: &Sample| s.append_p99_ms),
                    BLUE,
                ),
                (
                    "approval round trip",
                    Box::new(|s: &Sample| s.approval_p99_ms),
                    RED,
                ),
            ],
        ),
    ];
    let last = samples.last().map_or(1.0, x).max(1.0);
    for (area, (title, unit, lines)) in panels.iter().zip(groups) {
        let top = samples
            .iter()
            .flat_map(|s| lines.iter().map(move |(_, f, _)| f(s)))
            .filter(|v| v.is_finite())
            .fold(0.0_f64, f64::max)
            * 1.15;
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 24))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d(0.0..last, 0.0..top.max(1.0))?;
        chart
            .configure_mesh()
            .x_desc("minute")
            .y_desc(unit)
            .label_style(("sans-serif", 14))
            .draw()?;
        for (name, f, color) in lines {
            chart
                .draw_series(LineSeries::new(
                    samples
                        .iter()
                        .filter(|s| f(s).is_finite())
                        .map(|s| (x(s), f(s))),
                    color.stroke_width(2),
                ))?
                .label(name)
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 14))
            .position(SeriesLabelPosition::LowerRight)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// Where `--soak` draws by default.
pub(crate) fn default_out() -> PathBuf {
    PathBuf::from("soak.png")
}
