//! Claude Code asking its person rather than for permission: `AskUserQuestion` (one to a few
//! questions with labelled choices, multi-select, and "Other" in the person's words) becomes a
//! form question, and `ExitPlanMode` a plan approval — "Approve plan" or "Keep planning" with
//! the person's feedback. Both come through the `PreToolUse` hook, which is also how Claude
//! Code 2.1.328 takes the answers: the answers in `updatedInput.answers` (question text →
//! answer), the plan approved by `allow` (with `updatedInput`, so no dialog of its own opens)
//! or sent back by `deny` with the feedback as the reason the model reads.
//!
//! `claude -p` does not offer `AskUserQuestion` to the model (it is "disabled for this
//! session"); an interactive session and a stream-json session with a permission prompt tool
//! (`--input-format stream-json --permission-prompt-tool stdio`, how the Agent SDK and the
//! runner run it) do, and fire this hook for it (docs/adapters/claude-code.md).

use std::collections::BTreeMap;

use serde_json::{Value, json};
use waymark_proto::*;
use waymark_store::DecisionRow;

use super::{
    Gate, Holding, HookInput, Session, ask_through_hook, chosen, open_approval_with,
    pre_tool_answer, reason_of,
};
use crate::Context;
use crate::caller::Caller;
use crate::core::Tx;
use crate::decisions::{self, Asked, approval_grants};
use crate::error::ApiResult;

/// Claude Code's question tool.
pub(super) const ASK_TOOL: &str = "AskUserQuestion";
/// Claude Code's "my plan is ready" tool.
pub(super) const PLAN_TOOL: &str = "ExitPlanMode";

/// The form an `AskUserQuestion` input asks: `questions[]` with `question`, `header`,
/// `options[]` (`label`, `description`) and `multiSelect`; every question also takes the
/// person's own words, as Claude Code's "Other" does. `None` when the input is not one.
pub(super) fn form_of(input: &Value) -> Option<QuestionForm> {
    let questions = input.get("questions")?.as_array()?;
    let mut out = Vec::with_capacity(questions.len());
    for (i, q) in questions.iter().enumerate() {
        let text = q.get("question")?.as_str()?.to_owned();
        let choices = q
            .get("options")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .map(|o| {
                Some(FormChoice {
                    label: o.get("label")?.as_str()?.to_owned(),
                    description: o
                        .get("description")
                        .and_then(Value::as_str)
                        .filter(|d| !d.trim().is_empty())
                        .map(str::to_owned),
                })
            })
            .collect::<Option<Vec<_>>>()?;
        out.push(FormQuestion {
            id: format!("q{}", i + 1),
            question: text,
            header: q
                .get("header")
                .and_then(Value::as_str)
                .filter(|h| !h.trim().is_empty())
                .map(str::to_owned),
            choices,
            multi_select: q
                .get("multiSelect")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            free_text: true,
        });
    }
    let form = QuestionForm { questions: out };
    form.check().ok()?;
    Some(form)
}

/// The tool input Claude Code runs `AskUserQuestion` with once answered: its own, plus
/// `answers` keyed by each question's text.
pub(super) fn answered_input(
    input: &Value,
    form: &QuestionForm,
    answers: &BTreeMap<String, FormAnswer>,
) -> Value {
    let mut by_text = serde_json::Map::new();
    for q in &form.questions {
        if let Some(a) = answers.get(&q.id) {
            by_text.insert(
                q.question.clone(),
                Value::String(QuestionForm::answer_text(a)),
            );
        }
    }
    let mut out = match input {
        Value::Object(m) => Value::Object(m.clone()),
        _ => json!({}),
    };
    out["answers"] = Value::Object(by_text);
    out
}

fn answers_of(d: &DecisionRow) -> Option<BTreeMap<String, FormAnswer>> {
    d.outcome.as_ref()?.answers.clone()
}

/// What the hook answers once a question's decision is closed: `allow` with the answers, or
/// nothing (Claude Code then asks in its own way) when nobody answered.
fn question_answer(d: &DecisionRow, form: &QuestionForm, input: &Value) -> Value {
    match answers_of(d).filter(|_| d.status == DecisionStatus::Resolved) {
        Some(a) => {
            let mut out = pre_tool_answer("allow", reason_of(d));
            out["hookSpecificOutput"]["updatedInput"] = answered_input(input, form, &a);
            out
        }
        None => json!({}),
    }
}

