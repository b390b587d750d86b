//! Browser sessions and CSRF protection of the worker web app.
//!
//! The session cookie holds `mss_<session id>_<secret>`; the store keeps the
//! secret's SHA-256 digest, looked up by id and compared in constant time,
//! like every other credential. The cookie is HttpOnly, SameSite=Lax,
//! scoped to `/app`, and Secure when the request came over TLS.
//!
//! Every form carries a CSRF token derived from a cookie the page's origin
//! alone can read: the session cookie once signed in, otherwise a random
//! pre-session cookie (for the invite and sign-in forms). The token is the
//! digest of that cookie's value, so a cross-site page, which cannot read
//! the cookie, cannot compute it, and the server keeps no extra state.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, header};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::Duration;
use meatspace_core::clock;
use meatspace_core::store::Worker;
use meatspace_core::token::{self, TokenHash};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use uuid::Uuid;

use super::AppError;
use crate::AppState;
use crate::auth::{credential_subject, issue_token};

/// Name of the session cookie.
pub const SESSION_COOKIE: &str = "ms_session";
/// Name of the pre-session cookie behind the CSRF token of the sign-in forms.
pub const PRE_SESSION_COOKIE: &str = "ms_presession";
/// Prefix of session cookie values.
const SESSION_PREFIX: &str = "mss_";
/// How long a session lasts.
pub const SESSION_DAYS: i64 = 14;

/// Whether the request reached us over TLS: directly (no proxy in this
/// setup) or, behind a TLS-terminating proxy, as `X-Forwarded-Proto: https`.
pub fn over_tls(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"))
}

/// The value of cookie `name`, if the request carries it.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
        .filter(|v| !v.is_empty())
}

/// A `Set-Cookie` value; `max_age` 0 deletes the cookie.
pub fn set_cookie(headers: &HeaderMap, name: &str, value: &str, max_age: i64) -> HeaderValue {
    let secure = if over_tls(headers) { "; Secure" } else { "" };
    let value =
        format!("{name}={value}; Path=/app; Max-Age={max_age}; HttpOnly; SameSite=Lax{secure}");
    HeaderValue::from_str(&value).expect("cookie values are URL-safe base64 and ids")
}

/// The CSRF token of a cookie value.
pub fn csrf_token(cookie_value: &str) -> String {
    let digest = Sha256::new()
        .chain_update(b"meatspace-csrf\0")
        .chain_update(cookie_value.as_bytes())
        .finalize();
    URL_SAFE_NO_PAD.encode(digest)
}

/// Checks a submitted CSRF token against the cookie it must derive from.
pub fn check_csrf(cookie_value: Option<&str>, submitted: Option<&str>) -> Result<(), AppError> {
    match (cookie_value, submitted) {
        (Some(c), Some(s)) if bool::from(csrf_token(c).as_bytes().ct_eq(s.as_bytes())) => Ok(()),
        _ => Err(AppError::Csrf),
    }
}

/// The pre-session cookie of this request, or a new one to set.
pub fn pre_session(headers: &HeaderMap) -> (String, Option<HeaderValue>) {
    match cookie(headers, PRE_SESSION_COOKIE) {
        Some(v) => (v.to_owned(), None),
        None => {
            let v = token::generate("");
            let set = set_cookie(headers, PRE_SESSION_COOKIE, &v, 24 * 3600);
            (v, Some(set))
        }
    }
}

/// Starts a session for `worker_id`; returns the `Set-Cookie` value.
pub async fn start(
    state: &AppState,
    headers: &HeaderMap,
    worker_id: Uuid,
) -> Result<HeaderValue, AppError> {
    let id = Uuid::new_v4();
    let (secret, hash) = issue_token(SESSION_PREFIX, id);
    let now = clock::now();
    state
        .store
        .create_session(id, worker_id, hash, now, now + Duration::days(SESSION_DAYS))
        .await?;
    Ok(set_cookie(
        headers,
        SESSION_COOKIE,
        &secret,
        SESSION_DAYS * 24 * 3600,
    ))
}

/// A signed-in worker. Extracting it from a request without a valid
/// session sends the browser to the sign-in page.
#[derive(Debug, Clone)]
pub struct WorkerSession {
    pub session_id: Uuid,
    pub worker: Worker,
    /// The CSRF token every form of this session carries.
    pub csrf: String,
    cookie: String,
}

impl WorkerSession {
    /// Checks the CSRF token a form of this session submitted.
    pub fn check_csrf(&self, submitted: Option<&str>) -> Result<(), AppError> {
        check_csrf(Some(&self.cookie), submitted)
    }
}

impl FromRequestParts<AppState> for WorkerSession {
    type Rejection = AppError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let value = cookie(&parts.headers, SESSION_COOKIE).ok_or(AppError::SignIn)?;
        let id = credential_subject(value, SESSION_PREFIX).ok_or(AppError::SignIn)?;
        let session = state
            .store
            .session(id, clock::now())
            .await?
            .ok_or(AppError::SignIn)?;
        if !session.secret_hash.verify(value) {
            return Err(AppError::SignIn);
        }
        Ok(WorkerSession {
            session_id: id,
            worker: session.worker,
            csrf: csrf_token(value),
            cookie: value.to_owned(),
        })
    }
}

/// A digest for a credential presented in a URL (an invite code).
pub fn digest(credential: &str) -> TokenHash {
    TokenHash::of(credential)
}
