//! `ArtifactsTx` on PostgreSQL: blobs by content, the artifacts that name them, and test receipts.

use async_trait::async_trait;
use waymark_store::*;
use waymark_store_sql as sql;

use super::{PgTx, db_err};
use crate::rows::*;

#[async_trait]
impl ArtifactsTx for PgTx {
    async fn put_blob(&mut self, sha256: &str, data: &[u8]) -> Result<()> {
        self.exec(sql::artifacts::put_blob(sha256, data).query())
            .await
            .map(drop)
    }

    async fn blob(&mut self, sha256: &str) -> Result<Option<Vec<u8>>> {
        sql::artifacts::blob(sha256)
            .query_scalar()
            .fetch_optional(&mut *self.tx)
            .await
            .map_err(db_err)
    }

    async fn insert_artifact(&mut self, a: &ArtifactRow) -> Result<()> {
        self.insert("artifacts", sql::artifacts::insert_artifact(a))
            .await
    }

    async fn list_artifacts(&mut self, task_id: &str) -> Result<Vec<ArtifactRow>> {
        self.all(
            sql::artifacts::list_artifacts(task_id).query(),
            artifact_row,
        )
        .await
    }

    async fn blob_visible(&mut self, sha256: &str, owners: Option<&[String]>) -> Result<bool> {
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM artifacts a JOIN tasks t ON t.id = a.task_id
                            WHERE a.sha256 = $1 AND ($2::text[] IS NULL OR t.owner_id = ANY($2)))",
        )
        .bind(sha256)
        .bind(owners)
        .fetch_one(&mut *self.tx)
        .await
        .map_err(db_err)
    }

    async fn insert_receipt(&mut self, r: &ReceiptRow) -> Result<()> {
        self.insert("test_receipts", sql::artifacts::insert_receipt(r))
            .await
    }

    async fn list_receipts(&mut self, task_id: &str) -> Result<Vec<ReceiptRow>> {
        self.all(sql::artifacts::list_receipts(task_id).query(), receipt_row)
            .await
    }
}
