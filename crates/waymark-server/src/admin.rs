//! Host administration on the data dir: opening it, the first-start admin credential, users
//! and worker tokens. The `waymark admin` commands run these against the same files the
//! server uses, so only whoever runs the host administers it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use waymark_proto::Device;
use waymark_proto::ids;
use waymark_store::{MachineRow, PairingRow, Store, StoreError, TokenKind, TokenRow, UserRow};
use waymark_store_sqlite::SqliteStore;

use crate::clock::Clock;
use crate::convert;
use crate::domain::caller::{CallerKind, new_secret, secret_hash};

/// The user that owns what the admin creates, and worker tokens given no `--user`.
pub const DEFAULT_USER: &str = "admin";

/// Why an admin operation failed. Messages say what to do.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The data dir cannot be created or written.
    #[error("cannot write to the data dir {path}: {reason} — choose another with `--data-dir`")]
    DataDir {
        /// Where.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// No such user.
    #[error("no user `{0}` — add one with `waymark admin user add {0}`")]
    UnknownUser(String),
    /// The name is taken.
    #[error("a user named `{0}` already exists")]
    UserExists(String),
    /// A database URL this build cannot use.
    #[error(
        "unsupported database URL `{0}`: use `postgres://…`, or SQLite in `--data-dir` by leaving it out"
    )]
    DatabaseUrl(String),
    /// A PostgreSQL URL given to a build without the `postgres` feature (the app).
    #[error(
        "this build has no PostgreSQL support (the app embeds its control plane on SQLite): run `waymark serve --database-url …` for a shared database"
    )]
    NoPostgres,
    /// A name that cannot be used.
    #[error("invalid name `{0}`: use 1–64 letters, digits, `-`, `_` or `.`")]
    InvalidName(String),
    /// Not a scope.
    #[error("unknown scope `{0}`: use `view`, `steer` and `approve`")]
    InvalidScope(String),
    /// No such device.
    #[error("no device `{0}` — list them with `waymark admin device list`")]
    UnknownDevice(String),
    /// No such token, or a name several tokens share.
    #[error("{0} — list them with `waymark admin token list`")]
    UnknownToken(String),
    /// Storage.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The files of a data dir.
#[derive(Debug, Clone)]
pub struct DataDir {
    root: PathBuf,
}

