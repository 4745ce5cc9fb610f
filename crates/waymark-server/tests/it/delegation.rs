//! Delegation (issue 19's second person): alice lets bob read her tasks and answer their
//! decisions with his own signed device commands; pausing and the rest stay with her; ending
//! it ends his view at once, and an escalation step can name him. The clock is the test's.

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

    // alice delegates to bob; both see it from their side.
    let (s, v) = delegate(&h, Method::PUT, &alice_token, "bob").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["user"], "alice");
    assert_eq!(v["delegates"][0]["user"], "bob", "{v}");
    let (s, again) = delegate(&h, Method::PUT, &alice_token, "bob").await;
    assert_eq!(
        (s, &again["delegates"]),
        (StatusCode::OK, &v["delegates"]),
        "a second put changes nothing"
    );
    let (s, v) = h.get(&bob_token, "/v1/delegates").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["delegated_by"][0]["user"], "alice", "{v}");
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
    // The open stream re-reads its access within 30 s of the clock: after that, an event of
    // alice's is not sent, and bob's own next event is.
    h.advance(Duration::from_secs(31)).await;
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
