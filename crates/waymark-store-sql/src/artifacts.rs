//! `ArtifactsTx`'s statements: blobs by content, the artifacts that name them, and test receipts.
//! Whether a blob is visible to some owners is each backend's own (`json_each` against `ANY`).

use waymark_store::{ArtifactRow, ReceiptRow};

use crate::{Insert, Statement, insert};

/// Writes no row for a blob already stored: a blob is named by its content.
pub fn put_blob<'a>(sha256: &'a str, data: &'a [u8]) -> Statement<'a> {
    Statement::new(
        "INSERT INTO blobs (sha256, size, data) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
    )
    .bind(sha256)
    .bind(data.len() as i64)
    .bind(data)
}

pub fn blob(sha256: &str) -> Statement<'_> {
    Statement::new("SELECT data FROM blobs WHERE sha256 = $1").bind(sha256)
}

pub fn insert_artifact(a: &ArtifactRow) -> Insert<'_> {
    insert!(
        "INSERT INTO artifacts (id, task_id, sha256, name, media_type, size, step, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
    )
    .bind(&a.id)
    .bind(&a.task_id)
    .bind(&a.sha256)
    .bind(&a.name)
    .bind(&a.media_type)
    .bind(a.size)
    .bind(&a.step)
    .bind(a.created_at)
}

pub fn list_artifacts(task_id: &str) -> Statement<'_> {
    Statement::new("SELECT * FROM artifacts WHERE task_id = $1 ORDER BY created_at, id")
        .bind(task_id)
}

pub fn insert_receipt(r: &ReceiptRow) -> Insert<'_> {
    insert!(
        "INSERT INTO test_receipts (id, task_id, step, command, exit_code, commit_id, totals,
           failures, duration_seconds, passed, junit_sha256, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
    )
    .bind(&r.id)
    .bind(&r.task_id)
    .bind(&r.step)
    .bind(&r.command)
    .bind(r.exit_code)
    .bind(&r.commit)
    .json(&r.totals)
    .json(&r.failures)
    .bind(r.duration_seconds)
    .bind(r.passed)
    .bind(&r.junit_sha256)
    .bind(r.created_at)
}

pub fn list_receipts(task_id: &str) -> Statement<'_> {
    Statement::new("SELECT * FROM test_receipts WHERE task_id = $1 ORDER BY created_at, id")
        .bind(task_id)
}
