//! Machines and runners over real HTTP: a runner's token registers its machine and reaches
//! only that machine's tasks; a device starts a run with a signed `start_run`; the runner's
//! work (start, resume, stop) and reports; a runtime process that ended mid-run goes through
//! recovery — a call in flight is a card and nothing is re-run until a person answers — and
//! follow-ups and answers to deferred approvals resume the runtime on its machine. The runner
//! here is the test, speaking the runner routes as `waymark runner` does.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use waymark_proto::Operation;

use crate::support::{Harness, TestDevice, assert_problem};

const HOOK: &str = "/v1/adapters/claude-code/hook";

struct Laptop {
    token: String,
    id: String,
}

async fn laptop(h: &Harness, dirs: &[&str]) -> Laptop {
    let (token, m, _) =
        waymark_server::admin::create_runner_token(&*h.server.state.store, "laptop", Some("alice"))
            .await
            .unwrap();
    let (s, v) = h
        .send(
            reqwest::Method::PUT,
            &token,
            "/v1/runner/machine",
            Some(json!({
                "runtimes": [{"runtime": "claude-code", "version": "2.1.328"}],
                "directories": dirs,
                "runner_version": "0.1.0",
            })),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["online"], true, "{v}");
    Laptop { token, id: m.id }
}

async fn work(h: &Harness, l: &Laptop) -> Value {
    let (s, v) = h.get(&l.token, "/v1/runner/work").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    v
}

