//! Effects over HTTP: a worker declares one under its idempotency key and reports how it
//! went. The rules are in `waymark_domain::effects`.

use axum::Json as Out;
use axum::extract::{Path, State};
use waymark_proto::*;

use super::{Created, made};
use crate::auth::WorkerCaller;
use crate::domain::effects;
use crate::error::ApiResult;
use crate::extract::Json;
use crate::state::AppState;

#[utoipa::path(post, path = "/v1/tasks/{task}/effects", tag = "worker", request_body = DeclareEffect,
    params(("task" = String, Path, pattern = r"^task_[0-9a-f]{32}$")),
    responses((status = 201, body = EffectDeclared, description = "declared"),
              (status = 200, body = EffectDeclared, description = "the same key and body were declared before"),
              (status = 422, body = Problem, description = "`idempotency_mismatch`")))]
pub(crate) async fn declare_effect(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path(task_id): Path<String>,
    Json(req): Json<DeclareEffect>,
) -> ApiResult<Created<EffectDeclared>> {
    Ok(made(
        effects::declare_effect(&st, &caller, task_id, req).await?,
    ))
}

#[utoipa::path(patch, path = "/v1/effects/{effect}", tag = "worker", request_body = UpdateEffect,
    params(("effect" = String, Path, pattern = r"^eff_[0-9a-f]{32}$")),
    responses((status = 200, body = Effect), (status = 409, body = Problem, description = "`illegal_transition`, `fenced`")))]
pub(crate) async fn update_effect(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Path(effect_id): Path<String>,
    Json(req): Json<UpdateEffect>,
) -> ApiResult<Out<Written<Effect>>> {
    Ok(Out(
        effects::update_effect(&st, &caller, effect_id, req).await?
    ))
}
