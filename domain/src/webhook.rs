//! A task's webhook endpoint as the task resource shows it: where its
//! events go and how their delivery is going (never the secret, which is
//! derived and never stored).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Delivery state of an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum WebhookState {
    /// Delivering (or caught up).
    Active,
    /// The last attempt failed; retrying with backoff.
    Failing,
    /// No more deliveries: the receiver answered 410 Gone, or it failed
    /// for longer than the retry period.
    Disabled,
}

crate::names! {
    WebhookState {
        Active => "active",
        Failing => "failing",
        Disabled => "disabled",
    }
}

/// A task's webhook endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct Webhook {
    pub url: String,
    pub state: WebhookState,
    /// The last event the receiver acknowledged (0 before the first).
    pub last_delivered_event_id: i64,
    /// Failed attempts since the last success.
    pub attempts: i32,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub failing_since: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
}
