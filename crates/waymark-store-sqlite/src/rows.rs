//! Decoding rows. Column types follow migrations/server-sqlite: INTEGER as `i64`, JSON as
//! TEXT (`get_json`), booleans as 0/1.

use std::str::FromStr;

use rusqlite::Row;
use rusqlite::types::FromSql;
use serde::de::DeserializeOwned;
use waymark_store::*;

pub(crate) fn get<T: FromSql>(row: &Row<'_>, col: &str) -> Result<T> {
    row.get(col)
        .map_err(|e| StoreError::Corrupt(format!("column `{col}`: {e}")))
}

/// The column at `index` (a scalar query's first).
pub(crate) fn get_at<T: FromSql>(row: &Row<'_>, index: usize) -> Result<T> {
    row.get(index)
        .map_err(|e| StoreError::Corrupt(format!("column {index}: {e}")))
}

/// A JSON column as the type it holds (`decode_json`: text that is not one is corruption).
pub(crate) fn get_json<T: DeserializeOwned>(row: &Row<'_>, col: &str) -> Result<T> {
    decode_json(col, &get::<String>(row, col)?)
}

pub(crate) fn get_json_opt<T: DeserializeOwned>(row: &Row<'_>, col: &str) -> Result<Option<T>> {
    get::<Option<String>>(row, col)?
        .map(|s| decode_json(col, &s))
        .transpose()
}

