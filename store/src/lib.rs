//! Persistence behind one trait, [`Store`], with one implementation per
//! database in its own crate (`meatspace-store-postgres`,
//! `meatspace-store-sqlite`), each owning its migrations and holding its SQL.
//! This crate holds what both share: the trait, [`StoreError`], [`Change`],
//! the change counters ([`TaskVersions`]), token digests, the server key,
//! the model of idempotency records, webhooks and task requests, and the
//! [`engine`] that runs every command (read → decide → write → announce) the
//! same way whatever the backend.
//!
//! Every change to a task goes through [`EngineWrites::apply`]: read the task and
//! what the command [needs](meatspace_domain::Command::needs), run the pure
//! [`decide`](meatspace_domain::decide), and write the task, its events,
//! issues and photo in one transaction that holds the task's row lock and
//! checks that the task is still as it was decided on. Holding the row lock
//! while events are inserted is what makes one task's event ids become
//! visible in ascending order, so a client polling `after=<last id>` never
//! misses one.

use std::collections::HashMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use futures::stream::BoxStream;
use uuid::Uuid;

use meatspace_domain::{Command, Event, Issue, Refusal, Task, TaskState};

use crate::token::TokenHash;

pub mod console;
pub mod engine;
pub mod idempotency;
pub mod identity;
pub mod migrations;
pub mod notify;
pub mod requests;
pub mod row;
pub mod secret;
pub mod token;
mod versions;
pub mod webhooks;

pub use idempotency::{IdempotencyBegin, IdempotencyClaim};
pub use identity::{ApiKey, AuditEntry, AuditFilter, KeyRecord, KeyRefusal, NewApiKey, NewAudit};
pub use requests::TaskRequest;
pub use versions::TaskVersions;
pub use webhooks::{DueWebhook, Webhook, WebhookOutcome, WebhookState};

/// Which database a store talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Postgres,
    Sqlite,
}

