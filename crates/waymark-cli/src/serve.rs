//! `waymark serve`: the control plane on this machine.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;
use waymark_server::{AdminError, Config, DataDir, Redaction, ServeError, TlsFiles};

use crate::output::{CliResult, Exit, Failure, emit};

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Data dir (SQLite database, admin credential).
    #[arg(long, env = "WAYMARK_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, default_value = crate::DEFAULT_LISTEN, env = "WAYMARK_LISTEN")]
    listen: SocketAddr,
    /// Database URL (`postgres://…` for replicas; SQLite in the data dir by default).
    #[arg(long, env = "WAYMARK_DATABASE_URL")]
    database_url: Option<String>,
    /// How many events the log keeps before older cursors get `410 cursor_expired`.
    #[arg(long, default_value_t = Config::default().event_retention)]
    event_retention: i64,
    /// Keep secrets found in messages and checkpoints instead of redacting them.
    #[arg(long, conflicts_with_all = ["redact", "no_redact_kind"])]
    no_redact: bool,
    /// Also redact what this regular expression matches, shown as `[REDACTED:KIND]`
    /// (repeatable), e.g. `--redact 'ticket=TICKET-[0-9]+'`.
    #[arg(long, value_name = "KIND=REGEX", value_parser = kind_and_pattern)]
    redact: Vec<(String, String)>,
    /// Stop redacting one built-in kind (repeatable): private-key, aws-access-key,
    /// github-token, slack-token, api-key, waymark-token, bearer-token, secret.
    #[arg(long, value_name = "KIND")]
    no_redact_kind: Vec<String>,
    /// Requests per second allowed to each worker token and device (bursts of twice that).
    #[arg(long, default_value_t = Config::default().rate_per_second)]
    rate_limit: u32,
    /// Requests per second allowed to one client address on the routes open to callers not
    /// yet known — pairing, opening a session, signed commands (bursts of five times that).
    /// Behind a reverse proxy every client shares the proxy's address: raise it there.
    #[arg(long, default_value_t = Config::default().address_rate_per_second)]
    address_rate_limit: u32,
    /// Let push endpoints be in this network besides the public internet (repeatable), e.g. a
    /// self-hosted ntfy on the LAN: `--push-allow 192.168.1.20` or `--push-allow 10.0.0.0/8`.
    /// Every other address that is not public is refused, also when a name resolves to it.
    #[arg(long, value_name = "CIDR", value_parser = push_net)]
    push_allow: Vec<ipnet::IpNet>,
    /// Make an approval risky when a string of its intent matches this regular expression
    /// (case-insensitive; repeatable), besides the built-in patterns (`rm -rf`, `git push
    /// --force`, `DROP TABLE`, `curl … | sh`, `sudo`, `terraform apply`, `cargo publish`, …).
    /// A risky approval needs a second confirmation, escalates through quiet hours and never
    /// defaults to approve, whatever its agent says.
    #[arg(long, value_name = "REGEX")]
    risky: Vec<String>,
    /// How long audit entries are kept, e.g. `90d`.
    #[arg(long, default_value = "90d", value_parser = humantime::parse_duration)]
    audit_retention: std::time::Duration,
    /// How many audit entries are kept at most (the newest).
    #[arg(long, default_value_t = Config::default().audit_max_entries)]
    audit_max_entries: i64,
    /// Serve HTTPS with this certificate chain (PEM, leaf first); pairing links then pin it.
    #[arg(long, requires = "tls_key", env = "WAYMARK_TLS_CERT")]
    tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, requires = "tls_cert", env = "WAYMARK_TLS_KEY")]
    tls_key: Option<PathBuf>,
    /// How long a client may take over the TLS handshake and each request's headers (also how
    /// long an idle connection stays open), e.g. `20s`.
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    header_timeout: std::time::Duration,
    /// How long a client may take to send a request body, e.g. `2m`.
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    body_timeout: std::time::Duration,
    /// Open event and control streams allowed to each worker token and device.
    #[arg(long, default_value_t = Config::default().max_streams_per_credential)]
    max_streams_per_credential: usize,
    /// Open event and control streams allowed in all.
    #[arg(long, default_value_t = Config::default().max_streams)]
    max_streams: usize,
    /// Open client connections allowed at once; beyond, a new one is refused at once (plain
    /// HTTP: `503` with `Retry-After`; HTTPS: closed before the handshake) while open ones are
    /// served. Keep it above `--max-streams` and below the open-file limit (`ulimit -n`).
    #[arg(long, default_value_t = Config::default().max_connections)]
    max_connections: usize,
}

