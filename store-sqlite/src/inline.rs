//! The writer's own connection, and the engine's SQL on it.
//!
//! The engine's writes (every command on a task, creates, requested tasks,
//! idempotency claims, invite redemptions, reconciles) are the store's hot
//! path, with a few others beside them (idempotency records, webhook claims
//! and cursors, worker registration). They run as *inline jobs*: closures
//! that the writer runs one after another, on its own thread, against a
//! rusqlite connection it owns, inside the batch's transaction (see
//! [`crate::writer`]). A statement then
//! costs a function call into SQLite, not a round trip to sqlx's connection
//! thread and back (three or four per command, each a pair of wake-ups on a
//! busy machine), and a write queued behind another costs no wake-up at all.
//!
//! [`Inline`] implements the engine's [`Backend`] with statements that never
//! wait, so the engine's code runs to its end in one poll: [`run_to_end`] polls it
//! once, and a write that would wait is an error, not a stall.

use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use futures::FutureExt;
use meatspace_domain::place::cell_of;
use meatspace_domain::{Decision, EventType, Issue, IssueChange, Task};
use meatspace_store::engine::{Backend, INSERT_PHOTO_SQL, OPEN_ISSUE_SQL, RESOLVE_ISSUE_SQL};
use meatspace_store::idempotency::{IdempotencyClaim, IdempotencyRecord};
use meatspace_store::requests::TaskRequest;
use meatspace_store::token::TokenHash;
use meatspace_store::{Applied, Change, Draft, NewAudit, StoreError, StoredWork, Worker};
use rusqlite::{Connection, Params, Row};
use uuid::Uuid;

use crate::identity::WORKER_COLUMNS;
use crate::{RowReader, TASK_COLUMNS, from_ms, issue_from_row, ms, opt_ms, task_from_row, uuid};

/// Runs an engine write on an [`Inline`] backend to its end: its statements
/// never wait, so one poll finishes it.
pub fn run_to_end<T>(
    write: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    write.now_or_never().unwrap_or_else(|| {
        Err(StoreError::Database(sqlx::Error::Protocol(
            "an inline write waited for something".into(),
        )))
    })
}

/// The write connection, lent to one batch of inline jobs, and what the job
/// running now has done with it. The engine's [`Backend`] on it; see the
/// module's documentation.
#[derive(derive_more::Debug)]
pub struct Inline {
    // A mutex only because the engine's backend must be `Sync`: one job at
    // a time holds it, for a statement.
    #[debug(skip)]
    conn: Mutex<Connection>,
    #[debug(skip)]
    job: Mutex<JobState>,
}

/// What the running job did, read by the writer when it returns.
#[derive(Debug, Default)]
pub(crate) struct JobState {
    /// Its savepoint is set (it began a write).
    pub(crate) began: bool,
    /// It committed its write into the batch.
    pub(crate) committed: bool,
    /// What its write changes, announced after the batch's `COMMIT`.
    pub(crate) touched: Vec<Change>,
    /// Undoing its write failed: the batch's transaction is in doubt.
    pub(crate) in_doubt: bool,
}

/// A write transaction of an inline job: its savepoint in the batch's
/// transaction.
#[derive(Debug)]
pub struct InlineTx(());

impl Inline {
    pub(crate) fn new(conn: Connection) -> Self {
        Inline {
            conn: Mutex::new(conn),
            job: Mutex::default(),
        }
    }

