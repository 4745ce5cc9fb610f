//! The companion against a real control plane over real HTTP: sync, restarts, retention,
//! the offline outbox, crash recovery of deliveries, and offline reads.

#![allow(unreachable_pub)]

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{Value, json};
use waymark_companion::{Companion, Error, OutboxStatus, Seen, StageStatus, parse_pairing_link};
use waymark_proto::{DelegationState, Operation};
use waymark_server::{Config, DataDir, Running, TlsFiles};

struct Server {
    dir: tempfile::TempDir,
    addr: SocketAddr,
    running: Option<Running>,
    config: Config,
    worker: String,
    http: reqwest::Client,
}

impl Server {
    async fn start(config: Config) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let running = waymark_server::start(
            &DataDir::new(dir.path()),
            "127.0.0.1:0".parse().unwrap(),
            config.clone(),
        )
        .await
        .unwrap();
        let store = running.state.store.clone();
        waymark_server::admin::add_user(&*store, "alice")
            .await
            .unwrap();
        let (worker, _) =
            waymark_server::admin::create_worker_token(&*store, "agent", Some("alice"))
                .await
                .unwrap();
        Server {
            addr: running.addr,
            dir,
            running: Some(running),
            worker,
            http: trusting(&config),
            config,
        }
    }

    fn url(&self) -> String {
        let scheme = if self.config.tls.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.addr)
    }

    async fn stop(&mut self) {
        if let Some(r) = self.running.take() {
            r.shutdown().await.unwrap();
        }
    }

    async fn restart(&mut self) {
        self.stop().await;
        let mut tries = 0;
        loop {
            match waymark_server::start(
                &DataDir::new(self.dir.path()),
                self.addr,
                self.config.clone(),
            )
            .await
            {
                Ok(r) => {
                    self.running = Some(r);
                    return;
                }
                Err(_) if tries < 50 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("restart: {e}"),
            }
        }
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        let res = self
            .http
            .post(format!("{}{path}", self.url()))
            .bearer_auth(&self.worker)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = res.status();
        let v: Value = res.json().await.unwrap();
        assert!(status.is_success(), "{path}: {status} {v}");
        v
    }

    async fn admin_get(&self, path: &str) -> Value {
        let token = &self.running.as_ref().unwrap().admin_token;
        self.http
            .get(format!("{}{path}", self.url()))
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// A task with an attempt, `n` checkpoints and a pending approval.
    async fn busy_task(&self, title: &str, n: i64) -> (String, String) {
        let t = self.post("/v1/tasks", json!({"title": title, "plan": [{"id": "fix", "title": "Fix"}, {"id": "deploy", "title": "Deploy", "depends_on": ["fix"]}]})).await;
        let task = t["id"].as_str().unwrap().to_owned();
        let a = self
            .post(
                &format!("/v1/tasks/{task}/attempts"),
                json!({"worker": "agent", "lease_seconds": 600}),
            )
            .await;
        let att = a["id"].as_str().unwrap().to_owned();
        for seq in 1..=n {
            self.checkpoint(&task, &att, seq).await;
        }
        (task, att)
    }

    async fn checkpoint(&self, task: &str, att: &str, seq: i64) {
        self.post(&format!("/v1/tasks/{task}/checkpoints"), json!({"attempt_id": att, "fence": 1, "sequence": seq,
            "body": {"reason": "step_completed", "summary": format!("step {seq}"), "completed_steps": [{"step": "fix", "verified": true}]}})).await;
    }

    async fn approval(&self, task: &str, att: &str) -> String {
        let v = self.post(&format!("/v1/tasks/{task}/approvals"), json!({"attempt_id": att, "fence": 1,
            "intent": {"target": "staging", "commit": "abc123"}, "summary": "deploy abc123 to staging?"})).await;
        v["id"].as_str().unwrap().to_owned()
    }

    async fn pairing_code(&self) -> String {
        let store = self.running.as_ref().unwrap().state.store.clone();
        let scopes = vec!["view".to_owned(), "steer".to_owned(), "approve".to_owned()];
        waymark_server::steer::create_pairing(&*store, "alice", &scopes, 600_000)
            .await
            .unwrap()
            .0
    }
}

/// The test's own client: trusts the server's certificate when it serves TLS.
fn trusting(config: &Config) -> reqwest::Client {
    let mut b = reqwest::Client::builder();
    if let Some(tls) = &config.tls {
        let pem = std::fs::read(&tls.cert).unwrap();
        b = b.add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap());
    }
    b.build().unwrap()
}

/// A self-signed certificate for 127.0.0.1, made now, with its fingerprint.
struct Cert {
    _dir: tempfile::TempDir,
    files: TlsFiles,
    fp: String,
}

