//! The PostgreSQL store against a real server: the conformance story, then what only several
//! replicas on one database can break (fan-out, races on one task, cursor order).
//!
//! The server is `WAYMARK_TEST_DATABASE_URL` or, when that is unset, the throwaway cluster of
//! `scripts/postgres-test-server` (started on first use). No test is skipped: without
//! PostgreSQL they fail and say how to get it. Each test works in a database of its own.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use sqlx::{Connection, PgConnection};
use tokio::sync::Barrier;
use waymark_store::*;
use waymark_store_postgres::{PgOptions, PgStore};

use waymark_store_postgres::testing::{server_url, with_database};

/// A database of one test's own, dropped by [`TestDb::drop_db`] when the test passes.
struct TestDb {
    name: String,
    url: String,
}

impl TestDb {
    async fn new() -> TestDb {
        let name = format!("waymark_t_{:016x}", rand::random::<u64>());
        let mut admin = PgConnection::connect(server_url())
            .await
            .unwrap_or_else(|e| panic!("cannot reach the test server {}: {e}", server_url()));
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .await
            .unwrap();
        admin.close().await.unwrap();
        TestDb {
            url: with_database(server_url(), &name),
            name,
        }
    }

    async fn store(&self) -> PgStore {
        PgStore::connect(&self.url).await.unwrap()
    }

    /// A plain connection, for looking behind the store's back.
    async fn conn(&self) -> PgConnection {
        PgConnection::connect(&self.url).await.unwrap()
    }

    async fn drop_db(self, stores: &[&PgStore]) {
        for s in stores {
            s.close().await;
        }
        let mut admin = PgConnection::connect(server_url()).await.unwrap();
        sqlx::query(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        ))
        .execute(&mut admin)
        .await
        .unwrap();
    }
}

fn user(id: &str) -> UserRow {
    UserRow {
        id: id.into(),
        name: id.trim_start_matches("usr_").into(),
        created_at: 1,
    }
}

fn task(id: &str, owner: &str) -> TaskRow {
    TaskRow {
        id: id.into(),
        owner_id: owner.into(),
        title: "t".into(),
        goal: "g".into(),
        runtime: None,
        state: TaskState::Queued,
        plan: Vec::new(),
        plan_revision: 1,
        budget: Budget::default(),
        usage: Usage::default(),
        materials: Materials::default(),
        session_id: format!("ses_{id}"),
        fence: 0,
        outcome_summary: None,
        created_at: 1,
        updated_at: 1,
        parent_id: None,
        external_key: None,
        machine_id: None,
    }
}

fn event(task_id: &str, n: i64) -> NewEvent {
    NewEvent {
        task_id: task_id.into(),
        owner_id: "usr_alice".into(),
        kind: EventKind::TaskUpdated,
        data: json!({ "n": n }),
        at: n,
    }
}

fn checkpoint(task_id: &str, sequence: i64, attempt: &str) -> CheckpointRow {
    CheckpointRow {
        task_id: task_id.into(),
        sequence,
        attempt_id: attempt.into(),
        fence: 1,
        body: json!({ "by": attempt }),
        prev_digest: None,
        digest: format!("d{sequence}"),
        created_at: 2,
    }
}

/// alice and her task `task_1`.
async fn seed(store: &PgStore) {
    let mut tx = store.write().await.unwrap();
    tx.insert_user(&user("usr_alice")).await.unwrap();
    tx.insert_task(&task("task_1", "usr_alice")).await.unwrap();
    tx.commit().await.unwrap();
}

#[tokio::test]
async fn store_story() {
    let db = TestDb::new().await;
    let store = db.store().await;
    assert_eq!(store.backend(), "postgres");
    waymark_store::story::run_store_story(&store).await;
    db.drop_db(&[&store]).await;
}

#[tokio::test]
async fn a_value_no_enum_knows_is_corruption_never_a_default() {
    let db = TestDb::new().await;
    let store = db.store().await;
    seed(&store).await;
    let mut conn = db.conn().await;
    sqlx::query("UPDATE tasks SET state = 'sideways' WHERE id = 'task_1'")
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    let said = story::assert_corrupt_task(&store, "task_1", "state").await;
    assert!(said.contains("sideways"), "{said}");
    db.drop_db(&[&store]).await;
}

