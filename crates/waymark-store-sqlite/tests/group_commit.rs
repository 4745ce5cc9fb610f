//! Group commit: concurrent write transactions share one SQLite transaction and one fsync,
//! and still behave one by one — each commits or rolls back alone, nothing is acknowledged or
//! announced before the `COMMIT`, and what was acknowledged is there after a reopen.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use waymark_store::{EventKind, NewEvent, Store, StoreError, UserRow};
use waymark_store_sqlite::SqliteStore;

fn user(name: &str) -> UserRow {
    UserRow {
        id: format!("u-{name}"),
        name: name.to_owned(),
        created_at: 1,
    }
}

fn event(name: &str) -> NewEvent {
    NewEvent {
        task_id: format!("t-{name}"),
        owner_id: format!("u-{name}"),
        kind: EventKind::TaskCreated,
        data: json!({"name": name}),
        at: 1,
    }
}

/// One write transaction: a user and an event, committed. Returns the event's cursor.
async fn write_one(store: &SqliteStore, name: &str) -> Result<i64, StoreError> {
    let mut tx = store.write().await?;
    tx.insert_user(&user(name)).await?;
    let cursor = tx.append_event(&event(name)).await?;
    tx.commit().await?;
    Ok(cursor)
}

async fn open(path: &Path) -> Arc<SqliteStore> {
    Arc::new(SqliteStore::open(path).await.unwrap())
}

async fn user_names(store: &SqliteStore) -> BTreeSet<String> {
    let mut tx = store.read().await.unwrap();
    tx.list_users()
        .await
        .unwrap()
        .into_iter()
        .map(|u| u.name)
        .collect()
}

async fn event_names(store: &SqliteStore) -> Vec<(i64, String)> {
    let mut tx = store.read().await.unwrap();
    tx.events_after(0, 100_000, None)
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.cursor, e.data["name"].as_str().unwrap().to_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_writers_all_commit_with_distinct_growing_cursors() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("waymark.db")).await;
    let writers = 200;
    let handles: Vec<_> = (0..writers)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move { write_one(&store, &format!("w{i}")).await })
        })
        .collect();
    let mut cursors = BTreeSet::new();
    for h in handles {
        cursors.insert(h.await.unwrap().unwrap());
    }
    assert_eq!(cursors.len(), writers, "every writer got its own cursor");
    assert_eq!(user_names(&store).await.len(), writers);
    let events = event_names(&store).await;
    assert_eq!(
        events.iter().map(|(c, _)| *c).collect::<BTreeSet<_>>(),
        cursors
    );
    assert_eq!(
        *store.cursor_watch().borrow(),
        *cursors.last().unwrap(),
        "the watch reached the newest cursor"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_transaction_among_concurrent_ones_takes_only_its_own_changes_away() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("waymark.db")).await;
    write_one(&store, "taken").await.unwrap();
    let handles: Vec<_> = (0..120)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let name = format!("w{i}");
                let mut tx = store.write().await?;
                tx.insert_user(&user(&name)).await?;
                tx.append_event(&event(&name)).await?;
                match i % 4 {
                    // Refused by a unique constraint, then dropped: none of it stays.
                    0 => {
                        let e = tx.insert_user(&user("taken")).await.unwrap_err();
                        assert!(matches!(e, StoreError::Conflict(_)), "{e}");
                        Ok(false)
                    }
                    // Dropped without commit after writing.
                    1 => {
                        drop(tx);
                        Ok(false)
                    }
                    // A refused statement does not spoil the rest of its transaction.
                    2 => {
                        let e = tx.insert_user(&user("taken")).await.unwrap_err();
                        assert!(matches!(e, StoreError::Conflict(_)), "{e}");
                        tx.commit().await?;
                        Ok(true)
                    }
                    _ => {
                        tx.commit().await?;
                        Ok::<_, StoreError>(true)
                    }
                }
            })
        })
        .collect();
    let mut kept = BTreeSet::from(["taken".to_owned()]);
    for (i, h) in handles.into_iter().enumerate() {
        if h.await.unwrap().unwrap() {
            kept.insert(format!("w{i}"));
        }
    }
    assert_eq!(user_names(&store).await, kept);
    let events: BTreeSet<String> = event_names(&store)
        .await
        .into_iter()
        .map(|(_, n)| n)
        .collect();
    assert_eq!(events, kept, "events vanish with their transactions");
    // The writer is free and consistent afterwards.
    write_one(&store, "after").await.unwrap();
    assert!(user_names(&store).await.contains("after"));
}

