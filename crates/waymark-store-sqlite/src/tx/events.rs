//! `EventsTx` on SQLite: the event log (cursors, retention) and the audit log. An append notes its
//! cursor, which the group's commit announces.

use async_trait::async_trait;
use waymark_store::*;

use super::{SqliteTx, json_list};
use crate::rows::*;

#[async_trait]
impl EventsTx for SqliteTx {
    async fn append_event(&mut self, e: &NewEvent) -> Result<i64> {
        let cursor: i64 = sqlx::query_scalar(
            "INSERT INTO events (task_id, owner_id, kind, data, at) VALUES (?, ?, ?, ?, ?)
             RETURNING cursor",
        )
        .bind(&e.task_id)
        .bind(&e.owner_id)
        .bind(e.kind.as_str())
        .bind(json_text(&e.data))
        .bind(e.at)
        .fetch_one(self.db())
        .await
        .map_err(backend)?;
        self.appended = Some(cursor);
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
                        "SELECT * FROM events WHERE owner_id = ? AND cursor > ? ORDER BY cursor LIMIT ?",
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
                        "SELECT * FROM events
                         WHERE owner_id IN (SELECT value FROM json_each(?)) AND cursor > ?
                         ORDER BY cursor LIMIT ?",
                    )
                    .bind(json_list(os))
                    .bind(cursor)
                    .bind(limit),
                    event_row,
                )
                .await
            }
            None => {
                self.all(
                    sqlx::query("SELECT * FROM events WHERE cursor > ? ORDER BY cursor LIMIT ?")
                        .bind(cursor)
                        .bind(limit),
                    event_row,
                )
                .await
            }
        }
    }

    async fn max_cursor(&mut self) -> Result<i64> {
        // The sequence table remembers the newest cursor even after pruning deleted it.
        sqlx::query_scalar(
            "SELECT MAX(COALESCE((SELECT MAX(cursor) FROM events), 0),
                        (SELECT pruned_through FROM event_retention WHERE id = 1))",
        )
        .fetch_one(self.db())
        .await
        .map_err(backend)
    }

    async fn pruned_through(&mut self) -> Result<i64> {
        sqlx::query_scalar("SELECT pruned_through FROM event_retention WHERE id = 1")
            .fetch_one(self.db())
            .await
            .map_err(backend)
    }

    async fn prune_events_through(&mut self, cursor: i64) -> Result<u64> {
        let n = self
            .exec(sqlx::query("DELETE FROM events WHERE cursor <= ?").bind(cursor))
            .await?;
        self.exec(
            sqlx::query(
                "UPDATE event_retention SET pruned_through = MAX(pruned_through, ?) WHERE id = 1",
            )
            .bind(cursor),
        )
        .await?;
        Ok(n)
    }

    async fn insert_audit(&mut self, a: &AuditRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO audit (at, actor, action, task_id, code, detail) VALUES (?, ?, ?, ?, ?, ?)",
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

    async fn list_audit(&mut self, task_id: Option<&str>, limit: i64) -> Result<Vec<AuditRow>> {
        self.all(
            sqlx::query(
                "SELECT * FROM audit WHERE (? IS NULL OR task_id = ?) ORDER BY id DESC LIMIT ?",
            )
            .bind(task_id)
            .bind(task_id)
            .bind(limit),
            audit_row,
        )
        .await
    }

    async fn prune_audit(&mut self, before: i64, keep: i64) -> Result<u64> {
        // Two range deletes (by the `at` index, then by id) rather than one `OR`.
        let old = self
            .exec(sqlx::query("DELETE FROM audit WHERE at < ?").bind(before))
            .await?;
        let over = self
            .exec(
                sqlx::query(
                    "DELETE FROM audit WHERE id <= (SELECT COALESCE(MAX(id), 0) FROM audit) - ?",
                )
                .bind(keep.max(0)),
            )
            .await?;
        Ok(old + over)
    }
}