/// A JSON column is read as the type it holds: a usage that is not one is corruption, never a
/// zero spend (which would reopen a spent budget).
#[tokio::test]
async fn a_json_value_not_of_its_type_is_corruption_never_a_default() {
    let db = TestDb::new().await;
    let store = db.store().await;
    seed(&store).await;
    let mut conn = db.conn().await;
    for (col, value) in story::CORRUPT_TASK_JSON {
        sqlx::query(&format!(
            "UPDATE tasks SET {col} = $1::jsonb WHERE id = 'task_1'"
        ))
        .bind(value)
        .execute(&mut conn)
        .await
        .unwrap();
        story::assert_corrupt_task(&store, "task_1", col).await;
    }
    conn.close().await.unwrap();
    db.drop_db(&[&store]).await;
}

#[tokio::test]
async fn a_newer_schema_is_refused_clearly() {
    let db = TestDb::new().await;
    let store = db.store().await;
    store.close().await;
    let mut conn = db.conn().await;
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
         VALUES (29991231000000, 'from the future', true, '\\x00', 0)",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();
    let err = PgStore::connect(&db.url)
        .await
        .err()
        .expect("a newer schema must be refused");
    assert!(
        matches!(
            err,
            StoreError::NewerSchema {
                found: 29991231000000,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("upgrade waymark"), "{err}");
    db.drop_db(&[]).await;
}

#[tokio::test]
async fn an_unreachable_server_is_an_open_error_without_the_password() {
    let err = PgStore::connect("postgres://waymark:hunter2@127.0.0.1:1/waymark")
        .await
        .err()
        .expect("nothing listens on port 1");
    assert!(matches!(err, StoreError::Open { .. }), "{err}");
    assert!(!err.to_string().contains("hunter2"), "{err}");
}

#[tokio::test]
async fn replicas_starting_together_migrate_once_and_see_each_others_commits_promptly() {
    let db = TestDb::new().await;
    let (a, b) = tokio::join!(PgStore::connect(&db.url), PgStore::connect(&db.url));
    let (a, b) = (a.unwrap(), b.unwrap());
    seed(&b).await;

    let mut watch_a = a.cursor_watch();
    let before = *watch_a.borrow_and_update();
    let mut tx = b.write().await.unwrap();
    let cursor = tx.append_event(&event("task_1", 1)).await.unwrap();
    let committed = Instant::now();
    tx.commit().await.unwrap();
    assert!(cursor > before);
    tokio::time::timeout(Duration::from_secs(2), watch_a.wait_for(|c| *c >= cursor))
        .await
        .expect("a commit through replica B must wake replica A's cursor watch within 2 s")
        .unwrap();
    let latency = committed.elapsed();
    let mut r = a.read().await.unwrap();
    let seen = r.events_after(before, 10, None).await.unwrap();
    assert_eq!(
        seen.iter().map(|e| e.cursor).collect::<Vec<_>>(),
        vec![cursor]
    );
    drop(r);
    eprintln!("fan-out latency B → A: {latency:?}");
    db.drop_db(&[&a, &b]).await;
}

/// Waits until `n` store listeners are connected to the database of `admin`.
async fn wait_for_listeners(admin: &mut PgConnection, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let listening: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM pg_stat_activity
              WHERE datname = current_database() AND application_name = 'waymark-listener'",
        )
        .fetch_one(&mut *admin)
        .await
        .unwrap();
        if listening == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{listening} listeners connected, not {n}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_lost_listener_reconnects_and_catches_up() {
    let db = TestDb::new().await;
    let a = db.store().await;
    let b = db.store().await;
    seed(&b).await;
    let mut watch_a = a.cursor_watch();
    let mut admin = db.conn().await;

    for round in 1..=2 {
        // Cut every listener connection of this database, then commit while they are away.
        wait_for_listeners(&mut admin, 2).await;
        let killed: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
              WHERE datname = current_database() AND application_name = 'waymark-listener') k",
        )
        .fetch_one(&mut admin)
        .await
        .unwrap();
        assert_eq!(killed, 2, "one listener per store");
        let mut tx = b.write().await.unwrap();
        let cursor = tx.append_event(&event("task_1", round)).await.unwrap();
        tx.commit().await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), watch_a.wait_for(|c| *c >= cursor))
            .await
            .unwrap_or_else(|_| {
                panic!("round {round}: A's watch missed a commit made while its listener was away")
            })
            .unwrap();
    }

    // Once its listener is back, A keeps following B's commits.
    wait_for_listeners(&mut admin, 2).await;
    let mut tx = b.write().await.unwrap();
    let cursor = tx.append_event(&event("task_1", 3)).await.unwrap();
    tx.commit().await.unwrap();
    tokio::time::timeout(Duration::from_secs(2), watch_a.wait_for(|c| *c >= cursor))
        .await
        .expect("after reconnecting, A must keep following B's commits")
        .unwrap();
    admin.close().await.unwrap();
    db.drop_db(&[&a, &b]).await;
}

