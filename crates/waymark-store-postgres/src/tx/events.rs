//! `EventsTx` on PostgreSQL: the event log (cursors, retention) and the audit log. An append takes
//! the cursor lock first, so cursors become visible in commit order (crate docs).

use async_trait::async_trait;
use waymark_store::*;
use waymark_store_sql as sql;

use super::{PgTx, db_err};
use crate::CURSOR_LOCK;
use crate::rows::*;

#[async_trait]
impl EventsTx for PgTx {
    async fn append_event(&mut self, e: &NewEvent) -> Result<i64> {
        if !self.cursor_locked {
            // Held to commit: event-writing transactions draw cursors and commit one at a time,
            // so cursors become visible in order (crate docs, "Cursors become visible …").
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(CURSOR_LOCK)
                .execute(&mut *self.tx)
                .await
                .map_err(db_err)?;
            self.cursor_locked = true;
        }
        let cursor = sql::events::append_event(e)
            .query_scalar()
            .fetch_one(&mut *self.tx)
            .await
            .map_err(db_err)?;
        self.note_appended(cursor);
        Ok(cursor)
    }

    async fn events_after(
        &mut self,
        cursor: i64,
        limit: i64,
        owners: Option<&[String]>,
    ) -> Result<Vec<EventRow>> {
        let q = match owners {
            Some([o]) => sql::events::owner_events_after(o, cursor, limit).query(),
            // A delegate's view: several owners, merged by cursor.
            Some(os) => sqlx::query(
                "SELECT * FROM events WHERE owner_id = ANY($1) AND cursor > $2
                 ORDER BY cursor LIMIT $3",
            )
            .bind(os)
            .bind(cursor)
            .bind(limit),
            None => sql::events::events_after(cursor, limit).query(),
        };
        self.all(q, event_row).await
    }

    async fn max_cursor(&mut self) -> Result<i64> {
        // The pruned mark remembers the newest cursor even after pruning deleted it.
        self.scalar(
            "SELECT GREATEST(COALESCE((SELECT MAX(cursor) FROM events), 0),
                             (SELECT pruned_through FROM event_retention WHERE id = 1))",
        )
        .await
    }

    async fn pruned_through(&mut self) -> Result<i64> {
        sql::events::pruned_through()
            .query_scalar()
            .fetch_one(&mut *self.tx)
            .await
            .map_err(db_err)
    }

    async fn prune_events_through(&mut self, cursor: i64) -> Result<u64> {
        let n = self
            .exec(sql::events::delete_events_through(cursor).query())
            .await?;
        self.exec(
            sqlx::query(
                "UPDATE event_retention SET pruned_through = GREATEST(pruned_through, $1)
                 WHERE id = 1",
            )
            .bind(cursor),
        )
        .await?;
        Ok(n)
    }

    async fn insert_audit(&mut self, a: &AuditRow) -> Result<()> {
        self.exec(sql::events::insert_audit(a).query())
            .await
            .map(drop)
    }

    async fn prune_audit(&mut self, before: i64, keep: i64) -> Result<u64> {
        // Two range deletes (by the `at` index, then by id) rather than one `OR`.
        let old = self
            .exec(sql::events::delete_audit_before(before).query())
            .await?;
        let over = self
            .exec(sql::events::delete_audit_over(keep.max(0)).query())
            .await?;
        Ok(old + over)
    }

    async fn list_audit(&mut self, task_id: Option<&str>, limit: i64) -> Result<Vec<AuditRow>> {
        self.all(sql::events::list_audit(task_id, limit).query(), audit_row)
            .await
    }
}
