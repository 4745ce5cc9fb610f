//! `waymark runner` with the REAL OpenCode (`opencode-ai@1.18.33`), GitHub Copilot CLI
//! (`@github/copilot@1.0.102`) and Hermes Agent (`hermes-agent[acp]==0.19.0`) — ACP agents
//! installed by `scripts/setup-debian` under `$WAYMARK_RUNTIMES_DIR` — as a person with only a
//! phone uses them: a real `waymark serve`, a device paired with `waymark pair` that starts runs
//! with `waymark run --runtime …` and answers from its inbox, and the laptop's `waymark runner`,
//! which starts this binary's ACP adapter (and through it the agent) bound to the task the
//! signed `start_run` made. Each agent's only model is the fake OpenAI-compatible API of
//! `waymark-adapters/tests/support/fake_model.rs` (shared by path), whose shell calls append to
//! a file, so a repeated call shows twice — there and in the fake's count.
//!
//! What each test shows, per agent (measured first, `docs/runner.md`): a run started from the
//! phone and approved there finishes with its session kept; the agent, its adapter **and** the
//! runner killed with `-9` after a confirmed call — the restarted runner takes the same session
//! up again with `session/load` (the model's next request carries the first prompt, the call's
//! result and then Waymark's note), the call is not made again, a new attempt and fence; a
//! follow-up reaches the same session; and where the agent no longer holds the session (its id
//! replaced by one it never had: OpenCode answers `-32603`, Copilot `-32002`, Hermes an empty
//! success), the follow-up goes into a new session, saying so.
//!
//! No agent reaches the internet: private homes, offline switches, the fake's address. A test
//! fails — never skips — when its runtime is not installed; every process it starts is killed
//! when it ends, passing or not.

#[allow(dead_code, unreachable_pub)]
#[path = "../../waymark-adapters/tests/support/fake_model.rs"]
mod fake_model;
mod runner_world;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Instant;

use fake_model::{FakeModel, Shape, Turn, carries_result, user_texts};
use runner_world::*;
use serde_json::{Value, json};

/// An agent under test: where it is installed, how its owner configures it (the environment the
/// runner passes on), and what it is.
struct Agent {
    runtime: &'static str,
    version: &'static str,
    /// The runner's flag for its binary.
    flag: &'static str,
    shape: Shape,
}

const OPENCODE: Agent = Agent {
    runtime: "opencode",
    version: "1.18.33",
    flag: "--opencode",
    shape: Shape::BASH,
};
const COPILOT: Agent = Agent {
    runtime: "copilot",
    version: "1.0.102",
    flag: "--copilot",
    shape: Shape::BASH,
};
const HERMES: Agent = Agent {
    runtime: "hermes",
    version: "0.19.0",
    flag: "--hermes",
    shape: Shape::TERMINAL,
};

/// The laptop: a private home for the agent pointed at the fake model, the project it allows,
/// and the runner's state.
struct Laptop {
    dir: tempfile::TempDir,
    agent: &'static Agent,
    bin: PathBuf,
}

