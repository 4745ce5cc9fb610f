//! `EffectsTx`'s statements: effects, found again by their idempotency key. All of them are the
//! same on both backends.

use waymark_store::EffectRow;

use crate::{Insert, Statement, insert};

pub fn insert_effect(e: &EffectRow) -> Insert<'_> {
    insert!(
        "INSERT INTO effects (id, task_id, idempotency_key, body_digest, kind, step, resource_id,
           intent, intent_digest, status, receipt, attempt_id, fence, created_at, updated_at, flag)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)"
    )
    .bind(&e.id)
    .bind(&e.task_id)
    .bind(&e.idempotency_key)
    .bind(&e.body_digest)
    .bind(e.kind.as_str())
    .bind(&e.step)
    .bind(&e.resource_id)
    .json(&e.intent)
    .bind(&e.intent_digest)
    .bind(e.status.as_str())
    .opt_json(e.receipt.as_ref())
    .bind(&e.attempt_id)
    .bind(e.fence)
    .bind(e.created_at)
    .bind(e.updated_at)
    .bind(&e.flag)
}

pub fn effect(id: &str) -> Statement<'_> {
    Statement::new("SELECT * FROM effects WHERE id = $1").bind(id)
}

pub fn effect_by_key<'a>(task_id: &'a str, key: &'a str) -> Statement<'a> {
    Statement::new("SELECT * FROM effects WHERE task_id = $1 AND idempotency_key = $2")
        .bind(task_id)
        .bind(key)
}

pub fn update_effect(e: &EffectRow) -> Statement<'_> {
    Statement::new(
        "UPDATE effects SET resource_id = $1, status = $2, receipt = $3, attempt_id = $4,
           fence = $5, updated_at = $6, flag = $7, intent = $8, intent_digest = $9
         WHERE id = $10",
    )
    .bind(&e.resource_id)
    .bind(e.status.as_str())
    .opt_json(e.receipt.as_ref())
    .bind(&e.attempt_id)
    .bind(e.fence)
    .bind(e.updated_at)
    .bind(&e.flag)
    .json(&e.intent)
    .bind(&e.intent_digest)
    .bind(&e.id)
}

pub fn list_effects(task_id: &str) -> Statement<'_> {
    Statement::new("SELECT * FROM effects WHERE task_id = $1 ORDER BY created_at, id").bind(task_id)
}
