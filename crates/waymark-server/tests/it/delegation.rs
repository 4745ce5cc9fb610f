//! Delegation (issue 19's second person): alice lets bob read her tasks and answer their
//! decisions with his own signed device commands; pausing and the rest stay with her; ending
//! it ends his view at once, and an escalation step can name him. Consent (issue 32): what
//! alice puts is an offer, which gives bob nothing until he accepts it; he may decline it, or
//! leave it later. The clock is the test's.

use std::time::Duration;

use eventsource_stream::Eventsource;
use futures::StreamExt;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use waymark_proto::Operation;

use crate::escalation::{device_with_push, push_service, take};
use crate::support::{Harness, TestDevice, assert_problem};

/// A pending approval on a new task of alice's: (task, decision id, intent digest), and the
/// attempt holding the lease with its fence.
async fn pending(h: &Harness) -> (String, String, String, (String, i64)) {
    let task = h.create_task(&h.alice).await;
    let (att, fence) = h.attempt(&h.alice, &task, 7200).await;
    let (s, v) = h
        .post(
            &h.alice,
            &format!("/v1/tasks/{task}/approvals"),
            json!({"attempt_id": att, "fence": fence, "intent": {"target": "staging"},
                   "summary": "deploy to staging?", "expires_in_seconds": 7200}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    (
        task,
        v["id"].as_str().unwrap().to_owned(),
        v["intent_digest"].as_str().unwrap().to_owned(),
        (att, fence),
    )
}

async fn approve(h: &Harness, d: &TestDevice, task: &str, id: &str, digest: &str) -> Value {
    let rev = h.revision(task).await;
    h.submit(&d.sign(&d.command(
        task,
        Some(rev),
        Operation::Approve,
        json!({"decision_id": id, "intent_digest": digest}),
    )))
    .await
    .1
}

async fn delegate(h: &Harness, method: Method, token: &str, to: &str) -> (StatusCode, Value) {
    h.send(method, token, &format!("/v1/delegates/{to}"), None)
        .await
}

/// The delegate's answer to `owner`'s offer: `accept` or `decline`.
pub(crate) async fn consent(
    h: &Harness,
    token: &str,
    owner: &str,
    answer: &str,
) -> (StatusCode, Value) {
    h.send(
        Method::POST,
        token,
        &format!("/v1/delegations/{owner}/{answer}"),
        None,
    )
    .await
}

/// Audit entries of one action: their details, oldest first.
async fn audited(h: &Harness, action: &str) -> Vec<(String, String)> {
    let (s, v) = h.get(&h.admin, "/v1/admin/audit?limit=1000").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let mut out: Vec<(String, String)> = v
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["action"] == action)
        .map(|a| {
            (
                a["actor"].as_str().unwrap().to_owned(),
                a["detail"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    out.reverse();
    out
}

#[tokio::test]
async fn a_delegate_reads_and_answers_the_owners_decisions_and_nothing_more() {
    let h = Harness::start().await;
    let alice = h.pair_device("alice", &["view", "steer", "approve"]).await;
    let alice_token = h.session_token(&alice).await;
    let bob = h.pair_device("bob", &["view", "steer", "approve"]).await;
    let bob_token = h.session_token(&bob).await;
    let (task, id, digest, _) = pending(&h).await;

    // Before: alice's task is not bob's to see or answer.
    let (s, v) = h.get(&bob_token, &format!("/v1/tasks/{task}")).await;
    assert_problem(s, &v, 404, "not_found");
    let r = approve(&h, &bob, &task, &id, &digest).await;
    assert_eq!(r["reason"], "not_your_task", "{r}");

    // alice delegates to bob and he accepts; both see it from their side.
    let (s, v) = delegate(&h, Method::PUT, &alice_token, "bob").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["user"], "alice");
    assert_eq!(v["delegates"][0]["user"], "bob", "{v}");
    let (s, v) = consent(&h, &bob_token, "alice", "accept").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v) = delegate(&h, Method::PUT, &alice_token, "bob").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["delegates"][0]["state"], "accepted", "{v}");
    let (s, again) = delegate(&h, Method::PUT, &alice_token, "bob").await;
    assert_eq!(
        (s, &again["delegates"]),
        (StatusCode::OK, &v["delegates"]),
        "a second put changes nothing"
    );
    let (s, v) = h.get(&bob_token, "/v1/delegates").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["delegated_by"][0]["user"], "alice", "{v}");
    assert_eq!(v["delegated_by"][0]["state"], "accepted", "{v}");
    assert_eq!(v["delegates"], json!([]));

    // bob now reads the task and its decision…
    let (s, v) = h.get(&bob_token, &format!("/v1/tasks/{task}")).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, snap) = h.get(&bob_token, "/v1/snapshot").await;
    assert_eq!(s, StatusCode::OK, "{snap}");
    assert!(
        snap.to_string().contains(&task),
        "his snapshot holds alice's task: {snap}"
    );
    // …may not pause it…
    let rev = h.revision(&task).await;
    let (s, r) = h
        .submit(&bob.sign(&bob.command(&task, Some(rev), Operation::Pause, json!({}))))
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{r}");
    assert_eq!(r["reason"], "not_your_task", "{r}");
    assert!(
        r["detail"]
            .as_str()
            .unwrap()
            .contains("stays with the task's owner"),
        "{r}"
    );
    // …and answers its decision with his own signed command.
    let r = approve(&h, &bob, &task, &id, &digest).await;
    assert_eq!(r["status"], "applied", "{r}");
    let (_, d) = h
        .get(&h.alice, &format!("/v1/tasks/{task}/decisions/{id}"))
        .await;
    assert_eq!(d["status"], "resolved", "{d}");

    // His event stream carries alice's task while the delegation holds.
    let res = h
        .http
        .get(h.url("/v1/events"))
        .bearer_auth(&bob_token)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let mut stream = res.bytes_stream().eventsource();
    let mut tasks_seen = Vec::new();
    while !tasks_seen.contains(&task) {
        let ev = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("an event")
            .unwrap()
            .unwrap();
        let data: Value = serde_json::from_str(&ev.data).unwrap();
        tasks_seen.push(data["task_id"].as_str().unwrap_or("").to_owned());
    }

    // alice ends it: bob's reads, answers and stream lose her tasks.
    let (task2, id2, digest2, (att, fence)) = pending(&h).await;
    let (s, v) = delegate(&h, Method::DELETE, &alice_token, "bob").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["delegates"], json!([]));
    let ended_at = h
        .server
        .state
        .store
        .read()
        .await
        .unwrap()
        .max_cursor()
        .await
        .unwrap();
    let (s, v) = h.get(&bob_token, &format!("/v1/tasks/{task2}")).await;
    assert_problem(s, &v, 404, "not_found");
    let r = approve(&h, &bob, &task2, &id2, &digest2).await;
    assert_eq!(r["reason"], "not_your_task", "{r}");
    // The open stream learns it at once, with no clock moved (the change comes down the log
    // to every stream of bob's): an event of alice's is not sent, and bob's own next event is.
    let (s, v) = h.checkpoint(&h.alice, &task2, &att, fence, 1).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let own = h.create_task(&h.bob).await;
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("bob's own event")
            .unwrap()
            .unwrap();
        let data: Value = serde_json::from_str(&ev.data).unwrap();
        let t = data["task_id"].as_str().unwrap_or("");
        assert!(
            data["cursor"].as_i64().unwrap() <= ended_at || t != task2,
            "alice's event after the delegation ended: {data}"
        );
        if t == own {
            break;
        }
    }

    // Bad requests, each said plainly.
    let (s, v) = delegate(&h, Method::DELETE, &alice_token, "bob").await;
    assert_problem(s, &v, 404, "not_found");
    let (s, v) = delegate(&h, Method::PUT, &alice_token, "alice").await;
    assert_problem(s, &v, 422, "validation_failed");
    let (s, v) = delegate(&h, Method::PUT, &alice_token, "nobody").await;
    assert_problem(s, &v, 404, "not_found");
    assert!(v["detail"].as_str().unwrap().contains("nobody"), "{v}");
    let (s, v) = delegate(&h, Method::PUT, &h.alice, "bob").await;
    assert_problem(s, &v, 403, "forbidden");
    // An admin may delegate for a user.
    let (s, v) = h
        .send(Method::PUT, &h.admin, "/v1/delegates/bob?user=alice", None)
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["delegates"][0]["user"], "bob", "{v}");
}