impl DataDir {
    /// A data dir at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        DataDir { root: root.into() }
    }

    /// Its root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The SQLite database.
    pub fn database(&self) -> PathBuf {
        self.root.join("waymark.db")
    }

    /// The admin credential, readable only by its owner.
    pub fn admin_token_file(&self) -> PathBuf {
        self.root.join("admin.token")
    }

    /// Where the running server said it listens (for pairing links).
    pub fn server_url_file(&self) -> PathBuf {
        self.root.join("server.url")
    }

    /// Where the running server keeps its TLS certificate's fingerprint (for pairing links).
    pub fn fingerprint_file(&self) -> PathBuf {
        self.root.join("server.fingerprint")
    }

    /// Records the URL the server listens on and, with TLS, its certificate's fingerprint;
    /// pairing links default to them.
    pub fn record_url(&self, url: &str, fingerprint: Option<&str>) {
        if let Err(e) = std::fs::write(self.server_url_file(), format!("{url}\n")) {
            tracing::warn!(error = %e, "could not record the server URL in the data dir");
        }
        let written = match fingerprint {
            Some(fp) => std::fs::write(self.fingerprint_file(), format!("{fp}\n")),
            None => match std::fs::remove_file(self.fingerprint_file()) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                other => other,
            },
        };
        if let Err(e) = written {
            tracing::warn!(error = %e, "could not record the TLS fingerprint in the data dir");
        }
    }

    /// The fingerprint of the certificate the server last said it serves, if it serves TLS.
    pub fn recorded_fingerprint(&self) -> Option<String> {
        std::fs::read_to_string(self.fingerprint_file())
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
    }

    /// The URL the server last said it listens on.
    pub fn recorded_url(&self) -> Option<String> {
        std::fs::read_to_string(self.server_url_file())
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
    }

    /// Creates the dir if needed (its owner's only), checks it is writable, and opens
    /// (migrating) the store, whose files only their owner may read.
    pub async fn open(&self) -> Result<SqliteStore, AdminError> {
        let fail = |e: std::io::Error| AdminError::DataDir {
            path: self.root.clone(),
            reason: e.to_string(),
        };
        self.create_private().map_err(fail)?;
        let probe = self.root.join(".write-probe");
        std::fs::write(&probe, b"").map_err(fail)?;
        let _ = std::fs::remove_file(&probe);
        private_database(&self.database()).map_err(fail)?;
        Ok(SqliteStore::open(&self.database()).await?)
    }

    /// Creates the dir if needed and makes it its owner's only (0700): it holds the database
    /// (transcripts, the VAPID key, token hashes) and the admin credential. A dir that other
    /// users could enter is tightened, with a note.
    fn create_private(&self) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.root)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&self.root)?.permissions().mode();
            if mode & 0o077 != 0 {
                std::fs::set_permissions(&self.root, std::fs::Permissions::from_mode(0o700))?;
                tracing::info!(dir = %self.root.display(), was = format!("{:o}", mode & 0o777),
                    "made the data dir readable by its owner only (0700)");
            }
        }
        Ok(())
    }

    /// Opens the store: SQLite in this dir, or PostgreSQL at `database_url` (replicas share
    /// one database; each keeps its own data dir for its admin credential).
    pub async fn open_store(
        &self,
        database_url: Option<&str>,
    ) -> Result<Arc<dyn Store>, AdminError> {
        match database_url {
            None => Ok(Arc::new(self.open().await?)),
            #[cfg(feature = "postgres")]
            Some(url) if is_postgres(url) => {
                let fail = |e: std::io::Error| AdminError::DataDir {
                    path: self.root.clone(),
                    reason: e.to_string(),
                };
                self.create_private().map_err(fail)?;
                Ok(Arc::new(
                    waymark_store_postgres::PgStore::connect(url).await?,
                ))
            }
            #[cfg(not(feature = "postgres"))]
            Some(url) if is_postgres(url) => Err(AdminError::NoPostgres),
            Some(other) => Err(AdminError::DatabaseUrl(redact(other))),
        }
    }

    /// Makes sure the default user and an admin credential exist, and returns the
    /// credential. On first start it is created and written to `admin.token` (0600).
    pub async fn bootstrap(&self, store: &dyn Store) -> Result<String, AdminError> {
        let path = self.admin_token_file();
        if let Ok(existing) = std::fs::read_to_string(&path) {
            let existing = existing.trim().to_owned();
            let mut tx = store.read().await?;
            if tx
                .token_by_hash(&secret_hash(&existing))
                .await?
                .is_some_and(|t| t.revoked_at.is_none())
            {
                return Ok(existing);
            }
        }
        let user = ensure_user(store, DEFAULT_USER).await?;
        let secret = new_secret(CallerKind::Admin);
        let mut tx = store.write().await?;
        tx.insert_token(&TokenRow {
            id: ids::token(),
            kind: TokenKind::Admin,
            name: "admin".into(),
            user_id: user.id,
            secret_hash: secret_hash(&secret),
            created_at: Clock::system().now_ms(),
            revoked_at: None,
            machine_id: None,
        })
        .await?;
        write_private(&path, &format!("{secret}\n")).map_err(|e| AdminError::DataDir {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        tx.commit().await?;
        Ok(secret)
    }
}

fn write_private(path: &Path, contents: &str) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(&tmp)?;
    f.write_all(contents.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

fn check_name(name: &str) -> Result<(), AdminError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(AdminError::InvalidName(name.to_owned()))
    }
}

async fn ensure_user(store: &dyn Store, name: &str) -> Result<UserRow, AdminError> {
    let mut tx = store.write().await?;
    if let Some(u) = tx.user_by_name(name).await? {
        return Ok(u);
    }
    let user = UserRow {
        id: ids::user(),
        name: name.to_owned(),
        created_at: Clock::system().now_ms(),
    };
    tx.insert_user(&user).await?;
    tx.commit().await?;
    Ok(user)
}

/// `waymark admin user add NAME`.
pub async fn add_user(store: &dyn Store, name: &str) -> Result<UserRow, AdminError> {
    check_name(name)?;
    let mut tx = store.write().await?;
    if tx.user_by_name(name).await?.is_some() {
        return Err(AdminError::UserExists(name.to_owned()));
    }
    let user = UserRow {
        id: ids::user(),
        name: name.to_owned(),
        created_at: Clock::system().now_ms(),
    };
    tx.insert_user(&user).await?;
    tx.commit().await?;
    Ok(user)
}

/// `waymark admin user list`.
pub async fn list_users(store: &dyn Store) -> Result<Vec<UserRow>, AdminError> {
    Ok(store.read().await?.list_users().await?)
}

