//! `waymark runner` with the REAL Gemini CLI (`@google/gemini-cli@0.61.0` from npm, installed by
//! `scripts/setup-debian` under `$WAYMARK_RUNTIMES_DIR/gemini`, default
//! `~/.cache/waymark-runtimes/gemini`) — an ACP agent — as a person with only a phone uses it: a
//! real `waymark serve`, a device paired with `waymark pair` that starts runs with `waymark run
//! --runtime gemini` and answers from its inbox, and the laptop's `waymark runner`, which starts
//! this binary's ACP adapter (and through it `gemini --acp`) bound to the task the signed
//! `start_run` made. A resume is ACP's own `session/load` of the same session and a prompt with
//! Waymark's note. Gemini CLI's only model is the fake Gemini API of
//! `waymark-adapters/tests/support/fake_model.rs` (shared by path), whose `run_shell_command`
//! calls append to a file, so a repeated call shows twice — there and in the fake's count.
//!
//! Gemini CLI never reaches the internet: a private `HOME` with telemetry, statistics and
//! updates off, `GOOGLE_GEMINI_BASE_URL` at the fake. The test fails — never skips — when the
//! runtime is not installed; every process it starts is killed when it ends, passing or not.

#[allow(dead_code, unreachable_pub)]
#[path = "../../waymark-adapters/tests/support/fake_model.rs"]
mod fake_model;
mod runner_world;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fake_model::{FakeModel, Turn, carries_result, user_texts};
use runner_world::*;
use serde_json::{Value, json};

/// The version `scripts/setup-debian` installs and this test was written against.
const GEMINI_VERSION: &str = "0.61.0";
/// The model named in the environment (`GEMINI_MODEL`): with a model given, Gemini CLI skips
/// its router's side question.
const MODEL: &str = "gemini-2.5-flash";

fn gemini_binary() -> PathBuf {
    let dir = runtime_dir("gemini");
    let bin = dir.join("node_modules/.bin/gemini");
    let stamp = std::fs::read_to_string(dir.join("installed")).unwrap_or_default();
    assert!(
        bin.exists() && stamp.contains(&format!("@google/gemini-cli@{GEMINI_VERSION}")),
        "the real Gemini CLI {GEMINI_VERSION} is not installed in `{}` (installed: `{}`) — run \
         `scripts/setup-debian`, which installs it there (set WAYMARK_RUNTIMES_DIR to use \
         another place)",
        dir.display(),
        stamp.trim(),
    );
    bin
}

/// The laptop: a private Gemini home pointed at the fake model, the project it allows, and the
/// runner's state.
struct Laptop {
    dir: tempfile::TempDir,
    gemini: PathBuf,
}

