//! The agent as a child process: its stdout and stdin carry the JSON-RPC connection, its
//! stderr goes to the log, and closing the connection closes its stdin so it can exit on its
//! own before it is killed.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::jsonrpc::{Dialect, Incoming, Peer};

/// How long an agent whose stdin closed may take to exit before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(3);

/// A running agent.
#[derive(Debug)]
pub(crate) struct Agent {
    child: Child,
    close: CancellationToken,
    pump: JoinHandle<()>,
}

impl Agent {
    /// Runs `command` with `sh -c` in `cwd` and speaks ACP with it over stdio.
    pub(crate) fn spawn(
        command: &str,
        cwd: &Path,
    ) -> std::io::Result<(Agent, Peer, mpsc::Receiver<Incoming>)> {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(command)
            .current_dir(cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdin = child.stdin.take().expect("stdin is piped");
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tracing::info!(target: "waymark_adapters::acp::agent", "{line}");
            }
        });
        // The peer writes into a pipe of ours that a pump copies to the agent's stdin, so the
        // stdin can be closed (EOF for the agent) while the peer still exists.
        let (ours, theirs) = tokio::io::duplex(64 * 1024);
        let close = CancellationToken::new();
        let pump = tokio::spawn(pump(theirs, stdin, close.clone()));
        let (peer, incoming) = Peer::start(stdout, ours, Dialect::Standard);
        Ok((Agent { child, close, pump }, peer, incoming))
    }

    /// Closes the agent's stdin after what was written reached it, waits a little for it to
    /// exit, and kills it if it does not. Returns its exit status when known.
    pub(crate) async fn close(mut self) -> Option<std::process::ExitStatus> {
        self.close.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(1), &mut self.pump).await;
        match tokio::time::timeout(EXIT_GRACE, self.child.wait()).await {
            Ok(Ok(status)) => Some(status),
            _ => {
                tracing::info!("the agent did not exit after its stdin closed; killing it");
                let _ = self.child.kill().await;
                self.child.try_wait().ok().flatten()
            }
        }
    }
}

/// Copies what the peer writes to the agent's stdin until told to close, then drains what is
/// already written and drops the stdin.
async fn pump(mut from: tokio::io::DuplexStream, mut stdin: ChildStdin, close: CancellationToken) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            () = close.cancelled() => break,
        };
        if stdin.write_all(&buf[..n]).await.is_err() || stdin.flush().await.is_err() {
            return;
        }
    }
    // Whatever the peer wrote before the close is already in the pipe.
    while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_millis(20), from.read(&mut buf)).await
    {
        if n == 0 || stdin.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = stdin.flush().await;
    let _ = stdin.shutdown().await;
}
