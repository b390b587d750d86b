//! The controller binary's small HTTP surface for Kubernetes and Prometheus:
//! `/livez` (the process answers), `/readyz` (the database answers within a
//! timeout, else 503) and `/metrics` (Prometheus text format).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use meatspace_store::Store;
use metrics_exporter_prometheus::PrometheusHandle;

/// How long `/readyz` waits for the database. Shorter than a typical probe
/// timeout, so a hung database reads as "not ready" rather than as a probe
/// that timed out.
const READY_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Clone)]
struct Health {
    store: Arc<dyn Store>,
    metrics: PrometheusHandle,
}

/// The router of `/livez`, `/readyz` and `/metrics`.
pub fn router(store: Arc<dyn Store>, metrics: PrometheusHandle) -> Router {
    Router::new()
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/metrics", get(render))
        .with_state(Health { store, metrics })
}

async fn livez() -> &'static str {
    "ok\n"
}

async fn readyz(State(h): State<Health>) -> (StatusCode, String) {
    match tokio::time::timeout(READY_TIMEOUT, h.store.ping()).await {
        Ok(Ok(())) => (StatusCode::OK, "ok\n".into()),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "not ready: the database does not answer");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "database unavailable\n".into(),
            )
        }
        Err(_) => {
            tracing::warn!("not ready: the database did not answer within {READY_TIMEOUT:?}");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "database unavailable\n".into(),
            )
        }
    }
}

async fn render(State(h): State<Health>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        h.metrics.render(),
    )
}
