use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use waymark_server::{Clock, Config, DataDir, Running};

pub struct Harness {
    pub dir: tempfile::TempDir,
    /// The PostgreSQL database when the suite runs on it (`WAYMARK_TEST_BACKEND=postgres`).
    pub database_url: Option<String>,
    pub server: Running,
    pub http: reqwest::Client,
    pub admin: String,
    /// alice's worker token.
    pub alice: String,
    /// bob's worker token.
    pub bob: String,
}

/// A driven clock: tests move time with `Harness::advance` instead of sleeping.
///
/// The suite's push services listen on loopback, which the server reaches only because the
/// config allows it, as an operator allows a LAN's ntfy (`serve --push-allow`).
pub fn test_config() -> Config {
    Config {
        tick: Duration::from_millis(100),
        clock: Clock::driven(),
        push_allow: vec!["127.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()],
        ..Config::default()
    }
}

impl Harness {
    pub async fn start() -> Self {
        Self::start_with(test_config()).await
    }

    pub async fn start_with(config: Config) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let data = DataDir::new(dir.path());
        let database_url = match std::env::var("WAYMARK_TEST_BACKEND").as_deref() {
            Ok("postgres") => Some(waymark_store_postgres::testing::fresh_database().await),
            Ok("sqlite") | Err(_) => None,
            Ok(other) => panic!("unknown WAYMARK_TEST_BACKEND `{other}`"),
        };
        let store = data.open_store(database_url.as_deref()).await.unwrap();
        let server =
            waymark_server::start_with_store(&data, store, "127.0.0.1:0".parse().unwrap(), config)
                .await
                .unwrap();
        let store = server.state.store.clone();
        waymark_server::admin::add_user(&*store, "alice")
            .await
            .unwrap();
        waymark_server::admin::add_user(&*store, "bob")
            .await
            .unwrap();
        let (alice, _) =
            waymark_server::admin::create_worker_token(&*store, "alice-worker", Some("alice"))
                .await
                .unwrap();
        let (bob, _) =
            waymark_server::admin::create_worker_token(&*store, "bob-worker", Some("bob"))
                .await
                .unwrap();
        let admin = server.admin_token.clone();
        Harness {
            dir,
            database_url,
            server,
            http: reqwest::Client::new(),
            admin,
            alice,
            bob,
        }
    }

    /// Moves the server's clock forward and runs its background work (lease sweep,
    /// follow-ups, decision defaults) once on the new time, then a round of pushes.
    pub async fn advance(&self, by: Duration) {
        self.server
            .advance(by)
            .await
            .expect("the harness runs on a driven clock");
        self.server.deliver_pushes().await;
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.server.url())
    }

    pub async fn send(
        &self,
        method: reqwest::Method,
        token: &str,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut req = self.http.request(method, self.url(path)).bearer_auth(token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let res = req.send().await.unwrap();
        let status = res.status();
        let text = res.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    pub async fn post(&self, token: &str, path: &str, body: Value) -> (StatusCode, Value) {
        self.send(reqwest::Method::POST, token, path, Some(body))
            .await
    }

    pub async fn get(&self, token: &str, path: &str) -> (StatusCode, Value) {
        self.send(reqwest::Method::GET, token, path, None).await
    }

    /// The Prometheus text at `/metrics`.
    pub async fn metrics(&self) -> String {
        self.http
            .get(self.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// Returns once `/metrics` shows `name` at `value` or more: a gauge such as
    /// `waymark_decision_waits` (a long-poll is waiting) reached.
    pub async fn metric_reaches(&self, name: &str, value: f64) {
        let within = Duration::from_secs(10);
        if let Err(seen) = waymark_server::gauge_reaches(&self.url(""), name, value, within).await {
            panic!("`{name}` did not reach {value} within 10 s (last seen: {seen:?})");
        }
    }

    pub async fn create_task(&self, token: &str) -> String {
        let (s, v) = self
            .post(
                token,
                "/v1/tasks",
                json!({
                    "title": "fix the failing checkout test",
                    "goal": "tests green, staging deployed",
                    "runtime": "test",
                    "plan": [{"id": "fix", "title": "fix"}, {"id": "deploy", "title": "deploy", "depends_on": ["fix"]}],
                    "budget": {"max_tokens": 100000},
                    "materials": {"repo": "demo", "commit": "abc123"}
                }),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        v["id"].as_str().unwrap().to_owned()
    }

    /// Starts an attempt; returns (attempt id, fence).
    pub async fn attempt(&self, token: &str, task: &str, lease_seconds: u32) -> (String, i64) {
        let (s, v) = self
            .post(
                token,
                &format!("/v1/tasks/{task}/attempts"),
                json!({"worker": "w", "lease_seconds": lease_seconds}),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        (
            v["id"].as_str().unwrap().to_owned(),
            v["fence"].as_i64().unwrap(),
        )
    }

    pub async fn checkpoint(
        &self,
        token: &str,
        task: &str,
        attempt: &str,
        fence: i64,
        seq: i64,
    ) -> (StatusCode, Value) {
        self.post(
            token,
            &format!("/v1/tasks/{task}/checkpoints"),
            json!({"attempt_id": attempt, "fence": fence, "sequence": seq,
                   "body": {"reason": "step_completed", "plan_revision": 1, "summary": format!("step {seq}")}}),
        )
        .await
    }

    pub async fn detail(&self, task: &str) -> Value {
        let (s, v) = self.get(&self.admin, &format!("/v1/tasks/{task}")).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        v
    }

    pub async fn audit_codes(&self, task: &str) -> Vec<String> {
        let (s, v) = self
            .get(&self.admin, &format!("/v1/admin/audit?task={task}"))
            .await;
        assert_eq!(s, StatusCode::OK, "{v}");
        v.as_array()
            .unwrap()
            .iter()
            .map(|a| a["code"].as_str().unwrap().to_owned())
            .collect()
    }
}

impl Harness {
    /// Stops the server (as a crash would, between requests) and starts it again on the same
    /// address and database `down` later on its clock; the restarted server has run its
    /// background work once when this returns.
    pub async fn restart_after(&mut self, down: Duration) {
        let addr = self.server.addr;
        let config = (*self.server.state.config).clone();
        let data = DataDir::new(self.dir.path());
        // A stand-in keeps the harness whole while the server is down; it never ticks.
        let idle = Config {
            tick: Duration::from_secs(3600),
            ..config.clone()
        };
        let placeholder = {
            let store = data.open_store(self.database_url.as_deref()).await.unwrap();
            waymark_server::start_with_store(&data, store, "127.0.0.1:0".parse().unwrap(), idle)
                .await
                .unwrap()
        };
        let old = std::mem::replace(&mut self.server, placeholder);
        old.shutdown().await.unwrap();
        config
            .clock
            .advance(down)
            .expect("the harness runs on a driven clock");
        let store = data.open_store(self.database_url.as_deref()).await.unwrap();
        let mut tries = 0;
        let fresh = loop {
            match waymark_server::start_with_store(&data, store.clone(), addr, config.clone()).await
            {
                Ok(r) => break r,
                Err(_) if tries < 50 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("restart: {e}"),
            }
        };
        let placeholder = std::mem::replace(&mut self.server, fresh);
        placeholder.shutdown().await.unwrap();
        self.advance(Duration::ZERO).await;
    }

    /// Runs SQL behind the server's back, on whichever backend it uses.
    pub async fn raw_sql(&self, sqlite: &str, postgres: &str, bind: &str) -> u64 {
        use sqlx::Connection;
        match &self.database_url {
            None => {
                let db = self.dir.path().join("waymark.db");
                let mut c = sqlx::SqliteConnection::connect_with(
                    &sqlx::sqlite::SqliteConnectOptions::new().filename(db),
                )
                .await
                .unwrap();
                sqlx::query(sqlite)
                    .bind(bind)
                    .execute(&mut c)
                    .await
                    .unwrap()
                    .rows_affected()
            }
            Some(url) => {
                let mut c = sqlx::PgConnection::connect(url).await.unwrap();
                sqlx::query(postgres)
                    .bind(bind)
                    .execute(&mut c)
                    .await
                    .unwrap()
                    .rows_affected()
            }
        }
    }
}

pub fn assert_problem(status: StatusCode, body: &Value, want_status: u16, want_code: &str) {
    assert_eq!(status.as_u16(), want_status, "{body}");
    assert_eq!(body["code"], want_code, "{body}");
    assert_eq!(body["status"], want_status, "{body}");
    assert!(
        body["detail"].as_str().is_some_and(|d| !d.is_empty()),
        "{body}"
    );
}

/// A paired device with its private key (kept here as a real device keeps it in its keychain).
pub struct TestDevice {
    pub id: String,
    pub user: String,
    pub key: ed25519_dalek::SigningKey,
}

impl TestDevice {
    pub fn command(
        &self,
        task: &str,
        revision: Option<i64>,
        op: waymark_proto::Operation,
        args: Value,
    ) -> waymark_proto::SteerCommand {
        let now = chrono::Utc::now();
        waymark_proto::SteerCommand {
            command_id: waymark_proto::ids::command(),
            task_id: Some(task.to_owned()),
            expected_plan_revision: revision,
            operation: op,
            scope: vec![],
            args,
            issued_by: format!("user:{}", self.user),
            device_id: self.id.clone(),
            issued_at: now,
            expires_at: now + chrono::Duration::minutes(10),
        }
    }

    pub fn sign(&self, cmd: &waymark_proto::SteerCommand) -> Value {
        serde_json::to_value(waymark_proto::signing::sign(cmd, &self.key).unwrap()).unwrap()
    }
}

impl Harness {
    pub async fn pair_device(&self, user: &str, scopes: &[&str]) -> TestDevice {
        let scopes: Vec<String> = scopes.iter().map(|s| s.to_string()).collect();
        let (code, _) = waymark_server::steer::create_pairing(
            &*self.server.state.store,
            user,
            &scopes,
            600_000,
        )
        .await
        .unwrap();
        let key = ed25519_dalek::SigningKey::generate(&mut rand::rngs::OsRng);
        let (s, v) = self
            .post(
                "",
                "/v1/devices/pair",
                json!({"code": code.to_lowercase(), "name": format!("{user}'s phone"),
                   "public_key": waymark_proto::signing::public_key_b64(&key.verifying_key())}),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        assert_eq!(v["user"], user);
        TestDevice {
            id: v["id"].as_str().unwrap().to_owned(),
            user: user.to_owned(),
            key,
        }
    }

    pub async fn submit(&self, envelope: &Value) -> (StatusCode, Value) {
        self.post("", "/v1/commands", envelope.clone()).await
    }

    /// A read session token for a device (signed `open_session`).
    pub async fn session_token(&self, d: &TestDevice) -> String {
        // The device's clock agrees with the server's (driven) one.
        let now = self.server.state.now();
        let cmd = waymark_proto::SteerCommand {
            command_id: waymark_proto::ids::command(),
            task_id: None,
            expected_plan_revision: None,
            operation: waymark_proto::Operation::OpenSession,
            scope: vec![],
            args: Value::Null,
            issued_by: format!("user:{}", d.user),
            device_id: d.id.clone(),
            issued_at: now,
            expires_at: now + chrono::Duration::minutes(1),
        };
        let (s, v) = self
            .post("", &format!("/v1/devices/{}/session", d.id), d.sign(&cmd))
            .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        v["token"].as_str().unwrap().to_owned()
    }

    pub async fn revision(&self, task: &str) -> i64 {
        self.detail(task).await["task"]["plan_revision"]
            .as_i64()
            .unwrap()
    }
}
