//! `Idempotency-Key` records in SQLite: the SQL and its codecs only. What a
//! record means and how an existing one answers a claim is
//! [`meatspace_store::idempotency`]'s.

use chrono::{DateTime, Utc};
use meatspace_store::StoreError;
use meatspace_store::idempotency::{IdempotencyClaim, IdempotencyRecord};
use sqlx::Row;

fn ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

fn from_ms(v: i64) -> Result<DateTime<Utc>, StoreError> {
    DateTime::from_timestamp_millis(v).ok_or_else(|| StoreError::Corrupt(format!("timestamp {v}")))
}

type Tx = crate::WriteTx;

/// The key's record; the write transaction (BEGIN IMMEDIATE) already
/// serialises claims.
pub(crate) async fn lock(
    tx: &mut Tx,
    claim: &IdempotencyClaim,
) -> Result<Option<IdempotencyRecord>, StoreError> {
    let row = sqlx::query(
        "SELECT fingerprint, state, status, response, locked_until, expires_at \
         FROM idempotency_keys WHERE scope = ? AND key = ?",
    )
    .bind(&claim.scope[..])
    .bind(&claim.key)
    .fetch_optional(&mut **tx)
    .await?;
    row.map(|row| {
        Ok(IdempotencyRecord {
            fingerprint: row.try_get("fingerprint")?,
            state: row.try_get("state")?,
            status: row.try_get("status")?,
            response: row.try_get("response")?,
            locked_until: from_ms(row.try_get("locked_until")?)?,
            expires_at: from_ms(row.try_get("expires_at")?)?,
        })
    })
    .transpose()
}

/// Writes the key as in flight for `claim`, over whatever record it had.
pub(crate) async fn take(tx: &mut Tx, claim: &IdempotencyClaim) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT OR REPLACE INTO idempotency_keys \
         (scope, key, fingerprint, state, status, response, created_at, locked_until, expires_at) \
         VALUES (?, ?, ?, 'in_flight', NULL, NULL, ?, ?, ?)",
    )
    .bind(&claim.scope[..])
    .bind(&claim.key)
    .bind(&claim.fingerprint[..])
    .bind(ms(claim.now))
    .bind(ms(claim.now + claim.lease))
    .bind(ms(claim.now + claim.ttl))
    .execute(&mut **tx)
    .await?;
    Ok(())
}

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
