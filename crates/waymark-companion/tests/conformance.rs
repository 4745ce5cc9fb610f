//! The mirror conformance fixture: one snapshot + event stream, recorded from a real server run,
//! must give the same mirror rows in the Rust companion and the web companion (ui/src/web).

#![allow(unreachable_pub)]

use std::path::PathBuf;
use std::time::Duration;

use ed25519_dalek::SigningKey;
use futures::StreamExt;
use serde_json::{Map, Value, json};
use sqlx::{Column, Row, TypeInfo, ValueRef};
use waymark_companion::{Companion, Mirror, Seen};
use waymark_proto::*;
use waymark_server::{Config, DataDir, Running};

/// Set to `1` to record the fixture from a live run and the expected rows from replaying it
/// (then `cargo run -p waymark-app --example bindings -- write`: the views' shared cases,
/// `fixtures/views.json`, are made from the recorded query answers).
const RECORD: &str = "WAYMARK_RECORD_FIXTURES";

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../ui/src/web/fixtures")
}

fn recording() -> bool {
    std::env::var(RECORD).is_ok_and(|v| v == "1")
}

/// Every mirror table with its primary key, in the order the dump lists them. The migration
/// bookkeeping (`_sqlx_migrations` here, `schema_migrations` on the web) is left out; the
/// device-local tables (outbox, blobs, notified) are in, and must stay empty under replay.
const TABLES: &[(&str, &str)] = &[
    ("meta", "key"),
    ("tasks", "id"),
    ("attempts", "id"),
    ("checkpoints", "task_id, sequence"),
    ("effects", "id"),
    ("decisions", "id"),
    ("artifacts", "id"),
    ("receipts", "id"),
    ("messages", "session_id, seq"),
    ("deliveries", "decision_id, device_id, step"),
    ("outbox", "seq"),
    ("blobs", "sha256"),
    ("notified", "key"),
];

/// Columns holding JSON text; they are compared parsed, so key order and spacing do not count.
const JSON_COLUMNS: &[&str] = &["data", "envelope", "result"];

/// Every table's rows, all columns, sorted by primary key: `{table: [{column: value}]}`.
async fn dump(path: &std::path::Path) -> Value {
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(
            sqlx::sqlite::SqliteConnectOptions::new()
                .filename(path)
                .read_only(true),
        )
        .await
        .unwrap();
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'
           AND name NOT IN ('_sqlx_migrations', 'schema_migrations') ORDER BY name",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let mut listed: Vec<String> = TABLES.iter().map(|(t, _)| (*t).to_owned()).collect();
    listed.sort();
    assert_eq!(
        names, listed,
        "a migration added or dropped a mirror table: list it in TABLES here and in ui/src/web/mirror.test.ts"
    );
    let mut out = Map::new();
    for (table, pk) in TABLES {
        let rows = sqlx::query(&format!("SELECT * FROM {table} ORDER BY {pk}"))
            .fetch_all(&pool)
            .await
            .unwrap();
        let mut list = Vec::new();
        for r in rows {
            let mut obj = Map::new();
            for (i, col) in r.columns().iter().enumerate() {
                let raw = r.try_get_raw(i).unwrap();
                let v = match raw.type_info().name() {
                    "NULL" => Value::Null,
                    "INTEGER" => json!(r.get::<i64, _>(i)),
                    "REAL" => json!(r.get::<f64, _>(i)),
                    "BLOB" => json!(r.get::<Vec<u8>, _>(i)),
                    _ => {
                        let s: String = r.get(i);
                        if JSON_COLUMNS.contains(&col.name()) {
                            serde_json::from_str(&s).unwrap()
                        } else {
                            Value::String(s)
                        }
                    }
                };
                obj.insert(col.name().to_owned(), v);
            }
            list.push(Value::Object(obj));
        }
        out.insert((*table).to_owned(), Value::Array(list));
    }
    pool.close().await;
    Value::Object(out)
}

/// What the fixture holds: a snapshot as `resnapshot` takes it, then the events after it.
struct Fixture {
    cursor: i64,
    threads: Vec<TaskDetail>,
    events: Vec<Event>,
}

fn parse_fixture(v: &Value) -> Fixture {
    Fixture {
        cursor: v["snapshot"]["cursor"].as_i64().unwrap(),
        threads: serde_json::from_value(v["snapshot"]["threads"].clone()).unwrap(),
        events: serde_json::from_value(v["events"].clone()).unwrap(),
    }
}

