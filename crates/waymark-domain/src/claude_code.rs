//! Claude Code's hooks, served by the control plane (`POST /v1/adapters/claude-code/hook`):
//! Claude Code calls it as an `http` hook, so its sessions become tasks, its tool calls
//! effects keyed `session_id:tool_use_id`, and its permission prompts approvals answered from
//! the inbox in Claude Code's own decision JSON (docs/adapters/claude-code.md).
//!
//! Every write goes through the same rules the worker API's handlers call, so fences,
//! idempotency, audit and events are the ones every worker gets. The HTTP face (the route, its
//! query and headers) is the server's; this module is what a hook call means.

use std::time::Duration;

use regex::Regex;
use serde::Deserialize;
use serde_json::{Value, json};
use waymark_proto::digest::json_digest;
use waymark_proto::*;
use waymark_store::DecisionRow;

use crate::Context;
use crate::caller::Caller;
use crate::core::{Tx, invalid};
use crate::decisions::approval_grants;
use crate::error::{ApiError, ApiResult};
use crate::{checkpoints, decisions, effects, evidence, leases, tasks};

mod asks;

/// The runtime name of tasks made from Claude Code sessions.
pub const RUNTIME: &str = "claude-code";

/// How long an attempt of an interactive session lives between two hook calls.
const SESSION_LEASE_SECONDS: u32 = 3600;

/// Answer this long before the hook's own timeout, so the answer is not cut off.
const ANSWER_MARGIN: Duration = Duration::from_secs(3);

/// The query string the hook URL carries (written by `waymark adapters claude-code install`).
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
pub struct HookQuery {
    /// The hook's `timeout` in seconds (Claude Code's default for http hooks is 600): a held
    /// approval is answered, or expired, before it.
    pub timeout: Option<u64>,
    /// A regex of tool names whose `PreToolUse` asks for approval (e.g. `Bash|Write`).
    pub gate: Option<String>,
    /// `true` in `claude -p` runs: a gated `PreToolUse` answers `defer`, so the approval
    /// outlives the process; the resumed run gets the answer.
    pub defer: Option<bool>,
}

/// The header a hook call carries Claude Code's `CLAUDE_CODE_ENTRYPOINT` in (written by
/// `waymark adapters claude-code install`): `sdk-cli` in a `claude -p` run, `cli` in an
/// interactive session (Claude Code 2.1.328 sets it itself at start).
pub const ENTRYPOINT_HEADER: &str = "x-claude-code-entrypoint";

/// How the Claude Code process behind a hook call runs, as far as its entrypoint says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Run {
    /// `claude -p` or an SDK: nobody sits at a prompt. An unanswered permission is a denial,
    /// and a `PreToolUse` may answer `defer` (the run exits and waits, durably).
    Headless,
    /// An interactive session: Claude Code asks in its own prompt.
    Interactive,
    /// No header (a hook installed before it, or another launcher): assume a person may be at
    /// the prompt, and offer no switch.
    Unknown,
}

impl Run {
    /// How the process runs, from the [`ENTRYPOINT_HEADER`] its hook call carried.
    pub fn of(entrypoint: Option<&str>) -> Run {
        match entrypoint.map(str::trim) {
            Some("sdk-cli" | "sdk-ts" | "sdk-py") => Run::Headless,
            Some("cli") => Run::Interactive,
            _ => Run::Unknown,
        }
    }
}

/// The fields of Claude Code's hook input the adapter reads; the rest is kept as sent.
#[derive(Debug, Deserialize)]
struct HookInput {
    hook_event_name: String,
    session_id: String,
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    tool_name: Option<String>,
    #[serde(default)]
    tool_input: Option<Value>,
    #[serde(default)]
    tool_use_id: Option<String>,
    #[serde(default)]
    tool_response: Option<Value>,
    #[serde(default)]
    session_title: Option<String>,
    #[serde(default)]
    source: Option<String>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    last_assistant_message: Option<String>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    compact_summary: Option<String>,
    #[serde(default)]
    trigger: Option<String>,
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    permission_suggestions: Option<Value>,
    #[serde(default)]
    message: Option<String>,
    /// The working tree of `cwd`, added by the command hook of a runner's run (`--tree`).
    #[serde(default)]
    waymark_tree: Option<WorkingTree>,
}

/// The task and live attempt of one Claude Code session.
struct Session {
    task_id: String,
    attempt_id: String,
    fence: i64,
}

