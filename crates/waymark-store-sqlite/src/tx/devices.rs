//! `DevicesTx` on SQLite: paired devices and what they sign: deliveries, pairing codes, read
//! sessions, the command ledger and the control commands queued for workers.

use async_trait::async_trait;
use waymark_store::*;

use super::SqliteTx;
use crate::rows::*;

#[async_trait]
impl DevicesTx for SqliteTx {
    async fn insert_device(&mut self, d: &DeviceRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO devices (id, user_id, name, public_key, scopes, created_at, revoked_at,
                   last_seen_at)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(&d.id)
            .bind(&d.user_id)
            .bind(&d.name)
            .bind(&d.public_key)
            .bind(json_text(&d.scopes))
            .bind(d.created_at)
            .bind(d.revoked_at)
            .bind(d.last_seen_at),
        )
        .await
        .map(drop)
    }

    async fn device(&mut self, id: &str) -> Result<Option<DeviceRow>> {
        self.one(
            sqlx::query("SELECT * FROM devices WHERE id = ?").bind(id),
            device_row,
        )
        .await
    }

    async fn list_devices(&mut self, user_id: Option<&str>) -> Result<Vec<DeviceRow>> {
        self.all(
            sqlx::query(
                "SELECT * FROM devices WHERE (? IS NULL OR user_id = ?) ORDER BY created_at, id",
            )
            .bind(user_id)
            .bind(user_id),
            device_row,
        )
        .await
    }

    async fn update_device(&mut self, d: &DeviceRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "UPDATE devices SET name = ?, scopes = ?, revoked_at = ?, last_seen_at = ? WHERE id = ?",
            )
            .bind(&d.name)
            .bind(json_text(&d.scopes))
            .bind(d.revoked_at)
            .bind(d.last_seen_at)
            .bind(&d.id),
        )
        .await
        .map(drop)
    }

    async fn insert_delivery(&mut self, d: &DeliveryRow) -> Result<bool> {
        let n = self
            .exec(
                sqlx::query(
                    "INSERT INTO deliveries (decision_id, device_id, step, at, detail)
                     VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                )
                .bind(&d.decision_id)
                .bind(&d.device_id)
                .bind(d.step.as_str())
                .bind(d.at)
                .bind(&d.detail),
            )
            .await?;
        Ok(n == 1)
    }

    async fn deliveries(&mut self, decision_ids: &[String]) -> Result<Vec<DeliveryRow>> {
        if decision_ids.is_empty() {
            return Ok(Vec::new());
        }
        let ids = serde_json::to_string(decision_ids).unwrap_or_default();
        self.all(
            sqlx::query(
                "SELECT * FROM deliveries WHERE decision_id IN (SELECT value FROM json_each(?))
                 ORDER BY at, device_id, step",
            )
            .bind(ids),
            delivery_row,
        )
        .await
    }

    async fn insert_pairing(&mut self, p: &PairingRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO pairing_codes (code_hash, user_id, scopes, created_at, expires_at, used_at, device_id)
                 VALUES (?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(&p.code_hash)
            .bind(&p.user_id)
            .bind(json_text(&p.scopes))
            .bind(p.created_at)
            .bind(p.expires_at)
            .bind(p.used_at)
            .bind(&p.device_id),
        )
        .await
        .map(drop)
    }

    async fn pairing(&mut self, code_hash: &str) -> Result<Option<PairingRow>> {
        self.one(
            sqlx::query("SELECT * FROM pairing_codes WHERE code_hash = ?").bind(code_hash),
            pairing_row,
        )
        .await
    }

    async fn update_pairing(&mut self, p: &PairingRow) -> Result<()> {
        self.exec(
            sqlx::query("UPDATE pairing_codes SET used_at = ?, device_id = ? WHERE code_hash = ?")
                .bind(p.used_at)
                .bind(&p.device_id)
                .bind(&p.code_hash),
        )
        .await
        .map(drop)
    }

    async fn insert_device_session(&mut self, d: &DeviceSessionRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO device_sessions (token_hash, device_id, created_at, expires_at) VALUES (?, ?, ?, ?)",
            )
            .bind(&d.token_hash)
            .bind(&d.device_id)
            .bind(d.created_at)
            .bind(d.expires_at),
        )
        .await
        .map(drop)
    }

    async fn device_session(&mut self, token_hash: &str) -> Result<Option<DeviceSessionRow>> {
        self.one(
            sqlx::query("SELECT * FROM device_sessions WHERE token_hash = ?").bind(token_hash),
            device_session_row,
        )
        .await
    }

    async fn insert_command(&mut self, c: &CommandRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO commands (command_id, task_id, device_id, body_digest, operation, envelope,
                   status, result, created_at)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(&c.command_id)
            .bind(&c.task_id)
            .bind(&c.device_id)
            .bind(&c.body_digest)
            .bind(c.operation.as_str())
            .bind(json_text(&c.envelope))
            .bind(c.status.as_str())
            .bind(json_text(&c.result))
            .bind(c.created_at),
        )
        .await
        .map(drop)
    }

    async fn command(&mut self, command_id: &str) -> Result<Option<CommandRow>> {
        self.one(
            sqlx::query("SELECT * FROM commands WHERE command_id = ?").bind(command_id),
            command_row,
        )
        .await
    }

    async fn list_commands(&mut self, task_id: &str) -> Result<Vec<CommandRow>> {
        self.all(
            sqlx::query("SELECT * FROM commands WHERE task_id = ? ORDER BY created_at, command_id")
                .bind(task_id),
            command_row,
        )
        .await
    }

    async fn insert_control(&mut self, c: &ControlRow) -> Result<i64> {
        // The task's row is this writer's alone until commit, so MAX + 1 cannot race.
        self.one(
            sqlx::query(
                "INSERT INTO control_commands (command_id, task_id, operation, args, plan_revision, applied_at,
                   acknowledged_at, acknowledged_by, seq)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8,
                   (SELECT COALESCE(MAX(seq), 0) + 1 FROM control_commands WHERE task_id = ?2))
                 RETURNING seq",
            )
            .bind(&c.command_id)
            .bind(&c.task_id)
            .bind(c.operation.as_str())
            .bind(json_text(&c.args))
            .bind(c.plan_revision)
            .bind(c.applied_at)
            .bind(c.acknowledged_at)
            .bind(&c.acknowledged_by),
            |r| get(r, "seq"),
        )
        .await?
        .ok_or_else(|| StoreError::Conflict("control_commands: the row was not written".into()))
    }

    async fn pending_controls(&mut self, task_id: &str) -> Result<Vec<ControlRow>> {
        self.all(
            sqlx::query(
                "SELECT * FROM control_commands WHERE task_id = ? AND acknowledged_at IS NULL
                 ORDER BY seq",
            )
            .bind(task_id),
            control_row,
        )
        .await
    }

    async fn ack_control(
        &mut self,
        task_id: &str,
        command_id: &str,
        at: i64,
        attempt_id: &str,
    ) -> Result<bool> {
        let n = self
            .exec(
                sqlx::query(
                    "UPDATE control_commands SET acknowledged_at = ?, acknowledged_by = ?
                     WHERE task_id = ? AND command_id = ? AND acknowledged_at IS NULL",
                )
                .bind(at)
                .bind(attempt_id)
                .bind(task_id)
                .bind(command_id),
            )
            .await?;
        Ok(n == 1)
    }
}
