//! The console's API keys and invites: keys listed with their principal,
//! scopes, last use and state, created (the secret shown once, with a
//! copy button), rotated with a grace period and revoked (optionally
//! cancelling the principal's tasks); invites created (the link shown
//! once, with a QR code a phone can scan), listed with their state and
//! revoked. Each action is the API's own function, audited as the
//! signed-in operator.

use askama::Template;
use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use chrono::{DateTime, Utc};
use meatspace_api_types as api;
use meatspace_domain::identity::{InviteState, PrincipalKind, Scope};
use serde::Deserialize;
use uuid::Uuid;

use super::audit::time;
use super::{Console, ConsoleForm, CsrfForm, Missing, Nav, optional};
use crate::AppState;
use crate::http::error::ApiError;
use crate::routes::{invites, keys};
use crate::web::AppError;

const PAGE: u32 = 100;

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/console/keys", get(list_keys).post(create_key))
        .route("/console/keys/{key_id}/rotate", post(rotate_key))
        .route("/console/keys/{key_id}/revoke", post(revoke_key))
        .route("/console/invites", get(list_invites).post(create_invite))
        .route("/console/invites/{invite_id}/revoke", post(revoke_invite))
}

const MISSING: Missing = Missing::new("Not found", "There is no such record.");

/// A number of hours from a form, in seconds; `None` when left empty.
fn hours(text: &str, refusal: &str) -> Result<Option<u64>, String> {
    optional(text, |h| {
        h.parse::<u64>()
            .map(|h| h.saturating_mul(3600))
            .map_err(|_| refusal.to_owned())
    })
}

// ------------------------------------------------------------------- keys

struct KeyRow {
    id: Uuid,
    name: String,
    principal: String,
    scopes: String,
    created: String,
    last_used: String,
    state: String,
    active: bool,
}

fn key_row(k: &api::Key, now: DateTime<Utc>) -> KeyRow {
    let state = if let Some(at) = k.revoked_at {
        format!("revoked {}", at.to_rfc3339())
    } else if k.expires_at.is_some_and(|at| at <= now) {
        "expired".to_owned()
    } else if let Some(until) = k.previous_valid_until.filter(|u| *u > now) {
        format!("rotated; the old secret works until {}", until.to_rfc3339())
    } else {
        "active".to_owned()
    };
    KeyRow {
        id: k.id,
        name: k.name.clone(),
        principal: format!(
            "{} {} ({})",
            k.principal.kind.as_str(),
            k.principal.name,
            k.principal.id
        ),
        scopes: k.scopes.to_text(),
        created: k.created_at.to_rfc3339(),
        last_used: k
            .last_used_at
            .map(|t| t.to_rfc3339())
            .unwrap_or_else(|| "never".into()),
        active: k.revoked_at.is_none() && k.expires_at.is_none_or(|at| at > now),
        state,
    }
}

#[derive(Template)]
#[template(path = "console_keys.html")]
struct KeysPage {
    nav: Option<Nav>,
    csrf: String,
    keys: Vec<KeyRow>,
    scopes: Vec<&'static str>,
    /// A secret just made: shown this once.
    secret: Option<(String, String)>,
    notice: Option<String>,
    error: Option<String>,
}

async fn keys_page(
    c: &Console,
    secret: Option<(String, String)>,
    notice: Option<String>,
    error: Option<String>,
) -> Result<Response, AppError> {
    let now = c.state.clock.now();
    let keys = c.state.store.api_keys(None, PAGE).await?;
    let mut rows: Vec<KeyRow> = keys.into_iter().map(|k| key_row(&k, now)).collect();
    rows.sort_by(|a, b| a.principal.cmp(&b.principal).then(a.name.cmp(&b.name)));
    let page = KeysPage {
        nav: Some(Nav::of(c)),
        csrf: c.csrf.clone(),
        keys: rows,
        scopes: Scope::ALL.iter().map(|s| s.as_str()).collect(),
        secret,
        notice,
        error,
    };
    Ok(super::shown(
        &page,
        &page.error,
        StatusCode::UNPROCESSABLE_ENTITY,
    ))
}

async fn list_keys(c: Console) -> Result<Response, AppError> {
    keys_page(&c, None, None, None).await
}

/// A refusal of the API's in words on the page; other errors as errors.
fn refused(e: ApiError) -> Result<String, AppError> {
    match e {
        ApiError::Invalid(m) => Ok(m),
        ApiError::Conflict { detail, .. } => Ok(detail),
        e => Err(e.into()),
    }
}

#[derive(Debug, Default, Deserialize)]
struct KeyForm {
    csrf: Option<String>,
    #[serde(default)]
    name: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    expires_at: String,
    /// Checkboxes, one field per ticked scope.
    #[serde(default)]
    scope: Vec<String>,
}
crate::web::form::csrf_field!(KeyForm, RotateForm, RevokeForm, InviteForm);

