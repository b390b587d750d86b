//! The meatspace HTTP API server as a library: [`router`] builds the whole
//! application from an [`AppState`], [`serve`] runs it on a listener until a
//! shutdown future resolves. `main.rs` only parses configuration and wires
//! these together, so tests run the real server on `127.0.0.1:0`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::{Request, StatusCode};
use axum::routing::get;
use meatspace_domain::{Command, Policy};
use meatspace_store::Store;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;
use utoipa::OpenApi;
use utoipa::openapi::content::ContentBuilder;
use utoipa::openapi::path::{HttpMethod, OperationBuilder};
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa_axum::router::OpenApiRouter;
use uuid::Uuid;

pub mod access;
pub mod agent_integrations;
pub mod auth;
pub mod availability;
pub mod config;
pub mod connection;
pub mod error;
pub mod event_schema;
pub mod extract;
pub mod fd_limit;
pub mod feed;
pub mod feed_heads;
pub mod idempotency;
pub mod mcp;
pub mod metrics;
pub mod photo;
pub mod protocol;
pub mod public_url;
pub mod rate_limit;
pub mod routes;
pub mod startup;
pub mod telemetry;
pub mod web;

use auth::DevKey;
use availability::Availability;
use error::ApiError;
use feed::Feed;
use photo::PhotoLimits;
use rate_limit::RateLimit;
use routes::TaskChange;

/// Largest JSON body.
pub const MAX_JSON_BYTES: usize = 64 * 1024;
/// How long one request may take before it is answered 408: the longest
/// long poll of the event feed plus time to do the work.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(routes::MAX_WAIT_SECONDS as u64 + 10);

/// How often an HTTP/2 connection is pinged, and how long the answer may take.
const HTTP2_PING_INTERVAL: Duration = Duration::from_secs(30);

/// What every handler shares: one reference-counted [`Shared`]. axum
/// clones the state for each middleware and extractor of every request; a
/// clone of this is one reference count, where a clone of the parts would
/// be a dozen, plus the allocations of those that own strings and lists.
#[derive(Debug, Clone)]
pub struct AppState(Arc<Shared>);

impl AppState {
    pub fn new(shared: Shared) -> Self {
        AppState(Arc::new(shared))
    }

    /// The state the binary serves, as `main` and the test harness build
    /// it: `settings` on `store`, with the parts every server makes for
    /// itself (the feed's hub, the availability probe, the credential
    /// caches, the metrics registry's handle).
    pub fn build(store: Arc<dyn Store>, settings: Settings) -> AppState {
        let credentials = auth::Credentials::default();
        AppState::new(Shared {
            feed: feed::Feed::start(Arc::clone(&store), credentials.clone()),
            availability: availability::Availability::start(Arc::clone(&store)),
            store,
            clock: settings.clock,
            dev_key: settings.dev_key,
            policy: settings.policy,
            photo_limits: settings.photo_limits,
            metrics: metrics::handle(),
            rate_limit: rate_limit::RateLimit::new(settings.rate_limit),
            integrations: settings.integrations,
            mcp_allowed_hosts: settings.mcp_allowed_hosts,
            credentials,
            agent_digests: auth::DigestCache::for_agents(),
            public_origin: settings.public_origin,
        })
    }
}