/// `PreToolUse` of `AskUserQuestion`: the questions as a form in the inbox, held for the
/// hook's timeout (or deferred, with `--defer`), answered in Claude Code's words.
pub(super) async fn ask_questions(
    st: &Context,
    caller: &Caller,
    s: &Session,
    input: &HookInput,
    effect_id: Option<String>,
    how: Gate,
) -> ApiResult<Value> {
    let tool_input = input.tool_input.clone().unwrap_or(Value::Null);
    let Some(form) = form_of(&tool_input) else {
        // Not a shape we can show whole: Claude Code asks in its own way.
        tracing::warn!(session = %input.session_id, "an AskUserQuestion input Waymark cannot read; left to Claude Code");
        return Ok(json!({}));
    };
    let question = match form.questions.as_slice() {
        [one] => format!("Claude Code asks: {}", one.question),
        many => format!("Claude Code asks {} questions", many.len()),
    };
    let (asked_form, asked_input) = (&form, &tool_input);
    let open = |effect_id: Option<String>, held: Holding| async move {
        let expires_in = held.expires_in.as_secs().max(1);
        let asked = decisions::request_decision_with(
            st,
            caller,
            s.task_id.clone(),
            RequestDecision {
                attempt_id: Some(s.attempt_id.clone()),
                fence: Some(s.fence),
                kind: DecisionKind::Question,
                step: None,
                question,
                options: Vec::new(),
                default_option: None,
                expires_in_seconds: Some(expires_in),
                form: Some(asked_form.clone()),
            },
            Asked {
                context: Some(json!({
                    "runtime": super::RUNTIME,
                    "tool": ASK_TOOL,
                    "input": asked_input,
                })),
                effect_id,
                durability: Some(held.durability),
                // Past the hook's timeout Claude Code asks in its own dialog (or its SDK host).
                runtime_deadline: (held.durability == ApprovalDurability::FailOpenHook).then(
                    || AskedRuntimeDeadline {
                        runtime: "Claude Code".into(),
                        in_seconds: expires_in,
                        then: RuntimeFallback::AsksItself,
                    },
                ),
            },
        )
        .await?;
        Ok(asked.value)
    };
    ask_through_hook(st, caller, s, effect_id, how, open, |d, _| {
        question_answer(d, &form, &tool_input)
    })
    .await
}

/// The plan Claude Code asks to leave plan mode with: the tool's own `plan` when it carries
/// one, else the plan file as this session wrote it — Claude Code 2.1.328 sends
/// `ExitPlanMode` with an empty input and keeps the plan in a file the model wrote in plan
/// mode (`~/.claude/plans/<name>.md`, or the project's `plansDirectory`), with `Write` and
/// `Edit` calls the hooks saw. `None` when neither is known.
pub(super) async fn plan_text(
    st: &Context,
    s: &Session,
    input: &HookInput,
) -> ApiResult<Option<String>> {
    if let Some(p) = input
        .tool_input
        .as_ref()
        .and_then(|i| i.get("plan"))
        .and_then(Value::as_str)
        .filter(|p| !p.trim().is_empty())
    {
        return Ok(Some(p.to_owned()));
    }
    let effects = {
        let mut tx = Tx::read(st).await?;
        tx.list_effects(&s.task_id).await?
    };
    let calls: Vec<(String, Value)> = effects
        .iter()
        .filter_map(|e| {
            let tool = e.intent.get("tool")?.as_str()?.to_owned();
            Some((tool, e.intent.get("input")?.clone()))
        })
        .collect();
    Ok(plan_from_calls(&calls))
}

/// Whether a file is a plan file: a `.md` in a `plans` directory.
fn is_plan_file(path: &str) -> bool {
    let p = std::path::Path::new(path);
    p.extension().is_some_and(|x| x == "md")
        && p.parent()
            .and_then(|d| d.file_name())
            .is_some_and(|d| d == "plans")
}

