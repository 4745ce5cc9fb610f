use std::collections::BTreeSet;
use std::time::Duration;

use eventsource_stream::Eventsource;
use futures::StreamExt;
use rand::{Rng, SeedableRng};
use reqwest::StatusCode;

use crate::support::{Harness, assert_problem, test_config};

/// Reads up to `take` events from the stream, resuming after `last`; returns what it saw.
async fn read_some(h: &Harness, last: Option<i64>, take: usize) -> Vec<(i64, String)> {
    let mut req = h.http.get(h.url("/v1/events")).bearer_auth(&h.admin);
    if let Some(l) = last {
        req = req.header("Last-Event-ID", l.to_string());
    }
    let res = req.send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["content-type"], "text/event-stream");
    let mut stream = res.bytes_stream().eventsource();
    let mut out = Vec::new();
    while out.len() < take {
        match tokio::time::timeout(Duration::from_secs(2), stream.next()).await {
            Ok(Some(Ok(ev))) => {
                let data: serde_json::Value = serde_json::from_str(&ev.data).unwrap();
                let cursor: i64 = ev.id.parse().unwrap();
                assert_eq!(data["cursor"], cursor);
                assert_eq!(data["kind"], ev.event.as_str());
                out.push((cursor, ev.event));
            }
            Ok(other) => panic!("stream ended: {other:?}"),
            Err(_) => break,
        }
    }
    out // dropping the stream disconnects
}

#[tokio::test]
async fn a_reader_that_disconnects_at_random_points_resumes_without_gap_or_duplicate() {
    let h = std::sync::Arc::new(Harness::start().await);
    let task = h.create_task(&h.alice).await;
    let (att, fence) = h.attempt(&h.alice, &task, 120).await;

    // 1,000 checkpoints written while the reader comes and goes.
    let writer = {
        let (h, task, att) = (h.clone(), task.clone(), att.clone());
        tokio::spawn(async move {
            for seq in 1..=1000 {
                let (s, v) = h.checkpoint(&h.alice, &task, &att, fence, seq).await;
                assert_eq!(s, StatusCode::CREATED, "{v}");
            }
        })
    };

    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut seen: Vec<i64> = Vec::new();
    let mut reconnects = 0;
    let mut done = false;
    while !done {
        let take = rng.gen_range(1..150);
        let got = read_some(&h, seen.last().copied(), take).await;
        reconnects += 1;
        seen.extend(got.iter().map(|(c, _)| *c));
        if writer.is_finished() {
            let (_, health) = h.get(&h.admin, "/healthz").await;
            done = seen.last() == health["cursor"].as_i64().as_ref();
        }
        assert!(reconnects < 10_000);
    }
    writer.await.unwrap();

    let unique: BTreeSet<i64> = seen.iter().copied().collect();
    assert_eq!(unique.len(), seen.len(), "a duplicate was delivered");
    let max = *seen.last().unwrap();
    assert_eq!(
        seen,
        (1..=max).collect::<Vec<_>>(),
        "a gap: events are not contiguous"
    );
    assert!(max >= 1000);
    assert!(
        reconnects > 10,
        "the test should disconnect many times, did {reconnects}"
    );
}

