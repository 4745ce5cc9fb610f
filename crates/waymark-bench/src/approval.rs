//! An approval's round trip, stage by stage (issue 31 §4), read from the delivery records the
//! control plane keeps: decision opened → push accepted → fetched → shown → opened → answered
//! → the runtime took it, for the desktop app's engine (`waymark-companion`, following the
//! event stream as the app does) and for the web companion (the real one, in Chromium at phone
//! size, its push channel a push service on loopback). Nobody thinks in between: the client
//! reports each step and signs its answer as soon as it can, so what is measured is Waymark's
//! part. Beside them, the same run's baseline: one HTTP round trip to the same server.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use waymark_proto::{ApprovalDurability, DeliveryState, DeliveryStep, Operation};

use crate::{Figure, Server, bench_config, percentile, serve};

/// The stages, in order, as `/metrics` names them.
const STAGES: &[&str] = &["pushed", "fetched", "shown", "opened", "answered", "taken"];

/// A push service on loopback that takes every push (UnifiedPush: any 2xx).
async fn push_service() -> Result<String> {
    push_service_counting(Arc::default()).await
}

/// [`push_service`], counting the pushes it took.
pub(crate) async fn push_service_counting(
    taken: Arc<std::sync::atomic::AtomicU64>,
) -> Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let taken = taken.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                let mut got = Vec::new();
                // The head, then as much body as it says.
                loop {
                    let Ok(n) = sock.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    got.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&got);
                    if let Some(end) = text.find("\r\n\r\n") {
                        let len = text[..end]
                            .lines()
                            .find_map(|l| {
                                let (k, v) = l.split_once(':')?;
                                k.eq_ignore_ascii_case("content-length")
                                    .then(|| v.trim().parse::<usize>().ok())?
                            })
                            .unwrap_or(0);
                        if got.len() >= end + 4 + len {
                            break;
                        }
                    }
                }
                taken.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let _ = sock
                    .write_all(
                        b"HTTP/1.1 201 Created\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                    )
                    .await;
            });
        }
    });
    Ok(format!("http://{addr}"))
}

/// The worker's side of one round: opens an approval its runtime holds, waits for the answer
/// and reports that the runtime took it. Returns the decision's id.
async fn one_approval(
    run: &Arc<waymark_worker::Run>,
    n: usize,
) -> Result<(String, tokio::task::JoinHandle<Result<()>>)> {
    let d = run
        .open_approval(
            json!({"tool": "deploy", "target": "staging", "build": n}),
            &format!("deploy build {n} to staging?"),
            waymark_worker::ApprovalOptions {
                durability: Some(ApprovalDurability::ConnectionBound),
                ..Default::default()
            },
        )
        .await?;
    let id = d.id.clone();
    let run = run.clone();
    let waiter = tokio::spawn(async move {
        let d = run.await_decision(&id).await?;
        anyhow::ensure!(
            d.status == waymark_proto::DecisionStatus::Resolved,
            "not answered: {:?}",
            d.status
        );
        run.report_delivery(
            &id,
            DeliveryState::Acknowledged,
            Some("the bench's runtime took it".into()),
        )
        .await?;
        Ok(())
    });
    Ok((d.id, waiter))
}

/// Each stage's time since the decision opened (ms), from its record on the server.
async fn stages(s: &Server, task: &str, id: &str) -> Result<Vec<(&'static str, f64)>> {
    let d: Value = s
        .http
        .get(format!("{}/v1/tasks/{task}/decisions/{id}", s.run.url()))
        .bearer_auth(&s.worker)
        .send()
        .await?
        .json()
        .await?;
    let at = |v: &Value| -> Option<f64> {
        chrono::DateTime::parse_from_rfc3339(v.as_str()?)
            .ok()
            .map(|t| t.timestamp_micros() as f64 / 1000.0)
    };
    let opened = at(&d["created_at"]).context("created_at")?;
    let mut out = Vec::new();
    for stage in STAGES {
        let t = if *stage == "taken" {
            at(&d["delivery"]["at"]).filter(|_| d["delivery"]["state"] == "acknowledged")
        } else {
            d["deliveries"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|x| x["step"] == *stage)
                .filter_map(|x| at(&x["at"]))
                .reduce(f64::min)
        };
        if let Some(t) = t {
            out.push((*stage, t - opened));
        }
    }
    Ok(out)
}