/// The newest plan file's text from the session's calls, oldest first: its last `Write`, then
/// the `Edit`s after it applied in order. An edit that does not apply to the text as seen (the
/// file changed some other way) gives up rather than show a plan that is not the file's.
pub(super) fn plan_from_calls(calls: &[(String, Value)]) -> Option<String> {
    let path_of = |v: &Value| {
        v.get("file_path")
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let path = calls
        .iter()
        .rev()
        .filter(|(t, _)| t == "Write" || t == "Edit")
        .find_map(|(_, i)| path_of(i).filter(|p| is_plan_file(p)))?;
    let start = calls
        .iter()
        .rposition(|(t, i)| t == "Write" && path_of(i).as_deref() == Some(path.as_str()))?;
    let mut text = calls[start].1.get("content")?.as_str()?.to_owned();
    for (tool, i) in &calls[start + 1..] {
        if tool != "Edit" || path_of(i).as_deref() != Some(path.as_str()) {
            continue;
        }
        let old = i.get("old_string")?.as_str()?;
        let new = i.get("new_string")?.as_str()?;
        if old.is_empty() || !text.contains(old) {
            return None;
        }
        text = if i.get("replace_all").and_then(Value::as_bool) == Some(true) {
            text.replace(old, new)
        } else {
            text.replacen(old, new, 1)
        };
    }
    Some(text)
}

/// The choices of a plan approval.
fn plan_choices() -> Vec<DecisionOption> {
    vec![
        DecisionOption {
            id: "approve".into(),
            label: "Approve plan".into(),
            gives_up: "Claude Code leaves plan mode and starts on the plan".into(),
            cost: None,
        },
        DecisionOption {
            id: "deny".into(),
            label: "Keep planning".into(),
            gives_up: "nothing is changed yet; Claude Code plans again with your feedback".into(),
            cost: None,
        },
    ]
}

/// `PreToolUse` of `ExitPlanMode`: the plan as an approval ("Approve plan" / "Keep
/// planning"), held or deferred like any gated call.
pub(super) async fn ask_plan(
    st: &Context,
    caller: &Caller,
    s: &Session,
    input: &HookInput,
    effect_id: Option<String>,
    how: Gate,
) -> ApiResult<Value> {
    let open = |effect_id: Option<String>, held: Holding| async move {
        let plan = plan_text(st, s, input).await?;
        let summary = match &plan {
            Some(_) => {
                "Claude Code's plan is ready: approve it, or keep planning with your feedback"
            }
            None => "Claude Code asks to leave plan mode (its plan file was not seen by Waymark)",
        };
        let mut intent = super::approval_intent(input);
        if let Some(p) = plan {
            intent["plan"] = Value::String(p);
        }
        open_approval_with(
            st,
            caller,
            s,
            intent,
            summary.to_owned(),
            plan_choices(),
            None,
            effect_id,
            input.cwd.clone(),
            held,
        )
        .await
    };
    ask_through_hook(st, caller, s, effect_id, how, open, |d, _| {
        plan_answer(d, input)
    })
    .await
}

/// Approve: `allow` with the tool's input (so Claude Code takes it as the person's approval
/// and opens no dialog of its own). Keep planning: `deny` with the person's feedback.
fn plan_answer(d: &DecisionRow, input: &HookInput) -> Value {
    if chosen(d).as_deref().and_then(approval_grants) == Some(true) {
        let mut out = pre_tool_answer("allow", reason_of(d));
        out["hookSpecificOutput"]["updatedInput"] =
            input.tool_input.clone().unwrap_or_else(|| json!({}));
        return out;
    }
    let feedback = d
        .outcome
        .as_ref()
        .and_then(|o| o.text.as_deref())
        .filter(|t| !t.trim().is_empty());
    let reason = match (d.status, feedback) {
        (DecisionStatus::Resolved, Some(f)) => {
            format!("The user wants you to keep planning. Their feedback: {f}")
        }
        (DecisionStatus::Resolved, None) => {
            "The user wants you to keep planning; the plan is not approved yet.".to_owned()
        }
        _ => format!("The plan was not approved in Waymark: {}", reason_of(d)),
    };
    pre_tool_answer("deny", reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `AskUserQuestion`'s input as the real Claude Code 2.1.328 sent it to its `PreToolUse`
    /// hook (stream-json session, fake model).
    fn recorded() -> Value {
        json!({"questions":[{"question":"Which database should I use?","header":"Database",
            "options":[{"label":"Postgres","description":"server database"},
                       {"label":"SQLite","description":"a file"}],"multiSelect":false}]})
    }

    #[test]
    fn a_real_ask_becomes_a_form_and_its_answers_go_back_keyed_by_question_text() {
        let input = recorded();
        let form = form_of(&input).unwrap();
        assert_eq!(form.questions.len(), 1);
        let q = &form.questions[0];
        assert_eq!(
            (q.id.as_str(), q.header.as_deref()),
            ("q1", Some("Database"))
        );
        assert_eq!(q.choices[1].description.as_deref(), Some("a file"));
        assert!(q.free_text && !q.multi_select);
        let answers = BTreeMap::from([(
            "q1".to_owned(),
            FormAnswer {
                chosen: vec!["SQLite".into()],
                text: None,
            },
        )]);
        let out = answered_input(&input, &form, &answers);
        assert_eq!(
            out["answers"],
            json!({"Which database should I use?": "SQLite"})
        );
        assert_eq!(out["questions"], input["questions"], "its own input kept");
    }

    #[test]
    fn inputs_that_are_not_questions_are_not_forms() {
        assert!(form_of(&json!({})).is_none());
        assert!(form_of(&json!({"questions": []})).is_none());
        assert!(
            form_of(&json!({"questions": [{"question": "x", "options": [{"no": 1}]}]})).is_none()
        );
    }

    #[test]
    fn the_plan_is_the_plan_files_last_write_with_its_edits() {
        let plan = "/h/.claude/plans/split-lexer.md";
        let calls = vec![
            (
                "Read".to_owned(),
                json!({"file_path": "/repo/src/lexer.rs"}),
            ),
            (
                "Write".to_owned(),
                json!({"file_path": plan, "content": "# Plan\n1. split\n2. test\n"}),
            ),
            (
                "Edit".to_owned(),
                json!({"file_path": "/repo/x.md", "old_string": "1", "new_string": "9"}),
            ),
            (
                "Edit".to_owned(),
                json!({"file_path": plan, "old_string": "2. test", "new_string": "2. test both"}),
            ),
        ];
        assert_eq!(
            plan_from_calls(&calls).as_deref(),
            Some("# Plan\n1. split\n2. test both\n")
        );
        // An edit that does not apply: not the file's text any more.
        let mut broken = calls.clone();
        broken.push((
            "Edit".to_owned(),
            json!({"file_path": plan, "old_string": "nowhere", "new_string": "x"}),
        ));
        assert_eq!(plan_from_calls(&broken), None);
        // No plan file written.
        assert_eq!(plan_from_calls(&calls[..1]), None);
        assert!(!is_plan_file("/repo/plans.md") && is_plan_file("/p/plans/a.md"));
    }
}
