//! The one writer of a SQLite file, and how it groups writes into commits.
//!
//! SQLite commits one transaction at a time, and what a commit costs (its
//! WAL frames, the lock taken and handed on, the round trips of `BEGIN` and
//! `COMMIT`) does not grow with what the transaction holds. So one thread,
//! `sqlite-writer`, serves every write of the store in turn: it takes every
//! write queued at that moment (at most [`MAX_BATCH`]), runs each on the
//! open transaction inside a savepoint of its own, and commits them
//! together. A lone write never waits for company: when nothing else is
//! queued the transaction commits at once.
//!
//! Writes come in two kinds, each with its connection:
//!
//! - **Inline jobs** ([`Writer::run`], see [`crate::inline`]): the engine's
//!   writes, the hot path. The writer thread runs each itself, on a
//!   rusqlite connection it owns; a statement is a call, not a round trip.
//! - **Lending writes** ([`Writer::begin`]): the rest (identity, webhooks'
//!   cursors, sessions, retention), written with sqlx. The writer lends the
//!   write pool's connection to the caller inside the batch's transaction,
//!   as a [`WriteTx`]; the caller runs its statements, then hands it back
//!   with [`WriteTx::commit`] or [`WriteTx::rollback`] (dropping it rolls
//!   back too).
//!
//! A batch holds one kind (the queue's order is kept: a write of the other
//! kind ends the batch and starts the next), so the two connections never
//! wait for each other's lock.
//!
//! A write that fails or is refused is undone alone, back to its
//! savepoint, and answered at once. A committed write is answered only after
//! the `COMMIT` that holds it, and only after the tasks it touched are
//! announced (their change counters bumped and the change broadcast) — so
//! an answered write is as durable, and as visible to the process's caches,
//! as one committed alone. If the `COMMIT` fails, or SQLite drops the
//! transaction under a failing write, every write of the batch gets the
//! error and none is written.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use meatspace_store::{Change, StoreError, TaskVersions};
use rusqlite::Connection;
use sqlx::pool::PoolConnection;
use sqlx::{Sqlite, SqliteConnection, SqlitePool};
use tokio::sync::{broadcast, mpsc, oneshot};
use uuid::Uuid;

use crate::checkpoint::{self, Checkpoints};
use crate::inline::{Inline, failure, lost_batch};

/// The most writes one transaction holds: enough that a burst of writes
/// pays a commit per few dozen, few enough that a write queued behind a
/// batch waits for only so many others.
pub(crate) const MAX_BATCH: usize = 64;

/// Writes that may wait for the writer before more wait to be queued; a
/// bound on what a burst holds in memory (each waiter is also bounded in
/// time, by the acquire timeout).
const QUEUE: usize = 1024;

/// A write's place in the queue: a write that borrows the sqlx connection
/// for its statements, or an inline job the writer runs itself.
enum Ticket {
    Lend(LentWrite),
    Inline(Box<dyn Job>),
}

/// A lending write's place in the queue.
struct LentWrite {
    /// Where the writer sends the transaction when the write's turn comes.
    turn: oneshot::Sender<Result<WriteTx, StoreError>>,
    /// The write is one statement (see [`Writer::begin_statement`]).
    one_statement: bool,
}

/// How a write answers: through its own channel, once its batch is settled.
type Reply = oneshot::Sender<Result<(), StoreError>>;

/// How an inline job that committed into its batch answers, once the batch
/// is settled: with the batch's outcome.
pub(crate) type AnswerAfterBatch = Box<dyn FnOnce(Result<(), StoreError>) + Send>;

/// An inline write (see [`crate::inline`]), queued.
pub(crate) trait Job: Send {
    /// Runs the write on `db`, unless its caller has gone (`None`); how to
    /// answer it once its batch is settled.
    fn run(self: Box<Self>, db: &Inline) -> Option<AnswerAfterBatch>;

    /// Answers the write with `e` without running it.
    fn fail(self: Box<Self>, e: StoreError);
}

/// A closure as an inline [`Job`], and where its result goes.
struct Closure<F, T> {
    write: F,
    reply: oneshot::Sender<Result<T, StoreError>>,
}

impl<F, T> Job for Closure<F, T>
where
    F: FnOnce(&Inline) -> Result<T, StoreError> + Send,
    T: Send + 'static,
{
    fn run(self: Box<Self>, db: &Inline) -> Option<AnswerAfterBatch> {
        let Closure { write, reply } = *self;
        if reply.is_closed() {
            return None;
        }
        let out = write(db);
        Some(Box::new(move |settled: Result<(), StoreError>| {
            let _ = reply.send(settled.and(out));
        }))
    }

    fn fail(self: Box<Self>, e: StoreError) {
        let _ = self.reply.send(Err(e));
    }
}

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

