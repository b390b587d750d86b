//! Webhook delivery (Standard Webhooks 1.0), and which URLs a task may
//! name, checked when the task is created and again, after DNS resolution,
//! before every delivery.
//!
//! # Delivery
//!
//! The [`Webhooks`] reconciler runs in the controller, never in the request
//! path. Its durable state is the endpoint's cursor in the store (the last
//! event the receiver acknowledged; the events table is the outbox), so a
//! restart of any process loses no delivery: it claims endpoints with
//! undelivered events (a lease, so replicas share the work), POSTs each
//! event in order, and advances the cursor only after a 2xx. Each POST
//! carries `webhook-id` (`evt_<task>_<event id>`, stable across retries so
//! receivers can deduplicate), `webhook-timestamp` (unix seconds) and
//! `webhook-signature: v1,<base64 HMAC-SHA256 of "id.timestamp.body">`
//! keyed with the task's secret, which is derived from the server key and
//! never stored. The body is `{"type", "timestamp", "task_id", "event"}`,
//! `event` being exactly the polled feed's event (worker text stays marked
//! `"untrusted": true`).
//!
//! A failed attempt (connection error, timeout of 10 s, any non-2xx, and
//! redirects, which are never followed) is retried with exponential
//! backoff and jitter; an endpoint failing for longer than the give-up
//! period (26 h by default) is disabled, and so is one that answers `410
//! Gone`. The reconciler sleeps until the earliest next attempt and wakes
//! early when a task changes (a new event).
//!
//! Safe by default (SSRF): only `http` and `https`, and only globally
//! routable unicast addresses ([`is_public`], an allow-list: IPv6 inside
//! `2000::/3` only, IPv4 outside every special-purpose block, and an IPv4
//! address embedded in IPv6 — mapped, compatible, 6to4, Teredo — checked as
//! IPv4). Loopback, private, unique and site-local, link-local (which holds
//! the cloud metadata address 169.254.169.254), carrier-grade NAT,
//! unspecified, multicast, broadcast and documentation addresses are
//! refused unless an [`AllowList`] of CIDRs in configuration
//! (`MEATSPACE_WEBHOOK_ALLOW`, e.g. `127.0.0.1/32`) permits them. Checking
//! at delivery time after resolution (the client's resolver drops every
//! address that is not allowed) defeats a name that resolved to a public
//! address at creation and to an internal one later.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use chrono::TimeDelta;
use futures::StreamExt;
use ipnet::IpNet;
use meatspace_core::secret::{ServerKey, webhook_signature};
use meatspace_core::store::{DueWebhook, WebhookOutcome};
use meatspace_core::{Event, Store, clock};
use rand::Rng;
use reqwest::Url;
use tracing::Instrument;

use crate::backoff::Backoff;
use crate::{Error, Shutdown, metrics};

const NAME: &str = "webhooks";
/// Endpoints claimed per pass, and delivered concurrently.
const BATCH: u32 = 64;
/// Events sent per endpoint per claim.
const EVENTS_PER_CLAIM: u32 = 100;

/// How webhooks are delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookSettings {
    /// Non-public destinations allowed.
    pub allow: AllowList,
    /// First retry delay; doubled per failed attempt, with jitter.
    pub retry_base: Duration,
    /// Longest delay between two attempts.
    pub retry_max: Duration,
    /// An endpoint failing for this long is disabled.
    pub give_up_after: Duration,
    /// Longest time one attempt may take.
    pub timeout: Duration,
    /// Derives each task's signing secret; without it nothing is delivered.
    pub server_key: Option<ServerKey>,
}

/// Longest webhook URL.
pub const MAX_URL_LEN: usize = 2048;

/// Non-public networks that configuration allows as webhook destinations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList(Vec<IpNet>);

impl FromStr for AllowList {
    type Err = String;

