//! The views' shared cases: `views.rs` shapes the mirror's answers for the app, and the web
//! companion's `ui/src/web/views.ts` shapes the same answers for a browser. Each case here is an
//! input the Rust mirror gave in the recorded conformance run (`fixtures/mirror-queries.json`),
//! or one of them with a field changed to reach a branch the run did not (a runtime's own
//! deadline, a fail-open hook, an escalation, deliveries out of order), and the view `views.rs`
//! makes of it. `examples/bindings.rs` writes them to `fixtures/views.json` and checks they are
//! current; `ui/src/web/views.test.ts` requires `views.ts` to make exactly the same views.

use chrono::{DateTime, Duration, Utc};
use serde::Serialize;
use serde_json::{Value, json};
use waymark_companion::{InboxItem, ThreadDetail, ThreadRow};

use crate::views::{InboxItemView, ThreadDetailView, ThreadRowView};

/// Where the recorded query answers live, from the app crate's directory.
pub const QUERIES_PATH: &str = "../ui/src/web/fixtures/mirror-queries.json";

/// Where the cases are written, from the app crate's directory.
pub const VIEW_CASES_PATH: &str = "../ui/src/web/fixtures/views.json";

/// One input and the view `views.rs` makes of it.
#[derive(Serialize)]
struct Case {
    /// What it shows.
    name: String,
    /// `thread_row`, `inbox_item` or `thread_detail`.
    view: &'static str,
    /// This device's user.
    me: Option<String>,
    /// The mirror's answer, as the mirror serialises it.
    input: Value,
    /// The view, as the app's command returns it.
    expected: Value,
}

#[derive(Serialize)]
struct Cases {
    /// When every case is looked at (unix ms): a minute and a half after the newest task's
    /// change, so open tasks' elapsed time is counted to it.
    now: i64,
    cases: Vec<Case>,
}

/// The cases as they would be written now, from the recorded query answers (their JSON text).
pub fn render_view_cases(queries: &str) -> Result<String, String> {
    let queries: Value =
        serde_json::from_str(queries).map_err(|e| format!("{QUERIES_PATH}: {e}"))?;
    let threads: Vec<ThreadRow> = parse(&queries["threads"], "threads")?;
    let inbox: Vec<InboxItem> = parse(&queries["inbox"], "inbox")?;
    let details: Vec<ThreadDetail> = match &queries["thread"] {
        Value::Object(m) => m
            .values()
            .map(|v| parse(v, "thread"))
            .collect::<Result<_, _>>()?,
        _ => return Err(format!("{QUERIES_PATH}: `thread` is not an object")),
    };
    let newest = threads
        .iter()
        .map(|r| r.task.updated_at)
        .max()
        .ok_or_else(|| format!("{QUERIES_PATH}: no threads"))?;
    let now = newest + Duration::milliseconds(90_500);
    let mut cases = Vec::new();

    for row in &threads {
        let owner = row.task.owner.clone();
        for me in [None, Some(owner), Some("someone-else".to_owned())] {
            let name = format!(
                "thread {} ({}) for {me:?}",
                row.task.id,
                row.task.state.as_str()
            );
            cases.push(thread_row(name, row.clone(), me, now)?);
        }
    }

    for item in &inbox {
        let id = &item.decision.id;
        let base = to_value(item)?;
        cases.push(inbox_item(format!("{id} as recorded"), &base, None)?);
        cases.push(inbox_item(
            format!("{id} for another user"),
            &base,
            Some("someone-else".to_owned()),
        )?);
        let expires: DateTime<Utc> = item.decision.expires_at;
        let at = |d: i64| json!((expires + Duration::seconds(d)).to_rfc3339());
        let variants: Vec<(&str, Value)> = vec![
            (
                "asked at an older plan revision",
                json!({"plan_revision": item.plan_revision + 1}),
            ),
            (
                "a runtime that denies before the approval expires",
                json!({"decision": {"runtime_deadline": {"runtime": "Codex", "at": at(-30), "then": "denies", "can_wait": true}}}),
            ),
            (
                "a runtime that asks itself, after the approval expires",
                json!({"decision": {"runtime_deadline": {"runtime": "Gemini CLI", "at": at(30), "then": "asks_itself"}}}),
            ),
            (
                "a runtime deadline at the expiry itself",
                json!({"decision": {"runtime_deadline": {"runtime": "OpenClaw", "at": at(0), "then": "asks_itself"}}}),
            ),
            (
                "a fail-open hook",
                json!({"decision": {"durability": "fail_open_hook"}}),
            ),
            (
                "no default option",
                json!({"decision": {"default_option": null}}),
            ),
            (
                "an escalation under way",
                json!({"decision": {"escalation": {
                    "notified": [
                        {"device_id": "dev_b", "device_name": "phone", "step": 0, "at": at(-3000)},
                        {"device_id": "dev_a", "device_name": "laptop", "step": 0, "at": at(-3000)},
                        {"device_id": "dev_b", "device_name": "phone", "step": 0, "reminder": 1, "at": at(-2400)},
                    ],
                    "next": {"step": 1, "at": at(-1800), "devices": ["bob's phone"]},
                    "held_until": at(-2000),
                    "reminded": 1,
                    "next_reminder": at(-1200),
                }}}),
            ),
            (
                "an escalation that stopped",
                json!({"decision": {"escalation": {"notified": [], "stopped": "answered"}}}),
            ),
            (
                "deliveries out of order, two at the same instant",
                json!({"decision": {"deliveries": [
                    {"decision_id": id, "device_id": "dev_b", "device_name": "phone", "step": "opened", "at": at(-100)},
                    {"decision_id": id, "device_id": "dev_b", "device_name": "phone", "step": "fetched", "at": at(-200), "detail": "mirror"},
                    {"decision_id": id, "device_id": "dev_a", "device_name": "laptop", "step": "fetched", "at": at(-200)},
                ]}}),
            ),
            (
                "answered, delivered to the runtime",
                json!({"decision": {
                    "status": "resolved",
                    "outcome": {"option": "approve", "by": "user:alice", "at": at(-60), "edited_intent": {"commit": "def457"}},
                    "durability": "connection_bound",
                    "delivery": {"state": "acknowledged", "detail": "serverRequest/resolved", "at": at(-59)},
                    "editable": "/commit",
                }}),
            ),
        ];
        for (what, patch) in variants {
            let mut input = base.clone();
            merge(&mut input, patch);
            cases.push(inbox_item(format!("{id}: {what}"), &input, None)?);
        }
    }

    for detail in &details {
        let id = &detail.task.id;
        let state = detail.task.state.as_str();
        cases.push(thread_detail(
            format!("{id} ({state})"),
            to_value(detail)?,
            now,
        )?);
        // The same thread still open, and one started after `now` (elapsed is never negative).
        for (what, patch) in [
            ("still running", json!({"task": {"state": "running"}})),
            (
                "created after now",
                json!({"task": {"state": "running", "created_at": (now + Duration::seconds(5)).to_rfc3339()}}),
            ),
        ] {
            let mut input = to_value(detail)?;
            merge(&mut input, patch);
            cases.push(thread_detail(format!("{id}: {what}"), input, now)?);
        }
    }

    let mut text = serde_json::to_string_pretty(&Cases {
        now: now.timestamp_millis(),
        cases,
    })
    .map_err(|e| e.to_string())?;
    text.push('\n');
    Ok(text)
}

