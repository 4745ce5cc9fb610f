//! The Waymark control plane: the durable record of every agent run. [`app`] builds the axum
//! router over an [`AppState`]; [`start`] opens a data dir, binds, and runs the background
//! work (decision expiry, event retention) next to the router.

pub mod admin;
pub mod auth;
mod background;
pub mod error;
mod extract;
mod http;
mod known_tokens;
mod lanes;
mod limits;
mod listen;
mod state;
pub mod steer;
mod streams;
mod tail;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::routing::{get, patch, post};
use tokio::net::TcpListener;
use waymark_store::Store;

pub use admin::{AdminError, DataDir};
pub use clock::{Clock, NotDriven};
pub use http::openapi::{OPENAPI_PATH, openapi_file, openapi_json};
pub use metrics::Metrics;
pub use redact::{Redaction, RedactionError};
pub use state::AppState;
pub use tls::{TlsError, TlsFiles};
pub use waymark_domain::Config;
use waymark_domain::{self as domain, clock, convert, metrics};
pub use waymark_domain::{junit, redact, risk};

/// The HTTP API v1 router.
pub fn app(state: AppState) -> Router {
    use http::{
        admin, attempts, blobs, claude_code, commands, decisions, delegates, devices, effects,
        escalation, events, followups, push, rules, runner, tasks,
    };
    Router::new()
        .route("/healthz", get(http::healthz))
        .route("/metrics", get(http::metrics::render))
        .route("/v1/openapi.json", get(http::openapi::serve))
        .route("/app", get(http::webapp::redirect))
        .route("/app/", get(http::webapp::index))
        .route("/app/{*path}", get(http::webapp::asset))
        .route("/v1/tasks", post(tasks::create_task))
        .route("/v1/tasks/{task}", get(tasks::task_detail))
        .route("/v1/tasks/{task}/attempts", post(attempts::start_attempt))
        .route(
            "/v1/attempts/{attempt}/heartbeat",
            post(attempts::heartbeat),
        )
        .route("/v1/attempts/{attempt}/finish", post(attempts::finish))
        .route(
            "/v1/tasks/{task}/checkpoints",
            post(tasks::append_checkpoint),
        )
        .route("/v1/tasks/{task}/effects", post(effects::declare_effect))
        .route("/v1/effects/{effect}", patch(effects::update_effect))
        .route(
            "/v1/tasks/{task}/approvals",
            post(decisions::request_approval),
        )
        .route(
            "/v1/tasks/{task}/decisions",
            post(decisions::request_decision),
        )
        .route(
            "/v1/tasks/{task}/decisions/{decision}",
            get(decisions::get_decision),
        )
        .route(
            "/v1/tasks/{task}/decisions/{decision}/delivery",
            post(decisions::report_delivery),
        )
        .route(
            "/v1/tasks/{task}/decisions/{decision}/expire",
            post(decisions::expire_decision),
        )
        .route("/v1/tasks/{task}/artifacts", post(tasks::upload_artifact))
        .route(
            "/v1/tasks/{task}/test-receipts",
            post(tasks::submit_test_receipt),
        )
        .route("/v1/tasks/{task}/messages", post(tasks::append_messages))
        .route("/v1/tasks/{task}/usage", post(tasks::report_usage))
        .route("/v1/tasks/{task}/reconciliation", post(tasks::reconcile))
        .route("/v1/tasks/{task}/followups", post(followups::create))
        .route("/v1/followups/{followup}", get(followups::get))
        .route("/v1/attempts/{attempt}/released", post(attempts::released))
        .route(
            "/v1/attempts/{attempt}/control",
            get(attempts::control_stream),
        )
        .route("/v1/devices", get(devices::list))
        .route(
            "/v1/escalation",
            get(escalation::get_escalation)
                .put(escalation::put_escalation)
                .delete(escalation::delete_escalation),
        )
        .route("/v1/delegates", get(delegates::list_delegates))
        .route("/v1/rules", get(rules::list))
        .route(
            "/v1/delegates/{delegate}",
            axum::routing::put(delegates::add_delegate).delete(delegates::remove_delegate),
        )
        .route(
            "/v1/delegations/{owner}/accept",
            post(delegates::accept_delegation),
        )
        .route(
            "/v1/delegations/{owner}/decline",
            post(delegates::decline_delegation),
        )
        .route("/v1/devices/pair", post(devices::pair))
        .route("/v1/devices/{device}/receipts", post(devices::receipts))
        .route("/v1/devices/{device}/session", post(devices::open_session))
        .route("/v1/commands", post(commands::submit))
        .route(
            "/v1/devices/{device}/push",
            post(devices::register_push).get(devices::list_push),
        )
        .route("/v1/push/vapid", get(push::vapid))
        .route("/v1/adapters/claude-code/hook", post(claude_code::hook))
        .route("/v1/machines", get(runner::list))
        .route("/v1/runner/machine", axum::routing::put(runner::register))
        .route("/v1/runner/work", get(runner::work))
        .route("/v1/runner/work/{work}", post(runner::report))
        .route("/v1/runner/tasks/{task}/exited", post(runner::exited))
        .route("/v1/snapshot", get(events::snapshot))
        .route("/v1/events", get(events::events))
        .route("/v1/blobs/{sha256}", get(blobs::blob))
        .route(
            "/v1/admin/decisions/{decision}/resolve",
            post(admin::admin_resolve),
        )
        .route("/v1/admin/events/prune", post(admin::admin_prune))
        .route("/v1/admin/audit", get(admin::admin_audit))
        .route("/v1/admin/tasks/{task}/commands", get(admin::admin_ledger))
        .fallback(http::not_found)
        .method_not_allowed_fallback(http::method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            http::metrics::track,
        ))
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .with_state(state)
}

