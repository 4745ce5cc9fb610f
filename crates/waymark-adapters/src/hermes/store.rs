//! Hermes' SQLite session store (`~/.hermes/state.db`), read and never written: opened with
//! SQLite's read-only flag plus `query_only`, columns looked up first so an older or newer
//! schema reads as long as the few columns used are there (others read as NULL), and a busy
//! database (a checkpoint, a recovery) retried.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions, SqliteRow};
use sqlx::{Row, SqliteConnection};

/// How often a busy database is tried again before giving up.
const BUSY_TRIES: u32 = 8;

/// A `sessions` row.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SessionRow {
    pub(crate) id: String,
    pub(crate) source: Option<String>,
    pub(crate) title: Option<String>,
    pub(crate) model_config: Option<Value>,
    pub(crate) parent_session_id: Option<String>,
    pub(crate) started_at: Option<f64>,
    pub(crate) ended_at: Option<f64>,
    pub(crate) end_reason: Option<String>,
    pub(crate) cwd: Option<String>,
}

/// A `messages` row.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct MessageRow {
    pub(crate) id: i64,
    pub(crate) role: String,
    pub(crate) content: Option<String>,
    pub(crate) tool_call_id: Option<String>,
    pub(crate) tool_calls: Option<Value>,
    pub(crate) tool_name: Option<String>,
    pub(crate) effect_disposition: Option<String>,
    pub(crate) display_kind: Option<String>,
}

/// One assistant tool call: `tool_calls[]` of an assistant row.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ToolCall {
    pub(crate) name: String,
    /// Parsed when the arguments are JSON text, else as given.
    pub(crate) arguments: Value,
}

/// The state database, opened read-only.
#[derive(Debug)]
pub(crate) struct HermesDb {
    pool: SqlitePool,
    sessions: HashSet<String>,
    messages: HashSet<String>,
}

