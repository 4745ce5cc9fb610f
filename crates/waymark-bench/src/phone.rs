//! The phone: the web companion in Debian's Chromium (headless, 390×844, touch) against this
//! run's control plane, measured in the page through its `?bench` handle. Catch-up: events
//! from cursor 0 into the browser's SQLite mirror (OPFS), against the same events fetched and
//! inserted raw into the same database (one statement per row, 256 per commit). First render:
//! the inbox with its pending decisions drawn after a cold page load, against the same load's
//! first contentful paint.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

use crate::{Figure, Server, bench_config, server};

pub(crate) struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

pub(crate) async fn chromium(profile: &Path) -> Result<(Proc, Client)> {
    let port = free_port()?;
    let driver =
        Command::new(std::env::var("CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".into()))
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("chromedriver (Debian's chromium-driver; scripts/setup-debian installs it)")?;
    let driver = Proc(driver);
    let until = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > until {
            bail!("chromedriver did not listen on {port}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut caps = serde_json::Map::new();
    caps.insert("browserName".into(), "chrome".into());
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into()),
            "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", format!("--user-data-dir={}", profile.display()),
            ],
            "mobileEmulation": {"deviceMetrics": {"width": 390, "height": 844, "pixelRatio": 3.0, "touch": true}}
        }),
    );
    let c = ClientBuilder::native()
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{port}"))
        .await
        .context("a WebDriver session with Chromium")?;
    Ok((driver, c))
}

pub(crate) async fn wait_css(c: &Client, css: &str, secs: u64) -> Result<()> {
    if let Err(e) = c
        .wait()
        .at_most(Duration::from_secs(secs))
        .for_element(Locator::Css(css))
        .await
    {
        let page: Value = c
            .execute("return document.body.innerText", vec![])
            .await
            .unwrap_or_default();
        bail!("`{css}` did not appear within {secs} s ({e}); the page said: {page}");
    }
    Ok(())
}

/// Fills the log: `events` checkpoints over tasks of 2,000, and `decisions` pending approvals
/// on one more task.
async fn fill(s: &Server, events: i64, decisions: usize) -> Result<()> {
    let per_task = 2_000i64;
    let mut tasks = Vec::new();
    while (tasks.len() as i64) * per_task < events {
        tasks.push(s.task_with_attempt().await?);
    }
    let fills = tasks.iter().enumerate().map(|(i, (task, att))| {
        let m = (events - i as i64 * per_task).clamp(0, per_task);
        async move {
            for seq in 1..=m {
                let body = json!({"attempt_id": att, "fence": 1, "sequence": seq, "body": crate::body(seq)});
                s.post(&format!("/v1/tasks/{task}/checkpoints"), &body).await?;
            }
            Ok::<_, anyhow::Error>(())
        }
    });
    for r in futures::future::join_all(fills).await {
        r?;
    }
    let (task, att) = s.task_with_attempt().await?;
    for i in 0..decisions {
        s.post(
            &format!("/v1/tasks/{task}/approvals"),
            &json!({"attempt_id": att, "fence": 1, "intent": {"target": "staging", "n": i},
                    "summary": format!("deploy build {i} to staging?")}),
        )
        .await?;
    }
    Ok(())
}

const CATCH_UP: &str = r#"
const done = arguments[arguments.length - 1];
(async () => {
  const w = await window.__waymarkBench.webCompanion();
  w.stop();
  // An empty mirror at cursor 0: the whole log replays into it.
  await w.mirror.applySnapshot(0, []);
  let t = performance.now();
  const applied = await w.catchUp();
  const mirror = performance.now() - t;
  // The baseline: the same events over the same stream, inserted raw into the same database.
  const token = await new Promise((resolve) => {
    const open = indexedDB.open("keyval-store");
    open.onsuccess = () => {
      const get = open.result.transaction("keyval").objectStore("keyval").get("waymark-session");
      get.onsuccess = () => resolve(get.result.token);
    };
  });
  await w.db.exec("DROP TABLE IF EXISTS bench_raw");
  await w.db.exec("CREATE TABLE bench_raw (cursor INTEGER PRIMARY KEY, kind TEXT NOT NULL, data TEXT NOT NULL)");
  t = performance.now();
  const stop = new AbortController();
  const res = await fetch(`../v1/events?after=0`, { headers: { authorization: `Bearer ${token}` }, signal: stop.signal });
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "", rows = [], raw = 0, writing = Promise.resolve();
  const flush = () => {
    const batch = rows; rows = []; raw += batch.length;
    writing = writing.then(() => w.db.transaction(async (tx) => {
      for (const e of batch) await tx.exec("INSERT INTO bench_raw VALUES (?, ?, ?)", [e.cursor, e.kind, JSON.stringify(e.data)]);
    }));
  };
  try {
    for (;;) {
      const { value, done: end } = await reader.read();
      if (end) break;
      buf += value;
      let i;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        const frame = buf.slice(0, i); buf = buf.slice(i + 2);
        const data = frame.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
        if (!data) continue;
        rows.push(JSON.parse(data));
        if (rows.length >= 256) flush();
        if (raw + rows.length >= applied) stop.abort();
      }
    }
  } catch (e) { if (!stop.signal.aborted) throw e; }
  flush();
  await writing;
  const baseline = performance.now() - t;
  await w.db.exec("DROP TABLE bench_raw");
  return { applied, mirror, raw, baseline, persistent: w.db.persistent };
})().then(done, (e) => done({ error: String(e && e.stack || e) }));
"#;

