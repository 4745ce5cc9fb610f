//! The store conformance story: one scenario every backend must pass, so a second backend
//! never drifts from the first. Backends call [`run_store_story`] from their own tests with a
//! fresh, empty store.

use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::*;

/// A typed column's value, written as the JSON it is stored as.
fn typed<T: DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("a story value of its column's type")
}

fn user(id: &str, name: &str) -> UserRow {
    UserRow {
        id: id.into(),
        name: name.into(),
        created_at: 1,
    }
}

fn task(id: &str, owner: &str) -> TaskRow {
    TaskRow {
        id: id.into(),
        owner_id: owner.into(),
        title: "fix the flaky deploy".into(),
        goal: "green CI, staging deployed".into(),
        runtime: Some("story".into()),
        state: TaskState::Queued,
        plan: typed(json!([{"id": "fix"}, {"id": "deploy", "depends_on": ["fix"]}])),
        plan_revision: 1,
        budget: typed(json!({"max_tokens": 1000})),
        usage: Usage::default(),
        materials: typed(json!({"repo": "r", "commit": "c"})),
        session_id: format!("ses_{id}"),
        fence: 0,
        outcome_summary: None,
        created_at: 10,
        updated_at: 10,
        parent_id: None,
        external_key: None,
        machine_id: None,
    }
}

/// A user `usr_a` and one queued task `id`, committed: for a backend's own tests that then
/// change the row underneath the store.
pub async fn seed_one_task(store: &dyn Store, id: &str) {
    let mut tx = store.write().await.unwrap();
    tx.insert_user(&user("usr_a", "a")).await.unwrap();
    tx.insert_task(&task(id, "usr_a")).await.unwrap();
    tx.commit().await.unwrap();
}

