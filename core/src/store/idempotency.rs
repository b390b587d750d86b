//! Storage of `Idempotency-Key` records for both backends.
//!
//! A record goes `in_flight` when the first request with a key arrives and
//! `done` with the (sealed) answer when it finishes. Claiming is one
//! transaction over the record's row, so of many concurrent requests with
//! one key exactly one is told [`IdempotencyBegin::Started`]; the others see
//! it in flight (409) or, later, its answer. An in-flight record carries a
//! lease (`locked_until`): if the process handling it died, the next request
//! after the lease takes over instead of being refused forever.

use chrono::{DateTime, TimeDelta, Utc};
use sqlx::{PgPool, Row, SqlitePool};

use super::StoreError;

/// A request that wants to run under an idempotency key.
#[derive(Debug, Clone)]
pub struct IdempotencyClaim {
    /// SHA-256 of the credential that sent the request: keys of different
    /// credentials never meet.
    pub scope: [u8; 32],
    /// The client's key.
    pub key: String,
    /// SHA-256 of the request (method, path, content type, body).
    pub fingerprint: [u8; 32],
    pub now: DateTime<Utc>,
    /// How long the claim holds while the request runs.
    pub lease: TimeDelta,
    /// How long the answer is replayed.
    pub ttl: TimeDelta,
}

/// What the store says about a claimed key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdempotencyBegin {
    /// Run the request, then complete or release the key.
    Started,
    /// The same key is being handled right now (409).
    InFlight,
    /// The key was used for a different request (422).
    Mismatch,
    /// The request already ran: replay this answer.
    Completed { status: u16, response: Vec<u8> },
}

/// What an existing row says, given the claim.
fn judge(
    claim: &IdempotencyClaim,
    fingerprint: &[u8],
    state: &str,
    status: Option<i32>,
    response: Option<Vec<u8>>,
    locked_until: DateTime<Utc>,
    expires_at: DateTime<Utc>,
) -> Option<IdempotencyBegin> {
    let stale = expires_at <= claim.now || (state == "in_flight" && locked_until <= claim.now);
    if stale {
        return None;
    }
    if fingerprint != claim.fingerprint {
        return Some(IdempotencyBegin::Mismatch);
    }
    match (state, status, response) {
        ("done", Some(status), Some(response)) => Some(IdempotencyBegin::Completed {
            status: u16::try_from(status).unwrap_or(500),
            response,
        }),
        _ => Some(IdempotencyBegin::InFlight),
    }
}

pub(super) async fn pg_begin(
    pool: &PgPool,
    claim: &IdempotencyClaim,
) -> Result<IdempotencyBegin, StoreError> {
    let mut tx = pool.begin().await?;
    let inserted = sqlx::query(
        "INSERT INTO idempotency_keys (scope, key, fingerprint, state, created_at, locked_until, expires_at) \
         VALUES ($1, $2, $3, 'in_flight', $4, $5, $6) ON CONFLICT (scope, key) DO NOTHING",
    )
    .bind(&claim.scope[..])
    .bind(&claim.key)
    .bind(&claim.fingerprint[..])
    .bind(claim.now)
    .bind(claim.now + claim.lease)
    .bind(claim.now + claim.ttl)
    .execute(&mut *tx)
    .await?;
    if inserted.rows_affected() == 1 {
        tx.commit().await?;
        return Ok(IdempotencyBegin::Started);
    }
    // The row exists (the conflicting insert waited for its writer to
    // commit); lock it to judge and maybe take it over.
    let row = sqlx::query(
        "SELECT fingerprint, state, status, response, locked_until, expires_at \
         FROM idempotency_keys WHERE scope = $1 AND key = $2 FOR UPDATE",
    )
    .bind(&claim.scope[..])
    .bind(&claim.key)
    .fetch_optional(&mut *tx)
    .await?;
    if let Some(row) = row {
        let fingerprint: Vec<u8> = row.try_get("fingerprint")?;
        let state: String = row.try_get("state")?;
        if let Some(verdict) = judge(
            claim,
            &fingerprint,
            &state,
            row.try_get("status")?,
            row.try_get("response")?,
            row.try_get("locked_until")?,
            row.try_get("expires_at")?,
        ) {
            tx.commit().await?;
            return Ok(verdict);
        }
    }
    // Absent (released meanwhile), expired or abandoned: take it.
    sqlx::query(
        "INSERT INTO idempotency_keys (scope, key, fingerprint, state, created_at, locked_until, expires_at) \
         VALUES ($1, $2, $3, 'in_flight', $4, $5, $6) \
         ON CONFLICT (scope, key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, state = 'in_flight', \
           status = NULL, response = NULL, created_at = EXCLUDED.created_at, \
           locked_until = EXCLUDED.locked_until, expires_at = EXCLUDED.expires_at",
    )
    .bind(&claim.scope[..])
    .bind(&claim.key)
    .bind(&claim.fingerprint[..])
    .bind(claim.now)
    .bind(claim.now + claim.lease)
    .bind(claim.now + claim.ttl)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(IdempotencyBegin::Started)
}

