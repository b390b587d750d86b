//! Browser sessions and CSRF protection of the worker web app.
//!
//! The session cookie holds `mss_<session id>_<secret>`; the store keeps the
//! secret's SHA-256 digest, looked up by id and compared in constant time,
//! like every other credential. The cookie is HttpOnly, SameSite=Lax,
//! scoped to `/app`, and Secure when the server's public URL is https
//! ([`crate::public_url`]).
//!
//! Every form carries a CSRF token derived from a cookie the page's origin
//! alone can read: the session cookie once signed in, otherwise a random
//! pre-session cookie (for the invite and sign-in forms). The token is the
//! digest of that cookie's value, so a cross-site page, which cannot read
//! the cookie, cannot compute it, and the server keeps no extra state.
//! A double-submitted cookie is only as strong as the cookie's origin, and
//! a sibling subdomain or another port of the same host can set cookies
//! too: so when secure the pre-session cookie is `__Host-` prefixed (the
//! browser accepts it only from this very origin, over TLS, for path `/`),
//! and every state-changing form is also refused when the browser says it
//! comes from elsewhere ([`SameOrigin`]: `Sec-Fetch-Site`, `Origin`).

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, header};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::Duration;
use meatspace_store::Worker;
use meatspace_store::token::{self, TokenHash};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use uuid::Uuid;

use super::AppError;
use crate::AppState;
use crate::auth::{credential_subject, issue_token};

/// Name of the session cookie.
pub const SESSION_COOKIE: &str = "ms_session";
/// Name of the pre-session cookie behind the CSRF token of the sign-in
/// forms, over plain HTTP.
pub const PRE_SESSION_COOKIE: &str = "ms_presession";
/// Its name when cookies are Secure: a `__Host-` cookie cannot be set by
/// another origin (a sibling subdomain, another port).
pub const SECURE_PRE_SESSION_COOKIE: &str = "__Host-ms_presession";
/// Prefix of session cookie values.
const SESSION_PREFIX: &str = "mss_";
/// How long a session lasts.
pub const SESSION_DAYS: i64 = 14;

/// A family of cookies, the web app's ([`APP_COOKIES`]) or the console's:
/// where they live, and the pre-session cookie behind the CSRF token of
/// the forms posted before signing in.
#[derive(Debug, Clone, Copy)]
pub struct Cookies {
    /// The path of the cookies without the `__Host-` prefix.
    pub path: &'static str,
    /// Their `SameSite` attribute.
    pub same_site: &'static str,
    /// The pre-session cookie's name over plain HTTP.
    pub pre_session: &'static str,
    /// Its name when cookies are Secure.
    pub secure_pre_session: &'static str,
    /// How long a pre-session cookie lasts, in seconds.
    pub pre_session_seconds: i64,
}

/// The web app's cookies.
pub const APP_COOKIES: Cookies = Cookies {
    path: "/app",
    same_site: "Lax",
    pre_session: PRE_SESSION_COOKIE,
    secure_pre_session: SECURE_PRE_SESSION_COOKIE,
    pre_session_seconds: 24 * 3600,
};

impl Cookies {
    /// The name of the pre-session cookie, by whether cookies are Secure.
    pub fn pre_session_cookie(&self, secure: bool) -> &'static str {
        if secure {
            self.secure_pre_session
        } else {
            self.pre_session
        }
    }

    /// A `Set-Cookie` value of this family, `HttpOnly`: a `__Host-` cookie
    /// has path `/` (and Secure, no Domain, as the prefix demands), the
    /// others this family's path. `max_age` 0 deletes the cookie.
    pub fn set(&self, secure: bool, name: &str, value: &str, max_age: i64) -> HeaderValue {
        let path = if name.starts_with("__Host-") {
            "/"
        } else {
            self.path
        };
        let same_site = self.same_site;
        let secure = if secure { "; Secure" } else { "" };
        let value = format!(
            "{name}={value}; Path={path}; Max-Age={max_age}; HttpOnly; SameSite={same_site}{secure}"
        );
        HeaderValue::from_str(&value).expect("cookie values are URL-safe base64 and ids")
    }

    /// The pre-session cookie of this request, or a new one to set.
    pub fn pre_session(
        &self,
        state: &AppState,
        headers: &HeaderMap,
    ) -> (String, Option<HeaderValue>) {
        let secure = state.public_origin.secure(headers);
        let name = self.pre_session_cookie(secure);
        match cookie(headers, name) {
            Some(v) => (v.to_owned(), None),
            None => {
                let v = token::generate("");
                let set = self.set(secure, name, &v, self.pre_session_seconds);
                (v, Some(set))
            }
        }
    }
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

/// The value of this request's pre-session cookie, under the name cookies
/// of this request's kind carry.
pub fn pre_session_value<'a>(state: &AppState, headers: &'a HeaderMap) -> Option<&'a str> {
    cookie(
        headers,
        APP_COOKIES.pre_session_cookie(state.public_origin.secure(headers)),
    )
}