impl Counters {
    /// A commit of `writes` writes: counted here and in the process's
    /// metrics (`meatspace_sqlite_writes_total`, `…_commits_total`).
    fn committed(&self, writes: usize) {
        let writes = u64::try_from(writes).unwrap_or(u64::MAX);
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.writes.fetch_add(writes, Ordering::Relaxed);
        metrics::counter!("meatspace_sqlite_commits_total").increment(1);
        metrics::counter!("meatspace_sqlite_writes_total").increment(writes);
        tracing::trace!(writes, "committed a batch of writes");
    }
}

/// The handle writes queue on; cloned with the store.
#[derive(Debug, Clone)]
pub(crate) struct Writer {
    queue: mpsc::Sender<Ticket>,
    counters: Arc<Counters>,
    checkpointed: Arc<checkpoint::CheckpointState>,
    /// How long a write waits for its turn before the store reports the
    /// database unavailable (as a pool's acquire timeout does).
    wait: Duration,
}

impl Writer {
    /// Starts the writer thread, which runs lending batches on the current
    /// runtime. It acquires `pool`'s connection for each batch of lending
    /// writes and returns it after the
    /// commit, so that tools with raw SQL on the pool still get their turn;
    /// inline jobs run on `inline`, its own connection (reopened with
    /// `opener` if a job panicked with it).
    pub(crate) fn spawn(
        pool: SqlitePool,
        inline: Connection,
        opener: Opener,
        announcer: Announcer,
        wait: Duration,
    ) -> Result<Self, StoreError> {
        let (queue, jobs) = mpsc::channel(QUEUE);
        let counters = Arc::<Counters>::default();
        let checkpoints = Checkpoints::spawn(opener.open()?)
            .map_err(|e| StoreError::Database(sqlx::Error::Io(e)))?;
        let checkpointed = checkpoints.shared();
        let writer = WriterThread {
            pool,
            inline: Some(inline),
            opener,
            announcer,
            counters: counters.clone(),
            checkpoints,
        };
        // A thread of its own, not a task: a batch's statements never wait,
        // and the writer never queues behind the requests it serves.
        let runtime = tokio::runtime::Handle::current();
        std::thread::Builder::new()
            .name("sqlite-writer".into())
            .spawn(move || writer.serve(jobs, &runtime))
            .map_err(|e| StoreError::Database(sqlx::Error::Io(e)))?;
        Ok(Writer {
            queue,
            counters,
            checkpointed,
            wait,
        })
    }

    pub(crate) fn checkpoint_counts(&self) -> checkpoint::CheckpointCounts {
        self.checkpointed.counts()
    }

    /// Writes waiting in the queue (not the batch being written).
    pub(crate) fn queued(&self) -> usize {
        self.queue.max_capacity() - self.queue.capacity()
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
        let ticket = Ticket::Lend(LentWrite {
            turn: turn_tx,
            one_statement,
        });
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

    /// Runs `write` as an inline job (see [`crate::inline`]): in the writer's
    /// batch, on its own connection, answered after the commit that holds it
    /// (or at once, if it wrote nothing). A write still queued when the
    /// wait runs out is not run.
    pub(crate) async fn run<T, F>(&self, write: F) -> Result<T, StoreError>
    where
        F: FnOnce(&Inline) -> Result<T, StoreError> + Send + 'static,
        T: Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job = Box::new(Closure { write, reply });
        let wait = async {
            self.queue
                .send(Ticket::Inline(job))
                .await
                .map_err(|_| gone())?;
            answer.await.map_err(|_| gone())?
        };
        match tokio::time::timeout(self.wait, wait).await {
            Ok(out) => out,
            Err(_) => Err(StoreError::Unavailable(sqlx::Error::PoolTimedOut)),
        }
    }
}

/// The writer thread is gone (the store is closing, or its runtime is
/// shutting down).
fn gone() -> StoreError {
    StoreError::Unavailable(sqlx::Error::PoolClosed)
}

/// One write in progress: the write connection, lent to the caller inside
/// the batch's transaction. Dereferences to the connection for queries.
#[derive(derive_more::Debug)]
pub struct WriteTx {
    #[debug(skip)]
    conn: Option<PoolConnection<Sqlite>>,
    #[debug(skip)]
    back: Option<oneshot::Sender<ReturnedWrite>>,
    touched: Vec<Change>,
}

/// What a write hands back to the writer, with the connection.
struct ReturnedWrite {
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
        if let Err(mut lost) = back.send(ReturnedWrite { conn, end, touched }) {
            // The writer is gone mid-batch: the connection must not go back
            // to the pool inside its open transaction.
            lost.conn.close_on_drop();
        }
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

/// How the writer opens its own connection: the store's file, with the
/// pragmas of the store's other connections.
#[derive(Debug, Clone)]
pub(crate) struct Opener {
    pub(crate) path: std::path::PathBuf,
    pub(crate) busy_timeout: Duration,
}

impl Opener {
    pub(crate) fn open(&self) -> Result<Connection, StoreError> {
        let conn = Connection::open(&self.path).map_err(failure)?;
        conn.busy_timeout(self.busy_timeout).map_err(failure)?;
        // The journal mode (WAL) is the file's; these are the connection's.
        conn.execute_batch("PRAGMA foreign_keys = ON; PRAGMA synchronous = NORMAL")
            .map_err(failure)?;
        Ok(conn)
    }

