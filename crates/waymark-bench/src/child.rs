//! Work the bench runs in a child process of its own (the same binary, a hidden subcommand):
//! thousands of SSE subscribers, so that their sockets and memory are not counted as the
//! server's (and each process stays within its open-file limit); and the companion's
//! catch-up, so that its peak resident memory (`VmHWM`) is the companion's alone.
//!
//! The parent writes the child's instructions as one JSON line to its stdin and reads its
//! answers as lines on its stdout: `ready` once set up, then one JSON result.

use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::sys;

/// Nanoseconds since the Unix epoch: the one clock parent and child share.
pub(crate) fn unix_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
}

/// Subscribers to `GET /v1/events`.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Subscribers {
    pub(crate) url: String,
    pub(crate) token: String,
    /// The cursor they subscribe after.
    pub(crate) after: i64,
    pub(crate) n: usize,
    /// Keep reading every event until stdin closes (a load to carry), instead of answering
    /// when each subscriber's first event arrived.
    pub(crate) drain: bool,
}

/// What the subscribers saw.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Seen {
    /// When each subscriber's first event arrived ([`unix_ns`]), unless draining.
    pub(crate) first: Vec<u128>,
    /// Events read in all.
    pub(crate) events: u64,
}

/// A companion catching up from cursor 0.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct CatchUp {
    pub(crate) url: String,
    /// A pairing code with the `view` scope.
    pub(crate) code: String,
    pub(crate) home: std::path::PathBuf,
}

/// How the companion's catch-up went.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct CaughtUp {
    pub(crate) events: u64,
    pub(crate) secs: f64,
    /// The child's peak resident memory, in bytes.
    pub(crate) peak_rss: u64,
}

/// A child process of the bench and its pipes.
pub(crate) struct Child {
    /// Killed when dropped.
    _proc: tokio::process::Child,
    stdin: Option<tokio::process::ChildStdin>,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl Child {
    /// Starts `waymark-bench <mode>` with `spec` on its stdin.
    pub(crate) async fn start(mode: &str, spec: &impl Serialize) -> Result<Child> {
        let mut proc = tokio::process::Command::new(std::env::current_exe()?)
            .arg(mode)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting the bench's child process")?;
        let mut stdin = proc.stdin.take().context("child stdin")?;
        stdin
            .write_all(format!("{}\n", serde_json::to_string(spec)?).as_bytes())
            .await?;
        stdin.flush().await?;
        let lines = BufReader::new(proc.stdout.take().context("child stdout")?).lines();
        Ok(Child {
            _proc: proc,
            stdin: Some(stdin),
            lines,
        })
    }

    /// The child's process id, while it runs.
    pub(crate) fn pid(&self) -> Option<u32> {
        self._proc.id()
    }

    /// The child's next line.
    pub(crate) async fn line(&mut self) -> Result<String> {
        self.lines
            .next_line()
            .await?
            .context("the bench's child process ended early")
    }

    /// Closes the child's stdin (a draining child then answers and ends).
    pub(crate) fn close(&mut self) {
        self.stdin = None;
    }
}

async fn spec<T: for<'de> Deserialize<'de>>()
-> Result<(T, tokio::io::Lines<BufReader<tokio::io::Stdin>>)> {
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let line = lines
        .next_line()
        .await?
        .context("no instructions on stdin")?;
    Ok((serde_json::from_str(&line)?, lines))
}

/// The child side of [`Subscribers`].
pub(crate) async fn subscribers() -> Result<()> {
    let (s, mut stdin): (Subscribers, _) = spec().await?;
    sys::raise_nofile(s.n as u64 + 256)?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()?;
    // Connected a few at a time: a burst of 10,000 connects overflows the listen backlog.
    let streams: Vec<_> = futures::stream::iter(0..s.n)
        .map(|_| {
            let http = http.clone();
            let url = format!("{}/v1/events?after={}", s.url, s.after);
            let token = s.token.clone();
            async move {
                let res = http.get(url).bearer_auth(token).send().await?;
                anyhow::ensure!(res.status().is_success(), "subscribing: {}", res.status());
                Ok::<_, anyhow::Error>(res.bytes_stream().eventsource())
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_>>()?;
    println!("ready");
    let events = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let readers: Vec<_> = streams
        .into_iter()
        .map(|mut stream| {
            let (drain, events) = (s.drain, events.clone());
            tokio::spawn(async move {
                let mut first = None;
                while let Some(ev) = stream.next().await {
                    ev?;
                    first.get_or_insert_with(unix_ns);
                    events.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if !drain {
                        break;
                    }
                }
                // Not draining: the stream stays open, unread, until the child ends.
                Ok::<_, anyhow::Error>((first, stream))
            })
        })
        .collect();
    let mut first = Vec::new();
    let mut held = Vec::new();
    if s.drain {
        // Until the parent closes stdin.
        while stdin.next_line().await?.is_some() {}
        for r in &readers {
            r.abort();
        }
    } else {
        for r in readers {
            let (at, stream) = tokio::time::timeout(Duration::from_secs(60), r)
                .await
                .context("a subscriber saw no event within 60 s")???;
            first.push(at.context("a stream ended before its first event")?);
            held.push(stream);
        }
    }
    let seen = Seen {
        first,
        events: events.load(std::sync::atomic::Ordering::Relaxed),
    };
    println!("{}", serde_json::to_string(&seen)?);
    // Connected, unread, until the parent closes stdin (or drops the child).
    while stdin.next_line().await?.is_some() {}
    drop(held);
    Ok(())
}

/// The child side of [`CatchUp`].
pub(crate) async fn catch_up() -> Result<()> {
    let (s, _): (CatchUp, _) = spec().await?;
    let c = waymark_companion::Companion::open_with_keystore(&s.home, "file-insecure").await?;
    c.pair(&s.url, &s.code, "bench").await?;
    c.mirror().set_meta("cursor", "0").await?;
    println!("ready");
    let start = Instant::now();
    let r = c.sync_once().await?;
    let secs = start.elapsed().as_secs_f64();
    let (_, peak_rss) = sys::rss("self")?;
    let done = CaughtUp {
        events: r.events as u64,
        secs,
        peak_rss,
    };
    println!("{}", serde_json::to_string(&done)?);
    Ok(())
}
