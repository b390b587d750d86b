//! The PostgreSQL store: the production backend. It holds SQL and what only
//! PostgreSQL has (migrations, the LISTEN/NOTIFY listener, grouped creates,
//! the one-statement conditional write, copies of the tasks it wrote); every
//! decision is the engine's ([`meatspace_store::engine`]), whose default
//! methods this store overrides to keep its fast paths.
//!
//! Row locks do the coordination. Every write of a task takes `FOR UPDATE`
//! on its row before it appends events, so concurrent writers to one task
//! queue up and its event ids (from one identity sequence) commit in
//! ascending order. [`meatspace_store::EngineWrites::apply`] mostly decides on a task read without
//! the lock (or on the copy it wrote last) and then writes with one
//! statement that takes the lock and writes only if the task is still as
//! read (see [`PgStore::write_in_one_statement`]); otherwise it reads the
//! task and decides again.
//! [`meatspace_store::EngineWrites::reconcile_due`] takes `FOR UPDATE SKIP LOCKED` on a batch of due
//! rows, so several controller replicas split the due work without waiting
//! for each other and never act on the same task twice. Every task change
//! sends `NOTIFY meatspace_tasks` with the task id, delivered on commit.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use sqlx::postgres::{PgListener, PgPool, PgPoolOptions, PgRow};
use sqlx::{Postgres, Row, Transaction};
use tokio::sync::{Notify, oneshot};
use uuid::Uuid;

use meatspace_domain::{Command, Decision, Event, EventType, Issue, IssueChange, Policy, Task};
use meatspace_store::engine::{
    self, Conditional, INSERT_PHOTO_SQL, OPEN_ISSUE_SQL, RESOLVE_ISSUE_SQL,
};
use meatspace_store::token::TokenHash;
use meatspace_store::{
    Applied, BackendKind, Change, ConnectOptions, Draft, NewTask, Store, StoreError, StoredWork,
    TaskReads, TaskVersions, Worker, stored_event,
};

use crate::creates::{Creates, NewRow};
use crate::group_commit::GroupCommit;

mod creates;
mod dialect;
mod group_commit;
mod idempotency;
// Shared with the other backend, over this one's `dialect`.
#[path = "../../store/sql/mod.rs"]
mod sql;
use sql::{identity, reads};
mod requests;
mod webhooks;

/// The migrations of this backend, embedded at build time. sqlx records each
/// one's checksum in the database and refuses to start when a file that
/// ran has changed, so these files never change (see the test below).
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

use meatspace_store::engine::TASK_COLUMNS;

/// Channel of the task-change notifications.
pub(crate) const CHANNEL: &str = "meatspace_tasks";

/// How long [`Store::ping`] waits for its probe connection.
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(500);

#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    /// One connection of its own for [`Store::ping`], so that a busy main
    /// pool never makes a healthy database look down, and a database that
    /// is down is noticed within [`PROBE_TIMEOUT`] (the main pool keeps
    /// retrying a refused connection until its acquire timeout).
    probe: PgPool,
    policy: Policy,
    /// Bumped after every commit that touches a task (see [`TaskVersions`]).
    versions: Arc<TaskVersions>,
    /// The tasks as this store last wrote them, for [`meatspace_store::EngineWrites::apply`]'s
    /// first try (see [`KnownTasks`]).
    known: Arc<KnownTasks>,
    /// When `ping` last failed: older pooled connections are not reused.
    outages: Arc<Outages>,
    /// Concurrent creates are written together (see [`Creates`]).
    creates: Creates,
    /// So are concurrent commands' conditional writes (see [`GroupCommit`]).
    commands: GroupCommit,
}

/// When the database was last seen unreachable.
#[derive(Debug)]
struct Outages {
    since: std::time::Instant,
    /// Milliseconds from `since` to the last failed ping, plus one (0: none).
    last_failure_ms: std::sync::atomic::AtomicU64,
}

