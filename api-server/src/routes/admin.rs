//! The operator API: API keys (create, list, rotate, revoke), workers
//! (list, suspend, reinstate, rotate a token), invites (list, revoke) and
//! the audit trail. Every route takes a key with the `operator` scope (or
//! the development key, when enabled); every change writes its audit
//! entry in the same transaction.

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, TimeDelta, Utc};
use meatspace_api_types as api;
use meatspace_domain::Command;
use meatspace_domain::identity::{AuditAction, PrincipalKind, PrincipalRef, Scopes};
use meatspace_store::{ApiKey, AuditEntry, AuditFilter, Invite, NewApiKey, Worker};
use serde::Deserialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use super::{checked_text, decode_id_cursor, page_limit};
use crate::AppState;
use crate::auth::{Caller, Operator, issue_key, issue_worker_token};
use crate::error::ApiError;
use crate::error::responses::{AdminActionErrors, AdminListErrors};
use crate::extract::{Json, Path, Query};
use crate::rate_limit::ClientAddress;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_key, list_keys))
        .routes(routes!(get_key))
        .routes(routes!(rotate_key))
        .routes(routes!(revoke_key))
        .routes(routes!(suspend_worker))
        .routes(routes!(reinstate_worker))
        .routes(routes!(rotate_worker_token))
        .routes(routes!(revoke_invite))
        .routes(routes!(list_audit))
}

/// Longest name of a key or principal, in characters.
const MAX_NAME_CHARS: usize = 200;
/// Default grace period of a rotated secret: a day.
pub const DEFAULT_ROTATION_GRACE_SECONDS: u64 = 86_400;
/// Longest grace period: a week.
pub const MAX_ROTATION_GRACE_SECONDS: u64 = 7 * 86_400;

fn no_such(what: &str) -> ApiError {
    ApiError::NotFound(format!("no such {what}"))
}

/// A stored key as operators see it.
pub(crate) fn key_view(k: ApiKey) -> api::Key {
    {
        api::Key {
            id: k.id,
            name: k.name,
            principal: k.principal,
            scopes: k.scopes,
            created_at: k.created_at,
            expires_at: k.expires_at,
            last_used_at: k.last_used_at,
            revoked_at: k.revoked_at,
            rotated_at: k.rotated_at,
            previous_valid_until: k.previous_valid_until,
        }
    }
}

/// Creates an API key, for a new principal or another key of an existing one.
#[utoipa::path(post, path = "/api/v1/keys", tag = "operator",
    request_body = api::CreateKey,
    security(("api_key" = ["operator"]), ("dev_key" = [])),
    responses((status = 201, body = api::KeySecret), AdminActionErrors))]
async fn create_key(
    State(state): State<AppState>,
    Operator(caller): Operator,
    address: ClientAddress,
    Json(req): Json<api::CreateKey>,
) -> Result<Response, ApiError> {
    let name = checked_text("name", &req.name, MAX_NAME_CHARS)?;
    let now = state.clock.now();
    if req.expires_at.is_some_and(|at| at <= now) {
        return Err(ApiError::invalid("expires_at must be in the future"));
    }
    let (principal, new_principal) = match req.principal_id {
        Some(id) => (
            state
                .store
                .principal(id)
                .await?
                .ok_or_else(|| ApiError::invalid("principal_id names no operator or agent"))?,
            false,
        ),
        None => (
            PrincipalRef {
                id: Uuid::new_v4(),
                kind: match req.kind.unwrap_or(PrincipalKind::Agent) {
                    k @ (PrincipalKind::Agent | PrincipalKind::Operator) => k,
                    _ => return Err(ApiError::invalid("kind must be agent or operator")),
                },
                name: name.clone(),
            },
            true,
        ),
    };
    let scopes = match req.scopes {
        Some(s) if s.is_empty() => return Err(ApiError::invalid("scopes must not be empty")),
        Some(s) => Scopes::new(s),
        None => Scopes::default_for(principal.kind),
    };
    let id = Uuid::new_v4();
    let (secret, digest) = issue_key(id);
    let new = NewApiKey {
        id,
        principal,
        new_principal,
        name,
        scopes,
        digest,
        expires_at: req.expires_at,
        created_at: now,
    };
    let audit = caller.audit(
        AuditAction::KeyCreated,
        format!("key:{id}"),
        Some(address.0.to_string()),
        Some(serde_json::json!({ "principal_id": new.principal.id, "scopes": new.scopes })),
    );
    let key = state.store.create_api_key(new, audit).await?;
    Ok((
        StatusCode::CREATED,
        [(header::CACHE_CONTROL, "no-store")],
        axum::Json(api::KeySecret {
            key: key_view(key),
            secret,
        }),
    )
        .into_response())
}

