//! A full disk under the control plane (issue 32): a real `waymark serve` whose data dir is a
//! 16 MB tmpfs of its own (a user and mount namespace the test makes with `unshare`, so no
//! privilege and no host mount is needed), filled to the last byte while a worker appends
//! checkpoints. What must hold: the write that does not fit is refused with a clear `503`
//! saying the disk is full and nothing was written; reads and the process stay up; once space
//! is freed the same write succeeds; and after a restart every acknowledged checkpoint is
//! there — nothing acknowledged was lost, nothing refused was kept.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqlx::Connection;

/// The shell that holds the namespace: mounts the tmpfs, makes the user and the worker token,
/// starts the server, and then does what the test writes into its fifo — `fill` the disk,
/// `free` it, `restart` the server, `exit` — saying each one done in `acks`. The fifo is opened
/// once, for reading and writing: a `read < fifo` per command could open while the test's last
/// writer had not yet closed and read an empty line at its close (seen in CI on a loaded
/// machine), where a held descriptor never sees an end of file.
const HOLDER: &str = r#"
exec 2>> "$O/sh.err"
set -u
mount -t tmpfs -o size=16m tmpfs "$D"
"$W" admin --json --data-dir "$D/data" user add alice > "$O/user.json"
"$W" admin --json --data-dir "$D/data" worker-token --name w --user alice > "$O/worker.json"
serve() { "$W" serve --json --listen 127.0.0.1:0 --data-dir "$D/data" >> "$O/serve.out" 2>> "$O/serve.err" & pid=$!; }
serve
exec 3<> "$F"
while true; do
  read cmd <&3
  case "$cmd" in
    fill) dd if=/dev/zero of="$D/filler" bs=4k 2>/dev/null; df -k "$D" | tail -1 > "$O/df" ;;
    free) rm -f "$D/filler" ;;
    restart) kill "$pid"; wait "$pid"; serve ;;
    exit) kill "$pid"; wait "$pid"; echo "$cmd" >> "$O/acks"; exit 0 ;;
  esac
  echo "$cmd" >> "$O/acks"
done
"#;

struct Holder {
    child: Child,
    out: PathBuf,
    fifo: PathBuf,
}

impl Drop for Holder {
    /// Ends the holder and everything it started (its server too): they share its process
    /// group.
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.wait();
    }
}

