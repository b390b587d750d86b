//! Claiming an `Idempotency-Key` in PostgreSQL: the engine's SQL (the rest
//! is shared, `store/sql/deliveries.rs`). What a record means and how an
//! existing one answers a claim is [`meatspace_store::idempotency`]'s.

use meatspace_store::StoreError;
use meatspace_store::idempotency::{IdempotencyClaim, IdempotencyRecord};

type Tx = sqlx::Transaction<'static, sqlx::Postgres>;

/// Inserts a fresh record unless the key has one (the conflicting insert
/// waits for its writer to commit); true when it did.
pub(crate) async fn insert_fresh(
    tx: &mut Tx,
    claim: &IdempotencyClaim,
) -> Result<bool, StoreError> {
    Ok(write_claim(tx, claim, "DO NOTHING").await? == 1)
}

/// The key's record, locked to judge and maybe take it over.
pub(crate) async fn lock(
    tx: &mut Tx,
    claim: &IdempotencyClaim,
) -> Result<Option<IdempotencyRecord>, StoreError> {
    Ok(sqlx::query_as(
        "SELECT fingerprint, state, status, response, locked_until, expires_at \
         FROM idempotency_keys WHERE scope = $1 AND key = $2 FOR UPDATE",
    )
    .bind(&claim.scope[..])
    .bind(&claim.key)
    .fetch_optional(&mut **tx)
    .await?)
}

/// Writes the key as in flight for `claim`, over whatever record it had.
pub(crate) async fn take(tx: &mut Tx, claim: &IdempotencyClaim) -> Result<(), StoreError> {
    write_claim(
        tx,
        claim,
        "DO UPDATE SET fingerprint = EXCLUDED.fingerprint, state = 'in_flight', \
         status = NULL, response = NULL, created_at = EXCLUDED.created_at, \
         locked_until = EXCLUDED.locked_until, expires_at = EXCLUDED.expires_at",
    )
    .await?;
    Ok(())
}

/// Inserts `claim` as in flight, doing `on_conflict` when the key has a
/// record; the rows written.
async fn write_claim(
    tx: &mut Tx,
    claim: &IdempotencyClaim,
    on_conflict: &str,
) -> Result<u64, StoreError> {
    let sql = format!(
        "INSERT INTO idempotency_keys (scope, key, fingerprint, state, created_at, locked_until, expires_at) \
         VALUES ($1, $2, $3, 'in_flight', $4, $5, $6) ON CONFLICT (scope, key) {on_conflict}"
    );
    let done = sqlx::query(&sql)
        .bind(&claim.scope[..])
        .bind(&claim.key)
        .bind(&claim.fingerprint[..])
        .bind(claim.now)
        .bind(claim.now + claim.lease)
        .bind(claim.now + claim.ttl)
        .execute(&mut **tx)
        .await?;
    Ok(done.rows_affected())
}