fn cert() -> Cert {
    let dir = tempfile::tempdir().unwrap();
    let made = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).unwrap();
    let files = TlsFiles {
        cert: dir.path().join("cert.pem"),
        key: dir.path().join("key.pem"),
    };
    std::fs::write(&files.cert, made.cert.pem()).unwrap();
    std::fs::write(&files.key, made.signing_key.serialize_pem()).unwrap();
    Cert {
        fp: waymark_server::tls::fingerprint(made.cert.der()),
        _dir: dir,
        files,
    }
}

/// A companion with its own home and a device key in a key file (the OS keychain has its own
/// test below).
async fn companion(server: &Server) -> (tempfile::TempDir, Companion) {
    let home = tempfile::tempdir().unwrap();
    let c = Companion::open_with_keystore(home.path(), "file-insecure")
        .await
        .unwrap();
    c.pair(&server.url(), &server.pairing_code().await, "test laptop")
        .await
        .unwrap();
    (home, c)
}

async fn wait_for(mut f: impl AsyncFnMut() -> bool, what: &str) {
    for _ in 0..200 {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test]
async fn a_full_sync_mirrors_every_thread_and_answers_offline() {
    let mut s = Server::start(Config::default()).await;
    let mut tasks = Vec::new();
    for i in 0..30 {
        let (task, att) = s.busy_task(&format!("task {i}"), 3).await;
        if i % 3 == 0 {
            s.approval(&task, &att).await;
        }
        tasks.push(task);
    }
    let (_home, c) = companion(&s).await;
    let r = c.sync_once().await.unwrap();
    assert!(r.snapshot);
    let threads = c.mirror().threads().await.unwrap();
    assert_eq!(threads.len(), 30);
    assert!(
        threads[..10].iter().all(|t| t.pending_decisions == 1),
        "threads with decisions come first"
    );
    assert_eq!(c.mirror().inbox().await.unwrap().len(), 10);

    s.stop().await;
    // Offline: every UI query answers from the mirror.
    let threads = c.mirror().threads().await.unwrap();
    assert_eq!(threads.len(), 30);
    let t = c.mirror().thread(&tasks[5]).await.unwrap().unwrap();
    assert_eq!(t.checkpoints.len(), 3);
    assert_eq!(t.stages[0].status, StageStatus::Done);
    assert_eq!(c.mirror().inbox().await.unwrap().len(), 10);
    let err = c.sync_once().await.unwrap_err();
    assert!(
        matches!(err, waymark_companion::Error::Unreachable(_)),
        "{err}"
    );
    assert!(!c.health().borrow().server_reachable);
}

#[tokio::test]
async fn a_server_restart_mid_stream_converges_without_gap_or_duplicate() {
    let mut s = Server::start(Config::default()).await;
    let (task, att) = s.busy_task("long run", 1).await;
    let (_home, c) = companion(&s).await;
    c.sync_once().await.unwrap();
    let c = std::sync::Arc::new(c);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let follower = {
        let c = c.clone();
        tokio::spawn(async move { c.follow(stop_rx, &|_| {}).await })
    };
    for seq in 2..=40 {
        s.checkpoint(&task, &att, seq).await;
    }
    s.restart().await;
    for seq in 41..=80 {
        s.checkpoint(&task, &att, seq).await;
    }
    let head = s.admin_get("/healthz").await["cursor"].as_i64().unwrap();
    wait_for(
        async || c.mirror().cursor().await.unwrap() == Some(head),
        "the mirror to reach the head",
    )
    .await;
    stop_tx.send(true).unwrap();
    follower.await.unwrap().unwrap();
    let t = c.mirror().thread(&task).await.unwrap().unwrap();
    let seqs: Vec<i64> = t.checkpoints.iter().map(|c| c.sequence).collect();
    assert_eq!(seqs, (1..=80).collect::<Vec<_>>());
}

#[tokio::test]
async fn an_expired_cursor_resnapshots_and_leaves_the_outbox_alone() {
    let mut s = Server::start(Config {
        event_retention: 5,
        tick: Duration::from_secs(3600),
        ..Config::default()
    })
    .await;
    let (task, att) = s.busy_task("t", 1).await;
    let (_home, c) = companion(&s).await;
    c.sync_once().await.unwrap();
    // A command queued while offline.
    s.stop().await;
    let err = c
        .command(
            &task,
            Operation::Pause,
            json!({}),
            vec![],
            shown(&c, &task).await,
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("queued"), "{err}");
    assert_eq!(
        c.mirror().outbox(None).await.unwrap()[0].status,
        OutboxStatus::Queued
    );
    s.restart().await;
    for seq in 2..=30 {
        s.checkpoint(&task, &att, seq).await;
    }
    let token = s.running.as_ref().unwrap().admin_token.clone();
    s.http
        .post(format!("{}/v1/admin/events/prune", s.url()))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    let r = c.sync_once().await.unwrap();
    assert!(r.snapshot, "the expired cursor forced a snapshot");
    assert_eq!(
        c.mirror()
            .thread(&task)
            .await
            .unwrap()
            .unwrap()
            .checkpoints
            .len(),
        30
    );
    let outbox = c.mirror().outbox(None).await.unwrap();
    assert_eq!(outbox.len(), 1);
    assert_eq!(outbox[0].status, OutboxStatus::Delivered, "{outbox:?}");
}

#[tokio::test]
async fn offline_an_approve_comes_back_as_a_conflict_and_a_pause_applies_once() {
    let mut s = Server::start(Config::default()).await;
    let (task, att) = s.busy_task("deploy run", 1).await;
    let approval = s.approval(&task, &att).await;
    let (_home, c) = companion(&s).await;
    c.sync_once().await.unwrap();

    s.stop().await;
    assert!(
        c.answer(
            &approval,
            Operation::Approve,
            None,
            None,
            &shown_card(&c, &approval).await
        )
        .await
        .is_err()
    );
    assert!(
        c.command(
            &task,
            Operation::Pause,
            json!({}),
            vec![],
            shown(&c, &task).await
        )
        .await
        .is_err()
    );
    let queued: Vec<OutboxStatus> = c
        .mirror()
        .outbox(None)
        .await
        .unwrap()
        .iter()
        .map(|e| e.status)
        .collect();
    assert_eq!(queued, vec![OutboxStatus::Queued, OutboxStatus::Queued]);

    // Meanwhile another device replans.
    s.restart().await;
    another_device_replans(&s, &task).await;

    let r = c.sync_once().await.unwrap();
    assert_eq!(r.delivered.len(), 2);
    let outbox = c.mirror().outbox(Some(&task)).await.unwrap();
    let approve = outbox
        .iter()
        .find(|e| e.operation == Operation::Approve)
        .unwrap();
    let pause = outbox
        .iter()
        .find(|e| e.operation == Operation::Pause)
        .unwrap();
    assert_eq!(approve.status, OutboxStatus::Conflict, "{approve:?}");
    assert!(
        approve
            .what_changed
            .as_deref()
            .unwrap()
            .contains("revision 2"),
        "{approve:?}"
    );
    assert_eq!(pause.status, OutboxStatus::Delivered, "{pause:?}");
    assert_eq!(pause.result.as_ref().unwrap().based_on_revision, Some(1));
    assert_eq!(pause.result.as_ref().unwrap().plan_revision, Some(2));

    let detail = s.admin_get(&format!("/v1/tasks/{task}")).await;
    assert_eq!(detail["task"]["state"], "paused");
    let ledger = s
        .admin_get(&format!("/v1/admin/tasks/{task}/commands"))
        .await;
    let pauses = ledger
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["operation"] == "pause" && e["status"] == "applied")
        .count();
    assert_eq!(pauses, 1);
    // Nothing was re-signed: the conflict is the person's to decide again.
    assert_eq!(c.mirror().queued().await.unwrap().len(), 0);
}