impl Holder {
    /// `script` in a user and mount namespace of its own, in a process group of its own.
    fn start(dir: &Path, script: &str) -> Holder {
        let (mnt, out, fifo) = (dir.join("mnt"), dir.join("out"), dir.join("ctl"));
        std::fs::create_dir_all(&mnt).unwrap();
        std::fs::create_dir_all(&out).unwrap();
        let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(made.success(), "mkfifo");
        let child = Command::new("unshare")
            .args(["--user", "--map-root-user", "--mount", "sh", "-c", script])
            .env("D", &mnt)
            .env("O", &out)
            .env("F", &fifo)
            .env("W", env!("CARGO_BIN_EXE_waymark"))
            .env("WAYMARK_LOG", "warn")
            .stdin(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("unshare (util-linux) makes the namespace");
        Holder { child, out, fifo }
    }

    fn file(&self, name: &str) -> String {
        std::fs::read_to_string(self.out.join(name)).unwrap_or_default()
    }

    /// Waits (bounded) until `f` finds what it looks for in the holder's files.
    fn until<T>(&self, what: &str, f: impl Fn(&Holder) -> Option<T>) -> T {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(v) = f(self) {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "{what}; the server said: {}",
                self.file("serve.err")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The address the newest server listens on (its `n`th start).
    fn listening(&self, n: usize) -> String {
        self.until("the server never listened", |h| {
            let out = h.file("serve.out");
            let line = out.lines().filter(|l| l.contains("listening")).nth(n - 1)?;
            let v: Value = serde_json::from_str(line).ok()?;
            v["listening"].as_str().map(str::to_owned)
        })
    }

    fn command(&mut self, cmd: &str) {
        let before = self.file("acks").lines().count();
        // Written when the holder reads: a holder that is gone is a failure that says why,
        // never a test that waits forever.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            match std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(0o4000) // O_NONBLOCK: ENXIO while nobody reads
                .open(&self.fifo)
            {
                Ok(mut f) => {
                    f.write_all(format!("{cmd}\n").as_bytes()).unwrap();
                    break;
                }
                Err(e) => {
                    let gone = self.child.try_wait().ok().flatten();
                    assert!(
                        gone.is_none() && Instant::now() < deadline,
                        "the holder does not read `{cmd}` ({e}; exited: {gone:?}); it said: {}",
                        self.file("sh.err")
                    );
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
        self.until(&format!("`{cmd}` was never done"), |h| {
            (h.file("acks").lines().count() > before).then_some(())
        });
    }
}

/// A worker token's requests to one server.
struct Worker {
    http: reqwest::Client,
    url: String,
    token: String,
}

impl Worker {
    fn new(url: &str, token: &str) -> Worker {
        Worker {
            http: reqwest::Client::builder().no_proxy().build().unwrap(),
            url: url.to_owned(),
            token: token.to_owned(),
        }
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let res = self
            .http
            .post(format!("{}{path}", self.url))
            .bearer_auth(&self.token)
            .json(&body)
            .send()
            .await
            .expect("the server answers");
        let status = res.status().as_u16();
        (status, res.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str) -> Value {
        self.http
            .get(format!("{}{path}", self.url))
            .bearer_auth(&self.token)
            .send()
            .await
            .expect("the server answers")
            .json()
            .await
            .unwrap()
    }

    async fn healthy(&self) -> bool {
        let res = self.http.get(format!("{}/healthz", self.url)).send().await;
        res.is_ok_and(|r| r.status().is_success())
    }

    /// A new task with a running attempt (fence 1): (task, attempt).
    async fn task_with_attempt(&self, title: &str) -> (String, String) {
        let (s, t) = self.post("/v1/tasks", json!({"title": title})).await;
        assert_eq!(s, 201, "{t}");
        let task = t["id"].as_str().unwrap().to_owned();
        let (s, a) = self
            .post(
                &format!("/v1/tasks/{task}/attempts"),
                json!({"worker": "w", "lease_seconds": 3600}),
            )
            .await;
        assert_eq!(s, 201, "{a}");
        (task, a["id"].as_str().unwrap().to_owned())
    }

    /// Appends checkpoint `seq` with a summary of `pad` bytes more.
    async fn checkpoint(&self, task: &str, attempt: &str, seq: i64, pad: usize) -> (u16, Value) {
        let summary = format!("step {seq}{}", "x".repeat(pad));
        self.post(
            &format!("/v1/tasks/{task}/checkpoints"),
            json!({"attempt_id": attempt, "fence": 1, "sequence": seq,
                   "body": {"reason": "step_completed", "summary": summary}}),
        )
        .await
    }

    /// The sequences of the task's checkpoints, in order.
    async fn sequences(&self, task: &str) -> Vec<i64> {
        let d = self.get(&format!("/v1/tasks/{task}")).await;
        d["checkpoints"]
            .as_array()
            .unwrap_or_else(|| panic!("no checkpoints: {d}"))
            .iter()
            .map(|c| c["sequence"].as_i64().unwrap())
            .collect()
    }
}

/// A body of 256 KiB, so the disk fills in a few dozen writes.
const BIG: usize = 256 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_the_write_clearly_keeps_what_was_acknowledged_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = Holder::start(dir.path(), HOLDER);
    let url = h.listening(1);
    let token = h.until("no worker token", |h| {
        let v: Value = serde_json::from_str(&h.file("worker.json")).ok()?;
        v["token"].as_str().map(str::to_owned)
    });
    let w = Worker::new(&url, &token);
    let (task, attempt) = w.task_with_attempt("fill the disk").await;

    let mut acked = 0i64;
    for seq in 1..=4 {
        let (s, v) = w.checkpoint(&task, &attempt, seq, BIG).await;
        assert_eq!(s, 201, "{v}");
        acked = seq;
    }

    // The disk fills; the server keeps taking what fits (SQLite reuses its own free space)
    // until a write does not fit.
    h.command("fill");
    assert!(
        h.file("df").split_whitespace().nth(3) == Some("0"),
        "full: {}",
        h.file("df")
    );
    let refused = loop {
        let seq = acked + 1;
        let (s, v) = w.checkpoint(&task, &attempt, seq, BIG).await;
        match s {
            201 => acked = seq,
            503 => break v,
            other => panic!("checkpoint {seq} on a full disk: {other} {v}"),
        }
        assert!(
            acked < 200,
            "200 checkpoints of 256 KiB fitted on a full 16 MB disk"
        );
    };
    assert_eq!(refused["code"], "unavailable", "{refused}");
    assert!(
        refused["detail"]
            .as_str()
            .unwrap()
            .contains("disk is full: nothing was written"),
        "{refused}"
    );
    // The process is up and reads work.
    assert!(w.healthy().await);
    let seen = w.get(&format!("/v1/tasks/{task}")).await;
    assert_eq!(seen["task"]["id"], task.as_str(), "{seen}");

    // Space returns: the refused write goes through as it was, and so do the next ones.
    h.command("free");
    for seq in acked + 1..=acked + 3 {
        let (s, v) = w.checkpoint(&task, &attempt, seq, BIG).await;
        assert_eq!(s, 201, "after space returned, checkpoint {seq}: {v}");
        acked = seq;
    }

    // Restarted, the server has every acknowledged checkpoint, in order, and nothing more.
    h.command("restart");
    let w = Worker::new(&h.listening(2), &token);
    assert_eq!(w.sequences(&task).await, (1..=acked).collect::<Vec<_>>());
    h.command("exit");
}

/// The companion's side: the terminal client's home (its mirror and outbox) on a 16 MB tmpfs
/// of its own, driven command by command; the server on the host.
const CLIENT: &str = r#"
exec 2>> "$O/sh.err"
set -u
mount -t tmpfs -o size=16m tmpfs "$D"
n=0
exec 3<> "$F"
while true; do
  read line <&3
  set -- $line
  cmd=$1; shift
  case "$cmd" in
    fill) dd if=/dev/zero of="$D/filler" bs=4k 2>/dev/null ;;
    free) rm -f "$D/filler" ;;
    run) n=$((n+1)); WAYMARK_HOME="$D/home" WAYMARK_KEYSTORE=file-insecure "$W" "$@" > "$O/$n.out" 2> "$O/$n.err"; echo $? > "$O/$n.rc" ;;
    exit) echo exit >> "$O/acks"; exit 0 ;;
  esac
  echo "$cmd" >> "$O/acks"
done
"#;

/// A server on the host at a fixed port (so it comes back where its clients look), with the
/// environment given.
struct HostServer {
    child: Option<Child>,
    data: PathBuf,
    port: u16,
    env: Vec<(&'static str, std::ffi::OsString)>,
}

impl HostServer {
    fn new(data: &Path, env: Vec<(&'static str, std::ffi::OsString)>) -> HostServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        HostServer {
            child: None,
            data: data.to_owned(),
            port,
            env,
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn start(&mut self) {
        let mut child = Command::new(env!("CARGO_BIN_EXE_waymark"))
            .args(["serve", "--json", "--listen"])
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--data-dir")
            .arg(&self.data)
            .env("WAYMARK_LOG", "error")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        assert!(line.contains("listening"), "{line}");
        self.child = Some(child);
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for HostServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn admin(data: &Path, args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_waymark"))
        .arg("admin")
        .args(args)
        .args(["--json", "--data-dir"])
        .arg(data)
        .env("WAYMARK_LOG", "error")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The client in its namespace: `run` gives (exit code, stdout, stderr).
struct Client(Holder);

impl Client {
    fn run(&mut self, args: &str) -> (i32, String, String) {
        self.0.command(&format!("run {args}"));
        let n = self.0.file("acks").lines().filter(|l| *l == "run").count();
        let rc = self.0.file(&format!("{n}.rc")).trim().parse().unwrap_or(-1);
        (
            rc,
            self.0.file(&format!("{n}.out")),
            self.0.file(&format!("{n}.err")),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_under_the_companion_keeps_its_outbox_says_so_and_delivers_each_command_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("server");
    admin(&data, &["user", "add", "alice"]);
    let worker = admin(&data, &["worker-token", "--name", "w", "--user", "alice"])["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut server = HostServer::new(&data, Vec::new());
    let url = server.url();
    let link = admin(&data, &["pair", "--user", "alice", "--server", &url])["link"]
        .as_str()
        .unwrap()
        .to_owned();
    server.start();
    let (task, _) = Worker::new(&url, &worker)
        .task_with_attempt("steered from a full disk")
        .await;

    // The client's home on its own tmpfs (the holder's `D`).
    let cdir = dir.path().join("client");
    std::fs::create_dir_all(&cdir).unwrap();
    let mut client = Client(Holder::start(&cdir, CLIENT));
    let (rc, out, err) = client.run(&format!("pair {link} --name phone --json"));
    assert_eq!(rc, 0, "{out}{err}");
    let (rc, out, err) = client.run("sync --json");
    assert_eq!(rc, 0, "{out}{err}");

    // The server goes away; commands signed meanwhile wait in the outbox.
    server.stop();
    let (_, out, err) = client.run(&format!("steer {task} pause --json"));
    assert!(format!("{out}{err}").contains("queued"), "{out}{err}");

    // The client's disk fills: commands are signed and queued while they fit; the one that
    // does not is refused, saying so, and nothing of it is kept.
    client.0.command("fill");
    let mut queued = 1;
    let refusal = loop {
        let op = if queued % 2 == 0 { "pause" } else { "resume" };
        let (rc, out, err) = client.run(&format!("steer {task} {op} --json"));
        let said = format!("{out}{err}");
        if said.contains("queued") {
            queued += 1;
            assert!(queued < 300, "300 commands fitted on a full disk");
            continue;
        }
        assert_ne!(rc, 0, "{said}");
        break said;
    };
    assert!(
        (refusal.contains("this device's disk is full")
            || refusal.contains("this device's disk failed a write (is it full?)"))
            && refusal.contains("the outbox keeps what it held"),
        "{refusal}"
    );

    // The server is back; the disk is still full: what can be delivered is, and the client
    // says why it could not record it; then space returns and the next sync settles the rest.
    server.start();
    let (_, out, err) = client.run("sync --json");
    let said = format!("{out}{err}");
    assert!(
        said.contains("delivered") || said.contains("the outbox keeps what it held"),
        "a sync on a full disk: {said}"
    );
    client.0.command("free");
    let (rc, out, err) = client.run("sync --json");
    assert_eq!(rc, 0, "{out}{err}");
    let (rc, out, err) = client.run("outbox --json");
    assert_eq!(rc, 0, "{out}{err}");
    let outbox: Value = serde_json::from_str(&out).unwrap();
    let entries = outbox
        .as_array()
        .or_else(|| outbox["outbox"].as_array())
        .unwrap_or_else(|| panic!("{outbox}"));
    assert_eq!(entries.len(), queued, "every queued command kept: {outbox}");
    assert!(
        entries.iter().all(|e| e["status"] != "queued"),
        "every one delivered once space returned: {outbox}"
    );
    client.0.command("exit");

    // On the server: each queued command applied exactly once, and the refused one never.
    server.stop();
    let mut db = sqlx::SqliteConnection::connect(&format!(
        "sqlite://{}?mode=ro",
        data.join("waymark.db").display()
    ))
    .await
    .unwrap();
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM commands WHERE task_id = ?")
        .bind(&task)
        .fetch_one(&mut db)
        .await
        .unwrap();
    assert_eq!(
        n as usize, queued,
        "each queued command reached the server once"
    );
}

/// An `fsync` that fails (`EIO`), injected under a real `waymark serve` by a preloaded shim
/// while a flag file exists: what SQLite's own tests do with a faulty VFS, done at the libc
/// boundary so the server's real store is what fails.
const FAIL_SYNC: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>
static int failing(void) {
    const char *flag = getenv("WAYMARK_FAIL_SYNC_FLAG");
    return flag && access(flag, F_OK) == 0;
}
int fsync(int fd) {
    if (failing()) { errno = EIO; return -1; }
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    return real(fd);
}
int fdatasync(int fd) {
    if (failing()) { errno = EIO; return -1; }
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    return real(fd);
}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_fsync_is_refused_as_an_io_error_nothing_refused_is_acknowledged_and_writes_resume()
 {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("fail_sync.c");
    let lib = dir.path().join("libfail_sync.so");
    std::fs::write(&src, FAIL_SYNC).unwrap();
    let cc = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&lib)
        .arg(&src)
        .arg("-ldl")
        .status()
        .expect("a C compiler (gcc) builds the shim");
    assert!(cc.success(), "the shim compiles");
    let flag = dir.path().join("fail-now");
    let data = dir.path().join("data");
    admin(&data, &["user", "add", "alice"]);
    let token = admin(&data, &["worker-token", "--name", "w", "--user", "alice"])["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut server = HostServer::new(
        &data,
        vec![
            ("LD_PRELOAD", lib.clone().into()),
            ("WAYMARK_FAIL_SYNC_FLAG", flag.clone().into()),
        ],
    );
    server.start();
    let w = Worker::new(&server.url(), &token);
    let (task, attempt) = w.task_with_attempt("sync fails").await;
    let cp = |seq: i64| w.checkpoint(&task, &attempt, seq, 0);
    assert_eq!(cp(1).await.0, 201);

    // The disk starts failing its syncs: the write is refused as an I/O error, never
    // acknowledged; reads and the process stay up.
    std::fs::write(&flag, "").unwrap();
    let (s, v) = cp(2).await;
    assert_eq!(s, 503, "{v}");
    assert!(
        v["detail"]
            .as_str()
            .unwrap()
            .contains("disk failed to write (an I/O error): nothing was acknowledged"),
        "{v}"
    );
    assert!(w.healthy().await);

    // The fault clears: the same write goes through, and the next.
    std::fs::remove_file(&flag).unwrap();
    for seq in 2..=3 {
        let (s, v) = cp(seq).await;
        assert_eq!(s, 201, "checkpoint {seq} once syncs work again: {v}");
    }
    server.stop();
    server.start();
    assert_eq!(w.sequences(&task).await, [1, 2, 3], "after a restart");
}