/// Errors of the store. [`StoreError::is_unavailable`] separates "the
/// database cannot be reached" (503) from real faults (500).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("not found")]
    NotFound,
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("database unavailable: {0}")]
    Unavailable(#[source] sqlx::Error),
    #[error("database error: {0}")]
    Database(#[source] sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("corrupt row: {0}")]
    Corrupt(String),
    #[error("unsupported database URL {0:?}: use postgres://… or sqlite://…")]
    UnsupportedUrl(String),
}

impl StoreError {
    pub fn is_unavailable(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        match e {
            // A broken conversation with the server (the socket closed, or
            // a message cut off or out of place when a server process dies
            // mid-reply) says the connection is gone, not that the
            // statement is wrong: sqlx drops such a connection, and a retry
            // meets a new one.
            sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Io(_)
            | sqlx::Error::Protocol(_)
            | sqlx::Error::Tls(_) => StoreError::Unavailable(e),
            sqlx::Error::Database(ref db) if means_unavailable(db.as_ref()) => {
                StoreError::Unavailable(e)
            }
            other => StoreError::Database(other),
        }
    }
}

/// Database errors that say the database cannot be used right now, not that
/// a statement is wrong: SQLite's busy timeout (the file is locked), and
/// PostgreSQL ending or refusing the session (severity FATAL, e.g. "database
/// is not currently accepting connections"), connection exceptions (class
/// 08), operator intervention (57P01-57P04) and too many connections.
fn means_unavailable(db: &dyn sqlx::error::DatabaseError) -> bool {
    use sqlx::postgres::{PgDatabaseError, PgSeverity};
    if db
        .try_downcast_ref::<PgDatabaseError>()
        .is_some_and(|pg| matches!(pg.severity(), PgSeverity::Fatal | PgSeverity::Panic))
    {
        return true;
    }
    match db.code().as_deref() {
        // SQLITE_BUSY after the busy timeout.
        Some("5") => true,
        Some(code) => {
            code.starts_with("08")
                || matches!(code, "57P01" | "57P02" | "57P03" | "57P04" | "53300")
        }
        None => false,
    }
}

/// An event read back from its stored columns (the kind and actor by their
/// stored names); a name this build does not know is a corrupt row.
pub fn stored_event(
    id: i64,
    task_id: Uuid,
    kind: &str,
    created_at: DateTime<Utc>,
    actor: &str,
    data: serde_json::Value,
) -> Result<Event, StoreError> {
    let kind = meatspace_domain::EventType::parse(kind)
        .ok_or_else(|| StoreError::Corrupt(format!("event type {kind:?}")))?;
    let actor = meatspace_domain::Actor::parse(actor)
        .ok_or_else(|| StoreError::Corrupt(format!("actor {actor:?}")))?;
    Ok(Event::new(id, task_id, kind, created_at, actor, data))
}

/// A task's place and presence rule as both backends store them (five
/// nullable columns and a text), read back: the one decoding of them.
pub fn stored_place(
    latitude: Option<f64>,
    longitude: Option<f64>,
    radius_m: Option<i64>,
    address: Option<String>,
    presence: &str,
) -> Result<
    (
        Option<meatspace_domain::Location>,
        meatspace_domain::Presence,
    ),
    StoreError,
> {
    let presence = meatspace_domain::Presence::parse(presence)
        .ok_or_else(|| StoreError::Corrupt(format!("presence {presence:?}")))?;
    let location = match (latitude, longitude, radius_m) {
        (None, None, None) => None,
        (Some(lat), Some(lon), Some(radius)) => {
            let radius = u32::try_from(radius).ok();
            Some(
                meatspace_domain::Location::new(lat, lon, radius, address)
                    .map_err(|e| StoreError::Corrupt(format!("task location: {e}")))?,
            )
        }
        _ => return Err(StoreError::Corrupt("a task location half stored".into())),
    };
    Ok((location, presence))
}

/// A task's result schema, review, result and requirements as both
/// backends store them: nullable columns of JSON text the server reads and
/// writes whole.
#[derive(Debug, Default)]
pub struct StoredWork {
    pub result_schema: Option<String>,
    pub review: Option<String>,
    pub result: Option<String>,
    pub requirements: Option<String>,
}

/// [`StoredWork`] read back.
#[derive(Debug, Default)]
pub struct Work {
    pub result_schema: Option<serde_json::Value>,
    pub review: Option<meatspace_domain::Review>,
    pub result: Option<serde_json::Value>,
    pub requirements: Vec<meatspace_domain::qualification::Requirement>,
}

impl StoredWork {
    /// The columns of `task`.
    pub fn of(task: &Task) -> StoredWork {
        let text = |v: &serde_json::Value| v.to_string();
        StoredWork {
            result_schema: task.result_schema.as_ref().map(text),
            review: task
                .review
                .as_ref()
                .map(|r| serde_json::to_string(r).expect("a review serialises to JSON")),
            result: task.result.as_ref().map(text),
            requirements: (!task.requirements.is_empty()).then(|| {
                serde_json::to_string(&task.requirements).expect("requirements serialise to JSON")
            }),
        }
    }

    /// The columns read back: the one decoding of them.
    pub fn decode(self) -> Result<Work, StoreError> {
        fn json<T: serde::de::DeserializeOwned>(
            column: &str,
            text: Option<String>,
        ) -> Result<Option<T>, StoreError> {
            text.map(|t| serde_json::from_str(&t))
                .transpose()
                .map_err(|e| StoreError::Corrupt(format!("task {column}: {e}")))
        }
        Ok(Work {
            result_schema: json("result_schema", self.result_schema)?,
            review: json("review", self.review)?,
            result: json("result", self.result)?,
            requirements: json("requirements", self.requirements)?.unwrap_or_default(),
        })
    }
}

/// A task to create. The caller generates the id and the token and passes
/// only the token's digest.
#[derive(Debug, Clone)]
pub struct NewTask {
    pub id: Uuid,
    pub description: String,
    pub agent_token_hash: TokenHash,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    /// The principal whose key created the task (the development principal
    /// for the development key; a namespace's principal for a task
    /// requested through Kubernetes).
    pub owner_id: Uuid,
    /// Where the task is done, if anywhere in particular.
    pub location: Option<meatspace_domain::Location>,
    pub presence: meatspace_domain::Presence,
    /// The JSON Schema of the result, already checked to be in the subset.
    pub result_schema: Option<serde_json::Value>,
    /// The review's terms, when the agent asked for review.
    pub review: Option<meatspace_domain::Review>,
    /// Who may see and claim the task, already checked.
    pub requirements: Vec<meatspace_domain::qualification::Requirement>,
}

impl NewTask {
    /// A task of the development principal with no place, result schema
    /// or review (what tests and benchmarks create).
    pub fn development(
        id: Uuid,
        description: impl Into<String>,
        agent_token_hash: TokenHash,
        created_at: DateTime<Utc>,
        expires_at: DateTime<Utc>,
    ) -> NewTask {
        NewTask {
            id,
            description: description.into(),
            agent_token_hash,
            created_at,
            expires_at,
            owner_id: meatspace_domain::identity::DEVELOPMENT_PRINCIPAL,
            location: None,
            presence: meatspace_domain::Presence::None,
            result_schema: None,
            review: None,
            requirements: Vec::new(),
        }
    }

    /// The task as it is created, with what is stored beside it.
    pub fn into_draft(self, webhook_url: Option<&str>) -> Draft<'_> {
        let task = Task {
            location: self.location,
            presence: self.presence,
            result_schema: self.result_schema,
            review: self.review,
            requirements: self.requirements,
            ..Task::draft(self.id, self.description, self.created_at, self.expires_at)
        };
        Draft {
            task,
            agent_token_hash: self.agent_token_hash,
            owner_id: self.owner_id,
            webhook_url,
        }
    }
}

