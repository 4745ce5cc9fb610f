//! Recovery: the lease sweeper, admission checks on resume, reconciliation of effects from
//! what providers say, compensation tasks, and released resources.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{Harness, assert_problem};

async fn checkpoint_with(h: &Harness, task: &str, att: &str, fence: i64, seq: i64, body: Value) {
    let (s, v) = h
        .post(
            &h.alice,
            &format!("/v1/tasks/{task}/checkpoints"),
            json!({"attempt_id": att, "fence": fence, "sequence": seq, "body": body}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
}

async fn start(h: &Harness, task: &str, body: Value) -> (StatusCode, Value) {
    h.post(&h.alice, &format!("/v1/tasks/{task}/attempts"), body)
        .await
}

#[tokio::test]
async fn an_expired_lease_makes_the_task_a_recovery_candidate() {
    let h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    let (_att, _) = h.attempt(&h.alice, &task, 1).await;
    assert_eq!(h.detail(&task).await["task"]["state"], "running");
    h.advance(Duration::from_millis(900)).await;
    assert_eq!(
        h.detail(&task).await["task"]["state"],
        "running",
        "the lease is live"
    );
    h.advance(Duration::from_millis(200)).await;
    assert_eq!(h.detail(&task).await["task"]["state"], "recovery_candidate");
    // A paused task is left alone.
    let other = h.create_task(&h.alice).await;
    h.attempt(&h.alice, &other, 1).await;
    let d = h.pair_device("alice", &["view", "steer"]).await;
    h.submit(&d.sign(&d.command(&other, None, waymark_proto::Operation::Pause, json!({}))))
        .await;
    h.advance(Duration::from_millis(1500)).await;
    assert_eq!(h.detail(&other).await["task"]["state"], "paused");
}

#[tokio::test]
async fn a_resume_with_changed_materials_or_manifest_needs_a_person_who_may_resume_anyway() {
    let h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    let (s, a) = start(&h, &task, json!({"worker": "w1", "lease_seconds": 1, "manifest_digest": "sha256:m1", "materials": {"repo": "demo", "commit": "abc123"}})).await;
    assert_eq!(s, StatusCode::CREATED, "{a}");
    let att = a["id"].as_str().unwrap();
    checkpoint_with(&h, &task, att, 1, 1, json!({"reason": "step_completed", "manifest_digest": "sha256:m1", "materials": {"repo": "demo", "commit": "abc123"}})).await;
    h.advance(Duration::from_millis(1200)).await;

    let (s, v) = start(&h, &task, json!({"worker": "w2", "manifest_digest": "sha256:m2", "materials": {"repo": "demo", "commit": "fff999"}})).await;
    assert_problem(s, &v, 409, "admission_failed");
    let reasons = v["context"]["reasons"].as_array().unwrap();
    assert!(
        reasons
            .iter()
            .any(|r| r.as_str().unwrap().contains("manifest changed")),
        "{v}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.as_str().unwrap().contains("materials changed")
                && r.as_str().unwrap().contains("fff999")),
        "{v}"
    );
    let decision = v["context"]["decision_id"].as_str().unwrap().to_owned();
    let d = h.detail(&task).await;
    assert_eq!(d["task"]["state"], "needs_human");
    let rec = d["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["id"] == decision.as_str())
        .unwrap();
    assert_eq!(rec["kind"], "recovery");
    let opts: Vec<&str> = rec["options"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["id"].as_str().unwrap())
        .collect();
    assert_eq!(opts, vec!["resume_anyway", "replan", "cancel"]);
    assert!(
        rec["options"][0]["gives_up"]
            .as_str()
            .unwrap()
            .contains("materials changed")
    );

    // Trying again does not open a second decision.
    let (_, again) = start(
        &h,
        &task,
        json!({"worker": "w2", "manifest_digest": "sha256:m2"}),
    )
    .await;
    assert_eq!(again["context"]["decision_id"], decision.as_str());

    // The person resumes anyway: the next attempt is admitted, once.
    let (s, v) = h
        .post(
            &h.admin,
            &format!("/v1/admin/decisions/{decision}/resolve"),
            json!({"option": "resume_anyway"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(h.detail(&task).await["task"]["state"], "recovery_candidate");
    let (s, v) = start(
        &h,
        &task,
        json!({"worker": "w2", "manifest_digest": "sha256:m2", "materials": {"commit": "fff999"}}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(v["fence"], 2);
}

#[tokio::test]
async fn a_spent_budget_a_broken_chain_and_a_void_approval_each_stop_a_resume() {
    let h = Harness::start().await;
    let (s, t) = h
        .post(
            &h.alice,
            "/v1/tasks",
            json!({"title": "budgeted", "budget": {"max_tokens": 1000}}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let task = t["id"].as_str().unwrap().to_owned();
    let (att, fence) = h.attempt(&h.alice, &task, 1).await;
    let (_, appr) = h
        .post(&h.alice, &format!("/v1/tasks/{task}/approvals"), json!({"attempt_id": att, "fence": fence, "intent": {"target": "staging"}, "summary": "deploy?"}))
        .await;
    let approval = appr["id"].as_str().unwrap();
    checkpoint_with(&h, &task, &att, fence, 1, json!({"reason": "human_wait", "pending_step": {"step": "deploy", "approval_id": approval}})).await;
    checkpoint_with(&h, &task, &att, fence, 2, json!({"reason": "human_wait", "pending_step": {"step": "deploy", "approval_id": approval}})).await;
    h.post(
        &h.alice,
        &format!("/v1/tasks/{task}/usage"),
        json!({"tokens": 1500}),
    )
    .await;
    // The plan moves on while the worker is gone: the approval becomes void.
    let d = h.pair_device("alice", &["view", "steer"]).await;
    h.submit(&d.sign(&d.command(
        &task,
        Some(1),
        waymark_proto::Operation::Replan,
        json!({"instructions": "smaller"}),
    )))
    .await;
    h.raw_sql(
        "UPDATE checkpoints SET body = json_set(body, '$.summary', 'edited') WHERE task_id = ? AND sequence = 1",
        "UPDATE checkpoints SET body = jsonb_set(body, '{summary}', '\"edited\"') WHERE task_id = $1 AND sequence = 1",
        &task,
    )
    .await;
    h.advance(Duration::from_millis(1200)).await;
    let (s, v) = start(&h, &task, json!({"worker": "w2"})).await;
    assert_problem(s, &v, 409, "admission_failed");
    let reasons: Vec<String> = v["context"]["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_owned())
        .collect();
    assert!(
        reasons.iter().any(|r| r.contains("chain is broken at #1")),
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("budget is spent") && r.contains("1500 of 1000 tokens")),
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.contains(approval) && r.contains("void")),
        "{reasons:?}"
    );
    // Cancelling from the recovery decision ends the task.
    let decision = v["context"]["decision_id"].as_str().unwrap();
    h.post(
        &h.admin,
        &format!("/v1/admin/decisions/{decision}/resolve"),
        json!({"option": "cancel"}),
    )
    .await;
    assert_eq!(h.detail(&task).await["task"]["state"], "cancelled");
}

#[tokio::test]
async fn reconciliation_applies_what_each_provider_says() {
    let h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    let (old, f1) = h.attempt(&h.alice, &task, 1).await;
    let mut effects = Vec::new();
    for key in [
        "not-started",
        "confirmed",
        "in-progress",
        "unknown",
        "compensable",
    ] {
        let (s, v) = h
            .post(&h.alice, &format!("/v1/tasks/{task}/effects"), json!({"attempt_id": old, "fence": f1, "idempotency_key": key, "kind": "deploy", "resource_id": format!("res-{key}"), "intent": {"key": key}}))
            .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        let id = v["effect"]["id"].as_str().unwrap().to_owned();
        h.send(
            reqwest::Method::PATCH,
            &h.alice,
            &format!("/v1/effects/{id}"),
            Some(json!({"attempt_id": old, "fence": f1, "status": "in_progress"})),
        )
        .await;
        effects.push(id);
    }
    // The worker dies mid-effects; a new one resumes and asks each provider.
    h.advance(Duration::from_millis(1200)).await;
    let (new, f2) = h.attempt(&h.alice, &task, 60).await;
    let reports = json!([
        {"effect_id": effects[0], "provider_status": "not_started"},
        {"effect_id": effects[1], "provider_status": "confirmed", "receipt": {"deploy_id": "dep-7"}},
        {"effect_id": effects[2], "provider_status": "in_progress"},
        {"effect_id": effects[3], "provider_status": "unknown", "detail": "the provider timed out"},
        {"effect_id": effects[4], "provider_status": "failed_compensable", "receipt": {"half": true}},
    ]);
    // The old fence cannot reconcile.
    let (s, v) = h
        .post(
            &h.alice,
            &format!("/v1/tasks/{task}/reconciliation"),
            json!({"attempt_id": old, "fence": f1, "reports": reports}),
        )
        .await;
    assert_problem(s, &v, 409, "fenced");
    let (s, v) = h
        .post(
            &h.alice,
            &format!("/v1/tasks/{task}/reconciliation"),
            json!({"attempt_id": new, "fence": f2, "reports": reports}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let actions: Vec<(&str, &str)> = v["actions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["action"].as_str().unwrap(), a["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        actions,
        vec![
            ("continue", "intended"),
            ("recorded", "confirmed"),
            ("wait", "in_progress"),
            ("frozen", "unknown"),
            ("compensate", "failed_compensable")
        ]
    );
    let frozen_decision = v["actions"][3]["decision_id"].as_str().unwrap().to_owned();
    let comp = v["actions"][4]["compensation_task_id"]
        .as_str()
        .unwrap()
        .to_owned();

    let d = h.detail(&task).await;
    let confirmed = d["effects"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == effects[1].as_str())
        .unwrap();
    assert_eq!(confirmed["receipt"], json!({"deploy_id": "dep-7"}));
    assert_eq!(
        d["task"]["state"], "waiting_human",
        "the frozen branch waits for a person"
    );

    // The compensation task stands on its own, with its own approval.
    let c = h.detail(&comp).await;
    assert_eq!(c["task"]["parent_id"], task.as_str());
    assert_eq!(c["task"]["state"], "waiting_approval");
    assert_eq!(c["decisions"][0]["kind"], "approval");
    assert_eq!(
        c["decisions"][0]["intent"]["compensates"]["effect_id"],
        effects[4].as_str()
    );

    // A person settles the unknown one: it happened.
    let (s, v) = h
        .post(
            &h.admin,
            &format!("/v1/admin/decisions/{frozen_decision}/resolve"),
            json!({"option": "mark_confirmed", "text": "saw it in the console"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let d = h.detail(&task).await;
    let settled = d["effects"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == effects[3].as_str())
        .unwrap();
    assert_eq!(settled["status"], "confirmed");
    assert_eq!(settled["receipt"]["confirmed_by"], "admin");
    assert!(settled["flag"].is_null());
    // The confirmed one is never resent: a later report cannot move it.
    let (_, v) = h
        .post(&h.alice, &format!("/v1/tasks/{task}/reconciliation"), json!({"attempt_id": new, "fence": f2, "reports": [{"effect_id": effects[1], "provider_status": "not_started"}]}))
        .await;
    assert_eq!(v["actions"][0]["action"], "recorded");
    assert_eq!(v["actions"][0]["status"], "confirmed");
}

#[tokio::test]
async fn released_resources_are_recorded_even_from_a_revoked_worker() {
    let h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    let (att, fence) = h.attempt(&h.alice, &task, 60).await;
    let d = h.pair_device("alice", &["view", "steer"]).await;
    h.submit(&d.sign(&d.command(&task, Some(1), waymark_proto::Operation::Cancel, json!({}))))
        .await;
    let (s, v) = h
        .post(
            &h.alice,
            &format!("/v1/attempts/{att}/released"),
            json!({"fence": fence, "resources": ["worktree:/tmp/w1", "token:deploy"]}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["released"], json!(["worktree:/tmp/w1", "token:deploy"]));
    let (s, v) = h
        .post(
            &h.alice,
            &format!("/v1/attempts/{att}/released"),
            json!({"fence": fence + 1, "resources": ["x"]}),
        )
        .await;
    assert_problem(s, &v, 409, "fenced");

    let task2 = h.create_task(&h.alice).await;
    let (att2, f2) = h.attempt(&h.alice, &task2, 60).await;
    h.post(
        &h.alice,
        &format!("/v1/attempts/{att2}/finish"),
        json!({"fence": f2, "outcome": "completed", "released": ["worktree:/tmp/w2"]}),
    )
    .await;
    assert_eq!(
        h.detail(&task2).await["attempts"][0]["released"],
        json!(["worktree:/tmp/w2"])
    );
}
