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

use axum::extract::rejection::RawPathParamsRejection;
use axum::extract::{FromRequestParts, RawPathParams};
use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use chrono::{DateTime, Utc};
use meatspace_domain::identity::{
    ActedBy, AuditAction, DEVELOPMENT_PRINCIPAL, PrincipalKind, Scope, Scopes,
};
use meatspace_store::token::{self, TokenHash};
use meatspace_store::{KeyRefusal, NewAudit, StoreError};
use uuid::Uuid;

use crate::AppState;
use crate::error::ApiError;

/// Header carrying the development key (from the seed contract).
pub const DEV_KEY_HEADER: &str = "x-meatspace-dev-key";

const AGENT_PREFIX: &str = token::AGENT_PREFIX;
const WORKER_PREFIX: &str = "msw_";

/// The configured development key, kept only as a digest, and whether it
/// is accepted at all.
#[derive(Clone)]
pub struct DevKey {
    hash: TokenHash,
    enabled: bool,
    /// When a refusal of the turned-off key was last written to the audit
    /// trail (ms since the epoch): at most one a minute, so that callers
    /// without any credential cannot grow the table.
    last_refusal_audited: std::sync::Arc<std::sync::atomic::AtomicI64>,
}

impl std::fmt::Debug for DevKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DevKey(..)")
    }
}

impl DevKey {
    pub fn new(key: &str) -> Self {
        DevKey {
            hash: TokenHash::of(key),
            enabled: true,
            last_refusal_audited: Default::default(),
        }
    }

    /// The key as configured, turned off when `enabled` is false.
    pub fn with_enabled(self, enabled: bool) -> Self {
        DevKey { enabled, ..self }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// A fresh random key, for the embedded default when none is configured.
    pub fn generate() -> String {
        token::generate("msd_")
    }
}

/// The principal an API key or the development key proves: who creates
/// tasks, registers workers, makes invites and administers. Handlers ask
/// for the scope they need with [`Caller::require`].
#[derive(Debug, Clone)]
pub struct Caller {
    pub principal: Uuid,
    pub kind: PrincipalKind,
    pub scopes: Scopes,
    /// The key; `None` for the development key.
    pub key_id: Option<Uuid>,
    /// When the request was authenticated: the time of the audit entries
    /// it writes.
    pub at: chrono::DateTime<chrono::Utc>,
}

impl Caller {
    /// The development principal, as the development key proves it.
    pub fn development(at: chrono::DateTime<chrono::Utc>) -> Self {
        Caller {
            principal: DEVELOPMENT_PRINCIPAL,
            kind: PrincipalKind::Operator,
            scopes: Scopes::new(Scope::ALL),
            key_id: None,
            at,
        }
    }

    /// 403 unless the caller's key allows `scope`.
    pub fn require(&self, scope: Scope) -> Result<(), ApiError> {
        if self.scopes.allow(scope) {
            Ok(())
        } else {
            Err(ApiError::Forbidden(format!(
                "this API key lacks the {:?} scope; ask an operator for a key that has it",
                scope.as_str()
            )))
        }
    }

    pub fn is_operator(&self) -> bool {
        self.scopes.allow(Scope::Operator)
    }

    /// How the events of this caller's actions name it.
    pub fn acted_by(&self) -> ActedBy {
        match self.key_id {
            Some(key_id) => ActedBy::ApiKey {
                principal_id: self.principal,
                key_id,
            },
            None => ActedBy::DevelopmentKey,
        }
    }

    /// The unit of rate limits and idempotency scopes.
    pub fn as_principal(&self) -> Principal {
        match self.key_id {
            None => Principal::DevKey,
            Some(_) => Principal::Key(self.principal),
        }
    }

