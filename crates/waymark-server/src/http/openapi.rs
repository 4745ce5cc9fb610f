//! The OpenAPI document of API v1, generated from the handlers' annotations and the wire
//! types (`openapi_json`) into `openapi/v1.json`, which is what `/v1/openapi.json` serves. The
//! server serves the checked-in file, deflated in the binary, instead of building the document
//! at run time: utoipa's generated code is ≈ 0.6 MB of every binary that embeds a control plane
//! (the app's too), for a document that only changes when the code does. The test
//! `the_served_document_is_the_checked_in_one` fails when the file drifts from the code.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use utoipa::OpenApi;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};

use crate::http::{
    self, admin, attempts, blobs, claude_code, commands, decisions, delegates, devices, effects,
    escalation, events, followups, push, rules, runner, tasks,
};

#[derive(OpenApi)]
#[openapi(
    info(title = "Waymark API", version = "1", description = "The durable record of long-running agent runs. Every write that changes state answers with the event `cursor` of the change."),
    paths(
        http::healthz,
        tasks::create_task,
        tasks::task_detail,
        attempts::start_attempt,
        attempts::heartbeat,
        attempts::finish,
        tasks::append_checkpoint,
        effects::declare_effect,
        effects::update_effect,
        decisions::request_approval,
        decisions::request_decision,
        decisions::get_decision,
        decisions::report_delivery,
        decisions::expire_decision,
        tasks::upload_artifact,
        tasks::submit_test_receipt,
        tasks::append_messages,
        tasks::report_usage,
        tasks::reconcile,
        attempts::released,
        followups::create,
        followups::get,
        attempts::control_stream,
        devices::pair,
        devices::open_session,
        commands::submit,
        devices::list,
        devices::receipts,
        escalation::get_escalation,
        escalation::put_escalation,
        escalation::delete_escalation,
        delegates::list_delegates,
        delegates::add_delegate,
        delegates::remove_delegate,
        delegates::accept_delegation,
        delegates::decline_delegation,
        rules::list,
        devices::register_push,
        devices::list_push,
        push::vapid,
        claude_code::hook,
        runner::list,
        runner::register,
        runner::work,
        runner::report,
        runner::exited,
        events::snapshot,
        events::events,
        blobs::blob,
        admin::admin_resolve,
        admin::admin_prune,
        admin::admin_audit,
        admin::admin_ledger,
    ),
    components(schemas(waymark_proto::Event, waymark_proto::EventKind, waymark_proto::ErrorCode, waymark_proto::RuleSpec, waymark_proto::CallFacts)),
    modifiers(&BearerAuth, &CommonProblems, &TimeZones, &NoNul, &Links),
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

/// A follow-up's `time_zone` is one of the IANA zones the server knows: the bundled database's
/// names, the same on every machine (`domain::zone`).
struct TimeZones;

impl utoipa::Modify for TimeZones {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::{RefOr, Schema};
        let Some(RefOr::T(Schema::Object(followup))) = doc
            .components
            .as_mut()
            .and_then(|c| c.schemas.get_mut("CreateFollowup"))
        else {
            return;
        };
        if let Some(RefOr::T(Schema::Object(tz))) = followup.properties.get_mut("time_zone") {
            let mut zones: Vec<serde_json::Value> = crate::domain::zone::Zone::bundled_names()
                .into_iter()
                .map(Into::into)
                .collect();
            zones.push(serde_json::Value::Null);
            tz.enum_values = Some(zones);
        }
    }
}

/// The JSON extractor refuses a body with NUL (U+0000) in any string (`crate::extract`): every
/// string field of a request body says so with a pattern (those with a pattern of their own
/// exclude NUL there).
struct NoNul;

const NO_NUL: &str = r"^[^\x00]*$";