#[tokio::test]
async fn an_escalation_step_reaches_the_second_person_after_the_first_was_silent() {
    let h = Harness::start().await;
    let (base, woken) = push_service().await;
    let (laptop, alice_token) = device_with_push(&h, "alice", &base).await;
    let (phone, bob_token) = device_with_push(&h, "bob", &base).await;
    let policy = json!({"steps": [
        {"after_minutes": 0, "devices": [laptop.id]},
        {"after_minutes": 10, "devices": [], "people": ["bob"]},
        {"after_minutes": 10, "devices": [laptop.id]}
    ]});

    // Only someone alice delegates to can be a step.
    let (s, v) = h
        .send(
            Method::PUT,
            &alice_token,
            "/v1/escalation",
            Some(policy.clone()),
        )
        .await;
    assert_problem(s, &v, 422, "validation_failed");
    assert!(
        v["detail"].as_str().unwrap().contains("/v1/delegates/bob"),
        "{v}"
    );
    let (s, v) = h
        .send(
            Method::PUT,
            &alice_token,
            "/v1/escalation",
            Some(json!({"steps": [{"after_minutes": 0}]})),
        )
        .await;
    assert_problem(s, &v, 422, "validation_failed");
    let (s, v) = delegate(&h, Method::PUT, &alice_token, "bob").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v) = consent(&h, &bob_token, "alice", "accept").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v) = h
        .send(
            Method::PUT,
            &alice_token,
            "/v1/escalation",
            Some(policy.clone()),
        )
        .await;
    assert_eq!((s, &v), (StatusCode::OK, &policy), "{v}");

    // alice's own events never wake bob: a task of hers that needs no decision.
    h.create_task(&h.alice).await;
    let (task, id, _, _) = pending(&h).await;
    let path = format!("/v1/tasks/{task}/decisions/{id}");
    h.advance(Duration::ZERO).await;
    assert_eq!(
        take(&woken),
        vec![laptop.id.clone()],
        "alice's laptop first"
    );
    let (_, d) = h.get(&h.alice, &path).await;
    assert_eq!(d["escalation"]["next"]["devices"], json!(["bob"]), "{d}");

    // Ten silent minutes: bob's phone.
    h.advance(Duration::from_secs(9 * 60)).await;
    assert!(take(&woken).is_empty(), "not before its time");
    h.advance(Duration::from_secs(60)).await;
    assert_eq!(take(&woken), vec![phone.id.clone()], "bob is woken");
    let (_, d) = h.get(&h.alice, &path).await;
    let last = d["escalation"]["notified"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["device_id"], phone.id);
    assert_eq!(last["person"], "bob");
    assert_eq!(last["device_name"], "bob's phone (bob)", "{last}");
    let wire: waymark_proto::Decision = serde_json::from_value(d.clone()).unwrap();
    let line = wire.escalation.as_ref().unwrap().describe();
    assert!(line.contains("bob's phone (bob)"), "{line}");

    // bob opens it on his phone: the escalation says so.
    let (s, r) = h
        .post(
            &bob_token,
            &format!("/v1/devices/{}/receipts", phone.id),
            json!({"receipts": [{"decision_id": id, "step": "opened"}]}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{r}");
    let (_, d) = h.get(&h.alice, &path).await;
    assert_eq!(
        d["escalation"]["stopped"], "opened on bob's phone (bob)",
        "{d}"
    );
    h.advance(Duration::from_secs(15 * 60)).await;
    assert!(take(&woken).is_empty(), "nobody further once bob opened it");

    // Once alice stops delegating, a later decision's step skips him.
    let alice_token = h.session_token(&laptop).await; // the first one has expired
    let (s, _) = delegate(&h, Method::DELETE, &alice_token, "bob").await;
    assert_eq!(s, StatusCode::OK);
    pending(&h).await;
    h.advance(Duration::from_secs(11 * 60)).await;
    assert_eq!(
        take(&woken),
        vec![laptop.id.clone()],
        "only alice's laptop now"
    );
}

/// Finding 13 of issue 32: alice's offer shows bob nothing — not her tasks, not her decisions,
/// not her events — until he accepts; then he reads and answers as a delegate; declining (he
/// leaves) ends it, and an offer declined before it was accepted never showed him anything.
/// A row written before consent existed (no `accepted_at`) is an offer too.
#[tokio::test]
async fn an_offer_shows_the_delegate_nothing_until_he_accepts_and_a_decline_ends_it() {
    let h = Harness::start().await;
    let alice = h.pair_device("alice", &["view", "steer", "approve"]).await;
    let alice_token = h.session_token(&alice).await;
    let bob = h.pair_device("bob", &["view", "steer", "approve"]).await;
    let bob_token = h.session_token(&bob).await;
    let (task, id, digest, _) = pending(&h).await;
    let sees = |v: &Value| v.to_string().contains(&task);

    // A delegation as a server before consent wrote it: an offer, nothing more.
    let n = h
        .raw_sql(
            "INSERT INTO delegations (owner_id, delegate_id, created_at)
             SELECT a.id, b.id, 1 FROM users a, users b WHERE a.name = 'alice' AND b.name = ?",
            "INSERT INTO delegations (owner_id, delegate_id, created_at)
             SELECT a.id, b.id, 1 FROM users a, users b WHERE a.name = 'alice' AND b.name = $1",
            "bob",
        )
        .await;
    assert_eq!(n, 1);
    let (_, v) = h.get(&bob_token, "/v1/delegates").await;
    assert_eq!(v["delegated_by"][0]["user"], "alice", "{v}");
    assert_eq!(v["delegated_by"][0]["state"], "offered", "{v}");
    let (s, v) = delegate(&h, Method::DELETE, &alice_token, "bob").await;
    assert_eq!(s, StatusCode::OK, "{v}");

    // alice offers; both see it waiting for bob.
    let (s, v) = delegate(&h, Method::PUT, &alice_token, "bob").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["delegates"][0]["user"], "bob", "{v}");
    assert_eq!(v["delegates"][0]["state"], "offered", "{v}");
    assert!(v["delegates"][0].get("accepted_at").is_none(), "{v}");
    let (_, v) = h.get(&bob_token, "/v1/delegates").await;
    assert_eq!(v["delegated_by"][0]["state"], "offered", "{v}");

    // Offered only: bob reads nothing of alice's and answers nothing.
    let (s, v) = h.get(&bob_token, &format!("/v1/tasks/{task}")).await;
    assert_problem(s, &v, 404, "not_found");
    let (s, snap) = h.get(&bob_token, "/v1/snapshot").await;
    assert_eq!(s, StatusCode::OK, "{snap}");
    assert!(!sees(&snap), "an offer shows no task: {snap}");
    let (s, v) = h
        .post(
            &bob_token,
            &format!("/v1/devices/{}/receipts", bob.id),
            json!({"receipts": [{"decision_id": id, "step": "opened"}]}),
        )
        .await;
    assert_problem(s, &v, 404, "not_found");
    let r = approve(&h, &bob, &task, &id, &digest).await;
    assert_eq!(r["reason"], "not_your_task", "{r}");
    let res = h
        .http
        .get(h.url("/v1/events"))
        .bearer_auth(&bob_token)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let mut stream = res.bytes_stream().eventsource();
    let own = h.create_task(&h.bob).await;
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("bob's own event")
            .unwrap()
            .unwrap();
        assert!(
            !ev.data.contains(&task),
            "an offer streams no event of alice's: {}",
            ev.data
        );
        if ev.data.contains(&own) {
            break;
        }
    }

    // He accepts (once: again changes nothing); now he reads and answers.
    let (s, v) = consent(&h, &bob_token, "alice", "accept").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["user"], "bob");
    assert_eq!(v["delegated_by"][0]["state"], "accepted", "{v}");
    let accepted_at = v["delegated_by"][0]["accepted_at"].clone();
    assert!(accepted_at.is_string(), "{v}");
    let (s, again) = consent(&h, &bob_token, "alice", "accept").await;
    assert_eq!(
        (s, &again),
        (StatusCode::OK, &v),
        "accepting again changes nothing"
    );
    let (_, v) = h.get(&alice_token, "/v1/delegates").await;
    assert_eq!(v["delegates"][0]["state"], "accepted", "{v}");
    assert_eq!(v["delegates"][0]["accepted_at"], accepted_at, "{v}");
    let (s, v) = h.get(&bob_token, &format!("/v1/tasks/{task}")).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (_, snap) = h.get(&bob_token, "/v1/snapshot").await;
    assert!(sees(&snap), "{snap}");
    let r = approve(&h, &bob, &task, &id, &digest).await;
    assert_eq!(r["status"], "applied", "{r}");
    // The stream he opened before accepting carries alice's tasks from now on, at once.
    let hers = h.create_task(&h.alice).await;
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("alice's new task on bob's open stream")
            .unwrap()
            .unwrap();
        if ev.data.contains(&hers) {
            break;
        }
    }

    // He leaves: gone from both lists, and nothing of alice's is his any more.
    let (task2, id2, digest2, _) = pending(&h).await;
    let (s, v) = consent(&h, &bob_token, "alice", "decline").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["delegated_by"], json!([]), "{v}");
    let (_, v) = h.get(&alice_token, "/v1/delegates").await;
    assert_eq!(v["delegates"], json!([]), "{v}");
    let (s, v) = h.get(&bob_token, &format!("/v1/tasks/{task2}")).await;
    assert_problem(s, &v, 404, "not_found");
    let r = approve(&h, &bob, &task2, &id2, &digest2).await;
    assert_eq!(r["reason"], "not_your_task", "{r}");

    // An offer declined before it was accepted: it showed nothing, and nothing is left.
    let (s, _) = delegate(&h, Method::PUT, &alice_token, "bob").await;
    assert_eq!(s, StatusCode::OK);
    let (s, v) = consent(&h, &bob_token, "alice", "decline").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v) = consent(&h, &bob_token, "alice", "accept").await;
    assert_problem(s, &v, 404, "not_found");
    assert!(
        v["detail"]
            .as_str()
            .unwrap()
            .contains("no offer from `alice`"),
        "{v}"
    );
    let r = approve(&h, &bob, &task2, &id2, &digest2).await;
    assert_eq!(r["reason"], "not_your_task", "{r}");

    // Bad requests, each said plainly; an admin may answer for a user.
    let (s, v) = consent(&h, &bob_token, "alice", "decline").await;
    assert_problem(s, &v, 404, "not_found");
    let (s, v) = consent(&h, &bob_token, "nobody", "accept").await;
    assert_problem(s, &v, 404, "not_found");
    assert!(v["detail"].as_str().unwrap().contains("nobody"), "{v}");
    let (s, v) = consent(&h, &h.bob, "alice", "accept").await;
    assert_problem(s, &v, 403, "forbidden");
    let (s, v) = h
        .send(
            Method::POST,
            &alice_token,
            "/v1/delegations/alice/accept?user=bob",
            None,
        )
        .await;
    assert_problem(s, &v, 403, "forbidden");
    let (s, _) = delegate(&h, Method::PUT, &alice_token, "bob").await;
    assert_eq!(s, StatusCode::OK);
    let (s, v) = h
        .send(
            Method::POST,
            &h.admin,
            "/v1/delegations/alice/accept?user=bob",
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["delegated_by"][0]["state"], "accepted", "{v}");

    // Each answer is in the audit log, with who gave it.
    let device = format!("device:{}", bob.id);
    assert_eq!(
        audited(&h, "delegation.accept").await,
        vec![
            (device.clone(), "alice → bob".to_owned()),
            ("admin".to_owned(), "alice → bob".to_owned())
        ]
    );
    assert_eq!(
        audited(&h, "delegation.decline").await,
        vec![
            (device.clone(), "alice → bob, accepted before".to_owned()),
            (device, "alice → bob".to_owned())
        ]
    );
}