impl Laptop {
    fn new() -> Laptop {
        // Not under /tmp: Gemini CLI reads the runner's system settings only where no directory
        // above them is writable by others (docs/runner.md).
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        for d in ["home/.gemini", "tmp", "project", "data", "phone"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        let settings = json!({
            "privacy": {"usageStatisticsEnabled": false},
            "telemetry": {"enabled": false},
            "general": {"disableAutoUpdate": true, "disableUpdateNag": true},
        });
        std::fs::write(
            dir.path().join("home/.gemini/settings.json"),
            serde_json::to_vec_pretty(&settings).unwrap(),
        )
        .unwrap();
        Laptop {
            dir,
            gemini: gemini_binary(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `waymark runner` for alice's laptop, with the environment its owner gives the runtimes
    /// (the private home, the fake model's address and key); killed with `-9` when dropped.
    fn runner(&self, url: &str, token: &str, model: &FakeModel) -> RunnerProcess {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path("runner.log"))
            .unwrap();
        let mut c = waymark();
        c.args(["runner", "--server", url, "--allow"])
            .arg(self.path("project"))
            .arg("--gemini")
            .arg(&self.gemini)
            .arg("--state-dir")
            .arg(self.path("runner-state"))
            .env("WAYMARK_TOKEN", token)
            .env("WAYMARK_LOG", "info")
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", self.path("home"))
            .env("TMPDIR", self.path("tmp"))
            .env(
                "GOOGLE_GEMINI_BASE_URL",
                model.base_url.trim_end_matches("/v1"),
            )
            .env("GEMINI_API_KEY", "dummy")
            .env("GEMINI_MODEL", MODEL)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        RunnerProcess(c.spawn().expect("waymark runner starts"))
    }

    fn state(&self) -> PathBuf {
        self.path("runner-state")
    }
}

/// Kills, with `-9`, only the agent of the task's run — every process of the run's group but
/// the adapter (this binary) — so the adapter sees its agent die under it.
fn kill_agent_only(state: &Path, task: &str) -> usize {
    let group = runner_runs(state)["runs"][task]["pid"]
        .as_u64()
        .expect("the runner recorded the run's process");
    let ours = std::fs::canonicalize(env!("CARGO_BIN_EXE_waymark")).unwrap();
    let mut killed = 0;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u64>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // pgrp is the fifth field, the third after the command's closing parenthesis.
        let pgrp = stat[stat.rfind(')').unwrap() + 2..]
            .split(' ')
            .nth(2)
            .and_then(|f| f.parse::<u64>().ok());
        if pgrp != Some(group) || pid == group {
            continue;
        }
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
        if exe.as_deref() == Some(ours.as_path()) {
            continue;
        }
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
        killed += 1;
    }
    killed
}

/// A person with only a phone starts Gemini CLI on the laptop through its runner: the runner
/// binds the ACP adapter to the task the signed `start_run` made (its own machine token, the
/// prompt on stdin, the session's id kept in its state dir); Gemini CLI's permission request
/// reaches the phone's inbox, is approved there, and the run finishes with the session kept
/// open. Gemini CLI, its adapter and the runner killed with `-9` after a confirmed call: the
/// restarted runner revives the run with ACP's `session/load` of the same session and a prompt
/// carrying Waymark's note — the model sees the earlier conversation and the note, the call is
/// not made again (counted by the model and in the file it appends to), and the run finishes
/// with a new attempt and fence. A follow-up reaches the same session at its time. Gemini CLI
/// alone killed under a pending permission: the approval expires (never approved), the call
/// is closed as not run, the run is revived in its session, asks again, and runs once approved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runner_starts_revives_and_resumes_gemini_cli_for_a_phone() {
    let started = Instant::now();
    let scratch = tempfile::tempdir().unwrap();
    let counts = scratch.path().to_path_buf();
    let model = FakeModel::start(vec![
        Turn {
            prompt: "runner: make the approved file".into(),
            command: format!("echo ran >> {}", counts.join("count-a").display()),
            answer: "Runner run finished.".into(),
        },
        Turn {
            prompt: "runner: count once, then be killed".into(),
            command: format!("echo ran >> {}", counts.join("count-k").display()),
            answer: "Revived run finished.".into(),
        },
        Turn {
            prompt: "runner: the agent dies while asking".into(),
            command: format!("echo ran >> {}", counts.join("count-p").display()),
            answer: "Finished after the agent came back.".into(),
        },
    ])
    .await;
    let laptop = Laptop::new();
    let _cleanup = Cleanup(laptop.dir.path().to_path_buf());
    let project = laptop.path("project").canonicalize().unwrap();
    let dir = project.to_str().unwrap();
    let phone = laptop.path("phone");
    let (server, token, admin_token) = control_plane(&laptop.path("data"), &phone);
    let url = server.1.clone();
    let mut runner = laptop.runner(&url, &token, &model);
    let gemini = laptop_online(&phone, "gemini").await;
    assert_eq!(
        gemini,
        json!({"runtime": "gemini", "version": GEMINI_VERSION}),
        "the runner registered the Gemini CLI it found"
    );
    eprintln!("laptop online at {:?}", started.elapsed());

    // 1. Started from the phone; approved from the phone; the run finishes, its session kept.
    let task = start_run(&phone, "gemini", dir, "runner: make the approved file");
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
        |d| {
            d["attempts"][0]["state"] == "finished"
                && texts(d)
                    .iter()
                    .any(|t| t == "assistant: Runner run finished.")
        },
    )
    .await;
    eprintln!("run one finished at {:?}", started.elapsed());
    assert_eq!(lines(&counts.join("count-a")), 1);
    assert_eq!(d["task"]["runtime"], "gemini");
    assert_eq!(
        d["task"]["state"], "queued",
        "the session stays open for a follow-up or a revive: {d}"
    );
    assert_eq!(d["attempts"].as_array().unwrap().len(), 1, "{d}");
    assert_eq!(d["effects"][0]["status"], "confirmed", "{d}");
    let said = texts(&d);
    assert!(
        said.iter().any(|t| t == "system: laptop started the run"),
        "{said:?}"
    );
    assert!(
        said.iter()
            .any(|t| t == "user: runner: make the approved file"),
        "the prompt reached Gemini CLI: {said:?}"
    );
    let session = std::fs::read_to_string(laptop.state().join(format!("acp/{task}.session")))
        .expect("the runner kept the run's ACP session");
    assert!(!session.trim().is_empty());

