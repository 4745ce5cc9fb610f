//! The terminal client as a person uses it: a real `waymark serve` process, the real binary
//! for every client command, the device key in a real Secret Service (gnome-keyring under
//! `dbus-run-session`), and the exit codes of SPEC §10.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use serde_json::{Value, json};

fn waymark() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_waymark"));
    c.env_remove("WAYMARK_DATA_DIR")
        .env_remove("WAYMARK_KEYSTORE")
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
    serve_at(dir, "127.0.0.1:0")
}

fn serve_at(dir: &Path, listen: &str) -> Serving {
    let mut child = waymark()
        .args(["serve", "--json", "--listen", listen, "--data-dir"])
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
        .arg("--json")
        .arg("--data-dir")
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

fn client(home: &Path, args: &[&str]) -> Output {
    waymark()
        .env("WAYMARK_HOME", home)
        .env("WAYMARK_KEYSTORE", "file-insecure")
        .args(args)
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A data dir with the user alice and a worker token acting for her (returned).
fn alice_and_her_agent(data: &Path) -> String {
    admin(data, &["user", "add", "alice"]);
    admin(
        data,
        &["worker-token", "--name", "agent", "--user", "alice"],
    )["token"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Returns once the server at `url` counts `n` open event streams (`waymark_sse_subscribers`
/// at `/metrics`): a follower is listening.
fn event_streams_open(url: &str, n: u64) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let within = std::time::Duration::from_secs(30);
    let open = waymark_server::gauge_reaches(url, "waymark_sse_subscribers", n as f64, within);
    if let Err(seen) = rt.block_on(open) {
        panic!("{n} event stream(s) never opened (last seen: {seen:?})");
    }
}

/// A task with an attempt and a pending deploy approval, made by a worker over HTTP.
fn agent_waits_for_approval(url: &str, token: &str) -> (String, String) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let http = reqwest::Client::new();
        let post = |path: String, body: Value| {
            let http = http.clone();
            let token = token.to_owned();
            async move {
                let res = http.post(path).bearer_auth(token).json(&body).send().await.unwrap();
                assert!(res.status().is_success());
                res.json::<Value>().await.unwrap()
            }
        };
        let t = post(format!("{url}/v1/tasks"), json!({"title": "fix the checkout total", "plan": [{"id": "fix"}, {"id": "deploy"}]})).await;
        let task = t["id"].as_str().unwrap().to_owned();
        let a = post(format!("{url}/v1/tasks/{task}/attempts"), json!({"worker": "agent", "lease_seconds": 600})).await;
        let d = post(
            format!("{url}/v1/tasks/{task}/approvals"),
            json!({"attempt_id": a["id"], "fence": 1, "intent": {"target": "staging", "commit": "abc123"}, "summary": "deploy abc123 to staging?"}),
        )
        .await;
        (task, d["id"].as_str().unwrap().to_owned())
    })
}

fn decision(url: &str, token: &str, task: &str, id: &str) -> Value {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        reqwest::Client::new()
            .get(format!("{url}/v1/tasks/{task}/decisions/{id}"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    })
}

#[test]
fn pair_sync_and_approve_with_the_key_in_a_real_secret_service() {
    for tool in ["dbus-run-session", "gnome-keyring-daemon"] {
        assert!(
            Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .output()
                .unwrap()
                .status
                .success(),
            "`{tool}` is needed (apt package dbus / gnome-keyring; `.ci/run` installs them)"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("srv");
    let token = alice_and_her_agent(&data);
    let s = serve(&data);
    let (task, approval) = agent_waits_for_approval(&s.1, &token);
    let pairing = admin(&data, &["pair", "--user", "alice"]);
    let link = pairing["link"].as_str().unwrap().to_owned();
    // The phone's way in: the web companion's pairing page, the code in the fragment.
    let code = pairing["code"].as_str().unwrap();
    let web = pairing["web_link"].as_str().unwrap();
    assert!(web.ends_with(&format!("/app/#/pair?code={code}")), "{web}");
    assert!(
        web.starts_with(pairing["server"].as_str().unwrap()),
        "{web}"
    );
    let home = dir.path().join("home");

    // One D-Bus session: unlock a fresh gnome-keyring, then pair, sync and approve.
    let script = format!(
        r#"set -e
eval "$(printf waymark-test | gnome-keyring-daemon --unlock --components=secrets)"
export WAYMARK_KEYSTORE=secret-service WAYMARK_HOME='{home}' WAYMARK_LOG=error
W='{bin}'
"$W" pair '{link}' --name laptop --json
"$W" sync --json
"$W" inbox --json
"$W" approve {approval} --json
"#,
        home = home.display(),
        bin = env!("CARGO_BIN_EXE_waymark"),
    );
    let out = Command::new("dbus-run-session")
        .args(["--", "sh", "-c", &script])
        .env_remove("WAYMARK_KEYSTORE")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        stderr(&out)
    );
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["user"], "alice");
    assert!(lines[1]["snapshot"].as_bool().unwrap());
    assert_eq!(lines[2][0]["decision"]["id"], approval.as_str());
    assert_eq!(lines[3]["status"], "delivered");

    let d = decision(&s.1, &token, &task, &approval);
    assert_eq!(d["status"], "resolved");
    assert_eq!(d["outcome"]["option"], "approve");
    assert_eq!(d["outcome"]["by"], "user:alice");
    // The key lived in the keychain: nothing in the home but the mirror.
    for e in std::fs::read_dir(&home).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        assert!(
            name.starts_with("mirror.db"),
            "unexpected file in the companion home: {name}"
        );
    }
}

