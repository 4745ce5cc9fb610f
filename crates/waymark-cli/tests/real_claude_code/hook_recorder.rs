//! A recording proxy between Claude Code's hooks and `waymark serve`: it forwards every HTTP
//! request as it came (method, path and query, bearer token, body) and answers with the
//! server's answer, and keeps each hook call as `{"t", "input", "status", "output"}` — what
//! Claude Code sent and what it was told. The test points the hooks at it, so the run is the
//! one a person gets; with `WAYMARK_RECORD_FIXTURES=DIR` the calls of each run are written to
//! `DIR/claude-code-<run>.jsonl` (how `waymark-server/tests/fixtures/claude-code/real-2.1.328/`
//! is recorded).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// The running proxy; stops when dropped.
pub(crate) struct HookRecorder {
    /// `http://127.0.0.1:PORT`, given to `install --server`.
    pub(crate) url: String,
    calls: Arc<Mutex<Vec<Value>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for HookRecorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl HookRecorder {
    pub(crate) async fn start(server: &str) -> HookRecorder {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let calls = Arc::new(Mutex::new(Vec::new()));
        let (kept, server) = (calls.clone(), server.to_owned());
        let started = Instant::now();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (kept, server) = (kept.clone(), server.clone());
                tokio::spawn(async move {
                    if let Err(e) = forward(stream, &server, &kept, started).await {
                        eprintln!("hook recorder: {e}");
                    }
                });
            }
        });
        HookRecorder { url, calls, task }
    }

    /// Writes the calls kept since the last `take` to `$WAYMARK_RECORD_FIXTURES/claude-code-<run>.jsonl`
    /// when the variable is set, and forgets them.
    pub(crate) fn take(&self, run: &str) -> Vec<Value> {
        let calls = std::mem::take(&mut *self.calls.lock().unwrap());
        if let Some(dir) = std::env::var_os("WAYMARK_RECORD_FIXTURES").filter(|d| !d.is_empty()) {
            let dir = PathBuf::from(dir);
            std::fs::create_dir_all(&dir).unwrap();
            let text: String = calls.iter().map(|c| format!("{c}\n")).collect();
            std::fs::write(dir.join(format!("claude-code-{run}.jsonl")), text).unwrap();
        }
        calls
    }
}

async fn forward(
    stream: TcpStream,
    server: &str,
    kept: &Mutex<Vec<Value>>,
    started: Instant,
) -> Result<(), String> {
    let mut reader = BufReader::new(stream);
    let mut request_line = String::new();
    reader
        .read_line(&mut request_line)
        .await
        .map_err(|e| e.to_string())?;
    let (mut length, mut auth, mut content_type, mut entrypoint) = (0usize, None, None, None);
    loop {
        let mut line = String::new();
        if reader
            .read_line(&mut line)
            .await
            .map_err(|e| e.to_string())?
            == 0
            || line == "\r\n"
            || line == "\n"
        {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            let value = value.trim().to_owned();
            match name.trim().to_ascii_lowercase().as_str() {
                "content-length" => length = value.parse().unwrap_or(0),
                "authorization" => auth = Some(value),
                "content-type" => content_type = Some(value),
                // Claude Code's own entrypoint, as the installed hook sends it.
                "x-claude-code-entrypoint" => entrypoint = Some(value),
                _ => {}
            }
        }
    }
    let mut body = vec![0u8; length];
    reader
        .read_exact(&mut body)
        .await
        .map_err(|e| e.to_string())?;
    let mut stream = reader.into_inner();
    let mut parts = request_line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or("GET"), parts.next().unwrap_or("/"));
    let method = reqwest::Method::from_bytes(method.as_bytes()).map_err(|e| e.to_string())?;
    let mut req = reqwest::Client::new().request(method, format!("{server}{target}"));
    if let Some(a) = auth {
        req = req.header("authorization", a);
    }
    if let Some(c) = content_type {
        req = req.header("content-type", c);
    }
    if let Some(e) = &entrypoint {
        req = req.header("x-claude-code-entrypoint", e);
    }
    let res = req
        .body(body.clone())
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = res.status();
    let answer_type = res
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_owned();
    let answer = res.bytes().await.map_err(|e| e.to_string())?;
    if target.contains("/adapters/claude-code/hook") {
        let parse = |b: &[u8]| {
            serde_json::from_slice::<Value>(b).unwrap_or_else(|_| json!(String::from_utf8_lossy(b)))
        };
        let t = (started.elapsed().as_millis() as f64) / 1000.0;
        kept.lock().unwrap().push(json!({
            "t": t,
            "input": parse(&body),
            "status": status.as_u16(),
            "output": parse(&answer),
            "entrypoint": entrypoint,
        }));
    }
    let head = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: {answer_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        answer.len()
    );
    stream
        .write_all(head.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    stream.write_all(&answer).await.map_err(|e| e.to_string())?;
    stream.flush().await.map_err(|e| e.to_string())?;
    let _ = stream.shutdown().await;
    Ok(())
}
