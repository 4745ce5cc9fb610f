//! `waymark-record-stdio --out FILE -- CMD ARG…`: runs a runtime that speaks JSON lines over
//! stdio (`codex app-server`, an ACP agent) between its client and itself, and appends every
//! line that crosses, in the order it crossed, to FILE as
//! `{"t": SECONDS, "dir": "in" | "out", "message": PARSED}` (`in`: client → runtime). The real
//! runtimes' tests put it in front of the runtime when `WAYMARK_RECORD_FIXTURES` is set; the
//! fake peers' fixtures are converted from what it wrote (`waymark-fake-codex --convert`).
//!
//! Unlike a shell pipeline through `tee`, it holds no end of the client's pipes once the
//! runtime is gone: when the runtime's stdout closes (it exited or was killed) it exits with
//! the runtime's status, so the client sees the end at once. When the client closes its end,
//! the runtime's stdin is closed.

use std::io::Write;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use clap::Parser;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

#[derive(Parser)]
#[command(about = "Runs a JSON-lines stdio runtime and records every line both ways, for tests")]
struct Args {
    /// Where the lines are appended.
    #[arg(long, value_name = "PATH")]
    out: PathBuf,
    /// The runtime's command and arguments.
    #[arg(trailing_var_arg = true, required = true)]
    command: Vec<String>,
}

struct Recorder {
    file: std::fs::File,
    started: Instant,
}

impl Recorder {
    fn line(&mut self, dir: &str, line: &str) {
        let message: Value = serde_json::from_str(line).unwrap_or_else(|_| json!(line));
        let t = (self.started.elapsed().as_millis() as f64) / 1000.0;
        let mut entry = json!({"t": t, "dir": dir, "message": message}).to_string();
        entry.push('\n');
        // One write per entry, so a reader never sees half of one.
        let _ = self
            .file
            .write_all(entry.as_bytes())
            .and_then(|()| self.file.flush());
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = Args::parse();
    let file = match std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.out)
    {
        Ok(f) => f,
        Err(e) => {
            eprintln!("waymark-record-stdio: {}: {e}", args.out.display());
            std::process::exit(3);
        }
    };
    let recorder = Arc::new(Mutex::new(Recorder {
        file,
        started: Instant::now(),
    }));
    let mut child = match tokio::process::Command::new(&args.command[0])
        .args(&args.command[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "waymark-record-stdio: cannot start `{}`: {e}",
                args.command[0]
            );
            std::process::exit(3);
        }
    };
    let (Some(mut to_child), Some(from_child)) = (child.stdin.take(), child.stdout.take()) else {
        std::process::exit(3);
    };
    let inbound = recorder.clone();
    tokio::spawn(async move {
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            inbound.lock().unwrap().line("in", &line);
            let mut bytes = line.into_bytes();
            bytes.push(b'\n');
            if to_child.write_all(&bytes).await.is_err() || to_child.flush().await.is_err() {
                break;
            }
        }
        // The client closed its end: so does the runtime's stdin (dropped here).
    });
    let mut out = tokio::io::stdout();
    let mut lines = BufReader::new(from_child).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        recorder.lock().unwrap().line("out", &line);
        let mut bytes = line.into_bytes();
        bytes.push(b'\n');
        if out.write_all(&bytes).await.is_err() || out.flush().await.is_err() {
            break;
        }
    }
    let code = match child.wait().await {
        Ok(status) => status.code().unwrap_or(1),
        Err(_) => 1,
    };
    // Exit at once: the stdin reader may be blocked in a read the runtime will never answer.
    std::process::exit(code);
}
