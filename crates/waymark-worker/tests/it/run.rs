use std::time::Duration;

use serde_json::json;
use waymark_proto::CheckpointBody;
use waymark_worker::{AttemptOptions, Client, Error};

use crate::support::World;

fn body(summary: &str) -> CheckpointBody {
    CheckpointBody {
        reason: "step_completed".into(),
        summary: Some(summary.into()),
        ..CheckpointBody::default()
    }
}

/// Returns once the task's live attempt holds a lease renewed at the server's time now or
/// later: a heartbeat that came after this call.
async fn renewed_since_now(w: &World, task: &str) {
    let now_ms = w.server.state.now_ms();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let detail = w.detail(task).await;
        let attempt = detail.attempts.last().expect("the task has an attempt");
        let ends = attempt.expires_at.timestamp_millis();
        assert!(
            attempt.state == waymark_proto::AttemptState::Active && ends > w.server.state.now_ms(),
            "the lease ran out: {attempt:?}"
        );
        // A renewal sets the lease's end a lease length (1 s) after its own time.
        if ends >= now_ms + 1000 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no heartbeat renewed the lease within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn the_heartbeat_keeps_a_short_lease_alive_and_a_resumed_run_continues_the_chain() {
    let w = World::start().await;
    let task = w.task("chain").await;
    let run = w
        .client
        .start_attempt(
            &task,
            AttemptOptions::new("w").lease(Duration::from_secs(1)),
        )
        .await
        .unwrap();
    assert!(run.resumed_from().is_none());
    assert_eq!(run.checkpoint(body("one")).await.unwrap().sequence, 1);
    // Three lease lengths pass on the server's clock, half a lease at a time, each step taken
    // once the heartbeat renewed the lease from the time the step before reached (without the
    // renewals the second step would end the lease, and the sweep each step runs revoke it).
    for _ in 0..6 {
        renewed_since_now(&w, &task).await;
        w.server
            .advance(Duration::from_millis(500))
            .await
            .expect("the world runs on a driven clock");
    }
    renewed_since_now(&w, &task).await;
    // Three lease lengths later the lease is still ours.
    let second = w
        .client
        .start_attempt(&task, AttemptOptions::new("other"))
        .await;
    assert!(matches!(second, Err(Error::LeaseHeld { .. })), "{second:?}");
    assert_eq!(run.checkpoint(body("two")).await.unwrap().sequence, 2);
    run.finish(waymark_proto::FinishOutcome::Released, None)
        .await
        .unwrap();

    let resumed = w
        .client
        .start_attempt(&task, AttemptOptions::new("w2"))
        .await
        .unwrap();
    let from = resumed.resumed_from().unwrap();
    assert_eq!(from.sequence, 2);
    let three = resumed.checkpoint(body("three")).await.unwrap();
    assert_eq!(three.sequence, 3);
    assert_eq!(three.prev_digest.as_deref(), Some(from.digest.as_str()));
    assert!(w.detail(&task).await.chain.intact);
}

#[tokio::test]
async fn a_sequence_taken_by_another_writer_is_a_conflict_not_a_skip() {
    let w = World::start().await;
    let task = w.task("conflict").await;
    let run = w
        .client
        .start_attempt(&task, AttemptOptions::new("w"))
        .await
        .unwrap();
    // Someone else (with the same credentials) appends sequence 1 behind the run's back.
    let res = reqwest::Client::new()
        .post(format!("{}/v1/tasks/{task}/checkpoints", w.server.url()))
        .bearer_auth(&w.token)
        .json(&json!({"attempt_id": run.attempt().id, "fence": run.fence(), "sequence": 1, "body": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    let err = run.checkpoint(body("mine")).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::SequenceConflict {
                current: Some(1),
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(run.last_sequence(), 0, "the run does not pretend it wrote");
}

#[tokio::test]
async fn a_lost_lease_fires_the_cancellation_token_and_later_writes_fail_typed() {
    let w = World::start().await;
    let task = w.task("lease loss").await;
    let run = w
        .client
        .start_attempt(
            &task,
            AttemptOptions::new("w").lease(Duration::from_secs(1)),
        )
        .await
        .unwrap();
    run.stop_heartbeat();
    w.server.advance(Duration::from_millis(1300)).await.unwrap();
    let err = run.checkpoint(body("late")).await.unwrap_err();
    assert!(matches!(err, Error::LeaseLost { .. }), "{err}");
    assert!(run.cancelled().is_cancelled());
    // Refused locally from now on, without another round trip.
    assert!(matches!(
        run.say("hello").await,
        Err(Error::LeaseLost { .. })
    ));
    let takeover = w
        .client
        .start_attempt(&task, AttemptOptions::new("w2"))
        .await
        .unwrap();
    assert_eq!(takeover.fence(), 2);
}

#[tokio::test]
async fn an_unreachable_server_is_reported_as_such() {
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let client = Client::new(&url, "wmk_w_nothing").unwrap();
    let started = std::time::Instant::now();
    let err = client.health().await.unwrap_err();
    assert!(matches!(err, Error::Unreachable { .. }), "{err}");
    assert!(err.to_string().contains("waymark serve"), "{err}");
    assert!(
        started.elapsed() > Duration::from_millis(500),
        "it retried with backoff"
    );
}

#[tokio::test]
async fn a_refusal_is_not_retried_and_carries_the_problem() {
    let w = World::start().await;
    let client = Client::new(&w.server.url(), "wmk_w_not-a-token").unwrap();
    let started = std::time::Instant::now();
    let err = client.task("task_x").await.unwrap_err();
    assert_eq!(
        err.code(),
        Some(waymark_proto::ErrorCode::Unauthorized),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_millis(500));
}
