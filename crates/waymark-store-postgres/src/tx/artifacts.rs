//! `ArtifactsTx` on PostgreSQL: blobs by content, the artifacts that name them, and test receipts.

use async_trait::async_trait;
use waymark_store::*;

use super::{PgTx, db_err};
use crate::rows::*;

#[async_trait]
impl ArtifactsTx for PgTx {
    async fn put_blob(&mut self, sha256: &str, data: &[u8]) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO blobs (sha256, size, data) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
            )
            .bind(sha256)
            .bind(data.len() as i64)
            .bind(data),
        )
        .await
        .map(drop)
    }

    async fn blob(&mut self, sha256: &str) -> Result<Option<Vec<u8>>> {
        sqlx::query_scalar("SELECT data FROM blobs WHERE sha256 = $1")
            .bind(sha256)
            .fetch_optional(&mut *self.tx)
            .await
            .map_err(db_err)
    }

    async fn insert_artifact(&mut self, a: &ArtifactRow) -> Result<()> {
        self.insert(
            "artifacts",
            sqlx::query(
                "INSERT INTO artifacts (id, task_id, sha256, name, media_type, size, step, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING",
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
    }

    async fn list_artifacts(&mut self, task_id: &str) -> Result<Vec<ArtifactRow>> {
        self.all(
            sqlx::query("SELECT * FROM artifacts WHERE task_id = $1 ORDER BY created_at, id")
                .bind(task_id),
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
        self.insert(
            "test_receipts",
            sqlx::query(
                "INSERT INTO test_receipts (id, task_id, step, command, exit_code, commit_id, totals,
                   failures, duration_seconds, passed, junit_sha256, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) ON CONFLICT DO NOTHING",
            )
            .bind(&r.id)
            .bind(&r.task_id)
            .bind(&r.step)
            .bind(&r.command)
            .bind(r.exit_code)
            .bind(&r.commit)
            .bind(&r.totals)
            .bind(&r.failures)
            .bind(r.duration_seconds)
            .bind(r.passed)
            .bind(&r.junit_sha256)
            .bind(r.created_at),
        )
        .await
    }

    async fn list_receipts(&mut self, task_id: &str) -> Result<Vec<ReceiptRow>> {
        self.all(
            sqlx::query("SELECT * FROM test_receipts WHERE task_id = $1 ORDER BY created_at, id")
                .bind(task_id),
            receipt_row,
        )
        .await
    }
}
