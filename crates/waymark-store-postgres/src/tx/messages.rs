//! `MessagesTx` on PostgreSQL: a session's messages, numbered under a per-session advisory lock so
//! replicas appending to one session queue instead of colliding.

use async_trait::async_trait;
use waymark_store::*;
use waymark_store_sql as sql;

use super::{PgTx, db_err};
use crate::MESSAGES_LOCK;
use crate::rows::*;

#[async_trait]
impl MessagesTx for PgTx {
    async fn insert_message(&mut self, m: &MessageRow) -> Result<i64> {
        // The session lock is taken in its own statement, before the one that reads MAX(seq):
        // at READ COMMITTED that statement's snapshot then includes the previous holder's row.
        sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2))")
            .bind(MESSAGES_LOCK)
            .bind(&m.session_id)
            .execute(&mut *self.tx)
            .await
            .map_err(db_err)?;
        sql::messages::insert_message(m)
            .query_scalar()
            .fetch_one(&mut *self.tx)
            .await
            .map_err(db_err)
    }

    async fn list_messages(&mut self, session_id: &str) -> Result<Vec<MessageRow>> {
        self.all(
            sql::messages::list_messages(session_id).query(),
            message_row,
        )
        .await
    }
}