#[test]
fn the_client_reads_offline_queues_offline_and_says_so_with_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("srv");
    let home = dir.path().join("home");
    let token = alice_and_her_agent(&data);

    let out = client(&home, &["sync"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("waymark pair"), "{}", stderr(&out));
    let out = client(&home, &["pair", "not a link"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));

    let s = serve(&data);
    let (task, approval) = agent_waits_for_approval(&s.1, &token);
    // A code another device used. The server answers a used, expired or unknown code alike
    // (naming nobody; its suite shows an expired one answered so on its driven clock), so a
    // refused code needs no waiting for one to expire.
    let used = admin(&data, &["pair", "--user", "alice"])["link"]
        .as_str()
        .unwrap()
        .to_owned();
    let other = dir.path().join("other-home");
    assert!(client(&other, &["pair", &used]).status.success());
    let out = client(&home, &["pair", &used]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("unknown, used or expired")
            && stderr(&out).contains("waymark admin pair --user NAME"),
        "{}",
        stderr(&out)
    );

    let link = admin(&data, &["pair", "--user", "alice"])["link"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(client(&home, &["pair", &link]).status.success());
    assert!(client(&home, &["sync"]).status.success());

    let out = client(&home, &["threads"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("fix the checkout total"));
    let out = client(&home, &["steer", &task, "explode"]);
    assert_eq!(out.status.code(), Some(2));
    let out = client(&home, &["approve", "dec_nope"]);
    assert_eq!(out.status.code(), Some(1));
    let out = client(&home, &["steer", &task, "cancel"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "cancel asks for confirmation: {}",
        stderr(&out)
    );

    // Offline: reads still answer; a command is queued and the exit code says it is not delivered.
    let addr = s.1.trim_start_matches("http://").to_owned();
    drop(s);
    let out = client(&home, &["show", &task, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let t: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(t["decisions"][0]["id"], approval.as_str());
    let out = client(&home, &["inbox"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("deploy abc123 to staging?"));
    let out = client(&home, &["approve", &approval]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("queued"), "{}", stderr(&out));
    let out = client(&home, &["sync"]);
    assert_eq!(out.status.code(), Some(3));
    let out = client(&home, &["outbox", "--json"]);
    let outbox: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(outbox[0]["status"], "queued");

    // Back online: the queued approval is delivered, once.
    let s = serve_at(&data, &addr);
    let out = client(&home, &["sync", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["delivered"][0]["status"], "delivered", "{r}");
    let d = decision(&s.1, &token, &task, &approval);
    assert_eq!(d["outcome"]["option"], "approve");
    let out = client(&home, &["approve", &approval]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a second approval is refused: {}",
        stderr(&out)
    );
}

/// A self-signed certificate for 127.0.0.1 in `dir`: (cert, key, fingerprint).
fn certificate(dir: &Path, name: &str) -> (std::path::PathBuf, std::path::PathBuf, String) {
    let made = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).unwrap();
    let cert = dir.join(format!("{name}.pem"));
    let key = dir.join(format!("{name}-key.pem"));
    std::fs::write(&cert, made.cert.pem()).unwrap();
    std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
    (cert, key, waymark_server::tls::fingerprint(made.cert.der()))
}

#[test]
fn a_tls_server_pairing_link_pins_its_certificate_and_waymark_pair_keeps_the_pin() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("srv");
    let home = dir.path().join("home");
    let (cert, key, fp) = certificate(dir.path(), "server");
    let (other_cert, _, other_fp) = certificate(dir.path(), "other");
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
    let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    let s = Serving(child, v["listening"].as_str().unwrap().to_owned());
    assert!(s.1.starts_with("https://"), "{}", s.1);
    assert_eq!(v["tls_fingerprint"], fp.as_str());

    // The link carries the fingerprint the server recorded, and parses back to it.
    let p = admin(&data, &["pair", "--user", "admin"]);
    let link = p["link"].as_str().unwrap().to_owned();
    assert!(link.contains(&format!("&fp={fp}")), "{link}");
    assert_eq!(p["fingerprint"], fp.as_str());
    let parsed = waymark_companion::parse_pairing_link(&link).unwrap();
    assert_eq!(parsed.server, s.1);
    assert_eq!(parsed.pin.as_deref(), Some(fp.as_str()));
    // `--tls-cert` names another certificate; `--no-pin` leaves the fingerprint out.
    let p = admin(
        &data,
        &[
            "pair",
            "--user",
            "admin",
            "--tls-cert",
            other_cert.to_str().unwrap(),
        ],
    );
    assert_eq!(p["fingerprint"], other_fp.as_str());
    let p = admin(&data, &["pair", "--user", "admin", "--no-pin"]);
    assert!(!p["link"].as_str().unwrap().contains("fp="), "{p}");

    // A link pinning another certificate is refused, saying so, and pairs nothing.
    let forged = link.replace(&fp, &other_fp);
    let out = client(&home, &["pair", &forged]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!(
            "the server's certificate does not match the one paired ({other_fp})"
        )),
        "{}",
        stderr(&out)
    );
    let out = client(&home, &["pair", &forged, "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["error"]["code"], "certificate_mismatch", "{v}");
    // The real link pairs (its code unspent), keeps the pin, and syncs over TLS.
    let out = client(&home, &["pair", &link, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let id: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(id["pin"], fp.as_str());
    let out = client(&home, &["sync", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// `waymark sync --follow` prints each event as it comes and, after its batch is in the
/// mirror, the notification it deserves, once per decision (the threads to look at are
/// coalesced, never queued without end).
#[test]
fn sync_follow_prints_events_and_one_notification_per_decision() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("srv");
    let home = dir.path().join("home");
    let token = alice_and_her_agent(&data);
    let s = serve(&data);
    let link = admin(&data, &["pair", "--user", "alice"])["link"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(client(&home, &["pair", &link]).status.success());

    let mut follow = waymark()
        .env("WAYMARK_HOME", &home)
        .env("WAYMARK_KEYSTORE", "file-insecure")
        .args(["sync", "--follow", "--json"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = follow.stdout.take().unwrap();
    let (lines_tx, lines) = std::sync::mpsc::channel::<Value>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if let Ok(v) = serde_json::from_str(&line)
                && lines_tx.send(v).is_err()
            {
                return;
            }
        }
    });
    // The agents start once the follower's event stream is open.
    event_streams_open(&s.1, 1);
    let waiting: Vec<(String, String)> = (0..3)
        .map(|_| agent_waits_for_approval(&s.1, &token))
        .collect();

    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut notified: Vec<String> = Vec::new();
    let mut events = 0;
    while notified.len() < waiting.len() {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let Ok(v) = lines.recv_timeout(left) else {
            panic!(
                "{} notification(s) after {events} event(s): {notified:?}",
                notified.len()
            )
        };
        if let Some(n) = v.get("notification") {
            notified.push(n["decision_id"].as_str().unwrap_or_default().to_owned());
        } else if v.get("cursor").is_some() {
            events += 1;
        }
    }
    // No repeats arrive afterwards.
    while let Ok(v) = lines.recv_timeout(std::time::Duration::from_millis(700)) {
        if let Some(n) = v.get("notification") {
            notified.push(n["decision_id"].as_str().unwrap_or_default().to_owned());
        }
    }
    let _ = follow.kill();
    let _ = follow.wait();
    let mut want: Vec<String> = waiting.into_iter().map(|(_, d)| d).collect();
    want.sort();
    notified.sort();
    assert_eq!(notified, want, "one notification per decision");
    assert!(events >= 9, "every event printed: {events}");
}

/// `waymark show` said revision 1; the plan moved on before the person acted. With
/// `--expected-revision 1` the command is signed with 1 and refused as a conflict; without it,
/// the client says which revision it signed (human and `--json`).
#[test]
fn expected_revision_signs_the_revision_shown_and_a_moved_plan_is_a_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("srv");
    let home = dir.path().join("home");
    let token = alice_and_her_agent(&data);
    let s = serve(&data);
    let (task, approval) = agent_waits_for_approval(&s.1, &token);
    let link = admin(&data, &["pair", "--user", "alice"])["link"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(client(&home, &["pair", &link]).status.success());
    assert!(client(&home, &["sync"]).status.success());
    let out = client(&home, &["show", &task]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("plan revision 1"));

    // The digest as `waymark inbox` prints it names the intent; another one is refused
    // before anything is signed.
    let out = client(&home, &["inbox"]);
    let inbox = String::from_utf8_lossy(&out.stdout).into_owned();
    let shown = inbox
        .split("digest ")
        .nth(1)
        .and_then(|s| s.split('…').next())
        .unwrap_or_else(|| panic!("the inbox prints the digest: {inbox}"))
        .to_owned();
    let queued_before = client(&home, &["outbox", "--json"]).stdout;
    let out = client(
        &home,
        &["deny", &approval, "--intent-digest", "sha256:00000000"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("asks about intent {shown} now")),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        client(&home, &["outbox", "--json"]).stdout,
        queued_before,
        "nothing was signed"
    );
    let out = client(
        &home,
        &[
            "deny",
            &approval,
            "--intent-digest",
            &shown,
            "--expected-revision",
            "1",
            "--json",
        ],
    );
    let first: Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().next().unwrap()).unwrap();
    assert!(
        first["signed_with"]["intent_digest"]
            .as_str()
            .unwrap()
            .starts_with(&format!("sha256:{shown}")),
        "the prefix signs the full digest: {first}"
    );

    // The plan moves on (this device replans, naming what it saw).
    let out = client(
        &home,
        &[
            "replan",
            &task,
            "--instructions",
            "smaller",
            "--expected-revision",
            "1",
            "--json",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["status"], "delivered", "{v}");
    assert_eq!(
        v["signed_with"],
        json!({"plan_revision": 1, "intent_digest": null, "from": "flag"})
    );
    assert!(client(&home, &["sync"]).status.success());

    // A second command still based on what `show` said: a conflict, nothing applied.
    let out = client(
        &home,
        &[
            "replan",
            &task,
            "--instructions",
            "bigger",
            "--expected-revision",
            "1",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "a conflict is a refusal");
    assert!(stderr(&out).contains("revision 2"), "{}", stderr(&out));
    let out = client(
        &home,
        &["approve", &approval, "--expected-revision", "1", "--json"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    // The entry, then the refusal: one JSON document per line.
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let v = &lines[0];
    assert_eq!(lines[1]["error"]["code"], "refused", "{stdout}");
    assert_ne!(v["status"], "delivered", "{v}");
    assert_eq!(v["signed_with"]["plan_revision"], 1);
    assert!(
        v["signed_with"]["intent_digest"]
            .as_str()
            .unwrap()
            .starts_with("sha256:")
    );

    // Without the flag: the mirror's revision, said on stderr and in `signed_with`.
    let out = client(&home, &["steer", &task, "pause"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out)
            .contains("signed at plan revision 2 (the mirror's now; `--expected-revision N`"),
        "{}",
        stderr(&out)
    );
    let out = client(&home, &["steer", &task, "resume", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["signed_with"]["from"], "mirror");
    assert_eq!(v["signed_with"]["plan_revision"], 2);

    let out = client(
        &home,
        &["steer", &task, "pause", "--expected-revision", "zero"],
    );
    assert_eq!(out.status.code(), Some(2), "not a number is a usage error");
    drop(s);
}

#[test]
fn an_unpaired_machine_says_so_instead_of_an_empty_inbox() {
    let home = tempfile::tempdir().unwrap();
    for (args, empty) in [
        (&["inbox"][..], "nothing waits for you"),
        (&["threads"][..], "no threads"),
    ] {
        let out = client(home.path(), args);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(empty) && text.contains("not paired") && text.contains("waymark pair"),
            "{args:?}: {text}"
        );
        assert!(
            !String::from_utf8_lossy(&out.stderr).contains("slow statement"),
            "no database tuning notes for a person"
        );
    }
}

/// `waymark escalation`: shows no policy, refuses a device it cannot find (nothing set), sets a
/// step by device id, and `waymark inbox` then says who was notified, who is next and the
/// deadline with its consequence; `--clear` goes back to notifying every device.
#[test]
fn escalation_is_set_from_the_terminal_and_the_inbox_says_who_is_next() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("srv");
    let home = dir.path().join("home");
    let token = alice_and_her_agent(&data);
    let s = serve(&data);
    let link = admin(&data, &["pair", "--user", "alice"])["link"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        client(&home, &["pair", &link, "--name", "laptop"])
            .status
            .success()
    );

    let out = client(&home, &["escalation"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(text.contains("no escalation policy"), "{text}");
    assert!(text.contains("laptop"), "the devices are listed: {text}");

    let out = client(&home, &["escalation", "--step", "0=phone"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no device `phone`"),
        "{}",
        stderr(&out)
    );
    let out = client(
        &home,
        &["escalation", "--step", "0=laptop", "--quiet", "22:00-07:00"],
    );
    assert!(!out.status.success(), "quiet hours need a time zone");

    let out = client(&home, &["escalation", "--step", "0=laptop"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(text.contains("1. at once → laptop"), "{text}");

    let (_task, _approval) = agent_waits_for_approval(&s.1, &token);
    assert!(client(&home, &["sync"]).status.success());
    let out = client(&home, &["inbox"]);
    let inbox = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        inbox.contains("escalation: notified laptop · no one else in line"),
        "{inbox}"
    );
    assert!(
        inbox.contains("deny applies in ") && inbox.contains(": the call does not run"),
        "{inbox}"
    );

    let out = client(&home, &["escalation", "--clear"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("no escalation policy"));
}

/// `waymark delegates`: alice offers bob her decisions, he accepts (`--accept alice`), and she
/// names him in a step (`--step 10=@bob`); bob's `waymark inbox` says whose the decision is,
/// and his `approve` from his own machine is applied; `--decline alice` ends it. A user that
/// does not exist, or an offer that was never made, is refused plainly.
#[test]
fn a_delegate_answers_from_his_own_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("srv");
    let (alice_home, bob_home) = (dir.path().join("alice"), dir.path().join("bob"));
    let token = alice_and_her_agent(&data);
    admin(&data, &["user", "add", "bob"]);
    let s = serve(&data);
    for (home, user, name) in [
        (&alice_home, "alice", "laptop"),
        (&bob_home, "bob", "bob-laptop"),
    ] {
        let link = admin(&data, &["pair", "--user", user])["link"]
            .as_str()
            .unwrap()
            .to_owned();
        let out = client(home, &["pair", &link, "--name", name]);
        assert!(out.status.success(), "{}", stderr(&out));
    }

    let out = client(&alice_home, &["delegates"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("nobody else answers alice's decisions"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = client(&alice_home, &["delegates", "--add", "nobody"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no user `nobody`"),
        "{}",
        stderr(&out)
    );
    let out = client(&alice_home, &["delegates", "--add", "bob"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("waiting to accept alice's offer: bob"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // bob is asked first: the offer shows, and he accepts it (again: said, nothing changes).
    let out = client(&bob_home, &["delegates"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("offers bob has not answered: alice"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = client(&bob_home, &["delegates", "--accept", "nobody"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no user `nobody`"),
        "{}",
        stderr(&out)
    );
    let out = client(&bob_home, &["delegates", "--accept", "alice"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("bob may answer the decisions of: alice"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = client(&bob_home, &["delegates", "--accept", "alice"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("already accepted"),
        "{}",
        stderr(&out)
    );
    let out = client(&alice_home, &["delegates"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("answer their decisions: bob"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = client(&alice_home, &["delegates", "--accept", "bob"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no offer from `bob` to `alice`"),
        "{}",
        stderr(&out)
    );
    let out = client(
        &alice_home,
        &["escalation", "--step", "0=laptop", "--step", "10=@bob"],
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        text.contains("2. after 10 min unopened → @bob (every device of theirs)"),
        "{text}"
    );

    let (_task, approval) = agent_waits_for_approval(&s.1, &token);
    assert!(client(&bob_home, &["sync"]).status.success());
    let inbox = String::from_utf8_lossy(&client(&bob_home, &["inbox"]).stdout).into_owned();
    assert!(
        inbox.contains(&approval) && inbox.contains(", for alice)"),
        "{inbox}"
    );
    let out = client(&bob_home, &["approve", &approval]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(client(&alice_home, &["sync"]).status.success());
    let shown = String::from_utf8_lossy(&client(&alice_home, &["inbox"]).stdout).into_owned();
    assert!(!shown.contains(&approval), "answered by bob: {shown}");

    // bob steps away: gone from alice's list too.
    let out = client(&bob_home, &["delegates", "--decline", "alice"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = client(&alice_home, &["delegates"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("nobody else answers alice's decisions"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = client(&bob_home, &["delegates", "--decline", "alice"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no offer from `alice`"),
        "{}",
        stderr(&out)
    );
}

/// Asks for approval of a shell command in `cwd`, on a new task of the token's user; the
/// decision as the server answered it.
fn agent_asks_to_run(url: &str, token: &str, command: &str, cwd: &str) -> Value {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let http = reqwest::Client::new();
        let t: Value = http
            .post(format!("{url}/v1/tasks"))
            .bearer_auth(token)
            .json(&json!({"title": "shop"}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        http.post(format!(
            "{url}/v1/tasks/{}/approvals",
            t["id"].as_str().unwrap()
        ))
        .bearer_auth(token)
        .json(
            &json!({"intent": {"tool": "Bash", "input": {"command": command}},
                          "summary": format!("run {command}?"), "cwd": cwd}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
    })
}

/// `waymark rules`: a rule added from the terminal (`~` expanded here) answers the agent's next
/// matching approval, is listed with its use and expiry, and is revoked; wrong flags, a bad
/// regex and too long a rule are usage errors before anything is signed.
#[test]
fn rules_are_added_listed_and_revoked_from_the_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("srv");
    let home = dir.path().join("home");
    let token = alice_and_her_agent(&data);
    let s = serve(&data);
    let link = admin(&data, &["pair", "--user", "alice"])["link"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        client(&home, &["pair", &link, "--name", "laptop"])
            .status
            .success()
    );
    let rules = |args: &[&str]| {
        let mut all = vec!["rules"];
        all.extend_from_slice(args);
        waymark()
            .env("WAYMARK_HOME", &home)
            .env("WAYMARK_KEYSTORE", "file-insecure")
            .env("HOME", "/home/alice")
            .args(&all)
            .output()
            .unwrap()
    };

    let out = rules(&[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("no rules"));

    for (args, says) in [
        (
            vec![
                "add",
                "--tool",
                "Bash",
                "--pattern",
                "npm (test",
                "--regex",
                "--allow",
            ],
            "not a regular expression",
        ),
        (
            vec!["add", "--tool", "Bash", "--allow", "--days", "120"],
            "1 to 90 days",
        ),
        (
            vec!["add", "--dir", "~/src/shop", "--allow"],
            "needs `--tool` or `--pattern`",
        ),
        (vec!["add", "--tool", "Bash"], "--allow"),
        (
            vec!["add", "--tool", "Bash", "--allow", "--deny"],
            "cannot be used with",
        ),
    ] {
        let out = rules(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
    }

    let out = rules(&[
        "add",
        "--tool",
        "Bash",
        "--pattern",
        "npm test*",
        "--dir",
        "~/src/shop",
        "--allow",
        "--note",
        "tests are fine",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let made: Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = made["rule_id"].as_str().unwrap().to_owned();
    assert!(
        made["result"]["detail"]
            .as_str()
            .unwrap()
            .contains("allow Bash `npm test*` in /home/alice/src/shop"),
        "{made}"
    );

    let d = agent_asks_to_run(&s.1, &token, "npm test", "/home/alice/src/shop");
    assert_eq!(d["status"], "resolved", "{d}");
    assert_eq!(d["outcome"]["by"], format!("rule:{id}"));
    let d = agent_asks_to_run(&s.1, &token, "npm test", "/home/alice/src/other");
    assert_eq!(d["status"], "pending", "{d}");

    let out = rules(&[]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        text.contains(&id) && text.contains("1 use · until ") && text.contains("(7d)"),
        "{text}"
    );
    assert!(
        text.contains("signed on laptop") && text.contains("note: tests are fine"),
        "{text}"
    );

    let out = rules(&["revoke", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("revoked"));
    let out = rules(&["revoke", &id]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "revoked before: {}",
        stderr(&out)
    );
    let d = agent_asks_to_run(&s.1, &token, "npm test", "/home/alice/src/shop");
    assert_eq!(d["status"], "pending", "{d}");
    let text = String::from_utf8_lossy(&rules(&[]).stdout).into_owned();
    assert!(text.contains("revoked "), "{text}");

    // Risky calls need `--allow-risky` and a second yes; without a terminal to ask, `--yes`.
    let out = rules(&[
        "add",
        "--tool",
        "Bash",
        "--pattern",
        "rm -rf build",
        "--allow",
        "--allow-risky",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("not confirmed"), "{}", stderr(&out));
    let out = rules(&[
        "add",
        "--tool",
        "Bash",
        "--pattern",
        "rm -rf build",
        "--allow",
        "--allow-risky",
        "--yes",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let d = agent_asks_to_run(&s.1, &token, "rm -rf build", "/repo");
    assert_eq!(
        (&d["risky"], &d["status"]),
        (&json!(true), &json!("resolved")),
        "{d}"
    );
}
