//! `waymark demo` as real processes: a control plane (`waymark serve`), the deploy service
//! (`waymark demo deploy-service`) and demo workers that crash, hang and resume.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The demo workers' lease: short, so a drill's take-over comes soon; long enough that a
/// loaded machine's late heartbeat does not lose it (2 s did, on a machine running the whole
/// suite beside other builds).
const LEASE_SECONDS: &str = "4";
fn waymark() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_waymark"));
    c.env_remove("WAYMARK_DATA_DIR")
        .env_remove("WAYMARK_SERVER")
        .env_remove("WAYMARK_TOKEN")
        .env_remove("WAYMARK_ADMIN_TOKEN")
        .env("WAYMARK_LOG", "error");
    c
}

/// A child process killed when the test ends.
struct Proc(Child, Value);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a `--json` command whose first stdout line says where it listens.
fn listening(mut cmd: Command) -> Proc {
    let mut child = cmd.stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    Proc(child, v)
}

struct Setup {
    dir: tempfile::TempDir,
    server: Proc,
    deploy: Proc,
    admin: String,
    token: String,
}

impl Setup {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let mut serve = waymark();
        serve
            .args(["serve", "--json", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(&data);
        let server = listening(serve);
        let admin = std::fs::read_to_string(data.join("admin.token"))
            .unwrap()
            .trim()
            .to_owned();
        let out = waymark()
            .args([
                "admin",
                "worker-token",
                "--name",
                "demo",
                "--json",
                "--data-dir",
            ])
            .arg(&data)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        let token = serde_json::from_slice::<Value>(&out.stdout).unwrap()["token"]
            .as_str()
            .unwrap()
            .to_owned();
        let mut ds = waymark();
        ds.args(["--json", "demo", "deploy-service", "--state"])
            .arg(dir.path().join("deploys.json"));
        let deploy = listening(ds);
        Setup {
            dir,
            server,
            deploy,
            admin,
            token,
        }
    }

    fn url(&self) -> &str {
        self.server.1["listening"].as_str().unwrap()
    }

    fn demo(&self, extra: &[&str]) -> Command {
        let mut c = waymark();
        c.args(["demo", "--server", self.url(), "--token", &self.token])
            .args([
                "--admin-token",
                &self.admin,
                "--lease-seconds",
                LEASE_SECONDS,
            ])
            .args(["--deploy-url", self.deploy.1["listening"].as_str().unwrap()])
            .arg("--workdir")
            .arg(self.dir.path().join("work"))
            .args(extra);
        c
    }

    fn deploys(&self) -> Value {
        let bytes = std::fs::read(self.dir.path().join("deploys.json")).unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    fn get(&self, path: &str) -> Value {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            reqwest::Client::new()
                .get(format!("{}{path}", self.url()))
                .bearer_auth(&self.admin)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap()
        })
    }

    fn only_task(&self) -> Value {
        let snapshot = self.get("/v1/snapshot");
        let tasks = snapshot["tasks"].as_array().unwrap();
        assert_eq!(tasks.len(), 1, "{snapshot}");
        let id = tasks[0]["id"].as_str().unwrap();
        self.get(&format!("/v1/tasks/{id}"))
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn summary(out: &Output) -> Value {
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout: {}\nstderr: {}",
        text(&out.stdout),
        text(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)))
}

#[test]
fn a_worker_that_crashes_after_the_deploy_committed_is_resumed_and_the_deploy_happens_once() {
    let s = Setup::start();
    let crashed = s
        .demo(&[
            "--scenario",
            "crash-after-commit",
            "--approve",
            "yes",
            "--budget-choice",
            "relevant_tests",
        ])
        .output()
        .unwrap();
    assert_eq!(crashed.status.code(), Some(70), "{}", text(&crashed.stderr));
    let said = text(&crashed.stdout);
    assert!(said.contains("exiting with 70"), "{said}");
    assert!(said.contains("--scenario resume --task task_"), "{said}");

    // The deploy service committed; the control plane still has the effect in progress.
    assert_eq!(s.deploys()["deploys"].as_array().unwrap().len(), 1);
    let before = s.only_task();
    assert_eq!(before["effects"][0]["status"], "in_progress");
    let task = before["task"]["id"].as_str().unwrap().to_owned();

    let resumed = s
        .demo(&["--scenario", "resume", "--task", &task, "--json"])
        .output()
        .unwrap();
    let v = summary(&resumed);
    assert_eq!(v["outcome"], "completed");
    assert_eq!(v["fence"], 2);
    assert_eq!(v["deploy"]["resolution"], "reconciled");
    assert_eq!(v["chain_intact"], true);

    let log = s.deploys();
    assert_eq!(
        log["deploys"].as_array().unwrap().len(),
        1,
        "the deploy service saw exactly one deploy: {log}"
    );
    let after = s.only_task();
    assert_eq!(after["task"]["state"], "completed");
    assert_eq!(after["effects"][0]["status"], "confirmed");
    assert_eq!(after["effects"][0]["receipt"], log["deploys"][0]);
    assert_eq!(after["chain"]["intact"], true);
    // The resumed worker continued the first one's chain.
    let cps = after["checkpoints"].as_array().unwrap();
    assert_eq!(cps.last().unwrap()["fence"], 2);
    assert_eq!(cps.last().unwrap()["body"]["reason"], "effect_boundary");
    assert_eq!(cps[0]["fence"], 1);
}