#[tokio::test]
async fn sixteen_writers_on_two_replicas_race_for_each_checkpoint_sequence() {
    let db = TestDb::new().await;
    let stores = [Arc::new(db.store().await), Arc::new(db.store().await)];
    seed(&stores[0]).await;

    for sequence in 1..=3 {
        let start = Arc::new(Barrier::new(16));
        let mut racers = Vec::new();
        for w in 0..16 {
            let store = stores[w % 2].clone();
            let start = start.clone();
            racers.push(tokio::spawn(async move {
                let attempt = format!("att_{w}");
                let mut tx = store.write().await?;
                start.wait().await;
                tx.insert_checkpoint(&checkpoint("task_1", sequence, &attempt))
                    .await?;
                tx.commit().await?;
                Ok::<_, StoreError>(attempt)
            }));
        }
        let mut winners = Vec::new();
        for r in racers {
            match r.await.unwrap() {
                Ok(attempt) => winners.push(attempt),
                Err(StoreError::Conflict(_)) => {}
                Err(e) => panic!("a losing writer must see Conflict, not {e}"),
            }
        }
        assert_eq!(winners.len(), 1, "sequence {sequence}: winners {winners:?}");
        let mut r = stores[1].read().await.unwrap();
        let last = r.last_checkpoint("task_1").await.unwrap().unwrap();
        assert_eq!(last.sequence, sequence);
        assert_eq!(
            last.attempt_id, winners[0],
            "the stored row is the winner's"
        );
    }
    let mut r = stores[0].read().await.unwrap();
    assert_eq!(r.list_checkpoints("task_1").await.unwrap().len(), 3);
    drop(r);
    db.drop_db(&[&stores[0], &stores[1]]).await;
}

