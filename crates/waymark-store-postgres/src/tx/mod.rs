//! One transaction on PostgreSQL: every `StoreTx` method as one or two statements. The crate
//! docs say which locks a method takes and why. Here are the transaction, the helpers its
//! statements run through and its commit (with the `pg_notify` that fans its events out); each
//! table family's statements are a module of their own, one `waymark_store` trait each. A
//! statement both backends say alike comes from `waymark_store_sql`; a module writes here only
//! what PostgreSQL says its own way.

mod artifacts;
mod checkpoints;
mod decisions;
mod devices;
mod effects;
mod events;
mod followups;
mod machines;
mod messages;
mod push;
mod rules;
mod secrets;
mod tasks;
mod users;

use async_trait::async_trait;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::{Postgres, Transaction};
use tokio::sync::watch;
use waymark_store::*;

use crate::{EVENTS_CHANNEL, advance};

type Q<'q> = sqlx::query::Query<'q, Postgres, PgArguments>;

pub(crate) struct PgTx {
    tx: Transaction<'static, Postgres>,
    /// `Some` in write transactions: the watch raised after a commit that appended events.
    notify: Option<watch::Sender<i64>>,
    /// Whether this transaction holds the cursor lock (taken by its first event).
    cursor_locked: bool,
    /// The newest cursor this transaction appended.
    appended: Option<i64>,
    /// The cursor a statement of this transaction already announced with `pg_notify`.
    notified: Option<i64>,
}

/// Maps a driver error to the store's vocabulary.
pub(crate) fn db_err(e: sqlx::Error) -> StoreError {
    if let sqlx::Error::Database(db) = &e {
        match db.code().as_deref() {
            // unique_violation
            Some("23505") => return StoreError::Conflict(db.message().to_owned()),
            // serialization_failure, deadlock_detected, lock_not_available, query_canceled
            // (lock_timeout and statement_timeout)
            Some("40001" | "40P01" | "55P03" | "57014") => {
                return StoreError::Busy(db.message().to_owned());
            }
            // disk_full, and the insufficient_resources class around it
            Some("53100") => return StoreError::Full(db.message().to_owned()),
            // io_error
            Some("58030") => return StoreError::Io(db.message().to_owned()),
            // untranslatable_character: JSONB refuses `\u0000` in strings
            Some("22P05") => {
                return StoreError::Backend(format!(
                    "PostgreSQL cannot store this value: {}",
                    db.message()
                ));
            }
            _ => {}
        }
    }
    if matches!(e, sqlx::Error::PoolTimedOut) {
        return StoreError::Busy("timed out waiting for a database connection".into());
    }
    StoreError::Backend(e.to_string())
}

impl PgTx {
    pub(crate) fn new(
        tx: Transaction<'static, Postgres>,
        notify: Option<watch::Sender<i64>>,
    ) -> Self {
        PgTx {
            tx,
            notify,
            cursor_locked: false,
            appended: None,
            notified: None,
        }
    }

    /// Remembers the newest cursor this transaction appended (announced at commit).
    fn note_appended(&mut self, cursor: i64) {
        self.appended = Some(self.appended.map_or(cursor, |c| c.max(cursor)));
    }

    fn is_write(&self) -> bool {
        self.notify.is_some()
    }

    async fn one<'q, T>(&mut self, q: Q<'q>, map: fn(&PgRow) -> Result<T>) -> Result<Option<T>> {
        q.fetch_optional(&mut *self.tx)
            .await
            .map_err(db_err)?
            .as_ref()
            .map(map)
            .transpose()
    }

    async fn all<'q, T>(&mut self, q: Q<'q>, map: fn(&PgRow) -> Result<T>) -> Result<Vec<T>> {
        q.fetch_all(&mut *self.tx)
            .await
            .map_err(db_err)?
            .iter()
            .map(map)
            .collect()
    }

    async fn exec<'q>(&mut self, q: Q<'q>) -> Result<u64> {
        Ok(q.execute(&mut *self.tx)
            .await
            .map_err(db_err)?
            .rows_affected())
    }

    /// Runs a shared `INSERT` ending in `ON CONFLICT DO NOTHING`: a row not written met an
    /// existing key. Unlike a raised unique violation this leaves the transaction usable, as on
    /// SQLite.
    async fn insert(&mut self, what: &str, insert: waymark_store_sql::Insert<'_>) -> Result<()> {
        match self.exec(insert.or_skip().query()).await? {
            0 => Err(StoreError::Conflict(format!(
                "{what}: a row with the same key exists"
            ))),
            _ => Ok(()),
        }
    }

    async fn scalar(&mut self, sql: &'static str) -> Result<i64> {
        sqlx::query_scalar(sql)
            .fetch_one(&mut *self.tx)
            .await
            .map_err(db_err)
    }
}

#[async_trait]
impl StoreTx for PgTx {
    async fn commit(self: Box<Self>) -> Result<()> {
        let PgTx {
            mut tx,
            notify,
            appended,
            notified,
            ..
        } = *self;
        if let Some(cursor) = appended.filter(|c| notified != Some(*c)) {
            // Delivered to every listener when (and only if) the transaction commits.
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(EVENTS_CHANNEL)
                .bind(cursor.to_string())
                .execute(&mut *tx)
                .await
                .map_err(db_err)?;
        }
        tx.commit().await.map_err(db_err)?;
        if let (Some(cursor), Some(notify)) = (appended, notify) {
            advance(&notify, cursor);
        }
        Ok(())
    }
}
