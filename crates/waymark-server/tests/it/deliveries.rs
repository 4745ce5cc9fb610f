//! Proof of delivery (issue 19): how far a decision has reached each device — pushed (the
//! push service took it), fetched, shown, opened, answered — recorded once per step, shown on
//! the decision and as `decision.delivered` events; and which devices are stale. The clock is
//! the test's.

use std::time::Duration;

use axum::Router;
use axum::http::StatusCode as AxStatus;
use axum::routing::post;
use reqwest::StatusCode;
use serde_json::{Value, json};
use waymark_proto::Operation;
use waymark_server::Config;

use crate::support::{Harness, assert_problem, test_config};

/// A push service that takes every push (UnifiedPush: any 2xx).
async fn push_service() -> String {
    let app = Router::new().route("/push/{name}", post(|| async { AxStatus::CREATED }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

async fn read(h: &Harness, path: &str) -> Value {
    h.get(&h.alice, path).await.1
}

/// `device name: step` for each step recorded, oldest first.
fn steps(d: &Value) -> Vec<String> {
    d["deliveries"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|x| {
                    format!(
                        "{}: {}",
                        x["device_name"].as_str().unwrap(),
                        x["step"].as_str().unwrap()
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_decision_shows_how_far_it_reached_each_device_and_stale_devices_are_shown_stale() {
    // Background passes only when the test moves the clock: the harness's 100 ms timer
    // would otherwise push the new decision before the test reads that nobody has it yet
    // (it did, once in a PostgreSQL run).
    let h = Harness::start_with(Config {
        tick: Duration::from_secs(3600),
        ..test_config()
    })
    .await;
    let base = push_service().await;
    let phone = h.pair_device("alice", &["view", "steer", "approve"]).await;
    let laptop = h.pair_device("alice", &["view"]).await;
    let phone_token = h.session_token(&phone).await;
    let laptop_token = h.session_token(&laptop).await;
    let (s, v) = h
        .post(
            &phone_token,
            &format!("/v1/devices/{}/push", phone.id),
            json!({"kind": "unified_push", "endpoint": format!("{base}/push/phone")}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");

    let task = h.create_task(&h.alice).await;
    let (att, fence) = h.attempt(&h.alice, &task, 600).await;
    let (s, dec) = h
        .post(
            &h.alice,
            &format!("/v1/tasks/{task}/approvals"),
            json!({"attempt_id": att, "fence": fence, "intent": {"target": "staging"}, "summary": "deploy?"}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{dec}");
    let id = dec["id"].as_str().unwrap().to_owned();
    let path = format!("/v1/tasks/{task}/decisions/{id}");
    assert!(
        steps(&read(&h, &path).await).is_empty(),
        "no device has it yet"
    );

    // The push service took the phone's push.
    h.advance(Duration::ZERO).await;
    let d = read(&h, &path).await;
    assert_eq!(steps(&d), ["alice's phone: pushed"]);
    assert!(
        d["deliveries"][0]["detail"]
            .as_str()
            .unwrap()
            .contains("127.0.0.1 accepted the push"),
        "{d}"
    );

    // The devices say how far it reached them; a repeat counts nothing.
    let receipts = |token: &str, device: &str, body: Value| {
        let (token, path) = (token.to_owned(), format!("/v1/devices/{device}/receipts"));
        let h = &h;
        async move { h.post(&token, &path, body).await }
    };
    let (s, r) = receipts(
        &phone_token,
        &phone.id,
        json!({"receipts": [{"decision_id": id, "step": "fetched"}, {"decision_id": id, "step": "shown"}]}),
    )
    .await;
    assert_eq!(
        (s, r["recorded"].as_u64()),
        (StatusCode::OK, Some(2)),
        "{r}"
    );
    let (_, r) = receipts(
        &phone_token,
        &phone.id,
        json!({"receipts": [{"decision_id": id, "step": "shown"}]}),
    )
    .await;
    assert_eq!(r["recorded"], 0, "a step is recorded once: {r}");
    h.advance(Duration::from_secs(60)).await;
    let (_, r) = receipts(
        &laptop_token,
        &laptop.id,
        json!({"receipts": [{"decision_id": id, "step": "opened"}]}),
    )
    .await;
    assert_eq!(r["recorded"], 1, "{r}");
    // Each stage's first time, timed from the decision's opening on the server's clock, is
    // in /metrics (issue 31 §4); the repeated `shown` counted nothing.
    let text = h.metrics().await;
    for line in [
        r#"waymark_approval_stage_seconds_count{stage="pushed"} 1"#,
        r#"waymark_approval_stage_seconds_count{stage="shown"} 1"#,
        r#"waymark_approval_stage_seconds_count{stage="opened"} 1"#,
    ] {
        assert!(text.lines().any(|l| l == line), "{line} not in:\n{text}");
    }
    let opened: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix(r#"waymark_approval_stage_seconds_sum{stage="opened"} "#))
        .and_then(|v| v.parse().ok())
        .expect("the opened stage's sum");
    assert!(
        (60.0..61.0).contains(&opened),
        "opened after {opened} s, not the minute the clock moved"
    );

    // Refused, and nothing recorded: the server's own steps, another device's receipts,
    // another user's decision, too many at once, and a worker's token.
    let bob_task = h.create_task(&h.bob).await;
    let (batt, bfence) = h.attempt(&h.bob, &bob_task, 600).await;
    let (_, bob_dec) = h
        .post(
            &h.bob,
            &format!("/v1/tasks/{bob_task}/approvals"),
            json!({"attempt_id": batt, "fence": bfence, "intent": {"x": 1}, "summary": "bob's"}),
        )
        .await;
    let (s, v) = receipts(
        &phone_token,
        &phone.id,
        json!({"receipts": [{"decision_id": id, "step": "answered"}]}),
    )
    .await;
    assert_problem(s, &v, 422, "validation_failed");
    let (s, v) = receipts(
        &phone_token,
        &laptop.id,
        json!({"receipts": [{"decision_id": id, "step": "opened"}]}),
    )
    .await;
    assert_problem(s, &v, 403, "forbidden");
    let (s, v) = receipts(
        &phone_token,
        &phone.id,
        json!({"receipts": [{"decision_id": id, "step": "opened"}, {"decision_id": bob_dec["id"], "step": "opened"}]}),
    )
    .await;
    assert_problem(s, &v, 404, "not_found");
    let many: Vec<Value> = (0..201)
        .map(|_| json!({"decision_id": id, "step": "opened"}))
        .collect();
    let (s, v) = receipts(&phone_token, &phone.id, json!({ "receipts": many })).await;
    assert_problem(s, &v, 422, "validation_failed");
    let (s, v) = receipts(
        &h.alice,
        &phone.id,
        json!({"receipts": [{"decision_id": id, "step": "opened"}]}),
    )
    .await;
    assert_problem(s, &v, 403, "forbidden");
    let who = |x: &Value| {
        if x["device_id"] == phone.id.as_str() {
            "phone"
        } else {
            "laptop"
        }
    };
    let by_device = |d: &Value| -> Vec<String> {
        d["deliveries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| format!("{}: {}", who(x), x["step"].as_str().unwrap()))
            .collect()
    };
    assert_eq!(
        by_device(&read(&h, &path).await),
        [
            "phone: pushed",
            "phone: fetched",
            "phone: shown",
            "laptop: opened"
        ],
        "the refused receipts recorded nothing"
    );

    // Answered from the phone: its last step, recorded by the server.
    let cmd = phone.command(
        &task,
        Some(h.revision(&task).await),
        Operation::Approve,
        json!({"decision_id": id, "intent_digest": dec["intent_digest"]}),
    );
    let (s, r) = h.submit(&phone.sign(&cmd)).await;
    assert_eq!(
        (s, r["status"].as_str()),
        (StatusCode::OK, Some("applied")),
        "{r}"
    );
    let d = read(&h, &path).await;
    assert_eq!(by_device(&d).last().unwrap(), "phone: answered", "{d}");
    // The task's detail (what a mirror snapshots) carries the same steps.
    let detail = h.detail(&task).await;
    assert_eq!(detail["decisions"][0]["deliveries"], d["deliveries"]);

    // Devices: last heard from; stale after a day without a word, never "connected".
    let (s, list) = h.get(&phone_token, "/v1/devices").await;
    assert_eq!(s, StatusCode::OK, "{list}");
    let list = list.as_array().unwrap().clone();
    assert_eq!(list.len(), 2, "alice's devices only: {list:?}");
    assert!(
        list.iter()
            .all(|x| x["stale"] == false && x["last_seen_at"].is_string())
    );
    h.advance(Duration::from_secs(24 * 3600)).await;
    let fresh = h.session_token(&phone).await;
    let (_, list) = h.get(&fresh, "/v1/devices").await;
    let stale: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["stale"] == true)
        .map(|x| x["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        stale,
        [laptop.id.as_str()],
        "the phone just opened a session: {list}"
    );
    let (s, v) = h.get(&h.alice, "/v1/devices").await;
    assert_problem(s, &v, 403, "forbidden");
}
