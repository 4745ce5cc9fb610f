//! `EffectsTx` on SQLite: effects, found again by their idempotency key.

use async_trait::async_trait;
use waymark_store::*;

use super::SqliteTx;
use crate::rows::*;

#[async_trait]
impl EffectsTx for SqliteTx {
    async fn insert_effect(&mut self, e: &EffectRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO effects (id, task_id, idempotency_key, body_digest, kind, step, resource_id,
                   intent, intent_digest, status, receipt, attempt_id, fence, created_at, updated_at, flag)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(&e.id)
            .bind(&e.task_id)
            .bind(&e.idempotency_key)
            .bind(&e.body_digest)
            .bind(e.kind.as_str())
            .bind(&e.step)
            .bind(&e.resource_id)
            .bind(json_text(&e.intent))
            .bind(&e.intent_digest)
            .bind(e.status.as_str())
            .bind(e.receipt.as_ref().map(json_text))
            .bind(&e.attempt_id)
            .bind(e.fence)
            .bind(e.created_at)
            .bind(e.updated_at)
            .bind(&e.flag),
        )
        .await
        .map(drop)
    }

    async fn effect(&mut self, id: &str) -> Result<Option<EffectRow>> {
        self.one(
            sqlx::query("SELECT * FROM effects WHERE id = ?").bind(id),
            effect_row,
        )
        .await
    }

    async fn effect_by_key(&mut self, task_id: &str, key: &str) -> Result<Option<EffectRow>> {
        self.one(
            sqlx::query("SELECT * FROM effects WHERE task_id = ? AND idempotency_key = ?")
                .bind(task_id)
                .bind(key),
            effect_row,
        )
        .await
    }

    async fn update_effect(&mut self, e: &EffectRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "UPDATE effects SET resource_id = ?, status = ?, receipt = ?, attempt_id = ?, fence = ?,
                   updated_at = ?, flag = ?, intent = ?, intent_digest = ?
                 WHERE id = ?",
            )
            .bind(&e.resource_id)
            .bind(e.status.as_str())
            .bind(e.receipt.as_ref().map(json_text))
            .bind(&e.attempt_id)
            .bind(e.fence)
            .bind(e.updated_at)
            .bind(&e.flag)
            .bind(json_text(&e.intent))
            .bind(&e.intent_digest)
            .bind(&e.id),
        )
        .await
        .map(drop)
    }

    async fn list_effects(&mut self, task_id: &str) -> Result<Vec<EffectRow>> {
        self.all(
            sqlx::query("SELECT * FROM effects WHERE task_id = ? ORDER BY created_at, id")
                .bind(task_id),
            effect_row,
        )
        .await
    }
}