#[tokio::test]
async fn a_crash_between_sending_and_recording_resends_and_applies_once() {
    let mut s = Server::start(Config::default()).await;
    let (task, _att) = s.busy_task("t", 1).await;
    let (_home, c) = companion(&s).await;
    c.sync_once().await.unwrap();
    s.stop().await;
    let _ = c
        .command(
            &task,
            Operation::Replan,
            json!({"instructions": "smaller"}),
            vec![],
            shown(&c, &task).await,
        )
        .await;
    s.restart().await;
    // The first delivery reached the server, then the process died before recording it.
    let (_, env) = c.mirror().queued().await.unwrap().remove(0);
    let res: Value = s
        .http
        .post(format!("{}/v1/commands", s.url()))
        .json(&env)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(res["status"], "applied");
    // On restart the outbox resends; the server answers duplicate with the first result.
    let delivered = c.deliver_outbox().await.unwrap();
    assert_eq!(delivered.len(), 1);
    assert_eq!(delivered[0].status, OutboxStatus::Delivered);
    assert_eq!(
        delivered[0].result.as_ref().unwrap().status,
        waymark_proto::CommandStatus::Applied
    );
    let detail = s.admin_get(&format!("/v1/tasks/{task}")).await;
    assert_eq!(detail["task"]["plan_revision"], 2, "applied once");
}