fn thread_row(
    name: String,
    row: ThreadRow,
    me: Option<String>,
    now: DateTime<Utc>,
) -> Result<Case, String> {
    let input = to_value(&row)?;
    let expected = to_value(&ThreadRowView::for_user(row, me.as_deref(), now))?;
    Ok(Case {
        name,
        view: "thread_row",
        me,
        input,
        expected,
    })
}

fn inbox_item(name: String, input: &Value, me: Option<String>) -> Result<Case, String> {
    let item: InboxItem = parse(input, &name)?;
    // The input as the mirror would serialise it (a patch may have left a field in another form).
    let input = to_value(&item)?;
    let expected = to_value(&InboxItemView::for_user(item, me.as_deref()))?;
    Ok(Case {
        name,
        view: "inbox_item",
        me,
        input,
        expected,
    })
}

fn thread_detail(name: String, input: Value, now: DateTime<Utc>) -> Result<Case, String> {
    let detail: ThreadDetail = parse(&input, &name)?;
    let input = to_value(&detail)?;
    let expected = to_value(&ThreadDetailView::at(detail, now))?;
    Ok(Case {
        name,
        view: "thread_detail",
        me: None,
        input,
        expected,
    })
}

/// `patch`'s fields over `v`'s, objects merged, anything else replaced.
fn merge(v: &mut Value, patch: Value) {
    match (v, patch) {
        (Value::Object(v), Value::Object(patch)) => {
            for (k, p) in patch {
                merge(v.entry(k).or_insert(Value::Null), p);
            }
        }
        (v, patch) => *v = patch,
    }
}

fn parse<T: serde::de::DeserializeOwned>(v: &Value, what: &str) -> Result<T, String> {
    serde_json::from_value(v.clone()).map_err(|e| format!("{QUERIES_PATH}: {what}: {e}"))
}

fn to_value<T: Serialize>(v: &T) -> Result<Value, String> {
    serde_json::to_value(v).map_err(|e| e.to_string())
}