impl Outages {
    fn new() -> Self {
        Outages {
            since: std::time::Instant::now(),
            last_failure_ms: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn failed_now(&self) {
        let ms = u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_failure_ms
            .store(ms.saturating_add(1), std::sync::atomic::Ordering::SeqCst);
    }

    /// True when a connection of this age was opened before (or during the
    /// millisecond of) the last failure.
    fn predates_last(&self, age: Duration) -> bool {
        let last = self
            .last_failure_ms
            .load(std::sync::atomic::Ordering::SeqCst);
        if last == 0 {
            return false;
        }
        let opened = self.since.elapsed().saturating_sub(age);
        opened.as_millis() < u128::from(last)
    }
}

impl PgStore {
    /// Connects and runs migrations. sqlx's migrator holds an advisory lock
    /// while it runs, so replicas starting together migrate once.
    pub async fn connect(
        url: &str,
        policy: Policy,
        options: &ConnectOptions,
    ) -> Result<Self, StoreError> {
        // The pool retries a failing connection until its acquire timeout
        // and then says only "pool timed out"; one direct connection first
        // reports why it fails (refused, unknown host, wrong password).
        {
            use sqlx::Connection;
            let probe = tokio::time::timeout(
                options.acquire_timeout.max(Duration::from_secs(10)),
                sqlx::PgConnection::connect(url),
            )
            .await
            .map_err(|_| StoreError::Unavailable(sqlx::Error::PoolTimedOut))?
            .map_err(StoreError::from)?;
            let _ = probe.close().await;
        }
        let outages = Arc::new(Outages::new());
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.acquire_timeout)
            // sqlx pings every connection it hands out by default: one more
            // round trip per statement. Instead, a pooled connection opened
            // before the last failed `ping` (the availability monitor's
            // probe, four times a second) is replaced before use, so a
            // request after an outage does not meet a dead connection.
            .test_before_acquire(false)
            .before_acquire({
                let outages = Arc::clone(&outages);
                move |_conn, meta| {
                    let fresh = !outages.predates_last(meta.age);
                    Box::pin(async move { Ok(fresh) })
                }
            })
            .connect(url)
            .await?;
        MIGRATOR.run(&pool).await?;
        let probe = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(PROBE_TIMEOUT)
            .connect_lazy(url)?;
        Ok(Self {
            creates: Creates::start(pool.clone(), CHANNEL),
            commands: GroupCommit::start(pool.clone()),
            pool,
            probe,
            policy,
            versions: Arc::default(),
            known: Arc::default(),
            outages,
        })
    }

    /// The pool, for tests and tools that need raw SQL.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Writes `d`, decided on `before`, in the caller's transaction, which
    /// holds the task's row lock. The task row, its events and the closing
    /// of its issues are [`PgStore::write_in_one_statement`], the one place
    /// a decision becomes a task row; what that statement does not carry (a
    /// photo, an issue answered or opened) is written around it.
    async fn write(
        tx: &mut Transaction<'_, Postgres>,
        before: &Task,
        d: Decision,
    ) -> Result<Applied, StoreError> {
        let now = d.task.updated_at;
        if let Some(p) = &d.photo {
            sqlx::query(INSERT_PHOTO_SQL)
                .bind(p.id)
                .bind(d.task.id)
                .bind(&p.content_type)
                .bind(&p.bytes)
                .bind(now)
                .execute(&mut **tx)
                .await?;
        }
        // An answered issue is resolved before the statement closes the
        // task's other open issues (an answer that cancels does both).
        for change in &d.issue_changes {
            if let IssueChange::Resolve {
                event_id,
                resolution,
            } = change
            {
                sqlx::query(RESOLVE_ISSUE_SQL)
                    .bind(resolution)
                    .bind(now)
                    .bind(event_id)
                    .execute(&mut **tx)
                    .await?;
            }
        }
        let applied = Self::write_one(&mut **tx, before, &d)
            .await?
            .ok_or_else(|| {
                // Impossible while we hold the row lock; refuse rather than
                // commit a change that did not happen.
                StoreError::Corrupt(format!("task {} changed under its lock", before.id))
            })?;
        for change in &d.issue_changes {
            if let IssueChange::Open { kind } = change {
                let event_id = applied
                    .events
                    .iter()
                    .find(|e| e.kind == EventType::WorkerIssue)
                    .map(|e| e.id)
                    .ok_or_else(|| StoreError::Corrupt("issue without its event".into()))?;
                sqlx::query(OPEN_ISSUE_SQL)
                    .bind(event_id)
                    .bind(before.id)
                    .bind(kind.as_str())
                    .execute(&mut **tx)
                    .await?;
            }
        }
        Ok(applied)
    }
}

impl PgStore {
    /// Writes the task rows, events and issue closures of decisions, each
    /// decided on its task as `before` shows it, with one statement (so one
    /// round trip) for all of them. This is the one place a decision
    /// becomes a task row: a new task column is one more array here. Alone
    /// it writes whole only the decisions that [`fits_one_statement`]; a
    /// photo and issues opened or answered are written around it by
    /// [`PgStore::write`]. The tasks must be distinct and in ascending id
    /// order. Each write is conditional on its own: it writes only if its
    /// task is still exactly as `before` shows it (same state and same
    /// `last_event_id`), and otherwise writes nothing and gets `None`,
    /// taking nothing of the others down. The outcomes are in `writes`'
    /// order.
    ///
    /// The statement takes arrays with one element per write (and one per
    /// event); in order of its data dependencies:
    ///
    /// 1. `r` is the writes, numbered `n` in order.
    /// 2. `lk` locks (`FOR UPDATE`), in id order, the task rows that still
    ///    have the state and last event id their write was decided on. When
    ///    another transaction holds a lock, it waits; under READ COMMITTED,
    ///    PostgreSQL then re-checks the join against the newest version of
    ///    the row (EvalPlanQual) and skips the row if it no longer matches
    ///    (or was deleted). So `lk` has a write's row exactly when this
    ///    statement holds the lock on that task as it was read.
    /// 3. `ev` inserts the events of the writes in `lk`, in their order.
    ///    Their ids are drawn from the identity sequence only then, row by
    ///    row, so one task's event ids become visible in ascending order, as
    ///    DESIGN ("Events") requires: every other writer of the task appends
    ///    only while holding the same lock.
    /// 4. `closed` closes the open issues (a terminal or lapsed decision),
    ///    `up` writes the task (its `last_event_id` the newest of its
    ///    events), and the notification is sent, each only for the writes in
    ///    `lk`.
    ///
    /// Why `(state, last_event_id)` is enough to tell "unchanged": every
    /// decision [`decide`](meatspace_domain::decide) accepts appends at least one event (each arm of
    /// its `match` pushes one or ends the task, which pushes one), every
    /// write of a task row (`write`, this statement, `write_reconciled`)
    /// sets `last_event_id` to the newest event it appended, and event ids
    /// come from one sequence, so they only grow: any committed change to
    /// the task since `before` was read moved its `last_event_id`. Issues
    /// of the task change only together with the task row (under its lock,
    /// with an event), so they too are as `before` was read; and purge
    /// deletes the row, which leaves `lk` without it.
    ///
    /// Run on its own (autocommit), the statement is its own transaction
    /// and commits the locks, events, issues, tasks and notifications
    /// together. Run inside a transaction that already holds a lock
    /// ([`PgStore::write`]), `lk` just finds the row it holds. The grouped
    /// writes ([`crate::commands`]) run it in a transaction of their own.
    ///
    /// The `= ANY($1)` conditions keep every lookup of `tasks` and `issues`
    /// on an index: without them the planner, which cannot see how many
    /// writes the arrays hold, may scan the whole table.
    async fn write_in_one_statement<'c, E>(
        conn: E,
        writes: &[(&Task, &Decision)],
    ) -> Result<Vec<Option<Applied>>, StoreError>
    where
        E: sqlx::Executor<'c, Database = Postgres>,
    {
        debug_assert!(writes.windows(2).all(|w| w[0].0.id < w[1].0.id));
        let n = writes.len();
        let mut ids = Vec::with_capacity(n);
        let mut was = Vec::with_capacity(n);
        let mut last = Vec::with_capacity(n);
        let mut states = Vec::with_capacity(n);
        let mut workers = Vec::with_capacity(n);
        let mut nows = Vec::with_capacity(n);
        let mut published = Vec::with_capacity(n);
        let mut assigned = Vec::with_capacity(n);
        let mut started = Vec::with_capacity(n);
        let mut ended = Vec::with_capacity(n);
        let mut start_by = Vec::with_capacity(n);
        let mut active_until = Vec::with_capacity(n);
        let mut deadlines = Vec::with_capacity(n);
        let mut open_issues = Vec::with_capacity(n);
        let mut expires = Vec::with_capacity(n);
        let mut closes = Vec::with_capacity(n);
        let mut reviews = Vec::with_capacity(n);
        let mut results = Vec::with_capacity(n);
        // The events, each with the number of its write.
        let (mut event_of, mut kinds, mut actors, mut data) = (vec![], vec![], vec![], vec![]);
        for (number, (before, d)) in (1i64..).zip(writes) {
            // A photo and an issue opened or answered are the caller's to
            // write ([`PgStore::write`]); closing them all is this one's.
            debug_assert!(
                d.issue_changes
                    .iter()
                    .filter(|c| matches!(c, IssueChange::CloseAll { .. }))
                    .count()
                    <= 1
            );
            let task = &d.task;
            ids.push(before.id);
            was.push(before.state.as_str());
            last.push(before.last_event_id);
            states.push(task.state.as_str());
            workers.push(task.worker_id);
            nows.push(task.updated_at);
            published.push(task.published_at);
            assigned.push(task.assigned_at);
            started.push(task.started_at);
            ended.push(task.ended_at);
            start_by.push(task.start_by);
            active_until.push(task.active_until);
            deadlines.push(task.next_deadline());
            open_issues.push(task.open_issues);
            expires.push(task.expires_at);
            let work = StoredWork::of(task);
            reviews.push(work.review);
            results.push(work.result);
            closes.push(d.issue_changes.iter().find_map(|c| match c {
                IssueChange::CloseAll { resolution } => Some(resolution.as_str()),
                _ => None,
            }));
            for e in &d.events {
                event_of.push(number);
                kinds.push(e.kind.as_str());
                actors.push(e.actor.as_str());
                data.push(&e.data);
            }
        }
        let rows = sqlx::query(
            "WITH r AS MATERIALIZED ( \
               SELECT * FROM UNNEST($1::uuid[], $2::text[], $3::bigint[], $4::text[], \
                 $5::uuid[], $6::timestamptz[], $7::timestamptz[], $8::timestamptz[], \
                 $9::timestamptz[], $10::timestamptz[], $11::timestamptz[], $12::timestamptz[], \
                 $13::timestamptz[], $14::int[], $15::timestamptz[], $16::text[], \
                 $22::text[], $23::text[]) \
               WITH ORDINALITY AS r(id, was, last, state, worker_id, now, published_at, \
                 assigned_at, started_at, ended_at, start_by, active_until, next_deadline, \
                 open_issues, expires_at, close, review, result, n)), \
             lk AS MATERIALIZED ( \
               SELECT t.id, r.n FROM r JOIN tasks t \
                 ON t.id = r.id AND t.state = r.was AND t.last_event_id = r.last \
               WHERE t.id = ANY($1) ORDER BY t.id FOR UPDATE OF t), \
             ev AS ( \
               INSERT INTO events (task_id, type, actor, created_at, data) \
               SELECT lk.id, e.type, e.actor, r.now, e.data \
               FROM UNNEST($17::bigint[], $18::text[], $19::text[], $20::jsonb[]) \
                 WITH ORDINALITY AS e(n, type, actor, data, k) \
               JOIN lk ON lk.n = e.n JOIN r ON r.n = e.n \
               ORDER BY e.k RETURNING id, task_id), \
             closed AS ( \
               UPDATE issues SET status = 'closed', resolution = r.close, resolved_at = r.now \
               FROM r JOIN lk ON lk.n = r.n \
               WHERE r.close IS NOT NULL AND issues.task_id = r.id \
                 AND issues.task_id = ANY($1) AND issues.status = 'open'), \
             up AS ( \
               UPDATE tasks SET state = r.state, worker_id = r.worker_id, updated_at = r.now, \
                 published_at = r.published_at, assigned_at = r.assigned_at, \
                 started_at = r.started_at, ended_at = r.ended_at, start_by = r.start_by, \
                 active_until = r.active_until, next_deadline = r.next_deadline, \
                 open_issues = r.open_issues, expires_at = r.expires_at, \
                 review = r.review, result = r.result, \
                 last_event_id = COALESCE( \
                   (SELECT max(ev.id) FROM ev WHERE ev.task_id = tasks.id), tasks.last_event_id) \
               FROM r JOIN lk ON lk.n = r.n \
               WHERE tasks.id = r.id AND tasks.id = ANY($1) RETURNING r.n) \
             SELECT up.n IS NOT NULL AS updated, \
               ARRAY(SELECT ev.id FROM ev WHERE ev.task_id = r.id ORDER BY ev.id) AS ids, \
               CASE WHEN up.n IS NOT NULL THEN pg_notify($21, r.id::text) END AS notified \
             FROM r LEFT JOIN up ON up.n = r.n ORDER BY r.n",
        )
        .bind(&ids)
        .bind(&was)
        .bind(&last)
        .bind(&states)
        .bind(&workers)
        .bind(&nows)
        .bind(&published)
        .bind(&assigned)
        .bind(&started)
        .bind(&ended)
        .bind(&start_by)
        .bind(&active_until)
        .bind(&deadlines)
        .bind(&open_issues)
        .bind(&expires)
        .bind(&closes)
        .bind(&event_of)
        .bind(&kinds)
        .bind(&actors)
        .bind(&data)
        .bind(CHANNEL)
        .bind(&reviews)
        .bind(&results)
        .fetch_all(conn)
        .await?;
        if rows.len() != n {
            return Err(StoreError::Corrupt(format!(
                "{} outcomes of {n} writes",
                rows.len()
            )));
        }
        writes
            .iter()
            .zip(rows)
            .map(|((_, d), row)| {
                let updated: bool = row.try_get("updated")?;
                let event_ids: Vec<i64> = row.try_get("ids")?;
                match (updated, event_ids.len()) {
                    (false, 0) => return Ok(None),
                    (true, k) if k == d.events.len() => {}
                    _ => {
                        return Err(StoreError::Corrupt(format!(
                            "task {}: updated {updated} and {} of {} events written",
                            d.task.id,
                            event_ids.len(),
                            d.events.len()
                        )));
                    }
                }
                let mut task = d.task.clone();
                let now = task.updated_at;
                let events: Vec<Event> = d
                    .events
                    .iter()
                    .cloned()
                    .zip(event_ids)
                    .map(|(e, id)| e.stored(id, task.id, now))
                    .collect();
                if let Some(newest) = events.last() {
                    task.last_event_id = newest.id;
                }
                Ok(Some(Applied {
                    task,
                    events,
                    reconciled: d.reconciled,
                }))
            })
            .collect()
    }

