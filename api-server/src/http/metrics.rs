//! Prometheus metrics. The recorder is process-global (the `metrics` facade
//! is), so it is installed once and shared by every server and reconciler in
//! the process. HTTP metrics are labelled by route template, never by raw
//! path, so ids do not explode the label space.

use std::collections::HashMap;
use std::sync::{OnceLock, PoisonError, RwLock};
use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// The process's Prometheus recorder, installed on first use.
pub fn handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets(&[
                    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                ])
                .and_then(meatspace_controller::metrics::with_buckets)
                .expect("static bucket lists are not empty")
                .build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("a metrics recorder was already installed; /metrics will be empty");
            }
            handle
        })
        .clone()
}

/// Keeps histogram memory bounded; run for the life of the process.
pub async fn upkeep(handle: PrometheusHandle) {
    let mut every = tokio::time::interval(std::time::Duration::from_secs(5));
    loop {
        every.tick().await;
        handle.run_upkeep();
    }
}

/// The `method` label: the methods of RFC 9110 and PATCH by name, every
/// other (a client may send any token as a method) as `other`, so clients
/// cannot grow the label space.
pub fn method_label(method: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::CONNECT => "CONNECT",
        Method::OPTIONS => "OPTIONS",
        Method::TRACE => "TRACE",
        Method::PATCH => "PATCH",
        _ => "other",
    }
}

/// The router of the metrics listener: `GET /metrics` in the Prometheus
/// text format, and nothing else. It is served on its own address
/// (`MEATSPACE_METRICS_LISTEN_ADDR`), never on the public one, so the
/// Ingress cannot route to it and anonymous clients cannot read it.
pub fn router(handle: PrometheusHandle) -> axum::Router {
    use axum::http::{StatusCode, header};
    use axum::response::IntoResponse;
    axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let handle = handle.clone();
            async move {
                (
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                    handle.render(),
                )
                    .into_response()
            }
        }),
    )
}

/// Middleware recording request count and latency per route template.
pub async fn track(req: Request, next: Next) -> Response {
    let route = req.extensions().get::<MatchedPath>().cloned();
    let method = method_label(req.method());
    let started = Instant::now();
    let res = next.run(req).await;
    let route = route.as_ref().map_or("unmatched", MatchedPath::as_str);
    RouteMetrics::record(method, route, res.status().as_u16(), started.elapsed());
    res
}

/// The request counter and latency histogram of one label set (method,
/// route template, status), looked up in the recorder once and kept:
/// building a metric key per request (allocating its label strings,
/// hashing them, finding the key in the recorder's registry) cost more
/// than some requests it measured. The label space is bounded as the
/// metrics' is: route templates, [`method_label`]s and status codes.
struct RouteMetrics {
    requests: metrics::Counter,
    duration: metrics::Histogram,
}

type ByRoute = HashMap<String, HashMap<(&'static str, u16), RouteMetrics>>;

impl RouteMetrics {
    fn record(method: &'static str, route: &str, status: u16, took: std::time::Duration) {
        static KEPT: OnceLock<RwLock<ByRoute>> = OnceLock::new();
        let kept = KEPT.get_or_init(Default::default);
        let seconds = took.as_secs_f64();
        {
            let read = kept.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(m) = read.get(route).and_then(|r| r.get(&(method, status))) {
                m.requests.increment(1);
                m.duration.record(seconds);
                return;
            }
        }
        let labels = [
            ("method", method.to_owned()),
            ("route", route.to_owned()),
            ("status", status.to_string()),
        ];
        let m = RouteMetrics {
            requests: metrics::counter!("meatspace_http_requests_total", &labels),
            duration: metrics::histogram!("meatspace_http_request_duration_seconds", &labels),
        };
        m.requests.increment(1);
        m.duration.record(seconds);
        kept.write()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(route.to_owned())
            .or_default()
            .insert((method, status), m);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_methods_share_one_label() {
        for (method, label) in [
            ("GET", "GET"),
            ("PATCH", "PATCH"),
            ("BREW", "other"),
            ("get", "other"),
        ] {
            let method = axum::http::Method::from_bytes(method.as_bytes()).unwrap();
            assert_eq!(method_label(&method), label);
        }
    }
}