    /// The inline jobs' connection: as [`Opener::open`], with a page cache
    /// (8 MiB) that holds the pages a burst of writes goes back to. Its
    /// WAL checkpoints run between batches, the heavy part on another
    /// thread (see [`crate::checkpoint`]); its own auto-checkpoint, in the
    /// `COMMIT`, is only the backstop.
    pub(crate) fn open_writer(&self) -> Result<Connection, StoreError> {
        let conn = self.open()?;
        conn.execute_batch("PRAGMA cache_size = -8192")
            .map_err(failure)?;
        conn.pragma_update(None, "wal_autocheckpoint", checkpoint::BACKSTOP_PAGES)
            .map_err(failure)?;
        // A WAL that grew past the backstop (a checkpoint pass slowed down
        // while the writes went on) is cut back to it when it starts over,
        // so a past burst does not keep its disk space.
        let page_size: i64 = conn
            .query_row("PRAGMA page_size", [], |row| row.get(0))
            .map_err(failure)?;
        conn.pragma_update(
            None,
            "journal_size_limit",
            checkpoint::BACKSTOP_PAGES * page_size,
        )
        .map_err(failure)?;
        Ok(conn)
    }
}

/// The writer thread's state: its connections and where it reports.
struct WriterThread {
    pool: SqlitePool,
    /// The inline jobs' connection; `None` after a job panicked with it
    /// (the next batch opens another).
    inline: Option<Connection>,
    opener: Opener,
    announcer: Announcer,
    counters: Arc<Counters>,
    /// The WAL's checkpoints, run off the writer's path (see
    /// [`crate::checkpoint`]).
    checkpoints: Checkpoints,
}

impl WriterThread {
    /// A batch for every write that finds the queue empty: inline jobs
    /// commit with the inline jobs queued with them, lending writes with
    /// the lending writes (each kind on its own connection, one batch at a
    /// time, so the two never wait for each other's lock). Lending batches
    /// run on `runtime` (sqlx's statements are async); inline ones here.
    /// Returns when every handle to the writer is gone.
    fn serve(mut self, mut jobs: mpsc::Receiver<Ticket>, runtime: &tokio::runtime::Handle) {
        let mut next = None;
        loop {
            let first = match next.take() {
                Some(ticket) => ticket,
                None => match jobs.blocking_recv() {
                    Some(ticket) => ticket,
                    None => return,
                },
            };
            next = match first {
                Ticket::Lend(turn) => runtime.block_on(self.lend(turn, &mut jobs)),
                Ticket::Inline(job) => self.inline(job, &mut jobs),
            };
            self.checkpoints.after_batch(self.inline.as_ref());
        }
    }

    /// Serves a batch of lending writes starting with `first`; the queued
    /// write of the other kind that ended it, if one did.
    async fn lend(
        &mut self,
        first: LentWrite,
        jobs: &mut mpsc::Receiver<Ticket>,
    ) -> Option<Ticket> {
        if first.turn.is_closed() {
            return None;
        }
        let conn = match self.pool.acquire().await {
            Ok(conn) => conn,
            Err(e) => {
                let _ = first.turn.send(Err(e.into()));
                return None;
            }
        };
        let mut batch = Batch {
            announcer: self.announcer.clone(),
            counters: self.counters.clone(),
            conn: Some(conn),
            open: false,
            written: false,
            broken: false,
            waiting: Vec::new(),
            touched: Vec::new(),
        };
        let mut next = Some(first);
        let mut taken = 0;
        let mut other = None;
        while let Some(turn) = next.take() {
            taken += 1;
            if !batch.serve(turn).await {
                break;
            }
            if taken < MAX_BATCH {
                // What is queued now, never what might come: no timer.
                match jobs.try_recv() {
                    Ok(Ticket::Lend(turn)) => next = Some(turn),
                    Ok(inline) => other = Some(inline),
                    Err(_) => {}
                }
            }
        }
        batch.commit().await;
        other
    }

