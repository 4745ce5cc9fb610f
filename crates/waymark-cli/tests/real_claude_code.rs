//! Claude Code through Waymark as a person sets it up, against the REAL Claude Code
//! (`@anthropic-ai/claude-code@2.1.328` from npm, its native binary installed by
//! `scripts/setup-debian` under `$WAYMARK_RUNTIMES_DIR/claude-code`, default
//! `~/.cache/waymark-runtimes/claude-code`): a real `waymark serve`, the hooks written by
//! `waymark adapters claude-code install`, a device paired with `waymark pair` answering from its
//! inbox with `waymark approve` / `waymark deny`, and `claude -p` pointed at a fake Anthropic API
//! (`real_claude_code/fake_anthropic.rs`) that asks `Bash` to `touch` a file.
//!
//! Four runs, each its own session: approved (the file appears, the effect is confirmed with
//! the tool's output as receipt), denied (no file, the effect closed as not run, Claude Code
//! tells the model it was denied), edited before approval (`waymark approve --edit-command`:
//! Claude Code runs the person's command through `updatedInput`, not its own), and unanswered
//! until the hook's timeout (in `-p` Claude Code denies the call: the approval expires, the
//! effect is closed as not run). Each run is one task
//! with one attempt, its session start seen through the `SessionStart` command hook.
//!
//! Claude Code never reaches the internet: its only base URL is the fake, with telemetry,
//! non-essential traffic and the auto-updater off, in a private `HOME`/`CLAUDE_CONFIG_DIR`.
//! The test fails — never skips — when the runtime is not installed; every process it starts
//! is killed when it ends, passing or not.

#[path = "real_claude_code/fake_anthropic.rs"]
mod fake_anthropic;
#[path = "real_claude_code/hook_recorder.rs"]
mod hook_recorder;
mod runner_world;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fake_anthropic::{FakeAnthropic, Turn};
use hook_recorder::HookRecorder;
use serde_json::{Value, json};

/// The version `scripts/setup-debian` installs and this test was written against.
const CLAUDE_CODE_VERSION: &str = "2.1.328";
/// How long one `claude -p` run may take, the wait for a person included.
const RUN: Duration = Duration::from_secs(120);

// ---- the installed runtime -------------------------------------------------------------------

/// The installed `claude` binary, or a failure that says how to install it.
fn claude_binary() -> PathBuf {
    let base = std::env::var_os("WAYMARK_RUNTIMES_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/waymark-runtimes"))
        })
        .expect("neither WAYMARK_RUNTIMES_DIR nor HOME is set: cannot find the real Claude Code");
    let dir = base.join("claude-code");
    let bin = dir.join("node_modules/@anthropic-ai/claude-code-linux-x64/claude");
    let stamp = std::fs::read_to_string(dir.join("installed")).unwrap_or_default();
    assert!(
        bin.exists() && stamp.contains(&format!("@anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}")),
        "the real Claude Code {CLAUDE_CODE_VERSION} is not installed in `{}` (installed: `{}`; \
         binary {} {}) — run `scripts/setup-debian`, which installs it there \
         (set WAYMARK_RUNTIMES_DIR to use another place)",
        dir.display(),
        stamp.trim(),
        bin.display(),
        if bin.exists() { "present" } else { "missing" },
    );
    bin
}

// ---- waymark ---------------------------------------------------------------------------------

fn waymark() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_waymark"));
    c.env_remove("WAYMARK_DATA_DIR")
        .env_remove("WAYMARK_SERVER")
        .env_remove("WAYMARK_TOKEN")
        .env_remove("WAYMARK_KEYSTORE")
        .env("WAYMARK_LOG", "error");
    c
}