/// `limit` and `cursor` of an operator's listing.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PageQuery {
    /// Largest page (1-200, default 50).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

impl PageQuery {
    fn parts(&self) -> Result<(Option<Uuid>, u32), ApiError> {
        let after = self.cursor.as_deref().map(decode_id_cursor).transpose()?;
        Ok((after, page_limit(self.limit, 50, 200)?))
    }
}

/// The cursor of a page of `items` read with one more than `limit`.
fn page<T>(mut items: Vec<T>, limit: u32, id: impl Fn(&T) -> Uuid) -> (Vec<T>, Option<String>) {
    let more = items.len() > limit as usize;
    items.truncate(limit as usize);
    let next = more
        .then(|| items.last().map(|i| id(i).to_string()))
        .flatten();
    (items, next)
}

/// Every API key, revoked ones included, ordered by id.
#[utoipa::path(get, path = "/api/v1/keys", tag = "operator", params(PageQuery),
    security(("api_key" = ["operator"]), ("dev_key" = [])),
    responses((status = 200, body = api::KeyPage), AdminListErrors))]
async fn list_keys(
    State(state): State<AppState>,
    _: Operator,
    Query(q): Query<PageQuery>,
) -> Result<axum::Json<api::KeyPage>, ApiError> {
    let (after, limit) = q.parts()?;
    let keys = state.store.api_keys(after, limit + 1).await?;
    let (keys, next_cursor) = page(keys, limit, |k| k.id);
    Ok(axum::Json(api::KeyPage {
        keys: keys.into_iter().map(key_view).collect(),
        next_cursor,
    }))
}

/// One API key.
#[utoipa::path(get, path = "/api/v1/keys/{key_id}", tag = "operator",
    params(("key_id" = Uuid, Path)),
    security(("api_key" = ["operator"]), ("dev_key" = [])),
    responses((status = 200, body = api::Key), AdminActionErrors))]
async fn get_key(
    State(state): State<AppState>,
    _: Operator,
    Path(id): Path<Uuid>,
) -> Result<axum::Json<api::Key>, ApiError> {
    let key = state
        .store
        .api_key(id)
        .await?
        .ok_or_else(|| no_such("key"))?;
    Ok(axum::Json(key_view(key.key)))
}

/// Gives a key a new secret. The current one keeps working until
/// `previous_valid_until` (a grace period, one day by default), so its
/// users can switch without an outage.
#[utoipa::path(post, path = "/api/v1/keys/{key_id}/rotate", tag = "operator",
    params(("key_id" = Uuid, Path)),
    request_body(content = Option<api::RotateKey>, description = "optional grace period"),
    security(("api_key" = ["operator"]), ("dev_key" = [])),
    responses((status = 200, body = api::KeySecret), AdminActionErrors))]
