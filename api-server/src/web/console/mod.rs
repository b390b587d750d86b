//! The operator console under `/console`: server-rendered pages for the
//! people who run meatspace, signed in with an operator API key (or the
//! development key where it is on).
//!
//! Signing in turns the key into a server-side session: the cookie holds
//! only the session's own secret (`HttpOnly`, `SameSite=Strict`, `Secure`
//! and `__Host-` under an https public URL), the session ends after 30
//! minutes without activity and 12 hours in any case, and every request
//! checks the key again through the same cache the API uses, so a key
//! that is revoked, expires or is rotated out (its old secret past the
//! grace period) ends its sessions as soon as the API refuses it. Every
//! form carries a CSRF token derived from the session (or, to sign in,
//! from a pre-session cookie) and is refused from another origin. A wrong
//! key answers 401 and counts against the address's failed sign-in budget
//! like any other 401. Signing in and out is audited as the key's
//! principal.

use askama::Template;
use axum::Router;
use axum::extract::{FromRequestParts, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use chrono::{DateTime, TimeDelta, Utc};
use meatspace_domain::identity::{AuditAction, Scope};
use meatspace_store::console::ConsoleSession;
use meatspace_store::token::TokenHash;
use serde::Deserialize;
use uuid::Uuid;

mod audit;
mod keys;
mod overview;
mod tasks;
mod workers;

use super::session::{self, Cookies, SameOrigin, check_csrf, cookie, csrf_token};
use super::{AppError, html, with_cookie};
use crate::AppState;
use crate::auth::{Actor, Caller, credential_subject, issue_token, verify_key};
use crate::http::error::ApiError;
use crate::http::rate_limit::ClientAddress;

/// Prefix of console session cookie values.
const SESSION_PREFIX: &str = "mcs_";
/// A session ends after this long without a request.
pub const IDLE_TIMEOUT: TimeDelta = TimeDelta::minutes(30);
/// A session ends this long after sign-in, whatever the activity.
pub const ABSOLUTE_TIMEOUT: TimeDelta = TimeDelta::hours(12);
/// Activity is written at most this often per session.
const TOUCH_EVERY: TimeDelta = TimeDelta::seconds(60);

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/console/", get(|| async { Redirect::to("/console") }))
        .route("/console/login", get(login_form).post(login))
        .route("/console/logout", post(logout))
        .merge(overview::router())
        .merge(audit::router())
        .merge(tasks::router())
        .merge(workers::router())
        .merge(keys::router())
}

// ---------------------------------------------------------------- cookies

fn session_cookie(secure: bool) -> &'static str {
    if secure {
        "__Host-ms_console"
    } else {
        "ms_console"
    }
}

/// The console's cookies: `SameSite=Strict`, scoped to the console.
const COOKIES: Cookies = Cookies {
    path: "/console",
    same_site: "Strict",
    pre_session: "ms_console_pre",
    secure_pre_session: "__Host-ms_console_pre",
    pre_session_seconds: 3600,
};

// ---------------------------------------------------------------- session

/// A form posted in a signed-in session: the session (a cross-site post is
/// refused before it is read), the client's address, and the form, its
/// CSRF token checked against the session. Repeated fields (checkboxes)
/// are kept, as browsers send them.
pub(super) struct ConsoleForm<F> {
    pub c: Console,
    pub address: ClientAddress,
    pub form: F,
}

