//! `ArtifactsTx` on SQLite: blobs by content, the artifacts that name them, and test receipts.

use async_trait::async_trait;
use waymark_store::*;

use super::{SqliteTx, json_list};
use crate::rows::*;

#[async_trait]
impl ArtifactsTx for SqliteTx {
    async fn put_blob(&mut self, sha256: &str, data: &[u8]) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO blobs (sha256, size, data) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
            )
            .bind(sha256)
            .bind(data.len() as i64)
            .bind(data),
        )
        .await
        .map(drop)
    }

    async fn blob(&mut self, sha256: &str) -> Result<Option<Vec<u8>>> {
        sqlx::query_scalar("SELECT data FROM blobs WHERE sha256 = ?")
            .bind(sha256)
            .fetch_optional(self.db())
            .await
            .map_err(backend)
    }

    async fn insert_artifact(&mut self, a: &ArtifactRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO artifacts (id, task_id, sha256, name, media_type, size, step, created_at)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(&a.id)
            .bind(&a.task_id)
            .bind(&a.sha256)
            .bind(&a.name)
            .bind(&a.media_type)
            .bind(a.size)
            .bind(&a.step)
            .bind(a.created_at),
        )
        .await
        .map(drop)
    }

    async fn list_artifacts(&mut self, task_id: &str) -> Result<Vec<ArtifactRow>> {
        self.all(
            sqlx::query("SELECT * FROM artifacts WHERE task_id = ? ORDER BY created_at, id")
                .bind(task_id),
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
        self.exec(
            sqlx::query(
                "INSERT INTO test_receipts (id, task_id, step, command, exit_code, commit_id, totals,
                   failures, duration_seconds, passed, junit_sha256, created_at)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(&r.id)
            .bind(&r.task_id)
            .bind(&r.step)
            .bind(&r.command)
            .bind(r.exit_code)
            .bind(&r.commit)
            .bind(json_text(&r.totals))
            .bind(json_text(&r.failures))
            .bind(r.duration_seconds)
            .bind(r.passed)
            .bind(&r.junit_sha256)
            .bind(r.created_at),
        )
        .await
        .map(drop)
    }

    async fn list_receipts(&mut self, task_id: &str) -> Result<Vec<ReceiptRow>> {
        self.all(
            sqlx::query("SELECT * FROM test_receipts WHERE task_id = ? ORDER BY created_at, id")
                .bind(task_id),
            receipt_row,
        )
        .await
    }
}