impl utoipa::Modify for NoNul {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::RefOr;
        let mut todo: Vec<String> = doc
            .paths
            .paths
            .values()
            .flat_map(|item| {
                [&item.get, &item.post, &item.put, &item.patch, &item.delete]
                    .into_iter()
                    .flatten()
            })
            .filter_map(|op| op.request_body.as_ref())
            .flat_map(|body| body.content.values())
            .filter_map(|c| match &c.schema {
                Some(RefOr::Ref(r)) => Some(r.ref_location.clone()),
                _ => None,
            })
            .collect();
        let Some(components) = doc.components.as_mut() else {
            return;
        };
        let mut seen = std::collections::BTreeSet::new();
        while let Some(location) = todo.pop() {
            let name = location
                .trim_start_matches("#/components/schemas/")
                .to_owned();
            if !seen.insert(name.clone()) {
                continue;
            }
            if let Some(schema) = components.schemas.get_mut(&name) {
                exclude_nul(schema, &mut todo);
            }
        }
    }
}

/// Adds [`NO_NUL`] to the strings of a schema without a pattern; collects the references.
fn exclude_nul(
    schema: &mut utoipa::openapi::RefOr<utoipa::openapi::Schema>,
    refs: &mut Vec<String>,
) {
    use utoipa::openapi::schema::{ArrayItems, SchemaType, Type};
    use utoipa::openapi::{RefOr, Schema};
    match schema {
        RefOr::Ref(r) => refs.push(r.ref_location.clone()),
        RefOr::T(Schema::Object(o)) => {
            let string = match &o.schema_type {
                SchemaType::Type(t) => *t == Type::String,
                SchemaType::Array(ts) => ts.contains(&Type::String),
                SchemaType::AnyValue => false,
            };
            if string && o.pattern.is_none() && o.format.is_none() && o.enum_values.is_none() {
                o.pattern = Some(NO_NUL.to_owned());
            }
            for p in o.properties.values_mut() {
                exclude_nul(p, refs);
            }
        }
        RefOr::T(Schema::Array(a)) => {
            if let ArrayItems::RefOrSchema(items) = &mut a.items {
                exclude_nul(items, refs);
            }
        }
        RefOr::T(Schema::OneOf(x)) => x.items.iter_mut().for_each(|s| exclude_nul(s, refs)),
        RefOr::T(Schema::AllOf(x)) => x.items.iter_mut().for_each(|s| exclude_nul(s, refs)),
        RefOr::T(Schema::AnyOf(x)) => x.items.iter_mut().for_each(|s| exclude_nul(s, refs)),
        _ => {}
    }
}

/// Links between operations (OpenAPI `links`): the ids an answer carries, fed to the operations
/// that take them — a created task's `id` to its attempts, checkpoints, effects, decisions…; an
/// attempt's `id` and `fence` to its heartbeat, finish and fenced writes; an effect's `id` to
/// its update and approval; a decision's to its reads and reports; a follow-up's to its read.
/// Clients and stateful fuzzers (`scripts/api-fuzz`) follow them from one answer to the next
/// request. Fenced writes get the attempt's credentials in the request body, merged into the
/// rest of it.
struct Links;

/// A link: its name, the operation it leads to, and that operation's parameters and
/// request-body fields as runtime expressions over the answer.
type LinkSpec = (&'static str, &'static str, Params, Params);
type Params = &'static [(&'static str, &'static str)];

/// The attempt's credentials of a fenced write, from an `Attempt` answer.
const ATTEMPT_FENCE: Params = &[
    ("attempt_id", "$response.body#/id"),
    ("fence", "$response.body#/fence"),
];
const FENCE: Params = &[("fence", "$response.body#/fence")];
const NONE: Params = &[];
const TASK_ID: Params = &[("path.task", "$response.body#/id")];
const ATTEMPT_TASK: Params = &[("path.task", "$response.body#/task_id")];
const ATTEMPT_ID: Params = &[("path.attempt", "$response.body#/id")];
const DECISION: Params = &[
    ("path.task", "$response.body#/task_id"),
    ("path.decision", "$response.body#/id"),
];
const DECISION_ID: Params = &[("path.decision", "$response.body#/id")];

