//! `MessagesTx`'s statements: a session's messages. The insert numbers the message `MAX + 1`;
//! each backend says why that cannot race (SQLite: one writer; PostgreSQL: a session lock).

use waymark_store::MessageRow;

use crate::Statement;

/// Returns the message's `seq`.
pub fn insert_message(m: &MessageRow) -> Statement<'_> {
    Statement::new(
        "INSERT INTO messages (session_id, seq, task_id, role, text, created_at)
         VALUES ($1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM messages WHERE session_id = $1),
                 $2, $3, $4, $5)
         RETURNING seq",
    )
    .bind(&m.session_id)
    .bind(&m.task_id)
    .bind(&m.role)
    .bind(&m.text)
    .bind(m.created_at)
}

pub fn list_messages(session_id: &str) -> Statement<'_> {
    Statement::new("SELECT * FROM messages WHERE session_id = $1 ORDER BY seq").bind(session_id)
}
