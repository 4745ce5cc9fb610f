//! Starting and resuming Claude Code for a runner: `claude -p` with the run's session id, the
//! hooks into the control plane in a settings file of the runner's own (passed with
//! `--settings`, so nothing is written into the person's repository), the prompt on stdin
//! (never on a command line another user can read), and its output in the runner's log.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::io::AsyncWriteExt;
use waymark_proto::{Work, WorkKind};

use crate::adapters::{claude_hooks, hook_query, this_binary};

/// The Claude Code found on this machine.
#[derive(Debug, Clone)]
pub(crate) struct Claude {
    pub(crate) bin: PathBuf,
    pub(crate) version: Option<String>,
}

impl Claude {
    /// `explicit`, else `claude` on the PATH; its version from `claude --version`.
    pub(crate) async fn find(explicit: Option<&Path>) -> Option<Claude> {
        let bin = match explicit {
            Some(p) => p.to_path_buf(),
            None => super::on_path("claude")?,
        };
        // `2.1.328 (Claude Code)`.
        let version = super::version_of(&bin).await?;
        Some(Claude { bin, version })
    }
}

/// What every start and resume shares.
pub(crate) struct Spawn<'a> {
    pub(crate) server: &'a str,
    pub(crate) token: &'a str,
    pub(crate) server_fp: Option<&'a str>,
    pub(crate) state_dir: &'a Path,
    /// The runner's mark its runs carry ([`super::RUNNER_MARK`]).
    pub(crate) mark: &'a str,
    pub(crate) approval_timeout: u64,
}

impl Spawn<'_> {
    /// The settings file of one run: Waymark's hooks only, pointing at this control plane.
    fn settings(&self, w: &Work) -> std::io::Result<PathBuf> {
        let bin = this_binary().map_err(|f| std::io::Error::other(f.message))?;
        let query = hook_query(self.approval_timeout, w.run.gate.as_deref(), false);
        let mut hooks = serde_json::Map::new();
        for (event, group) in claude_hooks(
            &bin,
            self.server,
            "WAYMARK_TOKEN",
            &query,
            self.approval_timeout,
            false,
            true,
        ) {
            hooks.insert(event.to_owned(), serde_json::Value::Array(vec![group]));
        }
        let path = self
            .state_dir
            .join("claude")
            .join(format!("{}.json", w.task_id));
        std::fs::write(
            &path,
            serde_json::to_vec_pretty(&serde_json::json!({ "hooks": hooks }))?,
        )?;
        Ok(path)
    }

    /// Starts (`start`) or resumes (`resume`) the run's Claude Code session in `dir`.
    pub(crate) fn start(
        &self,
        claude: &Claude,
        w: &Work,
        dir: &Path,
    ) -> std::io::Result<tokio::process::Child> {
        let settings = self.settings(w)?;
        let log = super::run_log(self.state_dir, &w.task_id)?;
        let mut cmd = tokio::process::Command::new(&claude.bin);
        // The mode Claude Code's Agent SDK runs it in: stream-json in and out with a permission
        // prompt tool on stdio. Claude Code 2.1.328 offers the model `AskUserQuestion` and
        // `ExitPlanMode` only there (or interactively), and their hooks bring them to the
        // inbox. Stdin closes after the one message, so a prompt its hooks leave open fails
        // the call ("Stream closed") as `claude -p` denies it; `defer` and `--resume` behave
        // as under `claude -p` (measured: the deferred call's `PreToolUse` fires again).
        cmd.args(STREAM_ARGS);
        let input = match w.kind {
            // Begun before and cut off before it reached the control plane (the control plane
            // starts such a run again): Claude Code refuses `--session-id` for a session it
            // already keeps ("already in use"), so that session is resumed with the prompt.
            WorkKind::Start if session_kept(&w.run.session_key) => {
                cmd.args(["--resume", &w.run.session_key]);
                Some(w.run.prompt.clone())
            }
            WorkKind::Start => {
                cmd.args(["--session-id", &w.run.session_key]);
                if w.run.plan {
                    // Plan first: Claude Code plans, then asks with `ExitPlanMode` (a plan
                    // card in the inbox) before it changes anything.
                    cmd.args(["--permission-mode", "plan"]);
                }
                Some(w.run.prompt.clone())
            }
            _ => {
                cmd.args(["--resume", &w.run.session_key]);
                // No message: Claude Code adds its own "Continue from where you left off."
                w.resume.as_ref().and_then(|r| r.message.clone())
            }
        };
        cmd.arg("--settings")
            .arg(&settings)
            .current_dir(dir)
            .env("WAYMARK_TOKEN", self.token)
            .env("WAYMARK_SERVER", self.server)
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(log.try_clone()?)
            .stderr(log)
            // Its own process group: a stop ends the whole tree, and the runner's own end
            // (a restart, a Ctrl-C in its terminal) does not end the run.
            .process_group(0)
            .env(super::RUN_MARK, &w.task_id)
            .env(super::RUNNER_MARK, self.mark);
        if let Some(fp) = self.server_fp {
            cmd.env(waymark_worker::SERVER_FP_ENV, fp);
        }
        let mut child = cmd.spawn()?;
        if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
            let line = format!("{}\n", user_message(&text));
            tokio::spawn(async move {
                let _ = stdin.write_all(line.as_bytes()).await;
                let _ = stdin.shutdown().await;
            });
        }
        Ok(child)
    }
}

/// How the runner runs Claude Code (after `--session-id` or `--resume`).
pub(crate) const STREAM_ARGS: [&str; 8] = [
    "-p",
    "--input-format",
    "stream-json",
    "--output-format",
    "stream-json",
    "--verbose",
    "--permission-prompt-tool",
    "stdio",
];

/// One user message of Claude Code's stream-json input.
pub(crate) fn user_message(text: &str) -> serde_json::Value {
    serde_json::json!({
        "type": "user",
        "message": {"role": "user", "content": text},
        "parent_tool_use_id": null,
        "session_id": "",
    })
}

/// Whether Claude Code on this machine keeps a session `key` already: its transcript,
/// `<config dir>/projects/<project>/<key>.jsonl` (the config dir: `$CLAUDE_CONFIG_DIR`, else
/// `~/.claude`; measured with 2.1.328, which writes it as soon as the session begins).
fn session_kept(key: &str) -> bool {
    let Some(config) = std::env::var_os("CLAUDE_CONFIG_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".claude")))
    else {
        return false;
    };
    let file = format!("{key}.jsonl");
    std::fs::read_dir(config.join("projects"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|project| project.path().join(&file).is_file())
}