fn push_net(s: &str) -> Result<ipnet::IpNet, String> {
    s.parse::<ipnet::IpNet>()
        .or_else(|_| s.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
        .map_err(|_| format!("`{s}` is not an address or a network (`192.168.1.20`, `10.0.0.0/8`)"))
}

fn kind_and_pattern(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((kind, pattern)) if !kind.is_empty() && !pattern.is_empty() => {
            Ok((kind.to_owned(), pattern.to_owned()))
        }
        _ => Err("expected KIND=REGEX, e.g. 'ticket=TICKET-[0-9]+'".to_owned()),
    }
}

pub(crate) fn serve_failure(e: ServeError) -> Failure {
    match e {
        ServeError::AddrInUse { .. } => Failure::new(Exit::Refused, "addr_in_use", e.to_string()),
        ServeError::Bind { .. } => Failure::new(Exit::Refused, "bind_failed", e.to_string()),
        ServeError::Admin(a) => admin_failure(a),
        ServeError::Tls(t) => tls_failure(t),
    }
}

pub(crate) fn tls_failure(e: waymark_server::TlsError) -> Failure {
    Failure::new(Exit::Usage, "tls", e.to_string())
}

pub(crate) fn admin_failure(e: AdminError) -> Failure {
    let code = match &e {
        AdminError::DataDir { .. } => "data_dir",
        AdminError::UnknownUser(_) => "unknown_user",
        AdminError::UserExists(_) => "user_exists",
        AdminError::InvalidName(_) => "invalid_name",
        AdminError::DatabaseUrl(_) | AdminError::NoPostgres => "unsupported_database",
        AdminError::InvalidScope(_) => "invalid_scope",
        AdminError::UnknownDevice(_) => "unknown_device",
        AdminError::UnknownToken(_) => "unknown_token",
        AdminError::Store(waymark_store::StoreError::NewerSchema { .. }) => "newer_schema",
        AdminError::Store(_) => "storage",
    };
    let exit = match &e {
        AdminError::InvalidName(_)
        | AdminError::InvalidScope(_)
        | AdminError::DatabaseUrl(_)
        | AdminError::NoPostgres => Exit::Usage,
        _ => Exit::Refused,
    };
    Failure::new(exit, code, e.to_string())
}

pub(crate) async fn run(args: ServeArgs, json: bool) -> CliResult {
    // Settings first: a bad one creates nothing.
    let redaction = if args.no_redact {
        Redaction::off()
    } else {
        Redaction::new(&args.no_redact_kind, &args.redact)
            .map_err(|e| Failure::new(Exit::Usage, "invalid_redaction", e.to_string()))?
    };
    let risk = waymark_server::risk::RiskPolicy::with(args.risky)
        .map_err(|e| Failure::new(Exit::Usage, "bad_risky", format!("--risky: {e}")))?;
    let dir = DataDir::new(args.data_dir.unwrap_or_else(crate::default_data_dir));
    let store = dir
        .open_store(args.database_url.as_deref())
        .await
        .map_err(admin_failure)?;
    let config = Config {
        event_retention: args.event_retention.max(1),
        redaction,
        rate_per_second: args.rate_limit.max(1),
        rate_burst: args.rate_limit.max(1).saturating_mul(2),
        address_rate_per_second: args.address_rate_limit.max(1),
        address_rate_burst: args.address_rate_limit.max(1).saturating_mul(5),
        audit_retention: args.audit_retention,
        push_allow: args.push_allow,
        risk,
        audit_max_entries: args.audit_max_entries.max(1),
        tls: match (args.tls_cert, args.tls_key) {
            (Some(cert), Some(key)) => Some(TlsFiles { cert, key }),
            _ => None,
        },
        header_timeout: args
            .header_timeout
            .max(std::time::Duration::from_millis(100)),
        body_timeout: args.body_timeout.max(std::time::Duration::from_millis(100)),
        max_streams_per_credential: args.max_streams_per_credential.max(1),
        max_streams: args.max_streams.max(1),
        max_connections: args.max_connections.max(1),
        ..Config::default()
    };
    let running = waymark_server::start_with_store(&dir, store, args.listen, config)
        .await
        .map_err(serve_failure)?;
    let url = running.url();
    emit(
        json,
        &serde_json::json!({"listening": url, "data_dir": dir.root(), "admin_token_file": dir.admin_token_file(), "tls_fingerprint": running.fingerprint}),
        || {
            let tls = running
                .fingerprint
                .as_deref()
                .map(|fp| format!("\n  TLS:         {fp} (pairing links pin it)"))
                .unwrap_or_default();
            format!(
                "waymark control plane listening on {url}\n  data dir:    {}\n  admin token: {}\n  API:         {url}/v1/openapi.json{tls}",
                dir.root().display(),
                dir.admin_token_file().display()
            )
        },
    );
    shutdown_signal().await;
    eprintln!("shutting down");
    running.shutdown().await.map_err(|e| {
        Failure::new(
            Exit::Refused,
            "shutdown",
            format!("the server stopped with an error: {e}"),
        )
    })
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing a SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
