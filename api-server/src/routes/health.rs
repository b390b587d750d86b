//! Probes: `/livez` (the process answers) and `/readyz` (the database
//! answers, as [`crate::http::availability`] sees it; 503 otherwise), and `/`,
//! which points a browser at the worker app and an API client at the
//! capabilities document. `/metrics` is served on its own listener
//! ([`crate::http::metrics::router`]).

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::AppState;
use crate::http::error::ApiError;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/", get(root))
}

/// `GET /`: whoever opens the bare address learns where to go. A browser
/// (asking for HTML) is sent to the worker app; anything else gets the
/// entry points as JSON.
async fn root(headers: axum::http::HeaderMap) -> Response {
    let wants_html = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/html"));
    if wants_html {
        return axum::response::Redirect::to("/app").into_response();
    }
    axum::Json(serde_json::json!({
        "service": "meatspace",
        "worker_app": "/app",
        "capabilities": "/api/v1/capabilities",
        "openapi": "/api/v1/openapi.json",
        "detail": "agents: start with GET /api/v1/capabilities; people doing tasks: open /app in a browser",
    }))
    .into_response()
}

/// Ready while the availability monitor sees the database answer: it
/// probes several times a second, so readiness flips within a second of an
/// outage and of the recovery, and a probe never waits on the database.
async fn readyz(State(state): State<AppState>) -> Result<&'static str, ApiError> {
    if state.availability.is_up() {
        Ok("ok")
    } else {
        Err(ApiError::Unavailable)
    }
}
