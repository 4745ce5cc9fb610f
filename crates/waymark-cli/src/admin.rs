//! `waymark admin …`: acts on the server's data dir directly, so only whoever runs the host
//! administers it.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use waymark_server::DataDir;
use waymark_server::admin as ops;

use crate::output::{CliResult, emit};
use crate::serve::admin_failure;

#[derive(Debug, Args)]
pub(crate) struct AdminArgs {
    /// The server's data dir.
    #[arg(long, global = true, env = "WAYMARK_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// The server's database, when it runs on PostgreSQL (`postgres://…`).
    #[arg(long, global = true, env = "WAYMARK_DATABASE_URL")]
    database_url: Option<String>,
    #[command(subcommand)]
    command: AdminCommand,
}

#[derive(Debug, Subcommand)]
enum AdminCommand {
    /// Users, who own tasks.
    #[command(subcommand)]
    User(UserCommand),
    /// A one-time pairing code for a device of `--user`: code, `waymark://` link and QR code.
    Pair {
        /// The user the device will act for.
        #[arg(long)]
        user: String,
        /// What the device may do: `view`, `steer`, `approve` (comma-separated).
        #[arg(long, value_delimiter = ',', default_value = "view,steer,approve")]
        scopes: Vec<String>,
        /// How long the code is valid, e.g. `10m`, `1h`.
        #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
        ttl: std::time::Duration,
        /// The server URL the device should use (default: where `waymark serve` listens).
        #[arg(long)]
        server: Option<String>,
        /// The server's TLS certificate (PEM), whose fingerprint the link carries (default: the
        /// one `waymark serve --tls-cert` recorded in the data dir).
        #[arg(long, conflicts_with = "no_pin")]
        tls_cert: Option<PathBuf>,
        /// Leave the fingerprint out: the device then checks the certificate against the public
        /// CAs (for a CA-issued certificate, which is renewed).
        #[arg(long)]
        no_pin: bool,
    },
    /// Paired devices.
    #[command(subcommand)]
    Device(DeviceCommand),
    /// Worker and admin tokens: list, revoke, rotate this data dir's admin token.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Print a new worker token; tasks created with it belong to `--user`.
    WorkerToken {
        /// The worker's name (for audit).
        #[arg(long)]
        name: String,
        /// The user its tasks belong to (default: `admin`).
        #[arg(long)]
        user: Option<String>,
    },
    /// Print a new token for the runner of machine `--machine` (added when new): `waymark
    /// runner` on that machine starts, revives and resumes `--user`'s runs there, and reaches
    /// nothing else.
    RunnerToken {
        /// The machine's name (`laptop`).
        #[arg(long)]
        machine: String,
        /// The user whose runs it starts (default: `admin`).
        #[arg(long)]
        user: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
enum DeviceCommand {
    /// List devices.
    List,
    /// Revoke a device: its sessions and commands are refused from now on.
    Revoke {
        /// The device id (`dev_…`).
        device: String,
    },
}

#[derive(Debug, Subcommand)]
enum TokenCommand {
    /// List tokens (never their secrets).
    List,
    /// Revoke a token by its id (`tok_…`) or its name: refused on every replica once this
    /// returns.
    Revoke {
        /// The token's id, or the name of the one live token that has it.
        token: String,
    },
    /// A new admin token in `admin.token`; the one it held is revoked.
    Rotate,
}

#[derive(Debug, Subcommand)]
enum UserCommand {
    /// Add a user.
    Add {
        /// Name: letters, digits, `-`, `_`, `.`.
        name: String,
    },
    /// List users.
    List,
}

pub(crate) async fn run(args: AdminArgs, json: bool) -> CliResult {
    let dir = DataDir::new(args.data_dir.unwrap_or_else(crate::default_data_dir));
    let store = dir
        .open_store(args.database_url.as_deref())
        .await
        .map_err(admin_failure)?;
    let store = &*store;
    dir.bootstrap(store).await.map_err(admin_failure)?;
    match args.command {
        AdminCommand::User(UserCommand::Add { name }) => {
            let u = ops::add_user(store, &name).await.map_err(admin_failure)?;
            emit(
                json,
                &serde_json::json!({"id": u.id, "name": u.name}),
                || format!("added user `{}`", u.name),
            );
        }
        AdminCommand::User(UserCommand::List) => {
            let users = ops::list_users(store).await.map_err(admin_failure)?;
            let v: Vec<_> = users
                .iter()
                .map(|u| serde_json::json!({"id": u.id, "name": u.name}))
                .collect();
            emit(json, &serde_json::Value::Array(v), || {
                users
                    .iter()
                    .map(|u| u.name.as_str())
                    .collect::<Vec<_>>()
                    .join("\n")
            });
        }
        AdminCommand::Pair {
            user,
            scopes,
            ttl,
            server,
            tls_cert,
            no_pin,
        } => {
            let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
            if ttl_ms < 1000 {
                return Err(crate::output::Failure::new(
                    crate::output::Exit::Usage,
                    "bad_ttl",
                    "`--ttl` must be at least 1s",
                ));
            }
            let (code, expires) =
                waymark_server::steer::create_pairing(store, &user, &scopes, ttl_ms)
                    .await
                    .map_err(admin_failure)?;
            let server = server
                .or_else(|| dir.recorded_url())
                .unwrap_or_else(|| crate::DEFAULT_SERVER.into());
            let fingerprint = match tls_cert {
                _ if no_pin => None,
                Some(path) => Some(
                    waymark_server::tls::cert_fingerprint(&path)
                        .map_err(crate::serve::tls_failure)?,
                ),
                None => dir.recorded_fingerprint(),
            };
            // A pin means something only over TLS.
            let fingerprint = fingerprint.filter(|_| server.starts_with("https://"));
            let link = pairing_link(&server, &code, fingerprint.as_deref());
            let web = web_link(&server, &code);
            let expires = rfc3339(expires);
            emit(
                json,
                &serde_json::json!({"code": code, "link": link, "web_link": web, "server": server, "fingerprint": fingerprint, "user": user, "scopes": scopes, "expires_at": expires}),
                || {
                    // A phone's camera opens web addresses: the QR code is the web companion's.
                    let qr = qrcode::QrCode::new(web.as_bytes())
                        .map(|q| {
                            q.render::<qrcode::render::unicode::Dense1x2>()
                                .quiet_zone(true)
                                .build()
                        })
                        .unwrap_or_default();
                    let pins = fingerprint
                        .as_deref()
                        .map(|fp| format!("\n  pins:    {fp} (the server's TLS certificate)"))
                        .unwrap_or_default();
                    // A browser trusts only certificates a public CA (or the phone) vouches for,
                    // and makes device keys only on https:// or localhost.
                    let phone = if fingerprint.is_some() {
                        "\n  phone:   the browser will not trust this server's own certificate; put a reverse proxy or tunnel with a public certificate in front (docs/phone.md)"
                    } else if !server.starts_with("https://") && !is_loopback(&server) {
                        "\n  phone:   a phone's browser pairs only over https:// (docs/phone.md)"
                    } else {
                        ""
                    };
                    format!(
                        "{qr}\npairing code for `{user}` ({}): {code}\n  link:    {link}{pins}\n  phone:   {web}{phone}\n  expires: {expires} (single use)\n\non a computer: waymark pair '{link}' · on a phone: scan the code above",
                        scopes.join(",")
                    )
                },
            );
        }
        AdminCommand::Device(DeviceCommand::List) => {
            let devices = waymark_server::steer::list_devices(store)
                .await
                .map_err(admin_failure)?;
            emit(
                json,
                &serde_json::to_value(&devices).unwrap_or_default(),
                || {
                    if devices.is_empty() {
                        return "no devices — pair one with `waymark admin pair --user NAME`"
                            .into();
                    }
                    devices
                        .iter()
                        .map(|d| {
                            let state = if d.revoked_at.is_some() {
                                "revoked"
                            } else {
                                "active"
                            };
                            format!(
                                "{}  {:<8} {:<10} {:<20} {}",
                                d.id,
                                state,
                                d.user,
                                d.name,
                                d.scopes.join(",")
                            )
                        })
                        .collect::<Vec<_>>()
                        .join("\n")
                },
            );
        }
        AdminCommand::Device(DeviceCommand::Revoke { device }) => {
            let d = waymark_server::steer::revoke_device(store, &device)
                .await
                .map_err(admin_failure)?;
            emit(json, &serde_json::to_value(&d).unwrap_or_default(), || {
                format!(
                    "revoked `{}` ({}): its sessions and commands are refused from now on",
                    d.id, d.name
                )
            });
        }
        AdminCommand::Token(TokenCommand::List) => {
            let tokens = ops::list_tokens(store).await.map_err(admin_failure)?;
            let v: Vec<_> = tokens
                .iter()
                .map(|t| {
                    serde_json::json!({"id": t.id, "kind": t.kind.as_str(), "name": t.name,
                        "created_at": t.created_at, "revoked_at": t.revoked_at})
                })
                .collect();
            emit(json, &serde_json::Value::Array(v), || {
                tokens
                    .iter()
                    .map(|t| {
                        let state = if t.revoked_at.is_some() {
                            "revoked"
                        } else {
                            "active"
                        };
                        format!("{}  {:<8} {:<7} {}", t.id, state, t.kind.as_str(), t.name)
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
            });
        }
        AdminCommand::Token(TokenCommand::Revoke { token }) => {
            let t = ops::revoke_token(store, &token)
                .await
                .map_err(admin_failure)?;
            until_every_replica_refuses_it().await;
            emit(
                json,
                &serde_json::json!({"id": t.id, "kind": t.kind.as_str(), "name": t.name, "revoked_at": t.revoked_at}),
                || {
                    format!(
                        "revoked `{}` ({}): refused on every replica from now on",
                        t.id, t.name
                    )
                },
            );
        }
        AdminCommand::Token(TokenCommand::Rotate) => {
            let token = dir.rotate_admin_token(store).await.map_err(admin_failure)?;
            until_every_replica_refuses_it().await;
            emit(
                json,
                &serde_json::json!({"token": token, "file": dir.admin_token_file()}),
                || {
                    format!(
                        "a new admin token is in {}; the old one is refused from now on",
                        dir.admin_token_file().display()
                    )
                },
            );
        }
        AdminCommand::WorkerToken { name, user } => {
            let (token, user) = ops::create_worker_token(store, &name, user.as_deref())
                .await
                .map_err(admin_failure)?;
            emit(
                json,
                &serde_json::json!({"token": token, "name": name, "user": user.name}),
                || token.clone(),
            );
        }
        AdminCommand::RunnerToken { machine, user } => {
            let (token, m, user) = ops::create_runner_token(store, &machine, user.as_deref())
                .await
                .map_err(admin_failure)?;
            emit(
                json,
                &serde_json::json!({"token": token, "machine": m.name, "machine_id": m.id, "user": user.name}),
                || token.clone(),
            );
        }
    }
    Ok(())
}

/// `waymark://pair?server=…&code=…`, with `&fp=sha256:<hex>` when the server's certificate is
/// pinned.
/// The web companion's pairing page on `server` (`/app/`, the code in the fragment, so it is
/// never sent to the server in a request line or logged).
fn web_link(server: &str, code: &str) -> String {
    format!("{}/app/#/pair?code={code}", server.trim_end_matches('/'))
}

fn is_loopback(server: &str) -> bool {
    url::Url::parse(server).is_ok_and(|u| match u.host() {
        Some(url::Host::Domain(d)) => d == "localhost",
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    })
}

fn pairing_link(server: &str, code: &str, fingerprint: Option<&str>) -> String {
    let enc = |s: &str| -> String {
        s.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect()
    };
    let fp = fingerprint
        .map(|fp| format!("&fp={}", enc(fp).replace("%3A", ":")))
        .unwrap_or_default();
    format!(
        "waymark://pair?server={}&code={}{fp}",
        enc(server),
        enc(code)
    )
}

fn rfc3339(ms: i64) -> String {
    chrono::DateTime::<chrono::Utc>::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_default()
}

/// Waits out the time a replica trusts a token it read: once it has passed, every replica
/// refuses a token revoked before it (what `token revoke` and `token rotate` promise).
async fn until_every_replica_refuses_it() {
    let trusted = u64::try_from(waymark_server::auth::TOKEN_CACHE_MS).unwrap_or(0);
    tokio::time::sleep(std::time::Duration::from_millis(trusted)).await;
}
