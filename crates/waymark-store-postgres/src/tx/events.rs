//! `EventsTx` on PostgreSQL: the event log (cursors, retention) and the audit log. A
//! transaction's first event claims its place first, and reads stop at the horizon the
//! transaction began with (crate docs).

use async_trait::async_trait;
use waymark_store::*;
use waymark_store_sql as sql;

use super::{PgTx, db_err};
use crate::CLAIM_KEYS;
use crate::rows::*;

#[async_trait]
impl EventsTx for PgTx {
    async fn append_event(&mut self, e: &NewEvent) -> Result<i64> {
        let cursor = if self.claimed {
            sql::events::append_event(e)
                .query_scalar()
                .fetch_one(&mut *self.tx)
                .await
                .map_err(db_err)?
        } else {
            // The claim (keyed by how far the sequence has drawn) is held before the cursor is
            // drawn, and until the transaction ends.
            let cursor = sqlx::query_scalar(concat!(
                "WITH claim AS MATERIALIZED (
                   SELECT pg_advisory_xact_lock_shared($6 + ",
                crate::drawn!(),
                ") FROM events_cursor_seq)
                 INSERT INTO events (task_id, owner_id, kind, data, at)
                 SELECT $1, $2, $3, $4, $5 FROM claim
                 RETURNING cursor",
            ))
            .bind(&e.task_id)
            .bind(&e.owner_id)
            .bind(e.kind.as_str())
            .bind(&e.data)
            .bind(e.at)
            .bind(CLAIM_KEYS)
            .fetch_one(&mut *self.tx)
            .await
            .map_err(db_err)?;
            self.claimed = true;
            cursor
        };
        self.note_appended(cursor);
        Ok(cursor)
    }

    async fn events_after(
        &mut self,
        cursor: i64,
        limit: i64,
        owners: Option<&[String]>,
    ) -> Result<Vec<EventRow>> {
        // Never past the horizon this transaction began with (crate docs).
        let through = self.through;
        let q = match owners {
            Some(os) => sqlx::query(
                "SELECT * FROM events WHERE owner_id = ANY($1) AND cursor > $2 AND cursor <= $3
                 ORDER BY cursor LIMIT $4",
            )
            .bind(os)
            .bind(cursor)
            .bind(through)
            .bind(limit),
            None => sqlx::query(
                "SELECT * FROM events WHERE cursor > $1 AND cursor <= $2 ORDER BY cursor LIMIT $3",
            )
            .bind(cursor)
            .bind(through)
            .bind(limit),
        };
        self.all(q, event_row).await
    }

    async fn max_cursor(&mut self) -> Result<i64> {
        // The newest event up to the horizon; the pruned mark remembers the newest cursor
        // even after pruning deleted it.
        sqlx::query_scalar(
            "SELECT GREATEST(COALESCE((SELECT MAX(cursor) FROM events WHERE cursor <= $1), 0),
                             (SELECT pruned_through FROM event_retention WHERE id = 1))",
        )
        .bind(self.through)
        .fetch_one(&mut *self.tx)
        .await
        .map_err(db_err)
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
