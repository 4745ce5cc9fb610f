//! `waymark adapters …`: connect an agent runtime to the control plane. Claude Code calls the
//! server through hooks (`install` writes them); the other runtimes are driven by a long-lived
//! adapter process from `waymark-adapters`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use serde_json::{Map, Value, json};
use tokio::signal::unix::{SignalKind, signal};

use crate::output::{CliResult, Exit, Failure, emit};

#[derive(Debug, Args)]
pub(crate) struct AdaptersArgs {
    #[command(subcommand)]
    runtime: Runtime,
}

#[derive(Debug, Subcommand)]
enum Runtime {
    /// Claude Code: hooks that report sessions, tool calls and permission prompts.
    #[command(name = "claude-code", subcommand)]
    ClaudeCode(ClaudeCode),
    /// Codex: follow threads through `codex app-server`; approvals, steer and interrupt.
    Codex {
        #[command(flatten)]
        conn: Conn,
        #[command(flatten)]
        args: waymark_adapters::codex::CodexArgs,
    },
    /// OpenClaw: an operator client of the gateway; sessions, the task ledger, exec approvals.
    Openclaw {
        #[command(flatten)]
        conn: Conn,
        #[command(flatten)]
        args: waymark_adapters::openclaw::OpenClawArgs,
    },
    /// Any ACP agent: the client side of the Agent Client Protocol over the agent's stdio.
    Acp {
        #[command(flatten)]
        conn: Conn,
        #[command(flatten)]
        args: waymark_adapters::acp::AcpArgs,
    },
    /// Hermes Agent: live control over ACP, or a read-only mirror of its session store.
    Hermes {
        #[command(flatten)]
        conn: Conn,
        #[command(flatten)]
        args: waymark_adapters::hermes::HermesArgs,
    },
}

/// The control plane an adapter reports to.
#[derive(Debug, Args)]
struct Conn {
    /// The control plane's URL.
    #[arg(long, env = "WAYMARK_SERVER", default_value = crate::DEFAULT_SERVER)]
    server: String,
    /// Trust only the server certificate with this fingerprint (`sha256:…`, the `TLS:` line
    /// `waymark serve` prints), e.g. a self-signed one.
    #[arg(long, env = waymark_worker::SERVER_FP_ENV)]
    server_fp: Option<String>,
    /// A worker token (`waymark admin worker-token …`).
    #[arg(long, env = "WAYMARK_TOKEN", hide_env_values = true)]
    token: String,
}

impl Conn {
    async fn client(&self) -> Result<waymark_worker::Client, Failure> {
        let mut builder = waymark_worker::Client::builder(&self.server, self.token.clone());
        if let Some(fp) = &self.server_fp {
            builder = builder.pin(fp.clone());
        }
        let client = builder.build().map_err(|e| {
            Failure::new(
                Exit::Usage,
                "bad_server",
                format!("--server `{}`: {e}", self.server),
            )
        })?;
        client.health().await.map_err(|e| match e {
            waymark_worker::Error::CertificateMismatch { .. } => {
                Failure::new(Exit::Refused, "certificate_mismatch", e.to_string())
            }
            _ => Failure::new(Exit::Unreachable, "unreachable", e.to_string()),
        })?;
        Ok(client)
    }
}

/// Runs a long-lived adapter until it ends or Ctrl-C (then it stops cleanly: pending
/// approvals are expired, the attempt released) — or, with `on_term`, `SIGTERM` too.
async fn long_lived<E: std::fmt::Display>(
    conn: Conn,
    on_term: bool,
    run: impl AsyncFnOnce(waymark_worker::Client, tokio_util::sync::CancellationToken) -> Result<(), E>,
) -> CliResult {
    let client = conn.client().await?;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let on_signal = shutdown.clone();
    tokio::spawn(async move {
        let mut term = on_term
            .then(|| signal(SignalKind::terminate()).ok())
            .flatten();
        let terminated = async {
            match term.as_mut() {
                Some(t) => t.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = tokio::signal::ctrl_c() => if r.is_err() { return },
            Some(()) = terminated => {}
        }
        on_signal.cancel();
    });
    run(client, shutdown)
        .await
        .map_err(|e| Failure::new(Exit::Refused, "adapter_failed", e.to_string()))
}

#[derive(Debug, Subcommand)]
enum ClaudeCode {
    /// Write Waymark's hooks into a Claude Code settings file (merged with what is there).
    Install(InstallArgs),
    /// Remove Waymark's hooks from a Claude Code settings file.
    Uninstall(UninstallArgs),
    /// A command hook: reads Claude Code's hook input on stdin, forwards it, prints the answer.
    /// For setups that prefer `command` hooks to `http` hooks.
    Hook(HookArgs),
}

/// Which settings file: Claude Code merges all of them.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum Scope {
    /// `~/.claude/settings.json`: every project of this user.
    User,
    /// `.claude/settings.json`: this project, shared with its repository.
    Project,
    /// `.claude/settings.local.json`: this project, this machine only.
    Local,
}

