//! The OpenClaw adapter: an operator client of the OpenClaw gateway (WebSocket, protocol v4),
//! so that OpenClaw's sessions, tool calls and exec approvals show up as tasks, effects and
//! decisions, and a person's answer or steer goes back as `exec.approval.resolve`,
//! `sessions.steer` or `sessions.abort` (`docs/adapters/openclaw.md`).
//!
//! Exec approvals are `connection_bound`: the gateway holds them only while an approver
//! client is connected and times them out itself. The adapter keeps its decisions open across
//! a dropped connection (the gateway still holds them), reconnects with jittered backoff,
//! backfills from `exec.approval.list`, and re-sends answers the gateway has not confirmed.

mod adapter;
pub mod device;
mod gateway;

use std::path::PathBuf;

use tokio_util::sync::CancellationToken;
use waymark_worker::Client;

pub use device::{AuthPayload, DeviceKey, KeyError, StoredToken};

/// `waymark adapters openclaw`: mirror an OpenClaw gateway.
#[derive(Debug, Clone, clap::Args)]
pub struct OpenClawArgs {
    /// The gateway's WebSocket URL, e.g. `ws://127.0.0.1:18789`.
    #[arg(long, value_name = "URL")]
    pub gateway: String,
    /// The gateway's shared token (its `gateway.auth.token`), when it has one.
    #[arg(long, env = "OPENCLAW_GATEWAY_TOKEN", value_name = "TOKEN")]
    pub gateway_token: Option<String>,
    /// The adapter's Ed25519 device key, created (mode 0600) on first use; the device token
    /// the gateway issues is kept beside it. Default:
    /// `$XDG_CONFIG_HOME/waymark/openclaw-device.json` (or `~/.config/…`).
    #[arg(long, value_name = "PATH")]
    pub device_key: Option<PathBuf>,
    /// `connect.client.id`: one of the ids the gateway knows.
    #[arg(long, default_value = "gateway-client", value_name = "ID")]
    pub client_id: String,
    /// `connect.client.mode`: one of the modes the gateway knows.
    #[arg(long, default_value = "backend", value_name = "MODE")]
    pub client_mode: String,
    /// Follow one run instead of mirroring every session: bind the gateway session
    /// `--session-key` to this existing task (the one a runner's `start_run` made), send one
    /// turn into it (`--message`), follow that turn to its end, hand the task back open (a
    /// follow-up or a revive sends the next turn into the same session), and exit.
    #[arg(long, value_name = "TASK", requires_all = ["session_key", "message", "turn_key"])]
    pub task: Option<String>,
    /// The run's gateway session key (with `--task`); see [`run_session_key`].
    #[arg(long, value_name = "KEY", requires = "task")]
    pub session_key: Option<String>,
    /// The turn's text, `-` to read it from stdin (with `--task`).
    #[arg(long, value_name = "TEXT", requires = "task")]
    pub message: Option<String>,
    /// The turn's idempotency key (with `--task`): the gateway takes a turn sent twice with
    /// one key once, so a resend after a lost connection is no second turn.
    #[arg(long, value_name = "KEY", requires = "task")]
    pub turn_key: Option<String>,
    /// The working directory of the turn (`agent.cwd`, with `--task`): where its commands
    /// run. Its working tree is recorded after each tool call, for a revive's admission.
    #[arg(long, value_name = "DIR", requires = "task")]
    pub cwd: Option<PathBuf>,
}

/// The gateway session key of a runner's run of `task` under OpenClaw's agent `agent`: the
/// key the runner binds the run to, and that the mirroring adapter leaves to it.
pub fn run_session_key(agent: &str, task: &str) -> String {
    format!("agent:{agent}:{RUN_SESSION_PREFIX}{task}")
}

/// The last part of every runner run's session key.
const RUN_SESSION_PREFIX: &str = "waymark-run-";