#[tokio::test]
async fn a_write_transaction_locks_the_task_it_reads() {
    let db = TestDb::new().await;
    let a = db.store().await;
    let b = Arc::new(db.store().await);
    seed(&a).await;

    // A reads the task (revision 1) and holds it.
    let mut tx_a = a.write().await.unwrap();
    let mut t = tx_a.task("task_1").await.unwrap().unwrap();
    assert_eq!(t.plan_revision, 1);

    // B reads the same task for its own compare-and-set: it must wait for A.
    let b2 = b.clone();
    let second = tokio::spawn(async move {
        let mut tx = b2.write().await.unwrap();
        let mut t = tx.task("task_1").await.unwrap().unwrap();
        let seen = t.plan_revision;
        t.plan_revision += 1;
        tx.update_task(&t).await.unwrap();
        tx.commit().await.unwrap();
        seen
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !second.is_finished(),
        "B read the task while A's write transaction held it"
    );
    // Reads are never blocked by the lock, and do not see A's uncommitted work.
    let mut r = b.read().await.unwrap();
    assert_eq!(r.task("task_1").await.unwrap().unwrap().plan_revision, 1);
    drop(r);

    t.plan_revision += 1;
    tx_a.update_task(&t).await.unwrap();
    tx_a.commit().await.unwrap();
    assert_eq!(
        second.await.unwrap(),
        2,
        "B must see A's revision, not the one it would have read before A committed"
    );
    let mut r = a.read().await.unwrap();
    assert_eq!(r.task("task_1").await.unwrap().unwrap().plan_revision, 3);
    drop(r);
    db.drop_db(&[&a, &b]).await;
}

#[tokio::test]
async fn concurrent_plan_revision_bumps_on_two_replicas_lose_no_update() {
    let db = TestDb::new().await;
    let stores = [Arc::new(db.store().await), Arc::new(db.store().await)];
    seed(&stores[0]).await;
    let writers = 12;
    let start = Arc::new(Barrier::new(writers));
    let mut handles = Vec::new();
    for w in 0..writers {
        let store = stores[w % 2].clone();
        let start = start.clone();
        handles.push(tokio::spawn(async move {
            start.wait().await;
            let mut tx = store.write().await.unwrap();
            let mut t = tx.task("task_1").await.unwrap().unwrap();
            let seen = t.plan_revision;
            tokio::time::sleep(Duration::from_millis(5)).await;
            t.plan_revision = seen + 1;
            tx.update_task(&t).await.unwrap();
            tx.commit().await.unwrap();
            seen
        }));
    }
    let mut seen = Vec::new();
    for h in handles {
        seen.push(h.await.unwrap());
    }
    seen.sort();
    assert_eq!(
        seen,
        (1..=writers as i64).collect::<Vec<_>>(),
        "each writer must have read a different revision"
    );
    let mut r = stores[1].read().await.unwrap();
    let t = r.task("task_1").await.unwrap().unwrap();
    assert_eq!(t.plan_revision, 1 + writers as i64);
    drop(r);
    db.drop_db(&[&stores[0], &stores[1]]).await;
}

#[tokio::test]
async fn a_reader_never_skips_an_event_that_commits_late() {
    let db = TestDb::new().await;
    let stores = [Arc::new(db.store().await), Arc::new(db.store().await)];
    seed(&stores[0]).await;

    let writers = 6;
    let txs_each = 25;
    let mut handles = Vec::new();
    for w in 0..writers {
        let store = stores[w % 2].clone();
        handles.push(tokio::spawn(async move {
            let mut committed = Vec::new();
            let mut rolled_back = Vec::new();
            for i in 0..txs_each {
                let mut tx = store.write().await.unwrap();
                let mut mine = Vec::new();
                for k in 0..(1 + (i + w) % 3) {
                    mine.push(
                        tx.append_event(&event("task_1", (w * 1000 + i * 10 + k) as i64))
                            .await
                            .unwrap(),
                    );
                }
                // Dawdle between drawing cursors and committing: without ordering, a later
                // cursor would often commit first.
                let pause = rand::random::<u64>() % 4;
                tokio::time::sleep(Duration::from_millis(pause)).await;
                if i % 7 == 3 {
                    drop(tx);
                    rolled_back.extend(mine);
                } else {
                    tx.commit().await.unwrap();
                    committed.extend(mine);
                }
            }
            (committed, rolled_back)
        }));
    }

    // A reader on replica 0 follows the log like an SSE stream: read past `last`, repeat.
    // Once the writers are done it is told the newest committed cursor, and it stops when it
    // read up to that (its replica hears of replica 1's last commits a moment later).
    let reader_store = stores[0].clone();
    let (done, mut reader_done) = tokio::sync::watch::channel(None::<i64>);
    let reader = tokio::spawn(async move {
        let mut last = 0;
        let mut seen = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut r = reader_store.read().await.unwrap();
            let page = r.events_after(last, 1000, None).await.unwrap();
            drop(r);
            for e in &page {
                assert!(
                    e.cursor > last,
                    "cursor {} after {last}: events out of order",
                    e.cursor
                );
                last = e.cursor;
                seen.push(e.cursor);
            }
            let newest = *reader_done.borrow_and_update();
            if let Some(newest) = newest
                && page.is_empty()
                && last >= newest
            {
                return seen;
            }
            assert!(
                Instant::now() < deadline,
                "the reader never reached the newest committed cursor {newest:?} (at {last})"
            );
            tokio::select! {
                _ = reader_done.changed() => {}
                _ = tokio::time::sleep(Duration::from_millis(1)) => {}
            }
        }
    });

    let mut committed = BTreeSet::new();
    let mut rolled_back = BTreeSet::new();
    for h in handles {
        let (c, r) = h.await.unwrap();
        committed.extend(c);
        rolled_back.extend(r);
    }
    done.send_replace(committed.last().copied());
    let seen = reader.await.unwrap();
    let seen_set: BTreeSet<i64> = seen.iter().copied().collect();
    assert_eq!(seen.len(), seen_set.len(), "an event was delivered twice");
    assert!(
        rolled_back.is_disjoint(&seen_set),
        "a rolled-back event was seen"
    );
    let skipped: Vec<_> = committed.difference(&seen_set).collect();
    assert!(
        skipped.is_empty(),
        "the reader skipped {} committed events: {skipped:?}",
        skipped.len()
    );
    assert_eq!(seen_set, committed);
    assert!(!rolled_back.is_empty(), "the test must roll some back");
    db.drop_db(&[&stores[0], &stores[1]]).await;
}

