//! The horizon, and following the commits of every replica.
//!
//! The horizon is the newest cursor below which no event-writing transaction of any replica is
//! still in flight: every cursor up to it is committed (and visible to any snapshot taken
//! after it was computed) or rolled back (a gap that never fills). The cursor watch carries it,
//! and every read of the log stops there (the crate docs say why it is safe).
//!
//! It is computed on a connection of its own by one statement that reads, in this order, how
//! far the cursor sequence has drawn, then the smallest claim held in `pg_locks` (each
//! event-writing transaction holds a shared advisory lock keyed by the sequence's position
//! before its first cursor, until it ends). A transaction that drew a cursor before the first read held its
//! claim before it drew, so the second read sees it; one that draws after the first read gets
//! a cursor above the horizon.
//!
//! It is computed again when this replica committed events (the commit waits for that, so a
//! replica reads its own writes), when another replica's commit is announced on the events
//! channel, and every [`EVERY`] in any case (a transaction rolled back, or an announcement
//! lost while the listener reconnected). The announcement itself is a `pg_notify` in a
//! transaction of its own with `synchronous_commit` off: a notifying commit holds
//! PostgreSQL's cluster-wide notify lock until it ends, so it must not be the writer's own
//! durable commit.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::{Notify, watch};

use crate::{CLAIM_CLASS, CLAIM_CLASSES, EVENTS_CHANNEL, advance};

const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);
/// How often the horizon is computed when nothing asked for it.
pub(crate) const EVERY: Duration = Duration::from_secs(1);
/// How long a commit waits for its replica's horizon to be computed again before it answers
/// anyway (the database is unreachable: the next computation will catch up).
const COMMIT_WAIT: Duration = Duration::from_secs(5);

/// A replica's horizon and the requests to compute it again.
pub(crate) struct Horizon {
    /// The horizon: the store's cursor watch.
    pub(crate) watch: watch::Sender<i64>,
    /// Computations asked for so far.
    requested: AtomicU64,
    /// The newest request a finished computation started after.
    done: watch::Sender<u64>,
    wake: Notify,
    /// The newest cursor this replica committed and has not announced yet (0: none).
    unannounced: AtomicI64,
}

impl Horizon {
    pub(crate) fn new(start: i64) -> Horizon {
        Horizon {
            watch: watch::channel(start).0,
            requested: AtomicU64::new(0),
            done: watch::channel(0).0,
            wake: Notify::new(),
            unannounced: AtomicI64::new(0),
        }
    }

    /// The horizon now.
    pub(crate) fn now(&self) -> i64 {
        *self.watch.borrow()
    }

    /// After a commit that appended events up to `cursor`: asks for the horizon again (and
    /// for the commit to be announced to the other replicas), and waits until a computation
    /// that started after this call has finished, so the replica's reads include the commit
    /// unless an older transaction is still in flight.
    pub(crate) async fn committed(&self, cursor: i64) {
        self.unannounced.fetch_max(cursor, Ordering::AcqRel);
        let asked = self.requested.fetch_add(1, Ordering::AcqRel) + 1;
        let mut done = self.done.subscribe();
        self.wake.notify_one();
        let _ = tokio::time::timeout(COMMIT_WAIT, done.wait_for(|d| *d >= asked)).await;
    }

    /// Asks for the horizon again without waiting (another replica committed).
    fn poke(&self) {
        self.requested.fetch_add(1, Ordering::AcqRel);
        self.wake.notify_one();
    }
}

/// The horizon as the database says it now (see the module docs), in one statement: the
/// sequence is read in the `FROM` row, and the claims by a subquery of the select list that
/// refers to it, which runs only once that row was read.
pub(crate) async fn horizon(pool: &PgPool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(concat!(
        "SELECT LEAST(s.drawn, (
           SELECT MIN(((l.classid::bigint - $1) << 32) | l.objid::bigint) FROM pg_locks l
           WHERE s.drawn IS NOT NULL AND l.locktype = 'advisory' AND l.objsubid = 1
             AND l.classid::bigint >= $1 AND l.classid::bigint < $1 + $2
             AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())))
         FROM (SELECT ",
        crate::drawn!(),
        " AS drawn FROM events_cursor_seq) s",
    ))
    .bind(CLAIM_CLASS)
    .bind(CLAIM_CLASSES)
    .fetch_one(pool)
    .await
}

