//! Embedded mode: a solo user needs no server. The app starts the real control plane
//! (`waymark_server::start`, SQLite in the app's data dir) on a loopback port — the one it
//! used last time when free, so the pairing stays valid — and pairs itself as a local device
//! through the same path a phone takes (a one-time code, a key in the OS keychain, signed
//! commands). With `--demo` it runs the demo agent against it; the agent then waits for the
//! person, exactly as it would against a remote server.
//!
//! The demo's deploy service runs in this process too. `waymark demo` runs it as a separate
//! process because a write gateway that dies with its caller proves nothing about crashes;
//! here it only has to deploy, and the crash scenarios stay with the CLI.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use waymark_server::{Config, DataDir};
use waymark_worker::demo::{self, DemoConfig, Progress, Scenario};

use crate::error::AppError;

/// The control plane running in this process.
pub struct Embedded {
    running: waymark_server::Running,
    dir: PathBuf,
}

impl Embedded {
    /// Its URL.
    pub fn url(&self) -> String {
        self.running.url()
    }

    /// Its devices (the device list of the Pairing screen).
    pub async fn devices(&self) -> Result<Vec<waymark_proto::Device>, AppError> {
        waymark_server::steer::list_devices(&*self.running.state.store)
            .await
            .map_err(|e| AppError::new("embedded", e.to_string()))
    }
}

fn embedded_err(what: &str) -> impl Fn(String) -> AppError + '_ {
    move |e| AppError::new("embedded", format!("{what}: {e}"))
}

/// Starts the control plane in `dir` and makes sure this app is paired with it.
pub async fn start(
    c: &waymark_companion::Companion,
    slot: &tokio::sync::Mutex<Option<Embedded>>,
    dir: &Path,
) -> Result<String, AppError> {
    let data = DataDir::new(dir);
    let any: SocketAddr = "127.0.0.1:0".parse().expect("an address");
    let last = data
        .recorded_url()
        .and_then(|u| u.strip_prefix("http://").and_then(|a| a.parse().ok()));
    let running = match last {
        Some(addr) => match waymark_server::start(&data, addr, Config::default()).await {
            Ok(r) => r,
            Err(e) => {
                tracing::info!(%addr, error = %e, "the last address is taken; using a new port");
                waymark_server::start(&data, any, Config::default())
                    .await
                    .map_err(|e| {
                        embedded_err("cannot start the embedded control plane")(e.to_string())
                    })?
            }
        },
        None => waymark_server::start(&data, any, Config::default())
            .await
            .map_err(|e| embedded_err("cannot start the embedded control plane")(e.to_string()))?,
    };
    let url = running.url();
    let before = c.identity().await?;
    let paired_here = match &before {
        Some(id) if id.server == url => c.keystore().and_then(|k| k.load(&id.device_id)).is_ok(),
        _ => false,
    };
    if !paired_here {
        let scopes = ["view", "steer", "approve"].map(String::from);
        let (code, _) = waymark_server::steer::create_pairing(
            &*running.state.store,
            waymark_server::admin::DEFAULT_USER,
            &scopes,
            10 * 60_000,
        )
        .await
        .map_err(|e| embedded_err("cannot create a pairing code")(e.to_string()))?;
        c.pair(&url, &code, "this computer (embedded)").await?;
        if before.is_some_and(|b| b.server != url) {
            // The mirror held another server's threads (or this one's at an old port, which
            // a fresh read also fixes).
            c.mirror().replace_all(0, &[]).await?;
        }
    }
    *slot.lock().await = Some(Embedded {
        running,
        dir: dir.to_path_buf(),
    });
    Ok(url)
}

/// Runs the demo agent against the embedded control plane; progress goes to `say`.
pub async fn run_demo(
    slot: &tokio::sync::Mutex<Option<Embedded>>,
    say: Arc<dyn Fn(String) + Send + Sync>,
) -> Result<(), AppError> {
    let (url, store, dir) = {
        let guard = slot.lock().await;
        let e = guard.as_ref().ok_or_else(|| {
            AppError::new(
                "embedded",
                "the demo agent runs against the embedded control plane — start the app without `--remote`",
            )
        })?;
        (e.url(), e.running.state.store.clone(), e.dir.clone())
    };
    let (token, _) = waymark_server::admin::create_worker_token(&*store, "demo-agent", None)
        .await
        .map_err(|e| embedded_err("cannot create a worker token")(e.to_string()))?;
    let workdir = dir
        .parent()
        .unwrap_or(&dir)
        .join("demo")
        .join(chrono::Utc::now().format("%Y%m%dT%H%M%S%.3f").to_string());
    std::fs::create_dir_all(&workdir)
        .map_err(|e| embedded_err("cannot create the demo workdir")(e.to_string()))?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| embedded_err("cannot start the deploy service")(e.to_string()))?;
    let deploy_url = format!(
        "http://{}",
        listener
            .local_addr()
            .map_err(|e| embedded_err("deploy service")(e.to_string()))?
    );
    let state = workdir.join("deploys.json");
    let deploy = tokio::spawn(waymark_worker::deploy_service::serve(listener, state));
    let reporter_say = say.clone();
    let reporter: demo::Reporter = Arc::new(move |p: Progress| {
        reporter_say(format!("{}: {}", p.step, p.text));
    });
    let cfg = DemoConfig {
        server: url,
        server_fp: None,
        token,
        admin_token: None,
        deploy_url,
        workdir,
        scenario: Scenario::Normal,
        approve: None,
        task: None,
        lease: Duration::from_secs(15),
        worker: format!("demo@waymark-app-{}", std::process::id()),
    };
    let result = demo::run(cfg, reporter).await;
    deploy.abort();
    match result {
        Ok(s) => {
            say(format!("finished {}: {}", s.outcome, s.summary));
            Ok(())
        }
        Err(e) => {
            say(format!("stopped: {e}"));
            Err(AppError::new("demo", e.to_string()))
        }
    }
}
