//! Worker invites: an operator (or a key with the `invites` scope, or the
//! development key) creates a one-time link; the person who opens it chooses a display name in the web
//! app and is signed in (see [`crate::web`]). The code in the link is a
//! credential (`msi_<invite id>_<secret>`): only its digest is stored.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::Duration;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use meatspace_api_types::{CreateInvite, CreatedInvite};

use crate::AppState;
use crate::auth::{Caller, issue_token};
use crate::error::ApiError;
use crate::error::responses::ScopedCreateErrors;

/// Prefix of invite codes.
pub const INVITE_PREFIX: &str = "msi_";
/// Lifetime of an invite when the request names none: a week.
const DEFAULT_INVITE_SECONDS: u64 = 7 * 24 * 3600;
/// Longest lifetime of an invite: 30 days.
const MAX_INVITE_SECONDS: u64 = 30 * 24 * 3600;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(create_invite, super::admin::list_invites))
}

/// Creates a one-time invite link to the worker web app. Whoever opens it
/// first chooses a display name and becomes a worker, signed in.
#[utoipa::path(post, path = "/api/v1/workers/invites", tag = "worker",
    request_body(content = Option<CreateInvite>, description = "optional lifetime"),
    security(("api_key" = ["invites"]), ("dev_key" = [])),
    responses((status = 201, body = CreatedInvite), ScopedCreateErrors))]
async fn create_invite(
    State(state): State<AppState>,
    caller: Caller,
    address: crate::rate_limit::ClientAddress,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    caller.require(meatspace_domain::identity::Scope::Invites)?;
    let req: CreateInvite = optional_json(&headers, &body)?;
    let seconds = req.expires_in_seconds.unwrap_or(DEFAULT_INVITE_SECONDS);
    if !(60..=MAX_INVITE_SECONDS).contains(&seconds) {
        return Err(ApiError::invalid(format!(
            "expires_in_seconds must be between 60 and {MAX_INVITE_SECONDS}"
        )));
    }
    let id = Uuid::new_v4();
    let (code, hash) = issue_token(INVITE_PREFIX, id);
    let now = state.clock.now();
    let expires_at = now + Duration::seconds(seconds as i64);
    let audit = caller.audit(
        meatspace_domain::identity::AuditAction::InviteCreated,
        format!("invite:{id}"),
        Some(address.0.to_string()),
        Some(serde_json::json!({ "expires_at": expires_at })),
    );
    state
        .store
        .create_invite(
            id,
            hash,
            expires_at,
            meatspace_store::NewAudit { at: now, ..audit },
        )
        .await?;
    let invite_url = format!("{}/app/invite/{code}", state.public_origin.origin(&headers));
    Ok((
        StatusCode::CREATED,
        [(header::CACHE_CONTROL, "no-store")],
        axum::Json(CreatedInvite {
            id,
            invite_url,
            expires_at,
            created_by: caller.principal,
        }),
    )
        .into_response())
}

/// An optional JSON body: empty means every default.
pub(crate) fn optional_json<T: Default + serde::de::DeserializeOwned>(
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<T, ApiError> {
    if body.is_empty() {
        return Ok(T::default());
    }
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !is_json {
        return Err(ApiError::UnsupportedMediaType(
            "send the body as JSON with Content-Type: application/json".into(),
        ));
    }
    serde_json::from_slice(body).map_err(|e| {
        if e.is_syntax() || e.is_eof() {
            ApiError::bad_request("malformed-json", e.to_string())
        } else {
            ApiError::invalid(e.to_string())
        }
    })
}