/// An event-writing transaction still in flight holds every replica's horizon below its
/// cursor: a later cursor committed through another replica is neither read nor announced
/// until the earlier one ends, and then both come in cursor order. One that rolls back stops
/// holding it back when it ends. Writers do not wait for each other meanwhile.
#[tokio::test]
async fn an_event_in_flight_holds_the_horizon_below_it_on_every_replica() {
    let db = TestDb::new().await;
    let (a, b) = (db.store().await, db.store().await);
    seed(&a).await;
    let cursors = |rows: Vec<EventRow>| rows.iter().map(|e| e.cursor).collect::<Vec<_>>();
    // Where the log stands once both replicas know the seed's commits.
    let before = a.read().await.unwrap().max_cursor().await.unwrap();
    tokio::time::timeout(
        Duration::from_secs(5),
        b.cursor_watch().wait_for(|c| *c >= before),
    )
    .await
    .unwrap()
    .unwrap();

    let mut early = a.write().await.unwrap();
    let c1 = early.append_event(&event("task_1", 1)).await.unwrap();
    let mut late = b.write().await.unwrap();
    let c2 = late.append_event(&event("task_1", 2)).await.unwrap();
    assert!(c2 > c1);
    // It commits while the earlier one is still open: the writers do not take turns.
    tokio::time::timeout(Duration::from_secs(5), late.commit())
        .await
        .expect("a commit waits for no other writer")
        .unwrap();
    for store in [&a, &b] {
        assert!(
            *store.cursor_watch().borrow() < c1,
            "the horizon passed an event still in flight"
        );
        let mut r = store.read().await.unwrap();
        assert_eq!(
            cursors(r.events_after(before, 100, None).await.unwrap()),
            Vec::<i64>::new()
        );
        assert!(r.max_cursor().await.unwrap() < c1);
    }

    early.commit().await.unwrap();
    for store in [&a, &b] {
        tokio::time::timeout(
            Duration::from_secs(5),
            store.cursor_watch().wait_for(|c| *c >= c2),
        )
        .await
        .expect("once the earlier commit ends, every replica's horizon passes both")
        .unwrap();
        let mut r = store.read().await.unwrap();
        assert_eq!(
            cursors(r.events_after(before, 100, None).await.unwrap()),
            vec![c1, c2]
        );
    }

    // A transaction that rolls back leaves a gap, and holds nothing back once it ended.
    let mut gone = a.write().await.unwrap();
    let c3 = gone.append_event(&event("task_1", 3)).await.unwrap();
    drop(gone);
    let mut next = b.write().await.unwrap();
    let c4 = next.append_event(&event("task_1", 4)).await.unwrap();
    next.commit().await.unwrap();
    assert!(c4 > c3);
    for store in [&a, &b] {
        tokio::time::timeout(
            Duration::from_secs(5),
            store.cursor_watch().wait_for(|c| *c >= c4),
        )
        .await
        .expect("a rolled-back claim stops holding the horizon back")
        .unwrap();
        let mut r = store.read().await.unwrap();
        assert_eq!(
            cursors(r.events_after(c2, 100, None).await.unwrap()),
            vec![c4]
        );
    }
    db.drop_db(&[&a, &b]).await;
}

#[tokio::test]
async fn messages_on_one_session_get_consecutive_seqs_across_replicas() {
    let db = TestDb::new().await;
    let stores = [Arc::new(db.store().await), Arc::new(db.store().await)];
    let start = Arc::new(Barrier::new(16));
    let mut handles = Vec::new();
    for w in 0..16 {
        let store = stores[w % 2].clone();
        let start = start.clone();
        handles.push(tokio::spawn(async move {
            let mut tx = store.write().await.unwrap();
            start.wait().await;
            let seq = tx
                .insert_message(&MessageRow {
                    session_id: "ses_1".into(),
                    task_id: "task_1".into(),
                    seq: 0,
                    role: "user".into(),
                    text: format!("m{w}"),
                    created_at: 1,
                })
                .await
                .unwrap();
            tx.commit().await.unwrap();
            seq
        }));
    }
    let mut seqs = Vec::new();
    for h in handles {
        seqs.push(h.await.unwrap());
    }
    seqs.sort();
    assert_eq!(seqs, (1..=16).collect::<Vec<i64>>());
    db.drop_db(&[&stores[0], &stores[1]]).await;
}