/// Why a server could not start. Messages say what to do.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The data dir or its database.
    #[error(transparent)]
    Admin(#[from] AdminError),
    /// The TLS certificate or key.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The address is taken.
    #[error(
        "{addr} is already in use — is another `waymark serve` running? pick another address with `--listen`"
    )]
    AddrInUse {
        /// The address.
        addr: SocketAddr,
    },
    /// Binding failed otherwise.
    #[error("cannot listen on {addr}: {reason}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        reason: String,
    },
}

/// A control plane running in this process.
pub struct Running {
    /// Where it listens.
    pub addr: SocketAddr,
    /// The admin credential.
    pub admin_token: String,
    /// Its state (store, config).
    pub state: AppState,
    /// `sha256:<hex>` of its TLS certificate, when it serves HTTPS.
    pub fingerprint: Option<String>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Running {
    /// `http://addr`, or `https://addr` with TLS.
    pub fn url(&self) -> String {
        let scheme = if self.fingerprint.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.addr)
    }

    /// Moves a driven clock (`Config::clock`) forward, then runs the background work once on
    /// the new time — lease sweep, follow-ups, escalations, decision defaults, retention — and
    /// returns when it is done; a round of push delivery is started beside it, never waited
    /// for ([`Running::deliver_pushes`] waits). What tests use instead of waiting for time to
    /// pass.
    pub async fn advance(&self, by: std::time::Duration) -> Result<(), NotDriven> {
        self.state.config.clock.advance(by)?;
        background::pass(&self.state).await;
        Ok(())
    }

    /// Runs a round of push delivery on the clock's current time (after any round already
    /// under way) and returns when every due channel has been tried.
    pub async fn deliver_pushes(&self) {
        domain::push::round(&self.state).await;
    }

    /// Stops accepting, lets open requests finish, and waits.
    pub async fn shutdown(mut self) -> std::io::Result<()> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        self.task.await.unwrap_or(Ok(()))
    }

    /// Waits until the server stops (it stops on its own only on an I/O error).
    pub async fn wait(self) -> std::io::Result<()> {
        let Running { task, shutdown, .. } = self;
        let _keep = shutdown;
        task.await.unwrap_or(Ok(()))
    }
}

