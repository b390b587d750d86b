//! Credentials: API keys (`msk_<key id>_<secret>`, each of an operator
//! or agent principal, with scopes), the development key (the built-in
//! development principal, when enabled), task-scoped agent tokens, and
//! worker tokens.
//!
//! Tokens embed the id of what they belong to (`mst_<task id>_<secret>`,
//! `msw_<worker id>_<secret>`), so the server looks up one digest by id and
//! compares it in constant time; it never searches by secret. That also
//! separates a wrong token (401) from a valid token of another task (404,
//! so task ids cannot be probed).
//!
//! The parts, by concern: `keys` (API keys, the development key and the
//! [`Caller`] they prove), `tokens` (agent and worker tokens and their
//! extractors), `cache` (the digests kept in memory and how a revocation
//! drops them); here, what the rate limiter and idempotency ask of any
//! credential before a handler runs ([`presented`], [`principal`]).

mod cache;
mod keys;
mod tokens;

pub use cache::{AGENT_DIGEST_MAX_AGE, Credentials, DigestCache, KeyUse};
pub use keys::{
    Actor, Caller, DevKey, KEY_PREFIX, Operator, address_of, authorize_owner, issue_key, verify_key,
};
pub use tokens::{
    AgentAuth, AgentCredential, WorkerAuth, issue_agent_token, issue_worker_token, task_id_param,
    verify_worker_token,
};
pub(crate) use tokens::{
    agent_token_subject, authorize_agent, authorize_agent_token, invalid_agent_token,
};

use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use meatspace_store::token::{self, TokenHash};
use uuid::Uuid;

use crate::AppState;
use crate::http::error::ApiError;

/// Header carrying the development key (from the seed contract).
pub const DEV_KEY_HEADER: &str = "x-meatspace-dev-key";

const AGENT_PREFIX: &str = token::AGENT_PREFIX;
const WORKER_PREFIX: &str = "msw_";

/// A new credential (`<prefix><id>_<secret>`) for `id`, and the digest to
/// store: API keys, agent and worker tokens, invite codes.
pub fn issue_token(prefix: &str, id: Uuid) -> (String, TokenHash) {
    let secret = token::generate_for(prefix, id);
    let hash = TokenHash::of(&secret);
    (secret, hash)
}

fn bearer(headers: &HeaderMap) -> Result<&str, ApiError> {
    let value = headers.get(AUTHORIZATION).ok_or_else(|| {
        ApiError::Unauthorized("send the token as Authorization: Bearer <token>".into())
    })?;
    value
        .to_str()
        .ok()
        .and_then(|v| {
            // The scheme name is case-insensitive (RFC 9110, section 11.1).
            v.split_once(' ')
                .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
                .map(|(_, token)| token)
        })
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            ApiError::Unauthorized("the Authorization header must be Bearer <token>".into())
        })
}

/// The id a token claims to belong to.
fn token_subject(token: &str, prefix: &str) -> Option<Uuid> {
    let rest = token.strip_prefix(prefix)?;
    let (id, _secret) = rest.split_once('_')?;
    Uuid::try_parse(id).ok()
}

/// Who a verified credential belongs to: the unit that rate limits and
/// `Idempotency-Key` scopes are kept per.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Principal {
    /// The development key (the development principal; every client of it
    /// shares it).
    DevKey,
    /// An API key's principal (all of that principal's keys share it).
    Key(Uuid),
    /// The agent token of this task.
    Agent(Uuid),
    /// The token of this worker.
    Worker(Uuid),
}

/// What the credential of a request proves before the store is asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presented {
    /// No credential header.
    Nothing,
    /// A credential that verified against a digest held in memory.
    Verified(Principal),
    /// A credential whose digest is not in memory: telling needs a store read.
    Unknown,
    /// A credential that cannot be valid: wrong form, or it does not match
    /// the digest in memory.
    Wrong,
}

/// Judges the credential of a request (the `Authorization` bearer token,
/// else the development key header) from memory alone: no store read.
pub fn presented(state: &AppState, headers: &HeaderMap) -> Presented {
    if headers.get(AUTHORIZATION).is_some() {
        let Ok(token) = bearer(headers) else {
            return Presented::Wrong;
        };
        if let Some(id) = token_subject(token, KEY_PREFIX) {
            return match state.credentials.keys.cached(id) {
                Some(record) => match record.check(token, state.clock.now()) {
                    Ok(()) => Presented::Verified(Principal::Key(record.key.principal.id)),
                    Err(_) => Presented::Wrong,
                },
                None => Presented::Unknown,
            };
        }
        let (principal, hash) = if let Some(id) = token_subject(token, AGENT_PREFIX) {
            (Principal::Agent(id), state.agent_digests.cached(id))
        } else if let Some(id) = token_subject(token, WORKER_PREFIX) {
            (Principal::Worker(id), state.credentials.workers.cached(id))
        } else {
            return Presented::Wrong;
        };
        return match hash {
            Some(hash) if hash.verify(token) => Presented::Verified(principal),
            Some(_) => Presented::Wrong,
            None => Presented::Unknown,
        };
    }
    match headers.get(DEV_KEY_HEADER).map(|v| v.to_str()) {
        None => Presented::Nothing,
        Some(Ok(key)) if state.dev_key.enabled && state.dev_key.hash.verify(key) => {
            Presented::Verified(Principal::DevKey)
        }
        Some(_) => Presented::Wrong,
    }
}

/// The principal the request's credential proves, reading the store for a
/// digest not in memory (the caller has charged that read to the client's
/// address: see [`crate::http::rate_limit`]). `None` when it proves nothing.
pub async fn principal(
    state: &AppState,
    headers: &HeaderMap,
) -> Result<Option<Principal>, ApiError> {
    match presented(state, headers) {
        Presented::Verified(p) => Ok(Some(p)),
        Presented::Nothing | Presented::Wrong => Ok(None),
        Presented::Unknown => {
            let token = bearer(headers)?;
            if token.starts_with(KEY_PREFIX) {
                return Ok(verify_key(state, token)
                    .await
                    .ok()
                    .map(|caller| caller.as_principal()));
            }
            if let Some(id) = token_subject(token, AGENT_PREFIX) {
                let hash = state
                    .agent_digests
                    .digest(id, state.store.agent_token_hash(id))
                    .await?;
                Ok(hash
                    .is_some_and(|h| h.verify(token))
                    .then_some(Principal::Agent(id)))
            } else {
                Ok(verify_worker_token(state, token)
                    .await
                    .ok()
                    .map(Principal::Worker))
            }
        }
    }
}

/// The id a prefixed credential (`<prefix><id>_<secret>`) names, for
/// credentials other modules issue (invite codes, session cookies).
pub fn credential_subject(credential: &str, prefix: &str) -> Option<Uuid> {
    token_subject(credential, prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_name_their_subject_and_verify() {
        let id = Uuid::new_v4();
        let (token, hash) = issue_agent_token(id);
        assert_eq!(token_subject(&token, AGENT_PREFIX), Some(id));
        assert_eq!(token_subject(&token, WORKER_PREFIX), None);
        assert!(hash.verify(&token));
        assert_eq!(token_subject("mst_nonsense", AGENT_PREFIX), None);
    }
}
