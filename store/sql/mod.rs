//! The SQL both backends accept, written once: each backend compiles this
//! module (`#[path]` in its `lib.rs`) over its own `dialect` module, which
//! says how a value is bound and read back and does the few things only
//! one database does (see `identity.rs`).

pub(crate) mod console;
pub(crate) mod deliveries;
pub(crate) mod engine_writes;
pub(crate) mod identity;
pub(crate) mod notifications;
pub(crate) mod reads;
pub(crate) mod retention;

use chrono::{DateTime, Utc};
use meatspace_store::StoreError;

use crate::dialect::{self as d, Row, Tx};

/// The rows that `select` finds, binding `at` as `$1` and `limit` as `$2`,
/// locked until `tx` ends; where replicas share the work, rows another
/// write has locked are skipped ([`d::SKIP_LOCKED`], added here).
pub(crate) async fn lock_due(
    tx: &mut Tx,
    select: &str,
    at: DateTime<Utc>,
    limit: u32,
) -> Result<Vec<Row>, StoreError> {
    Ok(sqlx::query(&format!("{select}{}", d::SKIP_LOCKED))
        .bind(d::time(at))
        .bind(i64::from(limit))
        .fetch_all(&mut **tx)
        .await?)
}

/// Deletes at most `limit` rows of `table` (by its `key` column) that
/// `due` selects, binding `at` as `$1`, in a write of one statement; how
/// many it deleted. `due` is a condition and maybe an order:
/// `"at < $1 ORDER BY id"`.
pub(crate) async fn delete_due(
    store: &d::Store,
    table: &str,
    key: &str,
    due: &str,
    at: DateTime<Utc>,
    limit: u32,
) -> Result<u64, StoreError> {
    let sql = format!(
        "DELETE FROM {table} WHERE {key} IN (SELECT {key} FROM {table} WHERE {due} LIMIT $2)"
    );
    let query = sqlx::query(&sql).bind(d::time(at)).bind(i64::from(limit));
    d::write_statement(store, query).await
}

/// The rows that `query` reads on a reader, each through `from_row`.
pub(crate) async fn read_all<T>(
    store: &d::Store,
    query: d::Query<'_>,
    from_row: impl FnMut(&Row) -> Result<T, StoreError>,
) -> Result<Vec<T>, StoreError> {
    let rows = query.fetch_all(d::reader(store)).await?;
    rows.iter().map(from_row).collect()
}

/// Shipped migrations never change (see [`meatspace_store::migrations`]):
/// each backend checks its own against its `shipped-migrations.txt`.
#[cfg(test)]
mod migration_checksums {
    #[test]
    fn shipped_migrations_are_unchanged() {
        meatspace_store::migrations::assert_unchanged(
            &crate::MIGRATOR,
            include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/shipped-migrations.txt"
            )),
        );
    }
}
