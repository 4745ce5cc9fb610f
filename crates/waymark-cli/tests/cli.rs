//! The `waymark` binary as a newcomer meets it: real processes, real ports, real files.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

fn waymark() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_waymark"));
    c.env_remove("WAYMARK_DATA_DIR").env("WAYMARK_LOG", "error");
    c
}

struct Serving(Child, String);

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(dir: &std::path::Path, listen: &str) -> Serving {
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
    let v: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    Serving(child, v["listening"].as_str().unwrap().to_owned())
}

fn stderr_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn serve_creates_the_admin_credential_and_a_second_server_on_the_same_port_says_why_it_cannot_start()
 {
    let dir = tempfile::tempdir().unwrap();
    let s = serve(&dir.path().join("a"), "127.0.0.1:0");
    let token_file = dir.path().join("a/admin.token");
    let token = std::fs::read_to_string(&token_file).unwrap();
    assert!(token.starts_with("wmk_a_"));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&token_file).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
    let addr = s.1.trim_start_matches("http://").to_owned();
    let out = waymark()
        .args(["serve", "--listen", &addr, "--data-dir"])
        .arg(dir.path().join("b"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr_of(&out).contains("already in use"),
        "{}",
        stderr_of(&out)
    );
    assert!(stderr_of(&out).contains("--listen"), "{}", stderr_of(&out));
}

#[test]
fn an_unwritable_data_dir_is_named_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let out = waymark()
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(file.join("data"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = stderr_of(&out);
    assert!(
        err.contains("cannot write to the data dir") && err.contains("--data-dir"),
        "{err}"
    );
}

#[test]
fn a_database_from_a_newer_waymark_is_refused_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let out = waymark()
        .args(["admin", "user", "list", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    let conn = mark_migrated_by_a_newer_version(&dir.path().join("waymark.db"));
    assert!(conn);
    let out = waymark()
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = stderr_of(&out);
    assert!(
        err.contains("newer waymark") && err.contains("upgrade waymark"),
        "{err}"
    );
    let out = waymark()
        .args(["admin", "user", "list", "--json", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["error"]["code"], "newer_schema");
}

/// Marks the database as migrated by a future version, as a newer binary would.
fn mark_migrated_by_a_newer_version(db: &std::path::Path) -> bool {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let pool =
            sqlx::SqlitePool::connect_with(sqlx::sqlite::SqliteConnectOptions::new().filename(db))
                .await
                .unwrap();
        sqlx::query(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
             VALUES (29990101000000, 'from a newer waymark', 1, x'00', 0)",
        )
        .execute(&pool)
        .await
        .unwrap();
        pool.close().await;
        true
    })
}

#[test]
fn worker_tokens_act_for_their_user() {
    let dir = tempfile::tempdir().unwrap();
    let out = waymark()
        .args([
            "admin",
            "worker-token",
            "--name",
            "ci",
            "--user",
            "alice",
            "--data-dir",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr_of(&out).contains("waymark admin user add alice"),
        "{}",
        stderr_of(&out)
    );

    let out = waymark()
        .args(["admin", "user", "add", "alice", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    let out = waymark()
        .args([
            "admin",
            "worker-token",
            "--json",
            "--name",
            "ci",
            "--user",
            "alice",
            "--data-dir",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let token = v["token"].as_str().unwrap().to_owned();
    assert_eq!(v["user"], "alice");

    let s = serve(dir.path(), "127.0.0.1:0");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let http = reqwest::Client::new();
        let res = http
            .post(format!("{}/v1/tasks", s.1))
            .bearer_auth(&token)
            .json(&serde_json::json!({"title": "t"}))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 201);
        let task: serde_json::Value = res.json().await.unwrap();
        assert_eq!(task["owner"], "alice");
    });

    // Revoked by name while the server runs (and holds the token it read): refused once the
    // command has returned.
    let out = waymark()
        .args(["admin", "token", "revoke", "ci", "--json", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["name"], "ci");
    rt.block_on(async {
        let res = reqwest::Client::new()
            .get(format!("{}/v1/snapshot", s.1))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 401, "a revoked token is refused");
    });
    let out = waymark()
        .args(["admin", "token", "list", "--json", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ci = list
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "ci")
        .unwrap();
    assert!(ci["revoked_at"].is_i64(), "{list}");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("wmk_"),
        "no secrets listed"
    );
    let out = waymark()
        .args(["admin", "token", "revoke", "ci", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr_of(&out).contains("no live token `ci`"),
        "{}",
        stderr_of(&out)
    );
}

#[test]
fn usage_errors_exit_2() {
    let out = waymark()
        .args(["serve", "--no-such-flag"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let dir = tempfile::tempdir().unwrap();
    let out = waymark()
        .args([
            "serve",
            "--database-url",
            "mysql://localhost/w",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr_of(&out).contains("postgres://"),
        "{}",
        stderr_of(&out)
    );
    // A PostgreSQL nobody listens for: refused, with the password kept out of the message.
    let out = waymark()
        .args([
            "serve",
            "--database-url",
            "postgres://waymark:s3cret@127.0.0.1:1/w",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr_of(&out).contains("cannot open the database"),
        "{}",
        stderr_of(&out)
    );
    assert!(!stderr_of(&out).contains("s3cret"), "{}", stderr_of(&out));
}

#[test]
fn serve_with_a_certificate_it_cannot_use_names_the_file_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.pem");
    let out = waymark()
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--tls-cert")
        .arg(&missing)
        .arg("--tls-key")
        .arg(&missing)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    let err = stderr_of(&out);
    assert!(
        err.contains("TLS certificate") && err.contains(&*missing.to_string_lossy()),
        "{err}"
    );
    // A certificate without its key is a usage error too.
    let out = waymark()
        .args(["serve", "--listen", "127.0.0.1:0", "--tls-cert"])
        .arg(&missing)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr_of(&out).contains("--tls-key"), "{}", stderr_of(&out));
}

#[test]
fn serve_refuses_redaction_settings_it_cannot_use_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    for (args, says) in [
        (
            vec!["--redact", "ticket=TICKET-("],
            "not a valid regular expression",
        ),
        (vec!["--redact", "Ticket=T-1"], "not a usable kind"),
        (vec!["--redact", "ticket=x*"], "matches the empty string"),
        (
            vec!["--no-redact-kind", "passwords"],
            "no built-in secret kind `passwords`",
        ),
        // Malformed values and contradictions: clap's usage errors.
        (vec!["--redact", "no-equals-sign"], "expected KIND=REGEX"),
        (
            vec!["--no-redact", "--redact", "t=T-1"],
            "cannot be used with",
        ),
        (
            vec!["--risky", "deploy (prod"],
            "--risky: regex parse error",
        ),
    ] {
        let out = waymark()
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(&data)
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr_of(&out));
        assert!(
            stderr_of(&out).contains(says),
            "{args:?}: {}",
            stderr_of(&out)
        );
        assert!(!data.exists(), "{args:?} created the data dir");
    }
}
