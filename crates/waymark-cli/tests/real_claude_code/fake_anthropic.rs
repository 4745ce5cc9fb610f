//! A fake Anthropic Messages API for running the real Claude Code without a real model:
//! `POST /v1/messages` streamed as server-sent events (what `claude` speaks with
//! `ANTHROPIC_BASE_URL`), `POST /v1/messages/count_tokens`, and a harmless `200 {}` for any
//! other path. For a request whose messages carry a scripted turn's prompt and that offers the
//! `Bash` tool, it asks for `Bash` to run the turn's command; once the last message carries the
//! tool's result, it answers with the turn's final text followed by what the result said (so a
//! test sees what Claude Code told the model: the output, or why the call was denied). Any
//! other request (Claude Code's own side queries) gets a short text.
//!
//! A resumed session whose history already holds the tool's result is answered with text (a
//! model told what is done does not run it again); `hold_after_results` keeps every answer to
//! a request that carries a tool's result waiting, so a test can kill Claude Code after a call
//! ran and before its turn ends.
//!
//! Shapes as Claude Code 2.1.328 was seen to send them: `POST /v1/messages?beta=true` with
//! `stream: true`; the prompt inside a `text` block of the first user message, after Claude
//! Code's own `<system-reminder>` blocks; the tool's answer as a `tool_result` block of the last
//! user message (`is_error: true` when the call was denied). HTTP/1.1 by hand, one request per
//! connection (`Connection: close`).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// One scripted turn.
#[derive(Debug, Clone)]
pub(crate) struct Turn {
    /// Text the turn's prompt contains (how the turn is recognised).
    pub(crate) prompt: String,
    /// The shell command the model asks `Bash` to run; or `tool:NAME {json}`, another tool
    /// called with that input (`tool:AskUserQuestion {"questions": …}`).
    pub(crate) command: String,
    /// The final answer's first words, after the tool's result.
    pub(crate) answer: String,
}

/// The running fake; stops when dropped.
pub(crate) struct FakeAnthropic {
    /// `http://127.0.0.1:PORT`, for `ANTHROPIC_BASE_URL`.
    pub(crate) base_url: String,
    requests: Arc<Mutex<Vec<Value>>>,
    hold: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeAnthropic {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeAnthropic {
    pub(crate) async fn start(turns: Vec<Turn>) -> FakeAnthropic {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let turns = Arc::new(turns);
        let calls = Arc::new(AtomicUsize::new(0));
        let kept = requests.clone();
        let hold = Arc::new(AtomicBool::new(false));
        let held = hold.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (turns, kept, calls, held) =
                    (turns.clone(), kept.clone(), calls.clone(), held.clone());
                tokio::spawn(async move {
                    if let Err(e) = serve(stream, &turns, &kept, &calls, &held).await {
                        eprintln!("fake Anthropic API: {e}");
                    }
                });
            }
        });
        FakeAnthropic {
            base_url: format!("http://127.0.0.1:{port}"),
            requests,
            hold,
            task,
        }
    }

    /// While set, a request that carries a tool's result gets no answer (it waits).
    pub(crate) fn hold_after_results(&self, on: bool) {
        self.hold.store(on, Ordering::SeqCst);
    }

    /// Every `/v1/messages` request body received, in order.
    pub(crate) fn requests(&self) -> Vec<Value> {
        self.requests.lock().unwrap().clone()
    }
}

async fn serve(
    stream: TcpStream,
    turns: &[Turn],
    kept: &Mutex<Vec<Value>>,
    calls: &AtomicUsize,
    hold: &AtomicBool,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream);
    let mut request_line = String::new();
    reader.read_line(&mut request_line).await?;
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).await? == 0 || line == "\r\n" || line == "\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.trim().eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body).await?;
    let mut stream = reader.into_inner();
    let mut parts = request_line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    match (method, path) {
        ("POST", "/v1/messages/count_tokens") => {
            respond(&mut stream, "application/json", r#"{"input_tokens":10}"#).await
        }
        ("POST", "/v1/messages") => {
            let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            kept.lock().unwrap().push(request.clone());
            while hold.load(Ordering::SeqCst) && carries_a_result(&request) {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            let n = calls.fetch_add(1, Ordering::SeqCst);
            let reply = reply_to(&request, turns, n);
            if request["stream"].as_bool().unwrap_or(false) {
                respond(&mut stream, "text/event-stream", &sse(&request, &reply)).await
            } else {
                respond(
                    &mut stream,
                    "application/json",
                    &whole(&request, &reply).to_string(),
                )
                .await
            }
        }
        // Anything else Claude Code may ask (it should ask nothing else with the
        // non-essential traffic off): harmless.
        _ => respond(&mut stream, "application/json", "{}").await,
    }
}

async fn respond(stream: &mut TcpStream, content_type: &str, body: &str) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.flush().await?;
    stream.shutdown().await
}

#[derive(Debug, Clone, PartialEq)]
enum Reply {
    Tool {
        id: String,
        name: String,
        input: Value,
    },
    Text(String),
}

