//! Settings of the agent integrations (Idempotency-Key replays, Server-Sent
//! Events, webhooks) that handlers share through [`crate::AppState`].

use std::time::Duration;

use chrono::TimeDelta;
use meatspace_domain::webhook_url::AllowList;
use meatspace_store::secret::ServerKey;

/// Defaults, also used by the tests' in-process server.
pub const DEFAULT_SSE_HEARTBEAT: Duration = Duration::from_secs(15);
pub const DEFAULT_IDEMPOTENCY_TTL: TimeDelta = TimeDelta::hours(24);

#[derive(Debug, Clone)]
pub struct Integrations {
    /// Seals replayable answers and derives webhook secrets (see
    /// [`meatspace_store::secret`]).
    pub server_key: ServerKey,
    /// Interval of the `: keep-alive` comments on event streams.
    pub sse_heartbeat: Duration,
    /// How long an `Idempotency-Key` answer is replayed.
    pub idempotency_ttl: TimeDelta,
    /// Webhook destinations allowed although they are not public addresses.
    pub webhook_allow: AllowList,
    /// How long the controller retries a failing webhook endpoint (its
    /// `MEATSPACE_WEBHOOK_GIVE_UP_SECONDS`), as the capabilities state it.
    pub webhook_give_up: Duration,
    /// The public half of the VAPID key the controller signs push
    /// messages with (derived from the server key), for browsers to
    /// subscribe with.
    pub vapid_public_key: String,
}

impl Integrations {
    /// The defaults with the given key.
    pub fn new(server_key: ServerKey) -> Self {
        Integrations {
            vapid_public_key: meatspace_controller::notify::push::vapid_public_key(&server_key),
            server_key,
            sse_heartbeat: DEFAULT_SSE_HEARTBEAT,
            idempotency_ttl: DEFAULT_IDEMPOTENCY_TTL,
            webhook_allow: AllowList::default(),
            webhook_give_up: meatspace_controller::ControllerConfig::default()
                .webhooks
                .give_up_after,
        }
    }
}
