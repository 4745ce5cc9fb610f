//! `EffectsTx` on SQLite: effects, found again by their idempotency key.

use async_trait::async_trait;
use waymark_store::*;
use waymark_store_sql as sql;

use super::SqliteTx;
use crate::rows::*;

#[async_trait]
impl EffectsTx for SqliteTx {
    async fn insert_effect(&mut self, e: &EffectRow) -> Result<()> {
        self.insert(sql::effects::insert_effect(e))
    }

    async fn effect(&mut self, id: &str) -> Result<Option<EffectRow>> {
        self.one(sql::effects::effect(id), effect_row)
    }

    async fn effect_by_key(&mut self, task_id: &str, key: &str) -> Result<Option<EffectRow>> {
        let q = sql::effects::effect_by_key(task_id, key);
        self.one(q, effect_row)
    }

    async fn update_effect(&mut self, e: &EffectRow) -> Result<()> {
        self.exec(sql::effects::update_effect(e)).map(drop)
    }

    async fn list_effects(&mut self, task_id: &str) -> Result<Vec<EffectRow>> {
        self.all(sql::effects::list_effects(task_id), effect_row)
    }
}
