//! A full disk under the control plane (issue 32): a real `waymark serve` whose data dir is a
//! 16 MB tmpfs of its own (a user and mount namespace the test makes with `unshare`, so no
//! privilege and no host mount is needed), filled to the last byte while a worker appends
//! checkpoints. What must hold: the write that does not fit is refused with a clear `503`
//! saying the disk is full and nothing was written; reads and the process stay up; once space
//! is freed the same write succeeds; and after a restart every acknowledged checkpoint is
//! there — nothing acknowledged was lost, nothing refused was kept.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// The shell that holds the namespace: mounts the tmpfs, makes the user and the worker token,
/// starts the server, and then does what the test writes into its fifo — `fill` the disk,
/// `free` it, `restart` the server, `exit` — saying each one done in `acks`.
const HOLDER: &str = r#"
set -u
mount -t tmpfs -o size=16m tmpfs "$D"
"$W" admin --json --data-dir "$D/data" user add alice > "$O/user.json"
"$W" admin --json --data-dir "$D/data" worker-token --name w --user alice > "$O/worker.json"
serve() { "$W" serve --json --listen 127.0.0.1:0 --data-dir "$D/data" >> "$O/serve.out" 2>> "$O/serve.err" & pid=$!; }
serve
while true; do
  read cmd < "$F"
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
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Holder {
    fn start(dir: &Path) -> Holder {
        let (mnt, out, fifo) = (dir.join("mnt"), dir.join("out"), dir.join("ctl"));
        std::fs::create_dir_all(&mnt).unwrap();
        std::fs::create_dir_all(&out).unwrap();
        let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(made.success(), "mkfifo");
        let child = Command::new("unshare")
            .args(["--user", "--map-root-user", "--mount", "sh", "-c", HOLDER])
            .env("D", &mnt)
            .env("O", &out)
            .env("F", &fifo)
            .env("W", env!("CARGO_BIN_EXE_waymark"))
            .env("WAYMARK_LOG", "warn")
            .stdin(Stdio::null())
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

    fn command(&self, cmd: &str) {
        let before = self.file("acks").lines().count();
        std::fs::write(&self.fifo, format!("{cmd}\n")).unwrap();
        self.until(&format!("`{cmd}` was never done"), |h| {
            (h.file("acks").lines().count() > before).then_some(())
        });
    }
}

async fn checkpoint(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    task: &str,
    attempt: &str,
    seq: i64,
) -> (u16, Value) {
    // A body of 256 KiB, so the disk fills in a few dozen writes.
    let body = json!({"attempt_id": attempt, "fence": 1, "sequence": seq,
                      "body": {"reason": "step_completed", "summary": format!("step {seq}: {}", "x".repeat(256 * 1024))}});
    let res = http
        .post(format!("{url}/v1/tasks/{task}/checkpoints"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .expect("the server answers");
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_the_write_clearly_keeps_what_was_acknowledged_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let h = Holder::start(dir.path());
    let url = h.listening(1);
    let token = h.until("no worker token", |h| {
        let v: Value = serde_json::from_str(&h.file("worker.json")).ok()?;
        v["token"].as_str().map(str::to_owned)
    });
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let post = |path: &str, body: Value| {
        let (http, url, token) = (http.clone(), url.clone(), token.clone());
        let path = path.to_owned();
        async move {
            let res = http
                .post(format!("{url}{path}"))
                .bearer_auth(&token)
                .json(&body)
                .send()
                .await
                .unwrap();
            assert!(res.status().is_success(), "{path}: {}", res.status());
            res.json::<Value>().await.unwrap()
        }
    };
    let task = post("/v1/tasks", json!({"title": "fill the disk"})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let attempt = post(
        &format!("/v1/tasks/{task}/attempts"),
        json!({"worker": "w", "lease_seconds": 3600}),
    )
    .await["id"]
        .as_str()
        .unwrap()
        .to_owned();

    let mut acked = 0i64;
    for seq in 1..=4 {
        let (s, v) = checkpoint(&http, &url, &token, &task, &attempt, seq).await;
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
        let (s, v) = checkpoint(&http, &url, &token, &task, &attempt, seq).await;
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
    let health = http.get(format!("{url}/healthz")).send().await.unwrap();
    assert!(health.status().is_success());
    let seen: Value = http
        .get(format!("{url}/v1/tasks/{task}"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(seen["task"]["id"], task.as_str(), "{seen}");

    // Space returns: the refused write goes through as it was, and so do the next ones.
    h.command("free");
    for seq in acked + 1..=acked + 3 {
        let (s, v) = checkpoint(&http, &url, &token, &task, &attempt, seq).await;
        assert_eq!(s, 201, "after space returned, checkpoint {seq}: {v}");
        acked = seq;
    }

    // Restarted, the server has every acknowledged checkpoint, in order, and nothing more.
    h.command("restart");
    let url = h.listening(2);
    let detail: Value = http
        .get(format!("{url}/v1/tasks/{task}"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let seqs: Vec<i64> = detail["checkpoints"]
        .as_array()
        .unwrap_or_else(|| panic!("no checkpoints: {detail}"))
        .iter()
        .map(|c| c["sequence"].as_i64().unwrap())
        .collect();
    assert_eq!(seqs, (1..=acked).collect::<Vec<_>>(), "{detail}");
    h.command("exit");
}
