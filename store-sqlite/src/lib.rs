//! The SQLite store: the embedded default, one file in WAL mode. It holds
//! SQL, migrations and codecs; every decision is the engine's
//! ([`meatspace_store::engine`], with its default methods).
//!
//! SQLite has one writer at a time, so the store keeps a separate read pool,
//! and every write goes through one [writer thread](writer) that owns the
//! write connections: writes queue in-process instead of spinning on the
//! busy handler, and the writes queued together commit together, each in a
//! savepoint of its own. The engine's writes run on that thread itself, on
//! a rusqlite connection ([`inline`]); the rest borrow sqlx's. Write
//! transactions start with `BEGIN IMMEDIATE`, so even a second process on
//! the same file takes the write lock before it reads the row it will
//! change; that gives the same guarantees as PostgreSQL's row locks.
//! Timestamps are stored as integer milliseconds, ids as text UUIDs.

use std::str::FromStr;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use futures::stream::BoxStream;
use sqlx::Row;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use tokio::sync::broadcast;
use uuid::Uuid;

use meatspace_domain::{Event, Issue, Policy, Task};
use meatspace_store::engine;
use meatspace_store::{
    BackendKind, Change, ConnectOptions, NewTask, Store, StoreError, TaskVersions, stored_event,
};

mod checkpoint;
pub use checkpoint::CheckpointCounts;
mod dialect;
// Shared with the other backend, over this one's `dialect`.
#[path = "../../store/sql/mod.rs"]
mod sql;
use sql::{identity, reads};
pub mod inline;
mod requests;
mod webhooks;
mod writer;

pub use inline::{Inline, InlineTx};
pub use writer::{WriteCounts, WriteTx};

/// The migrations of this backend, embedded at build time. sqlx records each
/// one's checksum in the database and refuses to start when a file that
/// ran has changed, so these files never change (see the test below).
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

use meatspace_store::engine::TASK_COLUMNS;

#[derive(Debug, Clone)]
pub struct SqliteStore {
    /// The write connection's pool: the writer thread takes its one
    /// connection for each batch (and [`SqliteStore::pool`] for raw SQL).
    writer: SqlitePool,
    /// Where every write of the store queues for its turn.
    writes: writer::Writer,
    reader: SqlitePool,
    /// One read-only connection of its own for [`Store::ping`], as on
    /// PostgreSQL: thousands of long polls woken at once queue on `reader`,
    /// and a ping waiting behind them made a healthy database look down
    /// (every request then got 503 for a probe interval).
    probe: SqlitePool,
    policy: Policy,
    /// Task ids changed by this process, for [`Store::changes`].
    changes: broadcast::Sender<Change>,
    /// Bumped after every commit that touches a task (see [`TaskVersions`]).
    versions: std::sync::Arc<TaskVersions>,
}

fn ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

fn opt_ms(t: Option<DateTime<Utc>>) -> Option<i64> {
    t.map(ms)
}

fn from_ms(v: i64) -> Result<DateTime<Utc>, StoreError> {
    DateTime::from_timestamp_millis(v).ok_or_else(|| StoreError::Corrupt(format!("timestamp {v}")))
}

fn opt_from_ms(v: Option<i64>) -> Result<Option<DateTime<Utc>>, StoreError> {
    v.map(from_ms).transpose()
}

fn uuid(s: &str) -> Result<Uuid, StoreError> {
    Uuid::parse_str(s).map_err(|_| StoreError::Corrupt(format!("uuid {s:?}")))
}

/// Opens the single-connection write pool. Switching a new file to WAL takes
/// an exclusive lock that SQLite's busy timeout does not wait for, so when
/// several processes open the same new file at once, the others get
/// SQLITE_BUSY; they retry until the acquire timeout.
async fn open_writer(
    connect: &SqliteConnectOptions,
    options: &ConnectOptions,
) -> Result<SqlitePool, StoreError> {
    let deadline = tokio::time::Instant::now() + options.acquire_timeout;
    loop {
        // The writer keeps sqlx's ping before use: it waits for the rollback
        // of a transaction dropped mid-request (a client that went away),
        // which sqlx runs on the connection's thread in the background;
        // without it the next BEGIN can find the old transaction's depth.
        let opened = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(options.acquire_timeout)
            .connect_with(connect.clone())
            .await;
        match opened {
            Err(e) if is_busy(&e) && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            opened => return Ok(opened?),
        }
    }
}