/// What a server is configured with (see [`AppState::build`]).
#[derive(Debug)]
pub struct Settings {
    pub clock: meatspace_domain::clock::Clock,
    pub dev_key: auth::DevKey,
    pub policy: Policy,
    pub photo_limits: PhotoLimits,
    pub rate_limit: rate_limit::RateLimitSettings,
    pub integrations: agent_integrations::Integrations,
    pub mcp_allowed_hosts: meatspace_mcp::AllowedHosts,
    pub public_origin: public_url::PublicOrigin,
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// The parts of [`AppState`].
#[derive(Debug)]
pub struct Shared {
    pub store: Arc<dyn Store>,
    /// Where every handler reads the time: the system's, or in tests one
    /// the test moves past a deadline.
    pub clock: meatspace_domain::clock::Clock,
    pub dev_key: DevKey,
    pub policy: Policy,
    pub photo_limits: PhotoLimits,
    pub metrics: PrometheusHandle,
    /// Wakes long polls of the event feed; close it when shutdown starts.
    pub feed: Feed,
    /// Whether the database answers; API requests fail fast while it does not.
    pub availability: Availability,
    /// Per-credential request limits of the API routes.
    pub rate_limit: RateLimit,
    /// Idempotency-Key, SSE and webhook settings and the server key.
    pub integrations: agent_integrations::Integrations,
    /// `Host` headers the MCP endpoint (`/mcp`) accepts.
    pub mcp_allowed_hosts: meatspace_mcp::AllowedHosts,
    /// API keys, worker token digests and task owners already read, which
    /// the feed's hub drops when the store announces a revocation.
    pub credentials: auth::Credentials,
    /// Agent token digests already read ([`auth::DigestCache::for_agents`]).
    pub agent_digests: auth::DigestCache,
    /// The origin of absolute links and the cookie `Secure` decision.
    pub public_origin: public_url::PublicOrigin,
}

impl AppState {
    /// Runs a command on a task now and returns the change. The store's
    /// engine decides it, limits included (a full feed refuses additions
    /// from every surface alike).
    pub async fn act(
        &self,
        task_id: Uuid,
        command: Command,
    ) -> Result<axum::Json<TaskChange>, ApiError> {
        let applied = self.store.apply(task_id, command, self.clock.now()).await?;
        Ok(axum::Json(routes::task_change(applied)))
    }

    /// [`AppState::act`] for an agent-side action, which its events
    /// attribute to `by`.
    pub async fn act_by(
        &self,
        task_id: Uuid,
        command: Command,
        by: meatspace_domain::identity::ActedBy,
    ) -> Result<axum::Json<TaskChange>, ApiError> {
        let applied = self
            .store
            .apply_by(task_id, command, by, self.clock.now())
            .await?;
        Ok(axum::Json(routes::task_change(applied)))
    }
}

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

/// Builds the application.
pub fn router(state: AppState) -> Router {
    // Every route that needs the database fails fast while it is down.
    // `Idempotency-Key` applies to these routes only (the API's
    // state-changing POSTs), inside the routing: a request reaches it
    // once its route is known, so the body limit is the route's own.
    let needs_database = OpenApiRouter::new()
        .merge(routes::tasks::router())
        .merge(routes::stream::router())
        .merge(routes::workers::router(state.photo_limits.max_bytes))
        .merge(routes::invites::router())
        .merge(routes::admin::router())
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            idempotency::middleware,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            availability::guard,
        ));
    let (api, openapi) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(routes::capabilities::router())
        .merge(needs_database)
        .split_for_parts();
    let mut openapi = openapi;
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
    document_lifetime_bounds(&mut openapi, &state.policy);
    document_rate_limit(&mut openapi);
    document_path_ids(&mut openapi);
    let mut openapi = serde_json::to_value(&openapi).expect("the OpenAPI document is JSON");
    event_schema::document(&mut openapi);
    let openapi = Arc::new(openapi);
    // MCP clients send the dev key as a header (their configuration), so
    // the limiter charges an MCP session to it, or to the client's address
    // without one; agent tokens travel inside the JSON-RPC body, and each
    // tool call checks them as the API routes do.
    let mcp = Router::new()
        .route_service(meatspace_mcp::HTTP_PATH, mcp::service(state.clone()))
        .layer(axum::middleware::map_response(
            mcp::transport_errors_as_problems,
        ))
        .layer(axum::middleware::map_request(mcp::with_peer_address));
    let routes = Router::new()
        .merge(api)
        .merge(mcp)
        .route(
            "/api/v1/openapi.json",
            get(move || async move { axum::Json(openapi.as_ref().clone()) }),
        )
        .merge(routes::health::router())
        .merge(web::router(state.photo_limits.max_bytes))
        .fallback(|| async { ApiError::NotFound("no such route".into()) })
        .method_not_allowed_fallback(|| async {
            ApiError::MethodNotAllowed("this route does not take that method".into())
        })
        .layer(axum::extract::DefaultBodyLimit::max(MAX_JSON_BYTES))
        // Every route and the fallback: the API, `/mcp`, the web app (its
        // sign-in too), the probes and unknown paths (see `rate_limit`).
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            rate_limit::limit,
        ))
        // Inside the routing, where the matched route template (its label)
        // is known; outside the idempotency and rate limit layers, so
        // replays and 429s count too.
        .layer(axum::middleware::from_fn(metrics::track))
        .with_state(state);
    // The layers every request passes through wrap the router once, as one
    // service: `Router::layer` would wrap each route in each layer, a boxed
    // service and future per layer and request.
    let stack = tower::ServiceBuilder::new()
        .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
        .layer(PropagateRequestIdLayer::x_request_id())
        // Its own span: the default one logs the URI, and invite codes
        // travel in paths (see `telemetry::request_span`).
        .layer(
            TraceLayer::new_for_http().make_span_with(telemetry::request_span::<axum::body::Body>),
        )
        .layer(axum::middleware::map_response(
            error::problem_for_every_error,
        ))
        // Responses with tower-http's body types back into axum's.
        .map_response(axum::response::IntoResponse::into_response)
        .layer(CatchPanicLayer::new())
        .map_response(axum::response::IntoResponse::into_response)
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            REQUEST_TIMEOUT,
        ))
        .service(routes);
    Router::new().fallback_service(stack)
}

