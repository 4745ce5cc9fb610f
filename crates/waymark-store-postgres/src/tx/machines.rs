//! `MachinesTx` on PostgreSQL: machines and the work their runners take.

use async_trait::async_trait;
use waymark_store::*;
use waymark_store_sql as sql;

use super::PgTx;
use crate::rows::*;

#[async_trait]
impl MachinesTx for PgTx {
    async fn insert_machine(&mut self, m: &MachineRow) -> Result<()> {
        self.insert("machines", sql::machines::insert_machine(m))
            .await
    }

    async fn machine(&mut self, id: &str) -> Result<Option<MachineRow>> {
        self.one(sql::machines::machine(id).query(), machine_row)
            .await
    }

    async fn machine_by_name(&mut self, owner_id: &str, name: &str) -> Result<Option<MachineRow>> {
        let q = sql::machines::machine_by_name(owner_id, name);
        self.one(q.query(), machine_row).await
    }

    async fn list_machines(&mut self, owners: Option<&[String]>) -> Result<Vec<MachineRow>> {
        match owners {
            Some(os) => {
                self.all(
                    sqlx::query(
                        "SELECT * FROM machines WHERE owner_id = ANY($1)
                         ORDER BY name, id",
                    )
                    .bind(os),
                    machine_row,
                )
                .await
            }
            None => {
                self.all(sql::machines::all_machines().query(), machine_row)
                    .await
            }
        }
    }

    async fn update_machine(&mut self, m: &MachineRow) -> Result<()> {
        self.exec(sql::machines::update_machine(m).query())
            .await
            .map(drop)
    }

    async fn machine_tasks(&mut self, machine_id: &str) -> Result<Vec<TaskRow>> {
        self.all(sql::machines::machine_tasks(machine_id).query(), task_row)
            .await
    }

    async fn insert_work(&mut self, w: &WorkRow) -> Result<()> {
        self.insert("machine_work", sql::machines::insert_work(w))
            .await
    }

    async fn work(&mut self, id: &str) -> Result<Option<WorkRow>> {
        self.one(sql::machines::work(id).query(), work_row).await
    }

    async fn update_work(&mut self, w: &WorkRow) -> Result<()> {
        self.exec(sql::machines::update_work(w).query())
            .await
            .map(drop)
    }

    async fn open_work(&mut self, machine_id: &str) -> Result<Vec<WorkRow>> {
        self.all(sql::machines::open_work(machine_id).query(), work_row)
            .await
    }

    async fn task_work(&mut self, task_id: &str) -> Result<Vec<WorkRow>> {
        self.all(sql::machines::task_work(task_id).query(), work_row)
            .await
    }
}
