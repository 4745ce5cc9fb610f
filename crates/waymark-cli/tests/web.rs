//! The web companion end to end, as a person with only a phone uses it: a real `waymark serve`
//! serving `/app/`, the demo agent as a real run, and Debian's Chromium driven over WebDriver
//! (chromedriver) at a phone's size with touch. Pair by the link `waymark admin pair` prints,
//! see the approval with its diff and receipts, approve and watch the agent finish; lose the
//! server, queue a pause, get it back and see the pause applied once; a push delivered to the
//! service worker (over the DevTools protocol, as a push service would) shows the decision as
//! a notification whose Approve lands as a signed command; a rule made on the Rules screen
//! answers the next matching approval and stops once revoked there. Screenshots go to
//! `$WAYMARK_E2E_OUT/web` (default: the system temp dir).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn wait_port(port: u16, what: &str) {
    let until = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < until, "{what} did not listen on {port}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn waymark() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_waymark"));
    c.env_remove("WAYMARK_DATA_DIR")
        .env_remove("WAYMARK_KEYSTORE")
        .env("WAYMARK_LOG", "error");
    c
}

fn serve(data: &Path, port: u16, log: &Path) -> Proc {
    let child = waymark()
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--data-dir",
        ])
        .arg(data)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("log file"))
        .spawn()
        .expect("start `waymark serve`");
    wait_port(port, "waymark serve");
    Proc(child)
}

fn admin(data: &Path, args: &[&str]) -> Value {
    let out = waymark()
        .arg("--json")
        .arg("admin")
        .args(args)
        .arg("--data-dir")
        .arg(data)
        .output()
        .expect("run `waymark admin`");
    assert!(
        out.status.success(),
        "waymark admin {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON from `waymark --json admin`")
}

