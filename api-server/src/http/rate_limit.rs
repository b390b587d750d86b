//! Rate limiting of every route: 429 + `Retry-After` for a client that
//! sends more than its share.
//!
//! A request is charged to the principal its credential proves, judged from
//! memory only ([`auth::presented`]): the development key, an agent
//! token's task, a worker token's worker. Every other request (no
//! credential, a session cookie or sign-in form of the web app, a token
//! whose digest is not in memory yet, a wrong token) is charged to the
//! client's address (an IPv6 address by its /64, which one host usually
//! holds whole). So a client cannot mint fresh budgets by sending random
//! credentials: each one costs its own address, and the store read that
//! tells an unknown token from a real one happens only within that budget.
//!
//! Failed authentications (a 401 answer, or an invite code that is not
//! valid) are counted per address as well, with a budget of their own:
//! once it is spent, requests from that address that carry no credential
//! verified from memory get 429 before anything reads the store, while
//! clients whose credentials verify go on. The limiter is `governor`'s
//! GCRA (a sustained rate plus a burst, no timer per key); idle keys are
//! dropped every [`CLEANUP_INTERVAL`].
//!
//! The same module bounds the event streams and long polls each principal
//! and each address holds open at once ([`StreamSlots`]).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

use crate::AppState;
use crate::auth::{self, Presented, Principal};
use crate::http::error::ApiError;

/// How often keys that have refilled their burst are forgotten.
const CLEANUP_INTERVAL: Duration = Duration::from_secs(60);
/// Addresses whose failures are remembered at most; past it the oldest
/// news is dropped (every entry refills within a minute or so anyway).
const MAX_FAILING_ADDRESSES: usize = 100_000;

/// What a request is charged to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Key {
    Principal(Principal),
    Address(IpAddr),
}

/// Rates, bursts and stream caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimitSettings {
    /// Requests per second a principal or address may keep up; `None`
    /// turns request limiting off.
    pub per_second: Option<NonZeroU32>,
    /// Requests sent at once after being idle.
    pub burst: NonZeroU32,
    /// Failed authentications per minute one address may keep up; `None`:
    /// not limited.
    pub auth_failures_per_minute: Option<NonZeroU32>,
    /// Failed authentications one address may make at once.
    pub auth_failures_burst: NonZeroU32,
    /// Event streams and long polls one principal may hold open; `None`:
    /// not limited.
    pub max_streams_per_credential: Option<NonZeroU32>,
    /// Event streams and long polls one address may hold open.
    pub max_streams_per_address: Option<NonZeroU32>,
}

impl RateLimitSettings {
    /// No limit (benchmarks, and tests that are not about limiting).
    pub const OFF: RateLimitSettings = RateLimitSettings {
        per_second: None,
        burst: NonZeroU32::MIN,
        auth_failures_per_minute: None,
        auth_failures_burst: NonZeroU32::MIN,
        max_streams_per_credential: None,
        max_streams_per_address: None,
    };
}

/// The process-wide limiter. Cheap to clone.
#[derive(Debug, Clone)]
pub struct RateLimit {
    settings: RateLimitSettings,
    limiter: Option<Arc<DefaultKeyedRateLimiter<Key>>>,
    failures: Option<Arc<FailureBudget>>,
    streams: StreamSlots,
}

impl RateLimit {
    /// Builds the limiter and, when it is on, starts forgetting idle keys.
    pub fn new(settings: RateLimitSettings) -> RateLimit {
        let limiter = settings.per_second.map(|rate| {
            let quota = Quota::per_second(rate).allow_burst(settings.burst.max(rate));
            Arc::new(RateLimiter::keyed(quota))
        });
        let failures = settings.auth_failures_per_minute.map(|rate| {
            Arc::new(FailureBudget::new(
                Duration::from_secs(60) / rate.get(),
                settings.auth_failures_burst,
            ))
        });
        if limiter.is_some() || failures.is_some() {
            let (limiter, failures) = (
                limiter.as_ref().map(Arc::downgrade),
                failures.as_ref().map(Arc::downgrade),
            );
            tokio::spawn(async move {
                let mut ticks = tokio::time::interval(CLEANUP_INTERVAL);
                ticks.tick().await;
                loop {
                    ticks.tick().await;
                    let limiter = limiter.as_ref().map(|w| w.upgrade());
                    let failures = failures.as_ref().map(|w| w.upgrade());
                    if matches!(limiter, Some(None)) || matches!(failures, Some(None)) {
                        return;
                    }
                    if let Some(Some(limiter)) = limiter {
                        limiter.retain_recent();
                        limiter.shrink_to_fit();
                    }
                    if let Some(Some(failures)) = failures {
                        failures.forget_refilled();
                    }
                }
            });
        }
        RateLimit {
            settings,
            limiter,
            failures,
            streams: StreamSlots::new(
                settings.max_streams_per_credential,
                settings.max_streams_per_address,
            ),
        }
    }

    pub fn settings(&self) -> RateLimitSettings {
        self.settings
    }