#[tokio::test]
async fn acknowledgements_reach_the_outbox_and_blobs_are_cached_for_offline_review() {
    let mut s = Server::start(Config::default()).await;
    let (task, att) = s.busy_task("t", 1).await;
    let diff = "--- a/cart.py\n+++ b/cart.py\n@@ -1 +1 @@\n-    return sum(items) + 1\n+    return sum(items)\n";
    let token = s.worker.clone();
    let res = s
        .http
        .post(format!(
            "{}/v1/tasks/{task}/artifacts?name=fix.diff",
            s.url()
        ))
        .bearer_auth(&token)
        .header("content-type", "text/x-diff")
        .body(diff)
        .send()
        .await
        .unwrap();
    let art: Value = res.json().await.unwrap();
    s.approval(&task, &att).await;
    let (_home, c) = companion(&s).await;
    let r = c.sync_once().await.unwrap();
    assert_eq!(
        r.prefetched, 1,
        "the artifact of a thread with a pending decision is cached"
    );

    let e = c
        .command(
            &task,
            Operation::Pause,
            json!({}),
            vec![],
            shown(&c, &task).await,
        )
        .await
        .unwrap();
    assert_eq!(e.status, OutboxStatus::Delivered);
    let hb: Value = s
        .post(
            &format!("/v1/attempts/{att}/heartbeat"),
            json!({"fence": 1, "acknowledged": [e.command_id]}),
        )
        .await;
    assert!(hb["commands"].as_array().unwrap().is_empty());
    c.sync_once().await.unwrap();
    let e = c.mirror().outbox(None).await.unwrap().remove(0);
    assert_eq!(
        e.status,
        OutboxStatus::Acknowledged,
        "queued → delivered → acknowledged: {e:?}"
    );
    assert!(e.acknowledged_at.is_some());

    s.stop().await;
    let sha = art["sha256"].as_str().unwrap();
    assert_eq!(c.blob(sha).await.unwrap(), diff.as_bytes());
    let missing = c.blob(&"0".repeat(64)).await.unwrap_err();
    assert!(
        missing.to_string().contains("not in the offline cache"),
        "{missing}"
    );
}

#[tokio::test]
async fn the_home_holds_no_private_key_material_outside_the_key_store() {
    let s = Server::start(Config::default()).await;
    let home = tempfile::tempdir().unwrap();
    // The kernel keyring (a real OS keychain) holds the key here.
    let c = Companion::open_with_keystore(home.path(), "keyutils")
        .await
        .unwrap();
    let keystore = c
        .keystore()
        .expect("the kernel keyring (`keyutils`) must be usable in tests");
    assert_eq!(
        keystore.backend(),
        waymark_companion::Backend::KernelKeyring
    );
    let id = c
        .pair(&s.url(), &s.pairing_code().await, "laptop")
        .await
        .unwrap();
    let key = keystore.load(&id.device_id).unwrap();
    c.sync_once().await.unwrap();
    let seed = key.to_bytes();
    let forms: Vec<Vec<u8>> = vec![
        seed.to_vec(),
        hex_lower(&seed).into_bytes(),
        waymark_proto::signing::b64(&seed).into_bytes(),
    ];
    for entry in walk(home.path()) {
        let bytes = std::fs::read(&entry).unwrap();
        for f in &forms {
            assert!(
                !bytes.windows(f.len()).any(|w| w == f.as_slice()),
                "private key material in {}",
                entry.display()
            );
        }
    }
    keystore.delete(&id.device_id).unwrap();
}

fn hex_lower(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p))
        } else {
            out.push(p)
        }
    }
    out
}

#[tokio::test]
async fn notifications_carry_the_intent_the_diff_stat_and_the_receipts_once() {
    let s = Server::start(Config::default()).await;
    let (task, att) = s.busy_task("fix checkout", 1).await;
    let diff = "--- a/cart.py\n+++ b/cart.py\n@@ -1 +1 @@\n-    return sum(items) + 1\n+    return sum(items)\n";
    s.http
        .post(format!(
            "{}/v1/tasks/{task}/artifacts?name=fix.diff",
            s.url()
        ))
        .bearer_auth(&s.worker)
        .header("content-type", "text/x-diff")
        .body(diff)
        .send()
        .await
        .unwrap();
    s.approval(&task, &att).await;
    let (_home, c) = companion(&s).await;
    c.sync_once().await.unwrap();
    let n = c.notifications(&task, true).await.unwrap();
    assert_eq!(n.len(), 1, "{n:?}");
    assert!(n[0].title.starts_with("Approve?"), "{:?}", n[0]);
    assert!(
        n[0].body.contains("fix.diff (1 file(s), +1 −1)"),
        "{}",
        n[0].body
    );
    assert!(n[0].body.contains("target=staging"), "{}", n[0].body);
    assert_eq!(
        n[0].lock_screen, "Waymark: a decision is waiting",
        "no content on the lock screen"
    );
    assert!(n[0].actions.iter().any(|a| a.id == "approve"));
    assert!(
        c.notifications(&task, true).await.unwrap().is_empty(),
        "shown once"
    );
}