/// What a backend inserts for a new task: the task, a draft with no events
/// yet, and what is stored beside it.
#[derive(Debug, Clone)]
pub struct Draft<'a> {
    pub task: Task,
    pub agent_token_hash: TokenHash,
    /// The principal whose key created the task.
    pub owner_id: Uuid,
    /// The task's webhook endpoint, if it has one.
    pub webhook_url: Option<&'a str>,
}

pub use meatspace_domain::identity::{Invite, Worker};

/// A photo as stored.
#[derive(Clone, PartialEq, Eq, derive_more::Debug)]
pub struct Photo {
    pub id: Uuid,
    pub task_id: Uuid,
    pub content_type: String,
    #[debug("{} bytes", bytes.len())]
    pub bytes: Vec<u8>,
    pub created_at: DateTime<Utc>,
}

/// The outcome of an applied command: the task as written and the events
/// appended (with their ids).
#[derive(Debug, Clone)]
pub struct Applied {
    pub task: Task,
    pub events: Vec<Event>,
    /// Which deadline a `Reconcile` command applied; `None` for any other.
    pub reconciled: Option<meatspace_domain::Due>,
}

/// What an agent's poll of a task's feed needs, read in one statement (one
/// snapshot): the agent token's digest, the task's state and last event id,
/// and a page of its events.
#[derive(Debug, Clone)]
pub struct FeedRead {
    pub agent_token_hash: TokenHash,
    pub state: meatspace_domain::TaskState,
    pub last_event_id: i64,
    /// Events with `id > after`, ascending, at most `limit`.
    pub events: Vec<Event>,
}

/// The first circle [`TaskReads::open_tasks_near`] reads, in metres.
const FIRST_NEAR_RADIUS_M: f64 = 2_000.0;

/// A point and a distance: where a worker looks for tasks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Near {
    pub latitude: f64,
    pub longitude: f64,
    pub within_m: f64,
}

/// An open task's id and point, as the nearby listing's index holds them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OpenPlace {
    pub id: Uuid,
    pub latitude: f64,
    pub longitude: f64,
}

/// Where the nearby listing resumes: the last task of the previous page.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NearCursor {
    pub distance_m: f64,
    pub id: Uuid,
}

/// Where the open-task listing resumes: the last task of the previous page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenTasksCursor {
    pub created_at: DateTime<Utc>,
    pub id: Uuid,
}

/// A one-time invitation for a person to become a worker through the web
/// app, with the digest of its code: all the store keeps of the code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InviteRecord {
    pub invite: Invite,
    pub code_hash: TokenHash,
}

/// A signed-in browser session of a worker, read back unexpired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub id: Uuid,
    pub worker: Worker,
    pub secret_hash: TokenHash,
    pub expires_at: DateTime<Utc>,
}

/// Storage of tasks, events, issues, photos and workers.
#[async_trait]
pub trait Store:
    EngineWrites
    + TaskReads
    + DeliveryRecords
    + Retention
    + IdentityStore
    + notify::Notifications
    + console::ConsoleStore
    + std::fmt::Debug
    + 'static
{
    fn backend(&self) -> BackendKind;

    /// Checks the database answers (readiness).
    async fn ping(&self) -> Result<(), StoreError>;

    async fn create_task(&self, new: NewTask) -> Result<Task, StoreError>;

    /// The change counters this store bumps after each commit that touches
    /// a task (see [`TaskVersions`]); `None` when it keeps none, and then
    /// nothing may cache what it reads.
    fn versions(&self) -> Option<&TaskVersions> {
        None
    }

    /// A stream of the tasks changed after the call, from any process
    /// sharing the database (PostgreSQL LISTEN/NOTIFY) or from this process
    /// (SQLite). Used to wake long polls and the controller early.
    ///
    /// The stream never drops a change silently: when changes may have been
    /// missed (the notification connection was lost and re-established, or
    /// the consumer fell behind) it yields [`Change::Gap`], after which the
    /// consumer must re-read whatever it follows. The stream is driven by
    /// the store in the background, so a consumer that is busy elsewhere
    /// neither stalls the reconnect nor leaves the database's side of the
    /// connection unread. It ends only when the store is closed.
    async fn changes(&self) -> Result<BoxStream<'static, Change>, StoreError>;
}

