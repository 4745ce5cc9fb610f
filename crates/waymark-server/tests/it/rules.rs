//! Standing rules (issue 31 §2): alice signs a rule on her phone; the next matching approval
//! is answered at once and recorded with the rule, nobody is asked; a revocation or the rule's
//! expiry (the test's clock) ends it for the next request; deny wins; a risky call needs a
//! rule confirmed twice; rules are their owner's alone.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use waymark_proto::{EventKind, Operation, SteerCommand};

use crate::support::{Harness, TestDevice, assert_problem};

/// A command with no task, signed at the server's (driven) time, as a device whose clock
/// agrees with it signs.
fn rule_command(h: &Harness, d: &TestDevice, op: Operation, args: Value) -> Value {
    let now = h.server.state.now();
    d.sign(&SteerCommand {
        command_id: waymark_proto::ids::command(),
        task_id: None,
        expected_plan_revision: None,
        operation: op,
        scope: vec![],
        args,
        issued_by: format!("user:{}", d.user),
        device_id: d.id.clone(),
        issued_at: now,
        expires_at: now + chrono::Duration::minutes(10),
    })
}

/// Signs `add_rule` with `rule`; the command's result.
async fn add_rule(h: &Harness, d: &TestDevice, rule: Value) -> Value {
    let (_, r) = h
        .submit(&rule_command(
            h,
            d,
            Operation::AddRule,
            json!({"rule": rule}),
        ))
        .await;
    r
}

/// The id a result's detail names (`rule rul_…: …`).
fn rule_id(r: &Value) -> String {
    assert_eq!(r["status"], "applied", "{r}");
    let detail = r["detail"].as_str().unwrap();
    detail
        .split_whitespace()
        .nth(1)
        .unwrap()
        .trim_end_matches(':')
        .to_owned()
}

