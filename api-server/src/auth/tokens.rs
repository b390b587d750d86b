//! Task-scoped agent tokens and worker tokens: issuing them, and the
//! extractors that check them.

use axum::extract::rejection::RawPathParamsRejection;
use axum::extract::{FromRequestParts, RawPathParams};
use axum::http::HeaderMap;
use axum::http::request::Parts;
use meatspace_domain::identity::ActedBy;
use meatspace_store::token::TokenHash;
use uuid::Uuid;

use crate::AppState;
use crate::http::error::ApiError;

use super::keys::{KEY_PREFIX, authorize_owner, verify_key};
use super::{AGENT_PREFIX, WORKER_PREFIX, bearer, issue_token, token_subject};

pub fn issue_agent_token(task_id: Uuid) -> (String, TokenHash) {
    issue_token(AGENT_PREFIX, task_id)
}

pub fn issue_worker_token(worker_id: Uuid) -> (String, TokenHash) {
    issue_token(WORKER_PREFIX, worker_id)
}

/// The answer to an agent token that is not valid.
pub(crate) fn invalid_agent_token() -> ApiError {
    ApiError::Unauthorized("the agent token is not valid".into())
}

/// The task id an agent token claims to belong to.
pub(crate) fn agent_token_subject(token: &str) -> Option<Uuid> {
    token_subject(token, AGENT_PREFIX)
}

/// Checks that the request carries the agent token of `task_id`, or an
/// API key that may act on it ([`authorize_owner`]).
pub(crate) async fn authorize_agent(
    state: &AppState,
    headers: &HeaderMap,
    task_id: Uuid,
) -> Result<ActedBy, ApiError> {
    authorize_agent_token(state, bearer(headers)?, task_id).await
}

/// Checks that `token` is the agent token of `task_id`, or an API key
/// that may act on it ([`authorize_owner`]).
pub(crate) async fn authorize_agent_token(
    state: &AppState,
    token: &str,
    task_id: Uuid,
) -> Result<ActedBy, ApiError> {
    if token.starts_with(KEY_PREFIX) {
        let caller = verify_key(state, token).await?;
        return authorize_owner(state, &caller, task_id).await;
    }
    let wrong = invalid_agent_token;
    let subject = token_subject(token, AGENT_PREFIX).ok_or_else(wrong)?;
    let hash = state
        .agent_digests
        .digest(subject, state.store.agent_token_hash(subject))
        .await?
        .ok_or_else(wrong)?;
    if !hash.verify(token) {
        return Err(wrong());
    }
    if subject != task_id {
        // A genuine token, but of another task.
        return Err(ApiError::task_not_found());
    }
    Ok(ActedBy::AgentToken)
}

/// Proof that the request carries the agent token of the task named by the
/// `{task_id}` path parameter (an [`AgentCredential`], checked); holds that
/// task id. Runs before any body is read, so an unauthenticated request
/// never learns about body validation.
#[derive(Debug, Clone, Copy)]
pub struct AgentAuth(pub Uuid, pub ActedBy);

impl FromRequestParts<AppState> for AgentAuth {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let credential = AgentCredential::from_request_parts(parts, state).await?;
        let task_id = credential.task_id;
        let by = authorize_agent_token(state, credential.token(), task_id).await?;
        Ok(AgentAuth(task_id, by))
    }
}

/// An agent's bearer token and the `{task_id}` it names in the path,
/// checked for their form only: the handler checks the token itself
/// (the feed reads the digest with the page, see
/// [`crate::routes::events::agent_event_feed`]). No credential is a 401 and a
/// malformed task id a 404, as with [`AgentAuth`].
#[derive(Debug, Clone)]
pub struct AgentCredential {
    pub task_id: Uuid,
    token: String,
}

impl AgentCredential {
    /// The bearer token.
    pub fn token(&self) -> &str {
        &self.token
    }
}

impl FromRequestParts<AppState> for AgentCredential {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        // No credential is a 401 whatever the path says.
        let token = bearer(&parts.headers)?.to_owned();
        let task_id = task_id_param(parts, state).await?;
        Ok(AgentCredential { task_id, token })
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
    let wrong = || {
        ApiError::Unauthorized("the worker token is not valid (or its worker is suspended)".into())
    };
    let id = token_subject(token, WORKER_PREFIX).ok_or_else(wrong)?;
    let hash = state
        .credentials
        .workers
        .digest(id, state.store.worker_token_hash(id))
        .await?
        .ok_or_else(wrong)?;
    if hash.verify(token) {
        Ok(id)
    } else {
        Err(wrong())
    }
}
