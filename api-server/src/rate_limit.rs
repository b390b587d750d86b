//! Per-credential rate limiting: 429 + `Retry-After` for a client that
//! sends more than its share.
//!
//! Each request is charged to a key: the credential it carries (the dev key
//! header or the bearer token, hashed so that no credential is kept in
//! memory in the clear) or, without one, the peer's IP address. The
//! limiter is `governor`'s GCRA: a sustained rate per second plus a burst,
//! with no background timer per key. Requests are charged before they are
//! authenticated, so guessing tokens costs the guesser's own budget; a
//! forged token is its own key, so it never spends the real holder's.
//! Keys not seen for a while are dropped every [`CLEANUP_INTERVAL`].

use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use sha2::{Digest, Sha256};

use crate::AppState;
use crate::auth::DEV_KEY_HEADER;
use crate::error::ApiError;

/// How often keys that have refilled their burst are forgotten.
const CLEANUP_INTERVAL: Duration = Duration::from_secs(60);

/// What a request is charged to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Key {
    /// First 16 bytes of the SHA-256 of the credential header.
    Credential([u8; 16]),
    Peer(IpAddr),
}

/// Sustained rate and burst per credential.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimitSettings {
    /// Requests per second a credential may keep up; `None` turns limiting off.
    pub per_second: Option<NonZeroU32>,
    /// Requests a credential may send at once after being idle.
    pub burst: NonZeroU32,
}

impl RateLimitSettings {
    /// No limit (benchmarks, and tests that are not about limiting).
    pub const OFF: RateLimitSettings = RateLimitSettings {
        per_second: None,
        burst: NonZeroU32::MIN,
    };
}

/// The process-wide limiter. Cheap to clone.
#[derive(Debug, Clone)]
pub struct RateLimit {
    settings: RateLimitSettings,
    limiter: Option<Arc<DefaultKeyedRateLimiter<Key>>>,
}

impl RateLimit {
    /// Builds the limiter and, when it is on, starts forgetting idle keys.
    pub fn new(settings: RateLimitSettings) -> RateLimit {
        let limiter = settings.per_second.map(|rate| {
            let quota = Quota::per_second(rate).allow_burst(settings.burst.max(rate));
            Arc::new(RateLimiter::keyed(quota))
        });
        if let Some(limiter) = &limiter {
            let weak = Arc::downgrade(limiter);
            tokio::spawn(async move {
                let mut ticks = tokio::time::interval(CLEANUP_INTERVAL);
                ticks.tick().await;
                loop {
                    ticks.tick().await;
                    let Some(limiter) = weak.upgrade() else {
                        return;
                    };
                    limiter.retain_recent();
                    limiter.shrink_to_fit();
                }
            });
        }
        RateLimit { settings, limiter }
    }

    pub fn settings(&self) -> RateLimitSettings {
        self.settings
    }

    /// Charges one request to `key`: `Err(wait)` when it is over its limit.
    fn check(&self, key: Key) -> Result<(), Duration> {
        let Some(limiter) = &self.limiter else {
            return Ok(());
        };
        limiter
            .check_key(&key)
            .map_err(|not_until| not_until.wait_time_from(DefaultClock::default().now()))
    }
}

/// The key of a request: its credential if it carries one, else its peer.
fn key_of(req: &Request) -> Key {
    let headers = req.headers();
    let credential = headers
        .get(header::AUTHORIZATION)
        .or_else(|| headers.get(DEV_KEY_HEADER));
    if let Some(value) = credential {
        let digest = Sha256::digest(value.as_bytes());
        let mut short = [0u8; 16];
        short.copy_from_slice(&digest[..16]);
        return Key::Credential(short);
    }
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::from([0, 0, 0, 0]), |ConnectInfo(addr)| addr.ip());
    Key::Peer(peer)
}

/// Middleware: 429 with `Retry-After` (whole seconds, at least 1) for a
/// request over its key's limit.
pub async fn limit(State(state): State<AppState>, req: Request, next: Next) -> Response {
    match state.rate_limit.check(key_of(&req)) {
        Ok(()) => next.run(req).await,
        Err(wait) => {
            let seconds = wait.as_secs_f64().ceil().max(1.0) as u64;
            let mut res = ApiError::TooManyRequests(format!(
                "too many requests for this credential; retry in {seconds} s"
            ))
            .into_response();
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
            res
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(per_second: u32, burst: u32) -> RateLimitSettings {
        RateLimitSettings {
            per_second: NonZeroU32::new(per_second),
            burst: NonZeroU32::new(burst).unwrap(),
        }
    }

    #[tokio::test]
    async fn a_key_gets_its_burst_then_waits_and_other_keys_are_not_charged() {
        let limit = RateLimit::new(settings(1, 3));
        let a = Key::Credential([1; 16]);
        let b = Key::Credential([2; 16]);
        for _ in 0..3 {
            assert_eq!(limit.check(a), Ok(()));
        }
        let wait = limit.check(a).unwrap_err();
        assert!(wait > Duration::ZERO && wait <= Duration::from_secs(1));
        assert_eq!(limit.check(b), Ok(()));
        assert_eq!(limit.check(Key::Peer(IpAddr::from([127, 0, 0, 1]))), Ok(()));
    }

    #[tokio::test]
    async fn off_never_limits() {
        let limit = RateLimit::new(RateLimitSettings::OFF);
        for _ in 0..10_000 {
            assert_eq!(limit.check(Key::Credential([1; 16])), Ok(()));
        }
    }
}
