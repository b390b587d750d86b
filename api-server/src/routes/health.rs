//! Probes and metrics: `/livez` (the process answers), `/readyz` (the
//! database answers, as [`crate::availability`] sees it; 503 otherwise) and
//! `/metrics` (Prometheus text format).

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::AppState;
use crate::error::ApiError;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
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

async fn metrics(State(state): State<AppState>) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}