impl<F> axum::extract::FromRequest<AppState> for ConsoleForm<F>
where
    F: serde::de::DeserializeOwned + crate::web::form::CsrfField + Send,
{
    type Rejection = Response;

    async fn from_request(
        req: axum::extract::Request,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let (mut parts, body) = req.into_parts();
        let c = Console::from_request_parts(&mut parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        let Ok(address) = ClientAddress::from_request_parts(&mut parts, state).await;
        let body = axum::body::to_bytes(body, MAX_FORM_BYTES)
            .await
            .map_err(|_| {
                AppError::Page(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "Form refused",
                    "The form is larger than any console form.".into(),
                )
                .into_response()
            })?;
        let form: F = serde_html_form::from_bytes(&body).map_err(|e| {
            AppError::Page(
                StatusCode::BAD_REQUEST,
                "Form refused",
                format!("The form: {e}"),
            )
            .into_response()
        })?;
        check_csrf(session_value(state, &parts.headers), form.csrf())
            .map_err(IntoResponse::into_response)?;
        Ok(ConsoleForm { c, address, form })
    }
}

/// What the console answers when the record a path names is not there.
pub(super) struct Missing {
    title: &'static str,
    text: &'static str,
}

impl Missing {
    pub(super) const fn new(title: &'static str, text: &'static str) -> Self {
        Missing { title, text }
    }

    /// The not-found page.
    pub(super) fn error(&self) -> AppError {
        AppError::Page(StatusCode::NOT_FOUND, self.title, self.text.into())
    }

    /// The record a lookup found, or the not-found page.
    pub(super) fn found<T>(&self, record: Option<T>) -> Result<T, AppError> {
        record.ok_or_else(|| self.error())
    }

    /// The id a path names; anything that is not an id names no record.
    pub(super) fn id(&self, raw: &str) -> Result<Uuid, AppError> {
        Uuid::try_parse(raw).map_err(|_| self.error())
    }
}

/// A form or filter field that may be left empty: `None` when it is,
/// else what `parse` makes of its trimmed text (or what is wrong with it).
pub(super) fn optional<T>(
    text: &str,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> Result<Option<T>, String> {
    match text.trim() {
        "" => Ok(None),
        t => parse(t).map(Some),
    }
}

/// A page, answered with `refused` when it shows a refusal (`error`) and
/// 200 otherwise.
pub(super) fn shown(page: &impl Template, error: &Option<String>, refused: StatusCode) -> Response {
    let status = if error.is_some() {
        refused
    } else {
        StatusCode::OK
    };
    (status, html(page)).into_response()
}

/// The query string of a listing's filter, for its links: the fields that
/// are not blank, then `before` (where the next page starts) if given.
pub(super) fn filter_query(fields: &[(&str, &String)], before: Option<String>) -> String {
    let mut q = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in fields {
        if !v.trim().is_empty() {
            q.append_pair(k, v.trim());
        }
    }
    if let Some(b) = before {
        q.append_pair("before", &b);
    }
    q.finish()
}

/// Largest console form body.
const MAX_FORM_BYTES: usize = 64 * 1024;

/// A signed-in operator. Extracting it without a valid session sends the
/// browser to the sign-in page.
#[derive(Debug, Clone)]
pub struct Console {
    /// The server's state, for the page's handler.
    pub state: AppState,
    pub session: ConsoleSession,
    pub caller: Caller,
    /// The CSRF token every form of this session carries.
    pub csrf: String,
}

/// Why a session is not (or no longer) good.
fn signed_out() -> AppError {
    AppError::Redirect("/console/login?expired=1")
}

impl FromRequestParts<AppState> for Console {
    type Rejection = AppError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let name = session_cookie(state.public_origin.secure(&parts.headers));
        let Some(value) = session::session_cookie(parts, state, name).await? else {
            return Err(AppError::Redirect("/console/login"));
        };
        Console::of_session(state, value).await
    }
}

/// The console session cookie's value a request carries.
pub(super) fn session_value<'h>(state: &AppState, headers: &'h HeaderMap) -> Option<&'h str> {
    cookie(headers, session_cookie(state.public_origin.secure(headers)))
}

impl Console {
    /// The signed-in operator acting from `address`, as the operator API's
    /// actions take it.
    pub(super) fn actor(&self, address: ClientAddress) -> Actor {
        Actor {
            state: self.state.clone(),
            caller: self.caller.clone(),
            address,
        }
    }

    /// The signed-in operator of the session whose cookie is `value`, if
    /// it is still good: not ended, not idle too long, its key still
    /// valid. Touches the session (it was used).
    pub(super) async fn of_session(state: &AppState, value: &str) -> Result<Console, AppError> {
        let id = credential_subject(value, SESSION_PREFIX).ok_or_else(signed_out)?;
        let now = state.clock.now();
        let session = state
            .store
            .console_session(id, now)
            .await?
            .ok_or_else(signed_out)?;
        if !session.secret_hash.verify(value) {
            return Err(signed_out());
        }
        if now - session.last_seen_at >= IDLE_TIMEOUT {
            state.store.end_console_session(id).await?;
            return Err(signed_out());
        }
        let caller = match still_valid(state, &session, now).await? {
            Some(caller) => caller,
            None => {
                state.store.end_console_session(id).await?;
                return Err(signed_out());
            }
        };
        if now - session.last_seen_at >= TOUCH_EVERY {
            state.store.touch_console_session(id, now).await?;
        }
        Ok(Console {
            state: state.clone(),
            csrf: csrf_token(value),
            session,
            caller,
        })
    }
}

/// The caller the session's key still proves, or `None` when the key no
/// longer opens with the secret signed in with (revoked, expired, rotated
/// out, no longer an operator's) or the development key was turned off.
async fn still_valid(
    state: &AppState,
    session: &ConsoleSession,
    now: DateTime<Utc>,
) -> Result<Option<Caller>, ApiError> {
    let Some(key_id) = session.key_id else {
        return Ok(state.dev_key.enabled().then(|| Caller::development(now)));
    };
    let Some(record) = state
        .credentials
        .keys
        .digest(key_id, state.store.api_key(key_id))
        .await?
    else {
        return Ok(None);
    };
    let Some(presented) = &session.key_digest else {
        return Ok(None);
    };
    let same =
        |d: &TokenHash| bool::from(subtle::ConstantTimeEq::ct_eq(&d.0[..], &presented.0[..]));
    let current = same(&record.digest);
    let previous = record.previous_digest.as_ref().is_some_and(same)
        && record
            .key
            .previous_valid_until
            .is_some_and(|until| now < until);
    if !(current || previous)
        || record.key.revoked_at.is_some()
        || record.key.expires_at.is_some_and(|at| now >= at)
        || !record.key.scopes.allow(Scope::Operator)
    {
        return Ok(None);
    }
    Ok(Some(Caller {
        principal: record.key.principal.id,
        kind: record.key.principal.kind,
        scopes: record.key.scopes.clone(),
        key_id: Some(key_id),
        at: now,
    }))
}