pub(super) async fn pg_complete(
    pool: &PgPool,
    scope: &[u8; 32],
    key: &str,
    status: u16,
    response: &[u8],
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE idempotency_keys SET state = 'done', status = $3, response = $4 \
         WHERE scope = $1 AND key = $2",
    )
    .bind(&scope[..])
    .bind(key)
    .bind(i32::from(status))
    .bind(response)
    .execute(pool)
    .await?;
    Ok(())
}

pub(super) async fn pg_release(
    pool: &PgPool,
    scope: &[u8; 32],
    key: &str,
) -> Result<(), StoreError> {
    sqlx::query(
        "DELETE FROM idempotency_keys WHERE scope = $1 AND key = $2 AND state = 'in_flight'",
    )
    .bind(&scope[..])
    .bind(key)
    .execute(pool)
    .await?;
    Ok(())
}

pub(super) async fn pg_purge(
    pool: &PgPool,
    before: DateTime<Utc>,
    limit: u32,
) -> Result<u64, StoreError> {
    let done = sqlx::query(
        "DELETE FROM idempotency_keys WHERE ctid IN \
         (SELECT ctid FROM idempotency_keys WHERE expires_at <= $1 LIMIT $2)",
    )
    .bind(before)
    .bind(i64::from(limit))
    .execute(pool)
    .await?;
    Ok(done.rows_affected())
}

fn ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

fn from_ms(v: i64) -> Result<DateTime<Utc>, StoreError> {
    DateTime::from_timestamp_millis(v).ok_or_else(|| StoreError::Corrupt(format!("timestamp {v}")))
}

pub(super) async fn sqlite_begin(
    writer: &SqlitePool,
    claim: &IdempotencyClaim,
) -> Result<IdempotencyBegin, StoreError> {
    // BEGIN IMMEDIATE takes the write lock first: claims are serialised.
    let mut tx = writer.begin_with("BEGIN IMMEDIATE").await?;
    let row = sqlx::query(
        "SELECT fingerprint, state, status, response, locked_until, expires_at \
         FROM idempotency_keys WHERE scope = ? AND key = ?",
    )
    .bind(&claim.scope[..])
    .bind(&claim.key)
    .fetch_optional(&mut *tx)
    .await?;
    if let Some(row) = row {
        let fingerprint: Vec<u8> = row.try_get("fingerprint")?;
        let state: String = row.try_get("state")?;
        if let Some(verdict) = judge(
            claim,
            &fingerprint,
            &state,
            row.try_get("status")?,
            row.try_get("response")?,
            from_ms(row.try_get("locked_until")?)?,
            from_ms(row.try_get("expires_at")?)?,
        ) {
            tx.commit().await?;
            return Ok(verdict);
        }
    }
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
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(IdempotencyBegin::Started)
}

pub(super) async fn sqlite_complete(
    writer: &SqlitePool,
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
    .execute(writer)
    .await?;
    Ok(())
}

pub(super) async fn sqlite_release(
    writer: &SqlitePool,
    scope: &[u8; 32],
    key: &str,
) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM idempotency_keys WHERE scope = ? AND key = ? AND state = 'in_flight'")
        .bind(&scope[..])
        .bind(key)
        .execute(writer)
        .await?;
    Ok(())
}

pub(super) async fn sqlite_purge(
    writer: &SqlitePool,
    before: DateTime<Utc>,
    limit: u32,
) -> Result<u64, StoreError> {
    let done = sqlx::query(
        "DELETE FROM idempotency_keys WHERE rowid IN \
         (SELECT rowid FROM idempotency_keys WHERE expires_at <= ? LIMIT ?)",
    )
    .bind(ms(before))
    .bind(i64::from(limit))
    .execute(writer)
    .await?;
    Ok(done.rows_affected())
}
