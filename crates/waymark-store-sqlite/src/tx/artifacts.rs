//! `ArtifactsTx` on SQLite: blobs by content, the artifacts that name them, and test receipts.

use async_trait::async_trait;
use waymark_store::*;
use waymark_store_sql as sql;

use super::{SqliteTx, json_list};
use crate::rows::*;

#[async_trait]
impl ArtifactsTx for SqliteTx {
    async fn put_blob(&mut self, sha256: &str, data: &[u8]) -> Result<()> {
        self.exec(sql::artifacts::put_blob(sha256, data).query())
            .await
            .map(drop)
    }

    async fn blob(&mut self, sha256: &str) -> Result<Option<Vec<u8>>> {
        sql::artifacts::blob(sha256)
            .query_scalar()
            .fetch_optional(self.db())
            .await
            .map_err(backend)
    }

    async fn insert_artifact(&mut self, a: &ArtifactRow) -> Result<()> {
        self.insert(sql::artifacts::insert_artifact(a)).await
    }

    async fn list_artifacts(&mut self, task_id: &str) -> Result<Vec<ArtifactRow>> {
        self.all(
            sql::artifacts::list_artifacts(task_id).query(),
            artifact_row,
        )
        .await
    }

    async fn blob_visible(&mut self, sha256: &str, owners: Option<&[String]>) -> Result<bool> {
        let n: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM artifacts a JOIN tasks t ON t.id = a.task_id
             WHERE a.sha256 = ? AND (? IS NULL OR t.owner_id IN (SELECT value FROM json_each(?)))",
        )
        .bind(sha256)
        .bind(owners.map(json_list))
        .bind(owners.map(json_list))
        .fetch_one(self.db())
        .await
        .map_err(backend)?;
        Ok(n > 0)
    }

    async fn insert_receipt(&mut self, r: &ReceiptRow) -> Result<()> {
        self.insert(sql::artifacts::insert_receipt(r)).await
    }

    async fn list_receipts(&mut self, task_id: &str) -> Result<Vec<ReceiptRow>> {
        self.all(sql::artifacts::list_receipts(task_id).query(), receipt_row)
            .await
    }
}
