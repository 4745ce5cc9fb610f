//! A fake Claude Code for the `runner-kill` scenario, behind the hidden `chaos-fake-claude`
//! subcommand: `waymark runner --claude` runs it (through a `#!/bin/sh` wrapper) exactly as it
//! runs `claude -p`, and it runs the hooks of its `--settings` file as Claude Code 2.1.328
//! does — the payloads shaped as recorded from it (`waymark-server/tests/fixtures/claude-code/
//! real-2.1.328`) — so the runner, the hooks and recovery are the real ones. Its tool calls
//! apply side effects to a ledger outside it, at most once per idempotency key, so the harness
//! counts what really happened whatever was killed when; and it holds still at a point the
//! harness names, so a `kill -9` lands exactly there.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rand::Rng;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::output::{CliResult, Exit, Failure};

/// Where the fake finds its world (inherited from the runner's environment).
pub(crate) const WORLD_ENV: &str = "WAYMARK_CHAOS_WORLD";

/// What `--version` says (the runner registers the first word with a digit).
const VERSION: &str = "0.0.0 (waymark chaos: a fake Claude Code)";

/// How long the fake holds still at a point before it gives up and ends by itself.
const HOLD_AT_MOST: Duration = Duration::from_secs(60);

/// `claude`'s command line, taken as it comes.
#[derive(Debug, clap::Args)]
#[command(disable_help_flag = true)]
pub(crate) struct FakeArgs {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

/// The files of one run's world, shared by the fake and the harness: the external side
/// effects (the ledger), what the fake did (its journal), the sessions it keeps (as Claude
/// Code keeps its transcripts), and where it is told to hold still.
#[derive(Debug, Clone)]
pub(crate) struct World {
    dir: PathBuf,
}

impl World {
    pub(crate) fn new(dir: PathBuf) -> std::io::Result<World> {
        std::fs::create_dir_all(dir.join("sessions"))?;
        Ok(World { dir })
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where Claude Code keeps a session's transcript: `$CLAUDE_CONFIG_DIR/projects/<the
    /// project>/<session>.jsonl` (what a runner looks for before it begins a session again).
    fn session(&self, key: &str) -> PathBuf {
        let base = std::env::var_os("CLAUDE_CONFIG_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| self.dir.join("claude-config"));
        base.join("projects")
            .join("chaos")
            .join(format!("{key}.jsonl"))
    }

    fn ledger(&self) -> PathBuf {
        self.dir.join("ledger.jsonl")
    }

    fn journal(&self) -> PathBuf {
        self.dir.join("journal.jsonl")
    }

    fn hold(&self) -> PathBuf {
        self.dir.join("hold")
    }

    fn holding(&self) -> PathBuf {
        self.dir.join("holding")
    }

    /// The side effects applied: `(call, key)`, in order.
    pub(crate) fn applied(&self) -> Vec<(String, String)> {
        lines(&self.ledger())
            .into_iter()
            .map(|v| (str_of(&v, "call"), str_of(&v, "key")))
            .collect()
    }

    /// Everything the fake wrote in its journal, in order.
    pub(crate) fn journal_entries(&self) -> Vec<Value> {
        lines(&self.journal())
    }

    /// Names the point the next fake to reach it holds still at (`none`: nowhere), and
    /// forgets where one held before.
    pub(crate) fn set_hold(&self, point: &str) -> std::io::Result<()> {
        let _ = std::fs::remove_file(self.holding());
        write_whole(&self.hold(), point)
    }

    /// The point a fake holds still at now, and its pid.
    pub(crate) fn holding_at(&self) -> Option<(String, u32)> {
        let t = std::fs::read_to_string(self.holding()).ok()?;
        let (point, pid) = t.trim().split_once(' ')?;
        Some((point.to_owned(), pid.parse().ok()?))
    }

    fn wanted_hold(&self) -> String {
        std::fs::read_to_string(self.hold())
            .map(|t| t.trim().to_owned())
            .unwrap_or_default()
    }

    fn note(&self, entry: Value) {
        let mut e = entry;
        e["pid"] = json!(std::process::id());
        if let Err(err) = append_line(&self.journal(), &e) {
            tracing::warn!(error = %err, "cannot write the journal");
        }
    }
}

fn str_of(v: &Value, k: &str) -> String {
    v[k].as_str().unwrap_or_default().to_owned()
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn append_line(path: &Path, v: &Value) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    // One write of one line: a kill between two lines never leaves half of one.
    f.write_all(format!("{v}\n").as_bytes())
}

fn write_whole(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(tmp, path)
}

/// The prompt the harness starts a run with, naming its calls.
pub(crate) fn prompt(calls: &[String]) -> String {
    format!(
        "Chaos run. Make these calls, in order, each once: {}",
        calls.join(" ")
    )
}

/// The command line of one call, as the tool call carries it (and the resume note names it).
pub(crate) fn command_of(call: &str) -> String {
    format!("chaos-effect {call}")
}

/// The call a tool call's command makes.
pub(crate) fn call_of(command: &str) -> Option<&str> {
    command.strip_prefix("chaos-effect ").map(str::trim)
}

fn calls_in(prompt: &str) -> Vec<String> {
    prompt
        .rsplit_once(':')
        .map(|(_, calls)| calls.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// The calls a resume note lists as done (confirmed; not to be run again). A model reads the
/// note; so does this fake, and nothing else tells it what is done.
fn done_in(note: &str) -> Vec<String> {
    let mut done = Vec::new();
    let mut in_done = false;
    for line in note.lines() {
        if let Some(item) = line.strip_prefix("- ") {
            if in_done && let Some(call) = item.strip_prefix("Bash: ").and_then(call_of) {
                done.push(call.to_owned());
            }
        } else {
            in_done = line.starts_with("Done");
        }
    }
    done
}

pub(crate) async fn run(a: FakeArgs) -> CliResult {
    fake(a.args)
        .await
        .map_err(|e| Failure::new(Exit::Refused, "fake_claude", format!("{e:#}")))
}

/// How `claude -p` was asked to run.
struct Invocation {
    session: String,
    resume: bool,
    settings: PathBuf,
    /// `--input-format stream-json`: the prompt comes as JSON user messages.
    stream: bool,
}

fn parse(args: &[String]) -> anyhow::Result<Option<Invocation>> {
    let mut session = None;
    let mut resume = false;
    let mut settings = None;
    let mut stream = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--version" => return Ok(None),
            "-p" | "--print" => {}
            "--session-id" => session = it.next().cloned(),
            "--resume" => {
                resume = true;
                session = it.next().cloned();
            }
            "--settings" => settings = it.next().map(PathBuf::from),
            "--output-format" | "--permission-prompt-tool" => {
                it.next();
            }
            "--input-format" => stream = it.next().is_some_and(|f| f == "stream-json"),
            "--verbose" => {}
            other => bail!("unknown argument `{other}`"),
        }
    }
    Ok(Some(Invocation {
        session: session.context("--session-id or --resume is required")?,
        resume,
        settings: settings.context("--settings is required")?,
        stream,
    }))
}

/// The prompt of a stream-json input: its user messages' text, one after another.
fn stream_prompt(input: &str) -> String {
    input
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|m| m["type"] == "user")
        .filter_map(|m| m["message"]["content"].as_str().map(str::to_owned))
        .collect::<Vec<_>>()
        .join("\n")
}

async fn fake(args: Vec<String>) -> anyhow::Result<()> {
    let Some(inv) = parse(&args)? else {
        println!("{VERSION}");
        return Ok(());
    };
    let world = World::new(PathBuf::from(
        std::env::var_os(WORLD_ENV).with_context(|| format!("${WORLD_ENV} is not set"))?,
    ))?;
    let mut input = String::new();
    tokio::io::stdin().read_to_string(&mut input).await?;
    if inv.stream {
        input = stream_prompt(&input);
    }
    let settings: Value = serde_json::from_slice(
        &std::fs::read(&inv.settings)
            .with_context(|| format!("reading {}", inv.settings.display()))?,
    )?;
    let session_file = world.session(&inv.session);
    let (calls, done) = if inv.resume {
        let s: Value =
            serde_json::from_slice(&std::fs::read(&session_file).with_context(|| {
                format!("No conversation found with session ID: {}", inv.session)
            })?)?;
        (calls_in(&str_of(&s, "prompt")), done_in(&input))
    } else {
        if session_file.exists() {
            bail!("Session ID {} is already in use", inv.session);
        }
        if let Some(dir) = session_file.parent() {
            std::fs::create_dir_all(dir)?;
        }
        write_whole(
            &session_file,
            &json!({"prompt": input, "session_id": inv.session}).to_string(),
        )?;
        (calls_in(&input), Vec::new())
    };
    world.note(json!({"event": "started", "resume": inv.resume, "calls": calls, "done": done}));
    let hooks = Hooks {
        settings,
        base: json!({
            "session_id": inv.session,
            "transcript_path": world.dir.join("sessions").join(format!("{}.jsonl", inv.session)),
            "cwd": std::env::current_dir()?,
        }),
        world: world.clone(),
    };
    let prompt_id = uuid();
    if !inv.resume {
        hold(&world, "start").await?;
    }
    let source = if inv.resume { "resume" } else { "startup" };
    hooks
        .fire("SessionStart", None, json!({"source": source}))
        .await;
    hooks
        .fire(
            "UserPromptSubmit",
            None,
            json!({"prompt_id": prompt_id, "permission_mode": "default", "prompt": input}),
        )
        .await;
    let mut made = Vec::new();
    for call in calls.iter().filter(|c| !done.contains(c)) {
        let tool_use_id = format!("toolu_chaos_{:016x}", rand::thread_rng().r#gen::<u64>());
        let key = format!("{}:{tool_use_id}", inv.session);
        let tool_input =
            json!({"command": command_of(call), "description": format!("Apply {call}")});
        let call_fields = json!({
            "prompt_id": prompt_id,
            "permission_mode": "default",
            "effort": {"level": "medium"},
            "tool_name": "Bash",
            "tool_input": tool_input,
            "tool_use_id": tool_use_id,
        });
        let answers = hooks
            .fire("PreToolUse", Some(call), call_fields.clone())
            .await;
        let stop = answers.iter().any(|a| a["continue"] == false);
        let denied = stop
            || answers
                .iter()
                .any(|a| a["hookSpecificOutput"]["permissionDecision"] == "deny");
        if denied {
            world.note(json!({"event": "denied", "call": call, "stop": stop}));
            if stop {
                return Ok(());
            }
            continue;
        }
        hold(&world, &format!("pre:{call}")).await?;
        let started = Instant::now();
        let applied = apply(&world, call, &key)?;
        world.note(json!({"event": "effect", "call": call, "key": key, "applied": applied}));
        hold(&world, &format!("effect:{call}")).await?;
        let mut post = call_fields;
        post["tool_response"] = json!({
            "stdout": format!("{call} applied"), "stderr": "", "interrupted": false,
            "isImage": false, "noOutputExpected": false,
        });
        post["duration_ms"] = json!(started.elapsed().as_millis() as u64);
        hooks.fire("PostToolUse", Some(call), post).await;
        hold(&world, &format!("post:{call}")).await?;
        made.push(call.clone());
    }
    let last = format!("Chaos run done: {}.", calls.join(" "));
    hooks
        .fire(
            "Stop",
            None,
            json!({"prompt_id": prompt_id, "permission_mode": "default", "stop_hook_active": false,
                   "last_assistant_message": last, "background_tasks": [], "session_crons": []}),
        )
        .await;
    hold(&world, "stop").await?;
    hooks
        .fire(
            "SessionEnd",
            None,
            json!({"prompt_id": prompt_id, "reason": "other"}),
        )
        .await;
    world.note(json!({"event": "finished", "made": made}));
    println!(
        "{}",
        json!({"type": "result", "subtype": "success", "is_error": false, "result": last,
               "session_id": inv.session})
    );
    Ok(())
}

/// Holds still while the harness names `point`, so its `kill -9` lands exactly there; gives up
/// after [`HOLD_AT_MOST`], so a run always ends by itself.
async fn hold(world: &World, point: &str) -> anyhow::Result<()> {
    if world.wanted_hold() != point {
        return Ok(());
    }
    world.note(json!({"event": "holding", "point": point}));
    write_whole(&world.holding(), &format!("{point} {}", std::process::id()))?;
    let deadline = Instant::now() + HOLD_AT_MOST;
    while world.wanted_hold() == point {
        if Instant::now() > deadline {
            bail!("held at {point} for {HOLD_AT_MOST:?} and nobody came");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// The call's side effect: at most once per idempotency key, like a provider that honours
/// one. Whether it was applied now.
fn apply(world: &World, call: &str, key: &str) -> anyhow::Result<bool> {
    if world.applied().iter().any(|(_, k)| k == key) {
        return Ok(false);
    }
    append_line(&world.ledger(), &json!({"call": call, "key": key}))?;
    Ok(true)
}

fn uuid() -> String {
    let b: [u8; 16] = rand::thread_rng().r#gen();
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// The hooks of the settings file, run as Claude Code runs them.
struct Hooks {
    settings: Value,
    /// The fields every payload carries.
    base: Value,
    world: World,
}

impl Hooks {
    /// Runs every handler of `event` whose matcher takes `tool`; their answers (`{}` when a
    /// hook answered nothing usable — Claude Code goes on then, and so does this).
    async fn fire(&self, event: &str, call: Option<&str>, fields: Value) -> Vec<Value> {
        let mut payload = self.base.clone();
        payload["hook_event_name"] = json!(event);
        for (k, v) in fields.as_object().into_iter().flatten() {
            payload[k] = v.clone();
        }
        let tool = payload["tool_name"].as_str().map(str::to_owned);
        let mut answers = Vec::new();
        let groups = self.settings["hooks"][event].as_array().cloned();
        for group in groups.into_iter().flatten() {
            if !matches(group["matcher"].as_str(), tool.as_deref()) {
                continue;
            }
            for h in group["hooks"].as_array().into_iter().flatten() {
                let timeout = Duration::from_secs(h["timeout"].as_u64().unwrap_or(600));
                let (status, answer) = match h["type"].as_str() {
                    Some("command") => command_hook(h, &payload, timeout).await,
                    Some("http") => http_hook(h, &payload, timeout).await,
                    _ => (None, json!({})),
                };
                self.world.note(json!({
                    "event": "hook", "hook": event, "call": call,
                    "key": payload["tool_use_id"].as_str().map(|t| format!("{}:{t}", str_of(&payload, "session_id"))),
                    "status": status,
                }));
                answers.push(answer);
            }
        }
        answers
    }
}

/// Claude Code's matcher: empty or `*` takes every tool, else a regex of tool names.
fn matches(matcher: Option<&str>, tool: Option<&str>) -> bool {
    match matcher {
        None | Some("" | "*") => true,
        Some(m) => match (regex::Regex::new(&format!("^(?:{m})$")), tool) {
            (Ok(r), Some(t)) => r.is_match(t),
            _ => false,
        },
    }
}

/// A `command` hook: through a shell, the payload on stdin, its stdout the answer; exit 2
/// blocks (a deny, for `PreToolUse`).
async fn command_hook(h: &Value, payload: &Value, timeout: Duration) -> (Option<u16>, Value) {
    let Some(cmd) = h["command"].as_str() else {
        return (None, json!({}));
    };
    let spawned = tokio::process::Command::new("sh")
        .args(["-c", cmd])
        // Claude Code sets its entrypoint itself; `-p` is `sdk-cli`.
        .env("CLAUDE_CODE_ENTRYPOINT", "sdk-cli")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    let Ok(mut child) = spawned else {
        return (None, json!({}));
    };
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(payload.to_string().as_bytes()).await;
    }
    match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Ok(Ok(out)) => {
            let code = out.status.code();
            let answer = if code == Some(2) {
                json!({"hookSpecificOutput": {"permissionDecision": "deny"}})
            } else {
                serde_json::from_slice(&out.stdout).unwrap_or_else(|_| json!({}))
            };
            (code.map(|c| c as u16), answer)
        }
        _ => (None, json!({})),
    }
}

/// An `http` hook: the payload POSTed, the headers' `$VAR`s filled from `allowedEnvVars` only.
async fn http_hook(h: &Value, payload: &Value, timeout: Duration) -> (Option<u16>, Value) {
    let Some(url) = h["url"].as_str() else {
        return (None, json!({}));
    };
    let allowed: Vec<&str> = h["allowedEnvVars"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let client = reqwest::Client::new();
    let mut req = client.post(url).timeout(timeout).json(payload);
    for (name, v) in h["headers"].as_object().into_iter().flatten() {
        let mut value = v.as_str().unwrap_or_default().to_owned();
        for var in &allowed {
            let with = if *var == "CLAUDE_CODE_ENTRYPOINT" {
                "sdk-cli".to_owned()
            } else {
                std::env::var(var).unwrap_or_default()
            };
            value = value
                .replace(&format!("${{{var}}}"), &with)
                .replace(&format!("${var}"), &with);
        }
        req = req.header(name, value);
    }
    match req.send().await {
        Ok(res) => {
            let status = res.status().as_u16();
            let answer = if res.status().is_success() {
                res.json().await.unwrap_or_else(|_| json!({}))
            } else {
                json!({})
            };
            (Some(status), answer)
        }
        Err(_) => (None, json!({})),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_note_tells_what_is_done_and_the_prompt_what_to_do() {
        let calls: Vec<String> = ["c1", "c2", "c3"].map(String::from).to_vec();
        assert_eq!(calls_in(&prompt(&calls)), calls);
        let note = "Waymark: this session was interrupted (signal 9) and is resumed now. From Waymark's record:\n\
            Done — these calls ran and are confirmed; do not run them again:\n- Bash: chaos-effect c1\n- Bash: chaos-effect c3\n\
            Not finished — check before relying on them:\n- Bash: chaos-effect c2\nContinue the task from where it stands.";
        assert_eq!(done_in(note), ["c1", "c3"]);
        assert!(done_in("No tool call was recorded yet.").is_empty());
        assert!(matches(Some("*"), Some("Bash")));
        assert!(matches(Some("Bash|Write"), Some("Bash")));
        assert!(!matches(Some("Write"), Some("Bash")));
    }
}