/// From the answers (by status) of an operation, the links.
const LINKS: &[(&str, &[&str], &[LinkSpec])] = &[
    // A task, created or found again: everything that takes `{task}`.
    (
        "create_task",
        &["201", "200"],
        &[
            ("TaskDetail", "task_detail", TASK_ID, NONE),
            ("StartAttempt", "start_attempt", TASK_ID, NONE),
            ("RequestApproval", "request_approval", TASK_ID, NONE),
            ("RequestDecision", "request_decision", TASK_ID, NONE),
            ("AppendMessages", "append_messages", TASK_ID, NONE),
            ("ReportUsage", "report_usage", TASK_ID, NONE),
            ("UploadArtifact", "upload_artifact", TASK_ID, NONE),
            ("CreateFollowup", "create", TASK_ID, NONE),
            ("CommandLedger", "admin_ledger", TASK_ID, NONE),
        ],
    ),
    // An attempt: its lease, and its task's writes with its credentials.
    (
        "start_attempt",
        &["201"],
        &[
            ("Heartbeat", "heartbeat", ATTEMPT_ID, FENCE),
            ("Finish", "finish", ATTEMPT_ID, FENCE),
            ("Released", "released", ATTEMPT_ID, FENCE),
            (
                "AppendCheckpoint",
                "append_checkpoint",
                ATTEMPT_TASK,
                ATTEMPT_FENCE,
            ),
            (
                "DeclareEffect",
                "declare_effect",
                ATTEMPT_TASK,
                ATTEMPT_FENCE,
            ),
            (
                "SubmitTestReceipt",
                "submit_test_receipt",
                ATTEMPT_TASK,
                ATTEMPT_FENCE,
            ),
            ("Reconcile", "reconcile", ATTEMPT_TASK, ATTEMPT_FENCE),
            (
                "RequestApproval",
                "request_approval",
                ATTEMPT_TASK,
                ATTEMPT_FENCE,
            ),
            (
                "RequestDecision",
                "request_decision",
                ATTEMPT_TASK,
                ATTEMPT_FENCE,
            ),
            (
                "AppendMessages",
                "append_messages",
                ATTEMPT_TASK,
                ATTEMPT_FENCE,
            ),
            ("ReportUsage", "report_usage", ATTEMPT_TASK, ATTEMPT_FENCE),
            ("CreateFollowup", "create", ATTEMPT_TASK, NONE),
            (
                "UploadArtifact",
                "upload_artifact",
                &[
                    ("path.task", "$response.body#/task_id"),
                    ("query.attempt_id", "$response.body#/id"),
                    ("query.fence", "$response.body#/fence"),
                ],
                NONE,
            ),
        ],
    ),
    // A finished attempt: the task's next one.
    (
        "finish",
        &["200"],
        &[("StartAttempt", "start_attempt", ATTEMPT_TASK, NONE)],
    ),
    // An effect: its updates, and the approval that allows it (by the attempt that declared it).
    (
        "declare_effect",
        &["201", "200"],
        &[
            (
                "UpdateEffect",
                "update_effect",
                &[("path.effect", "$response.body#/effect/id")],
                &[
                    ("attempt_id", "$response.body#/effect/attempt_id"),
                    ("fence", "$response.body#/effect/fence"),
                ],
            ),
            (
                "RequestApproval",
                "request_approval",
                &[("path.task", "$response.body#/effect/task_id")],
                &[
                    ("effect_id", "$response.body#/effect/id"),
                    ("attempt_id", "$response.body#/effect/attempt_id"),
                    ("fence", "$response.body#/effect/fence"),
                ],
            ),
        ],
    ),
    (
        "update_effect",
        &["200"],
        &[(
            "UpdateEffect",
            "update_effect",
            &[("path.effect", "$response.body#/id")],
            &[
                ("attempt_id", "$response.body#/attempt_id"),
                ("fence", "$response.body#/fence"),
            ],
        )],
    ),
    // A decision: its read, the runtime's reports, the admin's answer.
    (
        "request_approval",
        &["201"],
        &[
            ("GetDecision", "get_decision", DECISION, NONE),
            ("ReportDelivery", "report_delivery", DECISION, NONE),
            ("ExpireDecision", "expire_decision", DECISION, NONE),
            ("Resolve", "admin_resolve", DECISION_ID, NONE),
        ],
    ),
    (
        "request_decision",
        &["201"],
        &[
            ("GetDecision", "get_decision", DECISION, NONE),
            ("Resolve", "admin_resolve", DECISION_ID, NONE),
        ],
    ),
    (
        "admin_resolve",
        &["200"],
        &[("ReportDelivery", "report_delivery", DECISION, NONE)],
    ),
    // A follow-up: its plan.
    (
        "create",
        &["201"],
        &[(
            "GetFollowup",
            "get",
            &[("path.followup", "$response.body#/id")],
            NONE,
        )],
    ),
];