/// What a hook call of `caller`'s Claude Code (its query `q`, its process `run`) means, as
/// Claude Code's own hook output: `{}`, or the event's decision JSON. Hooks of one session
/// take turns (Claude Code fires those of parallel tool calls at once, and a session gets one
/// attempt, not one per racing hook).
pub async fn hook(
    st: &Context,
    caller: &Caller,
    q: HookQuery,
    run: Run,
    raw: Value,
) -> ApiResult<Value> {
    let input: HookInput = serde_json::from_value(raw.clone())
        .map_err(|e| invalid(format!("not a Claude Code hook input: {e}")))?;
    if input.session_id.trim().is_empty() || input.session_id.len() > 200 {
        return Err(invalid("`session_id` must be 1 to 200 characters"));
    }
    let gate = q
        .gate
        .as_deref()
        .map(|g| Regex::new(&format!("^(?:{g})$")))
        .transpose()
        .map_err(|e| invalid(format!("`gate` is not a regex: {e}")))?;
    let hold = Duration::from_secs(q.timeout.unwrap_or(600).clamp(1, 86_400))
        .saturating_sub(ANSWER_MARGIN)
        .max(Duration::from_millis(500));

    let lock = st
        .claude_sessions
        .lock_of(&format!("{}\u{0}{}", caller.user_id, input.session_id));
    let guard = lock.lock().await;
    let event = input.hook_event_name.as_str();
    // A run's end never starts an attempt only to end it: `claude -p` fires `Stop` then
    // `SessionEnd`, and a run is one attempt (a resumed run, a real restart, is the next one).
    let ends = matches!(event, "Stop" | "StopFailure" | "SessionEnd");
    let s = match ensure_session(st, caller, &input, !ends).await? {
        Found::Live(s) => s,
        Found::Ended { task_id } => {
            if let Some(m) = input
                .last_assistant_message
                .clone()
                .filter(|_| event == "Stop")
            {
                note(st, caller, &task_id, "assistant", m).await?;
            }
            return Ok(json!({}));
        }
    };
    settle_deliveries(st, caller, &s, &input).await?;
    close_unrun_effects(st, caller, &s, &input).await?;
    let answer = match event {
        "SessionStart" => {
            let how = input.source.as_deref().unwrap_or("startup");
            say(
                st,
                caller,
                &s,
                "system",
                format!("Claude Code session started ({how})"),
            )
            .await?;
            record_tree(st, caller, &s, &input).await?;
            json!({})
        }
        "UserPromptSubmit" => {
            if let Some(p) = &input.prompt {
                say(st, caller, &s, "user", p.clone()).await?;
            }
            json!({})
        }
        "PreToolUse" if paused(st, &s).await? => {
            // `claude -p` has no pause of its own: it stops here, before the call, and keeps
            // its session; resuming the task resumes the session (a runner's run by itself).
            let tool = input.tool_name.as_deref().unwrap_or("tool");
            let why = format!(
                "the task is paused in Waymark: Claude Code stopped before `{tool}`, which did not run; resume the task to go on"
            );
            say(st, caller, &s, "system", why.clone()).await?;
            json!({
                "continue": false,
                "stopReason": why,
                "hookSpecificOutput": {
                    "hookEventName": "PreToolUse",
                    "permissionDecision": "deny",
                    "permissionDecisionReason": why,
                },
            })
        }
        "PreToolUse" => {
            let effect_id = declare_tool(st, caller, &s, &input).await?;
            // Questions and plans are the person's to answer, gated or not.
            let asks = match input.tool_name.as_deref() {
                Some(asks::ASK_TOOL) => Some(true),
                Some(asks::PLAN_TOOL) => Some(false),
                _ => None,
            };
            if let Some(question) = asks {
                drop(guard);
                let how = Gate {
                    defer: q.defer == Some(true),
                    hold,
                    run,
                };
                return if question {
                    asks::ask_questions(st, caller, &s, &input, effect_id, how).await
                } else {
                    asks::ask_plan(st, caller, &s, &input, effect_id, how).await
                };
            }
            let gated = gate
                .as_ref()
                .is_some_and(|g| input.tool_name.as_deref().is_some_and(|t| g.is_match(t)));
            if !gated {
                json!({})
            } else {
                drop(guard);
                return gate_tool(
                    st,
                    caller,
                    &s,
                    &input,
                    effect_id,
                    Gate {
                        defer: q.defer == Some(true),
                        hold,
                        run,
                    },
                )
                .await;
            }
        }
        "PostToolUse" | "PostToolUseFailure" => {
            finish_tool(st, caller, &s, &input, event == "PostToolUse").await?;
            record_tree(st, caller, &s, &input).await?;
            json!({})
        }
        "PermissionRequest" => {
            drop(guard);
            return permission_request(st, caller, &s, &input, hold, run).await;
        }
        "PreCompact" | "PostCompact" => {
            let reason = format!(
                "{} ({})",
                input.hook_event_name,
                input.trigger.as_deref().unwrap_or("auto")
            );
            let summary = input.compact_summary.as_ref().map(|x| truncate(x, 60_000));
            checkpoint(st, caller, &s, reason, summary, None).await?;
            json!({})
        }
        "Notification" => {
            if let Some(m) = &input.message {
                say(st, caller, &s, "system", m.clone()).await?;
            }
            json!({})
        }
        "Stop" => {
            if let Some(m) = &input.last_assistant_message {
                say(st, caller, &s, "assistant", m.clone()).await?;
            }
            // The turn is over and Claude Code waits for its person: hand the task back.
            release(st, caller, &s, "Claude Code finished its turn").await?;
            json!({})
        }
        "StopFailure" => {
            let why = input.error.as_deref().unwrap_or("error");
            say(
                st,
                caller,
                &s,
                "system",
                format!("Claude Code stopped on an error: {why}"),
            )
            .await?;
            release(st, caller, &s, &format!("Claude Code stopped: {why}")).await?;
            json!({})
        }
        "SessionEnd" => {
            let why = input.reason.as_deref().unwrap_or("other");
            release(
                st,
                caller,
                &s,
                &format!("Claude Code session ended ({why})"),
            )
            .await?;
            json!({})
        }
        _ => json!({}),
    };
    Ok(answer)
}

/// The session's task, with its live attempt or without one.
enum Found {
    Live(Session),
    /// The task has no live attempt and the hook must not start one.
    Ended {
        task_id: String,
    },
}

