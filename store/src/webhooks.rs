//! Webhook endpoints and their delivery cursors: the model both backends
//! store (each holds only its SQL).
//!
//! The events table is the outbox: an endpoint is due when its task has an
//! event after `delivered_event_id` and `next_attempt_at` has come. A
//! controller claims due endpoints by moving `next_attempt_at` forward by a
//! lease (with `FOR UPDATE SKIP LOCKED` on PostgreSQL, under the write lock
//! on SQLite), so replicas do not deliver the same endpoint at once, and a
//! replica that dies mid-delivery only delays the endpoint until the lease
//! ends. The cursor advances only after the receiver acknowledged an event:
//! delivery is at least once, in event order.

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::StoreError;

/// Delivery state of an endpoint, as shown on the task resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
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

impl WebhookState {
    pub fn as_str(self) -> &'static str {
        match self {
            WebhookState::Active => "active",
            WebhookState::Failing => "failing",
            WebhookState::Disabled => "disabled",
        }
    }

    /// The state a backend read back (a corrupt row otherwise).
    pub fn parse(s: &str) -> Result<Self, StoreError> {
        match s {
            "active" => Ok(WebhookState::Active),
            "failing" => Ok(WebhookState::Failing),
            "disabled" => Ok(WebhookState::Disabled),
            other => Err(StoreError::Corrupt(format!("webhook state {other:?}"))),
        }
    }
}

/// A task's webhook endpoint (no secret: it is derived, never stored).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
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

/// An endpoint a controller claimed for delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueWebhook {
    pub task_id: Uuid,
    pub url: String,
    pub delivered_event_id: i64,
    pub attempts: i32,
    pub failing_since: Option<DateTime<Utc>>,
}

/// What a delivery attempt did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WebhookOutcome {
    /// The receiver acknowledged `event_id`; `next_attempt_at` is `None`
    /// once the task's terminal event is delivered.
    Delivered {
        event_id: i64,
        next_attempt_at: Option<DateTime<Utc>>,
    },
    /// The attempt failed; try again then.
    Failed {
        error: String,
        next_attempt_at: DateTime<Utc>,
    },
    /// Stop delivering to this endpoint.
    Disabled { error: String },
}