/// Applies the fixture to a fresh mirror the way sync does (snapshot, then the events) and
/// returns the rows and the UI's queries.
async fn replay(f: &Fixture) -> (Value, Value) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mirror.db");
    let m = Mirror::open(&path).await.unwrap();
    m.replace_all(f.cursor, &f.threads).await.unwrap();
    m.apply(&f.events).await.unwrap();
    let mut details = Map::new();
    let threads = m.threads().await.unwrap();
    for t in &threads {
        let d = m.thread(&t.task.id).await.unwrap().unwrap();
        details.insert(t.task.id.clone(), serde_json::to_value(d).unwrap());
    }
    let queries = json!({
        "threads": threads,
        "inbox": m.inbox().await.unwrap(),
        "thread": details,
    });
    drop(m);
    (dump(&path).await, queries)
}

fn read_json(name: &str) -> Value {
    let path = fixtures().join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} — record it with {RECORD}=1 cargo nextest run -p waymark-companion conformance",
            path.display()
        )
    });
    serde_json::from_str(&text).unwrap()
}

fn write_json(name: &str, v: &Value) {
    std::fs::create_dir_all(fixtures()).unwrap();
    let mut text = serde_json::to_string_pretty(v).unwrap();
    text.push('\n');
    std::fs::write(fixtures().join(name), text).unwrap();
}

/// Replays the committed fixture; with `record`, writes what it gives as the expected rows.
async fn check_committed(record: bool) {
    let fixture = parse_fixture(&read_json("mirror-events.json"));
    let (rows, queries) = replay(&fixture).await;
    if record {
        write_json("mirror-rows.json", &rows);
        write_json("mirror-queries.json", &queries);
    }
    assert_eq!(
        rows,
        read_json("mirror-rows.json"),
        "the mirror's rows drifted from ui/src/web/fixtures/mirror-rows.json; if the change is meant, re-record with {RECORD}=1 and check the web mirror follows"
    );
    assert_eq!(queries, read_json("mirror-queries.json"));
}

#[tokio::test]
async fn the_committed_fixture_gives_the_committed_rows() {
    if recording() {
        // The recording test writes the fixture, then checks it the same way.
        return;
    }
    check_committed(false).await;
}

// The live run.

struct Live {
    _dir: tempfile::TempDir,
    running: Running,
    worker: String,
    http: reqwest::Client,
}

impl Live {
    fn url(&self) -> String {
        format!("http://{}", self.running.addr)
    }

    async fn send(&self, req: reqwest::RequestBuilder, what: &str) -> Value {
        let res = req.send().await.unwrap();
        let status = res.status();
        let v: Value = res.json().await.unwrap();
        assert!(status.is_success(), "{what}: {status} {v}");
        v
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        let req = self
            .http
            .post(format!("{}{path}", self.url()))
            .bearer_auth(&self.worker)
            .json(&body);
        self.send(req, path).await
    }

    async fn patch(&self, path: &str, body: Value) -> Value {
        let req = self
            .http
            .patch(format!("{}{path}", self.url()))
            .bearer_auth(&self.worker)
            .json(&body);
        self.send(req, path).await
    }

    async fn get(&self, token: &str, path: &str) -> Value {
        let req = self
            .http
            .get(format!("{}{path}", self.url()))
            .bearer_auth(token);
        self.send(req, path).await
    }

    async fn pairing_code(&self) -> String {
        let store = self.running.state.store.clone();
        let scopes = vec!["view".to_owned(), "steer".to_owned(), "approve".to_owned()];
        waymark_server::steer::create_pairing(&*store, "alice", &scopes, 600_000)
            .await
            .unwrap()
            .0
    }