impl utoipa::Modify for Links {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::RefOr;
        use utoipa::openapi::link::LinkBuilder;
        for (from, statuses, links) in LINKS {
            let Some(op) = doc.paths.paths.values_mut().find_map(|item| {
                [
                    &mut item.get,
                    &mut item.post,
                    &mut item.put,
                    &mut item.patch,
                    &mut item.delete,
                ]
                .into_iter()
                .flatten()
                .find(|op| op.operation_id.as_deref() == Some(*from))
            }) else {
                continue;
            };
            for (name, to, parameters, body) in *links {
                let mut link = LinkBuilder::new().operation_id(*to);
                for (name, value) in *parameters {
                    link = link.parameter(*name, *value);
                }
                if !body.is_empty() {
                    let body: serde_json::Map<String, serde_json::Value> = body
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).into()))
                        .collect();
                    link = link.request_body(Some(body));
                }
                let link = link.build();
                for status in *statuses {
                    if let Some(RefOr::T(response)) = op.responses.responses.get_mut(*status) {
                        response
                            .links
                            .insert((*name).to_owned(), link.clone().into());
                    }
                }
            }
        }
    }
}

/// The OpenAPI document as JSON.
pub fn openapi_json() -> serde_json::Value {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap_or_default();
    spell_links(&mut doc);
    doc
}

/// utoipa 5.5 writes a Link Object's fields as Rust names (`operation_id`, `request_body`);
/// OpenAPI spells them `operationId`, `operationRef` and `requestBody`.
fn spell_links(doc: &mut serde_json::Value) {
    let Some(paths) = doc.get_mut("paths").and_then(|p| p.as_object_mut()) else {
        return;
    };
    let links = paths
        .values_mut()
        .filter_map(|item| item.as_object_mut())
        .flat_map(|item| item.values_mut())
        .filter_map(|op| op.get_mut("responses")?.as_object_mut())
        .flat_map(|responses| responses.values_mut())
        .filter_map(|r| r.get_mut("links")?.as_object_mut())
        .flat_map(|links| links.values_mut())
        .filter_map(|link| link.as_object_mut());
    for link in links {
        for (rust, openapi) in [
            ("operation_id", "operationId"),
            ("operation_ref", "operationRef"),
            ("request_body", "requestBody"),
        ] {
            if let Some(v) = link.remove(rust) {
                link.insert(openapi.to_owned(), v);
            }
        }
    }
}

/// The document as generated now, as `openapi/v1.json` holds it: pretty JSON and a newline.
pub fn openapi_file() -> String {
    let mut text = serde_json::to_string_pretty(&openapi_json()).unwrap_or_default();
    text.push('\n');
    text
}

/// Where the checked-in document lives, from the server crate's directory.
pub const OPENAPI_PATH: &str = "openapi/v1.json";

#[derive(rust_embed::Embed)]
#[folder = "openapi/"]
struct Document;

pub(crate) async fn serve() -> Response {
    match Document::get("v1.json") {
        Some(file) => (
            [(header::CONTENT_TYPE, "application/json")],
            file.data.into_owned(),
        )
            .into_response(),
        None => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "this build holds no OpenAPI document",
        )
            .into_response(),
    }
}
