//! `MessagesTx` on SQLite: a session's messages, numbered by the insert (one writer, so `MAX + 1`
//! cannot race).

use async_trait::async_trait;
use waymark_store::*;
use waymark_store_sql as sql;

use super::SqliteTx;
use crate::rows::*;

#[async_trait]
impl MessagesTx for SqliteTx {
    async fn insert_message(&mut self, m: &MessageRow) -> Result<i64> {
        self.scalar(sql::messages::insert_message(m))
    }

    async fn list_messages(&mut self, session_id: &str) -> Result<Vec<MessageRow>> {
        self.all(sql::messages::list_messages(session_id), message_row)
    }
}
