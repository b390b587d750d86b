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
use uuid::Uuid;

pub use meatspace_domain::webhook::{Webhook, WebhookState};

/// An endpoint a controller claimed for delivery. A row of PostgreSQL's
/// claim reads into it as it is (`sqlx::FromRow`).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
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