/// The writes the engine decides: commands on a task, creates, reconciles,
/// invite redemptions and suspensions. Both backends run the same code for
/// them (`store/sql/engine_writes.rs`), each through its engine backend.
#[async_trait]
pub trait EngineWrites: Send + Sync {
    /// Runs `command` on the task: decides on the task as committed at one
    /// moment during the call and, if the command is accepted, writes the
    /// change in one transaction that holds the task's row lock and
    /// commits only if the task is still as decided on. Fails with
    /// [`StoreError::NotFound`] or [`StoreError::Refused`].
    async fn apply(
        &self,
        task_id: Uuid,
        command: Command,
        now: DateTime<Utc>,
    ) -> Result<Applied, StoreError>;

    /// [`EngineWrites::apply`] for an agent-side action, recording in its agent
    /// events' data (`by`) which credential acted.
    async fn apply_by(
        &self,
        task_id: Uuid,
        command: Command,
        by: meatspace_domain::identity::ActedBy,
        now: DateTime<Utc>,
    ) -> Result<Applied, StoreError>;

    /// [`EngineWrites::apply_by`] with `audit` appended to the audit trail in the
    /// same transaction (an operator acting on a task it does not own): the
    /// command and its audit row commit together or not at all. The time
    /// of the command is the audit row's.
    async fn apply_audited(
        &self,
        task_id: Uuid,
        command: Command,
        by: meatspace_domain::identity::ActedBy,
        audit: NewAudit,
    ) -> Result<Applied, StoreError>;

    /// Registers a worker (an operator's direct registration; an invite's
    /// goes through [`EngineWrites::redeem_invite`]).
    async fn create_worker(
        &self,
        id: Uuid,
        name: &str,
        token_hash: TokenHash,
        now: DateTime<Utc>,
    ) -> Result<Worker, StoreError>;

    /// Creates a task with a webhook endpoint, in one transaction, so the
    /// endpoint (and with it the delivery of every event) exists from the
    /// task's first moment.
    async fn create_task_with_webhook(
        &self,
        new: NewTask,
        webhook_url: &str,
    ) -> Result<Task, StoreError>;

    /// Claims an `Idempotency-Key` for a request (see [`IdempotencyBegin`]).
    async fn idempotency_begin(
        &self,
        claim: &IdempotencyClaim,
    ) -> Result<IdempotencyBegin, StoreError>;

    /// Applies what is due at `now` to at most `limit` due tasks, skipping
    /// tasks another replica is working on. Returns what it changed.
    async fn reconcile_due(
        &self,
        now: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<Applied>, StoreError>;

    /// In one transaction: marks the invite used and registers the worker
    /// it creates. `None` (and nothing written) when the invite does not
    /// exist, was used already or expired before `now`; of several
    /// concurrent redemptions exactly one gets the worker.
    async fn redeem_invite(
        &self,
        invite_id: Uuid,
        worker_id: Uuid,
        name: &str,
        token_hash: TokenHash,
        now: DateTime<Utc>,
    ) -> Result<Option<Worker>, StoreError>;

    /// Creates the task a Kubernetes resource asks for, exactly once per
    /// resource: in one transaction, records `request` (keyed by the
    /// resource's UID) and creates `new` (whose id must be
    /// `request.task_id`). When the resource already has a request row
    /// (a retry, a restart, a racing replica), nothing is written. Returns
    /// the row in the table: its `task_id` is `new.id` only if this call
    /// created the task.
    async fn create_requested_task(
        &self,
        new: NewTask,
        request: &TaskRequest,
    ) -> Result<TaskRequest, StoreError>;

    /// Suspends a worker, ends its sessions and releases every task it
    /// holds (assigned or active; `task.unassigned`, reason
    /// `worker_suspended`), all in one transaction with the audit row.
    /// `None` when there is no such worker. Suspending twice keeps the
    /// first time and writes no second audit entry.
    async fn suspend_worker(&self, id: Uuid, audit: NewAudit)
    -> Result<Option<Worker>, StoreError>;
}

/// What the store keeps of deliveries: each webhook endpoint's cursor and
/// the sealed answers of idempotent requests. Both backends run the same
/// SQL for them (`store/sql/deliveries.rs`); claiming due endpoints is each
/// database's own.
#[async_trait]
pub trait DeliveryRecords: Send + Sync {
    /// Records the (sealed) answer of a request that claimed `key`.
    async fn idempotency_complete(
        &self,
        scope: &[u8; 32],
        key: &str,
        status: u16,
        response: &[u8],
    ) -> Result<(), StoreError>;

    /// Forgets an in-flight claim whose request had no answer worth
    /// replaying (a server error): a retry runs the request again.
    async fn idempotency_release(&self, scope: &[u8; 32], key: &str) -> Result<(), StoreError>;

    /// The task's webhook endpoint, if it has one.
    async fn webhook(&self, task_id: Uuid) -> Result<Option<Webhook>, StoreError>;

