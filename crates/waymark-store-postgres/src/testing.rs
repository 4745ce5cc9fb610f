//! Test support shared by every crate whose tests run on PostgreSQL: finds (or starts, through
//! `scripts/postgres-test-server`) a test server and hands out throwaway databases. Tests fail
//! loudly when PostgreSQL cannot be had; they never skip.

use std::sync::OnceLock;

use sqlx::Connection;
use sqlx::postgres::PgConnection;

/// The URL of the test server's `waymark_test` database: `WAYMARK_TEST_DATABASE_URL`, else a
/// cluster started once by `scripts/postgres-test-server`.
pub fn server_url() -> &'static str {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        if let Some(url) = std::env::var("WAYMARK_TEST_DATABASE_URL").ok().filter(|u| !u.is_empty()) {
            return url;
        }
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/postgres-test-server");
        let out = std::process::Command::new("bash")
            .arg(script)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {script}: {e}"));
        assert!(
            out.status.success(),
            "PostgreSQL could not be started for the tests — set WAYMARK_TEST_DATABASE_URL to a \
             server you have, or install PostgreSQL (`apt-get install -y postgresql`).\n{script} said:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let url = String::from_utf8(out.stdout).unwrap_or_default().trim().to_owned();
        assert!(url.starts_with("postgres"), "{script} printed {url:?}");
        url
    })
}

/// `url` with its database replaced by `db`.
pub fn with_database(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, format!("?{q}")),
        None => (url, String::new()),
    };
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let path_start = base[authority_start..]
        .find('/')
        .map_or(base.len(), |i| authority_start + i);
    format!("{}/{db}{query}", &base[..path_start])
}

/// Creates a fresh, empty database on the test server and returns its URL.
pub async fn fresh_database() -> String {
    let name = format!("waymark_t_{:016x}", rand_u64());
    let mut admin = PgConnection::connect(server_url())
        .await
        .unwrap_or_else(|e| panic!("cannot reach the test server {}: {e}", server_url()));
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut admin)
        .await
        .unwrap();
    let _ = admin.close().await;
    with_database(server_url(), &name)
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    h.finish()
}
