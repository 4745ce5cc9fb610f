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

pub fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |t| t.lines().count())
}

/// The runner's record of its runs (`<state>/state.json`).
pub fn runner_runs(state: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(state.join("state.json")).unwrap()).unwrap()
}

/// Kills the runner and, with `-9`, the process group of the task's run.
pub fn kill_run_and_runner(runner: RunnerProcess, state: &Path, task: &str) {
    let pid = runner_runs(state)["runs"][task]["pid"]
        .as_u64()
        .expect("the runner recorded the run's process");
    drop(runner);
    let killed = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pid}")])
        .status()
        .unwrap();
    assert!(killed.success());
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
            if let Some(pid) = r.1["pid"].as_u64() {
                let _ = Command::new("kill")
                    .args(["-KILL", "--", &format!("-{pid}")])
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }
}
