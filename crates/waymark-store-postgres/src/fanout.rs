//! Following commits of every replica: one `LISTEN waymark_events` connection per store whose
//! notifications (the committing transaction's newest cursor) raise the cursor watch.
//!
//! Notifications sent while no listener is connected are lost, so every (re)subscription is
//! followed by a read of the newest cursor: `LISTEN` first, then `MAX(cursor)`, so a commit is
//! either notified to the new listener or counted by the read.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::watch;

use crate::{EVENTS_CHANNEL, advance};

const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// A listener on the events channel. It reports a lost connection (`Ok(None)`) at once, so the
/// caller can catch up before trusting notifications again.
pub(crate) async fn subscribe(listener_pool: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(listener_pool).await?;
    listener.eager_reconnect(false);
    listener.listen(EVENTS_CHANNEL).await?;
    Ok(listener)
}

/// The newest committed cursor (0 when the log is empty; the pruned mark when it was pruned).
pub(crate) async fn newest_cursor(pool: &PgPool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT GREATEST(COALESCE((SELECT MAX(cursor) FROM events), 0),
                         (SELECT pruned_through FROM event_retention WHERE id = 1))",
    )
    .fetch_one(pool)
    .await
}

/// Raises `watch` on every notification until the listener pool closes (the store closed) or
/// the task is aborted (the store dropped). Reconnects with backoff when the connection is
/// lost and catches up after each reconnect.
pub(crate) async fn run(
    listener_pool: PgPool,
    pool: PgPool,
    watch: watch::Sender<i64>,
    first: PgListener,
) {
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
            None => {
                let caught_up = async {
                    let l = subscribe(&listener_pool).await?;
                    advance(&watch, newest_cursor(&pool).await?);
                    Ok::<_, sqlx::Error>(l)
                };
                match caught_up.await {
                    Ok(l) => {
                        tracing::info!("listening for commits again");
                        l
                    }
                    Err(sqlx::Error::PoolClosed) => return,
                    Err(e) => {
                        let retry = delays.next().unwrap_or(RETRY_MAX);
                        tracing::warn!(error = %e, retry_in = ?retry, "cannot listen for commits");
                        tokio::time::sleep(retry).await;
                        continue;
                    }
                }
            }
        };
        delays = retries();
        loop {
            match current.try_recv().await {
                Ok(Some(n)) => match n.payload().parse::<i64>() {
                    Ok(cursor) => advance(&watch, cursor),
                    Err(_) => {
                        tracing::warn!(payload = n.payload(), "a commit notice without a cursor");
                        match newest_cursor(&pool).await {
                            Ok(c) => advance(&watch, c),
                            Err(e) => tracing::warn!(error = %e, "cannot read the newest cursor"),
                        }
                    }
                },
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
