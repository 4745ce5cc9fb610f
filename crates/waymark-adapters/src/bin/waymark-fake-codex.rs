//! `waymark-fake-codex`: plays `codex app-server` over real stdio for the Codex adapter's
//! tests. It follows a scenario (JSONL steps: lines to send, client messages to expect and
//! answer, files to wait for, an exit) and records every line it receives, so a test can
//! assert exactly what the Codex side was sent.
//!
//! Steps, one JSON object a line:
//! * `{"send": MESSAGE}` — write MESSAGE as one line;
//! * `{"expect": METHOD, "reply": RESULT}` / `{"expect": METHOD, "error": ERROR}` — wait for a
//!   client message with that method and answer it (no `reply`/`error`: just wait);
//! * `{"expect_answer": ID}` — wait for the client's answer to our request ID;
//! * `{"wait_file": NAME}` — wait until NAME exists beside the record file (a test's signal);
//! * `{"exit": CODE}` — exit at once, as a crash would;
//! * `{"note": TEXT}` — nothing.
//!
//! `--convert RECORDING` prints instead the scenario that replays a real app-server's run as
//! `waymark-record-stdio` recorded it (see [`convert`]).
//!
//! After the last step it reads until its stdin closes. Messages that arrive before a step
//! wants them are kept for later steps, up to [`MAX_KEPT`]: past that the scenario does not
//! match what the client sends, and the fake fails saying so (exit 3). Lines are read only as
//! fast as the steps take them (a bounded inbox), so a client that writes faster than the
//! scenario moves is held back by the pipe, as a real app-server holds it back. Each start takes the next `--scenario` (the count is
//! kept in `RECORD.runs`; the last scenario repeats), and every received line is appended to
//! the record as `{"run": N, "line": RAW, "message": PARSED}`.

use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

/// Client messages waiting between the stdin reader and the steps.
const INBOX: usize = 256;

/// Messages kept for later steps, at most.
const MAX_KEPT: usize = 1024;

#[derive(Parser)]
#[command(about = "Plays `codex app-server` from a scenario file, for tests")]
struct Args {
    /// Scenario of each start, in order; the last one repeats.
    #[arg(
        long = "scenario",
        value_name = "PATH",
        required_unless_present = "convert"
    )]
    scenarios: Vec<PathBuf>,
    /// Where every received line is appended.
    #[arg(long, value_name = "PATH", required_unless_present = "convert")]
    record: Option<PathBuf>,
    /// Print the scenario that replays this recording (`waymark-record-stdio`'s output) and
    /// exit.
    #[arg(long, value_name = "RECORDING", conflicts_with = "scenarios")]
    convert: Option<PathBuf>,
    /// How long one step may wait.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    step_timeout: u64,
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = Args::parse();
    if let Some(recording) = &args.convert {
        let code = match std::fs::read_to_string(recording) {
            Ok(text) => match convert(&text) {
                Ok(steps) => {
                    for s in steps {
                        println!("{s}");
                    }
                    0
                }
                Err(e) => {
                    eprintln!("waymark-fake-codex: {}: {e}", recording.display());
                    3
                }
            },
            Err(e) => {
                eprintln!("waymark-fake-codex: {}: {e}", recording.display());
                3
            }
        };
        std::process::exit(code);
    }
    let code = match play(&args).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("waymark-fake-codex: {e}");
            3
        }
    };
    // Exit at once: a runtime shut down normally would wait for the blocking stdin read.
    std::process::exit(code);
}

/// Which start this is (0 for the first), counted beside the record.
fn next_run(record: &Path) -> Result<usize, String> {
    let counter = record.with_extension("runs");
    let n: usize = std::fs::read_to_string(&counter)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    std::fs::write(&counter, (n + 1).to_string())
        .map_err(|e| format!("{}: {e}", counter.display()))?;
    Ok(n)
}

/// The scenario that replays a recorded run (`{"t", "dir": "in" | "out", "message"}` lines in
/// the order they crossed): each client request becomes an `expect` answered with what the
/// app-server answered it (its response, found by id), each client notification an `expect`,
/// each client answer to an app-server request an `expect_answer`, and everything else the
/// app-server wrote a `send`, in place. The first step notes where it came from.
fn convert(text: &str) -> Result<Vec<Value>, String> {
    let lines: Vec<Value> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| serde_json::from_str(l).map_err(|e| format!("line {}: {e}", i + 1)))
        .collect::<Result<_, _>>()?;
    let is_response = |m: &Value| m.get("method").is_none() && m.get("id").is_some();
    let mut steps = vec![
        json!({"note": "Converted by `waymark-fake-codex --convert` from a real `codex app-server` run recorded by `waymark-record-stdio` (`WAYMARK_RECORD_FIXTURES`); see docs/adapters/codex.md."}),
    ];
    for entry in &lines {
        let m = &entry["message"];
        match entry["dir"].as_str() {
            Some("in") if is_response(m) => steps.push(json!({"expect_answer": m["id"]})),
            Some("in") => {
                let method = m["method"]
                    .as_str()
                    .ok_or("a client message without a method")?;
                let mut step = json!({"expect": method});
                if let Some(id) = m.get("id") {
                    let answer = lines.iter().find(|e| {
                        e["dir"] == "out" && is_response(&e["message"]) && e["message"]["id"] == *id
                    });
                    match answer.map(|e| &e["message"]) {
                        Some(a) if a.get("error").is_some() => step["error"] = a["error"].clone(),
                        Some(a) => step["reply"] = a["result"].clone(),
                        // Never answered (the app-server died first): the step only waits.
                        None => {}
                    }
                }
                steps.push(step);
            }
            Some("out") if is_response(m) => {}
            Some("out") => steps.push(json!({"send": m})),
            other => return Err(format!("a line with `dir` {other:?}")),
        }
    }
    Ok(steps)
}

