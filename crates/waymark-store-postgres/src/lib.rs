//! The PostgreSQL store: several stateless control-plane replicas share one database. The
//! server's rules (leases, fences, CAS) stay in `waymark-server`; this crate only makes the
//! read-check-write transactions they run correct when two replicas run them at once.
//!
//! # What holds across replicas, and how
//!
//! * **A write transaction locks the task it reads.** Write transactions run at `READ
//!   COMMITTED`, and [`TasksTx::task`] in them is `SELECT … FOR UPDATE`. Every rule the server
//!   checks (lease held? fence current? `sequence == last + 1`? `plan_revision` matches?) starts
//!   by loading the task, so the checks and writes on one task serialise across replicas: the
//!   second transaction waits for the first to commit and then reads its row, never a stale
//!   one (no lost update, no two live leases). Unique keys (`(task_id, sequence)`,
//!   `(task_id, idempotency_key)`, `command_id`, …) back this up: an insert that meets an
//!   existing key is [`StoreError::Conflict`]. Inserts use `ON CONFLICT DO NOTHING` and report
//!   a row that was not written as the conflict, so — as on SQLite — the transaction stays
//!   usable after one.
//! * **Read transactions are snapshots**: `REPEATABLE READ READ ONLY`, never blocked by writers.
//! * **Readers never pass an event still in flight.** A sequence hands out cursors in the order
//!   `nextval` runs, not the order transactions commit: a transaction holding cursor 7 may
//!   commit after one holding cursor 8, and an SSE reader that had read `cursor > 6`, seen 8 and
//!   asked for `cursor > 8` next would skip 7 forever. Event-writing transactions do not take
//!   turns to prevent it (that made every one of them, on every replica, hold one lock across
//!   its commit's WAL flush, so adding a replica added nothing: docs/scale.md). Instead each
//!   one *claims* its place before its first cursor: a shared, transaction-scoped advisory lock
//!   keyed by how far the sequence had drawn ([`CLAIM_CLASS`]), held until it commits or rolls
//!   back. Each replica computes the *horizon* — the newest cursor below every claim still held
//!   and no further than the sequence has drawn ([`fanout`]) — and every read of the log stops
//!   at the horizon its transaction saw before its snapshot. Every cursor up to it is then
//!   committed and in that snapshot, or rolled back and never will be: no gap, no duplicate,
//!   and readers of different replicas see one order. PostgreSQL makes a commit visible before
//!   it releases the transaction's locks. Two transactions on one task still commit in order
//!   (the task's row lock), so its events' cursors grow with them. `max_cursor` is the newest
//!   event up to that horizon, so the rows a snapshot reads beside it may already show changes
//!   whose events come after it: a client resuming from it gets those events again, in order,
//!   and ends where the snapshot was or later.
//! * **Fan-out.** [`Store::cursor_watch`] is the horizon. A replica computes it again after its
//!   own commits (the commit waits, so a replica reads its own writes), when another replica
//!   announces a commit on `waymark_events` (`pg_notify`, sent after the commit in a
//!   transaction of its own that does not wait for the disk: a notifying transaction holds
//!   PostgreSQL's cluster-wide notify lock until it ends, so a writer's own commit must not
//!   notify), and every second in any case. Each store keeps one dedicated listener connection
//!   (`PgListener`); when it is lost, the task connects and `LISTEN`s again, then computes the
//!   horizon, so a commit announced while it was away still wakes the streams.
//! * **Messages** get `seq = max + 1` per session under a transaction-scoped advisory lock on
//!   the session (`pg_advisory_xact_lock(MESSAGES_LOCK, hashtext(session_id))`), taken before
//!   the `MAX` is read: two replicas appending to one session queue instead of colliding, with
//!   no retry, whether or not the caller locked the task first.
//! * **Errors.** Unique violations are `Conflict`; serialization failures, deadlocks, lock
//!   and statement timeouts and an exhausted pool are `Busy` (retry).
//! * **Schema.** Migrations in `migrations/server-postgres` run at connect on a connection of
//!   their own under sqlx's migration advisory lock, so replicas starting together migrate once;
//!   a database migrated by a newer build is refused with [`StoreError::NewerSchema`].
//!
//! # What callers must know
//!
//! A write transaction that has appended an event holds its claim until it ends, and no reader
//! of any replica passes its cursor meanwhile: keep event-writing transactions short. Lock every
//! task a transaction needs (call `task()`) before its first `append_event`, so its events'
//! cursors follow the task's order.
//!
//! A transaction left idle for [`PgOptions::idle_in_transaction_timeout`] is ended by
//! PostgreSQL, so a hung replica cannot hold a task, or the horizon, for everyone else.
//!
//! JSON columns are `JSONB`: a value comes back equal as a `serde_json::Value` (key order and
//! number spelling may differ, the value does not). PostgreSQL stores no NUL character, in
//! `TEXT` nor in a `JSONB` string (`\u0000`): such a write fails with `Backend` here while
//! SQLite takes it, so input should refuse NUL before it reaches a store.
//!
//! [`TasksTx::task`]: waymark_store::TasksTx::task
//! [`EventsTx::append_event`]: waymark_store::EventsTx::append_event