/// Whether `key` is a runner's run (followed by its own adapter, never mirrored as a session
/// of its own).
fn is_run_session(key: &str) -> bool {
    key.rsplit(':')
        .next()
        .is_some_and(|last| last.starts_with(RUN_SESSION_PREFIX))
}

/// Why the adapter stopped.
#[derive(Debug, thiserror::Error)]
pub enum OpenClawError {
    /// The device key cannot be read or written.
    #[error(transparent)]
    DeviceKey(#[from] KeyError),
    /// The gateway URL is not usable.
    #[error("`{url}` is not an OpenClaw gateway URL: {reason}")]
    BadGateway {
        /// What was given.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// The gateway refused the run's turn (`agent`), for good.
    #[error("the OpenClaw gateway refused the turn: {0}")]
    TurnRefused(String),
    /// The turn the adapter followed is gone: the gateway restarted under it. The attempt is
    /// left as it was, so the runner's report of this exit revives the run.
    #[error("the OpenClaw turn was cut off: {0}")]
    TurnLost(String),
    /// The gateway answered `connect` with `ok:false`.
    #[error("the OpenClaw gateway refused device `{device_id}`: {message} ({code}) — {hint}")]
    Refused {
        /// The gateway's error code, e.g. `PAIRING_REQUIRED`.
        code: String,
        /// The gateway's message, e.g. `pairing required`.
        message: String,
        /// This adapter's device id.
        device_id: String,
        /// What to do.
        hint: String,
    },
}

/// Runs the adapter until `shutdown` (then hands each session's task back, open) or until the
/// gateway refuses it. Connection losses are retried, never returned.
pub async fn run(
    args: OpenClawArgs,
    client: Client,
    shutdown: CancellationToken,
) -> Result<(), OpenClawError> {
    let url = url::Url::parse(&args.gateway).map_err(|e| OpenClawError::BadGateway {
        url: args.gateway.clone(),
        reason: e.to_string(),
    })?;
    if url.scheme() != "ws" {
        return Err(OpenClawError::BadGateway {
            url: args.gateway.clone(),
            reason: "give a `ws://host:port` URL (TLS `wss://` is not built in: reach a remote gateway through an SSH tunnel or Tailscale)".into(),
        });
    }
    let key_path = match args.device_key {
        Some(p) => p,
        None => default_key_path().ok_or_else(|| OpenClawError::BadGateway {
            url: args.gateway.clone(),
            reason: "no home directory to keep the device key in: pass `--device-key PATH`".into(),
        })?,
    };
    let key = DeviceKey::load_or_create(&key_path)?;
    tracing::info!(device = %key.device_id(), key = %key_path.display(), "OpenClaw device identity");
    let bound = match (args.task, args.session_key, args.message, args.turn_key) {
        (Some(task), Some(key), Some(message), Some(turn_key)) => Some(adapter::Bound {
            task,
            key,
            message,
            turn_key,
            cwd: args.cwd,
        }),
        _ => None,
    };
    let settings = adapter::Settings {
        bound,
        gateway: args.gateway.clone(),
        gateway_token: args.gateway_token.filter(|t| !t.is_empty()),
        client: gateway::ClientInfo {
            id: args.client_id,
            mode: args.client_mode,
            display_name: "waymark-adapter".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            platform: std::env::consts::OS.into(),
        },
    };
    adapter::Adapter::new(settings, key, client)
        .run(shutdown)
        .await
}

fn default_key_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("waymark").join("openclaw-device.json"))
}

/// A frame recorded from the real `openclaw@2026.9.6` gateway (`fixtures/openclaw/real/`), by
/// its label.
#[cfg(test)]
fn recorded(label: &str) -> serde_json::Value {
    include_str!("../fixtures/openclaw/real/openclaw-2026.9.6.jsonl")
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|r| r["label"] == label)
        .unwrap_or_else(|| panic!("no recorded frame `{label}`"))["frame"]
        .clone()
}
