//! `waymark`: the control plane (`serve`), host administration (`admin`), and — as later
//! issues land — the demo agent and the terminal client. Exit codes: 0 success, 1 refused or
//! conflict, 2 usage, 3 cannot reach the server.

mod adapters;
mod admin;
mod chaos;
mod client;
mod demo;
mod output;
mod runner;
mod serve;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "waymark",
    version,
    about = "Keep long-running AI agents safe across interruptions, and steer them"
)]
struct Cli {
    /// Print machine-readable JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the control plane.
    Serve(serve::ServeArgs),
    /// Administer the host's data dir: users and worker tokens.
    Admin(admin::AdminArgs),
    #[command(flatten)]
    Client(client::ClientCommand),
    /// Run the seed scenario as a real agent run (an embedded control plane unless `--server`).
    Demo(demo::DemoArgs),
    /// Connect an agent runtime (Claude Code, Codex, OpenClaw, ACP agents, Hermes).
    Adapters(adapters::AdaptersArgs),
    /// The hands on this machine: start, revive and resume agent runs the control plane
    /// addresses to it (`install` makes it a systemd user unit).
    Runner(runner::RunnerArgs),
    /// Break things on purpose (kill -9, crashes, stale workers, duplicates, partitions) and count what survived.
    Chaos(chaos::ChaosArgs),
    /// The fake Claude Code `waymark chaos --scenario runner-kill` gives its runners.
    #[command(name = "chaos-fake-claude", hide = true)]
    ChaosFakeClaude(chaos::fake_claude::FakeArgs),
}

/// Where `waymark serve` listens unless told otherwise.
pub(crate) const DEFAULT_LISTEN: &str = "127.0.0.1:7700";
/// Where every command that talks to a control plane looks for it unless told otherwise: the
/// address `serve` listens on by default (one port for every command).
pub(crate) const DEFAULT_SERVER: &str = "http://127.0.0.1:7700";

/// Where the control plane keeps its data: `--data-dir`, else `$WAYMARK_DATA_DIR`, else the
/// XDG data dir (`~/.local/share/waymark`).
pub(crate) fn default_data_dir() -> PathBuf {
    directories::ProjectDirs::from("dev", "waymark", "waymark")
        .map(|d| d.data_dir().to_path_buf())
        .unwrap_or_else(|| PathBuf::from(".waymark"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("WAYMARK_LOG").unwrap_or_else(|_| {
                // sqlx's slow-statement notes are for whoever tunes the database, not for
                // someone reading their inbox.
                tracing_subscriber::EnvFilter::new(
                    "warn,sqlx=error,waymark=info,waymark_server=info",
                )
            }),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let json = cli.json;
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Serve(args) => serve::run(args, json).await,
            Command::Admin(args) => admin::run(args, json).await,
            Command::Client(cmd) => client::run(cmd, json).await,
            Command::Demo(args) => demo::run(args, json).await,
            Command::Chaos(args) => chaos::run(args, json).await,
            Command::ChaosFakeClaude(args) => chaos::fake_claude::run(args).await,
            Command::Adapters(args) => adapters::run(args, json).await,
            Command::Runner(args) => runner::run(args, json).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => f.report(json),
    }
}