/// `$PLAN_FILE` in a scripted call replaced by the plan file Claude Code's plan mode names in
/// the request ("create your plan at PATH using the Write tool").
fn with_plan_file(step: &str, request: &Value) -> String {
    if !step.contains("$PLAN_FILE") {
        return step.to_owned();
    }
    let all = request.to_string();
    let marker = "create your plan at ";
    let path = all
        .find(marker)
        .map(|i| &all[i + marker.len()..])
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the request names the plan file (plan mode)");
    step.replace("$PLAN_FILE", path)
}

/// The tool call a turn's `command` asks for.
fn tool_call(command: &str) -> (String, Value) {
    match command
        .strip_prefix("tool:")
        .and_then(|rest| rest.split_once(' '))
    {
        Some((name, input)) => (
            name.to_owned(),
            serde_json::from_str(input).expect("a scripted tool input is JSON"),
        ),
        None => (
            "Bash".to_owned(),
            json!({"command": command, "description": "Run the scripted command"}),
        ),
    }
}

fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .map(|b| match &b["text"] {
                Value::String(t) => t.clone(),
                _ => text_of(&b["content"]),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// Whether any message of the request carries a tool's result.
fn carries_a_result(request: &Value) -> bool {
    request["messages"].as_array().is_some_and(|ms| {
        ms.iter().any(|m| {
            m["content"]
                .as_array()
                .is_some_and(|c| c.iter().any(|b| b["type"] == "tool_result"))
        })
    })
}

fn reply_to(request: &Value, turns: &[Turn], n: usize) -> Reply {
    let messages = request["messages"].as_array().cloned().unwrap_or_default();
    let offers_bash = request["tools"]
        .as_array()
        .is_some_and(|t| t.iter().any(|t| t["name"] == "Bash"));
    let all_text: String = messages
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| text_of(&m["content"]))
        .collect::<Vec<_>>()
        .join("\n");
    let Some(turn) = turns.iter().find(|t| all_text.contains(&t.prompt)) else {
        return Reply::Text("The fake model has no turn for this prompt.".into());
    };
    if !offers_bash {
        return Reply::Text("ok".into());
    }
    let result = messages.last().and_then(|m| {
        m["content"]
            .as_array()?
            .iter()
            .find(|b| b["type"] == "tool_result")
            .cloned()
    });
    // A turn of several calls (`command` lines joined by `\n---\n`): the next call once the
    // one before has its result.
    let steps: Vec<&str> = turn.command.split("\n---\n").collect();
    let done = messages
        .iter()
        .filter_map(|m| m["content"].as_array())
        .flatten()
        .filter(|b| b["type"] == "tool_result")
        .count();
    if steps.len() > 1 && result.is_some() && done < steps.len() {
        let (name, input) = tool_call(&with_plan_file(steps[done], request));
        return Reply::Tool {
            id: format!("toolu_fake_{n:04}"),
            name,
            input,
        };
    }
    match result {
        Some(r) => {
            let how = if r["is_error"] == true { "error" } else { "ok" };
            Reply::Text(format!(
                "{} [tool {how}: {}]",
                turn.answer,
                text_of(&r["content"]).trim()
            ))
        }
        // A resumed session that ran the call already: nothing to repeat.
        None if carries_a_result(request) => Reply::Text(format!("{} [resumed]", turn.answer)),
        None => {
            let (name, input) = tool_call(&with_plan_file(steps[0], request));
            Reply::Tool {
                id: format!("toolu_fake_{n:04}"),
                name,
                input,
            }
        }
    }
}

fn events(request: &Value, reply: &Reply) -> Vec<Value> {
    let model = request["model"].clone();
    let mut e = vec![json!({"type": "message_start", "message": {
        "id": "msg_fake", "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 10, "output_tokens": 1}}})];
    let stop = match reply {
        Reply::Tool { id, name, input } => {
            e.push(json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}));
            e.push(json!({"type": "content_block_delta", "index": 0, "delta": {
                "type": "input_json_delta", "partial_json": input.to_string()}}));
            "tool_use"
        }
        Reply::Text(text) => {
            e.push(json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "text", "text": ""}}));
            e.push(json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": text}}));
            "end_turn"
        }
    };
    e.push(json!({"type": "content_block_stop", "index": 0}));
    e.push(
        json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
                  "usage": {"output_tokens": 5}}),
    );
    e.push(json!({"type": "message_stop"}));
    e
}

fn sse(request: &Value, reply: &Reply) -> String {
    events(request, reply)
        .iter()
        .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap_or("")))
        .collect()
}

fn whole(request: &Value, reply: &Reply) -> Value {
    let (content, stop) = match reply {
        Reply::Tool { id, name, input } => (
            json!([{"type": "tool_use", "id": id, "name": name, "input": input}]),
            "tool_use",
        ),
        Reply::Text(t) => (json!([{"type": "text", "text": t}]), "end_turn"),
    };
    json!({"id": "msg_fake", "type": "message", "role": "assistant", "model": request["model"],
           "content": content, "stop_reason": stop, "stop_sequence": null,
           "usage": {"input_tokens": 10, "output_tokens": 5}})
}
