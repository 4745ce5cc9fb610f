//! Rows for the pure rules' unit tests: a task, its attempt and an approval as the rules see
//! them, each a plain value a test changes one field of.

use waymark_proto::*;
use waymark_store::*;

/// A running task at fence 2.
pub fn task() -> TaskRow {
    TaskRow {
        id: "task_1".into(),
        owner_id: "usr_1".into(),
        title: "fix the flaky deploy".into(),
        goal: String::new(),
        runtime: None,
        state: TaskState::Running,
        plan: Vec::new(),
        plan_revision: 1,
        budget: Budget::default(),
        usage: Usage::default(),
        materials: Materials::default(),
        session_id: "ses_1".into(),
        fence: 2,
        outcome_summary: None,
        created_at: 0,
        updated_at: 0,
        parent_id: None,
        external_key: None,
        machine_id: None,
    }
}

/// The task's live attempt at fence 2, its lease running until 1,000.
pub fn attempt() -> AttemptRow {
    AttemptRow {
        id: "att_2".into(),
        task_id: "task_1".into(),
        worker: "w".into(),
        fence: 2,
        expires_at: 1_000,
        state: AttemptState::Active,
        manifest_digest: None,
        started_at: 0,
        ended_at: None,
        outcome: None,
        released: None,
    }
}

/// A pending approval of `intent`, closing at 10,000.
pub fn approval(intent: serde_json::Value) -> DecisionRow {
    DecisionRow {
        id: "dec_1".into(),
        task_id: "task_1".into(),
        kind: DecisionKind::Approval,
        status: DecisionStatus::Pending,
        step: None,
        question: "run it?".into(),
        options: Vec::new(),
        default_option: Some("deny".into()),
        intent_digest: digest::json_digest(&intent).ok(),
        intent: Some(intent),
        effect_id: None,
        plan_revision: 1,
        risky: false,
        expires_at: 10_000,
        created_at: 0,
        outcome: None,
        durability: None,
        delivery: None,
        editable: None,
        runtime_deadline: None,
        escalation: None,
        escalate_at: None,
    }
}
