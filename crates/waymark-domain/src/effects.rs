//! Effects: declared with an idempotency key before they touch the world, moved along legal
//! transitions with their receipts; `unknown` is never resolved here.

use serde_json::json;
use waymark_proto::digest::json_digest;
use waymark_proto::*;
use waymark_store::*;

use crate::Context;
use crate::caller::Caller;
use crate::convert;
use crate::core::{
    Made, Tx, audited, check_intent, check_text, created, emit, field_digest, found, not_exact,
    refuse_terminal, task_for,
};
use crate::error::{ApiError, ApiResult};
use crate::fences::fenced_attempt;

/// Declares an effect before it touches the world: the same key and body is the same effect;
/// another body is `idempotency_mismatch`.
pub async fn declare_effect(
    st: &Context,
    caller: &Caller,
    task_id: String,
    req: DeclareEffect,
) -> ApiResult<Made<EffectDeclared>> {
    check_text("idempotency_key", &req.idempotency_key, 256, true)?;
    check_text("kind", &req.kind, 128, true)?;
    check_intent(&req.intent)?;
    audited(st, caller, "effect.declare", async {
        let mut tx = Tx::write(st).await?;
        let task = task_for(&mut tx, caller, &task_id).await?;
        refuse_terminal(&task)?;
        fenced_attempt(&mut tx, &task, &req.attempt_id, req.fence).await?;
        let declaration = json!({
            "kind": req.kind, "step": req.step, "resource_id": req.resource_id, "intent": req.intent,
        });
        let intent_digest = field_digest("intent", &req.intent)?;
        let body_digest = json_digest(&declaration).map_err(|e| not_exact("intent", e))?;
        if let Some(existing) = tx.effect_by_key(&task.id, &req.idempotency_key).await? {
            if existing.body_digest != body_digest {
                return Err(ApiError::new(
                    ErrorCode::IdempotencyMismatch,
                    format!(
                        "idempotency key `{}` was declared with a different body (effect `{}`); use a new key for a different change",
                        req.idempotency_key, existing.id
                    ),
                )
                .with("effect_id", &existing.id)
                .on_task(&task.id));
            }
            let cursor = tx.max_cursor().await?;
            let effect = convert::effect(&existing);
            return Ok(found(cursor, EffectDeclared { created: false, effect }));
        }
        if task.state == TaskState::Paused {
            return Err(ApiError::new(
                ErrorCode::TaskPaused,
                "the task is paused: no new effect may start until it is resumed",
            )
            .on_task(&task.id));
        }
        let now = tx.now;
        let row = EffectRow {
            id: ids::effect(),
            task_id: task.id.clone(),
            idempotency_key: req.idempotency_key.clone(),
            body_digest,
            kind: req.kind.clone(),
            step: req.step.clone(),
            resource_id: req.resource_id.clone(),
            intent: req.intent.clone(),
            intent_digest,
            status: EffectStatus::Intended,
            receipt: None,
            attempt_id: req.attempt_id.clone(),
            fence: req.fence,
            created_at: now,
            updated_at: now,
            flag: None,
        };
        match tx.insert_effect(&row).await {
            Err(StoreError::Conflict(_)) => {
                return Err(ApiError::new(ErrorCode::IdempotencyMismatch, "the idempotency key was taken concurrently; retry")
                    .on_task(&task.id));
            }
            r => r?,
        }
        let effect = convert::effect(&row);
        let cursor = emit(&mut tx, &task, EventKind::EffectDeclared, &effect).await?;
        tx.commit().await?;
        Ok(created(cursor, EffectDeclared { created: true, effect }))
    })
    .await
}

/// Moves an effect along a legal transition with its receipt.
pub async fn update_effect(
    st: &Context,
    caller: &Caller,
    effect_id: String,
    req: UpdateEffect,
) -> ApiResult<Written<Effect>> {
    audited(st, caller, "effect.update", async {
        let mut tx = Tx::write(st).await?;
        let mut effect = tx
            .effect(&effect_id)
            .await?
            .ok_or_else(|| ApiError::not_found("effect", &effect_id))?;
        let task = task_for(&mut tx, caller, &effect.task_id).await?;
        fenced_attempt(&mut tx, &task, &req.attempt_id, req.fence).await?;
        let from = effect.status;
        let to = req.status;
        let illegal = |detail: String| {
            Err(ApiError::new(ErrorCode::IllegalTransition, detail)
                .with("status", from)
                .with("requested", to)
                .on_task(&task.id))
        };
        if from == to {
            let same_receipt = req.receipt.is_none() || req.receipt == effect.receipt;
            if same_receipt
                && req
                    .resource_id
                    .as_ref()
                    .is_none_or(|r| Some(r) == effect.resource_id.as_ref())
            {
                // A repeated report: applied once already.
                let cursor = tx.max_cursor().await?;
                return Ok(Written {
                    cursor,
                    value: convert::effect(&effect),
                });
            }
            if from.is_terminal() {
                return illegal(format!(
                    "effect `{}` is already {from} with a different receipt",
                    effect.id
                ));
            }
        } else if !from.can_become(to) {
            return illegal(format!(
                "effect `{}` cannot move from {from} to {to}",
                effect.id
            ));
        }
        effect.status = to;
        if req.receipt.is_some() {
            effect.receipt = req.receipt.clone();
        }
        if req.resource_id.is_some() {
            effect.resource_id = req.resource_id.clone();
        }
        effect.attempt_id = req.attempt_id.clone();
        effect.fence = req.fence;
        effect.updated_at = tx.now;
        tx.update_effect(&effect).await?;
        let wire = convert::effect(&effect);
        let cursor = emit(&mut tx, &task, EventKind::EffectUpdated, &wire).await?;
        tx.commit().await?;
        Ok(Written {
            cursor,
            value: wire,
        })
    })
    .await
}