/// Asks for approval of a shell command on a new task of the worker's user.
async fn ask(h: &Harness, worker: &str, command: &str, cwd: &str) -> Value {
    let task = h.create_task(worker).await;
    let (s, v) = h
        .post(
            worker,
            &format!("/v1/tasks/{task}/approvals"),
            json!({"intent": {"tool": "Bash", "input": {"command": command}},
                   "summary": format!("run {command}?"), "cwd": cwd}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    v
}

async fn rules_of(h: &Harness, token: &str) -> Vec<Value> {
    let (s, v) = h.get(token, "/v1/rules").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    v["rules"].as_array().unwrap().clone()
}

/// The kinds of the events written about one decision.
async fn events_of(h: &Harness, decision: &str) -> Vec<EventKind> {
    let mut r = h.server.state.store.read().await.unwrap();
    r.events_after(0, 10_000, None)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.data.get("id").and_then(Value::as_str) == Some(decision))
        .map(|e| e.kind)
        .collect()
}

const SHOP: &str = "/home/alice/src/shop";

fn npm_test_rule() -> Value {
    json!({"match": {"tool": "Bash", "directory": SHOP,
                     "input": {"kind": "glob", "pattern": "npm test*"}},
           "answer": "allow", "note": "tests are fine"})
}

#[tokio::test]
async fn a_rule_signed_on_the_phone_answers_the_next_matching_approval_with_nobody_asked_until_it_is_revoked()
 {
    let h = Harness::start().await;
    let phone = h.pair_device("alice", &["view", "steer", "approve"]).await;
    let token = h.session_token(&phone).await;

    let r = add_rule(&h, &phone, npm_test_rule()).await;
    let id = rule_id(&r);
    assert!(r.get("task_id").is_none(), "a rule names no task: {r}");
    let listed = rules_of(&h, &token).await;
    assert_eq!(listed.len(), 1);
    let rule = &listed[0];
    assert_eq!(
        (&rule["id"], &rule["uses"], &rule["live"], &rule["answer"]),
        (&json!(id), &json!(0), &json!(true), &json!("allow"))
    );
    assert_eq!(rule["device_name"], "alice's phone");
    assert_eq!(rule["match"]["directory"], SHOP);
    // Seven days by default.
    let made = chrono::DateTime::parse_from_rfc3339(rule["created_at"].as_str().unwrap()).unwrap();
    let ends = chrono::DateTime::parse_from_rfc3339(rule["expires_at"].as_str().unwrap()).unwrap();
    assert_eq!(ends - made, chrono::Duration::days(7));
    let digest = rule["digest"].as_str().unwrap().to_owned();

    // The next matching approval is answered as it opens, by the rule, and says so.
    let d = ask(&h, &h.alice, "npm test -- --watch", &format!("{SHOP}/web")).await;
    assert_eq!(d["status"], "resolved", "{d}");
    let o = &d["outcome"];
    assert_eq!(o["option"], "approve");
    assert_eq!(o["by"], format!("rule:{id}"));
    assert_eq!(
        o["rule"],
        json!({"id": id, "digest": digest, "answer": "allow"})
    );
    let text = o["text"].as_str().unwrap();
    assert!(
        text.starts_with(&format!("allowed by rule {id} (alice's phone, until "))
            && text.ends_with(": tests are fine"),
        "{text}"
    );
    // Listed in its task, which never waited; no `decision.requested` (what pushes and
    // notifications follow) and no escalation.
    let task = h.detail(d["task_id"].as_str().unwrap()).await;
    assert_eq!(task["decisions"][0]["id"], d["id"]);
    assert_ne!(task["task"]["state"], "waiting_approval", "{task}");
    assert_eq!(
        events_of(&h, d["id"].as_str().unwrap()).await,
        [EventKind::DecisionClosed]
    );
    assert!(d.get("escalation").is_none_or(Value::is_null), "{d}");
    assert_eq!(rules_of(&h, &token).await[0]["uses"], 1);

    // What the rule does not cover still asks a person.
    for (cmd, cwd) in [
        ("npm test; rm -rf ~", SHOP),
        ("npm test", "/home/alice/src/other"),
        ("npm test", "/home/alice/src/shop/../other"),
        ("npm publish", SHOP),
    ] {
        let d = ask(&h, &h.alice, cmd, cwd).await;
        assert_eq!(d["status"], "pending", "{cmd} in {cwd}: {d}");
        assert_eq!(
            events_of(&h, d["id"].as_str().unwrap()).await,
            [EventKind::DecisionRequested]
        );
    }

    // Revoked from the phone: the very next request meets no rule.
    let (_, r) = h
        .submit(&rule_command(
            &h,
            &phone,
            Operation::RevokeRule,
            json!({"rule_id": id}),
        ))
        .await;
    assert_eq!(r["status"], "applied", "{r}");
    let d = ask(&h, &h.alice, "npm test", SHOP).await;
    assert_eq!(d["status"], "pending", "{d}");
    let listed = rules_of(&h, &token).await;
    assert_eq!(
        (
            &listed[0]["live"],
            &listed[0]["uses"],
            &listed[0]["revoked_by"]
        ),
        (&json!(false), &json!(1), &json!(phone.id))
    );
    // Revoking twice says so.
    let (_, r) = h
        .submit(&rule_command(
            &h,
            &phone,
            Operation::RevokeRule,
            json!({"rule_id": id}),
        ))
        .await;
    assert_eq!(r["reason"], "invalid_state", "{r}");
}

#[tokio::test]
async fn a_deny_rule_wins_over_an_allow_rule() {
    let h = Harness::start().await;
    let phone = h.pair_device("alice", &["approve"]).await;
    rule_id(
        &add_rule(
            &h,
            &phone,
            json!({"match": {"tool": "Bash", "input": {"kind": "glob", "pattern": "git *"}},
                   "answer": "allow"}),
        )
        .await,
    );
    let deny = rule_id(
        &add_rule(
            &h,
            &phone,
            json!({"match": {"input": {"kind": "regex", "pattern": "git push( .*)?"}},
                   "answer": "deny", "note": "pushes are mine"}),
        )
        .await,
    );
    let d = ask(&h, &h.alice, "git push origin main", "/repo").await;
    assert_eq!(
        (&d["status"], &d["outcome"]["option"], &d["outcome"]["by"]),
        (
            &json!("resolved"),
            &json!("deny"),
            &json!(format!("rule:{deny}"))
        )
    );
    assert!(
        d["outcome"]["text"]
            .as_str()
            .unwrap()
            .starts_with(&format!("denied by rule {deny}")),
        "{d}"
    );
    // Deny rules are read broadly: a push hidden behind another command is still denied.
    let d = ask(&h, &h.alice, "git status && git push", "/repo").await;
    assert_eq!(d["outcome"]["option"], "deny", "{d}");
    let d = ask(&h, &h.alice, "git status", "/repo").await;
    assert_eq!(d["outcome"]["option"], "approve", "{d}");
}

#[tokio::test]
async fn a_rule_expires_on_the_servers_clock() {
    let h = Harness::start().await;
    let phone = h.pair_device("alice", &["view", "approve"]).await;
    let in_two_days = h.server.state.now() + chrono::Duration::days(2);
    let mut rule = npm_test_rule();
    rule["expires_at"] = json!(in_two_days);
    rule_id(&add_rule(&h, &phone, rule).await);
    assert_eq!(
        ask(&h, &h.alice, "npm test", SHOP).await["status"],
        "resolved"
    );
    h.advance(Duration::from_secs(2 * 86_400 - 60)).await;
    assert_eq!(
        ask(&h, &h.alice, "npm test", SHOP).await["status"],
        "resolved",
        "a minute before its expiry it still answers"
    );
    h.advance(Duration::from_secs(61)).await;
    assert_eq!(
        ask(&h, &h.alice, "npm test", SHOP).await["status"],
        "pending"
    );
    let token = h.session_token(&phone).await;
    let listed = rules_of(&h, &token).await;
    assert_eq!(
        (&listed[0]["live"], &listed[0]["uses"]),
        (&json!(false), &json!(2))
    );
}

#[tokio::test]
async fn wrong_rules_are_refused_with_what_to_do() {
    let h = Harness::start().await;
    let phone = h.pair_device("alice", &["view", "approve"]).await;
    let now = h.server.state.now();
    let with = |patch: Value| {
        let mut r = npm_test_rule();
        for (k, v) in patch.as_object().unwrap() {
            r[k] = v.clone();
        }
        r
    };
    for (rule, reason, says) in [
        (
            with(json!({"expires_at": now + chrono::Duration::days(91)})),
            "invalid_command",
            "at most 90 days",
        ),
        (
            with(json!({"expires_at": now - chrono::Duration::minutes(1)})),
            "invalid_command",
            "has passed",
        ),
        (
            with(
                json!({"match": {"tool": "Bash", "input": {"kind": "regex", "pattern": "npm (test"}}}),
            ),
            "invalid_command",
            "not a regular expression",
        ),
        (
            with(json!({"match": {"tool": "Bash", "directory": "~/src/shop"}})),
            "invalid_command",
            "absolute path",
        ),
        (
            with(json!({"match": {"directory": SHOP}})),
            "invalid_command",
            "must name a `tool` or an input pattern",
        ),
        (
            with(json!({"match": {"tool": "Bash", "machine": "nowhere"}})),
            "unknown_machine",
            "no machine `nowhere`",
        ),
        (
            with(json!({"answer": "maybe"})),
            "invalid_command",
            "`args.rule`",
        ),
    ] {
        let r = add_rule(&h, &phone, rule.clone()).await;
        assert_eq!(r["status"], "rejected", "{rule}: {r}");
        assert_eq!(r["reason"], reason, "{rule}: {r}");
        assert!(r["detail"].as_str().unwrap().contains(says), "{rule}: {r}");
    }
    // A device paired without `approve` answers nothing, so makes no rule either.
    let viewer = h.pair_device("alice", &["view", "steer"]).await;
    let r = add_rule(&h, &viewer, npm_test_rule()).await;
    assert_eq!(r["reason"], "missing_scope", "{r}");
    assert!(
        rules_of(&h, &h.session_token(&phone).await)
            .await
            .is_empty()
    );
}

#[tokio::test]
async fn a_risky_call_is_allowed_only_by_a_rule_confirmed_twice() {
    let h = Harness::start().await;
    let phone = h.pair_device("alice", &["approve"]).await;
    let clean = json!({"match": {"tool": "Bash", "input": {"kind": "glob", "pattern": "rm -rf build"}},
                       "answer": "allow"});
    rule_id(&add_rule(&h, &phone, clean).await);
    // The server's risk policy marks `rm -rf` risky: a plain allow rule does not answer it.
    let d = ask(&h, &h.alice, "rm -rf build", "/repo").await;
    assert_eq!(
        (&d["status"], &d["risky"]),
        (&json!("pending"), &json!(true))
    );

    let mut risky = json!({"match": {"tool": "Bash", "input": {"kind": "glob", "pattern": "rm -rf build"}},
                           "answer": "allow", "allow_risky": true,
                           "expires_at": h.server.state.now() + chrono::Duration::days(1)});
    let r = add_rule(&h, &phone, risky.clone()).await;
    assert_eq!(r["reason"], "digest_mismatch", "once is not enough: {r}");
    assert!(
        r["detail"].as_str().unwrap().contains("confirm_risky"),
        "{r}"
    );
    let digest = waymark_proto::digest::json_digest(&risky).unwrap();
    let (_, r) = h
        .submit(&rule_command(
            &h,
            &phone,
            Operation::AddRule,
            json!({"rule": risky, "confirm_risky": digest}),
        ))
        .await;
    let id = rule_id(&r);
    let d = ask(&h, &h.alice, "rm -rf build", "/repo").await;
    assert_eq!(d["status"], "resolved", "{d}");
    assert_eq!(d["outcome"]["rule"]["id"], id);
    assert_eq!(
        d["outcome"]["rule"]["digest"], digest,
        "the digest confirmed is the rule's"
    );
    // Without an expiry of its own, nothing would say what was confirmed.
    risky.as_object_mut().unwrap().remove("expires_at");
    let digest = waymark_proto::digest::json_digest(&risky).unwrap();
    let (_, r) = h
        .submit(&rule_command(
            &h,
            &phone,
            Operation::AddRule,
            json!({"rule": risky, "confirm_risky": digest}),
        ))
        .await;
    assert_eq!(r["reason"], "invalid_command", "{r}");
}

#[tokio::test]
async fn rules_are_their_owners_alone_even_for_a_delegate() {
    let h = Harness::start().await;
    let alice = h.pair_device("alice", &["view", "approve"]).await;
    let bob = h.pair_device("bob", &["view", "approve"]).await;
    let alice_token = h.session_token(&alice).await;
    let bob_token = h.session_token(&bob).await;
    let id = rule_id(&add_rule(&h, &alice, npm_test_rule()).await);
    let (s, v) = h
        .send(
            reqwest::Method::PUT,
            &alice_token,
            "/v1/delegates/bob",
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v) = crate::delegation::consent(&h, &bob_token, "alice", "accept").await;
    assert_eq!(s, StatusCode::OK, "{v}");

    // bob neither sees nor revokes alice's rule, and it answers nothing of his.
    assert!(rules_of(&h, &bob_token).await.is_empty());
    let (_, r) = h
        .submit(&rule_command(
            &h,
            &bob,
            Operation::RevokeRule,
            json!({"rule_id": id}),
        ))
        .await;
    assert_eq!(r["reason"], "invalid_command", "{r}");
    assert!(r["detail"].as_str().unwrap().contains("no rule"), "{r}");
    assert_eq!(ask(&h, &h.bob, "npm test", SHOP).await["status"], "pending");
    assert_eq!(rules_of(&h, &alice_token).await[0]["live"], true);
    // A device asks for its own user's rules only; a worker token for none; the admin names
    // the user.
    let (s, v) = h.get(&bob_token, "/v1/rules?user=alice").await;
    assert_problem(s, &v, 403, "forbidden");
    let (s, v) = h.get(&h.alice, "/v1/rules").await;
    assert_problem(s, &v, 403, "forbidden");
    let (s, v) = h.get(&h.admin, "/v1/rules?user=alice").await;
    assert_eq!((s, &v["rules"][0]["id"]), (StatusCode::OK, &json!(id)));
}

#[tokio::test]
async fn a_claude_code_hook_is_answered_by_a_rule_at_once() {
    let h = Harness::start().await;
    let phone = h.pair_device("alice", &["approve"]).await;
    rule_id(
        &add_rule(
            &h,
            &phone,
            json!({"match": {"runtime": "claude-code", "tool": "Bash", "directory": "/home/u/repo",
                             "input": {"kind": "glob", "pattern": "npm test"}},
                   "answer": "allow"}),
        )
        .await,
    );
    let mut input: Value = serde_json::from_str(include_str!(
        "../fixtures/claude-code/permission_request.json"
    ))
    .unwrap();
    input["tool_input"]["command"] = json!("npm test");
    input["session_id"] = json!("rules-1");
    // A short hook timeout: were the rule not applied, the hook would come back empty.
    let started = std::time::Instant::now();
    let (s, v) = h
        .post(&h.alice, "/v1/adapters/claude-code/hook?timeout=5", input)
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        v["hookSpecificOutput"]["decision"]["behavior"], "allow",
        "{v}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "answered at once"
    );
}

