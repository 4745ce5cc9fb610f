//! `MachinesTx` on PostgreSQL: machines and the work their runners take.

use async_trait::async_trait;
use waymark_store::*;

use super::PgTx;
use crate::rows::*;

#[async_trait]
impl MachinesTx for PgTx {
    async fn insert_machine(&mut self, m: &MachineRow) -> Result<()> {
        self.insert(
            "machines",
            sqlx::query(
                "INSERT INTO machines (id, owner_id, name, info, registered_at, last_seen_at, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
            )
            .bind(&m.id)
            .bind(&m.owner_id)
            .bind(&m.name)
            .bind(&m.info)
            .bind(m.registered_at)
            .bind(m.last_seen_at)
            .bind(m.created_at),
        )
        .await
    }

    async fn machine(&mut self, id: &str) -> Result<Option<MachineRow>> {
        self.one(
            sqlx::query("SELECT * FROM machines WHERE id = $1").bind(id),
            machine_row,
        )
        .await
    }

    async fn machine_by_name(&mut self, owner_id: &str, name: &str) -> Result<Option<MachineRow>> {
        self.one(
            sqlx::query("SELECT * FROM machines WHERE owner_id = $1 AND name = $2")
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
                        "SELECT * FROM machines WHERE owner_id = ANY($1)
                         ORDER BY name, id",
                    )
                    .bind(os),
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
                "UPDATE machines SET info = $1, registered_at = $2, last_seen_at = $3 WHERE id = $4",
            )
            .bind(&m.info)
            .bind(m.registered_at)
            .bind(m.last_seen_at)
            .bind(&m.id),
        )
        .await
        .map(drop)
    }

    async fn machine_tasks(&mut self, machine_id: &str) -> Result<Vec<TaskRow>> {
        self.all(
            sqlx::query("SELECT * FROM tasks WHERE machine_id = $1 ORDER BY created_at, id")
                .bind(machine_id),
            task_row,
        )
        .await
    }

    async fn insert_work(&mut self, w: &WorkRow) -> Result<()> {
        self.insert(
            "machine_work",
            sqlx::query(
                "INSERT INTO machine_work (id, machine_id, task_id, kind, args, state, detail,
                   created_at, updated_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT DO NOTHING",
            )
            .bind(&w.id)
            .bind(&w.machine_id)
            .bind(&w.task_id)
            .bind(w.kind.as_str())
            .bind(&w.args)
            .bind(w.state.as_str())
            .bind(&w.detail)
            .bind(w.created_at)
            .bind(w.updated_at),
        )
        .await
    }

    async fn work(&mut self, id: &str) -> Result<Option<WorkRow>> {
        self.one(
            sqlx::query("SELECT * FROM machine_work WHERE id = $1").bind(id),
            work_row,
        )
        .await
    }

    async fn update_work(&mut self, w: &WorkRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "UPDATE machine_work SET state = $1, detail = $2, updated_at = $3 WHERE id = $4",
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
                "SELECT * FROM machine_work WHERE machine_id = $1 AND state IN ('pending', 'taken')
                 ORDER BY created_at, id",
            )
            .bind(machine_id),
            work_row,
        )
        .await
    }

    async fn task_work(&mut self, task_id: &str) -> Result<Vec<WorkRow>> {
        self.all(
            sqlx::query("SELECT * FROM machine_work WHERE task_id = $1 ORDER BY created_at, id")
                .bind(task_id),
            work_row,
        )
        .await
    }
}
