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

/// Hermes denies on its own once its fixed wait passes. The approval says so from the start
/// (the earlier deadline is the runtime's), gives the runtime's adapter a moment to report what
/// Hermes did, then closes it as Hermes decided — never with our default, never left open —
/// and a late answer is refused. The clock is driven.
#[tokio::test]
async fn a_runtime_deadline_before_ours_closes_the_approval_as_the_runtime_decided() {
    let h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    let (att, fence) = h.attempt(&h.alice, &task, 3600).await;
    let d = h.pair_device("alice", &["view", "steer", "approve"]).await;
    let (s, a) = runtime_approval(
        &h,
        &task,
        &att,
        fence,
        json!({
            "expires_in_seconds": 3600,
            "default_option": "approve",
            "runtime_deadline": {"runtime": "Hermes", "in_seconds": 60, "then": "denies"}
        }),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{a}");
    let created = chrono::DateTime::parse_from_rfc3339(a["created_at"].as_str().unwrap()).unwrap();
    let at = |v: &Value| chrono::DateTime::parse_from_rfc3339(v.as_str().unwrap()).unwrap();
    assert_eq!(a["runtime_deadline"]["runtime"], "Hermes");
    assert_eq!(a["runtime_deadline"]["then"], "denies");
    assert_eq!(
        (at(&a["runtime_deadline"]["at"]) - created).num_seconds(),
        60,
        "{a}"
    );
    assert_eq!(
        (at(&a["expires_at"]) - created).num_seconds(),
        65,
        "closed a grace after the runtime's deadline, not after our hour: {a}"
    );
    let wire: waymark_proto::Decision = serde_json::from_value(a.clone()).unwrap();
    let closing = wire.closing();
    assert_eq!(closing.runtime.as_deref(), Some("Hermes"));
    assert_eq!(
        closing.describe(wire.created_at + chrono::Duration::seconds(18)),
        "Hermes will deny in 0:42"
    );
    let id = a["id"].as_str().unwrap().to_owned();
    let digest = a["intent_digest"].as_str().unwrap().to_owned();

    h.advance(std::time::Duration::from_secs(61)).await;
    let open = h
        .get(&h.alice, &format!("/v1/tasks/{task}/decisions/{id}"))
        .await
        .1;
    assert_eq!(
        open["status"], "pending",
        "the adapter reports first: {open}"
    );
    h.advance(std::time::Duration::from_secs(5)).await;
    let closed = h
        .get(&h.alice, &format!("/v1/tasks/{task}/decisions/{id}"))
        .await
        .1;
    assert_eq!(closed["status"], "expired", "{closed}");
    assert_eq!(
        closed["outcome"]["option"],
        Value::Null,
        "not our default `approve`: {closed}"
    );
    assert_eq!(closed["outcome"]["by"], "runtime");
    assert!(
        closed["outcome"]["text"]
            .as_str()
            .unwrap()
            .contains("Hermes denied the call"),
        "{closed}"
    );
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
}

/// Where our expiry comes first, our default applies and the runtime's deadline is only shown.
#[tokio::test]
async fn our_expiry_before_the_runtimes_deadline_applies_our_default() {
    let h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    let (att, fence) = h.attempt(&h.alice, &task, 3600).await;
    let (_, a) = runtime_approval(
        &h,
        &task,
        &att,
        fence,
        json!({
            "expires_in_seconds": 30,
            "runtime_deadline": {"runtime": "OpenClaw", "in_seconds": 120, "then": "denies"}
        }),
    )
    .await;
    let wire: waymark_proto::Decision = serde_json::from_value(a.clone()).unwrap();
    assert_eq!(wire.closing().runtime, None, "ours comes first: {a}");
    assert_eq!(
        wire.closing()
            .describe(wire.created_at + chrono::Duration::seconds(5)),
        "deny applies in 0:25: the call does not run"
    );
    let id = a["id"].as_str().unwrap();
    h.advance(std::time::Duration::from_secs(31)).await;
    let closed = h
        .get(&h.alice, &format!("/v1/tasks/{task}/decisions/{id}"))
        .await
        .1;
    assert_eq!(closed["status"], "expired", "{closed}");
    assert_eq!(closed["outcome"]["option"], "deny");
    assert_eq!(closed["outcome"]["by"], "default");

    for (bad, why) in [
        (
            json!({"runtime": " ", "in_seconds": 5, "then": "denies"}),
            "blank runtime",
        ),
        (
            json!({"runtime": "Hermes", "in_seconds": 99_999_999u64, "then": "denies"}),
            "too far",
        ),
        (
            json!({"runtime": "Hermes", "in_seconds": 5, "then": "approves"}),
            "no such fallback",
        ),
        (
            json!({"runtime": "Hermes", "in_seconds": 5, "then": "denies", "x": 1}),
            "unknown field",
        ),
    ] {
        let (s, v) =
            runtime_approval(&h, &task, &att, fence, json!({"runtime_deadline": bad})).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{why}: {v}");
        assert_problem(s, &v, 422, "validation_failed");
    }
}
