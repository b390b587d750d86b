//! One router per resource, merged in [`crate::router`].

pub mod audit;
pub mod capabilities;
pub mod eligibility;
pub mod events;
pub mod health;
pub mod invites;
pub mod keys;
pub mod notifications;
pub mod qualifications;
pub mod results;
pub mod stream;
pub mod tasks;
pub mod worker_tasks;
pub mod workers;

pub use meatspace_api_types::{EventPage, TaskChange};
use meatspace_domain::Task;

use uuid::Uuid;

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

/// The answer of an action: the task as written and the events appended.
pub fn task_change(applied: meatspace_store::Applied) -> TaskChange {
    TaskChange {
        task: applied.task,
        events: applied.events,
    }
}
use crate::http::error::ApiError;

/// A page size from a query: `default` when absent, 400 outside 1..=`max`.
pub(crate) fn page_limit(limit: Option<u32>, default: u32, max: u32) -> Result<u32, ApiError> {
    let limit = limit.unwrap_or(default);
    if (1..=max).contains(&limit) {
        Ok(limit)
    } else {
        Err(ApiError::bad_request(
            "invalid-query",
            format!("limit must be between 1 and {max}"),
        ))
    }
}

/// The cursor after `t` in a listing ordered by creation.
pub(crate) fn encode_task_cursor(t: &Task) -> String {
    format!("{}.{}", t.created_at.timestamp_millis(), t.id.simple())
}

/// Reads [`encode_task_cursor`]'s form; 400 for anything else.
pub(crate) fn decode_task_cursor(s: &str) -> Result<meatspace_store::OpenTasksCursor, ApiError> {
    let parsed = s.split_once('.').and_then(|(ms, id)| {
        Some(meatspace_store::OpenTasksCursor {
            created_at: chrono::DateTime::from_timestamp_millis(ms.parse().ok()?)?,
            id: Uuid::try_parse(id).ok()?,
        })
    });
    parsed.ok_or_else(|| ApiError::bad_request("invalid-query", "cursor is not valid"))
}

/// Reads a cursor that is the last id of the previous page; 400 otherwise.
pub(crate) fn decode_id_cursor(s: &str) -> Result<Uuid, ApiError> {
    Uuid::try_parse(s).map_err(|_| ApiError::bad_request("invalid-query", "cursor is not valid"))
}

/// Validates free text written by a client: present, within `max`
/// characters, and free of NUL (which no database column accepts).
pub fn checked_text(field: &str, value: &str, max: usize) -> Result<String, ApiError> {
    if value.trim().is_empty() {
        return Err(ApiError::invalid(format!("{field} must not be empty")));
    }
    let chars = value.chars().count();
    if chars > max {
        return Err(ApiError::invalid(format!(
            "{field} has {chars} characters; the limit is {max}"
        )));
    }
    if value.contains('\0') {
        return Err(ApiError::invalid(format!(
            "{field} must not contain NUL characters"
        )));
    }
    Ok(value.to_owned())
}

/// Like [`checked_text`] for optional fields.
pub fn checked_optional_text(
    field: &str,
    value: Option<&str>,
    max: usize,
) -> Result<Option<String>, ApiError> {
    value.map(|v| checked_text(field, v, max)).transpose()
}

fn no_such(what: &str) -> ApiError {
    ApiError::NotFound(format!("no such {what}"))
}

/// `limit` and `cursor` of an operator's listing.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PageQuery {
    /// Largest page (1-200, default 50).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

impl PageQuery {
    /// One page of a listing ordered by id, and its `next_cursor`: `read`
    /// is asked for one item more than the limit after the cursor's id.
    async fn read<T, F>(
        &self,
        read: impl FnOnce(Option<Uuid>, u32) -> F,
        id: impl Fn(&T) -> Uuid,
    ) -> Result<(Vec<T>, Option<String>), ApiError>
    where
        F: Future<Output = Result<Vec<T>, meatspace_store::StoreError>>,
    {
        let after = self.cursor.as_deref().map(decode_id_cursor).transpose()?;
        let limit = page_limit(self.limit, 50, 200)?;
        let items = read(after, limit + 1).await?;
        Ok(page(items, limit, id))
    }
}

/// A page of `items` read with one more than `limit`, and the cursor of
/// the next page (`cursor` of its last item) when there is one.
fn page<T, C: ToString>(
    mut items: Vec<T>,
    limit: u32,
    cursor: impl Fn(&T) -> C,
) -> (Vec<T>, Option<String>) {
    let more = items.len() > limit as usize;
    items.truncate(limit as usize);
    let next = more
        .then(|| items.last().map(|i| cursor(i).to_string()))
        .flatten();
    (items, next)
}

/// A JSON answer that shows a secret once (a new key, token or invite
/// link): no cache may keep it.
fn secret_answer(status: StatusCode, body: impl serde::Serialize) -> Response {
    (
        status,
        [(header::CACHE_CONTROL, "no-store")],
        axum::Json(body),
    )
        .into_response()
}