#[tokio::test]
async fn a_conflict_leaves_the_transaction_usable() {
    let db = TestDb::new().await;
    let store = db.store().await;
    seed(&store).await;
    let mut tx = store.write().await.unwrap();
    let taken = UserRow {
        id: "usr_other".into(),
        ..user("usr_alice")
    };
    assert!(matches!(
        tx.insert_user(&taken).await,
        Err(StoreError::Conflict(_))
    ));
    tx.insert_user(&user("usr_bob")).await.unwrap();
    tx.commit().await.unwrap();
    let mut r = store.read().await.unwrap();
    assert!(r.user_by_name("bob").await.unwrap().is_some());
    assert!(r.user_by_id("usr_other").await.unwrap().is_none());
    drop(r);
    db.drop_db(&[&store]).await;
}

#[tokio::test]
async fn waiting_on_a_lock_past_the_timeout_is_busy() {
    let db = TestDb::new().await;
    let a = db.store().await;
    let impatient = PgStore::connect_with(
        &db.url,
        PgOptions {
            lock_timeout: Duration::from_millis(200),
            ..PgOptions::default()
        },
    )
    .await
    .unwrap();
    seed(&a).await;
    let mut held = a.write().await.unwrap();
    held.task("task_1").await.unwrap().unwrap();
    let mut tx = impatient.write().await.unwrap();
    let started = Instant::now();
    let err = tx.task("task_1").await.expect_err("the task is locked");
    assert!(matches!(err, StoreError::Busy(_)), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5));
    drop(tx);
    drop(held);
    db.drop_db(&[&a, &impatient]).await;
}

#[tokio::test]
async fn read_transactions_are_snapshots() {
    let db = TestDb::new().await;
    let store = db.store().await;
    seed(&store).await;
    let mut r = store.read().await.unwrap();
    assert_eq!(r.max_cursor().await.unwrap(), 0);
    let mut tx = store.write().await.unwrap();
    let cursor = tx.append_event(&event("task_1", 1)).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        r.max_cursor().await.unwrap(),
        0,
        "a read transaction must keep its snapshot"
    );
    assert!(
        r.insert_user(&user("usr_mallory")).await.is_err(),
        "a read transaction must not write"
    );
    drop(r);
    let mut r = store.read().await.unwrap();
    assert_eq!(r.max_cursor().await.unwrap(), cursor);
    drop(r);
    db.drop_db(&[&store]).await;
}

#[tokio::test]
async fn json_values_round_trip_exactly() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let mut tx = store.write().await.unwrap();
    tx.insert_user(&user("usr_alice")).await.unwrap();
    // A typed column: every float and string comes back as written.
    let mut t = task("task_j", "usr_alice");
    t.plan = vec![PlanStep {
        id: "ü".into(),
        title: "quote \" backslash \\ tab \t emoji 🦀".into(),
        depends_on: vec!["a".into()],
    }];
    t.usage.cost_usd = 0.30000000000000004;
    tx.insert_task(&t).await.unwrap();
    // A column kept as given (event data; checkpoint bodies and intents are digested as sent).
    let data = json!([
        {"id": "ü", "z": 1, "a": [0.1, -0.0, 1e-7, 1e20, 3.0, 12345678901234567890u64, -9007199254740993i64]},
        {"text": "quote \" backslash \\ tab \t emoji 🦀", "null": null, "nested": {"b": true, "a": false}}
    ]);
    let cursor = tx
        .append_event(&NewEvent {
            data: data.clone(),
            ..event("task_j", 1)
        })
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let mut r = store.read().await.unwrap();
    assert_eq!(r.task("task_j").await.unwrap(), Some(t));
    let events = r.events_after(cursor - 1, 1, None).await.unwrap();
    assert_eq!(events[0].data, data);
    drop(r);
    db.drop_db(&[&store]).await;
}

#[test]
fn database_names_are_swapped_in_urls() {
    assert_eq!(
        with_database("postgres://u@h:5/waymark_test", "x"),
        "postgres://u@h:5/x"
    );
    assert_eq!(
        with_database("postgres://u:p@h/db?sslmode=disable", "x"),
        "postgres://u:p@h/x?sslmode=disable"
    );
    assert_eq!(with_database("postgres://h:5", "x"), "postgres://h:5/x");
}
