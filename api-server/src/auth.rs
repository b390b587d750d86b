//! Credentials: the development key that creates tasks and registers
//! workers, task-scoped agent tokens, and worker tokens.
//!
//! Tokens embed the id of what they belong to (`mst_<task id>_<secret>`,
//! `msw_<worker id>_<secret>`), so the server looks up one digest by id and
//! compares it in constant time; it never searches by secret. That also
//! separates a wrong token (401) from a valid token of another task (404,
//! so task ids cannot be probed).

use axum::extract::rejection::RawPathParamsRejection;
use axum::extract::{FromRequestParts, RawPathParams};
use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use meatspace_core::token::{self, TokenHash};
use uuid::Uuid;

use crate::AppState;
use crate::error::ApiError;

/// Header carrying the development key (from the seed contract).
pub const DEV_KEY_HEADER: &str = "x-meatspace-dev-key";

const AGENT_PREFIX: &str = token::AGENT_PREFIX;
const WORKER_PREFIX: &str = "msw_";

/// The configured development key, kept only as a digest.
#[derive(Clone)]
pub struct DevKey(TokenHash);

impl std::fmt::Debug for DevKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DevKey(..)")
    }
}

impl DevKey {
    pub fn new(key: &str) -> Self {
        DevKey(TokenHash::of(key))
    }

    /// A fresh random key, for the embedded default when none is configured.
    pub fn generate() -> String {
        token::generate("msd_")
    }
}

/// Proof that the request carried the development key.
#[derive(Debug, Clone, Copy)]
pub struct DevKeyAuth;

impl FromRequestParts<AppState> for DevKeyAuth {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let presented = parts
            .headers
            .get(DEV_KEY_HEADER)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| {
                ApiError::Unauthorized(format!(
                    "send the development key in the {DEV_KEY_HEADER} header"
                ))
            })?;
        if state.dev_key.0.verify(presented) {
            Ok(DevKeyAuth)
        } else {
            Err(ApiError::Unauthorized(
                "the development key is not valid".into(),
            ))
        }
    }
}

/// A new token for `id`, and the digest to store.
pub fn issue_token(prefix: &str, id: Uuid) -> (String, TokenHash) {
    let secret = token::generate_for(prefix, id);
    let hash = TokenHash::of(&secret);
    (secret, hash)
}

pub fn issue_agent_token(task_id: Uuid) -> (String, TokenHash) {
    issue_token(AGENT_PREFIX, task_id)
}

pub fn issue_worker_token(worker_id: Uuid) -> (String, TokenHash) {
    issue_token(WORKER_PREFIX, worker_id)
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

/// The answer to an agent token that is not valid.
pub(crate) fn invalid_agent_token() -> ApiError {
    ApiError::Unauthorized("the agent token is not valid".into())
}

/// The task id an agent token claims to belong to.
pub(crate) fn agent_token_subject(token: &str) -> Option<Uuid> {
    token_subject(token, AGENT_PREFIX)
}

/// Checks that the request carries the agent token of `task_id`.
pub(crate) async fn authorize_agent(
    state: &AppState,
    headers: &HeaderMap,
    task_id: Uuid,
) -> Result<(), ApiError> {
    authorize_agent_token(state, bearer(headers)?, task_id).await
}

/// Checks that `token` is the agent token of `task_id`.
pub(crate) async fn authorize_agent_token(
    state: &AppState,
    token: &str,
    task_id: Uuid,
) -> Result<(), ApiError> {
    let wrong = invalid_agent_token;
    let subject = token_subject(token, AGENT_PREFIX).ok_or_else(wrong)?;
    let hash = state
        .store
        .agent_token_hash(subject)
        .await?
        .ok_or_else(wrong)?;
    if !hash.verify(token) {
        return Err(wrong());
    }
    if subject != task_id {
        // A genuine token, but of another task.
        return Err(ApiError::task_not_found());
    }
    Ok(())
}

/// Proof that the request carries the agent token of the task named by the
/// `{task_id}` path parameter; holds that task id. Runs before any body is
/// read, so an unauthenticated request never learns about body validation.
#[derive(Debug, Clone, Copy)]
pub struct AgentAuth(pub Uuid);

impl FromRequestParts<AppState> for AgentAuth {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        // No credential is a 401 whatever the path says.
        bearer(&parts.headers)?;
        let task_id = task_id_param(parts, state).await?;
        authorize_agent(state, &parts.headers, task_id).await?;
        Ok(AgentAuth(task_id))
    }
}

