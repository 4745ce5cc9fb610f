//! `waymark runner` with the REAL Codex (`@openai/codex@0.169.0` from npm, its native binary
//! installed by `scripts/setup-debian` under `$WAYMARK_RUNTIMES_DIR/codex`, default
//! `~/.cache/waymark-runtimes/codex`), as a person with only a phone uses it: a real `waymark
//! serve`, a device paired with `waymark pair` that starts runs with `waymark run --runtime
//! codex` and answers from its inbox, and the laptop's `waymark runner`, which starts this
//! binary's Codex adapter (and through it `codex app-server`) bound to the task the signed
//! `start_run` made. Codex's only model is a fake Responses API
//! (`waymark-adapters/tests/support/fake_responses.rs`, shared by path) whose `exec_command`
//! calls append to a file, so a repeated call shows twice — there and in the fake's count.
//!
//! Codex never reaches the internet: a private `CODEX_HOME` and `HOME` whose `config.toml`
//! names the fake as its only provider. The test fails — never skips — when the runtime is not
//! installed; every process it starts is killed when it ends, passing or not.

#[allow(dead_code, unreachable_pub)]
#[path = "../../waymark-adapters/tests/support/fake_model.rs"]
mod fake_model;
#[allow(dead_code, unreachable_pub)]
#[path = "../../waymark-adapters/tests/support/fake_responses.rs"]
mod fake_responses;
mod runner_world;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use fake_model::Turn;
use fake_responses::{FakeResponses, text_of};
use runner_world::*;
use serde_json::{Value, json};

/// The version `scripts/setup-debian` installs and this test was written against.
const CODEX_VERSION: &str = "0.169.0";

/// The native `codex` binary of the installed `@openai/codex-linux-x64`, or a failure that says
/// how to install it.
fn codex_binary() -> PathBuf {
    let base = std::env::var_os("WAYMARK_RUNTIMES_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/waymark-runtimes"))
        })
        .expect("neither WAYMARK_RUNTIMES_DIR nor HOME is set: cannot find the real Codex");
    let dir = base.join("codex");
    let stamp = std::fs::read_to_string(dir.join("installed")).unwrap_or_default();
    let vendor = dir.join("node_modules/@openai/codex-linux-x64/vendor");
    let binary = std::fs::read_dir(&vendor)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin/codex"))
        .find(|p| p.exists());
    match binary {
        Some(b) if stamp.trim() == format!("@openai/codex@{CODEX_VERSION}") => b,
        _ => panic!(
            "the real Codex {CODEX_VERSION} is not installed in `{}` (installed: `{}`) — run \
             `scripts/setup-debian`, which installs it there (set WAYMARK_RUNTIMES_DIR to use \
             another place)",
            dir.display(),
            stamp.trim(),
        ),
    }
}

/// `waymark run --runtime codex` from the phone: the new task's id.
fn start_run(phone: &Path, dir: &str, prompt: &str) -> String {
    runner_world::start_run(phone, "codex", dir, prompt)
}

/// The user messages of a Responses request, in order.
fn user_texts(request: &Value) -> Vec<String> {
    request["input"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|i| i["type"] == "message" && i["role"] == "user")
        .map(text_of)
        .collect()
}

// ---- the laptop ------------------------------------------------------------------------------

/// The laptop: a private Codex home pointed at the fake model, the project it allows, and the
/// runner's state.
struct Laptop {
    dir: tempfile::TempDir,
    codex: PathBuf,
}

