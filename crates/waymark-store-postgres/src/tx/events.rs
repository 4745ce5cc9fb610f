//! `EventsTx` on PostgreSQL: the event log (cursors, retention) and the audit log. An append takes
//! the cursor lock first, so cursors become visible in commit order (crate docs).

use async_trait::async_trait;
use waymark_store::*;

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
        let cursor: i64 = sqlx::query_scalar(
            "INSERT INTO events (task_id, owner_id, kind, data, at) VALUES ($1, $2, $3, $4, $5)
             RETURNING cursor",
        )
        .bind(&e.task_id)
        .bind(&e.owner_id)
        .bind(e.kind.as_str())
        .bind(&e.data)
        .bind(e.at)
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
        match owners {
            Some([o]) => {
                self.all(
                    sqlx::query(
                        "SELECT * FROM events WHERE owner_id = $1 AND cursor > $2
                         ORDER BY cursor LIMIT $3",
                    )
                    .bind(o)
                    .bind(cursor)
                    .bind(limit),
                    event_row,
                )
                .await
            }
            // A delegate's view: several owners, merged by cursor.
            Some(os) => {
                self.all(
                    sqlx::query(
                        "SELECT * FROM events WHERE owner_id = ANY($1) AND cursor > $2
                         ORDER BY cursor LIMIT $3",
                    )
                    .bind(os)
                    .bind(cursor)
                    .bind(limit),
                    event_row,
                )
                .await
            }
            None => {
                self.all(
                    sqlx::query("SELECT * FROM events WHERE cursor > $1 ORDER BY cursor LIMIT $2")
                        .bind(cursor)
                        .bind(limit),
                    event_row,
                )
                .await
            }
        }
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
        self.scalar("SELECT pruned_through FROM event_retention WHERE id = 1")
            .await
    }

    async fn prune_events_through(&mut self, cursor: i64) -> Result<u64> {
        let n = self
            .exec(sqlx::query("DELETE FROM events WHERE cursor <= $1").bind(cursor))
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
        self.exec(
            sqlx::query(
                "INSERT INTO audit (at, actor, action, task_id, code, detail)
                 VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind(a.at)
            .bind(&a.actor)
            .bind(&a.action)
            .bind(&a.task_id)
            .bind(&a.code)
            .bind(&a.detail),
        )
        .await
        .map(drop)
    }

    async fn prune_audit(&mut self, before: i64, keep: i64) -> Result<u64> {
        // Two range deletes (by the `at` index, then by id) rather than one `OR`.
        let old = self
            .exec(sqlx::query("DELETE FROM audit WHERE at < $1").bind(before))
            .await?;
        let over = self
            .exec(
                sqlx::query(
                    "DELETE FROM audit WHERE id <= (SELECT COALESCE(MAX(id), 0) FROM audit) - $1",
                )
                .bind(keep.max(0)),
            )
            .await?;
        Ok(old + over)
    }

    async fn list_audit(&mut self, task_id: Option<&str>, limit: i64) -> Result<Vec<AuditRow>> {
        self.all(
            sqlx::query(
                "SELECT * FROM audit WHERE ($1::text IS NULL OR task_id = $1)
                 ORDER BY id DESC LIMIT $2",
            )
            .bind(task_id)
            .bind(limit),
            audit_row,
        )
        .await
    }
}