#[derive(Debug, Args)]
struct InstallArgs {
    /// The control plane's URL, as Claude Code reaches it.
    #[arg(long, env = "WAYMARK_SERVER", default_value = crate::DEFAULT_SERVER)]
    server: String,
    /// The environment variable that holds the worker token when Claude Code runs (the token
    /// itself is never written into the settings file).
    #[arg(long, default_value = "WAYMARK_TOKEN")]
    token_env: String,
    /// Which settings file to write.
    #[arg(long, value_enum, default_value = "local")]
    scope: Scope,
    /// Write this settings file instead.
    #[arg(long, conflicts_with = "scope")]
    settings: Option<PathBuf>,
    /// Tools (a regex of names) whose every call asks for approval in Waymark, e.g.
    /// `Bash|Write`. Permission prompts are always forwarded.
    #[arg(long)]
    gate: Option<String>,
    /// For `claude -p` runs: gated calls answer `defer`, so the approval outlives the
    /// process; resume the session once it is decided.
    #[arg(long)]
    defer: bool,
    /// How long a permission prompt waits for a decision before Claude Code asks in its own
    /// prompt (seconds).
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// Use `command` hooks (`waymark adapters claude-code hook`) instead of `http` hooks for
    /// every event (`SessionStart` always gets one: Claude Code has no `http` hooks for it).
    #[arg(long)]
    command: bool,
}

