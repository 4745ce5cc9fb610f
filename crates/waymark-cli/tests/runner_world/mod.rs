//! What the real-runtime runner tests share: a real `waymark serve`, alice's phone (the
//! terminal client, paired with `waymark pair`) that starts runs with `waymark run` and answers
//! from its inbox, the laptop's `waymark runner` (killed with `-9` when dropped), and waits on
//! the record. Each runtime's test brings its runtime and its fake model.

#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long one run may take, the wait for a person included.
pub const RUN: Duration = Duration::from_secs(120);

/// Where a runtime installed by `scripts/setup-debian` lives: `$WAYMARK_RUNTIMES_DIR/<name>`
/// (default `~/.cache/waymark-runtimes/<name>`).
pub fn runtime_dir(name: &str) -> PathBuf {
    std::env::var_os("WAYMARK_RUNTIMES_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/waymark-runtimes"))
        })
        .expect("neither WAYMARK_RUNTIMES_DIR nor HOME is set: cannot find the real runtimes")
        .join(name)
}

pub fn waymark() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_waymark"));
    c.env_remove("WAYMARK_DATA_DIR")
        .env_remove("WAYMARK_SERVER")
        .env_remove("WAYMARK_TOKEN")
        .env_remove("WAYMARK_KEYSTORE")
        .env("WAYMARK_LOG", "error");
    c
}

