use serde_json::{Value, json};
use waymark_proto::digest::json_digest;
use waymark_proto::{DecisionKind, DecisionStatus, EffectStatus, FinishOutcome, TaskState};
use waymark_worker::Resolution;
use waymark_worker::demo::{self, AutoApprove, BudgetChoice, Scenario};

use crate::support::{World, recorder};

#[tokio::test]
async fn the_approved_run_checkpoints_every_boundary_stores_its_evidence_and_deploys_once() {
    let w = World::start().await;
    let (reporter, lines) = recorder();
    let summary = demo::run_with(
        w.demo_config(Some(AutoApprove::Yes)),
        w.plan(Some(BudgetChoice::FullSuite)),
        reporter,
    )
    .await
    .unwrap();
    assert_eq!(summary.outcome, FinishOutcome::Completed);
    let d = w.detail(&summary.task_id).await;
    assert_eq!(d.task.state, TaskState::Completed);

    // The chain: reproduce, fix, the budget wait, verify, the approval wait, effect boundary —
    // and it verifies.
    assert!(d.chain.intact, "{:?}", d.chain);
    let reasons: Vec<_> = d
        .checkpoints
        .iter()
        .map(|c| c.body.reason.as_str())
        .collect();
    assert_eq!(
        reasons,
        [
            "step_completed",
            "step_completed",
            "human_wait",
            "step_completed",
            "human_wait",
            "effect_boundary"
        ]
    );
    // The budget wait came after the fix, before re-verification, with nothing in progress.
    let budget_wait = &d.checkpoints[2].body;
    assert_eq!(budget_wait.pending_step.as_ref().unwrap().step, "verify");
    assert!(budget_wait.effects.is_empty());
    assert_eq!(
        budget_wait.budget_remaining.as_ref().unwrap().max_tokens,
        Some(40_000 - 9_400 - 22_900)
    );
    for pair in d.checkpoints.windows(2) {
        assert_eq!(
            pair[1].prev_digest.as_deref(),
            Some(pair[0].digest.as_str())
        );
    }

    // The receipts: the alert's test failing alone, then the full suite (the budget choice)
    // passing at the fix.
    assert_eq!(d.test_receipts.len(), 2);
    let (before, after) = (&d.test_receipts[0], &d.test_receipts[1]);
    assert!(!before.passed);
    assert_eq!(before.totals.tests, 1);
    assert_eq!(before.failures[0].name, "test_percentage_discount");
    assert!(after.passed, "{after:?}");
    assert_eq!(after.totals.passed, 12);
    assert_eq!(after.command, "python3 -m pytest -q --junitxml=junit.xml");

    // The budget decision opened at 80%, after the fix, and `full_suite` was followed.
    let budget = d
        .decisions
        .iter()
        .find(|x| x.kind == DecisionKind::Budget)
        .unwrap();
    assert!(budget.question.starts_with("80%"), "{}", budget.question);
    assert_eq!(
        budget.outcome.as_ref().unwrap().option.as_deref(),
        Some("full_suite")
    );
    assert!(
        budget.created_at > d.artifacts[0].created_at,
        "after the fix"
    );
    assert!(
        budget.created_at < after.created_at,
        "before re-verification"
    );
    assert_eq!(summary.budget.len(), 1);
    assert_eq!(summary.verification.as_ref().unwrap().scope, "full_suite");
    assert_eq!(d.task.usage.tokens, 9_400 + 22_900 + 500 + 12 * 300 + 900);
    let commit = summary.commit.clone().unwrap();
    assert_eq!(after.commit.as_deref(), Some(commit.as_str()));
    assert_ne!(before.commit, after.commit);

    // The diff is a real git diff of the fix, stored as text/x-diff.
    let diff = d.artifacts.iter().find(|a| a.name == "fix.diff").unwrap();
    assert_eq!(diff.media_type, "text/x-diff");
    let text = w.blob(&diff.sha256).await;
    assert!(text.starts_with("diff --git a/checkout/cart.py"), "{text}");
    assert!(text.contains("+    return amount_cents - amount_cents * percent // 100"));

    // The approval is bound to the intent's digest, and the intent names what is deployed.
    let approval = d
        .decisions
        .iter()
        .find(|x| x.kind == DecisionKind::Approval)
        .unwrap();
    assert_eq!(approval.status, DecisionStatus::Resolved);
    let intent = approval.intent.clone().unwrap();
    assert_eq!(intent["target"], "staging");
    assert_eq!(intent["commit"], commit.as_str());
    assert_eq!(intent["artifact_digests"]["fix.diff"], diff.sha256.as_str());
    assert_eq!(
        intent["artifact_digests"]["junit-verify.xml"],
        after.junit_sha256.as_str()
    );
    assert_eq!(approval.intent_digest, json_digest(&intent).ok());
    let wait = &d.checkpoints[4].body;
    let pending = wait.pending_step.as_ref().unwrap();
    assert_eq!(pending.approval_id.as_deref(), Some(approval.id.as_str()));
    assert_eq!(pending.intent_digest, approval.intent_digest);
    // Nothing was declared, let alone in progress, while the person decided.
    assert!(wait.effects.is_empty());
    assert!(d.effects.iter().all(|e| e.created_at > approval.created_at));

    // Exactly one deploy, and its receipt is what the deploy service recorded.
    let log = w.deploy_log();
    assert_eq!(log.deploys.len(), 1);
    assert_eq!(d.effects.len(), 1);
    assert_eq!(d.effects[0].status, EffectStatus::Confirmed);
    assert_eq!(
        d.effects[0].receipt,
        Some(serde_json::to_value(&log.deploys[0]).unwrap())
    );
    assert_eq!(log.deploys[0].commit, commit);
    assert_eq!(log.deploys[0].fence, 1);
    assert_eq!(summary.deploy.as_ref().unwrap().resolution, Resolution::Ran);

    // People get messages worth reading, not a bare "done".
    assert!(d.messages.len() >= 6);
    assert!(
        d.messages
            .iter()
            .any(|m| m.text.contains("divided by 10 instead of 100"))
    );
    let steps: Vec<_> = lines.lock().unwrap().iter().map(|p| p.step).collect();
    for s in [
        "repo",
        "reproduce",
        "fix",
        "usage",
        "budget",
        "verify",
        "approval",
        "deploy",
        "finish",
    ] {
        assert!(steps.contains(&s), "{steps:?}");
    }
}