    /// Comma-separated CIDRs or addresses (`127.0.0.1/32,10.1.0.0/16,::1`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut nets = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let net = part
                .parse::<IpNet>()
                .or_else(|_| part.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| format!("{part:?} is not a CIDR or an IP address"))?;
            nets.push(net);
        }
        Ok(AllowList(nets))
    }
}

impl AllowList {
    /// True when a delivery may go to `ip`.
    pub fn permits(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        is_public(ip) || self.0.iter().any(|n| n.contains(&ip))
    }
}

/// An IPv4 address written as IPv6 (`::ffff:10.0.0.1`) is that IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// Globally routable unicast addresses: the only destinations a webhook
/// may reach without the allow-list.
///
/// This is an allow-list, not a list of known-bad ranges: an IPv6 address
/// passes only inside global unicast `2000::/3`, minus the special-purpose
/// blocks in it; an IPv4 address only outside every special-purpose block
/// of the IANA registry. Addresses that carry an IPv4 address inside
/// (IPv4-mapped `::ffff:0:0/96`, IPv4-compatible `::/96`, 6to4
/// `2002::/16`, Teredo `2001::/32`) pass only when every embedded IPv4
/// address does, because a relay or a dual-stack host delivers them there.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    // The special-purpose blocks of the IANA IPv4 registry (RFC 6890 and
    // its updates) and multicast: none is globally routable unicast.
    let special = a == 0 // "this network" 0.0.0.0/8
        || a == 10 // private
        || (a == 100 && (64..128).contains(&b)) // carrier-grade NAT 100.64.0.0/10
        || a == 127 // loopback
        || (a == 169 && b == 254) // link-local, the cloud metadata address
        || (a == 172 && (16..32).contains(&b)) // private
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 192 && b == 0 && c == 2) // documentation TEST-NET-1
        || (a == 192 && b == 88 && c == 99) // 6to4 relay anycast (deprecated)
        || (a == 192 && b == 168) // private
        || (a == 198 && (18..20).contains(&b)) // benchmarking 198.18.0.0/15
        || (a == 198 && b == 51 && c == 100) // documentation TEST-NET-2
        || (a == 203 && b == 0 && c == 113) // documentation TEST-NET-3
        || a >= 224; // multicast 224/4, reserved 240/4, broadcast
    !special
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    let embedded = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    // IPv4-mapped ::ffff:a.b.c.d and IPv4-compatible ::a.b.c.d (which
    // includes :: and ::1, whose IPv4 reading is in 0.0.0.0/8).
    if s[..5] == [0; 5] && (s[5] == 0 || s[5] == 0xffff) {
        return is_public_v4(embedded(s[6], s[7]));
    }
    // Only global unicast 2000::/3 is routable on the internet.
    if s[0] & 0xe000 != 0x2000 {
        return false;
    }
    match s[0] {
        // 6to4: the IPv4 address of the site in bits 16..48.
        0x2002 => is_public_v4(embedded(s[1], s[2])),
        0x2001 => match s[1] {
            // Teredo: the server's IPv4 address in bits 32..64, the
            // client's, inverted, in bits 96..128.
            0x0000 => is_public_v4(embedded(s[2], s[3])) && is_public_v4(embedded(!s[6], !s[7])),
            // Documentation 2001:db8::/32.
            0x0db8 => false,
            // The rest of the IETF protocol assignments 2001::/23
            // (benchmarking, ORCHID, AMT, ...) is not globally reachable
            // unicast.
            x => x >= 0x0200,
        },
        // Documentation 3fff::/20 (RFC 9637).
        0x3fff => s[1] >= 0x1000,
        _ => true,
    }
}

/// Why a webhook URL is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlRefused {
    #[error("webhook_url is not a valid absolute URL")]
    Malformed,
    #[error("webhook_url must use http or https")]
    Scheme,
    #[error("webhook_url must not carry a user name or password")]
    Credentials,
    #[error("webhook_url is longer than {MAX_URL_LEN} characters")]
    TooLong,
    #[error("webhook_url's host does not resolve")]
    Unresolvable,
    #[error(
        "webhook_url resolves to {0}, which is not a public address (loopback, private, link-local or metadata); \
         the server's webhook allow-list does not permit it"
    )]
    NotPublic(IpAddr),
}

