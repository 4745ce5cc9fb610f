//! `PushTx` on PostgreSQL: push channels and where each one's delivery stands.

use async_trait::async_trait;
use waymark_store::*;

use super::PgTx;
use crate::rows::*;

#[async_trait]
impl PushTx for PgTx {
    async fn insert_push_channel(&mut self, c: &PushChannelRow) -> Result<()> {
        self.exec(
            sqlx::query(
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
            .bind(c.revoked_at),
        )
        .await
        .map(drop)
    }

    async fn push_channels(&mut self, device_id: Option<&str>) -> Result<Vec<PushChannelRow>> {
        match device_id {
            Some(d) => {
                self.all(
                    sqlx::query("SELECT * FROM push_channels WHERE device_id = $1 ORDER BY created_at, id").bind(d),
                    push_channel_row,
                )
                .await
            }
            None => {
                self.all(
                    sqlx::query("SELECT * FROM push_channels WHERE revoked_at IS NULL ORDER BY created_at, id"),
                    push_channel_row,
                )
                .await
            }
        }
    }

    async fn update_push_channel(&mut self, c: &PushChannelRow) -> Result<()> {
        self.exec(
            sqlx::query(
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
            .bind(&c.id),
        )
        .await
        .map(drop)
    }
}
