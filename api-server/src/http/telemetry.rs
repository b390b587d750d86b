//! Logging setup: `tracing` to stderr, level from `RUST_LOG`; and the span
//! of each request, which logs its path with credentials redacted.

use tracing_subscriber::EnvFilter;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Installs the global subscriber once, as the controller binary does
/// ([`meatspace_controller::telemetry::init`]); later calls do nothing.
/// The filter is `RUST_LOG`, or `info` when it is unset or not valid.
pub fn init(format: LogFormat) {
    use meatspace_controller::telemetry;
    let format = match format {
        LogFormat::Text => telemetry::LogFormat::Text,
        LogFormat::Json => telemetry::LogFormat::Json,
    };
    let from_env = std::env::var(EnvFilter::DEFAULT_ENV).ok();
    if from_env.is_none_or(|filter| telemetry::init(&filter, format).is_err()) {
        let _ = telemetry::init("info", format);
    }
}

/// The span of one request: method and path, with every path segment that
/// is a credential (an invite code `msi_…` in `/app/invite/…`, or any
/// other `ms?_` token or `whsec_` secret a client puts in a path)
/// replaced by `<redacted>`, and without the query string, so that
/// `RUST_LOG=debug` logs no credential. Headers are never logged.
pub fn request_span<B>(req: &axum::http::Request<B>) -> tracing::Span {
    tracing::debug_span!(
        "request",
        method = %req.method(),
        path = %redacted_path(req.uri().path()),
        version = ?req.version(),
    )
}

/// `path` with credential segments replaced (see [`request_span`]). A
/// segment is judged after percent-decoding, as the router would read it.
pub fn redacted_path(path: &str) -> String {
    path.split('/')
        .map(|segment| {
            if is_credential(&percent_decoded(segment)) {
                "<redacted>"
            } else {
                segment
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// Whether a path segment looks like a credential of this server:
/// `ms` + a letter + `_` (`msi_`, `mst_`, `msw_`, `msd_`, `mss_`, and
/// prefixes yet to come) or a webhook secret (`whsec_`).
fn is_credential(segment: &str) -> bool {
    let lower = segment.to_ascii_lowercase();
    let b = lower.as_bytes();
    (b.len() > 4 && b.starts_with(b"ms") && b[2].is_ascii_alphabetic() && b[3] == b'_')
        || lower.starts_with("whsec_")
}

fn percent_decoded(segment: &str) -> String {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && let (Some(hi), Some(lo)) = (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            )
        {
            out.push((hi * 16 + lo) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_in_paths_are_redacted_and_the_rest_kept() {
        let code = "msi_0b6d4c1e-7a5e-4a57-9d0e-3c1f1c7b2a11_c2VjcmV0";
        assert_eq!(
            redacted_path(&format!("/app/invite/{code}")),
            "/app/invite/<redacted>"
        );
        // Percent-encoded, as a client may send it.
        assert_eq!(
            redacted_path("/app/invite/%6Dsi_abc_def"),
            "/app/invite/<redacted>"
        );
        assert_eq!(redacted_path("/x/whsec_abc"), "/x/<redacted>");
        let plain = "/api/v1/tasks/0b6d4c1e-7a5e-4a57-9d0e-3c1f1c7b2a11/events";
        assert_eq!(redacted_path(plain), plain);
        assert_eq!(redacted_path("/app/tasks"), "/app/tasks");
        assert_eq!(redacted_path("/"), "/");
    }
}
