//! `Idempotency-Key` records in SQLite: the SQL and its codecs only. What a
//! record means and how an existing one answers a claim is
//! [`meatspace_store::idempotency`]'s.

use chrono::{DateTime, Utc};
use meatspace_store::StoreError;

fn ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

type Tx = crate::WriteTx;

pub(crate) async fn complete(
    tx: &mut Tx,
    scope: &[u8; 32],
    key: &str,
    status: u16,
    response: &[u8],
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE idempotency_keys SET state = 'done', status = ?, response = ? \
         WHERE scope = ? AND key = ?",
    )
    .bind(i32::from(status))
    .bind(response)
    .bind(&scope[..])
    .bind(key)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

pub(crate) async fn release(tx: &mut Tx, scope: &[u8; 32], key: &str) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM idempotency_keys WHERE scope = ? AND key = ? AND state = 'in_flight'")
        .bind(&scope[..])
        .bind(key)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

pub(crate) async fn purge(
    tx: &mut Tx,
    before: DateTime<Utc>,
    limit: u32,
) -> Result<u64, StoreError> {
    let done = sqlx::query(
        "DELETE FROM idempotency_keys WHERE rowid IN \
         (SELECT rowid FROM idempotency_keys WHERE expires_at <= ? LIMIT ?)",
    )
    .bind(ms(before))
    .bind(i64::from(limit))
    .execute(&mut **tx)
    .await?;
    Ok(done.rows_affected())
}
