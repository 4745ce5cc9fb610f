//! Escalation and quiet hours (issue 19): a user's policy notifies one device first, the next
//! after so many minutes if nobody opened the decision, and holds what can wait during quiet
//! hours; every move is a `decision.escalated` event, and pushes follow the steps. The clock is
//! the test's; the push service is a local one that records who it was asked to wake.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode as AxStatus;
use axum::routing::post;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{Harness, TestDevice, assert_problem};

pub(crate) type Woken = Arc<Mutex<Vec<String>>>;

/// A push service that takes every push and remembers which device's endpoint it was for —
/// pushes that wake someone, that is: a `decision.closed` push only withdraws a notification
/// (`push::a_closed_decision_is_withdrawn_from_the_devices_it_was_pushed_to_and_no_others`).
pub(crate) async fn push_service() -> (String, Woken) {
    let woken: Woken = Arc::default();
    let app = Router::new()
        .route(
            "/push/{name}",
            post(
                |State(w): State<Woken>, Path(name): Path<String>, body: axum::body::Bytes| async move {
                    let kind = serde_json::from_slice::<Value>(&body)
                        .ok()
                        .and_then(|v| v["type"].as_str().map(str::to_owned));
                    if kind.as_deref() != Some("decision.closed") {
                        w.lock().unwrap().push(name);
                    }
                    AxStatus::CREATED
                },
            ),
        )
        .with_state(woken.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), woken)
}