/// Limits of the HTTP server's connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeOptions {
    /// Time a client has to send a request's headers, counted from the
    /// connection's start or from the end of the previous response: a
    /// client trickling headers (slowloris) or an idle keep-alive
    /// connection is closed after it. An HTTP/2 connection is closed
    /// (gracefully) once it has carried no request for as long.
    pub header_read_timeout: Duration,
    /// Most connections open at once; past it the server stops accepting
    /// (new clients wait in the listen backlog) until one closes.
    pub max_connections: usize,
    /// Requests one HTTP/2 connection may have in flight at once.
    pub http2_max_streams: u32,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            header_read_timeout: Duration::from_secs(10),
            max_connections: 20_000,
            http2_max_streams: 1_000,
        }
    }
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

/// Says on every id in a path what the server does with one that is not a
/// UUID: it names nothing, so the answer is 404, as for an unknown id (a
/// 400 would tell a prober which ids are well-formed, and nothing more).
fn document_path_ids(openapi: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::path::ParameterIn;
    for item in openapi.paths.paths.values_mut() {
        let operations = [
            &mut item.get,
            &mut item.post,
            &mut item.put,
            &mut item.delete,
            &mut item.patch,
        ];
        for operation in operations.into_iter().flatten() {
            for p in operation.parameters.iter_mut().flatten() {
                if p.parameter_in == ParameterIn::Path && p.description.is_none() {
                    p.description = Some(format!(
                        "The {} (a UUID, or an event id for event_id); a value that is not one \
                         names nothing and is answered 404, like an unknown id",
                        p.name.replace('_', " ")
                    ));
                }
            }
        }
    }
}

/// Adds the 429 answer to every operation of the API routes: the rate
/// limit is a layer over all of them (see [`rate_limit`]), so it is
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
    for (path, item) in openapi.paths.paths.iter_mut() {
        if path == "/api/v1/openapi.json" {
            continue;
        }
        let operations = [
            &mut item.get,
            &mut item.post,
            &mut item.put,
            &mut item.patch,
            &mut item.delete,
        ];
        for operation in operations.into_iter().flatten() {
            operation
                .responses
                .responses
                .insert("429".to_owned(), RefOr::T(response.clone()));
        }
    }
}

