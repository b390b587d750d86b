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
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use chrono::{DateTime, Duration, TimeDelta, Utc};
use meatspace_domain::TaskState;
use meatspace_domain::identity::{AuditAction, Scope};
use meatspace_store::console::{ConsoleSession, HourCount};
use meatspace_store::token::{self, TokenHash};
use meatspace_store::{AuditEntry, AuditFilter};
use serde::Deserialize;
use uuid::Uuid;

use super::session::{SameOrigin, check_csrf, cookie, csrf_token};
use super::{AppError, html, with_cookie};
use crate::AppState;
use crate::auth::{Caller, credential_subject, issue_token, verify_key};
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
/// Audit entries on a page.
const AUDIT_PAGE: u32 = 50;
/// Most audit entries in one CSV download.
const AUDIT_CSV_MAX: u32 = 10_000;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/console", get(overview))
        .route("/console/", get(|| async { Redirect::to("/console") }))
        .route("/console/login", get(login_form).post(login))
        .route("/console/logout", post(logout))
        .route("/console/audit", get(audit))
        .route("/console/audit.csv", get(audit_csv))
}

// ---------------------------------------------------------------- cookies

fn session_cookie(secure: bool) -> &'static str {
    if secure {
        "__Host-ms_console"
    } else {
        "ms_console"
    }
}

fn pre_session_cookie(secure: bool) -> &'static str {
    if secure {
        "__Host-ms_console_pre"
    } else {
        "ms_console_pre"
    }
}

/// A console cookie: `HttpOnly`, `SameSite=Strict`; `__Host-` ones have
/// path `/` and `Secure` (as the prefix demands), the others are scoped
/// to the console. `max_age` 0 deletes it.
fn set_cookie(secure: bool, name: &str, value: &str, max_age: i64) -> HeaderValue {
    let path = if name.starts_with("__Host-") {
        "/"
    } else {
        "/console"
    };
    let secure = if secure { "; Secure" } else { "" };
    HeaderValue::from_str(&format!(
        "{name}={value}; Path={path}; Max-Age={max_age}; HttpOnly; SameSite=Strict{secure}"
    ))
    .expect("cookie values are URL-safe base64 and ids")
}

// ---------------------------------------------------------------- session

