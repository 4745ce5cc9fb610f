use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::json;
use waymark_proto::{EffectStatus, ErrorCode};
use waymark_worker::deploy_service::DeployClient;
use waymark_worker::{AttemptOptions, Error, ProviderError, Resolution};

use crate::support::World;

fn lease(secs: u64) -> AttemptOptions {
    AttemptOptions::new("w").lease(Duration::from_secs(secs))
}

#[tokio::test]
async fn a_crash_after_the_provider_committed_is_reconciled_by_the_next_attempt_without_a_second_deploy()
 {
    let w = World::start().await;
    let task = w.task("crash after commit").await;
    let key = format!("{task}/deploy/abc");

    // The first worker deploys, then dies before it can record the receipt.
    let crashed = {
        let (client, deploy, task, key) = (
            w.client.clone(),
            w.deploy.clone(),
            task.clone(),
            key.clone(),
        );
        tokio::spawn(async move {
            let run = client.start_attempt(&task, lease(1)).await.unwrap();
            let provider = &deploy;
            let _ = run
                .effect(key, "deploy", json!({"target": "staging", "commit": "abc"}))
                .run(&deploy, |ctx| async move {
                    provider.deploy(&ctx, "staging", "abc").await.unwrap();
                    panic!("the worker dies right after the provider committed");
                })
                .await;
        })
    };
    assert!(crashed.await.unwrap_err().is_panic());
    let d = w.detail(&task).await;
    assert_eq!(d.effects[0].status, EffectStatus::InProgress);
    assert_eq!(w.deploy_log().deploys.len(), 1);

    // The next worker queries before it retries, finds the deploy, records it.
    let run = w
        .client
        .start_attempt(&task, lease(10).wait_for_lease(Duration::from_secs(10)))
        .await
        .unwrap();
    assert_eq!(run.fence(), 2);
    let calls = AtomicUsize::new(0);
    let done = run
        .effect(
            key.clone(),
            "deploy",
            json!({"target": "staging", "commit": "abc"}),
        )
        .run(&w.deploy, |_ctx| async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(ProviderError::Failed {
                compensable: false,
                reason: "must not run".into(),
            })
        })
        .await
        .unwrap();
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "a confirmed deploy is never resent"
    );
    assert_eq!(done.resolution, Resolution::Reconciled);
    assert_eq!(done.effect.status, EffectStatus::Confirmed);
    let log = w.deploy_log();
    assert_eq!(
        log.deploys.len(),
        1,
        "the deploy service saw exactly one deploy"
    );
    assert_eq!(done.receipt, serde_json::to_value(&log.deploys[0]).unwrap());
    assert_eq!(done.effect.fence, 2);
}

#[tokio::test]
async fn a_stale_worker_that_wakes_after_a_newer_one_deployed_is_refused_by_the_deploy_service() {
    let w = World::start().await;
    let task = w.task("partitioned worker").await;
    let intent = json!({"target": "staging", "commit": "abc"});
    let key = format!("{task}/deploy/abc");

    let stale = w.client.start_attempt(&task, lease(1)).await.unwrap();
    let (in_progress_tx, in_progress_rx) = tokio::sync::oneshot::channel();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let stale_deploy = {
        let (deploy, key, intent) = (w.deploy.clone(), key.clone(), intent.clone());
        async move {
            let (provider, worker) = (&deploy, &stale);
            let res = stale
                .effect(key, "deploy", intent)
                .run(&deploy, |ctx| async move {
                    // Hung (or partitioned) with the effect in progress, past its lease.
                    worker.stop_heartbeat();
                    in_progress_tx.send(()).unwrap();
                    go_rx.await.unwrap();
                    let refused = provider.deploy(&ctx, "staging", "abc").await;
                    assert!(
                        matches!(&refused, Err(ProviderError::Failed { reason, .. }) if reason.contains("fence 1 is older than fence 2")),
                        "{refused:?}"
                    );
                    refused
                })
                .await;
            (res, stale)
        }
    };
    let stale_deploy = tokio::spawn(stale_deploy);
    in_progress_rx.await.unwrap();

    // A second worker takes over once the lease ran out, reconciles, and deploys.
    let run = w
        .client
        .start_attempt(&task, lease(10).wait_for_lease(Duration::from_secs(10)))
        .await
        .unwrap();
    let done = run
        .effect(key.clone(), "deploy", intent)
        .run(&w.deploy, |ctx| {
            let deploy = w.deploy.clone();
            async move { deploy.deploy(&ctx, "staging", "abc").await }
        })
        .await
        .unwrap();
    assert_eq!(done.resolution, Resolution::Ran);
    assert_eq!(done.receipt["fence"], 2);

    // The stale worker wakes: the deploy service refuses it, and so does the control plane.
    go_tx.send(()).unwrap();
    let (res, stale) = stale_deploy.await.unwrap();
    assert!(matches!(res, Err(Error::Fenced { .. })), "{res:?}");
    assert!(stale.cancelled().is_cancelled());
    let log = w.deploy_log();
    assert_eq!(log.deploys.len(), 1);
    assert_eq!(log.refusals.len(), 1);
    assert_eq!(log.refusals[0].fence, 1);
    assert_eq!(log.refusals[0].highest_fence, 2);
    let d = w.detail(&task).await;
    assert_eq!(d.effects[0].status, EffectStatus::Confirmed);
    assert_eq!(d.effects[0].fence, 2);
}

