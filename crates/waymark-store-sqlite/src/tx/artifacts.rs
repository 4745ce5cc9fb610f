//! `ArtifactsTx` on SQLite: blobs by content, the artifacts that name them, and test receipts.

use async_trait::async_trait;
use waymark_store::*;
use waymark_store_sql::{self as sql, Statement};

use super::SqliteTx;
use crate::rows::*;

#[async_trait]
impl ArtifactsTx for SqliteTx {
    async fn put_blob(&mut self, sha256: &str, data: &[u8]) -> Result<()> {
        self.exec(sql::artifacts::put_blob(sha256, data)).map(drop)
    }

    async fn blob(&mut self, sha256: &str) -> Result<Option<Vec<u8>>> {
        self.scalar_opt(sql::artifacts::blob(sha256))
    }

    async fn insert_artifact(&mut self, a: &ArtifactRow) -> Result<()> {
        self.insert(sql::artifacts::insert_artifact(a))
    }

    async fn list_artifacts(&mut self, task_id: &str) -> Result<Vec<ArtifactRow>> {
        self.all(sql::artifacts::list_artifacts(task_id), artifact_row)
    }

    async fn blob_visible(&mut self, sha256: &str, owners: Option<&[String]>) -> Result<bool> {
        let n: i64 = self.scalar(
            Statement::new(
                "SELECT COUNT(*) FROM artifacts a JOIN tasks t ON t.id = a.task_id
                 WHERE a.sha256 = ?1
                   AND (?2 IS NULL OR t.owner_id IN (SELECT value FROM json_each(?2)))",
            )
            .bind(sha256)
            .opt_json(owners),
        )?;
        Ok(n > 0)
    }

    async fn insert_receipt(&mut self, r: &ReceiptRow) -> Result<()> {
        self.insert(sql::artifacts::insert_receipt(r))
    }

    async fn list_receipts(&mut self, task_id: &str) -> Result<Vec<ReceiptRow>> {
        self.all(sql::artifacts::list_receipts(task_id), receipt_row)
    }
}
