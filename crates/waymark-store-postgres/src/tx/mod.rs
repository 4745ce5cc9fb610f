//! One transaction on PostgreSQL: every `StoreTx` method as one or two statements. The crate
//! docs say which locks a method takes and why. Here are the transaction, the helpers its
//! statements run through and its commit (which has its replica's horizon computed again); each
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

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::{Postgres, Transaction};
use waymark_store::*;

use crate::fanout::Horizon;

type Q<'q> = sqlx::query::Query<'q, Postgres, PgArguments>;

pub(crate) struct PgTx {
    tx: Transaction<'static, Postgres>,
    /// `Some` in write transactions: the horizon computed again after a commit that appended
    /// events.
    horizon: Option<Arc<Horizon>>,
    /// The horizon when the transaction began: its reads of the log stop there (crate docs).
    through: i64,
    /// Whether this transaction holds its claim (taken by its first event).
    claimed: bool,
    /// The newest cursor this transaction appended.
    appended: Option<i64>,
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
        horizon: Option<Arc<Horizon>>,
        through: i64,
    ) -> Self {
        PgTx {
            tx,
            horizon,
            through,
            claimed: false,
            appended: None,
        }
    }

    /// Remembers the newest cursor this transaction appended (announced after commit).
    fn note_appended(&mut self, cursor: i64) {
        self.appended = Some(self.appended.map_or(cursor, |c| c.max(cursor)));
    }

    fn is_write(&self) -> bool {
        self.horizon.is_some()
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
}

#[async_trait]
impl StoreTx for PgTx {
    async fn commit(self: Box<Self>) -> Result<()> {
        let PgTx {
            tx,
            horizon,
            appended,
            ..
        } = *self;
        tx.commit().await.map_err(db_err)?;
        if let (Some(cursor), Some(horizon)) = (appended, horizon) {
            horizon.committed(cursor).await;
        }
        Ok(())
    }
}