impl HermesDb {
    /// Opens `path` read-only (`SQLITE_OPEN_READONLY`, the `mode=ro` of a URI).
    pub(crate) async fn open(path: &Path) -> Result<HermesDb, sqlx::Error> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .read_only(true)
            .create_if_missing(false)
            .busy_timeout(Duration::from_secs(5))
            .pragma("query_only", "ON");
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await?;
        let mut db = HermesDb {
            pool,
            sessions: HashSet::new(),
            messages: HashSet::new(),
        };
        db.sessions = db.columns("sessions").await?;
        db.messages = db.columns("messages").await?;
        for (table, cols, needed) in [
            ("sessions", &db.sessions, &["id"][..]),
            ("messages", &db.messages, &["id", "session_id", "role"][..]),
        ] {
            if let Some(missing) = needed.iter().find(|c| !cols.contains(**c)) {
                return Err(sqlx::Error::Protocol(format!(
                    "this is not a Hermes state database: table `{table}` has no column `{missing}`"
                )));
            }
        }
        Ok(db)
    }

    /// Closes the pool.
    pub(crate) async fn close(self) {
        self.pool.close().await;
    }

    async fn columns(&self, table: &str) -> Result<HashSet<String>, sqlx::Error> {
        let sql = format!("SELECT name FROM pragma_table_info('{table}')");
        let rows = self.fetch(&sql, &[]).await?;
        Ok(rows
            .iter()
            .filter_map(|r| r.try_get::<String, _>("name").ok())
            .collect())
    }

    /// `col` when the table has it, else `NULL AS col`; cast so SQLite's loose typing decodes.
    fn col(cols: &HashSet<String>, name: &str, cast: &str) -> String {
        if cols.contains(name) {
            format!("CAST({name} AS {cast}) AS {name}")
        } else {
            format!("NULL AS {name}")
        }
    }

    /// Runs a read, trying again while the database is busy or locked.
    async fn fetch(&self, sql: &str, binds: &[Bind<'_>]) -> Result<Vec<SqliteRow>, sqlx::Error> {
        let mut tries = 0;
        loop {
            let res = async {
                let mut conn = self.pool.acquire().await?;
                query(&mut conn, sql, binds).await
            }
            .await;
            match res {
                Err(e) if is_busy(&e) && tries + 1 < BUSY_TRIES => {
                    tries += 1;
                    tracing::debug!(error = %e, tries, "Hermes' database is busy; trying again");
                    tokio::time::sleep(Duration::from_millis(100 << tries.min(4))).await;
                }
                other => return other,
            }
        }
    }

    /// Every session, oldest first.
    pub(crate) async fn sessions(&self) -> Result<Vec<SessionRow>, sqlx::Error> {
        let c = &self.sessions;
        let sql = format!(
            "SELECT CAST(id AS TEXT) AS id, {}, {}, {}, {}, {}, {}, {}, {} FROM sessions ORDER BY started_at, id",
            Self::col(c, "source", "TEXT"),
            Self::col(c, "title", "TEXT"),
            Self::col(c, "model_config", "TEXT"),
            Self::col(c, "parent_session_id", "TEXT"),
            Self::col(c, "started_at", "REAL"),
            Self::col(c, "ended_at", "REAL"),
            Self::col(c, "end_reason", "TEXT"),
            Self::col(c, "cwd", "TEXT"),
        );
        let rows = self.fetch(&sql, &[]).await?;
        rows.iter()
            .map(|r| {
                Ok(SessionRow {
                    id: r.try_get("id")?,
                    source: r.try_get("source")?,
                    title: r.try_get("title")?,
                    model_config: r
                        .try_get::<Option<String>, _>("model_config")?
                        .and_then(|t| serde_json::from_str(&t).ok()),
                    parent_session_id: r.try_get("parent_session_id")?,
                    started_at: r.try_get("started_at")?,
                    ended_at: r.try_get("ended_at")?,
                    end_reason: r.try_get("end_reason")?,
                    cwd: r.try_get("cwd")?,
                })
            })
            .collect()
    }

    /// The session's messages after `after` (a message id), in order.
    pub(crate) async fn messages_after(
        &self,
        session: &str,
        after: i64,
    ) -> Result<Vec<MessageRow>, sqlx::Error> {
        let c = &self.messages;
        let sql = format!(
            "SELECT id, CAST(role AS TEXT) AS role, {}, {}, {}, {}, {}, {} FROM messages \
             WHERE session_id = ?1 AND id > ?2 ORDER BY id",
            Self::col(c, "content", "TEXT"),
            Self::col(c, "tool_call_id", "TEXT"),
            Self::col(c, "tool_calls", "TEXT"),
            Self::col(c, "tool_name", "TEXT"),
            Self::col(c, "effect_disposition", "TEXT"),
            Self::col(c, "display_kind", "TEXT"),
        );
        let rows = self
            .fetch(&sql, &[Bind::Text(session), Bind::Int(after)])
            .await?;
        rows.iter()
            .map(|r| {
                Ok(MessageRow {
                    id: r.try_get("id")?,
                    role: r.try_get::<Option<String>, _>("role")?.unwrap_or_default(),
                    content: r.try_get("content")?,
                    tool_call_id: r.try_get("tool_call_id")?,
                    tool_calls: r
                        .try_get::<Option<String>, _>("tool_calls")?
                        .and_then(|t| serde_json::from_str(&t).ok()),
                    tool_name: r.try_get("tool_name")?,
                    effect_disposition: r.try_get("effect_disposition")?,
                    display_kind: r.try_get("display_kind")?,
                })
            })
            .collect()
    }

    /// Every tool call the session's assistant made, by call id.
    pub(crate) async fn tool_calls(
        &self,
        session: &str,
    ) -> Result<HashMap<String, ToolCall>, sqlx::Error> {
        let mut calls = HashMap::new();
        for m in self.messages_after(session, 0).await? {
            if m.role == "assistant"
                && let Some(list) = m.tool_calls.as_ref().and_then(Value::as_array)
            {
                for c in list {
                    if let Some((id, call)) = tool_call(c) {
                        calls.insert(id, call);
                    }
                }
            }
        }
        Ok(calls)
    }

    /// The call ids that have a `role='tool'` result in the session.
    pub(crate) async fn answered_calls(
        &self,
        session: &str,
    ) -> Result<HashSet<String>, sqlx::Error> {
        if !self.messages.contains("tool_call_id") {
            return Ok(HashSet::new());
        }
        let rows = self
            .fetch(
                "SELECT CAST(tool_call_id AS TEXT) AS tool_call_id FROM messages \
                 WHERE session_id = ?1 AND role = 'tool' AND tool_call_id IS NOT NULL",
                &[Bind::Text(session)],
            )
            .await?;
        Ok(rows
            .iter()
            .filter_map(|r| r.try_get::<String, _>("tool_call_id").ok())
            .collect())
    }
}

/// `{"id": …, "function": {"name": …, "arguments": "…json…"}}` (OpenAI's shape, which Hermes
/// stores).
pub(crate) fn tool_call(c: &Value) -> Option<(String, ToolCall)> {
    let id = c.get("id")?.as_str()?.to_owned();
    let f = c.get("function").unwrap_or(c);
    let name = f
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("tool")
        .to_owned();
    let arguments = match f.get("arguments") {
        Some(Value::String(s)) => {
            serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone()))
        }
        Some(v) => v.clone(),
        None => Value::Null,
    };
    Some((id, ToolCall { name, arguments }))
}

/// A bound parameter.
#[derive(Debug, Clone, Copy)]
enum Bind<'a> {
    Text(&'a str),
    Int(i64),
}

async fn query(
    conn: &mut SqliteConnection,
    sql: &str,
    binds: &[Bind<'_>],
) -> Result<Vec<SqliteRow>, sqlx::Error> {
    let mut q = sqlx::query(sql);
    for b in binds {
        q = match *b {
            Bind::Text(t) => q.bind(t.to_owned()),
            Bind::Int(i) => q.bind(i),
        };
    }
    q.fetch_all(&mut *conn).await
}

/// `SQLITE_BUSY` or `SQLITE_LOCKED`, with their extended codes.
fn is_busy(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .and_then(|c| c.parse::<i32>().ok())
        .is_some_and(|c| matches!(c & 0xff, 5 | 6))
}