// ---------------------------------------------------------------- sign-in

#[derive(Template)]
#[template(path = "console_login.html")]
struct LoginPage {
    nav: Option<Nav>,
    csrf: String,
    notice: Option<&'static str>,
    error: Option<&'static str>,
}

/// The console's navigation, with the session's CSRF token for sign-out.
#[derive(Debug, Clone)]
pub(super) struct Nav {
    csrf: String,
    /// Who is signed in, as the sign-out button's title says it.
    signed_in: String,
}

impl Nav {
    pub(super) fn of(c: &Console) -> Self {
        Nav {
            csrf: c.csrf.clone(),
            signed_in: match c.caller.key_id {
                Some(key) => format!("Signed in with key {key}"),
                None => "Signed in with the development key".into(),
            },
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct LoginQuery {
    expired: Option<String>,
    signed_out: Option<String>,
}

fn login_page(
    state: &AppState,
    headers: &HeaderMap,
    notice: Option<&'static str>,
    error: Option<&'static str>,
) -> Response {
    let (pre, set) = COOKIES.pre_session(state, headers);
    with_cookie(
        html(&LoginPage {
            nav: None,
            csrf: csrf_token(&pre),
            notice,
            error,
        }),
        set,
    )
}

async fn login_form(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<LoginQuery>,
) -> Response {
    let notice = if q.signed_out.is_some() {
        Some("You are signed out; the session has ended on the server.")
    } else if q.expired.is_some() {
        Some("Your session has ended. Sign in again.")
    } else {
        None
    };
    login_page(&state, &headers, notice, None)
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct KeyForm {
    csrf: Option<String>,
    key: String,
}

async fn login(
    State(state): State<AppState>,
    _same_origin: SameOrigin,
    address: ClientAddress,
    headers: HeaderMap,
    axum::extract::Form(form): axum::extract::Form<KeyForm>,
) -> Result<Response, AppError> {
    let secure = state.public_origin.secure(&headers);
    check_csrf(
        cookie(&headers, COOKIES.pre_session_cookie(secure)),
        form.csrf.as_deref(),
    )?;
    let key = form.key.trim();
    let now = state.clock.now();
    let caller = if !key.is_empty() && state.dev_key.matches(key) {
        Some(Caller::development(now))
    } else {
        match verify_key(&state, key).await {
            Ok(caller) => Some(caller),
            Err(ApiError::Unauthorized(_)) => None,
            Err(e) => return Err(e.into()),
        }
    };
    // The sign-in page again, saying why. The key is a secret: it is
    // never sent back into the page.
    let refused = |status: StatusCode, why: &'static str| {
        Ok((status, login_page(&state, &headers, None, Some(why))).into_response())
    };
    let Some(caller) = caller else {
        return refused(
            StatusCode::UNAUTHORIZED,
            "That key is not valid. Check that you pasted all of it.",
        );
    };
    if !caller.is_operator() {
        return refused(
            StatusCode::FORBIDDEN,
            "That key is valid but not an operator's: the console needs the operator scope.",
        );
    }
    let id = Uuid::new_v4();
    let (secret, hash) = issue_token(SESSION_PREFIX, id);
    let session = ConsoleSession {
        id,
        secret_hash: hash,
        key_id: caller.key_id,
        key_digest: caller.key_id.map(|_| TokenHash::of(key)),
        principal_id: caller.principal,
        created_at: now,
        last_seen_at: now,
        expires_at: now + ABSOLUTE_TIMEOUT,
    };
    state.store.create_console_session(&session).await?;
    record(&state, &caller, AuditAction::ConsoleSignedIn, id, &address).await?;
    Ok(with_cookie(
        Redirect::to("/console").into_response(),
        Some(COOKIES.set(
            secure,
            session_cookie(secure),
            &secret,
            ABSOLUTE_TIMEOUT.num_seconds(),
        )),
    ))
}

async fn record(
    state: &AppState,
    caller: &Caller,
    action: AuditAction,
    session: Uuid,
    address: &ClientAddress,
) -> Result<(), ApiError> {
    let entry = caller.audit(action, format!("console_session:{session}"), address, None);
    state.store.append_audit(entry).await?;
    Ok(())
}

/// A form with nothing but its CSRF token.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct CsrfForm {
    pub csrf: Option<String>,
}
crate::web::form::csrf_field!(CsrfForm);

async fn logout(
    State(state): State<AppState>,
    headers: HeaderMap,
    ConsoleForm { c, address, .. }: ConsoleForm<CsrfForm>,
) -> Result<Response, AppError> {
    let secure = state.public_origin.secure(&headers);
    state.store.end_console_session(c.session.id).await?;
    record(
        &state,
        &c.caller,
        AuditAction::ConsoleSignedOut,
        c.session.id,
        &address,
    )
    .await?;
    Ok(with_cookie(
        Redirect::to("/console/login?signed_out=1").into_response(),
        Some(COOKIES.set(secure, session_cookie(secure), "", 0)),
    ))
}
