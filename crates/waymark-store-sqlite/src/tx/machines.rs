//! `MachinesTx` on SQLite: machines and the work their runners take.

use async_trait::async_trait;
use waymark_store::*;
use waymark_store_sql::{self as sql, Statement};

use super::SqliteTx;
use crate::rows::*;

#[async_trait]
impl MachinesTx for SqliteTx {
    async fn insert_machine(&mut self, m: &MachineRow) -> Result<()> {
        self.insert(sql::machines::insert_machine(m))
    }

    async fn machine(&mut self, id: &str) -> Result<Option<MachineRow>> {
        self.one(sql::machines::machine(id), machine_row)
    }

    async fn machine_by_name(&mut self, owner_id: &str, name: &str) -> Result<Option<MachineRow>> {
        let q = sql::machines::machine_by_name(owner_id, name);
        self.one(q, machine_row)
    }

    async fn list_machines(&mut self, owners: Option<&[String]>) -> Result<Vec<MachineRow>> {
        match owners {
            Some(os) => self.all(
                Statement::new(
                    "SELECT * FROM machines WHERE owner_id IN (SELECT value FROM json_each(?))
                         ORDER BY name, id",
                )
                .json(os),
                machine_row,
            ),
            None => self.all(sql::machines::all_machines(), machine_row),
        }
    }

    async fn update_machine(&mut self, m: &MachineRow) -> Result<()> {
        self.exec(sql::machines::update_machine(m)).map(drop)
    }

    async fn machine_tasks(&mut self, machine_id: &str) -> Result<Vec<TaskRow>> {
        self.all(sql::machines::machine_tasks(machine_id), task_row)
    }

    async fn insert_work(&mut self, w: &WorkRow) -> Result<()> {
        self.insert(sql::machines::insert_work(w))
    }

    async fn work(&mut self, id: &str) -> Result<Option<WorkRow>> {
        self.one(sql::machines::work(id), work_row)
    }

    async fn update_work(&mut self, w: &WorkRow) -> Result<()> {
        self.exec(sql::machines::update_work(w)).map(drop)
    }

    async fn open_work(&mut self, machine_id: &str) -> Result<Vec<WorkRow>> {
        self.all(sql::machines::open_work(machine_id), work_row)
    }

    async fn task_work(&mut self, task_id: &str) -> Result<Vec<WorkRow>> {
        self.all(sql::machines::task_work(task_id), work_row)
    }
}