    /// Claims at most `limit` endpoints with undelivered events whose next
    /// attempt is due at `now`, moving their next attempt to `lease_until`
    /// so that no other controller takes them meanwhile.
    async fn claim_due_webhooks(
        &self,
        now: DateTime<Utc>,
        lease_until: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<DueWebhook>, StoreError>;

    /// The earliest next attempt of an endpoint with undelivered events.
    async fn next_webhook_attempt(&self) -> Result<Option<DateTime<Utc>>, StoreError>;

    /// Records what a delivery attempt did.
    async fn record_webhook(
        &self,
        task_id: Uuid,
        outcome: &WebhookOutcome,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError>;
}

/// What the controller deletes once it is no longer needed. Both backends
/// run the same SQL for it (`store/sql/retention.rs`).
#[async_trait]
pub trait Retention: Send + Sync {
    /// Deletes at most `limit` terminal tasks that ended before `cutoff`,
    /// oldest first, with their events, issues and photos, keeping only
    /// the agent token's digest (a tombstone stamped `now`). Returns how
    /// many went.
    async fn purge_ended_before(
        &self,
        cutoff: DateTime<Utc>,
        now: DateTime<Utc>,
        limit: u32,
    ) -> Result<u64, StoreError>;

    /// Deletes at most `limit` tombstones of tasks purged before `cutoff`:
    /// after that their tokens answer 401 like any unknown token. Returns
    /// how many went.
    async fn forget_purged_before(
        &self,
        cutoff: DateTime<Utc>,
        limit: u32,
    ) -> Result<u64, StoreError>;

    /// Deletes at most `limit` sign-in records that can no longer be used:
    /// sessions expired at `now`, and invites used, revoked or expired. Returns how
    /// many went. Each sign-in adds a session and each invite a row, so
    /// without this the tables grow for ever.
    async fn purge_sign_ins(&self, now: DateTime<Utc>, limit: u32) -> Result<u64, StoreError>;

    /// Deletes at most `limit` idempotency records whose window ended
    /// before `before`. Returns how many went.
    async fn purge_idempotency_keys(
        &self,
        before: DateTime<Utc>,
        limit: u32,
    ) -> Result<u64, StoreError>;
}

/// Reads of tasks, their feeds, issues and photos. Both backends run the
/// same SQL for them (`store/sql/reads.rs`).
#[async_trait]
pub trait TaskReads: Send + Sync {
    async fn task(&self, id: Uuid) -> Result<Option<Task>, StoreError>;

    /// Digest of the task's agent token, for authentication. It outlives
    /// the task: after retention removes it, the digest stays behind (a
    /// tombstone), so its agent is told the task is gone, not that the token
    /// is wrong.
    async fn agent_token_hash(&self, task_id: Uuid) -> Result<Option<TokenHash>, StoreError>;

    /// Events of a task with `id > after`, ascending, at most `limit`.
    async fn events(&self, task_id: Uuid, after: i64, limit: u32)
    -> Result<Vec<Event>, StoreError>;

    /// The task's agent token digest, state, last event id and events with
    /// `id > after` (at most `limit`), in one round trip and one snapshot.
    /// `None` when the task does not exist (a purged task's tombstone is
    /// not read here: [`TaskReads::agent_token_hash`] is).
    async fn feed_read(
        &self,
        task_id: Uuid,
        after: i64,
        limit: u32,
    ) -> Result<Option<FeedRead>, StoreError>;

    /// Issues of a task, ascending by event id.
    async fn issues(&self, task_id: Uuid) -> Result<Vec<Issue>, StoreError>;

    async fn photo(&self, task_id: Uuid, photo_id: Uuid) -> Result<Option<Photo>, StoreError>;

    /// Bytes of every photo stored for a task (0 for none), for the
    /// per-task cap on photo storage.
    async fn photo_bytes(&self, task_id: Uuid) -> Result<u64, StoreError>;

    /// Digest of a worker's token, for authentication.
    async fn worker_token_hash(&self, worker_id: Uuid) -> Result<Option<TokenHash>, StoreError>;

    /// Open tasks, oldest first, after `cursor`.
    async fn open_tasks(
        &self,
        cursor: Option<OpenTasksCursor>,
        limit: u32,
    ) -> Result<Vec<Task>, StoreError>;

    /// Open tasks without a place, oldest first, after `cursor`.
    async fn open_unlocated_tasks(
        &self,
        cursor: Option<OpenTasksCursor>,
        limit: u32,
    ) -> Result<Vec<Task>, StoreError>;

    /// Open tasks with a place whose index cell is in one of `ranges`
    /// (inclusive), as ids and points: what
    /// [`meatspace_domain::place::cover`] says may lie near a point, read
    /// from the index alone.
    async fn open_places_in_cells(
        &self,
        ranges: &[(i64, i64)],
    ) -> Result<Vec<OpenPlace>, StoreError>;

    /// The tasks with these ids, in no particular order; an id with no task
    /// is left out.
    async fn tasks_by_id(&self, ids: &[Uuid]) -> Result<Vec<Task>, StoreError>;

    /// Open tasks with a place within `near.within_m` of `near`'s point,
    /// nearest first (ties by id), after `after`, at most `limit`, each
    /// with its distance in metres. Reads a circle that grows (by the
    /// density it found, at most eightfold) until it holds a page or reaches
    /// `within_m`: every task inside a circle is a candidate, so those it
    /// holds are the nearest, and the work is in proportion to the tasks
    /// near the point, not to the table. Candidates are ids and points from
    /// the index; only the page's rows are read from the table.
    async fn open_tasks_near(
        &self,
        near: Near,
        after: Option<NearCursor>,
        limit: u32,
    ) -> Result<Vec<(Task, f64)>, StoreError> {
        let beyond = |d: f64, id: Uuid| match after {
            None => true,
            Some(a) => (d, id) > (a.distance_m, a.id),
        };
        let limit = limit as usize;
        let mut radius = after
            .map_or(0.0, |a| a.distance_m * 2.0)
            .max(FIRST_NEAR_RADIUS_M)
            .min(near.within_m);
        loop {
            let ranges = meatspace_domain::place::cover(near.latitude, near.longitude, radius);
            let mut candidates: Vec<(f64, Uuid)> = self
                .open_places_in_cells(&ranges)
                .await?
                .into_iter()
                .filter(|place| {
                    meatspace_domain::place::may_be_within(
                        near.latitude,
                        near.longitude,
                        place.latitude,
                        place.longitude,
                        radius,
                    )
                })
                .filter_map(|place| {
                    let d = meatspace_domain::place::distance_m(
                        near.latitude,
                        near.longitude,
                        place.latitude,
                        place.longitude,
                    );
                    (d <= radius && beyond(d, place.id)).then_some((d, place.id))
                })
                .collect();
            let whole = radius >= near.within_m;
            if candidates.len() >= limit || whole {
                candidates.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                // A candidate may have left the open state since the index
                // was read: its place goes to the next one.
                let mut page: Vec<(Task, f64)> = Vec::with_capacity(limit);
                let mut rest = candidates.as_slice();
                while page.len() < limit && !rest.is_empty() {
                    let (next, after_next) = rest.split_at((limit - page.len()).min(rest.len()));
                    rest = after_next;
                    let ids: Vec<Uuid> = next.iter().map(|&(_, id)| id).collect();
                    let mut tasks: HashMap<Uuid, Task> = self
                        .tasks_by_id(&ids)
                        .await?
                        .into_iter()
                        .filter(|task| task.state == TaskState::Open)
                        .map(|task| (task.id, task))
                        .collect();
                    page.extend(
                        next.iter()
                            .filter_map(|&(d, id)| Some((tasks.remove(&id)?, d))),
                    );
                }
                if page.len() >= limit || whole {
                    return Ok(page);
                }
            }
            // Grow to where, at the density just seen, a page would be:
            // at least half again, at most eightfold (each round is a
            // round trip; an empty circle says little about the next).
            let wanted = limit as f64 / candidates.len().max(1) as f64;
            radius = (radius * wanted.sqrt() * 1.25)
                .clamp(radius * 1.5, radius * 8.0)
                .min(near.within_m);
        }
    }

    /// Every task, ordered by id, after `after` (for full resyncs).
    async fn tasks_after(&self, after: Option<Uuid>, limit: u32) -> Result<Vec<Task>, StoreError>;

    /// The earliest deadline of any non-terminal task.
    async fn next_deadline(&self) -> Result<Option<DateTime<Utc>>, StoreError>;

    /// How many events the task has, counting no further than `up_to`
    /// (the per-task event limit: the count costs at most that many index
    /// entries).
    async fn count_events(&self, task_id: Uuid, up_to: u64) -> Result<u64, StoreError>;

    /// Id of the newest event of type `kind` of the task, if any (the
    /// worker's feed starts after the last `task.unassigned`).
    async fn last_event_of_type(
        &self,
        task_id: Uuid,
        kind: meatspace_domain::EventType,
    ) -> Result<Option<i64>, StoreError>;

    /// Tasks assigned to the worker (now or at their end), most recently
    /// changed first, at most `limit`.
    async fn worker_tasks(&self, worker_id: Uuid, limit: u32) -> Result<Vec<Task>, StoreError>;

    /// Open tasks, newest first, at most `limit`.
    async fn newest_open_tasks(&self, limit: u32) -> Result<Vec<Task>, StoreError>;

    /// The request row of the resource with this UID, if it has one.
    async fn task_request(&self, resource_uid: &str) -> Result<Option<TaskRequest>, StoreError>;

    /// Which of `task_ids` were requested from Kubernetes (the mirror
    /// leaves those to the resource that asked for them).
    async fn requested_among(&self, task_ids: &[Uuid]) -> Result<Vec<Uuid>, StoreError>;
}

/// Identity and access: keys, principals, workers' suspension and tokens,
/// invites and the audit trail. Both backends run the same SQL for it
/// (`store/sql/identity.rs`). Every privileged write takes the audit entry
/// that records it and writes both in one transaction, and every write
/// that takes a credential's power away announces [`Change::Credential`]
/// on commit.
#[async_trait]
pub trait IdentityStore: Send + Sync {
    /// Records a session of `worker_id` whose secret hashes to `secret_hash`.
    async fn create_session(
        &self,
        id: Uuid,
        worker_id: Uuid,
        secret_hash: TokenHash,
        now: DateTime<Utc>,
        expires_at: DateTime<Utc>,
    ) -> Result<(), StoreError>;

    /// The session with its worker, if it exists and has not expired at `now`.
    async fn session(&self, id: Uuid, now: DateTime<Utc>) -> Result<Option<Session>, StoreError>;

    /// Ends a session (sign out); false when there was none.
    async fn delete_session(&self, id: Uuid) -> Result<bool, StoreError>;

    /// Records an invite whose code hashes to `code_hash`, made by
    /// `audit.principal_id`, with its audit entry.
    async fn create_invite(
        &self,
        id: Uuid,
        code_hash: TokenHash,
        expires_at: DateTime<Utc>,
        audit: NewAudit,
    ) -> Result<(), StoreError>;

    /// An invite, used or not, expired or not.
    async fn invite(&self, id: Uuid) -> Result<Option<InviteRecord>, StoreError>;

    /// Stores a key (and its principal, when new) with its audit entry.
    async fn create_api_key(&self, new: NewApiKey, audit: NewAudit) -> Result<ApiKey, StoreError>;

    /// Stores `new` unless a key with its id exists (the key given in
    /// configuration at start-up); true when it was stored. Its principal,
    /// when `new_principal`, is made unless it exists: every replica given
    /// the key derives the same one.
    async fn insert_configured_key(&self, new: NewApiKey) -> Result<bool, StoreError>;

    /// A key with its digests, revoked or not.
    async fn api_key(&self, id: Uuid) -> Result<Option<KeyRecord>, StoreError>;

    /// Keys ordered by id, after `after`.
    async fn api_keys(&self, after: Option<Uuid>, limit: u32) -> Result<Vec<ApiKey>, StoreError>;

    /// Gives a key a new secret; the current one stays good until
    /// `previous_valid_until`. `None` when there is no such key; a revoked
    /// key is not rotated (the key comes back as it is, `revoked_at` set).
    async fn rotate_api_key(
        &self,
        id: Uuid,
        digest: TokenHash,
        previous_valid_until: DateTime<Utc>,
        audit: NewAudit,
    ) -> Result<Option<ApiKey>, StoreError>;

    /// Revokes a key (revoking twice keeps the first time, and writes no
    /// second audit entry). `None` when there is no such key.
    async fn revoke_api_key(&self, id: Uuid, audit: NewAudit)
    -> Result<Option<ApiKey>, StoreError>;

    /// Records when keys were last used (coarse: the server writes this
    /// from memory about once a minute).
    async fn touch_api_keys(&self, used: &[(Uuid, DateTime<Utc>)]) -> Result<(), StoreError>;

    /// Records `principal` unless it exists (the principal of a Kubernetes
    /// namespace, made on first use).
    async fn ensure_principal(
        &self,
        principal: &meatspace_domain::identity::PrincipalRef,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError>;

    /// An operator's or agent's principal.
    async fn principal(
        &self,
        id: Uuid,
    ) -> Result<Option<meatspace_domain::identity::PrincipalRef>, StoreError>;

    /// The principal that owns the task; `None` when there is no such task.
    async fn task_owner(&self, task_id: Uuid) -> Result<Option<Uuid>, StoreError>;

    /// The tasks `owner` owns, newest first, before `cursor`, in `state`
    /// when given.
    async fn owned_tasks(
        &self,
        owner: Uuid,
        state: Option<meatspace_domain::TaskState>,
        cursor: Option<OpenTasksCursor>,
        limit: u32,
    ) -> Result<Vec<Task>, StoreError>;

    /// One worker, suspended or not.
    async fn worker(&self, id: Uuid) -> Result<Option<Worker>, StoreError>;

    /// Workers ordered by id, after `after`.
    async fn workers(&self, after: Option<Uuid>, limit: u32) -> Result<Vec<Worker>, StoreError>;

    /// Grants (or replaces) a worker's qualification, with its audit row.
    /// `false` when there is no such worker.
    async fn grant_qualification(
        &self,
        worker: Uuid,
        qualification: &meatspace_domain::qualification::Qualification,
        audit: NewAudit,
    ) -> Result<bool, StoreError>;

    /// Revokes a worker's qualification, with its audit row. `false` when
    /// the worker did not hold it.
    async fn revoke_qualification(
        &self,
        worker: Uuid,
        name: &str,
        audit: NewAudit,
    ) -> Result<bool, StoreError>;

    /// The qualifications granted to a worker (lapsed ones included), by name.
    async fn qualifications(
        &self,
        worker: Uuid,
    ) -> Result<Vec<meatspace_domain::qualification::Qualification>, StoreError>;

    /// Blocks a worker from every task of `principal`, with its audit row.
    /// `false` when there is no such worker.
    async fn block_worker(
        &self,
        principal: Uuid,
        worker: Uuid,
        audit: NewAudit,
    ) -> Result<bool, StoreError>;

    /// Lifts a block, with its audit row. `false` when there was none.
    async fn unblock_worker(
        &self,
        principal: Uuid,
        worker: Uuid,
        audit: NewAudit,
    ) -> Result<bool, StoreError>;

    /// The workers `principal` has blocked, with when, by worker id.
    async fn blocked_workers(
        &self,
        principal: Uuid,
    ) -> Result<Vec<(Uuid, DateTime<Utc>)>, StoreError>;

    /// The principals that have blocked `worker`.
    async fn blocked_by(&self, worker: Uuid) -> Result<Vec<Uuid>, StoreError>;

    /// Lifts a suspension. `None` when there is no such worker.
    async fn reinstate_worker(
        &self,
        id: Uuid,
        audit: NewAudit,
    ) -> Result<Option<Worker>, StoreError>;

    /// Replaces a worker's token digest (the old token stops at once).
    async fn rotate_worker_token(
        &self,
        id: Uuid,
        token_hash: TokenHash,
        audit: NewAudit,
    ) -> Result<Option<Worker>, StoreError>;

    /// Invites ordered by id, after `after`.
    async fn invites(&self, after: Option<Uuid>, limit: u32) -> Result<Vec<Invite>, StoreError>;

    /// Revokes an unused invite (revoking twice changes nothing). `None`
    /// when there is no such invite.
    async fn revoke_invite(&self, id: Uuid, audit: NewAudit) -> Result<Option<Invite>, StoreError>;

    /// Appends an entry that records no other write (a refused
    /// development key).
    async fn append_audit(&self, audit: NewAudit) -> Result<(), StoreError>;

    /// Audit entries, newest first.
    async fn audit(&self, filter: &AuditFilter) -> Result<Vec<AuditEntry>, StoreError>;

    /// Deletes at most `limit` audit entries older than `before` (the
    /// retention period). Returns how many went.
    async fn purge_audit_before(
        &self,
        before: DateTime<Utc>,
        limit: u32,
    ) -> Result<u64, StoreError>;
}

/// One item of [`Store::changes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// This task changed (its row, events, issues or photos), or was purged.
    Task(Uuid),
    /// The credential with this id (an API key, or a worker: its token and
    /// sessions) lost power: revoked, rotated or suspended. Every process
    /// drops what it kept in memory about it.
    Credential(Uuid),
    /// Changes may have been missed since the previous item: re-read
    /// everything that matters. Yielded after the stream is listening
    /// again, so a re-read that follows it misses nothing.
    Gap,
}

/// Connection settings shared by both backends.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Largest number of pooled connections.
    pub max_connections: u32,
    /// How long a request waits for a connection before the store reports
    /// the database unavailable.
    pub acquire_timeout: std::time::Duration,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            max_connections: 16,
            // Short: a request that cannot get a connection within a second
            // is better answered 503 (the database is down or overloaded)
            // than left hanging.
            acquire_timeout: std::time::Duration::from_secs(1),
        }
    }
}

/// A database URL with any password replaced, safe to log.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let userinfo = &url[scheme_end + 3..at];
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{}://{}:***@{}", &url[..scheme_end], user, &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::{StoreError, redact_url};

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact_url("postgres://u:secret@h:5/db"),
            "postgres://u:***@h:5/db"
        );
        assert_eq!(redact_url("sqlite://x.db"), "sqlite://x.db");
    }

    #[test]
    fn a_broken_connection_is_an_outage_and_a_bad_statement_is_not() {
        let eof = std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
        for broken in [
            sqlx::Error::Io(eof),
            sqlx::Error::Protocol("execute: unexpected message: ReadyForQuery".into()),
            sqlx::Error::PoolTimedOut,
        ] {
            assert!(StoreError::from(broken).is_unavailable());
        }
        let wrong = sqlx::Error::ColumnNotFound("nope".into());
        assert!(!StoreError::from(wrong).is_unavailable());
    }
}