    /// An audit entry of an action by this caller.
    pub fn audit(
        &self,
        action: AuditAction,
        target: String,
        address: Option<String>,
        detail: Option<serde_json::Value>,
    ) -> NewAudit {
        NewAudit {
            at: self.at,
            principal_id: self.principal,
            action,
            target,
            address,
            detail,
        }
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        if parts.headers.get(AUTHORIZATION).is_some() {
            let token = bearer(&parts.headers)?;
            if token.starts_with(KEY_PREFIX) {
                return verify_key(state, token).await;
            }
            return Err(ApiError::Unauthorized(
                "this operation takes an API key (Authorization: Bearer msk_...) or the \
                 development key, not a task or worker token"
                    .into(),
            ));
        }
        let Some(presented) = parts.headers.get(DEV_KEY_HEADER) else {
            return Err(ApiError::Unauthorized(if state.dev_key.enabled {
                format!(
                    "send an API key as Authorization: Bearer msk_... or the development key \
                     in the {DEV_KEY_HEADER} header"
                )
            } else {
                "send an API key as Authorization: Bearer msk_... (ask an operator: \
                 `meatspace key create`)"
                    .to_owned()
            }));
        };
        if !state.dev_key.enabled {
            audit_refused_dev_key(state, parts).await;
            return Err(ApiError::DevKeyDisabled);
        }
        match presented.to_str() {
            Ok(key) if state.dev_key.hash.verify(key) => Ok(Caller::development(state.clock.now())),
            _ => Err(ApiError::Unauthorized(
                "the development key is not valid".into(),
            )),
        }
    }
}

/// A [`Caller`] whose key has the `operator` scope (403 otherwise): what
/// every route of the operator API takes.
#[derive(Debug, Clone)]
pub struct Operator(pub Caller);

impl FromRequestParts<AppState> for Operator {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let caller = Caller::from_request_parts(parts, state).await?;
        caller.require(Scope::Operator)?;
        Ok(Operator(caller))
    }
}

/// Records, at most once a minute, that the turned-off development key was
/// sent (an operator wants to know who still uses it).
async fn audit_refused_dev_key(state: &AppState, parts: &Parts) {
    use std::sync::atomic::Ordering;
    let now = state.clock.now();
    let last = state.dev_key.last_refusal_audited.load(Ordering::Relaxed);
    if now.timestamp_millis() - last < 60_000
        || state
            .dev_key
            .last_refusal_audited
            .compare_exchange(
                last,
                now.timestamp_millis(),
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_err()
    {
        return;
    }
    let entry = NewAudit {
        at: now,
        principal_id: DEVELOPMENT_PRINCIPAL,
        action: AuditAction::DevKeyRefused,
        target: format!("route:{}", parts.uri.path()),
        address: address_of(parts),
        detail: None,
    };
    if let Err(e) = state.store.append_audit(entry).await {
        tracing::warn!(error = %e, "cannot record a refused development key");
    }
}

/// The client's address, as the audit trail records it.
pub fn address_of(parts: &Parts) -> Option<String> {
    parts
        .extensions
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|axum::extract::ConnectInfo(addr)| addr.ip().to_string())
}

/// Prefix of API keys.
pub const KEY_PREFIX: &str = meatspace_store::identity::KEY_PREFIX;

/// A new API key for `id`, and the digest to store.
pub fn issue_key(id: Uuid) -> (String, TokenHash) {
    issue_token(KEY_PREFIX, id)
}

/// The caller an API key proves, or 401 saying why not. Answered from
/// memory when the key was read before and has not changed since.
pub async fn verify_key(state: &AppState, token: &str) -> Result<Caller, ApiError> {
    let wrong = || ApiError::Unauthorized("the API key is not valid".into());
    let id = token_subject(token, KEY_PREFIX).ok_or_else(wrong)?;
    let record = state
        .credentials
        .keys
        .digest(id, state.store.api_key(id))
        .await?
        .ok_or_else(wrong)?;
    let now = state.clock.now();
    match record.check(token, now) {
        Ok(()) => {}
        Err(KeyRefusal::Wrong) => return Err(wrong()),
        Err(KeyRefusal::Revoked) => {
            return Err(ApiError::Unauthorized(
                "the API key was revoked; ask an operator for a new one".into(),
            ));
        }
        Err(KeyRefusal::Expired) => {
            return Err(ApiError::Unauthorized(
                "the API key expired; ask an operator for a new one".into(),
            ));
        }
    }
    state.credentials.key_use.record(id, now);
    Ok(Caller {
        principal: record.key.principal.id,
        kind: record.key.principal.kind,
        scopes: record.key.scopes.clone(),
        key_id: Some(id),
        at: now,
    })
}