/// Computes the horizon (and answers the commits waiting for it), then announces this
/// replica's newest commit to the others.
async fn refresh(pool: &PgPool, h: &Horizon) -> Result<(), sqlx::Error> {
    let asked = h.requested.load(Ordering::Acquire);
    let unannounced = h.unannounced.swap(0, Ordering::AcqRel);
    let computed = horizon(pool).await;
    if let Ok(at) = computed {
        advance(&h.watch, at);
        h.done.send_if_modified(|d| {
            let newer = asked > *d;
            if newer {
                *d = asked;
            }
            newer
        });
    }
    if unannounced > 0 {
        // A wake-up, not a record: nothing is lost if it is (the others compute every
        // `EVERY`), so its commit need not wait for the disk.
        let sent =
            sqlx::query("SELECT set_config('synchronous_commit', 'off', true), pg_notify($1, $2)")
                .bind(EVENTS_CHANNEL)
                .bind(unannounced.to_string())
                .execute(pool)
                .await;
        if let Err(e) = sent {
            h.unannounced.fetch_max(unannounced, Ordering::AcqRel);
            return Err(e);
        }
    }
    computed.map(drop)
}

/// A listener on the events channel. It reports a lost connection (`Ok(None)`) at once, so the
/// caller can catch up before trusting notifications again.
pub(crate) async fn subscribe(listener_pool: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(listener_pool).await?;
    listener.eager_reconnect(false);
    listener.listen(EVENTS_CHANNEL).await?;
    Ok(listener)
}

/// Computes the horizon whenever asked, and every [`EVERY`], until the pool closes (the store
/// closed) or the task is aborted (the store dropped); and follows the other replicas' commits
/// on the listener, reconnecting with backoff.
pub(crate) async fn run(
    listener_pool: PgPool,
    pool: PgPool,
    horizon: std::sync::Arc<Horizon>,
    first: PgListener,
) {
    let computing = async {
        let mut tick = tokio::time::interval(EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = horizon.wake.notified() => {}
                _ = tick.tick() => {}
            }
            match refresh(&pool, &horizon).await {
                Ok(()) => {}
                Err(sqlx::Error::PoolClosed) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot compute the event horizon");
                    tokio::time::sleep(RETRY_FIRST).await;
                }
            }
        }
    };
    tokio::join!(computing, listen(listener_pool, &horizon, first));
}

/// Pokes the horizon on every notification, and once after each (re)subscription (a commit
/// announced while no listener was connected is lost).
async fn listen(listener_pool: PgPool, horizon: &Horizon, first: PgListener) {
    let mut listener = Some(first);
    let retries = || {
        ExponentialBuilder::default()
            .with_min_delay(RETRY_FIRST)
            .with_max_delay(RETRY_MAX)
            .without_max_times()
            .build()
    };
    let mut delays = retries();
    loop {
        let mut current = match listener.take() {
            Some(l) => l,
            None => match subscribe(&listener_pool).await {
                Ok(l) => {
                    tracing::info!("listening for commits again");
                    horizon.poke();
                    l
                }
                Err(sqlx::Error::PoolClosed) => return,
                Err(e) => {
                    let retry = delays.next().unwrap_or(RETRY_MAX);
                    tracing::warn!(error = %e, retry_in = ?retry, "cannot listen for commits");
                    tokio::time::sleep(retry).await;
                    continue;
                }
            },
        };
        delays = retries();
        loop {
            match current.try_recv().await {
                Ok(Some(_)) => horizon.poke(),
                Ok(None) => {
                    tracing::warn!("the commit listener lost its connection; reconnecting");
                    break;
                }
                Err(sqlx::Error::PoolClosed) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "the commit listener failed; reconnecting");
                    break;
                }
            }
        }
        drop(current);
        tokio::time::sleep(RETRY_FIRST).await;
    }
}