const FIRST_RENDER: &str = r#"
const done = arguments[arguments.length - 1];
const seen = () => {
  const card = document.querySelector("article[data-testid^=decision-]");
  if (!card) return requestAnimationFrame(seen);
  const at = performance.now();
  const fcp = performance.getEntriesByName("first-contentful-paint")[0];
  done({ at, fcp: fcp ? fcp.startTime : null, total: Number(card.getAttribute("aria-setsize") || 0) });
};
seen();
"#;

pub(crate) async fn phone(quick: bool, out: &mut Vec<Figure>) -> Result<()> {
    let s = server(bench_config()).await?;
    let events: i64 = if quick { 2_000 } else { 10_000 };
    let decisions = if quick { 200 } else { 1_000 };
    fill(&s, events, decisions)
        .await
        .context("filling the log")?;
    let scopes = vec!["view".to_owned(), "steer".to_owned(), "approve".to_owned()];
    let (code, _) =
        waymark_server::steer::create_pairing(&*s.run.state.store, "bench", &scopes, 600_000)
            .await?;
    let profile = tempfile::tempdir()?;
    let (_driver, c) = chromium(profile.path())
        .await
        .context("starting Chromium")?;
    let url = s.run.url();
    c.goto(&format!("{url}/app/?bench#/pair?code={code}"))
        .await?;
    wait_css(&c, "[data-testid=pair-result]", 60).await?;
    // Let the first sync (everything) finish before measuring.
    wait_css(&c, "article[data-testid^=decision-]", 60).await?;

    let r: Value = c
        .execute_async(CATCH_UP, vec![])
        .await
        .map_err(|e| anyhow::anyhow!("the catch-up script: {e:?}"))?;
    if let Some(e) = r.get("error") {
        bail!("the catch-up in the page failed: {e}");
    }
    let applied = r["applied"].as_f64().unwrap_or(0.0);
    let rate = applied / (r["mirror"].as_f64().unwrap_or(f64::NAN) / 1000.0);
    let raw =
        r["raw"].as_f64().unwrap_or(0.0) / (r["baseline"].as_f64().unwrap_or(f64::NAN) / 1000.0);
    let storage = if r["persistent"] == true {
        "OPFS"
    } else {
        "memory"
    };
    out.push(Figure {
        bench: "phone".into(),
        measure: format!("catch-up: {applied} events into the browser mirror ({storage})"),
        value: rate,
        unit: "/s".into(),
        baseline: Some(raw),
        ratio: Some(rate / raw),
        target: "reported (the desktop mirror's: ratio ≥ 0.5)".into(),
        met: None,
    });

    // A cold load of the inbox from the mirror the page keeps: a reload, as a person reopening
    // the app would.
    c.goto(&format!("{url}/app/?bench#/inbox")).await?;
    c.refresh().await?;
    let r: Value = match c.execute_async(FIRST_RENDER, vec![]).await {
        Ok(r) => r,
        Err(e) => {
            let page: Value = c
                .execute("return document.body.innerText", vec![])
                .await
                .unwrap_or_default();
            bail!("the inbox did not render ({e}); the page said: {page}");
        }
    };
    let at = r["at"].as_f64().unwrap_or(f64::NAN);
    let fcp = r["fcp"].as_f64();
    out.push(Figure {
        bench: "phone".into(),
        measure: format!(
            "first render: inbox with {} pending decisions (since navigation)",
            r["total"]
        ),
        value: at,
        unit: "ms".into(),
        baseline: fcp,
        ratio: fcp.map(|f| at / f),
        target: "reported (baseline: the same load's first contentful paint)".into(),
        met: None,
    });
    // Where that time goes: the mirror's inbox query alone, warm.
    let q: Value = c
        .execute_async(
            r#"const done = arguments[arguments.length - 1];
               window.__waymarkBench.webCompanion().then(async (w) => {
                 const t = performance.now();
                 const n = (await w.mirror.inbox()).length;
                 done({ ms: performance.now() - t, n });
               }, (e) => done({ error: String(e) }));"#,
            vec![],
        )
        .await
        .map_err(|e| anyhow::anyhow!("the inbox query script: {e:?}"))?;
    out.push(Figure {
        bench: "phone".into(),
        measure: format!(
            "of which: the mirror's inbox query ({} decisions, warm)",
            q["n"]
        ),
        value: q["ms"].as_f64().unwrap_or(f64::NAN),
        unit: "ms".into(),
        baseline: None,
        ratio: None,
        target: "reported".into(),
        met: None,
    });
    c.close().await?;
    Ok(())
}
