//! Rows to wire types: the one place that knows both shapes. A stored value it does not
//! know is `StoreError::Corrupt`, never a default.

use chrono::{DateTime, TimeZone, Utc};
use serde::de::DeserializeOwned;
use serde_json::Value;
use waymark_proto as p;
use waymark_store::{self as s, StoreError};

type R<T> = Result<T, StoreError>;

/// Unix milliseconds to a UTC time.
pub fn dt(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms).single().unwrap_or_default()
}

/// A delegation as one side sees it: `user` is the other person's name.
pub fn delegation(user: String, d: &s::DelegationRow) -> p::Delegation {
    p::Delegation {
        user,
        since: dt(d.created_at),
        state: match d.accepted_at {
            Some(_) => p::DelegationState::Accepted,
            None => p::DelegationState::Offered,
        },
        accepted_at: d.accepted_at.map(dt),
    }
}

pub fn json<T: DeserializeOwned>(v: &Value, what: &str) -> R<T> {
    serde_json::from_value(v.clone()).map_err(|e| StoreError::Corrupt(format!("{what}: {e}")))
}

pub fn task(t: &s::TaskRow, owner: &str) -> p::Task {
    p::Task {
        id: t.id.clone(),
        owner: owner.to_owned(),
        title: t.title.clone(),
        goal: t.goal.clone(),
        runtime: t.runtime.clone(),
        state: t.state,
        plan: t.plan.clone(),
        plan_revision: t.plan_revision,
        budget: t.budget.clone(),
        usage: t.usage.clone(),
        materials: t.materials.clone(),
        session_id: t.session_id.clone(),
        fence: t.fence,
        outcome_summary: t.outcome_summary.clone(),
        created_at: dt(t.created_at),
        updated_at: dt(t.updated_at),
        parent_id: t.parent_id.clone(),
        external_key: t.external_key.clone(),
        machine_id: t.machine_id.clone(),
    }
}

pub fn session(x: &s::SessionRow) -> p::Session {
    p::Session {
        id: x.id.clone(),
        task_id: x.task_id.clone(),
        parent_id: x.parent_id.clone(),
        created_at: dt(x.created_at),
    }
}

pub fn attempt(a: &s::AttemptRow) -> p::Attempt {
    p::Attempt {
        id: a.id.clone(),
        task_id: a.task_id.clone(),
        worker: a.worker.clone(),
        fence: a.fence,
        expires_at: dt(a.expires_at),
        state: a.state,
        manifest_digest: a.manifest_digest.clone(),
        started_at: dt(a.started_at),
        ended_at: a.ended_at.map(dt),
        outcome: a.outcome,
        released: a.released.clone().unwrap_or_default(),
    }
}

/// A checkpoint as stored. A body that no longer parses (a hand edit) is shown empty; the
/// chain check reports the edit.
pub fn checkpoint(c: &s::CheckpointRow) -> p::Checkpoint {
    p::Checkpoint {
        task_id: c.task_id.clone(),
        sequence: c.sequence,
        attempt_id: c.attempt_id.clone(),
        fence: c.fence,
        body: serde_json::from_value(c.body.clone()).unwrap_or_default(),
        prev_digest: c.prev_digest.clone(),
        digest: c.digest.clone(),
        created_at: dt(c.created_at),
    }
}

pub fn effect(e: &s::EffectRow) -> p::Effect {
    p::Effect {
        id: e.id.clone(),
        task_id: e.task_id.clone(),
        idempotency_key: e.idempotency_key.clone(),
        kind: e.kind.clone(),
        step: e.step.clone(),
        resource_id: e.resource_id.clone(),
        intent: e.intent.clone(),
        intent_digest: e.intent_digest.clone(),
        status: e.status,
        receipt: e.receipt.clone(),
        attempt_id: e.attempt_id.clone(),
        fence: e.fence,
        created_at: dt(e.created_at),
        updated_at: dt(e.updated_at),
        flag: e.flag.clone(),
    }
}

pub fn decision(d: &s::DecisionRow) -> R<p::Decision> {
    Ok(p::Decision {
        id: d.id.clone(),
        task_id: d.task_id.clone(),
        kind: d.kind,
        status: d.status,
        step: d.step.clone(),
        question: d.question.clone(),
        options: d.options.clone(),
        default_option: d.default_option.clone(),
        intent: d.intent.clone(),
        intent_digest: d.intent_digest.clone(),
        effect_id: d.effect_id.clone(),
        plan_revision: d.plan_revision,
        risky: d.risky,
        expires_at: dt(d.expires_at),
        created_at: dt(d.created_at),
        outcome: d.outcome.clone(),
        durability: d.durability,
        delivery: d.delivery.clone(),
        editable: d.editable.clone(),
        deliveries: Vec::new(),
        runtime_deadline: d.runtime_deadline.clone(),
        escalation: d.escalation.clone(),
        form: form_of(d)?,
    })
}

