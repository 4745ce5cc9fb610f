//! `SecretsTx` on SQLite: server secrets, and job claims (always granted: one file has one writer).

use async_trait::async_trait;
use waymark_store::*;

use super::SqliteTx;
use crate::rows::*;

#[async_trait]
impl SecretsTx for SqliteTx {
    async fn server_secret(&mut self, name: &str) -> Result<Option<String>> {
        sqlx::query_scalar("SELECT value FROM server_secrets WHERE name = ?")
            .bind(name)
            .fetch_optional(self.db())
            .await
            .map_err(backend)
    }

    async fn insert_server_secret(&mut self, name: &str, value: &str) -> Result<()> {
        self.exec(
            sqlx::query("INSERT INTO server_secrets (name, value) VALUES (?, ?)")
                .bind(name)
                .bind(value),
        )
        .await
        .map(drop)
    }

    async fn try_claim(&mut self, _job: &str) -> Result<bool> {
        // One file, one writer: a write transaction already excludes every other.
        Ok(true)
    }
}
