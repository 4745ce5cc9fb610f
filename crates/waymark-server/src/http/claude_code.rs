//! Claude Code's hooks over HTTP (`POST /v1/adapters/claude-code/hook`): Claude Code calls it
//! as an `http` hook. What a call means — sessions as tasks, tool calls as effects, permission
//! prompts as approvals answered in Claude Code's own decision JSON — is the rules'
//! (`waymark_domain::claude_code`, docs/adapters/claude-code.md); this is its route.

use axum::Json as Out;
use axum::extract::State;
use serde_json::Value;
use waymark_domain::claude_code::{self, HookQuery, Run};
use waymark_proto::Problem;

use waymark_domain::claude_code::ENTRYPOINT_HEADER;

use crate::auth::WorkerCaller;
use crate::error::ApiResult;
use crate::extract::{Json, Query};
use crate::state::AppState;

#[utoipa::path(post, path = "/v1/adapters/claude-code/hook", tag = "adapters",
    params(HookQuery),
    request_body(content = Object, description = "Claude Code's hook input, as Claude Code sends it"),
    responses((status = 200, body = Object, description = "Claude Code's hook output: `{}`, or the event's decision JSON"),
              (status = 422, body = Problem)))]
pub(crate) async fn hook(
    State(st): State<AppState>,
    WorkerCaller(caller): WorkerCaller,
    Query(q): Query<HookQuery>,
    headers: axum::http::HeaderMap,
    Json(raw): Json<Value>,
) -> ApiResult<Out<Value>> {
    let entrypoint = headers.get(ENTRYPOINT_HEADER).and_then(|v| v.to_str().ok());
    let answer = claude_code::hook(&st, &caller, q, Run::of(entrypoint), raw).await?;
    Ok(Out(answer))
}