#[tokio::test]
async fn a_cursor_older_than_retention_is_answered_410_and_the_snapshot_is_current() {
    let h = Harness::start_with(waymark_server::Config {
        event_retention: 20,
        ..test_config()
    })
    .await;
    let task = h.create_task(&h.alice).await;
    let (att, fence) = h.attempt(&h.alice, &task, 120).await;
    for seq in 1..=60 {
        h.checkpoint(&h.alice, &task, &att, fence, seq).await;
    }
    let (s, v) = h
        .post(&h.admin, "/v1/admin/events/prune", serde_json::json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let pruned = v["pruned_through"].as_i64().unwrap();
    assert!(pruned > 1, "{v}");

    let (s, v) = h.get(&h.admin, "/v1/events?after=1").await;
    assert_problem(s, &v, 410, "cursor_expired");
    let res = h
        .http
        .get(h.url("/v1/events"))
        .bearer_auth(&h.admin)
        .header("Last-Event-ID", "2")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::GONE);
    assert_eq!(res.headers()["content-type"], "application/problem+json");

    // The way back: a snapshot, then the stream from its cursor.
    let (s, snap) = h.get(&h.admin, "/v1/snapshot").await;
    assert_eq!(s, StatusCode::OK);
    let cursor = snap["cursor"].as_i64().unwrap();
    assert_eq!(snap["tasks"][0]["last_sequence"], 60);
    let res = h
        .http
        .get(h.url(&format!("/v1/events?after={cursor}")))
        .bearer_auth(&h.admin)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    // Right at the retention edge is still served.
    let res = h
        .http
        .get(h.url(&format!("/v1/events?after={pruned}")))
        .bearer_auth(&h.admin)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_user_streams_only_their_own_tasks() {
    let h = Harness::start().await;
    let mine = h.create_task(&h.alice).await;
    let _theirs = h.create_task(&h.bob).await;
    let res = h
        .http
        .get(h.url("/v1/events"))
        .bearer_auth(&h.alice)
        .send()
        .await
        .unwrap();
    let mut stream = res.bytes_stream().eventsource();
    let ev = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let data: serde_json::Value = serde_json::from_str(&ev.data).unwrap();
    assert_eq!(data["task_id"], mine.as_str());
    assert!(
        tokio::time::timeout(Duration::from_millis(300), stream.next())
            .await
            .is_err(),
        "bob's task leaked"
    );
}

#[tokio::test]
async fn a_devices_stream_ends_when_its_session_does() {
    let h = Harness::start().await;
    let d = h.pair_device("alice", &["view"]).await;
    let token = h.session_token(&d).await;
    let task = h.create_task(&h.alice).await;
    let res = h
        .http
        .get(h.url("/v1/events"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let mut stream = res.bytes_stream().eventsource();
    let ev = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("the task's event")
        .unwrap()
        .unwrap();
    assert!(ev.data.contains(&task), "{}", ev.data);
    // Within the session (15 minutes) the stream stays open…
    h.advance(Duration::from_secs(14 * 60)).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(300), stream.next())
            .await
            .is_err(),
        "the stream ended inside its session"
    );
    // …and ends when the session does (the clock moved past it), without an event.
    h.advance(Duration::from_secs(2 * 60)).await;
    let end = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("the stream outlived its session");
    assert!(end.is_none(), "ended, not another event: {end:?}");
    // The session is over: a new stream needs a new one.
    let (s, _) = h.get(&token, "/v1/events").await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
}

/// Revoking a device ends its open event stream at once — no clock moves, no event is sent —
/// and every later session it asks for is refused.
#[tokio::test]
async fn a_revoked_devices_stream_ends_at_once() {
    let h = Harness::start().await;
    let d = h.pair_device("alice", &["view"]).await;
    let other = h.pair_device("alice", &["view"]).await;
    let token = h.session_token(&d).await;
    let other_token = h.session_token(&other).await;
    let task = h.create_task(&h.alice).await;
    let open = |token: String| {
        let h = &h;
        async move {
            let res = h
                .http
                .get(h.url("/v1/events"))
                .bearer_auth(&token)
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), StatusCode::OK);
            res.bytes_stream().eventsource()
        }
    };
    let mut stream = open(token.clone()).await;
    let mut others = open(other_token.clone()).await;
    for s in [&mut stream, &mut others] {
        let ev = tokio::time::timeout(Duration::from_secs(5), s.next())
            .await
            .expect("the task's event")
            .unwrap()
            .unwrap();
        assert!(ev.data.contains(&task), "{}", ev.data);
    }
    waymark_server::steer::revoke_device(&*h.server.state.store, &d.id)
        .await
        .unwrap();
    let end = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("the revoked device's stream stayed open");
    assert!(end.is_none(), "ended, not another event: {end:?}");
    // The same user's other device listens on, and is sent nothing of the revocation.
    let next = h.create_task(&h.alice).await;
    let ev = tokio::time::timeout(Duration::from_secs(5), others.next())
        .await
        .expect("the other device's next event")
        .unwrap()
        .unwrap();
    assert!(
        ev.data.contains(&next),
        "only the task's event: {} {}",
        ev.event,
        ev.data
    );
    let (s, _) = h.get(&token, "/v1/events").await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
}

/// A connection that asks for the event stream moves to the people's lane (a runtime of its
/// own, at a lower priority), even after serving other requests first — a browser reuses a
/// kept-alive connection for its `EventSource` — and the stream goes on there: events written
/// after the move arrive. Requests that are not the stream do not move.
#[tokio::test]
async fn the_event_stream_moves_to_the_peoples_lane_and_keeps_streaming() {
    let h = Harness::start().await;
    let moved = || h.server.state.metrics.people_lane_connections.get();
    let task = h.create_task(&h.alice).await;
    let (att, fence) = h.attempt(&h.alice, &task, 120).await;
    let (s, _) = h.get(&h.admin, "/v1/snapshot").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(moved(), 0, "no request but the stream moves");

    // One connection: a request first, then the stream on it.
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(1)
        .build()
        .unwrap();
    let first = client.get(h.url("/healthz")).send().await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    first.bytes().await.unwrap();
    let res = client
        .get(h.url("/v1/events"))
        .bearer_auth(&h.admin)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(moved(), 1);
    let mut stream = res.bytes_stream().eventsource();
    let (s, v) = h.checkpoint(&h.alice, &task, &att, fence, 1).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let cursor = v["cursor"].as_i64().unwrap();
    let mut seen = Vec::new();
    while !seen.contains(&cursor) {
        let ev = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("the stream went quiet after moving")
            .expect("the stream ended")
            .unwrap();
        seen.push(ev.id.parse::<i64>().unwrap());
    }
    assert_eq!(moved(), 1);
}