/// A runner's report of the runtimes' own rules on its machine.
async fn report_own_rules(h: &Harness, token: &str, rules: Value) -> (StatusCode, Value) {
    h.send(
        reqwest::Method::PUT,
        token,
        "/v1/runner/machine",
        Some(json!({
            "runtimes": [{"runtime": "claude-code", "version": "2.1.328"}],
            "directories": ["/home/alice/src"],
            "runner_version": "0.1.0",
            "runtime_rules": rules,
        })),
    )
    .await
}

#[tokio::test]
async fn the_runtimes_own_rules_are_listed_beside_ours_and_a_conflict_is_named() {
    let h = Harness::start().await;
    let phone = h.pair_device("alice", &["view", "steer", "approve"]).await;
    let token = h.session_token(&phone).await;
    let (runner, _, _) =
        waymark_server::admin::create_runner_token(&*h.server.state.store, "laptop", Some("alice"))
            .await
            .unwrap();
    let npm = json!({
        "runtime": "claude-code",
        "source": "/home/alice/.claude/settings.json",
        "text": "Bash(npm:*)",
        "effect": "allow",
        "match": {"runtime": "claude-code", "tool": "Bash",
                  "input": {"kind": "glob", "pattern": "npm*"}},
    });
    let push = json!({
        "runtime": "codex",
        "source": "/home/alice/.codex/rules/default.rules",
        "text": "prefix_rule(pattern = [\"git\", \"push\"], decision = \"forbidden\")",
        "effect": "deny",
        "match": {"runtime": "codex", "tool": "commandExecution",
                  "input": {"kind": "glob", "pattern": "git push*"}},
    });
    let (s, v) = report_own_rules(&h, &runner, json!([npm, push])).await;
    assert_eq!(s, StatusCode::OK, "{v}");

    // Before alice has a rule: the runtimes' rules are listed, nothing conflicts.
    let (_, v) = h.get(&token, "/v1/rules").await;
    let own = v["runtime_rules"].as_array().unwrap();
    assert_eq!(own.len(), 2, "{v}");
    assert_eq!(own[0]["machine"], "laptop");
    assert_eq!(own[0]["rule"]["text"], "Bash(npm:*)");
    assert!(own.iter().all(|r| r["conflicts"] == json!([])), "{v}");

    // A deny rule over `npm publish` meets Claude Code's allow rule over every `npm` call;
    // an allow rule for `npm test` does not (Claude Code allows it too); bob sees nothing.
    let deny = rule_id(
        &add_rule(
            &h,
            &phone,
            json!({"match": {"tool": "Bash", "input": {"kind": "glob", "pattern": "npm publish*"}},
                   "answer": "deny"}),
        )
        .await,
    );
    rule_id(&add_rule(&h, &phone, npm_test_rule()).await);
    let (_, v) = h.get(&token, "/v1/rules").await;
    let own = &v["runtime_rules"];
    assert_eq!(own[0]["conflicts"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(own[0]["conflicts"][0]["rule_id"], json!(deny));
    let says = own[0]["conflicts"][0]["says"].as_str().unwrap();
    assert!(
        says.contains("Claude Code on laptop runs these calls without asking")
            && says.contains("never sees them"),
        "{says}"
    );
    assert_eq!(
        own[1]["conflicts"],
        json!([]),
        "codex's deny meets no allow rule of hers: {v}"
    );
    let bob = h.pair_device("bob", &["view"]).await;
    let bob_token = h.session_token(&bob).await;
    let (_, v) = h.get(&bob_token, "/v1/rules").await;
    assert_eq!(v["runtime_rules"], json!([]), "{v}");

    // An allow rule for `git push` meets Codex's forbidden prefix rule.
    let push_rule = rule_id(
        &add_rule(
            &h,
            &phone,
            json!({"match": {"runtime": "codex", "input": {"kind": "glob", "pattern": "git push origin main"}},
                   "answer": "allow"}),
        )
        .await,
    );
    let (_, v) = h.get(&token, "/v1/rules").await;
    assert_eq!(
        v["runtime_rules"][1]["conflicts"][0]["rule_id"],
        json!(push_rule),
        "{v}"
    );

    // The runner reads the files again and reports fewer: the listing follows.
    let (s, v) = report_own_rules(&h, &runner, json!([push_for_test()])).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (_, v) = h.get(&token, "/v1/rules").await;
    assert_eq!(v["runtime_rules"].as_array().unwrap().len(), 1, "{v}");

    // A report that says what it cannot: refused with the field, and nothing replaced.
    for (bad, field) in [
        (
            json!([{"runtime": "claude-code", "source": "/x", "text": "Bash", "effect": "allow",
                 "match": {"runtime": "codex"}}]),
            "match.runtime",
        ),
        (
            json!([{"runtime": "claude-code", "source": "/x", "text": "", "effect": "allow",
                 "match": {"runtime": "claude-code"}}]),
            "runtime_rules[0].text",
        ),
    ] {
        let (s, v) = report_own_rules(&h, &runner, bad).await;
        assert_problem(s, &v, 422, "validation_failed");
        assert!(
            v["detail"].as_str().unwrap().contains(field),
            "{field}: {v}"
        );
    }
    let (_, v) = h.get(&token, "/v1/rules").await;
    assert_eq!(v["runtime_rules"].as_array().unwrap().len(), 1, "{v}");
    // A rule of a person's file that Waymark cannot match never keeps the runner from
    // registering: it is listed as not matched.
    let (s, v) = report_own_rules(
        &h,
        &runner,
        json!([{"runtime": "claude-code", "source": "/x", "text": "Read(src/**)", "effect": "allow",
                "match": {"runtime": "claude-code", "directory": "src"}}]),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (_, v) = h.get(&token, "/v1/rules").await;
    let r = &v["runtime_rules"][0]["rule"];
    assert_eq!(r["effect"], "ask", "{v}");
    assert!(
        r["text"]
            .as_str()
            .unwrap()
            .starts_with("Read(src/**) (not matched:"),
        "{v}"
    );
}

fn push_for_test() -> Value {
    json!({
        "runtime": "codex",
        "source": "/home/alice/.codex/config.toml",
        "text": "approval_policy = \"never\"",
        "effect": "allow",
        "match": {"runtime": "codex"},
    })
}