    /// [`PgStore::write_in_one_statement`] of one decision.
    async fn write_one<'c, E>(
        conn: E,
        before: &Task,
        d: &Decision,
    ) -> Result<Option<Applied>, StoreError>
    where
        E: sqlx::Executor<'c, Database = Postgres>,
    {
        let mut written = Self::write_in_one_statement(conn, &[(before, d)]).await?;
        Ok(written.pop().flatten())
    }

    /// Writes the controller's decisions for a batch of locked tasks with a
    /// fixed number of statements, whatever the batch size: one round trip
    /// per task would make a backlog of thousands of due tasks take
    /// seconds. Reconciling appends events and closes issues, which is what
    /// [`PgStore::write_in_one_statement`] writes for all of them at once,
    /// in the caller's transaction, which holds every row's lock.
    async fn write_reconciled(
        tx: &mut Transaction<'_, Postgres>,
        decided: Vec<(Task, Decision)>,
    ) -> Result<Vec<Applied>, StoreError> {
        if decided.iter().any(|(_, d)| !fits_one_statement(d)) {
            let mut out = Vec::with_capacity(decided.len());
            for (before, d) in decided {
                out.push(Self::write(tx, &before, d).await?);
            }
            return Ok(out);
        }
        // The statement takes the tasks in id order; the batch is answered
        // in the order it was decided (earliest deadline first).
        let mut order: Vec<usize> = (0..decided.len()).collect();
        order.sort_by_key(|&i| decided[i].0.id);
        let writes: Vec<(&Task, &Decision)> = order
            .iter()
            .map(|&i| (&decided[i].0, &decided[i].1))
            .collect();
        let written = Self::write_in_one_statement(&mut **tx, &writes).await?;
        let mut out: Vec<Option<Applied>> = vec![None; decided.len()];
        for (applied, i) in written.into_iter().zip(order) {
            // Impossible while we hold the row locks; refuse rather than
            // commit events for changes that did not happen.
            out[i] = Some(applied.ok_or_else(|| {
                StoreError::Corrupt(format!("task {} changed under its lock", decided[i].0.id))
            })?);
        }
        Ok(out.into_iter().flatten().collect())
    }
}

