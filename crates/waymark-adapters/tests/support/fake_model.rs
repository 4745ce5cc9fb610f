//! A fake model API for running a real agent runtime without a real model: OpenAI chat
//! completions (`POST /v1/chat/completions`, streamed as server-sent events, what OpenClaw's
//! `api: "openai-completions"` speaks; `GET /v1/models` lists the one model). It plays a
//! script of turns: in the turn whose prompt a user message carries, it first asks for the
//! `exec` tool to run the turn's shell command, and once a tool result follows that prompt, it
//! answers with the turn's final text. Every request body is kept for the test to read.
//!
//! Shapes as OpenClaw 2026.9.6 was seen to send them: `stream: true` with
//! `stream_options.include_usage`, the tool result as a `tool` message, and after it a `user`
//! message of OpenClaw's own internal context (not a prompt). HTTP/1.1 by hand, one request
//! per connection (`Connection: close`), so the test needs no HTTP server crate.
//!
//! Other runtimes name their shell tool otherwise: [`FakeModel::start_with`] takes a
//! [`Shape`] ([`Shape::BASH`] for OpenCode 1.18 and GitHub Copilot CLI 1.0, whose tool is `bash`
//! with `command` and `description`). Such runtimes also ask the model for a session title in a
//! request that offers no tools; with [`Shape::answer_toolless`] that request gets a title, not a
//! tool call.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// The model id served; configure the runtime with it.
pub const MODEL: &str = "fake-model";

/// One scripted turn.
#[derive(Debug, Clone)]
pub struct Turn {
    /// Text the turn's prompt contains (how the turn is recognised).
    pub prompt: String,
    /// The shell command the model asks `exec` to run.
    pub command: String,
    /// The final answer after the tool's result.
    pub answer: String,
}

/// How the model asks for the shell command, and what it does with requests that offer no tools.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// The tool the model calls.
    pub tool: &'static str,
    /// The call's arguments for a command.
    pub args: fn(&str) -> Value,
    /// Answer a request without `tools` (e.g. a title generator) with [`TITLE`].
    pub answer_toolless: bool,
}

/// What a request without tools is answered when [`Shape::answer_toolless`] is set.
pub const TITLE: &str = "Waymark test session";

impl Shape {
    /// OpenClaw's `exec` tool, `{command}` (what [`FakeModel::start`] plays).
    pub const EXEC: Shape = Shape {
        tool: "exec",
        args: exec_args,
        answer_toolless: false,
    };
    /// Hermes Agent 0.19's shell tool `terminal`, `{command}`; its title and other auxiliary
    /// requests offer no tools and get a plain answer.
    pub const TERMINAL: Shape = Shape {
        tool: "terminal",
        args: exec_args,
        answer_toolless: true,
    };
    /// A `bash` tool with `{command, description}` (OpenCode 1.18, Copilot CLI 1.0), and a title
    /// for tool-less requests.
    pub const BASH: Shape = Shape {
        tool: "bash",
        args: bash_args,
        answer_toolless: true,
    };
}

fn exec_args(command: &str) -> Value {
    json!({"command": command})
}

/// The `description` of every [`Shape::BASH`] call.
pub const BASH_DESCRIPTION: &str = "Create the file the user asked for";

fn bash_args(command: &str) -> Value {
    // The description is what Copilot shows as the call's title: it does not repeat the command.
    json!({"command": command, "description": BASH_DESCRIPTION})
}

/// The running fake; stops when dropped.
pub struct FakeModel {
    /// `http://127.0.0.1:PORT/v1`, the provider's `baseUrl`.
    pub base_url: String,
    requests: Arc<Mutex<Vec<Value>>>,
    gemini: Arc<Gemini>,
    task: tokio::task::JoinHandle<()>,
}

/// What a test steers and counts of the Gemini API side: how many `run_shell_command` calls
/// the model asked for, and whether answers after a tool's result are held back (so a run can
/// be cut off after a confirmed call, before its turn ends).
#[derive(Debug, Default)]
struct Gemini {
    calls: AtomicUsize,
    hold: AtomicBool,
}

impl Drop for FakeModel {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeModel {
    pub async fn start(turns: Vec<Turn>) -> FakeModel {
        FakeModel::start_with(turns, Shape::EXEC).await
    }

    /// Like [`FakeModel::start`], with the tool and habits of another runtime.
    pub async fn start_with(turns: Vec<Turn>, shape: Shape) -> FakeModel {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let turns = Arc::new(turns);
        let kept = requests.clone();
        let gemini = Arc::new(Gemini::default());
        let ctl = gemini.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (turns, kept, ctl) = (turns.clone(), kept.clone(), ctl.clone());
                tokio::spawn(async move {
                    if let Err(e) = serve(stream, &turns, &kept, shape, &ctl).await {
                        eprintln!("fake model: {e}");
                    }
                });
            }
        });
        FakeModel {
            base_url: format!("http://127.0.0.1:{port}/v1"),
            requests,
            gemini,
            task,
        }
    }

    /// Every chat-completions request body received, in order.
    pub fn requests(&self) -> Vec<Value> {
        self.requests.lock().unwrap().clone()
    }

    /// How many shell calls the model asked for so far, on either side (a call the model was
    /// told is done, and not asked again, shows here).
    pub fn gemini_calls(&self) -> usize {
        self.gemini.calls.load(Ordering::SeqCst)
    }

    /// While on, a request that carries a tool's result gets no final answer (the run is held
    /// after a confirmed call, before its turn ends).
    pub fn hold_after_results(&self, on: bool) {
        self.gemini.hold.store(on, Ordering::SeqCst);
    }
}

