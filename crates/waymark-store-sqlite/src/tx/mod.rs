//! One transaction on SQLite: every `StoreTx` method as one or two statements, on a read-only
//! reader (a snapshot) or as a member of the writer's current group. Here are the transaction,
//! the helpers its statements run through and its commit; each table family's statements are a
//! module of their own, one `waymark_store` trait each. A statement both backends say alike comes
//! from `waymark_store_sql`; a module writes here only what SQLite says its own way.

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
use sqlx::sqlite::SqliteRow;
use sqlx::{Sqlite, SqliteConnection, Transaction};
use waymark_store::*;

use crate::group;
use crate::rows::backend;

pub(crate) struct SqliteTx {
    pub(crate) tx: Tx,
    /// The newest event cursor this transaction appended.
    pub(crate) appended: Option<i64>,
}

pub(crate) enum Tx {
    /// A snapshot on a reader connection.
    Read(Transaction<'static, Sqlite>),
    /// A savepoint on the writer connection, committed in a group.
    Write(group::Member),
}

pub(crate) type Q<'q> = sqlx::query::Query<'q, Sqlite, sqlx::sqlite::SqliteArguments<'q>>;

impl SqliteTx {
    fn db(&mut self) -> &mut SqliteConnection {
        match &mut self.tx {
            Tx::Read(tx) => tx,
            Tx::Write(member) => member.db(),
        }
    }

    async fn one<'q, T>(
        &mut self,
        q: Q<'q>,
        map: fn(&SqliteRow) -> Result<T>,
    ) -> Result<Option<T>> {
        q.fetch_optional(self.db())
            .await
            .map_err(backend)?
            .as_ref()
            .map(map)
            .transpose()
    }

    async fn all<'q, T>(&mut self, q: Q<'q>, map: fn(&SqliteRow) -> Result<T>) -> Result<Vec<T>> {
        q.fetch_all(self.db())
            .await
            .map_err(backend)?
            .iter()
            .map(map)
            .collect()
    }

    async fn exec<'q>(&mut self, q: Q<'q>) -> Result<u64> {
        Ok(q.execute(self.db()).await.map_err(backend)?.rows_affected())
    }

    /// Runs a shared `INSERT` as written: a row with an existing key raises a unique violation
    /// (`Conflict`), which on SQLite undoes this statement only.
    async fn insert(&mut self, insert: waymark_store_sql::Insert<'_>) -> Result<()> {
        self.exec(insert.raising().query()).await.map(drop)
    }
}

#[async_trait]
impl StoreTx for SqliteTx {
    async fn commit(self: Box<Self>) -> Result<()> {
        let SqliteTx { tx, appended } = *self;
        match tx {
            Tx::Read(tx) => tx.commit().await.map_err(backend),
            // Returns once the group's COMMIT made it durable; the cursor watch moved then.
            Tx::Write(member) => member.commit(appended).await,
        }
    }
}

/// A list of owners as the JSON array `json_each` reads.
fn json_list(owners: &[String]) -> String {
    serde_json::to_string(owners).unwrap_or_else(|_| "[]".into())
}

#[cfg(test)]
mod tests {
    use sqlx::{Connection, Row, SqliteConnection};
    use waymark_store_sql::Statement;

    /// The shared statements are written with `$n`, which sqlx binds on SQLite by its number:
    /// a placeholder may stand in any order, more than once, and `NULL` under a `CAST`.
    #[tokio::test]
    async fn dollar_placeholders_bind_by_number() {
        let mut db = SqliteConnection::connect("sqlite::memory:").await.unwrap();
        let row =
            Statement::new("SELECT $2 AS a, $1 AS b, $2 || $1 AS c, CAST($3 AS TEXT) IS NULL AS d")
                .bind("one")
                .bind("two")
                .bind(None::<&str>)
                .query()
                .fetch_one(&mut db)
                .await
                .unwrap();
        assert_eq!(row.get::<String, _>("a"), "two");
        assert_eq!(row.get::<String, _>("b"), "one");
        assert_eq!(row.get::<String, _>("c"), "twoone");
        assert!(row.get::<bool, _>("d"));
    }
}