async fn rotate_key(
    State(state): State<AppState>,
    Operator(caller): Operator,
    address: ClientAddress,
    Path(id): Path<Uuid>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let req = super::invites::optional_json::<api::RotateKey>(&headers, &body)?;
    let grace = req.grace_seconds.unwrap_or(DEFAULT_ROTATION_GRACE_SECONDS);
    if grace > MAX_ROTATION_GRACE_SECONDS {
        return Err(ApiError::invalid(format!(
            "grace_seconds must be at most {MAX_ROTATION_GRACE_SECONDS}"
        )));
    }
    let (secret, digest) = issue_key(id);
    let audit = caller.audit(
        AuditAction::KeyRotated,
        format!("key:{id}"),
        Some(address.0.to_string()),
        Some(serde_json::json!({ "grace_seconds": grace })),
    );
    let until = audit.at + TimeDelta::seconds(i64::try_from(grace).unwrap_or(0));
    let key = state
        .store
        .rotate_api_key(id, digest, until, audit)
        .await?
        .ok_or_else(|| no_such("key"))?;
    if key.revoked_at.is_some() {
        return Err(ApiError::Conflict {
            slug: "key-revoked",
            detail: "a revoked key cannot be rotated; create a new one".into(),
            task_state: None,
        });
    }
    state.credentials.keys.forget(id);
    Ok((
        [(header::CACHE_CONTROL, "no-store")],
        axum::Json(api::KeySecret {
            key: key_view(key),
            secret,
        }),
    )
        .into_response())
}

/// Revokes a key at once on every replica. Its principal's tasks keep
/// running and stay readable with their task tokens, unless `cancel_tasks`.
#[utoipa::path(post, path = "/api/v1/keys/{key_id}/revoke", tag = "operator",
    params(("key_id" = Uuid, Path)),
    request_body(content = Option<api::RevokeKey>, description = "optional"),
    security(("api_key" = ["operator"]), ("dev_key" = [])),
    responses((status = 200, body = api::RevokedKey), AdminActionErrors))]