#[test]
fn pairing_links_carry_the_certificate_pin_and_a_malformed_one_is_refused() {
    let hex = "AB".repeat(32);
    let link = parse_pairing_link(&format!(
        "waymark://pair?server=https%3A%2F%2F192.168.1.20%3A7700&code=K7Q2-M9XD&fp=sha256:{hex}"
    ))
    .unwrap();
    assert_eq!(link.server, "https://192.168.1.20:7700");
    assert_eq!(link.code, "K7Q2-M9XD");
    assert_eq!(
        link.pin,
        Some(format!("sha256:{}", hex.to_lowercase())),
        "pins are kept in lower case"
    );
    let plain =
        parse_pairing_link("waymark://pair?server=https%3A%2F%2Fwaymark.example&code=C").unwrap();
    assert_eq!(plain.pin, None);
    // A pin needs TLS, and must be a SHA-256 fingerprint.
    let e = parse_pairing_link(&format!(
        "waymark://pair?server=http%3A%2F%2F10.0.0.2%3A7700&code=C&fp=sha256:{hex}"
    ))
    .unwrap_err();
    assert!(
        matches!(&e, Error::Invalid(m) if m.contains("https://")),
        "{e}"
    );
    let e = parse_pairing_link(
        "waymark://pair?server=https%3A%2F%2F10.0.0.2%3A7700&code=C&fp=sha256:abc",
    )
    .unwrap_err();
    assert!(
        matches!(&e, Error::Invalid(m) if m.contains("64 hex digits")),
        "{e}"
    );
}

#[tokio::test]
async fn a_pinned_server_is_trusted_by_its_certificate_alone_and_another_is_refused() {
    let first = cert();
    let mut s = Server::start(Config {
        tls: Some(first.files.clone()),
        ..Config::default()
    })
    .await;
    let (task, _) = s.busy_task("behind TLS", 2).await;
    let home = tempfile::tempdir().unwrap();
    let c = Companion::open_with_keystore(home.path(), "file-insecure")
        .await
        .unwrap();
    let code = s.pairing_code().await;

    // Unpinned, a self-signed certificate is checked against the public CAs, and refused.
    let e = c.pair(&s.url(), &code, "laptop").await.unwrap_err();
    assert!(matches!(e, Error::Unreachable(_)), "{e}");
    assert!(e.to_string().contains("UnknownIssuer"), "{e}");
    assert!(e.to_string().contains("fp="), "{e}");

    // Pinned to another certificate: refused, before the code is sent.
    let other = cert();
    let e = c
        .pair_pinned(&s.url(), &code, Some(&other.fp), "laptop")
        .await
        .unwrap_err();
    match &e {
        Error::CertificateMismatch { pinned, presented } => {
            assert_eq!(pinned, &other.fp);
            assert_eq!(presented, &first.fp);
        }
        e => panic!("expected a certificate mismatch, got {e:?}"),
    }
    assert!(
        e.to_string().contains(&format!(
            "the server's certificate does not match the one paired ({})",
            other.fp
        )),
        "{e}"
    );
    assert!(c.identity().await.unwrap().is_none());

    // The link with the right pin pairs (the same code: nothing was sent before), and the pin
    // stays with the server in the mirror.
    let server = s.url().replace(':', "%3A").replace('/', "%2F");
    let link = parse_pairing_link(&format!(
        "waymark://pair?server={server}&code={code}&fp={}",
        first.fp
    ))
    .unwrap();
    assert_eq!(link.pin.as_deref(), Some(first.fp.as_str()));
    let id = c.pair_link(&link, "laptop").await.unwrap();
    assert_eq!(id.pin.as_deref(), Some(first.fp.as_str()));
    drop(c);
    let c = Companion::open_with_keystore(home.path(), "file-insecure")
        .await
        .unwrap();
    let kept = c.identity().await.unwrap().unwrap();
    assert_eq!(kept.pin.as_deref(), Some(first.fp.as_str()));
    assert_eq!(kept.server, s.url());
    c.sync_once().await.unwrap();
    assert!(c.mirror().task(&task).await.unwrap().is_some());

    // The server comes back with another certificate (or someone stands in for it): refused.
    s.config.tls = Some(other.files.clone());
    s.restart().await;
    let e = c.sync_once().await.unwrap_err();
    assert!(
        matches!(&e, Error::CertificateMismatch { presented, .. } if *presented == other.fp),
        "{e:?}"
    );
    assert!(
        e.to_string().contains(&format!(
            "the server's certificate does not match the one paired ({})",
            first.fp
        )),
        "{e}"
    );
}

#[tokio::test]
async fn a_runtime_choice_on_an_approval_is_sent_as_approve_or_deny_with_that_option() {
    let s = Server::start(Config::default()).await;
    let (task, att) = s.busy_task("codex thread", 0).await;
    let v = s
        .post(&format!("/v1/tasks/{task}/approvals"), json!({"attempt_id": att, "fence": 1,
            "intent": {"command": "npm install"}, "summary": "run npm install?",
            "durability": "connection_bound",
            "options": [{"id": "approve", "label": "Accept"}, {"id": "approve_session", "label": "Accept for session"},
                        {"id": "deny", "label": "Decline"}, {"id": "deny_cancel", "label": "Cancel the turn"}]}))
        .await;
    let id = v["id"].as_str().unwrap().to_owned();
    let (_home, c) = companion(&s).await;
    c.sync_once().await.unwrap();
    let err = c
        .answer(
            &id,
            Operation::ChooseOption,
            Some("maybe"),
            None,
            &shown_card(&c, &id).await,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Invalid(_)), "{err}");
    // `waymark choose <id> approve_session` on an approval: an approve bound to the digest.
    let sent = c
        .answer(
            &id,
            Operation::ChooseOption,
            Some("approve_session"),
            None,
            &shown_card(&c, &id).await,
        )
        .await
        .unwrap();
    assert_eq!(sent.operation, Operation::Approve);
    c.sync_once().await.unwrap();
    let d = c.mirror().decision(&id).await.unwrap().unwrap();
    let outcome = d.outcome.expect("answered");
    assert_eq!(outcome.option.as_deref(), Some("approve_session"));
    assert_eq!(
        d.delivery.map(|x| x.state),
        Some(waymark_proto::DeliveryState::Pending),
        "answered, and the mirror shows it is not yet taken by the runtime"
    );
}