#[test]
fn a_worker_hung_past_its_lease_is_refused_by_the_deploy_service_after_a_second_worker_deployed() {
    let s = Setup::start();
    let hung = s
        .demo(&[
            "--scenario",
            "hang-past-lease",
            "--approve",
            "yes",
            "--budget-choice",
            "relevant_tests",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let hung = Proc(hung, Value::Null);
    // Wait until the hung worker holds the deploy in progress.
    let deadline = Instant::now() + Duration::from_secs(60);
    let task = loop {
        assert!(
            Instant::now() < deadline,
            "the hung worker never started its deploy"
        );
        let snapshot = s.get("/v1/snapshot");
        if let Some(id) = snapshot["tasks"][0]["id"].as_str() {
            let d = s.get(&format!("/v1/tasks/{id}"));
            if d["effects"][0]["status"] == "in_progress" {
                break id.to_owned();
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let second = s
        .demo(&["--scenario", "resume", "--task", &task, "--json"])
        .output()
        .unwrap();
    let v = summary(&second);
    assert_eq!(v["outcome"], "completed");
    assert_eq!(v["deploy"]["resolution"], "ran");

    let mut hung = hung;
    let child = &mut hung.0;
    let mut out = String::new();
    std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut out).unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(1), "{out}\n{err}");
    assert!(
        out.contains("refused: the deploy service refused: fence 1 is older than fence 2"),
        "{out}"
    );
    assert!(err.contains("fenced off"), "{err}");

    let log = s.deploys();
    assert_eq!(log["deploys"].as_array().unwrap().len(), 1, "{log}");
    assert_eq!(log["deploys"][0]["fence"], 2);
    assert_eq!(log["refusals"].as_array().unwrap().len(), 1, "{log}");
    assert_eq!(log["refusals"][0]["fence"], 1);
    let d = s.get(&format!("/v1/tasks/{task}"));
    assert_eq!(d["effects"][0]["status"], "confirmed");
    assert_eq!(d["task"]["state"], "completed");
}

#[test]
fn the_embedded_demo_runs_whole_with_one_command_and_reports_what_it_did() {
    let dir = tempfile::tempdir().unwrap();
    let out = waymark()
        .args(["demo", "--approve", "no", "--budget-choice", "full_suite"])
        .args(["--json", "--workdir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let v = summary(&out);
    assert_eq!(v["outcome"], "partially_delivered");
    assert_eq!(v["decision"]["option"], "deny");
    assert_eq!(v["budget"][0]["option"], "full_suite");
    assert_eq!(v["verification"]["tests"], 12);
    assert!(v["deploy"].is_null());
    let names: Vec<_> = v["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a[0].as_str().unwrap().to_owned())
        .collect();
    assert!(names.contains(&"fix.diff".to_owned()), "{names:?}");
    assert!(names.contains(&"report.md".to_owned()), "{names:?}");
    assert!(Path::new(v["repo"].as_str().unwrap()).join(".git").exists());
    // The record outlives the run.
    assert!(dir.path().join("server/waymark.db").exists());
}

/// An embedded demo run with `args`, in a temporary workdir.
fn embedded(args: &[&str]) -> (tempfile::TempDir, Output) {
    let dir = tempfile::tempdir().unwrap();
    let out = waymark()
        .arg("demo")
        .args(args)
        .arg("--workdir")
        .arg(dir.path())
        .output()
        .unwrap();
    (dir, out)
}

#[test]
fn deliver_patch_stops_before_verifying_and_the_terminal_lists_what_was_not_verified() {
    let (_dir, out) = embedded(&["--approve", "yes", "--budget-choice", "deliver_patch"]);
    let said = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{said}\n{}", text(&out.stderr));
    // The threshold is crossed after the fix, and the options say what they give up.
    let fix = said.find("       fix  committed").expect(&said);
    let asks = said.find("asks: 80% of the budget is spent").expect(&said);
    assert!(fix < asks, "{said}");
    assert!(
        said.contains("· deliver_patch — Stop and deliver the patch"),
        "{said}"
    );
    assert!(said.contains("gives up the other 7 tests"), "{said}");
    assert!(
        said.contains("answered `deliver_patch` through the admin route (--budget-choice)"),
        "{said}"
    );
    assert!(said.contains("    verify  skipped"), "{said}");
    assert!(
        !said.contains("  approval  "),
        "no approval is asked: {said}"
    );
    assert!(
        said.contains("• partially_delivered — Partially delivered: the patch "),
        "{said}"
    );
    assert!(
        said.contains("\n  Verified:\n  - the alert reproduced"),
        "{said}"
    );
    assert!(
        said.contains("\n  Not verified:\n  - the patch at "),
        "{said}"
    );
    assert!(
        said.contains("  - the deploy to staging: not done — the budget choice `deliver_patch`"),
        "{said}"
    );
}

#[test]
fn without_a_budget_choice_the_stated_default_applies_when_nobody_answers() {
    let (_dir, out) = embedded(&[
        "--approve",
        "yes",
        "--budget-decision-seconds",
        "1",
        "--json",
    ]);
    let v = summary(&out);
    assert_eq!(v["outcome"], "completed");
    assert_eq!(v["budget"][0]["status"], "expired");
    assert_eq!(v["budget"][0]["option"], "relevant_tests");
    assert_eq!(v["budget"][0]["by"], "default");
    assert_eq!(v["verification"]["scope"], "relevant_tests");
    assert_eq!(v["verification"]["selection"][0], "tests/test_cart.py");
    assert_eq!(v["deploy"]["resolution"], "ran");
    assert!(v["usage"]["tokens"].as_u64().unwrap() < 40_000, "{v}");
}

#[test]
fn flaky_tests_past_the_retry_bound_finish_partially_delivered_with_both_lists() {
    let (_dir, out) = embedded(&[
        "--scenario",
        "flaky-tests",
        "--approve",
        "yes",
        "--budget-choice",
        "relevant_tests",
        "--json",
    ]);
    let v = summary(&out);
    assert_eq!(v["outcome"], "partially_delivered");
    assert_eq!(v["verification"]["tries"], 3);
    assert_eq!(v["verification"]["passed_all"], false);
    assert!(v["deploy"].is_null());
    let verified = v["verified"].to_string();
    assert!(verified.contains("test_percentage_discount` passes"), "{v}");
    let not_verified = v["not_verified"].to_string();
    assert!(
        not_verified.contains("test_promo_code_from_the_promo_service"),
        "{v}"
    );
    assert!(not_verified.contains("did not pass in 3 tries"), "{v}");
}

#[test]
fn usage_mistakes_exit_2_and_an_unreachable_server_exits_3() {
    let out = waymark()
        .args(["demo", "--scenario", "resume"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--task"),
        "{}",
        text(&out.stderr)
    );
    let out = waymark()
        .args(["demo", "--budget-choice", "sideways"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("relevant_tests"),
        "{}",
        text(&out.stderr)
    );
    // A malformed pin is refused before anything starts (no deploy service, no workdir).
    let dir = tempfile::tempdir().unwrap();
    let workdir = dir.path().join("work");
    let out = waymark()
        .args([
            "demo",
            "--server",
            "https://127.0.0.1:9",
            "--token",
            "wmk_w_x",
        ])
        .args(["--server-fp", "sha256:abc", "--workdir"])
        .arg(&workdir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("not a certificate fingerprint")
            && !text(&out.stdout).contains("deploy service"),
        "{}",
        text(&out.stderr)
    );
    assert!(!workdir.exists(), "the workdir was created");

    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let dir = tempfile::tempdir().unwrap();
    let out = waymark()
        .args([
            "demo",
            "--server",
            &url,
            "--token",
            "wmk_w_x",
            "--json",
            "--workdir",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["error"]["code"], "unreachable");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("waymark serve"),
        "{v}"
    );
}

/// The seeds' design question, as a drill: a run waits for staging approval; the laptop sleeps
/// (the worker is gone); the control plane restarts; a phone says "stop deploying, keep the
/// report". The next worker writes the report and deploys nothing, and the thread shows why.
#[test]
fn the_drill_laptop_asleep_server_restarted_phone_says_report_only() {
    let mut s = Setup::start();
    let mut demo = s
        .demo(&["--budget-choice", "relevant_tests"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until it asks for the deploy.
    let started = Instant::now();
    let (task, approval) = loop {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the demo never asked to deploy"
        );
        if let Some(status) = demo.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(demo.stderr.as_mut().unwrap(), &mut err).unwrap();
            panic!("the demo ended ({status}) before asking: {err}");
        }
        let snap = s.get("/v1/snapshot");
        if let Some(t) = snap["tasks"].as_array().and_then(|t| t.first()) {
            let id = t["id"].as_str().unwrap().to_owned();
            let d = s.get(&format!("/v1/tasks/{id}"));
            if let Some(a) = d["decisions"]
                .as_array()
                .unwrap()
                .iter()
                .find(|x| x["kind"] == "approval" && x["status"] == "pending")
            {
                break (id, a["id"].as_str().unwrap().to_owned());
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    // The laptop sleeps: the worker is gone without a word.
    demo.kill().unwrap();
    demo.wait().unwrap();
    // The control plane restarts on the same address.
    let addr = s.url().trim_start_matches("http://").to_owned();
    let data = s.dir.path().join("data");
    let old = std::mem::replace(
        &mut s.server,
        Proc(Command::new("true").spawn().unwrap(), Value::Null),
    );
    drop(old);
    let mut serve = waymark();
    serve
        .args(["serve", "--json", "--listen", &addr, "--data-dir"])
        .arg(&data);
    s.server = listening(serve);

    // A phone, paired for this user, says: do not deploy, write the report only.
    let out = waymark()
        .args(["admin", "pair", "--user", "admin", "--json", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let code = serde_json::from_slice::<Value>(&out.stdout).unwrap()["code"]
        .as_str()
        .unwrap()
        .to_owned();
    let key = ed25519_dalek::SigningKey::generate(&mut rand::rngs::OsRng);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let http = reqwest::Client::new();
    let device: Value = rt.block_on(async {
        http.post(format!("{}/v1/devices/pair", s.url()))
            .json(&serde_json::json!({"code": code, "name": "phone", "public_key": waymark_proto::signing::public_key_b64(&key.verifying_key())}))
            .send().await.unwrap().json().await.unwrap()
    });
    let now = chrono::Utc::now();
    let cmd = waymark_proto::SteerCommand {
        command_id: waymark_proto::ids::command(),
        task_id: Some(task.clone()),
        expected_plan_revision: Some(1),
        operation: waymark_proto::Operation::SuspendAndReplan,
        scope: vec!["deploy".into()],
        args: serde_json::json!({"instructions": "stop deploying; keep the report"}),
        issued_by: "user:admin".into(),
        device_id: device["id"].as_str().unwrap().to_owned(),
        issued_at: now,
        expires_at: now + chrono::Duration::minutes(10),
    };
    let env = waymark_proto::signing::sign(&cmd, &key).unwrap();
    let res: Value = rt.block_on(async {
        http.post(format!("{}/v1/commands", s.url()))
            .json(&env)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    });
    assert_eq!(res["status"], "applied", "{res}");

    // The next worker (the laptop wakes, or another machine) resumes the task: it waits for
    // the sleeping worker's lease to run out, at the end the server gives when it refuses
    // (`lease_held` with `expires_at`).
    let out = s
        .demo(&[
            "--scenario",
            "resume",
            "--task",
            &task,
            "--budget-choice",
            "relevant_tests",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let d = s.get(&format!("/v1/tasks/{task}"));
    assert_eq!(d["task"]["state"], "completed", "{}", d["task"]);
    let log = s.dir.path().join("deploys.json");
    let deployed = if log.exists() {
        s.deploys()["deploys"].as_array().map_or(0, |a| a.len())
    } else {
        0
    };
    assert_eq!(deployed, 0, "nothing was deployed");
    assert!(
        d["artifacts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["name"] == "report.md"),
        "the report is kept"
    );
    assert!(
        d["effects"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["kind"] != "deploy"),
        "the deploy was never declared"
    );
    // The audit trail says why: the voided approval, the signed replan, the agent's message.
    let voided = d["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["id"] == approval.as_str())
        .unwrap();
    assert_eq!(voided["status"], "void");
    assert!(
        voided["outcome"]["text"]
            .as_str()
            .unwrap()
            .contains("plan was revised")
    );
    let ledger = s.get(&format!("/v1/admin/tasks/{task}/commands"));
    let entry = &ledger.as_array().unwrap()[0];
    assert_eq!(entry["operation"], "suspend_and_replan");
    assert_eq!(
        entry["envelope"]["command"]["args"]["instructions"],
        "stop deploying; keep the report"
    );
    assert!(d["messages"].as_array().unwrap().iter().any(|m| {
        m["text"]
            .as_str()
            .unwrap()
            .contains("stop deploying; keep the report")
    }));
}
