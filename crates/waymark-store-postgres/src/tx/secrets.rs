//! `SecretsTx` on PostgreSQL: server secrets, and job claims as transaction-scoped advisory locks
//! (one replica at a time).

use async_trait::async_trait;
use waymark_store::*;
use waymark_store_sql as sql;

use super::{PgTx, db_err};

#[async_trait]
impl SecretsTx for PgTx {
    async fn server_secret(&mut self, name: &str) -> Result<Option<String>> {
        sql::secrets::server_secret(name)
            .query_scalar()
            .fetch_optional(&mut *self.tx)
            .await
            .map_err(db_err)
    }

    async fn insert_server_secret(&mut self, name: &str, value: &str) -> Result<()> {
        let q = sql::secrets::insert_server_secret(name, value);
        self.exec(q.query()).await.map(drop)
    }

    async fn try_claim(&mut self, job: &str) -> Result<bool> {
        // A transaction-scoped advisory lock: released at commit or rollback, so a replica that
        // dies mid-job frees it at once.
        sqlx::query_scalar("SELECT pg_try_advisory_xact_lock(hashtext('waymark-job:' || $1))")
            .bind(job)
            .fetch_one(&mut *self.tx)
            .await
            .map_err(db_err)
    }
}