/// The plan revision a screen rendered from the mirror shows now.
async fn shown(c: &Companion, task: &str) -> i64 {
    c.mirror().task(task).await.unwrap().unwrap().plan_revision
}

/// What a decision's card shows now: its task's revision and its intent digest.
async fn shown_card(c: &Companion, decision: &str) -> Seen {
    let d = c.mirror().decision(decision).await.unwrap().unwrap();
    Seen {
        plan_revision: shown(c, &d.task_id).await,
        intent_digest: d.intent_digest,
    }
}

/// The person reads revision 1 on screen; a background sync moves the mirror to revision 2
/// before they tap. The command is signed with revision 1 and comes back a conflict — never
/// applied at a revision they did not see.
#[tokio::test]
async fn a_sync_between_render_and_tap_gives_a_conflict_not_a_command_at_the_new_revision() {
    let s = Server::start(Config::default()).await;
    let (task, att) = s.busy_task("deploy run", 1).await;
    let approval = s.approval(&task, &att).await;
    let (_home, c) = companion(&s).await;
    c.sync_once().await.unwrap();
    // Render: the steer panel and the approval card.
    let panel = shown(&c, &task).await;
    let card = shown_card(&c, &approval).await;
    assert_eq!(panel, 1);

    // Another device replans; this device's background sync lands before the tap.
    another_device_replans(&s, &task).await;
    c.sync_once().await.unwrap();
    assert_eq!(
        shown(&c, &task).await,
        2,
        "the mirror moved on under the screen"
    );

    // The taps, with what the screen showed.
    let replan = c
        .command(
            &task,
            Operation::Replan,
            json!({"instructions": "ship it"}),
            vec![],
            panel,
        )
        .await
        .unwrap();
    assert_eq!(replan.status, OutboxStatus::Conflict, "{replan:?}");
    assert_eq!(replan.based_on_revision, Some(1));
    assert!(
        replan
            .what_changed
            .as_deref()
            .unwrap()
            .contains("revision 2"),
        "the person is told what changed: {replan:?}"
    );
    let approve = c
        .answer(&approval, Operation::Approve, None, None, &card)
        .await
        .unwrap();
    assert_ne!(approve.status, OutboxStatus::Delivered, "{approve:?}");
    assert_eq!(approve.based_on_revision, Some(1));

    // The server applied nothing from this device at revision 2.
    let ledger = s
        .admin_get(&format!("/v1/admin/tasks/{task}/commands"))
        .await;
    let applied: Vec<&str> = ledger
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["status"] == "applied")
        .map(|e| e["operation"].as_str().unwrap())
        .collect();
    assert_eq!(
        applied,
        vec!["replan"],
        "only the other device's replan: {ledger}"
    );
    let detail = s.admin_get(&format!("/v1/tasks/{task}")).await;
    assert_eq!(detail["task"]["plan_revision"], 2);

    // An approval answered without the digest its card showed is refused before signing.
    let err = c
        .answer(
            &approval,
            Operation::Approve,
            None,
            None,
            &Seen::revision(2),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Invalid(_)), "{err}");
}

/// A second device of alice's pairs, syncs and replans `task` at the revision it shows.
async fn another_device_replans(s: &Server, task: &str) {
    let home = tempfile::tempdir().unwrap();
    let other = Companion::open_with_keystore(home.path(), "file-insecure")
        .await
        .unwrap();
    other
        .pair(&s.url(), &s.pairing_code().await, "phone")
        .await
        .unwrap();
    other.sync_once().await.unwrap();
    let e = other
        .command(
            task,
            Operation::Replan,
            json!({"instructions": "report only"}),
            vec![],
            shown(&other, task).await,
        )
        .await
        .unwrap();
    assert_eq!(e.status, OutboxStatus::Delivered);
}

