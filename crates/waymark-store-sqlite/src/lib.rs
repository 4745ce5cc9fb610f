//! The SQLite store: the embedded default of the control plane. One file in WAL mode with
//! `synchronous=FULL` (an acknowledged write survives power loss), one writer connection
//! (`BEGIN IMMEDIATE`, so writers queue instead of failing) and read-only readers that see
//! consistent snapshots while writes go on. Concurrent write transactions are committed in
//! groups (savepoints in one transaction, one fsync): see [`group`]. Statements run through
//! rusqlite on the calling thread; sqlx only migrates the file when the store opens.

mod follow;
mod group;
mod readers;
mod rows;
mod tx;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use tokio::sync::watch;
use waymark_store::*;

use crate::readers::Readers;
use crate::rows::backend;
use crate::tx::{SqliteTx, Tx};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/server-sqlite");

/// A control-plane store in one SQLite file.
pub struct SqliteStore {
    writer: Arc<group::Writer>,
    readers: Arc<Readers>,
}

impl SqliteStore {
    /// Opens (creating and migrating as needed) the database at `path`.
    pub async fn open(path: &Path) -> Result<Self> {
        let open_err = |reason: String| StoreError::Open {
            path: path.display().to_string(),
            reason,
        };
        // Created and migrated by sqlx's migrator (the schema's history is its table), on a
        // connection closed before the store's own open.
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await
            .map_err(|e| open_err(e.to_string()))?;
        let migrated = migrate(&pool).await;
        pool.close().await;
        migrated?;
        let writer = readers::open_writer(path).map_err(|e| open_err(e.to_string()))?;
        let readers = Readers::new(path);
        let max: i64 = readers
            .begin()
            .await?
            .db()
            .query_row("SELECT COALESCE(MAX(cursor), 0) FROM events", [], |r| {
                r.get(0)
            })
            .map_err(backend)?;
        let (cursor_tx, _) = watch::channel(max);
        let writer = group::Writer::new(writer, cursor_tx);
        let follower = readers::open_reader(path).map_err(|e| open_err(e.to_string()))?;
        tokio::spawn(follow::run(follower, Arc::downgrade(&writer)));
        Ok(SqliteStore { writer, readers })
    }

    /// The newest migration this build knows.
    pub fn schema_version() -> i64 {
        MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0)
    }
}

async fn migrate(pool: &SqlitePool) -> Result<()> {
    match MIGRATOR.run(pool).await {
        Ok(()) => Ok(()),
        Err(sqlx::migrate::MigrateError::VersionMissing(found)) => Err(StoreError::NewerSchema {
            found,
            known: SqliteStore::schema_version(),
        }),
        Err(e) => Err(StoreError::Backend(format!("migrating the database: {e}"))),
    }
}

#[async_trait]
impl Store for SqliteStore {
    async fn write(&self) -> Result<Box<dyn StoreTx>> {
        Ok(Box::new(SqliteTx {
            tx: Tx::Write(self.writer.begin().await?),
            appended: None,
        }))
    }

    async fn read(&self) -> Result<Box<dyn StoreTx>> {
        Ok(Box::new(SqliteTx {
            tx: Tx::Read(self.readers.begin().await?),
            appended: None,
        }))
    }

    fn cursor_watch(&self) -> watch::Receiver<i64> {
        self.writer.cursor_watch()
    }

