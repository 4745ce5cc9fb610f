//! `SecretsTx` on SQLite: server secrets, and job claims (always granted: one file has one writer).

use async_trait::async_trait;
use waymark_store::*;
use waymark_store_sql as sql;

use super::SqliteTx;

#[async_trait]
impl SecretsTx for SqliteTx {
    async fn server_secret(&mut self, name: &str) -> Result<Option<String>> {
        self.scalar_opt(sql::secrets::server_secret(name))
    }

    async fn insert_server_secret(&mut self, name: &str, value: &str) -> Result<()> {
        let q = sql::secrets::insert_server_secret(name, value);
        self.exec(q).map(drop)
    }

    async fn try_claim(&mut self, _job: &str) -> Result<bool> {
        // One file, one writer: a write transaction already excludes every other.
        Ok(true)
    }
}