mod fanout;
mod rows;
pub mod testing;
mod tx;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgPool};
use tokio::sync::watch;
use waymark_store::{Result, Store, StoreError, StoreTx};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/server-postgres");

/// The channel commits announce their newest cursor on.
pub(crate) const EVENTS_CHANNEL: &str = "waymark_events";
/// The claims of event-writing transactions (crate docs): 64-bit advisory keys
/// `CLAIM_CLASS << 32 | position`, which `pg_locks` shows as `classid` (the upper half, from
/// `CLAIM_CLASS` up) and `objid` (the lower half). Positions below 2^53 (cursors are JSON
/// numbers) keep the upper half within `CLAIM_CLASS .. CLAIM_CLASS + CLAIM_CLASSES`.
pub(crate) const CLAIM_CLASS: i64 = 0x5700_0000;
/// How many `classid`s the claims span.
pub(crate) const CLAIM_CLASSES: i64 = 1 << 24;
/// The first claim key: position 0.
pub(crate) const CLAIM_KEYS: i64 = CLAIM_CLASS << 32;

/// How far the cursor sequence has drawn, as SQL over `events_cursor_seq` (a sequence not yet
/// called has drawn nothing): the position a claim is keyed by and the horizon's upper bound,
/// written once for the statements that `concat!` it in.
macro_rules! drawn {
    () => {
        "CASE WHEN is_called THEN last_value ELSE last_value - 1 END"
    };
}
pub(crate) use drawn;
/// The class of the per-session advisory locks (two 32-bit key space, which does not overlap
/// the 64-bit one): the bytes of `"wmsg"`.
pub(crate) const MESSAGES_LOCK: i32 = 0x776d_7367;

/// A pooled connection idle for longer than this is pinged before it is used.
const PING_AFTER_IDLE: Duration = Duration::from_secs(5);

/// How a [`PgStore`] connects.
#[derive(Debug, Clone)]
pub struct PgOptions {
    /// Connections in the pool of this replica (the commit listener and the horizon have one
    /// more each).
    pub max_connections: u32,
    /// How long a statement waits for a row or advisory lock before failing with
    /// [`StoreError::Busy`].
    pub lock_timeout: Duration,
    /// How long `write()` and `read()` wait for a free connection before [`StoreError::Busy`].
    pub acquire_timeout: Duration,
    /// How long a transaction may sit idle before PostgreSQL ends it: a replica that hangs
    /// inside a transaction must not hold a task (or the horizon) for every other replica.
    pub idle_in_transaction_timeout: Duration,
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            max_connections: 16,
            lock_timeout: Duration::from_secs(10),
            acquire_timeout: Duration::from_secs(30),
            idle_in_transaction_timeout: Duration::from_secs(60),
        }
    }
}

/// A control-plane store in a PostgreSQL database, safe to share between replicas.
pub struct PgStore {
    pool: PgPool,
    listener_pool: PgPool,
    horizon_pool: PgPool,
    horizon: Arc<fanout::Horizon>,
    fanout: tokio::task::JoinHandle<()>,
}

