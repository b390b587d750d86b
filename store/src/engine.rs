//! The one engine that runs a command on a task, for every backend: read the
//! task and what the command [needs](Command::needs), [`decide`], write the
//! decision, announce it. A backend implements [`Backend`] with its SQL (how
//! to lock and read a task, read an issue, write a decision, commit) and
//! gets [`apply`]; the rules are decided here and in the domain only, so no
//! backend can load a different context or skip a check.
//!
//! A backend with a cheaper write may override the defaults, in the manner
//! of atuin's `Database` trait (shared logic as default methods over
//! per-backend queries): PostgreSQL decides a command that needs nothing on
//! the task as it last wrote it or read it without a lock
//! ([`Backend::unlocked_copy`], [`Backend::read_unlocked`]) and writes the
//! decision in one conditional statement ([`Backend::write_if_unchanged`]),
//! which commits only if the task is still as it was decided on. The
//! decision is still the engine's, on the same [`Context`] (empty, because
//! the command needs nothing), so both paths decide alike.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use meatspace_domain::identity::ActedBy;
use meatspace_domain::{Command, Context, Decision, Issue, Policy, Task, decide};
use uuid::Uuid;

use crate::idempotency::{self, IdempotencyBegin, IdempotencyClaim, IdempotencyRecord};
use crate::requests::TaskRequest;
use crate::token::TokenHash;
use crate::{Applied, Draft, NewAudit, NewTask, StoreError, Worker};

/// What a [`Backend::write_if_unchanged`] did.
// Returned by value once per write and matched at once: boxing the large
// variant would cost an allocation on every optimistic write.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Conditional {
    /// The decision is written and committed.
    Written(Applied),
    /// Nothing was written: the task is no longer as it was decided on.
    Changed,
    /// This decision needs the locked path's statements (or the backend has
    /// no conditional write).
    NeedsLock,
}

/// The count behind [`Backend::count_events`], in SQL both databases
/// accept: `$1` the task's id, `$2` where counting stops (a full feed costs
/// no more to count than the limit).
pub const COUNT_EVENTS_SQL: &str =
    "SELECT count(*) FROM (SELECT 1 FROM events WHERE task_id = $1 LIMIT $2) AS e";

/// The columns a task is read from, in every `SELECT` of tasks of both
/// backends (each backend's `task_from_row` decodes them).
pub const TASK_COLUMNS: &str = "id, description, state, worker_id, created_at, updated_at, \
    published_at, assigned_at, started_at, ended_at, expires_at, start_by, active_until, \
    open_issues, last_event_id, latitude, longitude, radius_m, address, presence, \
    result_schema, review, result, requirements";

/// A decision's photo: `$1` id, `$2` task, `$3` content type, `$4` bytes,
/// `$5` time. Parameters appear in order, so SQLite, which numbers `$n`
/// parameters by first appearance, binds them as PostgreSQL does.
pub const INSERT_PHOTO_SQL: &str =
    "INSERT INTO photos (id, task_id, content_type, data, created_at) VALUES ($1, $2, $3, $4, $5)";

/// An issue a worker raised: `$1` its event, `$2` task, `$3` kind.
pub const OPEN_ISSUE_SQL: &str =
    "INSERT INTO issues (event_id, task_id, kind, status) VALUES ($1, $2, $3, 'open')";

/// An issue the agent answered: `$1` resolution, `$2` time, `$3` its event.
pub const RESOLVE_ISSUE_SQL: &str = "UPDATE issues SET status = 'resolved', resolution = $1, \
     resolved_at = $2 WHERE event_id = $3 AND status = 'open'";

/// The SQL a backend provides to the engine, and the hooks it may override.
#[async_trait]
pub trait Backend: Send + Sync {
    /// A write transaction.
    type Tx: Send;

    /// Begins a write transaction.
    async fn begin_write(&self) -> Result<Self::Tx, StoreError>;