impl Laptop {
    fn new(model: &FakeResponses) -> Laptop {
        let dir = tempfile::tempdir().unwrap();
        for d in ["codex-home", "project", "data", "phone"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        // What each setting is for: docs/adapters/codex.md.
        let config = format!(
            r#"model = "{model}"
model_provider = "fake"
approval_policy = "on-request"
sandbox_mode = "workspace-write"

[model_providers.fake]
name = "fake"
base_url = "{url}"
wire_api = "responses"
env_key = "WAYMARK_FAKE_MODEL_KEY"
request_max_retries = 0
stream_max_retries = 0
"#,
            model = fake_model::MODEL,
            url = model.base_url,
        );
        std::fs::write(dir.path().join("codex-home/config.toml"), config).unwrap();
        Laptop {
            dir,
            codex: codex_binary(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `waymark runner` for alice's laptop, with the environment its owner gives the runtimes
    /// (the private Codex home, the fake model's key); killed with `-9` when dropped.
    fn runner(&self, url: &str, token: &str) -> RunnerProcess {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path("runner.log"))
            .unwrap();
        let mut c = waymark();
        c.args(["runner", "--server", url, "--allow"])
            .arg(self.path("project"))
            .arg("--codex")
            .arg(&self.codex)
            .arg("--state-dir")
            .arg(self.path("runner-state"))
            .env("WAYMARK_TOKEN", token)
            .env("WAYMARK_LOG", "info")
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", self.path("codex-home"))
            .env("CODEX_HOME", self.path("codex-home"))
            .env("WAYMARK_FAKE_MODEL_KEY", "dummy")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        RunnerProcess(c.spawn().expect("waymark runner starts"))
    }
}

// ---- the story -------------------------------------------------------------------------------

/// A person with only a phone starts Codex on the laptop through its runner: the runner binds
/// the Codex adapter to the task the signed `start_run` made (its own machine token, the prompt
/// on stdin, the thread's id kept in its state dir); Codex's approval reaches the phone's inbox,
/// is approved there, and the run finishes. A run whose Codex (app-server and adapter) and
/// runner are all killed with `-9` after a confirmed call is revived by the restarted runner
/// with Codex's own `thread/resume` of the same thread and a turn carrying Waymark's note: the
/// model sees the earlier conversation and the note, the call is not made again (counted by
/// the model and in the file it appends to), and the run finishes. A follow-up then reaches the
/// same thread at its time. Killed while Codex waits for an approval, a run waits for the
/// person's answer to a recovery card, then resumes the same thread with the approval the dead
/// connection held expired and the call never run. A run cancelled from the phone ends, Codex
/// with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runner_starts_revives_and_resumes_codex_for_a_phone() {
    let started = Instant::now();
    // Where the calls count themselves (they run outside Codex's sandbox, once approved).
    let scratch = tempfile::tempdir().unwrap();
    let counts = scratch.path().to_path_buf();
    let model = FakeResponses::start(vec![
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
            prompt: "runner: killed while asking".into(),
            command: format!("echo ran >> {}", counts.join("count-p").display()),
            answer: "Finished after the recovery.".into(),
        },
        Turn {
            prompt: "runner: pause me while asking".into(),
            command: format!("echo ran >> {}", counts.join("count-z").display()),
            answer: "Finished after the pause.".into(),
        },
        Turn {
            prompt: "runner: wait to be cancelled".into(),
            command: format!("echo ran >> {}", counts.join("count-c").display()),
            answer: "This answer never comes.".into(),
        },
    ])
    .await;
    let laptop = Laptop::new(&model);
    let _cleanup = Cleanup(laptop.dir.path().to_path_buf());
    let project = laptop.path("project").canonicalize().unwrap();
    let dir = project.to_str().unwrap();
    // A repository, as a person's project is: a runner's run records its working tree.
    git_project(&project);
    let data = laptop.path("data");
    let phone = laptop.path("phone");
    admin(&data, &["user", "add", "alice"]);
    let server = serve(&data);
    let url = server.1.clone();
    let link = admin(&data, &["pair", "--user", "alice"])["link"]
        .as_str()
        .unwrap()
        .to_owned();
    device(
        &phone,
        &["pair", &link, "--name", "alice's phone", "--json"],
    );
    let token = admin(
        &data,
        &["runner-token", "--machine", "laptop", "--user", "alice"],
    )["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let admin_token = std::fs::read_to_string(data.join("admin.token"))
        .unwrap()
        .trim()
        .to_owned();
    let mut runner = laptop.runner(&url, &token);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let m = device(&phone, &["machines", "--json"]);
        if m["machines"][0]["online"] == true {
            let codex = m["machines"][0]["runtimes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["runtime"] == "codex")
                .cloned();
            assert_eq!(
                codex,
                Some(json!({"runtime": "codex", "version": CODEX_VERSION})),
                "the runner registered the Codex it found: {m}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the laptop never came online: {m}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("laptop online at {:?}", started.elapsed());

    // 1. Started from the phone; approved from the phone; the run finishes.
    let task = start_run(&phone, dir, "runner: make the approved file");
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
    assert_eq!(d["task"]["runtime"], "codex");
    assert!(d["task"]["machine_id"].as_str().is_some());
    assert_eq!(
        d["task"]["state"], "queued",
        "the thread stays open for a follow-up or a revive: {d}"
    );
    assert_eq!(d["attempts"].as_array().unwrap().len(), 1, "{d}");
    assert_eq!(d["effects"][0]["kind"], "codex.commandExecution");
    assert_eq!(d["effects"][0]["status"], "confirmed");
    assert!(
        d["checkpoints"].as_array().unwrap().iter().any(|c| {
            c["body"]["reason"] == "working_tree"
                && c["body"]["materials"]["tree"]["commit"]
                    .as_str()
                    .is_some_and(|c| c.len() == 40)
        }),
        "the adapter recorded the run's working tree: {d}"
    );
    let said = texts(&d);
    assert!(
        said.iter().any(|t| t == "system: laptop started the run"),
        "{said:?}"
    );
    assert!(
        said.iter()
            .any(|t| t == "user: runner: make the approved file"),
        "the prompt reached Codex: {said:?}"
    );
    let thread_a = std::fs::read_to_string(
        laptop
            .path("runner-state/codex")
            .join(format!("{task}.thread")),
    )
    .expect("the runner kept the run's Codex thread");
    assert!(!thread_a.trim().is_empty());
    let runs: Value = serde_json::from_str(
        &std::fs::read_to_string(laptop.path("runner-state/state.json")).unwrap(),
    )
    .unwrap();
    assert!(
        runs["runs"].get(&task).is_none(),
        "the ended run is forgotten: {runs}"
    );

    // 2. kill -9 after a confirmed call: Codex, its adapter and the runner; the restarted
    // runner revives the run in the same thread.
    model.hold_after_results(true);
    let task = start_run(&phone, dir, "runner: count once, then be killed");
    let item = pending_in_inbox(&phone, "count-k").await;
    approve(&phone, &item);
    until(&url, &admin_token, &task, "the call is confirmed", |d| {
        d["effects"][0]["status"] == "confirmed"
    })
    .await;
    model_received(
        || model.requests(),
        0,
        "the call's output (held)",
        |r| {
            user_texts(r)
                .iter()
                .any(|t| t.contains("runner: count once, then be killed"))
                && r["input"].to_string().contains("function_call_output")
        },
    )
    .await;
    assert_eq!(lines(&counts.join("count-k")), 1);
    let calls = model.calls();
    kill_run_and_runner(runner, &laptop.path("runner-state"), &task);
    model.hold_after_results(false);
    let before = model.requests().len();
    eprintln!("killed at {:?}", started.elapsed());
    runner = laptop.runner(&url, &token);
    let d = until(&url, &admin_token, &task, "the revived run finishes", |d| {
        d["attempts"].as_array().unwrap().len() >= 2
            && d["attempts"].as_array().unwrap().last().unwrap()["state"] == "finished"
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
        model.calls(),
        calls,
        "the model did not ask for the call again"
    );
    assert_revived(&d);
    let said = texts(&d);
    assert!(
        said.iter()
            .any(|t| t.starts_with("user: Waymark: this session was interrupted")),
        "the note went into the thread as a turn: {said:?}"
    );
    // The same Codex thread: the resumed turn's request carries the earlier conversation (the
    // first prompt and the call's output) and then the note.
    let resumed = note_in_session(
        &model.requests()[before..],
        "runner: count once, then be killed",
        "count-k",
        user_texts,
    );
    assert!(
        resumed["input"]
            .to_string()
            .contains("function_call_output"),
        "the call's output is in the resumed thread"
    );

    // 3. A follow-up on the run: at its time the runner resumes the same thread with it.
    let before = model.requests().len();
    followup(
        &url,
        &admin_token,
        &task,
        "runner: the follow-up says look again",
    )
    .await;
    model_received(
        || model.requests(),
        before,
        "the follow-up in the same thread",
        |r| {
            let users = user_texts(r);
            users
                .iter()
                .any(|t| t.contains("runner: the follow-up says look again"))
                && users
                    .iter()
                    .any(|t| t.contains("runner: count once, then be killed"))
                && users
                    .iter()
                    .any(|t| t.contains("Waymark: this session was interrupted"))
        },
    )
    .await;
    newest_finished(&url, &admin_token, &task, 3, "the follow-up's turn ends").await;
    eprintln!("follow-up delivered at {:?}", started.elapsed());
    assert_eq!(
        lines(&counts.join("count-k")),
        1,
        "the follow-up repeated nothing"
    );
    assert_eq!(model.calls(), calls);

    // 4. Codex and the runner killed while Codex waits for an approval: the approval is tied to
    // its item, which Codex runs only once accepted, so the call is known not to have run — no
    // recovery card; the runner resumes the thread at once, and the card the phone already has
    // stays the person's. Codex (told the call did not run) asks for the command again, and the
    // adapter answers it from that card: no second card; approved on the phone, it runs once.
    model.retry_aborted(true);
    let task = start_run(&phone, dir, "runner: killed while asking");
    let asked = pending_in_inbox(&phone, "count-p").await;
    kill_run_and_runner(runner, &laptop.path("runner-state"), &task);
    let calls = model.calls();
    runner = laptop.runner(&url, &token);
    let d = until(
        &url,
        &admin_token,
        &task,
        "the run resumed, and Codex asking again",
        |d| d["attempts"].as_array().unwrap().len() == 2 && model.calls() > calls,
    )
    .await;
    eprintln!("asked again after the revive at {:?}", started.elapsed());
    let decisions = d["decisions"].as_array().unwrap();
    assert!(
        !decisions.iter().any(|x| x["kind"] == "recovery"),
        "no recovery card: the call waited for a person and never ran: {d}"
    );
    assert_eq!(
        decisions.len(),
        1,
        "no second card for the same command: {d}"
    );
    assert_eq!(decisions[0]["id"], asked["decision"]["id"]);
    assert_eq!(decisions[0]["status"], "pending", "{d}");
    let first = d["effects"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == decisions[0]["effect_id"])
        .unwrap_or_else(|| panic!("the approval is tied to its item's effect: {d}"));
    assert_eq!(first["status"], "failed", "closed as not run: {first}");
    assert_eq!(lines(&counts.join("count-p")), 0, "nothing ran unanswered");
    approve(&phone, &asked);
    let d = until(
        &url,
        &admin_token,
        &task,
        "the approved run finishes",
        |d| {
            let attempts = d["attempts"].as_array().unwrap();
            attempts.len() == 2
                && attempts[1]["state"] == "finished"
                && texts(d)
                    .iter()
                    .any(|t| t == "assistant: Finished after the recovery.")
        },
    )
    .await;
    eprintln!("answered run finished at {:?}", started.elapsed());
    model.retry_aborted(false);
    assert_eq!(
        lines(&counts.join("count-p")),
        1,
        "the call ran once, as approved"
    );
    let held = d["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["id"] == asked["decision"]["id"])
        .unwrap();
    assert_eq!(held["status"], "resolved", "{held}");
    assert_eq!(held["outcome"]["option"], "approve", "{held}");
    assert_eq!(
        held["delivery"]["state"], "acknowledged",
        "Codex took the answer: {held}"
    );

    // 5. Paused from the phone under a pending approval: the adapter interrupts Codex's turn
    // and holds (the approval expires, the call does not run, the process lives on with its
    // attempt); resumed from the phone, the same adapter continues the thread with a new turn —
    // nothing is addressed to the runner — and the run finishes, the call run at most once,
    // only once approved.
    let task = start_run(&phone, dir, "runner: pause me while asking");
    let asked = pending_in_inbox(&phone, "count-z").await;
    device(&phone, &["steer", &task, "pause", "--json"]);
    let d = until(
        &url,
        &admin_token,
        &task,
        "the paused turn is interrupted",
        |d| {
            d["decisions"]
                .as_array()
                .unwrap()
                .iter()
                .any(|x| x["id"] == asked["decision"]["id"] && x["status"] == "expired")
        },
    )
    .await;
    assert_eq!(d["task"]["state"], "paused", "{d}");
    assert_eq!(lines(&counts.join("count-z")), 0, "the call did not run");
    assert!(
        runner_runs(&laptop.path("runner-state"))["runs"][&task]["pid"]
            .as_u64()
            .is_some(),
        "the adapter holds while paused"
    );
    device(&phone, &["steer", &task, "resume", "--json"]);
    let deadline = Instant::now() + RUN;
    let mut approved_again = false;
    let d = loop {
        let d = task_detail(&url, &admin_token, &task).await;
        if texts(&d)
            .iter()
            .any(|t| t == "assistant: Finished after the pause.")
        {
            break d;
        }
        // The new turn may ask for the call again: approved from the phone.
        device(&phone, &["sync", "--json"]);
        let inbox = device(&phone, &["inbox", "--json"]);
        if let Some(item) = inbox.as_array().and_then(|a| {
            a.iter().find(|i| {
                i["decision"]["question"]
                    .as_str()
                    .is_some_and(|q| q.contains("count-z"))
            })
        }) {
            approve(&phone, item);
            approved_again = true;
        }
        assert!(
            Instant::now() < deadline,
            "the resumed run never finished: {d}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("paused run finished at {:?}", started.elapsed());
    assert_eq!(
        lines(&counts.join("count-z")),
        usize::from(approved_again),
        "the call ran only if it was asked for again and approved, and then once"
    );
    assert_eq!(
        d["attempts"].as_array().unwrap().len(),
        1,
        "the same attempt, held through the pause: {d}"
    );

    // 6. Cancelled from the phone under a pending approval: the adapter and the app-server it
    // started end (their process group is gone), the call never ran.
    let task = start_run(&phone, dir, "runner: wait to be cancelled");
    pending_in_inbox(&phone, "count-c").await;
    let d = cancel_from_phone(
        &phone,
        &laptop.path("runner-state"),
        &url,
        &admin_token,
        &task,
    )
    .await;
    eprintln!("cancelled run ended at {:?}", started.elapsed());
    assert_eq!(lines(&counts.join("count-c")), 0, "the call never ran");
    assert!(
        d["decisions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|x| x["status"] != "pending"),
        "no card is left waiting: {d}"
    );
    drop(runner);
    drop(server);
}
