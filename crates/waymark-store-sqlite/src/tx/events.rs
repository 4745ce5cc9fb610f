//! `EventsTx` on SQLite: the event log (cursors, retention) and the audit log. An append notes its
//! cursor, which the group's commit announces.

use async_trait::async_trait;
use waymark_store::*;
use waymark_store_sql::{self as sql, Statement};

use super::SqliteTx;
use crate::rows::*;

#[async_trait]
impl EventsTx for SqliteTx {
    async fn append_event(&mut self, e: &NewEvent) -> Result<i64> {
        let cursor = self.scalar(sql::events::append_event(e))?;
        self.appended = Some(cursor);
        Ok(cursor)
    }

    async fn events_after(
        &mut self,
        cursor: i64,
        limit: i64,
        owners: Option<&[String]>,
    ) -> Result<Vec<EventRow>> {
        let q = match owners {
            Some([o]) => sql::events::owner_events_after(o, cursor, limit),
            // A delegate's view: several owners, merged by cursor.
            Some(os) => Statement::new(
                "SELECT * FROM events
                 WHERE owner_id IN (SELECT value FROM json_each(?)) AND cursor > ?
                 ORDER BY cursor LIMIT ?",
            )
            .json(os)
            .bind(cursor)
            .bind(limit),
            None => sql::events::events_after(cursor, limit),
        };
        self.all(q, event_row)
    }

    async fn max_cursor(&mut self) -> Result<i64> {
        // The sequence table remembers the newest cursor even after pruning deleted it.
        self.scalar(Statement::new(
            "SELECT MAX(COALESCE((SELECT MAX(cursor) FROM events), 0),
                        (SELECT pruned_through FROM event_retention WHERE id = 1))",
        ))
    }

    async fn pruned_through(&mut self) -> Result<i64> {
        self.scalar(sql::events::pruned_through())
    }

    async fn prune_events_through(&mut self, cursor: i64) -> Result<u64> {
        let n = self.exec(sql::events::delete_events_through(cursor))?;
        self.exec(
            Statement::new(
                "UPDATE event_retention SET pruned_through = MAX(pruned_through, ?) WHERE id = 1",
            )
            .bind(cursor),
        )?;
        Ok(n)
    }

    async fn insert_audit(&mut self, a: &AuditRow) -> Result<()> {
        self.exec(sql::events::insert_audit(a)).map(drop)
    }

    async fn list_audit(&mut self, task_id: Option<&str>, limit: i64) -> Result<Vec<AuditRow>> {
        self.all(sql::events::list_audit(task_id, limit), audit_row)
    }

    async fn prune_audit(&mut self, before: i64, keep: i64) -> Result<u64> {
        // Two range deletes (by the `at` index, then by id) rather than one `OR`.
        let old = self.exec(sql::events::delete_audit_before(before))?;
        let over = self.exec(sql::events::delete_audit_over(keep.max(0)))?;
        Ok(old + over)
    }
}
