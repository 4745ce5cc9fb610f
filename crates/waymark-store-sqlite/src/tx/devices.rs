//! `DevicesTx` on SQLite: paired devices and what they sign: deliveries, pairing codes, read
//! sessions, the command ledger and the control commands queued for workers.

use async_trait::async_trait;
use waymark_store::*;
use waymark_store_sql::{self as sql, Statement};

use super::SqliteTx;
use crate::rows::*;

#[async_trait]
impl DevicesTx for SqliteTx {
    async fn insert_device(&mut self, d: &DeviceRow) -> Result<()> {
        self.insert(sql::devices::insert_device(d))
    }

    async fn device(&mut self, id: &str) -> Result<Option<DeviceRow>> {
        self.one(sql::devices::device(id), device_row)
    }

    async fn list_devices(&mut self, user_id: Option<&str>) -> Result<Vec<DeviceRow>> {
        self.all(sql::devices::list_devices(user_id), device_row)
    }

    async fn update_device(&mut self, d: &DeviceRow) -> Result<()> {
        self.exec(sql::devices::update_device(d)).map(drop)
    }

    async fn insert_delivery(&mut self, d: &DeliveryRow) -> Result<bool> {
        Ok(self.exec(sql::devices::insert_delivery(d))? == 1)
    }

    async fn deliveries(&mut self, decision_ids: &[String]) -> Result<Vec<DeliveryRow>> {
        if decision_ids.is_empty() {
            return Ok(Vec::new());
        }
        self.all(
            Statement::new(
                "SELECT * FROM deliveries WHERE decision_id IN (SELECT value FROM json_each(?))
                 ORDER BY at, device_id, step",
            )
            .json(decision_ids),
            delivery_row,
        )
    }

    async fn insert_pairing(&mut self, p: &PairingRow) -> Result<()> {
        self.insert(sql::devices::insert_pairing(p))
    }

    async fn pairing(&mut self, code_hash: &str) -> Result<Option<PairingRow>> {
        self.one(sql::devices::pairing(code_hash), pairing_row)
    }

    async fn update_pairing(&mut self, p: &PairingRow) -> Result<()> {
        self.exec(sql::devices::update_pairing(p)).map(drop)
    }

    async fn insert_device_session(&mut self, d: &DeviceSessionRow) -> Result<()> {
        self.insert(sql::devices::insert_device_session(d))
    }

    async fn device_session(&mut self, token_hash: &str) -> Result<Option<DeviceSessionRow>> {
        let q = sql::devices::device_session(token_hash);
        self.one(q, device_session_row)
    }

    async fn insert_command(&mut self, c: &CommandRow) -> Result<()> {
        self.insert(sql::devices::insert_command(c))
    }

    async fn command(&mut self, command_id: &str) -> Result<Option<CommandRow>> {
        self.one(sql::devices::command(command_id), command_row)
    }

    async fn list_commands(&mut self, task_id: &str) -> Result<Vec<CommandRow>> {
        self.all(sql::devices::list_commands(task_id), command_row)
    }

    async fn insert_control(&mut self, c: &ControlRow) -> Result<i64> {
        // The task's row is this writer's alone until commit, so MAX + 1 cannot race.
        let q = sql::devices::insert_control(c).raising();
        self.one(q, |r| get(r, "seq"))?
            .ok_or_else(|| StoreError::Conflict("control_commands: the row was not written".into()))
    }

    async fn pending_controls(&mut self, task_id: &str) -> Result<Vec<ControlRow>> {
        self.all(sql::devices::pending_controls(task_id), control_row)
    }

    async fn ack_control(
        &mut self,
        task_id: &str,
        command_id: &str,
        at: i64,
        attempt_id: &str,
    ) -> Result<bool> {
        let q = sql::devices::ack_control(task_id, command_id, at, attempt_id);
        Ok(self.exec(q)? == 1)
    }
}
