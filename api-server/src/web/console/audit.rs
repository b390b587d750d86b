//! The console's audit trail: filtered by principal, action and time,
//! paged, and downloaded as CSV.

use askama::Template;
use axum::extract::Query;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use meatspace_domain::identity::AuditAction;
use meatspace_store::{AuditEntry, AuditFilter};
use serde::Deserialize;
use uuid::Uuid;

use super::{Console, Nav, optional};
use crate::AppState;
use crate::http::error::ApiError;
use crate::web::{AppError, html};

pub(super) fn router() -> axum::Router<AppState> {
    axum::Router::new()
        .route("/console/audit", axum::routing::get(audit))
        .route("/console/audit.csv", axum::routing::get(audit_csv))
}

/// Audit entries on a page.
const AUDIT_PAGE: u32 = 50;
/// Most audit entries in one CSV download.
const AUDIT_CSV_MAX: u32 = 10_000;

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
        let principal = optional(&self.principal, |p| {
            Uuid::try_parse(p).map_err(|_| "The principal must be an id.".to_owned())
        })?;
        let action = optional(&self.action, |a| {
            AuditAction::parse(a).ok_or_else(|| format!("No action is called {a:?}."))
        })?;
        Ok(AuditFilter {
            principal,
            action,
            target: None,
            since: time(&self.since)?,
            until: time(&self.until)?,
            before: self.before,
            limit,
        })
    }

    /// The query string of this filter, for links.
    fn query(&self, before: Option<i64>) -> String {
        super::filter_query(
            &[
                ("principal", &self.principal),
                ("action", &self.action),
                ("since", &self.since),
                ("until", &self.until),
            ],
            before.map(|b| b.to_string()),
        )
    }
}

/// A time from a form: RFC 3339, or the `datetime-local` input's
/// `YYYY-MM-DDTHH:MM` taken as UTC.
pub(super) fn time(s: &str) -> Result<Option<DateTime<Utc>>, String> {
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

async fn audit(c: Console, Query(q): Query<AuditQuery>) -> Result<Response, AppError> {
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
    let mut entries = c.state.store.audit(&filter).await?;
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
async fn audit_csv(c: Console, Query(q): Query<AuditQuery>) -> Result<Response, AppError> {
    let filter = q
        .filter(AUDIT_CSV_MAX)
        .map_err(|e| AppError::Page(StatusCode::BAD_REQUEST, "Not a filter", e))?;
    let entries = c.state.store.audit(&filter).await?;
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
    fn form_times_are_utc() {
        assert_eq!(
            time("2026-12-05T14:30").unwrap(),
            Some(DateTime::from_timestamp(1_796_481_000, 0).unwrap())
        );
        assert!(time("yesterday").is_err());
        assert_eq!(time("").unwrap(), None);
    }
}
