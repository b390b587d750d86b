//! What the store keeps for the operator console: its sessions, and the
//! counts its overview shows. Both backends run the same SQL for it
//! (`store/sql/console.rs`).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use meatspace_domain::{Task, TaskState};
use uuid::Uuid;

use crate::StoreError;
use crate::token::TokenHash;

/// A signed-in console session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleSession {
    pub id: Uuid,
    /// Digest of the session cookie's secret.
    pub secret_hash: TokenHash,
    /// The API key signed in with; `None` for the development key.
    pub key_id: Option<Uuid>,
    /// Digest of the key's secret as presented at sign-in.
    pub key_digest: Option<TokenHash>,
    pub principal_id: Uuid,
    pub created_at: DateTime<Utc>,
    pub last_seen_at: DateTime<Utc>,
    /// The absolute end, whatever the activity.
    pub expires_at: DateTime<Utc>,
}

/// Tasks created and completed in one hour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HourCount {
    pub hour: DateTime<Utc>,
    pub created: u64,
    pub completed: u64,
}

/// How the agents' side of delivery is doing: webhook endpoints failing or
/// disabled, and submissions waiting for an agent's review.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Health {
    pub webhooks_failing: u64,
    pub webhooks_disabled: u64,
    pub reviews_waiting: u64,
}

/// Which tasks the console lists: newest first, after a keyset cursor.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TaskFilter {
    pub state: Option<TaskState>,
    pub owner: Option<Uuid>,
    /// Created at or after.
    pub since: Option<DateTime<Utc>>,
    /// Created before.
    pub until: Option<DateTime<Utc>>,
    /// Text the description contains (case-insensitive for ASCII letters).
    pub search: Option<String>,
    /// The last task of the previous page: (created_at, id).
    pub before: Option<(DateTime<Utc>, Uuid)>,
    pub limit: u32,
}

#[async_trait]
pub trait ConsoleStore: Send + Sync {
    /// At most `limit` workers whose name contains `search` (every worker
    /// without one), with ids after `after`, in id order.
    async fn console_workers(
        &self,
        search: Option<&str>,
        after: Option<Uuid>,
        limit: u32,
    ) -> Result<Vec<meatspace_domain::identity::Worker>, StoreError>;

    /// Tasks matching `filter`, newest first, each with its owner.
    async fn console_tasks(&self, filter: &TaskFilter) -> Result<Vec<(Task, Uuid)>, StoreError>;

    async fn create_console_session(&self, session: &ConsoleSession) -> Result<(), StoreError>;

    /// The session, unless it expired (absolutely) by `now`.
    async fn console_session(
        &self,
        id: Uuid,
        now: DateTime<Utc>,
    ) -> Result<Option<ConsoleSession>, StoreError>;

    /// Records activity (the idle timeout counts from it).
    async fn touch_console_session(&self, id: Uuid, at: DateTime<Utc>) -> Result<(), StoreError>;

    async fn end_console_session(&self, id: Uuid) -> Result<(), StoreError>;

    /// Deletes at most `limit` sessions expired at `now`; how many went.
    async fn purge_console_sessions(
        &self,
        now: DateTime<Utc>,
        limit: u32,
    ) -> Result<u64, StoreError>;

    /// Webhook and review health now.
    async fn health(&self) -> Result<Health, StoreError>;

    /// How many tasks are in each state now (states without any left out).
    async fn task_counts(&self) -> Result<Vec<(TaskState, u64)>, StoreError>;

    /// The open task published longest ago.
    async fn oldest_open_task(&self) -> Result<Option<Task>, StoreError>;

    /// Tasks created, and tasks completed, per hour since `since` (hours
    /// without either left out), oldest first.
    async fn tasks_per_hour(&self, since: DateTime<Utc>) -> Result<Vec<HourCount>, StoreError>;
}
