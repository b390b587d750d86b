//! Probes and metrics: `/livez` (the process answers), `/readyz` (the
//! database answers, within a bound; 503 otherwise) and `/metrics`
//! (Prometheus text format).

use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::AppState;
use crate::error::ApiError;

/// How long readiness waits for the database.
const READY_TIMEOUT: Duration = Duration::from_secs(2);

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
}

async fn readyz(State(state): State<AppState>) -> Result<&'static str, ApiError> {
    match tokio::time::timeout(READY_TIMEOUT, state.store.ping()).await {
        Ok(Ok(())) => Ok("ok"),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "readiness check failed");
            Err(ApiError::Unavailable)
        }
        Err(_) => {
            tracing::warn!("readiness check timed out");
            Err(ApiError::Unavailable)
        }
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