/// Opens `data_dir` (SQLite), binds `addr`, and serves in the background.
pub async fn start(
    data_dir: &DataDir,
    addr: SocketAddr,
    config: Config,
) -> Result<Running, ServeError> {
    let store = data_dir.open_store(None).await?;
    start_with_store(data_dir, store, addr, config).await
}

/// Serves over a given store (e.g. PostgreSQL shared by several replicas); `data_dir` keeps
/// this replica's admin credential. With `config.tls`, serves HTTPS only.
pub async fn start_with_store(
    data_dir: &DataDir,
    store: Arc<dyn Store>,
    addr: SocketAddr,
    config: Config,
) -> Result<Running, ServeError> {
    let tls = config.tls.as_ref().map(tls::server_config).transpose()?;
    let admin_token = data_dir.bootstrap(&*store).await?;
    let listener = TcpListener::bind(addr).await.map_err(|e| match e.kind() {
        std::io::ErrorKind::AddrInUse => ServeError::AddrInUse { addr },
        _ => ServeError::Bind {
            addr,
            reason: e.to_string(),
        },
    })?;
    let addr = listener.local_addr().map_err(|e| ServeError::Bind {
        addr,
        reason: e.to_string(),
    })?;
    let header_timeout = config.header_timeout;
    let max_connections = config.max_connections.max(1);
    if max_connections <= config.max_streams {
        tracing::warn!(
            max_connections,
            max_streams = config.max_streams,
            "the connection cap is not above the stream cap: open streams alone can take every connection"
        );
    }
    let state = AppState::new(store, config);
    domain::delegations::tell_waiting(&state).await;
    background::spawn(state.clone());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let (tls, fingerprint) = match tls {
        Some((config, fp)) => (Some(config), Some(fp)),
        None => (None, None),
    };
    // People's event streams are served apart from the control path (`lanes`).
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let people = lanes::PeopleLane::start(threads).map_err(|e| ServeError::Bind {
        addr,
        reason: format!("cannot start the event streams' runtime: {e}"),
    })?;
    let serving = listen::Serving {
        router: app(state.clone()),
        tls,
        header_timeout,
        max_connections,
        metrics: state.metrics.clone(),
        people: Some(Arc::new(people)),
    };
    let stopping = state.stopping.clone();
    let task = tokio::spawn(listen::serve(listener, serving, async move {
        let _ = rx.await;
        stopping.send_replace(true);
    }));
    let running = Running {
        addr,
        admin_token,
        state,
        fingerprint,
        shutdown: Some(tx),
        task,
    };
    data_dir.record_url(&running.url(), running.fingerprint.as_deref());
    tracing::info!(%addr, tls = running.fingerprint.is_some(), dir = %data_dir.root().display(), "control plane listening");
    Ok(running)
}

/// The metrics alone, for the `/metrics` route and the request-counting middleware.
impl axum::extract::FromRef<AppState> for std::sync::Arc<Metrics> {
    fn from_ref(st: &AppState) -> Self {
        st.metrics.clone()
    }
}

/// Waits until the server at `base` (`http://host:port`) shows the gauge `name` (e.g.
/// `waymark_decision_waits`) at `at_least` or more on its `/metrics`, for at most `within`.
/// How a client or a test knows the server holds what it waits for open — a long-poll
/// waiting, an event stream, a connection — before making the change it waits for. `Err`
/// carries the last value seen (`None`: never shown, or `/metrics` not reached).
pub async fn gauge_reaches(
    base: &str,
    name: &str,
    at_least: f64,
    within: std::time::Duration,
) -> Result<(), Option<f64>> {
    let deadline = tokio::time::Instant::now() + within;
    let prefix = format!("{name} ");
    let mut seen = None;
    loop {
        if let Ok(res) = reqwest::get(format!("{base}/metrics")).await
            && let Ok(text) = res.text().await
        {
            seen = text
                .lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .and_then(|v| v.trim().parse::<f64>().ok());
            if seen.is_some_and(|v| v >= at_least) {
                return Ok(());
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(seen);
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