impl Laptop {
    fn new(agent: &'static Agent, model: &FakeModel) -> Laptop {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        for d in ["home", "tmp", "project", "data", "phone", "hermes"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        let root = runtime_dir(agent.runtime);
        let stamp = std::fs::read_to_string(root.join("installed")).unwrap_or_default();
        let (bin, want) = match agent.runtime {
            "opencode" => (
                root.join("node_modules/opencode-linux-x64/bin/opencode"),
                format!("opencode-ai@{}", agent.version),
            ),
            "copilot" => {
                // The owner's wrapper: no update and no telemetry, whatever the runner adds.
                let real = root.join("node_modules/@github/copilot-linux-x64/copilot");
                let wrapper = dir.path().join("copilot");
                std::fs::write(
                    &wrapper,
                    format!(
                        "#!/bin/sh\nexec '{}' \"$@\" --no-auto-update --disable-client-telemetry\n",
                        real.display()
                    ),
                )
                .unwrap();
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
                assert!(real.is_file(), "{} is missing", real.display());
                (wrapper, format!("@github/copilot@{}", agent.version))
            }
            _ => (
                root.join("bin/hermes"),
                format!("hermes-agent[acp]=={}", agent.version),
            ),
        };
        assert!(
            bin.exists() && stamp.trim() == want,
            "the real {want} is not installed in `{}` (installed: `{}`) — run \
             `scripts/setup-debian`, which installs it there (set WAYMARK_RUNTIMES_DIR to use \
             another place)",
            root.display(),
            stamp.trim(),
        );
        let laptop = Laptop { dir, agent, bin };
        match agent.runtime {
            "opencode" => {
                let config = json!({
                    "$schema": "https://opencode.ai/config.json",
                    "model": format!("fake/{}", fake_model::MODEL),
                    "small_model": format!("fake/{}", fake_model::MODEL),
                    "autoupdate": false,
                    "share": "disabled",
                    "provider": {"fake": {
                        "npm": "@ai-sdk/openai-compatible",
                        "name": "Waymark fake model",
                        "options": {"baseURL": model.base_url, "apiKey": "dummy"},
                        "models": {fake_model::MODEL: {"name": "fake model"}},
                    }},
                    "permission": {"bash": "ask"},
                });
                std::fs::write(laptop.path("opencode.json"), config.to_string()).unwrap();
            }
            "hermes" => {
                let config = format!(
                    "model:\n  provider: custom\n  base_url: {}\n  default: {}\n  api_key: dummy\n\
                     approvals:\n  mode: manual\n",
                    model.base_url,
                    fake_model::MODEL
                );
                std::fs::write(laptop.path("hermes/config.yaml"), config).unwrap();
            }
            _ => {}
        }
        laptop
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn state(&self) -> PathBuf {
        self.path("runner-state")
    }

    /// `waymark runner` for alice's laptop, with the environment its owner gives the agent;
    /// killed with `-9` when dropped.
    fn runner(&self, url: &str, token: &str, model: &FakeModel) -> RunnerProcess {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path("runner.log"))
            .unwrap();
        let mut c = waymark();
        c.args(["runner", "--server", url, "--allow"])
            .arg(self.path("project"))
            .arg(self.agent.flag)
            .arg(&self.bin)
            .arg("--state-dir")
            .arg(self.state())
            .env("WAYMARK_TOKEN", token)
            .env("WAYMARK_LOG", "info")
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", self.path("home"))
            .env("TMPDIR", self.path("tmp"))
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        let h = self.path("home");
        match self.agent.runtime {
            "opencode" => {
                c.env("XDG_CONFIG_HOME", h.join("config"))
                    .env("XDG_DATA_HOME", h.join("data"))
                    .env("XDG_CACHE_HOME", h.join("cache"))
                    .env("XDG_STATE_HOME", h.join("state"))
                    .env("OPENCODE_CONFIG", self.path("opencode.json"))
                    .env("OPENCODE_DISABLE_AUTOUPDATE", "1")
                    .env("OPENCODE_DISABLE_MODELS_FETCH", "1")
                    .env("OPENCODE_DISABLE_LSP_DOWNLOAD", "1")
                    .env("OPENCODE_DISABLE_SHARE", "1")
                    .env("OPENCODE_DISABLE_DEFAULT_PLUGINS", "1")
                    .env("OPENCODE_DISABLE_CLAUDE_CODE", "1");
            }
            "copilot" => {
                c.env("COPILOT_HOME", h.join(".copilot"))
                    .env("COPILOT_OFFLINE", "true")
                    .env("COPILOT_PROVIDER_BASE_URL", &model.base_url)
                    .env("COPILOT_PROVIDER_TYPE", "openai")
                    .env("COPILOT_PROVIDER_API_KEY", "dummy")
                    .env("COPILOT_MODEL", fake_model::MODEL)
                    .env("COPILOT_AUTO_UPDATE", "false");
            }
            _ => {
                c.env("HERMES_HOME", self.path("hermes"));
            }
        }
        RunnerProcess(c.spawn().expect("waymark runner starts"))
    }
}

