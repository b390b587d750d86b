//! The OpenAPI document: what the routes' annotations derive, and what
//! the server adds to it that they cannot know (the security schemes, the
//! configured lifetime bounds, the 429 of the rate limit on every
//! operation, the document's own route, what a malformed path id means).

use meatspace_domain::Policy;
use utoipa::OpenApi;
use utoipa::openapi::content::ContentBuilder;
use utoipa::openapi::path::{HttpMethod, OperationBuilder};
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};

use crate::auth;
use crate::http::{error, idempotency};

#[derive(OpenApi)]
#[openapi(
    info(title = "meatspace", description = "Hire people for work in the physical world."),
    // Relative: the paths are served where this document was fetched from.
    servers((url = "/", description = "This server")),
    modifiers(&SecuritySchemes),
    // Every error response refers to it (see `error::responses`).
    components(schemas(error::Problem)),
    tags((name = "agent", description = "For AI agents: create, publish and monitor tasks"),
         (name = "worker", description = "For people doing the work"),
         (name = "operator", description = "For operators: API keys, workers, invites, the audit trail"))
)]
struct ApiDoc;

struct SecuritySchemes;

impl utoipa::Modify for SecuritySchemes {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "dev_key",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::new(auth::DEV_KEY_HEADER))),
        );
        components.add_security_scheme(
            "api_key",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("msk_<key id>_<secret>")
                    .description(Some(
                        "An API key of an operator or agent principal. Its scopes (tasks, \
                         workers:register, invites, operator) are listed per operation; \
                         operator allows everything.",
                    ))
                    .build(),
            ),
        );
        for name in ["agent_token", "worker_token"] {
            components.add_security_scheme(
                name,
                SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
            );
        }
    }
}

/// The document the server serves: `openapi` (what the routes derive,
/// starting from [`base`]) with what the server adds, as JSON.
pub fn finish(mut openapi: utoipa::openapi::OpenApi, policy: &Policy) -> serde_json::Value {
    idempotency::document(&mut openapi);
    // The document lists itself: the capabilities document names it as an
    // endpoint, and clients discover routes from here.
    openapi.paths.add_path_operation(
        "/api/v1/openapi.json",
        vec![HttpMethod::Get],
        OperationBuilder::new()
            .tag("agent")
            .operation_id(Some("openapi"))
            .summary(Some("This OpenAPI document"))
            .response(
                "200",
                ResponseBuilder::new()
                    .description("The OpenAPI document of every API route")
                    .content(
                        "application/json",
                        ContentBuilder::new()
                            .schema(Some(ObjectBuilder::new().schema_type(Type::Object)))
                            .build(),
                    ),
            )
            .build(),
    );
    document_lifetime_bounds(&mut openapi, policy);
    document_rate_limit(&mut openapi);
    document_path_ids(&mut openapi);
    document_security(&mut openapi);
    let mut openapi = serde_json::to_value(&openapi).expect("the OpenAPI document is JSON");
    crate::event_schema::document(&mut openapi);
    openapi
}

/// The document's head: title, servers, security schemes, tags.
pub fn base() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// Writes the configured bounds of `expires_in_seconds` into the document:
/// they are settings, which the derived schema cannot know, and a client
/// (or a fuzzer) should not have to learn them from a 422.
fn document_lifetime_bounds(openapi: &mut utoipa::openapi::OpenApi, policy: &Policy) {
    use utoipa::openapi::RefOr;
    use utoipa::openapi::schema::Schema;
    let request = openapi
        .components
        .as_mut()
        .and_then(|c| c.schemas.get_mut("CreateTaskRequest"));
    let Some(RefOr::T(Schema::Object(request))) = request else {
        return;
    };
    if let Some(RefOr::T(Schema::Object(field))) = request.properties.get_mut("expires_in_seconds")
    {
        field.minimum = Some(policy.min_lifetime.num_seconds().into());
        field.maximum = Some(policy.max_lifetime.num_seconds().into());
    }
}

