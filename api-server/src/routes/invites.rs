//! Worker invites: an operator (or a key with the `invites` scope, or the
//! development key) creates a one-time link; the person who opens it chooses a display name in the web
//! app and is signed in (see [`crate::web`]). The code in the link is a
//! credential (`msi_<invite id>_<secret>`): only its digest is stored.
//!
//! Operators list invites and revoke one that has not been used.

use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use chrono::Duration;
use meatspace_api_types as api;
use meatspace_api_types::{CreateInvite, CreatedInvite};
use meatspace_domain::identity::AuditAction;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use super::{PageQuery, no_such, secret_answer};
use crate::AppState;
use crate::auth::{Actor, Operator, issue_token};
use crate::http::error::ApiError;
use crate::http::error::responses::{AdminActionErrors, AdminListErrors, ScopedCreateErrors};
use crate::http::extract::{OptionalJson, Path, Query};

/// Prefix of invite codes.
pub const INVITE_PREFIX: &str = "msi_";
/// Lifetime of an invite when the request names none: a week.
const DEFAULT_INVITE_SECONDS: u64 = 7 * 24 * 3600;
/// Longest lifetime of an invite: 30 days.
const MAX_INVITE_SECONDS: u64 = 30 * 24 * 3600;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_invite, list_invites))
        .routes(routes!(revoke_invite))
}

/// Creates a one-time invite link to the worker web app. Whoever opens it
/// first chooses a display name and becomes a worker, signed in.
#[utoipa::path(post, path = "/api/v1/workers/invites", tag = "worker",
    request_body(content = Option<CreateInvite>, description = "optional lifetime"),
    security(("api_key" = ["invites"]), ("dev_key" = [])),
    responses((status = 201, body = CreatedInvite), ScopedCreateErrors))]
async fn create_invite(
    actor: Actor,
    headers: HeaderMap,
    OptionalJson(req): OptionalJson<CreateInvite>,
) -> Result<Response, ApiError> {
    actor
        .caller
        .require(meatspace_domain::identity::Scope::Invites)?;
    Ok(secret_answer(
        StatusCode::CREATED,
        create(&actor, &headers, req.expires_in_seconds).await?,
    ))
}

/// Makes an invite (the API and the console), audited; its link is in
/// the answer, and only there.
pub(crate) async fn create(
    actor: &Actor,
    headers: &HeaderMap,
    expires_in_seconds: Option<u64>,
) -> Result<CreatedInvite, ApiError> {
    let seconds = expires_in_seconds.unwrap_or(DEFAULT_INVITE_SECONDS);
    if !(60..=MAX_INVITE_SECONDS).contains(&seconds) {
        return Err(ApiError::invalid(format!(
            "expires_in_seconds must be between 60 and {MAX_INVITE_SECONDS}"
        )));
    }
    let id = Uuid::new_v4();
    let (code, hash) = issue_token(INVITE_PREFIX, id);
    let now = actor.state.clock.now();
    let expires_at = now + Duration::seconds(seconds as i64);
    let audit = actor.audit(
        meatspace_domain::identity::AuditAction::InviteCreated,
        format!("invite:{id}"),
        Some(serde_json::json!({ "expires_at": expires_at })),
    );
    actor
        .state
        .store
        .create_invite(
            id,
            hash,
            expires_at,
            meatspace_store::NewAudit { at: now, ..audit },
        )
        .await?;
    let invite_url = format!(
        "{}/app/invite/{code}",
        actor.state.public_origin.origin(headers)
    );
    Ok(CreatedInvite {
        id,
        invite_url,
        expires_at,
        created_by: actor.caller.principal,
    })
}

/// Invites not yet purged (used and expired ones go after a while).
#[utoipa::path(get, path = "/api/v1/workers/invites", tag = "operator", params(PageQuery),
    responses((status = 200, body = api::InvitePage), AdminListErrors))]
pub(crate) async fn list_invites(
    Operator(op): Operator,
    Query(q): Query<PageQuery>,
) -> Result<axum::Json<api::InvitePage>, ApiError> {
    let (invites, next_cursor) = q
        .read(|after, n| op.state.store.invites(after, n), |i| i.id)
        .await?;
    Ok(axum::Json(api::InvitePage {
        invites,
        next_cursor,
    }))
}

/// Revokes an unused invite: its link no longer signs anyone up.
#[utoipa::path(post, path = "/api/v1/workers/invites/{invite_id}/revoke", tag = "operator",
    responses((status = 200, body = api::Invite), AdminActionErrors))]
async fn revoke_invite(
    Operator(op): Operator,
    Path(id): Path<Uuid>,
) -> Result<axum::Json<api::Invite>, ApiError> {
    Ok(axum::Json(revoke(&op, id).await?))
}

/// Revokes an unused invite (the API and the console), audited.
pub(crate) async fn revoke(op: &Actor, id: Uuid) -> Result<api::Invite, ApiError> {
    let audit = op.audit(AuditAction::InviteRevoked, format!("invite:{id}"), None);
    let invite = op
        .state
        .store
        .revoke_invite(id, audit)
        .await?
        .ok_or_else(|| no_such("invite"))?;
    Ok(invite)
}