    /// Pairs a device over HTTP and opens a read session for it, as the companion does.
    async fn device_token(&self) -> String {
        let key = SigningKey::generate(&mut rand::rngs::OsRng);
        let device = self
            .send(
                self.http
                    .post(format!("{}/v1/devices/pair", self.url()))
                    .json(&PairDevice {
                        code: self.pairing_code().await,
                        public_key: signing::public_key_b64(&key.verifying_key()),
                        name: "phone".into(),
                    }),
                "pair",
            )
            .await;
        let device_id = device["id"].as_str().unwrap().to_owned();
        let now = chrono::Utc::now();
        let cmd = SteerCommand {
            command_id: ids::command(),
            task_id: None,
            expected_plan_revision: None,
            operation: Operation::OpenSession,
            scope: vec![],
            args: Value::Null,
            issued_by: "user:alice".into(),
            device_id: device_id.clone(),
            issued_at: now,
            expires_at: now + chrono::Duration::minutes(2),
        };
        let env = signing::sign(&cmd, &key).unwrap();
        let s = self
            .send(
                self.http
                    .post(format!("{}/v1/devices/{device_id}/session", self.url()))
                    .json(&env),
                "session",
            )
            .await;
        s["token"].as_str().unwrap().to_owned()
    }

    /// `GET /v1/snapshot` and each thread in full, as `resnapshot` reads them (wire JSON).
    async fn snapshot(&self, token: &str) -> Value {
        let snap = self.get(token, "/v1/snapshot").await;
        let mut threads = Vec::new();
        for t in snap["tasks"].as_array().unwrap() {
            let id = t["id"].as_str().unwrap();
            threads.push(self.get(token, &format!("/v1/tasks/{id}")).await);
        }
        json!({"cursor": snap["cursor"], "threads": threads})
    }

    /// The event stream after `after` up to the log's head, each event's wire JSON.
    async fn events(&self, token: &str, after: i64) -> Vec<Value> {
        use eventsource_stream::Eventsource;
        let head = self.get(token, "/healthz").await["cursor"]
            .as_i64()
            .unwrap();
        let res = self
            .http
            .get(format!("{}/v1/events?after={after}", self.url()))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert!(res.status().is_success(), "events: {}", res.status());
        let mut stream = Box::pin(res.bytes_stream().eventsource());
        let mut out = Vec::new();
        let mut seen = after;
        while seen < head {
            let Ok(Some(ev)) = tokio::time::timeout(Duration::from_secs(1), stream.next()).await
            else {
                // The rest of the log is not this user's.
                break;
            };
            let ev = ev.unwrap();
            let v: Value = serde_json::from_str(&ev.data).unwrap();
            // It parses as the companion parses it.
            let typed: Event = serde_json::from_value(v.clone()).unwrap();
            seen = typed.cursor;
            out.push(v);
        }
        out
    }
}