/// A new worker token; tasks it creates belong to `user` (the default user when `None`).
pub async fn create_worker_token(
    store: &dyn Store,
    name: &str,
    user: Option<&str>,
) -> Result<(String, UserRow), AdminError> {
    check_name(name)?;
    let user = token_user(store, user).await?;
    let secret = insert_worker_token(store, name, &user, None).await?;
    Ok((secret, user))
}

/// `waymark admin runner-token`: a token for the runner of the machine `machine` of `user`
/// (the machine is added when it is new). It reaches only that machine's tasks and work; a
/// new token for a machine leaves its older ones alone (revoke them by id).
pub async fn create_runner_token(
    store: &dyn Store,
    machine: &str,
    user: Option<&str>,
) -> Result<(String, MachineRow, UserRow), AdminError> {
    check_name(machine)?;
    let user = token_user(store, user).await?;
    let mut tx = store.write().await?;
    let found = tx.machine_by_name(&user.id, machine).await?;
    let row = match found {
        Some(m) => m,
        None => {
            let m = MachineRow {
                id: ids::machine(),
                owner_id: user.id.clone(),
                name: machine.to_owned(),
                info: serde_json::json!({}),
                registered_at: None,
                last_seen_at: None,
                created_at: Clock::system().now_ms(),
            };
            tx.insert_machine(&m).await?;
            m
        }
    };
    tx.commit().await?;
    let secret = insert_worker_token(store, machine, &user, Some(row.id.clone())).await?;
    Ok((secret, row, user))
}

async fn token_user(store: &dyn Store, user: Option<&str>) -> Result<UserRow, AdminError> {
    match user {
        Some(u) => store
            .read()
            .await?
            .user_by_name(u)
            .await?
            .ok_or_else(|| AdminError::UnknownUser(u.to_owned())),
        None => ensure_user(store, DEFAULT_USER).await,
    }
}

async fn insert_worker_token(
    store: &dyn Store,
    name: &str,
    user: &UserRow,
    machine_id: Option<String>,
) -> Result<String, AdminError> {
    let secret = new_secret(CallerKind::Worker);
    let mut tx = store.write().await?;
    tx.insert_token(&TokenRow {
        id: ids::token(),
        kind: TokenKind::Worker,
        name: name.to_owned(),
        user_id: user.id.clone(),
        secret_hash: secret_hash(&secret),
        created_at: Clock::system().now_ms(),
        revoked_at: None,
        machine_id,
    })
    .await?;
    tx.commit().await?;
    Ok(secret)
}

/// Every worker and admin token, oldest first (secrets are never kept, only their hashes).
pub async fn list_tokens(store: &dyn Store) -> Result<Vec<TokenRow>, AdminError> {
    let mut tx = store.read().await?;
    let mut all = tx.list_tokens(TokenKind::Admin).await?;
    all.extend(tx.list_tokens(TokenKind::Worker).await?);
    all.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
    Ok(all)
}

/// Revokes a token named by its id, or by its name when one live token has it; returns it as
/// revoked. Every replica refuses it within [`crate::auth::TOKEN_CACHE_MS`] of its server clock
/// (the command that revokes waits that long before it says so).
pub async fn revoke_token(store: &dyn Store, which: &str) -> Result<TokenRow, AdminError> {
    let all = list_tokens(store).await?;
    let by_id: Vec<&TokenRow> = all.iter().filter(|t| t.id == which).collect();
    let by_name: Vec<&TokenRow> = all
        .iter()
        .filter(|t| t.name == which && t.revoked_at.is_none())
        .collect();
    let token = match (by_id.as_slice(), by_name.as_slice()) {
        ([t], _) | ([], [t]) => (*t).clone(),
        ([], []) => return Err(AdminError::UnknownToken(format!("no live token `{which}`"))),
        _ => {
            return Err(AdminError::UnknownToken(format!(
                "{} live tokens are named `{which}`: name one by its id",
                by_name.len()
            )));
        }
    };
    let now = Clock::system().now_ms();
    let mut tx = store.write().await?;
    let revoked = tx.revoke_token(&token.id, now).await?;
    tx.commit().await?;
    if !revoked {
        return Err(AdminError::UnknownToken(format!(
            "`{}` was revoked already",
            token.id
        )));
    }
    Ok(TokenRow {
        revoked_at: Some(now),
        ..token
    })
}