    fn backend(&self) -> &'static str {
        "sqlite"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn store_story() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("waymark.db"))
            .await
            .unwrap();
        waymark_store::story::run_store_story(&store).await;
    }

    #[tokio::test]
    async fn concurrent_writers_share_commits() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(
            SqliteStore::open(&dir.path().join("waymark.db"))
                .await
                .unwrap(),
        );
        let writers = 64;
        let handles: Vec<_> = (0..writers)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(async move {
                    let mut tx = store.write().await?;
                    tx.insert_user(&UserRow {
                        id: format!("u{i}"),
                        name: format!("user {i}"),
                        created_at: 0,
                    })
                    .await?;
                    tx.commit().await
                })
            })
            .collect();
        for h in handles {
            h.await.unwrap().unwrap();
        }
        let commits = store.writer.commits().await;
        assert!(
            commits < writers,
            "{writers} writers queued at once should share COMMITs, made {commits}"
        );
        let users = store.read().await.unwrap().list_users().await.unwrap();
        assert_eq!(users.len() as u64, writers);
    }

    /// A request whose client goes away while its transaction carries a batch's `COMMIT`
    /// (axum drops the handler's future) must not take the batch's other transactions with it:
    /// they were told to wait for that `COMMIT`, and it still runs. A chaos run caught this as
    /// "the store closed before the transaction was committed" when a killed worker's request
    /// was dropped mid-commit.
    #[tokio::test]
    async fn a_dropped_commit_still_commits_the_batch_it_carries() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(
            SqliteStore::open(&dir.path().join("waymark.db"))
                .await
                .unwrap(),
        );
        let user = |id: &str| UserRow {
            id: id.into(),
            name: id.into(),
            created_at: 0,
        };
        let mut first = store.write().await.unwrap();
        first.insert_user(&user("first")).await.unwrap();
        // A second writer queues for the connection, so the first leaves its COMMIT to it.
        let second = tokio::spawn({
            let store = store.clone();
            async move { store.write().await }
        });
        while store.writer.waiting() == 0 {
            tokio::task::yield_now().await;
        }
        let first = tokio::spawn(first.commit());
        let mut second = second.await.unwrap().unwrap();
        second.insert_user(&user("second")).await.unwrap();
        // Polled once, then dropped: the client of the second request went away.
        {
            let mut commit = std::pin::pin!(second.commit());
            std::future::poll_fn(|cx| {
                let _ = commit.as_mut().poll(cx);
                std::task::Poll::Ready(())
            })
            .await;
        }

        first
            .await
            .unwrap()
            .expect("the first transaction's batch was committed");
        let mut names: Vec<_> = store
            .read()
            .await
            .unwrap()
            .list_users()
            .await
            .unwrap()
            .into_iter()
            .map(|u| u.id)
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["first", "second"],
            "both writes of the batch are durable"
        );
    }

    #[tokio::test]
    async fn a_newer_schema_is_refused_clearly() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("waymark.db");
        drop(SqliteStore::open(&path).await.unwrap());
        let pool = SqlitePool::connect_with(SqliteConnectOptions::new().filename(&path))
            .await
            .unwrap();
        sqlx::query(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
             VALUES (29991231000000, 'from the future', 1, x'00', 0)",
        )
        .execute(&pool)
        .await
        .unwrap();
        pool.close().await;
        let err = SqliteStore::open(&path)
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
    }
    #[tokio::test]
    async fn a_value_no_enum_knows_is_corruption_never_a_default() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("waymark.db");
        let store = SqliteStore::open(&path).await.unwrap();
        waymark_store::story::seed_one_task(&store, "task_1").await;
        let pool = SqlitePool::connect_with(SqliteConnectOptions::new().filename(&path))
            .await
            .unwrap();
        sqlx::query("UPDATE tasks SET state = 'sideways' WHERE id = 'task_1'")
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
        let said = waymark_store::story::assert_corrupt_task(&store, "task_1", "state").await;
        assert!(said.contains("sideways"), "{said}");
    }

    /// A JSON column is read as the type it holds: a usage that is not one is corruption,
    /// never a zero spend (which would reopen a spent budget), and the row is left as it is.
    #[tokio::test]
    async fn a_json_value_not_of_its_type_is_corruption_never_a_default() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("waymark.db");
        let store = SqliteStore::open(&path).await.unwrap();
        waymark_store::story::seed_one_task(&store, "task_1").await;
        let pool = SqlitePool::connect_with(SqliteConnectOptions::new().filename(&path))
            .await
            .unwrap();
        let json = waymark_store::story::CORRUPT_TASK_JSON;
        for (col, value) in json.into_iter().chain([("budget", "not json")]) {
            let good: String = sqlx::query_scalar(&format!("SELECT {col} FROM tasks"))
                .fetch_one(&pool)
                .await
                .unwrap();
            sqlx::query(&format!("UPDATE tasks SET {col} = ? WHERE id = 'task_1'"))
                .bind(value)
                .execute(&pool)
                .await
                .unwrap();
            waymark_store::story::assert_corrupt_task(&store, "task_1", col).await;
            sqlx::query(&format!("UPDATE tasks SET {col} = ? WHERE id = 'task_1'"))
                .bind(good)
                .execute(&pool)
                .await
                .unwrap();
        }
        pool.close().await;
        assert!(store.read().await.unwrap().task("task_1").await.is_ok());
    }
}