/// A realistic run: a task with a plan, an attempt, checkpoints (a step done and verified, the
/// next in flight), an effect with its receipt, a diff, a test receipt, messages, spend, a
/// question answered and an approval left pending from a device, a pause and resume from a
/// device acknowledged by the worker, and a second task run to completion — with a device's
/// snapshot taken part way and the stream after it.
async fn record_live_run() -> Value {
    let dir = tempfile::tempdir().unwrap();
    let running = waymark_server::start(
        &DataDir::new(dir.path()),
        "127.0.0.1:0".parse().unwrap(),
        Config::default(),
    )
    .await
    .unwrap();
    let store = running.state.store.clone();
    waymark_server::admin::add_user(&*store, "alice")
        .await
        .unwrap();
    let (worker, _) = waymark_server::admin::create_worker_token(&*store, "agent", Some("alice"))
        .await
        .unwrap();
    let s = Live {
        _dir: dir,
        running,
        worker,
        http: reqwest::Client::new(),
    };

    // Before the snapshot: the checkout fix under way, and a queued docs task.
    let t = s
        .post(
            "/v1/tasks",
            json!({"title": "Fix checkout total", "goal": "cart totals match the receipt; tests pass",
                "runtime": "claude-code",
                "plan": [{"id": "fix", "title": "Fix the off-by-one"},
                         {"id": "test", "title": "Run the tests", "depends_on": ["fix"]},
                         {"id": "deploy", "title": "Deploy to staging", "depends_on": ["test"]}],
                "budget": {"max_tokens": 200000, "max_cost_usd": 5.0},
                "materials": {"repo": "git@example.com:shop.git", "commit": "abc123"}}),
        )
        .await;
    let task = t["id"].as_str().unwrap().to_owned();
    let a = s
        .post(
            &format!("/v1/tasks/{task}/attempts"),
            json!({"worker": "agent", "lease_seconds": 600}),
        )
        .await;
    let att = a["id"].as_str().unwrap().to_owned();
    let fence = a["fence"].as_i64().unwrap();
    let cp = |seq: i64, body: Value| {
        let s = &s;
        let (task, att) = (task.clone(), att.clone());
        async move {
            s.post(
                &format!("/v1/tasks/{task}/checkpoints"),
                json!({"attempt_id": att, "fence": fence, "sequence": seq, "body": body}),
            )
            .await
        }
    };
    cp(
        1,
        json!({"reason": "human_wait", "plan_revision": 1, "pending_step": {"step": "fix"},
            "summary": "reading cart.py"}),
    )
    .await;
    s.post(
        &format!("/v1/tasks/{task}/messages"),
        json!({"attempt_id": att, "fence": fence, "messages": [
            {"role": "user", "text": "The checkout total is one cent too high."},
            {"role": "assistant", "text": "Looking at cart.py."}]}),
    )
    .await;
    s.post(
        "/v1/tasks",
        json!({"title": "Update the README", "plan": [{"id": "docs", "title": "Write docs"}]}),
    )
    .await;

    let phone = s.device_token().await;
    let snapshot = s.snapshot(&phone).await;
    let after = snapshot["cursor"].as_i64().unwrap();

    // After it: the fix lands and is verified, the deploy waits for approval.
    let diff = "--- a/cart.py\n+++ b/cart.py\n@@ -1 +1 @@\n-    return sum(items) + 1\n+    return sum(items)\n";
    let art = s
        .send(
            s.http
                .post(format!(
                    "{}/v1/tasks/{task}/artifacts?name=fix.diff&step=fix",
                    s.url()
                ))
                .bearer_auth(&s.worker)
                .header("content-type", "text/x-diff")
                .body(diff),
            "artifact",
        )
        .await;
    let junit = r#"<testsuite name="cart" tests="3" failures="0" errors="0" skipped="1" time="0.75"><testcase classname="cart" name="test_total" time="0.5"/><testcase classname="cart" name="test_empty" time="0.25"/><testcase classname="cart" name="test_slow"><skipped/></testcase></testsuite>"#;
    s.post(
        &format!("/v1/tasks/{task}/test-receipts"),
        json!({"attempt_id": att, "fence": fence, "step": "test", "command": "pytest -q",
            "exit_code": 0, "commit": "def456", "junit_xml": junit}),
    )
    .await;
    cp(
        2,
        json!({"reason": "step_completed", "plan_revision": 1,
            "completed_steps": [{"step": "fix", "artifact_digests": [art["sha256"]], "verified": true},
                                {"step": "test", "verified": true}],
            "pending_step": {"step": "deploy"},
            "materials": {"repo": "git@example.com:shop.git", "commit": "def456"},
            "summary": "fixed and tested"}),
    )
    .await;
    s.post(
        &format!("/v1/tasks/{task}/usage"),
        json!({"attempt_id": att, "fence": fence, "tokens": 48210, "cost_usd": 0.62, "wall_seconds": 340}),
    )
    .await;
    let eff = s
        .post(
            &format!("/v1/tasks/{task}/effects"),
            json!({"attempt_id": att, "fence": fence, "idempotency_key": "ci-run-def456",
                "kind": "http.post", "step": "test",
                "intent": {"url": "https://ci.example.com/runs", "commit": "def456"}}),
        )
        .await;
    let eff_id = eff["effect"]["id"].as_str().unwrap().to_owned();
    s.patch(
        &format!("/v1/effects/{eff_id}"),
        json!({"attempt_id": att, "fence": fence, "status": "confirmed",
            "receipt": {"run": 9131, "status": "passed"}, "resource_id": "ci-9131"}),
    )
    .await;
    let q = s
        .post(
            &format!("/v1/tasks/{task}/decisions"),
            json!({"attempt_id": att, "fence": fence, "kind": "question", "step": "deploy",
                "question": "Which staging slot?", "options": [
                    {"id": "blue", "label": "Blue", "gives_up": "the demo running there"},
                    {"id": "green", "label": "Green", "gives_up": "nothing", "cost": "+5 min"}],
                "default_option": "green"}),
        )
        .await;
    let question = q["id"].as_str().unwrap().to_owned();
    s.post(
        &format!("/v1/tasks/{task}/messages"),
        json!({"attempt_id": att, "fence": fence, "messages": [
            {"role": "assistant", "text": "Fixed: the total no longer adds one. Tests pass."}]}),
    )
    .await;

    // A laptop of alice's answers the question and pauses, then resumes; the worker sees both.
    let home = tempfile::tempdir().unwrap();
    let laptop = Companion::open_with_keystore(home.path(), "file-insecure")
        .await
        .unwrap();
    laptop
        .pair(&s.url(), &s.pairing_code().await, "laptop")
        .await
        .unwrap();
    laptop.sync_once().await.unwrap();
    let revision = laptop
        .mirror()
        .task(&task)
        .await
        .unwrap()
        .unwrap()
        .plan_revision;
    laptop
        .answer(
            &question,
            Operation::ChooseOption,
            Some("green"),
            None,
            &Seen::revision(revision),
        )
        .await
        .unwrap();
    for op in [Operation::Pause, Operation::Resume] {
        let e = laptop
            .command(&task, op, json!({}), vec![], revision)
            .await
            .unwrap();
        s.post(
            &format!("/v1/attempts/{att}/heartbeat"),
            json!({"fence": fence, "acknowledged": [e.command_id]}),
        )
        .await;
    }
    s.post(
        &format!("/v1/tasks/{task}/approvals"),
        json!({"attempt_id": att, "fence": fence, "step": "deploy",
            "intent": {"target": "staging-green", "commit": "def456"},
            "summary": "Deploy def456 to staging-green?", "risky": true}),
    )
    .await;
    cp(
        3,
        json!({"reason": "human_wait", "plan_revision": 1,
            "pending_step": {"step": "deploy"}, "summary": "waiting for the deploy approval"}),
    )
    .await;

    // A second task runs start to finish.
    let t2 = s
        .post(
            "/v1/tasks",
            json!({"title": "Bump the lockfile", "plan": [{"id": "bump", "title": "Bump"}]}),
        )
        .await;
    let task2 = t2["id"].as_str().unwrap().to_owned();
    let a2 = s
        .post(
            &format!("/v1/tasks/{task2}/attempts"),
            json!({"worker": "agent", "lease_seconds": 600}),
        )
        .await;
    let att2 = a2["id"].as_str().unwrap().to_owned();
    s.post(
        &format!("/v1/tasks/{task2}/checkpoints"),
        json!({"attempt_id": att2, "fence": 1, "sequence": 1, "body": {"reason": "step_completed",
            "completed_steps": [{"step": "bump"}], "summary": "bumped"}}),
    )
    .await;
    s.post(
        &format!("/v1/attempts/{att2}/finish"),
        json!({"fence": 1, "outcome": "completed", "summary": "lockfile bumped; not verified"}),
    )
    .await;

    let events = s.events(&phone, after).await;
    s.running.shutdown().await.unwrap();
    json!({"snapshot": snapshot, "events": events})
}

