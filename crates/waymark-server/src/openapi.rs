//! The OpenAPI document of API v1, generated from the handlers' annotations and the wire
//! types, served at `/v1/openapi.json`.

use axum::Json;
use utoipa::OpenApi;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};

use crate::{claude_code, followups, push, reads, recovery, steer, worker};

#[derive(OpenApi)]
#[openapi(
    info(title = "Waymark API", version = "1", description = "The durable record of long-running agent runs. Every write that changes state answers with the event `cursor` of the change."),
    paths(
        reads::healthz,
        worker::create_task,
        reads::task_detail,
        worker::start_attempt,
        worker::heartbeat,
        worker::finish,
        worker::append_checkpoint,
        worker::declare_effect,
        worker::update_effect,
        worker::request_approval,
        worker::request_decision,
        reads::get_decision,
        worker::report_delivery,
        worker::expire_decision,
        worker::upload_artifact,
        worker::submit_test_receipt,
        worker::append_messages,
        worker::report_usage,
        recovery::reconcile,
        recovery::released,
        followups::create,
        followups::get,
        steer::control_stream,
        steer::pair,
        steer::open_session,
        steer::submit,
        push::register,
        push::list,
        push::vapid,
        claude_code::hook,
        reads::snapshot,
        reads::events,
        reads::blob,
        worker::admin_resolve,
        reads::admin_prune,
        reads::admin_audit,
        steer::admin_ledger,
    ),
    components(schemas(waymark_proto::Event, waymark_proto::EventKind, waymark_proto::ErrorCode)),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
)]
struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The OpenAPI document as JSON.
pub fn openapi_json() -> serde_json::Value {
    serde_json::to_value(ApiDoc::openapi()).unwrap_or_default()
}

pub(crate) async fn serve() -> Json<serde_json::Value> {
    Json(openapi_json())
}