#[tokio::test]
async fn an_uncommitted_write_is_neither_visible_nor_announced() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("waymark.db")).await;
    let mut watch = store.cursor_watch();
    let mut tx = store.write().await.unwrap();
    tx.insert_user(&user("pending")).await.unwrap();
    let cursor = tx.append_event(&event("pending")).await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(50), watch.changed())
            .await
            .is_err(),
        "announced before the commit"
    );
    assert!(user_names(&store).await.is_empty());
    tx.commit().await.unwrap();
    assert_eq!(*watch.borrow_and_update(), cursor);
    assert!(user_names(&store).await.contains("pending"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_announced_cursor_is_already_readable() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("waymark.db")).await;
    let watcher = {
        let store = store.clone();
        let mut watch = store.cursor_watch();
        tokio::spawn(async move {
            let mut seen = 0;
            while *watch.borrow_and_update() < 300 {
                let announced = *watch.borrow_and_update();
                let readable = store.read().await.unwrap().max_cursor().await.unwrap();
                assert!(
                    readable >= announced,
                    "cursor {announced} announced before it was committed (readable: {readable})"
                );
                seen += 1;
                if watch.changed().await.is_err() {
                    break;
                }
            }
            seen
        })
    };
    let handles: Vec<_> = (0..300)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let cursor = write_one(&store, &format!("w{i}")).await.unwrap();
                // Acknowledged: announced and readable.
                assert!(*store.cursor_watch().borrow() >= cursor);
                let readable = store.read().await.unwrap().max_cursor().await.unwrap();
                assert!(readable >= cursor);
            })
        })
        .collect();
    for h in handles {
        h.await.unwrap();
    }
    let seen = tokio::time::timeout(Duration::from_secs(10), watcher)
        .await
        .unwrap()
        .unwrap();
    assert!(seen > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_was_acknowledged_is_there_after_the_store_goes_away_mid_write() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("waymark.db");
    let store = open(&path).await;
    let (acked_tx, mut acked_rx) = tokio::sync::mpsc::unbounded_channel();
    let handles: Vec<_> = (0..64)
        .map(|w| {
            let (store, acked) = (store.clone(), acked_tx.clone());
            tokio::spawn(async move {
                for i in 0.. {
                    let name = format!("w{w}-{i}");
                    if write_one(&store, &name).await.is_ok() {
                        let _ = acked.send(name);
                    }
                }
            })
        })
        .collect();
    drop(acked_tx);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Pull the plug: writers stop wherever they are, their transactions dropped mid-way.
    for h in &handles {
        h.abort();
    }
    for h in handles {
        let _ = h.await;
    }
    drop(store);
    let mut acked = BTreeSet::new();
    while let Some(name) = acked_rx.recv().await {
        acked.insert(name);
    }
    assert!(!acked.is_empty());

    let store = open(&path).await;
    // One snapshot for both tables: the old store's last batch may still commit while this
    // reads (its flush timer outlives the handle; a dead process would not), and two reads
    // could straddle that commit.
    let (users, events) = {
        let mut tx = store.read().await.unwrap();
        let users: BTreeSet<String> = tx
            .list_users()
            .await
            .unwrap()
            .into_iter()
            .map(|u| u.name)
            .collect();
        let events: BTreeSet<String> = tx
            .events_after(0, 100_000, None)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.data["name"].as_str().unwrap().to_owned())
            .collect();
        (users, events)
    };
    let missing: Vec<_> = acked.difference(&users).collect();
    assert!(missing.is_empty(), "acknowledged but lost: {missing:?}");
    // Every transaction is whole: a user exactly when its event.
    let only_users: Vec<_> = users.difference(&events).collect();
    let only_events: Vec<_> = events.difference(&users).collect();
    assert!(
        only_users.is_empty() && only_events.is_empty(),
        "a transaction was torn: users without their event {only_users:?}, events without their user {only_events:?}"
    );
    // The reopened store writes on.
    write_one(&store, "after").await.unwrap();
}

/// A commit made through another connection to the file — another process, such as `waymark
/// admin` while `waymark serve` runs — moves this store's cursor watch too, as its own commits
/// do: SQLite tells no one, so the store follows the file itself.
#[tokio::test]
async fn a_commit_from_another_process_moves_the_cursor_watch() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("waymark.db");
    let serving = SqliteStore::open(&path).await.unwrap();
    let other = SqliteStore::open(&path).await.unwrap();
    let mut watch = serving.cursor_watch();
    let before = *watch.borrow_and_update();
    let cursor = write_one(&other, "from-elsewhere").await.unwrap();
    assert!(cursor > before);
    tokio::time::timeout(Duration::from_secs(5), watch.wait_for(|c| *c >= cursor))
        .await
        .expect("the serving store never saw the other's commit")
        .unwrap();
}

/// Another process holding the file's write lock (`waymark admin` writing while the server
/// runs) makes a write wait, not fail, and the wait does not hold up the runtime: on a runtime
/// of one thread, reads go on while the write waits, and the write goes ahead once the lock is
/// released. (Statements run on the caller's thread; this wait must not.)
#[tokio::test]
async fn a_write_waits_for_another_process_without_holding_up_the_runtime() {
    use sqlx::Connection;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("waymark.db");
    let store = open(&path).await;
    write_one(&store, "before").await.unwrap();
    let mut other = sqlx::SqliteConnection::connect_with(
        &sqlx::sqlite::SqliteConnectOptions::new().filename(&path),
    )
    .await
    .unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .unwrap();
    sqlx::query("INSERT INTO users (id, name, created_at) VALUES ('u-other', 'other', 1)")
        .execute(&mut other)
        .await
        .unwrap();
    let write = tokio::spawn({
        let store = store.clone();
        async move { write_one(&store, "after").await }
    });
    // Let the write start and meet the lock.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(
        !write.is_finished(),
        "the write waits for the other process's lock"
    );
    assert_eq!(
        user_names(&store).await,
        BTreeSet::from(["before".to_owned()]),
        "reads go on while the write waits"
    );
    sqlx::query("COMMIT").execute(&mut other).await.unwrap();
    write
        .await
        .unwrap()
        .expect("the write goes ahead once the lock is free");
    assert_eq!(
        user_names(&store).await,
        BTreeSet::from(["before", "other", "after"].map(String::from)),
    );
}