fn run_ok(mut c: Command) -> Value {
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{c:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

/// `waymark serve`, killed when dropped.
struct Serving(Child, String);

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(data: &Path) -> Serving {
    let mut child = waymark()
        .args(["serve", "--json", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let v: Value = serde_json::from_str(&line).unwrap();
    Serving(child, v["listening"].as_str().unwrap().to_owned())
}

fn admin(data: &Path, args: &[&str]) -> Value {
    let mut c = waymark();
    c.arg("admin")
        .args(args)
        .args(["--json", "--data-dir"])
        .arg(data);
    run_ok(c)
}

/// The terminal client of alice's paired device.
fn device(home: &Path, args: &[&str]) -> Value {
    let mut c = waymark();
    c.env("WAYMARK_HOME", home)
        .env("WAYMARK_KEYSTORE", "file-insecure")
        .args(args);
    run_ok(c)
}

// ---- one Claude Code run ---------------------------------------------------------------------

/// A private Claude Code: its own HOME and config dir, and a project directory.
struct Setup {
    dir: tempfile::TempDir,
    claude: PathBuf,
    model: FakeAnthropic,
    token: String,
}

impl Setup {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// What Claude Code runs with here: a private home and config, the fake model, no
    /// telemetry, no non-essential traffic, no auto-update.
    fn claude_env(&self) -> Vec<(&'static str, std::ffi::OsString)> {
        vec![
            ("HOME", self.path("home").into()),
            ("CLAUDE_CONFIG_DIR", self.path("home/.claude").into()),
            ("TMPDIR", self.path("tmp").into()),
            ("ANTHROPIC_BASE_URL", self.model.base_url.clone().into()),
            ("ANTHROPIC_API_KEY", "dummy".into()),
            ("DISABLE_TELEMETRY", "1".into()),
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".into()),
            ("DISABLE_AUTOUPDATER", "1".into()),
        ]
    }

    /// `waymark adapters claude-code install` into the project's local settings.
    fn install(&self, server: &str, timeout: u64) {
        self.install_with(server, timeout, &[]);
    }

    /// `install` with more of its flags (`--gate Bash --defer`).
    fn install_with(&self, server: &str, timeout: u64, more: &[&str]) {
        let mut c = waymark();
        c.args([
            "adapters",
            "claude-code",
            "install",
            "--json",
            "--server",
            server,
        ])
        .args(["--timeout", &timeout.to_string(), "--settings"])
        .arg(self.path("project/.claude/settings.local.json"))
        .args(more);
        run_ok(c);
    }

    /// `claude -p PROMPT --output-format json` in the project, in a process group of its own
    /// (killed, with whatever it started, when dropped).
    fn start(&self, prompt: &str) -> Claude {
        self.start_with(&["-p", prompt])
    }

    /// `claude ARGS --output-format json` (`-p PROMPT`, or `-p --resume SESSION`).
    fn start_with(&self, args: &[&str]) -> Claude {
        let bin_dir = Path::new(env!("CARGO_BIN_EXE_waymark")).parent().unwrap();
        // The SessionStart command hook runs `waymark` from PATH, as for a user.
        let path = std::env::join_paths(
            std::iter::once(bin_dir.to_owned())
                .chain(["/usr/local/bin", "/usr/bin", "/bin"].map(PathBuf::from)),
        )
        .unwrap();
        let out = self.path(&format!("claude-{}.out", rand_suffix()));
        let mut cmd = tokio::process::Command::new(&self.claude);
        cmd.args(args)
            .args(["--output-format", "json"])
            .current_dir(self.path("project"))
            .env_clear()
            .env("PATH", path)
            .envs(self.claude_env())
            .env("WAYMARK_TOKEN", &self.token)
            .env("WAYMARK_LOG", "error")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(Stdio::inherit())
            .process_group(0)
            .kill_on_drop(true);
        Claude {
            child: cmd.spawn().expect("the real `claude` starts"),
            out,
            started: Instant::now(),
        }
    }
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

struct Claude {
    child: tokio::process::Child,
    out: PathBuf,
    started: Instant,
}

impl Drop for Claude {
    fn drop(&mut self) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .stderr(Stdio::null())
                .status();
        }
        let _ = self.child.start_kill();
    }
}

impl Claude {
    /// Waits for the run to end; its `--output-format json` result.
    async fn result(&mut self) -> Value {
        let status = tokio::time::timeout(RUN, self.child.wait())
            .await
            .expect("claude -p ended in time")
            .unwrap();
        let text = std::fs::read_to_string(&self.out).unwrap();
        assert!(status.success(), "claude -p failed ({status}): {text}");
        eprintln!("claude -p ran {:?}", self.started.elapsed());
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
    }
}

// ---- reading the control plane ---------------------------------------------------------------

/// The device's inbox after a sync: waits for the pending decision of a Claude Code task whose
/// summary names `command`.
async fn pending_in_inbox(home: &Path, command: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        device(home, &["sync", "--json"]);
        let inbox = device(home, &["inbox", "--json"]);
        if let Some(item) = inbox.as_array().and_then(|a| {
            a.iter().find(|i| {
                i["decision"]["question"]
                    .as_str()
                    .is_some_and(|q| q.contains(command))
            })
        }) {
            return item.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no decision about `{command}` reached the inbox: {inbox}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn task_detail(server: &str, token: &str, task: &str) -> Value {
    reqwest::Client::new()
        .get(format!("{server}/v1/tasks/{task}"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The task of a session, found the way the hook finds it: by the runtime's key.
async fn session_task(server: &str, token: &str, session: &str) -> String {
    let res = reqwest::Client::new()
        .post(format!("{server}/v1/tasks"))
        .bearer_auth(token)
        .json(&json!({"title": "x", "runtime": "claude-code", "external_key": session}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        res.status(),
        200,
        "the hooks made the session's task already"
    );
    res.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn texts(detail: &Value) -> Vec<String> {
    detail["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            format!(
                "{}: {}",
                m["role"].as_str().unwrap_or(""),
                m["text"].as_str().unwrap_or("")
            )
        })
        .collect()
}

/// What every run shares: one task, one attempt (the run), its start seen, the prompt kept,
/// one `Bash` effect; returns the detail.
async fn one_run_one_attempt(server: &str, token: &str, result: &Value, prompt: &str) -> Value {
    let session = result["session_id"].as_str().expect("a session id");
    let task = session_task(server, token, session).await;
    let d = task_detail(server, token, &task).await;
    assert_eq!(d["task"]["runtime"], "claude-code", "{d}");
    let attempts = d["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "one run, one attempt: {attempts:#?}");
    assert_eq!(attempts[0]["state"], "finished", "{attempts:#?}");
    let said = texts(&d);
    assert!(
        said.iter()
            .any(|t| t == "system: Claude Code session started (startup)"),
        "the SessionStart command hook reported the start: {said:#?}"
    );
    assert!(
        said.iter().any(|t| t == &format!("user: {prompt}")),
        "{said:#?}"
    );
    let effects = d["effects"].as_array().unwrap();
    assert_eq!(effects.len(), 1, "{effects:#?}");
    assert_eq!(effects[0]["kind"], "claude_code.Bash");
    d
}

// ---- the story -------------------------------------------------------------------------------

/// A served control plane with alice's worker token and paired phone, and a private Claude
/// Code whose model plays `turns`.
struct World {
    setup: Setup,
    server: Serving,
    url: String,
    phone: PathBuf,
}

/// `turns` is given the project directory (where the commands make their files).
async fn world(turns: impl FnOnce(&Path) -> Vec<Turn>) -> World {
    let claude = claude_binary();
    let dir = tempfile::tempdir().unwrap();
    for d in ["data", "device", "home/.claude", "project/.claude", "tmp"] {
        std::fs::create_dir_all(dir.path().join(d)).unwrap();
    }
    let project = dir.path().join("project").canonicalize().unwrap();
    // A repository, as a person's project is: a runner's run records its working tree.
    runner_world::git_project(&project);
    let model = FakeAnthropic::start(turns(&project)).await;
    let data = dir.path().join("data");
    admin(&data, &["user", "add", "alice"]);
    let token = admin(
        &data,
        &["worker-token", "--name", "claude", "--user", "alice"],
    )["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let server = serve(&data);
    let url = server.1.clone();
    let link = admin(&data, &["pair", "--user", "alice"])["link"]
        .as_str()
        .unwrap()
        .to_owned();
    let phone = dir.path().join("device");
    device(
        &phone,
        &["pair", &link, "--name", "alice's phone", "--json"],
    );
    World {
        setup: Setup {
            dir,
            claude,
            model,
            token,
        },
        server,
        url,
        phone,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_asks_the_inbox_and_does_what_the_person_or_its_timeout_decided() {
    let turns = |project: &Path| {
        let file = |name: &str| project.join(name);
        vec![
            Turn {
                prompt: "make the approved file".into(),
                command: format!("touch {}", file("approved").display()),
                answer: "Approved run finished.".into(),
            },
            Turn {
                prompt: "make the denied file".into(),
                command: format!("touch {}", file("denied").display()),
                answer: "Denied run finished.".into(),
            },
            Turn {
                prompt: "make the unanswered file".into(),
                command: format!("touch {}", file("unanswered").display()),
                answer: "Unanswered run finished.".into(),
            },
            Turn {
                prompt: "make the file the person will rename".into(),
                command: format!("touch {}", file("asked").display()),
                answer: "Edited run finished.".into(),
            },
        ]
    };
    let World {
        setup,
        server,
        url,
        phone,
    } = world(turns).await;
    let token = setup.token.clone();
    let project = setup.path("project").canonicalize().unwrap();
    let turns = turns(&project);
    let file = |name: &str| project.join(name);
    setup.install(&url, 120);

    // 1. Approved from the device: the command runs, the effect gets its receipt.
    let mut run = setup.start(&turns[0].prompt);
    let item = pending_in_inbox(&phone, &turns[0].command).await;
    // The hook carries Claude Code's own entrypoint (`sdk-cli` under `-p`): the approval says
    // Claude Code denies at the hook's timeout, as it does here, not that it asks.
    assert_eq!(
        item["decision"]["runtime_deadline"]["then"], "denies",
        "{item}"
    );
    let decision = item["decision"]["id"].as_str().unwrap().to_owned();
    let options: Vec<&str> = item["decision"]["options"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["label"].as_str().unwrap())
        .collect();
    assert!(
        options.iter().any(|l| l.contains("acceptEdits")),
        "the option that applies Claude Code's suggestions says it switches the mode: {options:?}"
    );
    let asked = Instant::now();
    device(&phone, &["approve", &decision, "--json"]);
    while !file("approved").exists() && asked.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(file("approved").exists(), "approved: the command ran");
    eprintln!("approve → file made: {:?}", asked.elapsed());
    let result = run.result().await;
    assert_eq!(result["permission_denials"], json!([]), "{result}");
    assert!(
        result["result"].as_str().unwrap().contains("[tool ok"),
        "{result}"
    );
    let d = one_run_one_attempt(&url, &token, &result, &turns[0].prompt).await;
    let effect = &d["effects"][0];
    assert_eq!(effect["status"], "confirmed", "{effect}");
    assert_eq!(
        effect["intent"]["input"]["command"],
        turns[0].command.as_str()
    );
    assert!(effect["receipt"]["tool_response"].is_object(), "{effect}");
    let dec = &d["decisions"][0];
    assert_eq!(dec["status"], "resolved", "{dec}");
    assert_eq!(dec["outcome"]["option"], "approve", "{dec}");
    assert_eq!(
        dec["effect_id"], effect["id"],
        "the prompt is about this call"
    );
    assert_eq!(dec["delivery"]["state"], "acknowledged", "{dec}");
    assert!(
        texts(&d)
            .iter()
            .any(|t| t.starts_with("assistant: Approved run finished.")),
        "{:#?}",
        texts(&d)
    );

    // 2. Denied from the device: no file; the effect is closed as not run.
    let mut run = setup.start(&turns[1].prompt);
    let item = pending_in_inbox(&phone, &turns[1].command).await;
    let decision = item["decision"]["id"].as_str().unwrap().to_owned();
    device(&phone, &["deny", &decision, "--json"]);
    let result = run.result().await;
    assert!(!file("denied").exists(), "denied: the command did not run");
    assert_eq!(
        result["permission_denials"][0]["tool_name"], "Bash",
        "{result}"
    );
    let said = result["result"].as_str().unwrap();
    assert!(
        said.contains("[tool error") && said.contains("via Waymark"),
        "the model was told who denied it: {said}"
    );
    let d = one_run_one_attempt(&url, &token, &result, &turns[1].prompt).await;
    let effect = &d["effects"][0];
    assert_eq!(effect["status"], "failed", "{effect}");
    assert_eq!(effect["receipt"]["not_run"], true, "{effect}");
    assert!(
        effect["receipt"]["reason"]
            .as_str()
            .unwrap()
            .contains("denied"),
        "{effect}"
    );
    assert_eq!(d["decisions"][0]["outcome"]["option"], "deny");

    // 3. Edited before it was approved: Claude Code runs the person's command, not its own.
    let mut run = setup.start(&turns[3].prompt);
    let item = pending_in_inbox(&phone, &turns[3].command).await;
    assert_eq!(item["decision"]["editable"], "/input", "{item}");
    let decision = item["decision"]["id"].as_str().unwrap().to_owned();
    let edited = format!("touch {}", file("edited").display());
    let signed = device(
        &phone,
        &["approve", &decision, "--edit-command", &edited, "--json"],
    );
    assert_eq!(signed["status"], "delivered", "{signed}");
    let result = run.result().await;
    assert!(file("edited").exists(), "the edited command ran");
    assert!(!file("asked").exists(), "the command asked did not");
    let d = one_run_one_attempt(&url, &token, &result, &turns[3].prompt).await;
    let dec = &d["decisions"][0];
    assert_eq!(dec["intent"]["input"]["command"], turns[3].command.as_str());
    assert_eq!(
        dec["outcome"]["edited_intent"]["input"]["command"],
        edited.as_str(),
        "{dec}"
    );
    assert_eq!(dec["delivery"]["state"], "acknowledged", "{dec}");
    let effect = &d["effects"][0];
    assert_eq!(effect["status"], "confirmed", "{effect}");
    assert_eq!(
        effect["intent"]["input"]["command"],
        edited.as_str(),
        "the effect is what ran: {effect}"
    );

    // 4. Nobody answers before the hook's timeout: in `-p` Claude Code denies the call.
    setup.install(&url, 5);
    let mut run = setup.start(&turns[2].prompt);
    let started = Instant::now();
    let result = run.result().await;
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the hook answered before its timeout"
    );
    assert!(
        !file("unanswered").exists(),
        "unanswered: the command did not run"
    );
    assert_eq!(
        result["permission_denials"][0]["tool_name"], "Bash",
        "in -p an unanswered permission is a denial: {result}"
    );
    let d = one_run_one_attempt(&url, &token, &result, &turns[2].prompt).await;
    let dec = &d["decisions"][0];
    assert_eq!(dec["status"], "expired", "{dec}");
    assert_eq!(
        dec["outcome"]["option"],
        Value::Null,
        "never approved: {dec}"
    );
    assert!(
        dec["outcome"]["text"]
            .as_str()
            .unwrap()
            .contains("`claude -p` denies"),
        "{dec}"
    );
    let effect = &d["effects"][0];
    assert_eq!(effect["status"], "failed", "{effect}");
    assert_eq!(effect["receipt"]["not_run"], true, "{effect}");
    assert!(
        effect["receipt"]["reason"]
            .as_str()
            .unwrap()
            .contains("expired"),
        "{effect}"
    );

    // Claude Code spoke only to the fake, and the fake saw the three prompts.
    let requests = setup.model.requests();
    for t in &turns {
        assert!(
            requests.iter().any(|r| r.to_string().contains(&t.prompt)),
            "the fake saw `{}`",
            t.prompt
        );
    }
    drop(server);
}

/// The hook calls of a run whose event is `event`, in order.
fn calls_of<'a>(calls: &'a [Value], event: &str) -> Vec<&'a Value> {
    calls
        .iter()
        .filter(|c| c["input"]["hook_event_name"] == event)
        .collect()
}

/// `defer` and `addRules` as the real Claude Code does them, through a recording proxy
/// (`WAYMARK_RECORD_FIXTURES` keeps the hook calls: how
/// `waymark-server/tests/fixtures/claude-code/real-2.1.328/{defer,rules}.calls.jsonl` were
/// recorded).
///
/// 1. `install --gate Bash --defer`: the gated `PreToolUse` is answered `defer`; `claude -p`
///    ends at once with `stop_reason: tool_deferred` and nothing run; the approval waits in the
///    inbox, durable. Approved on the phone; `claude -p --resume SESSION` fires `PreToolUse`
///    again, is answered `allow`, and the command runs.
/// 2. A command Claude Code suggests an `addRules` for: approved on the phone with
///    `approve_always` — the `PermissionRequest` is answered `allow` with that rule as
///    `updatedPermissions`, the command runs, and Claude Code writes the rule to the project's
///    local settings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_defers_until_a_person_answers_and_allow_always_adds_its_rule() {
    let rule_command = "python3 -c 'print(40 + 2)'";
    let turns = |project: &Path| {
        vec![
            Turn {
                prompt: "make the deferred file".into(),
                command: format!("touch {}", project.join("deferred").display()),
                answer: "Deferred run finished.".into(),
            },
            Turn {
                prompt: "print a number with python".into(),
                command: rule_command.into(),
                answer: "Rule run finished.".into(),
            },
            Turn {
                prompt: "make the file that waits for me".into(),
                command: format!("touch {}", project.join("waited").display()),
                answer: "Waited run finished.".into(),
            },
        ]
    };
    let w = world(turns).await;
    let project = w.setup.path("project").canonicalize().unwrap();
    let turns = turns(&project);
    let recorder = HookRecorder::start(&w.url).await;

    // ---- 1. defer, then resume ------------------------------------------------------------
    w.setup
        .install_with(&recorder.url, 120, &["--gate", "Bash", "--defer"]);
    let started = Instant::now();
    let result = w.setup.start(&turns[0].prompt).result().await;
    assert_eq!(result["stop_reason"], "tool_deferred", "{result}");
    assert_eq!(result["deferred_tool_use"]["name"], "Bash", "{result}");
    assert!(!project.join("deferred").exists(), "nothing ran yet");
    let session = result["session_id"].as_str().unwrap().to_owned();
    let item = pending_in_inbox(&w.phone, &turns[0].command).await;
    eprintln!(
        "deferred: approval in the inbox {:?} after the run started",
        started.elapsed()
    );
    assert_eq!(item["decision"]["durability"], "durable", "{item}");
    let decision = item["decision"]["id"].as_str().unwrap().to_owned();
    device(&w.phone, &["approve", &decision, "--json"]);
    let resumed = Instant::now();
    let result = w
        .setup
        .start_with(&["-p", "--resume", &session])
        .result()
        .await;
    eprintln!("resume → run ended in {:?}", resumed.elapsed());
    assert!(project.join("deferred").exists(), "the resumed run ran it");
    assert_eq!(result["stop_reason"], "end_turn", "{result}");
    assert!(
        result["result"].as_str().unwrap().contains("[tool ok"),
        "{result}"
    );
    let calls = recorder.take("defer");
    let pre = calls_of(&calls, "PreToolUse");
    assert_eq!(pre.len(), 2, "asked once, again on resume: {calls:#?}");
    let said = |c: &Value| c["output"]["hookSpecificOutput"]["permissionDecision"].clone();
    assert_eq!(said(pre[0]), "defer");
    assert_eq!(said(pre[1]), "allow");
    assert_eq!(
        pre[0]["input"]["tool_use_id"], pre[1]["input"]["tool_use_id"],
        "the resumed run asks about the same call"
    );
    let starts: Vec<&Value> = calls_of(&calls, "SessionStart")
        .iter()
        .map(|c| &c["input"]["source"])
        .collect();
    assert_eq!(starts, [&json!("startup"), &json!("resume")]);
    let task = session_task(&w.url, &w.setup.token, &session).await;
    let d = task_detail(&w.url, &w.setup.token, &task).await;
    let dec = &d["decisions"][0];
    assert_eq!(dec["status"], "resolved", "{dec}");
    assert_eq!(dec["outcome"]["option"], "approve", "{dec}");
    assert_eq!(d["effects"][0]["status"], "confirmed", "{d}");

    // ---- 1b. held, then switched to a durable wait from the device -------------------------
    // Installed without `--defer`: the hook holds the call; the person asks Claude Code to wait
    // for them (`waymark defer`), the run stops with the call deferred, and the resumed run
    // gets the answer given afterwards.
    w.setup
        .install_with(&recorder.url, 120, &["--gate", "Bash"]);
    let mut run = w.setup.start(&turns[2].prompt);
    let item = pending_in_inbox(&w.phone, &turns[2].command).await;
    assert_eq!(item["decision"]["durability"], "fail_open_hook", "{item}");
    assert_eq!(
        item["decision"]["runtime_deadline"]["can_wait"], true,
        "a held call of a `claude -p` run can be switched: {item}"
    );
    let decision = item["decision"]["id"].as_str().unwrap().to_owned();
    let inbox = {
        let mut c = waymark();
        c.env("WAYMARK_HOME", &w.phone)
            .env("WAYMARK_KEYSTORE", "file-insecure")
            .arg("inbox");
        String::from_utf8_lossy(&c.output().unwrap().stdout).into_owned()
    };
    assert!(
        inbox.contains(&format!("waymark defer {decision}")),
        "{inbox}"
    );
    device(&w.phone, &["defer", &decision, "--json"]);
    let result = run.result().await;
    assert_eq!(result["stop_reason"], "tool_deferred", "{result}");
    assert!(!project.join("waited").exists(), "nothing ran yet");
    let session = result["session_id"].as_str().unwrap().to_owned();
    device(&w.phone, &["sync", "--json"]);
    let d = task_detail(
        &w.url,
        &w.setup.token,
        &session_task(&w.url, &w.setup.token, &session).await,
    )
    .await;
    assert_eq!(d["decisions"][0]["status"], "pending", "{d}");
    assert_eq!(d["decisions"][0]["durability"], "durable", "{d}");
    device(&w.phone, &["approve", &decision, "--json"]);
    let result = w
        .setup
        .start_with(&["-p", "--resume", &session])
        .result()
        .await;
    assert!(project.join("waited").exists(), "the resumed run ran it");
    assert_eq!(result["stop_reason"], "end_turn", "{result}");
    let calls = recorder.take("switched");
    let pre = calls_of(&calls, "PreToolUse");
    assert_eq!(
        pre.iter().map(|c| said(c)).collect::<Vec<_>>(),
        [json!("defer"), json!("allow")],
        "held, deferred on request, allowed on resume: {calls:#?}"
    );
    assert_eq!(
        pre[0]["entrypoint"], "sdk-cli",
        "Claude Code fills the header from its own entrypoint: {calls:#?}"
    );

    // ---- 2. allow always: the suggested rule ----------------------------------------------
    w.setup.install(&recorder.url, 120);
    let mut run = w.setup.start(&turns[1].prompt);
    let item = pending_in_inbox(&w.phone, rule_command).await;
    let rule = format!("Bash({rule_command})");
    let always = item["decision"]["options"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["id"] == "approve_always")
        .unwrap_or_else(|| panic!("Claude Code suggested a rule: {item}"))
        .clone();
    assert_eq!(
        always["label"],
        format!("Allow, and add the allow rule `{rule}` in this project's local settings"),
        "{always}"
    );
    let decision = item["decision"]["id"].as_str().unwrap().to_owned();
    device(
        &w.phone,
        &["approve", &decision, "--option", "approve_always", "--json"],
    );
    let result = run.result().await;
    assert!(
        result["result"].as_str().unwrap().contains("[tool ok: 42]"),
        "{result}"
    );
    let calls = recorder.take("rules");
    let asked = calls_of(&calls, "PermissionRequest");
    assert_eq!(asked.len(), 1, "{calls:#?}");
    let suggested = &asked[0]["input"]["permission_suggestions"];
    assert_eq!(suggested[0]["type"], "addRules", "{suggested}");
    assert_eq!(
        asked[0]["output"]["hookSpecificOutput"]["decision"],
        json!({"behavior": "allow", "updatedPermissions": suggested}),
        "allowed with Claude Code's own suggestion"
    );
    let settings: Value = serde_json::from_str(
        &std::fs::read_to_string(w.setup.path("project/.claude/settings.local.json")).unwrap(),
    )
    .unwrap();
    // Claude Code 2.1.328 escapes the parentheses of the rule's content when it writes it.
    assert_eq!(
        settings["permissions"]["allow"],
        json!([r"Bash(python3 -c 'print\(40 + 2\)')"]),
        "Claude Code wrote the rule to the project's local settings"
    );
    drop(w.server);
}

// ---- the runner ------------------------------------------------------------------------------

/// `waymark runner` for alice's laptop, with the environment its owner gives the runtimes
/// (the private HOME and the fake model); killed with `-9` when dropped.
struct RunnerProcess(Child);

impl Drop for RunnerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_runner(setup: &Setup, url: &str, token: &str) -> RunnerProcess {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(setup.path("runner.log"))
        .unwrap();
    let mut c = waymark();
    c.args([
        "runner",
        "--server",
        url,
        "--approval-timeout",
        "120",
        "--allow",
    ])
    .arg(setup.path("project"))
    .arg("--claude")
    .arg(&setup.claude)
    .arg("--state-dir")
    .arg(setup.path("runner-state"))
    .env("WAYMARK_TOKEN", token)
    .env("WAYMARK_LOG", "info")
    .env("PATH", "/usr/local/bin:/usr/bin:/bin")
    .envs(setup.claude_env())
    .stdin(Stdio::null())
    .stdout(log.try_clone().unwrap())
    .stderr(log);
    RunnerProcess(c.spawn().expect("waymark runner starts"))
}

/// Prints the runner's log and its runs' results when the test fails.
/// The laptop as its owner sets it up: a runner token for the machine `laptop`, `waymark
/// runner` started with it, and the phone seeing the laptop online.
struct Laptop {
    runner: RunnerProcess,
    /// The runner's token (to start it again).
    token: String,
    /// The admin token the tests read the record with.
    admin_token: String,
    /// The laptop as the phone lists it.
    machine: Value,
    _log: ShowOnPanic,
}

async fn laptop_online(setup: &Setup, url: &str, phone: &Path) -> Laptop {
    let data = setup.path("data");
    let token = admin(
        &data,
        &["runner-token", "--machine", "laptop", "--user", "alice"],
    )["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let runner = start_runner(setup, url, &token);
    let _log = ShowOnPanic(setup.path("runner.log"));
    let deadline = Instant::now() + Duration::from_secs(30);
    let machine = loop {
        let m = device(phone, &["machines", "--json"]);
        if m["machines"][0]["online"] == true {
            break m["machines"][0].clone();
        }
        assert!(
            Instant::now() < deadline,
            "the laptop never came online: {m}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let admin_token = std::fs::read_to_string(data.join("admin.token"))
        .unwrap()
        .trim()
        .to_owned();
    Laptop {
        runner,
        token,
        admin_token,
        machine,
        _log,
    }
}

struct ShowOnPanic(PathBuf);

impl Drop for ShowOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for l in std::fs::read_to_string(&self.0).unwrap_or_default().lines() {
                eprintln!("runner: {l}");
            }
            let logs = self.0.parent().unwrap().join("runner-state/logs");
            for f in std::fs::read_dir(logs).into_iter().flatten().flatten() {
                let t = std::fs::read_to_string(f.path()).unwrap_or_default();
                let v: Value = serde_json::from_str(&t).unwrap_or_default();
                eprintln!("{}: {}", f.path().display(), v["result"]);
            }
        }
    }
}

/// Waits until `check` holds of the task's detail (read with `token`).
async fn until(
    server: &str,
    token: &str,
    task: &str,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + RUN;
    loop {
        let d = task_detail(server, token, task).await;
        if check(&d) {
            return d;
        }
        assert!(Instant::now() < deadline, "{what}: {d}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |t| t.lines().count())
}

/// A person with only a phone: the laptop's runner starts Claude Code for a signed
/// `start_run` (the prompt on stdin, the hooks in the runner's own settings file, nothing
/// written into the repository), the call's approval is answered from the phone and the run
/// finishes; a directory the laptop does not have is refused by its runner with the reason,
/// nothing spawned; one it does not allow is refused before it is addressed; and a run whose
/// Claude Code and runner are both killed with `-9` after a confirmed call is revived by the
/// restarted runner with Claude Code's own resume and Waymark's note — the call is not run
/// again (counted in the file it appends to), and the fake model received the note; a
/// follow-up reaches the session at its time; and a call deferred from the phone (Claude Code
/// exits waiting) runs once it is approved there, resumed by the runner with nothing typed on
/// the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runner_starts_revives_and_resumes_claude_code_for_a_phone_and_refuses_what_is_not_allowed()
 {
    let turns = |project: &Path| {
        vec![
            Turn {
                prompt: "runner: make the approved file".into(),
                command: format!(
                    "echo ran >> {} && touch {}",
                    project.join("count-a").display(),
                    project.join("approved").display()
                ),
                answer: "Runner run finished.".into(),
            },
            Turn {
                prompt: "runner: wait for me".into(),
                command: format!("echo ran >> {}", project.join("count-d").display()),
                answer: "Deferred run finished.".into(),
            },
            Turn {
                prompt: "runner: count once, then be killed".into(),
                command: format!("echo ran >> {}", project.join("count-k").display()),
                answer: "Revived run finished.".into(),
            },
        ]
    };
    let World {
        setup,
        server,
        url,
        phone,
    } = world(turns).await;
    let project = setup.path("project").canonicalize().unwrap();
    // Claude Code's own rule on the laptop, in its user settings (it refuses `curl` unasked).
    std::fs::write(
        setup.path("home/.claude/settings.json"),
        r#"{"permissions": {"deny": ["Bash(curl:*)"]}}"#,
    )
    .unwrap();
    let Laptop {
        mut runner,
        token,
        admin_token,
        machine,
        _log,
    } = laptop_online(&setup, &url, &phone).await;
    assert_eq!(
        machine["runtimes"][0]["version"], CLAUDE_CODE_VERSION,
        "{machine}"
    );
    // The runner read it and the phone lists it beside alice's rules; her allow rule for
    // `curl` is named as one Claude Code never lets reach her.
    device(
        &phone,
        &[
            "rules",
            "add",
            "--allow",
            "--tool",
            "Bash",
            "--pattern",
            "curl https://example.com/*",
            "--json",
        ],
    );
    let rules = device(&phone, &["rules", "--json"]);
    let own = &rules["runtime_rules"][0];
    assert_eq!(
        (
            &own["machine"],
            &own["rule"]["text"],
            &own["rule"]["effect"]
        ),
        (&json!("laptop"), &json!("Bash(curl:*)"), &json!("deny")),
        "{rules}"
    );
    assert_eq!(
        own["rule"]["source"],
        json!(setup.path("home/.claude/settings.json")),
        "{rules}"
    );
    assert_eq!(
        own["conflicts"][0]["rule_id"], rules["rules"][0]["id"],
        "{rules}"
    );

    // 1. Started from the phone; approved from the phone; the run finishes.
    let dir = project.to_str().unwrap();
    let started = device(
        &phone,
        &[
            "run",
            "--machine",
            "laptop",
            "--dir",
            dir,
            "--gate",
            "Bash",
            "--json",
            "runner: make the approved file",
        ],
    );
    let task = started["task_id"].as_str().unwrap().to_owned();
    let item = pending_in_inbox(&phone, "count-a").await;
    device(
        &phone,
        &[
            "approve",
            item["decision"]["id"].as_str().unwrap(),
            "--json",
        ],
    );
    let d = until(
        &url,
        &admin_token,
        &task,
        "the approved run finishes",
        |d| {
            d["attempts"][0]["state"] == "finished"
                && texts(d)
                    .iter()
                    .any(|t| t.starts_with("assistant: Runner run finished."))
        },
    )
    .await;
    assert!(project.join("approved").exists());
    assert_eq!(lines(&project.join("count-a")), 1);
    assert!(d["task"]["machine_id"].as_str().is_some());
    assert!(
        texts(&d)
            .iter()
            .any(|t| t == "system: laptop started the run"),
        "{:?}",
        texts(&d)
    );
    assert!(
        texts(&d)
            .iter()
            .any(|t| t == "user: runner: make the approved file"),
        "the prompt reached Claude Code: {:?}",
        texts(&d)
    );
    assert_eq!(d["effects"][0]["status"], "confirmed");
    assert!(
        !project.join(".claude/settings.local.json").exists()
            && !project.join(".claude/settings.json").exists(),
        "nothing is written into the person's repository"
    );

    // 2. A directory under the allowed one that the laptop does not have: its runner refuses.
    let missing = project.join("not-here");
    let refused = device(
        &phone,
        &[
            "run",
            "--machine",
            "laptop",
            "--dir",
            missing.to_str().unwrap(),
            "--json",
            "runner: make the approved file",
        ],
    );
    let refused_task = refused["task_id"].as_str().unwrap().to_owned();
    let d = until(
        &url,
        &admin_token,
        &refused_task,
        "the runner refuses",
        |d| d["task"]["state"] == "failed",
    )
    .await;
    assert!(
        d["task"]["outcome_summary"]
            .as_str()
            .unwrap()
            .contains("laptop refused to start the run"),
        "{d}"
    );
    assert!(
        d["attempts"].as_array().unwrap().is_empty(),
        "nothing was spawned: {d}"
    );
    let mut c = waymark();
    c.env("WAYMARK_HOME", &phone)
        .env("WAYMARK_KEYSTORE", "file-insecure")
        .args(["run", "--machine", "laptop", "--dir", "/etc", "x"]);
    let out = c.output().unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("does not allow runs in `/etc`"),
        "{out:?}"
    );

    // 3. kill -9 after a confirmed call, the runner too; the restarted runner revives the run.
    setup.model.hold_after_results(true);
    let started = device(
        &phone,
        &[
            "run",
            "--machine",
            "laptop",
            "--dir",
            dir,
            "--gate",
            "Bash",
            "--json",
            "runner: count once, then be killed",
        ],
    );
    let task = started["task_id"].as_str().unwrap().to_owned();
    let item = pending_in_inbox(&phone, "count-k").await;
    device(
        &phone,
        &[
            "approve",
            item["decision"]["id"].as_str().unwrap(),
            "--json",
        ],
    );
    // Claude Code's command hook read the working tree after the call: recorded with it.
    until(
        &url,
        &admin_token,
        &task,
        "the call is confirmed and the tree it left recorded",
        |d| {
            d["effects"][0]["status"] == "confirmed"
                && d["checkpoints"].as_array().unwrap().iter().any(|c| {
                    c["body"]["materials"]["tree"]["changed"]
                        .get("count-k")
                        .is_some()
                })
        },
    )
    .await;
    assert_eq!(lines(&project.join("count-k")), 1);
    let state: Value = serde_json::from_str(
        &std::fs::read_to_string(setup.path("runner-state/state.json")).unwrap(),
    )
    .unwrap();
    let pid = runner_world::live_run_group(&state["runs"][&task])
        .expect("the runner recorded the run's process, and it runs");
    let _ = runner.0.kill();
    let _ = runner.0.wait();
    let killed = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pid}")])
        .status()
        .unwrap();
    assert!(killed.success());
    setup.model.hold_after_results(false);
    // While the laptop was down, someone edited a file: the revive asks the phone first,
    // naming it, and goes on only when told to.
    std::fs::write(project.join("README.md"), "edited by hand meanwhile\n").unwrap();
    let before = setup.model.requests().len();
    runner = start_runner(&setup, &url, &token);
    let card = pending_in_inbox(&phone, "`README.md` has changed").await;
    assert_eq!(card["decision"]["kind"], "recovery", "{card}");
    assert_eq!(
        setup.model.requests().len(),
        before,
        "nothing resumed before the person answered"
    );
    device(
        &phone,
        &[
            "choose",
            card["decision"]["id"].as_str().unwrap(),
            "resume_anyway",
            "--json",
        ],
    );
    let d = until(&url, &admin_token, &task, "the revived run finishes", |d| {
        texts(d)
            .iter()
            .any(|t| t.starts_with("assistant: Revived run finished. [resumed]"))
    })
    .await;
    assert_eq!(
        lines(&project.join("count-k")),
        1,
        "the confirmed call did not run again"
    );
    runner_world::assert_revived(&d);
    let noted = setup.model.requests()[before..].iter().any(|r| {
        r["messages"]
            .to_string()
            .contains("Waymark: this session was interrupted")
            && r["messages"].to_string().contains("count-k")
    });
    assert!(
        noted,
        "the resumed Claude Code sent the model Waymark's note"
    );

    // 4. A follow-up on the run: at its time the runner resumes the session with its message.
    let before = setup.model.requests().len();
    let res = reqwest::Client::new()
        .post(format!("{url}/v1/tasks/{task}/followups"))
        .bearer_auth(&admin_token)
        .json(&json!({"schedule": {"after": "PT1S"}, "message": "runner: the follow-up says look again"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    let deadline = Instant::now() + RUN;
    while !setup.model.requests()[before..].iter().any(|r| {
        r["messages"]
            .to_string()
            .contains("runner: the follow-up says look again")
    }) {
        assert!(
            Instant::now() < deadline,
            "the follow-up never reached Claude Code"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        lines(&project.join("count-k")),
        1,
        "the follow-up repeated nothing"
    );

    // 5. Deferred from the phone: Claude Code exits waiting; the answer resumes it by itself.
    let started = device(
        &phone,
        &[
            "run",
            "--machine",
            "laptop",
            "--dir",
            dir,
            "--gate",
            "Bash",
            "--json",
            "runner: wait for me",
        ],
    );
    let task = started["task_id"].as_str().unwrap().to_owned();
    let item = pending_in_inbox(&phone, "count-d").await;
    let decision = item["decision"]["id"].as_str().unwrap().to_owned();
    device(&phone, &["defer", &decision, "--json"]);
    until(
        &url,
        &admin_token,
        &task,
        "Claude Code exits with the call deferred",
        |d| d["attempts"][0]["state"] == "finished" && d["decisions"][0]["durability"] == "durable",
    )
    .await;
    assert_eq!(
        lines(&project.join("count-d")),
        0,
        "nothing ran while it waited"
    );
    device(&phone, &["approve", &decision, "--json"]);
    let d = until(
        &url,
        &admin_token,
        &task,
        "the answered run resumes and runs the call",
        |d| {
            d["effects"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["status"] == "confirmed")
        },
    )
    .await;
    assert_eq!(lines(&project.join("count-d")), 1);
    assert!(
        texts(&d)
            .iter()
            .any(|t| t == "system: laptop resumed the run"),
        "{:?}",
        texts(&d)
    );
    drop(runner);
    drop(server);
}

// ---- questions and plans ---------------------------------------------------------------------

/// A Claude Code session in the mode its Agent SDK runs it, the one that offers the model
/// `AskUserQuestion` and `ExitPlanMode` (`claude -p` alone does not): stream-json in and out,
/// with a permission prompt tool on stdio. The prompt goes in as one user message; nothing is
/// ever answered on stdio, so any question or plan reaching Claude Code's own prompt instead of
/// the hook fails the test.
struct StreamRun {
    child: tokio::process::Child,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    _stdin: tokio::process::ChildStdin,
}

impl Setup {
    async fn start_stream(&self, prompt: &str, more: &[&str]) -> StreamRun {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        let bin_dir = Path::new(env!("CARGO_BIN_EXE_waymark")).parent().unwrap();
        let path = std::env::join_paths(
            std::iter::once(bin_dir.to_owned())
                .chain(["/usr/local/bin", "/usr/bin", "/bin"].map(PathBuf::from)),
        )
        .unwrap();
        let mut cmd = tokio::process::Command::new(&self.claude);
        cmd.args([
            "-p",
            "--input-format",
            "stream-json",
            "--output-format",
            "stream-json",
        ])
        .args(["--verbose", "--permission-prompt-tool", "stdio"])
        .args(more)
        .current_dir(self.path("project"))
        .env_clear()
        .env("PATH", path)
        .envs(self.claude_env())
        .env("WAYMARK_TOKEN", &self.token)
        .env("WAYMARK_LOG", "error")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .process_group(0)
        .kill_on_drop(true);
        let mut child = cmd.spawn().expect("the real `claude` starts");
        let mut stdin = child.stdin.take().unwrap();
        let message = json!({"type": "user", "message": {"role": "user", "content": prompt},
                             "parent_tool_use_id": null, "session_id": ""});
        let lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        stdin
            .write_all(format!("{message}\n").as_bytes())
            .await
            .unwrap();
        StreamRun {
            child,
            lines,
            _stdin: stdin,
        }
    }
}

impl StreamRun {
    /// Reads Claude Code's stream to the run's `result`; refuses any prompt on stdio.
    async fn result(&mut self) -> Value {
        let read = async {
            while let Some(line) = self.lines.next_line().await.unwrap() {
                let Ok(v) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                assert_ne!(
                    v["type"], "control_request",
                    "Claude Code asked on stdio instead of through the hook: {v}"
                );
                if v["type"] == "result" {
                    return v;
                }
            }
            panic!("Claude Code's stream ended without a result");
        };
        let out = tokio::time::timeout(RUN, read)
            .await
            .expect("the run ended in time");
        let _ = self.child.start_kill();
        out
    }
}

/// The last `/v1/messages` request's tool results, as the model read them.
fn tool_results(model: &FakeAnthropic) -> Vec<String> {
    model
        .requests()
        .iter()
        .flat_map(|r| r["messages"].as_array().cloned().unwrap_or_default())
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .filter(|b| b["type"] == "tool_result")
        .map(|b| match &b["content"] {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_codes_questions_and_plan_reach_the_phone_and_the_model_reads_the_answers() {
    let questions = json!({"questions": [
        {"question": "Which database should I use?", "header": "Database", "multiSelect": false,
         "options": [{"label": "Postgres", "description": "a server"},
                     {"label": "SQLite", "description": "a file"}]},
        {"question": "Which checks should run?", "header": "Checks", "multiSelect": true,
         "options": [{"label": "unit", "description": "fast"}, {"label": "e2e", "description": "slow"},
                     {"label": "lint", "description": "style"}]}]});
    let plan = "# Plan\n\n1. Split the lexer\n2. Keep the public API";
    let write_plan = json!({"file_path": "$PLAN_FILE", "content": plan});
    let turns = move |_: &Path| {
        vec![
            Turn {
                prompt: "ask me about the database".into(),
                command: format!("tool:AskUserQuestion {questions}"),
                answer: "Asked.".into(),
            },
            Turn {
                prompt: "plan the lexer split".into(),
                command: format!("tool:Write {write_plan}\n---\ntool:ExitPlanMode {{}}"),
                answer: "Planned.".into(),
            },
        ]
    };
    let World {
        setup,
        server: _server,
        url,
        phone,
    } = world(turns).await;
    setup.install(&url, 120);

    // 1. Two questions, one multi-select, answered on the phone: the model reads the answers.
    let mut run = setup.start_stream("ask me about the database", &[]).await;
    let item = pending_in_inbox(&phone, "Claude Code asks 2 questions").await;
    let d = &item["decision"];
    assert_eq!(d["kind"], "question", "{item}");
    assert_eq!(d["form"]["questions"][1]["multi_select"], true, "{item}");
    let id = d["id"].as_str().unwrap().to_owned();
    // A wrong answer is refused before anything is signed, and says why.
    let mut bad = waymark();
    bad.env("WAYMARK_HOME", &phone)
        .env("WAYMARK_KEYSTORE", "file-insecure")
        .args(["answer", &id, "--choose", "q1=MySQL", "--choose", "q2=unit"]);
    let out = bad.output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("`MySQL` is not a choice of question `q1`"),
        "{out:?}"
    );
    device(
        &phone,
        &[
            "answer",
            &id,
            "--choose",
            "q1=SQLite",
            "--choose",
            "q2=unit",
            "--choose",
            "q2=lint",
            "--json",
        ],
    );
    device(&phone, &["sync", "--json"]);
    let result = run.result().await;
    assert_eq!(result["subtype"], "success", "{result}");
    let told = tool_results(&setup.model).join("\n");
    assert!(
        told.contains(r#""Which database should I use?"="SQLite""#)
            && told.contains(r#""Which checks should run?"="unit, lint""#),
        "the model was told the answers: {told}"
    );

    // 2. A plan, in plan mode: sent back with feedback, the model reads the feedback.
    let mut run = setup
        .start_stream("plan the lexer split", &["--permission-mode", "plan"])
        .await;
    let item = pending_in_inbox(&phone, "plan is ready").await;
    let d = &item["decision"];
    assert_eq!(
        d["intent"]["plan"], plan,
        "the plan as Claude Code wrote it: {item}"
    );
    let id = d["id"].as_str().unwrap().to_owned();
    let digest = d["intent_digest"].as_str().unwrap().to_owned();
    let feedback = "keep the old parser behind a flag";
    device(
        &phone,
        &[
            "deny",
            &id,
            "--intent-digest",
            &digest,
            "--note",
            feedback,
            "--json",
        ],
    );
    let result = run.result().await;
    assert_eq!(result["subtype"], "success", "{result}");
    let told = tool_results(&setup.model).join("\n");
    assert!(
        told.contains(&format!(
            "The user wants you to keep planning. Their feedback: {feedback}"
        )),
        "the model was told to keep planning: {told}"
    );
}

/// A run started from the phone through `waymark runner` asks its person a question
/// (`AskUserQuestion`, offered because the runner runs Claude Code in the SDK's stream-json
/// mode): the question reaches the phone, is answered there, and the model reads the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_started_from_the_phone_asks_its_question_there_and_the_model_reads_the_answer() {
    let questions = json!({"questions": [
        {"question": "Which branch should I push to?", "header": "Branch", "multiSelect": false,
         "options": [{"label": "main", "description": "the default"},
                     {"label": "release", "description": "the release line"}]}]});
    let turns = move |_: &Path| {
        vec![Turn {
            prompt: "runner: ask me which branch".into(),
            command: format!("tool:AskUserQuestion {questions}"),
            answer: "Runner asked.".into(),
        }]
    };
    let World {
        setup,
        server: _server,
        url,
        phone,
    } = world(turns).await;
    let project = setup.path("project").canonicalize().unwrap();
    let Laptop {
        runner: _runner,
        admin_token,
        _log,
        ..
    } = laptop_online(&setup, &url, &phone).await;
    let started = device(
        &phone,
        &[
            "run",
            "--machine",
            "laptop",
            "--dir",
            project.to_str().unwrap(),
            "--json",
            "runner: ask me which branch",
        ],
    );
    let task = started["task_id"].as_str().unwrap().to_owned();
    let item = pending_in_inbox(&phone, "Which branch should I push to?").await;
    assert_eq!(
        item["decision"]["form"]["questions"][0]["choices"][1]["label"],
        "release"
    );
    let id = item["decision"]["id"].as_str().unwrap().to_owned();
    device(&phone, &["answer", &id, "--choose", "release", "--json"]);
    until(&url, &admin_token, &task, "the run finishes", |d| {
        texts(d)
            .iter()
            .any(|t| t.starts_with("assistant: Runner asked."))
    })
    .await;
    let told = tool_results(&setup.model).join("\n");
    assert!(
        told.contains(r#""Which branch should I push to?"="release""#),
        "the model was told the answer: {told}"
    );
}
