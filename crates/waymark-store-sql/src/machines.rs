//! `MachinesTx`'s statements: machines and the work their runners take. Listing the machines of
//! several owners is each backend's own (`json_each` against `ANY`).

use waymark_store::{MachineRow, WorkRow};

use crate::{Insert, Statement, insert};

pub fn insert_machine(m: &MachineRow) -> Insert<'_> {
    insert!(
        "INSERT INTO machines (id, owner_id, name, info, registered_at, last_seen_at, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7)"
    )
    .bind(&m.id)
    .bind(&m.owner_id)
    .bind(&m.name)
    .json(&m.info)
    .bind(m.registered_at)
    .bind(m.last_seen_at)
    .bind(m.created_at)
}

pub fn machine(id: &str) -> Statement<'_> {
    Statement::new("SELECT * FROM machines WHERE id = $1").bind(id)
}

pub fn machine_by_name<'a>(owner_id: &'a str, name: &'a str) -> Statement<'a> {
    Statement::new("SELECT * FROM machines WHERE owner_id = $1 AND name = $2")
        .bind(owner_id)
        .bind(name)
}

pub fn all_machines() -> Statement<'static> {
    Statement::new("SELECT * FROM machines ORDER BY name, id")
}

pub fn update_machine(m: &MachineRow) -> Statement<'_> {
    Statement::new(
        "UPDATE machines SET info = $1, registered_at = $2, last_seen_at = $3 WHERE id = $4",
    )
    .json(&m.info)
    .bind(m.registered_at)
    .bind(m.last_seen_at)
    .bind(&m.id)
}

pub fn machine_tasks(machine_id: &str) -> Statement<'_> {
    Statement::new("SELECT * FROM tasks WHERE machine_id = $1 ORDER BY created_at, id")
        .bind(machine_id)
}

pub fn insert_work(w: &WorkRow) -> Insert<'_> {
    insert!(
        "INSERT INTO machine_work (id, machine_id, task_id, kind, args, state, detail,
           created_at, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
    )
    .bind(&w.id)
    .bind(&w.machine_id)
    .bind(&w.task_id)
    .bind(w.kind.as_str())
    .json(&w.args)
    .bind(w.state.as_str())
    .bind(&w.detail)
    .bind(w.created_at)
    .bind(w.updated_at)
}

pub fn work(id: &str) -> Statement<'_> {
    Statement::new("SELECT * FROM machine_work WHERE id = $1").bind(id)
}

pub fn update_work(w: &WorkRow) -> Statement<'_> {
    Statement::new("UPDATE machine_work SET state = $1, detail = $2, updated_at = $3 WHERE id = $4")
        .bind(w.state.as_str())
        .bind(&w.detail)
        .bind(w.updated_at)
        .bind(&w.id)
}

pub fn open_work(machine_id: &str) -> Statement<'_> {
    Statement::new(
        "SELECT * FROM machine_work WHERE machine_id = $1 AND state IN ('pending', 'taken')
         ORDER BY created_at, id",
    )
    .bind(machine_id)
}

pub fn task_work(task_id: &str) -> Statement<'_> {
    Statement::new("SELECT * FROM machine_work WHERE task_id = $1 ORDER BY created_at, id")
        .bind(task_id)
}
