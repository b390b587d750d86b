//! The meatspace HTTP API server as a library: [`router`] builds the whole
//! application from an [`AppState`], [`serve`] runs it on a listener until a
//! shutdown future resolves. `main.rs` only parses configuration and wires
//! these together, so tests run the real server on `127.0.0.1:0`.
//!
//! Where things are: a route's handler in [`routes`] (one module per
//! resource), the worker web app in [`web`], the MCP endpoint in [`mcp`];
//! what every request passes through in [`http`] (errors, extractors,
//! middleware, the accept loop); credentials in [`auth`]; what handlers
//! share in [`state`].

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;
use utoipa_axum::router::OpenApiRouter;

pub mod access;
pub mod agent_integrations;
pub mod auth;
pub mod config;
pub mod event_schema;
pub mod fd_limit;
pub mod feed;
pub mod feed_heads;
pub mod http;
pub mod mcp;
pub mod openapi;
pub mod photo;
pub mod public_url;
pub mod routes;
pub mod startup;
pub mod state;
pub mod web;

pub use http::serve::{ServeOptions, serve};
pub use state::{AppState, Settings, Shared};

use http::error::ApiError;
use http::{availability, error, idempotency, metrics, rate_limit, telemetry};

/// Largest JSON body.
pub const MAX_JSON_BYTES: usize = 64 * 1024;
/// How long one request may take before it is answered 408: the longest
/// long poll of the event feed plus time to do the work.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(routes::events::MAX_WAIT_SECONDS as u64 + 10);

/// Builds the application.
pub fn router(state: AppState) -> Router {
    // Every route that needs the database fails fast while it is down.
    // `Idempotency-Key` applies to these routes only (the API's
    // state-changing POSTs), inside the routing: a request reaches it
    // once its route is known, so the body limit is the route's own.
    let needs_database = OpenApiRouter::new()
        .merge(routes::tasks::router())
        .merge(routes::stream::router())
        .merge(routes::worker_tasks::router(state.photo_limits.max_bytes))
        .merge(routes::workers::router())
        .merge(routes::qualifications::router())
        .merge(routes::notifications::router())
        .merge(routes::invites::router())
        .merge(routes::keys::router())
        .merge(routes::audit::router())
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            idempotency::middleware,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            availability::guard,
        ));
    let (api, openapi) = OpenApiRouter::with_openapi(openapi::base())
        .merge(routes::capabilities::router())
        .merge(needs_database)
        .split_for_parts();
    let openapi = Arc::new(openapi::finish(openapi, &state.policy));
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