/// One HTTP/1.1 request: method, path (without the query), body, and the stream to answer on.
pub async fn read_request(
    stream: TcpStream,
) -> std::io::Result<(String, String, Vec<u8>, TcpStream)> {
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
    let stream = reader.into_inner();
    let mut parts = request_line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    Ok((method.to_owned(), path.to_owned(), body, stream))
}

async fn serve(
    stream: TcpStream,
    turns: &[Turn],
    kept: &Mutex<Vec<Value>>,
    shape: Shape,
    gemini: &Gemini,
) -> std::io::Result<()> {
    let (method, path, body, mut stream) = read_request(stream).await?;
    let (method, path) = (method.as_str(), path.as_str());
    match (method, path) {
        ("GET", p) if p.ends_with("/models") => {
            let list = json!({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "waymark-tests"}]});
            respond(&mut stream, "200 OK", "application/json", &list.to_string()).await
        }
        ("POST", p) if p.ends_with("/chat/completions") => {
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
            kept.lock().unwrap().push(request.clone());
            let offers_tools = request["tools"].as_array().is_some_and(|t| !t.is_empty());
            let reply = if shape.answer_toolless && !offers_tools {
                Reply::Answer(TITLE.into())
            } else {
                reply_to(&request, turns, shape)
            };
            if matches!(reply, Reply::Answer(_))
                && offers_tools
                && request["messages"]
                    .as_array()
                    .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"))
            {
                while gemini.hold.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            if let Reply::Exec { .. } = reply {
                gemini.calls.fetch_add(1, Ordering::SeqCst);
            }
            if request["stream"].as_bool().unwrap_or(false) {
                respond(&mut stream, "200 OK", "text/event-stream", &sse(&reply)).await
            } else {
                respond(
                    &mut stream,
                    "200 OK",
                    "application/json",
                    &whole(&reply).to_string(),
                )
                .await
            }
        }
        ("POST", p) if p.contains(":streamGenerateContent") || p.contains(":generateContent") => {
            let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            kept.lock().unwrap().push(request.clone());
            let reply = gemini_reply(&request, turns);
            let part = &reply["candidates"][0]["content"]["parts"][0];
            if part.get("functionCall").is_some() {
                gemini.calls.fetch_add(1, Ordering::SeqCst);
            } else if carries_function_response(&request) {
                while gemini.hold.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            if p.contains(":stream") {
                let body = format!("data: {reply}\r\n\r\n");
                respond(&mut stream, "200 OK", "text/event-stream", &body).await
            } else {
                respond(
                    &mut stream,
                    "200 OK",
                    "application/json",
                    &reply.to_string(),
                )
                .await
            }
        }
        _ => {
            let problem =
                json!({"error": {"message": format!("the fake model serves no {method} {path}")}});
            respond(
                &mut stream,
                "404 Not Found",
                "application/json",
                &problem.to_string(),
            )
            .await
        }
    }
}

/// Answers with `body` and closes the connection.
pub async fn respond(
    stream: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &str,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.flush().await?;
    stream.shutdown().await
}

/// What the model says next.
#[derive(Debug, Clone, PartialEq)]
enum Reply {
    /// Call the shell tool (`exec` unless the [`Shape`] says otherwise) with these arguments.
    Exec {
        call_id: String,
        tool: &'static str,
        args: Value,
    },
    /// Say this and stop.
    Answer(String),
}

