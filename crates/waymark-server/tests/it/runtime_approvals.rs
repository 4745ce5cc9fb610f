//! What runtime adapters rely on: a task per runtime session found again by its key, approvals
//! with the runtime's own choices and a durability class, answers that count only once the
//! runtime acknowledges them, and approvals a runtime dropped closed as expired.

use reqwest::StatusCode;
use serde_json::{Value, json};
use waymark_proto::Operation;

use crate::support::{Harness, assert_problem};

fn session_task(key: &str) -> Value {
    json!({"title": "codex thread", "runtime": "codex", "external_key": key})
}

#[tokio::test]
async fn a_runtime_key_finds_its_task_again_and_keys_are_per_owner_and_runtime() {
    let h = Harness::start().await;
    let (s, first) = h.post(&h.alice, "/v1/tasks", session_task("thr_1")).await;
    assert_eq!(s, StatusCode::CREATED, "{first}");
    assert_eq!(first["external_key"], "thr_1");
    let (s, again) = h.post(&h.alice, "/v1/tasks", session_task("thr_1")).await;
    assert_eq!(s, StatusCode::OK, "{again}");
    assert_eq!(
        again["id"], first["id"],
        "the same runtime key is the same task"
    );

    let (s, other) = h.post(&h.alice, "/v1/tasks", session_task("thr_2")).await;
    assert_eq!(s, StatusCode::CREATED);
    assert_ne!(other["id"], first["id"]);
    let (s, other_runtime) = h
        .post(
            &h.alice,
            "/v1/tasks",
            json!({"title": "t", "runtime": "acp", "external_key": "thr_1"}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    assert_ne!(other_runtime["id"], first["id"]);
    let (s, bobs) = h.post(&h.bob, "/v1/tasks", session_task("thr_1")).await;
    assert_eq!(
        s,
        StatusCode::CREATED,
        "another owner's key is another task"
    );
    assert_ne!(bobs["id"], first["id"]);

    let (s, v) = h
        .post(
            &h.alice,
            "/v1/tasks",
            json!({"title": "t", "external_key": "k"}),
        )
        .await;
    assert_problem(s, &v, 422, "validation_failed");
}

/// An adapter and a person's tool often open the same runtime session at once. Whoever loses
/// the race gets the winner's task — also when both land in one group commit, where the winner's
/// row is not yet visible to readers (this answered `500` once).
#[tokio::test]
async fn many_creates_of_one_runtime_key_at_once_are_one_task() {
    let h = Harness::start().await;
    for round in 0..5 {
        let key = format!("thr_race_{round}");
        let answers = futures::future::join_all(
            (0..16).map(|_| h.post(&h.alice, "/v1/tasks", session_task(&key))),
        )
        .await;
        let mut ids = std::collections::BTreeSet::new();
        let mut created = 0;
        for (s, v) in &answers {
            assert!(
                *s == StatusCode::CREATED || *s == StatusCode::OK,
                "round {round}: {s} {v}"
            );
            created += usize::from(*s == StatusCode::CREATED);
            ids.insert(v["id"].as_str().unwrap().to_owned());
        }
        assert_eq!(ids.len(), 1, "round {round}: one task, got {ids:?}");
        assert_eq!(created, 1, "round {round}: created once");
        let (s, v) = h
            .get(&h.alice, &format!("/v1/tasks/{}", ids.first().unwrap()))
            .await;
        assert_eq!(s, StatusCode::OK, "the answered task is readable: {v}");
    }
}

async fn runtime_approval(
    h: &Harness,
    task: &str,
    att: &str,
    fence: i64,
    extra: Value,
) -> (StatusCode, Value) {
    let mut body = json!({
        "attempt_id": att, "fence": fence,
        "intent": {"tool": "Bash", "command": "npm install"},
        "summary": "Codex wants to run `npm install`",
        "durability": "connection_bound",
        "options": [
            {"id": "approve", "label": "Accept"},
            {"id": "approve_session", "label": "Accept for session"},
            {"id": "deny", "label": "Decline"},
            {"id": "deny_cancel", "label": "Cancel the turn"}
        ]
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    h.post(&h.alice, &format!("/v1/tasks/{task}/approvals"), body)
        .await
}

#[tokio::test]
async fn approval_options_must_keep_approve_and_deny_and_say_which_way_they_go() {
    let h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    let (att, fence) = h.attempt(&h.alice, &task, 60).await;
    let (s, v) = runtime_approval(
        &h,
        &task,
        &att,
        fence,
        json!({"options": [{"id": "approve", "label": "ok"}]}),
    )
    .await;
    assert_problem(s, &v, 422, "validation_failed");
    assert!(
        v["detail"]
            .as_str()
            .unwrap()
            .contains("`approve` and `deny`"),
        "{v}"
    );
    let (s, v) = runtime_approval(&h, &task, &att, fence, json!({"options": [
        {"id": "approve", "label": "ok"}, {"id": "deny", "label": "no"}, {"id": "maybe", "label": "?"}]})).await;
    assert_problem(s, &v, 422, "validation_failed");
    assert!(v["detail"].as_str().unwrap().contains("maybe"), "{v}");
    let (s, v) = runtime_approval(&h, &task, &att, fence, json!({"durability": "forever"})).await;
    assert_eq!(s.as_u16(), 422, "{v}");

    let (s, v) = runtime_approval(&h, &task, &att, fence, json!({})).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(v["durability"], "connection_bound");
    assert_eq!(v["options"].as_array().unwrap().len(), 4);
    assert!(
        v.get("delivery").is_none(),
        "nothing delivered while pending: {v}"
    );
}

#[tokio::test]
async fn an_answer_counts_once_the_runtime_acknowledges_it() {
    let h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    let (att, fence) = h.attempt(&h.alice, &task, 60).await;
    let d = h.pair_device("alice", &["view", "steer", "approve"]).await;
    let (_, a) = runtime_approval(&h, &task, &att, fence, json!({})).await;
    let id = a["id"].as_str().unwrap().to_owned();
    let digest = a["intent_digest"].as_str().unwrap().to_owned();

    // Delivery is only for answered approvals.
    let (s, v) = h
        .post(
            &h.alice,
            &format!("/v1/tasks/{task}/decisions/{id}/delivery"),
            json!({"attempt_id": att, "fence": fence, "state": "acknowledged"}),
        )
        .await;
    assert_problem(s, &v, 409, "decision_closed");

    // A refusing option cannot ride on `approve`.
    let (s, r) = h
        .submit(&d.sign(&d.command(
            &task,
            Some(1),
            Operation::Approve,
            json!({"decision_id": id, "intent_digest": digest, "option": "deny_cancel"}),
        )))
        .await;
    assert_eq!(s.as_u16(), 422, "{r}");
    assert_eq!(r["reason"], "invalid_command", "{r}");

    let (s, r) = h
        .submit(&d.sign(&d.command(
            &task,
            Some(1),
            Operation::Approve,
            json!({"decision_id": id, "intent_digest": digest, "option": "approve_session"}),
        )))
        .await;
    assert_eq!(s, StatusCode::OK, "{r}");
    assert_eq!(r["status"], "applied", "{r}");
    let (_, dec) = h
        .get(&h.alice, &format!("/v1/tasks/{task}/decisions/{id}"))
        .await;
    assert_eq!(dec["status"], "resolved");
    assert_eq!(dec["outcome"]["option"], "approve_session");
    assert_eq!(
        dec["delivery"]["state"], "pending",
        "answered, not yet taken: {dec}"
    );

    // A stale fence cannot report for the runtime.
    let (s, v) = h
        .post(
            &h.alice,
            &format!("/v1/tasks/{task}/decisions/{id}/delivery"),
            json!({"attempt_id": att, "fence": fence - 1, "state": "acknowledged"}),
        )
        .await;
    assert_eq!(s.as_u16(), 409, "{v}");

    let (s, v) = h
        .post(&h.alice, &format!("/v1/tasks/{task}/decisions/{id}/delivery"),
              json!({"attempt_id": att, "fence": fence, "state": "acknowledged", "detail": "serverRequest/resolved"}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["delivery"]["state"], "acknowledged");
    assert_eq!(v["delivery"]["detail"], "serverRequest/resolved");
    // Reported again the same way: idempotent. Another way: refused.
    let (s, _) = h
        .post(
            &h.alice,
            &format!("/v1/tasks/{task}/decisions/{id}/delivery"),
            json!({"attempt_id": att, "fence": fence, "state": "acknowledged"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, v) = h
        .post(
            &h.alice,
            &format!("/v1/tasks/{task}/decisions/{id}/delivery"),
            json!({"attempt_id": att, "fence": fence, "state": "lost"}),
        )
        .await;
    assert_problem(s, &v, 409, "decision_closed");

    // The mirror hears of it as `decision.updated`.
    let mut tx = h.server.state.store.read().await.unwrap();
    let events = tx.events_after(0, 10_000, None).await.unwrap();
    let updated: Vec<_> = events
        .iter()
        .filter(|e| e.kind.as_str() == "decision.updated")
        .collect();
    assert_eq!(updated.len(), 1, "one update for one acknowledgement");
    assert_eq!(updated[0].data["delivery"]["state"], "acknowledged");
}

#[tokio::test]
async fn a_dropped_approval_is_expired_never_approved() {
    let h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    let (att, fence) = h.attempt(&h.alice, &task, 60).await;
    let d = h.pair_device("alice", &["view", "steer", "approve"]).await;
    let (_, a) =
        runtime_approval(&h, &task, &att, fence, json!({"default_option": "approve"})).await;
    let id = a["id"].as_str().unwrap().to_owned();
    let digest = a["intent_digest"].as_str().unwrap().to_owned();
    assert_eq!(h.detail(&task).await["task"]["state"], "waiting_approval");

    let (s, v) = h
        .post(
            &h.alice,
            &format!("/v1/tasks/{task}/decisions/{id}/expire"),
            json!({"attempt_id": att, "fence": fence, "reason": "the Codex connection closed"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["status"], "expired");
    assert_eq!(
        v["outcome"]["option"],
        Value::Null,
        "no option applies, not even the default"
    );
    assert_eq!(v["outcome"]["by"], "runtime");
    assert_eq!(h.detail(&task).await["task"]["state"], "running");

    // The phone's late approval is refused, and expiring twice is refused.
    let (s, r) = h
        .submit(&d.sign(&d.command(
            &task,
            Some(1),
            Operation::Approve,
            json!({"decision_id": id, "intent_digest": digest}),
        )))
        .await;
    assert_eq!(s.as_u16(), 422, "{r}");
    assert_eq!(r["reason"], "decision_closed");
    let (s, v) = h
        .post(
            &h.alice,
            &format!("/v1/tasks/{task}/decisions/{id}/expire"),
            json!({"reason": "again"}),
        )
        .await;
    assert_problem(s, &v, 409, "decision_closed");

    // A plain approval (no durability) is not the runtime's to expire.
    let (s, plain) = h
        .post(
            &h.alice,
            &format!("/v1/tasks/{task}/approvals"),
            json!({"attempt_id": att, "fence": fence, "intent": {"x": 1}, "summary": "ok?"}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, v) = h
        .post(
            &h.alice,
            &format!(
                "/v1/tasks/{task}/decisions/{}/expire",
                plain["id"].as_str().unwrap()
            ),
            json!({"reason": "x"}),
        )
        .await;
    assert_problem(s, &v, 422, "validation_failed");
}
