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
    modifiers(&BearerAuth, &CommonProblems),
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

/// The problems every route can answer besides its own, from the layers every request passes
/// (auth and rate limits, path lookups, the body and query extractors), documented once here
/// instead of on each handler; and problem documents under their real media type,
/// `application/problem+json`. Found missing by `scripts/api-fuzz` (schemathesis).
struct CommonProblems;

const PROBLEM_JSON: &str = "application/problem+json";

fn problem(description: &str) -> utoipa::openapi::Response {
    use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
    ResponseBuilder::new()
        .description(description)
        .content(
            PROBLEM_JSON,
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("Problem")))
                .build(),
        )
        .build()
}

fn is_problem(content: &utoipa::openapi::Content) -> bool {
    matches!(&content.schema, Some(utoipa::openapi::RefOr::Ref(r)) if r.ref_location == "#/components/schemas/Problem")
}

impl utoipa::Modify for CommonProblems {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::path::ParameterIn;
        use utoipa::openapi::{RefOr, Schema};
        // Bodies that carry an attempt's `fence`: such writes can meet a newer attempt.
        let fenced: Vec<String> = doc
            .components
            .as_ref()
            .map(|c| {
                c.schemas
                    .iter()
                    .filter(|(_, s)| {
                        matches!(s, RefOr::T(Schema::Object(o)) if o.properties.contains_key("fence"))
                    })
                    .map(|(name, _)| format!("#/components/schemas/{name}"))
                    .collect()
            })
            .unwrap_or_default();
        for item in doc.paths.paths.values_mut() {
            let ops = [
                &mut item.get,
                &mut item.post,
                &mut item.put,
                &mut item.patch,
                &mut item.delete,
            ];
            for op in ops.into_iter().flatten() {
                for response in op.responses.responses.values_mut() {
                    if let RefOr::T(r) = response
                        && let Some(content) = r.content.shift_remove("application/json")
                    {
                        let media = if is_problem(&content) {
                            PROBLEM_JSON
                        } else {
                            "application/json"
                        };
                        r.content.insert(media.to_owned(), content);
                    }
                }
                // `security(())` on a handler marks it public (signed, or no secret at all).
                let authenticated = op
                    .security
                    .as_ref()
                    .is_none_or(|reqs| reqs.iter().all(|r| r != &Default::default()));
                let params = op.parameters.as_deref().unwrap_or_default();
                let in_path = params
                    .iter()
                    .any(|p| matches!(p.parameter_in, ParameterIn::Path));
                let in_query = params
                    .iter()
                    .any(|p| matches!(p.parameter_in, ParameterIn::Query));
                let body = op.request_body.is_some();
                let fence = params.iter().any(|p| p.name == "fence")
                    || op.request_body.as_ref().is_some_and(|b| {
                        b.content.values().any(|c| {
                            matches!(&c.schema, Some(RefOr::Ref(r)) if fenced.contains(&r.ref_location))
                        })
                    });
                // A status the route documents with its own body (a signed command's
                // `CommandResult`) can still come from a shared layer as a problem document.
                let mut add = |status: &str, description: &str| match op
                    .responses
                    .responses
                    .entry(status.to_owned())
                {
                    std::collections::btree_map::Entry::Vacant(e) => {
                        e.insert(problem(description).into());
                    }
                    std::collections::btree_map::Entry::Occupied(mut e) => {
                        if let RefOr::T(r) = e.get_mut()
                            && !r.content.is_empty()
                            && !r.content.contains_key(PROBLEM_JSON)
                            && let Some(c) = problem(description).content.shift_remove(PROBLEM_JSON)
                        {
                            r.content.insert(PROBLEM_JSON.to_owned(), c);
                        }
                    }
                };
                if body || in_query {
                    add(
                        "400",
                        "`malformed_json` or `bad_request`: the body or query could not be read",
                    );
                    add(
                        "422",
                        "`validation_failed`: well-formed, but not the expected shape",
                    );
                }
                if body {
                    add(
                        "413",
                        "`payload_too_large`: the body is larger than this route accepts",
                    );
                    add(
                        "415",
                        "`unsupported_media_type`: not `Content-Type: application/json`",
                    );
                }
                if in_path {
                    add("404", "`not_found`: no such object, or not the caller's");
                }
                if fence {
                    add(
                        "409",
                        "`fenced`, `lease_expired`, `attempt_closed`, `task_paused` or `task_terminal`: a newer attempt or the task's state refuses this write",
                    );
                }
                if authenticated {
                    add(
                        "401",
                        "`unauthorized`: no, unknown or revoked bearer credential",
                    );
                    add("403", "`forbidden`: the credential may not do this");
                    add(
                        "429",
                        "`rate_limited`: too many requests; `Retry-After` says when to retry",
                    );
                }
            }
        }
    }
}

/// The OpenAPI document as JSON.
pub fn openapi_json() -> serde_json::Value {
    serde_json::to_value(ApiDoc::openapi()).unwrap_or_default()
}

pub(crate) async fn serve() -> Json<serde_json::Value> {
    Json(openapi_json())
}