/// Waits up to two minutes for a demo run to end; its exit status.
async fn finished(run: &mut Proc, what: &str) -> std::process::ExitStatus {
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(s) = run.0.try_wait().expect("demo status") {
            return s;
        }
        assert!(Instant::now() < until, "{what}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn demo(url: &str, token: &str, workdir: &Path, log: &Path) -> Proc {
    demo_with(url, token, workdir, log, &[])
}

fn demo_with(url: &str, token: &str, workdir: &Path, log: &Path, extra: &[&str]) -> Proc {
    let child = waymark()
        .args([
            "demo",
            "--server",
            url,
            "--token",
            token,
            "--lease-seconds",
            "60",
            "--workdir",
        ])
        .arg(workdir)
        .args(extra)
        .stdout(std::fs::File::create(log).expect("log file"))
        .stderr(Stdio::null())
        .spawn()
        .expect("start `waymark demo`");
    Proc(child)
}

fn out_dir() -> PathBuf {
    let dir = std::env::var_os("WAYMARK_E2E_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("waymark-e2e"))
        .join("web");
    std::fs::create_dir_all(&dir).expect("the output dir");
    dir
}

/// Whether a captured PNG is blank: a window or page that drew nothing is one colour, so
/// every row alike (any screen with content has rows that differ).
fn blank(png: &[u8]) -> bool {
    let mut r = png::Decoder::new(std::io::Cursor::new(png))
        .read_info()
        .expect("a PNG");
    let mut buf = vec![0; r.output_buffer_size().expect("its size")];
    let info = r.next_frame(&mut buf).expect("its pixels");
    let mut rows = buf[..info.buffer_size()].chunks(info.line_size);
    rows.next().is_none_or(|first| rows.all(|row| row == first))
}

async fn shot(c: &Client, name: &str) {
    let png = c.screenshot().await.expect("screenshot");
    assert!(png.starts_with(b"\x89PNG"), "the screenshot is a PNG");
    let path = out_dir().join(format!("{name}.png"));
    std::fs::write(&path, &png).expect("write screenshot");
    assert!(
        !blank(&png),
        "the screenshot {} is blank (all one colour)",
        path.display()
    );
    println!("screenshot {}", path.display());
}

async fn wait_css(c: &Client, css: &str, secs: u64) -> fantoccini::elements::Element {
    match c
        .wait()
        .at_most(Duration::from_secs(secs))
        .for_element(Locator::Css(css))
        .await
    {
        Ok(e) => e,
        Err(e) => {
            shot(c, "failure").await;
            let logs = c
                .execute("return document.body.innerText", vec![])
                .await
                .unwrap_or_default();
            panic!("`{css}` did not appear within {secs} s: {e}\npage: {logs}")
        }
    }
}

async fn wait_until<F, Fut>(c: &Client, what: &str, secs: u64, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let until = Instant::now() + Duration::from_secs(secs);
    loop {
        if check().await {
            return;
        }
        if Instant::now() > until {
            shot(c, "failure").await;
            panic!("{what}: not within {secs} s");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn click(c: &Client, css: &str) {
    wait_css(c, css, 30)
        .await
        .click()
        .await
        .unwrap_or_else(|e| panic!("click `{css}`: {e}"));
}

async fn attr(c: &Client, css: &str, name: &str) -> Option<String> {
    match c.find(Locator::Css(css)).await {
        Ok(e) => e.attr(name).await.ok().flatten(),
        Err(_) => None,
    }
}

async fn text(c: &Client, css: &str) -> String {
    match c.find(Locator::Css(css)).await {
        Ok(e) => e.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

fn chromedriver(port: u16, log: &Path) -> Proc {
    let child =
        Command::new(std::env::var("CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".into()))
            .arg(format!("--port={port}"))
            .stdout(std::fs::File::create(log).expect("log file"))
            .stderr(Stdio::null())
            .spawn()
            .expect(
                "start chromedriver (Debian's chromium-driver; scripts/setup-debian installs it)",
            );
    wait_port(port, "chromedriver");
    Proc(child)
}

/// Headless Chromium as a phone: 390 × 844 CSS pixels at 3×, touch, a phone's user agent.
async fn phone_browser(driver_port: u16, profile: &Path) -> Client {
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
            "mobileEmulation": {
                "deviceMetrics": {"width": 390, "height": 844, "pixelRatio": 3.0, "touch": true},
                "userAgent": "Mozilla/5.0 (Linux; Android 15; Pixel 9) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/156.0 Mobile Safari/537.36"
            }
        }),
    );
    ClientBuilder::native()
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{driver_port}"))
        .await
        .expect("a WebDriver session with Chromium")
}

/// A DevTools protocol connection to the phone's browser, for what WebDriver cannot do:
/// grant the notification permission a person would grant, and deliver a push message to the
/// service worker as the push service does (`ServiceWorker.deliverPushMessage`).
struct Cdp {
    ws: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
    next: u64,
    events: Vec<Value>,
}

impl Cdp {
    /// Connects to the browser chromedriver started with `profile` as its user data dir
    /// (Chromium writes its DevTools port and path to `DevToolsActivePort` there).
    async fn connect(profile: &Path) -> Cdp {
        let file = profile.join("DevToolsActivePort");
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("{} (Chromium's DevTools address): {e}", file.display()));
        let mut lines = text.lines();
        let (port, path) = (lines.next().unwrap_or(""), lines.next().unwrap_or(""));
        let (ws, _) = tokio_tungstenite::connect_async(format!("ws://127.0.0.1:{port}{path}"))
            .await
            .expect("a DevTools connection to the browser");
        Cdp {
            ws,
            next: 0,
            events: Vec::new(),
        }
    }

    /// The next message from the browser, within 30 s.
    async fn read(&mut self) -> Value {
        loop {
            let msg = tokio::time::timeout(Duration::from_secs(30), self.ws.next())
                .await
                .expect("the browser answered within 30 s")
                .expect("the DevTools connection stayed open")
                .expect("a DevTools message");
            if let Message::Text(t) = msg {
                return serde_json::from_str(&t).expect("DevTools sends JSON");
            }
        }
    }

    /// Calls `method` (in the target attached as `session`, or on the browser); keeps the
    /// events that arrive meanwhile.
    async fn call(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        self.next += 1;
        let id = self.next;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        self.ws
            .send(Message::Text(msg.to_string().into()))
            .await
            .expect("send to DevTools");
        loop {
            let v = self.read().await;
            if v["id"] == json!(id) {
                assert!(v.get("error").is_none(), "{method} failed: {v}");
                return v["result"].clone();
            }
            self.events.push(v);
        }
    }

    /// The first event named `method` for which `pick` gives something.
    async fn event<T>(&mut self, method: &str, mut pick: impl FnMut(&Value) -> Option<T>) -> T {
        let until = Instant::now() + Duration::from_secs(30);
        let mut seen = 0;
        loop {
            while seen < self.events.len() {
                let e = &self.events[seen];
                seen += 1;
                if e["method"] == method
                    && let Some(t) = pick(&e["params"])
                {
                    return t;
                }
            }
            assert!(Instant::now() < until, "no {method} event in 30 s");
            let v = self.read().await;
            self.events.push(v);
        }
    }
}

/// Delivers a content-free push, as the server sends one, to the page's service worker and
/// returns the notifications the worker shows afterwards (as the page reads them back).
async fn push_to_service_worker(
    c: &Client,
    profile: &Path,
    origin: &str,
    payload: Value,
) -> Vec<Value> {
    push_until(c, profile, origin, payload, |shown| !shown.is_empty()).await
}

/// Delivers a push to the page's service worker (again every 10 s, as a push service does
/// with what was not taken) until the notifications it shows satisfy `done`; returns them.
async fn push_until(
    c: &Client,
    profile: &Path,
    origin: &str,
    payload: Value,
    done: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let mut cdp = Cdp::connect(profile).await;
    cdp.call(
        None,
        "Browser.grantPermissions",
        json!({"origin": origin, "permissions": ["notifications"]}),
    )
    .await;
    let targets = cdp.call(None, "Target.getTargets", json!({})).await;
    let page = targets["targetInfos"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["type"] == "page"))
        .and_then(|t| t["targetId"].as_str())
        .expect("the phone's page among the browser's targets")
        .to_owned();
    let attached = cdp
        .call(
            None,
            "Target.attachToTarget",
            json!({"targetId": page, "flatten": true}),
        )
        .await;
    let session = attached["sessionId"]
        .as_str()
        .expect("a session")
        .to_owned();
    cdp.call(Some(&session), "ServiceWorker.enable", json!({}))
        .await;
    let scope = format!("{origin}/app/");
    let registration = cdp
        .event("ServiceWorker.workerRegistrationUpdated", |p| {
            p["registrations"].as_array()?.iter().find_map(|r| {
                (r["scopeURL"] == json!(scope) && r["isDeleted"] == json!(false))
                    .then(|| r["registrationId"].as_str().map(str::to_owned))
                    .flatten()
            })
        })
        .await;
    // A push service delivers again what was not taken; so does this one, every 10 s: on a
    // loaded machine Chromium was seen to drop a push handed to a worker it was (re)starting.
    let until = Instant::now() + Duration::from_secs(40);
    let mut next_delivery = Instant::now();
    loop {
        if Instant::now() >= next_delivery {
            cdp.call(
                Some(&session),
                "ServiceWorker.deliverPushMessage",
                json!({"origin": origin, "registrationId": registration, "data": payload.to_string()}),
            )
            .await;
            next_delivery = Instant::now() + Duration::from_secs(10);
        }
        let shown = notifications(c).await;
        if done(&shown) {
            return shown;
        }
        if Instant::now() > until {
            shot(c, "failure").await;
            panic!(
                "the service worker did not show what was expected within 40 s of the push (delivered every 10 s): {shown:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The notifications the page's service worker shows now.
async fn notifications(c: &Client) -> Vec<Value> {
    let v = c
        .execute_async(
            r#"const done = arguments[arguments.length - 1];
               navigator.serviceWorker.ready
                 .then((r) => r.getNotifications())
                 .then((ns) => done(ns.map((n) => ({title: n.title, body: n.body, tag: n.tag, data: n.data, actions: n.actions}))))
                 .catch((e) => done([{error: String(e)}]));"#,
            vec![],
        )
        .await
        .expect("read the notifications back");
    let list = v.as_array().cloned().unwrap_or_default();
    assert!(
        list.iter().all(|n| n.get("error").is_none()),
        "reading notifications failed: {v}"
    );
    list
}

fn snapshot(url: &str, token: &str) -> Value {
    let out = Command::new("curl")
        .args(["-fsS", "-H", &format!("authorization: Bearer {token}")])
        .arg(format!("{url}/v1/snapshot"))
        .output()
        .expect("curl");
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

fn decision_status(url: &str, admin_token: &str, task: &str, id: &str) -> String {
    decision(url, admin_token, task, id)["status"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Decision `id` as the server has it.
fn decision(url: &str, admin_token: &str, task: &str, id: &str) -> Value {
    let out = Command::new("curl")
        .args([
            "-fsS",
            "-H",
            &format!("authorization: Bearer {admin_token}"),
        ])
        .arg(format!("{url}/v1/tasks/{task}/decisions/{id}"))
        .output()
        .expect("curl");
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_phone_browser_pairs_by_link_approves_and_steers_offline() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let data = tmp.path().join("server");
    let out = out_dir();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");

    let server = serve(&data, port, &out.join("serve.log"));
    admin(&data, &["user", "add", "alice"]);
    let token = admin(
        &data,
        &["worker-token", "--name", "demo", "--user", "alice"],
    )["token"]
        .as_str()
        .expect("a worker token")
        .to_owned();
    let admin_token = std::fs::read_to_string(data.join("admin.token"))
        .expect("the admin token")
        .trim()
        .to_owned();
    let pairing = admin(&data, &["pair", "--user", "alice", "--server", &url]);
    let web_link = pairing["web_link"].as_str().expect("a web link").to_owned();
    // The budget question waits for the phone (not 15 s, then the default).
    let mut first = demo_with(
        &url,
        &token,
        &tmp.path().join("demo1"),
        &out.join("demo1.log"),
        &["--budget-decision-seconds", "600"],
    );
    // The phone pairs into a server that already has work: its first sync is a snapshot.
    let until = Instant::now() + Duration::from_secs(120);
    while !snapshot(&url, &token)["tasks"]
        .as_array()
        .is_some_and(|t| t.iter().any(|t| t["pending_decisions"].as_i64() > Some(0)))
    {
        assert!(Instant::now() < until, "the demo never asked anything");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let driver_port = free_port();
    let _driver = chromedriver(driver_port, &out.join("chromedriver.log"));
    let c = phone_browser(driver_port, &tmp.path().join("chromium")).await;

    // The QR code's target: the page pairs on arrival.
    c.goto(&web_link).await.expect("open the pairing link");
    let paired = wait_css(&c, "[data-testid=pair-result]", 60)
        .await
        .text()
        .await
        .unwrap_or_default();
    assert!(paired.contains(&url), "paired with the server: {paired}");
    shot(&c, "paired").await;

    // The budget question first: the phone chooses the full suite, not the default, each
    // option saying what it gives up.
    let full = wait_css(&c, "[data-testid=option-full_suite]", 120).await;
    let budget = c
        .find(Locator::XPath(
            "//button[@data-testid='option-full_suite']/ancestor::article",
        ))
        .await
        .expect("the budget question's card");
    let budget_text = budget.text().await.unwrap_or_default();
    assert!(
        budget_text.contains("Gives up") || budget_text.contains("gives up"),
        "each option says what it gives up: {budget_text}"
    );
    let budget_id = budget
        .attr("data-testid")
        .await
        .ok()
        .flatten()
        .expect("the card's id")
        .trim_start_matches("decision-")
        .to_owned();
    shot(&c, "inbox-budget").await;
    full.click().await.expect("choose the full suite");
    let chose = wait_css(&c, "[data-testid=decision-result]", 30)
        .await
        .text()
        .await
        .unwrap_or_default();
    assert!(
        chose.contains("delivered") || chose.contains("acknowledged"),
        "the choice delivered: {chose}"
    );

    // The approval arrives in the inbox, with its diff and receipts.
    wait_css(&c, "[data-testid=approve]", 120).await;
    let approval = APPROVAL_CARD;
    let (card, decision_id) = approval_card(&c).await;
    let card_text = card.text().await.unwrap_or_default();
    assert!(
        card_text.contains("staging"),
        "the card names the target: {card_text}"
    );
    // Its thread, through the card's link; then back.
    card.find(Locator::Css(".card-head button.link"))
        .await
        .expect("the card links its thread")
        .click()
        .await
        .expect("open the thread");
    wait_css(&c, "[data-testid=thread-state]", 30).await;
    shot(&c, "thread-waiting").await;
    let hash = c
        .current_url()
        .await
        .expect("the URL")
        .fragment()
        .unwrap_or_default()
        .to_owned();
    let task = hash.trim_start_matches("/threads/").to_owned();
    assert!(
        task.starts_with("task_"),
        "the thread's route names its task: {hash}"
    );
    click(&c, "[data-testid=nav-inbox]").await;
    wait_css(&c, "[data-testid=approve]", 30).await;
    c.find(Locator::XPath(&format!(
        "{approval}//*[@data-testid='show-diff']"
    )))
    .await
    .expect("the approval shows its diff")
    .click()
    .await
    .expect("open the diff");
    let diff = wait_css(&c, "[data-testid=diff-viewer]", 30)
        .await
        .text()
        .await
        .unwrap_or_default();
    assert!(
        diff.contains("file(s)"),
        "the diff viewer shows the patch: {diff}"
    );
    let receipts = text(&c, "[data-testid=receipts]").await;
    assert!(
        receipts.contains("FAILED") && receipts.contains("passed"),
        "receipts before and after the fix: {receipts}"
    );
    shot(&c, "inbox-approval").await;

    // Approve: a command signed in the browser; the agent continues and finishes.
    c.find(Locator::XPath(&format!(
        "{approval}//button[@data-testid='approve']"
    )))
    .await
    .expect("the approve button")
    .click()
    .await
    .expect("approve");
    if c.find(Locator::Css("[data-testid=confirm-approve]"))
        .await
        .is_ok()
    {
        click(&c, "[data-testid=confirm-approve]").await;
    }
    let sent = wait_css(&c, "[data-testid=decision-result]", 30)
        .await
        .text()
        .await
        .unwrap_or_default();
    assert!(
        sent.contains("delivered") || sent.contains("acknowledged"),
        "approval delivered: {sent}"
    );
    let status = finished(&mut first, "the agent did not finish after the approval").await;
    assert!(
        status.success(),
        "the demo agent finished cleanly: {status}"
    );
    assert_eq!(
        decision_status(&url, &admin_token, &task, &decision_id),
        "resolved",
        "the server recorded the answer"
    );
    let chosen = decision(&url, &admin_token, &task, &budget_id);
    assert_eq!(
        chosen["outcome"]["option"], "full_suite",
        "the phone's choice, not the default: {chosen}"
    );
    click(&c, "[data-testid=nav-threads]").await;
    click(&c, "button[data-testid^=thread-]").await;
    wait_until(&c, "the thread shows completed", 60, || async {
        attr(&c, "[data-testid=thread-state]", "data-state")
            .await
            .as_deref()
            == Some("completed")
    })
    .await;
    shot(&c, "thread-completed").await;

    // A second run waits; the server goes away; a pause is signed and queued offline.
    let _second = demo(
        &url,
        &token,
        &tmp.path().join("demo2"),
        &out.join("demo2.log"),
    );
    click(&c, "[data-testid=nav-inbox]").await;
    let card = wait_css(&c, "article[data-testid^=decision-]", 120).await;
    card.find(Locator::Css(".card-head button.link"))
        .await
        .expect("the card links its thread")
        .click()
        .await
        .expect("open the thread");
    wait_css(&c, "[data-testid=steer-pause]", 30).await;
    drop(server);
    wait_css(&c, "[data-testid=offline-banner]", 90).await;
    click(&c, "[data-testid=steer-pause]").await;
    let queued = wait_css(&c, "[data-testid=steer-result]", 30)
        .await
        .text()
        .await
        .unwrap_or_default();
    assert!(
        queued.contains("Queued"),
        "the pause is queued while offline: {queued}"
    );
    shot(&c, "offline-pause-queued").await;

    // Back on the same address: delivered once, applied.
    let second_task = paused_task(&c).await;
    let _server = serve(&data, port, &out.join("serve2.log"));
    click(&c, "[data-testid=nav-outbox]").await;
    wait_until(&c, "the queued pause delivered", 120, || async {
        matches!(
            attr(&c, "[data-testid=outbox-pause]", "data-status")
                .await
                .as_deref(),
            Some("delivered" | "acknowledged")
        )
    })
    .await;
    shot(&c, "pause-delivered").await;

    // The revision the person read is the one signed: a replan is confirmed at revision 1; a
    // second device (the terminal client) replans meanwhile and the page's sync moves the
    // screen to revision 2; the confirmation still sends revision 1 and the conflict is shown.
    c.goto(&format!("{url}/app/#/threads/{second_task}"))
        .await
        .expect("the paused thread");
    wait_until(&c, "the thread shows paused", 60, || async {
        attr(&c, "[data-testid=thread-state]", "data-state")
            .await
            .as_deref()
            == Some("paused")
    })
    .await;
    click(&c, "[data-testid=steer-replan]").await;
    wait_css(&c, ".replan textarea", 10)
        .await
        .send_keys("write the report only")
        .await
        .expect("type instructions");
    click(&c, ".replan button[type=submit]").await;
    let dialog = text(&c, ".steer .confirm").await;
    assert!(
        dialog.contains("revision 1"),
        "the confirmation names the revision read: {dialog}"
    );
    let laptop = tmp.path().join("laptop");
    let link = admin(&data, &["pair", "--user", "alice", "--server", &url])["link"]
        .as_str()
        .expect("a pairing link")
        .to_owned();
    terminal(&laptop, &["pair", &link, "--name", "laptop"]);
    terminal(&laptop, &["sync"]);
    let task2 = paused_task(&c).await;
    let moved = terminal(
        &laptop,
        &[
            "replan",
            &task2,
            "--instructions",
            "stop after the fix",
            "--expected-revision",
            "1",
        ],
    );
    assert_eq!(moved["status"], "delivered", "{moved}");
    wait_css(&c, "[data-testid=steer-moved]", 60).await;
    shot(&c, "replan-moved-under-confirmation").await;
    click(&c, "[data-testid=steer-confirm]").await;
    wait_until(&c, "the conflict shown", 30, || async {
        let r = text(&c, "[data-testid=steer-result]").await;
        r.contains("conflict") && r.contains("revision 2")
    })
    .await;
    shot(&c, "replan-conflict").await;
    terminal(&laptop, &["sync"]);
    let shown = terminal(&laptop, &["show", &task2]);
    assert_eq!(
        shown["task"]["plan_revision"], 2,
        "only the laptop's replan applied: {shown}"
    );

    // A link that looks like a notification's Approve but comes from anywhere else (no nonce
    // the service worker handed over) answers nothing.
    let mut third = demo(
        &url,
        &token,
        &tmp.path().join("demo3"),
        &out.join("demo3.log"),
    );
    click(&c, "[data-testid=nav-inbox]").await;
    wait_css(&c, "[data-testid=approve]", 120).await;
    let (card, id) = approval_card(&c).await;
    let digest = card
        .find(Locator::Css("[data-testid=intent-digest]"))
        .await
        .expect("the digest on the card")
        .attr("title")
        .await
        .ok()
        .flatten()
        .expect("the full digest");
    card.find(Locator::Css(".card-head button.link"))
        .await
        .expect("the card links its thread")
        .click()
        .await
        .expect("open the thread");
    let third_task = paused_or_any_task(&c).await;
    c.goto(&format!("{url}/app/#/inbox/{id}?action=forged"))
        .await
        .expect("a forged action link");
    wait_css(&c, "[data-testid=decision-error]", 30).await;
    assert_eq!(
        decision_status(&url, &admin_token, &third_task, &id),
        "pending",
        "a forged link answered nothing"
    );

    // The push the server sends for it carries no content: the service worker fetches the
    // decision over this device's session and shows what is asked, the intent, the revision
    // and what happens if nobody answers, with Approve and Deny for a decision not marked
    // risky.
    let card_text = card_text_of(&c, &id).await;
    let shown = push_to_service_worker(
        &c,
        &tmp.path().join("chromium"),
        &url,
        json!({"v": 1, "type": "decision.requested", "task_id": third_task, "cursor": 0}),
    )
    .await;
    assert_eq!(shown.len(), 1, "one notification: {shown:?}");
    let n = &shown[0];
    let title = n["title"].as_str().unwrap_or_default();
    assert!(
        !title.is_empty() && card_text.contains(title),
        "the notification asks what the card asks: {n}\ncard: {card_text}"
    );
    let body = n["body"].as_str().unwrap_or_default();
    assert!(
        body.contains("Plan revision 1")
            && (body.contains("if nobody answers") || body.contains("expires at"))
            && body.contains("Diff: fix.diff")
            && body.contains("Tests: "),
        "the notification says the diff, the tests, the revision and what happens then: {body}"
    );
    assert_eq!(n["tag"], json!(id), "{n}");
    assert_eq!(n["data"]["decision_id"], json!(id), "{n}");
    assert_eq!(n["data"]["intent_digest"], json!(digest), "{n}");
    let actions: Vec<_> = n["actions"]
        .as_array()
        .map(|a| a.iter().map(|a| a["action"].clone()).collect())
        .unwrap_or_default();
    assert_eq!(actions, [json!("approve"), json!("deny")], "{n}");

    // Its Approve, as the service worker hands it to the page: under a one-time nonce in
    // IndexedDB, with the revision and digest the notification carries (DevTools cannot click
    // a notification's button; the worker's own hand-over is this write and a navigation).
    c.execute_async(
        r#"const [id, digest, revision, done] = arguments;
           const open = indexedDB.open("keyval-store");
           open.onupgradeneeded = () => open.result.createObjectStore("keyval");
           open.onsuccess = () => {
             const tx = open.result.transaction("keyval", "readwrite");
             tx.objectStore("keyval").put({nonce: "n-1", op: "approve", decision_id: id, plan_revision: revision, intent_digest: digest, at: Date.now()}, "waymark-action");
             tx.oncomplete = () => done(true);
           };"#,
        vec![
            n["data"]["decision_id"].clone(),
            n["data"]["intent_digest"].clone(),
            n["data"]["plan_revision"].clone(),
        ],
    )
    .await
    .expect("hand over the action as the service worker does");
    c.goto(&format!("{url}/app/#/inbox/{id}?action=n-1"))
        .await
        .expect("the notification's target");
    let sent = wait_css(&c, "[data-testid=decision-result]", 30)
        .await
        .text()
        .await
        .unwrap_or_default();
    assert!(
        sent.contains("delivered") || sent.contains("acknowledged"),
        "the notification's approval delivered: {sent}"
    );
    shot(&c, "approved-from-notification").await;
    assert_eq!(
        decision_status(&url, &admin_token, &third_task, &id),
        "resolved"
    );
    // Answered: the server's `decision.closed` push (to each device the decision was pushed
    // to) makes the worker replace the notification, same tag, with a quiet one saying how it
    // closed — no buttons left to answer a closed decision with.
    let withdrawn = push_until(
        &c,
        &tmp.path().join("chromium"),
        &url,
        json!({"v": 1, "type": "decision.closed", "task_id": third_task, "cursor": 0, "decision_id": id}),
        |shown| shown.iter().any(|n| n["data"]["closed"] == json!(true)),
    )
    .await;
    let mine: Vec<&Value> = withdrawn.iter().filter(|n| n["tag"] == json!(id)).collect();
    assert_eq!(
        mine.len(),
        1,
        "one notification for the decision: {withdrawn:?}"
    );
    let n = mine[0];
    let title = n["title"].as_str().unwrap_or_default();
    assert!(
        title.starts_with("Answered on ") && title.to_lowercase().contains("approve"),
        "it says where and how it was answered: {n}"
    );
    assert!(
        n["body"]
            .as_str()
            .unwrap_or_default()
            .contains("Nothing to do here"),
        "{n}"
    );
    assert_eq!(n["actions"], json!([]), "nothing left to answer: {n}");
    finished(
        &mut third,
        "the third run did not finish after the approval",
    )
    .await;

    // Deny from the phone: the run delivers its patch and report without deploying.
    let mut fourth = demo(
        &url,
        &token,
        &tmp.path().join("demo4"),
        &out.join("demo4.log"),
    );
    click(&c, "[data-testid=nav-inbox]").await;
    wait_css(&c, "[data-testid=deny]", 120).await;
    let (card, denied_id) = approval_card(&c).await;
    card.find(Locator::Css("[data-testid=deny]"))
        .await
        .expect("the deny button")
        .click()
        .await
        .expect("deny");
    let sent = wait_css(&c, "[data-testid=decision-result]", 30)
        .await
        .text()
        .await
        .unwrap_or_default();
    assert!(
        sent.contains("delivered") || sent.contains("acknowledged"),
        "the denial delivered: {sent}"
    );
    let status = finished(
        &mut fourth,
        "the fourth run did not finish after the denial",
    )
    .await;
    assert!(status.success(), "the denied run ended cleanly: {status}");
    let log = std::fs::read_to_string(out.join("demo4.log")).unwrap_or_default();
    let fourth_task = log
        .split_whitespace()
        .find(|w| w.starts_with("task_"))
        .expect("the fourth run names its task")
        .trim_end_matches(|ch: char| !ch.is_ascii_alphanumeric())
        .to_owned();
    let denied = decision(&url, &admin_token, &fourth_task, &denied_id);
    assert_eq!(
        denied["outcome"]["option"], "deny",
        "the phone's denial: {denied}"
    );
    shot(&c, "denied").await;

    // Two runs waiting at once: both selected and approved together — two signed commands,
    // each bound to what its card showed — and both runs go on to finish.
    let mut pair: Vec<Proc> = ["demo5", "demo6"]
        .iter()
        .map(|n| {
            demo(
                &url,
                &token,
                &tmp.path().join(n),
                &out.join(format!("{n}.log")),
            )
        })
        .collect();
    click(&c, "[data-testid=nav-inbox]").await;
    wait_until(&c, "two approvals waiting", 180, || async {
        c.find_all(Locator::Css("[data-testid=approve]"))
            .await
            .map(|b| b.len())
            .unwrap_or(0)
            >= 2
    })
    .await;
    let boxes = c
        .find_all(Locator::XPath(&format!(
            "{APPROVAL_CARD}//input[@data-testid='select']"
        )))
        .await
        .expect("the approvals' select boxes");
    assert_eq!(boxes.len(), 2, "each approval can be selected");
    for b in &boxes {
        b.click().await.expect("select an approval");
    }
    let bar = text(&c, "[data-testid=batch-bar]").await;
    assert!(
        bar.contains("2 selected"),
        "the batch bar counts them: {bar}"
    );
    shot(&c, "batch-selected").await;
    click(&c, "[data-testid=batch-approve]").await;
    wait_until(&c, "two answers sent", 30, || async {
        let sent = c
            .find_all(Locator::Css("[data-testid=decision-result]"))
            .await
            .unwrap_or_default();
        let mut n = 0;
        for s in sent {
            let t = s.text().await.unwrap_or_default();
            if t.contains("approve") && (t.contains("delivered") || t.contains("acknowledged")) {
                n += 1;
            }
        }
        n >= 2
    })
    .await;
    shot(&c, "batch-approved").await;
    for p in &mut pair {
        let status = finished(p, "a run approved together did not finish").await;
        assert!(
            status.success(),
            "a run approved together ended cleanly: {status}"
        );
    }

    // Settings offer this device's notifications (Web Push; pushes carry no content).
    click(&c, "[data-testid=nav-settings]").await;
    let push = wait_css(&c, "[data-testid=push-settings]", 30)
        .await
        .text()
        .await
        .unwrap_or_default();
    assert!(
        push.contains("carry no content"),
        "the push settings explain themselves: {push}"
    );
    shot(&c, "settings").await;

    // Another pairing link opened on the paired phone asks before replacing its pairing, and
    // "keep" leaves everything as it was: the code unused (a terminal pairs with it) and the
    // phone still reading with its own key.
    let again = admin(&data, &["pair", "--user", "alice", "--server", &url]);
    let again_web = again["web_link"].as_str().expect("a web link").to_owned();
    c.goto(&again_web)
        .await
        .expect("open the second pairing link");
    let ask = wait_css(&c, "[data-testid=repair-ask]", 30)
        .await
        .text()
        .await
        .unwrap_or_default();
    assert!(ask.contains("Pair it again"), "the phone asks first: {ask}");
    shot(&c, "pair-again-asked").await;
    click(&c, "[data-testid=repair-no]").await;
    wait_css(&c, "[data-testid=nav-inbox]", 30).await;
    let tablet = tmp.path().join("tablet");
    let link = again["link"].as_str().expect("a pairing link");
    terminal(&tablet, &["pair", link, "--name", "tablet"]);
    click(&c, "[data-testid=nav-settings]").await;
    wait_css(&c, "[data-testid=push-settings]", 30).await;
    c.close().await.expect("close the browser");
}

/// A person with only a phone starts a run on their laptop: the Machines screen shows the
/// machine its runner registered (over the runner's own HTTP calls, with its machine-scoped
/// token), New run signs `start_run` in the browser with what its summary shows, and the
/// laptop's runner is handed exactly that as a `start` work item — the task already in the
/// phone's threads, saying where it runs.
#[tokio::test(flavor = "multi_thread")]
async fn a_phone_browser_starts_a_run_on_a_machine() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let data = tmp.path().join("server");
    let out = out_dir();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let _server = serve(&data, port, &out.join("serve-run.log"));
    admin(&data, &["user", "add", "alice"]);
    let runner = admin(
        &data,
        &["runner-token", "--machine", "laptop", "--user", "alice"],
    )["token"]
        .as_str()
        .expect("a runner token")
        .to_owned();
    let src = tmp.path().join("src");
    std::fs::create_dir_all(src.join("app")).expect("a source tree");
    let src = src.to_str().expect("a UTF-8 path").to_owned();
    // What `waymark runner` reports when it starts: its runtimes and the directories allowed.
    let registered = curl_json(
        "PUT",
        &format!("{url}/v1/runner/machine"),
        &runner,
        Some(&json!({
            "runtimes": [{"runtime": "claude-code", "version": "2.1.328 (Claude Code)"}],
            "directories": [src],
            "runner_version": "0.1.0",
        })),
    );
    assert_eq!(registered["name"], "laptop", "registered: {registered}");
    // Its first work request: the heartbeat that makes it online.
    let idle = curl_json(
        "GET",
        &format!("{url}/v1/runner/work?wait=0"),
        &runner,
        None,
    );
    assert_eq!(idle["work"], json!([]), "no work yet: {idle}");

    let pairing = admin(&data, &["pair", "--user", "alice", "--server", &url]);
    let web_link = pairing["web_link"].as_str().expect("a web link").to_owned();
    let driver_port = free_port();
    let _driver = chromedriver(driver_port, &out.join("chromedriver-run.log"));
    let c = phone_browser(driver_port, &tmp.path().join("chromium")).await;
    c.goto(&web_link).await.expect("open the pairing link");
    wait_css(&c, "[data-testid=pair-result]", 60).await;

    click(&c, "[data-testid=nav-machines]").await;
    let card = wait_css(&c, "[data-testid=machine][data-machine=laptop]", 60)
        .await
        .text()
        .await
        .unwrap_or_default();
    assert!(
        card.contains("Online") && card.contains("Claude Code") && card.contains(&src),
        "the laptop as its runner reported it: {card}"
    );
    shot(&c, "machines").await;
    click(&c, "[data-testid=new-run-here]").await;
    wait_until(
        &c,
        "the form knows the laptop's directories",
        30,
        || async {
            match c.find(Locator::Css("[data-testid=run-directory]")).await {
                Ok(e) => e.prop("value").await.ok().flatten().as_deref() == Some(src.as_str()),
                Err(_) => false,
            }
        },
    )
    .await;
    let prompt = "make the flaky checkout test pass";
    for (field, value) in [
        ("run-below", "app"),
        ("run-prompt", prompt),
        ("run-gate", "Bash|Write"),
    ] {
        c.find(Locator::Css(&format!("[data-testid={field}]")))
            .await
            .expect("a field of the form")
            .send_keys(value)
            .await
            .expect("type into the form");
    }
    let summary = text(&c, "[data-testid=run-summary]").await;
    let dir = format!("{src}/app");
    assert!(
        summary.contains(&dir) && summary.contains("laptop") && summary.contains("Bash|Write"),
        "the summary shows what is signed: {summary}"
    );
    shot(&c, "new-run").await;
    click(&c, "[data-testid=run-start]").await;
    let started = wait_css(&c, "[data-testid=run-started]", 30).await;
    assert_eq!(
        started.attr("data-status").await.ok().flatten().as_deref(),
        Some("delivered"),
        "the signed start_run was applied: {}",
        started.text().await.unwrap_or_default()
    );
    shot(&c, "run-started").await;

    // The laptop's runner is handed exactly what the phone signed.
    let work = curl_json(
        "GET",
        &format!("{url}/v1/runner/work?wait=0"),
        &runner,
        None,
    );
    let items = work["work"].as_array().cloned().unwrap_or_default();
    assert_eq!(items.len(), 1, "one start for the laptop: {work}");
    let item = &items[0];
    assert_eq!(item["kind"], "start", "{item}");
    assert_eq!(item["run"]["runtime"], "claude-code", "{item}");
    assert_eq!(item["run"]["directory"], dir, "{item}");
    assert_eq!(item["run"]["prompt"], prompt, "{item}");
    assert_eq!(item["run"]["gate"], "Bash|Write", "{item}");
    let task = item["task_id"].as_str().expect("the task").to_owned();

    // The run's thread, from the phone: where it runs.
    click(&c, "[data-testid=open-run]").await;
    wait_until(&c, "the new run's thread", 60, || async {
        c.find(Locator::Css("[data-testid=thread-state]"))
            .await
            .is_ok()
    })
    .await;
    let on = wait_css(&c, "[data-testid=machine-on]", 30)
        .await
        .text()
        .await
        .unwrap_or_default();
    assert_eq!(on, "Runs on laptop", "the thread says where it runs");
    assert_eq!(
        paused_task(&c).await,
        task,
        "the thread is the task handed to the runner"
    );
    shot(&c, "run-thread").await;
    c.close().await.expect("close the browser");
}

/// A rule made on the phone's Rules screen answers the agent's next matching approval with
/// nobody asked, never a command that only starts like it, and stops once revoked there.
#[tokio::test(flavor = "multi_thread")]
async fn a_rule_made_on_the_phone_answers_the_next_matching_approval() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let data = tmp.path().join("server");
    let out = out_dir();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let _server = serve(&data, port, &out.join("serve-rules.log"));
    admin(&data, &["user", "add", "alice"]);
    let agent = admin(&data, &["worker-token", "--user", "alice", "--name", "w"])["token"]
        .as_str()
        .expect("a worker token")
        .to_owned();
    let pairing = admin(&data, &["pair", "--user", "alice", "--server", &url]);
    let web_link = pairing["web_link"].as_str().expect("a web link").to_owned();
    let driver_port = free_port();
    let _driver = chromedriver(driver_port, &out.join("chromedriver-rules.log"));
    let c = phone_browser(driver_port, &tmp.path().join("chromium")).await;
    c.goto(&web_link).await.expect("open the pairing link");
    wait_css(&c, "[data-testid=pair-result]", 60).await;

    click(&c, "[data-testid=nav-rules]").await;
    wait_css(&c, "[data-testid=rules-empty]", 30).await;
    click(&c, "[data-testid=rule-new]").await;
    for (field, value) in [
        ("rule-tool", "Bash"),
        ("rule-pattern", "npm test*"),
        ("rule-directory", "/home/alice/src/shop"),
        ("rule-note", "tests are fine"),
    ] {
        c.find(Locator::Css(&format!("[data-testid={field}]")))
            .await
            .expect("a field of the form")
            .send_keys(value)
            .await
            .expect("type into the form");
    }
    shot(&c, "rule-form").await;
    click(&c, "[data-testid=rule-sign]").await;
    let made = wait_css(&c, "[data-testid=rule-made]", 30)
        .await
        .text()
        .await
        .unwrap_or_default();
    assert!(
        made.contains("allow Bash `npm test*` in /home/alice/src/shop"),
        "the server's words for the rule: {made}"
    );
    let id = wait_css(&c, "[data-testid=rule]", 30)
        .await
        .attr("data-rule")
        .await
        .ok()
        .flatten()
        .expect("the rule listed");

    let asks = |command: &str| {
        let (url, agent) = (url.clone(), agent.clone());
        let task = curl_json(
            "POST",
            &format!("{url}/v1/tasks"),
            &agent,
            Some(&json!({"title": "shop"})),
        );
        curl_json(
            "POST",
            &format!(
                "{url}/v1/tasks/{}/approvals",
                task["id"].as_str().expect("a task")
            ),
            &agent,
            Some(
                &json!({"intent": {"tool": "Bash", "input": {"command": command}},
                         "summary": format!("run {command}?"), "cwd": "/home/alice/src/shop"}),
            ),
        )
    };
    let d = asks("npm test --watch=false");
    assert_eq!(d["status"], "resolved", "answered by the rule: {d}");
    assert_eq!(d["outcome"]["by"], format!("rule:{id}"), "{d}");
    let d = asks("npm test; rm -rf ~");
    assert_eq!(d["status"], "pending", "a wildcard never crosses `;`: {d}");

    // Alice's laptop's runner reports Claude Code's own rule there, which refuses `npm test`
    // before anyone is asked: listed below hers, and the conflict named on both cards.
    let runner = admin(
        &data,
        &["runner-token", "--machine", "laptop", "--user", "alice"],
    )["token"]
        .as_str()
        .expect("a runner token")
        .to_owned();
    let m = curl_json(
        "PUT",
        &format!("{url}/v1/runner/machine"),
        &runner,
        Some(&json!({
            "runtimes": [{"runtime": "claude-code", "version": "2.1.328"}],
            "directories": ["/home/alice/src"],
            "runner_version": "0.1.0",
            "runtime_rules": [{
                "runtime": "claude-code",
                "source": "/home/alice/src/shop/.claude/settings.json",
                "text": "Bash(npm test:*)",
                "effect": "deny",
                "match": {"runtime": "claude-code", "tool": "Bash", "directory": "/home/alice/src/shop",
                          "input": {"kind": "glob", "pattern": "npm test*"}},
            }],
        })),
    );
    assert_eq!(m["name"], "laptop", "{m}");

    // Listed again (as on opening the screen): the use counted.
    click(&c, "[data-testid=nav-inbox]").await;
    click(&c, "[data-testid=nav-rules]").await;
    wait_until(&c, "the rule's use counted", 30, || async {
        text(&c, "[data-testid=rule-uses]")
            .await
            .contains("used 1×")
    })
    .await;
    let said = text(&c, "[data-testid=rule-conflict]").await;
    assert!(
        said.contains("Claude Code on laptop refuses these calls before asking"),
        "the conflict on alice's rule: {said}"
    );
    assert_eq!(
        text(&c, "[data-testid=runtime-rule-text]").await,
        "Bash(npm test:*)"
    );
    assert_eq!(
        attr(&c, "[data-testid=runtime-rule-conflict]", "data-rule")
            .await
            .as_deref(),
        Some(id.as_str()),
        "the runtime's rule names the rule it works against"
    );
    assert!(
        text(&c, "[data-testid=runtime-rule-conflict]")
            .await
            .contains("Works against your rule: Allow Bash `npm test*` · /home/alice/src/shop"),
        "said in the rule's own terms"
    );
    shot(&c, "rules").await;
    click(&c, "[data-testid=rule-revoke]").await;
    click(&c, "[data-testid=rule-revoke-confirm]").await;
    wait_until(&c, "the rule revoked", 30, || async {
        attr(&c, "[data-testid=rule]", "data-state")
            .await
            .as_deref()
            == Some("revoked")
    })
    .await;
    let d = asks("npm test");
    assert_eq!(
        d["status"], "pending",
        "a revoked rule answers nothing: {d}"
    );

    // "Always allow…" on that approval's card: the form filled in from its intent, the
    // pattern widened before signing; the agent's next such call is answered by the new rule.
    let dec = d["id"].as_str().expect("the decision").to_owned();
    click(&c, "[data-testid=nav-inbox]").await;
    let card = format!("[data-testid=decision-{dec}]");
    click(&c, &format!("{card} [data-testid=always-allow]")).await;
    let field = |name: &'static str| {
        let css = format!("{card} [data-testid={name}]");
        let c = &c;
        async move {
            wait_css(c, &css, 30)
                .await
                .prop("value")
                .await
                .ok()
                .flatten()
                .unwrap_or_default()
        }
    };
    assert_eq!(
        field("rule-tool").await,
        "Bash",
        "the tool, from the intent"
    );
    assert_eq!(
        field("rule-pattern").await,
        "npm test",
        "the command, from the intent"
    );
    c.find(Locator::Css(&format!("{card} [data-testid=rule-pattern]")))
        .await
        .expect("the pattern")
        .send_keys("*")
        .await
        .expect("widen the pattern");
    shot(&c, "always-allow").await;
    click(&c, &format!("{card} [data-testid=rule-sign]")).await;
    let made = wait_css(&c, &format!("{card} [data-testid=rule-made]"), 30)
        .await
        .text()
        .await
        .unwrap_or_default();
    let new_id = made
        .split_whitespace()
        .find(|w| w.starts_with("rul_"))
        .expect("the card names the rule")
        .to_owned();
    let d = asks("npm test --ci");
    assert_eq!(d["outcome"]["by"], format!("rule:{new_id}"), "{d}");
    c.close().await.expect("close the browser");
}

/// A JSON call with a bearer token, by curl (as the other out-of-browser calls here).
fn curl_json(method: &str, url: &str, token: &str, body: Option<&Value>) -> Value {
    let mut cmd = Command::new("curl");
    cmd.args([
        "-sS",
        "-X",
        method,
        "-H",
        &format!("authorization: Bearer {token}"),
    ]);
    if let Some(b) = body {
        cmd.args(["-H", "content-type: application/json", "--data-binary"])
            .arg(b.to_string());
    }
    let out = cmd.arg(url).output().expect("curl");
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{method} {url}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// The text of decision `id`'s card in the inbox (then back to where the page was).
async fn card_text_of(c: &Client, id: &str) -> String {
    let back = c.current_url().await.expect("the page's address");
    click(c, "[data-testid=nav-inbox]").await;
    wait_css(c, "[data-testid=approve]", 60).await;
    let (card, card_id) = approval_card(c).await;
    assert_eq!(card_id, id, "the inbox's approval is the one asked");
    let text = card.text().await.unwrap_or_default();
    c.goto(back.as_str()).await.expect("back");
    text
}

/// The inbox card holding an approve button.
const APPROVAL_CARD: &str = "//button[@data-testid='approve']/ancestor::article";

/// The first approval's card in the inbox, and its decision id.
async fn approval_card(c: &Client) -> (fantoccini::elements::Element, String) {
    let card = c
        .find(Locator::XPath(APPROVAL_CARD))
        .await
        .expect("the approval's card");
    let id = card
        .attr("data-testid")
        .await
        .ok()
        .flatten()
        .expect("the card's id")
        .trim_start_matches("decision-")
        .to_owned();
    (card, id)
}

/// The task of the thread on screen.
async fn paused_or_any_task(c: &Client) -> String {
    wait_css(c, "[data-testid=thread-state]", 30).await;
    paused_task(c).await
}

/// The thread the page shows as paused (the second run's).
async fn paused_task(c: &Client) -> String {
    let hash = c
        .current_url()
        .await
        .expect("the URL")
        .fragment()
        .unwrap_or_default()
        .to_owned();
    if let Some(t) = hash.strip_prefix("/threads/") {
        return t.to_owned();
    }
    panic!("not on a thread: {hash}")
}

/// The terminal client as a second device, with its key in a file (a throwaway home).
fn terminal(home: &Path, args: &[&str]) -> Value {
    let out = waymark()
        .arg("--json")
        .args(args)
        .env("WAYMARK_HOME", home)
        .env("WAYMARK_KEYSTORE", "file-insecure")
        .output()
        .expect("run the terminal client");
    assert!(
        out.status.success(),
        "waymark {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

#[test]
fn a_blank_capture_is_told_from_one_with_content() {
    let encode = |pixels: &[u8]| {
        let mut out = Vec::new();
        let mut e = png::Encoder::new(&mut out, 4, 4);
        e.set_color(png::ColorType::Grayscale);
        e.write_header().unwrap().write_image_data(pixels).unwrap();
        out
    };
    assert!(blank(&encode(&[255; 16])), "all one colour");
    let mut drawn = [255u8; 16];
    drawn[9] = 0;
    assert!(!blank(&encode(&drawn)), "one dark pixel is content");
}
