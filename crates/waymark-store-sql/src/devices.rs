//! `DevicesTx`'s statements: paired devices and what they sign: deliveries, pairing codes, read
//! sessions, the command ledger and the control commands queued for workers. Deliveries for
//! several decisions are each backend's own (`json_each` against `ANY`).

use waymark_store::{CommandRow, ControlRow, DeliveryRow, DeviceRow, DeviceSessionRow, PairingRow};

use crate::{Insert, Statement, insert};

pub fn insert_device(d: &DeviceRow) -> Insert<'_> {
    insert!(
        "INSERT INTO devices (id, user_id, name, public_key, scopes, created_at, revoked_at,
           last_seen_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
    )
    .bind(&d.id)
    .bind(&d.user_id)
    .bind(&d.name)
    .bind(&d.public_key)
    .json(&d.scopes)
    .bind(d.created_at)
    .bind(d.revoked_at)
    .bind(d.last_seen_at)
}

pub fn device(id: &str) -> Statement<'_> {
    Statement::new("SELECT * FROM devices WHERE id = $1").bind(id)
}

/// `None` lists every user's devices.
pub fn list_devices(user_id: Option<&str>) -> Statement<'_> {
    Statement::new(
        "SELECT * FROM devices WHERE (CAST($1 AS TEXT) IS NULL OR user_id = $1)
         ORDER BY created_at, id",
    )
    .bind(user_id)
}

pub fn update_device(d: &DeviceRow) -> Statement<'_> {
    Statement::new(
        "UPDATE devices SET name = $1, scopes = $2, revoked_at = $3, last_seen_at = $4
         WHERE id = $5",
    )
    .bind(&d.name)
    .json(&d.scopes)
    .bind(d.revoked_at)
    .bind(d.last_seen_at)
    .bind(&d.id)
}

/// Writes no row for a step already delivered.
pub fn insert_delivery(d: &DeliveryRow) -> Statement<'_> {
    Statement::new(
        "INSERT INTO deliveries (decision_id, device_id, step, at, detail)
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
    )
    .bind(&d.decision_id)
    .bind(&d.device_id)
    .bind(d.step.as_str())
    .bind(d.at)
    .bind(&d.detail)
}

pub fn insert_pairing(p: &PairingRow) -> Insert<'_> {
    insert!(
        "INSERT INTO pairing_codes (code_hash, user_id, scopes, created_at, expires_at,
           used_at, device_id)
         VALUES ($1, $2, $3, $4, $5, $6, $7)"
    )
    .bind(&p.code_hash)
    .bind(&p.user_id)
    .json(&p.scopes)
    .bind(p.created_at)
    .bind(p.expires_at)
    .bind(p.used_at)
    .bind(&p.device_id)
}

pub fn pairing(code_hash: &str) -> Statement<'_> {
    Statement::new("SELECT * FROM pairing_codes WHERE code_hash = $1").bind(code_hash)
}

pub fn update_pairing(p: &PairingRow) -> Statement<'_> {
    Statement::new("UPDATE pairing_codes SET used_at = $1, device_id = $2 WHERE code_hash = $3")
        .bind(p.used_at)
        .bind(&p.device_id)
        .bind(&p.code_hash)
}

pub fn insert_device_session(d: &DeviceSessionRow) -> Insert<'_> {
    insert!(
        "INSERT INTO device_sessions (token_hash, device_id, created_at, expires_at)
         VALUES ($1, $2, $3, $4)"
    )
    .bind(&d.token_hash)
    .bind(&d.device_id)
    .bind(d.created_at)
    .bind(d.expires_at)
}

pub fn device_session(token_hash: &str) -> Statement<'_> {
    Statement::new("SELECT * FROM device_sessions WHERE token_hash = $1").bind(token_hash)
}

pub fn insert_command(c: &CommandRow) -> Insert<'_> {
    insert!(
        "INSERT INTO commands (command_id, task_id, device_id, body_digest, operation,
           envelope, status, result, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
    )
    .bind(&c.command_id)
    .bind(&c.task_id)
    .bind(&c.device_id)
    .bind(&c.body_digest)
    .bind(c.operation.as_str())
    .json(&c.envelope)
    .bind(c.status.as_str())
    .json(&c.result)
    .bind(c.created_at)
}

pub fn command(command_id: &str) -> Statement<'_> {
    Statement::new("SELECT * FROM commands WHERE command_id = $1").bind(command_id)
}

pub fn list_commands(task_id: &str) -> Statement<'_> {
    Statement::new("SELECT * FROM commands WHERE task_id = $1 ORDER BY created_at, command_id")
        .bind(task_id)
}

/// Numbers the command `MAX + 1` within its task and returns that `seq`. The caller holds the
/// task (SQLite: the one writer; PostgreSQL: the task's row lock), so the number cannot race.
pub fn insert_control(c: &ControlRow) -> Insert<'_> {
    insert!(
        "INSERT INTO control_commands (command_id, task_id, operation, args, plan_revision,
           applied_at, acknowledged_at, acknowledged_by, seq)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8,
           (SELECT COALESCE(MAX(seq), 0) + 1 FROM control_commands WHERE task_id = $2))",
        "RETURNING seq"
    )
    .bind(&c.command_id)
    .bind(&c.task_id)
    .bind(c.operation.as_str())
    .json(&c.args)
    .bind(c.plan_revision)
    .bind(c.applied_at)
    .bind(c.acknowledged_at)
    .bind(&c.acknowledged_by)
}

pub fn pending_controls(task_id: &str) -> Statement<'_> {
    Statement::new(
        "SELECT * FROM control_commands WHERE task_id = $1 AND acknowledged_at IS NULL
         ORDER BY seq",
    )
    .bind(task_id)
}

pub fn ack_control<'a>(
    task_id: &'a str,
    command_id: &'a str,
    at: i64,
    attempt_id: &'a str,
) -> Statement<'a> {
    Statement::new(
        "UPDATE control_commands SET acknowledged_at = $1, acknowledged_by = $2
         WHERE task_id = $3 AND command_id = $4 AND acknowledged_at IS NULL",
    )
    .bind(at)
    .bind(attempt_id)
    .bind(task_id)
    .bind(command_id)
}