/// The SQL of [`meatspace_store::engine`]'s command path, with PostgreSQL's
/// faster overrides: the copies of tasks this store wrote ([`KnownTasks`]),
/// and the one-statement conditional write.
///
/// A command reaches the same result one of two ways (see
/// [`meatspace_store::EngineWrites::apply`]'s contract):
///
/// - **Optimistic** (most commands, two round trips, or one): read the
///   task without a lock, [`decide`](meatspace_domain::decide), and write with
///   [`PgStore::write_in_one_statement`], which locks the row first and
///   writes only if the task is still as read. If it is not (another
///   writer committed in between), nothing was written: read and decide
///   again, since the decision may now be different (the losing
///   claimant of a task is refused). A refusal is an answer as good as
///   the locking path's: it is about a committed state of the task at a
///   moment within this call. The first try uses this store's own copy
///   of the task instead of reading it, when it has one
///   ([`KnownTasks`]); that try's refusals are no answer.
/// - **Locking** (issues, photos, answers to issues, decisions that do
///   more than append events and close issues, and after a few lost
///   races): `BEGIN`, `SELECT … FOR UPDATE`, decide, write, `COMMIT`.
///
/// The engine ([`meatspace_store::engine::apply`]) runs both and makes
/// every decision; this store provides the SQL.
#[async_trait]
impl engine::Backend for PgStore {
    type Tx = Transaction<'static, Postgres>;

    async fn begin_write(&self) -> Result<Self::Tx, StoreError> {
        Ok(self.pool.begin().await?)
    }