/// Declares the ids of a path that a handler reads through an extractor of
/// its own ([`auth::AgentAuth`], the worker routes' `TaskId`), which the
/// derived document cannot see: each is a UUID. And says on every id in
/// a path what the server does with one that is not a UUID: it names
/// nothing, so the answer is 404, as for an unknown id (a 400 would tell a
/// prober which ids are well-formed, and nothing more).
fn document_path_ids(openapi: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::Required;
    use utoipa::openapi::path::{ParameterBuilder, ParameterIn};
    use utoipa::openapi::schema::{KnownFormat, SchemaFormat};
    let uuid = ObjectBuilder::new()
        .schema_type(Type::String)
        .format(Some(SchemaFormat::KnownFormat(KnownFormat::Uuid)))
        .build();
    for (path, operation) in operations(openapi) {
        let parameters = operation.parameters.get_or_insert_with(Vec::new);
        let names = path.split('{').skip(1).filter_map(|s| s.split_once('}'));
        for (at, (name, _)) in names.enumerate() {
            let declared = parameters
                .iter()
                .any(|p| p.parameter_in == ParameterIn::Path && p.name == name);
            if !declared {
                let id = ParameterBuilder::new()
                    .name(name)
                    .parameter_in(ParameterIn::Path)
                    .required(Required::True)
                    .schema(Some(uuid.clone()));
                parameters.insert(at, id.build());
            }
        }
        for p in parameters.iter_mut() {
            if p.parameter_in == ParameterIn::Path && p.description.is_none() {
                p.description = Some(format!(
                    "The {} (a UUID, or an event id for event_id); a value that is not one \
                     names nothing and is answered 404, like an unknown id",
                    p.name.replace('_', " ")
                ));
            }
        }
        if parameters.is_empty() {
            operation.parameters = None;
        }
    }
}

/// Adds the 429 answer to every operation of the API routes: the rate
/// limit is a layer over all of them (see [`crate::http::rate_limit`]), so it is
/// documented in one place too.
fn document_rate_limit(openapi: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::header::HeaderBuilder;
    use utoipa::openapi::{ContentBuilder, Ref, RefOr};
    let response = ResponseBuilder::new()
        .description(
            "Too many requests (or open event streams and long polls) for this credential or \
             client address; retry after the given seconds",
        )
        .header(
            "Retry-After",
            HeaderBuilder::new()
                .schema(
                    utoipa::openapi::ObjectBuilder::new()
                        .schema_type(utoipa::openapi::schema::Type::Integer),
                )
                .description(Some("Seconds to wait before retrying"))
                .build(),
        )
        .content(
            error::PROBLEM_JSON,
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("Problem")))
                .build(),
        )
        .build();
    for (path, operation) in operations(openapi) {
        if path != "/api/v1/openapi.json" {
            operation
                .responses
                .responses
                .insert("429".to_owned(), RefOr::T(response.clone()));
        }
    }
}

/// Says what each part of the API takes, in one place each:
/// - the operator API (tagged `operator`) takes [`auth::Operator`]: an API
///   key with the `operator` scope, or the development key;
/// - the worker API (under `/api/v1/worker/`) takes [`auth::WorkerAuth`]:
///   a worker token;
/// - a task's routes (under `/api/v1/tasks/{task_id}`) take
///   [`auth::AgentAuth`]: the task's agent token, or an API key with the
///   `tasks` scope whose principal owns the task.
///
/// The other routes, and any route that differs, say on their own.
fn document_security(openapi: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::security::SecurityRequirement;
    for (path, operation) in operations(openapi) {
        let operator = operation.tags.iter().flatten().any(|t| t == "operator");
        let security = &mut operation.security;
        if security.is_some() {
            continue;
        }
        if operator {
            *security = Some(vec![
                SecurityRequirement::new("api_key", ["operator"]),
                SecurityRequirement::new::<_, _, &str>("dev_key", []),
            ]);
        } else if path.starts_with("/api/v1/worker/") {
            *security = Some(vec![SecurityRequirement::new::<_, _, &str>(
                "worker_token",
                [],
            )]);
        } else if path.starts_with("/api/v1/tasks/{task_id}") {
            *security = Some(vec![
                SecurityRequirement::new::<_, _, &str>("agent_token", []),
                SecurityRequirement::new("api_key", ["tasks"]),
            ]);
        }
    }
}

/// Every operation of the document, with its path.
fn operations(
    openapi: &mut utoipa::openapi::OpenApi,
) -> impl Iterator<Item = (&String, &mut utoipa::openapi::path::Operation)> {
    openapi.paths.paths.iter_mut().flat_map(|(path, item)| {
        let utoipa::openapi::PathItem {
            get,
            post,
            put,
            patch,
            delete,
            ..
        } = item;
        [get, post, put, patch, delete]
            .into_iter()
            .flatten()
            .map(move |operation| (path, operation))
    })
}