/// An agent's bearer token and the `{task_id}` it names in the path,
/// checked for their form only: the handler checks the token itself
/// (the feed reads the digest with the page, see
/// [`crate::routes::agent_event_feed`]). No credential is a 401 and a
/// malformed task id a 404, as with [`AgentAuth`].
#[derive(Debug, Clone)]
pub struct AgentCredential {
    pub task_id: Uuid,
    authorization: axum::http::HeaderValue,
}

impl AgentCredential {
    /// The bearer token.
    pub fn token(&self) -> &str {
        // Checked in `from_request_parts`.
        self.authorization
            .to_str()
            .ok()
            .and_then(|v| v.split_once(' '))
            .map_or("", |(_, token)| token.trim())
    }
}

impl FromRequestParts<AppState> for AgentCredential {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        bearer(&parts.headers)?;
        let task_id = task_id_param(parts, state).await?;
        let authorization = parts.headers.get(AUTHORIZATION).cloned().ok_or_else(|| {
            ApiError::Unauthorized("send the token as Authorization: Bearer <token>".into())
        })?;
        Ok(AgentCredential {
            task_id,
            authorization,
        })
    }
}

/// The `{task_id}` path parameter; a malformed id names no task (404).
pub async fn task_id_param(parts: &mut Parts, state: &AppState) -> Result<Uuid, ApiError> {
    let params = match RawPathParams::from_request_parts(parts, state).await {
        Ok(params) => params,
        // Percent-encoded bytes that are not UTF-8 cannot spell a task id.
        Err(RawPathParamsRejection::InvalidUtf8InPathParam(_)) => {
            return Err(ApiError::task_not_found());
        }
        Err(e) => return Err(ApiError::Internal(anyhow::anyhow!(e.body_text()))),
    };
    params
        .iter()
        .find(|(name, _)| *name == "task_id")
        .and_then(|(_, value)| Uuid::try_parse(value).ok())
        .ok_or_else(ApiError::task_not_found)
}

/// An authenticated worker.
#[derive(Debug, Clone, Copy)]
pub struct WorkerAuth(pub Uuid);

impl FromRequestParts<AppState> for WorkerAuth {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let token = bearer(&parts.headers)?;
        verify_worker_token(state, token).await.map(WorkerAuth)
    }
}

/// The worker a worker token belongs to, or 401 (also used by the web
/// app's sign-in, which exchanges a token for a session).
pub async fn verify_worker_token(state: &AppState, token: &str) -> Result<Uuid, ApiError> {
    let wrong = || ApiError::Unauthorized("the worker token is not valid".into());
    let id = token_subject(token, WORKER_PREFIX).ok_or_else(wrong)?;
    let hash = match state.worker_digests.get(id) {
        Some(hash) => hash,
        None => {
            let hash = state.store.worker_token_hash(id).await?.ok_or_else(wrong)?;
            state.worker_digests.insert(id, hash.clone());
            hash
        }
    };
    if hash.verify(token) {
        Ok(id)
    } else {
        Err(wrong())
    }
}

/// Worker token digests already read from the store, by worker id, so that
/// a worker's requests do not each read the digest again.
///
/// Sound because a worker's digest never changes and a worker is never
/// removed: the store has no statement that updates or deletes a worker.
/// Only digests that exist are kept (an unknown worker is read every
/// time). Whoever adds a way to revoke a worker token must drop the entry
/// here (in every process) before the revocation is acknowledged.
#[derive(Debug, Clone, Default)]
pub struct WorkerDigests {
    known: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<Uuid, TokenHash>>>,
}

/// Digests kept at most; when full, the map starts over.
const WORKER_DIGESTS: usize = 100_000;

impl WorkerDigests {
    fn get(&self, id: Uuid) -> Option<TokenHash> {
        self.known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&id)
            .cloned()
    }

    fn insert(&self, id: Uuid, hash: TokenHash) {
        let mut known = self
            .known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if known.len() >= WORKER_DIGESTS {
            known.clear();
        }
        known.insert(id, hash);
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
