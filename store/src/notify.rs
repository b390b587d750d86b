//! What the store keeps of notifications: each worker's preferences and
//! push subscriptions, the outbox of causes (recorded by the database in
//! the transaction that appends the event, see the `0080` migrations), and
//! one row per worker, cause and channel that the controller delivers.
//! Both backends run the same SQL for it (`store/sql/notifications.rs`).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use meatspace_domain::notify::{Cause, Channel, Preferences};
use meatspace_domain::qualification::Qualification;
use meatspace_domain::{Actor, EventType};
use uuid::Uuid;

use crate::StoreError;

/// A browser's Web Push subscription (the Push API's `PushSubscription`):
/// where to send, and the keys to encrypt for (RFC 8291), base64url.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushSubscription {
    pub endpoint: String,
    pub p256dh: String,
    pub auth: String,
}

/// An event in the outbox, not yet (or not yet wholly) turned into
/// notifications.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingCause {
    pub event_id: i64,
    pub task_id: Uuid,
    pub kind: EventType,
    pub actor: Actor,
    pub created_at: DateTime<Utc>,
    /// How far an announcement has gone: workers with smaller ids have
    /// their notifications.
    pub next_worker: Option<Uuid>,
}

/// A worker who asked to hear of new tasks, with what deciding needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Listener {
    pub worker_id: Uuid,
    pub preferences: Preferences,
    pub qualifications: Vec<Qualification>,
    /// Whether any browser of the worker's is subscribed to push.
    pub has_push: bool,
}

/// A notification to make (once per worker, cause key and channel).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewNotification {
    pub worker_id: Uuid,
    pub cause_key: String,
    pub cause: Cause,
    pub task_id: Uuid,
    pub channel: Channel,
}

/// A notification whose attempt is due, claimed by one controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueNotification {
    pub id: i64,
    pub worker_id: Uuid,
    pub cause: Cause,
    pub task_id: Uuid,
    pub channel: Channel,
    /// Attempts made before this one.
    pub attempts: u32,
    pub created_at: DateTime<Utc>,
}

/// What an attempt did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotificationOutcome {
    /// Delivered (accepted by the SMTP server, or by the push service for
    /// at least one of the worker's browsers).
    Sent,
    /// Failed for now: try again at this time.
    Retry(DateTime<Utc>),
    /// Failed for good (gave up, or nowhere left to send it).
    Failed,
    /// Not sent: the worker had as many as the hourly cap allows.
    Capped,
    /// Not sent: it is no longer for this worker (the task moved on, the
    /// worker unsubscribed or lost the right to see it).
    Withdrawn,
}

impl NotificationOutcome {
    /// The stored name of a final outcome.
    pub fn as_str(self) -> Option<&'static str> {
        match self {
            NotificationOutcome::Sent => Some("sent"),
            NotificationOutcome::Retry(_) => None,
            NotificationOutcome::Failed => Some("failed"),
            NotificationOutcome::Capped => Some("capped"),
            NotificationOutcome::Withdrawn => Some("withdrawn"),
        }
    }
}

/// What waits: causes not yet fanned out and notifications not yet done,
/// and when the oldest of them was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Backlog {
    pub causes: u64,
    pub notifications: u64,
    pub oldest: Option<DateTime<Utc>>,
}

/// A task whose holder's time runs out soon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lapsing {
    pub task_id: Uuid,
    pub worker_id: Uuid,
    /// When the assignment lapses (the start deadline of an assigned task,
    /// the time limit of an active one).
    pub at: DateTime<Utc>,
}

#[async_trait]
pub trait Notifications: Send + Sync {
    /// The worker's preferences; `None` when there is no such worker.
    async fn preferences(&self, worker: Uuid) -> Result<Option<Preferences>, StoreError>;

    /// Replaces the worker's preferences (checked by the caller); `false`
    /// when there is no such worker. Turning email off (no address)
    /// withdraws the worker's pending email notifications.
    async fn set_preferences(
        &self,
        worker: Uuid,
        preferences: &Preferences,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError>;

    /// Adds (or renews) a browser's push subscription for the worker.
    async fn add_push_subscription(
        &self,
        worker: Uuid,
        subscription: &PushSubscription,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError>;

    /// The worker's push subscriptions.
    async fn push_subscriptions(&self, worker: Uuid) -> Result<Vec<PushSubscription>, StoreError>;

    /// Removes a push subscription: the worker's (`Some`) or whoever's
    /// (`None`, when the push service says it is gone). `true` when there
    /// was one.
    async fn remove_push_subscription(
        &self,
        worker: Option<Uuid>,
        endpoint: &str,
    ) -> Result<bool, StoreError>;

    /// Stops a channel for the worker (the unsubscribe link): email loses
    /// its address, push its subscriptions; pending notifications on the
    /// channel are withdrawn.
    async fn unsubscribe(
        &self,
        worker: Uuid,
        channel: Channel,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError>;

    /// Claims at most `limit` causes no other controller holds at `now`,
    /// holding them until `lease_until`; oldest first.
    async fn claim_causes(
        &self,
        now: DateTime<Utc>,
        lease_until: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<PendingCause>, StoreError>;

    /// At most `limit` unsuspended workers who asked for new tasks, with
    /// ids after `after`, in id order.
    async fn listeners(&self, after: Option<Uuid>, limit: u32)
    -> Result<Vec<Listener>, StoreError>;

    /// In one transaction: makes `notifications` (those made before are
    /// kept as they are), and moves the cause on: to `next_worker` when
    /// its fan-out continues, out of the outbox when it is done. Returns
    /// how many notifications are new.
    async fn fan_out(
        &self,
        cause_event_id: Option<i64>,
        notifications: &[NewNotification],
        next_worker: Option<Uuid>,
        now: DateTime<Utc>,
    ) -> Result<u64, StoreError>;

    /// Claims at most `limit` notifications due at `now`, holding them
    /// until `lease_until`; oldest first.
    async fn claim_due_notifications(
        &self,
        now: DateTime<Utc>,
        lease_until: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<DueNotification>, StoreError>;

    /// The earliest next attempt of a notification, or of the oldest cause
    /// (whose lease ends).
    async fn next_notification_work(&self) -> Result<Option<DateTime<Utc>>, StoreError>;

    /// Records what an attempt did.
    async fn record_notification(
        &self,
        id: i64,
        outcome: NotificationOutcome,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError>;

    /// Notifications sent to the worker on `channel` since `since`.
    async fn sent_since(
        &self,
        worker: Uuid,
        channel: Channel,
        since: DateTime<Utc>,
    ) -> Result<u32, StoreError>;

    /// What waits.
    async fn notification_backlog(&self) -> Result<Backlog, StoreError>;

    /// At most `limit` assigned or active tasks whose assignment lapses
    /// after `now` and by `by`.
    async fn lapsing(
        &self,
        now: DateTime<Utc>,
        by: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<Lapsing>, StoreError>;
}