    /// Reads the task and takes its row lock (or the database's write lock)
    /// until `tx` ends; `None` when it does not exist.
    async fn lock_task(&self, tx: &mut Self::Tx, task_id: Uuid)
    -> Result<Option<Task>, StoreError>;

    /// The issue opened by the `worker.issue` event `event_id` of the task.
    async fn read_issue(
        &self,
        tx: &mut Self::Tx,
        task_id: Uuid,
        event_id: i64,
    ) -> Result<Option<Issue>, StoreError>;

    /// How many events the task's feed holds, counted up to `up_to`, in
    /// `tx` (which holds the task's lock); both backends run
    /// [`COUNT_EVENTS_SQL`].
    async fn count_events(
        &self,
        tx: &mut Self::Tx,
        task_id: Uuid,
        up_to: u64,
    ) -> Result<u64, StoreError>;

    /// The same count without a transaction, for an optimistic decision
    /// (see [`apply`]).
    async fn count_events_unlocked(&self, task_id: Uuid, up_to: u64) -> Result<u64, StoreError>;

    /// Writes `decision`, decided on `before`, in `tx` (which holds the
    /// task's lock): the task, its events, issue changes and photo.
    async fn write_decision(
        &self,
        tx: &mut Self::Tx,
        before: &Task,
        decision: Decision,
    ) -> Result<Applied, StoreError>;

    async fn commit(&self, tx: Self::Tx) -> Result<(), StoreError>;

    /// Ends `tx` without writing. Called on a refusal before it is
    /// answered, so the lock is released at once (a dropped transaction is
    /// rolled back only later, in the background, and until then other
    /// writers wait).
    async fn rollback(&self, tx: Self::Tx) -> Result<(), StoreError>;

    /// After a commit of a write of `task_id` was attempted: `applied` is
    /// what was written, `None` when the commit failed (it may have
    /// committed all the same). Bumps change counters, announces the change.
    fn after_commit(&self, task_id: Uuid, applied: Option<&Applied>);