async fn revoke_key(
    State(state): State<AppState>,
    Operator(caller): Operator,
    address: ClientAddress,
    Path(id): Path<Uuid>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Result<axum::Json<api::RevokedKey>, ApiError> {
    let req = super::invites::optional_json::<api::RevokeKey>(&headers, &body)?;
    let audit = caller.audit(
        AuditAction::KeyRevoked,
        format!("key:{id}"),
        Some(address.0.to_string()),
        Some(serde_json::json!({ "cancel_tasks": req.cancel_tasks })),
    );
    let key = state
        .store
        .revoke_api_key(id, audit)
        .await?
        .ok_or_else(|| no_such("key"))?;
    // This replica refuses it before answering; the others on the change
    // stream's word.
    state.credentials.keys.forget(id);
    let mut cancelled = 0;
    if req.cancel_tasks {
        cancelled = cancel_owned(&state, &caller, &address, key.principal.id).await?;
    }
    Ok(axum::Json(api::RevokedKey {
        key: key_view(key),
        cancelled_tasks: cancelled,
    }))
}

/// Cancels every non-terminal task of `owner`, each with its audit entry.
async fn cancel_owned(
    state: &AppState,
    caller: &Caller,
    address: &ClientAddress,
    owner: Uuid,
) -> Result<u64, ApiError> {
    let mut cancelled = 0;
    let mut cursor = None;
    loop {
        let tasks = state.store.owned_tasks(owner, None, cursor, 200).await?;
        let Some(last) = tasks.last() else { break };
        cursor = Some(meatspace_store::OpenTasksCursor {
            created_at: last.created_at,
            id: last.id,
        });
        for task in tasks.iter().filter(|t| !t.state.is_terminal()) {
            let command = Command::Cancel {
                reason: Some("the owner's API key was revoked".into()),
            };
            let entry = caller.audit(
                AuditAction::TaskCancelledByOperator,
                format!("task:{}", task.id),
                Some(address.0.to_string()),
                None,
            );
            match state
                .store
                .apply_audited(task.id, command, caller.acted_by(), entry)
                .await
            {
                Ok(_) => cancelled += 1,
                // Ended meanwhile.
                Err(meatspace_store::StoreError::Refused(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(cancelled)
}

/// Every worker, suspended ones included, ordered by id.
#[utoipa::path(get, path = "/api/v1/workers", tag = "operator", params(PageQuery),
    security(("api_key" = ["operator"]), ("dev_key" = [])),
    responses((status = 200, body = api::WorkerPage), AdminListErrors))]
pub(crate) async fn list_workers(
    State(state): State<AppState>,
    _: Operator,
    Query(q): Query<PageQuery>,
) -> Result<axum::Json<api::WorkerPage>, ApiError> {
    let (after, limit) = q.parts()?;
    let workers = state.store.workers(after, limit + 1).await?;
    let (workers, next_cursor) = page(workers, limit, |w| w.id);
    Ok(axum::Json(api::WorkerPage {
        workers,
        next_cursor,
    }))
}

/// Suspends a worker on every replica: its token and sessions are refused,
/// its sessions end, and the task it holds (assigned or active) reopens
/// for another worker (`task.unassigned`, reason `worker_suspended`).
#[utoipa::path(post, path = "/api/v1/workers/{worker_id}/suspend", tag = "operator",
    params(("worker_id" = Uuid, Path)),
    request_body(content = Option<api::Suspend>, description = "optional reason"),
    security(("api_key" = ["operator"]), ("dev_key" = [])),
    responses((status = 200, body = Worker), AdminActionErrors))]
async fn suspend_worker(
    State(state): State<AppState>,
    Operator(caller): Operator,
    address: ClientAddress,
    Path(id): Path<Uuid>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Result<axum::Json<Worker>, ApiError> {
    let req = super::invites::optional_json::<api::Suspend>(&headers, &body)?;
    let reason = super::checked_optional_text("reason", req.reason.as_deref(), 1000)?;
    let audit = caller.audit(
        AuditAction::WorkerSuspended,
        format!("worker:{id}"),
        Some(address.0.to_string()),
        reason.map(|r| serde_json::json!({ "reason": r })),
    );
    let worker = state
        .store
        .suspend_worker(id, audit)
        .await?
        .ok_or_else(|| no_such("worker"))?;
    state.credentials.workers.forget(id);
    Ok(axum::Json(worker))
}

/// Lifts a worker's suspension.
#[utoipa::path(post, path = "/api/v1/workers/{worker_id}/reinstate", tag = "operator",
    params(("worker_id" = Uuid, Path)),
    security(("api_key" = ["operator"]), ("dev_key" = [])),
    responses((status = 200, body = Worker), AdminActionErrors))]
async fn reinstate_worker(
    State(state): State<AppState>,
    Operator(caller): Operator,
    address: ClientAddress,
    Path(id): Path<Uuid>,
) -> Result<axum::Json<Worker>, ApiError> {
    let audit = caller.audit(
        AuditAction::WorkerReinstated,
        format!("worker:{id}"),
        Some(address.0.to_string()),
        None,
    );
    let worker = state
        .store
        .reinstate_worker(id, audit)
        .await?
        .ok_or_else(|| no_such("worker"))?;
    Ok(axum::Json(worker))
}

/// Gives a worker a new token; the old one stops working at once.
#[utoipa::path(post, path = "/api/v1/workers/{worker_id}/rotate", tag = "operator",
    params(("worker_id" = Uuid, Path)),
    security(("api_key" = ["operator"]), ("dev_key" = [])),
    responses((status = 200, body = api::RotatedWorker), AdminActionErrors))]
async fn rotate_worker_token(
    State(state): State<AppState>,
    Operator(caller): Operator,
    address: ClientAddress,
    Path(id): Path<Uuid>,
) -> Result<Response, ApiError> {
    let (worker_token, hash) = issue_worker_token(id);
    let audit = caller.audit(
        AuditAction::WorkerTokenRotated,
        format!("worker:{id}"),
        Some(address.0.to_string()),
        None,
    );
    let worker = state
        .store
        .rotate_worker_token(id, hash, audit)
        .await?
        .ok_or_else(|| no_such("worker"))?;
    state.credentials.workers.forget(id);
    Ok((
        [(header::CACHE_CONTROL, "no-store")],
        axum::Json(api::RotatedWorker {
            worker,
            worker_token,
        }),
    )
        .into_response())
}

