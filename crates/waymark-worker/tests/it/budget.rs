//! Budget decisions and bounded retries through the SDK, against the real control plane.

use std::time::{Duration, Instant};

use serde_json::json;
use waymark_proto::{
    Budget, CreateTask, DecisionKind, DecisionStatus, PlanStep, RequestDecision, TaskState,
};
use waymark_worker::{
    AttemptOptions, DELIVER_PARTIAL, Error, PartialDelivery, Retried, chosen_option,
};

use crate::support::World;

async fn budgeted(w: &World, decision_seconds: u64) -> String {
    w.client
        .create_task(&CreateTask {
            title: "budgeted".into(),
            goal: String::new(),
            runtime: Some("test".into()),
            budget: Budget {
                max_tokens: Some(1000),
                decision_seconds: Some(decision_seconds),
                ..Budget::default()
            },
            plan: vec![PlanStep {
                id: "verify".into(),
                title: "verify".into(),
                depends_on: vec![],
            }],
            materials: Default::default(),
            external_key: None,
        })
        .await
        .unwrap()
        .id
}

#[tokio::test]
async fn usage_hands_the_worker_the_budget_decision_and_budget_choice_waits_for_the_person() {
    let w = World::start().await;
    let task = budgeted(&w, 60).await;
    let run = w
        .client
        .start_attempt(&task, AttemptOptions::new("w"))
        .await
        .unwrap();
    let under = run.usage(500, 0.01, 1).await.unwrap();
    assert!(under.budget_decision.is_none());
    assert_eq!(under.task.usage.tokens, 500);
    let over = run.usage(350, 0.01, 1).await.unwrap();
    assert_eq!(over.task.usage.tokens, 850);
    let d = over.budget_decision.expect("80% crossed");
    assert_eq!(d.kind, DecisionKind::Budget);
    assert_eq!(d.status, DecisionStatus::Pending);

    let waiting = {
        let d = d.clone();
        let run = &run;
        async move { run.budget_choice(&d).await }
    };
    let answer = async {
        // The person answers while the worker's long-poll waits on the server.
        w.metric_reaches("waymark_decision_waits", 1.0).await;
        w.admin_post(
            &format!("/v1/admin/decisions/{}/resolve", d.id),
            json!({"option": "full_suite"}),
        )
        .await
    };
    let (closed, (status, _)) = tokio::join!(waiting, answer);
    assert_eq!(status, 200);
    let closed = closed.unwrap();
    assert_eq!(closed.status, DecisionStatus::Resolved);
    assert_eq!(chosen_option(&closed), Some("full_suite"));
    // A closed decision is answered at once.
    let again = run.budget_choice(&closed).await.unwrap();
    assert_eq!(again, closed);
}

#[tokio::test]
async fn a_budget_decision_nobody_answers_closes_with_its_default() {
    let w = World::start().await;
    let task = budgeted(&w, 1).await;
    let run = w
        .client
        .start_attempt(&task, AttemptOptions::new("w"))
        .await
        .unwrap();
    let d = run
        .usage(1000, 0.0, 0)
        .await
        .unwrap()
        .budget_decision
        .unwrap();
    assert!(d.question.starts_with("100%"), "{}", d.question);
    let started = Instant::now();
    let closed = run.budget_choice(&d).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(closed.status, DecisionStatus::Expired);
    assert_eq!(chosen_option(&closed), Some("deliver_patch"));
    assert_eq!(closed.outcome.unwrap().by, "default");
}

#[tokio::test]
async fn retry_step_retries_the_steps_own_failures_only_and_stops_at_the_bound() {
    let w = World::start().await;
    let task = w.task("retries").await;
    let run = w
        .client
        .start_attempt(&task, AttemptOptions::new("w"))
        .await
        .unwrap();

    // Fails once, then passes.
    let mut seen = Vec::new();
    let r = run
        .retry_step("verify", 3, |n| {
            seen.push(n);
            async move {
                Ok::<_, Error>(if n < 2 {
                    Err(format!("try {n}"))
                } else {
                    Ok(n * 10)
                })
            }
        })
        .await
        .unwrap();
    assert_eq!(seen, [1, 2]);
    match r {
        Retried::Succeeded {
            value,
            attempts,
            failures,
        } => assert_eq!(
            (value, attempts, failures),
            (20, 2, vec!["try 1".to_owned()])
        ),
        Retried::Exhausted(e) => panic!("{e:?}"),
    }

    // An outer error is not retried.
    let mut calls = 0;
    let r: Result<Retried<(), ()>, Error> = run
        .retry_step("verify", 3, |_| {
            calls += 1;
            async { Err(Error::Transport("the tool could not start".into())) }
        })
        .await;
    assert!(matches!(r, Err(Error::Transport(_))), "{r:?}");
    assert_eq!(calls, 1);

    // Always failing: exactly `bound` tries, then a typed outcome.
    let mut calls = 0;
    let r = run
        .retry_step("verify", 3, |n| {
            calls += 1;
            async move { Ok::<Result<(), String>, Error>(Err(format!("flaky {n}"))) }
        })
        .await
        .unwrap();
    assert_eq!(calls, 3);
    let Retried::Exhausted(e) = r else {
        panic!("not exhausted")
    };
    assert_eq!(e.failures, ["flaky 1", "flaky 2", "flaky 3"]);

    // Past the bound a person decides; the default delivers partially.
    let req: RequestDecision = e.decision("verify failed 3 times: flaky 3");
    let opened = run.open_decision(req).await.unwrap();
    assert_eq!(opened.kind, DecisionKind::Recovery);
    assert_eq!(opened.step.as_deref(), Some("verify"));
    assert_eq!(w.detail(&task).await.task.state, TaskState::WaitingHuman);
    let (s, _) = w
        .admin_post(
            &format!("/v1/admin/decisions/{}/resolve", opened.id),
            json!({"option": DELIVER_PARTIAL}),
        )
        .await;
    assert_eq!(s, 200);
    let closed = run.await_decision(&opened.id).await.unwrap();
    assert_eq!(chosen_option(&closed), Some(DELIVER_PARTIAL));
    let delivery = PartialDelivery {
        delivered: "the patch".into(),
        verified: vec!["4 of 5 tests pass".into()],
        not_verified: vec![
            "test_promo: failed all 3 tries".into(),
            "the deploy: not done".into(),
        ],
    };
    run.deliver_partially(&delivery).await.unwrap();
    let d = w.detail(&task).await;
    assert_eq!(d.task.state, TaskState::PartiallyDelivered);
    assert_eq!(d.task.outcome_summary, Some(delivery.summary()));
    assert!(
        delivery
            .summary()
            .contains("Not verified:\n- test_promo: failed all 3 tries\n- the deploy: not done")
    );
}