#[derive(Debug, Args)]
struct UninstallArgs {
    /// Which settings file.
    #[arg(long, value_enum, default_value = "local")]
    scope: Scope,
    /// This settings file instead.
    #[arg(long, conflicts_with = "scope")]
    settings: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct HookArgs {
    /// The control plane's URL.
    #[arg(long, env = "WAYMARK_SERVER", default_value = crate::DEFAULT_SERVER)]
    server: String,
    /// The worker token.
    #[arg(long, env = "WAYMARK_TOKEN", hide_env_values = true)]
    token: String,
    /// Trust only the server certificate with this fingerprint (`sha256:…`).
    #[arg(long, env = waymark_worker::SERVER_FP_ENV)]
    server_fp: Option<String>,
    /// The query the http hook would carry (`gate=…&defer=true&timeout=…`).
    #[arg(long, default_value = "")]
    query: String,
    /// Add the working tree of the hook's `cwd` (its commit and changed files' hashes) to what
    /// is sent: a runner's runs record it after each call, for admission on a revive.
    #[arg(long)]
    tree: bool,
}

/// Hook events Waymark listens to; the ones that can block get the long timeout.
const EVENTS: &[&str] = &[
    "SessionStart",
    "UserPromptSubmit",
    "PreToolUse",
    "PermissionRequest",
    "PostToolUse",
    "PostToolUseFailure",
    "PreCompact",
    "PostCompact",
    "Notification",
    "Stop",
    "StopFailure",
    "SessionEnd",
];

/// Marks our entries so `install` replaces them and `uninstall` finds them.
const MARK: &str = "/v1/adapters/claude-code/hook";

pub(crate) async fn run(args: AdaptersArgs, json: bool) -> CliResult {
    match args.runtime {
        Runtime::ClaudeCode(ClaudeCode::Install(a)) => install(a, json),
        Runtime::ClaudeCode(ClaudeCode::Uninstall(a)) => uninstall(a, json),
        Runtime::ClaudeCode(ClaudeCode::Hook(a)) => hook(a).await,
        Runtime::Codex { conn, mut args } => {
            from_stdin(&mut args.prompt, "--prompt")?;
            from_stdin(&mut args.message, "--message")?;
            long_lived(conn, false, async |c, s| {
                waymark_adapters::codex::run(args, c, s).await
            })
            .await
        }
        Runtime::Openclaw { conn, mut args } => {
            from_stdin(&mut args.message, "--message")?;
            // A runner ends a run's adapter with `SIGTERM` (and kills it after a grace): the
            // OpenClaw run lives on in the gateway, so the adapter aborts a cancelled one there.
            long_lived(conn, true, async |c, s| {
                waymark_adapters::openclaw::run(args, c, s).await
            })
            .await
        }
        Runtime::Acp { conn, mut args } => {
            let mut prompt = Some(std::mem::take(&mut args.prompt));
            from_stdin(&mut prompt, "--prompt")?;
            args.prompt = prompt.unwrap_or_default();
            long_lived(conn, false, async |c, s| {
                waymark_adapters::acp::run(args, c, s).await
            })
            .await
        }
        Runtime::Hermes { conn, args } => {
            long_lived(conn, false, async |c, s| {
                waymark_adapters::hermes::run(args, c, s).await
            })
            .await
        }
    }
}

/// A text flag given as `-` is read from stdin: how the runner passes a prompt, which never
/// goes on a command line other users of the host can read.
fn from_stdin(text: &mut Option<String>, flag: &str) -> Result<(), Failure> {
    if text.as_deref() != Some("-") {
        return Ok(());
    }
    let read = std::io::read_to_string(std::io::stdin())
        .map_err(|e| Failure::new(Exit::Usage, "bad_stdin", format!("{flag} -: {e}")))?;
    if read.trim().is_empty() {
        return Err(Failure::new(
            Exit::Usage,
            "bad_stdin",
            format!("{flag} -: stdin was empty"),
        ));
    }
    *text = Some(read);
    Ok(())
}

fn settings_path(scope: Scope, explicit: Option<PathBuf>) -> Result<PathBuf, Failure> {
    if let Some(p) = explicit {
        return Ok(p);
    }
    Ok(match scope {
        Scope::User => directories::BaseDirs::new()
            .map(|d| d.home_dir().join(".claude/settings.json"))
            .ok_or_else(|| {
                Failure::new(
                    Exit::Usage,
                    "no_home",
                    "cannot find your home directory; pass --settings",
                )
            })?,
        Scope::Project => PathBuf::from(".claude/settings.json"),
        Scope::Local => PathBuf::from(".claude/settings.local.json"),
    })
}

fn read_settings(path: &Path) -> Result<Map<String, Value>, Failure> {
    match std::fs::read_to_string(path) {
        Ok(text) if text.trim().is_empty() => Ok(Map::new()),
        Ok(text) => match serde_json::from_str::<Value>(&text) {
            Ok(Value::Object(m)) => Ok(m),
            Ok(_) => Err(Failure::new(
                Exit::Refused,
                "bad_settings",
                format!(
                    "{} is not a JSON object; fix it or pass another --settings",
                    path.display()
                ),
            )),
            Err(e) => Err(Failure::new(
                Exit::Refused,
                "bad_settings",
                format!(
                    "{} is not valid JSON ({e}); nothing was changed",
                    path.display()
                ),
            )),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Map::new()),
        Err(e) => Err(Failure::new(
            Exit::Refused,
            "bad_settings",
            format!("cannot read {}: {e}", path.display()),
        )),
    }
}

fn write_settings(path: &Path, settings: &Map<String, Value>) -> Result<(), Failure> {
    let fail = |e: std::io::Error| {
        Failure::new(
            Exit::Refused,
            "write_failed",
            format!("cannot write {}: {e}", path.display()),
        )
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(fail)?;
    }
    let mut text = serde_json::to_string_pretty(settings).unwrap_or_default();
    text.push('\n');
    // Write beside it and rename, so a crash never leaves half a settings file.
    let tmp = path.with_extension("json.waymark-tmp");
    std::fs::write(&tmp, text).map_err(fail)?;
    std::fs::rename(&tmp, path).map_err(fail)
}

fn is_ours(handler: &Value) -> bool {
    handler["url"].as_str().is_some_and(|u| u.contains(MARK))
        || handler["command"]
            .as_str()
            .is_some_and(|c| c.contains("adapters claude-code hook"))
}

/// Removes our handlers from every event, dropping groups and events left empty.
fn strip_ours(settings: &mut Map<String, Value>) -> usize {
    let mut removed = 0;
    let Some(Value::Object(hooks)) = settings.get_mut("hooks") else {
        return 0;
    };
    for groups in hooks.values_mut() {
        let Some(groups) = groups.as_array_mut() else {
            continue;
        };
        for g in groups.iter_mut() {
            if let Some(hs) = g.get_mut("hooks").and_then(Value::as_array_mut) {
                let before = hs.len();
                hs.retain(|h| !is_ours(h));
                removed += before - hs.len();
            }
        }
        groups.retain(|g| g["hooks"].as_array().is_none_or(|h| !h.is_empty()));
    }
    hooks.retain(|_, g| g.as_array().is_none_or(|a| !a.is_empty()));
    if hooks.is_empty() {
        settings.remove("hooks");
    }
    removed
}

fn query(a: &InstallArgs) -> String {
    hook_query(a.timeout, a.gate.as_deref(), a.defer)
}

/// The hook URL's query: the hook's timeout, the gated tools, whether gated calls defer.
pub(crate) fn hook_query(timeout: u64, gate: Option<&str>, defer: bool) -> String {
    let mut q = vec![format!("timeout={timeout}")];
    if let Some(g) = gate {
        q.push(format!(
            "gate={}",
            url::form_urlencoded::byte_serialize(g.as_bytes()).collect::<String>()
        ));
    }
    if defer {
        q.push("defer=true".into());
    }
    q.join("&")
}

/// A shell word: Claude Code runs command hooks through a shell.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The command hook's command line: this `waymark` binary by its absolute path (Claude Code
/// runs hooks with a `PATH` of its own, where `waymark` may be missing, and a hook that cannot
/// start loses every session start without a word), the server it was installed for, and the
/// token from the variable `install` was told of (the token never appears in the settings).
fn hook_command(bin: &Path, server: &str, token_env: &str, query: &str) -> String {
    let token = if token_env == "WAYMARK_TOKEN" {
        String::new()
    } else {
        format!("WAYMARK_TOKEN=\"${token_env}\" ")
    };
    format!(
        "{token}{} adapters claude-code hook --server {} --query {}",
        shell_quote(&bin.to_string_lossy()),
        shell_quote(server),
        shell_quote(query)
    )
}

/// This binary's absolute path, for the command hook; refused with the reason when it cannot
/// be told.
pub(crate) fn this_binary() -> Result<PathBuf, Failure> {
    std::env::current_exe()
        .and_then(|p| p.canonicalize())
        .map_err(|e| {
            Failure::new(
                Exit::Refused,
                "no_binary_path",
                format!(
                    "cannot tell where this `waymark` binary is ({e}); Claude Code's SessionStart hook must run it by its full path"
                ),
            )
        })
}

/// Waymark's hook entries for every event Claude Code reports: `http` hooks into the control
/// plane (a `command` hook for `SessionStart`, which Claude Code runs no `http` hook for, and
/// for every event with `command_only`).
pub(crate) fn claude_hooks(
    bin: &Path,
    server: &str,
    token_env: &str,
    query: &str,
    timeout: u64,
    command_only: bool,
    tree: bool,
) -> Vec<(&'static str, Value)> {
    EVENTS
        .iter()
        .map(|event| {
            // Blocking events wait for a person; the rest only report and must stay quick.
            let blocking = matches!(*event, "PermissionRequest" | "PreToolUse");
            let timeout = if blocking { timeout } else { 10 };
            // The working tree is read on the host, so the events that record it are command
            // hooks: the session's start and each call's end.
            let tree = tree
                && matches!(
                    *event,
                    "SessionStart" | "PostToolUse" | "PostToolUseFailure"
                );
            // Claude Code 2.1.328 runs no `http` hook for `SessionStart` ("HTTP hooks are not
            // supported for SessionStart"): only a command hook sees the session begin.
            let handler = if command_only || tree || *event == "SessionStart" {
                let mut command = hook_command(bin, server, token_env, query);
                if tree {
                    command.push_str(" --tree");
                }
                json!({
                    "type": "command",
                    "command": command,
                    "timeout": timeout,
                })
            } else {
                json!({
                    "type": "http",
                    "url": format!("{server}{MARK}?{query}"),
                    "timeout": timeout,
                    // Claude Code sets `CLAUDE_CODE_ENTRYPOINT` itself (`sdk-cli` under `-p`,
                    // `cli` interactively): the server tells a headless run from a person at a
                    // prompt by it (what the hook's timeout does; whether `defer` is offered).
                    "headers": {
                        "Authorization": format!("Bearer ${token_env}"),
                        "X-Claude-Code-Entrypoint": "$CLAUDE_CODE_ENTRYPOINT",
                    },
                    "allowedEnvVars": [token_env, "CLAUDE_CODE_ENTRYPOINT"],
                })
            };
            (*event, json!({"matcher": "*", "hooks": [handler]}))
        })
        .collect()
}

fn install(a: InstallArgs, json: bool) -> CliResult {
    // The server compiles the gate with the same crate, anchored.
    if let Some(g) = &a.gate
        && let Err(e) = regex::Regex::new(&format!("^(?:{g})$"))
    {
        return Err(Failure::new(
            Exit::Usage,
            "bad_gate",
            format!("--gate is not a regex: {e}"),
        ));
    }
    let server = a.server.trim_end_matches('/').to_owned();
    if !(server.starts_with("http://") || server.starts_with("https://")) {
        return Err(Failure::new(
            Exit::Usage,
            "bad_server",
            format!("--server `{server}` must start with http:// or https://"),
        ));
    }
    let plain_name = !a.token_env.is_empty()
        && !a.token_env.starts_with(|c: char| c.is_ascii_digit())
        && a.token_env
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !plain_name {
        return Err(Failure::new(
            Exit::Usage,
            "bad_token_env",
            format!(
                "--token-env `{}` must be an environment variable's name (letters, digits, `_`)",
                a.token_env
            ),
        ));
    }
    let path = settings_path(a.scope, a.settings.clone())?;
    let bin = this_binary()?;
    let mut settings = read_settings(&path)?;
    strip_ours(&mut settings);
    let q = query(&a);
    let hooks = settings
        .entry("hooks")
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(hooks) = hooks.as_object_mut() else {
        return Err(Failure::new(
            Exit::Refused,
            "bad_settings",
            format!(
                "`hooks` in {} is not an object; nothing was changed",
                path.display()
            ),
        ));
    };
    for (event, group) in claude_hooks(&bin, &server, &a.token_env, &q, a.timeout, a.command, false)
    {
        let list = hooks
            .entry(event.to_string())
            .or_insert_with(|| Value::Array(Vec::new()));
        match list.as_array_mut() {
            Some(l) => l.push(group),
            None => {
                return Err(Failure::new(
                    Exit::Refused,
                    "bad_settings",
                    format!(
                        "`hooks.{event}` in {} is not a list; nothing was changed",
                        path.display()
                    ),
                ));
            }
        }
    }
    write_settings(&path, &settings)?;
    emit(
        json,
        &json!({"settings": path, "events": EVENTS, "server": server, "token_env": a.token_env, "hook_binary": bin}),
        || {
            format!(
                "wrote Waymark's hooks for {} events into {}\n  server: {server}\n  token:  ${} must hold a worker token when Claude Code runs (waymark admin worker-token …)\n  the SessionStart hook runs {} by its full path (install again if you move it)",
                EVENTS.len(),
                path.display(),
                a.token_env,
                bin.display()
            )
        },
    );
    Ok(())
}

fn uninstall(a: UninstallArgs, json: bool) -> CliResult {
    let path = settings_path(a.scope, a.settings)?;
    let mut settings = read_settings(&path)?;
    let removed = strip_ours(&mut settings);
    if removed > 0 {
        write_settings(&path, &settings)?;
    }
    emit(json, &json!({"settings": path, "removed": removed}), || {
        format!("removed {removed} Waymark hook(s) from {}", path.display())
    });
    Ok(())
}

/// The command hook. Claude Code must never be blocked by Waymark being away: when the server
/// cannot be reached the hook says so on stderr and renders no decision (exit 0).
async fn hook(a: HookArgs) -> CliResult {
    use tokio::io::AsyncReadExt;
    let mut input = String::new();
    tokio::io::stdin()
        .read_to_string(&mut input)
        .await
        .map_err(|e| {
            Failure::new(
                Exit::Usage,
                "no_input",
                format!("cannot read the hook input: {e}"),
            )
        })?;
    let body: Value = serde_json::from_str(&input).map_err(|e| {
        Failure::new(
            Exit::Usage,
            "bad_input",
            format!("the hook input is not JSON: {e}"),
        )
    })?;
    let timeout = a
        .query
        .split('&')
        .find_map(|kv| kv.strip_prefix("timeout="))
        .and_then(|t| t.parse::<u64>().ok())
        .unwrap_or(600);
    let url = format!(
        "{}{MARK}{}{}",
        a.server.trim_end_matches('/'),
        if a.query.is_empty() { "" } else { "?" },
        a.query
    );
    let mut client = reqwest::Client::builder().timeout(Duration::from_secs(timeout + 5));
    if let Some(fp) = &a.server_fp {
        let tls = waymark_tls_pin::client_config(fp)
            .map_err(|e| Failure::new(Exit::Usage, "bad_pin", format!("--server-fp: {e}")))?;
        client = client.use_preconfigured_tls(tls);
    }
    let client = client
        .build()
        .map_err(|e| Failure::new(Exit::Unreachable, "client", e.to_string()))?;
    let mut body = body;
    if a.tree
        && let Some(cwd) = body.get("cwd").and_then(Value::as_str).map(PathBuf::from)
        && let Some(tree) = waymark_worker::tree::snapshot(&cwd).await
        && let Some(obj) = body.as_object_mut()
    {
        obj.insert(
            "waymark_tree".into(),
            serde_json::to_value(tree).unwrap_or(Value::Null),
        );
    }
    let mut req = client.post(&url).bearer_auth(&a.token).json(&body);
    // Claude Code runs command hooks with its own environment: its entrypoint tells the
    // server a `claude -p` run (`sdk-cli`) from an interactive session (`cli`).
    if let Ok(e) = std::env::var("CLAUDE_CODE_ENTRYPOINT") {
        req = req.header("X-Claude-Code-Entrypoint", e);
    }
    let res = req.send().await;
    match res {
        Ok(r) if r.status().is_success() => {
            let out: Value = r.json().await.unwrap_or_else(|_| json!({}));
            println!("{out}");
            Ok(())
        }
        Ok(r) => {
            let status = r.status();
            let text = r.text().await.unwrap_or_default();
            // Exit 1: to Claude Code a hook's error that blocks nothing (only 2 blocks), and
            // to whoever reads the exit status, a hook the control plane did not take.
            Err(Failure::new(
                Exit::Refused,
                "hook_refused",
                format!("the control plane refused the hook ({status}): {text}"),
            ))
        }
        Err(e) => Err(Failure::new(
            Exit::Unreachable,
            "unreachable",
            match waymark_tls_pin::find_mismatch(&e) {
                Some(m) => format!(
                    "the control plane at {} presented the certificate {}, not the pinned {}; nothing was sent and Claude Code goes on without it",
                    a.server, m.presented, m.pinned
                ),
                None => format!(
                    "cannot reach the control plane at {}: {e}; Claude Code goes on without it",
                    a.server
                ),
            },
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn install_merges_with_other_hooks_and_uninstall_leaves_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("settings.local.json");
        std::fs::write(
            &path,
            r#"{"model": "opus", "hooks": {"PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "./lint.sh"}]}]}}"#,
        )
        .unwrap();
        let args = |gate: Option<&str>| InstallArgs {
            server: "http://127.0.0.1:9000/".into(),
            token_env: "WAYMARK_TOKEN".into(),
            scope: Scope::Local,
            settings: Some(path.clone()),
            gate: gate.map(str::to_owned),
            defer: false,
            timeout: 300,
            command: false,
        };
        install(args(Some("Bash|Write")), true).unwrap();
        // Installing again replaces ours; it does not add a second copy.
        install(args(Some("Bash")), true).unwrap();
        let s: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(s["model"], "opus");
        let pre = s["hooks"]["PreToolUse"].as_array().unwrap();
        assert_eq!(pre.len(), 2, "the user's lint hook and ours: {pre:?}");
        assert_eq!(pre[0]["hooks"][0]["command"], "./lint.sh");
        let ours = &pre[1]["hooks"][0];
        assert_eq!(ours["type"], "http");
        assert_eq!(
            ours["url"],
            "http://127.0.0.1:9000/v1/adapters/claude-code/hook?timeout=300&gate=Bash"
        );
        assert_eq!(ours["headers"]["Authorization"], "Bearer $WAYMARK_TOKEN");
        assert_eq!(
            ours["allowedEnvVars"],
            json!(["WAYMARK_TOKEN", "CLAUDE_CODE_ENTRYPOINT"])
        );
        assert_eq!(ours["timeout"], 300);
        assert_eq!(s["hooks"]["Stop"][0]["hooks"][0]["timeout"], 10);
        assert_eq!(s["hooks"].as_object().unwrap().len(), EVENTS.len());
        // No `http` hook runs for SessionStart: a command hook, to the same server.
        let start = &s["hooks"]["SessionStart"][0]["hooks"][0];
        assert_eq!(start["type"], "command", "{start}");
        assert_eq!(
            start["command"],
            format!(
                "'{}' adapters claude-code hook --server 'http://127.0.0.1:9000' --query 'timeout=300&gate=Bash'",
                this_binary().unwrap().display()
            )
        );

        uninstall(
            UninstallArgs {
                scope: Scope::Local,
                settings: Some(path.clone()),
            },
            true,
        )
        .unwrap();
        let s: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(
            s,
            json!({"model": "opus", "hooks": {"PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "./lint.sh"}]}]}})
        );
    }

    #[test]
    fn a_broken_settings_file_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("settings.json");
        std::fs::write(&path, "{ not json").unwrap();
        let err = install(
            InstallArgs {
                server: crate::DEFAULT_SERVER.into(),
                token_env: "WAYMARK_TOKEN".into(),
                scope: Scope::Local,
                settings: Some(path.clone()),
                gate: None,
                defer: false,
                timeout: 600,
                command: false,
            },
            true,
        )
        .unwrap_err();
        assert_eq!(err.code, "bad_settings");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{ not json");
    }

    #[test]
    fn command_hooks_go_to_the_server_they_were_installed_for() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("settings.json");
        install(
            InstallArgs {
                server: "https://waymark.example:9443".into(),
                token_env: "CLAUDE_WAYMARK_TOKEN".into(),
                scope: Scope::Local,
                settings: Some(path.clone()),
                gate: None,
                defer: true,
                timeout: 60,
                command: true,
            },
            true,
        )
        .unwrap();
        let s: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for event in EVENTS {
            let h = &s["hooks"][event][0]["hooks"][0];
            assert_eq!(h["type"], "command", "{event}: {h}");
            // The binary by its full path: Claude Code's hook PATH may not hold `waymark`.
            let bin = this_binary().unwrap();
            assert!(bin.is_absolute());
            assert_eq!(
                h["command"],
                format!(
                    "WAYMARK_TOKEN=\"$CLAUDE_WAYMARK_TOKEN\" '{}' adapters claude-code hook --server 'https://waymark.example:9443' --query 'timeout=60&defer=true'",
                    bin.display()
                ),
                "{event}"
            );
        }
        // A name that is not a variable would be run by the shell: refused.
        let err = install(
            InstallArgs {
                server: "http://127.0.0.1:7700".into(),
                token_env: "X; rm -rf ~".into(),
                scope: Scope::Local,
                settings: Some(path.clone()),
                gate: None,
                defer: false,
                timeout: 60,
                command: true,
            },
            true,
        )
        .unwrap_err();
        assert_eq!(err.code, "bad_token_env");
    }

    #[test]
    fn every_command_looks_for_the_server_where_serve_listens() {
        use clap::Parser;
        #[derive(Parser)]
        struct Install {
            #[command(flatten)]
            a: InstallArgs,
        }
        #[derive(Parser)]
        struct Hook {
            #[command(flatten)]
            a: HookArgs,
        }
        #[derive(Parser)]
        struct Adapter {
            #[command(flatten)]
            c: Conn,
        }
        let want = format!("http://{}", crate::DEFAULT_LISTEN);
        assert!(
            std::env::var_os("WAYMARK_SERVER").is_none(),
            "unset WAYMARK_SERVER to run this test: it would win over the defaults under test"
        );
        assert_eq!(Install::try_parse_from(["t"]).unwrap().a.server, want);
        assert_eq!(
            Hook::try_parse_from(["t", "--token", "x"])
                .unwrap()
                .a
                .server,
            want
        );
        assert_eq!(
            Adapter::try_parse_from(["t", "--token", "x"])
                .unwrap()
                .c
                .server,
            want
        );
        assert_eq!(crate::DEFAULT_SERVER, want);
    }
}
