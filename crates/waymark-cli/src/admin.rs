//! `waymark admin …`: acts on the server's data dir directly, so only whoever runs the host
//! administers it.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use waymark_server::DataDir;
use waymark_server::admin as ops;

use crate::output::{CliResult, emit};
use crate::serve::admin_failure;

#[derive(Debug, Args)]
pub(crate) struct AdminArgs {
    /// The server's data dir.
    #[arg(long, global = true, env = "WAYMARK_DATA_DIR")]
    data_dir: Option<PathBuf>,
    #[command(subcommand)]
    command: AdminCommand,
}

#[derive(Debug, Subcommand)]
enum AdminCommand {
    /// Users, who own tasks.
    #[command(subcommand)]
    User(UserCommand),
    /// Print a new worker token; tasks created with it belong to `--user`.
    WorkerToken {
        /// The worker's name (for audit).
        #[arg(long)]
        name: String,
        /// The user its tasks belong to (default: `admin`).
        #[arg(long)]
        user: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
enum UserCommand {
    /// Add a user.
    Add {
        /// Name: letters, digits, `-`, `_`, `.`.
        name: String,
    },
    /// List users.
    List,
}

pub(crate) async fn run(args: AdminArgs, json: bool) -> CliResult {
    let dir = DataDir::new(args.data_dir.unwrap_or_else(crate::default_data_dir));
    let store = dir.open().await.map_err(admin_failure)?;
    dir.bootstrap(&store).await.map_err(admin_failure)?;
    match args.command {
        AdminCommand::User(UserCommand::Add { name }) => {
            let u = ops::add_user(&store, &name).await.map_err(admin_failure)?;
            emit(
                json,
                &serde_json::json!({"id": u.id, "name": u.name}),
                || format!("added user `{}`", u.name),
            );
        }
        AdminCommand::User(UserCommand::List) => {
            let users = ops::list_users(&store).await.map_err(admin_failure)?;
            let v: Vec<_> = users
                .iter()
                .map(|u| serde_json::json!({"id": u.id, "name": u.name}))
                .collect();
            emit(json, &serde_json::Value::Array(v), || {
                users
                    .iter()
                    .map(|u| u.name.as_str())
                    .collect::<Vec<_>>()
                    .join("\n")
            });
        }
        AdminCommand::WorkerToken { name, user } => {
            let (token, user) = ops::create_worker_token(&store, &name, user.as_deref())
                .await
                .map_err(admin_failure)?;
            emit(
                json,
                &serde_json::json!({"token": token, "name": name, "user": user.name}),
                || token.clone(),
            );
        }
    }
    Ok(())
}
