//! `MessagesTx` on SQLite: a session's messages, numbered by the insert (one writer, so `MAX + 1`
//! cannot race).

use async_trait::async_trait;
use waymark_store::*;

use super::SqliteTx;
use crate::rows::*;

#[async_trait]
impl MessagesTx for SqliteTx {
    async fn insert_message(&mut self, m: &MessageRow) -> Result<i64> {
        let seq: i64 = sqlx::query_scalar(
            "INSERT INTO messages (session_id, seq, task_id, role, text, created_at)
             VALUES (?, (SELECT COALESCE(MAX(seq), 0) + 1 FROM messages WHERE session_id = ?), ?, ?, ?, ?)
             RETURNING seq",
        )
        .bind(&m.session_id)
        .bind(&m.session_id)
        .bind(&m.task_id)
        .bind(&m.role)
        .bind(&m.text)
        .bind(m.created_at)
        .fetch_one(self.db())
        .await
        .map_err(backend)?;
        Ok(seq)
    }

    async fn list_messages(&mut self, session_id: &str) -> Result<Vec<MessageRow>> {
        self.all(
            sqlx::query("SELECT * FROM messages WHERE session_id = ? ORDER BY seq")
                .bind(session_id),
            message_row,
        )
        .await
    }
}
