//! A fake model behind the OpenAI Responses API (`POST /v1/responses`, streamed as server-sent
//! events), what Codex speaks with `wire_api = "responses"`. It plays the same script of turns
//! as [`super::fake_model`]: in the turn whose prompt a user message carries, it first calls
//! Codex's `exec_command` tool with `"sandbox_permissions": "require_escalated"` and a
//! `justification` (which makes Codex ask for approval), and once a `function_call_output`
//! follows that prompt (the command ran, was declined, or its turn was interrupted) it answers
//! with the turn's final text. Every request body is kept for the test to read, and the
//! `exec_command` calls it made are counted ([`FakeResponses::calls`]: a call the model was told
//! is done and not asked again shows there). [`FakeResponses::hold_after_results`] keeps every
//! answer to a request that carries a call's output waiting, so a test can kill Codex after a
//! call ran and before its turn ends.
//!
//! Shapes as Codex 0.169.0 was seen to send and accept them (`fixtures/codex/real/`): the
//! request has `model`, `stream: true`, `input` (messages, `function_call`,
//! `function_call_output` items), `tools`; the stream needs `response.created`, the output
//! items (`response.output_item.done`) and `response.completed` with `usage`.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};

use super::fake_model::{Turn, read_request, respond};

/// The running fake; stops when dropped.
pub struct FakeResponses {
    /// `http://127.0.0.1:PORT/v1`, the provider's `base_url`.
    pub base_url: String,
    requests: Arc<Mutex<Vec<Value>>>,
    calls: Arc<AtomicUsize>,
    hold: Arc<AtomicBool>,
    retry_aborted: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

/// What the server's connections share.
struct Shared {
    turns: Vec<Turn>,
    /// Play [`planner_reply`] instead of the turns.
    planner: bool,
    kept: Arc<Mutex<Vec<Value>>>,
    calls: Arc<AtomicUsize>,
    hold: Arc<AtomicBool>,
    retry_aborted: Arc<AtomicBool>,
}

impl Drop for FakeResponses {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeResponses {
    pub async fn start(turns: Vec<Turn>) -> FakeResponses {
        Self::serving(turns, false).await
    }

    /// A model that plans, as [`planner_reply`] says.
    pub async fn start_planner() -> FakeResponses {
        Self::serving(Vec::new(), true).await
    }

    async fn serving(turns: Vec<Turn>, planner: bool) -> FakeResponses {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            planner,
            turns,
            kept: Arc::new(Mutex::new(Vec::new())),
            calls: Arc::new(AtomicUsize::new(0)),
            hold: Arc::new(AtomicBool::new(false)),
            retry_aborted: Arc::new(AtomicBool::new(false)),
        });
        let (requests, calls, hold, retry_aborted) = (
            shared.kept.clone(),
            shared.calls.clone(),
            shared.hold.clone(),
            shared.retry_aborted.clone(),
        );
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let shared = shared.clone();
                tokio::spawn(async move {
                    if let Err(e) = serve(stream, &shared).await {
                        eprintln!("fake responses: {e}");
                    }
                });
            }
        });
        FakeResponses {
            base_url: format!("http://127.0.0.1:{port}/v1"),
            requests,
            calls,
            hold,
            retry_aborted,
            task,
        }
    }

    /// While on, a call Codex closed as `aborted` (its connection died before it ran) is no
    /// result: the model asks for the call again, as a model told it did not run would.
    pub fn retry_aborted(&self, on: bool) {
        self.retry_aborted.store(on, Ordering::SeqCst);
    }

    /// How many `exec_command` calls the model made so far.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// While on, a request that carries a call's output is kept (it counts among
    /// [`FakeResponses::requests`]) and not answered until this is turned off.
    pub fn hold_after_results(&self, on: bool) {
        self.hold.store(on, Ordering::SeqCst);
    }

    /// Every Responses request body received, in order.
    pub fn requests(&self) -> Vec<Value> {
        self.requests.lock().unwrap().clone()
    }
}

async fn serve(stream: TcpStream, shared: &Shared) -> std::io::Result<()> {
    let (method, path, body, mut stream) = read_request(stream).await?;
    if method != "POST" || !path.ends_with("/responses") {
        let problem =
            json!({"error": {"message": format!("the fake model serves no {method} {path}")}});
        return respond(
            &mut stream,
            "404 Not Found",
            "application/json",
            &problem.to_string(),
        )
        .await;
    }
    let request: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            let problem = json!({"error": {"message": format!("not JSON: {e}")}});
            return respond(
                &mut stream,
                "400 Bad Request",
                "application/json",
                &problem.to_string(),
            )
            .await;
        }
    };
    let n = {
        let mut kept = shared.kept.lock().unwrap();
        kept.push(request.clone());
        kept.len()
    };
    let item = if shared.planner {
        planner_reply(&request, n)
    } else {
        reply_to(
            &request,
            &shared.turns,
            n,
            shared.retry_aborted.load(Ordering::SeqCst),
        )
    };
    if item["type"] == "function_call" {
        shared.calls.fetch_add(1, Ordering::SeqCst);
    } else if has_output(&request) {
        while shared.hold.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    respond(&mut stream, "200 OK", "text/event-stream", &sse(item, n)).await
}

