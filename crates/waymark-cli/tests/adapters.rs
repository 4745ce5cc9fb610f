//! `waymark adapters claude-code hook`, the command-hook form, as Claude Code runs it: a real
//! `waymark serve` process, the hook input on stdin, the answer on stdout.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use serde_json::Value;

fn waymark() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_waymark"));
    c.env_remove("WAYMARK_DATA_DIR")
        .env_remove("WAYMARK_SERVER")
        .env_remove("WAYMARK_TOKEN")
        .env("WAYMARK_LOG", "error");
    c
}

struct Serving(Child, String);

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(dir: &Path) -> Serving {
    let mut child = waymark()
        .args(["serve", "--json", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir)
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

fn admin(dir: &Path, args: &[&str]) -> Value {
    let out = waymark()
        .arg("admin")
        .args(args)
        .args(["--json", "--data-dir"])
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn run_hook(server: &str, token: &str, query: &str, input: &str) -> Output {
    let mut child = waymark()
        .args([
            "adapters",
            "claude-code",
            "hook",
            "--server",
            server,
            "--token",
            token,
            "--query",
            query,
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn fixture(name: &str) -> String {
    std::fs::read_to_string(format!(
        "{}/../waymark-server/tests/fixtures/claude-code/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

#[test]
fn the_command_hook_forwards_claude_codes_input_and_prints_the_answer() {
    let data = tempfile::tempdir().unwrap();
    let s = serve(data.path());
    admin(data.path(), &["user", "add", "alice"]);
    let token = admin(
        data.path(),
        &["worker-token", "--user", "alice", "--name", "claude"],
    )["token"]
        .as_str()
        .unwrap()
        .to_owned();

    let out = run_hook(&s.1, &token, "timeout=30", &fixture("session_start"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "{}");

    let out = run_hook(
        &s.1,
        &token,
        "gate=Bash&defer=true&timeout=30",
        &fixture("deferred_push"),
    );
    assert!(out.status.success());
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["hookSpecificOutput"]["hookEventName"], "PreToolUse");
    assert_eq!(answer["hookSpecificOutput"]["permissionDecision"], "defer");

    // A refused credential is said on stderr and by exit 1, a hook error that blocks nothing
    // in Claude Code (only 2 blocks).
    let out = run_hook(&s.1, "wrk_nope", "", &fixture("session_start"));
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("refused the hook"));
}

#[test]
fn with_the_control_plane_down_the_command_hook_renders_no_decision() {
    let out = run_hook(
        "http://127.0.0.1:9",
        "wrk_x",
        "timeout=5",
        &fixture("permission_request"),
    );
    assert_eq!(
        out.status.code(),
        Some(3),
        "fail open: unreachable (3), never a block (2)"
    );
    assert!(
        out.stdout.is_empty(),
        "no decision: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach the control plane"));

    let out = run_hook("http://127.0.0.1:9", "wrk_x", "", "not json");
    assert_eq!(out.status.code(), Some(2));
}

/// A worker-side command pinned through `WAYMARK_SERVER_FP` to a real `waymark serve` over
/// TLS with a self-signed certificate: the fingerprint it printed is trusted, another one is
/// refused before anything is sent, saying so.
#[test]
fn workers_pin_the_servers_certificate_from_waymark_server_fp() {
    let dir = tempfile::tempdir().unwrap();
    let made =
        rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&cert, made.cert.pem()).unwrap();
    std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
    let data = dir.path().join("data");
    let mut child = waymark()
        .args(["serve", "--json", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .arg("--tls-cert")
        .arg(&cert)
        .arg("--tls-key")
        .arg(&key)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let started: Value = serde_json::from_str(&line).unwrap();
    let s = Serving(child, started["listening"].as_str().unwrap().to_owned());
    let fp = started["tls_fingerprint"].as_str().unwrap().to_owned();
    assert!(s.1.starts_with("https://"), "{}", s.1);
    admin(&data, &["user", "add", "alice"]);
    let token = admin(&data, &["worker-token", "--user", "alice", "--name", "w"])["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let other = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let wrong = format!(
        "sha256:{}",
        waymark_proto::digest::sha256_hex(other.cert.der())
    );

    // The command hook.
    let hook = |pin: &str| {
        let mut child = waymark()
            .args(["adapters", "claude-code", "hook", "--server", &s.1])
            .args(["--token", &token, "--query", "timeout=30"])
            .env("WAYMARK_SERVER_FP", pin)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(fixture("session_start").as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    };
    let out = hook(&fp);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "{}",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = hook(&wrong);
    assert_eq!(
        out.status.code(),
        Some(3),
        "Claude Code is never blocked (exit 2 would)"
    );
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not the pinned") && err.contains(&wrong) && err.contains(&fp),
        "{err}"
    );

    // A long-lived adapter: with the right pin it gets past the control plane (and stops at
    // its own arguments); with a wrong one it is refused, naming both certificates.
    let adapter = |pin: &str| {
        waymark()
            .args(["adapters", "codex", "--server", &s.1, "--token", &token])
            .env("WAYMARK_SERVER_FP", pin)
            .output()
            .unwrap()
    };
    let out = adapter(&fp);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nothing to follow"), "{err}");
    let out = adapter(&wrong);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("does not match the pinned one") && err.contains(&wrong),
        "{err}"
    );
    // A malformed pin is a usage error.
    let out = adapter("sha256:nope");
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
