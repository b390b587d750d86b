//! What the SQL shared with PostgreSQL (`store/sql/`) needs of SQLite: the
//! connection types, how a value is bound and read back (ids as text,
//! times as milliseconds since the epoch, JSON as text), and what only
//! this database does.

use chrono::{DateTime, Utc};
use meatspace_store::StoreError;
use sqlx::Row as _;
use sqlx::sqlite::{SqliteConnection, SqlitePool, SqliteRow};
use uuid::Uuid;

use crate::{from_ms, ms, opt_from_ms, opt_ms, uuid};

pub(crate) type Pool = SqlitePool;
pub(crate) type Conn = SqliteConnection;
pub(crate) type Row = SqliteRow;
/// A write of the store's single writer (see [`crate::writer`]).
pub(crate) type Tx = crate::WriteTx;
pub(crate) type Store = crate::SqliteStore;

/// The engine's backend: the writer's own connection, lent to an inline job.
pub(crate) type Engine = crate::inline::Inline;

/// Runs an engine operation as an inline job of the writer, with the
/// store's policy: its statements never wait, so one poll runs it to its
/// end ([`crate::inline::run_to_end`]).
pub(crate) async fn engine<T: Send + 'static>(
    store: &Store,
    op: impl for<'a> FnOnce(
        &'a Engine,
        &'a meatspace_domain::Policy,
    ) -> futures::future::LocalBoxFuture<'a, Result<T, StoreError>>
    + Send
    + 'static,
) -> Result<T, StoreError> {
    let policy = store.policy;
    store
        .writes
        .run(move |db| crate::inline::run_to_end(op(db, &policy)))
        .await
}

/// Where reads go: the pool of read-only connections.
pub(crate) fn reader(store: &Store) -> &Pool {
    &store.reader
}

/// A write of the store's writer.
pub(crate) async fn begin(store: &Store) -> Result<Tx, StoreError> {
    store.begin_write().await
}

/// A write of one statement, which the writer may group with others.
pub(crate) async fn begin_statement(store: &Store) -> Result<Tx, StoreError> {
    store.begin_statement().await
}

/// A statement as the shared SQL builds it.
pub(crate) type Query<'q> = sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>>;

/// Runs one statement as a write of the writer's; returns how many rows it
/// changed.
pub(crate) async fn write_statement(store: &Store, query: Query<'_>) -> Result<u64, StoreError> {
    let mut tx = begin_statement(store).await?;
    let changed = query.execute(&mut *tx).await?.rows_affected();
    tx.commit().await?;
    Ok(changed)
}

/// The column that addresses a row physically, for deleting a batch.
pub(crate) const ROW_ADDRESS: &str = "rowid";

/// Nothing: the writer is the only writer.
pub(crate) const SKIP_LOCKED: &str = "";

/// Has the writer announce the task's change after `tx` commits.
pub(crate) async fn announce_task(tx: &mut Tx, id: Uuid) -> Result<(), StoreError> {
    tx.touch(id);
    Ok(())
}

/// Nothing to do: the writer bumps the versions of the tasks it announces.
pub(crate) fn forget_tasks(_store: &Store, _ids: &[Uuid]) {}

/// The start of the hour `column` (a time) falls in, as SQL: times are
/// milliseconds.
pub(crate) fn hour_of(column: &str) -> String {
    format!("(({column}) / 3600000) * 3600000")
}

// ---- values as bound ----------------------------------------------------------------

pub(crate) fn id(v: Uuid) -> String {
    v.to_string()
}

pub(crate) fn time(v: DateTime<Utc>) -> i64 {
    ms(v)
}

pub(crate) fn opt_time(v: Option<DateTime<Utc>>) -> Option<i64> {
    opt_ms(v)
}

pub(crate) fn json(v: Option<&serde_json::Value>) -> Option<String> {
    v.map(|v| v.to_string())
}

// ---- values as read back --------------------------------------------------------------

pub(crate) fn read_id(row: &Row, column: &str) -> Result<Uuid, StoreError> {
    uuid(row.try_get(column)?)
}

pub(crate) fn read_opt_id(row: &Row, column: &str) -> Result<Option<Uuid>, StoreError> {
    let text: Option<&str> = row.try_get(column)?;
    text.map(uuid).transpose()
}

pub(crate) fn read_time(row: &Row, column: &str) -> Result<DateTime<Utc>, StoreError> {
    from_ms(row.try_get(column)?)
}

pub(crate) fn read_opt_time(row: &Row, column: &str) -> Result<Option<DateTime<Utc>>, StoreError> {
    opt_from_ms(row.try_get(column)?)
}

pub(crate) fn read_json(row: &Row, column: &str) -> Result<Option<serde_json::Value>, StoreError> {
    let text: Option<&str> = row.try_get(column)?;
    text.map(serde_json::from_str)
        .transpose()
        .map_err(|_| StoreError::Corrupt(format!("{column} is not JSON")))
}

/// A keyset cursor past every task: the largest time, and an id after
/// every id ('~' sorts after every hex digit and hyphen).
pub(crate) fn past_every_task() -> (i64, String) {
    (i64::MAX, "~".to_owned())
}

/// A keyset cursor before every task: the smallest time and an id before
/// every id.
pub(crate) fn before_every_task() -> (i64, String) {
    (i64::MIN, String::new())
}

// ---- what only SQLite does ----------------------------------------------------------

/// Has the writer announce the credential after `tx` commits, before the
/// write is answered.
pub(crate) async fn announce_credential(tx: &mut Tx, id: Uuid) -> Result<(), StoreError> {
    tx.touch_credential(id);
    Ok(())
}

/// Nothing to do: the writer runs one write at a time.
pub(crate) async fn serialize_configured_keys(_tx: &mut Tx) -> Result<(), StoreError> {
    Ok(())
}

/// Records when each key was last used; an older time never overwrites a
/// newer one.
pub(crate) async fn touch_keys(
    store: &Store,
    used: &[(Uuid, DateTime<Utc>)],
) -> Result<(), StoreError> {
    let mut tx = begin(store).await?;
    for (key, at) in used {
        sqlx::query(
            "UPDATE api_keys SET last_used_at = $1 \
             WHERE id = $2 AND (last_used_at IS NULL OR last_used_at < $1)",
        )
        .bind(ms(*at))
        .bind(id(*key))
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await
}

/// Claims due webhook endpoints: an inline job of the writer, so no other
/// write comes between reading them and moving their next attempt.
pub(crate) async fn claim_due_webhooks(
    store: &Store,
    now: DateTime<Utc>,
    lease_until: DateTime<Utc>,
    limit: u32,
) -> Result<Vec<meatspace_store::DueWebhook>, StoreError> {
    store
        .writes
        .run(move |db| db.one_write(|db| crate::webhooks::claim_due(db, now, lease_until, limit)))
        .await
}
