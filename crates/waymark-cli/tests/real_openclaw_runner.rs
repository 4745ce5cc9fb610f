//! `waymark runner` with the REAL OpenClaw gateway (`openclaw@2026.9.6` from npm and the Node 24
//! it needs, installed by `scripts/setup-debian` under `$WAYMARK_RUNTIMES_DIR/openclaw`), as a
//! person with only a phone uses it: a real `waymark serve`, a device paired with `waymark pair`
//! that starts runs with `waymark run --runtime openclaw` and answers from its inbox, the
//! owner's gateway running as a service of its own, and the laptop's `waymark runner`, which
//! names that gateway (`--openclaw-gateway`) and runs each run as this binary's OpenClaw
//! adapter bound to the task and to a gateway session of the run's own. OpenClaw's only model
//! is the fake chat-completions API of `waymark-adapters/tests/support/fake_model.rs` (shared
//! by path), whose `exec` calls make a file of their own in the run's directory (`mktemp`), so
//! a repeated call shows twice — there and in the fake's count.
//!
//! The test fails — never skips — when the runtime is not installed; the gateway takes 25–45 s
//! to be ready; every process it starts is killed when it ends, passing or not.

#[path = "../../waymark-adapters/tests/support/fake_model.rs"]
#[allow(dead_code, unreachable_pub)]
mod fake_model;
#[path = "../../waymark-adapters/tests/support/openclaw_gateway.rs"]
mod openclaw_gateway;
mod runner_world;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use fake_model::{FakeModel, Turn, carries_result, user_texts};
use openclaw_gateway::{GATEWAY_TOKEN, Gateway, Home, OPENCLAW_VERSION, runtime};
use runner_world::*;
use serde_json::{Value, json};

/// `waymark runner` for alice's laptop, naming the gateway; killed with `-9` when dropped.
fn runner(laptop: &Path, url: &str, token: &str, home: &Home) -> RunnerProcess {
    let rt = runtime();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(laptop.join("runner.log"))
        .unwrap();
    let node_dir = rt.node.parent().unwrap();
    let openclaw = rt
        .openclaw
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join(".bin/openclaw");
    let mut c = waymark();
    c.args(["runner", "--server", url, "--allow"])
        .arg(laptop.join("project"))
        .args(["--openclaw-gateway", &home.url()])
        .arg("--openclaw")
        .arg(&openclaw)
        .arg("--state-dir")
        .arg(laptop.join("runner-state"))
        .env("WAYMARK_TOKEN", token)
        .env("OPENCLAW_GATEWAY_TOKEN", GATEWAY_TOKEN)
        .env("WAYMARK_LOG", "info,waymark_adapters=debug")
        .env(
            "PATH",
            format!("{}:/usr/local/bin:/usr/bin:/bin", node_dir.display()),
        )
        .env("HOME", laptop.join("home"))
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log);
    RunnerProcess(c.spawn().expect("waymark runner starts"))
}

/// How many files named `<prefix>.…` the run's calls made in `dir`: each run of a call makes
/// one (`mktemp`; OpenClaw refuses to ask about a command with a redirection, which it cannot
/// bind to what it approves).
fn made(dir: &Path, prefix: &str) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("{prefix}."))
        })
        .count()
}