/// Starts a session for `worker_id`; returns the `Set-Cookie` value.
pub async fn start(
    state: &AppState,
    headers: &HeaderMap,
    worker_id: Uuid,
) -> Result<HeaderValue, AppError> {
    let id = Uuid::new_v4();
    let (secret, hash) = issue_token(SESSION_PREFIX, id);
    let now = state.clock.now();
    state
        .store
        .create_session(id, worker_id, hash, now, now + Duration::days(SESSION_DAYS))
        .await?;
    Ok(APP_COOKIES.set(
        state.public_origin.secure(headers),
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
        let value = session_cookie(parts, state, SESSION_COOKIE)
            .await?
            .ok_or(AppError::SignIn)?;
        let id = credential_subject(value, SESSION_PREFIX).ok_or(AppError::SignIn)?;
        let session = state
            .store
            .session(id, state.clock.now())
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

/// The value of the session cookie `name` a request carries, for the
/// worker's and the console's sessions alike. Every form of a session
/// changes something: a cross-site one is refused ([`SameOrigin`]) before
/// the session is even looked up.
pub async fn session_cookie<'p>(
    parts: &'p mut Parts,
    state: &AppState,
    name: &str,
) -> Result<Option<&'p str>, AppError> {
    if !parts.method.is_safe() {
        SameOrigin::from_request_parts(parts, state).await?;
    }
    Ok(cookie(&parts.headers, name))
}

/// A state-changing request that the browser did not mark as coming from
/// another site. `Sec-Fetch-Site` (sent by every current browser) must be
/// `same-origin` (or `none`, a request the user made directly); an
/// `Origin` header other than `null` must be this server's public origin.
/// A client that sends neither (not a browser) still needs the CSRF token.
#[derive(Debug, Clone, Copy)]
pub struct SameOrigin;

impl FromRequestParts<AppState> for SameOrigin {
    type Rejection = AppError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let expected = state.public_origin.origin(&parts.headers);
        if same_origin(&parts.headers, &expected) {
            Ok(SameOrigin)
        } else {
            Err(AppError::Csrf)
        }
    }
}

/// Whether a request's `Sec-Fetch-Site` and `Origin` allow it to come from
/// `expected` (`scheme://host[:port]`).
pub fn same_origin(headers: &HeaderMap, expected: &str) -> bool {
    if let Some(site) = headers.get("sec-fetch-site") {
        let site = site.to_str().unwrap_or_default();
        if !(site.eq_ignore_ascii_case("same-origin") || site.eq_ignore_ascii_case("none")) {
            return false;
        }
    }
    match headers
        .get(header::ORIGIN)
        .map(|o| o.to_str().unwrap_or_default())
    {
        // Under this app's `Referrer-Policy: no-referrer` a browser sends
        // `Origin: null` with every form, its own included: that says
        // nothing, and `Sec-Fetch-Site` (checked above) decides.
        Some(origin) if origin != "null" => origin.eq_ignore_ascii_case(expected),
        _ => true,
    }
}

/// A digest for a credential presented in a URL (an invite code).
pub fn digest(credential: &str) -> TokenHash {
    TokenHash::of(credential)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::public_url::tests::headers;

    #[test]
    fn forms_from_other_origins_are_refused() {
        let us = "https://m.example";
        assert!(same_origin(&headers(&[]), us), "no browser headers");
        // What a browser sends under Referrer-Policy: no-referrer.
        assert!(same_origin(
            &headers(&[("sec-fetch-site", "same-origin"), ("origin", "null")]),
            us
        ));
        assert!(same_origin(
            &headers(&[
                ("sec-fetch-site", "same-origin"),
                ("origin", "https://m.example")
            ]),
            us
        ));
        for bad in [
            headers(&[("sec-fetch-site", "same-site")]),
            headers(&[("sec-fetch-site", "cross-site")]),
            headers(&[("origin", "https://evil.m.example")]),
            headers(&[("origin", "https://m.example:8443")]),
            headers(&[("origin", "http://m.example")]),
            headers(&[("origin", "null"), ("sec-fetch-site", "cross-site")]),
            headers(&[
                ("sec-fetch-site", "same-origin"),
                ("origin", "https://evil.example"),
            ]),
        ] {
            assert!(!same_origin(&bad, us), "{bad:?}");
        }
    }

    #[test]
    fn a_secure_pre_session_cookie_is_host_prefixed() {
        let cookies = APP_COOKIES;
        assert_eq!(cookies.pre_session_cookie(true), "__Host-ms_presession");
        let set = cookies.set(true, cookies.pre_session_cookie(true), "v", 60);
        let set = set.to_str().unwrap();
        assert!(
            set.contains("; Path=/;") && set.ends_with("; Secure"),
            "{set}"
        );
        assert!(!set.contains("Domain"), "{set}");
        let plain = cookies.set(false, cookies.pre_session_cookie(false), "v", 60);
        assert!(
            plain
                .to_str()
                .unwrap()
                .starts_with("ms_presession=v; Path=/app;")
        );
    }
}
