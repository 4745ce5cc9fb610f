//! Several control-plane replicas on one PostgreSQL database (SPEC §8): fan-out across
//! replicas, cursors a reader can trust, CAS and leases across replicas, background work run
//! once.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use eventsource_stream::Eventsource;
use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};
use waymark_proto::Operation;
use waymark_server::{Clock, Config, DataDir, Running};

use crate::support::{TestDevice, test_config};

struct Replicas {
    _dirs: Vec<tempfile::TempDir>,
    /// One clock for every replica, as one machine's would be.
    clock: Clock,
    nodes: Vec<Option<Running>>,
    worker: String,
    http: reqwest::Client,
}

impl Replicas {
    async fn start(n: usize) -> Self {
        let url = waymark_store_postgres::testing::fresh_database().await;
        let mut dirs = Vec::new();
        let mut nodes = Vec::new();
        let clock = Clock::driven();
        for _ in 0..n {
            let dir = tempfile::tempdir().unwrap();
            let data = DataDir::new(dir.path());
            let store = data.open_store(Some(&url)).await.unwrap();
            let cfg = Config {
                tick: Duration::from_millis(100),
                clock: clock.clone(),
                ..test_config()
            };
            nodes.push(Some(
                waymark_server::start_with_store(&data, store, "127.0.0.1:0".parse().unwrap(), cfg)
                    .await
                    .unwrap(),
            ));
            dirs.push(dir);
        }
        let store = nodes[0].as_ref().unwrap().state.store.clone();
        waymark_server::admin::add_user(&*store, "alice")
            .await
            .unwrap();
        let (worker, _) =
            waymark_server::admin::create_worker_token(&*store, "agent", Some("alice"))
                .await
                .unwrap();
        Replicas {
            _dirs: dirs,
            clock,
            nodes,
            worker,
            http: reqwest::Client::new(),
        }
    }

    /// Moves the shared clock forward, then runs every running replica's background work
    /// at the same time, so they race for what fell due.
    async fn advance(&self, by: Duration) {
        self.clock.advance(by).unwrap();
        futures::future::join_all(
            self.nodes
                .iter()
                .flatten()
                .map(|n| async { n.advance(Duration::ZERO).await.unwrap() }),
        )
        .await;
        self.settled().await;
    }

    /// Waits until every running replica has heard of the others' commits: each one's cursor
    /// watch (its horizon) reaches the newest any of them has. A replica's reads of the log
    /// stop at its horizon, and it hears of another's commit moments after it
    /// (`waymark-store-postgres`, "Readers never pass an event still in flight").
    async fn settled(&self) {
        let running = || self.nodes.iter().flatten();
        let newest = running()
            .map(|n| *n.state.store.cursor_watch().borrow())
            .max()
            .unwrap_or(0);
        for n in running() {
            tokio::time::timeout(
                Duration::from_secs(5),
                n.state.store.cursor_watch().wait_for(|c| *c >= newest),
            )
            .await
            .expect("every replica hears of the others' commits")
            .unwrap();
        }
    }

    fn node(&self, i: usize) -> &Running {
        self.nodes[i].as_ref().expect("replica is running")
    }

    fn url(&self, i: usize) -> String {
        self.node(i).url()
    }

    async fn post(&self, i: usize, path: &str, body: Value) -> (StatusCode, Value) {
        let res = self
            .http
            .post(format!("{}{path}", self.url(i)))
            .bearer_auth(&self.worker)
            .json(&body)
            .send()
            .await
            .unwrap();
        let s = res.status();
        (s, res.json().await.unwrap_or(Value::Null))
    }