/// The text of an `input` message (its `input_text` parts joined).
pub fn text_of(item: &Value) -> String {
    match &item["content"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// Whether the request carries a call's output.
fn has_output(request: &Value) -> bool {
    request["input"]
        .as_array()
        .is_some_and(|i| i.iter().any(|i| i["type"] == "function_call_output"))
}

/// The output item to send: the `exec_command` call, or the answer once the call has an output.
fn reply_to(request: &Value, turns: &[Turn], n: usize, retry_aborted: bool) -> Value {
    let input = request["input"].as_array().cloned().unwrap_or_default();
    let found = input.iter().enumerate().rev().find_map(|(at, item)| {
        if item["type"] != "message" || item["role"] != "user" {
            return None;
        }
        let text = text_of(item);
        turns
            .iter()
            .enumerate()
            .find(|(_, t)| text.contains(&t.prompt))
            .map(|(i, t)| (at, i, t))
    });
    let answer = |text: &str| {
        json!({"type": "message", "role": "assistant", "id": format!("msg_{n}"),
               "content": [{"type": "output_text", "text": text, "annotations": []}]})
    };
    let Some((at, index, turn)) = found else {
        return answer("The fake model has no turn for this prompt.");
    };
    let aborted = |i: &Value| {
        let o = &i["output"];
        o.as_str().or_else(|| o["content"].as_str()).map(str::trim) == Some("aborted")
    };
    if input[at..]
        .iter()
        .any(|i| i["type"] == "function_call_output" && !(retry_aborted && aborted(i)))
    {
        return answer(&turn.answer);
    }
    let arguments = json!({
        "cmd": turn.command,
        "sandbox_permissions": "require_escalated",
        "justification": format!("waymark test: {}", turn.prompt),
    });
    json!({"type": "function_call", "id": format!("fc_{index}_{n}"), "call_id": format!("call_{index}_{n}"),
           "name": "exec_command", "arguments": arguments.to_string()})
}

/// The question [`planner_reply`] asks through `request_user_input`.
pub fn planner_question() -> Value {
    json!({"questions": [{"id": "db", "header": "Database", "question": "Which database should the cache use?",
        "options": [{"label": "SQLite (Recommended)", "description": "a file next to the service"},
                    {"label": "PostgreSQL", "description": "the server the service already uses"}]}]})
}

/// What Codex's terminal sends in Default mode when a plan is approved.
pub const IMPLEMENT: &str = "Implement the plan.";

/// The text of the newest message the person wrote (Codex's own context messages, which
/// start with a tag, left out).
pub fn last_prompt(request: &Value) -> String {
    request["input"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|i| i["type"] == "message" && i["role"] == "user")
        .map(text_of)
        .rfind(|t| !t.trim_start().starts_with('<'))
        .unwrap_or_default()
}

/// Whether the request offers the model this tool.
pub fn offers(request: &Value, tool: &str) -> bool {
    request["tools"]
        .as_array()
        .is_some_and(|t| t.iter().any(|t| t["name"] == tool))
}

/// The collaboration mode the request is in, by the newest `<collaboration_mode>` developer
/// message Codex 0.169 sends: `plan` ("# Plan Mode …") or `default` ("# Collaboration Mode:
/// Default …"); none when no mode was ever set. (Its tool list is the same in both modes:
/// `request_user_input` is always listed, and refused by Codex outside Plan mode.)
pub fn mode(request: &Value) -> Option<&'static str> {
    let text = request["input"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|i| i["type"] == "message" && i["role"] == "developer")
        .map(text_of)
        .rfind(|t| t.contains("<collaboration_mode>"))?;
    if text.contains("# Plan Mode") {
        Some("plan")
    } else if text.contains("Collaboration Mode: Default") {
        Some("default")
    } else {
        None
    }
}

/// A model in Codex's Plan mode: in Plan mode, while nothing was asked yet, it asks
/// [`planner_question`] through `request_user_input`; then it proposes a plan (`<proposed_plan>`) whose one
/// step repeats the newest prompt; told [`IMPLEMENT`], it says it did.
fn planner_reply(request: &Value, n: usize) -> Value {
    let prompt = last_prompt(request);
    let answer = |text: &str| {
        json!({"type": "message", "role": "assistant", "id": format!("msg_{n}"),
               "content": [{"type": "output_text", "text": text, "annotations": []}]})
    };
    if prompt.contains(IMPLEMENT) {
        return answer("Implemented the plan.");
    }
    if mode(request) == Some("plan")
        && offers(request, "request_user_input")
        && !has_output(request)
    {
        return json!({"type": "function_call", "id": format!("fc_q_{n}"), "call_id": format!("call_q_{n}"),
                      "name": "request_user_input", "arguments": planner_question().to_string()});
    }
    answer(&format!(
        "Here is my plan.\n<proposed_plan>\n# Cache plan\n1. {}\n</proposed_plan>",
        prompt.trim()
    ))
}

fn sse(item: Value, n: usize) -> String {
    let id = format!("resp_{n}");
    let events = [
        json!({"type": "response.created", "response": {"id": id}}),
        json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
        json!({"type": "response.completed", "response": {"id": id, "usage": {
            "input_tokens": 10, "input_tokens_details": null, "output_tokens": 5,
            "output_tokens_details": null, "total_tokens": 15}}}),
    ];
    events
        .iter()
        .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap()))
        .collect()
}