    /// Runs a batch of inline jobs starting with `first`; the queued write
    /// of the other kind that ended it, if one did.
    fn inline(&mut self, first: Box<dyn Job>, jobs: &mut mpsc::Receiver<Ticket>) -> Option<Ticket> {
        let mut batch = vec![first];
        let mut other = None;
        while batch.len() < MAX_BATCH {
            match jobs.try_recv() {
                Ok(Ticket::Inline(job)) => batch.push(job),
                Ok(lend) => {
                    other = Some(lend);
                    break;
                }
                Err(_) => break,
            }
        }
        let conn = match self
            .inline
            .take()
            .map_or_else(|| self.opener.open_writer(), Ok)
        {
            Ok(conn) => conn,
            Err(e) => {
                for job in batch {
                    job.fail(same_error(&e));
                }
                return other;
            }
        };
        let db = Inline::new(conn);
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run_inline(&db, batch, &self.announcer, &self.counters);
        }));
        // A job that panicked leaves its batch's callers (dropped unanswered)
        // seeing the writer gone; its connection, and the transaction left
        // open on it, is closed, and the next batch opens a new one. So is a
        // connection a failed rollback left in a transaction.
        let conn = db.into_connection();
        self.inline = (ran.is_ok() && conn.is_autocommit()).then_some(conn);
        other
    }
}

/// Runs inline jobs in one transaction and commits it: each in its own
/// savepoint, undone alone when it fails or writes nothing; then announces
/// what the committed ones changed and answers them.
fn run_inline(db: &Inline, jobs: Vec<Box<dyn Job>>, announcer: &Announcer, counters: &Counters) {
    let mut waiting: Vec<AnswerAfterBatch> = Vec::new();
    let mut touched = Vec::new();
    let mut open = false;
    let mut jobs = jobs.into_iter();
    while let Some(job) = jobs.next() {
        if !open {
            if let Err(e) = db.execute("BEGIN IMMEDIATE") {
                // The file is locked (another process) or failing: what is
                // left of the batch would wait the same, so it fails alike.
                for job in std::iter::once(job).chain(jobs.by_ref()) {
                    job.fail(same_error(&e));
                }
                break;
            }
            open = true;
        }
        let Some(settle) = job.run(db) else {
            continue;
        };
        let done = db.take_job();
        let lost = !db.in_transaction();
        if done.committed && !lost {
            waiting.push(settle);
            touched.extend(done.touched);
            continue;
        }
        let undone = if done.began && !lost {
            db.undo()
        } else {
            Ok(())
        };
        if lost || done.in_doubt || undone.is_err() {
            // The transaction is gone or in doubt: nothing of the batch so
            // far can be trusted to commit.
            let e = lost_batch();
            abort_inline(db, &mut waiting, &e);
            touched.clear();
            open = false;
            if done.committed {
                settle(Err(same_error(&e)));
                continue;
            }
        }
        // It wrote nothing: its answer (a refusal, an error) is final.
        settle(Ok(()));
    }
    if !open {
        return;
    }
    if waiting.is_empty() {
        // Nothing to keep (every job was refused, failed or gone).
        if db.execute("ROLLBACK").is_err() {
            tracing::warn!("an empty batch of writes could not be rolled back");
        }
        return;
    }
    match db.execute("COMMIT") {
        Ok(()) => {
            counters.committed(waiting.len());
            for change in touched {
                announcer.announce(change);
            }
            for settle in waiting {
                settle(Ok(()));
            }
        }
        // A failed COMMIT may leave the transaction open (SQLITE_BUSY); it
        // is rolled back, so that no answer lies.
        Err(e) => abort_inline(db, &mut waiting, &e),
    }
}

/// Rolls the inline batch's transaction back and answers every write
/// committed into it with `e`.
fn abort_inline(db: &Inline, waiting: &mut Vec<AnswerAfterBatch>, e: &StoreError) {
    if db.in_transaction() {
        // Failing too leaves the connection in a transaction, which the next
        // batch's BEGIN reports.
        let _ = db.execute("ROLLBACK");
    }
    if !waiting.is_empty() {
        tracing::warn!(writes = waiting.len(), error = %e, "a batch of writes was rolled back");
    }
    for settle in waiting.drain(..) {
        settle(Err(same_error(e)));
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
    async fn serve(&mut self, ticket: LentWrite) -> bool {
        let LentWrite {
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
        let (back, returned) = oneshot::channel();
        let tx = WriteTx {
            conn: self.conn.take(),
            back: Some(back),
            touched: Vec::new(),
        };
        // A caller that went away just now drops the transaction unsent, and
        // its drop hands the connection back as abandoned.
        drop(turn.send(Ok(tx)));
        let Ok(ReturnedWrite { conn, end, touched }) = returned.await else {
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
        if self.waiting.is_empty() {
            // Nothing to keep: every write of the batch was undone or gone.
            self.open = false;
            self.broken |= self.exec("ROLLBACK").await.is_err();
            return;
        }
        let committed = self.exec("COMMIT").await;
        match committed {
            Ok(()) => {
                self.open = false;
                self.counters.committed(self.waiting.len());
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
        // Open here only when the lending batch is cancelled (the runtime
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
