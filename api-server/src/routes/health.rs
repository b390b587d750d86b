//! Probes: `/livez` (the process answers) and `/readyz` (the database
//! answers, as [`crate::availability`] sees it; 503 otherwise). `/metrics`
//! is served on its own listener ([`crate::metrics::router`]).

use axum::Router;
use axum::extract::State;
use axum::routing::get;

use crate::AppState;
use crate::error::ApiError;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
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
