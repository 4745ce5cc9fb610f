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
use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{CachedStatement, Connection, Row};
use waymark_store::*;
use waymark_store_sql::{Arg, Insert, Statement};

use crate::rows::backend;
use crate::{group, readers};

pub(crate) struct SqliteTx {
    pub(crate) tx: Tx,
    /// The newest event cursor this transaction appended.
    pub(crate) appended: Option<i64>,
}

pub(crate) enum Tx {
    /// A snapshot on a reader connection.
    Read(readers::ReadTx),
    /// A savepoint on the writer connection, committed in a group.
    Write(group::Member),
}

impl SqliteTx {
    fn db(&mut self) -> &Connection {
        match &mut self.tx {
            Tx::Read(tx) => tx.db(),
            Tx::Write(member) => member.db(),
        }
    }

    /// The first row's mapping, if there is a row.
    fn one<T>(&mut self, s: Statement<'_>, map: fn(&Row<'_>) -> Result<T>) -> Result<Option<T>> {
        let mut st = prepare(self.db(), &s)?;
        let mut rows = st.raw_query();
        match rows.next().map_err(backend)? {
            Some(row) => map(row).map(Some),
            None => Ok(None),
        }
    }

    fn all<T>(&mut self, s: Statement<'_>, map: fn(&Row<'_>) -> Result<T>) -> Result<Vec<T>> {
        let mut st = prepare(self.db(), &s)?;
        let mut rows = st.raw_query();
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(backend)? {
            out.push(map(row)?);
        }
        Ok(out)
    }

    /// The first column of the first row, which the statement always returns.
    fn scalar<T: rusqlite::types::FromSql>(&mut self, s: Statement<'_>) -> Result<T> {
        self.one(s, |r| crate::rows::get_at(r, 0))?.ok_or_else(|| {
            StoreError::Backend("a statement that always returns a row returned none".into())
        })
    }

    /// The first column of the first row, if there is a row.
    fn scalar_opt<T: rusqlite::types::FromSql>(&mut self, s: Statement<'_>) -> Result<Option<T>> {
        self.one(s, |r| crate::rows::get_at(r, 0))
    }

    /// Runs a statement for its effect; the rows it changed.
    fn exec(&mut self, s: Statement<'_>) -> Result<u64> {
        let db = self.db();
        let mut st = prepare(db, &s)?;
        if st.column_count() == 0 {
            return st.raw_execute().map(|n| n as u64).map_err(backend);
        }
        // An `INSERT … RETURNING`: run it to its end; what it changed is counted as usual.
        let mut rows = st.raw_query();
        while rows.next().map_err(backend)?.is_some() {}
        drop(rows);
        drop(st);
        Ok(db.changes())
    }

    /// Runs a shared `INSERT` as written: a row with an existing key raises a unique violation
    /// (`Conflict`), which on SQLite undoes this statement only.
    fn insert(&mut self, insert: Insert<'_>) -> Result<()> {
        self.exec(insert.raising()).map(drop)
    }
}

/// The statement prepared (from the connection's cache) with its arguments bound. A placeholder
/// named by a number (`$2`, `?2`) takes that argument, a bare `?` the next one in order.
fn prepare<'c>(db: &'c Connection, s: &Statement<'_>) -> Result<CachedStatement<'c>> {
    let mut st = db.prepare_cached(s.sql()).map_err(backend)?;
    let args = s.args();
    for i in 1..=st.parameter_count() {
        let n = match st.parameter_name(i) {
            None => i,
            Some(name) => name
                .get(1..)
                .and_then(|n| n.parse::<usize>().ok())
                .ok_or_else(|| {
                    StoreError::Backend(format!("placeholder {name} is not numbered"))
                })?,
        };
        let arg = n.checked_sub(1).and_then(|n| args.get(n)).ok_or_else(|| {
            StoreError::Backend(format!(
                "placeholder {n} has no argument ({} given)",
                args.len()
            ))
        })?;
        st.raw_bind_parameter(i, value(arg)).map_err(backend)?;
    }
    Ok(st)
}

/// An argument as SQLite stores it: JSON as its text, booleans as 0 and 1.
fn value<'a>(arg: &'a Arg<'_>) -> ToSqlOutput<'a> {
    ToSqlOutput::Borrowed(match arg {
        Arg::Text(Some(v)) => ValueRef::Text(v.as_bytes()),
        Arg::Int(Some(v)) => ValueRef::Integer(*v),
        Arg::Text(None) | Arg::Int(None) | Arg::Json(None) => ValueRef::Null,
        Arg::Real(v) => ValueRef::Real(*v),
        Arg::Bool(v) => ValueRef::Integer(i64::from(*v)),
        Arg::Bytes(v) => ValueRef::Blob(v),
        Arg::Json(Some(v)) => ValueRef::Text(v.get().as_bytes()),
    })
}

#[async_trait]
impl StoreTx for SqliteTx {
    async fn commit(self: Box<Self>) -> Result<()> {
        let SqliteTx { tx, appended } = *self;
        match tx {
            Tx::Read(tx) => tx.commit(),
            // Returns once the group's COMMIT made it durable; the cursor watch moved then.
            Tx::Write(member) => member.commit(appended).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use rusqlite::Connection;
    use waymark_store_sql::Statement;

    /// The shared statements are written with `$n`, bound by their number: a placeholder may
    /// stand in any order, more than once, and `NULL` under a `CAST`; a bare `?` takes the next.
    #[test]
    fn numbered_placeholders_bind_by_number() {
        let db = Connection::open_in_memory().unwrap();
        let s =
            Statement::new("SELECT $2 AS a, $1 AS b, $2 || $1 AS c, CAST($3 AS TEXT) IS NULL AS d")
                .bind("one")
                .bind("two")
                .bind(None::<&str>);
        let mut st = super::prepare(&db, &s).unwrap();
        let mut rows = st.raw_query();
        let row = rows.next().unwrap().unwrap();
        assert_eq!(row.get::<_, String>("a").unwrap(), "two");
        assert_eq!(row.get::<_, String>("b").unwrap(), "one");
        assert_eq!(row.get::<_, String>("c").unwrap(), "twoone");
        assert!(row.get::<_, bool>("d").unwrap());
        drop(rows);
        drop(st);
        let s = Statement::new("SELECT ? || ?, ?1").bind("x").bind("y");
        let mut st = super::prepare(&db, &s).unwrap();
        let mut rows = st.raw_query();
        let row = rows.next().unwrap().unwrap();
        assert_eq!(row.get::<_, String>(0).unwrap(), "xy");
        assert_eq!(row.get::<_, String>(1).unwrap(), "x");
    }

    /// A placeholder past the arguments given is an error, never a silent `NULL`.
    #[test]
    fn a_placeholder_without_its_argument_is_refused() {
        let db = Connection::open_in_memory().unwrap();
        let s = Statement::new("SELECT $1, $2").bind("one");
        let err = super::prepare(&db, &s).err().expect("refused");
        assert!(err.to_string().contains("placeholder 2"), "{err}");
    }
}