#[tokio::test]
async fn a_denied_deploy_delivers_the_patch_and_a_report_partially() {
    let w = World::start().await;
    let (reporter, _) = recorder();
    let summary = demo::run_with(
        w.demo_config(Some(AutoApprove::No)),
        w.plan(Some(BudgetChoice::RelevantTests)),
        reporter,
    )
    .await
    .unwrap();
    assert_eq!(summary.outcome, FinishOutcome::PartiallyDelivered);
    let d = w.detail(&summary.task_id).await;
    assert_eq!(d.task.state, TaskState::PartiallyDelivered);
    assert!(d.effects.is_empty(), "a denied deploy is never declared");
    assert!(w.deploy_log().deploys.is_empty());
    let report = d.artifacts.iter().find(|a| a.name == "report.md").unwrap();
    assert_eq!(report.media_type, "text/markdown");
    let text = w.blob(&report.sha256).await;
    assert!(text.contains("**not deployed**"), "{text}");
    assert!(text.contains("denied"), "{text}");
    assert!(
        d.task
            .outcome_summary
            .unwrap()
            .contains("denied and did not happen")
    );
    assert!(d.chain.intact);
}

#[tokio::test]
async fn report_only_finishes_completed_with_the_report_and_no_deploy() {
    let w = World::start().await;
    let (reporter, _) = recorder();
    let summary = demo::run_with(
        w.demo_config(Some(AutoApprove::Report)),
        w.plan(Some(BudgetChoice::RelevantTests)),
        reporter,
    )
    .await
    .unwrap();
    assert_eq!(summary.outcome, FinishOutcome::Completed);
    let d = w.detail(&summary.task_id).await;
    assert_eq!(d.task.state, TaskState::Completed);
    assert!(d.artifacts.iter().any(|a| a.name == "report.md"));
    assert!(w.deploy_log().deploys.is_empty());
    let approval = d
        .decisions
        .iter()
        .find(|x| x.kind == DecisionKind::Approval)
        .unwrap();
    assert_eq!(
        approval.outcome.as_ref().unwrap().option.as_deref(),
        Some("deny")
    );
    assert!(summary.summary.starts_with("Report only"));
}