/// A form question's form, kept in its intent beside what the runtime asked.
pub fn form_of(d: &s::DecisionRow) -> R<Option<p::QuestionForm>> {
    if d.kind != p::DecisionKind::Question {
        return Ok(None);
    }
    d.intent
        .as_ref()
        .and_then(|i| i.get("form"))
        .map(|f| json(f, "decision form"))
        .transpose()
}

pub fn artifact(a: &s::ArtifactRow) -> p::Artifact {
    p::Artifact {
        id: a.id.clone(),
        task_id: a.task_id.clone(),
        sha256: a.sha256.clone(),
        name: a.name.clone(),
        media_type: a.media_type.clone(),
        size: a.size,
        step: a.step.clone(),
        created_at: dt(a.created_at),
    }
}

pub fn receipt(r: &s::ReceiptRow) -> R<p::TestReceipt> {
    Ok(p::TestReceipt {
        id: r.id.clone(),
        task_id: r.task_id.clone(),
        step: r.step.clone(),
        command: r.command.clone(),
        exit_code: r.exit_code as i32,
        commit: r.commit.clone(),
        totals: json(&r.totals, "receipt totals")?,
        failures: json(&r.failures, "receipt failures")?,
        duration_seconds: r.duration_seconds,
        passed: r.passed,
        junit_sha256: r.junit_sha256.clone(),
        created_at: dt(r.created_at),
    })
}

pub fn message(m: &s::MessageRow) -> p::Message {
    p::Message {
        session_id: m.session_id.clone(),
        seq: m.seq,
        role: m.role.clone(),
        text: m.text.clone(),
        created_at: dt(m.created_at),
    }
}

pub fn event(e: &s::EventRow) -> p::Event {
    p::Event {
        cursor: e.cursor,
        task_id: e.task_id.clone(),
        kind: e.kind,
        at: dt(e.at),
        data: e.data.clone(),
    }
}

/// A device as people see it (its user's name given).
pub fn device(d: &s::DeviceRow, user: &str) -> p::Device {
    p::Device {
        id: d.id.clone(),
        user: user.to_owned(),
        name: d.name.clone(),
        scopes: d.scopes.clone(),
        public_key: d.public_key.clone(),
        created_at: dt(d.created_at),
        revoked_at: d.revoked_at.map(dt),
        last_seen_at: d.last_seen_at.map(dt),
        stale: false,
    }
}

pub fn delivery(d: &s::DeliveryRow, device_name: &str) -> p::DeviceDelivery {
    p::DeviceDelivery {
        decision_id: d.decision_id.clone(),
        device_id: d.device_id.clone(),
        device_name: device_name.to_owned(),
        step: d.step,
        at: dt(d.at),
        detail: d.detail.clone(),
    }
}

/// A control command as the worker sees it.
pub fn control(c: &s::ControlRow) -> p::ControlCommand {
    p::ControlCommand {
        command_id: c.command_id.clone(),
        operation: c.operation,
        args: c.args.clone(),
        plan_revision: c.plan_revision,
        applied_at: dt(c.applied_at),
        seq: c.seq,
    }
}

/// A follow-up.
pub fn followup(f: &s::FollowupRow) -> R<p::Followup> {
    Ok(p::Followup {
        id: f.id.clone(),
        task_id: f.task_id.clone(),
        schedule: json(&f.schedule, "follow-up schedule")?,
        time_zone: f.time_zone.clone(),
        catch_up: f.catch_up,
        message: f.message.clone(),
        state: f.state,
        next_run_at: f.next_run_at.map(dt),
        last_run_at: f.last_run_at.map(dt),
        runs: f.runs,
        missed: f.missed,
        created_at: dt(f.created_at),
    })
}

/// A push channel, with its delivery record.
pub fn push_channel(c: &s::PushChannelRow) -> p::PushChannel {
    p::PushChannel {
        id: c.id.clone(),
        device_id: c.device_id.clone(),
        kind: c.kind.as_str().to_owned(),
        endpoint: c.endpoint.clone(),
        delivered: c.delivered,
        attempts: c.attempts,
        failures: c.failures,
        last_error: c.last_error.clone(),
        last_attempt_at: c.last_attempt_at.map(dt),
        next_attempt_at: dt(c.next_attempt_at),
        revoked_at: c.revoked_at.map(dt),
    }
}

/// What a machine's runner last reported, as stored; `None` before its first registration
/// (a machine made by `waymark admin` holds `{}` until then).
pub fn machine_info(m: &s::MachineRow) -> Option<p::RegisterMachine> {
    serde_json::from_value(m.info.clone()).ok()
}