impl DataDir {
    /// A new admin token for this data dir, written to `admin.token`, and the one it held
    /// revoked (other replicas' admin tokens, in their own data dirs, are left alone).
    pub async fn rotate_admin_token(&self, store: &dyn Store) -> Result<String, AdminError> {
        let old = std::fs::read_to_string(self.admin_token_file())
            .ok()
            .map(|s| s.trim().to_owned());
        let _ = std::fs::remove_file(self.admin_token_file());
        let fresh = self.bootstrap(store).await?;
        if let Some(old) = old {
            let row = store
                .read()
                .await?
                .token_by_hash(&secret_hash(&old))
                .await?;
            if let Some(row) = row.filter(|r| r.revoked_at.is_none()) {
                let mut tx = store.write().await?;
                tx.revoke_token(&row.id, Clock::system().now_ms()).await?;
                tx.commit().await?;
            }
        }
        Ok(fresh)
    }
}

/// A URL with its password hidden, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.find('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.find(':') {
                Some(c) => format!("{}{}:***{}", &url[..s + 3], &creds[..c], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

/// The SQLite database and its WAL and shared-memory files are their owner's only (0600):
/// made so before SQLite creates it (SQLite gives the `-wal` and `-shm` files the database's
/// mode), and tightened when an older one was readable by others.
fn private_database(db: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(db)?;
        for suffix in ["", "-wal", "-shm"] {
            let path = PathBuf::from(format!("{}{suffix}", db.display()));
            match std::fs::metadata(&path) {
                Ok(m) if m.permissions().mode() & 0o077 != 0 => {
                    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    #[cfg(not(unix))]
    let _ = db;
    Ok(())
}

fn is_postgres(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

// Devices, from the host: pairing codes made on the command line, the list, revocation.

/// `waymark admin pair`: a one-time code for `user` with `scopes`, valid for `ttl_ms`.
pub async fn create_pairing(
    store: &dyn Store,
    user: &str,
    scopes: &[String],
    ttl_ms: i64,
) -> Result<(String, i64), AdminError> {
    use rand::Rng;
    const ALPHABET: &[u8] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
    for s in scopes {
        if !["view", "steer", "approve"].contains(&s.as_str()) {
            return Err(AdminError::InvalidScope(s.clone()));
        }
    }
    let user = store
        .read()
        .await?
        .user_by_name(user)
        .await?
        .ok_or_else(|| AdminError::UnknownUser(user.to_owned()))?;
    let mut rng = rand::rngs::OsRng;
    let raw: String = (0..8)
        .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
        .collect();
    let code = format!("{}-{}", &raw[..4], &raw[4..]);
    // An admin act outside the server's rules: the system clock (the server checks expiry
    // against its own).
    let now = Clock::system().now_ms();
    let key = crate::domain::devices::pairing_key(store).await?;
    let mut tx = store.write().await?;
    tx.insert_pairing(&PairingRow {
        code_hash: crate::domain::devices::code_hash(&key, &code),
        user_id: user.id,
        scopes: scopes.to_vec(),
        created_at: now,
        expires_at: now + ttl_ms,
        used_at: None,
        device_id: None,
    })
    .await?;
    tx.commit().await?;
    Ok((code, now + ttl_ms))
}

/// `waymark admin device list`.
pub async fn list_devices(store: &dyn Store) -> Result<Vec<Device>, AdminError> {
    let mut tx = store.read().await?;
    let mut out = Vec::new();
    for d in tx.list_devices(None).await? {
        let user = tx
            .user_by_id(&d.user_id)
            .await?
            .map(|u| u.name)
            .unwrap_or_default();
        out.push(convert::device(&d, &user));
    }
    Ok(out)
}

/// `waymark admin device revoke`: immediate; later sessions and commands are refused.
pub async fn revoke_device(store: &dyn Store, id: &str) -> Result<Device, AdminError> {
    let mut tx = store.write().await?;
    let mut d = tx
        .device(id)
        .await?
        .ok_or_else(|| AdminError::UnknownDevice(id.to_owned()))?;
    if d.revoked_at.is_none() {
        let now = Clock::system().now_ms();
        d.revoked_at = Some(now);
        tx.update_device(&d).await?;
        // Its push channels end with it: nothing more is sent to a device that is gone.
        for mut c in tx.push_channels(Some(&d.id)).await? {
            if c.revoked_at.is_none() {
                c.revoked_at = Some(now);
                c.last_error = Some("the device was revoked".into());
                tx.update_push_channel(&c).await?;
            }
        }
        // Its open event streams end now, on every replica (not at their next look).
        crate::domain::core::access_changed(&mut *tx, &[&d.user_id], now).await?;
    }
    let user = tx
        .user_by_id(&d.user_id)
        .await?
        .map(|u| u.name)
        .unwrap_or_default();
    tx.commit().await?;
    Ok(convert::device(&d, &user))
}
