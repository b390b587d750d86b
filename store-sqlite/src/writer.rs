//! The one writer of a SQLite file, and how it groups writes into commits.
//!
//! SQLite commits one transaction at a time, and what a commit costs (its
//! WAL frames, the lock taken and handed on, the round trips of `BEGIN` and
//! `COMMIT`) does not grow with what the transaction holds. So one task
//! owns the write connection and serves writes in turn: it takes every write
//! queued at that moment (at most [`MAX_BATCH`]), runs each on the open
//! transaction inside a savepoint of its own, and commits them together.
//! A lone write never waits for company: when nothing else is queued the
//! transaction commits at once.
//!
//! A write is a [`WriteTx`]: the caller (the engine, with its own SQL) holds
//! the connection while it runs its statements, then hands it back with
//! [`WriteTx::commit`] or [`WriteTx::rollback`] (dropping it rolls back
//! too). A rollback undoes that write alone, back to its savepoint, and is
//! answered at once. A commit is answered only after the `COMMIT` that holds
//! it, and only after the tasks it touched are announced (their change
//! counters bumped and the change broadcast) — so an answered write is as
//! durable, and as visible to the process's caches, as one committed alone.
//! If the `COMMIT` fails, every write of the batch gets the error and none
//! is written.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use meatspace_store::{Change, StoreError, TaskVersions};
use sqlx::pool::PoolConnection;
use sqlx::{Sqlite, SqliteConnection, SqlitePool};
use tokio::sync::{broadcast, mpsc, oneshot};
use uuid::Uuid;

/// The most writes one transaction holds: enough that a burst of writes
/// pays a commit per few dozen, few enough that a write queued behind a
/// batch waits for only so many others.
pub(crate) const MAX_BATCH: usize = 64;

/// Writes that may wait for the writer before more wait to be queued; a
/// bound on what a burst holds in memory (each waiter is also bounded in
/// time, by the acquire timeout).
const QUEUE: usize = 1024;

/// A write's place in the queue.
struct Ticket {
    /// Where the writer sends the transaction when the write's turn comes.
    turn: oneshot::Sender<Result<WriteTx, StoreError>>,
    /// The write is one statement (see [`Writer::begin_statement`]).
    one_statement: bool,
}

/// How a write answers: through its own channel, once its batch is settled.
type Reply = oneshot::Sender<Result<(), StoreError>>;

/// Where a committed write's tasks are announced, after their commit: the
/// same counters and channel the store reads.
#[derive(Debug, Clone)]
pub(crate) struct Announcer {
    pub(crate) changes: broadcast::Sender<Change>,
    pub(crate) versions: Arc<TaskVersions>,
}

impl Announcer {
    fn announce(&self, change: Change) {
        if let Change::Task(id) = change {
            self.versions.bump(id);
        }
        // No receiver is fine: nobody is waiting.
        let _ = self.changes.send(change);
    }
}

/// How many writes have committed, in how many commits: their ratio is
/// the grouping the writer achieved (see [`crate::SqliteStore::write_counts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WriteCounts {
    /// Writes answered as committed.
    pub writes: u64,
    /// Successful `COMMIT`s that held them.
    pub commits: u64,
}

#[derive(Debug, Default)]
struct Counters {
    writes: AtomicU64,
    commits: AtomicU64,
}

/// The handle writes queue on; cloned with the store.
#[derive(Debug, Clone)]
pub(crate) struct Writer {
    queue: mpsc::Sender<Ticket>,
    counters: Arc<Counters>,
    /// How long a write waits for its turn before the store reports the
    /// database unavailable (as a pool's acquire timeout does).
    wait: Duration,
}

impl Writer {
    /// Starts the writer task on the current runtime. It acquires `pool`'s
    /// connection for each batch and returns it after the commit, so that
    /// tools with raw SQL on the pool still get their turn.
    pub(crate) fn spawn(pool: SqlitePool, announcer: Announcer, wait: Duration) -> Self {
        let (queue, jobs) = mpsc::channel(QUEUE);
        let counters = Arc::<Counters>::default();
        tokio::spawn(serve(pool, jobs, announcer, counters.clone()));
        Writer {
            queue,
            counters,
            wait,
        }
    }