impl PgStore {
    /// Connects to `url` (`postgres://…`), migrates the database and starts following
    /// commits, with [`PgOptions::default`].
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, PgOptions::default()).await
    }

    /// Connects with explicit pool and timeout settings.
    pub async fn connect_with(url: &str, options: PgOptions) -> Result<Self> {
        let open_err = |reason: String| StoreError::Open {
            path: redact(url),
            reason,
        };
        let base = PgConnectOptions::from_str(url)
            .map_err(|e| open_err(format!("not a PostgreSQL URL: {e}")))?
            .application_name("waymark");
        migrate(&base).await.map_err(|e| match e {
            StoreError::Backend(reason) => open_err(reason),
            e => e,
        })?;

        let ms = |d: Duration| d.as_millis().max(1).to_string();
        let with_timeouts = base.clone().options([
            ("lock_timeout", ms(options.lock_timeout)),
            (
                "idle_in_transaction_session_timeout",
                ms(options.idle_in_transaction_timeout),
            ),
        ]);
        // sqlx pings a connection before every use by default: one more round trip per
        // transaction. A connection used moments ago is as alive as the ping would say, so
        // only one that sat idle for a while is pinged (and replaced when that fails).
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections.max(1))
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for < PING_AFTER_IDLE {
                        return Ok(true);
                    }
                    conn.ping().await.map(|()| true)
                })
            })
            .acquire_timeout(options.acquire_timeout)
            .connect_with(with_timeouts.clone())
            .await
            .map_err(|e| open_err(e.to_string()))?;
        // The listener's connection lives as long as the store: no idle or lifetime limit.
        let listener_pool = PgPoolOptions::new()
            .max_connections(1)
            .max_lifetime(None)
            .idle_timeout(None)
            .acquire_timeout(options.acquire_timeout)
            .connect_lazy_with(base.application_name("waymark-listener"));
        // The horizon is computed on a connection of its own, so a commit waiting for it does
        // not queue behind the writers for the pool.
        let horizon_pool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(options.acquire_timeout)
            .connect_lazy_with(with_timeouts.clone().application_name("waymark-horizon"));
        let listener = fanout::subscribe(&listener_pool)
            .await
            .map_err(|e| open_err(format!("listening for commits: {e}")))?;
        // Computed after LISTEN: a commit between the two is either announced or counted here.
        let start = fanout::horizon(&horizon_pool)
            .await
            .map_err(|e| open_err(format!("reading the newest cursor: {e}")))?;
        let horizon = Arc::new(fanout::Horizon::new(start));
        let fanout = tokio::spawn(fanout::run(
            listener_pool.clone(),
            horizon_pool.clone(),
            horizon.clone(),
            listener,
        ));
        Ok(PgStore {
            pool,
            listener_pool,
            horizon_pool,
            horizon,
            fanout,
        })
    }

    /// The newest migration this build knows.
    pub fn schema_version() -> i64 {
        MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0)
    }

    /// Stops following commits and closes every connection, waiting for transactions in
    /// flight to end.
    pub async fn close(&self) {
        self.fanout.abort();
        self.listener_pool.close().await;
        self.horizon_pool.close().await;
        self.pool.close().await;
    }
}

impl Drop for PgStore {
    fn drop(&mut self) {
        self.fanout.abort();
    }
}

/// Runs the migrations on a connection of their own: sqlx holds a session advisory lock while
/// it migrates (so replicas starting together migrate once), and a refused migration must not
/// hand that lock back to a pool.
async fn migrate(base: &PgConnectOptions) -> Result<()> {
    let mut conn = base
        .connect()
        .await
        .map_err(|e| StoreError::Backend(e.to_string()))?;
    let res = match MIGRATOR.run(&mut conn).await {
        Ok(()) => Ok(()),
        Err(sqlx::migrate::MigrateError::VersionMissing(found)) => Err(StoreError::NewerSchema {
            found,
            known: PgStore::schema_version(),
        }),
        Err(e) => Err(StoreError::Backend(format!("migrating the database: {e}"))),
    };
    if res.is_ok() {
        // A failed close only loses the goodbye message; dropping the connection ends it.
        let _ = conn.close().await;
    }
    res
}

/// The URL without its password, for messages.
fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => match rest[..at].find(':') {
            Some(colon) => format!(
                "{}{}:***{}",
                &url[..scheme_end],
                &rest[..colon],
                &rest[at..]
            ),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

#[async_trait]
impl Store for PgStore {
    async fn write(&self) -> Result<Box<dyn StoreTx>> {
        // The horizon is taken before the transaction's first statement, so everything up to
        // it is in what the transaction reads.
        let through = self.horizon.now();
        let tx = self
            .pool
            .begin_with("BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE")
            .await
            .map_err(tx::db_err)?;
        Ok(Box::new(tx::PgTx::new(
            tx,
            Some(self.horizon.clone()),
            through,
        )))
    }

    async fn read(&self) -> Result<Box<dyn StoreTx>> {
        // Taken before the snapshot (the first statement's): see `write`.
        let through = self.horizon.now();
        let tx = self
            .pool
            .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .await
            .map_err(tx::db_err)?;
        Ok(Box::new(tx::PgTx::new(tx, None, through)))
    }

    fn cursor_watch(&self) -> watch::Receiver<i64> {
        self.horizon.watch.subscribe()
    }

    fn backend(&self) -> &'static str {
        "postgres"
    }
}

/// Raises the watch to `cursor` if that is newer; never lowers it.
pub(crate) fn advance(watch: &watch::Sender<i64>, cursor: i64) {
    watch.send_if_modified(|c| {
        let newer = cursor > *c;
        if newer {
            *c = cursor;
        }
        newer
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_stay_out_of_messages() {
        assert_eq!(
            redact("postgres://waymark:s3cret@db:5432/waymark"),
            "postgres://waymark:***@db:5432/waymark"
        );
        assert_eq!(
            redact("postgres://waymark@db/waymark?sslmode=require"),
            "postgres://waymark@db/waymark?sslmode=require"
        );
        assert_eq!(
            redact("postgres://u:p@ss@db/w"),
            "postgres://u:***@db/w",
            "the last @ of the authority ends the password"
        );
        assert_eq!(redact("not a url"), "not a url");
    }
}