/// A column holding one of an enum's values (`decode_enum`: unknown is corruption).
pub(crate) fn get_enum<T: FromStr>(row: &Row<'_>, col: &str) -> Result<T>
where
    T::Err: std::fmt::Display,
{
    decode_enum(col, &get::<String>(row, col)?)
}

pub(crate) fn get_enum_opt<T: FromStr>(row: &Row<'_>, col: &str) -> Result<Option<T>>
where
    T::Err: std::fmt::Display,
{
    get::<Option<String>>(row, col)?
        .map(|s| decode_enum(col, &s))
        .transpose()
}

pub(crate) fn delegation_row(r: &Row<'_>) -> Result<DelegationRow> {
    Ok(DelegationRow {
        owner_id: get(r, "owner_id")?,
        delegate_id: get(r, "delegate_id")?,
        created_at: get(r, "created_at")?,
        accepted_at: get(r, "accepted_at")?,
    })
}

pub(crate) fn user_row(r: &Row<'_>) -> Result<UserRow> {
    Ok(UserRow {
        id: get(r, "id")?,
        name: get(r, "name")?,
        created_at: get(r, "created_at")?,
    })
}

pub(crate) fn token_row(r: &Row<'_>) -> Result<TokenRow> {
    Ok(TokenRow {
        id: get(r, "id")?,
        kind: get_enum(r, "kind")?,
        name: get(r, "name")?,
        user_id: get(r, "user_id")?,
        secret_hash: get(r, "secret_hash")?,
        created_at: get(r, "created_at")?,
        revoked_at: get(r, "revoked_at")?,
        machine_id: get(r, "machine_id")?,
    })
}

pub(crate) fn task_row(r: &Row<'_>) -> Result<TaskRow> {
    Ok(TaskRow {
        id: get(r, "id")?,
        owner_id: get(r, "owner_id")?,
        title: get(r, "title")?,
        goal: get(r, "goal")?,
        runtime: get(r, "runtime")?,
        state: get_enum(r, "state")?,
        plan: get_json(r, "plan")?,
        plan_revision: get(r, "plan_revision")?,
        budget: get_json(r, "budget")?,
        usage: get_json(r, "usage")?,
        materials: get_json(r, "materials")?,
        session_id: get(r, "session_id")?,
        fence: get(r, "fence")?,
        outcome_summary: get(r, "outcome_summary")?,
        created_at: get(r, "created_at")?,
        updated_at: get(r, "updated_at")?,
        parent_id: get(r, "parent_id")?,
        external_key: get(r, "external_key")?,
        machine_id: get(r, "machine_id")?,
    })
}

pub(crate) fn session_row(r: &Row<'_>) -> Result<SessionRow> {
    Ok(SessionRow {
        id: get(r, "id")?,
        task_id: get(r, "task_id")?,
        parent_id: get(r, "parent_id")?,
        created_at: get(r, "created_at")?,
    })
}

pub(crate) fn attempt_row(r: &Row<'_>) -> Result<AttemptRow> {
    attempt_at(r, "")
}

/// An attempt from columns named `<prefix><column>` (a join that also selects a task's).
pub(crate) fn attempt_at(r: &Row<'_>, prefix: &str) -> Result<AttemptRow> {
    let c = |name: &str| format!("{prefix}{name}");
    Ok(AttemptRow {
        id: get(r, &c("id"))?,
        task_id: get(r, &c("task_id"))?,
        worker: get(r, &c("worker"))?,
        fence: get(r, &c("fence"))?,
        expires_at: get(r, &c("expires_at"))?,
        state: get_enum(r, &c("state"))?,
        manifest_digest: get(r, &c("manifest_digest"))?,
        started_at: get(r, &c("started_at"))?,
        ended_at: get(r, &c("ended_at"))?,
        outcome: get_enum_opt(r, &c("outcome"))?,
        released: get_json_opt(r, &c("released"))?,
    })
}

pub(crate) fn checkpoint_row(r: &Row<'_>) -> Result<CheckpointRow> {
    Ok(CheckpointRow {
        task_id: get(r, "task_id")?,
        sequence: get(r, "sequence")?,
        attempt_id: get(r, "attempt_id")?,
        fence: get(r, "fence")?,
        body: get_json(r, "body")?,
        prev_digest: get(r, "prev_digest")?,
        digest: get(r, "digest")?,
        created_at: get(r, "created_at")?,
    })
}

pub(crate) fn effect_row(r: &Row<'_>) -> Result<EffectRow> {
    Ok(EffectRow {
        id: get(r, "id")?,
        task_id: get(r, "task_id")?,
        idempotency_key: get(r, "idempotency_key")?,
        body_digest: get(r, "body_digest")?,
        kind: get(r, "kind")?,
        step: get(r, "step")?,
        resource_id: get(r, "resource_id")?,
        intent: get_json(r, "intent")?,
        intent_digest: get(r, "intent_digest")?,
        status: get_enum(r, "status")?,
        receipt: get_json_opt(r, "receipt")?,
        attempt_id: get(r, "attempt_id")?,
        fence: get(r, "fence")?,
        created_at: get(r, "created_at")?,
        updated_at: get(r, "updated_at")?,
        flag: get(r, "flag")?,
    })
}

pub(crate) fn decision_row(r: &Row<'_>) -> Result<DecisionRow> {
    Ok(DecisionRow {
        id: get(r, "id")?,
        task_id: get(r, "task_id")?,
        kind: get_enum(r, "kind")?,
        status: get_enum(r, "status")?,
        step: get(r, "step")?,
        question: get(r, "question")?,
        options: get_json(r, "options")?,
        default_option: get(r, "default_option")?,
        intent: get_json_opt(r, "intent")?,
        intent_digest: get(r, "intent_digest")?,
        effect_id: get(r, "effect_id")?,
        plan_revision: get(r, "plan_revision")?,
        risky: get(r, "risky")?,
        expires_at: get(r, "expires_at")?,
        created_at: get(r, "created_at")?,
        outcome: get_json_opt(r, "outcome")?,
        durability: get_enum_opt(r, "durability")?,
        delivery: get_json_opt(r, "delivery")?,
        editable: get(r, "editable")?,
        runtime_deadline: get_json_opt(r, "runtime_deadline")?,
        escalation: get_json_opt(r, "escalation")?,
        escalate_at: get(r, "escalate_at")?,
    })
}

pub(crate) fn artifact_row(r: &Row<'_>) -> Result<ArtifactRow> {
    Ok(ArtifactRow {
        id: get(r, "id")?,
        task_id: get(r, "task_id")?,
        sha256: get(r, "sha256")?,
        name: get(r, "name")?,
        media_type: get(r, "media_type")?,
        size: get(r, "size")?,
        step: get(r, "step")?,
        created_at: get(r, "created_at")?,
    })
}

pub(crate) fn receipt_row(r: &Row<'_>) -> Result<ReceiptRow> {
    Ok(ReceiptRow {
        id: get(r, "id")?,
        task_id: get(r, "task_id")?,
        step: get(r, "step")?,
        command: get(r, "command")?,
        exit_code: get(r, "exit_code")?,
        commit: get(r, "commit_id")?,
        totals: get_json(r, "totals")?,
        failures: get_json(r, "failures")?,
        duration_seconds: get(r, "duration_seconds")?,
        passed: get(r, "passed")?,
        junit_sha256: get(r, "junit_sha256")?,
        created_at: get(r, "created_at")?,
    })
}

pub(crate) fn message_row(r: &Row<'_>) -> Result<MessageRow> {
    Ok(MessageRow {
        session_id: get(r, "session_id")?,
        task_id: get(r, "task_id")?,
        seq: get(r, "seq")?,
        role: get(r, "role")?,
        text: get(r, "text")?,
        created_at: get(r, "created_at")?,
    })
}

pub(crate) fn event_row(r: &Row<'_>) -> Result<EventRow> {
    Ok(EventRow {
        cursor: get(r, "cursor")?,
        task_id: get(r, "task_id")?,
        owner_id: get(r, "owner_id")?,
        kind: get_enum(r, "kind")?,
        data: get_json(r, "data")?,
        at: get(r, "at")?,
    })
}

pub(crate) fn audit_row(r: &Row<'_>) -> Result<AuditRow> {
    Ok(AuditRow {
        at: get(r, "at")?,
        actor: get(r, "actor")?,
        action: get(r, "action")?,
        task_id: get(r, "task_id")?,
        code: get(r, "code")?,
        detail: get(r, "detail")?,
    })
}

pub(crate) fn device_row(r: &Row<'_>) -> Result<DeviceRow> {
    Ok(DeviceRow {
        id: get(r, "id")?,
        user_id: get(r, "user_id")?,
        name: get(r, "name")?,
        public_key: get(r, "public_key")?,
        scopes: get_json(r, "scopes")?,
        created_at: get(r, "created_at")?,
        revoked_at: get(r, "revoked_at")?,
        last_seen_at: get(r, "last_seen_at")?,
    })
}

pub(crate) fn delivery_row(r: &Row<'_>) -> Result<DeliveryRow> {
    Ok(DeliveryRow {
        decision_id: get(r, "decision_id")?,
        device_id: get(r, "device_id")?,
        step: get_enum(r, "step")?,
        at: get(r, "at")?,
        detail: get(r, "detail")?,
    })
}

pub(crate) fn pairing_row(r: &Row<'_>) -> Result<PairingRow> {
    Ok(PairingRow {
        code_hash: get(r, "code_hash")?,
        user_id: get(r, "user_id")?,
        scopes: get_json(r, "scopes")?,
        created_at: get(r, "created_at")?,
        expires_at: get(r, "expires_at")?,
        used_at: get(r, "used_at")?,
        device_id: get(r, "device_id")?,
    })
}

pub(crate) fn device_session_row(r: &Row<'_>) -> Result<DeviceSessionRow> {
    Ok(DeviceSessionRow {
        token_hash: get(r, "token_hash")?,
        device_id: get(r, "device_id")?,
        created_at: get(r, "created_at")?,
        expires_at: get(r, "expires_at")?,
    })
}

pub(crate) fn command_row(r: &Row<'_>) -> Result<CommandRow> {
    Ok(CommandRow {
        command_id: get(r, "command_id")?,
        task_id: get(r, "task_id")?,
        device_id: get(r, "device_id")?,
        body_digest: get(r, "body_digest")?,
        operation: get_enum(r, "operation")?,
        envelope: get_json(r, "envelope")?,
        status: get_enum(r, "status")?,
        result: get_json(r, "result")?,
        created_at: get(r, "created_at")?,
    })
}

pub(crate) fn control_row(r: &Row<'_>) -> Result<ControlRow> {
    Ok(ControlRow {
        command_id: get(r, "command_id")?,
        task_id: get(r, "task_id")?,
        operation: get_enum(r, "operation")?,
        args: get_json(r, "args")?,
        plan_revision: get(r, "plan_revision")?,
        applied_at: get(r, "applied_at")?,
        acknowledged_at: get(r, "acknowledged_at")?,
        acknowledged_by: get(r, "acknowledged_by")?,
        seq: get(r, "seq")?,
    })
}

pub(crate) fn followup_row(r: &Row<'_>) -> Result<FollowupRow> {
    Ok(FollowupRow {
        id: get(r, "id")?,
        task_id: get(r, "task_id")?,
        schedule: get_json(r, "schedule")?,
        time_zone: get(r, "time_zone")?,
        catch_up: get_enum(r, "catch_up")?,
        message: get(r, "message")?,
        state: get_enum(r, "state")?,
        next_run_at: get(r, "next_run_at")?,
        last_run_at: get(r, "last_run_at")?,
        runs: get(r, "runs")?,
        missed: get(r, "missed")?,
        created_at: get(r, "created_at")?,
    })
}

pub(crate) fn push_channel_row(r: &Row<'_>) -> Result<PushChannelRow> {
    Ok(PushChannelRow {
        id: get(r, "id")?,
        device_id: get(r, "device_id")?,
        user_id: get(r, "user_id")?,
        kind: get_enum(r, "kind")?,
        endpoint: get(r, "endpoint")?,
        p256dh: get(r, "p256dh")?,
        auth: get(r, "auth")?,
        cursor: get(r, "cursor")?,
        attempts: get(r, "attempts")?,
        delivered: get(r, "delivered")?,
        failures: get(r, "failures")?,
        consecutive_failures: get(r, "consecutive_failures")?,
        last_error: get(r, "last_error")?,
        last_attempt_at: get(r, "last_attempt_at")?,
        next_attempt_at: get(r, "next_attempt_at")?,
        created_at: get(r, "created_at")?,
        revoked_at: get(r, "revoked_at")?,
    })
}

/// A database error as the store says it: a unique key is `Conflict`, a busy database
/// `Busy`, a full disk `Full`, a failed write or sync `Io`.
pub(crate) fn backend(e: rusqlite::Error) -> StoreError {
    use rusqlite::ffi;
    if let rusqlite::Error::SqliteFailure(f, msg) = &e {
        let said = || msg.clone().unwrap_or_else(|| e.to_string());
        if f.extended_code == ffi::SQLITE_CONSTRAINT_UNIQUE
            || f.extended_code == ffi::SQLITE_CONSTRAINT_PRIMARYKEY
        {
            return StoreError::Conflict(said());
        }
        match f.code {
            ffi::ErrorCode::DatabaseBusy | ffi::ErrorCode::DatabaseLocked => {
                return StoreError::Busy(said());
            }
            ffi::ErrorCode::DiskFull => return StoreError::Full(said()),
            // SQLITE_IOERR with its extended codes: a failed write or fsync.
            ffi::ErrorCode::SystemIoFailure => return StoreError::Io(said()),
            _ => {}
        }
    }
    StoreError::Backend(e.to_string())
}

pub(crate) fn machine_row(r: &Row<'_>) -> Result<MachineRow> {
    Ok(MachineRow {
        id: get(r, "id")?,
        owner_id: get(r, "owner_id")?,
        name: get(r, "name")?,
        info: get_json(r, "info")?,
        registered_at: get(r, "registered_at")?,
        last_seen_at: get(r, "last_seen_at")?,
        created_at: get(r, "created_at")?,
    })
}

pub(crate) fn work_row(r: &Row<'_>) -> Result<WorkRow> {
    Ok(WorkRow {
        id: get(r, "id")?,
        machine_id: get(r, "machine_id")?,
        task_id: get(r, "task_id")?,
        kind: get_enum(r, "kind")?,
        args: get_json(r, "args")?,
        state: get_enum(r, "state")?,
        detail: get(r, "detail")?,
        created_at: get(r, "created_at")?,
        updated_at: get(r, "updated_at")?,
    })
}

pub(crate) fn rule_row(r: &Row<'_>) -> Result<RuleRow> {
    Ok(RuleRow {
        id: get(r, "id")?,
        owner_id: get(r, "owner_id")?,
        device_id: get(r, "device_id")?,
        command_id: get(r, "command_id")?,
        spec: get_json(r, "spec")?,
        digest: get(r, "digest")?,
        answer: get_enum(r, "answer")?,
        created_at: get(r, "created_at")?,
        expires_at: get(r, "expires_at")?,
        revoked_at: get(r, "revoked_at")?,
        revoked_by: get(r, "revoked_by")?,
        uses: get(r, "uses")?,
        last_used_at: get(r, "last_used_at")?,
    })
}
