//! Where people and agents reach this server: the origin of every absolute
//! link it hands out (invite links) and the one that decides whether its
//! cookies are `Secure`.
//!
//! A client chooses its own `Host` and `X-Forwarded-Proto` headers, so they
//! cannot be trusted for either: `Host: evil.example` would mint invite
//! links to the attacker's site, and a proxy that drops `X-Forwarded-Proto`
//! would get session cookies without `Secure`. A deployment therefore
//! states its public URL (`MEATSPACE_PUBLIC_URL`; the Helm chart sets it
//! from the Ingress). Only a server that listens on loopback may go without
//! one (the embedded default, `127.0.0.1:8080`): then only local clients
//! can reach it, and the origin is taken from the request as before.

use axum::http::{HeaderMap, header};

/// The server's public origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublicOrigin {
    /// From `MEATSPACE_PUBLIC_URL`: `scheme://host[:port]`, as browsers
    /// write it in an `Origin` header.
    Configured {
        origin: String,
        /// The URL is https: cookies are `Secure` and the pre-session
        /// cookie takes the `__Host-` prefix.
        secure: bool,
    },
    /// None configured, on a loopback listener only: the request's `Host`,
    /// and https when a proxy says `X-Forwarded-Proto: https`.
    FromRequest,
}

/// Why a public URL is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublicUrlError {
    #[error("MEATSPACE_PUBLIC_URL is not an absolute URL ({0})")]
    Malformed(String),
    #[error("MEATSPACE_PUBLIC_URL must use http or https")]
    Scheme,
    #[error(
        "MEATSPACE_PUBLIC_URL must be an origin (scheme://host[:port]), without a user, path, query or fragment"
    )]
    NotAnOrigin,
    #[error(
        "MEATSPACE_PUBLIC_URL is not set, and the server listens on {0}, which is not a loopback \
         address: links and cookies would trust the client's Host and X-Forwarded-Proto headers. \
         Set MEATSPACE_PUBLIC_URL to the URL people open (e.g. https://meatspace.example.com)"
    )]
    Required(std::net::SocketAddr),
}

impl PublicOrigin {
    /// The origin of `raw` (`MEATSPACE_PUBLIC_URL`), checked.
    pub fn parse(raw: &str) -> Result<PublicOrigin, PublicUrlError> {
        let url =
            url::Url::parse(raw.trim()).map_err(|e| PublicUrlError::Malformed(e.to_string()))?;
        let secure = match url.scheme() {
            "https" => true,
            "http" => false,
            _ => return Err(PublicUrlError::Scheme),
        };
        if url.host().is_none()
            || !url.username().is_empty()
            || url.password().is_some()
            || url.path() != "/"
            || url.query().is_some()
            || url.fragment().is_some()
        {
            return Err(PublicUrlError::NotAnOrigin);
        }
        Ok(PublicOrigin::Configured {
            origin: url.origin().ascii_serialization(),
            secure,
        })
    }

    /// The setting in effect for a server listening on `listen`: the
    /// configured URL, or the request's own origin on loopback only.
    pub fn for_listener(
        configured: Option<&str>,
        listen: std::net::SocketAddr,
    ) -> Result<PublicOrigin, PublicUrlError> {
        match configured.map(str::trim).filter(|s| !s.is_empty()) {
            Some(raw) => PublicOrigin::parse(raw),
            None if listen.ip().is_loopback() => Ok(PublicOrigin::FromRequest),
            None => Err(PublicUrlError::Required(listen)),
        }
    }

    /// `scheme://host[:port]` of links for this request.
    pub fn origin(&self, headers: &HeaderMap) -> String {
        match self {
            PublicOrigin::Configured { origin, .. } => origin.clone(),
            PublicOrigin::FromRequest => {
                let host = headers
                    .get(header::HOST)
                    .and_then(|v| v.to_str().ok())
                    .filter(|h| !h.is_empty() && h.chars().all(|c| c.is_ascii_graphic()))
                    .unwrap_or("localhost");
                let scheme = if forwarded_https(headers) {
                    "https"
                } else {
                    "http"
                };
                format!("{scheme}://{host}")
            }
        }
    }

    /// Whether cookies set in answer to this request are `Secure`.
    pub fn secure(&self, headers: &HeaderMap) -> bool {
        match self {
            PublicOrigin::Configured { secure, .. } => *secure,
            PublicOrigin::FromRequest => forwarded_https(headers),
        }
    }
}

/// A proxy in front said the request came over TLS.
fn forwarded_https(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Request headers from name-value pairs (the web session's tests use
    /// it too).
    pub(crate) fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn a_configured_url_ignores_the_clients_host_and_proto() {
        let public = PublicOrigin::parse("https://meatspace.example.com/").unwrap();
        let evil = headers(&[("host", "evil.example"), ("x-forwarded-proto", "http")]);
        assert_eq!(public.origin(&evil), "https://meatspace.example.com");
        assert!(public.secure(&evil));
        let plain = PublicOrigin::parse("http://10.1.2.3:8080").unwrap();
        let https = headers(&[("x-forwarded-proto", "https")]);
        assert_eq!(plain.origin(&https), "http://10.1.2.3:8080");
        assert!(!plain.secure(&https));
        // Default ports are dropped, as in a browser's Origin header.
        assert_eq!(
            PublicOrigin::parse("HTTPS://Example.COM:443")
                .unwrap()
                .origin(&HeaderMap::new()),
            "https://example.com"
        );
    }

    #[test]
    fn only_http_origins_are_accepted() {
        for bad in [
            "example.com",
            "ftp://example.com",
            "https://example.com/app",
            "https://u:p@example.com",
            "https://example.com/?x=1",
            "https://example.com/#top",
        ] {
            assert!(PublicOrigin::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn without_one_only_a_loopback_listener_starts() {
        let lo: std::net::SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let v6: std::net::SocketAddr = "[::1]:8080".parse().unwrap();
        let any: std::net::SocketAddr = "0.0.0.0:8080".parse().unwrap();
        assert_eq!(
            PublicOrigin::for_listener(None, lo),
            Ok(PublicOrigin::FromRequest)
        );
        assert_eq!(
            PublicOrigin::for_listener(Some(" "), v6),
            Ok(PublicOrigin::FromRequest)
        );
        assert_eq!(
            PublicOrigin::for_listener(None, any),
            Err(PublicUrlError::Required(any))
        );
        assert!(PublicOrigin::for_listener(Some("https://m.example"), any).is_ok());
        // On loopback the request decides, as before.
        let req = headers(&[("host", "localhost:8080"), ("x-forwarded-proto", "https")]);
        assert_eq!(
            PublicOrigin::FromRequest.origin(&req),
            "https://localhost:8080"
        );
        assert!(PublicOrigin::FromRequest.secure(&req));
    }
}