/// Checks the form of a webhook URL (scheme, host, length), without any
/// network access.
pub fn parse_url(raw: &str) -> Result<Url, UrlRefused> {
    if raw.len() > MAX_URL_LEN {
        return Err(UrlRefused::TooLong);
    }
    let url = Url::parse(raw).map_err(|_| UrlRefused::Malformed)?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(UrlRefused::Scheme);
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(UrlRefused::Credentials);
    }
    if url.host().is_none() {
        return Err(UrlRefused::Malformed);
    }
    Ok(url)
}

/// Checks a webhook URL completely: its form, and that every address its
/// host resolves to is permitted. An IP literal is checked without any
/// network access; a name is resolved (a DNS query, never a connection).
pub async fn check_url(raw: &str, allow: &AllowList) -> Result<Url, UrlRefused> {
    let url = parse_url(raw)?;
    let port = url.port_or_known_default().unwrap_or(443);
    let addrs: Vec<IpAddr> = match url.host() {
        Some(url::Host::Ipv4(v4)) => vec![IpAddr::V4(v4)],
        Some(url::Host::Ipv6(v6)) => vec![IpAddr::V6(v6)],
        Some(url::Host::Domain(name)) => tokio::net::lookup_host((name, port))
            .await
            .map_err(|_| UrlRefused::Unresolvable)?
            .map(|a| a.ip())
            .collect(),
        None => return Err(UrlRefused::Malformed),
    };
    if addrs.is_empty() {
        return Err(UrlRefused::Unresolvable);
    }
    if let Some(bad) = addrs.into_iter().find(|ip| !allow.permits(*ip)) {
        return Err(UrlRefused::NotPublic(bad));
    }
    Ok(url)
}

/// The webhook reconciler of one controller replica.
#[derive(Debug)]
pub struct Webhooks {
    store: Arc<dyn Store>,
    settings: WebhookSettings,
    key: ServerKey,
    client: reqwest::Client,
    max_sleep: Duration,
}

/// A resolver that drops every address the allow-list does not permit, so
/// a name cannot lead a delivery to an internal address (checked after
/// resolution, at delivery time, on every connection).
#[derive(Debug, Clone)]
struct CheckedResolver {
    allow: AllowList,
}