/// The turn is the one whose prompt the latest prompt (a user message that is not OpenClaw's
/// internal context) carries; a `tool` message after that prompt means the tool has answered.
fn reply_to(request: &Value, turns: &[Turn], shape: Shape) -> Reply {
    let messages = request["messages"].as_array().cloned().unwrap_or_default();
    let text = |m: &Value| match &m["content"] {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let is_prompt =
        |m: &Value| m["role"] == "user" && !text(m).contains("OPENCLAW_INTERNAL_CONTEXT");
    if !messages.iter().any(is_prompt) {
        return Reply::Answer("There is no prompt to answer.".into());
    }
    // The newest prompt of a scripted turn: a later user message that is none (a resume note,
    // a follow-up) continues the turn it came after.
    let found = messages.iter().enumerate().rev().find_map(|(at, m)| {
        let prompt = text(m);
        is_prompt(m)
            .then(|| {
                turns
                    .iter()
                    .enumerate()
                    .find(|(_, t)| prompt.contains(&t.prompt))
            })
            .flatten()
            .map(|(index, turn)| (at, index, turn))
    });
    let Some((at, index, turn)) = found else {
        return Reply::Answer("The fake model has no turn for this prompt.".into());
    };
    if messages[at..].iter().any(|m| m["role"] == "tool") {
        Reply::Answer(turn.answer.clone())
    } else {
        Reply::Exec {
            call_id: format!("call_{index}_{at}"),
            tool: shape.tool,
            args: (shape.args)(&turn.command),
        }
    }
}

fn chunk(delta: Value, finish: Option<&str>) -> Value {
    json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
}

/// The reply as a stream: the tool call's name, then its arguments, then the finish, then
/// usage, then `[DONE]` (as OpenAI streams them).
fn sse(reply: &Reply) -> String {
    let chunks = match reply {
        Reply::Exec {
            call_id,
            tool,
            args,
        } => vec![
            chunk(
                json!({"role": "assistant", "content": null, "tool_calls": [{"index": 0, "id": call_id, "type": "function", "function": {"name": tool, "arguments": ""}}]}),
                None,
            ),
            chunk(
                json!({"tool_calls": [{"index": 0, "function": {"arguments": args.to_string()}}]}),
                None,
            ),
            chunk(json!({}), Some("tool_calls")),
        ],
        Reply::Answer(text) => vec![
            chunk(json!({"role": "assistant", "content": text}), None),
            chunk(json!({}), Some("stop")),
        ],
    };
    let usage = json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
                       "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}});
    let mut out = String::new();
    for c in chunks.iter().chain([&usage]) {
        out.push_str(&format!("data: {c}\n\n"));
    }
    out.push_str("data: [DONE]\n\n");
    out
}

/// The reply as one JSON body (a request without `stream`).
fn whole(reply: &Reply) -> Value {
    let (message, finish) = match reply {
        Reply::Exec {
            call_id,
            tool,
            args,
        } => (
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": call_id, "type": "function", "function": {"name": tool, "arguments": args.to_string()}}]}),
            "tool_calls",
        ),
        Reply::Answer(text) => (json!({"role": "assistant", "content": text}), "stop"),
    };
    json!({"id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": MODEL,
           "choices": [{"index": 0, "message": message, "finish_reason": finish}],
           "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}})
}

/// The Gemini API (`generativelanguage` v1beta, what Gemini CLI 0.61 sends to
/// `GOOGLE_GEMINI_BASE_URL`: `POST /v1beta/models/{model}:streamGenerateContent?alt=sse` for the
/// turn, `:generateContent` for its side questions). The turn is the one whose prompt the
/// latest user text carries; a `functionResponse` after it means the tool answered. With tools
/// offered it asks `run_shell_command` to run the turn's command, else (or once answered) it
/// says the turn's answer. Use `FakeModel::start` and give Gemini CLI the URL without `/v1`.
fn gemini_reply(request: &Value, turns: &[Turn]) -> Value {
    let contents = request["contents"].as_array().cloned().unwrap_or_default();
    let texts = |c: &Value| -> String {
        c["parts"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n")
    };
    let found = contents.iter().enumerate().rev().find_map(|(at, c)| {
        let text = texts(c);
        (c["role"] == "user")
            .then(|| turns.iter().find(|t| text.contains(&t.prompt)))
            .flatten()
            .map(|t| (at, t))
    });
    let answered = |at: usize| {
        contents[at..].iter().any(|c| {
            c["parts"]
                .as_array()
                .is_some_and(|ps| ps.iter().any(|p| p.get("functionResponse").is_some()))
        })
    };
    let part = match found {
        Some((at, turn)) if offers_gemini_tools(request) && !answered(at) => json!({
            "functionCall": {"name": "run_shell_command",
                             "args": {"command": turn.command, "description": "run the command"}}
        }),
        Some((_, turn)) => json!({"text": turn.answer}),
        None => json!({"text": "The fake model has no turn for this prompt."}),
    };
    json!({
        "candidates": [{"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15},
        "modelVersion": MODEL,
    })
}

/// The user texts of a request the fake was sent, in order: a chat-completions request's `user`
/// messages, or a Gemini API request's `user` contents.
pub fn user_texts(request: &Value) -> Vec<String> {
    if let Some(contents) = request["contents"].as_array() {
        return contents
            .iter()
            .filter(|c| c["role"] == "user")
            .map(|c| {
                c["parts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|p| p["text"].as_str())
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .filter(|t| !t.is_empty())
            .collect();
    }
    request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "user")
        .map(|m| match &m["content"] {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .collect()
}

/// Whether a request the fake was sent carries a tool's result (a `tool` message, or a Gemini
/// `functionResponse`).
pub fn carries_result(request: &Value) -> bool {
    carries_function_response(request)
        || request["messages"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"))
}

fn carries_function_response(request: &Value) -> bool {
    request["contents"].as_array().is_some_and(|cs| {
        cs.iter().any(|c| {
            c["parts"]
                .as_array()
                .is_some_and(|ps| ps.iter().any(|p| p.get("functionResponse").is_some()))
        })
    })
}

fn offers_gemini_tools(request: &Value) -> bool {
    request["tools"].as_array().is_some_and(|t| !t.is_empty())
}
