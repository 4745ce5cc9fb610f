use serde_json::json;
use waymark_proto::digest::json_digest;
use waymark_proto::{DecisionStatus, EffectStatus, FinishOutcome, TaskState};
use waymark_worker::Resolution;
use waymark_worker::demo::{self, AutoApprove};

use crate::support::{World, recorder};

#[tokio::test]
async fn the_approved_run_checkpoints_every_boundary_stores_its_evidence_and_deploys_once() {
    let w = World::start().await;
    let (reporter, lines) = recorder();
    let summary = demo::run(w.demo_config(Some(AutoApprove::Yes)), reporter)
        .await
        .unwrap();
    assert_eq!(summary.outcome, FinishOutcome::Completed);
    let d = w.detail(&summary.task_id).await;
    assert_eq!(d.task.state, TaskState::Completed);

    // The chain: reproduce, fix, verify, human wait, effect boundary — and it verifies.
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
            "step_completed",
            "human_wait",
            "effect_boundary"
        ]
    );
    for pair in d.checkpoints.windows(2) {
        assert_eq!(
            pair[1].prev_digest.as_deref(),
            Some(pair[0].digest.as_str())
        );
    }

    // The receipts: a failing one naming the alert's test, then a passing one at the fix.
    assert_eq!(d.test_receipts.len(), 2);
    let (before, after) = (&d.test_receipts[0], &d.test_receipts[1]);
    assert!(!before.passed);
    assert_eq!(before.totals.failures, 1);
    assert_eq!(before.failures[0].name, "test_percentage_discount");
    assert!(after.passed, "{after:?}");
    assert_eq!(after.totals.passed, 4);
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
    let approval = &d.decisions[0];
    assert_eq!(approval.status, DecisionStatus::Resolved);
    let intent = approval.intent.clone().unwrap();
    assert_eq!(intent["target"], "staging");
    assert_eq!(intent["commit"], commit.as_str());
    assert_eq!(intent["artifact_digests"]["fix.diff"], diff.sha256.as_str());
    assert_eq!(
        intent["artifact_digests"]["junit-verify.xml"],
        after.junit_sha256.as_str()
    );
    assert_eq!(approval.intent_digest, json_digest(&intent));
    let wait = &d.checkpoints[3].body;
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
    let summary = demo::run(w.demo_config(Some(AutoApprove::No)), reporter)
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
    let summary = demo::run(w.demo_config(Some(AutoApprove::Report)), reporter)
        .await
        .unwrap();
    assert_eq!(summary.outcome, FinishOutcome::Completed);
    let d = w.detail(&summary.task_id).await;
    assert_eq!(d.task.state, TaskState::Completed);
    assert!(d.artifacts.iter().any(|a| a.name == "report.md"));
    assert!(w.deploy_log().deploys.is_empty());
    assert_eq!(
        d.decisions[0].outcome.as_ref().unwrap().option.as_deref(),
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
    let run = tokio::spawn(demo::run(cfg, reporter));
    // A person answers once the demo says it waits for them (and how to answer).
    let decision = loop {
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
