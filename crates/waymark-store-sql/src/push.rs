//! `PushTx`'s statements: push channels and where each one's delivery stands. All of them are
//! the same on both backends.

use waymark_store::PushChannelRow;

use crate::Statement;

pub fn insert_push_channel(c: &PushChannelRow) -> Statement<'_> {
    Statement::new(
        "INSERT INTO push_channels (id, device_id, user_id, kind, endpoint, p256dh, auth, cursor,
           attempts, delivered, failures, consecutive_failures, last_error, last_attempt_at,
           next_attempt_at, created_at, revoked_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)",
    )
    .bind(&c.id)
    .bind(&c.device_id)
    .bind(&c.user_id)
    .bind(c.kind.as_str())
    .bind(&c.endpoint)
    .bind(&c.p256dh)
    .bind(&c.auth)
    .bind(c.cursor)
    .bind(c.attempts)
    .bind(c.delivered)
    .bind(c.failures)
    .bind(c.consecutive_failures)
    .bind(&c.last_error)
    .bind(c.last_attempt_at)
    .bind(c.next_attempt_at)
    .bind(c.created_at)
    .bind(c.revoked_at)
}

pub fn push_channels_of_device(device_id: &str) -> Statement<'_> {
    Statement::new("SELECT * FROM push_channels WHERE device_id = $1 ORDER BY created_at, id")
        .bind(device_id)
}

pub fn live_push_channels() -> Statement<'static> {
    Statement::new("SELECT * FROM push_channels WHERE revoked_at IS NULL ORDER BY created_at, id")
}

pub fn update_push_channel(c: &PushChannelRow) -> Statement<'_> {
    Statement::new(
        "UPDATE push_channels SET cursor = $1, attempts = $2, delivered = $3, failures = $4,
           consecutive_failures = $5, last_error = $6, last_attempt_at = $7, next_attempt_at = $8,
           revoked_at = $9
         WHERE id = $10",
    )
    .bind(c.cursor)
    .bind(c.attempts)
    .bind(c.delivered)
    .bind(c.failures)
    .bind(c.consecutive_failures)
    .bind(&c.last_error)
    .bind(c.last_attempt_at)
    .bind(c.next_attempt_at)
    .bind(c.revoked_at)
    .bind(&c.id)
}
