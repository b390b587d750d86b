//! API keys, for operators: create, list, read, rotate with a grace
//! period, revoke (optionally cancelling the tasks the key's principal
//! owns). Every change writes its audit entry in the same transaction.

use axum::http::StatusCode;
use axum::response::Response;
use chrono::TimeDelta;
use meatspace_api_types as api;
use meatspace_domain::Command;
use meatspace_domain::identity::{AuditAction, PrincipalKind, PrincipalRef, Scopes};
use meatspace_store::NewApiKey;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use super::{PageQuery, checked_text, no_such, secret_answer};
use crate::AppState;
use crate::auth::{Actor, Operator, issue_key};
use crate::http::error::ApiError;
use crate::http::error::responses::{AdminActionErrors, AdminListErrors};
use crate::http::extract::{Json, OptionalJson, Path, Query};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_key, list_keys))
        .routes(routes!(get_key))
        .routes(routes!(rotate_key))
        .routes(routes!(revoke_key))
}

/// Longest name of a key or principal, in characters.
const MAX_NAME_CHARS: usize = 200;
/// Default grace period of a rotated secret: a day.
pub const DEFAULT_ROTATION_GRACE_SECONDS: u64 = 86_400;
/// Longest grace period: a week.
pub const MAX_ROTATION_GRACE_SECONDS: u64 = 7 * 86_400;

/// Creates an API key, for a new principal or another key of an existing one.
#[utoipa::path(post, path = "/api/v1/keys", tag = "operator",
    request_body = api::CreateKey,
    responses((status = 201, body = api::KeySecret), AdminActionErrors))]
async fn create_key(
    Operator(op): Operator,
    Json(req): Json<api::CreateKey>,
) -> Result<Response, ApiError> {
    Ok(secret_answer(StatusCode::CREATED, create(&op, req).await?))
}

/// Creates a key (the API and the console), audited; its secret is in
/// the answer, and only there.
pub(crate) async fn create(op: &Actor, req: api::CreateKey) -> Result<api::KeySecret, ApiError> {
    let name = checked_text("name", &req.name, MAX_NAME_CHARS)?;
    let now = op.state.clock.now();
    if req.expires_at.is_some_and(|at| at <= now) {
        return Err(ApiError::invalid("expires_at must be in the future"));
    }
    let (principal, new_principal) = match req.principal_id {
        Some(id) => (
            op.state
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
    let audit = op.audit(
        AuditAction::KeyCreated,
        format!("key:{id}"),
        Some(serde_json::json!({ "principal_id": new.principal.id, "scopes": new.scopes })),
    );
    let key = op.state.store.create_api_key(new, audit).await?;
    Ok(api::KeySecret { key, secret })
}

/// Every API key, revoked ones included, ordered by id.
#[utoipa::path(get, path = "/api/v1/keys", tag = "operator", params(PageQuery),
    responses((status = 200, body = api::KeyPage), AdminListErrors))]
async fn list_keys(
    Operator(op): Operator,
    Query(q): Query<PageQuery>,
) -> Result<axum::Json<api::KeyPage>, ApiError> {
    let (keys, next_cursor) = q
        .read(|after, n| op.state.store.api_keys(after, n), |k| k.id)
        .await?;
    Ok(axum::Json(api::KeyPage { keys, next_cursor }))
}

/// One API key.
#[utoipa::path(get, path = "/api/v1/keys/{key_id}", tag = "operator",
    responses((status = 200, body = api::Key), AdminActionErrors))]
async fn get_key(
    Operator(op): Operator,
    Path(id): Path<Uuid>,
) -> Result<axum::Json<api::Key>, ApiError> {
    let key = op
        .state
        .store
        .api_key(id)
        .await?
        .ok_or_else(|| no_such("key"))?;
    Ok(axum::Json(key.key))
}

/// Gives a key a new secret. The current one keeps working until
/// `previous_valid_until` (a grace period, one day by default), so its
/// users can switch without an outage.
#[utoipa::path(post, path = "/api/v1/keys/{key_id}/rotate", tag = "operator",
    request_body(content = Option<api::RotateKey>, description = "optional grace period"),
    responses((status = 200, body = api::KeySecret), AdminActionErrors))]
