//! API keys (`msk_<key id>_<secret>`), the development key, and the
//! [`Caller`] either proves.

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use meatspace_domain::identity::{
    ActedBy, AuditAction, DEVELOPMENT_PRINCIPAL, PrincipalKind, Scope, Scopes,
};
use meatspace_store::token::{self, TokenHash};
use meatspace_store::{KeyRefusal, NewAudit};
use uuid::Uuid;

use crate::AppState;
use crate::http::error::ApiError;
use crate::http::rate_limit::ClientAddress;

use super::{DEV_KEY_HEADER, Principal, bearer, issue_token, token_subject};

/// The configured development key, kept only as a digest, and whether it
/// is accepted at all.
#[derive(Clone, derive_more::Debug)]
pub struct DevKey {
    #[debug(skip)]
    pub(super) hash: TokenHash,
    pub(super) enabled: bool,
    /// When a refusal of the turned-off key was last written to the audit
    /// trail (ms since the epoch): at most one a minute, so that callers
    /// without any credential cannot grow the table.
    last_refusal_audited: std::sync::Arc<std::sync::atomic::AtomicI64>,
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

    /// Whether `key` is the development key and the key is on (digests
    /// compared in constant time).
    pub fn matches(&self, key: &str) -> bool {
        self.enabled && self.hash.verify(key)
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

    /// An audit entry of an action by this caller, from `address`.
    pub fn audit(
        &self,
        action: AuditAction,
        target: String,
        address: &ClientAddress,
        detail: Option<serde_json::Value>,
    ) -> NewAudit {
        NewAudit {
            at: self.at,
            principal_id: self.principal,
            action,
            target,
            address: Some(address.0.to_string()),
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

/// A caller at work: the server's state, the [`Caller`] and the client's
/// address, which the audit entry of each of its actions records. The
/// actions that routes and the console share take one of these.
#[derive(Debug, Clone)]
pub struct Actor {
    pub state: AppState,
    pub caller: Caller,
    pub address: ClientAddress,
}

impl Actor {
    /// An audit entry of an action by this caller, from its address.
    pub fn audit(
        &self,
        action: AuditAction,
        target: String,
        detail: Option<serde_json::Value>,
    ) -> NewAudit {
        self.caller.audit(action, target, &self.address, detail)
    }
}

impl FromRequestParts<AppState> for Actor {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let caller = Caller::from_request_parts(parts, state).await?;
        let Ok(address) = ClientAddress::from_request_parts(parts, state).await;
        Ok(Actor {
            state: state.clone(),
            caller,
            address,
        })
    }
}

/// An [`Actor`] whose key has the `operator` scope (403 otherwise): what
/// every route of the operator API takes.
#[derive(Debug, Clone)]
pub struct Operator(pub Actor);

impl FromRequestParts<AppState> for Operator {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let actor = Actor::from_request_parts(parts, state).await?;
        actor.caller.require(Scope::Operator)?;
        Ok(Operator(actor))
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
