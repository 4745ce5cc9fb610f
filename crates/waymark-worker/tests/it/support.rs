use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use waymark_proto::{CreateTask, PlanStep, TaskDetail};
use waymark_server::{Clock, Config, DataDir, Running};
use waymark_worker::Client;
use waymark_worker::demo::{
    AutoApprove, BudgetChoice, BudgetPlan, DemoConfig, Progress, Reporter, Scenario,
};
use waymark_worker::deploy_service::{DeployClient, DeployLog};

pub struct World {
    pub dir: tempfile::TempDir,
    pub server: Running,
    pub admin: String,
    pub token: String,
    pub client: Client,
    pub deploy_url: String,
    pub deploy_state: PathBuf,
    pub deploy: DeployClient,
    deploy_task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Drop for World {
    fn drop(&mut self) {
        self.deploy_task.abort();
    }
}

impl World {
    pub async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let server = waymark_server::start(
            &DataDir::new(dir.path().join("server")),
            "127.0.0.1:0".parse().unwrap(),
            Config {
                tick: Duration::from_millis(100),
                clock: Clock::driven(),
                ..Config::default()
            },
        )
        .await
        .unwrap();
        let (token, _) =
            waymark_server::admin::create_worker_token(&*server.state.store, "agent", None)
                .await
                .unwrap();
        let deploy_state = dir.path().join("deploys.json");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let deploy_url = format!("http://{}", listener.local_addr().unwrap());
        let deploy_task = tokio::spawn(waymark_worker::deploy_service::serve(
            listener,
            deploy_state.clone(),
        ));
        World {
            admin: server.admin_token.clone(),
            client: Client::new(&server.url(), token.clone()).unwrap(),
            deploy: DeployClient::new(&deploy_url).unwrap(),
            server,
            token,
            deploy_url,
            deploy_state,
            dir,
            deploy_task,
        }
    }

    pub fn demo_config(&self, approve: Option<AutoApprove>) -> DemoConfig {
        DemoConfig {
            server: self.server.url(),
            server_fp: None,
            token: self.token.clone(),
            admin_token: Some(self.admin.clone()),
            deploy_url: self.deploy_url.clone(),
            workdir: self.dir.path().join("work"),
            scenario: Scenario::Normal,
            approve,
            task: None,
            lease: Duration::from_secs(10),
            worker: "test-agent".into(),
        }
    }

    /// Budget decisions answered as `choice` says, or left to expire after a second.
    pub fn plan(&self, choice: Option<BudgetChoice>) -> BudgetPlan {
        BudgetPlan {
            choice,
            decision_wait: Duration::from_secs(1),
        }
    }

    pub async fn task(&self, title: &str) -> String {
        self.client
            .create_task(&CreateTask {
                title: title.into(),
                goal: String::new(),
                runtime: Some("test".into()),
                budget: Default::default(),
                plan: vec![PlanStep {
                    id: "deploy_staging".into(),
                    title: "deploy".into(),
                    depends_on: vec![],
                }],
                materials: Default::default(),
                external_key: None,
            })
            .await
            .unwrap()
            .id
    }

    pub async fn detail(&self, task: &str) -> TaskDetail {
        self.client.task(task).await.unwrap()
    }

    /// The deploy service's log as it is on disk.
    pub fn deploy_log(&self) -> DeployLog {
        DeployLog::load(&self.deploy_state).unwrap()
    }

    pub async fn blob(&self, sha: &str) -> String {
        reqwest::Client::new()
            .get(format!("{}/v1/blobs/{sha}", self.server.url()))
            .bearer_auth(&self.admin)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// Returns once `/metrics` shows `name` at `value` or more: a server gauge such as
    /// `waymark_decision_waits` (a worker's long-poll is waiting) reached.
    pub async fn metric_reaches(&self, name: &str, value: f64) {
        let within = Duration::from_secs(10);
        let url = self.server.url();
        if let Err(seen) = waymark_server::gauge_reaches(&url, name, value, within).await {
            panic!("`{name}` did not reach {value} within 10 s (last seen: {seen:?})");
        }
    }

    pub async fn admin_post(&self, path: &str, body: Value) -> (u16, Value) {
        let res = reqwest::Client::new()
            .post(format!("{}{path}", self.server.url()))
            .bearer_auth(&self.admin)
            .json(&body)
            .send()
            .await
            .unwrap();
        (res.status().as_u16(), res.json().await.unwrap_or_default())
    }
}

/// A reporter that keeps what it was told.
pub fn recorder() -> (Reporter, Arc<Mutex<Vec<Progress>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    (Arc::new(move |p| s.lock().unwrap().push(p)), seen)
}
