//! Codex's Plan mode: a turn in the `plan` collaboration mode ends with a proposed plan (a
//! `plan` item); Codex's own terminal then asks "Implement this plan?". Here that question is
//! a plan approval in the inbox, in Codex's words — "Yes, implement this plan" starts a turn in
//! Default mode with "Implement the plan." (what the terminal sends), "No, stay in Plan mode"
//! with the person's feedback starts another planning turn with it.

use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::mpsc;
use waymark_proto::{ApprovalDurability, DecisionStatus};
use waymark_worker::{Run, chosen_option};

use crate::bridge::{self, Choice};

/// What Codex's terminal sends, in Default mode, when a person approves a plan.
pub const IMPLEMENT: &str = "Implement the plan.";

/// The collaboration modes, as `turn/start` takes them.
pub(super) const PLAN: &str = "plan";
pub(super) const DEFAULT: &str = "default";

/// `turn/start`'s `collaborationMode` (experimental API): the mode, with the thread's model
/// (required) and Codex's built-in instructions for it (`developer_instructions: null`).
pub(super) fn collaboration(mode: &str, model: &str) -> Value {
    json!({"mode": mode, "settings": {"model": model, "developer_instructions": null}})
}

/// What a person chose.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Answer {
    /// Implement it.
    Implement,
    /// Plan again with this feedback.
    Revise(String),
    /// Neither (declined without feedback, expired, voided): the thread stays in Plan mode and
    /// the run ends as after any turn; `why` says so.
    Stop(String),
}

fn choices() -> Vec<Choice> {
    vec![
        Choice {
            id: "approve".into(),
            label: "Yes, implement this plan".into(),
            gives_up: "Codex switches to Default mode and starts changing files and running \
                       commands (each still asks where its approval policy says so)"
                .into(),
        },
        Choice {
            id: "deny".into(),
            label: "No, stay in Plan mode".into(),
            gives_up: "nothing is changed yet; Codex plans again with your feedback (without \
                       feedback the run stops here, the thread still in Plan mode)"
                .into(),
        },
    ]
}

/// The approval's intent: the plan as Codex proposed it, whose turn, and where.
pub(super) fn intent(plan: &str, turn: &str, cwd: Option<&str>) -> Value {
    let mut intent = json!({"tool": "codex_plan", "plan": plan, "turn": turn});
    if let Some(cwd) = cwd {
        intent["cwd"] = cwd.into();
    }
    intent
}

/// What the decision comes to.
pub(super) fn answer_of(d: &waymark_proto::Decision) -> Answer {
    if d.status != DecisionStatus::Resolved {
        return Answer::Stop(format!(
            "the plan was not approved ({}); the Codex thread stays in Plan mode",
            match d.status {
                DecisionStatus::Expired => "nobody answered in time",
                _ => "the question was closed",
            }
        ));
    }
    if chosen_option(d) == Some("approve") {
        return Answer::Implement;
    }
    match d
        .outcome
        .as_ref()
        .and_then(|o| o.text.as_deref())
        .map(str::trim)
        .filter(|t| !t.is_empty())
    {
        Some(f) => Answer::Revise(f.to_owned()),
        None => Answer::Stop(
            "the plan was not approved and no feedback was given; the Codex thread stays in Plan mode"
                .into(),
        ),
    }
}

/// Asks the plan and reports the answer to the adapter's loop (with the decision, to
/// acknowledge once the turn it starts is under way).
pub(super) async fn ask(
    run: Arc<Run>,
    thread: String,
    plan: String,
    turn: String,
    cwd: Option<String>,
    events: mpsc::Sender<super::Event>,
) {
    let opened = bridge::open_approval(
        &run,
        intent(&plan, &turn, cwd.as_deref()),
        "Codex's plan is ready: implement it, or stay in Plan mode with your feedback",
        // The thread keeps the plan in Codex: nothing waits on a connection.
        ApprovalDurability::Durable,
        &choices(),
        None,
        None,
    )
    .await;
    let (answer, decision) = match opened {
        Err(e) => (
            Answer::Stop(format!(
                "the plan could not reach the inbox ({e}); the Codex thread stays in Plan mode"
            )),
            None,
        ),
        Ok(d) => match run.await_decision(&d.id).await {
            Ok(d) => (answer_of(&d), Some(d.id)),
            // The run stopped (cancelled, fenced): the loop hears that on its own.
            Err(e) => {
                tracing::info!(thread, error = %e, "no answer to the plan will come");
                return;
            }
        },
    };
    let _ = events
        .send(super::Event::Plan {
            thread,
            answer,
            decision,
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;
    use waymark_proto::{Decision, DecisionKind, DecisionOutcome};

    fn closed(status: DecisionStatus, option: Option<&str>, text: Option<&str>) -> Decision {
        let mut d: Decision = serde_json::from_value(json!({
            "id": "dec_00000000000000000000000000000000", "task_id": "tsk_00000000000000000000000000000000",
            "kind": "approval", "status": "pending", "question": "q", "options": [],
            "plan_revision": 1, "risky": false, "created_at": Utc::now(), "expires_at": Utc::now(),
        }))
        .unwrap();
        d.kind = DecisionKind::Approval;
        d.status = status;
        d.outcome = Some(DecisionOutcome {
            option: option.map(str::to_owned),
            text: text.map(str::to_owned),
            by: "user:alice".into(),
            at: Utc::now(),
            edited_intent: None,
            edited_intent_digest: None,
            answers: None,
            rule: None,
        });
        d
    }

    #[test]
    fn approve_implements_feedback_revises_and_anything_else_stops_in_plan_mode() {
        assert_eq!(
            answer_of(&closed(DecisionStatus::Resolved, Some("approve"), None)),
            Answer::Implement
        );
        assert_eq!(
            answer_of(&closed(
                DecisionStatus::Resolved,
                Some("deny"),
                Some(" use Redis ")
            )),
            Answer::Revise("use Redis".into())
        );
        for d in [
            closed(DecisionStatus::Resolved, Some("deny"), Some("  ")),
            closed(DecisionStatus::Expired, None, None),
            closed(DecisionStatus::Void, None, None),
        ] {
            assert!(
                matches!(answer_of(&d), Answer::Stop(why) if why.contains("Plan mode")),
                "{d:?}"
            );
        }
    }

    #[test]
    fn the_mode_is_set_with_the_threads_model_and_codex_own_instructions() {
        assert_eq!(
            collaboration(PLAN, "gpt-5"),
            json!({"mode": "plan", "settings": {"model": "gpt-5", "developer_instructions": null}})
        );
        let i = intent("# Plan\n1. a", "turn-1", Some("/src"));
        assert_eq!(
            (&i["tool"], &i["plan"], &i["cwd"]),
            (&json!("codex_plan"), &json!("# Plan\n1. a"), &json!("/src"))
        );
    }
}