    pub(crate) fn counts(&self) -> WriteCounts {
        WriteCounts {
            writes: self.counters.writes.load(Ordering::Relaxed),
            commits: self.counters.commits.load(Ordering::Relaxed),
        }
    }

    /// Waits for this write's turn: the transaction is open (its savepoint
    /// set) and its connection is the caller's until it ends it.
    pub(crate) async fn begin(&self) -> Result<WriteTx, StoreError> {
        self.enqueue(false).await
    }

    /// As [`Writer::begin`], for a write of exactly one statement that ends
    /// with [`WriteTx::commit`] (or is dropped after that statement failed),
    /// never with a rollback. It needs no savepoint, and saves its round
    /// trip: a failed statement undoes itself, leaving the writes before it
    /// in the transaction as they were.
    pub(crate) async fn begin_statement(&self) -> Result<WriteTx, StoreError> {
        self.enqueue(true).await
    }

    async fn enqueue(&self, one_statement: bool) -> Result<WriteTx, StoreError> {
        let (turn_tx, turn) = oneshot::channel();
        let ticket = Ticket {
            turn: turn_tx,
            one_statement,
        };
        let wait = async {
            self.queue.send(ticket).await.map_err(|_| gone())?;
            turn.await.map_err(|_| gone())?
        };
        match tokio::time::timeout(self.wait, wait).await {
            Ok(tx) => tx,
            // A transaction handed over just now is dropped with `turn` and
            // handed back as abandoned.
            Err(_) => Err(StoreError::Unavailable(sqlx::Error::PoolTimedOut)),
        }
    }
}

/// The writer task is gone (its runtime is shutting down).
fn gone() -> StoreError {
    StoreError::Unavailable(sqlx::Error::PoolClosed)
}

/// One write in progress: the write connection, lent to the caller inside
/// the batch's transaction. Dereferences to the connection for queries.
pub struct WriteTx {
    conn: Option<PoolConnection<Sqlite>>,
    back: Option<oneshot::Sender<Handback>>,
    touched: Vec<Change>,
}

/// What a write hands back to the writer, with the connection.
struct Handback {
    conn: PoolConnection<Sqlite>,
    end: End,
    touched: Vec<Change>,
}

enum End {
    Commit(Reply),
    Rollback(Reply),
    /// Dropped without an end: a `?` on an error, or a caller that went away.
    Abandoned,
}

impl WriteTx {
    /// Notes that this write changes `task_id`: the task is announced after
    /// the commit that holds the write, before the write is answered.
    pub fn touch(&mut self, task_id: Uuid) {
        self.touched.push(Change::Task(task_id));
    }

    /// Notes that this write takes the power of the credential `id` away:
    /// announced after the commit, before the write is answered, so every
    /// follower of the change stream forgets it.
    pub fn touch_credential(&mut self, id: Uuid) {
        self.touched.push(Change::Credential(id));
    }

    /// Ends the write and waits for the commit that holds it.
    pub async fn commit(mut self) -> Result<(), StoreError> {
        let (reply, answer) = oneshot::channel();
        self.hand_back(End::Commit(reply));
        answer.await.map_err(|_| gone())?
    }

    /// Undoes the write (alone) and ends it.
    pub async fn rollback(mut self) -> Result<(), StoreError> {
        let (reply, answer) = oneshot::channel();
        self.hand_back(End::Rollback(reply));
        answer.await.map_err(|_| gone())?
    }

    fn hand_back(&mut self, end: End) {
        let (Some(conn), Some(back)) = (self.conn.take(), self.back.take()) else {
            return;
        };
        let touched = std::mem::take(&mut self.touched);
        if let Err(mut lost) = back.send(Handback { conn, end, touched }) {
            // The writer is gone mid-batch: the connection must not go back
            // to the pool inside its open transaction.
            lost.conn.close_on_drop();
        }
    }
}

