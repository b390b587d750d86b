//! `Idempotency-Key` records: what they mean, and how an existing record
//! answers a new claim ([`judge`]), once for both backends (each holds only
//! its SQL).
//!
//! A record goes `in_flight` when the first request with a key arrives and
//! `done` with the (sealed) answer when it finishes. Claiming is one
//! transaction over the record's row, so of many concurrent requests with
//! one key exactly one is told [`IdempotencyBegin::Started`]; the others see
//! it in flight (409) or, later, its answer. An in-flight record carries a
//! lease (`locked_until`): if the process handling it died, the next request
//! after the lease takes over instead of being refused forever.

use chrono::{DateTime, TimeDelta, Utc};

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

/// A stored record, as a claim reads it. A PostgreSQL row reads into it as
/// it is (`sqlx::FromRow`).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct IdempotencyRecord {
    pub fingerprint: Vec<u8>,
    pub state: String,
    pub status: Option<i32>,
    pub response: Option<Vec<u8>>,
    pub locked_until: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

/// What an existing row says, given the claim: `None` when it is stale (its
/// window or its lease ended) and the claim takes it over.
pub fn judge(
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
