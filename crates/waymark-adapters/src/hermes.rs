//! The Hermes Agent adapter (NousResearch/hermes-agent), in two parts (`docs/adapters/hermes.md`):
//! live control is the ACP adapter run against Hermes' ACP entrypoint with runtime `hermes`
//! (Hermes' own permission options, `allow_session` among them); history and lineage come from
//! a read-only mirror of Hermes' SQLite session store, which the adapter never writes.

mod mirror;
mod store;

use std::path::PathBuf;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use waymark_worker::Client;

use crate::acp::{self, AcpArgs, AcpError};

/// `waymark adapters hermes …`.
#[derive(Debug, Clone, clap::Args)]
pub struct HermesArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: HermesCommand,
}

/// The Hermes adapter's two surfaces.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum HermesCommand {
    /// Run one prompt turn of Hermes over ACP, approvals answered from the inbox.
    Acp(HermesAcpArgs),
    /// Mirror Hermes' session store (`~/.hermes/state.db`) read-only into tasks.
    Mirror(MirrorArgs),
}

/// `waymark adapters hermes acp`.
#[derive(Debug, Clone, clap::Args)]
pub struct HermesAcpArgs {
    /// Hermes' ACP entrypoint (`hermes acp`, which needs `hermes-agent[acp]`; tested with
    /// Hermes Agent 0.19.0).
    #[arg(long, default_value = "hermes acp")]
    pub agent_cmd: String,
    /// The session's working directory (default: the current one).
    #[arg(long)]
    pub cwd: Option<PathBuf>,
    /// What to ask Hermes.
    #[arg(long)]
    pub prompt: String,
    /// The task's title (default: the prompt's first line).
    #[arg(long)]
    pub title: Option<String>,
    /// The worker name recorded on the attempt.
    #[arg(long, default_value = "waymark-hermes")]
    pub worker: String,
    /// Seconds an approval stays open before its default (deny) applies (default: an hour; the
    /// approval carries Hermes' own fixed wait, 60 s, after which Hermes denies on its own, as
    /// its runtime deadline, which comes first unless this is shorter).
    #[arg(long)]
    pub approval_expires_in: Option<u64>,
}

/// `waymark adapters hermes mirror`.
#[derive(Debug, Clone, clap::Args)]
pub struct MirrorArgs {
    /// Hermes' state database (`~/.hermes/state.db`, or `$HERMES_HOME/state.db`).
    #[arg(long)]
    pub state_db: PathBuf,
    /// One pass, then exit (the default).
    #[arg(long, conflicts_with = "follow")]
    pub once: bool,
    /// Keep mirroring, a pass every `--interval-ms`, until stopped.
    #[arg(long)]
    pub follow: bool,
    /// Milliseconds between passes with `--follow`.
    #[arg(long, default_value_t = 2000)]
    pub interval_ms: u64,
    /// Where the mirror remembers what it mirrored (default:
    /// `$XDG_STATE_HOME/waymark/hermes-mirror.json`, else `~/.local/state/waymark/…`).
    #[arg(long)]
    pub state_file: Option<PathBuf>,
    /// The worker name recorded on the attempts.
    #[arg(long, default_value = "waymark-hermes-mirror")]
    pub worker: String,
}

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum HermesError {
    /// The ACP side failed.
    #[error(transparent)]
    Acp(#[from] AcpError),
    /// The state database cannot be opened read-only.
    #[error("cannot open Hermes' state database `{path}` read-only: {source} — check `--state-db`")]
    Open {
        /// The path given.
        path: String,
        /// Why.
        #[source]
        source: sqlx::Error,
    },
    /// Reading the state database failed.
    #[error("reading Hermes' state database: {0}")]
    Read(#[from] sqlx::Error),
    /// The mirror's own state file is unusable.
    #[error("the mirror's state file `{path}`: {reason}")]
    StateFile {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// No state file was given and there is no home to put it in.
    #[error("no place for the mirror's state file: give `--state-file`")]
    NoStateDir,
    /// The control plane refused or could not be reached.
    #[error("the control plane: {0}")]
    ControlPlane(#[from] waymark_worker::Error),
}

/// Runs `waymark adapters hermes acp|mirror`.
pub async fn run(
    args: HermesArgs,
    client: Client,
    shutdown: CancellationToken,
) -> Result<(), HermesError> {
    match args.command {
        HermesCommand::Acp(a) => {
            let args = AcpArgs {
                agent_cmd: a.agent_cmd,
                cwd: a.cwd,
                prompt: a.prompt,
                runtime: "hermes".into(),
                title: a.title,
                worker: a.worker,
                approval_expires_in: a.approval_expires_in,
                bind: Default::default(),
            };
            Ok(acp::run(args, client, shutdown).await?)
        }
        HermesCommand::Mirror(m) => mirror(m, client, shutdown).await,
    }
}

/// The read-only mirror: one pass (`--once`), or passes until `shutdown` (`--follow`), after
/// which the attempts of sessions still open are released.
pub async fn mirror(
    args: MirrorArgs,
    client: Client,
    shutdown: CancellationToken,
) -> Result<(), HermesError> {
    let db_path = std::fs::canonicalize(&args.state_db).map_err(|e| HermesError::Open {
        path: args.state_db.display().to_string(),
        source: sqlx::Error::Io(e),
    })?;
    let state_file = match args.state_file {
        Some(p) => p,
        None => default_state_file().ok_or(HermesError::NoStateDir)?,
    };
    let db = store::HermesDb::open(&db_path)
        .await
        .map_err(|source| HermesError::Open {
            path: db_path.display().to_string(),
            source,
        })?;
    let state = mirror::State::load(&state_file, &db_path)?;
    let mut m = mirror::Mirror::new(client, args.worker, db, state, args.follow);
    let result = if args.follow {
        let every = Duration::from_millis(args.interval_ms.max(100));
        loop {
            if let Err(e) = m.pass().await {
                tracing::warn!(error = %e, "a mirror pass failed; trying again next time");
            }
            tokio::select! {
                () = shutdown.cancelled() => break Ok(()),
                () = tokio::time::sleep(every) => {}
            }
        }
    } else {
        m.pass().await
    };
    m.close().await;
    result
}

fn default_state_file() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_STATE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))?;
    Some(base.join("waymark").join("hermes-mirror.json"))
}