async fn report(h: &Harness, l: &Laptop, work: &str, state: &str, detail: &str) -> Value {
    let (s, v) = h
        .post(
            &l.token,
            &format!("/v1/runner/work/{work}"),
            json!({"state": state, "detail": detail}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    v
}

fn start_run(d: &TestDevice, task: &str, args: Value) -> Value {
    d.sign(&d.command(task, None, Operation::StartRun, args))
}

fn run_args(dir: &str) -> Value {
    json!({"machine": "laptop", "runtime": "claude-code", "directory": dir,
           "prompt": "make the tests pass", "gate": "Bash"})
}

/// A run started from a device and started by the runner: its task id and session key.
async fn started(h: &Harness, l: &Laptop, d: &TestDevice) -> (String, String) {
    let task = waymark_proto::ids::task();
    let (s, v) = h
        .submit(&start_run(d, &task, run_args("/home/alice/src/app")))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["status"], "applied", "{v}");
    let w = work(h, l).await;
    let item = &w["work"][0];
    report(h, l, item["id"].as_str().unwrap(), "taken", "").await;
    report(h, l, item["id"].as_str().unwrap(), "done", "pid 42").await;
    (
        task,
        item["run"]["session_key"].as_str().unwrap().to_owned(),
    )
}

async fn hook(h: &Harness, token: &str, query: &str, body: Value) -> Value {
    let (s, v) = h.post(token, &format!("{HOOK}{query}"), body).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    v
}

fn event(session: &str, name: &str, more: Value) -> Value {
    let mut v =
        json!({"session_id": session, "hook_event_name": name, "cwd": "/home/alice/src/app"});
    for (k, x) in more.as_object().unwrap() {
        v[k] = x.clone();
    }
    v
}

fn bash(session: &str, name: &str, id: &str, command: &str) -> Value {
    let mut more =
        json!({"tool_name": "Bash", "tool_input": {"command": command}, "tool_use_id": id});
    if name == "PostToolUse" {
        more["tool_response"] = json!({"stdout": "", "stderr": "", "interrupted": false});
    }
    event(session, name, more)
}

#[tokio::test]
async fn a_machine_registers_goes_offline_by_the_clock_and_only_its_owner_sees_it() {
    let h = Harness::start().await;
    let alice = h.pair_device("alice", &["view", "steer", "approve"]).await;
    let bob = h.pair_device("bob", &["view", "steer"]).await;
    let (token, _, _) =
        waymark_server::admin::create_runner_token(&*h.server.state.store, "laptop", Some("alice"))
            .await
            .unwrap();
    let session = h.session_token(&alice).await;
    let (_, v) = h.get(&session, "/v1/machines").await;
    assert_eq!(v["machines"][0]["name"], "laptop");
    assert_eq!(v["machines"][0]["online"], false, "never heard from: {v}");
    assert!(v["machines"][0].get("offline_since").is_none(), "{v}");

    // A second token of the machine, as `runner-token` makes one for a new runner; the first
    // one still speaks for it.
    let l = laptop(&h, &["/home/alice/src"]).await;
    let (s, v) = h.get(&token, "/v1/runner/work").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (_, v) = h.get(&session, "/v1/machines").await;
    let m = &v["machines"][0];
    assert_eq!(m["online"], true, "{v}");
    assert_eq!(m["runtimes"][0]["runtime"], "claude-code");
    assert_eq!(m["directories"], json!(["/home/alice/src"]));

    h.advance(Duration::from_secs(61)).await;
    let (_, v) = h.get(&session, "/v1/machines").await;
    let m = &v["machines"][0];
    assert_eq!(m["online"], false, "a minute without a word: {v}");
    let seen = chrono::DateTime::parse_from_rfc3339(m["last_seen_at"].as_str().unwrap()).unwrap();
    let since = chrono::DateTime::parse_from_rfc3339(m["offline_since"].as_str().unwrap()).unwrap();
    assert_eq!((since - seen).num_seconds(), 60);
    work(&h, &l).await;
    let (_, v) = h.get(&session, "/v1/machines").await;
    assert_eq!(
        v["machines"][0]["online"], true,
        "asking for work is its heartbeat"
    );

    let bob_session = h.session_token(&bob).await;
    let (_, v) = h.get(&bob_session, "/v1/machines").await;
    assert_eq!(
        v["machines"],
        json!([]),
        "another user's machine is not listed"
    );

    // A runner's token reaches its machine's work only.
    let (s, v) = h.get(&l.token, "/v1/events").await;
    assert_problem(s, &v, 403, "forbidden");
    let other = h.create_task(&h.alice).await;
    let (s, v) = h.get(&l.token, &format!("/v1/tasks/{other}")).await;
    assert_problem(s, &v, 404, "not_found");
    let (s, v) = h.get(&h.alice, "/v1/runner/work").await;
    assert_problem(s, &v, 403, "forbidden");
    // A session started by hand on the machine (its hooks with the runner's token) is the
    // machine's task, but not a run its runner started: it is not recovered through it.
    hook(
        &h,
        &l.token,
        "",
        event("by-hand", "SessionStart", json!({"source": "startup"})),
    )
    .await;
    let w = work(&h, &l).await;
    assert_eq!(w["running"], json!([]), "{w}");
    let (s, v) = h
        .post(
            &l.token,
            "/v1/tasks",
            json!({"title": "x", "runtime": "claude-code", "external_key": "by-hand"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "the hook made it: {v}");
    assert_eq!(v["machine_id"], l.id.as_str(), "{v}");
    let by_hand = v["id"].as_str().unwrap().to_owned();
    let (s, v) = h
        .post(
            &l.token,
            &format!("/v1/runner/tasks/{by_hand}/exited"),
            json!({"signal": 9}),
        )
        .await;
    assert_problem(s, &v, 422, "validation_failed");
    let (s, v) = h
        .send(
            reqwest::Method::PUT,
            &l.token,
            "/v1/runner/machine",
            Some(json!({"runtimes": [], "directories": ["/home/alice/../etc"], "runner_version": "1"})),
        )
        .await;
    assert_problem(s, &v, 422, "validation_failed");
}

#[tokio::test]
async fn a_signed_start_run_reaches_the_runner_once_and_what_the_machine_does_not_allow_is_refused()
{
    let h = Harness::start().await;
    let alice = h.pair_device("alice", &["view", "steer", "approve"]).await;
    let l = laptop(&h, &["/home/alice/src"]).await;
    let task = waymark_proto::ids::task();
    let env = start_run(&alice, &task, run_args("/home/alice/src/app"));
    let (_, v) = h.submit(&env).await;
    assert_eq!(v["status"], "applied", "{v}");
    assert_eq!(v["task_id"], task.as_str());
    let (_, again) = h.submit(&env).await;
    assert_eq!(
        again["status"], "duplicate",
        "a resend is the same command: {again}"
    );

    let d = h.detail(&task).await;
    assert_eq!(d["task"]["machine_id"], l.id.as_str());
    assert_eq!(d["task"]["runtime"], "claude-code");
    assert_eq!(d["task"]["state"], "queued");
    assert_eq!(d["task"]["goal"], "make the tests pass");

    let w = work(&h, &l).await;
    assert_eq!(w["work"].as_array().unwrap().len(), 1, "one start: {w}");
    let item = &w["work"][0];
    assert_eq!(item["kind"], "start");
    assert_eq!(item["task_id"], task.as_str());
    assert_eq!(
        item["run"].get("plan"),
        None,
        "not planned first unless asked"
    );
    assert_eq!(item["run"]["directory"], "/home/alice/src/app");
    assert_eq!(item["run"]["gate"], "Bash");
    let key = item["run"]["session_key"].as_str().unwrap();
    assert_eq!(
        d["task"]["external_key"], key,
        "the runtime's hooks find the task by it"
    );
    assert!(
        uuid::Uuid::parse_str(key).is_ok(),
        "Claude Code takes a UUID: {key}"
    );
    let id = item["id"].as_str().unwrap();
    report(&h, &l, id, "taken", "").await;
    assert_eq!(
        work(&h, &l).await["work"][0]["state"],
        "taken",
        "given again until reported"
    );
    report(&h, &l, id, "done", "pid 42").await;
    assert_eq!(work(&h, &l).await["work"], json!([]));
    let (s, v) = h
        .post(
            &l.token,
            &format!("/v1/runner/work/{id}"),
            json!({"state": "refused"}),
        )
        .await;
    assert_problem(s, &v, 409, "illegal_transition");
    assert!(
        h.detail(&task).await["messages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["text"] == "laptop started the run"),
    );

    // Refusals: the reason is said, and nothing reaches the runner.
    let reader = h.pair_device("alice", &["view"]).await;
    let fresh = |args: Value| start_run(&alice, &waymark_proto::ids::task(), args);
    let cases = [
        (
            fresh(run_args("/etc")),
            "not_allowed_on_machine",
            "does not allow runs in `/etc`",
        ),
        (
            fresh(run_args("/home/alice/src/../../etc")),
            "not_allowed_on_machine",
            "does not allow",
        ),
        (
            fresh(run_args("/home/alice/srcx")),
            "not_allowed_on_machine",
            "does not allow",
        ),
        (
            fresh(
                json!({"machine": "laptop", "runtime": "codex", "directory": "/home/alice/src", "prompt": "p"}),
            ),
            "not_allowed_on_machine",
            "codex",
        ),
        (
            fresh(
                json!({"machine": "desk", "runtime": "claude-code", "directory": "/home/alice/src", "prompt": "p"}),
            ),
            "unknown_machine",
            "no machine `desk`",
        ),
        (
            fresh(
                json!({"machine": "laptop", "runtime": "claude-code", "directory": "/home/alice/src", "prompt": ""}),
            ),
            "invalid_command",
            "prompt",
        ),
        (
            fresh(
                json!({"machine": "laptop", "runtime": "gemini", "directory": "/home/alice/src", "prompt": "p", "plan": true}),
            ),
            "invalid_command",
            "plan first is for claude-code and codex",
        ),
        (
            fresh(
                json!({"machine": "laptop", "runtime": "claude-code", "directory": "/home/alice/src", "prompt": "p", "plan": "yes"}),
            ),
            "invalid_command",
            "`args.plan` is true or false",
        ),
        (
            start_run(&alice, &task, run_args("/home/alice/src")),
            "invalid_command",
            "exists",
        ),
        (
            start_run(&alice, "task_1", run_args("/home/alice/src")),
            "invalid_command",
            "32 lower-case hex",
        ),
        (
            start_run(
                &reader,
                &waymark_proto::ids::task(),
                run_args("/home/alice/src"),
            ),
            "missing_scope",
            "steer",
        ),
    ];
    for (env, reason, needle) in cases {
        let (s, v) = h.submit(&env).await;
        assert!(s.is_client_error(), "{s}: {v}");
        assert_eq!(v["status"], "rejected", "{v}");
        assert_eq!(v["reason"], reason, "{v}");
        assert!(
            v["detail"].as_str().unwrap().contains(needle),
            "{needle}: {v}"
        );
    }
    assert_eq!(
        work(&h, &l).await["work"],
        json!([]),
        "nothing was addressed"
    );
    let bob = h.pair_device("bob", &["view", "steer"]).await;
    let (_, v) = h
        .submit(&start_run(
            &bob,
            &waymark_proto::ids::task(),
            run_args("/home/alice/src"),
        ))
        .await;
    assert_eq!(
        v["reason"], "unknown_machine",
        "bob cannot start runs on alice's laptop: {v}"
    );
}

#[tokio::test]
async fn a_runner_that_refuses_a_start_fails_the_task_with_its_reason() {
    let h = Harness::start().await;
    let alice = h.pair_device("alice", &["view", "steer"]).await;
    let l = laptop(&h, &["/home/alice/src"]).await;
    let task = waymark_proto::ids::task();
    h.submit(&start_run(&alice, &task, run_args("/home/alice/src/gone")))
        .await;
    let w = work(&h, &l).await;
    let id = w["work"][0]["id"].as_str().unwrap();
    report(
        &h,
        &l,
        id,
        "refused",
        "`/home/alice/src/gone` cannot be used here: No such file or directory",
    )
    .await;
    let d = h.detail(&task).await;
    assert_eq!(d["task"]["state"], "failed");
    assert!(
        d["task"]["outcome_summary"]
            .as_str()
            .unwrap()
            .contains("laptop refused to start the run: `/home/alice/src/gone`"),
        "{d}"
    );
    assert!(h.audit_codes(&task).await.contains(&"refused".to_owned()));
}

#[tokio::test]
async fn a_run_cut_off_with_a_call_in_flight_waits_for_a_person_then_resumes_with_a_note() {
    let h = Harness::start().await;
    let alice = h.pair_device("alice", &["view", "steer", "approve"]).await;
    let l = laptop(&h, &["/home/alice/src"]).await;
    let (task, key) = started(&h, &l, &alice).await;
    hook(
        &h,
        &l.token,
        "",
        event(&key, "SessionStart", json!({"source": "startup"})),
    )
    .await;
    hook(
        &h,
        &l.token,
        "",
        bash(&key, "PreToolUse", "t1", "touch done.txt"),
    )
    .await;
    hook(
        &h,
        &l.token,
        "",
        bash(&key, "PostToolUse", "t1", "touch done.txt"),
    )
    .await;
    hook(&h, &l.token, "", bash(&key, "PreToolUse", "t2", "git push")).await;
    let w = work(&h, &l).await;
    assert_eq!(
        w["running"],
        json!([task]),
        "an attempt holds the run's lease: {w}"
    );

    // kill -9: the runner reports what it saw.
    let (s, v) = h
        .post(
            &l.token,
            &format!("/v1/runner/tasks/{task}/exited"),
            json!({"signal": 9}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["action"], "needs_human", "{v}");
    let d = h.detail(&task).await;
    assert_eq!(d["task"]["state"], "needs_human");
    assert_eq!(d["attempts"][0]["state"], "revoked");
    let effects = d["effects"].as_array().unwrap();
    let push = effects
        .iter()
        .find(|e| e["intent"]["input"]["command"] == "git push")
        .unwrap();
    let done = effects
        .iter()
        .find(|e| e["intent"]["input"]["command"] == "touch done.txt")
        .unwrap();
    assert_eq!(push["status"], "unknown", "never re-run blindly: {push}");
    assert_eq!(done["status"], "confirmed", "{done}");
    let card = d["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["kind"] == "recovery" && x["status"] == "pending")
        .unwrap_or_else(|| panic!("a recovery card: {d}"))
        .clone();
    assert!(
        card["question"].as_str().unwrap().contains("signal 9"),
        "the evidence: {card}"
    );
    assert_eq!(card["intent"]["input"]["command"], "git push");
    assert_eq!(
        work(&h, &l).await["work"],
        json!([]),
        "nothing resumes until the person answers"
    );
    assert_eq!(work(&h, &l).await["running"], json!([]));

    let rev = h.revision(&task).await;
    let cmd = alice.command(
        &task,
        Some(rev),
        Operation::ChooseOption,
        json!({"decision_id": card["id"], "option": "mark_not_started"}),
    );
    let (_, v) = h.submit(&alice.sign(&cmd)).await;
    assert_eq!(v["status"], "applied", "{v}");
    let w = work(&h, &l).await;
    let item = &w["work"][0];
    assert_eq!(item["kind"], "resume", "{w}");
    assert_eq!(item["resume"]["reason"], "revive");
    let note = item["resume"]["message"].as_str().unwrap();
    assert!(
        note.contains("do not run them again") && note.contains("Bash: touch done.txt"),
        "{note}"
    );
    assert!(
        note.contains("Not finished") && note.contains("Bash: git push"),
        "{note}"
    );
    assert_eq!(
        item["run"]["session_key"],
        key.as_str(),
        "the same session is resumed"
    );

    // The resumed run is a new attempt with a new fence.
    report(&h, &l, item["id"].as_str().unwrap(), "done", "pid 43").await;
    hook(
        &h,
        &l.token,
        "",
        event(&key, "SessionStart", json!({"source": "resume"})),
    )
    .await;
    let d = h.detail(&task).await;
    let fences: Vec<i64> = d["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["fence"].as_i64().unwrap())
        .collect();
    assert_eq!(fences, vec![1, 2], "{d}");
}

#[tokio::test]
async fn a_run_cut_off_between_calls_is_resumed_at_once_and_a_clean_end_needs_nothing() {
    let h = Harness::start().await;
    let alice = h.pair_device("alice", &["view", "steer"]).await;
    let l = laptop(&h, &["/home/alice/src"]).await;
    let (task, key) = started(&h, &l, &alice).await;
    hook(
        &h,
        &l.token,
        "",
        bash(&key, "PreToolUse", "t1", "touch done.txt"),
    )
    .await;
    hook(
        &h,
        &l.token,
        "",
        bash(&key, "PostToolUse", "t1", "touch done.txt"),
    )
    .await;
    let (_, v) = h
        .post(
            &l.token,
            &format!("/v1/runner/tasks/{task}/exited"),
            json!({"detail": "not running on this machine"}),
        )
        .await;
    assert_eq!(v["action"], "resume", "{v}");
    let w = work(&h, &l).await;
    assert_eq!(w["work"][0]["kind"], "resume");
    assert!(
        w["work"][0]["resume"]["message"]
            .as_str()
            .unwrap()
            .contains("Bash: touch done.txt")
    );
    assert!(h.audit_codes(&task).await.contains(&"resume".to_owned()));
    report(&h, &l, w["work"][0]["id"].as_str().unwrap(), "done", "").await;

    // The resumed run ends cleanly: it started (its SessionStart took a new attempt), and Stop
    // and SessionEnd released its attempt.
    hook(
        &h,
        &l.token,
        "",
        event(&key, "SessionStart", json!({"source": "resume"})),
    )
    .await;
    hook(
        &h,
        &l.token,
        "",
        event(&key, "Stop", json!({"last_assistant_message": "done"})),
    )
    .await;
    hook(
        &h,
        &l.token,
        "",
        event(&key, "SessionEnd", json!({"reason": "other"})),
    )
    .await;
    let (_, v) = h
        .post(
            &l.token,
            &format!("/v1/runner/tasks/{task}/exited"),
            json!({"code": 0}),
        )
        .await;
    assert_eq!(v["action"], "nothing", "{v}");
    assert_eq!(work(&h, &l).await["work"], json!([]));
}

/// A runtime killed after its runner started it and before its first hook (or one that fails
/// at once) left nothing under the record: it is started again the same way — a `start` while it
/// never reached the control plane, a `resume` once it had — three times in a row at most, then a
/// person decides.
#[tokio::test]
async fn a_run_that_ends_before_reaching_the_control_plane_is_started_again_then_asks_a_person() {
    let h = Harness::start().await;
    let alice = h.pair_device("alice", &["view", "steer"]).await;
    let l = laptop(&h, &["/home/alice/src"]).await;
    let (task, key) = started(&h, &l, &alice).await;
    assert_eq!(
        work(&h, &l).await["running"],
        json!([task]),
        "started, not yet heard from: running (a runner that lost it reports it gone)"
    );
    let exited = || async {
        let (s, v) = h
            .post(
                &l.token,
                &format!("/v1/runner/tasks/{task}/exited"),
                json!({"signal": 9}),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{v}");
        v
    };
    // Killed before its SessionStart: the same start again, with the same session key.
    let v = exited().await;
    assert_eq!(v["action"], "restart", "{v}");
    let w = work(&h, &l).await;
    assert_eq!(w["work"].as_array().unwrap().len(), 1, "{w}");
    assert_eq!(w["work"][0]["kind"], "start", "{w}");
    assert_eq!(w["work"][0]["run"]["prompt"], "make the tests pass");
    assert_eq!(w["work"][0]["run"]["session_key"], key.as_str());
    // Reported again before the new start was taken: nothing more is queued.
    assert_eq!(exited().await["action"], "nothing");
    report(
        &h,
        &l,
        w["work"][0]["id"].as_str().unwrap(),
        "done",
        "pid 43",
    )
    .await;

    // This time it reaches the control plane, and is killed between calls: revived.
    hook(
        &h,
        &l.token,
        "",
        event(&key, "SessionStart", json!({"source": "startup"})),
    )
    .await;
    assert_eq!(exited().await["action"], "resume");
    // The resumed runtime dies before its first hook, three times: resumed twice more, then a
    // person is asked (the task needs one, nothing is queued).
    for round in 1..=3 {
        let w = work(&h, &l).await;
        assert_eq!(w["work"].as_array().unwrap().len(), 1, "round {round}: {w}");
        assert_eq!(w["work"][0]["kind"], "resume", "round {round}: {w}");
        report(&h, &l, w["work"][0]["id"].as_str().unwrap(), "done", "").await;
        let v = exited().await;
        let expected = if round < 3 { "restart" } else { "needs_human" };
        assert_eq!(v["action"], expected, "round {round}: {v}");
    }
    assert_eq!(work(&h, &l).await["work"], json!([]));
    let (_, d) = h.get(&h.alice, &format!("/v1/tasks/{task}")).await;
    assert_eq!(d["task"]["state"], "needs_human", "{d}");
    assert!(
        d["task"]["outcome_summary"]
            .as_str()
            .is_some_and(|s| s.contains("before its session reached Waymark 3 times")),
        "{d}"
    );
    assert!(h.audit_codes(&task).await.contains(&"restart".to_owned()));
}

/// The run records the runtime's version its runner reported when it started; a revive on
/// another version (the runner restarted after an upgrade registers the new one) fails
/// admission with both versions named, and a person's "resume anyway" resumes it.
#[tokio::test]
async fn a_revive_on_another_runtime_version_asks_a_person_first() {
    let h = Harness::start().await;
    let alice = h.pair_device("alice", &["view", "steer"]).await;
    let l = laptop(&h, &["/home/alice/src"]).await;
    let (task, key) = started(&h, &l, &alice).await;
    hook(
        &h,
        &l.token,
        "",
        event(&key, "SessionStart", json!({"source": "startup"})),
    )
    .await;
    // The laptop's Claude Code is upgraded and its runner restarts: it registers the new one.
    let (s, v) = h
        .send(
            reqwest::Method::PUT,
            &l.token,
            "/v1/runner/machine",
            Some(json!({
                "runtimes": [{"runtime": "claude-code", "version": "2.1.330"}],
                "directories": ["/home/alice/src"],
                "runner_version": "0.1.0",
            })),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (_, v) = h
        .post(
            &l.token,
            &format!("/v1/runner/tasks/{task}/exited"),
            json!({"detail": "not running on this machine"}),
        )
        .await;
    assert_eq!(v["action"], "needs_human", "{v}");
    assert!(
        v["detail"]
            .as_str()
            .unwrap()
            .contains("claude-code was 2.1.328 when the run started and is 2.1.330 on laptop now"),
        "{v}"
    );
    assert_eq!(work(&h, &l).await["work"], json!([]), "nothing resumes yet");
    let (_, d) = h.get(&h.alice, &format!("/v1/tasks/{task}")).await;
    let card = d["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["kind"] == "recovery" && x["status"] == "pending")
        .unwrap_or_else(|| panic!("an admission card: {d}"))
        .clone();
    assert!(
        card["question"].as_str().unwrap().contains("2.1.330"),
        "{card}"
    );
    let rev = h.revision(&task).await;
    let cmd = alice.command(
        &task,
        Some(rev),
        Operation::ChooseOption,
        json!({"decision_id": card["id"], "option": "resume_anyway"}),
    );
    let (_, v) = h.submit(&alice.sign(&cmd)).await;
    assert_eq!(v["status"], "applied", "{v}");
    let w = work(&h, &l).await;
    assert_eq!(w["work"][0]["kind"], "resume", "{w}");
    assert_eq!(w["work"][0]["run"]["runtime_version"], "2.1.328");
}

#[tokio::test]
async fn a_follow_up_and_an_answer_to_a_deferred_approval_resume_the_runtime_on_its_machine() {
    let h = Harness::start().await;
    let alice = h.pair_device("alice", &["view", "steer", "approve"]).await;
    let l = laptop(&h, &["/home/alice/src"]).await;
    let (task, key) = started(&h, &l, &alice).await;
    hook(
        &h,
        &l.token,
        "",
        event(&key, "SessionStart", json!({"source": "startup"})),
    )
    .await;
    hook(
        &h,
        &l.token,
        "",
        event(
            &key,
            "Stop",
            json!({"last_assistant_message": "first pass done"}),
        ),
    )
    .await;
    hook(
        &h,
        &l.token,
        "",
        event(&key, "SessionEnd", json!({"reason": "other"})),
    )
    .await;
    h.post(
        &l.token,
        &format!("/v1/runner/tasks/{task}/exited"),
        json!({"code": 0}),
    )
    .await;

    let (s, v) = h
        .post(
            &h.alice,
            &format!("/v1/tasks/{task}/followups"),
            json!({"schedule": {"after": "PT5S"}, "message": "check CI again"}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(work(&h, &l).await["work"], json!([]), "not before its time");
    h.advance(Duration::from_secs(6)).await;
    let w = work(&h, &l).await;
    let item = &w["work"][0];
    assert_eq!(item["kind"], "resume", "{w}");
    assert_eq!(item["resume"]["reason"], "follow_up");
    assert_eq!(item["resume"]["message"], "check CI again");
    report(&h, &l, item["id"].as_str().unwrap(), "done", "").await;

    // The resumed run defers a gated call and exits; the answer from the phone resumes it.
    let out = hook(
        &h,
        &l.token,
        "?gate=Bash&defer=true&timeout=60",
        bash(&key, "PreToolUse", "t9", "git push"),
    )
    .await;
    assert_eq!(
        out["hookSpecificOutput"]["permissionDecision"], "defer",
        "{out}"
    );
    hook(
        &h,
        &l.token,
        "",
        event(&key, "SessionEnd", json!({"reason": "other"})),
    )
    .await;
    h.post(
        &l.token,
        &format!("/v1/runner/tasks/{task}/exited"),
        json!({"code": 0}),
    )
    .await;
    assert_eq!(work(&h, &l).await["work"], json!([]));
    let d = h.detail(&task).await;
    let dec = d["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["status"] == "pending")
        .unwrap()
        .clone();
    assert_eq!(dec["durability"], "durable");
    let rev = h.revision(&task).await;
    let cmd = alice.command(
        &task,
        Some(rev),
        Operation::Approve,
        json!({"decision_id": dec["id"], "intent_digest": dec["intent_digest"]}),
    );
    let (_, v) = h.submit(&alice.sign(&cmd)).await;
    assert_eq!(v["status"], "applied", "{v}");
    let w = work(&h, &l).await;
    assert_eq!(w["work"][0]["kind"], "resume", "{w}");
    assert_eq!(w["work"][0]["resume"]["reason"], "answered");
    assert!(
        w["work"][0]["resume"].get("message").is_none(),
        "the runtime's own continue: {w}"
    );

    // Cancel: the runner is told to stop the run; the pending resume is void.
    let cmd = alice.command(
        &task,
        Some(h.revision(&task).await),
        Operation::Cancel,
        json!({}),
    );
    let (_, v) = h.submit(&alice.sign(&cmd)).await;
    assert_eq!(v["status"], "applied", "{v}");
    let w = work(&h, &l).await;
    let kinds: Vec<&str> = w["work"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["stop"], "{w}");
}

#[tokio::test]
async fn a_paused_run_stops_at_its_next_call_and_resuming_the_task_resumes_its_session() {
    let h = Harness::start().await;
    let alice = h.pair_device("alice", &["view", "steer"]).await;
    let l = laptop(&h, &["/home/alice/src"]).await;
    let (task, key) = started(&h, &l, &alice).await;
    hook(&h, &l.token, "", bash(&key, "PreToolUse", "t1", "ls")).await;
    hook(&h, &l.token, "", bash(&key, "PostToolUse", "t1", "ls")).await;
    let steer = |op| {
        let cmd = alice.sign(&alice.command(&task, Some(1), op, json!({})));
        let h = &h;
        async move {
            let (s, v) = h.submit(&cmd).await;
            assert_eq!(s, StatusCode::OK, "{v}");
            assert_eq!(v["status"], "applied", "{v}");
            v
        }
    };

    // Paused and resumed while the runtime still runs: nothing to resume on the machine.
    steer(Operation::Pause).await;
    let v = steer(Operation::Resume).await;
    assert_eq!(v["detail"], "resumed", "{v}");
    assert_eq!(work(&h, &l).await["work"], json!([]));

    // Paused: the next call stops Claude Code before it runs, and nothing is declared.
    steer(Operation::Pause).await;
    let answer = hook(
        &h,
        &l.token,
        "",
        bash(&key, "PreToolUse", "t2", "rm -rf build"),
    )
    .await;
    assert_eq!(answer["continue"], false, "{answer}");
    assert_eq!(
        answer["hookSpecificOutput"]["permissionDecision"], "deny",
        "{answer}"
    );
    assert!(
        answer["stopReason"].as_str().unwrap().contains("paused"),
        "{answer}"
    );
    let d = h.detail(&task).await;
    assert_eq!(d["effects"].as_array().unwrap().len(), 1, "{d}");
    // Claude Code lets go of the run; the task stays paused, and its process's end needs
    // nothing.
    hook(
        &h,
        &l.token,
        "",
        event(&key, "SessionEnd", json!({"reason": "other"})),
    )
    .await;
    assert_eq!(h.detail(&task).await["task"]["state"], "paused");
    let (_, v) = h
        .post(
            &l.token,
            &format!("/v1/runner/tasks/{task}/exited"),
            json!({"code": 0}),
        )
        .await;
    assert_eq!(v["action"], "nothing", "{v}");
    assert_eq!(work(&h, &l).await["work"], json!([]));
    assert_eq!(h.detail(&task).await["task"]["state"], "paused");

    // Resumed from the phone: the runner resumes the session, told why.
    let v = steer(Operation::Resume).await;
    assert!(
        v["detail"].as_str().unwrap().contains("runner resumes"),
        "{v}"
    );
    let w = work(&h, &l).await;
    assert_eq!(w["work"][0]["kind"], "resume", "{w}");
    assert_eq!(w["work"][0]["resume"]["reason"], "resumed", "{w}");
    assert!(
        w["work"][0]["resume"]["message"]
            .as_str()
            .unwrap()
            .contains("did not run"),
        "{w}"
    );
    assert_eq!(h.detail(&task).await["task"]["state"], "queued");
}

#[tokio::test]
async fn a_runtime_that_dies_while_its_task_is_paused_waits_for_the_resume() {
    let h = Harness::start().await;
    let alice = h.pair_device("alice", &["view", "steer"]).await;
    let l = laptop(&h, &["/home/alice/src"]).await;
    let (task, key) = started(&h, &l, &alice).await;
    hook(&h, &l.token, "", bash(&key, "PreToolUse", "t1", "ls")).await;
    hook(&h, &l.token, "", bash(&key, "PostToolUse", "t1", "ls")).await;
    let (s, v) = h
        .submit(&alice.sign(&alice.command(&task, Some(1), Operation::Pause, json!({}))))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    // kill -9 while paused: the attempt is revoked, nothing is revived behind the pause.
    let (_, v) = h
        .post(
            &l.token,
            &format!("/v1/runner/tasks/{task}/exited"),
            json!({"signal": 9}),
        )
        .await;
    assert_eq!(v["action"], "nothing", "{v}");
    assert!(v["detail"].as_str().unwrap().contains("paused"), "{v}");
    let d = h.detail(&task).await;
    assert_eq!(d["task"]["state"], "paused");
    assert_eq!(d["attempts"][0]["state"], "revoked");
    assert_eq!(work(&h, &l).await["work"], json!([]));
    let (_, v) = h
        .submit(&alice.sign(&alice.command(&task, Some(1), Operation::Resume, json!({}))))
        .await;
    assert_eq!(v["status"], "applied", "{v}");
    assert_eq!(work(&h, &l).await["work"][0]["resume"]["reason"], "resumed");
}

/// Plan first: the signed `args.plan` reaches the runner with the run, for a runtime that has a
/// plan mode.
#[tokio::test]
async fn a_run_started_plan_first_says_so_to_its_runner() {
    let h = Harness::start().await;
    let alice = h.pair_device("alice", &["view", "steer", "approve"]).await;
    let l = laptop(&h, &["/home/alice/src"]).await;
    let task = waymark_proto::ids::task();
    let mut args = run_args("/home/alice/src/app");
    args["plan"] = json!(true);
    let (_, v) = h.submit(&start_run(&alice, &task, args)).await;
    assert_eq!(v["status"], "applied", "{v}");
    let w = work(&h, &l).await;
    assert_eq!(w["work"][0]["run"]["plan"], true, "{w}");
}

fn tree(commit: &str, changed: &[(&str, &str)]) -> Value {
    let changed: serde_json::Map<String, Value> = changed
        .iter()
        .map(|(p, h)| ((*p).to_owned(), json!(h)))
        .collect();
    let digest = format!("{commit}:{}", Value::Object(changed.clone()));
    json!({"commit": commit, "digest": digest, "changed": changed})
}

/// A runner's command hooks record the working tree after each call (a checkpoint when it
/// changed); a revive compares the tree the runner sees then with it. Untouched: resumed at
/// once. Changed by someone meanwhile: a person decides, told which files changed, and a call
/// in doubt carries what the tree shows.
#[tokio::test]
async fn a_revive_checks_the_working_tree_against_the_last_call_recorded() {
    let h = Harness::start().await;
    let alice = h.pair_device("alice", &["view", "steer"]).await;
    let l = laptop(&h, &["/home/alice/src"]).await;
    let (task, key) = started(&h, &l, &alice).await;
    let clean = tree("c0ffee", &[]);
    let edited = tree("c0ffee", &[("src/cart.rs", "aa11")]);
    let mut start = event(&key, "SessionStart", json!({"source": "startup"}));
    start["waymark_tree"] = clean.clone();
    hook(&h, &l.token, "", start).await;
    hook(&h, &l.token, "", bash(&key, "PreToolUse", "t1", "fix cart")).await;
    let mut post = bash(&key, "PostToolUse", "t1", "fix cart");
    post["waymark_tree"] = edited.clone();
    hook(&h, &l.token, "", post).await;
    // A read changes nothing: no checkpoint for it.
    hook(
        &h,
        &l.token,
        "",
        bash(&key, "PreToolUse", "t2", "cat cart.rs"),
    )
    .await;
    let mut post = bash(&key, "PostToolUse", "t2", "cat cart.rs");
    post["waymark_tree"] = edited.clone();
    hook(&h, &l.token, "", post).await;
    let (_, cps) = h.get(&h.alice, &format!("/v1/tasks/{task}")).await;
    let trees: Vec<&Value> = cps["checkpoints"]
        .as_array()
        .unwrap_or_else(|| panic!("{cps}"))
        .iter()
        .filter_map(|c| c["body"]["materials"]["tree"].as_object().map(|_| c))
        .collect();
    assert_eq!(
        trees.len(),
        2,
        "the start and the edit, not the read: {cps}"
    );
    assert_eq!(trees[1]["body"]["materials"]["tree"], edited);

    // Cut off; the tree is as the last call left it: resumed at once.
    let (_, v) = h
        .post(
            &l.token,
            &format!("/v1/runner/tasks/{task}/exited"),
            json!({"signal": 9, "tree": edited}),
        )
        .await;
    assert_eq!(v["action"], "resume", "{v}");
    let w = work(&h, &l).await;
    report(&h, &l, w["work"][0]["id"].as_str().unwrap(), "done", "").await;
    let mut start = event(&key, "SessionStart", json!({"source": "resume"}));
    start["waymark_tree"] = edited.clone();
    hook(&h, &l.token, "", start).await;

    // Cut off again; meanwhile someone checked out another commit and edited a file.
    let foreign = tree("beef00", &[("src/cart.rs", "bb22"), ("README.md", "cc33")]);
    let (_, v) = h
        .post(
            &l.token,
            &format!("/v1/runner/tasks/{task}/exited"),
            json!({"detail": "not running on this machine", "tree": foreign}),
        )
        .await;
    assert_eq!(v["action"], "needs_human", "{v}");
    let said = v["detail"].as_str().unwrap();
    assert!(
        said.contains(
            "the working tree is not as the last checkpoint left it: HEAD moved from c0ffee to beef00; `README.md`, `src/cart.rs` have changed"
        ),
        "{said}"
    );
    assert_eq!(work(&h, &l).await["work"], json!([]), "nothing resumes yet");
    let (_, d) = h.get(&h.alice, &format!("/v1/tasks/{task}")).await;
    let card = d["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["kind"] == "recovery" && x["status"] == "pending")
        .unwrap_or_else(|| panic!("an admission card: {d}"))
        .clone();
    assert!(
        card["question"].as_str().unwrap().contains("`src/cart.rs`"),
        "{card}"
    );
    let rev = h.revision(&task).await;
    let cmd = alice.command(
        &task,
        Some(rev),
        Operation::ChooseOption,
        json!({"decision_id": card["id"], "option": "resume_anyway"}),
    );
    let (_, v) = h.submit(&alice.sign(&cmd)).await;
    assert_eq!(v["status"], "applied", "{v}");
    let w = work(&h, &l).await;
    assert_eq!(w["work"][0]["kind"], "resume", "{w}");
    report(&h, &l, w["work"][0]["id"].as_str().unwrap(), "done", "").await;
    let mut start = event(&key, "SessionStart", json!({"source": "resume"}));
    start["waymark_tree"] = foreign.clone();
    hook(&h, &l.token, "", start).await;

    // Cut off in a call: its card says what the tree shows.
    hook(
        &h,
        &l.token,
        "",
        bash(&key, "PreToolUse", "t3", "rm -rf build"),
    )
    .await;
    let (_, v) = h
        .post(
            &l.token,
            &format!("/v1/runner/tasks/{task}/exited"),
            json!({"signal": 9, "tree": foreign}),
        )
        .await;
    assert_eq!(v["action"], "needs_human", "{v}");
    let (_, d) = h.get(&h.alice, &format!("/v1/tasks/{task}")).await;
    let card = d["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["kind"] == "recovery" && x["status"] == "pending")
        .unwrap_or_else(|| panic!("a card for the call: {d}"))
        .clone();
    assert!(
        card.to_string()
            .contains("the working tree is as the last checkpoint left it"),
        "{card}"
    );
}
