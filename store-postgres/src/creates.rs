//! Task creation on PostgreSQL, grouped: creates that arrive while others
//! are being written share one statement. They pay one round trip, one
//! commit and one notification signal between them. Each would otherwise
//! pay its own, and PostgreSQL serializes NOTIFY at commit, so under load a
//! commit's notification is what creates wait on.
//!
//! Nothing waits to fill a group. A writer takes the first create queued
//! and whatever else is queued at that moment (up to [`MAX_GROUP`]), so a
//! lone create is written at once. Every new task row is written by
//! [`insert`], here and in the engine's transactions. [`WRITERS`] groups can be in flight at once. Every
//! create is answered only after its group commits. A group refused as a
//! whole for anything but an outage is written again one create at a time,
//! so one create's fault is never another's.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use tokio::sync::{Mutex, mpsc, oneshot};
use uuid::Uuid;

use meatspace_domain::place::cell_of;
use meatspace_domain::{Location, Presence};
use meatspace_store::token::TokenHash;
use meatspace_store::{Draft, StoreError, StoredWork};

/// Groups written at once (each takes a pooled connection).
const WRITERS: usize = 4;
/// Most creates in one statement.
const MAX_GROUP: usize = 64;

/// One new task's row: the one place a draft becomes a row of `tasks`.
#[derive(Debug)]
pub(super) struct NewRow {
    pub id: Uuid,
    pub description: String,
    pub agent_token_hash: TokenHash,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub next_deadline: Option<DateTime<Utc>>,
    pub owner_id: Uuid,
    pub location: Option<Location>,
    pub presence: Presence,
    pub work: StoredWork,
}

impl NewRow {
    /// The row of a new task.
    pub fn draft(draft: &Draft<'_>) -> Self {
        let task = &draft.task;
        NewRow {
            id: task.id,
            description: task.description.clone(),
            agent_token_hash: draft.agent_token_hash.clone(),
            created_at: task.created_at,
            expires_at: task.expires_at,
            next_deadline: task.next_deadline(),
            owner_id: draft.owner_id,
            location: task.location.clone(),
            presence: task.presence,
            work: StoredWork::of(task),
        }
    }
}

#[derive(Debug)]
struct Queued {
    row: NewRow,
    done: oneshot::Sender<Result<(), StoreError>>,
}

/// The queue of creates and its writers; the writers stop when the last
/// clone of the queue is dropped.
#[derive(Debug, Clone)]
pub(super) struct Creates {
    queue: mpsc::UnboundedSender<Queued>,
}

impl Creates {
    /// Starts the writers, which use `pool` and notify on `channel`.
    pub fn start(pool: PgPool, channel: &'static str) -> Self {
        let (queue, queued) = mpsc::unbounded_channel();
        let queued = Arc::new(Mutex::new(queued));
        for _ in 0..WRITERS {
            tokio::spawn(write_groups(pool.clone(), channel, Arc::clone(&queued)));
        }
        Creates { queue }
    }

    /// Inserts `row` as a draft and notifies its id; returns once committed.
    pub async fn create(&self, row: NewRow) -> Result<(), StoreError> {
        let (done, answer) = oneshot::channel();
        self.queue
            .send(Queued { row, done })
            .map_err(|_| closed())?;
        answer.await.map_err(|_| closed())?
    }
}

fn closed() -> StoreError {
    StoreError::Unavailable(sqlx::Error::PoolClosed)
}

/// One writer: takes a group off the queue, writes it, answers its creates.
async fn write_groups(
    pool: PgPool,
    channel: &'static str,
    queued: Arc<Mutex<mpsc::UnboundedReceiver<Queued>>>,
) {
    while let Some(group) = next_group(&queued, MAX_GROUP).await {
        count_group(GroupKind::Create, group.len());
        let written = insert(&pool, channel, group.iter().map(|q| &q.row)).await;
        match written {
            Err(e) if group.len() > 1 && !e.is_unavailable() => {
                // Find the fault's owner: each alone.
                count_fallback(GroupKind::Create);
                for q in group {
                    let alone = insert(&pool, channel, std::iter::once(&q.row)).await;
                    let _ = q.done.send(alone);
                }
            }
            Err(e) => {
                let mut group = group.into_iter();
                // The error for the first; the same kind for the others.
                let shared = share(&e);
                if let Some(q) = group.next() {
                    let _ = q.done.send(Err(e));
                }
                for q in group {
                    let _ = q.done.send(Err(shared()));
                }
            }
            Ok(()) => {
                for q in group {
                    let _ = q.done.send(Ok(()));
                }
            }
        }
    }
}

/// What a group of writes holds, as the metrics label it.
#[derive(Debug, Clone, Copy)]
pub(super) enum GroupKind {
    Create,
    Command,
}

impl GroupKind {
    fn label(self) -> &'static str {
        match self {
            GroupKind::Create => "create",
            GroupKind::Command => "command",
        }
    }
}

/// Counter of groups of two or more writes written together, by kind.
pub const GROUPS: &str = "meatspace_pg_write_groups_total";
/// Counter of the writes in those groups, by kind.
pub const GROUPED_WRITES: &str = "meatspace_pg_grouped_writes_total";
/// Counter of groups that failed for something other than an outage and
/// were written again one write at a time, by kind. Each is a fault of one
/// write (or of the grouped statement itself): never expected in steady
/// state, and what a test of grouping asserts stays zero.
pub const GROUP_FALLBACKS: &str = "meatspace_pg_write_group_fallbacks_total";