/// Proof of delivery from the companion: a sync that brings a new decision tells the server
/// this device fetched it (once), an opened card says so, and the mirror keeps every step
/// even after a newer version of the decision arrives without them.
#[tokio::test]
async fn a_synced_decision_is_reported_fetched_once_and_the_mirror_keeps_its_deliveries() {
    let s = Server::start(Config::default()).await;
    let (task, att) = s.busy_task("deploy", 1).await;
    let id = s.approval(&task, &att).await;
    let (_home, c) = companion(&s).await;
    c.sync_once().await.unwrap();
    let me = c.identity().await.unwrap().unwrap().device_id;
    let server_steps = || async {
        let d: Value = s
            .http
            .get(format!("{}/v1/tasks/{task}/decisions/{id}", s.url()))
            .bearer_auth(&s.worker)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        d["deliveries"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|x| {
                (
                    x["device_id"].as_str().unwrap().to_owned(),
                    x["step"].as_str().unwrap().to_owned(),
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(server_steps().await, [(me.clone(), "fetched".to_owned())]);
    // The next sync brings the `decision.delivered` event back into the mirror, and reports
    // nothing again.
    c.sync_once().await.unwrap();
    let d = c.mirror().decision(&id).await.unwrap().unwrap();
    assert_eq!(d.deliveries.len(), 1, "{:?}", d.deliveries);
    assert_eq!(d.deliveries[0].device_name, "test laptop");
    assert_eq!(
        c.report_receipts(
            std::slice::from_ref(&id),
            waymark_proto::DeliveryStep::Fetched
        )
        .await
        .unwrap(),
        0,
        "the mirror shows it fetched already: nothing is sent"
    );
    // The card was opened; then the decision changes (answered), arriving without deliveries.
    assert_eq!(
        c.report_receipts(
            std::slice::from_ref(&id),
            waymark_proto::DeliveryStep::Opened
        )
        .await
        .unwrap(),
        1
    );
    let seen = shown_card(&c, &id).await;
    c.answer(&id, Operation::Approve, None, None, &seen)
        .await
        .unwrap();
    c.sync_once().await.unwrap();
    let d = c.mirror().decision(&id).await.unwrap().unwrap();
    assert!(d.outcome.is_some(), "answered");
    let steps: Vec<String> = d.deliveries.iter().map(|x| x.step.to_string()).collect();
    for want in ["fetched", "opened", "answered"] {
        assert!(steps.iter().any(|s| s == want), "{want} kept: {steps:?}");
    }
    // The server lists this device, heard from just now.
    let devices = c.devices().await.unwrap();
    assert_eq!(devices.len(), 1);
    assert!(!devices[0].stale && devices[0].last_seen_at.is_some());
}

/// Under an escalation policy a device raises a decision's notification only once a step has
/// reached it: the phone first; the laptop ten minutes later (the server's clock driven), with
/// the notification saying where the escalation stands. The policy is set and cleared from a
/// device.
#[tokio::test]
async fn a_device_notifies_a_decision_only_once_its_escalation_step_reached_it() {
    let s = Server::start(Config {
        clock: waymark_server::Clock::driven(),
        tick: Duration::from_millis(100),
        ..Config::default()
    })
    .await;
    let (_h1, laptop) = companion(&s).await;
    let (_h2, phone) = companion(&s).await;
    let laptop_id = laptop.identity().await.unwrap().unwrap().device_id;
    let phone_id = phone.identity().await.unwrap().unwrap().device_id;
    assert_eq!(laptop.escalation().await.unwrap(), None);
    let policy = waymark_proto::EscalationPolicy {
        steps: vec![
            waymark_proto::EscalationStep {
                after_minutes: 0,
                devices: vec![phone_id.clone()],
                people: vec![],
            },
            waymark_proto::EscalationStep {
                after_minutes: 10,
                devices: vec![laptop_id.clone()],
                people: vec![],
            },
        ],
        quiet_hours: None,
        reminders: None,
    };
    laptop.set_escalation(Some(&policy)).await.unwrap();
    assert_eq!(phone.escalation().await.unwrap(), Some(policy));

    let (task, att) = s.busy_task("deploy", 1).await;
    s.approval(&task, &att).await;
    phone.sync_once().await.unwrap();
    laptop.sync_once().await.unwrap();
    assert_eq!(phone.notifications(&task, true).await.unwrap().len(), 1);
    assert!(
        laptop.notifications(&task, true).await.unwrap().is_empty(),
        "not the laptop's turn yet"
    );

    s.running
        .as_ref()
        .unwrap()
        .advance(Duration::from_secs(600))
        .await
        .unwrap();
    laptop.sync_once().await.unwrap();
    let n = laptop.notifications(&task, true).await.unwrap();
    assert_eq!(n.len(), 1, "the laptop's step came: {n:?}");
    assert!(
        n[0].body
            .contains("notified test laptop · no one else in line"),
        "{}",
        n[0].body
    );

    assert_eq!(laptop.set_escalation(None).await.unwrap(), None);
    assert_eq!(phone.escalation().await.unwrap(), None);
}

/// The second person (issue 19): alice delegates her decisions to bob and names him in her
/// escalation's second step. Until bob accepts (issue 32) his companion mirrors nothing of
/// hers; once he does, it mirrors her task, notifies him only once his step came (saying whose
/// decision it is), and his signed approve is applied; once alice ends the delegation, his
/// next sync drops nothing he already answered but gets none of hers, and an offer he declines
/// brings nothing either.
#[tokio::test]
async fn a_delegate_is_notified_at_his_step_and_answers_from_his_own_device() {
    let s = Server::start(Config {
        clock: waymark_server::Clock::driven(),
        tick: Duration::from_millis(100),
        ..Config::default()
    })
    .await;
    let store = s.running.as_ref().unwrap().state.store.clone();
    waymark_server::admin::add_user(&*store, "bob")
        .await
        .unwrap();
    let (_h1, alice) = companion(&s).await;
    let (_h2, bob) = {
        let home = tempfile::tempdir().unwrap();
        let c = Companion::open_with_keystore(home.path(), "file-insecure")
            .await
            .unwrap();
        let scopes = vec!["view".to_owned(), "approve".to_owned()];
        let code = waymark_server::steer::create_pairing(&*store, "bob", &scopes, 600_000)
            .await
            .unwrap()
            .0;
        c.pair(&s.url(), &code, "bob's phone").await.unwrap();
        (home, c)
    };
    let alice_id = alice.identity().await.unwrap().unwrap().device_id;

    // Refused until alice delegates; then both see it from their side.
    let policy = waymark_proto::EscalationPolicy {
        steps: vec![
            waymark_proto::EscalationStep {
                after_minutes: 0,
                devices: vec![alice_id.clone()],
                people: vec![],
            },
            waymark_proto::EscalationStep {
                after_minutes: 10,
                devices: vec![],
                people: vec!["bob".into()],
            },
        ],
        quiet_hours: None,
        reminders: None,
    };
    assert!(alice.set_escalation(Some(&policy)).await.is_err());
    let d = alice.set_delegate("bob", true).await.unwrap();
    assert_eq!(d.delegates[0].user, "bob");
    assert_eq!(d.delegates[0].state, DelegationState::Offered);
    assert_eq!(bob.delegates().await.unwrap().delegated_by[0].user, "alice");
    alice.set_escalation(Some(&policy)).await.unwrap();

    // An offer shows bob nothing; once he accepts, his mirror holds what alice had before.
    let (task, att) = s.busy_task("deploy", 1).await;
    let decision = s.approval(&task, &att).await;
    bob.sync_once().await.unwrap();
    assert!(
        bob.mirror().inbox().await.unwrap().is_empty(),
        "offered only"
    );
    let d = bob.accept_delegation("alice").await.unwrap();
    assert_eq!(d.delegated_by[0].state, DelegationState::Accepted);
    assert_eq!(
        alice.delegates().await.unwrap().delegates[0].state,
        DelegationState::Accepted
    );
    let inbox = bob.mirror().inbox().await.unwrap();
    assert_eq!(inbox.len(), 1, "bob mirrors alice's decision");
    assert_eq!(inbox[0].task_owner, "alice");
    assert!(
        bob.notifications(&task, true).await.unwrap().is_empty(),
        "not bob's turn yet"
    );

    s.running
        .as_ref()
        .unwrap()
        .advance(Duration::from_secs(600))
        .await
        .unwrap();
    bob.sync_once().await.unwrap();
    let n = bob.notifications(&task, true).await.unwrap();
    assert_eq!(n.len(), 1, "bob's step came: {n:?}");
    assert!(n[0].body.contains("bob's phone (bob)"), "{}", n[0].body);
    assert!(n[0].title.starts_with("For alice: "), "{}", n[0].title);

    let seen = shown_card(&bob, &decision).await;
    bob.answer(&decision, Operation::Approve, None, None, &seen)
        .await
        .unwrap();
    bob.deliver_outbox().await.unwrap();
    let out = bob.mirror().outbox(Some(&task)).await.unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].status, OutboxStatus::Delivered, "{:?}", out[0]);
    alice.sync_once().await.unwrap();
    let d = alice.mirror().decision(&decision).await.unwrap().unwrap();
    assert_eq!(d.status, waymark_proto::DecisionStatus::Resolved);

    // Ended: bob's next sync brings none of alice's new tasks.
    alice.set_delegate("bob", false).await.unwrap();
    let (later, _) = s.busy_task("later", 1).await;
    bob.sync_once().await.unwrap();
    assert!(bob.mirror().thread(&later).await.unwrap().is_none());

    // Offered again, and declined: nothing of hers comes, and the offer is gone.
    alice.set_delegate("bob", true).await.unwrap();
    let d = bob.decline_delegation("alice").await.unwrap();
    assert!(d.delegated_by.is_empty());
    assert!(alice.delegates().await.unwrap().delegates.is_empty());
    let (declined, _) = s.busy_task("declined", 1).await;
    bob.sync_once().await.unwrap();
    assert!(bob.mirror().thread(&declined).await.unwrap().is_none());
    assert!(
        bob.accept_delegation("alice").await.is_err(),
        "no offer left"
    );
}
