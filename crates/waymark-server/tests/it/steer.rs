//! Devices and signed steer commands: pairing, sessions, the verification path, the ledger's
//! compare-and-set, and what each operation does to the task and its worker.

use std::time::Duration;

use eventsource_stream::{Event, EventStreamError, Eventsource};
use futures::StreamExt;
use futures::stream::BoxStream;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use waymark_proto::Operation;

use crate::support::{Harness, TestDevice, assert_problem};

/// Attempt `att`'s control stream, as its worker (alice's token) reads it.
async fn control_stream(
    h: &Harness,
    att: &str,
) -> BoxStream<'static, Result<Event, EventStreamError<reqwest::Error>>> {
    let res = h
        .http
        .get(h.url(&format!("/v1/attempts/{att}/control")))
        .bearer_auth(&h.alice)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    res.bytes_stream().eventsource().boxed()
}

async fn approval(h: &Harness, task: &str, att: &str, fence: i64) -> (String, String) {
    let intent = json!({"target": "staging", "commit": "abc123"});
    let (s, v) = h
        .post(&h.alice, &format!("/v1/tasks/{task}/approvals"),
              json!({"attempt_id": att, "fence": fence, "intent": intent, "summary": "deploy abc123 to staging?"}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    (
        v["id"].as_str().unwrap().to_owned(),
        v["intent_digest"].as_str().unwrap().to_owned(),
    )
}

#[tokio::test]
async fn a_pairing_code_is_single_use_and_expires_and_every_refusal_looks_alike() {
    let h = Harness::start().await;
    let store = h.server.state.store.clone();
    let scopes = vec!["view".to_owned()];
    let (code, _) = waymark_server::steer::create_pairing(&*store, "alice", &scopes, 600_000)
        .await
        .unwrap();
    let key = |n: u8| {
        waymark_proto::signing::public_key_b64(
            &ed25519_dalek::SigningKey::from_bytes(&[n; 32]).verifying_key(),
        )
    };
    let (s, v) = h
        .post(
            "",
            "/v1/devices/pair",
            json!({"code": code, "public_key": key(1), "name": "phone"}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(v["scopes"], json!(["view"]));
    let (s, v) = h
        .post(
            "",
            "/v1/devices/pair",
            json!({"code": code, "public_key": key(2), "name": "laptop"}),
        )
        .await;
    // Used, expired and unknown get one answer (none names whose code it was); the audit
    // log says which it was.
    assert_problem(s, &v, 401, "pairing_code_invalid");
    let used = v["detail"].clone();

    let (code, _) = waymark_server::steer::create_pairing(&*store, "alice", &scopes, 1000)
        .await
        .unwrap();
    h.advance(Duration::from_millis(1001)).await;
    let (s, v) = h
        .post(
            "",
            "/v1/devices/pair",
            json!({"code": code, "public_key": key(3), "name": "tablet"}),
        )
        .await;
    assert_problem(s, &v, 401, "pairing_code_invalid");
    assert_eq!(v["detail"], used);
    assert!(!v.to_string().contains("alice"), "{v}");
    assert!(
        v["detail"]
            .as_str()
            .unwrap()
            .contains("waymark admin pair --user NAME"),
        "{v}"
    );
    let (_, audit) = h.get(&h.admin, "/v1/admin/audit?limit=10").await;
    let codes: Vec<&str> = audit
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["action"] == "device.pair")
        .map(|a| a["code"].as_str().unwrap())
        .collect();
    assert_eq!(
        codes,
        ["pairing_code_expired", "pairing_code_used"],
        "newest first"
    );

    let (s, v) = h
        .post(
            "",
            "/v1/devices/pair",
            json!({"code": "ZZZZ-ZZZZ", "public_key": key(4), "name": "x"}),
        )
        .await;
    assert_problem(s, &v, 401, "pairing_code_invalid");
    assert_eq!(v["detail"], used);
    let (code, _) = waymark_server::steer::create_pairing(&*store, "alice", &scopes, 600_000)
        .await
        .unwrap();
    let (s, v) = h
        .post(
            "",
            "/v1/devices/pair",
            json!({"code": code, "public_key": "not-a-key", "name": "x"}),
        )
        .await;
    assert_problem(s, &v, 422, "validation_failed");
}

async fn open_session(h: &Harness, d: &TestDevice) -> (StatusCode, Value) {
    let now = chrono::Utc::now();
    let cmd = waymark_proto::SteerCommand {
        command_id: waymark_proto::ids::command(),
        task_id: None,
        expected_plan_revision: None,
        operation: Operation::OpenSession,
        scope: vec![],
        args: Value::Null,
        issued_by: format!("user:{}", d.user),
        device_id: d.id.clone(),
        issued_at: now,
        expires_at: now + chrono::Duration::minutes(1),
    };
    h.post("", &format!("/v1/devices/{}/session", d.id), d.sign(&cmd))
        .await
}

#[tokio::test]
async fn a_device_session_reads_only_its_users_tasks_and_dies_with_revocation() {
    let h = Harness::start().await;
    let mine = h.create_task(&h.alice).await;
    let _bobs = h.create_task(&h.bob).await;
    let d = h.pair_device("alice", &["view", "steer"]).await;
    let (s, v) = open_session(&h, &d).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let token = v["token"].as_str().unwrap().to_owned();
    assert!(token.starts_with("wmk_s_"));

    let (s, snap) = h.get(&token, "/v1/snapshot").await;
    assert_eq!(s, StatusCode::OK);
    let ids: Vec<&str> = snap["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![mine.as_str()]);
    let (s, _) = h.get(&token, &format!("/v1/tasks/{mine}")).await;
    assert_eq!(s, StatusCode::OK);
    // A session reads; it does not write through the worker API.
    let (s, v) = h.post(&token, "/v1/tasks", json!({"title": "x"})).await;
    assert_problem(s, &v, 403, "forbidden");

    waymark_server::steer::revoke_device(&*h.server.state.store, &d.id)
        .await
        .unwrap();
    let (s, v) = h.get(&token, "/v1/snapshot").await;
    assert_problem(s, &v, 401, "unauthorized");
    let (s, v) = open_session(&h, &d).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    assert_eq!(v["reason"], "device_revoked");
}

#[tokio::test]
async fn every_abuse_is_refused_with_its_own_code_and_audited() {
    let h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    let alice = h.pair_device("alice", &["view", "steer", "approve"]).await;
    let viewer = h.pair_device("alice", &["view"]).await;
    let mallory = h.pair_device("bob", &["view", "steer", "approve"]).await;
    let rev = h.revision(&task).await;

    let mut cases: Vec<(&str, Value, u16)> = Vec::new();

    // forged: signed by a key that is not the device's
    let forger = TestDevice {
        id: alice.id.clone(),
        user: "alice".into(),
        key: ed25519_dalek::SigningKey::generate(&mut rand::rngs::OsRng),
    };
    cases.push((
        "bad_signature",
        forger.sign(&alice.command(&task, Some(rev), Operation::Cancel, json!({}))),
        403,
    ));

    // one flipped byte in the signed command
    let mut env = alice.sign(&alice.command(
        &task,
        Some(rev),
        Operation::Replan,
        json!({"instructions": "report only"}),
    ));
    env["command"]["args"]["instructions"] = json!("report onlz");
    cases.push(("bad_signature", env, 403));

    // expired
    let mut c = alice.command(&task, Some(rev), Operation::Pause, json!({}));
    c.issued_at = chrono::Utc::now() - chrono::Duration::minutes(20);
    c.expires_at = chrono::Utc::now() - chrono::Duration::minutes(10);
    cases.push(("expired", alice.sign(&c), 422));

    // a clock far in the future
    let mut c = alice.command(&task, Some(rev), Operation::Pause, json!({}));
    c.issued_at = chrono::Utc::now() + chrono::Duration::hours(1);
    c.expires_at = c.issued_at + chrono::Duration::minutes(10);
    cases.push(("clock_skew", alice.sign(&c), 422));

    // mallory (bob's device) steering alice's task
    cases.push((
        "not_your_task",
        mallory.sign(&mallory.command(&task, Some(rev), Operation::Cancel, json!({}))),
        403,
    ));

    // a view-only device steering
    cases.push((
        "missing_scope",
        viewer.sign(&viewer.command(&task, Some(rev), Operation::Pause, json!({}))),
        403,
    ));

    // a device claiming to be another
    let mut c = alice.command(&task, Some(rev), Operation::Pause, json!({}));
    c.device_id = viewer.id.clone();
    let mut env = alice.sign(&c);
    env["signature"]["key_id"] = json!(alice.id);
    cases.push(("device_mismatch", env, 403));

    for (code, env, status) in &cases {
        let (s, v) = h.submit(env).await;
        assert_eq!(s.as_u16(), *status, "{code}: {v}");
        assert_eq!(v["status"], "rejected", "{code}: {v}");
        assert_eq!(v["reason"], *code, "{v}");
    }

    // replayed id with a different body
    let c = alice.command(&task, None, Operation::Pause, json!({}));
    let (s, v) = h.submit(&alice.sign(&c)).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let mut c2 = c.clone();
    c2.args = json!({"why": "changed"});
    let (s, v) = h.submit(&alice.sign(&c2)).await;
    assert_eq!(s.as_u16(), 422);
    assert_eq!(v["reason"], "command_id_reused");

    // revoked device
    waymark_server::steer::revoke_device(&*h.server.state.store, &alice.id)
        .await
        .unwrap();
    let (s, v) = h
        .submit(&alice.sign(&alice.command(&task, None, Operation::Pause, json!({}))))
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert_eq!(v["reason"], "device_revoked");

    let codes = h.audit_codes(&task).await;
    for want in [
        "bad_signature",
        "expired",
        "clock_skew",
        "not_your_task",
        "missing_scope",
        "device_mismatch",
        "command_id_reused",
        "device_revoked",
    ] {
        assert!(
            codes.iter().any(|c| c == want),
            "{want} not audited: {codes:?}"
        );
    }
    // Nothing of it touched the task, but the one pause.
    let d = h.detail(&task).await;
    assert_eq!(d["task"]["state"], "paused");
    assert_eq!(d["task"]["plan_revision"], rev);

    // Evidence signed before revocation still verifies with the device's key.
    let (s, ledger) = h
        .get(&h.admin, &format!("/v1/admin/tasks/{task}/commands"))
        .await;
    assert_eq!(s, StatusCode::OK, "{ledger}");
    let entry = ledger
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["device_id"] == alice.id.as_str())
        .unwrap();
    assert_eq!(entry["status"], "applied");
    let env: waymark_proto::SignedEnvelope =
        serde_json::from_value(entry["envelope"].clone()).unwrap();
    waymark_proto::signing::verify(&env, &alice.key.verifying_key()).unwrap();
}

/// Found by the `envelope_parse_verify` fuzz target: canonical JSON writes numbers as doubles,
/// so a revision of 2^53 + 1 and one of 2^53 had the same signed bytes.
#[tokio::test]
async fn a_command_with_an_integer_beyond_2_53_is_invalid_and_never_rounded() {
    use ed25519_dalek::Signer;
    let h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    let alice = h.pair_device("alice", &["view", "steer", "approve"]).await;
    let rev = h.revision(&task).await;

    let mut c = alice.command(&task, Some(rev), Operation::Pause, json!({}));
    c.expected_plan_revision = Some(waymark_proto::MAX_SAFE_INTEGER + 2);
    // Signed the way a device that canonicalises by itself would.
    let command = serde_json::to_value(&c).unwrap();
    let bytes = waymark_proto::digest::canonical_json(&command).unwrap();
    let sig = alice.key.sign(&bytes);
    let mut env = json!({
        "command": command,
        "signature": {"alg": "ed25519", "key_id": alice.id,
                      "sig": waymark_proto::signing::b64(&sig.to_bytes())},
    });
    for revision in [
        waymark_proto::MAX_SAFE_INTEGER + 2,
        waymark_proto::MAX_SAFE_INTEGER + 1,
    ] {
        env["command"]["expected_plan_revision"] = json!(revision);
        let (s, v) = h.submit(&env).await;
        assert_eq!(s.as_u16(), 422, "{v}");
        assert_eq!(v["status"], "rejected", "{v}");
        assert_eq!(v["reason"], "invalid_command", "{v}");
    }
    let d = h.detail(&task).await;
    assert_eq!(d["task"]["state"], "queued", "{d}");
    assert_eq!(d["task"]["plan_revision"], rev);
}

#[tokio::test]
async fn the_same_command_twice_is_applied_once() {
    let h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    let (att, fence) = h.attempt(&h.alice, &task, 60).await;
    let d = h.pair_device("alice", &["view", "steer"]).await;
    let env = d.sign(&d.command(
        &task,
        Some(1),
        Operation::Replan,
        json!({"instructions": "write the report only"}),
    ));
    let (s, first) = h.submit(&env).await;
    assert_eq!(s, StatusCode::OK, "{first}");
    assert_eq!(first["status"], "applied");
    assert_eq!(first["plan_revision"], 2);
    for _ in 0..3 {
        let (s, again) = h.submit(&env).await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(again["status"], "duplicate", "{again}");
        assert_eq!(again["original"]["status"], "applied");
        assert_eq!(again["original"]["plan_revision"], 2);
    }
    assert_eq!(h.revision(&task).await, 2, "applied once");
    let (_, hb) = h
        .post(
            &h.alice,
            &format!("/v1/attempts/{att}/heartbeat"),
            json!({"fence": fence}),
        )
        .await;
    assert_eq!(hb["commands"].as_array().unwrap().len(), 1, "{hb}");
    assert_eq!(
        hb["commands"][0]["args"]["instructions"],
        "write the report only"
    );
}

#[tokio::test]
async fn two_devices_replanning_at_the_same_revision_apply_exactly_once_in_100_trials() {
    let h = std::sync::Arc::new(Harness::start().await);
    let a = std::sync::Arc::new(h.pair_device("alice", &["view", "steer"]).await);
    let b = std::sync::Arc::new(h.pair_device("alice", &["view", "steer"]).await);
    let task = h.create_task(&h.alice).await;
    for trial in 0..100 {
        let rev = h.revision(&task).await;
        let env_a = a.sign(&a.command(
            &task,
            Some(rev),
            Operation::Replan,
            json!({"instructions": format!("a{trial}")}),
        ));
        let env_b = b.sign(&b.command(
            &task,
            Some(rev),
            Operation::Replan,
            json!({"instructions": format!("b{trial}")}),
        ));
        let (ha, hb) = (h.clone(), h.clone());
        let (ra, rb) = tokio::join!(
            tokio::spawn(async move { ha.submit(&env_a).await }),
            tokio::spawn(async move { hb.submit(&env_b).await })
        );
        let statuses = [
            ra.unwrap().1["status"].clone(),
            rb.unwrap().1["status"].clone(),
        ];
        let applied = statuses.iter().filter(|s| *s == "applied").count();
        let conflicts = statuses.iter().filter(|s| *s == "conflict").count();
        assert_eq!((applied, conflicts), (1, 1), "trial {trial}: {statuses:?}");
        assert_eq!(h.revision(&task).await, rev + 1);
    }
}

#[tokio::test]
async fn an_approval_after_a_replan_is_refused_and_a_new_one_is_asked() {
    let h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    let (att, fence) = h.attempt(&h.alice, &task, 60).await;
    let d = h.pair_device("alice", &["view", "steer", "approve"]).await;
    let (old, digest) = approval(&h, &task, &att, fence).await;

    let (_, r) = h
        .submit(&d.sign(&d.command(
            &task,
            Some(1),
            Operation::Replan,
            json!({"instructions": "smaller change"}),
        )))
        .await;
    assert_eq!(r["status"], "applied");
    let dd = h.detail(&task).await;
    assert_eq!(
        dd["decisions"][0]["status"], "void",
        "the replan voids pending approvals"
    );
    assert_eq!(dd["task"]["state"], "running");

    // Approving the old one at the new revision: superseded.
    let (s, r) = h
        .submit(&d.sign(&d.command(
            &task,
            Some(2),
            Operation::Approve,
            json!({"decision_id": old, "intent_digest": digest}),
        )))
        .await;
    assert_eq!(s.as_u16(), 422, "{r}");
    assert_eq!(r["reason"], "decision_closed", "{r}");
    // At the old revision: a conflict, with the current revision.
    let (s, r) = h
        .submit(&d.sign(&d.command(
            &task,
            Some(1),
            Operation::Approve,
            json!({"decision_id": old, "intent_digest": digest}),
        )))
        .await;
    assert_eq!(s, StatusCode::CONFLICT);
    assert_eq!(r["status"], "conflict");
    assert_eq!(r["plan_revision"], 2);

    // The worker asks again; a wrong digest is refused; the right one approves.
    let (new, digest) = approval(&h, &task, &att, fence).await;
    let (_, r) = h
        .submit(&d.sign(&d.command(
            &task,
            Some(2),
            Operation::Approve,
            json!({"decision_id": new, "intent_digest": "sha256:00"}),
        )))
        .await;
    assert_eq!(r["reason"], "digest_mismatch", "{r}");
    let (s, r) = h
        .submit(&d.sign(&d.command(
            &task,
            Some(2),
            Operation::Approve,
            json!({"decision_id": new, "intent_digest": digest}),
        )))
        .await;
    assert_eq!(s, StatusCode::OK, "{r}");
    let (_, dec) = h
        .get(&h.alice, &format!("/v1/tasks/{task}/decisions/{new}"))
        .await;
    assert_eq!(dec["status"], "resolved");
    assert_eq!(dec["outcome"]["option"], "approve");
    assert_eq!(dec["outcome"]["by"], "user:alice");
}

#[tokio::test]
async fn an_approval_needs_the_approve_scope_and_a_pending_unexpired_decision() {
    let h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    let (att, fence) = h.attempt(&h.alice, &task, 60).await;
    let steerer = h.pair_device("alice", &["view", "steer"]).await;
    let (id, digest) = approval(&h, &task, &att, fence).await;
    let (s, r) = h
        .submit(&steerer.sign(&steerer.command(
            &task,
            Some(1),
            Operation::Approve,
            json!({"decision_id": id, "intent_digest": digest}),
        )))
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert_eq!(r["reason"], "missing_scope");
    let (_, r) = h
        .submit(&steerer.sign(&steerer.command(
            &task,
            Some(1),
            Operation::ChooseOption,
            json!({"decision_id": id, "option": "approve"}),
        )))
        .await;
    assert_eq!(
        r["reason"], "wrong_operation",
        "choose_option cannot approve: {r}"
    );
}

#[tokio::test]
async fn pause_applies_even_when_the_plan_moved_on_and_says_which_revisions() {
    let h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    let d = h.pair_device("alice", &["view", "steer"]).await;
    h.submit(&d.sign(&d.command(&task, Some(1), Operation::Replan, json!({}))))
        .await;
    let (s, r) = h
        .submit(&d.sign(&d.command(&task, Some(1), Operation::Pause, json!({}))))
        .await;
    assert_eq!(s, StatusCode::OK, "{r}");
    assert_eq!(r["status"], "applied");
    assert_eq!(r["based_on_revision"], 1);
    assert_eq!(r["plan_revision"], 2);
    assert_eq!(r["task_state"], "paused");
    let (s, r) = h
        .submit(&d.sign(&d.command(&task, Some(1), Operation::Resume, json!({}))))
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "resume is compare-and-set: {r}");
    let (s, r) = h
        .submit(&d.sign(&d.command(&task, Some(2), Operation::Resume, json!({}))))
        .await;
    assert_eq!(s, StatusCode::OK, "{r}");
    assert_eq!(r["task_state"], "queued");
}

#[tokio::test]
async fn a_paused_task_starts_no_new_effect() {
    let h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    let (att, fence) = h.attempt(&h.alice, &task, 60).await;
    let d = h.pair_device("alice", &["view", "steer"]).await;
    h.submit(&d.sign(&d.command(&task, None, Operation::Pause, json!({}))))
        .await;
    let (s, v) = h
        .post(&h.alice, &format!("/v1/tasks/{task}/effects"),
              json!({"attempt_id": att, "fence": fence, "idempotency_key": "k", "kind": "deploy", "intent": {}}))
        .await;
    assert_problem(s, &v, 409, "task_paused");
}

#[tokio::test]
async fn cancel_while_an_effect_is_under_way_stops_the_worker_and_fences_its_writes() {
    let h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    let (att, fence) = h.attempt(&h.alice, &task, 60).await;
    let (_, eff) = h
        .post(&h.alice, &format!("/v1/tasks/{task}/effects"),
              json!({"attempt_id": att, "fence": fence, "idempotency_key": "deploy-1", "kind": "deploy", "intent": {"target": "staging"}}))
        .await;
    let effect = eff["effect"]["id"].as_str().unwrap().to_owned();
    h.send(
        Method::PATCH,
        &h.alice,
        &format!("/v1/effects/{effect}"),
        Some(json!({"attempt_id": att, "fence": fence, "status": "in_progress"})),
    )
    .await;

    // The worker listens on its control stream.
    let mut control = control_stream(&h, &att).await;

    let d = h.pair_device("alice", &["view", "steer"]).await;
    let sent = std::time::Instant::now();
    let (s, r) = h
        .submit(&d.sign(&d.command(&task, Some(1), Operation::Cancel, json!({}))))
        .await;
    assert_eq!(s, StatusCode::OK, "{r}");
    assert_eq!(r["task_state"], "cancelled");

    let ev = tokio::time::timeout(Duration::from_secs(5), control.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(ev.event, "control");
    let cmd: Value = serde_json::from_str(&ev.data).unwrap();
    assert_eq!(cmd["operation"], "cancel");
    assert_eq!(cmd["args"]["effects_to_reconcile"], json!([effect]));
    let ev = tokio::time::timeout(Duration::from_secs(5), control.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(ev.event, "revoked");
    assert!(
        sent.elapsed() < Duration::from_secs(2),
        "cancel reached the worker in {:?}",
        sent.elapsed()
    );

    let dd = h.detail(&task).await;
    assert_eq!(dd["effects"][0]["status"], "in_progress", "never guessed");
    assert!(
        dd["effects"][0]["flag"]
            .as_str()
            .unwrap()
            .contains("reconcile"),
        "{}",
        dd["effects"][0]
    );
    assert_eq!(dd["attempts"][0]["state"], "revoked");

    // The old fence writes nothing more.
    let (s, v) = h
        .send(
            Method::PATCH,
            &h.alice,
            &format!("/v1/effects/{effect}"),
            Some(json!({"attempt_id": att, "fence": fence, "status": "confirmed"})),
        )
        .await;
    assert_problem(s, &v, 409, "fenced");
    let cancel_id = cmd["command_id"].as_str().unwrap().to_owned();
    let (s, v) = h
        .post(
            &h.alice,
            &format!("/v1/attempts/{att}/heartbeat"),
            json!({"fence": fence, "acknowledged": [cancel_id]}),
        )
        .await;
    assert_problem(s, &v, 409, "fenced");
    // …but its acknowledgement of the cancel that revoked it is recorded.
    let store = h.server.state.store.clone();
    let pending = store
        .read()
        .await
        .unwrap()
        .pending_controls(&task)
        .await
        .unwrap();
    assert!(
        pending.is_empty(),
        "the cancel stays unacknowledged: {pending:?}"
    );
}

#[tokio::test]
async fn heartbeats_carry_commands_until_the_worker_acknowledges_them() {
    let h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    let (att, fence) = h.attempt(&h.alice, &task, 60).await;
    let d = h.pair_device("alice", &["view", "steer"]).await;
    let (_, r) = h
        .submit(&d.sign(&d.command(&task, None, Operation::Pause, json!({}))))
        .await;
    let id = r["command_id"].as_str().unwrap().to_owned();
    let hb = format!("/v1/attempts/{att}/heartbeat");
    let (_, v) = h.post(&h.alice, &hb, json!({"fence": fence})).await;
    assert_eq!(v["commands"][0]["command_id"], id.as_str());
    assert_eq!(v["task_state"], "paused");
    let (_, v) = h.post(&h.alice, &hb, json!({"fence": fence})).await;
    assert_eq!(
        v["commands"].as_array().unwrap().len(),
        1,
        "redelivered until acknowledged"
    );
    let (_, v) = h
        .post(&h.alice, &hb, json!({"fence": fence, "acknowledged": [id]}))
        .await;
    assert!(v["commands"].as_array().unwrap().is_empty(), "{v}");

    let (_, snap) = h.get(&h.admin, "/v1/snapshot").await;
    let cursor = snap["cursor"].as_i64().unwrap();
    let res = h
        .http
        .get(h.url(&format!("/v1/events?after={}", cursor - 5)))
        .bearer_auth(&h.admin)
        .send()
        .await
        .unwrap();
    let mut events = res.bytes_stream().eventsource();
    let mut kinds = Vec::new();
    while let Ok(Some(Ok(ev))) =
        tokio::time::timeout(Duration::from_millis(300), events.next()).await
    {
        kinds.push(ev.event);
    }
    assert!(
        kinds.contains(&"command.acknowledged".to_owned()),
        "{kinds:?}"
    );
}

#[tokio::test]
async fn a_command_signed_by_an_independent_python_implementation_is_accepted() {
    let h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    let d = h.pair_device("alice", &["view", "steer"]).await;
    let cmd = d.command(
        &task,
        Some(1),
        Operation::SuspendAndReplan,
        json!({"instructions": "不要部署，只写报告 — do not deploy; write the report only"}),
    );
    let mut cmd = serde_json::to_value(&cmd).unwrap();
    cmd["scope"] = json!(["deploy_staging", "notify_release"]);
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/sign_command.py"
    );
    let mut child = std::process::Command::new("python3")
        .arg(script)
        .arg(hex::encode(d.key.to_bytes()))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 with the `cryptography` package (`.ci/run` installs it)");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(cmd.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let env: Value = serde_json::from_slice(&out.stdout).unwrap();
    let (s, r) = h.submit(&env).await;
    assert_eq!(s, StatusCode::OK, "{r}");
    assert_eq!(r["status"], "applied");
    assert_eq!(r["plan_revision"], 2);
}

/// Pause and resume, ten times each, reach the worker's control stream once each and in the
/// order they applied (`seq` 1…20). A command applied on the stream's own replica is handed
/// over in memory once the stream knows the one before it (`controls_handed_over`), so most
/// of them are shown without a database read; none twice, none out of order.
#[tokio::test]
async fn steers_reach_the_control_stream_once_each_in_order_most_without_a_read() {
    let h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    let (att, _fence) = h.attempt(&h.alice, &task, 600).await;
    let mut control = control_stream(&h, &att).await;
    let d = h.pair_device("alice", &["view", "steer"]).await;
    let mut seen = Vec::new();
    for i in 0..20 {
        let op = if i % 2 == 0 {
            Operation::Pause
        } else {
            Operation::Resume
        };
        let (s, r) = h
            .submit(&d.sign(&d.command(&task, Some(1), op, json!({}))))
            .await;
        assert_eq!(
            (s, r["status"].as_str()),
            (StatusCode::OK, Some("applied")),
            "{r}"
        );
        let ev = tokio::time::timeout(Duration::from_secs(5), control.next())
            .await
            .expect("the command reached the stream")
            .unwrap()
            .unwrap();
        assert_eq!(ev.event, "control");
        let cmd: Value = serde_json::from_str(&ev.data).unwrap();
        assert_eq!(
            cmd["command_id"], r["command_id"],
            "this command, not another"
        );
        seen.push(cmd["seq"].as_i64().unwrap());
    }
    assert_eq!(seen, (1..=20).collect::<Vec<i64>>());
    let handed: u64 = h
        .metrics()
        .await
        .lines()
        .find_map(|l| l.strip_prefix("waymark_controls_handed_over_total "))
        .expect("the counter is exported")
        .trim()
        .parse()
        .unwrap();
    eprintln!("{handed} of 19 handed over");
    assert!(
        (1..20).contains(&handed),
        "the first is read (nothing known before it); later ones handed over: {handed}"
    );
    let extra = tokio::time::timeout(Duration::from_millis(200), control.next()).await;
    assert!(extra.is_err(), "nothing shown twice: {extra:?}");
}
