//! `EffectsTx` on PostgreSQL: effects, found again by their idempotency key.

use async_trait::async_trait;
use waymark_store::*;
use waymark_store_sql as sql;

use super::PgTx;
use crate::rows::*;

#[async_trait]
impl EffectsTx for PgTx {
    async fn insert_effect(&mut self, e: &EffectRow) -> Result<()> {
        self.insert("effects", sql::effects::insert_effect(e)).await
    }

    async fn effect(&mut self, id: &str) -> Result<Option<EffectRow>> {
        self.one(sql::effects::effect(id).query(), effect_row).await
    }

    async fn effect_by_key(&mut self, task_id: &str, key: &str) -> Result<Option<EffectRow>> {
        let q = sql::effects::effect_by_key(task_id, key);
        self.one(q.query(), effect_row).await
    }

    async fn update_effect(&mut self, e: &EffectRow) -> Result<()> {
        self.exec(sql::effects::update_effect(e).query())
            .await
            .map(drop)
    }

    async fn list_effects(&mut self, task_id: &str) -> Result<Vec<EffectRow>> {
        self.all(sql::effects::list_effects(task_id).query(), effect_row)
            .await
    }
}