/// A signed-in operator. Extracting it without a valid session sends the
/// browser to the sign-in page.
#[derive(Debug, Clone)]
pub struct Console {
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
        if !parts.method.is_safe() {
            SameOrigin::from_request_parts(parts, state).await?;
        }
        let secure = state.public_origin.secure(&parts.headers);
        let Some(value) = cookie(&parts.headers, session_cookie(secure)) else {
            return Err(AppError::Redirect("/console/login"));
        };
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
struct Nav {
    csrf: String,
    who: String,
}

impl Nav {
    fn of(c: &Console) -> Self {
        Nav {
            csrf: c.csrf.clone(),
            who: match c.caller.key_id {
                Some(key) => format!("key {key}"),
                None => "the development key".into(),
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

/// A page posted before signing in: the pre-session cookie (set when the
/// browser has none) and its CSRF token.
fn pre_session(state: &AppState, headers: &HeaderMap) -> (String, Option<HeaderValue>) {
    let secure = state.public_origin.secure(headers);
    let name = pre_session_cookie(secure);
    match cookie(headers, name) {
        Some(v) => (v.to_owned(), None),
        None => {
            let v = token::generate("");
            (v.clone(), Some(set_cookie(secure, name, &v, 3600)))
        }
    }
}

fn login_page(
    state: &AppState,
    headers: &HeaderMap,
    notice: Option<&'static str>,
    error: Option<&'static str>,
) -> Response {
    let (pre, set) = pre_session(state, headers);
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
        cookie(&headers, pre_session_cookie(secure)),
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
    let Some(caller) = caller else {
        // The key is a secret: it is never sent back into the page.
        let page = login_page(
            &state,
            &headers,
            None,
            Some("That key is not valid. Check that you pasted all of it."),
        );
        return Ok((StatusCode::UNAUTHORIZED, page).into_response());
    };
    if !caller.is_operator() {
        let page = login_page(
            &state,
            &headers,
            None,
            Some("That key is valid but not an operator's: the console needs the operator scope."),
        );
        return Ok((StatusCode::FORBIDDEN, page).into_response());
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
        Some(set_cookie(
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

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct CsrfForm {
    csrf: Option<String>,
}

async fn logout(
    State(state): State<AppState>,
    c: Console,
    address: ClientAddress,
    headers: HeaderMap,
    axum::extract::Form(form): axum::extract::Form<CsrfForm>,
) -> Result<Response, AppError> {
    let secure = state.public_origin.secure(&headers);
    check_csrf(
        cookie(&headers, session_cookie(secure)),
        form.csrf.as_deref(),
    )?;
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
        Some(set_cookie(secure, session_cookie(secure), "", 0)),
    ))
}

// ---------------------------------------------------------------- overview

/// One bar pair of the chart, in the SVG's coordinates.
#[derive(Debug, Clone)]
struct Bar {
    x: u32,
    created_y: u32,
    created_h: u32,
    completed_y: u32,
    completed_h: u32,
    label: String,
}

#[derive(Template)]
#[template(path = "console_overview.html")]
struct OverviewPage {
    nav: Option<Nav>,
    counts: Vec<(&'static str, u64)>,
    total: u64,
    oldest: Option<(Uuid, String, String)>,
    bars: Vec<Bar>,
    day_created: u64,
    day_completed: u64,
    week_created: u64,
    week_completed: u64,
    peak: u64,
}

/// Chart geometry: 24 hours, each a pair of bars.
const CHART_HEIGHT: u32 = 120;
const SLOT: u32 = 16;

fn bars(hours: &[HourCount], now: DateTime<Utc>) -> (Vec<Bar>, u64) {
    let this_hour = now - Duration::seconds(now.timestamp() % 3600);
    let slots: Vec<(DateTime<Utc>, u64, u64)> = (0..24)
        .rev()
        .map(|i| {
            let hour = this_hour - Duration::hours(i);
            let h = hours.iter().find(|h| h.hour == hour);
            (
                hour,
                h.map_or(0, |h| h.created),
                h.map_or(0, |h| h.completed),
            )
        })
        .collect();
    let peak = slots
        .iter()
        .map(|(_, c, d)| (*c).max(*d))
        .max()
        .unwrap_or(0)
        .max(1);
    let scale = |n: u64| ((n * u64::from(CHART_HEIGHT)) / peak) as u32;
    let bars = slots
        .iter()
        .enumerate()
        .map(|(i, (hour, created, completed))| {
            let (ch, dh) = (scale(*created), scale(*completed));
            Bar {
                x: i as u32 * SLOT + 2,
                created_y: CHART_HEIGHT - ch,
                created_h: ch,
                completed_y: CHART_HEIGHT - dh,
                completed_h: dh,
                label: format!(
                    "{} UTC: {created} created, {completed} completed",
                    hour.format("%H:00")
                ),
            }
        })
        .collect();
    (bars, peak)
}

async fn overview(State(state): State<AppState>, c: Console) -> Result<Response, AppError> {
    let now = state.clock.now();
    let counts = state.store.task_counts().await?;
    let hours = state.store.tasks_per_hour(now - Duration::days(7)).await?;
    let day_start = now - Duration::hours(24);
    let sum = |since: DateTime<Utc>, f: fn(&HourCount) -> u64| -> u64 {
        hours.iter().filter(|h| h.hour >= since).map(f).sum()
    };
    let oldest = state.store.oldest_open_task().await?.map(|t| {
        let since = t.published_at.unwrap_or(t.created_at);
        (t.id, since.to_rfc3339(), age(now - since))
    });
    let (bars, peak) = bars(&hours, now);
    let page = OverviewPage {
        nav: Some(Nav::of(&c)),
        total: counts.iter().map(|(_, n)| n).sum(),
        counts: TaskState::ALL
            .iter()
            .map(|s| {
                (
                    s.as_str(),
                    counts.iter().find(|(t, _)| t == s).map_or(0, |(_, n)| *n),
                )
            })
            .collect(),
        oldest,
        bars,
        day_created: sum(day_start, |h| h.created),
        day_completed: sum(day_start, |h| h.completed),
        week_created: sum(now - Duration::days(7), |h| h.created),
        week_completed: sum(now - Duration::days(7), |h| h.completed),
        peak,
    };
    Ok(html(&page))
}

/// `3 h 20 min`, `45 s`: how long, for people.
fn age(d: TimeDelta) -> String {
    let s = d.num_seconds().max(0);
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min", s / 60),
        3600..86400 => format!("{} h {} min", s / 3600, (s % 3600) / 60),
        _ => format!("{} d {} h", s / 86400, (s % 86400) / 3600),
    }
}

// ---------------------------------------------------------------- audit

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct AuditQuery {
    principal: String,
    action: String,
    since: String,
    until: String,
    before: Option<i64>,
}

impl AuditQuery {
    /// The store's filter, or what is wrong with the form.
    fn filter(&self, limit: u32) -> Result<AuditFilter, String> {
        let principal = match self.principal.trim() {
            "" => None,
            p => Some(Uuid::try_parse(p).map_err(|_| "The principal must be an id.".to_owned())?),
        };
        let action = match self.action.trim() {
            "" => None,
            a => Some(AuditAction::parse(a).ok_or_else(|| format!("No action is called {a:?}."))?),
        };
        Ok(AuditFilter {
            principal,
            action,
            since: time(&self.since)?,
            until: time(&self.until)?,
            before: self.before,
            limit,
        })
    }

    /// The query string of this filter, for links.
    fn query(&self, before: Option<i64>) -> String {
        let mut q = url::form_urlencoded::Serializer::new(String::new());
        for (k, v) in [
            ("principal", &self.principal),
            ("action", &self.action),
            ("since", &self.since),
            ("until", &self.until),
        ] {
            if !v.trim().is_empty() {
                q.append_pair(k, v.trim());
            }
        }
        if let Some(b) = before {
            q.append_pair("before", &b.to_string());
        }
        q.finish()
    }
}

/// A time from a form: RFC 3339, or the `datetime-local` input's
/// `YYYY-MM-DDTHH:MM` taken as UTC.
fn time(s: &str) -> Result<Option<DateTime<Utc>>, String> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(None);
    }
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Ok(Some(t.with_timezone(&Utc)));
    }
    chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M")
        .map(|t| Some(t.and_utc()))
        .map_err(|_| format!("{s:?} is not a time (2026-12-05T14:30)."))
}

#[derive(Template)]
#[template(path = "console_audit.html")]
struct AuditPage {
    nav: Option<Nav>,
    q: AuditQueryView,
    actions: Vec<&'static str>,
    entries: Vec<AuditRow>,
    next: Option<String>,
    csv: String,
    error: Option<String>,
}

struct AuditQueryView {
    principal: String,
    action: String,
    since: String,
    until: String,
}

struct AuditRow {
    id: i64,
    at: String,
    principal: String,
    action: &'static str,
    target: String,
    address: String,
}

impl From<&AuditEntry> for AuditRow {
    fn from(e: &AuditEntry) -> Self {
        AuditRow {
            id: e.id,
            at: e.at.to_rfc3339(),
            principal: if e.principal.name.is_empty() {
                e.principal.id.to_string()
            } else {
                format!("{} ({})", e.principal.name, e.principal.id)
            },
            action: e.action.as_str(),
            target: e.target.clone(),
            address: e.address.clone().unwrap_or_default(),
        }
    }
}

async fn audit(
    State(state): State<AppState>,
    c: Console,
    Query(q): Query<AuditQuery>,
) -> Result<Response, AppError> {
    let view = AuditQueryView {
        principal: q.principal.clone(),
        action: q.action.clone(),
        since: q.since.clone(),
        until: q.until.clone(),
    };
    let actions = AuditAction::ALL.iter().map(|a| a.as_str()).collect();
    let filter = match q.filter(AUDIT_PAGE + 1) {
        Ok(f) => f,
        Err(error) => {
            let page = AuditPage {
                nav: Some(Nav::of(&c)),
                q: view,
                actions,
                entries: Vec::new(),
                next: None,
                csv: String::new(),
                error: Some(error),
            };
            return Ok((StatusCode::BAD_REQUEST, html(&page)).into_response());
        }
    };
    let mut entries = state.store.audit(&filter).await?;
    let next = (entries.len() > AUDIT_PAGE as usize).then(|| {
        entries.truncate(AUDIT_PAGE as usize);
        q.query(entries.last().map(|e| e.id))
    });
    let page = AuditPage {
        nav: Some(Nav::of(&c)),
        q: view,
        actions,
        entries: entries.iter().map(AuditRow::from).collect(),
        next,
        csv: q.query(None),
        error: None,
    };
    Ok(html(&page))
}

/// The filtered trail as CSV (newest first, at most 10,000 entries).
async fn audit_csv(
    State(state): State<AppState>,
    _c: Console,
    Query(q): Query<AuditQuery>,
) -> Result<Response, AppError> {
    let filter = q
        .filter(AUDIT_CSV_MAX)
        .map_err(|e| AppError::Page(StatusCode::BAD_REQUEST, "Not a filter", e))?;
    let entries = state.store.audit(&filter).await?;
    let mut out = csv::Writer::from_writer(Vec::new());
    let csv_error = |e: csv::Error| AppError::Api(ApiError::Internal(e.into()));
    out.write_record([
        "id",
        "at",
        "principal_id",
        "principal_kind",
        "principal_name",
        "action",
        "target",
        "address",
        "detail",
    ])
    .map_err(csv_error)?;
    for e in &entries {
        out.write_record([
            e.id.to_string(),
            e.at.to_rfc3339(),
            e.principal.id.to_string(),
            e.principal.kind.as_str().to_owned(),
            // A name may start with = or +: spreadsheets must not take it
            // for a formula.
            defused(&e.principal.name),
            e.action.as_str().to_owned(),
            defused(&e.target),
            e.address.clone().unwrap_or_default(),
            e.detail
                .as_ref()
                .map(|d| defused(&d.to_string()))
                .unwrap_or_default(),
        ])
        .map_err(csv_error)?;
    }
    let body = out
        .into_inner()
        .map_err(|e| AppError::Api(ApiError::Internal(anyhow::anyhow!("{e}"))))?;
    Ok((
        [
            (header::CONTENT_TYPE, "text/csv; charset=utf-8"),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"meatspace-audit.csv\"",
            ),
        ],
        body,
    )
        .into_response())
}

/// A cell a spreadsheet shows as text: one starting with `= + - @` (or a
/// tab or carriage return) gets a leading apostrophe (OWASP's advice on
/// CSV injection).
fn defused(s: &str) -> String {
    if s.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{s}")
    } else {
        s.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formulas_are_defused() {
        assert_eq!(defused("=HYPERLINK(\"x\")"), "'=HYPERLINK(\"x\")");
        assert_eq!(defused("key:1"), "key:1");
    }

    #[test]
    fn the_chart_has_24_hours_scaled_to_the_peak() {
        let now = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        let this_hour = now - Duration::seconds(now.timestamp() % 3600);
        let hours = [HourCount {
            hour: this_hour,
            created: 4,
            completed: 2,
        }];
        let (bars, peak) = bars(&hours, now);
        assert_eq!((bars.len(), peak), (24, 4));
        let last = bars.last().unwrap();
        assert_eq!(
            (last.created_h, last.completed_h),
            (CHART_HEIGHT, CHART_HEIGHT / 2)
        );
        assert!(bars[..23].iter().all(|b| b.created_h == 0));
    }

    #[test]
    fn form_times_are_utc() {
        assert_eq!(
            time("2026-12-05T14:30").unwrap(),
            Some(DateTime::from_timestamp(1_796_481_000, 0).unwrap())
        );
        assert!(time("yesterday").is_err());
        assert_eq!(time("").unwrap(), None);
    }
}