/// A person with only a phone starts OpenClaw on the laptop through its runner, in a directory
/// the laptop allows: the run is a gateway session of its own, its exec approval reaches the
/// phone's inbox and is approved there, the command runs in that directory, and the run's
/// session stays open. The adapter and the runner killed with `-9` after a confirmed call (the
/// gateway, the owner's service, goes on): the restarted runner revives the run in the same
/// session with Waymark's note — the model sees the earlier conversation and the note, the call
/// is not made again — with a new attempt and fence. A follow-up reaches the same session at
/// its time. A directory that leads out of what the laptop allows is refused by its runner with
/// the reason, and nothing runs. The gateway killed and started again under a turn: the run is
/// revived in its session on the new gateway process, the confirmed call not made again. A run
/// cancelled from the phone is aborted in the gateway too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runner_starts_revives_and_resumes_openclaw_runs_for_a_phone() {
    let started = Instant::now();
    let rt = runtime();
    let laptop = tempfile::tempdir().unwrap();
    for d in ["home", "project", "data", "phone", "elsewhere"] {
        std::fs::create_dir_all(laptop.path().join(d)).unwrap();
    }
    let _cleanup = Cleanup(laptop.path().to_path_buf());
    let project = laptop.path().join("project").canonicalize().unwrap();
    let dir = project.to_str().unwrap();
    git_project(&project);
    let model = FakeModel::start(vec![
        Turn {
            prompt: "runner: make the approved file".into(),
            command: "mktemp count-a.XXXXXX".into(),
            answer: "Runner run finished.".into(),
        },
        Turn {
            prompt: "runner: count once, then be killed".into(),
            command: "mktemp count-k.XXXXXX".into(),
            answer: "Revived run finished.".into(),
        },
        Turn {
            prompt: "runner: wait to be cancelled".into(),
            command: "mktemp count-c.XXXXXX".into(),
            answer: "This turn should have been aborted.".into(),
        },
        Turn {
            prompt: "runner: the gateway goes away".into(),
            command: "mktemp count-g.XXXXXX".into(),
            answer: "Finished on the restarted gateway.".into(),
        },
    ])
    .await;
    // The owner's gateway: started first, as it takes a while.
    let home = Home::new(&model.base_url, fake_model::MODEL);
    let mut gw = Gateway::spawn(&rt, &home);
    let phone = laptop.path().join("phone");
    let (server, token, admin_token) = control_plane(&laptop.path().join("data"), &phone);
    let url = server.1.clone();
    Gateway::wait_ready(&mut gw).await;
    let mut runner_proc = runner(laptop.path(), &url, &token, &home);
    let openclaw = laptop_online(&phone, "openclaw").await;
    assert_eq!(
        openclaw,
        json!({"runtime": "openclaw", "version": OPENCLAW_VERSION}),
        "the runner registered the gateway's OpenClaw"
    );
    eprintln!("laptop online at {:?}", started.elapsed());

    // 1. Started from the phone in an allowed directory; approved from the phone; the command
    // runs there; the run's session stays open.
    let task = start_run(&phone, "openclaw", dir, "runner: make the approved file");
    let item = pending_in_inbox(&phone, "count-a").await;
    assert_eq!(
        made(&project, "count-a"),
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
    assert_eq!(
        made(&project, "count-a"),
        1,
        "the command ran once, in the run's directory\n{}",
        gw.log_tail()
    );
    assert_eq!(d["task"]["runtime"], "openclaw");
    assert_eq!(
        d["task"]["state"], "queued",
        "the session stays open for a follow-up or a revive: {d}"
    );
    assert_eq!(d["attempts"].as_array().unwrap().len(), 1, "{d}");
    let effect = d["effects"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["intent"].to_string().contains("count-a"))
        .cloned()
        .unwrap_or_else(|| panic!("the exec call is an effect: {d}"));
    assert_eq!(effect["status"], "confirmed", "{d}");
    let said = texts(&d);
    assert!(
        said.iter().any(|t| t == "system: laptop started the run"),
        "{said:?}"
    );
    assert!(
        said.iter()
            .any(|t| t.starts_with("user: ") && t.contains("runner: make the approved file")),
        "the prompt reached OpenClaw: {said:?}"
    );
    // Its working tree is recorded from the start and after the call that changed it.
    let trees: Vec<&Value> = d["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["body"]["reason"] == "working_tree")
        .collect();
    assert!(
        trees.len() >= 2
            && trees.last().unwrap()["body"]["materials"]["tree"]["changed"]
                .as_object()
                .is_some_and(|c| c.keys().any(|k| k.starts_with("count-a."))),
        "the run's working tree is recorded: {d}"
    );

    // 2. kill -9 the adapter and the runner after a confirmed call, the turn still under way in
    // the gateway; the restarted runner revives the run in the same session.
    model.hold_after_results(true);
    let task = start_run(
        &phone,
        "openclaw",
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
    assert_eq!(made(&project, "count-k"), 1);
    let calls = model.gemini_calls();
    kill_run_and_runner(runner_proc, &laptop.path().join("runner-state"), &task);
    model.hold_after_results(false);
    let before = model.requests().len();
    eprintln!("killed at {:?}", started.elapsed());
    runner_proc = runner(laptop.path(), &url, &token, &home);
    let d = newest_finished(&url, &admin_token, &task, 2, "the revived run finishes").await;
    eprintln!("revived run finished at {:?}", started.elapsed());
    assert_eq!(
        made(&project, "count-k"),
        1,
        "the confirmed call did not run again"
    );
    assert_eq!(
        model.gemini_calls(),
        calls,
        "the model did not ask for the call again"
    );
    assert_revived(&d);
    // The same session: the note's request carries the earlier conversation (the first prompt
    // and the call's result) and then the note.
    let resumed = note_in_session(
        &model.requests()[before..],
        "runner: count once, then be killed",
        "count-k",
        user_texts,
    );
    assert!(
        carries_result(&resumed),
        "the call's result is in the session"
    );

    // 3. A follow-up on the run: at its time the runner sends it into the same session.
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
        made(&project, "count-k"),
        1,
        "the follow-up repeated nothing"
    );
    assert_eq!(model.gemini_calls(), calls);

    // 4. A directory that looks allowed but leads elsewhere (a link out of the project): the
    // control plane cannot tell, the runner can — refused there with the reason, nothing
    // started.
    let escape = project.join("escape");
    std::os::unix::fs::symlink(laptop.path().join("elsewhere"), &escape).unwrap();
    let requests = model.requests().len();
    let refused = start_run(
        &phone,
        "openclaw",
        escape.to_str().unwrap(),
        "runner: make the approved file",
    );
    let d = until(&url, &admin_token, &refused, "the runner refuses", |d| {
        d["task"]["state"] == "failed"
    })
    .await;
    let why = d["task"]["outcome_summary"].as_str().unwrap_or("");
    assert!(
        why.contains("laptop refused to start the run")
            && why.contains("outside the directories this machine allows"),
        "{d}"
    );
    assert!(d["attempts"].as_array().unwrap().is_empty(), "{d}");
    assert_eq!(model.requests().len(), requests, "nothing reached OpenClaw");

    // 5. Cancelled from the phone under a pending approval: the adapter (ended by the runner
    // with `SIGTERM`) aborts the turn in the gateway, where it would otherwise go on; the call
    // never runs and no card is left waiting.
    let task = start_run(&phone, "openclaw", dir, "runner: wait to be cancelled");
    pending_in_inbox(&phone, "count-c").await;
    let d = cancel_from_phone(
        &phone,
        &laptop.path().join("runner-state"),
        &url,
        &admin_token,
        &task,
    )
    .await;
    eprintln!("cancelled run ended at {:?}", started.elapsed());
    assert!(
        d["decisions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|x| x["status"] != "pending"),
        "no card is left waiting: {d}"
    );
    assert_eq!(made(&project, "count-c"), 0, "the call never ran");
    // The gateway aborted the session's turn: its lane says so.
    let lane = format!("lane=session:agent:main:waymark-run-{task}");
    let deadline = Instant::now() + RUN;
    while !gw
        .log_text()
        .lines()
        .any(|l| l.contains(&lane) && l.contains("This operation was aborted"))
    {
        assert!(
            Instant::now() < deadline,
            "the gateway never aborted the run's turn:\n{}",
            gw.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // 6. The gateway itself killed under a turn, after a confirmed call, and started again by
    // its owner: the adapter finds another gateway process (its boot id), leaves the attempt,
    // and the runner's report revives the run in the same session, which the gateway kept.
    model.hold_after_results(true);
    let task = start_run(&phone, "openclaw", dir, "runner: the gateway goes away");
    confirmed_and_held(
        &phone,
        (&url, &admin_token, &task),
        "count-g",
        || model.requests(),
        |r| {
            user_texts(r)
                .iter()
                .any(|t| t.contains("runner: the gateway goes away"))
                && carries_result(r)
        },
    )
    .await;
    let calls = model.gemini_calls();
    drop(gw);
    model.hold_after_results(false);
    let before = model.requests().len();
    eprintln!("gateway killed at {:?}", started.elapsed());
    let mut gw = Gateway::spawn(&rt, &home);
    Gateway::wait_ready(&mut gw).await;
    // OpenClaw 2026.9.6, started again, takes up the interrupted turn itself and seeds its
    // bootstrap files (`AGENTS.md`, `SOUL.md`…) into the session's working directory where they
    // are missing: the revive's admission sees the tree changed and asks the person, naming
    // them. Answered "resume anyway" from the phone, the run goes on.
    let card = {
        let deadline = Instant::now() + RUN;
        loop {
            device(&phone, &["sync", "--json"]);
            let inbox = device(&phone, &["inbox", "--json"]);
            let card = inbox.as_array().and_then(|a| {
                a.iter()
                    .find(|i| {
                        i["decision"]["task_id"] == task.as_str()
                            && i["decision"]["kind"] == "recovery"
                    })
                    .cloned()
            });
            let d = task_detail(&url, &admin_token, &task).await;
            let revived = d["attempts"].as_array().unwrap().len() >= 2;
            if card.is_some() || revived {
                break card;
            }
            assert!(Instant::now() < deadline, "no revive and no card: {d}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    if let Some(card) = card {
        let question = card["decision"]["question"].as_str().unwrap_or("");
        assert!(
            question.contains("the working tree is not as the last checkpoint left it")
                && question.contains("`AGENTS.md`"),
            "the card names what OpenClaw wrote: {card}"
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
    }
    let d = newest_finished(&url, &admin_token, &task, 2, "the revived run finishes").await;
    eprintln!(
        "revived on the restarted gateway at {:?}",
        started.elapsed()
    );
    assert_eq!(d["attempts"][0]["state"], "revoked", "{d}");
    assert_eq!(
        made(&project, "count-g"),
        1,
        "the confirmed call did not run again"
    );
    assert_eq!(
        model.gemini_calls(),
        calls,
        "the model did not ask for it again"
    );
    model_received(
        || model.requests(),
        before,
        "the note in the kept session",
        |r| {
            let users = user_texts(r);
            users
                .iter()
                .any(|t| t.contains("Waymark: this session was interrupted"))
                && users
                    .iter()
                    .any(|t| t.contains("runner: the gateway goes away"))
        },
    )
    .await;

    drop(runner_proc);
    drop(server);
    drop(gw);
    eprintln!("done at {:?}", started.elapsed());
}