    /// Reads at most `limit` tasks whose deadline has come at `now`, earliest
    /// first, locking them until `tx` ends; tasks another writer has locked
    /// may be skipped (so that replicas share the due work).
    async fn lock_due(
        &self,
        tx: &mut Self::Tx,
        now: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<Task>, StoreError>;

    /// Writes the decisions of a batch of locked tasks in `tx`, in order.
    /// The default writes them one by one; a backend may write a batch in
    /// a fixed number of statements.
    async fn write_batch(
        &self,
        tx: &mut Self::Tx,
        decided: Vec<(Task, Decision)>,
        _now: DateTime<Utc>,
    ) -> Result<Vec<Applied>, StoreError> {
        let mut out = Vec::with_capacity(decided.len());
        for (before, decision) in decided {
            out.push(self.write_decision(tx, &before, decision).await?);
        }
        Ok(out)
    }

    /// Inserts a new draft task, with its agent token's digest, its owner
    /// and its webhook endpoint if it has one, in `tx`.
    async fn insert_draft(&self, tx: &mut Self::Tx, draft: &Draft<'_>) -> Result<(), StoreError>;

    /// Records `request` in `tx` unless a request for its resource UID is
    /// already recorded, and returns the recorded one (whose task id tells
    /// whether this claim won).
    async fn claim_request(
        &self,
        tx: &mut Self::Tx,
        request: &TaskRequest,
    ) -> Result<TaskRequest, StoreError>;

    /// Inserts a fresh in-flight record for `claim` in `tx` unless its key
    /// has one; true when it did (the claim has started). The default
    /// inserts nothing, so the engine reads the record first: right for a
    /// backend whose write transaction already serialises claims.
    async fn insert_idempotency_key(
        &self,
        _tx: &mut Self::Tx,
        _claim: &IdempotencyClaim,
    ) -> Result<bool, StoreError> {
        Ok(false)
    }

    /// Reads the record of `claim`'s key, locking it until `tx` ends.
    async fn lock_idempotency_key(
        &self,
        tx: &mut Self::Tx,
        claim: &IdempotencyClaim,
    ) -> Result<Option<IdempotencyRecord>, StoreError>;

    /// Writes `claim`'s key as in flight for it, replacing a stale record.
    async fn take_idempotency_key(
        &self,
        tx: &mut Self::Tx,
        claim: &IdempotencyClaim,
    ) -> Result<(), StoreError>;

    /// Inserts a worker in `tx`.
    async fn insert_worker(
        &self,
        tx: &mut Self::Tx,
        worker: &Worker,
        token_hash: &TokenHash,
    ) -> Result<(), StoreError>;

    /// Marks the invite used by `worker_id` in `tx` if it is unused and not
    /// expired at `now`; true when it did. Concurrent redemptions queue on
    /// the invite (row lock or write lock): the second sees it used.
    async fn use_invite(
        &self,
        tx: &mut Self::Tx,
        invite_id: Uuid,
        worker_id: Uuid,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError>;

    /// Appends `audit` to the audit trail in `tx`: the row commits with the
    /// action it records, or neither does.
    async fn insert_audit(&self, tx: &mut Self::Tx, audit: &NewAudit) -> Result<(), StoreError>;

    /// Suspends the worker in `tx` with its audit row (only when it was not
    /// suspended already), ends its sessions and announces its credential
    /// after the commit; answers the worker and the ids of the tasks it
    /// holds (assigned or active), or `None` when no such worker exists.
    async fn suspend_worker_rows(
        &self,
        tx: &mut Self::Tx,
        worker_id: Uuid,
        audit: &NewAudit,
    ) -> Result<Option<(Worker, Vec<Uuid>)>, StoreError>;

    /// After the commit of a new task was attempted (`committed` says
    /// whether it answered success; it may have committed all the same).
    fn after_create(&self, task_id: Uuid, committed: bool);

    /// After the commit of a batch was attempted (`committed` says whether it
    /// answered success): as [`Backend::after_commit`], for each task.
    fn after_batch_commit(&self, applied: &[Applied], committed: bool) {
        for a in applied {
            self.after_commit(a.task.id, committed.then_some(a));
        }
    }

    /// Whether the engine should try [`Backend::write_if_unchanged`] for
    /// this command (which needs no issue). A hint for speed:
    /// false for commands whose decision never fits the conditional write.
    fn writes_optimistically(&self, _command: &Command) -> bool {
        false
    }

    /// The task as this process last wrote it, if it keeps such copies: the
    /// first optimistic try decides on it without reading the database.
    fn unlocked_copy(&self, _task_id: Uuid) -> Option<Task> {
        None
    }

    /// The task as committed, read without a lock.
    async fn read_unlocked(&self, _task_id: Uuid) -> Result<Option<Task>, StoreError> {
        Ok(None)
    }

    /// Writes `decision`, decided on `before` without a lock, only if the
    /// task is still exactly `before`; one statement, committed.
    async fn write_if_unchanged(
        &self,
        _before: &Task,
        _decision: Decision,
    ) -> Result<Conditional, StoreError> {
        Ok(Conditional::NeedsLock)
    }
}

/// How often [`apply`] reads, decides and tries the conditional write before
/// it takes the row lock first instead. A write finds the task changed only
/// when another writer of the same task committed in between, so a second or
/// third try normally succeeds; the bound keeps a task that many writers
/// hammer from starving one of them.
const OPTIMISTIC_ATTEMPTS: usize = 3;

/// Runs `command` on the task (see `EngineWrites::apply`).
///
/// - **Optimistic** (a command that [needs](Command::needs) no issue, on a
///   backend that [writes optimistically](Backend::writes_optimistically);
///   a feed's count it needs is read first, without a lock):
///   first on the backend's copy of the task, without reading it (a refusal
///   or a stale copy is no answer: the task is read next), then up to
///   [`OPTIMISTIC_ATTEMPTS`] times on the task read without a lock; each
///   decision is written only if the task is unchanged.
/// - **Locked** (everything else, and after the optimistic tries lost their
///   races): begin, lock and read the task and what the command needs,
///   decide, write, commit.
pub async fn apply<B: Backend + ?Sized>(
    backend: &B,
    task_id: Uuid,
    command: Command,
    by: Option<ActedBy>,
    now: DateTime<Utc>,
    policy: &Policy,
) -> Result<Applied, StoreError> {
    let decide = |task: &Task, ctx: &Context, command: Command| {
        decide(task, ctx, command, now, policy).map(|d| attributed(d, by))
    };
    let needs = command.needs();
    if needs.issue.is_none() && backend.writes_optimistically(&command) {
        // The feed's count, read without a lock: writers racing past the
        // limit at once can each add one event beyond it, no more (each
        // counted before the others' commits).
        let no_context = if needs.events {
            Context {
                events: backend
                    .count_events_unlocked(task_id, policy.max_task_events)
                    .await?,
                ..Context::default()
            }
        } else {
            Context::default()
        };
        if let Some(copy) = backend.unlocked_copy(task_id)
            && let Ok(decision) = decide(&copy, &no_context, command.clone())
        {
            match backend.write_if_unchanged(&copy, decision).await? {
                Conditional::Written(applied) => return Ok(applied),
                Conditional::Changed => {}
                Conditional::NeedsLock => {
                    return apply_locked(backend, task_id, command, by, None, now, policy).await;
                }
            }
        }
        for _ in 0..OPTIMISTIC_ATTEMPTS {
            let task = backend
                .read_unlocked(task_id)
                .await?
                .ok_or(StoreError::NotFound)?;
            let decision = decide(&task, &no_context, command.clone())?;
            match backend.write_if_unchanged(&task, decision).await? {
                Conditional::Written(applied) => return Ok(applied),
                Conditional::Changed => {}
                Conditional::NeedsLock => break,
            }
        }
    }
    apply_locked(backend, task_id, command, by, None, now, policy).await
}

/// Applies `command` as [`apply`] does, and appends `audit` to the audit
/// trail in the same transaction (an operator's action on a task it does
/// not own): both commit, or neither. Always the locked path.
pub async fn apply_audited<B: Backend + ?Sized>(
    backend: &B,
    task_id: Uuid,
    command: Command,
    by: ActedBy,
    audit: &NewAudit,
    policy: &Policy,
) -> Result<Applied, StoreError> {
    apply_locked(
        backend,
        task_id,
        command,
        Some(by),
        Some(audit),
        audit.at,
        policy,
    )
    .await
}

/// `decision` with `by` recorded in each of its agent events' data, so the
/// feed says which credential acted.
fn attributed(mut decision: Decision, by: Option<ActedBy>) -> Decision {
    if let Some(by) = by {
        for event in &mut decision.events {
            if event.actor == meatspace_domain::Actor::Agent
                && let Some(data) = event.data.as_object_mut()
            {
                data.insert("by".to_owned(), serde_json::json!(by));
            }
        }
    }
    decision
}

/// The locked path of [`apply`]: one transaction that locks the task before
/// it reads it and what the command needs, and writes `audit` with the
/// decision when there is one.
async fn apply_locked<B: Backend + ?Sized>(
    backend: &B,
    task_id: Uuid,
    command: Command,
    by: Option<ActedBy>,
    audit: Option<&NewAudit>,
    now: DateTime<Utc>,
    policy: &Policy,
) -> Result<Applied, StoreError> {
    let mut tx = backend.begin_write().await?;
    let Some(task) = backend.lock_task(&mut tx, task_id).await? else {
        backend.rollback(tx).await?;
        return Err(StoreError::NotFound);
    };
    let ctx = load_context(backend, &mut tx, task_id, &command, policy).await?;
    let decision = match decide(&task, &ctx, command, now, policy) {
        Ok(decision) => attributed(decision, by),
        Err(refusal) => {
            backend.rollback(tx).await?;
            return Err(refusal.into());
        }
    };
    let applied = backend.write_decision(&mut tx, &task, decision).await?;
    if let Some(audit) = audit {
        backend.insert_audit(&mut tx, audit).await?;
    }
    match backend.commit(tx).await {
        Ok(()) => {
            backend.after_commit(task_id, Some(&applied));
            Ok(applied)
        }
        Err(e) => {
            backend.after_commit(task_id, None);
            Err(e)
        }
    }
}

/// Creates a draft task, and its webhook endpoint when it has one, in one
/// transaction (see `Store::create_task` and
/// `EngineWrites::create_task_with_webhook`). PostgreSQL overrides the plain
/// create with a grouped insert of concurrent creates.
pub async fn create_task<B: Backend + ?Sized>(
    backend: &B,
    new: NewTask,
    webhook_url: Option<&str>,
) -> Result<Task, StoreError> {
    let draft = new.into_draft(webhook_url);
    let mut tx = backend.begin_write().await?;
    backend.insert_draft(&mut tx, &draft).await?;
    let committed = backend.commit(tx).await;
    backend.after_create(draft.task.id, committed.is_ok());
    committed?;
    Ok(draft.task)
}

/// Claims `request` and, when the claim wins, creates its task, in one
/// transaction (see `EngineWrites::create_requested_task`).
pub async fn create_requested_task<B: Backend + ?Sized>(
    backend: &B,
    new: NewTask,
    request: &TaskRequest,
) -> Result<TaskRequest, StoreError> {
    let draft = new.into_draft(None);
    let mut tx = backend.begin_write().await?;
    let row = backend.claim_request(&mut tx, request).await?;
    let created = row.task_id == draft.task.id;
    if created {
        backend.insert_draft(&mut tx, &draft).await?;
    }
    let committed = backend.commit(tx).await;
    if created {
        backend.after_create(draft.task.id, committed.is_ok());
    }
    committed?;
    Ok(row)
}

/// Claims an idempotency key (see `EngineWrites::idempotency_begin`) in one
/// transaction: a fresh key starts at once; an existing record is
/// [judged](idempotency::judge), and a stale one is taken over.
pub async fn idempotency_begin<B: Backend + ?Sized>(
    backend: &B,
    claim: &IdempotencyClaim,
) -> Result<IdempotencyBegin, StoreError> {
    let mut tx = backend.begin_write().await?;
    if backend.insert_idempotency_key(&mut tx, claim).await? {
        backend.commit(tx).await?;
        return Ok(IdempotencyBegin::Started);
    }
    if let Some(r) = backend.lock_idempotency_key(&mut tx, claim).await?
        && let Some(verdict) = idempotency::judge(
            claim,
            &r.fingerprint,
            &r.state,
            r.status,
            r.response,
            r.locked_until,
            r.expires_at,
        )
    {
        backend.commit(tx).await?;
        return Ok(verdict);
    }
    // Absent (released meanwhile), expired or abandoned: take it.
    backend.take_idempotency_key(&mut tx, claim).await?;
    backend.commit(tx).await?;
    Ok(IdempotencyBegin::Started)
}

/// Registers a worker (see `EngineWrites::create_worker`).
pub async fn create_worker<B: Backend + ?Sized>(
    backend: &B,
    worker: Worker,
    token_hash: &TokenHash,
) -> Result<Worker, StoreError> {
    let mut tx = backend.begin_write().await?;
    backend.insert_worker(&mut tx, &worker, token_hash).await?;
    backend.commit(tx).await?;
    Ok(worker)
}

/// Redeems an invite for a new worker in one transaction (see
/// `EngineWrites::redeem_invite`): `None`, and no worker, when the invite is used,
/// expired or unknown.
pub async fn redeem_invite<B: Backend + ?Sized>(
    backend: &B,
    invite_id: Uuid,
    worker: Worker,
    token_hash: &TokenHash,
) -> Result<Option<Worker>, StoreError> {
    let mut tx = backend.begin_write().await?;
    backend.insert_worker(&mut tx, &worker, token_hash).await?;
    if !backend
        .use_invite(&mut tx, invite_id, worker.id, worker.created_at)
        .await?
    {
        backend.rollback(tx).await?;
        return Ok(None);
    }
    backend.commit(tx).await?;
    Ok(Some(worker))
}

/// Suspends a worker (see `EngineWrites::suspend_worker`): one transaction that
/// suspends it with its audit row and releases every task it holds
/// ([`Command::Release`], decided here like any command), so no task is
/// left held by a suspended worker whatever fails. `None` when no such
/// worker exists.
pub async fn suspend_worker<B: Backend + ?Sized>(
    backend: &B,
    worker_id: Uuid,
    audit: &NewAudit,
    policy: &Policy,
) -> Result<Option<Worker>, StoreError> {
    let now = audit.at;
    let mut tx = backend.begin_write().await?;
    let Some((worker, held)) = backend
        .suspend_worker_rows(&mut tx, worker_id, audit)
        .await?
    else {
        backend.rollback(tx).await?;
        return Ok(None);
    };
    let mut released = Vec::with_capacity(held.len());
    for task_id in held {
        let command = Command::Release { worker: worker_id };
        let Some(task) = backend.lock_task(&mut tx, task_id).await? else {
            continue;
        };
        let ctx = load_context(backend, &mut tx, task_id, &command, policy).await?;
        match decide(&task, &ctx, command, now, policy) {
            Ok(decision) => released.push(backend.write_decision(&mut tx, &task, decision).await?),
            // It moved on between the list and its lock (the worker's
            // last act committed first): nothing to release.
            Err(refusal) => {
                tracing::debug!(%task_id, %refusal, "a suspended worker's task had moved on");
            }
        }
    }
    match backend.commit(tx).await {
        Ok(()) => {
            for applied in &released {
                backend.after_commit(applied.task.id, Some(applied));
            }
            Ok(Some(worker))
        }
        Err(e) => {
            for applied in &released {
                backend.after_commit(applied.task.id, None);
            }
            Err(e)
        }
    }
}

/// Applies what is due at `now` to at most `limit` due tasks (see
/// `EngineWrites::reconcile_due`): one transaction that locks them, decides
/// [`Command::Reconcile`] on each and writes every decision as a batch.
pub async fn reconcile_due<B: Backend + ?Sized>(
    backend: &B,
    now: DateTime<Utc>,
    limit: u32,
    policy: &Policy,
) -> Result<Vec<Applied>, StoreError> {
    let mut tx = backend.begin_write().await?;
    let tasks = backend.lock_due(&mut tx, now, limit).await?;
    let mut decided = Vec::with_capacity(tasks.len());
    for task in tasks {
        // Reconciling needs nothing beyond the task (no read happens here);
        // asked all the same, so that a rule that starts to need more is
        // loaded on this path too.
        let ctx = load_context(backend, &mut tx, task.id, &Command::Reconcile, policy).await?;
        match decide(&task, &ctx, Command::Reconcile, now, policy) {
            Ok(decision) => decided.push((task, decision)),
            Err(refusal) => {
                tracing::warn!(task_id = %task.id, %refusal, "indexed deadline was not due");
            }
        }
    }
    let out = backend.write_batch(&mut tx, decided, now).await?;
    let committed = backend.commit(tx).await;
    backend.after_batch_commit(&out, committed.is_ok());
    committed?;
    Ok(out)
}

/// Reads exactly what the command [needs](Command::needs), in the caller's
/// transaction (under the task's lock).
pub async fn load_context<B: Backend + ?Sized>(
    backend: &B,
    tx: &mut B::Tx,
    task_id: Uuid,
    command: &Command,
    policy: &Policy,
) -> Result<Context, StoreError> {
    let needs = command.needs();
    let mut ctx = Context::default();
    if let Some(event_id) = needs.issue {
        ctx.issue = backend.read_issue(tx, task_id, event_id).await?;
    }
    if needs.events {
        ctx.events = backend
            .count_events(tx, task_id, policy.max_task_events)
            .await?;
    }
    Ok(ctx)
}