/// p50 and p95 of each stage over the rounds, as figures.
fn figures(client: &str, rounds: &[Vec<(&'static str, f64)>], rtt: f64, out: &mut Vec<Figure>) {
    for stage in STAGES {
        let mut v: Vec<f64> = rounds
            .iter()
            .filter_map(|r| r.iter().find(|(s, _)| s == stage).map(|(_, ms)| *ms))
            .collect();
        if v.is_empty() {
            continue;
        }
        v.sort_by(f64::total_cmp);
        for (p, name) in [(0.5, "p50"), (0.95, "p95")] {
            let value = percentile(&v, p);
            out.push(Figure {
                bench: "approval".into(),
                measure: format!("{client}: opened → {stage} {name} (n={})", v.len()),
                value,
                unit: "ms".into(),
                baseline: Some(rtt),
                ratio: Some(value / rtt),
                target: "reported (baseline: one HTTP round trip)".into(),
                met: None,
            });
        }
    }
}

/// One HTTP round trip to the server, p50 over `n` (ms).
async fn round_trip(s: &Server, n: usize) -> Result<f64> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let res = s
            .http
            .get(format!("{}/healthz", s.run.url()))
            .send()
            .await?;
        anyhow::ensure!(res.status().is_success(), "healthz: {}", res.status());
        res.bytes().await?;
        v.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    v.sort_by(f64::total_cmp);
    Ok(percentile(&v, 0.5))
}

pub(crate) async fn approval(quick: bool, out: &mut Vec<Figure>) -> Result<()> {
    let rounds = if quick { 10 } else { 50 };
    let s = serve(
        waymark_server::Config {
            push_allow: vec!["127.0.0.0/8".parse()?],
            ..bench_config()
        },
        None,
        None,
    )
    .await?;
    let url = s.run.url();
    let push = push_service().await?;
    let (task, _) = {
        let t = s.post("/v1/tasks", &json!({"title": "approvals"})).await?;
        (t["id"].as_str().context("task")?.to_owned(), ())
    };
    let client = waymark_worker::Client::new(&url, s.worker.clone())?;
    let run = Arc::new(
        client
            .start_attempt(
                &task,
                waymark_worker::AttemptOptions::new("bench").lease(Duration::from_secs(3600)),
            )
            .await?,
    );
    let scopes = vec!["view".to_owned(), "steer".to_owned(), "approve".to_owned()];

    // The desktop app's engine: a companion following the event stream.
    let home = tempfile::tempdir()?;
    let app = Arc::new(
        waymark_companion::Companion::open_with_keystore(home.path(), "file-insecure").await?,
    );
    let (code, _) =
        waymark_server::steer::create_pairing(&*s.run.state.store, "bench", &scopes, 600_000)
            .await?;
    app.pair(&url, &code, "bench laptop").await?;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let follower = {
        let app = app.clone();
        tokio::spawn(async move { app.follow(stopped, &|_| {}).await })
    };
    let mut app_rounds = Vec::with_capacity(rounds);
    for n in 0..rounds {
        let (id, waiter) = one_approval(&run, n).await?;
        let until = Instant::now() + Duration::from_secs(30);
        let d = loop {
            if let Some(d) = app.mirror().decision(&id).await? {
                break d;
            }
            if Instant::now() > until {
                bail!("the app's mirror never received decision {id}");
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        app.report_receipts(std::slice::from_ref(&id), DeliveryStep::Shown)
            .await?;
        app.report_receipts(std::slice::from_ref(&id), DeliveryStep::Opened)
            .await?;
        let seen = waymark_companion::Seen {
            plan_revision: d.plan_revision,
            intent_digest: d.intent_digest.clone(),
        };
        app.answer(&id, Operation::Approve, None, None, &seen)
            .await?;
        tokio::time::timeout(Duration::from_secs(30), waiter)
            .await
            .context("the runtime never took the app's answer")???;
        app_rounds.push(stages(&s, &task, &id).await?);
    }
    let _ = stop.send(true);
    let _ = follower.await;

    // The web companion, in Chromium.
    let profile = tempfile::tempdir()?;
    let (_driver, c) = crate::phone::chromium(profile.path())
        .await
        .context("starting Chromium")?;
    let (code, _) =
        waymark_server::steer::create_pairing(&*s.run.state.store, "bench", &scopes, 600_000)
            .await?;
    c.goto(&format!("{url}/app/?bench#/pair?code={code}"))
        .await?;
    crate::phone::wait_css(&c, "[data-testid=pair-result]", 60).await?;
    let r: Value = c
        .execute_async(WEB_PUSH_CHANNEL, vec![json!(format!("{push}/push/phone"))])
        .await
        .map_err(|e| anyhow::anyhow!("registering the phone's push channel: {e:?}"))?;
    if let Some(e) = r.get("error") {
        bail!("registering the phone's push channel: {e}");
    }
    let mut web_rounds = Vec::with_capacity(rounds);
    for n in 0..rounds {
        let (id, waiter) = one_approval(&run, rounds + n).await?;
        let r: Value = c
            .execute_async(WEB_ANSWER, vec![json!(id)])
            .await
            .map_err(|e| anyhow::anyhow!("the web companion's answer: {e:?}"))?;
        if let Some(e) = r.get("error") {
            bail!("the web companion's answer to {id}: {e}");
        }
        tokio::time::timeout(Duration::from_secs(30), waiter)
            .await
            .context("the runtime never took the phone's answer")???;
        web_rounds.push(stages(&s, &task, &id).await?);
    }
    c.close().await?;

    let rtt = round_trip(&s, 200).await?;
    figures("app", &app_rounds, rtt, out);
    figures("web", &web_rounds, rtt, out);
    Ok(())
}

/// Registers a UnifiedPush channel for the page's device (arguments[0]: the endpoint), with
/// the page's own read session.
const WEB_PUSH_CHANNEL: &str = r#"
const done = arguments[arguments.length - 1];
const endpoint = arguments[0];
(async () => {
  const token = await new Promise((resolve) => {
    const open = indexedDB.open("keyval-store");
    open.onsuccess = () => {
      const get = open.result.transaction("keyval").objectStore("keyval").get("waymark-session");
      get.onsuccess = () => resolve(get.result.token);
    };
  });
  const auth = { authorization: `Bearer ${token}` };
  const w = await window.__waymarkBench.webCompanion();
  const me = (await w.devices()).find((d) => d.this_device);
  const res = await fetch(`../v1/devices/${me.id}/push`, {
    method: "POST",
    headers: { ...auth, "content-type": "application/json" },
    body: JSON.stringify({ kind: "unified_push", endpoint }),
  });
  if (!res.ok) throw new Error(`${res.status} ${await res.text()}`);
  return { device: me.id };
})().then(done, (e) => done({ error: String(e && e.stack || e) }));
"#;

/// Waits for the decision (arguments[0]) in the page's mirror, reports it shown and opened,
/// and approves it, all by the web companion's own code.
const WEB_ANSWER: &str = r#"
const done = arguments[arguments.length - 1];
const id = arguments[0];
(async () => {
  const w = await window.__waymarkBench.webCompanion();
  const until = performance.now() + 30000;
  let d = null;
  while (!(d = await w.mirror.decision(id))) {
    if (performance.now() > until) throw new Error("the decision never reached the page's mirror");
    await new Promise((r) => setTimeout(r, 2));
  }
  await w.reportReceipts([id], "shown");
  await w.markOpened([id]);
  await w.decide(id, "approve", null, null, { plan_revision: d.plan_revision, intent_digest: d.intent_digest ?? null });
  return {};
})().then(done, (e) => done({ error: String(e && e.stack || e) }));
"#;