/// A paired device of `user` with a push channel whose endpoint ends in its id.
pub(crate) async fn device_with_push(h: &Harness, user: &str, base: &str) -> (TestDevice, String) {
    let d = h.pair_device(user, &["view", "steer", "approve"]).await;
    let token = h.session_token(&d).await;
    let (s, v) = h
        .post(
            &token,
            &format!("/v1/devices/{}/push", d.id),
            json!({"kind": "unified_push", "endpoint": format!("{base}/push/{}", d.id)}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    (d, token)
}

async fn approval(h: &Harness, task: &str, extra: Value) -> Value {
    let (att, fence) = h.attempt(&h.alice, task, 7200).await;
    let mut body = json!({"attempt_id": att, "fence": fence, "intent": {"target": "staging"},
        "summary": "deploy?", "expires_in_seconds": 7200});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let (s, d) = h
        .post(&h.alice, &format!("/v1/tasks/{task}/approvals"), body)
        .await;
    assert_eq!(s, StatusCode::CREATED, "{d}");
    d
}

pub(crate) fn take(w: &Woken) -> Vec<String> {
    std::mem::take(&mut *w.lock().unwrap())
}

fn notified(d: &Value) -> Vec<String> {
    d["escalation"]["notified"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["device_id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_decision_reaches_the_next_device_only_when_nobody_opened_it_in_time() {
    let h = Harness::start().await;
    let (base, woken) = push_service().await;
    let (laptop, laptop_token) = device_with_push(&h, "alice", &base).await;
    let (phone, phone_token) = device_with_push(&h, "alice", &base).await;
    let (tablet, _) = device_with_push(&h, "alice", &base).await;
    let policy = json!({"steps": [
        {"after_minutes": 0, "devices": [laptop.id]},
        {"after_minutes": 10, "devices": [phone.id]},
        {"after_minutes": 5, "devices": [tablet.id]}
    ]});
    let (s, v) = h
        .send(
            reqwest::Method::PUT,
            &laptop_token,
            "/v1/escalation",
            Some(policy.clone()),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v) = h
        .send(reqwest::Method::GET, &phone_token, "/v1/escalation", None)
        .await;
    assert_eq!((s, v.clone()), (StatusCode::OK, policy), "{v}");

    let task = h.create_task(&h.alice).await;
    let d = approval(&h, &task, json!({})).await;
    let path = format!("/v1/tasks/{task}/decisions/{}", d["id"].as_str().unwrap());
    assert_eq!(
        notified(&d),
        vec![laptop.id.clone()],
        "the laptop first: {d}"
    );
    assert_eq!(d["escalation"]["next"]["step"], 1);
    let wire: waymark_proto::Decision = serde_json::from_value(d.clone()).unwrap();
    let line = wire.escalation.as_ref().unwrap().describe();
    assert!(
        line.starts_with("notified alice's phone · next: alice's phone at "),
        "{line}"
    );
    h.advance(Duration::ZERO).await;
    assert_eq!(
        take(&woken),
        vec![laptop.id.clone()],
        "only the laptop is woken"
    );

    // Nobody opened it for 10 minutes: the phone is next.
    h.advance(Duration::from_secs(9 * 60)).await;
    assert!(take(&woken).is_empty(), "not before its time");
    h.advance(Duration::from_secs(60)).await;
    assert_eq!(take(&woken), vec![phone.id.clone()]);
    let d = h.get(&h.alice, &path).await.1;
    assert_eq!(
        notified(&d),
        vec![laptop.id.clone(), phone.id.clone()],
        "{d}"
    );
    assert_eq!(d["escalation"]["next"]["step"], 2);

    // The phone opens it: nobody further is woken, and the decision says why.
    let (s, r) = h
        .post(
            &phone_token,
            &format!("/v1/devices/{}/receipts", phone.id),
            json!({"receipts": [{"decision_id": d["id"], "step": "opened"}]}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{r}");
    let d = h.get(&h.alice, &path).await.1;
    assert_eq!(d["escalation"]["stopped"], "opened on alice's phone", "{d}");
    assert!(
        d["escalation"].get("next").is_none(),
        "no one is next once it stopped: {d}"
    );
    h.advance(Duration::from_secs(30 * 60)).await;
    assert!(take(&woken).is_empty(), "the tablet is never woken");

    // Every move is on the task's timeline.
    let moves: Vec<_> = h
        .server
        .state
        .store
        .read()
        .await
        .unwrap()
        .events_after(0, 10_000, None)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.task_id == task && e.kind == waymark_proto::EventKind::DecisionEscalated)
        .collect();
    assert_eq!(moves.len(), 2, "the phone's step and the stop: {moves:?}");
}

#[tokio::test]
async fn quiet_hours_hold_what_can_wait_and_let_the_urgent_through() {
    let h = Harness::start().await;
    let (base, woken) = push_service().await;
    let (phone, token) = device_with_push(&h, "alice", &base).await;
    let now = h.server.state.now();
    let hhmm = |t: chrono::DateTime<chrono::Utc>| t.format("%H:%M").to_string();
    let (from, to) = (
        hhmm(now - chrono::Duration::hours(1)),
        hhmm(now + chrono::Duration::hours(2)),
    );
    let (s, v) = h
        .send(
            reqwest::Method::PUT,
            &token,
            "/v1/escalation",
            Some(
                json!({"steps": [{"after_minutes": 0, "devices": [phone.id]}],
            "quiet_hours": {"from": from, "to": to, "time_zone": "UTC"}}),
            ),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");

    let task = h.create_task(&h.alice).await;
    let calm = approval(&h, &task, json!({})).await;
    let other = h.create_task(&h.alice).await;
    assert!(notified(&calm).is_empty(), "held: {calm}");
    let held = calm["escalation"]["held_until"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(held.contains(&format!("T{to}:00")), "{held} vs {to}");
    let risky = approval(&h, &other, json!({"risky": true})).await;
    let third = h.create_task(&h.alice).await;
    assert_eq!(notified(&risky), vec![phone.id.clone()], "risky is urgent");
    let soon = approval(&h, &third, json!({"expires_in_seconds": 1800})).await;
    assert_eq!(
        notified(&soon),
        vec![phone.id.clone()],
        "closes before the quiet hours end: urgent"
    );
    h.advance(Duration::ZERO).await;
    assert_eq!(take(&woken), vec![phone.id.clone(), phone.id.clone()]);

    // The quiet hours end: the held one goes out.
    h.advance(Duration::from_secs(2 * 3600 + 60)).await;
    assert_eq!(take(&woken), vec![phone.id.clone()]);
    let path = format!(
        "/v1/tasks/{task}/decisions/{}",
        calm["id"].as_str().unwrap()
    );
    let d = h.get(&h.alice, &path).await.1;
    assert_eq!(notified(&d), vec![phone.id.clone()], "{d}");
    assert!(d["escalation"]["held_until"].is_null(), "{d}");
}

#[tokio::test]
async fn a_bad_policy_is_refused_with_why_and_changes_nothing() {
    let h = Harness::start().await;
    let phone = h.pair_device("alice", &["view"]).await;
    let token = h.session_token(&phone).await;
    let bobs = h.pair_device("bob", &["view"]).await;
    let (s, v) = h
        .send(reqwest::Method::GET, &token, "/v1/escalation", None)
        .await;
    assert_problem(s, &v, 404, "not_found");
    let step = |devices: Value| json!({"steps": [{"after_minutes": 0, "devices": devices}]});
    for (body, why) in [
        (json!({"steps": []}), "no steps"),
        (step(json!([])), "a step with no device"),
        (step(json!(["dev_nope"])), "no such device"),
        (step(json!([bobs.id])), "another user's device"),
        (step(json!([phone.id, phone.id])), "twice"),
        (
            json!({"steps": [{"after_minutes": 20000, "devices": [phone.id]}]}),
            "more than a week",
        ),
        (
            json!({"steps": [{"after_minutes": 0, "devices": [phone.id]}],
                "quiet_hours": {"from": "25:00", "to": "07:00", "time_zone": "UTC"}}),
            "no such time",
        ),
        (
            json!({"steps": [{"after_minutes": 0, "devices": [phone.id]}],
                "quiet_hours": {"from": "22:00", "to": "07:00", "time_zone": "Mars/Olympus"}}),
            "no such zone",
        ),
        (
            json!({"steps": [{"after_minutes": 0, "devices": [phone.id], "x": 1}]}),
            "unknown field",
        ),
        (
            json!({"steps": [{"after_minutes": 0, "devices": [phone.id]}],
                "reminders": {"every_minutes": 1, "at_most": 3}}),
            "reminders more often than every 5 minutes",
        ),
        (
            json!({"steps": [{"after_minutes": 0, "devices": [phone.id]}],
                "reminders": {"every_minutes": 30, "at_most": 0}}),
            "no reminders at all",
        ),
        (
            json!({"steps": [{"after_minutes": 0, "devices": [phone.id]}],
                "reminders": {"every_minutes": 30, "at_most": 13}}),
            "more than 12 reminders",
        ),
    ] {
        let (s, v) = h
            .send(reqwest::Method::PUT, &token, "/v1/escalation", Some(body))
            .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{why}: {v}");
    }
    let (s, v) = h
        .send(reqwest::Method::GET, &token, "/v1/escalation", None)
        .await;
    assert_problem(s, &v, 404, "not_found");

    // A worker's token may not decide who is woken; a device names no other user.
    let (s, v) = h
        .send(
            reqwest::Method::PUT,
            &h.alice,
            "/v1/escalation",
            Some(step(json!([phone.id]))),
        )
        .await;
    assert_problem(s, &v, 403, "forbidden");
    let (s, v) = h
        .send(
            reqwest::Method::PUT,
            &token,
            "/v1/escalation?user=bob",
            Some(step(json!([phone.id]))),
        )
        .await;
    assert_problem(s, &v, 403, "forbidden");
    // An admin sets and removes alice's.
    let (s, v) = h
        .send(
            reqwest::Method::PUT,
            &h.admin,
            "/v1/escalation?user=alice",
            Some(step(json!([phone.id]))),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, _) = h
        .send(reqwest::Method::DELETE, &token, "/v1/escalation", None)
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, v) = h
        .send(reqwest::Method::DELETE, &token, "/v1/escalation", None)
        .await;
    assert_problem(s, &v, 404, "not_found");

    // A risky approval never defaults to approve: nobody answering must never run it.
    let task = h.create_task(&h.alice).await;
    let (att, fence) = h.attempt(&h.alice, &task, 600).await;
    let (s, v) = h
        .post(
            &h.alice,
            &format!("/v1/tasks/{task}/approvals"),
            json!({"attempt_id": att, "fence": fence, "intent": {"x": 1}, "summary": "drop the table?",
                "risky": true, "default_option": "approve"}),
        )
        .await;
    assert_problem(s, &v, 422, "validation_failed");
}

/// An unanswered decision is reminded as the policy says, and never more often: the devices
/// notified so far, `every_minutes` after the last notification (a step or a reminder), at most
/// `at_most` times — also after one of them opened it (opened is not answered); an answer, and
/// quiet hours, stop them like steps.
#[tokio::test]
async fn an_unanswered_decision_is_reminded_as_the_policy_says_and_never_more_often() {
    let h = Harness::start().await;
    let (base, woken) = push_service().await;
    let (laptop, laptop_token) = device_with_push(&h, "alice", &base).await;
    let (phone, phone_token) = device_with_push(&h, "alice", &base).await;
    let policy = json!({"steps": [
        {"after_minutes": 0, "devices": [laptop.id]},
        {"after_minutes": 10, "devices": [phone.id]}
    ], "reminders": {"every_minutes": 30, "at_most": 2}});
    let (s, v) = h
        .send(
            reqwest::Method::PUT,
            &laptop_token,
            "/v1/escalation",
            Some(policy.clone()),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v, policy, "the reminders are kept as given");

    let task = h.create_task(&h.alice).await;
    let d = approval(&h, &task, json!({})).await;
    let path = format!("/v1/tasks/{task}/decisions/{}", d["id"].as_str().unwrap());
    h.advance(Duration::ZERO).await;
    assert_eq!(take(&woken), vec![laptop.id.clone()]);
    h.advance(Duration::from_secs(10 * 60)).await;
    assert_eq!(take(&woken), vec![phone.id.clone()], "the phone's step");
    // The phone opened it but nobody answers: reminders go on (steps stop).
    let (s, r) = h
        .post(
            &phone_token,
            &format!("/v1/devices/{}/receipts", phone.id),
            json!({"receipts": [{"decision_id": d["id"], "step": "opened"}]}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{r}");
    let d = h.get(&h.alice, &path).await.1;
    let next = d["escalation"]["next_reminder"]
        .as_str()
        .unwrap()
        .to_owned();
    // 30 minutes after the last notification (the phone's, at minute 10), not sooner.
    h.advance(Duration::from_secs(30 * 60 - 1)).await;
    assert!(take(&woken).is_empty(), "not before its time ({next})");
    h.advance(Duration::from_secs(1)).await;
    let mut first = take(&woken);
    first.sort();
    let mut both = vec![laptop.id.clone(), phone.id.clone()];
    both.sort();
    assert_eq!(first, both, "every device notified so far, once each");
    let d = h.get(&h.alice, &path).await.1;
    assert_eq!(d["escalation"]["reminded"], 1, "{d}");
    let wire: waymark_proto::Decision = serde_json::from_value(d.clone()).unwrap();
    let line = wire.escalation.as_ref().unwrap().describe();
    assert!(
        line.contains("reminded 1×") && line.contains("next reminder at"),
        "{line}"
    );
    h.advance(Duration::from_secs(29 * 60)).await;
    assert!(
        take(&woken).is_empty(),
        "never more often than every 30 minutes"
    );
    h.advance(Duration::from_secs(60)).await;
    assert_eq!(take(&woken).len(), 2, "the second reminder");
    h.advance(Duration::from_secs(60 * 60)).await;
    assert!(take(&woken).is_empty(), "at most two");
    let d = h.get(&h.alice, &path).await.1;
    assert_eq!(d["escalation"]["reminded"], 2, "{d}");
    assert!(d["escalation"].get("next_reminder").is_none(), "{d}");

    // A decision answered before its reminder is not reminded.
    let d2 = approval(&h, &task, json!({})).await;
    h.advance(Duration::ZERO).await;
    take(&woken);
    let (s, v) = h
        .post(
            &h.admin,
            &format!("/v1/admin/decisions/{}/resolve", d2["id"].as_str().unwrap()),
            json!({"option": "deny"}),
        )
        .await;
    assert!(s.is_success(), "{s} {v}");
    h.advance(Duration::from_secs(2 * 60 * 60)).await;
    assert!(
        take(&woken).is_empty(),
        "an answered decision is not reminded"
    );
}