    async fn lock_task(
        &self,
        tx: &mut Self::Tx,
        task_id: Uuid,
    ) -> Result<Option<Task>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {TASK_COLUMNS} FROM tasks WHERE id = $1 FOR UPDATE"
        ))
        .bind(task_id)
        .fetch_optional(&mut **tx)
        .await?;
        row.as_ref().map(task_from_row).transpose()
    }

    async fn read_issue(
        &self,
        tx: &mut Self::Tx,
        task_id: Uuid,
        event_id: i64,
    ) -> Result<Option<Issue>, StoreError> {
        let row = sqlx::query("SELECT * FROM issues WHERE event_id = $1 AND task_id = $2")
            .bind(event_id)
            .bind(task_id)
            .fetch_optional(&mut **tx)
            .await?;
        row.as_ref().map(issue_from_row).transpose()
    }

    async fn count_events(
        &self,
        tx: &mut Self::Tx,
        task_id: Uuid,
        up_to: u64,
    ) -> Result<u64, StoreError> {
        count_events(&mut **tx, task_id, up_to).await
    }

    async fn count_events_unlocked(&self, task_id: Uuid, up_to: u64) -> Result<u64, StoreError> {
        count_events(&self.pool, task_id, up_to).await
    }

    async fn write_decision(
        &self,
        tx: &mut Self::Tx,
        before: &Task,
        decision: Decision,
    ) -> Result<Applied, StoreError> {
        self.known.forget(before.id);
        Self::write(tx, before, decision).await
    }

    async fn insert_draft(&self, tx: &mut Self::Tx, draft: &Draft<'_>) -> Result<(), StoreError> {
        creates::insert(&mut **tx, CHANNEL, std::iter::once(&NewRow::draft(draft))).await?;
        if let Some(url) = draft.webhook_url {
            let task = &draft.task;
            crate::webhooks::insert(tx, task.id, url, task.created_at).await?;
        }
        Ok(())
    }

    async fn claim_request(
        &self,
        tx: &mut Self::Tx,
        request: &meatspace_store::requests::TaskRequest,
    ) -> Result<meatspace_store::requests::TaskRequest, StoreError> {
        crate::requests::claim(tx, request).await
    }

    async fn insert_idempotency_key(
        &self,
        tx: &mut Self::Tx,
        claim: &meatspace_store::idempotency::IdempotencyClaim,
    ) -> Result<bool, StoreError> {
        crate::idempotency::insert_fresh(tx, claim).await
    }

    async fn lock_idempotency_key(
        &self,
        tx: &mut Self::Tx,
        claim: &meatspace_store::idempotency::IdempotencyClaim,
    ) -> Result<Option<meatspace_store::idempotency::IdempotencyRecord>, StoreError> {
        crate::idempotency::lock(tx, claim).await
    }

    async fn take_idempotency_key(
        &self,
        tx: &mut Self::Tx,
        claim: &meatspace_store::idempotency::IdempotencyClaim,
    ) -> Result<(), StoreError> {
        crate::idempotency::take(tx, claim).await
    }

    async fn insert_audit(
        &self,
        tx: &mut Self::Tx,
        audit: &meatspace_store::NewAudit,
    ) -> Result<(), StoreError> {
        identity::insert_audit(tx, audit).await
    }

    async fn suspend_worker_rows(
        &self,
        tx: &mut Self::Tx,
        worker_id: Uuid,
        audit: &meatspace_store::NewAudit,
    ) -> Result<Option<(Worker, Vec<Uuid>)>, StoreError> {
        let suspended = sqlx::query(
            "UPDATE workers SET suspended_at = $1 WHERE id = $2 AND suspended_at IS NULL",
        )
        .bind(audit.at)
        .bind(worker_id)
        .execute(&mut **tx)
        .await?
        .rows_affected();
        if suspended == 1 {
            identity::insert_audit(tx, audit).await?;
        }
        sqlx::query("DELETE FROM worker_sessions WHERE worker_id = $1")
            .bind(worker_id)
            .execute(&mut **tx)
            .await?;
        let Some(worker) = identity::WORKERS.find(tx, worker_id).await? else {
            return Ok(None);
        };
        dialect::announce_credential(tx, worker_id).await?;
        let held: Vec<Uuid> = sqlx::query_scalar(
            "SELECT id FROM tasks WHERE worker_id = $1 AND state IN ('assigned', 'active')",
        )
        .bind(worker_id)
        .fetch_all(&mut **tx)
        .await?;
        Ok(Some((worker, held)))
    }

    async fn insert_worker(
        &self,
        tx: &mut Self::Tx,
        worker: &Worker,
        token_hash: &TokenHash,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO workers (id, name, token_hash, created_at) VALUES ($1, $2, $3, $4)",
        )
        .bind(worker.id)
        .bind(&worker.name)
        .bind(&token_hash.0[..])
        .bind(worker.created_at)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    async fn use_invite(
        &self,
        tx: &mut Self::Tx,
        invite_id: Uuid,
        worker_id: Uuid,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        // The row lock of the UPDATE makes concurrent redemptions queue: the
        // second sees used_at set and changes nothing.
        let used = sqlx::query(
            "UPDATE worker_invites SET used_at = $2, worker_id = $3 \
             WHERE id = $1 AND used_at IS NULL AND revoked_at IS NULL AND expires_at > $2",
        )
        .bind(invite_id)
        .bind(now)
        .bind(worker_id)
        .execute(&mut **tx)
        .await?
        .rows_affected();
        Ok(used == 1)
    }

    fn after_create(&self, task_id: Uuid, _committed: bool) {
        // Whether or not the commit's answer arrived (see TaskVersions).
        self.versions.bump(task_id);
    }

    async fn commit(&self, tx: Self::Tx) -> Result<(), StoreError> {
        Ok(tx.commit().await?)
    }

    async fn rollback(&self, tx: Self::Tx) -> Result<(), StoreError> {
        Ok(tx.rollback().await?)
    }

    fn after_commit(&self, task_id: Uuid, applied: Option<&Applied>) {
        // Whether or not the commit answered, it may have committed.
        self.versions.bump(task_id);
        if let Some(applied) = applied {
            self.known.wrote(&applied.task);
        }
    }

    async fn lock_due(
        &self,
        tx: &mut Self::Tx,
        now: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<Task>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {TASK_COLUMNS} FROM tasks WHERE next_deadline <= $1 \
             ORDER BY next_deadline LIMIT $2 FOR UPDATE SKIP LOCKED"
        ))
        .bind(now)
        .bind(i64::from(limit))
        .fetch_all(&mut **tx)
        .await?;
        rows.iter().map(task_from_row).collect()
    }

    /// [`PgStore::write_reconciled`]: the whole batch in one statement.
    async fn write_batch(
        &self,
        tx: &mut Self::Tx,
        decided: Vec<(Task, Decision)>,
        _now: DateTime<Utc>,
    ) -> Result<Vec<Applied>, StoreError> {
        Self::write_reconciled(tx, decided).await
    }

    fn after_batch_commit(&self, applied: &[Applied], _committed: bool) {
        // Whether or not the commit answered, it may have committed; the
        // copies are dropped (a reconciled task is rarely written next by
        // this replica).
        for a in applied {
            self.versions.bump(a.task.id);
            self.known.forget(a.task.id);
        }
    }

    /// Photos and new issues never fit the one-statement write: deciding
    /// them optimistically would only cost a read before the locked path.
    fn writes_optimistically(&self, command: &Command) -> bool {
        !matches!(command, Command::Photo { .. } | Command::RaiseIssue { .. })
    }

    fn unlocked_copy(&self, task_id: Uuid) -> Option<Task> {
        self.known.get(task_id)
    }

    async fn read_unlocked(&self, task_id: Uuid) -> Result<Option<Task>, StoreError> {
        self.task(task_id).await
    }

    /// [`PgStore::write_in_one_statement`], when the decision fits it.
    async fn write_if_unchanged(
        &self,
        before: &Task,
        decision: Decision,
    ) -> Result<Conditional, StoreError> {
        if !fits_one_statement(&decision) {
            return Ok(Conditional::NeedsLock);
        }
        let written = self.commands.write(before.clone(), decision).await;
        // Whatever the answer, the statement may have committed.
        self.versions.bump(before.id);
        match written {
            Ok(Some(applied)) => {
                self.known.wrote(&applied.task);
                Ok(Conditional::Written(applied))
            }
            Ok(None) => {
                self.known.forget(before.id);
                Ok(Conditional::Changed)
            }
            Err(e) => {
                self.known.forget(before.id);
                Err(e)
            }
        }
    }
}