/// SQLITE_BUSY, plain or extended (the primary code is the low byte).
fn is_busy(e: &sqlx::Error) -> bool {
    let code = match e {
        sqlx::Error::Database(db) => db.code().and_then(|c| c.parse::<i32>().ok()),
        _ => None,
    };
    code.is_some_and(|c| c & 0xff == 5)
}

impl SqliteStore {
    /// Opens (creating if needed) the database file and runs migrations.
    pub async fn connect(
        url: &str,
        policy: Policy,
        options: &ConnectOptions,
    ) -> Result<Self, StoreError> {
        let connect = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .foreign_keys(true)
            .busy_timeout(options.acquire_timeout);
        let writer = open_writer(&connect, options).await?;
        // sqlx's migrator takes no lock on SQLite, so two processes opening
        // a new file at once would both apply the first migration and one
        // would fail. Migrating inside a write transaction makes the second
        // wait for the first and then find the migrations applied.
        let mut tx = writer.begin_with("BEGIN IMMEDIATE").await?;
        MIGRATOR.run(&mut *tx).await?;
        tx.commit().await?;
        let reader = SqlitePoolOptions::new()
            .max_connections(options.max_connections.max(1))
            // A file does not drop connections: no ping (a round trip to
            // the connection's thread) before every read.
            .test_before_acquire(false)
            .acquire_timeout(options.acquire_timeout)
            .connect_with(connect.clone().read_only(true))
            .await?;
        let probe = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(options.acquire_timeout)
            .connect_with(connect.clone().read_only(true))
            .await?;
        let (changes, _) = broadcast::channel(1024);
        let versions = std::sync::Arc::<TaskVersions>::default();
        let announcer = writer::Announcer {
            changes: changes.clone(),
            versions: versions.clone(),
        };
        let opener = writer::Opener {
            path: connect.get_filename().to_owned(),
            busy_timeout: options.acquire_timeout,
        };
        let inline = opener.open_writer()?;
        let writes = writer::Writer::spawn(
            writer.clone(),
            inline,
            opener,
            announcer,
            options.acquire_timeout,
        )?;
        Ok(Self {
            writer,
            writes,
            reader,
            probe,
            policy,
            changes,
            versions,
        })
    }

    /// The write pool, for tests and tools that need raw SQL.
    pub fn pool(&self) -> &SqlitePool {
        &self.writer
    }

    /// Runs `write` as one of the writer's inline jobs (see [`inline`]): in
    /// a batch with the writes queued with it, on the writer's connection,
    /// answered after the commit that holds it. For tests and tools that
    /// need raw SQL ([`Inline::execute`]) in a batch.
    pub async fn write_inline<T, F>(&self, write: F) -> Result<T, StoreError>
    where
        F: FnOnce(&Inline) -> Result<T, StoreError> + Send + 'static,
        T: Send + 'static,
    {
        self.writes.run(write).await
    }

    /// How many writes wait for the writer now.
    pub fn queued_writes(&self) -> usize {
        self.writes.queued()
    }

    /// How many writes this store has committed, in how many commits.
    pub fn write_counts(&self) -> WriteCounts {
        self.writes.counts()
    }

    /// How many WAL checkpoints ran off the writer's path, and how many
    /// times the writer caught up (see [`checkpoint`]).
    pub fn checkpoint_counts(&self) -> CheckpointCounts {
        self.writes.checkpoint_counts()
    }

    /// Waits for a lending write's turn (see [`writer`]): every write of
    /// the store that is not an inline job begins here, and ends with the
    /// [`WriteTx`]'s commit or rollback. Public for tests and tools that
    /// need raw sqlx SQL in the writer's batch.
    pub async fn begin_write(&self) -> Result<WriteTx, StoreError> {
        self.writes.begin().await
    }

    /// As [`SqliteStore::begin`], for a write of exactly one statement that
    /// ends with its commit (see [`writer::Writer::begin_statement`]): it
    /// needs no savepoint of its own.
    async fn begin_statement(&self) -> Result<WriteTx, StoreError> {
        self.writes.begin_statement().await
    }
}

/// A row of either driver, read by column name: sqlx's for reads, the
/// writer's rusqlite for the engine's writes (see [`inline`]), so that each
/// table's codec is written once.
pub(crate) trait RowReader {
    fn str(&self, column: &str) -> Result<Option<&str>, StoreError>;
    fn int(&self, column: &str) -> Result<Option<i64>, StoreError>;
    fn real(&self, column: &str) -> Result<Option<f64>, StoreError>;

    fn text(&self, column: &str) -> Result<&str, StoreError> {
        self.str(column)?
            .ok_or_else(|| StoreError::Corrupt(format!("{column} is NULL")))
    }

