//! The SQL both store backends speak. A statement whose text is the same on SQLite and
//! PostgreSQL is written here once, with `$1..$n` placeholders (bound by their number), together
//! with the arguments it takes, in placeholder order; PostgreSQL runs it with sqlx
//! ([`Statement::query`]), SQLite with rusqlite ([`Statement::sql`] and [`Statement::args`]).
//! What one backend says its own way stays in that backend's `tx` module: `json_each` against
//! arrays, `MAX` against `GREATEST`, `FOR UPDATE`, advisory locks, `pg_notify`.
//!
//! One module per table family, as the `waymark_store` traits and the backends' `tx` modules.

pub mod artifacts;
pub mod checkpoints;
pub mod decisions;
pub mod devices;
pub mod effects;
pub mod events;
pub mod followups;
pub mod machines;
pub mod messages;
pub mod push;
pub mod rules;
pub mod secrets;
pub mod tasks;
pub mod users;

use serde::Serialize;
use serde_json::value::RawValue;
use sqlx::query::{Query, QueryScalar};
use sqlx::types::Json;
use sqlx::{Database, Encode, FromRow, Type};

/// One argument of a statement, as both backends bind it.
pub enum Arg<'a> {
    /// `TEXT`.
    Text(Option<&'a str>),
    /// `BIGINT` (SQLite `INTEGER`).
    Int(Option<i64>),
    /// `DOUBLE PRECISION` (SQLite `REAL`).
    Real(f64),
    /// `BOOLEAN` (SQLite `INTEGER`).
    Bool(bool),
    /// `BYTEA` (SQLite `BLOB`).
    Bytes(&'a [u8]),
    /// JSON, serialised once: text on SQLite, `jsonb` on PostgreSQL (sqlx's `Json`).
    Json(Option<Box<RawValue>>),
}

impl<'a> From<&'a str> for Arg<'a> {
    fn from(v: &'a str) -> Self {
        Arg::Text(Some(v))
    }
}

impl<'a> From<&'a String> for Arg<'a> {
    fn from(v: &'a String) -> Self {
        Arg::Text(Some(v))
    }
}

impl<'a> From<Option<&'a str>> for Arg<'a> {
    fn from(v: Option<&'a str>) -> Self {
        Arg::Text(v)
    }
}

impl<'a> From<&'a Option<String>> for Arg<'a> {
    fn from(v: &'a Option<String>) -> Self {
        Arg::Text(v.as_deref())
    }
}

impl From<i64> for Arg<'_> {
    fn from(v: i64) -> Self {
        Arg::Int(Some(v))
    }
}

impl From<Option<i64>> for Arg<'_> {
    fn from(v: Option<i64>) -> Self {
        Arg::Int(v)
    }
}

impl From<f64> for Arg<'_> {
    fn from(v: f64) -> Self {
        Arg::Real(v)
    }
}

impl From<bool> for Arg<'_> {
    fn from(v: bool) -> Self {
        Arg::Bool(v)
    }
}

impl<'a> From<&'a [u8]> for Arg<'a> {
    fn from(v: &'a [u8]) -> Self {
        Arg::Bytes(v)
    }
}

/// A statement both backends run, with its arguments.
pub struct Statement<'a> {
    sql: &'static str,
    args: Vec<Arg<'a>>,
}

impl<'a> Statement<'a> {
    pub fn new(sql: &'static str) -> Self {
        Statement {
            sql,
            args: Vec::new(),
        }
    }

    /// Binds the next placeholder.
    pub fn bind(mut self, arg: impl Into<Arg<'a>>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Binds the next placeholder to a value stored as JSON.
    pub fn json<T: Serialize + ?Sized>(self, value: &T) -> Self {
        self.opt_json(Some(value))
    }

    /// Binds the next placeholder to a value stored as JSON, or to `NULL`.
    pub fn opt_json<T: Serialize + ?Sized>(mut self, value: Option<&T>) -> Self {
        let raw = value.map(|v| {
            serde_json::value::to_raw_value(v).expect("a stored value serialises as JSON")
        });
        self.args.push(Arg::Json(raw));
        self
    }

    /// The statement's text.
    pub fn sql(&self) -> &'static str {
        self.sql
    }

    /// Its arguments, in placeholder order: `$n` takes the n-th (a backend binding them itself,
    /// as the SQLite store does through rusqlite, looks each placeholder's number up here).
    pub fn args(&self) -> &[Arg<'a>] {
        &self.args
    }