    /// The caps on open event streams and long polls.
    pub fn streams(&self) -> &StreamSlots {
        &self.streams
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

/// Failed authentications per address, as a GCRA whose state can be read
/// without spending it: an address over its budget is refused before its
/// request reaches any store read.
#[derive(Debug)]
struct FailureBudget {
    /// Time one failure takes to be forgiven.
    interval: Duration,
    burst: u32,
    /// Per address, when its failures will all be forgiven (the GCRA's
    /// theoretical arrival time).
    forgiven_at: Mutex<HashMap<IpAddr, Instant>>,
}

impl FailureBudget {
    fn new(interval: Duration, burst: NonZeroU32) -> Self {
        FailureBudget {
            interval,
            burst: burst.get(),
            forgiven_at: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, Instant>> {
        self.forgiven_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// How long `address` must wait before another failure is allowed, if
    /// its budget is spent.
    fn blocked(&self, address: IpAddr, now: Instant) -> Option<Duration> {
        let at = *self.lock().get(&address)?;
        let allowed_until = now + self.interval * (self.burst - 1);
        (at > allowed_until).then(|| at - allowed_until)
    }

    /// Records one failure of `address`.
    fn failed(&self, address: IpAddr, now: Instant) {
        let mut map = self.lock();
        if map.len() >= MAX_FAILING_ADDRESSES && !map.contains_key(&address) {
            map.retain(|_, at| *at > now);
            if map.len() >= MAX_FAILING_ADDRESSES {
                map.clear();
            }
        }
        let at = map.entry(address).or_insert(now);
        // Never further ahead than a full burst: failures while blocked
        // do not push the end of the block out for ever.
        *at = ((*at).max(now) + self.interval).min(now + self.interval * self.burst);
    }

    fn forget_refilled(&self) {
        let now = Instant::now();
        let mut map = self.lock();
        map.retain(|_, at| *at > now);
        map.shrink_to_fit();
    }
}

/// The address a request is charged to: the peer's IP address, an IPv6
/// one by its /64 (an IPv4-mapped address as the IPv4 address).
pub fn address_of(req: &Request) -> IpAddr {
    let ip = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::from([0, 0, 0, 0]), |ConnectInfo(addr)| addr.ip());
    address_key(ip)
}

/// The client's address as [`address_of`] counts it, for handlers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddress(pub IpAddr);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for ClientAddress {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        let ip = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map_or(IpAddr::from([0, 0, 0, 0]), |ConnectInfo(addr)| addr.ip());
        Ok(ClientAddress(address_key(ip)))
    }
}

/// The address an IP is counted as (see [`address_of`]).
pub fn address_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(v6.to_bits() & !((1u128 << 64) - 1))),
        },
    }
}

/// Whether an answer says an authentication failed: a 401, or an invite
/// code of the web app that is not valid (410).
fn authentication_failed(path: &str, status: StatusCode) -> bool {
    status == StatusCode::UNAUTHORIZED
        || (status == StatusCode::GONE && path.starts_with("/app/invite/"))
}

/// Middleware over every route: 429 with `Retry-After` (whole seconds, at
/// least 1) for a request over its principal's or address's limit.
pub async fn limit(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let limits = &state.rate_limit;
    if limits.limiter.is_none() && limits.failures.is_none() {
        return next.run(req).await;
    }
    if let Presented::Verified(principal) = auth::presented(&state, req.headers()) {
        return match limits.check(Key::Principal(principal)) {
            Ok(()) => next.run(req).await,
            Err(wait) => too_many(wait, "too many requests for this credential"),
        };
    }
    let address = address_of(&req);
    if let Some(failures) = &limits.failures
        && let Some(wait) = failures.blocked(address, Instant::now())
    {
        return too_many(wait, "too many failed authentications from this address");
    }
    if let Err(wait) = limits.check(Key::Address(address)) {
        return too_many(wait, "too many requests from this address");
    }
    let path = req.uri().path().to_owned();
    let res = next.run(req).await;
    if let Some(failures) = &limits.failures
        && authentication_failed(&path, res.status())
    {
        failures.failed(address, Instant::now());
    }
    res
}

fn too_many(wait: Duration, what: &str) -> Response {
    let seconds = wait.as_secs_f64().ceil().max(1.0) as u64;
    let mut res =
        ApiError::TooManyRequests(format!("{what}; retry in {seconds} s")).into_response();
    res.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    res
}

/// Counts of the event streams and long polls open per principal and per
/// address, each capped: a client holding as many as it may gets 429
/// `too-many-streams` for the next one. Every open stream wakes on each
/// change of its task, so the caps bound the work a change costs too.
#[derive(Debug, Clone)]
pub struct StreamSlots {
    per_credential: Option<u32>,
    per_address: Option<u32>,
    open: Arc<Mutex<HashMap<Key, u32>>>,
}

/// One open stream or long poll; its slots are given back when dropped.
#[derive(Debug)]
pub struct StreamSlot {
    open: Arc<Mutex<HashMap<Key, u32>>>,
    keys: Vec<Key>,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        for key in &self.keys {
            if let Some(n) = open.get_mut(key) {
                *n -= 1;
                if *n == 0 {
                    open.remove(key);
                }
            }
        }
    }
}