/// A stored invite as operators see it.
pub(crate) fn invite_view(i: Invite) -> api::Invite {
    {
        api::Invite {
            id: i.id,
            created_at: i.created_at,
            expires_at: i.expires_at,
            used_at: i.used_at,
            revoked_at: i.revoked_at,
            created_by: i.created_by,
        }
    }
}

/// Invites not yet purged (used and expired ones go after a while).
#[utoipa::path(get, path = "/api/v1/workers/invites", tag = "operator", params(PageQuery),
    security(("api_key" = ["operator"]), ("dev_key" = [])),
    responses((status = 200, body = api::InvitePage), AdminListErrors))]
pub(crate) async fn list_invites(
    State(state): State<AppState>,
    _: Operator,
    Query(q): Query<PageQuery>,
) -> Result<axum::Json<api::InvitePage>, ApiError> {
    let (after, limit) = q.parts()?;
    let invites = state.store.invites(after, limit + 1).await?;
    let (invites, next_cursor) = page(invites, limit, |i| i.id);
    Ok(axum::Json(api::InvitePage {
        invites: invites.into_iter().map(invite_view).collect(),
        next_cursor,
    }))
}

/// Revokes an unused invite: its link no longer signs anyone up.
#[utoipa::path(post, path = "/api/v1/workers/invites/{invite_id}/revoke", tag = "operator",
    params(("invite_id" = Uuid, Path)),
    security(("api_key" = ["operator"]), ("dev_key" = [])),
    responses((status = 200, body = api::Invite), AdminActionErrors))]
async fn revoke_invite(
    State(state): State<AppState>,
    Operator(caller): Operator,
    address: ClientAddress,
    Path(id): Path<Uuid>,
) -> Result<axum::Json<api::Invite>, ApiError> {
    let audit = caller.audit(
        AuditAction::InviteRevoked,
        format!("invite:{id}"),
        Some(address.0.to_string()),
        None,
    );
    let invite = state
        .store
        .revoke_invite(id, audit)
        .await?
        .ok_or_else(|| no_such("invite"))?;
    Ok(axum::Json(invite_view(invite)))
}

/// Filters of the audit trail.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    /// Only entries of this principal.
    pub principal: Option<Uuid>,
    /// Only entries at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Only entries before this time.
    pub until: Option<DateTime<Utc>>,
    /// Largest page (1-200, default 50).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// A stored audit entry as operators see it.
fn audit_view(e: AuditEntry) -> api::AuditEntry {
    {
        api::AuditEntry {
            id: e.id,
            at: e.at,
            principal: e.principal,
            action: e.action,
            target: e.target,
            address: e.address,
            detail: e.detail,
        }
    }
}

/// The audit trail, newest first.
#[utoipa::path(get, path = "/api/v1/audit", tag = "operator", params(AuditQuery),
    security(("api_key" = ["operator"]), ("dev_key" = [])),
    responses((status = 200, body = api::AuditPage), AdminListErrors))]
async fn list_audit(
    State(state): State<AppState>,
    _: Operator,
    Query(q): Query<AuditQuery>,
) -> Result<axum::Json<api::AuditPage>, ApiError> {
    let limit = page_limit(q.limit, 50, 200)?;
    let before = q
        .cursor
        .as_deref()
        .map(|c| {
            c.parse::<i64>()
                .map_err(|_| ApiError::bad_request("invalid-query", "cursor is not valid"))
        })
        .transpose()?;
    let filter = AuditFilter {
        principal: q.principal,
        since: q.since,
        until: q.until,
        before,
        limit: limit + 1,
    };
    let mut entries = state.store.audit(&filter).await?;
    let more = entries.len() > limit as usize;
    entries.truncate(limit as usize);
    let next_cursor = more
        .then(|| entries.last().map(|e| e.id.to_string()))
        .flatten();
    Ok(axum::Json(api::AuditPage {
        entries: entries.into_iter().map(audit_view).collect(),
        next_cursor,
    }))
}