#[tokio::test]
async fn without_the_admin_token_the_demo_waits_for_a_person_and_follows_their_answer() {
    let w = World::start().await;
    let (reporter, lines) = recorder();
    let mut cfg = w.demo_config(None);
    cfg.admin_token = None;
    // Nobody answers the budget decision either: its default applies after a second.
    let run = tokio::spawn(demo::run_with(cfg, w.plan(None), reporter));
    // A person answers once the demo says it waits for them (and how to answer).
    let decision = loop {
        // The demo must not end before asking (say why it did, rather than wait forever).
        assert!(
            !run.is_finished(),
            "the demo ended before asking: {:?}",
            lines.lock().unwrap()
        );
        let snapshot = lines.lock().unwrap().clone();
        let asked = snapshot.iter().find_map(|p| {
            (p.step == "approval" && p.text.starts_with("dec_"))
                .then(|| p.text.split_whitespace().next().unwrap().to_owned())
        });
        let waiting = snapshot
            .iter()
            .find(|p| p.step == "approval" && p.text.starts_with("waiting for a person"));
        if let (Some(id), Some(line)) = (asked, waiting) {
            assert!(
                line.text
                    .contains(&format!("/v1/admin/decisions/{id}/resolve")),
                "{snapshot:?}"
            );
            break id;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let (s, v) = w
        .admin_post(
            &format!("/v1/admin/decisions/{decision}/resolve"),
            json!({"option": "approve"}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let summary = run.await.unwrap().unwrap();
    assert_eq!(summary.outcome, FinishOutcome::Completed);
    assert_eq!(summary.decision.unwrap().by.as_deref(), Some("admin"));
    assert_eq!(w.deploy_log().deploys.len(), 1);
}

/// The receipts of the `verify` step: (command, tests, passed).
fn verify_receipts(d: &waymark_proto::TaskDetail) -> Vec<(String, u64, bool)> {
    d.test_receipts
        .iter()
        .filter(|r| r.step.as_deref() == Some("verify"))
        .map(|r| (r.command.clone(), r.totals.tests, r.passed))
        .collect()
}

#[tokio::test]
async fn relevant_tests_runs_only_the_test_file_touching_the_change_and_says_so_in_the_approval() {
    let w = World::start().await;
    let (reporter, _) = recorder();
    let summary = demo::run_with(
        w.demo_config(Some(AutoApprove::Yes)),
        w.plan(Some(BudgetChoice::RelevantTests)),
        reporter,
    )
    .await
    .unwrap();
    assert_eq!(summary.outcome, FinishOutcome::Completed);
    let d = w.detail(&summary.task_id).await;
    assert_eq!(
        verify_receipts(&d),
        [(
            "python3 -m pytest -q tests/test_cart.py --junitxml=junit.xml".to_owned(),
            5,
            true
        )]
    );
    let v = summary.verification.unwrap();
    assert_eq!(v.scope, "relevant_tests");
    assert_eq!((v.tests, v.suite), (5, 12));
    let approval = d
        .decisions
        .iter()
        .find(|x| x.kind == DecisionKind::Approval)
        .unwrap();
    assert!(
        approval.question.contains(
            "The 5 tests touching the change pass (tests/test_cart.py; 7 others not run)"
        ),
        "{}",
        approval.question
    );
    assert_eq!(d.task.usage.tokens, 9_400 + 22_900 + 500 + 5 * 300 + 900);
    assert_eq!(w.deploy_log().deploys.len(), 1);
}

#[tokio::test]
async fn deliver_patch_stops_before_any_more_verification_and_lists_what_was_not_verified() {
    let w = World::start().await;
    let (reporter, _) = recorder();
    let summary = demo::run_with(
        w.demo_config(Some(AutoApprove::Yes)),
        w.plan(Some(BudgetChoice::DeliverPatch)),
        reporter,
    )
    .await
    .unwrap();
    assert_eq!(summary.outcome, FinishOutcome::PartiallyDelivered);
    let d = w.detail(&summary.task_id).await;
    assert_eq!(d.task.state, TaskState::PartiallyDelivered);
    // Only the reproduction ran; nothing was asked, declared or deployed after the choice.
    assert!(verify_receipts(&d).is_empty());
    assert_eq!(d.test_receipts.len(), 1);
    assert!(d.decisions.iter().all(|x| x.kind == DecisionKind::Budget));
    assert!(d.effects.is_empty());
    assert!(w.deploy_log().deploys.is_empty());
    assert!(summary.verification.is_none());

    let text = d.task.outcome_summary.clone().unwrap();
    assert!(
        text.starts_with("Partially delivered: the patch "),
        "{text}"
    );
    let (verified, not_verified) = text.split_once("\nNot verified:").unwrap();
    assert!(verified.contains("the alert reproduced"), "{text}");
    assert!(not_verified.contains("no test ran on it"), "{text}");
    assert!(
        not_verified.contains("the suite: 12 tests not run"),
        "{text}"
    );
    assert!(
        not_verified
            .contains("the deploy to staging: not done — the budget choice `deliver_patch`"),
        "{text}"
    );
    assert_eq!(summary.summary, text);
    assert_eq!(summary.not_verified.len(), 3, "{:?}", summary.not_verified);
    let report = d.artifacts.iter().find(|a| a.name == "report.md").unwrap();
    let report = w.blob(&report.sha256).await;
    assert!(report.contains("## Not verified"), "{report}");
    assert!(report.contains("* the suite: 12 tests not run"), "{report}");
}

#[tokio::test]
async fn nobody_answering_the_budget_decision_applies_its_stated_default() {
    let w = World::start().await;
    let (reporter, lines) = recorder();
    let summary = demo::run_with(
        w.demo_config(Some(AutoApprove::Yes)),
        w.plan(Some(BudgetChoice::Default)),
        reporter,
    )
    .await
    .unwrap();
    let d = w.detail(&summary.task_id).await;
    let budget = d
        .decisions
        .iter()
        .find(|x| x.kind == DecisionKind::Budget)
        .unwrap();
    assert_eq!(budget.status, DecisionStatus::Expired);
    let outcome = budget.outcome.as_ref().unwrap();
    assert_eq!(
        (outcome.option.as_deref(), outcome.by.as_str()),
        (Some("relevant_tests"), "default")
    );
    // The default is followed: only the cart tests ran, and the run went on to deploy.
    assert_eq!(verify_receipts(&d).len(), 1);
    assert_eq!(verify_receipts(&d)[0].1, 5);
    assert_eq!(summary.outcome, FinishOutcome::Completed);
    let said: Vec<String> = lines
        .lock()
        .unwrap()
        .iter()
        .filter(|p| p.step == "budget")
        .map(|p| p.text.clone())
        .collect();
    assert!(
        said.iter().any(
            |t| t.contains("expired: nobody answered, so the default `relevant_tests` applies")
        ),
        "{said:?}"
    );
}

#[tokio::test]
async fn flaky_tests_past_the_retry_bound_deliver_partially_listing_what_was_verified() {
    let w = World::start().await;
    let (reporter, lines) = recorder();
    let mut cfg = w.demo_config(Some(AutoApprove::Yes));
    cfg.scenario = Scenario::FlakyTests;
    let summary = demo::run_with(cfg, w.plan(None), reporter).await.unwrap();
    assert_eq!(summary.outcome, FinishOutcome::PartiallyDelivered);
    let d = w.detail(&summary.task_id).await;
    // Three tries, no more, each failing on the flaky promo test only.
    let tries = verify_receipts(&d);
    assert_eq!(tries.len(), 3, "{tries:?}");
    for r in d
        .test_receipts
        .iter()
        .filter(|r| r.step.as_deref() == Some("verify"))
    {
        assert_eq!((r.totals.tests, r.totals.passed), (5, 4));
        assert_eq!(r.failures[0].name, "test_promo_code_from_the_promo_service");
    }
    assert!(d.effects.is_empty(), "nothing deployed unverified");
    assert!(d.decisions.iter().all(|x| x.kind != DecisionKind::Approval));

    let alert_passes = format!(
        "`tests/test_cart.py::test_percentage_discount` passes at {}",
        &summary.commit.as_deref().unwrap()[..12]
    );
    assert!(
        summary.verified.contains(&alert_passes),
        "{:?}",
        summary.verified
    );
    let nv = summary.not_verified.join("\n");
    assert!(
        nv.contains("tests/test_cart.py::test_promo_code_from_the_promo_service: TimeoutError: the promo service did not answer within 2.0 s — failed all 3 tries"),
        "{nv}"
    );
    assert!(
        nv.contains(
            "7 tests outside the change, not run (tests/test_shipping.py, tests/test_tax.py)"
        ),
        "{nv}"
    );
    assert!(nv.contains("verification did not pass in 3 tries"), "{nv}");
    assert_eq!(
        d.task.outcome_summary.as_deref(),
        Some(summary.summary.as_str())
    );
    let said: Vec<String> = lines
        .lock()
        .unwrap()
        .iter()
        .filter(|p| p.step == "verify")
        .map(|p| p.text.clone())
        .collect();
    assert!(
        said.iter().any(|t| t.starts_with("try 3 of 3:")),
        "{said:?}"
    );
    assert!(
        said.iter().any(|t| t.starts_with("gave up after 3 tries")),
        "{said:?}"
    );
}

/// The seeds' design question: a run waits for staging approval, and a phone says "stop
/// deploying, keep the report". The signed replan voids the approval; the agent writes the
/// report and deploys nothing; the ledger shows why.
#[tokio::test]
async fn a_replan_from_a_phone_while_the_deploy_waits_stops_the_deploy_and_keeps_the_report() {
    let w = World::start().await;
    let (reporter, lines) = recorder();
    let mut cfg = w.demo_config(None);
    cfg.admin_token = None;
    let run = tokio::spawn(demo::run_with(cfg, w.plan(None), reporter));
    let decision = loop {
        let snapshot = lines.lock().unwrap().clone();
        let waiting = snapshot
            .iter()
            .any(|p| p.step == "approval" && p.text.starts_with("waiting for a person"));
        let asked = snapshot.iter().find_map(|p| {
            (p.step == "approval" && p.text.starts_with("dec_"))
                .then(|| p.text.split_whitespace().next().unwrap().to_owned())
        });
        if let (true, Some(id)) = (waiting, asked) {
            break id;
        }
        if run.is_finished() {
            panic!("the demo ended before asking: {:?}", run.await);
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let task = lines
        .lock()
        .unwrap()
        .iter()
        .find(|p| p.step == "task")
        .map(|p| p.text.split_whitespace().next().unwrap().to_owned())
        .expect("the demo names its task");
    // A phone, paired for alice's tasks, signs the replan.
    let store = w.server.state.store.clone();
    let owner = w.detail(&task).await.task.owner;
    let scopes = vec!["view".to_owned(), "steer".to_owned(), "approve".to_owned()];
    let (code, _) = waymark_server::steer::create_pairing(&*store, &owner, &scopes, 600_000)
        .await
        .unwrap();
    let key = ed25519_dalek::SigningKey::generate(&mut rand::rngs::OsRng);
    let http = reqwest::Client::new();
    let dev: Value = http
        .post(format!("{}/v1/devices/pair", w.server.url()))
        .json(&json!({"code": code, "name": "phone", "public_key": waymark_proto::signing::public_key_b64(&key.verifying_key())}))
        .send().await.unwrap().json().await.unwrap();
    let revision = w.detail(&task).await.task.plan_revision;
    let now = chrono::Utc::now();
    let cmd = waymark_proto::SteerCommand {
        command_id: waymark_proto::ids::command(),
        task_id: Some(task.clone()),
        expected_plan_revision: Some(revision),
        operation: waymark_proto::Operation::SuspendAndReplan,
        scope: vec!["deploy".into()],
        args: json!({"instructions": "do not deploy; write the report only"}),
        issued_by: format!("user:{owner}"),
        device_id: dev["id"].as_str().unwrap().to_owned(),
        issued_at: now,
        expires_at: now + chrono::Duration::minutes(5),
    };
    let env = waymark_proto::signing::sign(&cmd, &key).unwrap();
    let res: Value = http
        .post(format!("{}/v1/commands", w.server.url()))
        .json(&env)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(res["status"], "applied", "{res}");

    let summary = run.await.unwrap().unwrap();
    assert_eq!(summary.outcome, FinishOutcome::Completed, "{summary:?}");
    assert!(w.deploy_log().deploys.is_empty(), "nothing was deployed");
    let d = w.detail(&task).await;
    assert!(
        d.artifacts.iter().any(|a| a.name == "report.md"),
        "the report is kept"
    );
    assert!(
        d.effects.iter().all(|e| e.kind != "deploy"),
        "the deploy was never even declared"
    );
    assert!(
        d.decisions
            .iter()
            .any(|x| x.id == decision && x.status == waymark_proto::DecisionStatus::Void)
    );
    assert!(
        d.messages
            .iter()
            .any(|m| m.text.contains("do not deploy; write the report only"))
    );
    assert!(lines.lock().unwrap().iter().any(|p| p.step == "replan"));
}
