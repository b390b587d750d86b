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
//! Safe by default (SSRF): which destinations are allowed is the domain's
//! [`meatspace_domain::webhook_url`] (public unicast addresses only, unless
//! an [`AllowList`] permits more), the same rule the API server applies when
//! a task names its webhook. Checking at delivery time after resolution (the client's resolver drops every
//! address that is not allowed) defeats a name that resolved to a public
//! address at creation and to an internal one later.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use chrono::TimeDelta;
use futures::{FutureExt, StreamExt};
use meatspace_domain::Event;
use meatspace_domain::clock::Clock;
use meatspace_store::Store;
use meatspace_store::secret::{ServerKey, webhook_signature};
use meatspace_store::{webhooks::DueWebhook, webhooks::WebhookOutcome};
use tracing::Instrument;

pub use meatspace_domain::webhook_url::AllowList;
use meatspace_domain::webhook_url::{UrlRefused, parse_url};

use crate::backoff::Backoff;
use crate::{ControllerConfig, Error, Shutdown, metrics};

const NAME: &str = "webhooks";
/// Endpoints claimed per pass, and delivered concurrently.
const BATCH: u32 = 64;
/// Events sent per endpoint per claim.
const EVENTS_PER_CLAIM: u32 = 100;
/// The least time between two looks at what is due that task changes
/// prompt: under load every write is a change, and one look (a read of the
/// store) answers all the changes of this long, at the cost of as much
/// delay before a delivery.
const LOOK_EVERY: Duration = Duration::from_millis(20);

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

/// The webhook reconciler of one controller replica.
#[derive(Debug)]
pub struct Webhooks {
    store: Arc<dyn Store>,
    settings: WebhookSettings,
    key: ServerKey,
    client: reqwest::Client,
    max_sleep: Duration,
    clock: Clock,
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

/// An HTTP client for destinations that workers or agents name (webhook
/// and push endpoints): no redirects, no proxy, and only the addresses
/// `allow` permits, checked after resolution on every connection.
pub(crate) fn checked_client(
    allow: &AllowList,
    timeout: Duration,
    user_agent: &'static str,
) -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(timeout)
        .connect_timeout(timeout)
        .no_proxy()
        .user_agent(user_agent)
        .dns_resolver(Arc::new(CheckedResolver {
            allow: allow.clone(),
        }))
        .build()
}

/// An IP literal in `url` that `allow` does not permit (a literal never
/// reaches the resolver, so it is checked here).
pub(crate) fn refused_literal(url: &url::Url, allow: &AllowList) -> Option<UrlRefused> {
    let literal = match url.host() {
        Some(url::Host::Ipv4(v4)) => IpAddr::V4(v4),
        Some(url::Host::Ipv6(v6)) => IpAddr::V6(v6),
        _ => return None,
    };
    (!allow.permits(literal)).then_some(UrlRefused::NotPublic(literal))
}

impl Webhooks {
    /// `None` without a server key: nothing can be signed.
    pub(crate) fn new(store: Arc<dyn Store>, config: &ControllerConfig) -> Option<Self> {
        let settings = config.webhooks.clone();
        let key = settings.server_key.clone()?;
        let client = checked_client(
            &settings.allow,
            settings.timeout,
            concat!("meatspace-webhooks/", env!("CARGO_PKG_VERSION")),
        )
        .ok()?;
        Some(Webhooks {
            store,
            settings,
            key,
            client,
            max_sleep: config.max_sleep,
            clock: config.clock.clone(),
        })
    }

    pub(crate) async fn run(self, mut shutdown: Shutdown) {
        let mut backoff = Backoff::default();
        // Task changes (new events) wake the loop; a lost notification is
        // covered by the max_sleep bound.
        let mut changes = self.store.changes().await.ok();
        while !shutdown.is_requested() {
            // A claim is a write: it is made only when an endpoint is due,
            // never on every change of a task that has no webhook (most
            // tasks), which would double the store's writes.
            let looked = tokio::time::Instant::now();
            let sleep = match self.store.next_webhook_attempt().await {
                Ok(Some(at)) => (at - self.clock.now())
                    .to_std()
                    .unwrap_or(Duration::ZERO)
                    .min(self.max_sleep),
                Ok(None) => self.max_sleep,
                Err(_) => Duration::from_secs(1),
            };
            if sleep.is_zero() {
                match self.pass().await {
                    Ok(()) => backoff.reset(),
                    Err(e) => {
                        metrics::failed(NAME, e.metric_label());
                        tracing::warn!(error = %e, "webhook delivery pass failed; retrying");
                        backoff.wait(&mut shutdown).await;
                    }
                }
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
                    match changed {
                        // Every change until the next look is answered by
                        // that look.
                        Some(_) => {
                            tokio::select! {
                                () = shutdown.requested() => {}
                                () = tokio::time::sleep_until(looked + LOOK_EVERY) => {}
                            }
                            while let Some(Some(_)) =
                                changes.as_mut().and_then(|c| c.next().now_or_never())
                            {}
                        }
                        None => changes = self.store.changes().await.ok(),
                    }
                }
            }
        }
    }

    /// Claims and delivers one batch (the loop claims again while more are
    /// due).
    async fn pass(&self) -> Result<(), Error> {
        let now = self.clock.now();
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
            Ok(())
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
                        (self.clock.now() - event.created_at)
                            .to_std()
                            .unwrap_or_default(),
                    );
                    WebhookOutcome::Delivered {
                        event_id: event.id,
                        // After the terminal event nothing more will come.
                        next_attempt_at: (!event.kind.is_terminal()).then(|| self.clock.now()),
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
                    let now = self.clock.now();
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
                .record_webhook(due.task_id, &outcome, self.clock.now())
                .await?;
            if stop {
                break;
            }
        }
        Ok(())
    }

    fn retry_delay(&self, attempts: i32) -> TimeDelta {
        crate::backoff::retry_delay(
            self.settings.retry_base,
            self.settings.retry_max,
            u32::try_from(attempts).unwrap_or(1),
        )
    }

    /// One POST of one event.
    async fn attempt(&self, raw_url: &str, secret: &[u8], event: &Event) -> Result<(), Attempt> {
        let url = parse_url(raw_url).map_err(|e| Attempt::Failed(e.to_string()))?;
        if let Some(refused) = refused_literal(&url, &self.settings.allow) {
            return Err(Attempt::Failed(refused.to_string()));
        }
        let id = format!("evt_{}_{}", event.task_id.simple(), event.id);
        let timestamp = self.clock.now().timestamp();
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
pub(crate) fn describe(e: &reqwest::Error) -> String {
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