impl std::fmt::Debug for WriteTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteTx")
            .field("touched", &self.touched)
            .finish_non_exhaustive()
    }
}

impl Drop for WriteTx {
    fn drop(&mut self) {
        self.hand_back(End::Abandoned);
    }
}

impl Deref for WriteTx {
    type Target = SqliteConnection;

    fn deref(&self) -> &SqliteConnection {
        self.conn.as_ref().expect("held until the write ends")
    }
}

impl DerefMut for WriteTx {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        self.conn.as_mut().expect("held until the write ends")
    }
}

/// The writer task: a batch for every write that finds the queue empty.
async fn serve(
    pool: SqlitePool,
    mut jobs: mpsc::Receiver<Ticket>,
    announcer: Announcer,
    counters: Arc<Counters>,
) {
    while let Some(first) = jobs.recv().await {
        if first.turn.is_closed() {
            continue;
        }
        let conn = match pool.acquire().await {
            Ok(conn) => conn,
            Err(e) => {
                let _ = first.turn.send(Err(e.into()));
                continue;
            }
        };
        let mut batch = Batch {
            announcer: announcer.clone(),
            counters: counters.clone(),
            conn: Some(conn),
            open: false,
            written: false,
            broken: false,
            waiting: Vec::new(),
            touched: Vec::new(),
        };
        let mut next = Some(first);
        let mut taken = 0;
        while let Some(ticket) = next.take() {
            taken += 1;
            if !batch.serve(ticket).await {
                break;
            }
            if taken < MAX_BATCH {
                // What is queued now, never what might come: no timer.
                next = jobs.try_recv().ok();
            }
        }
        batch.commit().await;
    }
}

/// One transaction's worth of writes.
struct Batch {
    announcer: Announcer,
    counters: Arc<Counters>,
    /// The write connection, while no write holds it.
    conn: Option<PoolConnection<Sqlite>>,
    /// A transaction is open on the connection.
    open: bool,
    /// A write has committed into the open transaction, so the next one runs
    /// inside a savepoint (the first runs without: undoing it is a rollback).
    written: bool,
    /// A rollback failed, so the connection's state is unknown: the batch
    /// ends and the connection is closed, not returned to the pool.
    broken: bool,
    /// The committed writes, answered after the `COMMIT`.
    waiting: Vec<Reply>,
    /// The tasks they changed, announced after the `COMMIT`.
    touched: Vec<Change>,
}

impl Batch {
    /// Serves one write; false when the batch cannot go on (the connection
    /// was leaked with a write, or a rollback failed).
    async fn serve(&mut self, ticket: Ticket) -> bool {
        let Ticket {
            turn,
            one_statement,
        } = ticket;
        if turn.is_closed() {
            // Its caller gave up waiting.
            return true;
        }
        let savepoint = self.open && self.written && !one_statement;
        let ready = if !self.open {
            self.exec("BEGIN IMMEDIATE")
                .await
                .map(|()| self.open = true)
        } else if savepoint {
            self.exec("SAVEPOINT write").await
        } else {
            Ok(())
        };
        if let Err(e) = ready {
            if self.open {
                self.abort(&e).await;
            }
            let _ = turn.send(Err(e));
            return !self.broken;
        }
        let (back, handback) = oneshot::channel();
        let tx = WriteTx {
            conn: self.conn.take(),
            back: Some(back),
            touched: Vec::new(),
        };
        // A caller that went away just now drops the transaction unsent, and
        // its drop hands the connection back as abandoned.
        drop(turn.send(Ok(tx)));
        let Ok(Handback { conn, end, touched }) = handback.await else {
            // Leaked with the connection in it: this batch cannot go on.
            self.open = false;
            let e = StoreError::Corrupt("a write kept the write connection".into());
            self.abort(&e).await;
            self.broken = true;
            return false;
        };
        self.conn = Some(conn);
        match end {
            End::Commit(reply) => {
                self.waiting.push(reply);
                self.touched.extend(touched);
                self.written = true;
            }
            End::Rollback(reply) => {
                let undone = self.undo(savepoint, false).await;
                let _ = reply.send(undone);
            }
            End::Abandoned => {
                let _ = self.undo(savepoint, one_statement).await;
            }
        }
        !self.broken
    }