/// JSON a backend's test writes into a task's column behind the store's back: valid JSON, but
/// not of the column's type (a usage whose tokens are words, a plan that is not a list).
pub const CORRUPT_TASK_JSON: [(&str, &str); 2] = [
    (
        "usage",
        r#"{"tokens": "many", "cost_usd": 1.0, "wall_seconds": 0}"#,
    ),
    ("plan", r#"{"id": "not a list"}"#),
];

/// Reads task `id`, which a backend's test corrupted in column `col` behind the store's back:
/// the store must refuse it as `Corrupt`, naming the column, never read it as a default.
/// Returns what the refusal says.
pub async fn assert_corrupt_task(store: &dyn Store, id: &str, col: &str) -> String {
    let err = store
        .read()
        .await
        .unwrap()
        .task(id)
        .await
        .expect_err("a corrupt row is refused");
    assert!(matches!(err, StoreError::Corrupt(_)), "{col}: {err}");
    let said = err.to_string();
    assert!(said.contains(&format!("`{col}`")), "{said}");
    said
}

fn checkpoint(task_id: &str, sequence: i64) -> CheckpointRow {
    CheckpointRow {
        task_id: task_id.into(),
        sequence,
        attempt_id: "att_1".into(),
        fence: 1,
        body: json!({"reason": "step_completed", "n": sequence}),
        prev_digest: (sequence > 1).then(|| format!("d{}", sequence - 1)),
        digest: format!("d{sequence}"),
        created_at: 20 + sequence,
    }
}

fn effect(id: &str, task_id: &str, key: &str) -> EffectRow {
    EffectRow {
        id: id.into(),
        task_id: task_id.into(),
        idempotency_key: key.into(),
        body_digest: "b".into(),
        kind: "deploy".into(),
        step: Some("deploy".into()),
        resource_id: None,
        intent: json!({"target": "staging"}),
        intent_digest: "sha256:i".into(),
        status: EffectStatus::Intended,
        receipt: None,
        attempt_id: "att_1".into(),
        fence: 1,
        created_at: 30,
        updated_at: 30,
        flag: None,
    }
}

fn event(task_id: &str, owner: &str, kind: EventKind) -> NewEvent {
    NewEvent {
        task_id: task_id.into(),
        owner_id: owner.into(),
        kind,
        data: json!({"k": kind.as_str()}),
        at: 40,
    }
}

/// Runs the whole story against an empty store. Panics with a message on the first
/// divergence.
pub async fn run_store_story(store: &dyn Store) {
    // users: unique names, lookups both ways
    let mut tx = store.write().await.unwrap();
    tx.insert_user(&user("usr_a", "alice")).await.unwrap();
    tx.insert_user(&user("usr_b", "bob")).await.unwrap();
    tx.commit().await.unwrap();
    let mut tx = store.write().await.unwrap();
    assert!(
        matches!(
            tx.insert_user(&user("usr_x", "alice")).await,
            Err(StoreError::Conflict(_))
        ),
        "a second user named alice must conflict"
    );
    drop(tx);
    let mut r = store.read().await.unwrap();
    assert_eq!(r.user_by_name("alice").await.unwrap().unwrap().id, "usr_a");
    assert_eq!(r.user_by_id("usr_b").await.unwrap().unwrap().name, "bob");
    assert!(r.user_by_name("mallory").await.unwrap().is_none());
    assert_eq!(r.list_users().await.unwrap().len(), 2);
    drop(r);

    // tokens
    let mut tx = store.write().await.unwrap();
    let token = TokenRow {
        id: "tok_1".into(),
        kind: TokenKind::Worker,
        name: "ci".into(),
        user_id: "usr_a".into(),
        secret_hash: "h1".into(),
        created_at: 1,
        revoked_at: None,
        machine_id: None,
    };
    tx.insert_token(&token).await.unwrap();
    tx.commit().await.unwrap();
    let mut r = store.read().await.unwrap();
    assert_eq!(r.token_by_hash("h1").await.unwrap(), Some(token.clone()));
    assert!(r.token_by_hash("h2").await.unwrap().is_none());
    assert_eq!(
        r.list_tokens(TokenKind::Worker).await.unwrap(),
        vec![token.clone()]
    );
    drop(r);

    // a credential is revoked once; the first time stands
    let mut tx = store.write().await.unwrap();
    tx.insert_token(&TokenRow {
        id: "tok_2".into(),
        secret_hash: "h2".into(),
        ..token.clone()
    })
    .await
    .unwrap();
    assert!(tx.revoke_token("tok_2", 5).await.unwrap());
    assert!(
        !tx.revoke_token("tok_2", 6).await.unwrap(),
        "already revoked"
    );
    assert!(!tx.revoke_token("tok_none", 6).await.unwrap());
    tx.commit().await.unwrap();
    let mut r = store.read().await.unwrap();
    assert_eq!(
        r.token_by_hash("h2").await.unwrap().unwrap().revoked_at,
        Some(5)
    );
    assert_eq!(
        r.token_by_hash("h1").await.unwrap().unwrap().revoked_at,
        None
    );
    drop(r);

    // a dropped transaction leaves nothing behind
    let mut tx = store.write().await.unwrap();
    tx.insert_task(&task("task_gone", "usr_a")).await.unwrap();
    tx.append_event(&event("task_gone", "usr_a", EventKind::TaskCreated))
        .await
        .unwrap();
    drop(tx);
    let mut r = store.read().await.unwrap();
    assert!(
        r.task("task_gone").await.unwrap().is_none(),
        "rolled back task is visible"
    );
    assert_eq!(
        r.max_cursor().await.unwrap(),
        0,
        "rolled back event is visible"
    );
    drop(r);

    // tasks, sessions, attempts round-trip
    let mut tx = store.write().await.unwrap();
    let mut t = task("task_1", "usr_a");
    tx.insert_task(&t).await.unwrap();
    tx.insert_task(&task("task_2", "usr_b")).await.unwrap();
    let session = SessionRow {
        id: "ses_task_1".into(),
        task_id: "task_1".into(),
        parent_id: None,
        created_at: 10,
    };
    tx.insert_session(&session).await.unwrap();
    let mut attempt = AttemptRow {
        id: "att_1".into(),
        task_id: "task_1".into(),
        worker: "w1".into(),
        fence: 1,
        expires_at: 1000,
        state: AttemptState::Active,
        manifest_digest: Some("m".into()),
        started_at: 11,
        ended_at: None,
        outcome: None,
        released: None,
    };
    tx.insert_attempt(&attempt).await.unwrap();
    tx.commit().await.unwrap();

    let mut tx = store.write().await.unwrap();
    t.state = TaskState::Running;
    t.fence = 1;
    t.usage = typed(json!({"tokens": 5, "cost_usd": 0.25, "wall_seconds": 3}));
    t.updated_at = 12;
    t.parent_id = Some("task_2".into());
    tx.update_task(&t).await.unwrap();
    attempt.state = AttemptState::Finished;
    attempt.ended_at = Some(99);
    attempt.outcome = Some(FinishOutcome::Completed);
    attempt.released = Some(vec!["worktree:/tmp/w".into()]);
    tx.update_attempt(&attempt).await.unwrap();
    tx.commit().await.unwrap();

    // the sweeper's list: active, expired, on a task a worker runs
    let mut tx = store.write().await.unwrap();
    let live = AttemptRow {
        id: "att_2".into(),
        task_id: "task_2".into(),
        worker: "w2".into(),
        fence: 1,
        expires_at: 500,
        state: AttemptState::Active,
        manifest_digest: None,
        started_at: 11,
        ended_at: None,
        outcome: None,
        released: None,
    };
    tx.insert_attempt(&live).await.unwrap();
    let mut t2 = tx.task("task_2").await.unwrap().unwrap();
    t2.state = TaskState::Running;
    tx.update_task(&t2).await.unwrap();
    tx.commit().await.unwrap();
    let mut r = store.read().await.unwrap();
    assert!(r.expired_leases(499).await.unwrap().is_empty());
    assert_eq!(r.expired_leases(500).await.unwrap(), vec![live.clone()]);
    drop(r);

    let mut r = store.read().await.unwrap();
    assert_eq!(r.task("task_1").await.unwrap(), Some(t.clone()));
    assert_eq!(r.session("ses_task_1").await.unwrap(), Some(session));
    assert_eq!(r.attempt("att_1").await.unwrap(), Some(attempt.clone()));
    assert_eq!(r.list_attempts("task_1").await.unwrap(), vec![attempt]);
    assert_eq!(r.list_tasks(None).await.unwrap().len(), 2);
    let mine = r.list_tasks(Some(&["usr_b".into()])).await.unwrap();
    assert_eq!(mine.len(), 1);
    assert_eq!(mine[0].id, "task_2");
    // a delegate's view: several owners at once
    let both = r
        .list_tasks(Some(&["usr_a".into(), "usr_b".into()]))
        .await
        .unwrap();
    assert_eq!(both.len(), 2);
    assert!(r.list_tasks(Some(&[])).await.unwrap().is_empty());
    drop(r);

    // checkpoints: exactly one row per (task, sequence)
    let mut tx = store.write().await.unwrap();
    tx.insert_checkpoint(&checkpoint("task_1", 1))
        .await
        .unwrap();
    tx.insert_checkpoint(&checkpoint("task_1", 2))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let mut tx = store.write().await.unwrap();
    assert!(
        matches!(
            tx.insert_checkpoint(&checkpoint("task_1", 2)).await,
            Err(StoreError::Conflict(_))
        ),
        "a taken checkpoint sequence must conflict"
    );
    drop(tx);
    let mut r = store.read().await.unwrap();
    assert_eq!(
        r.last_checkpoint("task_1").await.unwrap(),
        Some(checkpoint("task_1", 2))
    );
    assert_eq!(
        r.list_checkpoints("task_1").await.unwrap(),
        vec![checkpoint("task_1", 1), checkpoint("task_1", 2)]
    );
    assert!(r.last_checkpoint("task_2").await.unwrap().is_none());
    drop(r);

    // effects: one per (task, key); update round-trips
    let mut tx = store.write().await.unwrap();
    tx.insert_effect(&effect("eff_1", "task_1", "k1"))
        .await
        .unwrap();
    tx.insert_effect(&effect("eff_2", "task_2", "k1"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let mut tx = store.write().await.unwrap();
    assert!(
        matches!(
            tx.insert_effect(&effect("eff_3", "task_1", "k1")).await,
            Err(StoreError::Conflict(_))
        ),
        "a reused idempotency key must conflict"
    );
    drop(tx);
    let mut tx = store.write().await.unwrap();
    let mut e = tx.effect_by_key("task_1", "k1").await.unwrap().unwrap();
    assert_eq!(e, effect("eff_1", "task_1", "k1"));
    e.status = EffectStatus::Confirmed;
    e.receipt = Some(json!({"deploy_id": 7}));
    e.updated_at = 31;
    e.flag = Some("cancelled: reconcile".into());
    tx.update_effect(&e).await.unwrap();
    tx.commit().await.unwrap();
    let mut r = store.read().await.unwrap();
    assert_eq!(r.effect("eff_1").await.unwrap(), Some(e.clone()));
    assert_eq!(r.list_effects("task_1").await.unwrap(), vec![e]);
    drop(r);

    // decisions: due ones, pending counts
    let mut tx = store.write().await.unwrap();
    let mut d = DecisionRow {
        id: "dec_1".into(),
        task_id: "task_1".into(),
        kind: DecisionKind::Approval,
        status: DecisionStatus::Pending,
        step: Some("deploy".into()),
        question: "deploy to staging?".into(),
        options: typed(json!([{"id": "approve", "label": "Approve", "gives_up": ""}])),
        default_option: Some("deny".into()),
        intent: Some(json!({"target": "staging"})),
        intent_digest: Some("sha256:i".into()),
        effect_id: Some("eff_1".into()),
        plan_revision: 1,
        risky: true,
        expires_at: 500,
        created_at: 50,
        outcome: None,
        durability: None,
        delivery: None,
        editable: None,
        runtime_deadline: Some(typed(
            json!({"runtime": "Hermes", "at": "2026-12-02T00:00:00Z", "then": "denies"}),
        )),
        escalation: Some(typed(json!({
            "notified": [],
            "next": {"step": 0, "at": "2026-12-02T00:00:00Z", "devices": ["phone"]}
        }))),
        escalate_at: Some(300),
    };
    tx.insert_decision(&d).await.unwrap();
    tx.commit().await.unwrap();
    let mut tx = store.write().await.unwrap();
    assert_eq!(tx.pending_decision_count("task_1").await.unwrap(), 1);
    assert!(tx.due_decisions(499).await.unwrap().is_empty());
    assert_eq!(tx.due_decisions(500).await.unwrap(), vec![d.clone()]);
    assert!(tx.due_escalations(299).await.unwrap().is_empty());
    assert_eq!(tx.due_escalations(300).await.unwrap(), vec![d.clone()]);
    // escalation moves with the decision's other mutable columns
    d.escalation = Some(typed(json!({
        "notified": [{"step": 0, "device_id": "dev_1", "device_name": "phone", "at": "2026-12-02T00:00:00Z"}],
        "stopped": "opened on phone"
    })));
    d.escalate_at = None;
    // …and a switch to a durable wait drops the runtime's deadline (`defer`)
    d.durability = Some(ApprovalDurability::Durable);
    d.runtime_deadline = None;
    tx.update_decision(&d).await.unwrap();
    assert!(tx.due_escalations(10_000).await.unwrap().is_empty());
    // a user's escalation policy: none, set, replaced, removed
    assert_eq!(tx.escalation_policy("usr_a").await.unwrap(), None);
    let policy = |after: u32| -> EscalationPolicy {
        typed(json!({"steps": [{"after_minutes": after, "devices": ["dev_1"]}]}))
    };
    tx.put_escalation_policy("usr_a", &policy(1), 7)
        .await
        .unwrap();
    tx.put_escalation_policy("usr_a", &policy(2), 8)
        .await
        .unwrap();
    assert_eq!(
        tx.escalation_policy("usr_a").await.unwrap(),
        Some(policy(2))
    );
    assert!(tx.delete_escalation_policy("usr_a").await.unwrap());
    assert!(!tx.delete_escalation_policy("usr_a").await.unwrap());
    assert_eq!(tx.escalation_policy("usr_a").await.unwrap(), None);
    // delegations: offered until accepted (once); a second put keeps the first, accepted or
    // not; listed both ways; removed once
    let deleg = |o: &str, d: &str, at, accepted_at| DelegationRow {
        owner_id: o.into(),
        delegate_id: d.into(),
        created_at: at,
        accepted_at,
    };
    tx.put_delegation(&deleg("usr_a", "usr_b", 5, None))
        .await
        .unwrap();
    tx.put_delegation(&deleg("usr_a", "usr_b", 9, Some(9)))
        .await
        .unwrap();
    tx.put_delegation(&deleg("usr_b", "usr_a", 6, None))
        .await
        .unwrap();
    assert_eq!(
        tx.delegations(Some("usr_a"), None).await.unwrap(),
        vec![deleg("usr_a", "usr_b", 5, None)]
    );
    assert!(!tx.accept_delegation("usr_a", "usr_c", 7).await.unwrap());
    assert!(tx.accept_delegation("usr_a", "usr_b", 7).await.unwrap());
    assert!(!tx.accept_delegation("usr_a", "usr_b", 8).await.unwrap());
    tx.put_delegation(&deleg("usr_a", "usr_b", 9, None))
        .await
        .unwrap();
    assert_eq!(
        tx.delegations(Some("usr_a"), None).await.unwrap(),
        vec![deleg("usr_a", "usr_b", 5, Some(7))]
    );
    assert_eq!(
        tx.delegations(None, Some("usr_a")).await.unwrap(),
        vec![deleg("usr_b", "usr_a", 6, None)]
    );
    assert_eq!(tx.delegations(None, None).await.unwrap().len(), 2);
    assert!(tx.delete_delegation("usr_b", "usr_a").await.unwrap());
    assert!(!tx.delete_delegation("usr_b", "usr_a").await.unwrap());
    assert_eq!(
        tx.delegations(None, None).await.unwrap(),
        vec![deleg("usr_a", "usr_b", 5, Some(7))]
    );
    d.status = DecisionStatus::Expired;
    d.outcome = Some(typed(
        json!({"option": "deny", "by": "default", "at": "2026-12-02T00:00:00Z"}),
    ));
    tx.update_decision(&d).await.unwrap();
    tx.commit().await.unwrap();
    let mut r = store.read().await.unwrap();
    assert_eq!(r.decision("dec_1").await.unwrap(), Some(d.clone()));
    assert_eq!(r.list_decisions("task_1").await.unwrap(), vec![d]);
    assert_eq!(r.pending_decision_count("task_1").await.unwrap(), 0);
    assert!(r.due_decisions(10_000).await.unwrap().is_empty());
    drop(r);

    // blobs dedup, artifacts, visibility by owner
    let mut tx = store.write().await.unwrap();
    tx.put_blob("aa", b"hello").await.unwrap();
    tx.put_blob("aa", b"hello").await.unwrap();
    let art = ArtifactRow {
        id: "art_1".into(),
        task_id: "task_1".into(),
        sha256: "aa".into(),
        name: "fix.diff".into(),
        media_type: "text/x-diff".into(),
        size: 5,
        step: None,
        created_at: 60,
    };
    tx.insert_artifact(&art).await.unwrap();
    let receipt = ReceiptRow {
        id: "rcpt_1".into(),
        task_id: "task_1".into(),
        step: Some("fix".into()),
        command: "pytest".into(),
        exit_code: 1,
        commit: Some("c".into()),
        totals: json!({"tests": 3, "failures": 1}),
        failures: json!([{"name": "t"}]),
        duration_seconds: 0.5,
        passed: false,
        junit_sha256: "aa".into(),
        created_at: 61,
    };
    tx.insert_receipt(&receipt).await.unwrap();
    tx.commit().await.unwrap();
    let mut r = store.read().await.unwrap();
    assert_eq!(r.blob("aa").await.unwrap().as_deref(), Some(&b"hello"[..]));
    assert!(r.blob("bb").await.unwrap().is_none());
    assert_eq!(r.list_artifacts("task_1").await.unwrap(), vec![art]);
    assert!(r.blob_visible("aa", Some(&["usr_a".into()])).await.unwrap());
    assert!(!r.blob_visible("aa", Some(&["usr_b".into()])).await.unwrap());
    assert!(
        r.blob_visible("aa", Some(&["usr_b".into(), "usr_a".into()]))
            .await
            .unwrap()
    );
    assert!(r.blob_visible("aa", None).await.unwrap());
    assert_eq!(r.list_receipts("task_1").await.unwrap(), vec![receipt]);
    drop(r);

    // messages get consecutive seqs per session
    let mut tx = store.write().await.unwrap();
    for (i, text) in ["one", "two", "three"].iter().enumerate() {
        let m = MessageRow {
            session_id: "ses_task_1".into(),
            task_id: "task_1".into(),
            seq: 0,
            role: "assistant".into(),
            text: (*text).into(),
            created_at: 70,
        };
        assert_eq!(tx.insert_message(&m).await.unwrap(), i as i64 + 1);
    }
    tx.commit().await.unwrap();
    let mut r = store.read().await.unwrap();
    let msgs = r.list_messages("ses_task_1").await.unwrap();
    assert_eq!(
        msgs.iter().map(|m| m.seq).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    assert_eq!(msgs[2].text, "three");
    drop(r);

    // events: increasing cursors, owner filter, the watch, pruning
    let mut watch = store.cursor_watch();
    let mut tx = store.write().await.unwrap();
    let mut cursors = Vec::new();
    for i in 0..10 {
        let owner = if i % 2 == 0 { "usr_a" } else { "usr_b" };
        cursors.push(
            tx.append_event(&event("task_1", owner, EventKind::TaskUpdated))
                .await
                .unwrap(),
        );
    }
    tx.commit().await.unwrap();
    assert!(
        cursors.windows(2).all(|w| w[0] < w[1]),
        "cursors must increase: {cursors:?}"
    );
    tokio::time::timeout(
        std::time::Duration::from_secs(5),
        watch.wait_for(|c| *c >= cursors[9]),
    )
    .await
    .expect("the cursor watch must see the commit")
    .unwrap();
    let mut r = store.read().await.unwrap();
    assert_eq!(r.max_cursor().await.unwrap(), cursors[9]);
    let all = r.events_after(0, 100, None).await.unwrap();
    assert_eq!(all.iter().map(|e| e.cursor).collect::<Vec<_>>(), cursors);
    assert_eq!(all[0].data, json!({"k": "task.updated"}));
    let page = r.events_after(cursors[2], 3, None).await.unwrap();
    assert_eq!(
        page.iter().map(|e| e.cursor).collect::<Vec<_>>(),
        cursors[3..6].to_vec()
    );
    let bobs = r
        .events_after(0, 100, Some(&["usr_b".into()]))
        .await
        .unwrap();
    assert_eq!(bobs.len(), 5);
    assert!(bobs.iter().all(|e| e.owner_id == "usr_b"));
    // several owners: merged in cursor order, paged the same way
    let both = r
        .events_after(cursors[0], 4, Some(&["usr_b".into(), "usr_a".into()]))
        .await
        .unwrap();
    assert_eq!(
        both.iter().map(|e| e.cursor).collect::<Vec<_>>(),
        cursors[1..5].to_vec()
    );
    assert_eq!(r.pruned_through().await.unwrap(), 0);
    drop(r);
    let mut tx = store.write().await.unwrap();
    assert_eq!(tx.prune_events_through(cursors[4]).await.unwrap(), 5);
    tx.commit().await.unwrap();
    let mut r = store.read().await.unwrap();
    assert_eq!(r.pruned_through().await.unwrap(), cursors[4]);
    assert_eq!(r.events_after(0, 100, None).await.unwrap().len(), 5);
    drop(r);
    // new cursors keep increasing after a prune
    let mut tx = store.write().await.unwrap();
    let next = tx
        .append_event(&event("task_1", "usr_a", EventKind::TaskUpdated))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(next > cursors[9]);

    // audit
    let mut tx = store.write().await.unwrap();
    for code in ["fenced", "sequence_conflict"] {
        tx.insert_audit(&AuditRow {
            at: 80,
            actor: "worker:w1".into(),
            action: "checkpoint.append".into(),
            task_id: Some("task_1".into()),
            code: code.into(),
            detail: "stale".into(),
        })
        .await
        .unwrap();
    }
    tx.commit().await.unwrap();
    let mut r = store.read().await.unwrap();
    let audit = r.list_audit(Some("task_1"), 10).await.unwrap();
    assert_eq!(audit.len(), 2);
    assert_eq!(audit[0].code, "sequence_conflict", "newest first");
    assert!(r.list_audit(Some("task_2"), 10).await.unwrap().is_empty());
    drop(r);

    // audit retention: by age, then by count of the newest kept
    let mut tx = store.write().await.unwrap();
    for (at, code) in [(90, "a"), (100, "b"), (110, "c"), (120, "d")] {
        tx.insert_audit(&AuditRow {
            at,
            actor: "device:unpaired".into(),
            action: "device.pair".into(),
            task_id: None,
            code: code.into(),
            detail: "no such pairing code".into(),
        })
        .await
        .unwrap();
    }
    assert_eq!(tx.prune_audit(90, 100).await.unwrap(), 2, "the two at 80");
    assert_eq!(
        tx.prune_audit(0, 3).await.unwrap(),
        1,
        "all but the newest 3"
    );
    tx.commit().await.unwrap();
    let mut r = store.read().await.unwrap();
    let kept: Vec<String> = r
        .list_audit(None, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.code)
        .collect();
    assert_eq!(kept, ["d", "c", "b"]);
    drop(r);

    // devices: unique keys, revocation round-trips, per-user lists
    let mut tx = store.write().await.unwrap();
    let mut phone = DeviceRow {
        id: "dev_1".into(),
        user_id: "usr_a".into(),
        name: "alice's phone".into(),
        public_key: "pk1".into(),
        scopes: vec!["view".into(), "steer".into()],
        created_at: 90,
        revoked_at: None,
        last_seen_at: None,
    };
    tx.insert_device(&phone).await.unwrap();
    tx.commit().await.unwrap();
    let mut tx = store.write().await.unwrap();
    let dup = DeviceRow {
        id: "dev_2".into(),
        ..phone.clone()
    };
    assert!(
        matches!(tx.insert_device(&dup).await, Err(StoreError::Conflict(_))),
        "a key pairs once"
    );
    drop(tx);
    let mut tx = store.write().await.unwrap();
    phone.revoked_at = Some(95);
    phone.last_seen_at = Some(94);
    tx.update_device(&phone).await.unwrap();
    tx.commit().await.unwrap();
    let mut r = store.read().await.unwrap();
    assert_eq!(r.device("dev_1").await.unwrap(), Some(phone.clone()));
    assert_eq!(r.list_devices(Some("usr_a")).await.unwrap(), vec![phone]);
    assert!(r.list_devices(Some("usr_b")).await.unwrap().is_empty());
    drop(r);

    // deliveries: each step once per decision and device, the first time standing
    let mut tx = store.write().await.unwrap();
    let step = |decision: &str, step: DeliveryStep, at: i64| DeliveryRow {
        decision_id: decision.into(),
        device_id: "dev_1".into(),
        step,
        at,
        detail: Some(format!("at {at}")),
    };
    assert!(
        tx.insert_delivery(&step("dec_a", DeliveryStep::Pushed, 10))
            .await
            .unwrap()
    );
    assert!(
        tx.insert_delivery(&step("dec_a", DeliveryStep::Shown, 12))
            .await
            .unwrap()
    );
    assert!(
        !tx.insert_delivery(&step("dec_a", DeliveryStep::Pushed, 20))
            .await
            .unwrap(),
        "a step is recorded once"
    );
    assert!(
        tx.insert_delivery(&step("dec_b", DeliveryStep::Fetched, 11))
            .await
            .unwrap()
    );
    tx.commit().await.unwrap();
    let mut r = store.read().await.unwrap();
    let got = r.deliveries(&["dec_a".into()]).await.unwrap();
    assert_eq!(
        got,
        vec![
            step("dec_a", DeliveryStep::Pushed, 10),
            step("dec_a", DeliveryStep::Shown, 12)
        ]
    );
    assert_eq!(
        r.deliveries(&["dec_a".into(), "dec_b".into()])
            .await
            .unwrap()
            .len(),
        3
    );
    assert!(r.deliveries(&[]).await.unwrap().is_empty());
    drop(r);

    // pairing codes and device sessions
    let mut tx = store.write().await.unwrap();
    let mut pairing = PairingRow {
        code_hash: "ph".into(),
        user_id: "usr_a".into(),
        scopes: vec!["view".into()],
        created_at: 1,
        expires_at: 2,
        used_at: None,
        device_id: None,
    };
    tx.insert_pairing(&pairing).await.unwrap();
    pairing.used_at = Some(2);
    pairing.device_id = Some("dev_1".into());
    tx.update_pairing(&pairing).await.unwrap();
    let session = DeviceSessionRow {
        token_hash: "th".into(),
        device_id: "dev_1".into(),
        created_at: 1,
        expires_at: 9,
    };
    tx.insert_device_session(&session).await.unwrap();
    tx.commit().await.unwrap();
    let mut r = store.read().await.unwrap();
    assert_eq!(r.pairing("ph").await.unwrap(), Some(pairing));
    assert_eq!(r.device_session("th").await.unwrap(), Some(session));
    assert!(r.device_session("nope").await.unwrap().is_none());
    drop(r);

    // the command ledger: one row per command id
    let mut tx = store.write().await.unwrap();
    let cmd = CommandRow {
        command_id: "c1".into(),
        task_id: Some("task_1".into()),
        device_id: "dev_1".into(),
        body_digest: "bd".into(),
        operation: Operation::Pause,
        envelope: json!({"command": {}}),
        status: CommandStatus::Applied,
        result: json!({"status": "applied"}),
        created_at: 100,
    };
    tx.insert_command(&cmd).await.unwrap();
    tx.commit().await.unwrap();
    let mut tx = store.write().await.unwrap();
    assert!(
        matches!(tx.insert_command(&cmd).await, Err(StoreError::Conflict(_))),
        "a command id is recorded once"
    );
    drop(tx);
    assert_eq!(
        store.read().await.unwrap().command("c1").await.unwrap(),
        Some(cmd.clone())
    );
    assert_eq!(
        store
            .read()
            .await
            .unwrap()
            .list_commands("task_1")
            .await
            .unwrap(),
        vec![cmd]
    );
    assert!(
        store
            .read()
            .await
            .unwrap()
            .list_commands("task_2")
            .await
            .unwrap()
            .is_empty()
    );

    // a background job is claimed by one transaction at a time
    let mut tx = store.write().await.unwrap();
    assert!(tx.try_claim("sweep").await.unwrap());
    tx.commit().await.unwrap();

    // follow-ups: due ones, and one run per nominal time
    let mut tx = store.write().await.unwrap();
    let mut f = FollowupRow {
        id: "fup_1".into(),
        task_id: "task_1".into(),
        schedule: json!({"every": "PT1H"}),
        time_zone: "Europe/Paris".into(),
        catch_up: CatchUp::RunOnce,
        message: "check the canary".into(),
        state: FollowupState::Active,
        next_run_at: Some(1000),
        last_run_at: None,
        runs: 0,
        missed: 0,
        created_at: 5,
    };
    tx.insert_followup(&f).await.unwrap();
    tx.commit().await.unwrap();
    let mut tx = store.write().await.unwrap();
    assert!(tx.due_followups(999).await.unwrap().is_empty());
    assert_eq!(tx.due_followups(1000).await.unwrap(), vec![f.clone()]);
    assert!(
        tx.insert_followup_run("fup_1", 1000, 1001, 0)
            .await
            .unwrap()
    );
    assert!(
        !tx.insert_followup_run("fup_1", 1000, 1002, 0)
            .await
            .unwrap(),
        "a nominal time runs once"
    );
    f.runs = 1;
    f.last_run_at = Some(1000);
    f.next_run_at = Some(4600);
    tx.update_followup(&f).await.unwrap();
    tx.commit().await.unwrap();
    let mut r = store.read().await.unwrap();
    assert_eq!(r.followup("fup_1").await.unwrap(), Some(f.clone()));
    assert_eq!(r.list_followups("task_1").await.unwrap(), vec![f]);
    assert!(r.due_followups(4599).await.unwrap().is_empty());
    drop(r);

    // push channels and server secrets
    let mut tx = store.write().await.unwrap();
    let mut ch = PushChannelRow {
        id: "push_1".into(),
        device_id: "dev_1".into(),
        user_id: "usr_a".into(),
        kind: PushKind::WebPush,
        endpoint: "https://push.example/abc".into(),
        p256dh: Some("pk".into()),
        auth: Some("au".into()),
        cursor: 7,
        attempts: 0,
        delivered: 0,
        failures: 0,
        consecutive_failures: 0,
        last_error: None,
        last_attempt_at: None,
        next_attempt_at: 0,
        created_at: 1,
        revoked_at: None,
    };
    tx.insert_push_channel(&ch).await.unwrap();
    tx.insert_server_secret("vapid", "k1").await.unwrap();
    tx.commit().await.unwrap();
    let mut tx = store.write().await.unwrap();
    assert!(
        matches!(
            tx.insert_server_secret("vapid", "k2").await,
            Err(StoreError::Conflict(_))
        ),
        "the first secret wins"
    );
    drop(tx);
    let mut tx = store.write().await.unwrap();
    ch.cursor = 9;
    ch.attempts = 2;
    ch.failures = 1;
    ch.last_error = Some("503".into());
    tx.update_push_channel(&ch).await.unwrap();
    tx.commit().await.unwrap();
    let mut r = store.read().await.unwrap();
    assert_eq!(
        r.server_secret("vapid").await.unwrap().as_deref(),
        Some("k1")
    );
    assert!(r.server_secret("nope").await.unwrap().is_none());
    assert_eq!(
        r.push_channels(Some("dev_1")).await.unwrap(),
        vec![ch.clone()]
    );
    assert_eq!(r.push_channels(None).await.unwrap(), vec![ch]);
    drop(r);

    // control commands: numbered in the order they applied (two in one millisecond too),
    // pending until acknowledged, acknowledged once
    let mut tx = store.write().await.unwrap();
    for (id, expected_seq) in [("c2", 1), ("c1", 2)] {
        let seq = tx
            .insert_control(&ControlRow {
                command_id: id.into(),
                task_id: "task_1".into(),
                operation: Operation::Pause,
                args: json!({}),
                plan_revision: 1,
                applied_at: 100,
                acknowledged_at: None,
                acknowledged_by: None,
                seq: 0,
            })
            .await
            .unwrap();
        assert_eq!(
            seq, expected_seq,
            "{id} is the task's command number {expected_seq}"
        );
    }
    tx.commit().await.unwrap();
    let mut tx = store.write().await.unwrap();
    let pending = tx.pending_controls("task_1").await.unwrap();
    assert_eq!(
        pending
            .iter()
            .map(|c| (c.command_id.as_str(), c.seq))
            .collect::<Vec<_>>(),
        vec![("c2", 1), ("c1", 2)],
        "in the order they applied, not by id"
    );
    assert!(tx.ack_control("task_1", "c1", 102, "att_1").await.unwrap());
    assert!(
        !tx.ack_control("task_1", "c1", 103, "att_1").await.unwrap(),
        "acknowledged twice"
    );
    assert!(
        !tx.ack_control("task_2", "c2", 103, "att_1").await.unwrap(),
        "another task's command"
    );
    tx.commit().await.unwrap();
    let pending = store
        .read()
        .await
        .unwrap()
        .pending_controls("task_1")
        .await
        .unwrap();
    assert_eq!(
        pending
            .iter()
            .map(|c| c.command_id.as_str())
            .collect::<Vec<_>>(),
        vec!["c2"]
    );

    // a checkpoint append's reads and writes, as a backend may make them in fewer round trips
    let mut tx = store.write().await.unwrap();
    let ctx = tx.append_context("task_1", "att_1").await.unwrap();
    assert_eq!(ctx.task.as_ref().map(|t| t.id.as_str()), Some("task_1"));
    assert_eq!(ctx.attempt.as_ref().map(|a| a.id.as_str()), Some("att_1"));
    assert_eq!(
        ctx.head,
        Some(ChainHead {
            sequence: 2,
            digest: "d2".into()
        })
    );
    // the attempt named is read whichever task it belongs to; no checkpoint yet: no head
    let ctx = tx.append_context("task_2", "att_1").await.unwrap();
    assert_eq!(ctx.attempt.map(|a| a.task_id), Some("task_1".into()));
    assert_eq!(ctx.head, None);
    let ctx = tx.append_context("task_1", "att_none").await.unwrap();
    assert!(ctx.task.is_some() && ctx.attempt.is_none());
    assert_eq!(
        tx.append_context("task_none", "att_1").await.unwrap(),
        AppendContext::default()
    );
    let before = tx.max_cursor().await.unwrap();
    let cursor = tx
        .insert_checkpoint_with_event(
            &checkpoint("task_1", 3),
            &event("task_1", "usr_a", EventKind::CheckpointAppended),
        )
        .await
        .unwrap();
    assert!(cursor > before);
    assert!(
        matches!(
            tx.insert_checkpoint_with_event(
                &checkpoint("task_1", 3),
                &event("task_1", "usr_a", EventKind::CheckpointAppended),
            )
            .await,
            Err(StoreError::Conflict(_))
        ),
        "a taken sequence conflicts, and writes no event"
    );
    tx.commit().await.unwrap();
    let mut r = store.read().await.unwrap();
    assert_eq!(r.max_cursor().await.unwrap(), cursor);
    let last = r.events_after(before, 10, None).await.unwrap();
    assert_eq!(last.len(), 1);
    assert_eq!(last[0].kind, EventKind::CheckpointAppended);
    assert_eq!(
        r.last_checkpoint("task_1").await.unwrap(),
        Some(checkpoint("task_1", 3))
    );
    machines(store).await;
    rules(store).await;
}

/// Standing rules: listed newest first, live ones only when asked, revoked once, and every
/// use counted even from two transactions at once.
async fn rules(store: &dyn Store) {
    let rule = |id: &str, answer: RuleAnswer, at: i64, expires_at: i64| RuleRow {
        id: id.into(),
        owner_id: "usr_a".into(),
        device_id: "dev_1".into(),
        command_id: format!("cmd-{id}"),
        spec: json!({"match": {"tool": "Bash"}, "answer": answer.as_str()}),
        digest: format!("sha256:{id}"),
        answer,
        created_at: at,
        expires_at,
        revoked_at: None,
        revoked_by: None,
        uses: 0,
        last_used_at: None,
    };
    let mut tx = store.write().await.unwrap();
    tx.insert_rule(&rule("rul_1", RuleAnswer::Allow, 100, 1_000))
        .await
        .unwrap();
    tx.insert_rule(&rule("rul_2", RuleAnswer::Deny, 200, 300))
        .await
        .unwrap();
    tx.insert_rule(&rule("rul_3", RuleAnswer::Allow, 300, 2_000))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let mut tx = store.write().await.unwrap();
    assert!(
        matches!(
            tx.insert_rule(&rule("rul_1", RuleAnswer::Deny, 1, 2)).await,
            Err(StoreError::Conflict(_))
        ),
        "a rule id is one rule"
    );
    drop(tx);

    let mut tx = store.write().await.unwrap();
    assert!(tx.revoke_rule("rul_3", 400, "dev_1").await.unwrap());
    assert!(
        !tx.revoke_rule("rul_3", 500, "dev_1").await.unwrap(),
        "a rule is revoked once; the first revocation stands"
    );
    tx.count_rule_use("rul_1", 410).await.unwrap();
    tx.commit().await.unwrap();
    // Two uses in two transactions both count (an increment, not a read-then-write).
    for at in [420, 430] {
        let mut tx = store.write().await.unwrap();
        tx.count_rule_use("rul_1", at).await.unwrap();
        tx.commit().await.unwrap();
    }

    let mut r = store.read().await.unwrap();
    let all = r.list_rules("usr_a", None, 10).await.unwrap();
    assert_eq!(
        all.iter().map(|x| x.id.as_str()).collect::<Vec<_>>(),
        ["rul_3", "rul_2", "rul_1"],
        "newest first"
    );
    let used = r.rule("rul_1").await.unwrap().unwrap();
    assert_eq!((used.uses, used.last_used_at), (3, Some(430)));
    assert_eq!(used.spec, rule("rul_1", RuleAnswer::Allow, 0, 0).spec);
    let revoked = r.rule("rul_3").await.unwrap().unwrap();
    assert_eq!(
        (revoked.revoked_at, revoked.revoked_by.as_deref()),
        (Some(400), Some("dev_1"))
    );
    assert_eq!(
        r.rule("rul_2").await.unwrap().unwrap().answer,
        RuleAnswer::Deny
    );
    // At 250 the deny rule is live; at 300 it has expired; rul_3 is revoked either way.
    let live = |rows: Vec<RuleRow>| rows.into_iter().map(|x| x.id).collect::<Vec<_>>();
    assert_eq!(
        live(r.list_rules("usr_a", Some(250), 10).await.unwrap()),
        ["rul_2", "rul_1"]
    );
    assert_eq!(
        live(r.list_rules("usr_a", Some(300), 10).await.unwrap()),
        ["rul_1"]
    );
    assert!(
        r.list_rules("usr_a", Some(1_000), 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(r.list_rules("usr_a", None, 1).await.unwrap().len(), 1);
    assert!(r.list_rules("usr_b", None, 10).await.unwrap().is_empty());
    assert!(r.rule("rul_9").await.unwrap().is_none());
}

/// Machines, the tokens and tasks bound to them, and their work items.
async fn machines(store: &dyn Store) {
    let laptop = MachineRow {
        id: "mch_1".into(),
        owner_id: "usr_a".into(),
        name: "laptop".into(),
        info: json!({}),
        registered_at: None,
        last_seen_at: None,
        created_at: 5,
    };
    let mut tx = store.write().await.unwrap();
    tx.insert_machine(&laptop).await.unwrap();
    tx.insert_machine(&MachineRow {
        id: "mch_2".into(),
        name: "desk".into(),
        owner_id: "usr_b".into(),
        ..laptop.clone()
    })
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let mut tx = store.write().await.unwrap();
    assert!(
        matches!(
            tx.insert_machine(&MachineRow {
                id: "mch_3".into(),
                ..laptop.clone()
            })
            .await,
            Err(StoreError::Conflict(_))
        ),
        "a second machine of one owner named laptop must conflict"
    );
    drop(tx);

    let mut tx = store.write().await.unwrap();
    let token = TokenRow {
        id: "tok_m".into(),
        kind: TokenKind::Worker,
        name: "laptop".into(),
        user_id: "usr_a".into(),
        secret_hash: "hm".into(),
        created_at: 6,
        revoked_at: None,
        machine_id: Some("mch_1".into()),
    };
    tx.insert_token(&token).await.unwrap();
    let mut seen = laptop.clone();
    seen.info = json!({"runtimes": [{"runtime": "claude-code", "version": "2.1"}]});
    seen.registered_at = Some(7);
    seen.last_seen_at = Some(8);
    tx.update_machine(&seen).await.unwrap();
    let run = TaskRow {
        machine_id: Some("mch_1".into()),
        ..task("task_m", "usr_a")
    };
    tx.insert_task(&run).await.unwrap();
    tx.commit().await.unwrap();

    let mut r = store.read().await.unwrap();
    assert_eq!(r.token_by_hash("hm").await.unwrap(), Some(token));
    assert_eq!(r.machine("mch_1").await.unwrap(), Some(seen.clone()));
    assert_eq!(
        r.machine_by_name("usr_a", "laptop").await.unwrap(),
        Some(seen.clone())
    );
    assert!(
        r.machine_by_name("usr_b", "laptop")
            .await
            .unwrap()
            .is_none()
    );
    let mine = r.list_machines(Some(&["usr_a".into()])).await.unwrap();
    assert_eq!(mine, vec![seen.clone()]);
    let both = r
        .list_machines(Some(&["usr_a".into(), "usr_b".into()]))
        .await
        .unwrap();
    assert_eq!(
        both.iter().map(|m| m.name.as_str()).collect::<Vec<_>>(),
        ["desk", "laptop"],
        "by name"
    );
    assert_eq!(r.list_machines(None).await.unwrap().len(), 2);
    assert_eq!(r.task("task_m").await.unwrap(), Some(run.clone()));
    assert_eq!(r.machine_tasks("mch_1").await.unwrap(), vec![run]);
    assert!(r.machine_tasks("mch_2").await.unwrap().is_empty());
    drop(r);

    let work = |id: &str, at: i64| WorkRow {
        id: id.into(),
        machine_id: "mch_1".into(),
        task_id: "task_m".into(),
        kind: WorkKind::Start,
        args: json!({"run": {"runtime": "claude-code"}}),
        state: WorkState::Pending,
        detail: None,
        created_at: at,
        updated_at: at,
    };
    let mut tx = store.write().await.unwrap();
    tx.insert_work(&work("wrk_2", 20)).await.unwrap();
    tx.insert_work(&work("wrk_1", 10)).await.unwrap();
    let mut done = work("wrk_3", 5);
    done.kind = WorkKind::Resume;
    tx.insert_work(&done).await.unwrap();
    done.state = WorkState::Refused;
    done.detail = Some("not allowed".into());
    done.updated_at = 30;
    tx.update_work(&done).await.unwrap();
    let mut taken = work("wrk_2", 20);
    taken.state = WorkState::Taken;
    tx.update_work(&taken).await.unwrap();
    assert!(
        matches!(
            tx.insert_work(&work("wrk_1", 10)).await,
            Err(StoreError::Conflict(_))
        ),
        "a work id is one item"
    );
    drop(tx);
    let mut tx = store.write().await.unwrap();
    tx.insert_work(&work("wrk_2", 20)).await.unwrap();
    tx.insert_work(&work("wrk_1", 10)).await.unwrap();
    tx.insert_work(&done).await.unwrap();
    tx.update_work(&taken).await.unwrap();
    tx.commit().await.unwrap();
    let mut r = store.read().await.unwrap();
    assert_eq!(
        r.open_work("mch_1").await.unwrap(),
        vec![work("wrk_1", 10), taken.clone()],
        "pending and taken, oldest first; refused is closed"
    );
    assert!(r.open_work("mch_2").await.unwrap().is_empty());
    assert_eq!(r.work("wrk_3").await.unwrap(), Some(done.clone()));
    assert_eq!(
        r.task_work("task_m").await.unwrap(),
        vec![done, work("wrk_1", 10), taken]
    );
}