fn kinds(fixture: &Value) -> Vec<String> {
    fixture["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_owned())
        .collect()
}

/// Runs the scenario against a real server. Recording, it writes the fixture and the rows its
/// replay gives; otherwise it checks the committed fixture still has the shape a run gives now
/// (the same threads and the same kinds of events in the same order), so a server change that
/// alters the stream asks for a new recording.
#[tokio::test]
async fn a_real_run_records_the_fixture() {
    let live = record_live_run().await;
    // Everything the mirror can hold is in the stream.
    let k = kinds(&live);
    for want in [
        "task.created",
        "task.updated",
        "attempt.started",
        "attempt.ended",
        "checkpoint.appended",
        "effect.declared",
        "effect.updated",
        "decision.requested",
        "decision.closed",
        "artifact.added",
        "test_receipt.added",
        "messages.appended",
        "command.applied",
        "command.acknowledged",
    ] {
        assert!(k.iter().any(|x| x == want), "no {want} in {k:?}");
    }
    if recording() {
        write_json("mirror-events.json", &live);
        check_committed(true).await;
        return;
    }
    let committed = read_json("mirror-events.json");
    assert_eq!(
        kinds(&committed),
        k,
        "the server's stream for this run changed: re-record with {RECORD}=1"
    );
    assert_eq!(
        committed["snapshot"]["threads"].as_array().unwrap().len(),
        live["snapshot"]["threads"].as_array().unwrap().len()
    );
}