pub fn run_ok(mut c: Command) -> Value {
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
pub struct Serving(pub Child, pub String);

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn serve(data: &Path) -> Serving {
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

pub fn admin(data: &Path, args: &[&str]) -> Value {
    let mut c = waymark();
    c.arg("admin")
        .args(args)
        .args(["--json", "--data-dir"])
        .arg(data);
    run_ok(c)
}

/// The terminal client of alice's paired phone.
pub fn device(home: &Path, args: &[&str]) -> Value {
    let mut c = waymark();
    c.env("WAYMARK_HOME", home)
        .env("WAYMARK_KEYSTORE", "file-insecure")
        .args(args);
    run_ok(c)
}

/// The control plane with alice, her paired phone (`phone`) and the laptop's runner token:
/// (the server, the runner token, the admin token).
pub fn control_plane(data: &Path, phone: &Path) -> (Serving, String, String) {
    admin(data, &["user", "add", "alice"]);
    let server = serve(data);
    let link = admin(data, &["pair", "--user", "alice"])["link"]
        .as_str()
        .unwrap()
        .to_owned();
    device(phone, &["pair", &link, "--name", "alice's phone", "--json"]);
    let token = admin(
        data,
        &["runner-token", "--machine", "laptop", "--user", "alice"],
    )["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let admin_token = std::fs::read_to_string(data.join("admin.token"))
        .unwrap()
        .trim()
        .to_owned();
    (server, token, admin_token)
}

/// Waits until the phone sees the laptop online; the runtime `runtime` it registered.
pub async fn laptop_online(phone: &Path, runtime: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let m = device(phone, &["machines", "--json"]);
        if m["machines"][0]["online"] == true {
            return m["machines"][0]["runtimes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["runtime"] == runtime)
                .cloned()
                .unwrap_or(Value::Null);
        }
        assert!(
            Instant::now() < deadline,
            "the laptop never came online: {m}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `waymark run --runtime RUNTIME` from the phone: the new task's id.
pub fn start_run(phone: &Path, runtime: &str, dir: &str, prompt: &str) -> String {
    let started = device(
        phone,
        &[
            "run",
            "--machine",
            "laptop",
            "--runtime",
            runtime,
            "--dir",
            dir,
            "--json",
            prompt,
        ],
    );
    started["task_id"].as_str().unwrap().to_owned()
}

/// The phone's inbox after a sync: waits for the pending decision whose question names `what`.
pub async fn pending_in_inbox(phone: &Path, what: &str) -> Value {
    let deadline = Instant::now() + RUN;
    loop {
        device(phone, &["sync", "--json"]);
        let inbox = device(phone, &["inbox", "--json"]);
        if let Some(item) = inbox.as_array().and_then(|a| {
            a.iter().find(|i| {
                i["decision"]["question"]
                    .as_str()
                    .is_some_and(|q| q.contains(what))
            })
        }) {
            return item.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no decision about `{what}` reached the inbox: {inbox}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub fn approve(phone: &Path, item: &Value) {
    device(
        phone,
        &[
            "approve",
            item["decision"]["id"].as_str().unwrap(),
            "--json",
        ],
    );
}

pub async fn task_detail(server: &str, token: &str, task: &str) -> Value {
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

pub fn texts(detail: &Value) -> Vec<String> {
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

/// Waits until `check` holds of the task's detail (read with `token`).
pub async fn until(
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

/// Makes `dir` a git repository with one commit (a `README.md`), as a person's project is: a
/// runner's run records its working tree there.
pub fn git_project(dir: &Path) {
    std::fs::write(dir.join("README.md"), "the project\n").unwrap();
    for args in [
        &["init", "-q"][..],
        &["add", "README.md"],
        &["commit", "-qm", "start"],
    ] {
        let ok = Command::new("git")
            .args([
                "-c",
                "user.name=alice",
                "-c",
                "user.email=alice@example.invalid",
            ])
            .args(args)
            .current_dir(dir)
            .status()
            .unwrap()
            .success();
        assert!(ok, "git {args:?}");
    }
}

/// Waits until the fake model has received a request, from the `from`th of `requests()` on,
/// that `check` holds of; that request.
pub async fn model_received(
    requests: impl Fn() -> Vec<Value>,
    from: usize,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + RUN;
    loop {
        if let Some(r) = requests()[from..].iter().find(|r| check(r)) {
            return r.clone();
        }
        assert!(Instant::now() < deadline, "the model never received {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A follow-up on `task` a second from now, with `message` (as its owner schedules it).
pub async fn followup(server: &str, token: &str, task: &str, message: &str) {
    let res = reqwest::Client::new()
        .post(format!("{server}/v1/tasks/{task}/followups"))
        .bearer_auth(token)
        .json(&serde_json::json!({"schedule": {"after": "PT1S"}, "message": message}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
}

/// Approves from the phone the call whose card names `what`, then waits until the call is
/// confirmed and the model has a request `held` holds of (its result, held there by the fake):
/// a run to cut off after a confirmed call.
pub async fn confirmed_and_held(
    phone: &Path,
    (server, token, task): (&str, &str, &str),
    what: &str,
    requests: impl Fn() -> Vec<Value>,
    held: impl Fn(&Value) -> bool,
) {
    let item = pending_in_inbox(phone, what).await;
    approve(phone, &item);
    until(server, token, task, "the call is confirmed", |d| {
        d["effects"]
            .as_array()
            .is_some_and(|e| e.iter().any(|e| e["status"] == "confirmed"))
    })
    .await;
    model_received(requests, 0, "the call's result (held)", held).await;
}

/// A follow-up on a task (`(server, token, task)`) and the model request that brings it into the
/// run's own session: one whose user texts carry both the follow-up and `earlier`, a prompt the
/// session had before; that request.
pub async fn followup_reaches_session(
    (server, token, task): (&str, &str, &str),
    message: &str,
    earlier: &str,
    requests: impl Fn() -> Vec<Value>,
    user_texts: impl Fn(&Value) -> Vec<String>,
) -> Value {
    let before = requests().len();
    followup(server, token, task, message).await;
    model_received(requests, before, "the follow-up in the same session", |r| {
        let users = user_texts(r);
        users.iter().any(|t| t.contains(message)) && users.iter().any(|t| t.contains(earlier))
    })
    .await
}

/// Among `requests`, the one that brought Waymark's resume note into the run's own session:
/// its user texts (`user_texts`) hold `earlier`, a prompt the session had, before the note, and
/// the note names `call`, the confirmed call. That request.
pub fn note_in_session(
    requests: &[Value],
    earlier: &str,
    call: &str,
    user_texts: impl Fn(&Value) -> Vec<String>,
) -> Value {
    const NOTE: &str = "Waymark: this session was interrupted";
    let resumed = requests
        .iter()
        .find(|r| user_texts(r).iter().any(|t| t.contains(NOTE)))
        .cloned()
        .expect("the revived run sent the model Waymark's note");
    let users = user_texts(&resumed);
    let prompt_at = users
        .iter()
        .position(|t| t.contains(earlier))
        .expect("the earlier prompt is in the session");
    let note_at = users.iter().position(|t| t.contains(NOTE)).unwrap();
    assert!(prompt_at < note_at, "{users:#?}");
    assert!(
        users[note_at].contains(call),
        "the note names the confirmed call: {}",
        users[note_at]
    );
    resumed
}

/// Waits until the task has `attempts` attempts or more and the newest has finished.
pub async fn newest_finished(
    server: &str,
    token: &str,
    task: &str,
    attempts: usize,
    what: &str,
) -> Value {
    until(server, token, task, what, |d| {
        let a = d["attempts"].as_array().unwrap();
        a.len() >= attempts && a.last().unwrap()["state"] == "finished"
    })
    .await
}

/// What a revive leaves in the record: the first attempt revoked at fence 1, the newest at
/// fence 2, and the run said to be resumed.
pub fn assert_revived(d: &Value) {
    let attempts: Vec<(&str, i64)> = d["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["state"].as_str().unwrap(), a["fence"].as_i64().unwrap()))
        .collect();
    assert_eq!(attempts[0], ("revoked", 1), "{attempts:?}");
    assert_eq!(
        attempts.last().unwrap().1,
        2,
        "a new attempt and fence: {attempts:?}"
    );
    let said = texts(d);
    assert!(
        said.iter().any(|t| t == "system: laptop resumed the run"),
        "{said:?}"
    );
}

pub fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |t| t.lines().count())
}

/// The runner's record of its runs (`<state>/state.json`).
pub fn runner_runs(state: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(state.join("state.json")).unwrap()).unwrap()
}

/// The process group of a run the runner recorded (`{pid, start_ticks}`), if that process still
/// runs: a pid the system has since given to another process (pids wrap quickly on a busy
/// machine) is not the run's, and is never killed for it.
pub fn live_run_group(run: &Value) -> Option<u64> {
    let pid = run["pid"].as_u64()?;
    let ticks = run["start_ticks"].as_u64()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: fields follow the last `)`.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let started: u64 = rest.split(' ').nth(19)?.parse().ok()?;
    (started == ticks).then_some(pid)
}

/// Kills the runner and, with `-9`, the process group of the task's run.
pub fn kill_run_and_runner(runner: RunnerProcess, state: &Path, task: &str) {
    let pid = live_run_group(&runner_runs(state)["runs"][task])
        .expect("the runner recorded the run's process, and it runs");
    drop(runner);
    let killed = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pid}")])
        .status()
        .unwrap();
    assert!(killed.success());
}

/// Whether the process group `pid` leads still has a process.
pub fn group_alive(pid: u64) -> bool {
    Command::new("kill")
        .args(["-0", "--", &format!("-{pid}")])
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success()
}

/// Cancels the task's run from the phone: it is running (its process group alive), the task
/// ends `cancelled`, and the run's process group is gone; the task's detail then.
pub async fn cancel_from_phone(
    phone: &Path,
    state: &Path,
    server: &str,
    token: &str,
    task: &str,
) -> Value {
    let pid = live_run_group(&runner_runs(state)["runs"][task])
        .expect("the runner recorded the run's process, and it runs");
    device(phone, &["steer", task, "cancel", "--yes", "--json"]);
    let d = until(server, token, task, "the run is cancelled", |d| {
        d["task"]["state"] == "cancelled"
    })
    .await;
    let deadline = Instant::now() + RUN;
    while group_alive(pid) {
        assert!(
            Instant::now() < deadline,
            "the cancelled run's processes never ended"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    d
}

/// `waymark runner`, killed with `-9` when dropped.
pub struct RunnerProcess(pub Child);

impl Drop for RunnerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Kills the process groups of the runs still recorded when the test ends, and prints the
/// runner's log and its runs' logs when it fails. Holds the laptop's directory: `runner.log`
/// and `runner-state/`.
pub struct Cleanup(pub PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let state = self.0.join("runner-state");
        if std::thread::panicking() {
            for l in std::fs::read_to_string(self.0.join("runner.log"))
                .unwrap_or_default()
                .lines()
            {
                eprintln!("runner: {l}");
            }
            for f in std::fs::read_dir(state.join("logs"))
                .into_iter()
                .flatten()
                .flatten()
            {
                let t = std::fs::read_to_string(f.path()).unwrap_or_default();
                eprintln!("---- {}\n{t}", f.path().display());
            }
        }
        let runs: Value = std::fs::read_to_string(state.join("state.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default();
        for r in runs["runs"].as_object().into_iter().flatten() {
            if let Some(pid) = live_run_group(r.1) {
                let _ = Command::new("kill")
                    .args(["-KILL", "--", &format!("-{pid}")])
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }
}
