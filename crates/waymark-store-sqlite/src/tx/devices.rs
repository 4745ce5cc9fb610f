//! `DevicesTx` on SQLite: paired devices and what they sign: deliveries, pairing codes, read
//! sessions, the command ledger and the control commands queued for workers.

use async_trait::async_trait;
use waymark_store::*;
use waymark_store_sql as sql;

use super::SqliteTx;
use crate::rows::*;

#[async_trait]
impl DevicesTx for SqliteTx {
    async fn insert_device(&mut self, d: &DeviceRow) -> Result<()> {
        self.insert(sql::devices::insert_device(d)).await
    }

    async fn device(&mut self, id: &str) -> Result<Option<DeviceRow>> {
        self.one(sql::devices::device(id).query(), device_row).await
    }

    async fn list_devices(&mut self, user_id: Option<&str>) -> Result<Vec<DeviceRow>> {
        self.all(sql::devices::list_devices(user_id).query(), device_row)
            .await
    }

    async fn update_device(&mut self, d: &DeviceRow) -> Result<()> {
        self.exec(sql::devices::update_device(d).query())
            .await
            .map(drop)
    }

    async fn insert_delivery(&mut self, d: &DeliveryRow) -> Result<bool> {
        Ok(self.exec(sql::devices::insert_delivery(d).query()).await? == 1)
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
        self.insert(sql::devices::insert_pairing(p)).await
    }

    async fn pairing(&mut self, code_hash: &str) -> Result<Option<PairingRow>> {
        self.one(sql::devices::pairing(code_hash).query(), pairing_row)
            .await
    }

    async fn update_pairing(&mut self, p: &PairingRow) -> Result<()> {
        self.exec(sql::devices::update_pairing(p).query())
            .await
            .map(drop)
    }

    async fn insert_device_session(&mut self, d: &DeviceSessionRow) -> Result<()> {
        self.insert(sql::devices::insert_device_session(d)).await
    }

    async fn device_session(&mut self, token_hash: &str) -> Result<Option<DeviceSessionRow>> {
        let q = sql::devices::device_session(token_hash);
        self.one(q.query(), device_session_row).await
    }

    async fn insert_command(&mut self, c: &CommandRow) -> Result<()> {
        self.insert(sql::devices::insert_command(c)).await
    }

    async fn command(&mut self, command_id: &str) -> Result<Option<CommandRow>> {
        self.one(sql::devices::command(command_id).query(), command_row)
            .await
    }

    async fn list_commands(&mut self, task_id: &str) -> Result<Vec<CommandRow>> {
        self.all(sql::devices::list_commands(task_id).query(), command_row)
            .await
    }

    async fn insert_control(&mut self, c: &ControlRow) -> Result<i64> {
        // The task's row is this writer's alone until commit, so MAX + 1 cannot race.
        let q = sql::devices::insert_control(c).raising();
        self.one(q.query(), |r| get(r, "seq"))
            .await?
            .ok_or_else(|| StoreError::Conflict("control_commands: the row was not written".into()))
    }

    async fn pending_controls(&mut self, task_id: &str) -> Result<Vec<ControlRow>> {
        self.all(sql::devices::pending_controls(task_id).query(), control_row)
            .await
    }

    async fn ack_control(
        &mut self,
        task_id: &str,
        command_id: &str,
        at: i64,
        attempt_id: &str,
    ) -> Result<bool> {
        let q = sql::devices::ack_control(task_id, command_id, at, attempt_id);
        Ok(self.exec(q.query()).await? == 1)
    }
}