    // 2. kill -9 after a confirmed call: Gemini CLI, its adapter and the runner; the restarted
    // runner revives the run in the same session.
    model.hold_after_results(true);
    let task = start_run(&phone, "gemini", dir, "runner: count once, then be killed");
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
            && texts(d)
                .iter()
                .any(|t| t == "assistant: Revived run finished.")
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
        "the model did not ask for the call again"
    );
    assert_revived(&d);
    let said = texts(&d);
    assert_eq!(
        said.iter()
            .filter(|t| *t == "user: runner: count once, then be killed")
            .count(),
        1,
        "the replayed history is not mirrored again: {said:?}"
    );
    // The same session: the resumed turn's request carries the earlier conversation (the
    // first prompt and the call's result) and then the note.
    let resumed = note_in_session(
        &model.requests()[before..],
        "runner: count once, then be killed",
        "count-k",
        user_texts,
    );
    assert!(
        carries_result(&resumed),
        "the call's result is in the loaded session"
    );

    // 3. A follow-up on the run: at its time the runner loads the same session with it.
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
    assert_eq!(model.gemini_calls(), calls);

    // 4. Gemini CLI alone dies while its permission waits in the inbox; the adapter stays and
    // sees it go: the approval expires (never approved), the call is closed as not run, and the
    // adapter leaves the run to the runner's report — which revives it in its session, where
    // the model asks again and the call runs once approved.
    let task = start_run(&phone, "gemini", dir, "runner: the agent dies while asking");
    let asked = pending_in_inbox(&phone, "count-p").await;
    assert!(
        kill_agent_only(&laptop.state(), &task) > 0,
        "Gemini CLI was found and killed"
    );
    let again = {
        let deadline = Instant::now() + RUN;
        loop {
            device(&phone, &["sync", "--json"]);
            let inbox = device(&phone, &["inbox", "--json"]);
            let other = inbox.as_array().and_then(|a| {
                a.iter()
                    .find(|i| {
                        i["decision"]["question"]
                            .as_str()
                            .is_some_and(|q| q.contains("count-p"))
                            && i["decision"]["id"] != asked["decision"]["id"]
                    })
                    .cloned()
            });
            if let Some(item) = other {
                break item;
            }
            assert!(
                Instant::now() < deadline,
                "the revived run never asked again: {inbox}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    assert_eq!(
        lines(&counts.join("count-p")),
        0,
        "nothing ran without an answer"
    );
    approve(&phone, &again);
    let d = until(&url, &admin_token, &task, "the revived run finishes", |d| {
        let attempts = d["attempts"].as_array().unwrap();
        attempts.len() == 2
            && attempts[1]["state"] == "finished"
            && texts(d)
                .iter()
                .any(|t| t == "assistant: Finished after the agent came back.")
    })
    .await;
    eprintln!(
        "the run whose agent died finished at {:?}",
        started.elapsed()
    );
    assert_eq!(
        lines(&counts.join("count-p")),
        1,
        "the call ran once, when approved"
    );
    let held = d["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["id"] == asked["decision"]["id"])
        .unwrap();
    assert_eq!(held["status"], "expired", "{held}");
    assert_eq!(
        held["outcome"]["option"],
        Value::Null,
        "never approved: {held}"
    );
    assert_eq!(d["attempts"][0]["state"], "revoked", "{d}");
    let not_run = d["effects"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["status"] == "failed")
        .count();
    assert_eq!(not_run, 1, "the first call is closed as not run: {d}");
    drop(runner);
    drop(server);
}
