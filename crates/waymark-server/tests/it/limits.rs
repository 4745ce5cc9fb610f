//! Slow clients and stream caps: a client trickling its headers or its body is cut off at the
//! deadline while others are served; event and control streams are capped per credential and
//! in all, and a closed stream frees its slot. Callers not yet known are limited by client
//! address before anything is recorded; what a refusal records is short, and the audit log
//! keeps its retention.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use waymark_server::Config;

use crate::support::{Harness, assert_problem, test_config};

/// Reads until the server closes the connection (or 10 s pass); returns what it said.
async fn read_to_close(mut r: tokio::net::tcp::OwnedReadHalf) -> (String, bool) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let read = async {
        loop {
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    let closed = tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .is_ok();
    (String::from_utf8_lossy(&got).into_owned(), closed)
}

#[tokio::test]
async fn a_client_trickling_its_headers_is_disconnected_at_the_deadline_while_others_are_served() {
    let h = Harness::start_with(Config {
        header_timeout: Duration::from_secs(1),
        ..test_config()
    })
    .await;
    let stream = TcpStream::connect(h.server.addr).await.unwrap();
    let (r, mut w) = stream.into_split();
    let started = Instant::now();
    let closed = tokio::spawn(async move {
        let out = read_to_close(r).await;
        (out, started.elapsed())
    });
    // One byte every 100 ms: the head would take 6 s to arrive.
    let trickle = tokio::spawn(async move {
        let head = format!(
            "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: {}\r\n\r\n",
            "a".repeat(30)
        );
        for b in head.bytes() {
            if w.write_all(&[b]).await.is_err() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    });
    // Meanwhile (the server holds the slow connection: it counts two open, that one and the
    // one asking) a normal request is answered at once.
    let mut asking = TcpStream::connect(h.server.addr).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let said = exchange(&mut asking, "/metrics").await;
        if metric(&said, "waymark_connections_open") >= 2.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the server never counted the slow connection: {said}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(asking);
    let t = Instant::now();
    let (s, v) = h.get(&h.alice, "/v1/snapshot").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());

    let ((said, was_closed), after) = closed.await.unwrap();
    assert!(was_closed, "the slow connection is still open");
    assert!(
        after >= Duration::from_millis(900) && after < Duration::from_secs(4),
        "closed after {after:?}"
    );
    assert!(!said.contains("200 OK"), "{said}");
    trickle.abort();

    // A connection that never says anything is closed at the same deadline.
    let idle = TcpStream::connect(h.server.addr).await.unwrap();
    let (r, _w) = idle.into_split();
    let t = Instant::now();
    let (_, was_closed) = read_to_close(r).await;
    assert!(
        was_closed && t.elapsed() < Duration::from_secs(4),
        "{:?}",
        t.elapsed()
    );
}

#[tokio::test]
async fn a_body_that_does_not_arrive_in_time_is_refused_with_408() {
    let h = Harness::start_with(Config {
        body_timeout: Duration::from_secs(1),
        ..test_config()
    })
    .await;
    let stream = TcpStream::connect(h.server.addr).await.unwrap();
    let (r, mut w) = stream.into_split();
    let body = r#"{"title": "slow", "plan": [{"id": "a", "title": "a"}]}"#;
    let head = format!(
        "POST /v1/tasks HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        h.alice,
        body.len()
    );
    w.write_all(head.as_bytes()).await.unwrap();
    let trickle = tokio::spawn(async move {
        for b in body.bytes() {
            if w.write_all(&[b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let t = Instant::now();
    let (said, was_closed) = read_to_close(r).await;
    trickle.abort();
    assert!(was_closed);
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    assert!(said.starts_with("HTTP/1.1 408"), "{said}");
    assert!(said.contains("application/problem+json"), "{said}");
    assert!(said.contains(r#""code":"request_timeout""#), "{said}");
    // Nothing was written.
    let (s, v) = h.get(&h.admin, "/v1/snapshot").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["tasks"].as_array().unwrap().len(), 0, "{v}");
}

async fn open_events(h: &Harness, token: &str) -> reqwest::Response {
    h.http
        .get(h.url("/v1/events"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
}

async fn problem(res: reqwest::Response) -> (StatusCode, Value) {
    let status = res.status();
    assert_eq!(
        res.headers()["content-type"],
        "application/problem+json",
        "{status}"
    );
    (status, res.json().await.unwrap())
}

#[tokio::test]
async fn streams_are_capped_per_credential_and_in_all_and_a_closed_stream_frees_its_slot() {
    let h = Harness::start_with(Config {
        max_streams_per_credential: 2,
        max_streams: 3,
        keep_alive: Duration::from_millis(100),
        ..test_config()
    })
    .await;
    let task = h.create_task(&h.alice).await;
    let (att, _) = h.attempt(&h.alice, &task, 600).await;

    let a1 = open_events(&h, &h.alice).await;
    let a2 = open_events(&h, &h.alice).await;
    assert_eq!(a1.status(), StatusCode::OK);
    assert_eq!(a2.status(), StatusCode::OK);
    // alice's third stream (an event stream or a control stream alike) is refused…
    let (s, v) = problem(open_events(&h, &h.alice).await).await;
    assert_problem(s, &v, 429, "too_many_streams");
    assert_eq!(v["context"]["limit"], 2);
    let res = h
        .http
        .get(h.url(&format!("/v1/attempts/{att}/control")))
        .bearer_auth(&h.alice)
        .send()
        .await
        .unwrap();
    let (s, v) = problem(res).await;
    assert_problem(s, &v, 429, "too_many_streams");

    // …bob is not held back by alice's share, until the server's total is reached.
    let b1 = open_events(&h, &h.bob).await;
    assert_eq!(b1.status(), StatusCode::OK);
    let (s, v) = problem(open_events(&h, &h.bob).await).await;
    assert_problem(s, &v, 503, "unavailable");
    assert_eq!(v["context"]["limit"], 3);

    // Closing one of alice's streams frees her slot.
    drop(a1);
    let mut reopened = None;
    for _ in 0..100 {
        let res = open_events(&h, &h.alice).await;
        if res.status() == StatusCode::OK {
            reopened = Some(res);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        reopened.is_some(),
        "the closed stream's slot was never freed"
    );
    drop((a2, b1));
}

/// Sends `GET path` on an open connection and reads one whole response (the connection stays
/// open: HTTP/1.1 keep-alive).
async fn exchange(stream: &mut TcpStream, path: &str) -> String {
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let read = async {
        loop {
            let text = String::from_utf8_lossy(&got).into_owned();
            if let Some(end) = text.find("\r\n\r\n") {
                let len = text[..end]
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().parse::<usize>().unwrap())
                    })
                    .unwrap_or(0);
                if got.len() >= end + 4 + len {
                    return text;
                }
            }
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return String::from_utf8_lossy(&got).into_owned(),
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("no response within 10 s")
}

/// The number after `name ` in a Prometheus text exposition.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no `{name}` in\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn past_the_connection_cap_a_new_connection_gets_503_while_open_ones_are_served() {
    let h = Harness::start_with(Config {
        max_connections: 3,
        ..test_config()
    })
    .await;
    // Three connections, each kept open after a request.
    let mut open = Vec::new();
    for _ in 0..3 {
        let mut c = TcpStream::connect(h.server.addr).await.unwrap();
        let said = exchange(&mut c, "/healthz").await;
        assert!(said.starts_with("HTTP/1.1 200"), "{said}");
        open.push(c);
    }

    // The fourth, and a fifth, are refused at once with a problem and `Retry-After`.
    for _ in 0..2 {
        let t = Instant::now();
        let mut c = TcpStream::connect(h.server.addr).await.unwrap();
        let said = exchange(&mut c, "/healthz").await;
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        assert!(said.starts_with("HTTP/1.1 503"), "{said}");
        let lower = said.to_ascii_lowercase();
        assert!(lower.contains("\r\nretry-after: 1\r\n"), "{said}");
        assert!(
            lower.contains("\r\ncontent-type: application/problem+json\r\n"),
            "{said}"
        );
        let body: Value = serde_json::from_str(&said[said.find("\r\n\r\n").unwrap() + 4..])
            .unwrap_or_else(|e| panic!("{e}: {said}"));
        assert_eq!(body["code"], "unavailable", "{body}");
        assert_eq!(body["status"], 503, "{body}");
        assert_eq!(body["context"]["limit"], 3, "{body}");
        assert!(
            body["detail"]
                .as_str()
                .unwrap()
                .contains("--max-connections"),
            "{body}"
        );
        // …and closed.
        let mut rest = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut rest))
            .await
            .expect("the refused connection stayed open")
            .unwrap_or(0);
        assert_eq!(n, 0);
    }
    // A real client is told the same.
    let res = reqwest::get(h.url("/healthz")).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.headers()["retry-after"], "1");

    // The open connections are still served.
    for c in &mut open {
        let said = exchange(c, "/metrics").await;
        assert!(said.starts_with("HTTP/1.1 200"), "{said}");
    }
    let said = exchange(&mut open[0], "/metrics").await;
    assert_eq!(metric(&said, "waymark_connections_open"), 3.0, "{said}");
    assert!(
        metric(&said, "waymark_connections_refused_total") >= 3.0,
        "{said}"
    );

    // Closing one frees its slot.
    drop(open.remove(0));
    let mut served = None;
    for _ in 0..100 {
        let mut c = TcpStream::connect(h.server.addr).await.unwrap();
        let said = exchange(&mut c, "/healthz").await;
        if said.starts_with("HTTP/1.1 200") {
            served = Some(c);
            break;
        }
        assert!(said.starts_with("HTTP/1.1 503"), "{said}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        served.is_some(),
        "the closed connection's slot was never freed"
    );
}

/// Counts audit entries of one action, and checks each stayed short.
async fn audited(h: &Harness, action: &str) -> usize {
    let (s, v) = h.get(&h.admin, "/v1/admin/audit?limit=1000").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let entries: Vec<&Value> = v
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["action"] == action)
        .collect();
    for a in &entries {
        let actor = a["actor"].as_str().unwrap().chars().count();
        let detail = a["detail"].as_str().unwrap().chars().count();
        assert!(
            actor <= 121 && detail <= 501,
            "kept as sent: {actor}, {detail}"
        );
    }
    entries.len()
}

#[tokio::test]
async fn an_outsider_is_limited_by_address_before_anything_is_recorded_and_what_is_recorded_is_short()
 {
    let h = Harness::start_with(Config {
        address_rate_per_second: 1,
        address_rate_burst: 5,
        ..test_config()
    })
    .await;
    // A made-up 1 MiB key id: once stored as sent, six of these grew the database 8.8 MB.
    let forged = serde_json::json!({
        "command": {"command_id": "cmd_1", "operation": "pause"},
        "signature": {"alg": "ed25519", "key_id": "x".repeat(1 << 20), "sig": "AAAA"},
    });
    let started = Instant::now();
    let (mut answered, mut limited) = (0, 0);
    for _ in 0..20 {
        let (s, v) = h.submit(&forged).await;
        match s {
            StatusCode::TOO_MANY_REQUESTS => {
                assert_problem(s, &v, 429, "rate_limited");
                limited += 1;
            }
            s => {
                assert!(s.is_client_error(), "{s} {v}");
                answered += 1;
            }
        }
    }
    let refills = started.elapsed().as_secs() as usize + 1;
    assert!(answered >= 5, "the burst is answered: {answered}");
    assert!(
        answered <= 5 + refills,
        "{answered} answered in {refills} s"
    );
    assert_eq!(limited + answered, 20);
    // Each answered refusal is one short entry; a limited request wrote nothing.
    assert_eq!(audited(&h, "command.submit").await, answered);

    // Pairing and opening a session draw on the same address's bucket: still empty.
    let (s, v) = h
        .post(
            "",
            "/v1/devices/pair",
            serde_json::json!({"code": "ABCD-EFGH", "name": "x", "public_key": "AAAA"}),
        )
        .await;
    if s == StatusCode::TOO_MANY_REQUESTS {
        assert_eq!(audited(&h, "device.pair").await, 0);
    } else {
        // A second passed and refilled one token: the next is refused.
        assert_problem(s, &v, 422, "validation_failed");
    }
    let path = format!("/v1/devices/dev_{}/session", "0".repeat(32));
    let mut refused = false;
    for _ in 0..5 {
        let (s, _) = h.post("", &path, forged.clone()).await;
        refused |= s == StatusCode::TOO_MANY_REQUESTS;
    }
    assert!(refused, "sessions are limited by address too");
    // Other callers are not: a worker's own credential answers.
    let (s, _) = h.get(&h.alice, "/v1/snapshot").await;
    assert_eq!(s, StatusCode::OK);
}

#[tokio::test]
async fn commands_forged_in_a_devices_name_do_not_spend_its_rate() {
    let h = Harness::start_with(Config {
        rate_per_second: 1,
        rate_burst: 3,
        ..test_config()
    })
    .await;
    let alice = h.pair_device("alice", &["view", "steer"]).await;
    let task = h.create_task(&h.alice).await;
    let rev = h.revision(&task).await;
    // Signed by another key, in alice's phone's name: refused, and not charged to it.
    let stranger = ed25519_dalek::SigningKey::generate(&mut rand::rngs::OsRng);
    for _ in 0..10 {
        let cmd = alice.command(
            &task,
            Some(rev),
            waymark_proto::Operation::Pause,
            Value::Null,
        );
        let mut env =
            serde_json::to_value(waymark_proto::signing::sign(&cmd, &stranger).unwrap()).unwrap();
        env["signature"]["key_id"] = Value::String(alice.id.clone());
        let (s, v) = h.submit(&env).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
        assert_eq!(v["reason"], "bad_signature", "{v}");
    }
    let cmd = alice.command(
        &task,
        Some(rev),
        waymark_proto::Operation::Pause,
        Value::Null,
    );
    let (s, v) = h.submit(&alice.sign(&cmd)).await;
    assert_eq!(s, StatusCode::OK, "the phone's own command is applied: {v}");
    assert_eq!(v["status"], "applied", "{v}");
    // The phone's own bucket still holds: its own flood is limited.
    let mut limited = false;
    for _ in 0..10 {
        let cmd = alice.command(&task, None, waymark_proto::Operation::Resume, Value::Null);
        let (s, _) = h.submit(&alice.sign(&cmd)).await;
        limited |= s == StatusCode::TOO_MANY_REQUESTS;
    }
    assert!(limited, "ten commands at once exceed 1/s with bursts of 3");
}

#[tokio::test]
async fn the_audit_log_keeps_its_retention_by_age_and_by_count() {
    let h = Harness::start_with(Config {
        audit_retention: Duration::from_secs(3600),
        audit_max_entries: 3,
        ..test_config()
    })
    .await;
    let pair = |code: &str| {
        serde_json::json!({"code": code, "name": "x",
            "public_key": waymark_proto::signing::public_key_b64(
                &ed25519_dalek::SigningKey::generate(&mut rand::rngs::OsRng).verifying_key())})
    };
    for i in 0..6 {
        let (s, v) = h
            .post("", "/v1/devices/pair", pair(&format!("NOPE{i}")))
            .await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{v}");
    }
    assert_eq!(audited(&h, "device.pair").await, 6);
    h.advance(Duration::from_secs(1)).await;
    assert_eq!(audited(&h, "device.pair").await, 3, "the newest 3 are kept");
    h.advance(Duration::from_secs(3601)).await;
    assert_eq!(
        audited(&h, "device.pair").await,
        0,
        "older than the retention"
    );
}