/// Finds or creates the session's task, and its live attempt (renewing the lease); starts an
/// attempt when there is none and `start` allows it.
async fn ensure_session(
    st: &Context,
    caller: &Caller,
    input: &HookInput,
    start: bool,
) -> ApiResult<Found> {
    let title = input
        .session_title
        .clone()
        .unwrap_or_else(|| match &input.cwd {
            Some(cwd) => format!("Claude Code in {cwd}"),
            None => "Claude Code session".into(),
        });
    let task = tasks::create_task(
        st,
        caller,
        CreateTask {
            title: truncate(&title, 200),
            goal: String::new(),
            runtime: Some(RUNTIME.into()),
            budget: Budget::default(),
            plan: Vec::new(),
            materials: Materials::default(),
            external_key: Some(input.session_id.clone()),
        },
    )
    .await?;
    let task = task.value;
    let live = {
        let mut tx = Tx::read(st).await?;
        tx.list_attempts(&task.id)
            .await?
            .into_iter()
            .find(|a| a.state == AttemptState::Active && a.expires_at > st.now_ms())
    };
    if let Some(a) = live {
        let renewed = leases::heartbeat(
            st,
            caller,
            a.id.clone(),
            Heartbeat {
                fence: a.fence,
                lease_seconds: Some(SESSION_LEASE_SECONDS),
                acknowledged: Vec::new(),
            },
        )
        .await;
        if renewed.is_ok() {
            return Ok(Found::Live(Session {
                task_id: task.id,
                attempt_id: a.id,
                fence: a.fence,
            }));
        }
    }
    if !start {
        return Ok(Found::Ended { task_id: task.id });
    }
    let attempt = leases::start_attempt(
        st,
        caller,
        task.id.clone(),
        StartAttempt {
            worker: caller.name.clone(),
            lease_seconds: Some(SESSION_LEASE_SECONDS),
            manifest_digest: None,
            materials: None,
        },
    )
    .await?;
    Ok(Found::Live(Session {
        task_id: task.id,
        attempt_id: attempt.value.id,
        fence: attempt.value.fence,
    }))
}

/// A message outside any attempt (the run's attempt already ended).
async fn note(
    st: &Context,
    caller: &Caller,
    task_id: &str,
    role: &str,
    text: String,
) -> ApiResult<()> {
    if text.trim().is_empty() {
        return Ok(());
    }
    evidence::append_messages(
        st,
        caller,
        task_id.to_owned(),
        AppendMessages {
            attempt_id: None,
            fence: None,
            messages: vec![NewMessage {
                role: role.into(),
                text: truncate(&text, 60_000),
            }],
        },
    )
    .await
    .map(drop)
}

async fn say(
    st: &Context,
    caller: &Caller,
    s: &Session,
    role: &str,
    text: String,
) -> ApiResult<()> {
    if text.trim().is_empty() {
        return Ok(());
    }
    evidence::append_messages(
        st,
        caller,
        s.task_id.clone(),
        AppendMessages {
            attempt_id: Some(s.attempt_id.clone()),
            fence: Some(s.fence),
            messages: vec![NewMessage {
                role: role.into(),
                text: truncate(&text, 60_000),
            }],
        },
    )
    .await
    .map(drop)
}

fn effect_key(input: &HookInput) -> Option<String> {
    input
        .tool_use_id
        .as_ref()
        .map(|t| format!("{}:{t}", input.session_id))
}

fn tool_intent(input: &HookInput) -> Value {
    json!({
        "tool": input.tool_name.clone().unwrap_or_default(),
        "input": input.tool_input.clone().unwrap_or(Value::Null),
    })
}

/// What an approval of a call asks about: the call, and the directory Claude Code runs it in
/// (shown to the person, bound by the digest, and what a standing rule made from the card is
/// scoped to). The call's effect keeps `tool_intent` alone, so a session resumed elsewhere
/// still finds its calls.
fn approval_intent(input: &HookInput) -> Value {
    let mut intent = tool_intent(input);
    if let Some(cwd) = input.cwd.as_deref().filter(|c| !c.is_empty()) {
        intent["cwd"] = Value::String(cwd.to_owned());
    }
    intent
}

/// `PreToolUse` → the tool call as an effect in progress; returns its id.
async fn declare_tool(
    st: &Context,
    caller: &Caller,
    s: &Session,
    input: &HookInput,
) -> ApiResult<Option<String>> {
    let Some(key) = effect_key(input) else {
        return Ok(None);
    };
    let declared = effects::declare_effect(
        st,
        caller,
        s.task_id.clone(),
        DeclareEffect {
            attempt_id: s.attempt_id.clone(),
            fence: s.fence,
            idempotency_key: key,
            kind: format!(
                "claude_code.{}",
                input.tool_name.as_deref().unwrap_or("tool")
            ),
            step: None,
            resource_id: None,
            intent: tool_intent(input),
        },
    )
    .await?;
    Ok(Some(declared.value.effect.id))
}

/// Whether the session's task is paused (read now: the pause may have come mid-turn).
async fn paused(st: &Context, s: &Session) -> ApiResult<bool> {
    Ok(Tx::read(st)
        .await?
        .task(&s.task_id)
        .await?
        .is_some_and(|t| t.state == TaskState::Paused))
}

