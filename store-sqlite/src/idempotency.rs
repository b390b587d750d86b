//! `Idempotency-Key` records in SQLite: the SQL and its codecs only. What a
//! record means and how an existing one answers a claim is
//! [`meatspace_store::idempotency`]'s. Claims are the engine's
//! ([`crate::inline`]); these are the writes after them, inline jobs too.

use chrono::{DateTime, Utc};
use meatspace_store::StoreError;

use crate::inline::Inline;
use crate::ms;

pub(crate) fn complete(
    db: &Inline,
    scope: &[u8; 32],
    key: &str,
    status: u16,
    response: &[u8],
) -> Result<(), StoreError> {
    db.exec(
        "UPDATE idempotency_keys SET state = 'done', status = ?, response = ? \
         WHERE scope = ? AND key = ?",
        (i32::from(status), response, &scope[..], key),
    )?;
    Ok(())
}

pub(crate) fn release(db: &Inline, scope: &[u8; 32], key: &str) -> Result<(), StoreError> {
    db.exec(
        "DELETE FROM idempotency_keys WHERE scope = ? AND key = ? AND state = 'in_flight'",
        (&scope[..], key),
    )?;
    Ok(())
}

pub(crate) fn purge(db: &Inline, before: DateTime<Utc>, limit: u32) -> Result<u64, StoreError> {
    let done = db.exec(
        "DELETE FROM idempotency_keys WHERE rowid IN \
         (SELECT rowid FROM idempotency_keys WHERE expires_at <= ? LIMIT ?)",
        (ms(before), i64::from(limit)),
    )?;
    Ok(u64::try_from(done).unwrap_or(u64::MAX))
}