    pub(crate) fn into_connection(self) -> Connection {
        self.conn
            .into_inner()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        self.conn
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn state(&self) -> MutexGuard<'_, JobState> {
        self.job
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// What the job that just returned did; the next starts afresh.
    pub(crate) fn take_job(&self) -> JobState {
        std::mem::take(&mut *self.state())
    }

    /// Whether the batch's transaction is still open: SQLite rolls a whole
    /// transaction back on some errors (a full disk, for one), after which
    /// a statement would run, and commit, on its own.
    pub(crate) fn in_transaction(&self) -> bool {
        !self.conn().is_autocommit()
    }

    /// Runs `sql` (no parameters) on the write connection, in the batch's
    /// transaction: for tests and tools that need raw SQL in a batch.
    pub fn execute(&self, sql: &str) -> Result<(), StoreError> {
        self.conn().execute_batch(sql).map_err(failure)
    }

    /// Runs one cached statement; the number of rows it changed.
    pub(crate) fn exec(&self, sql: &str, params: impl Params) -> Result<usize, StoreError> {
        let conn = self.conn();
        let mut statement = conn.prepare_cached(sql).map_err(failure)?;
        statement.execute(params).map_err(failure)
    }

    /// The first row of a cached query, decoded.
    fn one<T>(
        &self,
        sql: &str,
        params: impl Params,
        decode: impl FnOnce(&Row<'_>) -> Result<T, StoreError>,
    ) -> Result<Option<T>, StoreError> {
        let conn = self.conn();
        let mut statement = conn.prepare_cached(sql).map_err(failure)?;
        let mut rows = statement.query(params).map_err(failure)?;
        match rows.next().map_err(failure)? {
            Some(row) => decode(row).map(Some),
            None => Ok(None),
        }
    }

    /// Every row of a cached query, decoded.
    pub(crate) fn all<T>(
        &self,
        sql: &str,
        params: impl Params,
        decode: impl Fn(&Row<'_>) -> Result<T, StoreError>,
    ) -> Result<Vec<T>, StoreError> {
        let conn = self.conn();
        let mut statement = conn.prepare_cached(sql).map_err(failure)?;
        let mut rows = statement.query(params).map_err(failure)?;
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(failure)? {
            out.push(decode(row)?);
        }
        Ok(out)
    }

    /// Runs `statements` as this job's one write: in its savepoint, and
    /// committed into the batch unless they fail (the writer then undoes
    /// them).
    pub(crate) fn one_write<T>(
        &self,
        statements: impl FnOnce(&Inline) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let tx = run_to_end(self.begin_write())?;
        let out = statements(self)?;
        run_to_end(self.commit(tx))?;
        Ok(out)
    }

    fn touch(&self, task_id: Uuid) {
        self.state().touched.push(Change::Task(task_id));
    }

    /// Undoes the running job's write, back to its savepoint.
    pub(crate) fn undo(&self) -> Result<(), StoreError> {
        let undone = self
            .conn()
            .execute_batch("ROLLBACK TO write; RELEASE write")
            .map_err(failure);
        let mut state = self.state();
        state.began = false;
        state.committed = false;
        state.touched.clear();
        state.in_doubt |= undone.is_err();
        undone
    }

    fn insert_task(&self, draft: &Draft<'_>) -> Result<(), StoreError> {
        let Draft {
            task,
            agent_token_hash,
            owner_id,
            ..
        } = draft;
        // Noted first: announced only if the batch commits.
        self.touch(task.id);
        let place = task.location.as_ref();
        let work = StoredWork::of(task);
        self.exec(
            "INSERT INTO tasks (id, description, state, agent_token_hash, created_at, updated_at, \
             expires_at, next_deadline, owner_id, latitude, longitude, radius_m, address, \
             presence, cell, result_schema, review, requirements) \
             VALUES (?, ?, 'draft', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rusqlite::params![
                task.id.to_string(),
                &task.description,
                &agent_token_hash.0[..],
                ms(task.created_at),
                ms(task.created_at),
                ms(task.expires_at),
                opt_ms(task.next_deadline()),
                owner_id.to_string(),
                place.map(|p| p.latitude),
                place.map(|p| p.longitude),
                place.map(|p| p.radius_m),
                place.and_then(|p| p.address.as_deref()),
                task.presence.as_str(),
                place.map(|p| cell_of(p.latitude, p.longitude)),
                work.result_schema,
                work.review,
                work.requirements,
            ],
        )?;
        Ok(())
    }

    /// Writes `d`, decided on `before`: the task, its events, issue changes
    /// and photo.
    fn write_decision_rows(&self, before: &Task, d: Decision) -> Result<Applied, StoreError> {
        let Decision {
            mut task,
            events: new_events,
            issue_changes,
            photo,
            reconciled,
        } = d;
        let now = task.updated_at;
        let id = task.id.to_string();
        self.touch(task.id);
        if let Some(p) = &photo {
            self.exec(
                INSERT_PHOTO_SQL,
                (
                    p.id.to_string(),
                    &id,
                    &p.content_type,
                    &p.bytes[..],
                    ms(now),
                ),
            )?;
        }
        let mut events = Vec::with_capacity(new_events.len());
        for e in new_events {
            let event_id: i64 = self
                .one(
                    "INSERT INTO events (task_id, type, actor, created_at, data) \
                     VALUES (?, ?, ?, ?, ?) RETURNING id",
                    (
                        &id,
                        e.kind.as_str(),
                        e.actor.as_str(),
                        ms(now),
                        e.data.to_string(),
                    ),
                    |row| row.get(0).map_err(failure),
                )?
                .ok_or_else(|| StoreError::Corrupt("an event insert returned no id".into()))?;
            events.push(e.stored(event_id, task.id, now));
        }
        if let Some(last) = events.last() {
            task.last_event_id = last.id;
        }
        for change in issue_changes {
            match change {
                IssueChange::Open { kind } => {
                    let event_id = events
                        .iter()
                        .find(|e| e.kind == EventType::WorkerIssue)
                        .map(|e| e.id)
                        .ok_or_else(|| StoreError::Corrupt("issue without its event".into()))?;
                    self.exec(OPEN_ISSUE_SQL, (event_id, &id, kind.as_str()))?;
                }
                IssueChange::Resolve {
                    event_id,
                    resolution,
                } => {
                    self.exec(RESOLVE_ISSUE_SQL, (resolution, ms(now), event_id))?;
                }
                IssueChange::CloseAll { resolution } => {
                    self.exec(
                        "UPDATE issues SET status = 'closed', resolution = ?, resolved_at = ? \
                         WHERE task_id = ? AND status = 'open'",
                        (resolution, ms(now), &id),
                    )?;
                }
            }
        }
        let work = StoredWork::of(&task);
        let updated = self.exec(
            "UPDATE tasks SET state = ?, worker_id = ?, updated_at = ?, published_at = ?, \
             assigned_at = ?, started_at = ?, ended_at = ?, start_by = ?, active_until = ?, \
             next_deadline = ?, open_issues = ?, last_event_id = ?, expires_at = ?, review = ?, \
             result = ? WHERE id = ? AND state = ?",
            rusqlite::params![
                task.state.as_str(),
                task.worker_id.map(|w| w.to_string()),
                ms(task.updated_at),
                opt_ms(task.published_at),
                opt_ms(task.assigned_at),
                opt_ms(task.started_at),
                opt_ms(task.ended_at),
                opt_ms(task.start_by),
                opt_ms(task.active_until),
                opt_ms(task.next_deadline()),
                task.open_issues,
                task.last_event_id,
                ms(task.expires_at),
                work.review,
                work.result,
                &id,
                before.state.as_str(),
            ],
        )?;
        if updated != 1 {
            return Err(StoreError::Corrupt(format!(
                "task {} changed under its lock",
                task.id
            )));
        }
        Ok(Applied {
            task,
            events,
            reconciled,
        })
    }
}

/// The engine's SQL on the writer's connection. Every command runs under
/// the write lock the batch holds (`BEGIN IMMEDIATE`), in a savepoint of
/// its own; a commit commits into the batch, which the writer commits.
#[async_trait]
impl Backend for Inline {
    type Tx = InlineTx;

    async fn begin_write(&self) -> Result<Self::Tx, StoreError> {
        if self.state().began {
            return Err(StoreError::Database(sqlx::Error::Protocol(
                "an inline job began a second write".into(),
            )));
        }
        if !self.in_transaction() {
            return Err(lost_batch());
        }
        self.exec("SAVEPOINT write", [])?;
        self.state().began = true;
        Ok(InlineTx(()))
    }

    async fn lock_task(
        &self,
        _tx: &mut Self::Tx,
        task_id: Uuid,
    ) -> Result<Option<Task>, StoreError> {
        self.one(
            &format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = ?"),
            [task_id.to_string()],
            |row| task_from_row(row),
        )
    }

    async fn read_issue(
        &self,
        _tx: &mut Self::Tx,
        task_id: Uuid,
        event_id: i64,
    ) -> Result<Option<Issue>, StoreError> {
        self.one(
            "SELECT * FROM issues WHERE event_id = ? AND task_id = ?",
            (event_id, task_id.to_string()),
            |row| issue_from_row(row),
        )
    }

    async fn count_events(
        &self,
        _tx: &mut Self::Tx,
        task_id: Uuid,
        up_to: u64,
    ) -> Result<u64, StoreError> {
        self.count_events_unlocked(task_id, up_to).await
    }

    /// On the writer's connection, like every read here: under the write
    /// lock, so no other writer's events can come in between.
    async fn count_events_unlocked(&self, task_id: Uuid, up_to: u64) -> Result<u64, StoreError> {
        let n = self.one(
            meatspace_store::engine::COUNT_EVENTS_SQL,
            (
                task_id.to_string(),
                i64::try_from(up_to).unwrap_or(i64::MAX),
            ),
            |row| row.get::<_, i64>(0).map_err(failure),
        )?;
        Ok(n.and_then(|n| u64::try_from(n).ok()).unwrap_or(0))
    }

    async fn write_decision(
        &self,
        _tx: &mut Self::Tx,
        before: &Task,
        decision: Decision,
    ) -> Result<Applied, StoreError> {
        self.write_decision_rows(before, decision)
    }

    async fn commit(&self, _tx: Self::Tx) -> Result<(), StoreError> {
        self.exec("RELEASE write", [])?;
        self.state().committed = true;
        Ok(())
    }

    async fn rollback(&self, _tx: Self::Tx) -> Result<(), StoreError> {
        self.undo()
    }

    /// Nothing left to do: the writer announces the task after the batch's
    /// commit, before it answers (see [`crate::writer`]).
    fn after_commit(&self, _task_id: Uuid, _applied: Option<&Applied>) {}

    async fn lock_due(
        &self,
        _tx: &mut Self::Tx,
        now: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<Task>, StoreError> {
        // The write lock (`BEGIN IMMEDIATE`) covers every row.
        self.all(
            &format!(
                "SELECT {TASK_COLUMNS} FROM tasks WHERE next_deadline IS NOT NULL \
                 AND next_deadline <= ? ORDER BY next_deadline LIMIT ?"
            ),
            (ms(now), i64::from(limit)),
            |row| task_from_row(row),
        )
    }

    async fn insert_draft(&self, _tx: &mut Self::Tx, draft: &Draft<'_>) -> Result<(), StoreError> {
        self.insert_task(draft)?;
        let task = &draft.task;
        if let Some(url) = draft.webhook_url {
            self.exec(
                "INSERT INTO webhooks (task_id, url, state, next_attempt_at, updated_at) \
                 VALUES (?, ?, 'active', ?, ?)",
                (
                    task.id.to_string(),
                    url,
                    ms(task.created_at),
                    ms(task.created_at),
                ),
            )?;
        }
        Ok(())
    }

    /// As on PostgreSQL; the batch's `BEGIN IMMEDIATE` serializes writers.
    async fn claim_request(
        &self,
        _tx: &mut Self::Tx,
        request: &TaskRequest,
    ) -> Result<TaskRequest, StoreError> {
        self.exec(
            "INSERT INTO task_requests (resource_uid, task_id, namespace, name, created_at) \
             VALUES (?, ?, ?, ?, ?) ON CONFLICT (resource_uid) DO NOTHING",
            (
                &request.resource_uid,
                request.task_id.to_string(),
                &request.namespace,
                &request.name,
                ms(request.created_at),
            ),
        )?;
        self.one(
            "SELECT resource_uid, task_id, namespace, name, created_at FROM task_requests \
             WHERE resource_uid = ?",
            [&request.resource_uid],
            |row| crate::requests::from_row(row),
        )?
        .ok_or_else(|| StoreError::Corrupt("a claimed request is not stored".into()))
    }

    /// The key's record; the batch's write lock already serialises claims.
    async fn lock_idempotency_key(
        &self,
        _tx: &mut Self::Tx,
        claim: &IdempotencyClaim,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        self.one(
            "SELECT fingerprint, state, status, response, locked_until, expires_at \
             FROM idempotency_keys WHERE scope = ? AND key = ?",
            (&claim.scope[..], &claim.key),
            |row| {
                Ok(IdempotencyRecord {
                    fingerprint: row.get("fingerprint").map_err(failure)?,
                    state: row.get("state").map_err(failure)?,
                    status: row.get("status").map_err(failure)?,
                    response: row.get("response").map_err(failure)?,
                    locked_until: from_ms(row.get("locked_until").map_err(failure)?)?,
                    expires_at: from_ms(row.get("expires_at").map_err(failure)?)?,
                })
            },
        )
    }

    /// Writes the key as in flight for `claim`, over whatever record it had.
    async fn take_idempotency_key(
        &self,
        _tx: &mut Self::Tx,
        claim: &IdempotencyClaim,
    ) -> Result<(), StoreError> {
        self.exec(
            "INSERT OR REPLACE INTO idempotency_keys \
             (scope, key, fingerprint, state, status, response, created_at, locked_until, expires_at) \
             VALUES (?, ?, ?, 'in_flight', NULL, NULL, ?, ?, ?)",
            (
                &claim.scope[..],
                &claim.key,
                &claim.fingerprint[..],
                ms(claim.now),
                ms(claim.now + claim.lease),
                ms(claim.now + claim.ttl),
            ),
        )?;
        Ok(())
    }

    async fn insert_worker(
        &self,
        _tx: &mut Self::Tx,
        worker: &Worker,
        token_hash: &TokenHash,
    ) -> Result<(), StoreError> {
        self.exec(
            "INSERT INTO workers (id, name, token_hash, created_at) VALUES (?, ?, ?, ?)",
            (
                worker.id.to_string(),
                &worker.name,
                &token_hash.0[..],
                ms(worker.created_at),
            ),
        )?;
        Ok(())
    }

    async fn use_invite(
        &self,
        _tx: &mut Self::Tx,
        invite_id: Uuid,
        worker_id: Uuid,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        // One writer at a time (BEGIN IMMEDIATE): a second redemption sees
        // used_at set and changes nothing.
        let used = self.exec(
            "UPDATE worker_invites SET used_at = ?, worker_id = ? \
             WHERE id = ? AND used_at IS NULL AND revoked_at IS NULL AND expires_at > ?",
            (
                ms(now),
                worker_id.to_string(),
                invite_id.to_string(),
                ms(now),
            ),
        )?;
        Ok(used == 1)
    }

    async fn insert_audit(&self, _tx: &mut Self::Tx, audit: &NewAudit) -> Result<(), StoreError> {
        self.exec(
            meatspace_store::identity::INSERT_AUDIT_SQL,
            (
                ms(audit.at),
                audit.principal_id.to_string(),
                audit.action.as_str(),
                &audit.target,
                &audit.address,
                audit.detail.as_ref().map(|d| d.to_string()),
            ),
        )?;
        Ok(())
    }

    async fn suspend_worker_rows(
        &self,
        tx: &mut Self::Tx,
        worker_id: Uuid,
        audit: &NewAudit,
    ) -> Result<Option<(Worker, Vec<Uuid>)>, StoreError> {
        let id = worker_id.to_string();
        let suspended = self.exec(
            "UPDATE workers SET suspended_at = ? WHERE id = ? AND suspended_at IS NULL",
            (ms(audit.at), &id),
        )?;
        if suspended == 1 {
            self.insert_audit(tx, audit).await?;
        }
        self.exec("DELETE FROM worker_sessions WHERE worker_id = ?", [&id])?;
        let Some(worker) = self.one(
            &format!("SELECT {WORKER_COLUMNS} FROM workers WHERE id = ?"),
            [&id],
            |row| {
                Ok(Worker {
                    id: uuid(row.text("id")?)?,
                    name: row.text("name")?.to_owned(),
                    created_at: row.time("created_at")?,
                    suspended_at: row.opt_time("suspended_at")?,
                })
            },
        )?
        else {
            return Ok(None);
        };
        self.state().touched.push(Change::Credential(worker_id));
        let held = self.all(
            "SELECT id FROM tasks WHERE worker_id = ? AND state IN ('assigned', 'active')",
            [&id],
            |row| uuid(row.text("id")?),
        )?;
        Ok(Some((worker, held)))
    }

    /// Nothing left to do: the writer announces the task after the batch's
    /// commit, before it answers (see [`crate::writer`]).
    fn after_create(&self, _task_id: Uuid, _committed: bool) {}
}

impl RowReader for Row<'_> {
    fn str(&self, column: &str) -> Result<Option<&str>, StoreError> {
        self.get_ref(column)
            .and_then(|v| v.as_str_or_null().map_err(Into::into))
            .map_err(failure)
    }

    fn int(&self, column: &str) -> Result<Option<i64>, StoreError> {
        self.get_ref(column)
            .and_then(|v| v.as_i64_or_null().map_err(Into::into))
            .map_err(failure)
    }

    fn real(&self, column: &str) -> Result<Option<f64>, StoreError> {
        self.get_ref(column)
            .and_then(|v| v.as_f64_or_null().map_err(Into::into))
            .map_err(failure)
    }
}

/// The batch's transaction is gone (see [`Inline::in_transaction`]).
pub(crate) fn lost_batch() -> StoreError {
    StoreError::Database(sqlx::Error::Protocol(
        "the batch's transaction was lost with a failed write".into(),
    ))
}

/// A rusqlite error as the store reports SQLite's errors through sqlx: the
/// same codes, so a busy file is unavailable here as there.
pub(crate) fn failure(e: rusqlite::Error) -> StoreError {
    match e {
        rusqlite::Error::SqliteFailure(code, message) => {
            let message = message.unwrap_or_else(|| code.to_string());
            StoreError::from(sqlx::Error::Database(Box::new(SqliteFailure {
                code: code.extended_code,
                message,
            })))
        }
        other => StoreError::Database(sqlx::Error::Protocol(other.to_string())),
    }
}

/// SQLite's error on the writer's connection, in sqlx's terms.
#[derive(Debug)]
struct SqliteFailure {
    /// The extended result code, as sqlx reports it.
    code: i32,
    message: String,
}

impl std::fmt::Display for SqliteFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for SqliteFailure {}

impl sqlx::error::DatabaseError for SqliteFailure {
    fn message(&self) -> &str {
        &self.message
    }

    fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
        Some(self.code.to_string().into())
    }

    fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
        self
    }

    fn kind(&self) -> sqlx::error::ErrorKind {
        use rusqlite::ffi;
        match self.code {
            ffi::SQLITE_CONSTRAINT_UNIQUE | ffi::SQLITE_CONSTRAINT_PRIMARYKEY => {
                sqlx::error::ErrorKind::UniqueViolation
            }
            ffi::SQLITE_CONSTRAINT_FOREIGNKEY => sqlx::error::ErrorKind::ForeignKeyViolation,
            ffi::SQLITE_CONSTRAINT_NOTNULL => sqlx::error::ErrorKind::NotNullViolation,
            ffi::SQLITE_CONSTRAINT_CHECK => sqlx::error::ErrorKind::CheckViolation,
            _ => sqlx::error::ErrorKind::Other,
        }
    }
}