async fn create_key(
    ConsoleForm { c, address, form }: ConsoleForm<KeyForm>,
) -> Result<Response, AppError> {
    let kind = match form.kind.as_str() {
        "operator" => PrincipalKind::Operator,
        _ => PrincipalKind::Agent,
    };
    let scopes = form
        .scope
        .iter()
        .map(|s| Scope::parse(s))
        .collect::<Option<Vec<_>>>();
    let Some(scopes) = scopes else {
        return keys_page(&c, None, None, Some("Unknown scope.".into())).await;
    };
    let expires_at = match time(&form.expires_at) {
        Ok(t) => t,
        Err(e) => return keys_page(&c, None, None, Some(e)).await,
    };
    let req = api::CreateKey {
        name: form.name,
        kind: Some(kind),
        principal_id: None,
        scopes: (!scopes.is_empty()).then_some(scopes),
        expires_at,
    };
    match keys::create(&c.actor(address), req).await {
        Ok(made) => {
            let label = format!("Secret of the new key {}", made.key.name);
            keys_page(&c, Some((label, made.secret)), None, None).await
        }
        Err(e) => keys_page(&c, None, None, Some(refused(e)?)).await,
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RotateForm {
    csrf: Option<String>,
    grace_hours: String,
}

async fn rotate_key(
    Path(raw): Path<String>,
    ConsoleForm { c, address, form }: ConsoleForm<RotateForm>,
) -> Result<Response, AppError> {
    let id = MISSING.id(&raw)?;
    let grace = match hours(
        &form.grace_hours,
        "The grace period is a whole number of hours.",
    ) {
        Ok(grace) => grace,
        Err(e) => return keys_page(&c, None, None, Some(e)).await,
    };
    match keys::rotate(&c.actor(address), id, grace).await {
        Ok(made) => {
            let label = format!("New secret of the key {}", made.key.name);
            keys_page(&c, Some((label, made.secret)), None, None).await
        }
        Err(ApiError::NotFound(_)) => Err(MISSING.error()),
        Err(e) => keys_page(&c, None, None, Some(refused(e)?)).await,
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RevokeForm {
    csrf: Option<String>,
    cancel_tasks: Option<String>,
}

async fn revoke_key(
    Path(raw): Path<String>,
    ConsoleForm { c, address, form }: ConsoleForm<RevokeForm>,
) -> Result<Response, AppError> {
    let id = MISSING.id(&raw)?;
    match keys::revoke(&c.actor(address), id, form.cancel_tasks.is_some()).await {
        Ok(revoked) => {
            let notice = format!(
                "Revoked the key {}; {} of its principal's tasks cancelled.",
                revoked.key.name, revoked.cancelled_tasks
            );
            keys_page(&c, None, Some(notice), None).await
        }
        Err(ApiError::NotFound(_)) => Err(MISSING.error()),
        Err(e) => Err(e.into()),
    }
}

// ------------------------------------------------------------------- invites

struct InviteRow {
    id: Uuid,
    created: String,
    expires: String,
    state: &'static str,
    open: bool,
}

#[derive(Template)]
#[template(path = "console_invites.html")]
struct InvitesPage {
    nav: Option<Nav>,
    csrf: String,
    invites: Vec<InviteRow>,
    /// A link just made, and its QR code (SVG): shown this once.
    made: Option<(String, String)>,
    error: Option<String>,
}

async fn invites_page(
    c: &Console,
    made: Option<(String, String)>,
    error: Option<String>,
) -> Result<Response, AppError> {
    let now = c.state.clock.now();
    let invites = c.state.store.invites(None, PAGE).await?;
    let rows = invites
        .into_iter()
        .map(|i| {
            let state = i.state(now);
            InviteRow {
                id: i.id,
                created: i.created_at.to_rfc3339(),
                expires: i.expires_at.to_rfc3339(),
                open: state == InviteState::Open,
                state: state.as_str(),
            }
        })
        .collect();
    let page = InvitesPage {
        nav: Some(Nav::of(c)),
        csrf: c.csrf.clone(),
        invites: rows,
        made,
        error,
    };
    Ok(super::shown(
        &page,
        &page.error,
        StatusCode::UNPROCESSABLE_ENTITY,
    ))
}

async fn list_invites(c: Console) -> Result<Response, AppError> {
    invites_page(&c, None, None).await
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct InviteForm {
    csrf: Option<String>,
    hours: String,
}

/// The QR code of `text` as an SVG element (dark modules on white).
fn qr_svg(text: &str) -> Result<String, AppError> {
    let code = qrcode::QrCode::new(text.as_bytes())
        .map_err(|e| AppError::Api(ApiError::Internal(e.into())))?;
    Ok(code
        .render::<qrcode::render::svg::Color<'_>>()
        .min_dimensions(200, 200)
        .quiet_zone(true)
        .build())
}

async fn create_invite(
    headers: HeaderMap,
    ConsoleForm { c, address, form }: ConsoleForm<InviteForm>,
) -> Result<Response, AppError> {
    let seconds = match hours(&form.hours, "The lifetime is a whole number of hours.") {
        Ok(seconds) => seconds,
        Err(e) => return invites_page(&c, None, Some(e)).await,
    };
    match invites::create(&c.actor(address), &headers, seconds).await {
        Ok(made) => {
            let svg = qr_svg(&made.invite_url)?;
            invites_page(&c, Some((made.invite_url, svg)), None).await
        }
        Err(e) => invites_page(&c, None, Some(refused(e)?)).await,
    }
}

async fn revoke_invite(
    Path(raw): Path<String>,
    ConsoleForm { c, address, .. }: ConsoleForm<CsrfForm>,
) -> Result<Response, AppError> {
    let id = MISSING.id(&raw)?;
    match invites::revoke(&c.actor(address), id).await {
        Ok(_) => Ok(Redirect::to("/console/invites").into_response()),
        Err(ApiError::NotFound(_)) => Err(MISSING.error()),
        Err(e) => Err(e.into()),
    }
}
