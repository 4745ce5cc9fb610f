//! `MachinesTx` on SQLite: machines and the work their runners take.

use async_trait::async_trait;
use waymark_store::*;

use super::{SqliteTx, json_list};
use crate::rows::*;

#[async_trait]
impl MachinesTx for SqliteTx {
    async fn insert_machine(&mut self, m: &MachineRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO machines (id, owner_id, name, info, registered_at, last_seen_at, created_at)
                 VALUES (?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(&m.id)
            .bind(&m.owner_id)
            .bind(&m.name)
            .bind(json_text(&m.info))
            .bind(m.registered_at)
            .bind(m.last_seen_at)
            .bind(m.created_at),
        )
        .await
        .map(drop)
    }

    async fn machine(&mut self, id: &str) -> Result<Option<MachineRow>> {
        self.one(
            sqlx::query("SELECT * FROM machines WHERE id = ?").bind(id),
            machine_row,
        )
        .await
    }

    async fn machine_by_name(&mut self, owner_id: &str, name: &str) -> Result<Option<MachineRow>> {
        self.one(
            sqlx::query("SELECT * FROM machines WHERE owner_id = ? AND name = ?")
                .bind(owner_id)
                .bind(name),
            machine_row,
        )
        .await
    }

    async fn list_machines(&mut self, owners: Option<&[String]>) -> Result<Vec<MachineRow>> {
        match owners {
            Some(os) => {
                self.all(
                    sqlx::query(
                        "SELECT * FROM machines WHERE owner_id IN (SELECT value FROM json_each(?))
                         ORDER BY name, id",
                    )
                    .bind(json_list(os)),
                    machine_row,
                )
                .await
            }
            None => {
                self.all(
                    sqlx::query("SELECT * FROM machines ORDER BY name, id"),
                    machine_row,
                )
                .await
            }
        }
    }

    async fn update_machine(&mut self, m: &MachineRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "UPDATE machines SET info = ?, registered_at = ?, last_seen_at = ? WHERE id = ?",
            )
            .bind(json_text(&m.info))
            .bind(m.registered_at)
            .bind(m.last_seen_at)
            .bind(&m.id),
        )
        .await
        .map(drop)
    }

    async fn machine_tasks(&mut self, machine_id: &str) -> Result<Vec<TaskRow>> {
        self.all(
            sqlx::query("SELECT * FROM tasks WHERE machine_id = ? ORDER BY created_at, id")
                .bind(machine_id),
            task_row,
        )
        .await
    }

    async fn insert_work(&mut self, w: &WorkRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO machine_work (id, machine_id, task_id, kind, args, state, detail,
                   created_at, updated_at)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(&w.id)
            .bind(&w.machine_id)
            .bind(&w.task_id)
            .bind(w.kind.as_str())
            .bind(json_text(&w.args))
            .bind(w.state.as_str())
            .bind(&w.detail)
            .bind(w.created_at)
            .bind(w.updated_at),
        )
        .await
        .map(drop)
    }

    async fn work(&mut self, id: &str) -> Result<Option<WorkRow>> {
        self.one(
            sqlx::query("SELECT * FROM machine_work WHERE id = ?").bind(id),
            work_row,
        )
        .await
    }

    async fn update_work(&mut self, w: &WorkRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "UPDATE machine_work SET state = ?, detail = ?, updated_at = ? WHERE id = ?",
            )
            .bind(w.state.as_str())
            .bind(&w.detail)
            .bind(w.updated_at)
            .bind(&w.id),
        )
        .await
        .map(drop)
    }

    async fn open_work(&mut self, machine_id: &str) -> Result<Vec<WorkRow>> {
        self.all(
            sqlx::query(
                "SELECT * FROM machine_work WHERE machine_id = ? AND state IN ('pending', 'taken')
                 ORDER BY created_at, id",
            )
            .bind(machine_id),
            work_row,
        )
        .await
    }

    async fn task_work(&mut self, task_id: &str) -> Result<Vec<WorkRow>> {
        self.all(
            sqlx::query("SELECT * FROM machine_work WHERE task_id = ? ORDER BY created_at, id")
                .bind(task_id),
            work_row,
        )
        .await
    }
}
