//! Claude Code's `http` hooks against the real server: hook inputs kept in
//! `tests/fixtures/claude-code/` become a session's task, effects, checkpoints and approvals,
//! and the hook answers in Claude Code's decision JSON. `real-2.1.328/*.jsonl` are whole runs
//! recorded from the real Claude Code 2.1.328 (`claude -p` against a fake model, every hook
//! posted to a recorder; `SessionStart` through a command hook); the single-event files are in
//! the shapes those runs showed (events the runs did not reach, such as compaction, follow
//! Claude Code's hook documentation).

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use waymark_proto::Operation;

use crate::support::{Harness, TestDevice, assert_problem};

fn fixture(name: &str) -> Value {
    let path = format!(
        "{}/tests/fixtures/claude-code/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

const HOOK: &str = "/v1/adapters/claude-code/hook";

async fn hook(h: &Harness, query: &str, body: Value) -> Value {
    let (s, v) = h.post(&h.alice, &format!("{HOOK}{query}"), body).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    v
}

/// The session's task, found the way the adapter finds it: by the runtime's key.
async fn session_task(h: &Harness, session: &str) -> String {
    let (s, v) = h
        .post(
            &h.alice,
            "/v1/tasks",
            json!({"title": "x", "runtime": "claude-code", "external_key": session}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "the hook created it already: {v}");
    v["id"].as_str().unwrap().to_owned()
}

async fn pending_decision(h: &Harness, task: &str) -> Value {
    for _ in 0..200 {
        let d = h.detail(task).await;
        if let Some(p) = d["decisions"]
            .as_array()
            .and_then(|a| a.iter().find(|x| x["status"] == "pending"))
        {
            return p.clone();
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("no pending decision on {task}")
}

async fn decision(h: &Harness, task: &str, id: &str) -> Value {
    h.get(&h.alice, &format!("/v1/tasks/{task}/decisions/{id}"))
        .await
        .1
}

/// A hook call posted as Claude Code posts it (with its entrypoint header when given) and held
/// by the server until its decision closes or is deferred; its answer when it returns.
fn hold_call(
    h: &Harness,
    query: &str,
    entrypoint: Option<&str>,
    body: Value,
) -> tokio::task::JoinHandle<Value> {
    let (url, token) = (h.url(&format!("{HOOK}{query}")), h.alice.clone());
    let entrypoint = entrypoint.map(str::to_owned);
    tokio::spawn(async move {
        let mut req = reqwest::Client::new().post(url).bearer_auth(token);
        if let Some(e) = entrypoint {
            req = req.header("X-Claude-Code-Entrypoint", e);
        }
        req.json(&body)
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap()
    })
}

/// The fixture's `PermissionRequest`, held by the server (a 60 s hook timeout).
fn held_permission_request(h: &Harness) -> tokio::task::JoinHandle<Value> {
    hold_call(h, "?timeout=60", None, fixture("permission_request"))
}

async fn answer(h: &Harness, d: &TestDevice, task: &str, dec: &Value, op: Operation, args: Value) {
    let mut a = json!({"decision_id": dec["id"], "intent_digest": dec["intent_digest"]});
    for (k, v) in args.as_object().unwrap() {
        a[k] = v.clone();
    }
    let (s, r) = h
        .submit(&d.sign(&d.command(task, Some(dec["plan_revision"].as_i64().unwrap()), op, a)))
        .await;
    assert_eq!(s, StatusCode::OK, "{r}");
    assert_eq!(r["status"], "applied", "{r}");
}

#[tokio::test]
async fn a_session_becomes_a_task_with_effects_checkpoints_and_messages() {
    let h = Harness::start().await;
    assert_eq!(hook(&h, "", fixture("session_start")).await, json!({}));
    let task = session_task(&h, "abc123").await;
    let d = h.detail(&task).await;
    assert_eq!(d["task"]["runtime"], "claude-code");
    // Real hook inputs carry no title: the task is named after the directory.
    assert_eq!(d["task"]["title"], "Claude Code in /home/u/repo");
    assert_eq!(d["attempts"][0]["state"], "active");

    // Not gated: the call is recorded and allowed to go on without a decision.
    assert_eq!(
        hook(&h, "?gate=Write", fixture("pre_tool_use")).await,
        json!({})
    );
    let d = h.detail(&task).await;
    let e = &d["effects"][0];
    assert_eq!(e["idempotency_key"], "abc123:toolu_01ABC");
    assert_eq!(e["intent"]["input"]["command"], "npm test");
    assert_eq!(e["status"], "intended");
    // The same hook again (Claude Code retried it): still one effect.
    hook(&h, "", fixture("pre_tool_use")).await;
    hook(&h, "", fixture("post_tool_use")).await;
    let d = h.detail(&task).await;
    assert_eq!(d["effects"].as_array().unwrap().len(), 1);
    assert_eq!(d["effects"][0]["status"], "confirmed");
    assert_eq!(
        d["effects"][0]["receipt"]["tool_response"]["stdout"],
        "12 passing"
    );

    hook(&h, "", fixture("pre_compact")).await;
    hook(&h, "", fixture("post_compact")).await;
    let d = h.detail(&task).await;
    let cps = d["checkpoints"].as_array().unwrap();
    assert_eq!(cps.len(), 2, "{d}");
    assert_eq!(cps[1]["sequence"], 2);
    assert_eq!(cps[1]["prev_digest"], cps[0]["digest"], "one hash chain");
    assert!(
        cps[1]["body"]["summary"]
            .as_str()
            .unwrap()
            .contains("discount rounding")
    );

    hook(&h, "", fixture("stop")).await;
    let d = h.detail(&task).await;
    assert_eq!(d["attempts"][0]["state"], "finished");
    assert_eq!(
        d["task"]["state"], "queued",
        "handed back until the next prompt"
    );
    let texts: Vec<&str> = d["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["text"].as_str())
        .collect();
    assert!(texts.contains(&"Done."), "{texts:?}");

    // The next prompt starts a new attempt on the same task.
    hook(&h, "", json!({"session_id": "abc123", "hook_event_name": "UserPromptSubmit", "prompt": "now deploy"})).await;
    let d = h.detail(&task).await;
    assert_eq!(d["attempts"].as_array().unwrap().len(), 2);
    assert_eq!(d["task"]["state"], "running");
}

#[tokio::test]
async fn a_permission_prompt_is_held_until_the_phone_denies_it() {
    let h = Harness::start().await;
    let dev = h.pair_device("alice", &["view", "steer", "approve"]).await;
    hook(&h, "", fixture("session_start")).await;
    let held = held_permission_request(&h);
    let task = session_task(&h, "abc123").await;
    let dec = pending_decision(&h, &task).await;
    assert_eq!(dec["durability"], "fail_open_hook");
    assert_eq!(dec["intent"]["input"]["command"], "rm -rf node_modules");
    let ids: Vec<&str> = dec["options"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|o| o["id"].as_str())
        .collect();
    assert_eq!(ids, ["approve", "approve_always", "deny"]);
    assert!(!held.is_finished(), "the hook waits for the person");

    answer(
        &h,
        &dev,
        &task,
        &dec,
        Operation::Deny,
        json!({"text": "not on my machine"}),
    )
    .await;
    let out = tokio::time::timeout(Duration::from_secs(10), held)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        out,
        json!({"hookSpecificOutput": {"hookEventName": "PermissionRequest", "decision": {
            "behavior": "deny", "message": "user:alice via Waymark: not on my machine", "interrupt": false}}})
    );
    let id = dec["id"].as_str().unwrap();
    assert_eq!(
        decision(&h, &task, id).await["delivery"]["state"],
        "pending"
    );
    // Claude Code's next hook shows it went on without the tool.
    hook(&h, "", fixture("stop")).await;
    let after = decision(&h, &task, id).await;
    assert_eq!(after["delivery"]["state"], "acknowledged", "{after}");
}

#[tokio::test]
async fn an_allow_always_answer_counts_once_the_tool_ran() {
    let h = Harness::start().await;
    let dev = h.pair_device("alice", &["view", "steer", "approve"]).await;
    hook(&h, "", fixture("session_start")).await;
    let held = held_permission_request(&h);
    let task = session_task(&h, "abc123").await;
    let dec = pending_decision(&h, &task).await;
    answer(
        &h,
        &dev,
        &task,
        &dec,
        Operation::Approve,
        json!({"option": "approve_always"}),
    )
    .await;
    let out = tokio::time::timeout(Duration::from_secs(10), held)
        .await
        .unwrap()
        .unwrap();
    let decision_out = &out["hookSpecificOutput"]["decision"];
    assert_eq!(decision_out["behavior"], "allow", "{out}");
    assert_eq!(
        decision_out["updatedPermissions"],
        fixture("permission_request")["permission_suggestions"],
        "the suggested rule goes back as the permission update"
    );
    let id = dec["id"].as_str().unwrap();
    let d = decision(&h, &task, id).await;
    assert_eq!(d["outcome"]["option"], "approve_always");
    assert_eq!(
        d["delivery"]["state"], "pending",
        "approved here, not yet acted on"
    );
    // A different call's PostToolUse is not the acknowledgement.
    hook(&h, "", fixture("post_tool_use")).await;
    assert_eq!(
        decision(&h, &task, id).await["delivery"]["state"],
        "pending"
    );
    hook(&h, "", fixture("post_permitted_tool")).await;
    let d = decision(&h, &task, id).await;
    assert_eq!(d["delivery"]["state"], "acknowledged", "{d}");
}

/// Edit before approve: the person changes the command, signs the edited intent's digest
/// beside the one they were shown, and Claude Code gets the edit as `updatedInput`; the decision
/// keeps the intent asked, the effect records what runs, and a wrong edit is refused first.
#[tokio::test]
async fn an_edited_command_is_approved_and_claude_code_runs_the_edit() {
    let h = Harness::start().await;
    let dev = h.pair_device("alice", &["view", "steer", "approve"]).await;
    hook(&h, "", fixture("session_start")).await;
    // The call as Claude Code announces it before asking (same input, with its tool_use_id).
    let mut pre = fixture("permission_request");
    pre["hook_event_name"] = json!("PreToolUse");
    pre["tool_use_id"] = json!("toolu_01RM");
    hook(&h, "", pre).await;
    let held = held_permission_request(&h);
    let task = session_task(&h, "abc123").await;
    let dec = pending_decision(&h, &task).await;
    assert_eq!(
        dec["editable"], "/input",
        "Claude Code takes an edited input"
    );
    let effect_id = dec["effect_id"]
        .as_str()
        .expect("the call's effect")
        .to_owned();
    let rev = dec["plan_revision"].as_i64().unwrap();
    // The intent asked (the call and its directory), with the person's command in place.
    assert_eq!(dec["intent"]["cwd"], fixture("permission_request")["cwd"]);
    let mut edited = dec["intent"].clone();
    edited["input"] = json!({"command": "rm -ri node_modules"});
    let digest = waymark_proto::digest::json_digest(&edited).unwrap();
    let submit = |op: Operation, args: Value| {
        let mut a = json!({"decision_id": dec["id"], "intent_digest": dec["intent_digest"]});
        for (k, v) in args.as_object().unwrap() {
            a[k] = v.clone();
        }
        let env = dev.sign(&dev.command(&task, Some(rev), op, a));
        let h = &h;
        async move { h.submit(&env).await }
    };
    // Refused, and nothing closes: another tool, a digest not the edit's, an edited denial.
    let other_tool = json!({"tool": "Write", "input": {"command": "rm -ri node_modules"}});
    for (op, args, reason) in [
        (
            Operation::Approve,
            json!({"edited_intent": other_tool, "edited_intent_digest": waymark_proto::digest::json_digest(&other_tool).unwrap()}),
            "invalid_command",
        ),
        (
            Operation::Approve,
            json!({"edited_intent": edited, "edited_intent_digest": dec["intent_digest"]}),
            "digest_mismatch",
        ),
        (
            Operation::Approve,
            json!({"edited_intent": {"tool": "Bash", "input": "rm -ri node_modules"}, "edited_intent_digest": digest}),
            "invalid_command",
        ),
        (
            Operation::Deny,
            json!({"edited_intent": edited, "edited_intent_digest": digest}),
            "invalid_command",
        ),
    ] {
        let (s, r) = submit(op, args).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{r}");
        assert_eq!(
            (r["status"].as_str(), r["reason"].as_str()),
            (Some("rejected"), Some(reason)),
            "{r}"
        );
    }
    assert!(!held.is_finished(), "a refused edit answers nothing");

    let (_, r) = submit(
        Operation::Approve,
        json!({"edited_intent": edited, "edited_intent_digest": digest}),
    )
    .await;
    assert_eq!(r["status"], "applied", "{r}");
    let out = tokio::time::timeout(Duration::from_secs(10), held)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        out["hookSpecificOutput"]["decision"],
        json!({"behavior": "allow", "updatedInput": {"command": "rm -ri node_modules"}}),
        "{out}"
    );
    let d = decision(&h, &task, dec["id"].as_str().unwrap()).await;
    assert_eq!(
        d["intent"], dec["intent"],
        "the decision keeps what was asked"
    );
    assert_eq!(d["outcome"]["edited_intent"], edited);
    assert_eq!(d["outcome"]["edited_intent_digest"], digest.as_str());
    let effect = h.detail(&task).await["effects"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == effect_id.as_str())
        .cloned()
        .unwrap();
    assert_eq!(effect["intent"], edited, "the effect records what will run");
    assert_eq!(effect["intent_digest"], digest.as_str());
    // Claude Code ran the edit: its PostToolUse carries the edited input and settles it.
    let mut post = fixture("post_permitted_tool");
    post["tool_input"] = json!({"command": "rm -ri node_modules"});
    hook(&h, "", post).await;
    let d = decision(&h, &task, dec["id"].as_str().unwrap()).await;
    assert_eq!(d["delivery"]["state"], "acknowledged", "{d}");
    let effect = h.detail(&task).await["effects"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == effect_id.as_str())
        .cloned()
        .unwrap();
    assert_eq!(effect["status"], "confirmed", "{effect}");
}

#[tokio::test]
async fn a_hook_timeout_expires_the_approval_and_renders_no_decision() {
    let h = Harness::start().await;
    // timeout=4: the server answers ~3 s before the hook's own timeout, here after 1 s.
    let started = std::time::Instant::now();
    let out = hook(&h, "?timeout=4", fixture("permission_request")).await;
    assert_eq!(
        out,
        json!({}),
        "no decision: Claude Code asks in its own prompt"
    );
    assert!(started.elapsed() < Duration::from_secs(4));
    let task = session_task(&h, "abc123").await;
    let d = h.detail(&task).await;
    let dec = &d["decisions"][0];
    assert_eq!(dec["status"], "expired", "{dec}");
    assert_eq!(dec["outcome"]["option"], Value::Null, "never approved");
    assert_eq!(dec["outcome"]["by"], "runtime");
}

/// Two paths can close an approval a hook holds when its time runs out: the hook's own wait,
/// and the server's expiry sweep. They must agree on what Claude Code does — nothing decided
/// here, it asks in its own prompt — never our stated default `deny` passed on as an answer.
/// The clock is driven past the expiry while the hook still waits, so the sweep closes it.
#[tokio::test]
async fn the_expiry_sweep_closes_a_held_hook_approval_as_the_runtime_would() {
    let h = Harness::start().await;
    hook(&h, "", fixture("session_start")).await;
    let held = tokio::spawn({
        let (url, token) = (h.url(&format!("{HOOK}?timeout=600")), h.alice.clone());
        async move {
            reqwest::Client::new()
                .post(url)
                .bearer_auth(token)
                .json(&fixture("permission_request"))
                .send()
                .await
                .expect("the hook's answer")
                .json::<Value>()
                .await
                .expect("JSON")
        }
    });
    let task = session_task(&h, "abc123").await;
    let dec = pending_decision(&h, &task).await;
    assert_eq!(dec["durability"], "fail_open_hook", "{dec}");
    assert_eq!(dec["default_option"], "deny", "{dec}");
    // Shown with the runtime's deadline: the hook's, and Claude Code asks then.
    assert_eq!(dec["runtime_deadline"]["runtime"], "Claude Code", "{dec}");
    assert_eq!(dec["runtime_deadline"]["then"], "asks_itself", "{dec}");
    assert_eq!(dec["runtime_deadline"]["at"], dec["expires_at"], "{dec}");
    h.advance(Duration::from_secs(601)).await;

    let out = tokio::time::timeout(Duration::from_secs(30), held)
        .await
        .expect("the held hook answered once the sweep closed its approval")
        .unwrap();
    assert_eq!(
        out,
        json!({}),
        "no decision: Claude Code asks in its own prompt"
    );
    let closed = decision(&h, &task, dec["id"].as_str().unwrap()).await;
    assert_eq!(closed["status"], "expired", "{closed}");
    assert_eq!(
        closed["outcome"]["option"],
        Value::Null,
        "not our default: {closed}"
    );
    assert_eq!(closed["outcome"]["by"], "runtime", "{closed}");
}

#[tokio::test]
async fn a_hook_whose_caller_goes_away_expires_its_approval() {
    let h = Harness::start().await;
    hook(&h, "", fixture("session_start")).await;
    let req = tokio::spawn({
        let (url, token) = (h.url(&format!("{HOOK}?timeout=600")), h.alice.clone());
        async move {
            let _ = reqwest::Client::new()
                .post(url)
                .bearer_auth(token)
                .json(&fixture("permission_request"))
                .send()
                .await;
        }
    });
    let task = session_task(&h, "abc123").await;
    let dec = pending_decision(&h, &task).await;
    req.abort(); // Claude Code was interrupted: the connection closes.
    let id = dec["id"].as_str().unwrap();
    let mut status = Value::Null;
    for _ in 0..200 {
        status = decision(&h, &task, id).await["status"].clone();
        if status != "pending" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(status, "expired");
}

#[tokio::test]
async fn in_print_mode_a_gated_call_is_deferred_and_the_resumed_run_gets_the_answer() {
    let h = Harness::start().await;
    let dev = h.pair_device("alice", &["view", "steer", "approve"]).await;
    let q = "?gate=Bash&defer=true&timeout=30";
    let out = hook(&h, q, fixture("deferred_push")).await;
    assert_eq!(
        out["hookSpecificOutput"]["permissionDecision"], "defer",
        "{out}"
    );
    let task = session_task(&h, "p-run-7").await;
    let dec = pending_decision(&h, &task).await;
    assert_eq!(dec["durability"], "durable");
    assert_eq!(dec["intent"]["input"]["command"], "git push");
    // The `claude -p` process exits; the approval outlives it.
    hook(&h, "", fixture("session_end")).await;
    assert_eq!(h.detail(&task).await["decisions"][0]["status"], "pending");

    answer(&h, &dev, &task, &dec, Operation::Approve, json!({})).await;
    // `claude -p --resume p-run-7`: PreToolUse fires again for the same call.
    hook(&h, "", fixture("session_resume")).await;
    let out = hook(&h, q, fixture("deferred_push")).await;
    assert_eq!(
        out["hookSpecificOutput"]["permissionDecision"], "allow",
        "{out}"
    );
    let id = dec["id"].as_str().unwrap();
    assert_eq!(
        decision(&h, &task, id).await["delivery"]["state"],
        "pending"
    );
    hook(&h, "", fixture("deferred_push_done")).await;
    assert_eq!(
        decision(&h, &task, id).await["delivery"]["state"],
        "acknowledged"
    );
    let d = h.detail(&task).await;
    assert_eq!(
        d["effects"].as_array().unwrap().len(),
        1,
        "one effect for the one call"
    );
    assert_eq!(d["effects"][0]["status"], "confirmed");
}

/// A gated call held in a run whose entrypoint is `entrypoint` (`sdk-cli`: `claude -p`).
fn held_headless_call(h: &Harness, entrypoint: &str) -> tokio::task::JoinHandle<Value> {
    hold_call(
        h,
        "?gate=Bash&timeout=60",
        Some(entrypoint),
        fixture("deferred_push"),
    )
}

/// The person switches a held call of a `claude -p` run to a durable wait: the held hook
/// answers `defer` at once, the approval stays open without Claude Code's deadline, and the
/// resumed run's `PreToolUse` gets the answer given later. An interactive session's hold, or a
/// run whose entrypoint is unknown, offers no such switch, and one asked for is refused.
#[tokio::test]
async fn a_held_call_of_a_headless_run_is_switched_to_a_durable_wait_on_request() {
    let h = Harness::start().await;
    let dev = h.pair_device("alice", &["view", "steer", "approve"]).await;
    for session in ["p-run-7", "interactive-1"] {
        let mut start = fixture("session_start");
        start["session_id"] = json!(session);
        hook(&h, "", start).await;
    }
    let held = held_headless_call(&h, "sdk-cli");
    let task = session_task(&h, "p-run-7").await;
    let dec = pending_decision(&h, &task).await;
    assert_eq!(dec["durability"], "fail_open_hook");
    // Truthful about what Claude Code does at the hook's timeout in `-p`: it denies.
    assert_eq!(dec["runtime_deadline"]["then"], "denies", "{dec}");
    assert_eq!(dec["runtime_deadline"]["can_wait"], true, "{dec}");

    answer(&h, &dev, &task, &dec, Operation::Defer, json!({})).await;
    let out = tokio::time::timeout(Duration::from_secs(10), held)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        out["hookSpecificOutput"]["permissionDecision"], "defer",
        "{out}"
    );
    let id = dec["id"].as_str().unwrap();
    let d = decision(&h, &task, id).await;
    assert_eq!(d["status"], "pending");
    assert_eq!(d["durability"], "durable");
    assert!(d["runtime_deadline"].is_null(), "no deadline left: {d}");
    // A second switch has nothing to switch.
    let (_, r) = h
        .submit(&dev.sign(&dev.command(
            &task,
            Some(1),
            Operation::Defer,
            json!({"decision_id": id, "intent_digest": dec["intent_digest"]}),
        )))
        .await;
    assert_eq!(r["reason"], "wrong_operation", "{r}");

    // The process exits; the person decides later; the resumed run is told.
    hook(&h, "", fixture("session_end")).await;
    answer(&h, &dev, &task, &dec, Operation::Approve, json!({})).await;
    hook(&h, "", fixture("session_resume")).await;
    let out = hook(&h, "?gate=Bash&timeout=60", fixture("deferred_push")).await;
    assert_eq!(
        out["hookSpecificOutput"]["permissionDecision"], "allow",
        "{out}"
    );

    // An interactive session: Claude Code asks in its own prompt; no switch is offered.
    let mut other = fixture("deferred_push");
    other["session_id"] = json!("interactive-1");
    other["tool_use_id"] = json!("toolu_interactive");
    let held = hold_call(&h, "?gate=Bash&timeout=60", Some("cli"), other);
    let task2 = session_task(&h, "interactive-1").await;
    let dec2 = pending_decision(&h, &task2).await;
    assert_eq!(dec2["runtime_deadline"]["then"], "asks_itself", "{dec2}");
    assert!(dec2["runtime_deadline"].get("can_wait").is_none(), "{dec2}");
    let (_, r) = h
        .submit(&dev.sign(&dev.command(
            &task2,
            Some(1),
            Operation::Defer,
            json!({"decision_id": dec2["id"], "intent_digest": dec2["intent_digest"]}),
        )))
        .await;
    assert_eq!(r["reason"], "wrong_operation", "{r}");
    answer(&h, &dev, &task2, &dec2, Operation::Deny, json!({})).await;
    let out = tokio::time::timeout(Duration::from_secs(10), held)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out["hookSpecificOutput"]["permissionDecision"], "deny");
}

#[tokio::test]
async fn bad_hook_inputs_are_refused_clearly() {
    let h = Harness::start().await;
    let (s, v) = h
        .post(&h.alice, HOOK, json!({"hook_event_name": "Stop"}))
        .await;
    assert_problem(s, &v, 422, "validation_failed");
    assert!(v["detail"].as_str().unwrap().contains("session_id"), "{v}");
    let (s, v) = h
        .post(
            &h.alice,
            &format!("{HOOK}?gate=(("),
            fixture("pre_tool_use"),
        )
        .await;
    assert_problem(s, &v, 422, "validation_failed");
    let (s, _) = h.post("", HOOK, fixture("pre_tool_use")).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
}

/// A run recorded from the real Claude Code 2.1.328, one hook input per line.
fn recorded(name: &str) -> Vec<Value> {
    let path = format!(
        "{}/tests/fixtures/claude-code/real-2.1.328/{name}.jsonl",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// How the person (or nobody) answers the run's permission prompt.
enum Person {
    Approves,
    Denies,
    IsAway,
}

/// Replays a recorded run hook by hook as Claude Code sent it; the `PermissionRequest` is held
/// until `person` answers from a paired device. Returns the task and the permission answer.
async fn replay(h: &Harness, run: &str, query: &str, person: Person) -> (String, Value) {
    let dev = h.pair_device("alice", &["view", "steer", "approve"]).await;
    let mut answered = Value::Null;
    let mut task = None;
    for input in recorded(run) {
        let session = input["session_id"].as_str().unwrap().to_owned();
        if input["hook_event_name"] != "PermissionRequest" {
            assert_eq!(hook(h, query, input).await, json!({}));
            continue;
        }
        let held = tokio::spawn({
            let (url, token) = (h.url(&format!("{HOOK}{query}")), h.alice.clone());
            async move {
                let r = reqwest::Client::new()
                    .post(url)
                    .bearer_auth(token)
                    .json(&input)
                    .send()
                    .await
                    .unwrap();
                r.json::<Value>().await.unwrap()
            }
        });
        let t = session_task(h, &session).await;
        let dec = pending_decision(h, &t).await;
        match person {
            Person::Approves => answer(h, &dev, &t, &dec, Operation::Approve, json!({})).await,
            Person::Denies => answer(h, &dev, &t, &dec, Operation::Deny, json!({})).await,
            Person::IsAway => {}
        }
        answered = tokio::time::timeout(Duration::from_secs(30), held)
            .await
            .unwrap()
            .unwrap();
        task = Some(t);
    }
    (task.expect("the run asked for permission"), answered)
}

/// The one attempt of a recorded run, finished.
fn one_attempt(d: &Value) {
    let attempts = d["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "one run, one attempt: {attempts:#?}");
    assert_eq!(attempts[0]["state"], "finished");
}

#[tokio::test]
async fn a_real_approved_run_is_one_task_with_one_attempt_and_a_confirmed_effect() {
    let h = Harness::start().await;
    let (task, out) = replay(&h, "allow", "?timeout=60", Person::Approves).await;
    assert_eq!(
        out["hookSpecificOutput"]["decision"]["behavior"], "allow",
        "{out}"
    );
    let d = h.detail(&task).await;
    one_attempt(&d);
    let texts: Vec<&str> = d["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["text"].as_str())
        .collect();
    assert_eq!(
        texts,
        [
            "Claude Code session started (startup)",
            "make the file",
            "Done: the file is there."
        ]
    );
    let effect = &d["effects"][0];
    assert_eq!(effect["status"], "confirmed", "{effect}");
    assert_eq!(effect["receipt"]["tool_response"]["noOutputExpected"], true);
    let dec = &d["decisions"][0];
    assert_eq!(
        dec["effect_id"], effect["id"],
        "the prompt (no tool_use_id) is linked to its PreToolUse call"
    );
    assert_eq!(dec["delivery"]["state"], "acknowledged", "{dec}");
}

#[tokio::test]
async fn a_real_denied_call_is_closed_as_not_run_never_left_intended() {
    let h = Harness::start().await;
    let (task, out) = replay(&h, "deny", "?timeout=60", Person::Denies).await;
    assert_eq!(out["hookSpecificOutput"]["decision"]["behavior"], "deny");
    let d = h.detail(&task).await;
    one_attempt(&d);
    let effect = &d["effects"][0];
    assert_eq!(effect["status"], "failed", "{effect}");
    assert_eq!(effect["receipt"]["not_run"], true, "{effect}");
    assert_eq!(effect["receipt"]["decision_id"], d["decisions"][0]["id"]);
    let why = effect["receipt"]["reason"].as_str().unwrap();
    assert!(
        why.starts_with("not run: denied") && why.contains("user:alice"),
        "{why}"
    );
}

#[tokio::test]
async fn a_real_unanswered_call_expires_and_is_closed_as_not_run_when_the_turn_ends() {
    let h = Harness::start().await;
    // timeout=4: the server answers ~1 s in, before Claude Code's own timeout.
    let (task, out) = replay(&h, "timeout", "?timeout=4", Person::IsAway).await;
    assert_eq!(
        out,
        json!({}),
        "no decision: Claude Code decides without us"
    );
    let d = h.detail(&task).await;
    one_attempt(&d);
    let dec = &d["decisions"][0];
    assert_eq!(dec["status"], "expired");
    let text = dec["outcome"]["text"].as_str().unwrap();
    assert!(text.contains("`claude -p` denies the call"), "{text}");
    let effect = &d["effects"][0];
    assert_eq!(effect["status"], "failed", "closed at Stop: {effect}");
    let why = effect["receipt"]["reason"].as_str().unwrap();
    assert!(
        why.contains("approval expired") && why.contains("(Stop)"),
        "{why}"
    );
}

/// An expired approval's call may still run in an interactive session (the person allows it in
/// Claude Code's own prompt): its `PostToolUse` confirms it, and nothing closes it as not run.
#[tokio::test]
async fn an_expired_call_that_ran_after_all_is_confirmed_not_closed() {
    let h = Harness::start().await;
    let run = recorded("allow");
    let (start, prompt, pre, perm, post, stop) =
        (&run[0], &run[1], &run[2], &run[3], &run[4], &run[5]);
    for i in [start, prompt, pre] {
        hook(&h, "", i.clone()).await;
    }
    assert_eq!(hook(&h, "?timeout=4", perm.clone()).await, json!({}));
    // Another hook before the call's outcome (Claude Code's notification of its own prompt).
    hook(&h, "", json!({"session_id": start["session_id"], "hook_event_name": "Notification",
        "message": "Claude needs your permission to use Bash", "notification_type": "permission_prompt"})).await;
    let task = session_task(&h, start["session_id"].as_str().unwrap()).await;
    assert_eq!(h.detail(&task).await["effects"][0]["status"], "intended");
    hook(&h, "", post.clone()).await;
    hook(&h, "", stop.clone()).await;
    let d = h.detail(&task).await;
    assert_eq!(d["decisions"][0]["status"], "expired");
    assert_eq!(
        d["effects"][0]["status"], "confirmed",
        "{}",
        d["effects"][0]
    );
}

#[tokio::test]
async fn allowing_with_claude_codes_suggestions_says_it_switches_the_session_to_accept_edits() {
    let h = Harness::start().await;
    let run = recorded("allow");
    let at = run
        .iter()
        .position(|i| i["hook_event_name"] == "PermissionRequest")
        .unwrap();
    let perm = run[at].clone();
    // What Claude Code sent before it asked (its session start among them), so the session's
    // task exists before the question is held.
    for input in &run[..at] {
        hook(&h, "", input.clone()).await;
    }
    let held = tokio::spawn({
        let (url, token) = (h.url(&format!("{HOOK}?timeout=4")), h.alice.clone());
        async move {
            reqwest::Client::new()
                .post(url)
                .bearer_auth(token)
                .json(&perm)
                .send()
                .await
                .unwrap()
        }
    });
    let task = session_task(&h, run[0]["session_id"].as_str().unwrap()).await;
    let dec = pending_decision(&h, &task).await;
    let always = dec["options"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["id"] == "approve_always")
        .expect("offered: Claude Code suggested changes")
        .clone();
    let label = always["label"].as_str().unwrap();
    assert!(
        label.contains("give Claude Code access to `/tmp/ccx/work` for this session")
            && label.contains("switch the session to `acceptEdits` mode: file edits no longer ask"),
        "{label}"
    );
    assert!(always["gives_up"].as_str().unwrap().contains("acceptEdits"));
    held.await.unwrap();
}

#[tokio::test]
async fn a_run_end_after_stop_starts_no_second_attempt() {
    let h = Harness::start().await;
    hook(&h, "", fixture("session_start")).await;
    hook(&h, "", fixture("stop")).await;
    hook(
        &h,
        "",
        json!({"session_id": "abc123", "hook_event_name": "SessionEnd", "reason": "other"}),
    )
    .await;
    let task = session_task(&h, "abc123").await;
    let d = h.detail(&task).await;
    one_attempt(&d);
    // A resumed run is a real restart: its own attempt.
    hook(&h, "", fixture("session_start")).await;
    assert_eq!(
        h.detail(&task).await["attempts"].as_array().unwrap().len(),
        2
    );
}

/// Hook calls recorded from the real Claude Code 2.1.328 through a proxy, with what the server
/// answered each: `{"t", "input", "status", "output"}` a line (`real-2.1.328/*.calls.jsonl`,
/// recorded by `waymark-cli/tests/real_claude_code.rs` with `WAYMARK_RECORD_FIXTURES`).
fn recorded_calls(name: &str) -> Vec<Value> {
    recorded(&format!("{name}.calls"))
}

/// An answer with its decision ids (new in every run) written `dec_…`.
fn without_ids(v: &Value) -> Value {
    let text = v.to_string();
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(at) = rest.find("dec_") {
        out.push_str(&rest[..at]);
        out.push_str("dec_…");
        rest = rest[at + 4..].trim_start_matches(|c: char| c.is_ascii_alphanumeric());
    }
    out.push_str(rest);
    serde_json::from_str(&out).unwrap()
}

/// Replays a recorded run call by call and checks each answer is the one the real run got;
/// a `PermissionRequest` is held until `person` answers it (`op`, `args`) from a paired device,
/// and so is the run after a `defer` (the person answers, then the resumed run goes on).
/// Returns the task.
async fn replay_answers(h: &Harness, name: &str, query: &str, args: Value) -> String {
    let dev = h.pair_device("alice", &["view", "steer", "approve"]).await;
    let mut task = None;
    for call in recorded_calls(name) {
        let input = call["input"].clone();
        let session = input["session_id"].as_str().unwrap().to_owned();
        let out = if input["hook_event_name"] == "PermissionRequest" {
            let held = tokio::spawn({
                let (url, token) = (h.url(&format!("{HOOK}{query}")), h.alice.clone());
                let input = input.clone();
                async move {
                    let r = reqwest::Client::new()
                        .post(url)
                        .bearer_auth(token)
                        .json(&input)
                        .send()
                        .await
                        .unwrap();
                    r.json::<Value>().await.unwrap()
                }
            });
            let t = session_task(h, &session).await;
            let dec = pending_decision(h, &t).await;
            answer(h, &dev, &t, &dec, Operation::Approve, args.clone()).await;
            tokio::time::timeout(Duration::from_secs(30), held)
                .await
                .unwrap()
                .unwrap()
        } else {
            hook(h, query, input.clone()).await
        };
        assert_eq!(
            without_ids(&out),
            without_ids(&call["output"]),
            "the answer the real Claude Code got to {input}"
        );
        let t = session_task(h, &session).await;
        if out["hookSpecificOutput"]["permissionDecision"] == "defer" {
            // The run has ended (`tool_deferred`); a person answers before it is resumed.
            let dec = pending_decision(h, &t).await;
            assert_eq!(dec["durability"], "durable", "{dec}");
            answer(h, &dev, &t, &dec, Operation::Approve, args.clone()).await;
        }
        task = Some(t);
    }
    task.expect("the run has a session")
}

/// The real deferred run: `PreToolUse` answered `defer` (the approval durable in the inbox),
/// `SessionEnd`; approved; the resumed run (`SessionStart` `resume`) asks `PreToolUse` for the
/// same call again and is answered `allow`, naming who decided; its `PostToolUse` confirms the
/// effect and acknowledges the answer. Every answer is the one Claude Code got in the real run.
#[tokio::test]
async fn a_real_deferred_call_waits_for_a_person_and_the_resumed_run_is_allowed() {
    let h = Harness::start().await;
    let task = replay_answers(&h, "defer", "?timeout=120&gate=Bash&defer=true", json!({})).await;
    let d = h.detail(&task).await;
    let dec = &d["decisions"][0];
    assert_eq!(dec["status"], "resolved", "{dec}");
    assert_eq!(dec["outcome"]["option"], "approve", "{dec}");
    assert_eq!(dec["delivery"]["state"], "acknowledged", "{dec}");
    let effect = &d["effects"][0];
    assert_eq!(effect["status"], "confirmed", "{effect}");
    assert_eq!(dec["effect_id"], effect["id"]);
}

/// The real `addRules` suggestion: approved with `approve_always`, the `PermissionRequest` is
/// answered `allow` with Claude Code's own suggestion as `updatedPermissions` (the real run then
/// wrote the rule to the project's local settings), exactly as the real run got it.
#[tokio::test]
async fn a_real_add_rules_suggestion_approved_always_is_sent_back_as_claude_code_gave_it() {
    let h = Harness::start().await;
    let task = replay_answers(
        &h,
        "rules",
        "?timeout=120",
        json!({"option": "approve_always"}),
    )
    .await;
    let d = h.detail(&task).await;
    let dec = &d["decisions"][0];
    assert_eq!(dec["outcome"]["option"], "approve_always", "{dec}");
    let label = dec["options"][1]["label"].as_str().unwrap();
    assert_eq!(
        label,
        "Allow, and add the allow rule `Bash(python3 -c 'print(40 + 2)')` in this project's local settings"
    );
    assert_eq!(dec["delivery"]["state"], "acknowledged", "{dec}");
    assert_eq!(d["effects"][0]["status"], "confirmed");
}

/// `AskUserQuestion` as the real Claude Code 2.1.328 sends it (a stream-json session, where
/// it is offered): a form question in the inbox, answered from a phone with a signed
/// `answer_question`; the held hook answers `allow` with the answers keyed by question text,
/// which is how Claude Code hands them to the model. Bad answers are refused with why.
#[tokio::test]
async fn a_real_ask_user_question_is_a_form_answered_from_a_phone() {
    let h = Harness::start().await;
    let dev = h.pair_device("alice", &["view", "steer", "approve"]).await;
    let mut start = fixture("session_start");
    start["session_id"] = json!("ask-1");
    hook(&h, "", start).await;
    let held = hold_call(&h, "?timeout=60", None, fixture("ask_user_question"));
    let task = session_task(&h, "ask-1").await;
    let dec = pending_decision(&h, &task).await;
    assert_eq!(dec["kind"], "question");
    assert_eq!(
        dec["question"],
        "Claude Code asks: Which database should I use?"
    );
    assert_eq!(dec["durability"], "fail_open_hook");
    assert_eq!(dec["runtime_deadline"]["then"], "asks_itself");
    let form = &dec["form"]["questions"][0];
    assert_eq!(form["id"], "q1");
    assert_eq!(form["header"], "Database");
    assert_eq!(
        form["choices"][1],
        json!({"label": "SQLite", "description": "a file"})
    );
    assert_eq!(
        (form["multi_select"].clone(), form["free_text"].clone()),
        (json!(false), json!(true))
    );
    assert!(!held.is_finished(), "the hook waits for the person");

    let submit = |args: Value| {
        let cmd = dev.command(
            &task,
            Some(dec["plan_revision"].as_i64().unwrap()),
            Operation::AnswerQuestion,
            {
                let mut a = json!({"decision_id": dec["id"]});
                for (k, v) in args.as_object().unwrap() {
                    a[k] = v.clone();
                }
                a
            },
        );
        let signed = dev.sign(&cmd);
        let h = &h;
        async move { h.submit(&signed).await }
    };
    let digest = dec["intent_digest"].clone();
    for (args, why) in [
        (
            json!({"answers": {"q1": {"chosen": ["SQLite"]}}}),
            "intent_digest",
        ),
        (
            json!({"intent_digest": "sha256:0000000000000000000000000000000000000000000000000000000000000000", "answers": {"q1": {"chosen": ["SQLite"]}}}),
            "intent_digest",
        ),
        (
            json!({"intent_digest": digest, "answers": {"q1": {"chosen": ["MySQL"]}}}),
            "`MySQL` is not a choice",
        ),
        (
            json!({"intent_digest": digest, "answers": {"q1": {"chosen": ["SQLite", "Postgres"]}}}),
            "takes one choice",
        ),
        (
            json!({"intent_digest": digest, "answers": {"q1": {"text": " "}}}),
            "empty",
        ),
        (
            json!({"intent_digest": digest, "answers": {}}),
            "not answered",
        ),
        (
            json!({"intent_digest": digest, "text": "SQLite"}),
            "`args.answers` is required",
        ),
    ] {
        let (_, r) = submit(args.clone()).await;
        assert_eq!(r["status"], "rejected", "{args}: {r}");
        assert!(r["detail"].as_str().unwrap().contains(why), "{args}: {r}");
    }
    assert!(!held.is_finished(), "a refused answer answers nothing");
    let (s, r) =
        submit(json!({"intent_digest": digest, "answers": {"q1": {"chosen": ["SQLite"]}}})).await;
    assert_eq!(
        (s, r["status"].as_str()),
        (StatusCode::OK, Some("applied")),
        "{r}"
    );

    let out = tokio::time::timeout(Duration::from_secs(10), held)
        .await
        .unwrap()
        .unwrap();
    let o = &out["hookSpecificOutput"];
    assert_eq!(o["permissionDecision"], "allow", "{out}");
    assert_eq!(
        o["updatedInput"]["answers"],
        json!({"Which database should I use?": "SQLite"})
    );
    assert_eq!(
        o["updatedInput"]["questions"],
        fixture("ask_user_question")["tool_input"]["questions"]
    );
    let id = dec["id"].as_str().unwrap();
    let closed = decision(&h, &task, id).await;
    assert_eq!(closed["status"], "resolved");
    assert_eq!(
        closed["outcome"]["answers"],
        json!({"q1": {"chosen": ["SQLite"]}})
    );
    assert_eq!(closed["outcome"]["text"], "Database: SQLite");
    assert_eq!(closed["delivery"]["state"], "pending");
    // Claude Code ran the tool with the answers: delivered.
    hook(&h, "", fixture("ask_user_question_done")).await;
    assert_eq!(
        decision(&h, &task, id).await["delivery"]["state"],
        "acknowledged"
    );
}

/// `ExitPlanMode` as the real Claude Code 2.1.328 sends it once the plan file is written: a
/// plan approval showing the plan. "Keep planning" with feedback denies the tool with the
/// feedback as the reason the model reads; the next `ExitPlanMode`, approved, is allowed with
/// its input, so Claude Code opens no dialog of its own.
#[tokio::test]
async fn a_real_plan_is_approved_or_sent_back_with_feedback() {
    let h = Harness::start().await;
    let dev = h.pair_device("alice", &["view", "steer", "approve"]).await;
    hook(&h, "", fixture("plan_write")).await;
    hook(&h, "", fixture("plan_write_done")).await;
    let held = hold_call(&h, "?timeout=60", None, fixture("exit_plan_mode"));
    let task = session_task(&h, "plan-1").await;
    let dec = pending_decision(&h, &task).await;
    assert_eq!(dec["kind"], "approval");
    assert_eq!(
        dec["intent"]["plan"],
        "# Plan\n\n1. Split the lexer\n2. Keep the API"
    );
    let labels: Vec<&str> = dec["options"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|o| o["label"].as_str())
        .collect();
    assert_eq!(labels, ["Approve plan", "Keep planning"]);
    answer(
        &h,
        &dev,
        &task,
        &dec,
        Operation::Deny,
        json!({"text": "keep the old parser behind a flag"}),
    )
    .await;
    let out = tokio::time::timeout(Duration::from_secs(10), held)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        out,
        json!({"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny",
            "permissionDecisionReason": "The user wants you to keep planning. Their feedback: keep the old parser behind a flag"}})
    );

    // The model plans again and asks again (a new call): approved this time.
    let mut again = fixture("exit_plan_mode");
    again["tool_use_id"] = json!("toolu_ExitPlanMode_2");
    let held = hold_call(&h, "?timeout=60", None, again.clone());
    let dec2 = {
        let mut found = None;
        for _ in 0..200 {
            let d = h.detail(&task).await;
            found = d["decisions"]
                .as_array()
                .unwrap()
                .iter()
                .find(|x| x["status"] == "pending" && x["id"] != dec["id"])
                .cloned();
            if found.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        found.expect("a second plan approval")
    };
    answer(&h, &dev, &task, &dec2, Operation::Approve, json!({})).await;
    let out = tokio::time::timeout(Duration::from_secs(10), held)
        .await
        .unwrap()
        .unwrap();
    let o = &out["hookSpecificOutput"];
    assert_eq!(o["permissionDecision"], "allow", "{out}");
    assert_eq!(o["updatedInput"], again["tool_input"]);
}