/// The tasks as this store last wrote them (non-terminal ones only), so
/// that [`meatspace_store::EngineWrites::apply`] can decide a task's next command without reading
/// the task first: the common case of one client driving its task through
/// publish, claim, start and complete costs one statement per command.
///
/// A copy may be stale (another process, or a controller, changed the task
/// since), and that is safe, because nothing is answered from it alone:
///
/// - a decision made on the copy is written by
///   [`PgStore::write_in_one_statement`] only if the task's state and
///   `last_event_id` are still the copy's, and then the whole row is the
///   copy: the copy holds every column this store wrote with that
///   `last_event_id` (only timestamps that PostgreSQL keeps exactly, see
///   [`KnownTasks::wrote`]), and any later write would have moved
///   `last_event_id` (see the statement's documentation);
/// - a refusal decided on the copy is not an answer: [`meatspace_store::EngineWrites::apply`]
///   reads the task and decides again, as it does when the write finds the
///   task changed.
///
/// At worst a stale copy costs one write that writes nothing.
#[derive(Debug, Default)]
struct KnownTasks {
    copies: Mutex<Copies>,
}

#[derive(Debug, Default)]
struct Copies {
    tasks: std::collections::HashMap<Uuid, Task>,
    /// Bytes of the kept descriptions (a description may be 16 KB).
    description_bytes: usize,
}

/// Copies kept at most, and bytes of their descriptions at most: beyond
/// either, the map starts over (a miss costs one read).
const KNOWN_TASKS: usize = 16 * 1024;
const KNOWN_DESCRIPTION_BYTES: usize = 8 << 20;

impl KnownTasks {
    fn get(&self, id: Uuid) -> Option<Task> {
        self.lock().tasks.get(&id).cloned()
    }

    /// Records `task` as just committed by this store. A terminal task
    /// accepts no command any more, so it is dropped instead; so is a task
    /// with a timestamp finer than PostgreSQL's microseconds, which would
    /// not read back as it was written.
    fn wrote(&self, task: &Task) {
        let exact = |t: &DateTime<Utc>| t.timestamp_subsec_nanos().is_multiple_of(1000);
        let times = [
            Some(task.created_at),
            Some(task.updated_at),
            task.published_at,
            task.assigned_at,
            task.started_at,
            task.ended_at,
            Some(task.expires_at),
            task.start_by,
            task.active_until,
        ];
        let mut copies = self.lock();
        copies.remove(task.id);
        if task.state.is_terminal() || !times.iter().flatten().all(exact) {
            return;
        }
        let bytes = task.description.len();
        if copies.tasks.len() >= KNOWN_TASKS
            || copies.description_bytes + bytes > KNOWN_DESCRIPTION_BYTES
        {
            *copies = Copies::default();
        }
        copies.description_bytes += bytes;
        copies.tasks.insert(task.id, task.clone());
    }