    async fn task(&self, i: usize) -> (String, String) {
        let (_, t) = self
            .post(i, "/v1/tasks", json!({"title": "replicated"}))
            .await;
        let task = t["id"].as_str().unwrap().to_owned();
        let (s, a) = self
            .post(
                i,
                &format!("/v1/tasks/{task}/attempts"),
                json!({"worker": "w", "lease_seconds": 600}),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{a}");
        (task, a["id"].as_str().unwrap().to_owned())
    }

    async fn checkpoint(&self, i: usize, task: &str, att: &str, seq: i64) -> StatusCode {
        self.post(
            i,
            &format!("/v1/tasks/{task}/checkpoints"),
            json!({"attempt_id": att, "fence": 1, "sequence": seq, "body": {"reason": "r"}}),
        )
        .await
        .0
    }

    /// Every committed event, as the database holds it.
    async fn all_cursors(&self) -> Vec<i64> {
        self.settled().await;
        let store = self.node(0).state.store.clone();
        let mut tx = store.read().await.unwrap();
        tx.events_after(0, 1_000_000, None)
            .await
            .unwrap()
            .iter()
            .map(|e| e.cursor)
            .collect()
    }

    async fn pair(&self, i: usize) -> TestDevice {
        let store = self.node(i).state.store.clone();
        let scopes = vec!["view".to_owned(), "steer".to_owned()];
        let (code, _) = waymark_server::steer::create_pairing(&*store, "alice", &scopes, 600_000)
            .await
            .unwrap();
        let key = ed25519_dalek::SigningKey::generate(&mut rand::rngs::OsRng);
        let (s, v) = self
            .post(i, "/v1/devices/pair", json!({"code": code, "name": "d", "public_key": waymark_proto::signing::public_key_b64(&key.verifying_key())}))
            .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        TestDevice {
            id: v["id"].as_str().unwrap().to_owned(),
            user: "alice".into(),
            key,
        }
    }
}

/// Reads the stream of replica `i` from `after` until `until` is seen (or 2 s of silence).
async fn read_until(
    r: &Replicas,
    i: usize,
    after: i64,
    until: i64,
    stop_after: Option<usize>,
) -> Vec<i64> {
    let res = r
        .http
        .get(format!("{}/v1/events", r.url(i)))
        .bearer_auth(&r.node(i).admin_token)
        .header("Last-Event-ID", after.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let mut stream = res.bytes_stream().eventsource();
    let mut seen = Vec::new();
    while seen.last().is_none_or(|c| *c < until) {
        match tokio::time::timeout(Duration::from_secs(2), stream.next()).await {
            Ok(Some(Ok(ev))) => seen.push(ev.id.parse::<i64>().unwrap()),
            _ => break,
        }
        if stop_after.is_some_and(|n| seen.len() >= n) {
            break;
        }
    }
    seen
}

#[tokio::test]
async fn a_reader_on_one_replica_sees_every_write_through_the_other_in_order() {
    let r = Arc::new(Replicas::start(2).await);
    let mut writers = tokio::task::JoinSet::new();
    for w in 0..4 {
        let r = r.clone();
        writers.spawn(async move {
            let node = w % 2;
            let (task, att) = r.task(node).await;
            for seq in 1..=40 {
                assert_eq!(
                    r.checkpoint(node, &task, &att, seq).await,
                    StatusCode::CREATED
                );
            }
        });
    }
    // Read from replica 0 while all four write through both replicas.
    let reader = {
        let r = r.clone();
        tokio::spawn(async move {
            let mut seen = Vec::new();
            loop {
                let more =
                    read_until(&r, 0, seen.last().copied().unwrap_or(0), i64::MAX, Some(37)).await;
                if more.is_empty() {
                    return seen;
                }
                seen.extend(more);
            }
        })
    };
    while writers.join_next().await.is_some() {}
    let seen = reader.await.unwrap();
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "out of order or duplicated"
    );
    assert_eq!(
        seen,
        r.all_cursors().await,
        "the reader missed committed events"
    );
    assert!(seen.len() >= 4 * 40);
}

#[tokio::test]
async fn sixteen_writers_across_replicas_race_for_each_sequence_and_one_wins() {
    let r = Arc::new(Replicas::start(2).await);
    let (task, att) = r.task(0).await;
    for seq in 1..=10 {
        let mut set = tokio::task::JoinSet::new();
        for w in 0..16 {
            let (r, task, att) = (r.clone(), task.clone(), att.clone());
            set.spawn(async move { r.checkpoint(w % 2, &task, &att, seq).await });
        }
        let mut won = 0;
        while let Some(s) = set.join_next().await {
            match s.unwrap().as_u16() {
                201 => won += 1,
                409 => {}
                other => panic!("unexpected {other}"),
            }
        }
        assert_eq!(won, 1, "sequence {seq}");
    }
    // A live lease held through one replica is exclusive through the other.
    let (s, v) = r
        .post(
            1,
            &format!("/v1/tasks/{task}/attempts"),
            json!({"worker": "other"}),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    assert_eq!(v["code"], "lease_held");
}

#[tokio::test]
async fn two_devices_replanning_through_different_replicas_apply_once() {
    let r = Arc::new(Replicas::start(2).await);
    let (task, _) = r.task(0).await;
    let a = Arc::new(r.pair(0).await);
    let b = Arc::new(r.pair(1).await);
    for rev in 1..=20 {
        let ea = a.sign(&a.command(
            &task,
            Some(rev),
            Operation::Replan,
            json!({"instructions": "a"}),
        ));
        let eb = b.sign(&b.command(
            &task,
            Some(rev),
            Operation::Replan,
            json!({"instructions": "b"}),
        ));
        let (ra, rb) = (r.clone(), r.clone());
        let (x, y) = tokio::join!(
            tokio::spawn(async move { ra.post(0, "/v1/commands", ea).await }),
            tokio::spawn(async move { rb.post(1, "/v1/commands", eb).await })
        );
        let statuses = [
            x.unwrap().1["status"].clone(),
            y.unwrap().1["status"].clone(),
        ];
        assert_eq!(
            statuses.iter().filter(|s| *s == "applied").count(),
            1,
            "revision {rev}: {statuses:?}"
        );
        assert_eq!(
            statuses.iter().filter(|s| *s == "conflict").count(),
            1,
            "revision {rev}: {statuses:?}"
        );
    }
}

#[tokio::test]
async fn a_reader_whose_replica_dies_resumes_on_the_other_without_gap_or_duplicate() {
    let mut r = Replicas::start(2).await;
    let (task, att) = r.task(1).await;
    for seq in 1..=30 {
        r.checkpoint(1, &task, &att, seq).await;
    }
    let first = read_until(&r, 0, 0, i64::MAX, Some(20)).await;
    assert_eq!(first.len(), 20);
    // Replica 0 goes away mid-stream; writes go on through replica 1.
    r.nodes[0].take().unwrap().shutdown().await.unwrap();
    for seq in 31..=60 {
        r.checkpoint(1, &task, &att, seq).await;
    }
    let store = r.node(1).state.store.clone();
    let head = store.read().await.unwrap().max_cursor().await.unwrap();
    let rest = read_until(&r, 1, *first.last().unwrap(), head, None).await;
    let mut all = first.clone();
    all.extend(rest);
    let unique: BTreeSet<i64> = all.iter().copied().collect();
    assert_eq!(unique.len(), all.len(), "a duplicate was delivered");
    let committed: Vec<i64> = store
        .read()
        .await
        .unwrap()
        .events_after(0, 100_000, None)
        .await
        .unwrap()
        .iter()
        .map(|e| e.cursor)
        .collect();
    assert_eq!(all, committed, "a gap");
}

#[tokio::test]
async fn a_decision_due_while_both_replicas_run_expires_once() {
    let r = Replicas::start(2).await;
    let (task, _) = r.task(0).await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        let (s, d) = r
            .post(1, &format!("/v1/tasks/{task}/decisions"),
                  json!({"kind": "question", "question": "which?", "options": [{"id": "a", "label": "A"}], "default_option": "a", "expires_in_seconds": 1}))
            .await;
        assert_eq!(s, StatusCode::CREATED, "{d}");
        ids.push(d["id"].as_str().unwrap().to_owned());
    }
    r.advance(Duration::from_millis(1500)).await;
    let store = r.node(0).state.store.clone();
    let events = store
        .read()
        .await
        .unwrap()
        .events_after(0, 100_000, None)
        .await
        .unwrap();
    for id in &ids {
        let closes = events
            .iter()
            .filter(|e| e.kind.as_str() == "decision.closed" && e.data["id"] == id.as_str())
            .count();
        assert_eq!(closes, 1, "decision {id} closed {closes} times");
    }
}

#[tokio::test]
async fn a_follow_up_due_while_both_replicas_run_fires_once_per_period() {
    let r = Replicas::start(2).await;
    let (task, _) = r.task(0).await;
    let (s, f) = r
        .post(
            1,
            &format!("/v1/tasks/{task}/followups"),
            json!({"schedule": {"every": "PT1S"}, "message": "poll"}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{f}");
    for _ in 0..3 {
        r.advance(Duration::from_millis(1200)).await;
    }
    let store = r.node(0).state.store.clone();
    let events = store
        .read()
        .await
        .unwrap()
        .events_after(0, 100_000, None)
        .await
        .unwrap();
    let fired: Vec<&str> = events
        .iter()
        .filter(|e| e.kind.as_str() == "followup.fired")
        .map(|e| e.data["nominal_at"].as_str().unwrap())
        .collect();
    let unique: BTreeSet<&str> = fired.iter().copied().collect();
    assert!(fired.len() >= 2, "{fired:?}");
    assert_eq!(unique.len(), fired.len(), "a period fired twice: {fired:?}");
    let messages = events
        .iter()
        .filter(|e| e.kind.as_str() == "messages.appended")
        .flat_map(|e| e.data["messages"].as_array().unwrap().clone())
        .filter(|m| m["role"] == "followup")
        .count();
    assert_eq!(messages, fired.len(), "one message per period");
}

/// A device revoked through one replica loses its stream on the other at once: the
/// revocation comes down the log every replica follows, not at the stream's next look.
#[tokio::test]
async fn a_device_revoked_through_one_replica_loses_its_stream_on_the_other_at_once() {
    let r = Replicas::start(2).await;
    let d = r.pair(0).await;
    let now = r.node(1).state.now();
    let open = waymark_proto::SteerCommand {
        command_id: waymark_proto::ids::command(),
        task_id: None,
        expected_plan_revision: None,
        operation: Operation::OpenSession,
        scope: vec![],
        args: Value::Null,
        issued_by: "user:alice".into(),
        device_id: d.id.clone(),
        issued_at: now,
        expires_at: now + chrono::Duration::minutes(1),
    };
    let (s, v) = r
        .post(1, &format!("/v1/devices/{}/session", d.id), d.sign(&open))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let token = v["token"].as_str().unwrap().to_owned();
    let res = r
        .http
        .get(format!("{}/v1/events", r.url(1)))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let mut stream = res.bytes_stream().eventsource();
    let (task, _) = r.task(0).await;
    let ev = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("the task's event, written through the other replica")
        .unwrap()
        .unwrap();
    assert!(ev.data.contains(&task), "{}", ev.data);
    let before = r.all_cursors().await.last().copied().unwrap();
    waymark_server::steer::revoke_device(&*r.node(0).state.store, &d.id)
        .await
        .unwrap();
    // What was written before may still arrive; then the stream ends, with nothing after.
    while let Some(ev) = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("the stream on the other replica outlived the revocation")
    {
        let ev = ev.unwrap();
        assert!(
            ev.id.parse::<i64>().unwrap() <= before,
            "an event after the revocation: {ev:?}"
        );
    }
}