/// Counts a group about to be written (a lone write is no group).
pub(super) fn count_group(kind: GroupKind, size: usize) {
    if size > 1 {
        metrics::counter!(GROUPS, "kind" => kind.label()).increment(1);
        metrics::counter!(GROUPED_WRITES, "kind" => kind.label()).increment(size as u64);
    }
}

/// Counts a group written again one write at a time.
pub(super) fn count_fallback(kind: GroupKind) {
    metrics::counter!(GROUP_FALLBACKS, "kind" => kind.label()).increment(1);
}

/// The next group off a queue that writers share: the first item queued
/// and whatever else is queued at that moment, at most `max`; `None` once
/// the queue is closed and empty.
pub(super) async fn next_group<T>(
    queued: &Mutex<mpsc::UnboundedReceiver<T>>,
    max: usize,
) -> Option<Vec<T>> {
    let mut queued = queued.lock().await;
    let first = queued.recv().await?;
    let mut group = vec![first];
    while group.len() < max {
        match queued.try_recv() {
            Ok(next) => group.push(next),
            Err(_) => break,
        }
    }
    Some(group)
}

/// Makes more of an error of the same kind (sqlx errors do not clone).
pub(super) fn share(e: &StoreError) -> impl Fn() -> StoreError + use<> {
    let unavailable = e.is_unavailable();
    let message = e.to_string();
    move || {
        let e = sqlx::Error::Protocol(message.clone());
        if unavailable {
            StoreError::Unavailable(e)
        } else {
            StoreError::Database(e)
        }
    }
}

/// Inserts the rows and notifies their ids, in one statement: on the pool
/// its own transaction (the notifications are sent when it commits), or in
/// the caller's.
pub(super) async fn insert<'a, 'c, E>(
    conn: E,
    channel: &str,
    rows: impl ExactSizeIterator<Item = &'a NewRow>,
) -> Result<(), StoreError>
where
    E: sqlx::Executor<'c, Database = sqlx::Postgres>,
{
    let mut ids = Vec::with_capacity(rows.len());
    let mut descriptions = Vec::with_capacity(rows.len());
    let mut hashes = Vec::with_capacity(rows.len());
    let mut created = Vec::with_capacity(rows.len());
    let mut expires = Vec::with_capacity(rows.len());
    let mut deadlines = Vec::with_capacity(rows.len());
    let mut owners = Vec::with_capacity(rows.len());
    let mut latitudes = Vec::with_capacity(rows.len());
    let mut longitudes = Vec::with_capacity(rows.len());
    let mut radii = Vec::with_capacity(rows.len());
    let mut addresses = Vec::with_capacity(rows.len());
    let mut presences = Vec::with_capacity(rows.len());
    let mut cells = Vec::with_capacity(rows.len());
    let mut schemas = Vec::with_capacity(rows.len());
    let mut reviews = Vec::with_capacity(rows.len());
    let mut requirements = Vec::with_capacity(rows.len());
    for row in rows {
        schemas.push(row.work.result_schema.as_deref());
        reviews.push(row.work.review.as_deref());
        requirements.push(row.work.requirements.as_deref());
        let place = row.location.as_ref();
        latitudes.push(place.map(|p| p.latitude));
        longitudes.push(place.map(|p| p.longitude));
        radii.push(place.map(|p| i32::try_from(p.radius_m).unwrap_or(i32::MAX)));
        addresses.push(place.and_then(|p| p.address.as_deref()));
        presences.push(row.presence.as_str());
        cells.push(place.map(|p| cell_of(p.latitude, p.longitude)));
        ids.push(row.id);
        descriptions.push(row.description.as_str());
        hashes.push(&row.agent_token_hash.0[..]);
        created.push(row.created_at);
        expires.push(row.expires_at);
        deadlines.push(row.next_deadline);
        owners.push(row.owner_id);
    }
    sqlx::query(
        "WITH t AS (INSERT INTO tasks (id, description, state, agent_token_hash, created_at, \
           updated_at, expires_at, next_deadline, owner_id, latitude, longitude, radius_m, \
           address, presence, cell, result_schema, review, requirements) \
           SELECT id, description, 'draft', hash, created, created, expires, deadline, owner, \
             latitude, longitude, radius_m, address, presence, cell, result_schema, review, \
             requirements \
           FROM UNNEST($1::uuid[], $2::text[], $3::bytea[], $4::timestamptz[], \
             $5::timestamptz[], $6::timestamptz[], $8::uuid[], $9::float8[], $10::float8[], \
             $11::int[], $12::text[], $13::text[], $14::bigint[], $15::text[], $16::text[], \
             $17::text[]) \
             AS r(id, description, hash, created, expires, deadline, owner, latitude, longitude, \
               radius_m, address, presence, cell, result_schema, review, requirements) \
           RETURNING id) \
         SELECT pg_notify($7, id::text) FROM t",
    )
    .bind(ids)
    .bind(descriptions)
    .bind(hashes)
    .bind(created)
    .bind(expires)
    .bind(deadlines)
    .bind(channel)
    .bind(owners)
    .bind(latitudes)
    .bind(longitudes)
    .bind(radii)
    .bind(addresses)
    .bind(presences)
    .bind(cells)
    .bind(schemas)
    .bind(reviews)
    .bind(requirements)
    .execute(conn)
    .await?;
    Ok(())
}