    fn forget(&self, id: Uuid) {
        self.lock().remove(id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Copies> {
        self.copies.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Copies {
    fn remove(&mut self, id: Uuid) {
        if let Some(old) = self.tasks.remove(&id) {
            self.description_bytes -= old.description.len();
        }
    }
}

/// Whether [`PgStore::write_in_one_statement`] can write the decision: it
/// appends events and at most closes the open issues; no photo, no issue
/// opened or answered (those take [`PgStore::write`]'s statements).
fn fits_one_statement(d: &Decision) -> bool {
    d.photo.is_none()
        && d.issue_changes.len() <= 1
        && d.issue_changes
            .iter()
            .all(|c| matches!(c, IssueChange::CloseAll { .. }))
}

async fn notify(tx: &mut Transaction<'_, Postgres>, id: Uuid) -> Result<(), StoreError> {
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(CHANNEL)
        .bind(id.to_string())
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// A PostgreSQL row as a task row: typed ids and times.
struct Columns<'r>(&'r PgRow);

impl meatspace_store::row::RowColumns for Columns<'_> {
    fn str(&self, column: &str) -> Result<Option<&str>, StoreError> {
        Ok(self.0.try_get(column)?)
    }

    /// `int4` and `int8` columns alike.
    fn int(&self, column: &str) -> Result<Option<i64>, StoreError> {
        match self.0.try_get::<Option<i64>, _>(column) {
            Ok(v) => Ok(v),
            Err(_) => Ok(self.0.try_get::<Option<i32>, _>(column)?.map(i64::from)),
        }
    }

    fn real(&self, column: &str) -> Result<Option<f64>, StoreError> {
        Ok(self.0.try_get(column)?)
    }

    fn id(&self, column: &str) -> Result<Option<Uuid>, StoreError> {
        Ok(self.0.try_get(column)?)
    }

    fn time(&self, column: &str) -> Result<Option<DateTime<Utc>>, StoreError> {
        Ok(self.0.try_get(column)?)
    }
}

/// The task a row holds ([`meatspace_store::row::task_from_row`]).
fn task_from_row(row: &PgRow) -> Result<Task, StoreError> {
    meatspace_store::row::task_from_row(&Columns(row))
}

fn event_from_row(row: &PgRow) -> Result<Event, StoreError> {
    stored_event(
        row.try_get("id")?,
        row.try_get("task_id")?,
        row.try_get("type")?,
        row.try_get("created_at")?,
        row.try_get("actor")?,
        row.try_get("data")?,
    )
}

fn issue_from_row(row: &PgRow) -> Result<Issue, StoreError> {
    meatspace_store::row::issue_from_row(&Columns(row))
}

#[async_trait]
impl Store for PgStore {
    fn backend(&self) -> BackendKind {
        BackendKind::Postgres
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn ping(&self) -> Result<(), StoreError> {
        if let Err(e) = sqlx::query("SELECT 1").execute(&self.probe).await {
            self.outages.failed_now();
            return Err(e.into());
        }
        Ok(())
    }

    #[tracing::instrument(level = "debug", skip_all, fields(task_id = %new.id), err)]
    async fn create_task(&self, new: NewTask) -> Result<Task, StoreError> {
        let draft = new.into_draft(None);
        let created = self.creates.create(NewRow::draft(&draft)).await;
        self.versions.bump(draft.task.id);
        created?;
        self.known.wrote(&draft.task);
        Ok(draft.task)
    }

    fn versions(&self) -> Option<&TaskVersions> {
        Some(&self.versions)
    }

    async fn changes(&self) -> Result<BoxStream<'static, Change>, StoreError> {
        let pool = listener_pool(&self.pool);
        // The first LISTEN happens here, so a caller learns at once that the
        // database is unreachable; later losses become gaps.
        let listener = listen(&pool).await?;
        let shared = Arc::new(Pending::default());
        let (dropped, consumer) = oneshot::channel::<()>();
        tokio::spawn(follow(
            self.pool.clone(),
            pool,
            listener,
            shared.clone(),
            dropped,
        ));
        let stream = futures::stream::unfold((shared, consumer), |(shared, consumer)| async move {
            let next = shared.next().await?;
            Some((next, (shared, consumer)))
        });
        Ok(stream.boxed())
    }
}

// ---- the change stream ------------------------------------------------------------------

/// Task ids a subscription may hold for a consumer that is busy; beyond
/// that they collapse into one [`Change::Gap`].
const PENDING_CAPACITY: usize = 1024;
/// How long one attempt to (re)connect the listener may wait for a
/// connection before it counts as failed and is retried.
const LISTENER_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// First and longest pause between two attempts to reconnect the listener.
/// Short, because a waiting long poll learns of changes lost in an outage
/// only once the listener is back.
const RECONNECT_MIN: Duration = Duration::from_millis(50);
const RECONNECT_MAX: Duration = Duration::from_secs(1);

/// The pool of one subscription's listener: one connection of its own (so
/// a busy request pool never delays a reconnect) with TCP keepalives on the
/// server's side of the socket, so that PostgreSQL drops a listener whose
/// client host vanished instead of keeping a half-open backend.
fn listener_pool(pool: &PgPool) -> PgPool {
    let options = (*pool.connect_options()).clone().options([
        ("tcp_keepalives_idle", "10"),
        ("tcp_keepalives_interval", "5"),
        ("tcp_keepalives_count", "3"),
    ]);
    PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(LISTENER_CONNECT_TIMEOUT)
        .connect_lazy_with(options)
}

async fn listen(pool: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    // A lost connection is reported at once (`Ok(None)`); [`follow`]
    // reconnects itself, so that it knows when LISTEN is in force again.
    listener.eager_reconnect(false);
    listener.listen(CHANNEL).await?;
    Ok(listener)
}

/// A notification's payload: a task id, or `credential:<id>`.
fn parse_change(payload: &str) -> Option<Change> {
    match payload.strip_prefix(dialect::CREDENTIAL_PREFIX) {
        Some(id) => id.parse().ok().map(Change::Credential),
        None => payload.parse().ok().map(Change::Task),
    }
}

/// What the listener received and the consumer has not taken yet.
#[derive(Debug, Default)]
struct Pending {
    queue: Mutex<Queue>,
    ready: Notify,
}

#[derive(Debug, Default)]
struct Queue {
    ids: VecDeque<Change>,
    /// Changes may have been lost since the consumer's last item.
    gap: bool,
    /// No more items will come (the store was closed).
    ended: bool,
}

impl Pending {
    fn update(&self, f: impl FnOnce(&mut Queue)) {
        f(&mut self.queue.lock().unwrap_or_else(PoisonError::into_inner));
        // One consumer: a stored permit wakes it even if it is not waiting yet.
        self.ready.notify_one();
    }

    #[cfg(test)]
    fn task(&self, id: Uuid) {
        self.change(Change::Task(id));
    }

    fn change(&self, change: Change) {
        self.update(|q| {
            if q.gap {
                // The gap makes the consumer re-read everything anyway.
            } else if q.ids.len() >= PENDING_CAPACITY {
                q.ids.clear();
                q.gap = true;
            } else {
                q.ids.push_back(change);
            }
        });
    }

    fn gap(&self) {
        self.update(|q| {
            q.ids.clear();
            q.gap = true;
        });
    }

    fn end(&self) {
        self.update(|q| q.ended = true);
    }

    /// The next item for the consumer; `None` once the stream ended.
    async fn next(&self) -> Option<Change> {
        loop {
            {
                let mut q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
                if q.gap {
                    q.gap = false;
                    return Some(Change::Gap);
                }
                if let Some(change) = q.ids.pop_front() {
                    return Some(change);
                }
                if q.ended {
                    return None;
                }
            }
            self.ready.notified().await;
        }
    }
}

/// Drives one subscription until its consumer drops the stream or the
/// store's pool closes: reads every notification as it arrives, whatever
/// the consumer is doing, and after a lost connection reconnects with a
/// short backoff, re-issues LISTEN and only then reports the gap.
async fn follow(
    store_pool: PgPool,
    pool: PgPool,
    listener: PgListener,
    pending: Arc<Pending>,
    mut consumer: oneshot::Sender<()>,
) {
    // The listener lives (and holds its connection) only inside `drive`,
    // so the pool can close once it returns.
    drive(&store_pool, &pool, listener, &pending, &mut consumer).await;
    pending.end();
    pool.close().await;
}

async fn drive(
    store_pool: &PgPool,
    pool: &PgPool,
    mut listener: PgListener,
    pending: &Pending,
    consumer: &mut oneshot::Sender<()>,
) {
    loop {
        let received = tokio::select! {
            () = consumer.closed() => return,
            () = store_pool.close_event() => return,
            received = listener.try_recv() => received,
        };
        match received {
            Ok(Some(n)) => match parse_change(n.payload()) {
                Some(change) => pending.change(change),
                None => tracing::warn!(
                    payload = n.payload(),
                    "ignoring a malformed task change notification"
                ),
            },
            Ok(None) | Err(_) => {
                if let Err(e) = &received {
                    tracing::warn!(error = %e, "task change notifications failed; reconnecting");
                } else {
                    tracing::warn!("task change connection lost; reconnecting");
                }
                drop(listener);
                match reconnect(store_pool, pool, consumer).await {
                    Some(l) => listener = l,
                    None => return,
                }
                tracing::info!("listening for task changes again");
                pending.gap();
            }
        }
    }
}

/// Listens again after a lost connection, retrying with backoff; `None`
/// when the consumer or the store went away meanwhile.
async fn reconnect(
    store_pool: &PgPool,
    pool: &PgPool,
    consumer: &mut oneshot::Sender<()>,
) -> Option<PgListener> {
    let mut backoff = RECONNECT_MIN;
    loop {
        let attempt = tokio::select! {
            () = consumer.closed() => return None,
            () = store_pool.close_event() => return None,
            attempt = listen(pool) => attempt,
        };
        match attempt {
            Ok(l) => return Some(l),
            Err(e) => tracing::debug!(error = %e, "cannot listen for task changes yet"),
        }
        tokio::select! {
            () = consumer.closed() => return None,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(RECONNECT_MAX);
    }
}

/// [`meatspace_store::engine::COUNT_EVENTS_SQL`] on `executor`.
async fn count_events<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    task_id: Uuid,
    up_to: u64,
) -> Result<u64, StoreError> {
    let n: i64 = sqlx::query_scalar(meatspace_store::engine::COUNT_EVENTS_SQL)
        .bind(task_id)
        .bind(i64::try_from(up_to).unwrap_or(i64::MAX))
        .fetch_one(executor)
        .await?;
    Ok(u64::try_from(n).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use meatspace_domain::TaskState;

    fn task(state: TaskState) -> Task {
        let at = DateTime::from_timestamp(1_800_000_000, 0).expect("valid timestamp");
        Task {
            state,
            ..Task::draft(
                Uuid::from_u128(1),
                "water the plants".into(),
                at,
                at + chrono::TimeDelta::hours(1),
            )
        }
    }

    fn id(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    #[test]
    fn known_tasks_keep_live_tasks_that_read_back_exactly() {
        let known = KnownTasks::default();
        let mut t = task(TaskState::Active);
        known.wrote(&t);
        assert_eq!(known.get(t.id), Some(t.clone()));
        known.forget(t.id);
        assert_eq!(known.get(t.id), None);

        // A nanosecond PostgreSQL would round away: not kept.
        known.wrote(&t);
        t.updated_at += chrono::TimeDelta::nanoseconds(1);
        known.wrote(&t);
        assert_eq!(known.get(t.id), None);

        // A terminal task takes no command: not kept.
        let mut done = task(TaskState::Active);
        known.wrote(&done);
        done.state = TaskState::Completed;
        known.wrote(&done);
        assert_eq!(known.get(done.id), None);
    }

    #[test]
    fn known_tasks_stay_within_their_byte_budget() {
        let known = KnownTasks::default();
        let mut big = task(TaskState::Open);
        big.description = "x".repeat(KNOWN_DESCRIPTION_BYTES / 2 + 1);
        for n in 0..3 {
            big.id = id(n);
            known.wrote(&big);
            let bytes = known.lock().description_bytes;
            assert!(bytes <= KNOWN_DESCRIPTION_BYTES, "{bytes} bytes kept");
            assert_eq!(known.get(big.id).map(|t| t.id), Some(id(n)));
        }
        // Rewriting a copy replaces its bytes.
        known.wrote(&big);
        assert_eq!(known.lock().description_bytes, big.description.len());
    }

    #[tokio::test]
    async fn changes_arrive_in_order_and_a_gap_supersedes_what_was_pending() {
        let p = Pending::default();
        p.task(id(1));
        p.task(id(2));
        assert_eq!(p.next().await, Some(Change::Task(id(1))));
        // A gap makes the consumer re-read everything: the ids still
        // pending, and those arriving before it takes the gap, add nothing.
        p.gap();
        p.task(id(3));
        assert_eq!(p.next().await, Some(Change::Gap));
        p.task(id(4));
        assert_eq!(p.next().await, Some(Change::Task(id(4))));
        p.end();
        assert_eq!(p.next().await, None);
    }

    #[tokio::test]
    async fn a_consumer_that_falls_behind_gets_one_gap_not_unbounded_memory() {
        let p = Pending::default();
        for n in 0..=PENDING_CAPACITY as u128 {
            p.task(id(n));
        }
        assert_eq!(p.next().await, Some(Change::Gap));
        p.end();
        assert_eq!(p.next().await, None);
    }

    #[tokio::test]
    async fn a_waiting_consumer_is_woken() {
        let p = Arc::new(Pending::default());
        let waiting = tokio::spawn({
            let p = p.clone();
            async move { p.next().await }
        });
        tokio::task::yield_now().await;
        p.gap();
        let got = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("woken")
            .expect("no panic");
        assert_eq!(got, Some(Change::Gap));
    }
}