/// `PostToolUse` / `PostToolUseFailure` → the effect's receipt.
async fn finish_tool(
    st: &Context,
    caller: &Caller,
    s: &Session,
    input: &HookInput,
    ok: bool,
) -> ApiResult<()> {
    let Some(key) = effect_key(input) else {
        return Ok(());
    };
    let effect = {
        let mut tx = Tx::read(st).await?;
        tx.effect_by_key(&s.task_id, &key).await?
    };
    let effect_id = match effect {
        Some(e) if e.status == EffectStatus::Confirmed || e.status == EffectStatus::Failed => {
            return Ok(());
        }
        Some(e) => e.id,
        // The hooks were installed mid-call: the receipt still gets its effect.
        None => match declare_tool(st, caller, s, input).await? {
            Some(id) => id,
            None => return Ok(()),
        },
    };
    let response = input.tool_response.clone().unwrap_or(Value::Null);
    let receipt = json!({
        "tool_response": clip_json(response, 16_000),
        "error": input.error,
    });
    effects::update_effect(
        st,
        caller,
        effect_id,
        UpdateEffect {
            attempt_id: s.attempt_id.clone(),
            fence: s.fence,
            status: if ok {
                EffectStatus::Confirmed
            } else {
                EffectStatus::Failed
            },
            receipt: Some(receipt),
            resource_id: None,
        },
    )
    .await
    .map(drop)
}

/// Records the working tree a runner's command hook read, when it differs from the last
/// checkpoint's: the tree a revive's admission compares the host's with.
async fn record_tree(
    st: &Context,
    caller: &Caller,
    s: &Session,
    input: &HookInput,
) -> ApiResult<()> {
    let Some(tree) = &input.waymark_tree else {
        return Ok(());
    };
    let last = {
        let mut tx = Tx::read(st).await?;
        tx.last_checkpoint(&s.task_id).await?
    };
    let recorded = last
        .and_then(|c| serde_json::from_value::<CheckpointBody>(c.body).ok())
        .and_then(|b| b.materials)
        .and_then(|m| m.tree);
    if recorded.is_some_and(|r| r.digest == tree.digest) {
        return Ok(());
    }
    let materials = Materials {
        tree: Some(tree.clone()),
        ..Materials::default()
    };
    let reason = format!("working_tree ({})", input.hook_event_name);
    checkpoint(st, caller, s, reason, None, Some(materials)).await
}

async fn checkpoint(
    st: &Context,
    caller: &Caller,
    s: &Session,
    reason: String,
    summary: Option<String>,
    materials: Option<Materials>,
) -> ApiResult<()> {
    let (sequence, plan_revision) = {
        let mut tx = Tx::read(st).await?;
        let last = tx
            .last_checkpoint(&s.task_id)
            .await?
            .map_or(0, |c| c.sequence);
        let revision = tx.task(&s.task_id).await?.map_or(1, |t| t.plan_revision);
        (last + 1, revision)
    };
    checkpoints::append_checkpoint(
        st,
        caller,
        s.task_id.clone(),
        AppendCheckpoint {
            attempt_id: s.attempt_id.clone(),
            fence: s.fence,
            sequence,
            body: CheckpointBody {
                reason,
                plan_revision,
                summary,
                materials,
                ..CheckpointBody::default()
            },
        },
    )
    .await
    .map(drop)
}

async fn release(st: &Context, caller: &Caller, s: &Session, summary: &str) -> ApiResult<()> {
    leases::finish(
        st,
        caller,
        s.attempt_id.clone(),
        FinishAttempt {
            fence: s.fence,
            outcome: FinishOutcome::Released,
            summary: Some(summary.into()),
            released: Vec::new(),
        },
    )
    .await
    .map(drop)
}