impl StreamSlots {
    fn new(per_credential: Option<NonZeroU32>, per_address: Option<NonZeroU32>) -> Self {
        StreamSlots {
            per_credential: per_credential.map(NonZeroU32::get),
            per_address: per_address.map(NonZeroU32::get),
            open: Arc::default(),
        }
    }

    /// Takes a slot for a stream of `principal` from `address`, or says
    /// which cap it would pass.
    pub fn open(&self, principal: Principal, address: IpAddr) -> Result<StreamSlot, ApiError> {
        let keys: Vec<(Key, Option<u32>, &str)> = vec![
            (
                Key::Principal(principal),
                self.per_credential,
                "this credential",
            ),
            (
                Key::Address(address_key(address)),
                self.per_address,
                "this address",
            ),
        ];
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        for (key, cap, whose) in &keys {
            if let Some(cap) = cap
                && open.get(key).copied().unwrap_or(0) >= *cap
            {
                return Err(ApiError::TooManyStreams(format!(
                    "{whose} already holds {cap} event streams and long polls open; close one first"
                )));
            }
        }
        let keys: Vec<Key> = keys
            .into_iter()
            .filter(|(_, cap, _)| cap.is_some())
            .map(|(key, _, _)| key)
            .collect();
        for key in &keys {
            *open.entry(*key).or_insert(0) += 1;
        }
        Ok(StreamSlot {
            open: Arc::clone(&self.open),
            keys,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(per_second: u32, burst: u32) -> RateLimitSettings {
        RateLimitSettings {
            per_second: NonZeroU32::new(per_second),
            burst: NonZeroU32::new(burst).unwrap(),
            ..RateLimitSettings::OFF
        }
    }

    #[tokio::test]
    async fn a_key_gets_its_burst_then_waits_and_other_keys_are_not_charged() {
        let limit = RateLimit::new(settings(1, 3));
        let a = Key::Principal(Principal::Agent(uuid::Uuid::new_v4()));
        let b = Key::Principal(Principal::DevKey);
        for _ in 0..3 {
            assert_eq!(limit.check(a), Ok(()));
        }
        let wait = limit.check(a).unwrap_err();
        assert!(wait > Duration::ZERO && wait <= Duration::from_secs(1));
        assert_eq!(limit.check(b), Ok(()));
        assert_eq!(
            limit.check(Key::Address(IpAddr::from([127, 0, 0, 1]))),
            Ok(())
        );
    }

    #[tokio::test]
    async fn off_never_limits() {
        let limit = RateLimit::new(RateLimitSettings::OFF);
        for _ in 0..10_000 {
            assert_eq!(limit.check(Key::Principal(Principal::DevKey)), Ok(()));
        }
    }

    #[test]
    fn failures_block_after_their_burst_and_are_forgiven_in_time() {
        let budget = FailureBudget::new(Duration::from_secs(2), NonZeroU32::new(3).unwrap());
        let (a, b) = (IpAddr::from([10, 0, 0, 1]), IpAddr::from([10, 0, 0, 2]));
        let t = Instant::now();
        for _ in 0..3 {
            assert_eq!(budget.blocked(a, t), None);
            budget.failed(a, t);
        }
        let wait = budget.blocked(a, t).expect("blocked after the burst");
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_secs(2),
            "{wait:?}"
        );
        assert_eq!(budget.blocked(b, t), None, "another address is not charged");
        // Failing on while blocked does not extend the block past a burst.
        for _ in 0..100 {
            budget.failed(a, t);
        }
        assert_eq!(budget.blocked(a, t + Duration::from_secs(2)), None);
    }

    #[test]
    fn an_ipv6_host_is_one_address_by_its_64() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::2".parse().unwrap();
        let other: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(address_key(a), address_key(b));
        assert_ne!(address_key(a), address_key(other));
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert_eq!(address_key(mapped), IpAddr::from([192, 0, 2, 7]));
    }

    #[test]
    fn stream_slots_are_capped_per_principal_and_address_and_given_back() {
        let slots = StreamSlots::new(NonZeroU32::new(2), NonZeroU32::new(3));
        let (p, q) = (
            Principal::Agent(uuid::Uuid::new_v4()),
            Principal::Agent(uuid::Uuid::new_v4()),
        );
        let here = IpAddr::from([10, 0, 0, 1]);
        let first = slots.open(p, here).unwrap();
        let _second = slots.open(p, here).unwrap();
        assert!(matches!(
            slots.open(p, here),
            Err(ApiError::TooManyStreams(_))
        ));
        let _third = slots.open(q, here).unwrap();
        // The address holds three: a fourth credential from it is refused.
        let r = Principal::Worker(uuid::Uuid::new_v4());
        assert!(matches!(
            slots.open(r, here),
            Err(ApiError::TooManyStreams(_))
        ));
        drop(first);
        assert!(slots.open(p, here).is_ok());
    }
}
