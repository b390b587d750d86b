//! The audit trail, for operators: every privileged action, filtered by
//! principal, action and time, newest first.

use chrono::{DateTime, Utc};
use meatspace_api_types as api;
use meatspace_store::AuditFilter;
use serde::Deserialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use super::{page, page_limit};
use crate::AppState;
use crate::auth::Operator;
use crate::http::error::ApiError;
use crate::http::error::responses::AdminListErrors;
use crate::http::extract::Query;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(list_audit))
}

/// Filters of the audit trail.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    /// Only entries of this principal.
    pub principal: Option<Uuid>,
    /// Only entries of this action (e.g. `key.revoked`).
    pub action: Option<meatspace_domain::identity::AuditAction>,
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

/// The audit trail, newest first.
#[utoipa::path(get, path = "/api/v1/audit", tag = "operator", params(AuditQuery),
    responses((status = 200, body = api::AuditPage), AdminListErrors))]
async fn list_audit(
    Operator(op): Operator,
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
        action: q.action,
        target: None,
        since: q.since,
        until: q.until,
        before,
        limit: limit + 1,
    };
    let entries = op.state.store.audit(&filter).await?;
    let (entries, next_cursor) = page(entries, limit, |e| e.id);
    Ok(axum::Json(api::AuditPage {
        entries,
        next_cursor,
    }))
}