/// Serves `app` on `listener` until `shutdown` resolves, then finishes the
/// requests in flight. Close the [`Feed`] in `shutdown` so that long polls
/// answer at once instead of holding the shutdown up.
///
/// The accept loop is hyper's rather than `axum::serve`, for what
/// `axum::serve` does not offer: a header-read timeout (which hyper also
/// applies to idle HTTP/1.1 keep-alive connections), a cap on concurrent
/// connections, so a slow or idle client cannot hold sockets for ever, and
/// HTTP/2 with prior knowledge next to HTTP/1.1 on the same port (see
/// [`protocol`]).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use hyper::body::Incoming;
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use std::convert::Infallible;
    use tower::ServiceExt;

    // u32: what `acquire_many` takes back at shutdown.
    let max_connections = u32::try_from(options.max_connections)
        .unwrap_or(u32::MAX)
        .max(1);
    let permits = Arc::new(tokio::sync::Semaphore::new(max_connections as usize));
    let (stopping, stop) = tokio::sync::watch::channel(false);
    let mut http1 = hyper::server::conn::http1::Builder::new();
    http1
        .timer(TokioTimer::new())
        .header_read_timeout(options.header_read_timeout)
        .keep_alive(true);
    let mut http2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    http2
        .timer(TokioTimer::new())
        .max_concurrent_streams(options.http2_max_streams)
        // Pings find peers that went away without closing the connection.
        .keep_alive_interval(Some(HTTP2_PING_INTERVAL))
        .keep_alive_timeout(HTTP2_PING_INTERVAL);
    let (http1, http2) = (Arc::new(http1), Arc::new(http2));
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            biased;
            () = &mut shutdown => break,
            permit = Arc::clone(&permits).acquire_owned() => permit.expect("the semaphore is never closed"),
        };
        let (stream, peer) = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors or similar: pause rather than spin.
                    tracing::error!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let (http1, http2) = (Arc::clone(&http1), Arc::clone(&http2));
        let mut stop = stop.clone();
        let header_read_timeout = options.header_read_timeout;
        tokio::spawn(async move {
            let detected = tokio::select! {
                detected = protocol::detect(stream, header_read_timeout) => detected,
                // No request started: nothing to finish.
                _ = stop.wait_for(|stopping| *stopping) => return,
            };
            let ended = match detected {
                Ok((protocol::Protocol::Http1, io)) => {
                    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                        app.clone().oneshot(with_peer(req, peer))
                    });
                    let connection = http1.serve_connection(TokioIo::new(io), service);
                    connection::drive(connection, stop, None)
                        .await
                        .map_err(|e| e.to_string())
                }
                Ok((protocol::Protocol::Http2, io)) => {
                    let activity = connection::Activity::new();
                    let service = hyper::service::service_fn({
                        let activity = Arc::clone(&activity);
                        move |req: Request<Incoming>| {
                            let in_flight = activity.begin();
                            let response = app.clone().oneshot(with_peer(req, peer));
                            async move {
                                let response = response.await?;
                                Ok::<_, Infallible>(response.map(|body| {
                                    axum::body::Body::new(connection::Tracked::new(body, in_flight))
                                }))
                            }
                        }
                    });
                    let connection = http2.serve_connection(TokioIo::new(io), service);
                    connection::drive(connection, stop, Some((activity, header_read_timeout)))
                        .await
                        .map_err(|e| e.to_string())
                }
                Err(e) => Err(format!("before its first request: {e}")),
            };
            if let Err(e) = ended {
                tracing::debug!(error = %e, %peer, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    // Every connection shuts down gracefully and returns its permit at its end.
    let _ = stopping.send(true);
    let _ = permits.acquire_many(max_connections).await;
    Ok(())
}

/// The request as the router takes it, with the client's address.
fn with_peer(
    mut req: Request<hyper::body::Incoming>,
    peer: std::net::SocketAddr,
) -> Request<axum::body::Body> {
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(peer));
    req.map(axum::body::Body::new)
}