impl reqwest::dns::Resolve for CheckedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allow = self.allow.clone();
        Box::pin(async move {
            let addrs: Vec<std::net::SocketAddr> = tokio::net::lookup_host((name.as_str(), 0))
                .await?
                .filter(|a| allow.permits(a.ip()))
                .collect();
            if addrs.is_empty() {
                return Err(format!(
                    "{} resolves to no address that webhooks may reach",
                    name.as_str()
                )
                .into());
            }
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

impl Webhooks {
    /// `None` without a server key: nothing can be signed.
    pub(crate) fn new(
        store: Arc<dyn Store>,
        settings: WebhookSettings,
        max_sleep: Duration,
    ) -> Option<Self> {
        let key = settings.server_key.clone()?;
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(settings.timeout)
            .connect_timeout(settings.timeout)
            .no_proxy()
            .user_agent(concat!("meatspace-webhooks/", env!("CARGO_PKG_VERSION")))
            .dns_resolver(Arc::new(CheckedResolver {
                allow: settings.allow.clone(),
            }))
            .build()
            .ok()?;
        Some(Webhooks {
            store,
            settings,
            key,
            client,
            max_sleep,
        })
    }

    pub(crate) async fn run(self, mut shutdown: Shutdown) {
        let mut backoff = Backoff::default();
        // Task changes (new events) wake the loop; a lost notification is
        // covered by the max_sleep bound.
        let mut changes = self.store.changes().await.ok();
        while !shutdown.is_requested() {
            match self.pass().await {
                Ok(true) => continue,
                Ok(false) => backoff.reset(),
                Err(e) => {
                    metrics::failed(NAME, e.metric_label());
                    tracing::warn!(error = %e, "webhook delivery pass failed; retrying");
                    backoff.wait(&mut shutdown).await;
                    continue;
                }
            }
            let sleep = match self.store.next_webhook_attempt().await {
                Ok(Some(at)) => (at - clock::now())
                    .to_std()
                    .unwrap_or(Duration::ZERO)
                    .min(self.max_sleep),
                Ok(None) => self.max_sleep,
                Err(_) => Duration::from_secs(1),
            };
            if sleep.is_zero() {
                continue;
            }
            tokio::select! {
                () = shutdown.requested() => {}
                () = tokio::time::sleep(sleep) => {}
                changed = async {
                    match changes.as_mut() {
                        Some(c) => c.next().await,
                        None => std::future::pending().await,
                    }
                } => {
                    if changed.is_none() {
                        changes = self.store.changes().await.ok();
                    }
                }
            }
        }
    }

    /// Claims and delivers one batch; true if it was full.
    async fn pass(&self) -> Result<bool, Error> {
        let now = clock::now();
        // The lease outlasts one claim's worth of attempts.
        let lease = TimeDelta::from_std(self.settings.timeout * 3)
            .unwrap_or(TimeDelta::seconds(30))
            + TimeDelta::seconds(5);
        let due = self
            .store
            .claim_due_webhooks(now, now + lease, BATCH)
            .await?;
        let n = due.len();
        let span = tracing::info_span!("reconcile", reconciler = NAME, endpoints = n);
        async {
            let started = std::time::Instant::now();
            let results: Vec<Result<(), Error>> = futures::stream::iter(due)
                .map(|d| self.deliver(d))
                .buffer_unordered(16)
                .collect()
                .await;
            metrics::reconciled(NAME, started.elapsed());
            results.into_iter().collect::<Result<Vec<()>, Error>>()?;
            Ok(n >= BATCH as usize)
        }
        .instrument(span)
        .await
    }

    /// Sends the endpoint's undelivered events in order until one fails.
    async fn deliver(&self, due: DueWebhook) -> Result<(), Error> {
        let events = self
            .store
            .events(due.task_id, due.delivered_event_id, EVENTS_PER_CLAIM)
            .await?;
        let secret = self.key.webhook_secret_bytes(due.task_id);
        let mut attempts = due.attempts;
        let mut failing_since = due.failing_since;
        for event in events {
            let outcome = match self.attempt(&due.url, &secret, &event).await {
                Ok(()) => {
                    metrics::webhook_delivered(
                        (clock::now() - event.created_at)
                            .to_std()
                            .unwrap_or_default(),
                    );
                    WebhookOutcome::Delivered {
                        event_id: event.id,
                        // After the terminal event nothing more will come.
                        next_attempt_at: (!event.kind.is_terminal()).then(clock::now),
                    }
                }
                Err(Attempt::Gone) => {
                    metrics::webhook_failed("gone");
                    WebhookOutcome::Disabled {
                        error: "the receiver answered 410 Gone: endpoint disabled".into(),
                    }
                }
                Err(Attempt::Failed(error)) => {
                    metrics::webhook_failed("failed");
                    let now = clock::now();
                    let since = *failing_since.get_or_insert(now);
                    let give_up = TimeDelta::from_std(self.settings.give_up_after)
                        .unwrap_or(TimeDelta::days(1));
                    if now - since >= give_up {
                        WebhookOutcome::Disabled {
                            error: format!("gave up after failing since {since}: {error}"),
                        }
                    } else {
                        attempts += 1;
                        WebhookOutcome::Failed {
                            error,
                            next_attempt_at: now + self.retry_delay(attempts),
                        }
                    }
                }
            };
            let stop = !matches!(outcome, WebhookOutcome::Delivered { .. });
            if let WebhookOutcome::Disabled { error } = &outcome {
                tracing::warn!(task_id = %due.task_id, %error, "webhook endpoint disabled");
            }
            self.store
                .record_webhook(due.task_id, &outcome, clock::now())
                .await?;
            if stop {
                break;
            }
        }
        Ok(())
    }

    /// Exponential backoff with equal jitter: half the delay fixed, half
    /// random, so retries of many endpoints do not arrive in step.
    fn retry_delay(&self, attempts: i32) -> TimeDelta {
        let exp = u32::try_from(attempts.clamp(1, 30) - 1).unwrap_or(0);
        let base = self
            .settings
            .retry_base
            .saturating_mul(2u32.saturating_pow(exp))
            .min(self.settings.retry_max);
        let half = base / 2;
        let jitter = rand::thread_rng().gen_range(0..=half.as_millis().max(1) as u64);
        TimeDelta::from_std(half + Duration::from_millis(jitter)).unwrap_or(TimeDelta::seconds(1))
    }

    /// One POST of one event.
    async fn attempt(&self, raw_url: &str, secret: &[u8], event: &Event) -> Result<(), Attempt> {
        let url = parse_url(raw_url).map_err(|e| Attempt::Failed(e.to_string()))?;
        // A literal address never reaches the resolver: check it here.
        let literal = match url.host() {
            Some(url::Host::Ipv4(v4)) => Some(IpAddr::V4(v4)),
            Some(url::Host::Ipv6(v6)) => Some(IpAddr::V6(v6)),
            _ => None,
        };
        if let Some(ip) = literal
            && !self.settings.allow.permits(ip)
        {
            return Err(Attempt::Failed(UrlRefused::NotPublic(ip).to_string()));
        }
        let id = format!("evt_{}_{}", event.task_id.simple(), event.id);
        let timestamp = clock::now().timestamp();
        let body = serde_json::to_vec(&serde_json::json!({
            "type": event.kind.as_str(),
            "timestamp": event.created_at,
            "task_id": event.task_id,
            "event": event,
        }))
        .map_err(|e| Attempt::Failed(e.to_string()))?;
        let signature = webhook_signature(secret, &id, timestamp, &body);
        let res = self
            .client
            .post(url)
            .header("content-type", "application/json")
            .header("webhook-id", &id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(body)
            .send()
            .await
            .map_err(|e| Attempt::Failed(describe(&e)))?;
        let status = res.status();
        if status.is_success() {
            Ok(())
        } else if status == reqwest::StatusCode::GONE {
            Err(Attempt::Gone)
        } else if status.is_redirection() {
            Err(Attempt::Failed(format!(
                "the receiver answered {status}; redirects are not followed"
            )))
        } else {
            Err(Attempt::Failed(format!("the receiver answered {status}")))
        }
    }
}

/// Why an attempt did not deliver.
#[derive(Debug)]
enum Attempt {
    Gone,
    Failed(String),
}

/// A transport error in words, without the URL's query (which might hold
/// a token of the receiver's).
fn describe(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else {
        "request failed"
    };
    let mut cause = String::new();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        cause = s.to_string();
        source = s.source();
    }
    if cause.is_empty() {
        kind.to_owned()
    } else {
        format!("{kind}: {cause}")
    }
}

/// The `whsec_` secret's bytes, as a receiver decodes them (for tests and
/// tools that verify signatures).
pub fn decode_secret(secret: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::STANDARD
        .decode(secret.strip_prefix("whsec_")?)
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn only_public_addresses_pass_by_default() {
        let none = AllowList::default();
        for bad in [
            "127.0.0.1",
            "10.0.0.1",
            "172.16.5.4",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fe80::1",
            "fd00:ec2::254",
            "::ffff:10.0.0.1",
            "::ffff:127.0.0.1",
        ] {
            assert!(!none.permits(ip(bad)), "{bad} must be refused");
        }
        for good in ["93.184.216.34", "1.1.1.1", "2606:4700::1111"] {
            assert!(none.permits(ip(good)), "{good} is public");
        }
    }

    #[test]
    fn embedded_and_special_ipv6_ranges_are_refused() {
        let none = AllowList::default();
        for bad in [
            // The review's examples: IPv4-compatible loopback, site-local,
            // 6to4 of loopback.
            "::127.0.0.1",
            "fec0::1",
            "2002:7f00:1::",
            // 6to4 of private and metadata addresses.
            "2002:a00:1::1",
            "2002:a9fe:a9fe::1",
            // Teredo whose client (inverted 127.0.0.1) or server is internal.
            "2001:0:5ef5:79fd:0:0:80ff:fffe",
            "2001:0:a00:1:0:0:a2c1:1f1e",
            // IPv4-compatible private, NAT64 of loopback, documentation,
            // ORCHID, discard-only, IPv4-mapped metadata, multicast.
            "::10.0.0.1",
            "64:ff9b::7f00:1",
            "2001:db8::1",
            "3fff::1",
            "2001:10::1",
            "100::1",
            "::ffff:169.254.169.254",
            "ff02::1",
            "fc00::1",
            "4000::1",
        ] {
            assert!(!none.permits(ip(bad)), "{bad} must be refused");
        }
        for good in [
            // 6to4 and Teredo of public addresses, IPv4-compatible public.
            "2002:5db8:d822::1",
            "2001:0:5ef5:79fd:0:0:a2c1:1f1e",
            "::93.184.216.34",
            "::ffff:1.1.1.1",
            "2a00:1450:4001:82b::200e",
            "3fff:1000::1",
        ] {
            assert!(none.permits(ip(good)), "{good} is globally routable");
        }
    }

    #[test]
    fn special_ipv4_ranges_are_refused() {
        let none = AllowList::default();
        for bad in [
            "192.0.0.8",
            "192.0.2.1",
            "192.88.99.1",
            "198.18.0.1",
            "198.51.100.7",
            "203.0.113.9",
            "224.0.0.1",
            "240.0.0.1",
            "0.1.2.3",
        ] {
            assert!(!none.permits(ip(bad)), "{bad} must be refused");
        }
        for good in ["8.8.8.8", "100.128.0.1", "172.32.0.1", "192.0.3.1"] {
            assert!(none.permits(ip(good)), "{good} is public");
        }
    }

    #[test]
    fn the_allow_list_opens_exactly_its_networks() {
        let allow: AllowList = "127.0.0.1/32, 10.1.0.0/16,::1".parse().unwrap();
        assert!(allow.permits(ip("127.0.0.1")));
        assert!(!allow.permits(ip("127.0.0.2")));
        assert!(allow.permits(ip("10.1.2.3")));
        assert!(!allow.permits(ip("10.2.0.1")));
        assert!(allow.permits(ip("::1")));
        assert!("nonsense".parse::<AllowList>().is_err());
        assert_eq!("".parse::<AllowList>().unwrap(), AllowList::default());
    }

    #[tokio::test]
    async fn urls_are_checked_without_traffic_for_literals() {
        let none = AllowList::default();
        assert_eq!(
            check_url("http://127.0.0.1:9/x", &none).await.unwrap_err(),
            UrlRefused::NotPublic(ip("127.0.0.1"))
        );
        assert_eq!(
            check_url("https://10.0.0.1/", &none).await.unwrap_err(),
            UrlRefused::NotPublic(ip("10.0.0.1"))
        );
        assert_eq!(
            check_url("ftp://93.184.216.34/", &none).await.unwrap_err(),
            UrlRefused::Scheme
        );
        assert_eq!(
            check_url("http://u:p@93.184.216.34/", &none)
                .await
                .unwrap_err(),
            UrlRefused::Credentials
        );
        assert_eq!(
            check_url("not a url", &none).await.unwrap_err(),
            UrlRefused::Malformed
        );
        let local: AllowList = "127.0.0.1/32".parse().unwrap();
        assert!(check_url("http://127.0.0.1:9/hook", &local).await.is_ok());
        assert!(check_url("http://93.184.216.34/hook", &none).await.is_ok());
    }
}