async fn rotate_key(
    Operator(op): Operator,
    Path(id): Path<Uuid>,
    OptionalJson(req): OptionalJson<api::RotateKey>,
) -> Result<Response, ApiError> {
    Ok(secret_answer(
        StatusCode::OK,
        rotate(&op, id, req.grace_seconds).await?,
    ))
}

/// Gives key `id` a new secret (the API and the console), audited; the
/// old one works for `grace_seconds` more (a day by default).
pub(crate) async fn rotate(
    op: &Actor,
    id: Uuid,
    grace_seconds: Option<u64>,
) -> Result<api::KeySecret, ApiError> {
    let grace = grace_seconds.unwrap_or(DEFAULT_ROTATION_GRACE_SECONDS);
    if grace > MAX_ROTATION_GRACE_SECONDS {
        return Err(ApiError::invalid(format!(
            "grace_seconds must be at most {MAX_ROTATION_GRACE_SECONDS}"
        )));
    }
    let (secret, digest) = issue_key(id);
    let audit = op.audit(
        AuditAction::KeyRotated,
        format!("key:{id}"),
        Some(serde_json::json!({ "grace_seconds": grace })),
    );
    let until = audit.at + TimeDelta::seconds(i64::try_from(grace).unwrap_or(0));
    let key = op
        .state
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
    op.state.credentials.keys.forget(id);
    Ok(api::KeySecret { key, secret })
}

/// Revokes a key at once on every replica. Its principal's tasks keep
/// running and stay readable with their task tokens, unless `cancel_tasks`.
#[utoipa::path(post, path = "/api/v1/keys/{key_id}/revoke", tag = "operator",
    request_body(content = Option<api::RevokeKey>, description = "optional"),
    responses((status = 200, body = api::RevokedKey), AdminActionErrors))]
async fn revoke_key(
    Operator(op): Operator,
    Path(id): Path<Uuid>,
    OptionalJson(req): OptionalJson<api::RevokeKey>,
) -> Result<axum::Json<api::RevokedKey>, ApiError> {
    Ok(axum::Json(revoke(&op, id, req.cancel_tasks).await?))
}

/// Revokes key `id` at once on every replica (the API and the console),
/// audited; with `cancel_tasks`, its principal's tasks are cancelled too.
pub(crate) async fn revoke(
    op: &Actor,
    id: Uuid,
    cancel_tasks: bool,
) -> Result<api::RevokedKey, ApiError> {
    let audit = op.audit(
        AuditAction::KeyRevoked,
        format!("key:{id}"),
        Some(serde_json::json!({ "cancel_tasks": cancel_tasks })),
    );
    let key = op
        .state
        .store
        .revoke_api_key(id, audit)
        .await?
        .ok_or_else(|| no_such("key"))?;
    // This replica refuses it before answering; the others on the change
    // stream's word.
    op.state.credentials.keys.forget(id);
    let mut cancelled = 0;
    if cancel_tasks {
        cancelled = cancel_owned(op, key.principal.id).await?;
    }
    Ok(api::RevokedKey {
        key,
        cancelled_tasks: cancelled,
    })
}

/// Cancels every non-terminal task of `owner`, each with its audit entry.
async fn cancel_owned(op: &Actor, owner: Uuid) -> Result<u64, ApiError> {
    let mut cancelled = 0;
    let mut cursor = None;
    loop {
        let tasks = op.state.store.owned_tasks(owner, None, cursor, 200).await?;
        let Some(last) = tasks.last() else { break };
        cursor = Some(meatspace_store::OpenTasksCursor {
            created_at: last.created_at,
            id: last.id,
        });
        for task in tasks.iter().filter(|t| !t.state.is_terminal()) {
            let command = Command::Cancel {
                reason: Some("the owner's API key was revoked".into()),
            };
            let entry = op.audit(
                AuditAction::TaskCancelledByOperator,
                format!("task:{}", task.id),
                None,
            );
            match op
                .state
                .store
                .apply_audited(task.id, command, op.caller.acted_by(), entry)
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
