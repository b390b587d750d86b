//! What the SQL shared with SQLite (`store/sql/`) needs of PostgreSQL: the
//! connection types, how a value is bound and read back (ids are `uuid`,
//! times `timestamptz`, JSON `jsonb`: as they are), and what only this
//! database does.

use chrono::{DateTime, Utc};
use meatspace_store::StoreError;
use sqlx::Row as _;
use sqlx::postgres::{PgConnection, PgPool, PgRow};
use uuid::Uuid;

use crate::CHANNEL;

pub(crate) type Pool = PgPool;
pub(crate) type Conn = PgConnection;
pub(crate) type Row = PgRow;
pub(crate) type Tx = sqlx::Transaction<'static, sqlx::Postgres>;
pub(crate) type Store = crate::PgStore;

/// The engine's backend: the store itself.
pub(crate) type Engine = crate::PgStore;

/// Runs an engine operation on the store, with its policy.
pub(crate) async fn engine<T>(
    store: &Store,
    op: impl for<'a> FnOnce(
        &'a Engine,
        &'a meatspace_domain::Policy,
    ) -> futures::future::BoxFuture<'a, Result<T, StoreError>>
    + Send,
) -> Result<T, StoreError> {
    op(store, &store.policy).await
}

/// Where reads go.
pub(crate) fn reader(store: &Store) -> &Pool {
    &store.pool
}

/// A write transaction.
pub(crate) async fn begin(store: &Store) -> Result<Tx, StoreError> {
    Ok(store.pool.begin().await?)
}

/// A write transaction of one statement.
pub(crate) async fn begin_statement(store: &Store) -> Result<Tx, StoreError> {
    begin(store).await
}

/// A statement as the shared SQL builds it.
pub(crate) type Query<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

/// Runs one statement as a write of its own (autocommit); returns how many
/// rows it changed.
pub(crate) async fn write_statement(store: &Store, query: Query<'_>) -> Result<u64, StoreError> {
    Ok(query.execute(&store.pool).await?.rows_affected())
}

/// The column that addresses a row physically, for deleting a batch.
pub(crate) const ROW_ADDRESS: &str = "ctid";

/// What a read of rows to change adds so that replicas take different rows.
pub(crate) const SKIP_LOCKED: &str = " FOR UPDATE SKIP LOCKED";

/// Has the task's change announced on commit.
pub(crate) async fn announce_task(tx: &mut Tx, id: Uuid) -> Result<(), StoreError> {
    crate::notify(tx, id).await
}

/// Forgets what this process knows of tasks a write removed.
pub(crate) fn forget_tasks(store: &Store, ids: &[Uuid]) {
    for &id in ids {
        store.versions.bump(id);
        store.known.forget(id);
    }
}

/// The payload that announces a credential change (a task change is the
/// bare task id).
pub(crate) const CREDENTIAL_PREFIX: &str = "credential:";

/// The start of the hour `column` (a time) falls in, as SQL.
pub(crate) fn hour_of(column: &str) -> String {
    format!("date_trunc('hour', {column}, 'UTC')")
}

// ---- values as bound ----------------------------------------------------------------

pub(crate) fn id(v: Uuid) -> Uuid {
    v
}

pub(crate) fn time(v: DateTime<Utc>) -> DateTime<Utc> {
    v
}

pub(crate) fn opt_time(v: Option<DateTime<Utc>>) -> Option<DateTime<Utc>> {
    v
}

pub(crate) fn json(v: Option<&serde_json::Value>) -> Option<&serde_json::Value> {
    v
}

// ---- values as read back --------------------------------------------------------------

pub(crate) fn read_id(row: &Row, column: &str) -> Result<Uuid, StoreError> {
    Ok(row.try_get(column)?)
}

pub(crate) fn read_opt_id(row: &Row, column: &str) -> Result<Option<Uuid>, StoreError> {
    Ok(row.try_get(column)?)
}

pub(crate) fn read_time(row: &Row, column: &str) -> Result<DateTime<Utc>, StoreError> {
    Ok(row.try_get(column)?)
}

pub(crate) fn read_opt_time(row: &Row, column: &str) -> Result<Option<DateTime<Utc>>, StoreError> {
    Ok(row.try_get(column)?)
}

pub(crate) fn read_json(row: &Row, column: &str) -> Result<Option<serde_json::Value>, StoreError> {
    Ok(row.try_get(column)?)
}

/// A keyset cursor past every task: the last second of year 9999 and the
/// largest id.
pub(crate) fn past_every_task() -> (DateTime<Utc>, Uuid) {
    (
        DateTime::from_timestamp(253_402_300_799, 0).unwrap_or_default(),
        Uuid::max(),
    )
}

/// A keyset cursor before every task: the epoch (chrono's earliest time is
/// outside `timestamptz`'s range; no task is created before 1970) and the
/// smallest id.
pub(crate) fn before_every_task() -> (DateTime<Utc>, Uuid) {
    (DateTime::<Utc>::UNIX_EPOCH, Uuid::nil())
}

// ---- what only PostgreSQL does ------------------------------------------------------

/// Sends `credential:<id>` on the change channel in `tx`: every replica
/// hears of it when `tx` commits.
pub(crate) async fn announce_credential(tx: &mut Tx, id: Uuid) -> Result<(), StoreError> {
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(CHANNEL)
        .bind(format!("{CREDENTIAL_PREFIX}{id}"))
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Replicas starting at once with the same configured key: the lock makes
/// the second see the first's row instead of failing on it.
pub(crate) async fn serialize_configured_keys(tx: &mut Tx) -> Result<(), StoreError> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('meatspace configured key'))")
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Records when each key was last used, in one statement for the batch;
/// an older time never overwrites a newer one.
pub(crate) async fn touch_keys(
    store: &Store,
    used: &[(Uuid, DateTime<Utc>)],
) -> Result<(), StoreError> {
    let (ids, ats): (Vec<Uuid>, Vec<DateTime<Utc>>) = used.iter().copied().unzip();
    sqlx::query(
        "UPDATE api_keys k SET last_used_at = u.at \
         FROM UNNEST($1::uuid[], $2::timestamptz[]) AS u(id, at) \
         WHERE k.id = u.id AND (k.last_used_at IS NULL OR k.last_used_at < u.at)",
    )
    .bind(ids)
    .bind(ats)
    .execute(&store.pool)
    .await?;
    Ok(())
}

/// Claims due webhook endpoints in one statement, skipping those another
/// controller has locked.
pub(crate) async fn claim_due_webhooks(
    store: &Store,
    now: DateTime<Utc>,
    lease_until: DateTime<Utc>,
    limit: u32,
) -> Result<Vec<meatspace_store::DueWebhook>, StoreError> {
    crate::webhooks::claim_due(&store.pool, now, lease_until, limit).await
}