/// A step naming someone offered but not yet accepted skips him, as it skips one removed; once
/// he accepts, the next decision reaches him at his step; once he leaves, it skips him again.
#[tokio::test]
async fn an_escalation_step_skips_a_delegate_until_he_accepts() {
    let h = Harness::start().await;
    let (base, woken) = push_service().await;
    let (laptop, alice_token) = device_with_push(&h, "alice", &base).await;
    let (phone, bob_token) = device_with_push(&h, "bob", &base).await;
    let (s, v) = delegate(&h, Method::PUT, &alice_token, "bob").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    // Named while offered: the policy stands, the step waits for his consent.
    let policy = json!({"steps": [
        {"after_minutes": 0, "devices": [laptop.id]},
        {"after_minutes": 10, "devices": [], "people": ["bob"]}
    ]});
    let (s, v) = h
        .send(Method::PUT, &alice_token, "/v1/escalation", Some(policy))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");

    let (task, id, _, _) = pending(&h).await;
    h.advance(Duration::ZERO).await;
    assert_eq!(take(&woken), vec![laptop.id.clone()]);
    let (_, d) = h
        .get(&h.alice, &format!("/v1/tasks/{task}/decisions/{id}"))
        .await;
    assert_ne!(
        d["escalation"]["next"]["devices"],
        json!(["bob"]),
        "not named as next while offered: {d}"
    );
    h.advance(Duration::from_secs(11 * 60)).await;
    assert!(take(&woken).is_empty(), "an offer reaches nobody");

    let (s, v) = consent(&h, &bob_token, "alice", "accept").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    pending(&h).await;
    h.advance(Duration::ZERO).await;
    assert_eq!(take(&woken), vec![laptop.id.clone()]);
    h.advance(Duration::from_secs(11 * 60)).await;
    assert_eq!(
        take(&woken),
        vec![phone.id.clone()],
        "accepted: bob is woken"
    );

    let bob_token = h.session_token(&phone).await; // the first one has expired
    let (s, v) = consent(&h, &bob_token, "alice", "decline").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    pending(&h).await;
    h.advance(Duration::from_secs(11 * 60)).await;
    assert_eq!(
        take(&woken),
        vec![laptop.id.clone()],
        "left: only alice's laptop"
    );
}