/// What one of Claude Code's permission suggestions changes, in words: a suggestion is not
/// always a rule — Claude Code 2.1.328 offers `addDirectories` + `setMode: acceptEdits` for a
/// `Bash` call, which switches the whole session to accepting file edits unasked.
fn describe_suggestion(s: &Value) -> String {
    let str_of = |k: &str| s[k].as_str().unwrap_or("?").to_owned();
    let scope = match s["destination"].as_str() {
        Some("session") | None => "for this session".to_owned(),
        Some("localSettings") => "in this project's local settings".to_owned(),
        Some("projectSettings") => "in this project's shared settings".to_owned(),
        Some("userSettings") => "in your user settings".to_owned(),
        Some(other) => format!("in {other}"),
    };
    let list = |k: &str| -> String {
        s[k].as_array()
            .map(|a| {
                a.iter()
                    .map(|r| match r.as_str() {
                        Some(d) => format!("`{d}`"),
                        None => match (r["toolName"].as_str(), r["ruleContent"].as_str()) {
                            (Some(t), Some(c)) => format!("`{t}({c})`"),
                            (Some(t), None) => format!("`{t}`"),
                            _ => r.to_string(),
                        },
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default()
    };
    match s["type"].as_str().unwrap_or("") {
        "addRules" | "replaceRules" => {
            let verb = if s["type"] == "addRules" {
                "add"
            } else {
                "replace with"
            };
            format!(
                "{verb} the {} rule {} {scope}",
                str_of("behavior"),
                list("rules")
            )
        }
        "removeRules" => format!("remove the rule {} {scope}", list("rules")),
        "addDirectories" => format!("give Claude Code access to {} {scope}", list("directories")),
        "removeDirectories" => format!("remove access to {} {scope}", list("directories")),
        "setMode" => match s["mode"].as_str() {
            Some("acceptEdits") => {
                format!(
                    "switch the session to `acceptEdits` mode: file edits no longer ask ({scope})"
                )
            }
            Some("bypassPermissions") => {
                format!(
                    "switch the session to `bypassPermissions` mode: nothing asks any more ({scope})"
                )
            }
            Some("plan") => format!("switch the session to `plan` mode ({scope})"),
            Some(m) => format!("switch the session's permission mode to `{m}` ({scope})"),
            None => format!("change the session's permission mode ({scope})"),
        },
        other => format!("apply Claude Code's `{other}` change {scope}"),
    }
}

/// The choices of a Claude Code permission prompt; "allow and apply the suggestions" says
/// what each suggestion changes.
fn choices(suggestions: &[Value]) -> Vec<DecisionOption> {
    let mut c = vec![DecisionOption {
        id: "approve".into(),
        label: "Allow once".into(),
        gives_up: String::new(),
        cost: None,
    }];
    if !suggestions.is_empty() {
        let what: Vec<String> = suggestions.iter().map(describe_suggestion).collect();
        let what = truncate(&what.join("; "), 440);
        c.push(DecisionOption {
            id: "approve_always".into(),
            label: truncate(&format!("Allow, and {what}"), 490),
            gives_up: truncate(
                &format!("Claude Code stops asking for what this allows: {what}"),
                490,
            ),
            cost: None,
        });
    }
    c.push(DecisionOption {
        id: "deny".into(),
        label: "Deny".into(),
        gives_up: "the tool does not run; Claude is told why".into(),
        cost: None,
    });
    c
}

/// How a hook call's approval is held.
#[derive(Debug, Clone, Copy)]
struct Holding {
    /// Held for the hook's timeout (`FailOpenHook`) or deferred (`Durable`).
    durability: ApprovalDurability,
    /// How long until it expires.
    expires_in: Duration,
    /// What Claude Code does at a held hook's timeout: a headless run denies, an interactive
    /// one asks.
    run: Run,
    /// The hook may still answer `defer` if the person asks (a held `PreToolUse` in a
    /// headless run).
    can_wait: bool,
}

/// Opens the approval a held or deferred hook call waits on.
async fn open_approval(
    st: &Context,
    caller: &Caller,
    s: &Session,
    input: &HookInput,
    effect_id: Option<String>,
    how: Holding,
) -> ApiResult<Decision> {
    let tool = input.tool_name.as_deref().unwrap_or("a tool");
    let detail = input
        .tool_input
        .as_ref()
        .and_then(|i| i.get("command").or_else(|| i.get("file_path")))
        .and_then(Value::as_str)
        .map(|c| format!(": {}", truncate(c, 300)))
        .unwrap_or_default();
    let suggestions = input
        .permission_suggestions
        .as_ref()
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    open_approval_with(
        st,
        caller,
        s,
        approval_intent(input),
        format!("Claude Code wants to use {tool}{detail}"),
        choices(suggestions),
        // Claude Code runs an allowed call with `updatedInput` in place of its own.
        Some("/input".into()),
        effect_id,
        input.cwd.clone(),
        how,
    )
    .await
}

/// Opens an approval a held or deferred hook call waits on, with its intent, words and
/// choices.
#[allow(clippy::too_many_arguments)]
async fn open_approval_with(
    st: &Context,
    caller: &Caller,
    s: &Session,
    intent: Value,
    summary: String,
    options: Vec<DecisionOption>,
    editable: Option<String>,
    effect_id: Option<String>,
    cwd: Option<String>,
    how: Holding,
) -> ApiResult<Decision> {
    let Holding {
        durability,
        expires_in,
        run,
        can_wait,
    } = how;
    let d = decisions::request_approval(
        st,
        caller,
        s.task_id.clone(),
        RequestApproval {
            attempt_id: Some(s.attempt_id.clone()),
            fence: Some(s.fence),
            step: None,
            effect_id,
            intent,
            intent_digest: None,
            summary,
            expires_in_seconds: Some(expires_in.as_secs().max(1)),
            default_option: Some("deny".into()),
            risky: false,
            durability: Some(durability),
            options,
            editable,
            // A held hook gives up at its timeout: a headless run denies the call, an
            // interactive session asks in its own prompt.
            runtime_deadline: (durability == ApprovalDurability::FailOpenHook).then(|| {
                AskedRuntimeDeadline {
                    runtime: "Claude Code".into(),
                    in_seconds: expires_in.as_secs().max(1),
                    then: if run == Run::Headless {
                        RuntimeFallback::Denies
                    } else {
                        RuntimeFallback::AsksItself
                    },
                }
            }),
            cwd,
        },
        can_wait && durability == ApprovalDurability::FailOpenHook,
    )
    .await?;
    Ok(d.value)
}

/// Waits until the decision is closed or `hold` passes; `None` on timeout.
async fn wait_closed(
    st: &Context,
    decision_id: &str,
    hold: Duration,
) -> ApiResult<Option<DecisionRow>> {
    let deadline = tokio::time::Instant::now() + hold;
    let mut watch = st.cursor_watch();
    loop {
        watch.borrow_and_update();
        let d = {
            let mut tx = Tx::read(st).await?;
            tx.decision(decision_id)
                .await?
                .ok_or_else(|| ApiError::not_found("decision", decision_id))?
        };
        // Closed, or switched to a durable wait (`defer`): the hook answers now.
        if d.status != DecisionStatus::Pending || d.durability == Some(ApprovalDurability::Durable)
        {
            return Ok(Some(d));
        }
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => return Ok(None),
            r = watch.changed() => if r.is_err() { return Ok(None) },
        }
    }
}

/// Expires a held approval when the hook's request goes away (Claude Code stopped waiting,
/// or the hook timed out) before an answer: it is never reported approved.
struct HoldGuard {
    st: Context,
    caller: Caller,
    task_id: String,
    decision_id: String,
    armed: bool,
}

impl Drop for HoldGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (st, caller) = (self.st.clone(), self.caller.clone());
        let (task, decision) = (self.task_id.clone(), self.decision_id.clone());
        tokio::spawn(async move {
            let _ = expire(
                &st,
                &caller,
                &task,
                &decision,
                "Claude Code stopped waiting for the hook and decided without Waymark",
            )
            .await;
        });
    }
}

async fn expire(
    st: &Context,
    caller: &Caller,
    task: &str,
    decision: &str,
    reason: &str,
) -> ApiResult<()> {
    match decisions::expire_held(
        st,
        caller,
        task.to_owned(),
        decision.to_owned(),
        ExpireDecision {
            attempt_id: None,
            fence: None,
            reason: reason.into(),
        },
    )
    .await
    {
        Ok(_) => Ok(()),
        // Answered in the meantime: the answer stands (and is not delivered, see `settle`).
        Err(e) if e.code() == ErrorCode::DecisionClosed => Ok(()),
        Err(e) => Err(e),
    }
}

/// Holds the hook's request until the decision or the hook's timeout.
async fn hold_for_answer(
    st: &Context,
    caller: &Caller,
    s: &Session,
    d: &Decision,
    hold: Duration,
) -> ApiResult<Option<DecisionRow>> {
    let mut guard = HoldGuard {
        st: st.clone(),
        caller: caller.clone(),
        task_id: s.task_id.clone(),
        decision_id: d.id.clone(),
        armed: true,
    };
    let closed = wait_closed(st, &d.id, hold).await?;
    guard.armed = false;
    if closed.is_none() {
        expire(st, caller, &s.task_id, &d.id, decisions::HOOK_TIMED_OUT).await?;
        // An answer may have won the race with the expiry.
        let mut tx = Tx::read(st).await?;
        return Ok(tx
            .decision(&d.id)
            .await?
            .filter(|x| x.status == DecisionStatus::Resolved));
    }
    Ok(closed)
}

fn chosen(d: &DecisionRow) -> Option<String> {
    if d.status != DecisionStatus::Resolved {
        return None;
    }
    d.outcome.as_ref().and_then(|o| o.option.clone())
}

/// The tool input a person approved in place of Claude Code's own, when they edited it.
fn edited_input(d: &DecisionRow) -> Option<Value> {
    d.outcome
        .as_ref()?
        .edited_intent
        .as_ref()?
        .get("input")
        .cloned()
}

fn reason_of(d: &DecisionRow) -> String {
    let by = d.outcome.as_ref().map_or("someone", |o| o.by.as_str());
    let text = d.outcome.as_ref().and_then(|o| o.text.as_deref());
    match text {
        Some(t) => format!("{by} via Waymark: {t}"),
        None => format!("decided by {by} via Waymark (decision {})", d.id),
    }
}

/// `PermissionRequest`: an approval held open until answered; the answer in Claude Code's
/// `decision` JSON, or no decision on timeout (the runtime then prompts on its own).
async fn permission_request(
    st: &Context,
    caller: &Caller,
    s: &Session,
    input: &HookInput,
    hold: Duration,
    run: Run,
) -> ApiResult<Value> {
    let effect_id = asked_call(st, s, input).await?;
    // A permission prompt cannot be deferred (only `PreToolUse` answers `defer`).
    let how = Holding {
        durability: ApprovalDurability::FailOpenHook,
        expires_in: hold,
        run,
        can_wait: false,
    };
    let d = open_approval(st, caller, s, input, effect_id, how).await?;
    let Some(closed) = hold_for_answer(st, caller, s, &d, hold).await? else {
        return Ok(json!({}));
    };
    let Some(option) = chosen(&closed) else {
        return Ok(json!({}));
    };
    let decision = match approval_grants(&option) {
        Some(true) => {
            let mut allow = json!({"behavior": "allow"});
            if let Some(input) = edited_input(&closed) {
                allow["updatedInput"] = input;
            }
            if option == "approve_always"
                && let Some(sug) = &input.permission_suggestions
            {
                allow["updatedPermissions"] = sug.clone();
            }
            allow
        }
        _ => json!({"behavior": "deny", "message": reason_of(&closed), "interrupt": false}),
    };
    Ok(json!({"hookSpecificOutput": {"hookEventName": "PermissionRequest", "decision": decision}}))
}

/// The effect a `PermissionRequest` asks about. Claude Code 2.1.328 sends it without a
/// `tool_use_id`, so it is the newest call of the session's `PreToolUse`s with the same tool
/// and input that is still `intended` and not yet asked about.
async fn asked_call(st: &Context, s: &Session, input: &HookInput) -> ApiResult<Option<String>> {
    if let Some(key) = effect_key(input) {
        let mut tx = Tx::read(st).await?;
        return Ok(tx.effect_by_key(&s.task_id, &key).await?.map(|e| e.id));
    }
    let intent = tool_intent(input);
    let mut tx = Tx::read(st).await?;
    let asked: Vec<String> = tx
        .list_decisions(&s.task_id)
        .await?
        .into_iter()
        .filter_map(|d| d.effect_id)
        .collect();
    Ok(tx
        .list_effects(&s.task_id)
        .await?
        .into_iter()
        .filter(|e| {
            e.status == EffectStatus::Intended && e.intent == intent && !asked.contains(&e.id)
        })
        .max_by_key(|e| e.created_at)
        .map(|e| e.id))
}

/// A call Claude Code did not run gets no `PostToolUse` (nor a failure): its effect is closed
/// `failed`, with why it did not run, once the session shows Claude Code went on without it —
/// never left `intended`, never guessed as done. A denial shows at the session's next hook
/// about anything but that call; an expiry only when the turn is over, since Claude Code then
/// decided alone (`claude -p` denies; an interactive session asks in its own prompt, where the
/// person may still allow it — the call's `PostToolUse` then confirms it before the turn ends).
async fn close_unrun_effects(
    st: &Context,
    caller: &Caller,
    s: &Session,
    input: &HookInput,
) -> ApiResult<()> {
    let event = input.hook_event_name.as_str();
    let turn_over = matches!(
        event,
        "Stop" | "StopFailure" | "SessionEnd" | "UserPromptSubmit"
    );
    let (decisions, effects) = {
        let mut tx = Tx::read(st).await?;
        (
            tx.list_decisions(&s.task_id).await?,
            tx.list_effects(&s.task_id).await?,
        )
    };
    let this_call = effect_key(input)
        .and_then(|k| effects.iter().find(|e| e.idempotency_key == k))
        .map(|e| e.id.clone());
    for d in decisions {
        let Some(effect_id) = d.effect_id.as_deref() else {
            continue;
        };
        if d.kind != DecisionKind::Approval || this_call.as_deref() == Some(effect_id) {
            continue;
        }
        let reason = match d.status {
            DecisionStatus::Resolved
                if chosen(&d).as_deref().and_then(approval_grants) != Some(true) =>
            {
                format!("not run: denied ({})", reason_of(&d))
            }
            DecisionStatus::Expired if turn_over => {
                let why = d
                    .outcome
                    .as_ref()
                    .and_then(|o| o.text.as_deref())
                    .unwrap_or("no answer in time");
                format!(
                    "not run: the approval expired ({why}); Claude Code went on without the call ({event})"
                )
            }
            _ => continue,
        };
        if !effects
            .iter()
            .any(|e| e.id == effect_id && e.status == EffectStatus::Intended)
        {
            continue;
        }
        let r = effects::update_effect(
            st,
            caller,
            effect_id.to_owned(),
            UpdateEffect {
                attempt_id: s.attempt_id.clone(),
                fence: s.fence,
                status: EffectStatus::Failed,
                receipt: Some(json!({"not_run": true, "decision_id": d.id, "reason": reason})),
                resource_id: None,
            },
        )
        .await;
        // Closed in the meantime by a racing hook of the same session: that close stands.
        if let Err(e) = r
            && e.code() != ErrorCode::IllegalTransition
        {
            return Err(e);
        }
    }
    Ok(())
}

fn pre_tool_answer(permission: &str, reason: String) -> Value {
    json!({"hookSpecificOutput": {
        "hookEventName": "PreToolUse",
        "permissionDecision": permission,
        "permissionDecisionReason": reason,
    }})
}

/// `allow`, with the person's edit of the tool input when they made one.
fn pre_tool_allow(d: &DecisionRow) -> Value {
    let mut out = pre_tool_answer("allow", reason_of(d));
    if let Some(input) = edited_input(d) {
        out["hookSpecificOutput"]["updatedInput"] = input;
    }
    out
}

/// How a gated call is asked about: deferred at once (`--defer`), or held for `hold`.
#[derive(Debug, Clone, Copy)]
struct Gate {
    defer: bool,
    hold: Duration,
    run: Run,
}

/// How a call asked about through the hook is held: deferred at once (`durable`, a day), or
/// held for the hook's timeout — which a headless run's person may still switch to a wait.
fn holding(how: Gate) -> Holding {
    if how.defer {
        Holding {
            durability: ApprovalDurability::Durable,
            expires_in: decisions::DEFERRED_EXPIRY,
            run: how.run,
            can_wait: false,
        }
    } else {
        Holding {
            durability: ApprovalDurability::FailOpenHook,
            expires_in: how.hold,
            run: how.run,
            can_wait: how.run == Run::Headless,
        }
    }
}

/// Claude Code is to wait for the person across its exit: the run ends, the decision stays
/// open, and the resumed run's `PreToolUse` for the same call gets the answer.
fn deferred() -> Value {
    pre_tool_answer(
        "defer",
        "waiting for a decision in Waymark; resume the session to continue".into(),
    )
}

/// What every `PreToolUse` that asks a person goes through — a gated call, a question, a plan:
/// a call asked about before (a deferred run resumed) is answered from its decision;
/// otherwise `open` asks (held or deferred, per `how`) and the hook answers once the decision
/// closes, `defer` when the person asks Claude Code to wait, and nothing when the hook's time
/// runs out (Claude Code then decides in its own way). `answer` words a closed decision in
/// Claude Code's terms; its flag says the decision was found from an earlier run.
async fn ask_through_hook<O, Fut>(
    st: &Context,
    caller: &Caller,
    s: &Session,
    effect_id: Option<String>,
    how: Gate,
    open: O,
    answer: impl Fn(&DecisionRow, bool) -> Value,
) -> ApiResult<Value>
where
    O: FnOnce(Option<String>, Holding) -> Fut,
    Fut: std::future::Future<Output = ApiResult<Decision>>,
{
    if let Some(effect) = &effect_id {
        let earlier = {
            let mut tx = Tx::read(st).await?;
            tx.list_decisions(&s.task_id)
                .await?
                .into_iter()
                .rfind(|d| d.effect_id.as_deref() == Some(effect.as_str()))
        };
        if let Some(d) = earlier {
            if d.status == DecisionStatus::Pending {
                return Ok(pre_tool_answer(
                    "defer",
                    "waiting for a decision in Waymark".into(),
                ));
            }
            return Ok(answer(&d, true));
        }
    }
    let d = open(effect_id, holding(how)).await?;
    let closed = if how.defer {
        // A standing rule may have answered it as it opened: no need to wait.
        if d.status == DecisionStatus::Pending {
            return Ok(deferred());
        }
        match Tx::read(st).await?.decision(&d.id).await? {
            Some(closed) => closed,
            None => return Ok(deferred()),
        }
    } else {
        match hold_for_answer(st, caller, s, &d, how.hold).await? {
            Some(closed) => closed,
            None => return Ok(json!({})),
        }
    };
    // The person asked Claude Code to wait for them (`defer`).
    if closed.status == DecisionStatus::Pending {
        return Ok(deferred());
    }
    Ok(answer(&closed, false))
}

/// A gated `PreToolUse`: held like a permission prompt, or in `-p` runs deferred so the
/// approval is durable; the resumed run's `PreToolUse` for the same call gets the answer.
async fn gate_tool(
    st: &Context,
    caller: &Caller,
    s: &Session,
    input: &HookInput,
    effect_id: Option<String>,
    how: Gate,
) -> ApiResult<Value> {
    ask_through_hook(
        st,
        caller,
        s,
        effect_id,
        how,
        |effect, held| open_approval(st, caller, s, input, effect, held),
        |d, earlier| match chosen(d).as_deref().and_then(approval_grants) {
            Some(true) => pre_tool_allow(d),
            _ if earlier => pre_tool_answer(
                "deny",
                format!("not approved in Waymark ({}): {}", d.status, reason_of(d)),
            ),
            _ => pre_tool_answer("deny", reason_of(d)),
        },
    )
    .await
}

/// Answers count once Claude Code acted on them: an allowed call when its `PostToolUse`
/// (or failure) arrives, a denial or a resumed deferral at the session's next hook.
async fn settle_deliveries(
    st: &Context,
    caller: &Caller,
    s: &Session,
    input: &HookInput,
) -> ApiResult<()> {
    let waiting: Vec<DecisionRow> = {
        let mut tx = Tx::read(st).await?;
        tx.list_decisions(&s.task_id)
            .await?
            .into_iter()
            .filter(|d| d.delivery.as_ref().map(|v| v.state) == Some(DeliveryState::Pending))
            .collect()
    };
    if waiting.is_empty() {
        return Ok(());
    }
    let event = input.hook_event_name.as_str();
    let post = matches!(event, "PostToolUse" | "PostToolUseFailure");
    // An approval asks about the call and its directory (`approval_intent`).
    let this_call = json_digest(&approval_intent(input)).ok();
    let this_effect = match effect_key(input) {
        Some(k) => {
            let mut tx = Tx::read(st).await?;
            tx.effect_by_key(&s.task_id, &k).await?.map(|e| e.id)
        }
        None => None,
    };
    for d in waiting {
        // An answered question lets its tool run with the answers.
        let grants = d.kind == DecisionKind::Question
            || chosen(&d).as_deref().and_then(approval_grants) == Some(true);
        let same_call = match (&d.effect_id, &this_effect) {
            (Some(a), Some(b)) => a == b,
            // Approved as asked, or as the person edited it (the call then carries the edit).
            _ => {
                let edited = d
                    .outcome
                    .as_ref()
                    .and_then(|o| o.edited_intent_digest.as_deref());
                this_call.is_some()
                    && (d.intent_digest == this_call || edited == this_call.as_deref())
            }
        };
        let detail = if !grants {
            format!("Claude Code went on without the tool ({event})")
        } else if post && same_call {
            format!("{event} ran for the approved call")
        } else {
            continue;
        };
        let r = decisions::report_delivery(
            st,
            caller,
            s.task_id.clone(),
            d.id.clone(),
            ReportDelivery {
                attempt_id: None,
                fence: None,
                state: DeliveryState::Acknowledged,
                detail: Some(detail),
            },
        )
        .await;
        if let Err(e) = r
            && e.code() != ErrorCode::DecisionClosed
        {
            return Err(e);
        }
    }
    Ok(())
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// Keeps a tool's response under `max` bytes of JSON (long outputs are cut, visibly).
fn clip_json(v: Value, max: usize) -> Value {
    let text = v.to_string();
    if text.len() <= max {
        return v;
    }
    json!({"truncated": true, "bytes": text.len(), "head": truncate(&text, max)})
}
