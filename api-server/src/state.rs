//! What every handler shares ([`AppState`]): the store, the clock, the
//! settings a server is configured with, and the parts each server makes
//! for itself; [`AppState::build`] assembles it for `main` and the test
//! harness alike.

use std::sync::Arc;

use meatspace_domain::{Command, Policy};
use meatspace_store::Store;
use metrics_exporter_prometheus::PrometheusHandle;
use uuid::Uuid;

use crate::auth::{self, DevKey};
use crate::feed::{self, Feed};
use crate::http::availability::{self, Availability};
use crate::http::error::ApiError;
use crate::http::metrics;
use crate::http::rate_limit::{self, RateLimit};
use crate::photo::PhotoLimits;
use crate::routes::{self, TaskChange};
use crate::{agent_integrations, public_url};

/// What every handler shares: one reference-counted [`Shared`]. axum
/// clones the state for each middleware and extractor of every request; a
/// clone of this is one reference count, where a clone of the parts would
/// be a dozen, plus the allocations of those that own strings and lists.
#[derive(Debug, Clone)]
pub struct AppState(Arc<Shared>);

impl AppState {
    pub fn new(shared: Shared) -> Self {
        AppState(Arc::new(shared))
    }

    /// The state the binary serves, as `main` and the test harness build
    /// it: `settings` on `store`, with the parts every server makes for
    /// itself (the feed's hub, the availability probe, the credential
    /// caches, the metrics registry's handle).
    pub fn build(store: Arc<dyn Store>, settings: Settings) -> AppState {
        let credentials = auth::Credentials::default();
        AppState::new(Shared {
            feed: feed::Feed::start(Arc::clone(&store), credentials.clone()),
            availability: availability::Availability::start(Arc::clone(&store)),
            store,
            clock: settings.clock,
            dev_key: settings.dev_key,
            policy: settings.policy,
            photo_limits: settings.photo_limits,
            metrics: metrics::handle(),
            rate_limit: rate_limit::RateLimit::new(settings.rate_limit),
            integrations: settings.integrations,
            mcp_allowed_hosts: settings.mcp_allowed_hosts,
            credentials,
            agent_digests: auth::DigestCache::for_agents(),
            public_origin: settings.public_origin,
        })
    }
}

/// What a server is configured with (see [`AppState::build`]).
#[derive(Debug)]
pub struct Settings {
    pub clock: meatspace_domain::clock::Clock,
    pub dev_key: auth::DevKey,
    pub policy: Policy,
    pub photo_limits: PhotoLimits,
    pub rate_limit: rate_limit::RateLimitSettings,
    pub integrations: agent_integrations::Integrations,
    pub mcp_allowed_hosts: meatspace_mcp::AllowedHosts,
    pub public_origin: public_url::PublicOrigin,
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// The parts of [`AppState`].
#[derive(Debug)]
pub struct Shared {
    pub store: Arc<dyn Store>,
    /// Where every handler reads the time: the system's, or in tests one
    /// the test moves past a deadline.
    pub clock: meatspace_domain::clock::Clock,
    pub dev_key: DevKey,
    pub policy: Policy,
    pub photo_limits: PhotoLimits,
    pub metrics: PrometheusHandle,
    /// Wakes long polls of the event feed; close it when shutdown starts.
    pub feed: Feed,
    /// Whether the database answers; API requests fail fast while it does not.
    pub availability: Availability,
    /// Per-credential request limits of the API routes.
    pub rate_limit: RateLimit,
    /// Idempotency-Key, SSE and webhook settings and the server key.
    pub integrations: agent_integrations::Integrations,
    /// `Host` headers the MCP endpoint (`/mcp`) accepts.
    pub mcp_allowed_hosts: meatspace_mcp::AllowedHosts,
    /// API keys, worker token digests and task owners already read, which
    /// the feed's hub drops when the store announces a revocation.
    pub credentials: auth::Credentials,
    /// Agent token digests already read ([`auth::DigestCache::for_agents`]).
    pub agent_digests: auth::DigestCache,
    /// The origin of absolute links and the cookie `Secure` decision.
    pub public_origin: public_url::PublicOrigin,
}

impl AppState {
    /// Runs a command on a task now and returns the change. The store's
    /// engine decides it, limits included (a full feed refuses additions
    /// from every surface alike).
    pub async fn act(
        &self,
        task_id: Uuid,
        command: Command,
    ) -> Result<axum::Json<TaskChange>, ApiError> {
        let applied = self.store.apply(task_id, command, self.clock.now()).await?;
        Ok(axum::Json(routes::task_change(applied)))
    }

    /// The worker's complete, from the API and the web app alike: a typed
    /// result is checked against the task's result schema first (its photo
    /// fields must name photos this worker sent for the task), then the
    /// engine decides. The schema never changes and a task's photos are
    /// only ever added, so checking before the command's lock is sound.
    pub async fn complete(
        &self,
        task_id: Uuid,
        worker: Uuid,
        note: Option<String>,
        result: Option<serde_json::Value>,
    ) -> Result<axum::Json<TaskChange>, ApiError> {
        if let Some(result) = &result {
            crate::routes::results::check(self, task_id, worker, result).await?;
        }
        self.act(
            task_id,
            Command::Complete {
                worker,
                note,
                result,
            },
        )
        .await
    }

    /// [`AppState::act`] for an agent-side action, which its events
    /// attribute to `by`.
    pub async fn act_by(
        &self,
        task_id: Uuid,
        command: Command,
        by: meatspace_domain::identity::ActedBy,
    ) -> Result<axum::Json<TaskChange>, ApiError> {
        let applied = self
            .store
            .apply_by(task_id, command, by, self.clock.now())
            .await?;
        Ok(axum::Json(routes::task_change(applied)))
    }
}