async fn play(args: &Args) -> Result<i32, String> {
    let record_path = args.record.as_deref().ok_or("`--record` is required")?;
    let run = next_run(record_path)?;
    let scenario = &args.scenarios[run.min(args.scenarios.len() - 1)];
    let text =
        std::fs::read_to_string(scenario).map_err(|e| format!("{}: {e}", scenario.display()))?;
    let steps: Vec<Value> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l)
                .map_err(|e| format!("{} step {}: {e}", scenario.display(), i + 1))
        })
        .collect::<Result<_, _>>()?;

    let mut record = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(record_path)
        .map_err(|e| format!("{}: {e}", record_path.display()))?;
    let (tx, inbox) = mpsc::channel(INBOX);
    tokio::spawn(async move {
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let message: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
            let mut entry = json!({"run": run, "line": line, "message": message}).to_string();
            entry.push('\n');
            // One write per entry, so a reader never sees half of one.
            if record
                .write_all(entry.as_bytes())
                .and_then(|()| record.flush())
                .is_err()
            {
                break;
            }
            if tx.send(message).await.is_err() {
                break;
            }
        }
    });
    let mut player = Player {
        inbox,
        backlog: VecDeque::new(),
        out: tokio::io::stdout(),
        dir: record_path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default(),
        timeout: Duration::from_secs(args.step_timeout),
    };
    for (i, step) in steps.iter().enumerate() {
        if let Some(code) = player
            .step(step)
            .await
            .map_err(|e| format!("{} step {}: {e}", scenario.display(), i + 1))?
        {
            return Ok(code);
        }
    }
    // Stay until the client goes away.
    while player.inbox.recv().await.is_some() {}
    Ok(0)
}

struct Player {
    inbox: mpsc::Receiver<Value>,
    backlog: VecDeque<Value>,
    out: tokio::io::Stdout,
    dir: PathBuf,
    timeout: Duration,
}

impl Player {
    /// Runs one step; `Some(code)` ends the process.
    async fn step(&mut self, step: &Value) -> Result<Option<i32>, String> {
        if let Some(msg) = step.get("send") {
            self.send(msg).await?;
        } else if let Some(method) = step.get("expect").and_then(Value::as_str) {
            let got = self
                .take(|m| m.get("method").and_then(Value::as_str) == Some(method))
                .await
                .map_err(|e| format!("expecting `{method}`: {e}"))?;
            if let Some(id) = got.get("id").filter(|id| !id.is_null()) {
                if let Some(result) = step.get("reply") {
                    self.send(&json!({"id": id, "result": result})).await?;
                } else if let Some(error) = step.get("error") {
                    self.send(&json!({"id": id, "error": error})).await?;
                }
            }
        } else if let Some(id) = step.get("expect_answer") {
            self.take(|m| m.get("method").is_none() && m.get("id") == Some(id))
                .await
                .map_err(|e| format!("expecting the answer to request {id}: {e}"))?;
        } else if let Some(name) = step.get("wait_file").and_then(Value::as_str) {
            let path = self.dir.join(name);
            let deadline = tokio::time::Instant::now() + self.timeout;
            while !path.exists() {
                if tokio::time::Instant::now() > deadline {
                    return Err(format!("{} did not appear", path.display()));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        } else if let Some(code) = step.get("exit").and_then(Value::as_u64) {
            return Ok(Some(i32::try_from(code).unwrap_or(1)));
        } else if step.get("note").is_none() {
            return Err(format!("unknown step {step}"));
        }
        Ok(None)
    }

    async fn send(&mut self, msg: &Value) -> Result<(), String> {
        let mut line = msg.to_string();
        line.push('\n');
        self.out
            .write_all(line.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        self.out.flush().await.map_err(|e| e.to_string())
    }

    /// The first message (kept earlier, or arriving before the timeout) that `want` accepts.
    async fn take(&mut self, want: impl Fn(&Value) -> bool) -> Result<Value, String> {
        if let Some(pos) = self.backlog.iter().position(&want) {
            return Ok(self.backlog.remove(pos).unwrap_or_default());
        }
        let deadline = tokio::time::Instant::now() + self.timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.inbox.recv()).await {
                Err(_) => return Err("timed out".into()),
                Ok(None) => return Err("the client closed the connection".into()),
                Ok(Some(m)) if want(&m) => return Ok(m),
                Ok(Some(_)) if self.backlog.len() >= MAX_KEPT => {
                    return Err(format!(
                        "more than {MAX_KEPT} messages arrived that no step wanted; the scenario does not match what the client sends"
                    ));
                }
                Ok(Some(m)) => self.backlog.push_back(m),
            }
        }
    }
}