    fn integer(&self, column: &str) -> Result<i64, StoreError> {
        self.int(column)?
            .ok_or_else(|| StoreError::Corrupt(format!("{column} is NULL")))
    }

    fn time(&self, column: &str) -> Result<DateTime<Utc>, StoreError> {
        from_ms(self.integer(column)?)
    }

    fn opt_time(&self, column: &str) -> Result<Option<DateTime<Utc>>, StoreError> {
        opt_from_ms(self.int(column)?)
    }
}

impl RowReader for SqliteRow {
    fn str(&self, column: &str) -> Result<Option<&str>, StoreError> {
        Ok(self.try_get(column)?)
    }

    fn real(&self, column: &str) -> Result<Option<f64>, StoreError> {
        Ok(self.try_get(column)?)
    }

    fn int(&self, column: &str) -> Result<Option<i64>, StoreError> {
        Ok(self.try_get(column)?)
    }
}

/// A SQLite row as a task row: ids are text, times milliseconds.
struct Columns<'r, R>(&'r R);

impl<R: RowReader> meatspace_store::row::RowColumns for Columns<'_, R> {
    fn str(&self, column: &str) -> Result<Option<&str>, StoreError> {
        self.0.str(column)
    }

    fn int(&self, column: &str) -> Result<Option<i64>, StoreError> {
        self.0.int(column)
    }

    fn real(&self, column: &str) -> Result<Option<f64>, StoreError> {
        self.0.real(column)
    }

    fn id(&self, column: &str) -> Result<Option<Uuid>, StoreError> {
        self.0.str(column)?.map(uuid).transpose()
    }

    fn time(&self, column: &str) -> Result<Option<DateTime<Utc>>, StoreError> {
        self.0.opt_time(column)
    }
}

/// The task a row holds ([`meatspace_store::row::task_from_row`]).
fn task_from_row(row: &impl RowReader) -> Result<Task, StoreError> {
    meatspace_store::row::task_from_row(&Columns(row))
}

fn event_from_row(row: &SqliteRow) -> Result<Event, StoreError> {
    stored_event(
        row.try_get("id")?,
        uuid(row.try_get("task_id")?)?,
        row.try_get("type")?,
        from_ms(row.try_get("created_at")?)?,
        row.try_get("actor")?,
        event_data(row)?,
    )
}

fn event_data(row: &SqliteRow) -> Result<serde_json::Value, StoreError> {
    let data: &str = row.try_get("data")?;
    serde_json::from_str(data).map_err(|e| StoreError::Corrupt(format!("event data: {e}")))
}

fn issue_from_row(row: &impl RowReader) -> Result<Issue, StoreError> {
    meatspace_store::row::issue_from_row(&Columns(row))
}

#[async_trait]
impl Store for SqliteStore {
    fn backend(&self) -> BackendKind {
        BackendKind::Sqlite
    }

    #[tracing::instrument(level = "debug", skip(self), err)]
    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.probe).await?;
        Ok(())
    }

    #[tracing::instrument(level = "debug", skip_all, fields(task_id = %new.id), err)]
    async fn create_task(&self, new: NewTask) -> Result<Task, StoreError> {
        self.writes
            .run(move |db| inline::run_to_end(engine::create_task(db, new, None)))
            .await
    }

    fn versions(&self) -> Option<&TaskVersions> {
        Some(&self.versions)
    }

    async fn changes(&self) -> Result<BoxStream<'static, Change>, StoreError> {
        // The broadcast channel is fed by the writers themselves, so nothing
        // needs driving in the background; a receiver that falls behind
        // learns it from `Lagged` and reports a gap.
        let rx = self.changes.subscribe();
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            match rx.recv().await {
                Ok(change) => Some((change, rx)),
                Err(broadcast::error::RecvError::Lagged(_)) => Some((Change::Gap, rx)),
                Err(broadcast::error::RecvError::Closed) => None,
            }
        });
        Ok(stream.boxed())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_ping_does_not_wait_behind_busy_readers() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let url = format!("sqlite://{}", dir.path().join("ping.db").display());
        let options = ConnectOptions {
            max_connections: 1,
            acquire_timeout: Duration::from_secs(10),
        };
        let store = SqliteStore::connect(&url, Policy::default(), &options)
            .await
            .expect("open the store");
        // Every reader is taken, as when thousands of long polls wake at once.
        let _busy = store.reader.acquire().await.expect("the one reader");
        tokio::time::timeout(Duration::from_secs(5), store.ping())
            .await
            .expect("the ping answered without waiting for a reader")
            .expect("the database answers");
    }
}