/// Whether the run's record has this answer of the agent (Hermes starts its text with blank
/// lines).
fn answered(d: &Value, text: &str) -> bool {
    d["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|m| m["role"] == "assistant" && m["text"].as_str().is_some_and(|t| t.trim() == text))
}

async fn starts_revives_and_resumes(agent: &'static Agent) {
    let started = Instant::now();
    let scratch = tempfile::tempdir().unwrap();
    let counts = scratch.path().to_path_buf();
    let command = |name: &str| {
        let c = format!("echo ran >> {}", counts.join(name).display());
        // Hermes asks before a command only when it runs a shell of its own (docs/adapters/hermes.md).
        if agent.runtime == "hermes" {
            format!("sh -c '{c}'")
        } else {
            c
        }
    };
    let model = FakeModel::start_with(
        vec![
            Turn {
                prompt: "runner: make the approved file".into(),
                command: command("count-a"),
                answer: "Runner run finished.".into(),
            },
            Turn {
                prompt: "runner: count once, then be killed".into(),
                command: command("count-k"),
                answer: "Revived run finished.".into(),
            },
        ],
        agent.shape,
    )
    .await;
    let laptop = Laptop::new(agent, &model);
    let _cleanup = Cleanup(laptop.dir.path().to_path_buf());
    let project = laptop.path("project").canonicalize().unwrap();
    let dir = project.to_str().unwrap();
    let phone = laptop.path("phone");
    let (server, token, admin_token) = control_plane(&laptop.path("data"), &phone);
    let url = server.1.clone();
    let mut runner = laptop.runner(&url, &token, &model);
    let found = laptop_online(&phone, agent.runtime).await;
    assert_eq!(
        found,
        json!({"runtime": agent.runtime, "version": agent.version}),
        "the runner registered the agent it found, with its version"
    );
    eprintln!("laptop online at {:?}", started.elapsed());

    // 1. Started from the phone; approved from the phone; the run finishes, its session kept.
    let task = start_run(&phone, agent.runtime, dir, "runner: make the approved file");
    let item = pending_in_inbox(&phone, "count-a").await;
    assert_eq!(
        lines(&counts.join("count-a")),
        0,
        "nothing runs before the answer"
    );
    approve(&phone, &item);
    let d = until(
        &url,
        &admin_token,
        &task,
        "the approved run finishes",
        |d| d["attempts"][0]["state"] == "finished" && answered(d, "Runner run finished."),
    )
    .await;
    eprintln!("run one finished at {:?}", started.elapsed());
    assert_eq!(lines(&counts.join("count-a")), 1);
    assert_eq!(d["task"]["runtime"], agent.runtime);
    assert_eq!(d["task"]["state"], "queued", "the session stays open: {d}");
    assert!(
        texts(&d)
            .iter()
            .any(|t| t == "system: laptop started the run"),
        "{:?}",
        texts(&d)
    );
    let session = std::fs::read_to_string(session_file_of(&laptop, &task))
        .expect("the runner kept the session");
    assert!(!session.trim().is_empty());

    // 2. kill -9 after a confirmed call: the agent, its adapter and the runner; the restarted
    // runner takes the same session up again.
    model.hold_after_results(true);
    let task = start_run(
        &phone,
        agent.runtime,
        dir,
        "runner: count once, then be killed",
    );
    confirmed_and_held(
        &phone,
        (&url, &admin_token, &task),
        "count-k",
        || model.requests(),
        |r| {
            user_texts(r)
                .iter()
                .any(|t| t.contains("runner: count once, then be killed"))
                && carries_result(r)
        },
    )
    .await;
    assert_eq!(lines(&counts.join("count-k")), 1);
    let calls = model.gemini_calls();
    kill_run_and_runner(runner, &laptop.state(), &task);
    model.hold_after_results(false);
    let before = model.requests().len();
    eprintln!("killed at {:?}", started.elapsed());
    runner = laptop.runner(&url, &token, &model);
    let d = until(&url, &admin_token, &task, "the revived run finishes", |d| {
        let attempts = d["attempts"].as_array().unwrap();
        attempts.len() >= 2
            && attempts.last().unwrap()["state"] == "finished"
            && answered(d, "Revived run finished.")
    })
    .await;
    eprintln!("revived run finished at {:?}", started.elapsed());
    assert_eq!(
        lines(&counts.join("count-k")),
        1,
        "the confirmed call did not run again"
    );
    assert_eq!(
        model.gemini_calls(),
        calls,
        "the model did not ask for it again"
    );
    assert_revived(&d);
    let resumed = model_received(
        || model.requests(),
        before,
        "Waymark's note",
        |r| {
            user_texts(r)
                .iter()
                .any(|t| t.contains("Waymark: this session was interrupted"))
        },
    )
    .await;
    let users = user_texts(&resumed);
    let prompt_at = users
        .iter()
        .position(|t| t.contains("runner: count once, then be killed"))
        .expect("the earlier prompt is in the loaded session");
    let note_at = users
        .iter()
        .rposition(|t| t.contains("Waymark: this session was interrupted"))
        .unwrap();
    assert!(
        prompt_at < note_at || users[note_at].contains("runner: count once"),
        "{users:#?}"
    );
    assert!(
        users[note_at].contains("count-k"),
        "the note names the call: {users:#?}"
    );
    assert!(
        carries_result(&resumed),
        "the call's result is in the loaded session"
    );

    // 3. A follow-up reaches the same session at its time.
    followup_reaches_session(
        (&url, &admin_token, &task),
        "runner: the follow-up says look again",
        "runner: count once, then be killed",
        || model.requests(),
        user_texts,
    )
    .await;
    newest_finished(&url, &admin_token, &task, 3, "the follow-up's turn ends").await;
    eprintln!("follow-up delivered at {:?}", started.elapsed());
    assert_eq!(
        lines(&counts.join("count-k")),
        1,
        "the follow-up repeated nothing"
    );

    // 4. The agent no longer holds the session (an id it never had): the next follow-up goes
    // into a new session, which says so, and the new session's id is kept for the next time.
    let lost = "0b6f3c1e-7d2a-4c55-9e61-5a1f0c2d9b77";
    std::fs::write(session_file_of(&laptop, &task), format!("{lost}\n")).unwrap();
    let before = model.requests().len();
    followup(
        &url,
        &admin_token,
        &task,
        "runner: a follow-up after the session was lost",
    )
    .await;
    let fresh = model_received(
        || model.requests(),
        before,
        "the follow-up in a new session",
        |r| {
            user_texts(r)
                .iter()
                .any(|t| t.contains("runner: a follow-up after the session was lost"))
        },
    )
    .await;
    assert!(
        !user_texts(&fresh)
            .iter()
            .any(|t| t.contains("runner: count once, then be killed")),
        "a new session holds none of the old conversation: {:#?}",
        user_texts(&fresh)
    );
    let d = until(&url, &admin_token, &task, "the new session says why", |d| {
        texts(d).iter().any(|t| {
            t.starts_with(&format!(
                "system: {} could not take up its session `{lost}` again",
                agent.runtime
            ))
        })
    })
    .await;
    let kept = std::fs::read_to_string(session_file_of(&laptop, &task)).unwrap();
    assert!(
        !kept.contains(lost) && !kept.trim().is_empty(),
        "the new session's id is kept: {kept}"
    );
    assert_eq!(d["task"]["runtime"], agent.runtime);
    eprintln!("new session at {:?}", started.elapsed());
    drop(runner);
    drop(server);
}

fn session_file_of(laptop: &Laptop, task: &str) -> PathBuf {
    laptop.state().join(format!("acp/{task}.session"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runner_starts_revives_and_resumes_opencode_for_a_phone() {
    starts_revives_and_resumes(&OPENCODE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runner_starts_revives_and_resumes_copilot_cli_for_a_phone() {
    starts_revives_and_resumes(&COPILOT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runner_starts_revives_and_resumes_hermes_agent_for_a_phone() {
    starts_revives_and_resumes(&HERMES).await;
}
