//! A stand-in ACP agent for tests: speaks JSON-RPC 2.0 over stdio as an ACP agent does,
//! driven by a scenario file, and records every line it receives.
//!
//! ```text
//! waymark-fake-acp --scenario FILE [--record FILE] [--gate FILE]
//! ```
//!
//! The scenario is `{"steps": [...]}`, run in order:
//!
//! * `{"expect": METHOD}` — read until a message with that method arrives (a request's id is
//!   remembered for `reply`);
//! * `{"reply": METHOD, "result": …}` / `{"reply": METHOD, "error": …}` — answer the last
//!   request of that method;
//! * `{"send": MESSAGE}` — write a message as it is;
//! * `{"expect_response": ID}` — read until the answer to our request `ID` has arrived (at
//!   once if it already has);
//! * `{"gate": true}` — wait until the `--gate` file exists (the test opens it);
//! * `{"exit": CODE}` — exit at once, as a crashing agent would.
//!
//! After the last step it reads (and records) until its stdin closes, then exits 0. A line
//! that is not JSON-RPC 2.0 (no `"jsonrpc": "2.0"`) makes it exit 2.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

struct Fake {
    lines: std::io::Lines<std::io::StdinLock<'static>>,
    record: Option<std::fs::File>,
    requests: HashMap<String, Value>,
    /// Ids of our requests the client has answered.
    answered: Vec<Value>,
}

impl Fake {
    /// The next message from the client; exits 0 on end of input.
    fn next(&mut self) -> Value {
        loop {
            let line = match self.lines.next() {
                Some(Ok(l)) => l,
                _ => std::process::exit(0),
            };
            if let Some(f) = &mut self.record {
                let _ = writeln!(f, "{line}");
                let _ = f.flush();
            }
            if line.trim().is_empty() {
                continue;
            }
            let msg: Value = serde_json::from_str(&line).unwrap_or_else(|e| {
                eprintln!("fake-acp: not JSON ({e}): {line}");
                std::process::exit(2)
            });
            if msg.get("jsonrpc") != Some(&json!("2.0")) {
                eprintln!("fake-acp: not JSON-RPC 2.0: {line}");
                std::process::exit(2)
            }
            match (msg.get("method").and_then(Value::as_str), msg.get("id")) {
                (Some(m), Some(id)) => {
                    self.requests.insert(m.to_owned(), id.clone());
                }
                (None, Some(id)) => self.answered.push(id.clone()),
                _ => {}
            }
            return msg;
        }
    }

    fn send(&self, msg: &Value) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{msg}");
        let _ = out.flush();
    }
}

fn arg(args: &[String], name: &str) -> Option<PathBuf> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(scenario) = arg(&args, "--scenario") else {
        eprintln!("usage: waymark-fake-acp --scenario FILE [--record FILE] [--gate FILE]");
        std::process::exit(64);
    };
    let text = std::fs::read_to_string(&scenario).unwrap_or_else(|e| {
        eprintln!("fake-acp: cannot read {}: {e}", scenario.display());
        std::process::exit(64)
    });
    let scenario: Value = serde_json::from_str(&text).unwrap_or_else(|e| {
        eprintln!("fake-acp: {} is not JSON: {e}", scenario.display());
        std::process::exit(64)
    });
    let record = arg(&args, "--record").map(|p| {
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(&p)
            .unwrap_or_else(|e| {
                eprintln!("fake-acp: cannot open {}: {e}", p.display());
                std::process::exit(64)
            })
    });
    let gate = arg(&args, "--gate");
    let mut fake = Fake {
        lines: std::io::stdin().lock().lines(),
        record,
        requests: HashMap::new(),
        answered: Vec::new(),
    };
    for step in scenario["steps"].as_array().cloned().unwrap_or_default() {
        if let Some(method) = step.get("expect").and_then(Value::as_str) {
            while fake.next().get("method").and_then(Value::as_str) != Some(method) {}
        } else if let Some(method) = step.get("reply").and_then(Value::as_str) {
            let Some(id) = fake.requests.get(method).cloned() else {
                eprintln!("fake-acp: no `{method}` request to reply to");
                std::process::exit(3)
            };
            let msg = match step.get("error") {
                Some(e) => json!({"jsonrpc": "2.0", "id": id, "error": e}),
                None => json!({"jsonrpc": "2.0", "id": id, "result": step["result"]}),
            };
            fake.send(&msg);
        } else if let Some(msg) = step.get("send") {
            fake.send(msg);
        } else if let Some(id) = step.get("expect_response") {
            while !fake.answered.contains(id) {
                fake.next();
            }
        } else if step.get("gate").is_some() {
            let Some(gate) = &gate else {
                eprintln!("fake-acp: a `gate` step needs `--gate FILE`");
                std::process::exit(64)
            };
            let deadline = Instant::now() + Duration::from_secs(60);
            while !gate.exists() {
                if Instant::now() > deadline {
                    eprintln!("fake-acp: the gate {} never opened", gate.display());
                    std::process::exit(4)
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        } else if let Some(code) = step.get("exit").and_then(Value::as_i64) {
            std::process::exit(code as i32);
        } else {
            eprintln!("fake-acp: unknown step {step}");
            std::process::exit(64)
        }
    }
    loop {
        fake.next();
    }
}