/// Whether `caller` may act on the task `task_id` without its token: its
/// principal owns the task, or it is an operator. Another principal's task
/// (or none) is 404, so task ids cannot be probed.
pub async fn authorize_owner(
    state: &AppState,
    caller: &Caller,
    task_id: Uuid,
) -> Result<ActedBy, ApiError> {
    caller.require(Scope::Tasks)?;
    if caller.is_operator() {
        return Ok(caller.acted_by());
    }
    let owner = state
        .credentials
        .owners
        .digest(task_id, state.store.task_owner(task_id))
        .await?;
    if owner == Some(caller.principal) {
        Ok(caller.acted_by())
    } else {
        Err(ApiError::task_not_found())
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
/// `{task_id}` path parameter; holds that task id. Runs before any body is
/// read, so an unauthenticated request never learns about body validation.
#[derive(Debug, Clone, Copy)]
pub struct AgentAuth(pub Uuid, pub ActedBy);

impl FromRequestParts<AppState> for AgentAuth {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        // No credential is a 401 whatever the path says.
        bearer(&parts.headers)?;
        let task_id = task_id_param(parts, state).await?;
        let by = authorize_agent(state, &parts.headers, task_id).await?;
        Ok(AgentAuth(task_id, by))
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

/// Token digests already read from the store, by the id of the task or
/// worker a token names, so that a client's requests do not each read its
/// digest again: workers' in [`Credentials::workers`]
/// ([`DigestCache::for_workers`]), agents' in [`AppState`]'s
/// `agent_digests` ([`DigestCache::for_agents`]). Only digests that exist are kept (read
/// from the store, or [remembered](DigestCache::remember) once the create
/// that stored them committed): an unknown id is read every time, so a
/// token is never refused on the word of the cache.
///
/// Why a cached digest gives the answer the store would give:
///
/// - **Worker tokens.** A worker is never removed, and its digest changes
///   only when an operator rotates its token; that rotation, like a
///   suspension, is announced and drops the entry (below). Otherwise kept
///   for good.
/// - **Agent tokens.** A task's digest is written once, when the task is
///   created, and never updated. Retention's purge deletes the task but
///   keeps the digest as a tombstone (`purged_tasks`), and
///   [`TaskReads::agent_token_hash`](meatspace_store::Store::agent_token_hash)
///   reads the tombstone too, so a purge does not change its answer:
///   the token still authenticates, and the command or read it authorizes
///   still goes to the store, which answers that the task is gone (404),
///   exactly as without the cache. The one change that does alter the
///   store's answer is forgetting the tombstone
///   ([`Store::forget_purged_before`](meatspace_store::Store::forget_purged_before),
///   30 days after the purge by default), after which the token is unknown
///   (401). So an agent digest is kept at most [`AGENT_DIGEST_MAX_AGE`]:
///   a token of a forgotten tombstone is told 404 rather than 401 for at
///   most that long, as a request that read the digest just before the
///   tombstone went would be.
///
/// A worker's token stops working when an operator suspends the worker or
/// rotates its token: the store announces it ([`Change::Credential`]) and
/// every process drops the entry ([`Credentials::forget`]); a read that
/// raced the revocation is not kept (the cache's generation moved).
///
/// [`Change::Credential`]: meatspace_store::Change::Credential
#[derive(Debug, Clone)]
pub struct DigestCache<V = TokenHash> {
    known: std::sync::Arc<std::sync::Mutex<Entries<V>>>,
    /// How long an entry is trusted after it was read; `None`: for good.
    max_age: Option<std::time::Duration>,
}

#[derive(Debug)]
struct Entries<V> {
    map: std::collections::HashMap<Uuid, Known<V>>,
    /// Bumped by every [`DigestCache::forget`] and [`DigestCache::clear`]:
    /// a read that started before it may have seen the credential as it
    /// was before the revocation, so its answer is not kept.
    generation: u64,
}

impl<V> Default for Entries<V> {
    fn default() -> Self {
        Entries {
            map: Default::default(),
            generation: 0,
        }
    }
}

#[derive(Debug, Clone)]
struct Known<V> {
    hash: V,
    read_at: std::time::Instant,
}

/// Digests kept at most per cache; when full, the map starts over.
const DIGESTS: usize = 100_000;

/// Longest an agent token digest is used after it was read (see
/// [`DigestCache`]).
pub const AGENT_DIGEST_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(60);

impl DigestCache {
    /// For worker tokens: kept until the worker's credential changes
    /// ([`Credentials::forget`]).
    pub fn for_workers() -> Self {
        Self::new(None)
    }

    /// For agent tokens: kept at most [`AGENT_DIGEST_MAX_AGE`].
    pub fn for_agents() -> Self {
        Self::new(Some(AGENT_DIGEST_MAX_AGE))
    }
}

impl<V: Clone> DigestCache<V> {
    fn new(max_age: Option<std::time::Duration>) -> Self {
        DigestCache {
            known: Default::default(),
            max_age,
        }
    }

    /// Kept until forgotten.
    pub fn for_good() -> Self {
        Self::new(None)
    }

    /// The digest of `id`'s token: the kept one, or what `read` (the
    /// store's lookup) answers, kept when it exists and nothing was
    /// forgotten while it was read.
    pub async fn digest(
        &self,
        id: Uuid,
        read: impl std::future::Future<Output = Result<Option<V>, StoreError>>,
    ) -> Result<Option<V>, StoreError> {
        if let Some(hash) = self.get(id) {
            return Ok(Some(hash));
        }
        let read_at = std::time::Instant::now();
        let generation = self.lock().generation;
        let hash = read.await?;
        if let Some(hash) = &hash {
            self.insert(id, hash.clone(), read_at, Some(generation));
        }
        Ok(hash)
    }

    /// Keeps the digest of a token the caller has just stored (committed),
    /// as if it had been read now.
    pub fn remember(&self, id: Uuid, hash: V) {
        self.insert(id, hash, std::time::Instant::now(), None);
    }

    /// The kept digest of `id`'s token, without reading the store.
    pub fn cached(&self, id: Uuid) -> Option<V> {
        self.get(id)
    }

    /// Drops what is kept of `id`: its credential changed.
    pub fn forget(&self, id: Uuid) {
        let mut known = self.lock();
        known.map.remove(&id);
        known.generation += 1;
    }

    /// Drops everything: changes may have been missed.
    pub fn clear(&self) {
        let mut known = self.lock();
        known.map.clear();
        known.generation += 1;
    }

    fn get(&self, id: Uuid) -> Option<V> {
        let known = self.lock();
        let entry = known.map.get(&id)?;
        let fresh = self
            .max_age
            .is_none_or(|max_age| entry.read_at.elapsed() < max_age);
        fresh.then(|| entry.hash.clone())
    }

    fn insert(&self, id: Uuid, hash: V, read_at: std::time::Instant, generation: Option<u64>) {
        let mut known = self.lock();
        if generation.is_some_and(|g| g != known.generation) {
            return;
        }
        if known.map.len() >= DIGESTS {
            known.map.clear();
        }
        known.map.insert(id, Known { hash, read_at });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries<V>> {
        self.known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// What the server keeps in memory about credentials that can lose their
/// power: API keys, worker tokens, and which principal owns a task (which
/// never changes, so it is only bounded). The feed's hub calls
/// [`Credentials::forget`] for every [`Change::Credential`] it hears from
/// the store, from any replica, and [`Credentials::clear`] whenever it may
/// have missed some (a gap, a new subscription): a revocation reaches
/// every replica's memory as fast as the change stream does.
///
/// [`Change::Credential`]: meatspace_store::Change::Credential
#[derive(Debug, Clone)]
pub struct Credentials {
    pub keys: DigestCache<meatspace_store::KeyRecord>,
    pub workers: DigestCache,
    pub owners: DigestCache<Uuid>,
    /// When each key was last used, written to the store about once a
    /// minute ([`KeyUse::flush`]).
    pub key_use: KeyUse,
}

impl Default for Credentials {
    fn default() -> Self {
        Credentials {
            keys: DigestCache::for_good(),
            workers: DigestCache::for_workers(),
            owners: DigestCache::for_good(),
            key_use: KeyUse::default(),
        }
    }
}

impl Credentials {
    pub fn forget(&self, id: Uuid) {
        self.keys.forget(id);
        self.workers.forget(id);
    }

    pub fn clear(&self) {
        self.keys.clear();
        self.workers.clear();
    }
}

/// Last use of each key since the previous flush.
#[derive(Debug, Clone, Default)]
pub struct KeyUse(std::sync::Arc<std::sync::Mutex<std::collections::HashMap<Uuid, DateTime<Utc>>>>);

/// Keys whose use is remembered between flushes at most; more are dropped
/// until the next flush (`last_used_at` is coarse by design).
const KEY_USES: usize = 10_000;

impl KeyUse {
    pub fn record(&self, key: Uuid, at: DateTime<Utc>) {
        let mut used = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if used.len() < KEY_USES || used.contains_key(&key) {
            used.insert(key, at);
        }
    }

    /// Writes what was recorded since the last flush.
    pub async fn flush(&self, store: &dyn meatspace_store::Store) -> Result<(), StoreError> {
        let used: Vec<(Uuid, DateTime<Utc>)> = std::mem::take(
            &mut *self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
        .into_iter()
        .collect();
        if used.is_empty() {
            return Ok(());
        }
        store.touch_api_keys(&used).await
    }
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
/// address: see [`crate::rate_limit`]). `None` when it proves nothing.
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

    /// Counts the store reads a cache makes.
    async fn digest_counting(
        cache: &DigestCache,
        id: Uuid,
        stored: Option<&TokenHash>,
        reads: &std::sync::atomic::AtomicUsize,
    ) -> Option<TokenHash> {
        let read = async {
            reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(stored.cloned())
        };
        cache.digest(id, read).await.expect("no store error")
    }

    #[tokio::test]
    async fn a_digest_is_read_once_and_an_unknown_id_every_time() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let (id, hash) = (Uuid::new_v4(), TokenHash::of("mst_x"));
        for cache in [DigestCache::for_workers(), DigestCache::for_agents()] {
            let reads = AtomicUsize::new(0);
            for _ in 0..3 {
                let got = digest_counting(&cache, id, Some(&hash), &reads).await;
                assert_eq!(got, Some(hash.clone()));
            }
            assert_eq!(reads.load(Ordering::SeqCst), 1);

            let (unknown, reads) = (Uuid::new_v4(), AtomicUsize::new(0));
            for _ in 0..3 {
                assert_eq!(digest_counting(&cache, unknown, None, &reads).await, None);
            }
            assert_eq!(reads.load(Ordering::SeqCst), 3, "an unknown id was cached");
        }
    }

    #[tokio::test]
    async fn an_agent_digest_older_than_its_limit_is_read_again() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        // A limit of zero: every entry is already too old.
        let cache = DigestCache::new(Some(std::time::Duration::ZERO));
        let (id, hash) = (Uuid::new_v4(), TokenHash::of("mst_x"));
        let reads = AtomicUsize::new(0);
        for _ in 0..3 {
            digest_counting(&cache, id, Some(&hash), &reads).await;
        }
        assert_eq!(reads.load(Ordering::SeqCst), 3);
        // The tombstone is forgotten: the store no longer knows the token.
        assert_eq!(digest_counting(&cache, id, None, &reads).await, None);
    }
}
