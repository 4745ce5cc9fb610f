//! Following commits made by other processes on the same file (`waymark admin` revoking a
//! device while `waymark serve` runs), so [`crate::SqliteStore`]'s cursor watch moves for
//! them as it does for its own — what `LISTEN` does for the PostgreSQL store. SQLite has no
//! cross-process notification, so a read-only connection of its own looks at `PRAGMA
//! data_version` (a counter read from the WAL index in shared memory: no I/O) every
//! [`EVERY`], and reads the newest cursor only when another connection committed.

use std::sync::Weak;
use std::time::Duration;

use rusqlite::Connection;

use crate::group::Writer;

/// How often the file is looked at.
pub(crate) const EVERY: Duration = Duration::from_millis(250);

/// Runs until the store is dropped (or the connection fails, said once in the log).
pub(crate) async fn run(db: Connection, writer: Weak<Writer>) {
    let mut seen: Option<i64> = None;
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(writer) = writer.upgrade() else {
            break;
        };
        let version: i64 = match db.query_row("PRAGMA data_version", [], |r| r.get(0)) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "cannot follow other processes' commits any more");
                break;
            }
        };
        if seen == Some(version) {
            continue;
        }
        seen = Some(version);
        match db.query_row::<i64, _, _>("SELECT COALESCE(MAX(cursor), 0) FROM events", [], |r| {
            r.get(0)
        }) {
            Ok(max) => writer.advance_to(max),
            Err(e) => tracing::warn!(error = %e, "reading the newest cursor failed"),
        }
    }
}