#[tokio::test]
async fn a_confirmed_effect_is_returned_on_resume_without_running_and_a_changed_intent_is_refused()
{
    let w = World::start().await;
    let task = w.task("idempotent").await;
    let intent = json!({"target": "staging", "commit": "abc"});
    let calls = Arc::new(AtomicUsize::new(0));
    let call = |ctx: waymark_worker::EffectCtx| {
        let (deploy, calls) = (w.deploy.clone(), calls.clone());
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            deploy.deploy(&ctx, "staging", "abc").await
        }
    };
    let first = w.client.start_attempt(&task, lease(1)).await.unwrap();
    let a = first
        .effect("k1", "deploy", intent.clone())
        .run(&w.deploy, call)
        .await
        .unwrap();
    assert_eq!(a.resolution, Resolution::Ran);
    // The same call again in the same attempt: already confirmed, nothing runs.
    let again = first
        .effect("k1", "deploy", intent.clone())
        .run(&w.deploy, call)
        .await
        .unwrap();
    assert_eq!(again.resolution, Resolution::AlreadyConfirmed);
    first.stop_heartbeat();
    drop(first);

    let second = w
        .client
        .start_attempt(&task, lease(10).wait_for_lease(Duration::from_secs(10)))
        .await
        .unwrap();
    let b = second
        .effect("k1", "deploy", intent)
        .run(&w.deploy, call)
        .await
        .unwrap();
    assert_eq!(b.resolution, Resolution::AlreadyConfirmed);
    assert_eq!(b.receipt, a.receipt);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(w.deploy_log().deploys.len(), 1);

    let err = second
        .effect(
            "k1",
            "deploy",
            json!({"target": "production", "commit": "abc"}),
        )
        .run(&w.deploy, call)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::IdempotencyMismatch), "{err}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn when_the_provider_cannot_be_asked_the_effect_stays_unknown_and_nothing_is_retried() {
    let w = World::start().await;
    let task = w.task("unknown").await;
    let intent = json!({"target": "staging"});
    let first = w.client.start_attempt(&task, lease(1)).await.unwrap();
    let _ = first
        .effect("k", "deploy", intent.clone())
        .run(&w.deploy, |_| async {
            Err(ProviderError::Unknown {
                reason: "the connection broke mid-request".into(),
            })
        })
        .await;
    assert_eq!(
        w.detail(&task).await.effects[0].status,
        EffectStatus::Unknown
    );
    first.stop_heartbeat();
    drop(first);

    // The provider is down when the next worker asks: it must not guess.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead = DeployClient::new(&format!("http://{}", closed.local_addr().unwrap())).unwrap();
    drop(closed);
    let second = w
        .client
        .start_attempt(&task, lease(10).wait_for_lease(Duration::from_secs(10)))
        .await
        .unwrap();
    let calls = AtomicUsize::new(0);
    let err = second
        .effect("k", "deploy", intent.clone())
        .run(&dead, |_| async {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok(json!({}))
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::EffectUnknown { .. }), "{err}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!(
        w.detail(&task).await.effects[0].status,
        EffectStatus::Unknown
    );

    // Once the provider answers "never saw it", the effect runs under the current lease.
    let done = second
        .effect("k", "deploy", intent)
        .run(&w.deploy, |ctx| {
            let deploy = w.deploy.clone();
            async move { deploy.deploy(&ctx, "staging", "abc").await }
        })
        .await
        .unwrap();
    assert_eq!(done.resolution, Resolution::Ran);
    assert_eq!(w.deploy_log().deploys.len(), 1);
}

#[tokio::test]
async fn the_deploy_service_dedups_keys_refuses_stale_fences_and_keeps_its_log_across_restarts() {
    let w = World::start().await;
    let ctx = |fence: i64, key: &str| waymark_worker::EffectCtx {
        idempotency_key: key.into(),
        fence,
        attempt_id: "att_x".into(),
        task_id: "task_x".into(),
        effect_id: "eff_x".into(),
    };
    let first = w
        .deploy
        .deploy(&ctx(3, "a"), "staging", "c1")
        .await
        .unwrap();
    let repeat = w
        .deploy
        .deploy(&ctx(3, "a"), "staging", "c1")
        .await
        .unwrap();
    assert_eq!(first, repeat, "a repeat returns the first result");
    let other = w.deploy.deploy(&ctx(3, "a"), "staging", "c2").await;
    assert!(
        matches!(other, Err(ProviderError::Failed { .. })),
        "{other:?}"
    );
    let stale = w.deploy.deploy(&ctx(2, "b"), "staging", "c1").await;
    assert!(
        matches!(&stale, Err(ProviderError::Failed { reason, .. }) if reason.contains("older than fence 3")),
        "{stale:?}"
    );
    assert!(w.deploy.get("b").await.unwrap().is_none());

    // A second service over the same state file knows everything the first did.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let again = tokio::spawn(waymark_worker::deploy_service::serve(
        listener,
        w.deploy_state.clone(),
    ));
    let restarted = DeployClient::new(&url).unwrap();
    let log = restarted.log().await.unwrap();
    assert_eq!(log.deploys.len(), 1);
    assert_eq!(log.refusals.len(), 1);
    assert_eq!(
        serde_json::to_value(restarted.get("a").await.unwrap().unwrap()).unwrap(),
        first
    );
    again.abort();
}
