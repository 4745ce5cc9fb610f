//! `EffectsTx` on PostgreSQL: effects, found again by their idempotency key.

use async_trait::async_trait;
use waymark_store::*;

use super::PgTx;
use crate::rows::*;

#[async_trait]
impl EffectsTx for PgTx {
    async fn insert_effect(&mut self, e: &EffectRow) -> Result<()> {
        self.insert(
            "effects",
            sqlx::query(
                "INSERT INTO effects (id, task_id, idempotency_key, body_digest, kind, step, resource_id,
                   intent, intent_digest, status, receipt, attempt_id, fence, created_at, updated_at, flag)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)
                 ON CONFLICT DO NOTHING",
            )
            .bind(&e.id)
            .bind(&e.task_id)
            .bind(&e.idempotency_key)
            .bind(&e.body_digest)
            .bind(e.kind.as_str())
            .bind(&e.step)
            .bind(&e.resource_id)
            .bind(&e.intent)
            .bind(&e.intent_digest)
            .bind(e.status.as_str())
            .bind(&e.receipt)
            .bind(&e.attempt_id)
            .bind(e.fence)
            .bind(e.created_at)
            .bind(e.updated_at)
            .bind(&e.flag),
        )
        .await
    }

    async fn effect(&mut self, id: &str) -> Result<Option<EffectRow>> {
        self.one(
            sqlx::query("SELECT * FROM effects WHERE id = $1").bind(id),
            effect_row,
        )
        .await
    }

    async fn effect_by_key(&mut self, task_id: &str, key: &str) -> Result<Option<EffectRow>> {
        self.one(
            sqlx::query("SELECT * FROM effects WHERE task_id = $1 AND idempotency_key = $2")
                .bind(task_id)
                .bind(key),
            effect_row,
        )
        .await
    }

    async fn update_effect(&mut self, e: &EffectRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "UPDATE effects SET resource_id = $1, status = $2, receipt = $3, attempt_id = $4,
                   fence = $5, updated_at = $6, flag = $7, intent = $8, intent_digest = $9
                 WHERE id = $10",
            )
            .bind(&e.resource_id)
            .bind(e.status.as_str())
            .bind(&e.receipt)
            .bind(&e.attempt_id)
            .bind(e.fence)
            .bind(e.updated_at)
            .bind(&e.flag)
            .bind(&e.intent)
            .bind(&e.intent_digest)
            .bind(&e.id),
        )
        .await
        .map(drop)
    }

    async fn list_effects(&mut self, task_id: &str) -> Result<Vec<EffectRow>> {
        self.all(
            sqlx::query("SELECT * FROM effects WHERE task_id = $1 ORDER BY created_at, id")
                .bind(task_id),
            effect_row,
        )
        .await
    }
}