    /// The statement as a query on `DB`.
    pub fn query<DB: Dialect<'a>>(self) -> Query<'a, DB, DB::Arguments<'a>> {
        self.args.into_iter().fold(sqlx::query(self.sql), DB::bind)
    }

    /// The statement as a query of one value on `DB`: the first column of each row.
    pub fn query_scalar<DB, O>(self) -> QueryScalar<'a, DB, O, DB::Arguments<'a>>
    where
        DB: Dialect<'a>,
        (O,): for<'r> FromRow<'r, DB::Row>,
    {
        self.args
            .into_iter()
            .fold(sqlx::query_scalar(self.sql), DB::bind)
    }
}

/// A database every [`Arg`] binds into: SQLite and PostgreSQL.
pub trait Dialect<'a>: Database {
    /// Binds `arg` to the next placeholder of `q`.
    fn bind<Q: Bind<'a, Self>>(q: Q, arg: Arg<'a>) -> Q;
}

impl<'a, DB> Dialect<'a> for DB
where
    DB: Database,
    Option<&'a str>: Encode<'a, DB> + Type<DB>,
    Option<i64>: Encode<'a, DB> + Type<DB>,
    f64: Encode<'a, DB> + Type<DB>,
    bool: Encode<'a, DB> + Type<DB>,
    &'a [u8]: Encode<'a, DB> + Type<DB>,
    Option<Json<Box<RawValue>>>: Encode<'a, DB> + Type<DB>,
{
    fn bind<Q: Bind<'a, Self>>(q: Q, arg: Arg<'a>) -> Q {
        match arg {
            Arg::Text(v) => q.bind(v),
            Arg::Int(v) => q.bind(v),
            Arg::Real(v) => q.bind(v),
            Arg::Bool(v) => q.bind(v),
            Arg::Bytes(v) => q.bind(v),
            Arg::Json(v) => q.bind(v.map(Json)),
        }
    }
}

/// What a statement's arguments bind into: sqlx's `Query` and `QueryScalar`.
pub trait Bind<'a, DB: Database>: Sized {
    fn bind<T: 'a + Encode<'a, DB> + Type<DB>>(self, value: T) -> Self;
}

impl<'a, DB: Database> Bind<'a, DB> for Query<'a, DB, DB::Arguments<'a>> {
    fn bind<T: 'a + Encode<'a, DB> + Type<DB>>(self, value: T) -> Self {
        Query::bind(self, value)
    }
}

impl<'a, DB: Database, O> Bind<'a, DB> for QueryScalar<'a, DB, O, DB::Arguments<'a>> {
    fn bind<T: 'a + Encode<'a, DB> + Type<DB>>(self, value: T) -> Self {
        QueryScalar::bind(self, value)
    }
}

/// An `INSERT` both backends run, in the two forms they need: as written, and ending in
/// `ON CONFLICT DO NOTHING`. Written with `insert!`.
pub struct Insert<'a> {
    statement: Statement<'a>,
    or_skip: &'static str,
}

impl<'a> Insert<'a> {
    /// Binds the next placeholder.
    pub fn bind(mut self, arg: impl Into<Arg<'a>>) -> Self {
        self.statement = self.statement.bind(arg);
        self
    }

    /// Binds the next placeholder to a value stored as JSON.
    pub fn json<T: Serialize + ?Sized>(mut self, value: &T) -> Self {
        self.statement = self.statement.json(value);
        self
    }

    /// Binds the next placeholder to a value stored as JSON, or to `NULL`.
    pub fn opt_json<T: Serialize + ?Sized>(mut self, value: Option<&T>) -> Self {
        self.statement = self.statement.opt_json(value);
        self
    }

    /// As written: a duplicate key raises a unique violation (SQLite's form, where the violation
    /// undoes this statement only).
    pub fn raising(self) -> Statement<'a> {
        self.statement
    }

    /// Ending in `ON CONFLICT DO NOTHING`: a duplicate key writes no row (PostgreSQL's form, where
    /// a raised violation would abort the whole transaction).
    pub fn or_skip(self) -> Statement<'a> {
        Statement {
            sql: self.or_skip,
            ..self.statement
        }
    }
}

/// An [`Insert`] from its SQL, and optionally what follows the conflict clause (`RETURNING …`).
macro_rules! insert {
    ($sql:literal $(, $tail:literal)?) => {
        $crate::Insert {
            statement: $crate::Statement::new(concat!($sql $(, "\n ", $tail)?)),
            or_skip: concat!($sql, "\n ON CONFLICT DO NOTHING" $(, "\n ", $tail)?),
        }
    };
}
use insert;
