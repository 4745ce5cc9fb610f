use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::json;
use waymark_server::Config;

use crate::support::{Harness, assert_problem, test_config};

#[tokio::test]
async fn a_live_lease_is_exclusive_and_an_expired_one_is_taken_over_with_a_higher_fence() {
    let h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    let (old, f1) = h.attempt(&h.alice, &task, 1).await;
    assert_eq!(f1, 1);

    let (s, v) = h
        .post(
            &h.alice,
            &format!("/v1/tasks/{task}/attempts"),
            json!({"worker": "second"}),
        )
        .await;
    assert_problem(s, &v, 409, "lease_held");
    assert_eq!(v["context"]["attempt_id"], old.as_str());

    h.advance(Duration::from_millis(1200)).await;
    let (new, f2) = h.attempt(&h.alice, &task, 30).await;
    assert_eq!(f2, 2, "takeover gets fence + 1");

    let d = h.detail(&task).await;
    assert_eq!(d["task"]["fence"], 2);
    assert_eq!(d["attempts"][0]["state"], "superseded");
    assert_eq!(d["attempts"][1]["id"], new.as_str());
    assert_eq!(d["task"]["state"], "running");
}

#[tokio::test]
async fn every_fenced_write_of_a_stale_attempt_is_refused_and_audited() {
    let h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    let (old, f1) = h.attempt(&h.alice, &task, 1).await;
    let (s, v) = h.checkpoint(&h.alice, &task, &old, f1, 1).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, eff) = h
        .post(
            &h.alice,
            &format!("/v1/tasks/{task}/effects"),
            json!({"attempt_id": old, "fence": f1, "idempotency_key": "deploy-1", "kind": "deploy",
                   "intent": {"target": "staging"}}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{eff}");
    let effect_id = eff["effect"]["id"].as_str().unwrap().to_owned();

    h.advance(Duration::from_millis(1200)).await;
    // Even before anyone takes over, an expired lease writes nothing.
    let (s, v) = h.checkpoint(&h.alice, &task, &old, f1, 2).await;
    assert_problem(s, &v, 409, "lease_expired");

    let (new, f2) = h.attempt(&h.alice, &task, 30).await;

    let (s, v) = h.checkpoint(&h.alice, &task, &old, f1, 2).await;
    assert_problem(s, &v, 409, "fenced");
    assert_eq!(v["context"]["current_fence"], f2);

    let (s, v) = h
        .send(
            Method::PATCH,
            &h.alice,
            &format!("/v1/effects/{effect_id}"),
            Some(json!({"attempt_id": old, "fence": f1, "status": "confirmed", "receipt": {"id": 1}})),
        )
        .await;
    assert_problem(s, &v, 409, "fenced");

    let (s, v) = h
        .post(
            &h.alice,
            &format!("/v1/tasks/{task}/test-receipts"),
            json!({"attempt_id": old, "fence": f1, "command": "pytest", "exit_code": 0,
                   "junit_xml": "<testsuite name=\"s\"><testcase name=\"t\"/></testsuite>"}),
        )
        .await;
    assert_problem(s, &v, 409, "fenced");

    let (s, v) = h
        .post(
            &h.alice,
            &format!("/v1/attempts/{old}/finish"),
            json!({"fence": f1, "outcome": "completed"}),
        )
        .await;
    assert_problem(s, &v, 409, "fenced");

    // A caller lying about its fence is refused too.
    let (s, v) = h.checkpoint(&h.alice, &task, &new, f1, 2).await;
    assert_problem(s, &v, 409, "fenced");

    // The new attempt writes fine, and nothing of the old one landed.
    let (s, v) = h.checkpoint(&h.alice, &task, &new, f2, 2).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let d = h.detail(&task).await;
    assert_eq!(d["checkpoints"].as_array().unwrap().len(), 2);
    assert_eq!(d["effects"][0]["status"], "intended");
    assert!(d["test_receipts"].as_array().unwrap().is_empty());
    assert_eq!(d["task"]["state"], "running");

    let codes = h.audit_codes(&task).await;
    assert_eq!(
        codes.iter().filter(|c| *c == "fenced").count(),
        5,
        "{codes:?}"
    );
    assert!(codes.contains(&"lease_expired".to_owned()), "{codes:?}");
}

#[tokio::test]
async fn sixteen_writers_race_for_each_sequence_and_exactly_one_wins() {
    let h = std::sync::Arc::new(Harness::start().await);
    let task = h.create_task(&h.alice).await;
    let (att, fence) = h.attempt(&h.alice, &task, 60).await;
    for seq in 1..=25 {
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..16 {
            let (h, task, att) = (h.clone(), task.clone(), att.clone());
            set.spawn(async move { h.checkpoint(&h.alice, &task, &att, fence, seq).await });
        }
        let mut won = 0;
        while let Some(r) = set.join_next().await {
            let (s, v) = r.unwrap();
            match s.as_u16() {
                201 => won += 1,
                409 => {
                    assert_eq!(v["code"], "sequence_conflict", "{v}");
                    assert_eq!(v["context"]["current_sequence"], seq, "{v}");
                }
                other => panic!("unexpected {other}: {v}"),
            }
        }
        assert_eq!(won, 1, "sequence {seq}: {won} writers won");
    }
    let d = h.detail(&task).await;
    let seqs: Vec<i64> = d["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["sequence"].as_i64().unwrap())
        .collect();
    assert_eq!(seqs, (1..=25).collect::<Vec<_>>());
    assert_eq!(d["chain"]["intact"], true, "{}", d["chain"]);
}

#[tokio::test]
async fn effects_are_idempotent_by_key_and_move_only_along_legal_transitions() {
    let h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    let (att, fence) = h.attempt(&h.alice, &task, 60).await;
    let declare = |intent: serde_json::Value| {
        json!({"attempt_id": att, "fence": fence, "idempotency_key": "deploy-staging-abc123",
               "kind": "deploy", "step": "deploy", "intent": intent})
    };
    let path = format!("/v1/tasks/{task}/effects");
    let (s, first) = h
        .post(
            &h.alice,
            &path,
            declare(json!({"target": "staging", "commit": "abc123"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{first}");
    assert_eq!(first["created"], true);
    assert_eq!(first["effect"]["status"], "intended");
    assert!(
        first["effect"]["intent_digest"]
            .as_str()
            .unwrap()
            .starts_with("sha256:")
    );

    // Same key, same body (keys in another order): the same effect.
    let (s, again) = h
        .post(
            &h.alice,
            &path,
            declare(json!({"commit": "abc123", "target": "staging"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{again}");
    assert_eq!(again["created"], false);
    assert_eq!(again["effect"]["id"], first["effect"]["id"]);

    // Same key, different body: refused.
    let (s, v) = h
        .post(
            &h.alice,
            &path,
            declare(json!({"target": "production", "commit": "abc123"})),
        )
        .await;
    assert_problem(s, &v, 422, "idempotency_mismatch");
    assert_eq!(v["context"]["effect_id"], first["effect"]["id"]);

    let id = first["effect"]["id"].as_str().unwrap();
    let patch = |status: &str, receipt: serde_json::Value| json!({"attempt_id": att, "fence": fence, "status": status, "receipt": receipt});
    let epath = format!("/v1/effects/{id}");
    let (s, v) = h
        .send(
            Method::PATCH,
            &h.alice,
            &epath,
            Some(patch("in_progress", json!(null))),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v) = h
        .send(
            Method::PATCH,
            &h.alice,
            &epath,
            Some(patch("unknown", json!(null))),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");

    // The server never resolves `unknown` on its own, whatever time passes (within the lease).
    h.advance(Duration::from_secs(50)).await;
    assert_eq!(h.detail(&task).await["effects"][0]["status"], "unknown");

    let (s, v) = h
        .send(
            Method::PATCH,
            &h.alice,
            &epath,
            Some(patch("confirmed", json!({"deploy_id": "d-1"}))),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let cursor_after_confirm = v["cursor"].as_i64().unwrap();

    // The same receipt again is applied once.
    let (s, v) = h
        .send(
            Method::PATCH,
            &h.alice,
            &epath,
            Some(patch("confirmed", json!({"deploy_id": "d-1"}))),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        v["cursor"].as_i64().unwrap(),
        cursor_after_confirm,
        "a repeat writes no event"
    );

    let (s, v) = h
        .send(
            Method::PATCH,
            &h.alice,
            &epath,
            Some(patch("confirmed", json!({"deploy_id": "d-2"}))),
        )
        .await;
    assert_problem(s, &v, 409, "illegal_transition");
    let (s, v) = h
        .send(
            Method::PATCH,
            &h.alice,
            &epath,
            Some(patch("in_progress", json!(null))),
        )
        .await;
    assert_problem(s, &v, 409, "illegal_transition");

    let d = h.detail(&task).await;
    assert_eq!(d["effects"].as_array().unwrap().len(), 1);
    assert_eq!(d["effects"][0]["receipt"], json!({"deploy_id": "d-1"}));
}

#[tokio::test]
async fn approvals_bind_the_intent_digest_and_long_polls_see_the_outcome() {
    let h = std::sync::Arc::new(Harness::start().await);
    let task = h.create_task(&h.alice).await;
    let (att, fence) = h.attempt(&h.alice, &task, 60).await;
    let intent = json!({"target": "staging", "commit": "abc123", "artifacts": ["sha256:00"]});
    let path = format!("/v1/tasks/{task}/approvals");

    let (s, v) = h
        .post(
            &h.alice,
            &path,
            json!({"attempt_id": att, "fence": fence, "intent": intent,
                                      "intent_digest": "sha256:0000", "summary": "deploy?"}),
        )
        .await;
    assert_problem(s, &v, 422, "validation_failed");

    let digest = waymark_proto::digest::json_digest(&intent).unwrap();
    let (s, appr) = h
        .post(&h.alice, &path, json!({"attempt_id": att, "fence": fence, "intent": intent,
                                      "intent_digest": digest, "summary": "deploy abc123 to staging?",
                                      "step": "deploy", "expires_in_seconds": 600}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{appr}");
    assert_eq!(appr["status"], "pending");
    assert_eq!(appr["intent_digest"], digest.as_str());
    assert_eq!(appr["plan_revision"], 1);
    assert_eq!(appr["default_option"], "deny");
    assert_eq!(h.detail(&task).await["task"]["state"], "waiting_approval");

    let id = appr["id"].as_str().unwrap().to_owned();
    let poll = format!("/v1/tasks/{task}/decisions/{id}?wait=1s");
    let started = std::time::Instant::now();
    let (s, v) = h.get(&h.alice, &poll).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["status"], "pending");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "the long-poll waited"
    );

    let waiter = {
        let h = h.clone();
        let poll = format!("/v1/tasks/{task}/decisions/{id}?wait=30s");
        tokio::spawn(async move { h.get(&h.alice, &poll).await })
    };
    // The answers below come while that long-poll waits.
    h.metric_reaches("waymark_decision_waits", 1.0).await;
    // Workers cannot answer their own approvals.
    let (s, v) = h
        .post(
            &h.alice,
            &format!("/v1/admin/decisions/{id}/resolve"),
            json!({"option": "approve"}),
        )
        .await;
    assert_problem(s, &v, 403, "forbidden");
    let (s, v) = h
        .post(
            &h.admin,
            &format!("/v1/admin/decisions/{id}/resolve"),
            json!({"option": "maybe"}),
        )
        .await;
    assert_problem(s, &v, 422, "validation_failed");
    let (s, v) = h
        .post(
            &h.admin,
            &format!("/v1/admin/decisions/{id}/resolve"),
            json!({"option": "approve"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v) = waiter.await.unwrap();
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["status"], "resolved");
    assert_eq!(v["outcome"]["option"], "approve");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the long-poll returned on the change"
    );
    assert_eq!(h.detail(&task).await["task"]["state"], "running");

    let (s, v) = h
        .post(
            &h.admin,
            &format!("/v1/admin/decisions/{id}/resolve"),
            json!({"option": "deny"}),
        )
        .await;
    assert_problem(s, &v, 409, "decision_closed");
}

#[tokio::test]
async fn an_unanswered_decision_takes_its_stated_default_on_expiry() {
    let h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    let (s, d) = h
        .post(
            &h.alice,
            &format!("/v1/tasks/{task}/decisions"),
            json!({"kind": "budget", "question": "80% of the budget is spent",
                   "options": [
                     {"id": "relevant_tests", "label": "Run only relevant tests", "gives_up": "full-suite coverage"},
                     {"id": "full_suite", "label": "Continue the full suite", "gives_up": "budget: +$2", "cost": "$2"},
                     {"id": "deliver_patch", "label": "Stop and deliver the patch", "gives_up": "unverified tests"}],
                   "default_option": "deliver_patch", "expires_in_seconds": 3600}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{d}");
    assert_eq!(h.detail(&task).await["task"]["state"], "waiting_human");
    let id = d["id"].as_str().unwrap();
    let path = format!("/v1/tasks/{task}/decisions/{id}");
    // The driven clock also runs with real time between advances: a minute of slack either
    // side, so a loaded machine cannot move the expiry across the assertion.
    h.advance(Duration::from_secs(3540)).await;
    assert_eq!(h.get(&h.alice, &path).await.1["status"], "pending");
    h.advance(Duration::from_secs(120)).await;
    let (s, v) = h.get(&h.alice, &path).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["status"], "expired", "{v}");
    assert_eq!(v["outcome"]["option"], "deliver_patch");
    assert_eq!(v["outcome"]["by"], "default");

    let (s, v) = h
        .post(
            &h.alice,
            &format!("/v1/tasks/{task}/decisions"),
            json!({"kind": "budget", "question": "q", "options": [{"id": "a", "label": "A"}]}),
        )
        .await;
    assert_problem(s, &v, 422, "validation_failed");
}

#[tokio::test]
async fn artifacts_are_content_addressed_and_visible_only_to_their_owner() {
    let h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    let diff = "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-bug\n+fix\n";
    let upload = || {
        h.http
            .post(h.url(&format!(
                "/v1/tasks/{task}/artifacts?name=fix.diff&step=fix"
            )))
            .bearer_auth(&h.alice)
            .header("content-type", "text/x-diff")
            .body(diff)
            .send()
    };
    let a: serde_json::Value = upload().await.unwrap().json().await.unwrap();
    let b: serde_json::Value = upload().await.unwrap().json().await.unwrap();
    let sha = a["sha256"].as_str().unwrap();
    assert_eq!(sha, waymark_proto::digest::sha256_hex(diff.as_bytes()));
    assert_eq!(b["sha256"], sha);
    assert_eq!(a["media_type"], "text/x-diff");

    let res = h
        .http
        .get(h.url(&format!("/v1/blobs/{sha}")))
        .bearer_auth(&h.alice)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.text().await.unwrap(), diff);
    let (s, v) = h.get(&h.bob, &format!("/v1/blobs/{sha}")).await;
    assert_problem(s, &v, 404, "not_found");
    let (s, v) = h.get(&h.bob, &format!("/v1/tasks/{task}")).await;
    assert_problem(s, &v, 404, "not_found");
    let (s, v) = h.get(&h.bob, "/v1/snapshot").await;
    assert_eq!(s, StatusCode::OK);
    assert!(
        v["tasks"].as_array().unwrap().is_empty(),
        "bob sees none of alice's tasks"
    );
    let (_, v) = h.get(&h.alice, "/v1/snapshot").await;
    assert_eq!(v["tasks"].as_array().unwrap().len(), 1);
    assert_eq!(v["tasks"][0]["owner"], "alice");
}

#[tokio::test]
async fn messages_usage_and_finish_complete_the_thread() {
    let h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    let (att, fence) = h.attempt(&h.alice, &task, 60).await;
    let (s, v) = h
        .post(
            &h.alice,
            &format!("/v1/tasks/{task}/messages"),
            json!({"attempt_id": att, "fence": fence,
                     "messages": [{"role": "assistant", "text": "reproduced the failure"},
                                  {"role": "assistant", "text": "patched the off-by-one"}]}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(v["messages"][1]["seq"], 2);
    let (s, v) = h
        .post(
            &h.alice,
            &format!("/v1/tasks/{task}/usage"),
            json!({"tokens": 1200, "cost_usd": 0.25, "wall_seconds": 30}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (_, v) = h
        .post(
            &h.alice,
            &format!("/v1/tasks/{task}/usage"),
            json!({"tokens": 800, "cost_usd": 0.5}),
        )
        .await;
    assert_eq!(v["usage"]["tokens"], 2000);
    assert_eq!(v["usage"]["cost_usd"], 0.75);

    let (s, v) = h
        .post(&h.alice, &format!("/v1/attempts/{att}/finish"),
              json!({"fence": fence, "outcome": "partially_delivered", "summary": "patch ready; deploy not approved"}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let d = h.detail(&task).await;
    assert_eq!(d["task"]["state"], "partially_delivered");
    assert_eq!(
        d["task"]["outcome_summary"],
        "patch ready; deploy not approved"
    );
    assert_eq!(d["attempts"][0]["state"], "finished");
    assert_eq!(d["messages"].as_array().unwrap().len(), 2);

    let (s, v) = h.checkpoint(&h.alice, &task, &att, fence, 1).await;
    assert_problem(s, &v, 409, "attempt_closed");
    let (s, v) = h
        .post(
            &h.alice,
            &format!("/v1/tasks/{task}/attempts"),
            json!({"worker": "late"}),
        )
        .await;
    assert_problem(s, &v, 409, "task_terminal");
}

#[tokio::test]
async fn secrets_in_messages_and_checkpoints_are_redacted_before_storage_visibly() {
    let h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    let (att, fence) = h.attempt(&h.alice, &task, 60).await;
    let (s, v) = h
        .post(&h.alice, &format!("/v1/tasks/{task}/messages"),
              json!({"messages": [{"role": "tool", "text": "export GITHUB_TOKEN=ghp_0123456789abcdefghijklmnopqrstuvwxyzAB"}]}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, v) = h
        .post(&h.alice, &format!("/v1/tasks/{task}/checkpoints"),
              json!({"attempt_id": att, "fence": fence, "sequence": 1,
                     "body": {"reason": "step_completed", "summary": "logged in with password=hunter2hunter2"}}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let d = h.detail(&task).await;
    let all = d.to_string();
    assert!(
        !all.contains("ghp_0123") && !all.contains("hunter2"),
        "a secret was stored"
    );
    assert!(
        d["messages"][0]["text"]
            .as_str()
            .unwrap()
            .contains("[REDACTED:github-token]")
    );
    assert!(
        d["checkpoints"][0]["body"]["summary"]
            .as_str()
            .unwrap()
            .contains("[REDACTED:secret]")
    );
    assert_eq!(
        d["chain"]["intact"], true,
        "the chain covers what was stored"
    );
}

#[tokio::test]
async fn an_operators_own_pattern_is_redacted_and_a_kind_turned_off_is_kept() {
    let redaction = waymark_server::Redaction::new(
        &["secret".to_owned()],
        &[("ticket".to_owned(), r"TICKET-[0-9]{3,}".to_owned())],
    )
    .unwrap();
    let h = Harness::start_with(Config {
        redaction,
        ..test_config()
    })
    .await;
    let task = h.create_task(&h.alice).await;
    let (att, fence) = h.attempt(&h.alice, &task, 60).await;
    let (s, v) = h
        .post(&h.alice, &format!("/v1/tasks/{task}/messages"),
              json!({"messages": [{"role": "tool", "text": "closing TICKET-4821 with AKIAABCDEFGHIJKLMNOP"}]}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, v) = h
        .post(&h.alice, &format!("/v1/tasks/{task}/checkpoints"),
              json!({"attempt_id": att, "fence": fence, "sequence": 1,
                     "body": {"reason": "step_completed", "summary": "TICKET-4821: the form's password=placeholder stays"}}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let d = h.detail(&task).await;
    let message = d["messages"][0]["text"].as_str().unwrap();
    assert_eq!(
        message,
        "closing [REDACTED:ticket] with [REDACTED:aws-access-key]"
    );
    let summary = d["checkpoints"][0]["body"]["summary"].as_str().unwrap();
    assert_eq!(
        summary,
        "[REDACTED:ticket]: the form's password=placeholder stays"
    );
}

/// RFC 8785 writes 2^53 + 1 as 2^53: a digest over either would bind both, so an approval of
/// one amount would read as an approval of the other and two effect bodies that differ would
/// share an idempotency key. Such integers are refused where a digest is taken, saying where,
/// and nothing is written.
#[tokio::test]
async fn an_integer_beyond_2_53_is_refused_where_a_digest_would_round_it() {
    let h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    let (att, fence) = h.attempt(&h.alice, &task, 60).await;
    let max = waymark_proto::MAX_SAFE_INTEGER;

    let (s, v) = h
        .post(
            &h.alice,
            &format!("/v1/tasks/{task}/approvals"),
            json!({"attempt_id": att, "fence": fence, "summary": "pay?",
                   "intent": {"action": "pay", "args": {"cents": max + 2}}}),
        )
        .await;
    assert_problem(s, &v, 422, "validation_failed");
    assert_eq!(v["context"]["pointer"], "/intent/args/cents", "{v}");
    let detail = v["detail"].as_str().unwrap();
    assert!(detail.contains(&(max + 2).to_string()), "{detail}");
    assert!(detail.contains("as a string"), "{detail}");

    let (s, v) = h
        .post(
            &h.alice,
            &format!("/v1/tasks/{task}/effects"),
            json!({"attempt_id": att, "fence": fence, "idempotency_key": "pay-1", "kind": "pay",
                   "intent": {"amounts": [1, -(max + 1)]}}),
        )
        .await;
    assert_problem(s, &v, 422, "validation_failed");
    assert_eq!(v["context"]["pointer"], "/intent/amounts/1", "{v}");

    let (s, v) = h
        .post(
            &h.alice,
            &format!("/v1/tasks/{task}/checkpoints"),
            json!({"attempt_id": att, "fence": fence, "sequence": 1,
                   "body": {"reason": "step_completed", "plan_revision": 1,
                            "budget_remaining": {"max_tokens": 1u64 << 60}}}),
        )
        .await;
    assert_problem(s, &v, 422, "validation_failed");
    assert_eq!(
        v["context"]["pointer"], "/body/budget_remaining/max_tokens",
        "{v}"
    );

    let d = h.detail(&task).await;
    assert_eq!(d["decisions"], json!([]), "{d}");
    assert_eq!(d["effects"], json!([]), "{d}");
    assert_eq!(d["checkpoints"], json!([]), "{d}");
    assert_eq!(d["task"]["state"], "running");

    // The largest exact integer is bound exactly: its digest is the one a client computes.
    let intent = json!({"action": "pay", "args": {"cents": max}});
    let (s, appr) = h
        .post(
            &h.alice,
            &format!("/v1/tasks/{task}/approvals"),
            json!({"attempt_id": att, "fence": fence, "summary": "pay?", "intent": intent}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{appr}");
    assert_eq!(
        appr["intent_digest"],
        waymark_proto::digest::json_digest(&intent)
            .unwrap()
            .as_str()
    );
}

#[tokio::test]
async fn a_revoked_token_is_refused_on_every_replica_within_the_cache_time_and_rotation_ends_the_old_admin_token()
 {
    let h = Harness::start().await;
    let store = &*h.server.state.store;
    let (spare, _) = waymark_server::admin::create_worker_token(store, "spare", Some("alice"))
        .await
        .unwrap();
    // alice's worker token has been used (and is kept by the server)…
    let (s, _) = h.get(&h.alice, "/v1/snapshot").await;
    assert_eq!(s, StatusCode::OK);
    let names: Vec<String> = waymark_server::admin::list_tokens(store)
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert!(
        names.contains(&"alice-worker".to_owned()) && names.contains(&"spare".to_owned()),
        "{names:?}"
    );
    // …and is revoked by name; the spare one, never used, by id.
    let revoked = waymark_server::admin::revoke_token(store, "alice-worker")
        .await
        .unwrap();
    assert!(revoked.revoked_at.is_some());
    let spare_id = waymark_server::admin::list_tokens(store)
        .await
        .unwrap()
        .into_iter()
        .find(|t| t.name == "spare")
        .unwrap()
        .id;
    waymark_server::admin::revoke_token(store, &spare_id)
        .await
        .unwrap();
    let (s, _) = h.get(&spare, "/v1/snapshot").await;
    assert_eq!(
        s,
        StatusCode::UNAUTHORIZED,
        "a token not kept is refused at once"
    );
    // Past the time a replica trusts what it read, the used one is refused too.
    h.advance(Duration::from_millis(
        waymark_server::auth::TOKEN_CACHE_MS as u64,
    ))
    .await;
    let (s, v) = h.get(&h.alice, "/v1/snapshot").await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{v}");
    // Revoking again, or what does not exist, says so.
    let again = waymark_server::admin::revoke_token(store, &revoked.id)
        .await
        .unwrap_err();
    assert!(again.to_string().contains("revoked already"), "{again}");
    let none = waymark_server::admin::revoke_token(store, "nobody")
        .await
        .unwrap_err();
    assert!(
        none.to_string().contains("waymark admin token list"),
        "{none}"
    );

    // Rotating this data dir's admin token: the new one works, the old one is refused.
    let data = waymark_server::DataDir::new(h.dir.path());
    let old = h.admin.clone();
    let (s, _) = h.get(&old, "/v1/admin/audit").await;
    assert_eq!(s, StatusCode::OK);
    let fresh = data.rotate_admin_token(store).await.unwrap();
    assert_ne!(fresh, old);
    h.advance(Duration::from_millis(
        waymark_server::auth::TOKEN_CACHE_MS as u64,
    ))
    .await;
    let (s, _) = h.get(&old, "/v1/admin/audit").await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, _) = h.get(&fresh, "/v1/admin/audit").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        std::fs::read_to_string(data.admin_token_file())
            .unwrap()
            .trim(),
        fresh
    );
}

/// The server's policy decides what is risky, not only the asking worker: an intent that
/// matches it (here nested below harmless keys) is risky and defaults to `deny` whatever the
/// worker said; the operator's own pattern (`serve --risky`) counts too; a worker can still
/// make any approval risky, and an everyday one stays as asked.
#[tokio::test]
async fn the_servers_policy_makes_an_approval_risky_whatever_its_worker_says() {
    let mut config = test_config();
    config.risk =
        waymark_server::risk::RiskPolicy::with(["\\bdeploy\\s+prod\\b".to_owned()]).unwrap();
    let h = Harness::start_with(config).await;
    let task = h.create_task(&h.alice).await;
    let (att, fence) = h.attempt(&h.alice, &task, 600).await;
    let ask = |intent: serde_json::Value, risky: bool, default: &str| {
        let (h, task, att) = (&h, task.clone(), att.clone());
        let default = default.to_owned();
        async move {
            let (s, v) = h
                .post(
                    &h.alice,
                    &format!("/v1/tasks/{task}/approvals"),
                    json!({"attempt_id": att, "fence": fence, "intent": intent,
                           "summary": "run it?", "risky": risky, "default_option": default}),
                )
                .await;
            assert_eq!(s, StatusCode::CREATED, "{v}");
            v
        }
    };
    let hidden = ask(
        json!({"a": "1", "b": "2", "c": "3", "d": "4",
               "input": {"command": "git push --force origin main"}}),
        false,
        "approve",
    )
    .await;
    assert_eq!(hidden["risky"], true, "{hidden}");
    assert_eq!(hidden["default_option"], "deny", "{hidden}");
    let own = ask(json!({"command": "make deploy prod"}), false, "deny").await;
    assert_eq!(own["risky"], true, "{own}");
    let everyday = ask(json!({"command": "npm test"}), false, "approve").await;
    assert_eq!(everyday["risky"], false, "{everyday}");
    assert_eq!(everyday["default_option"], "approve", "{everyday}");
    let raised = ask(json!({"command": "npm test"}), true, "deny").await;
    assert_eq!(raised["risky"], true, "{raised}");
}