    /// Undoes the write just handed back, and only it: back to its
    /// `savepoint`, or the whole transaction when it was the first write, or
    /// nothing when it was a one-statement write dropped after its statement
    /// failed (`failed_statement`: the statement undid itself).
    async fn undo(&mut self, savepoint: bool, failed_statement: bool) -> Result<(), StoreError> {
        if self.written && !savepoint {
            if failed_statement && self.exec("BEGIN").await.is_err() {
                // "Cannot start a transaction within a transaction": the
                // writes before it are still there.
                return Ok(());
            }
            // The transaction is gone (SQLite rolls a whole transaction back
            // on some errors, e.g. a full disk; the BEGIN just opened a new
            // one), or a one-statement write asked to roll back what it
            // wrote: nothing of the batch can be trusted to commit.
            let e = StoreError::Database(sqlx::Error::Protocol(
                "the batch's transaction was lost with a failed write".into(),
            ));
            self.abort(&e).await;
            return Err(e);
        }
        if self.written {
            let undone = self.exec("ROLLBACK TO write").await;
            if let Err(e) = &undone {
                // The transaction is in doubt (SQLite rolls back a whole
                // transaction on some errors): its earlier writes fail too.
                self.abort(e).await;
            }
            undone
        } else {
            self.open = false;
            let undone = self.exec("ROLLBACK").await;
            self.broken |= undone.is_err();
            undone
        }
    }

    /// Rolls the whole transaction back and answers every committed write
    /// with `e`: nothing of this batch so far is written.
    async fn abort(&mut self, e: &StoreError) {
        if self.open && self.exec("ROLLBACK").await.is_err() {
            self.broken = true;
        }
        self.open = false;
        self.written = false;
        self.touched.clear();
        if !self.waiting.is_empty() {
            tracing::warn!(writes = self.waiting.len(), error = %e, "a batch of writes was rolled back");
        }
        for reply in self.waiting.drain(..) {
            let _ = reply.send(Err(same_error(e)));
        }
    }

    /// Commits what the batch holds, announces its tasks, answers its writes.
    async fn commit(mut self) {
        if !self.open {
            return;
        }
        let committed = self.exec("COMMIT").await;
        match committed {
            Ok(()) => {
                self.open = false;
                self.counters.commits.fetch_add(1, Ordering::Relaxed);
                let writes = u64::try_from(self.waiting.len()).unwrap_or(u64::MAX);
                self.counters.writes.fetch_add(writes, Ordering::Relaxed);
                tracing::trace!(writes, "committed a batch of writes");
                for change in self.touched.drain(..) {
                    self.announcer.announce(change);
                }
                for reply in self.waiting.drain(..) {
                    let _ = reply.send(Ok(()));
                }
            }
            // A failed COMMIT may leave the transaction open (SQLITE_BUSY);
            // it is rolled back, so that no answer lies.
            Err(e) => self.abort(&e).await,
        }
    }

    async fn exec(&mut self, sql: &'static str) -> Result<(), StoreError> {
        let conn = self.conn.as_mut().expect("held between writes");
        sqlx::query(sql).execute(&mut **conn).await?;
        Ok(())
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        // Open here only when the writer task is cancelled (the runtime
        // shuts down): never return the connection to the pool inside a
        // transaction, or in a state a failed rollback left.
        if (self.open || self.broken)
            && let Some(conn) = self.conn.as_mut()
        {
            conn.close_on_drop();
        }
    }
}

/// `e` again, for each write of a failed batch (a database error is not
/// `Clone`); an unavailable database stays unavailable.
fn same_error(e: &StoreError) -> StoreError {
    let again = sqlx::Error::Protocol(e.to_string());
    if e.is_unavailable() {
        StoreError::Unavailable(again)
    } else {
        StoreError::Database(again)
    }
}
