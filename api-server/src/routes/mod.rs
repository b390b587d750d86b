//! One router per resource, merged in [`crate::router`].

pub mod capabilities;
pub mod health;
pub mod tasks;
pub mod workers;

use meatspace_core::{Event, Task};
use serde::Serialize;

use crate::error::ApiError;

/// Returned by every action: the task as it is now and the events the
/// action appended (in feed order).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TaskChange {
    pub task: Task,
    pub events: Vec<Event>,
}

impl From<meatspace_core::store::Applied> for TaskChange {
    fn from(a: meatspace_core::store::Applied) -> Self {
        TaskChange {
            task: a.task,
            events: a.events,
        }
    }
}

/// A page of a task's event feed.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct EventPage {
    pub task_id: uuid::Uuid,
    /// The task's state when the page was read. It is read before the
    /// events, so when it is terminal the feed up to the terminal event is
    /// in this page or the pages after it.
    pub task_state: meatspace_core::TaskState,
    /// True when `task_state` is terminal: stop polling once `has_more` is false.
    pub terminal: bool,
    /// Events with `id > after`, ascending.
    pub events: Vec<Event>,
    /// Pass as `after` next time: the last id in this page, or `after` when empty.
    pub next_cursor: i64,
    /// True when more events are available right now.
    pub has_more: bool,
}

/// `after` and `limit` of an event feed request.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Return events with an id greater than this (start with 0).
    #[serde(default)]
    pub after: i64,
    /// Largest number of events to return (1-1000, default 100).
    pub limit: Option<u32>,
}

/// Largest page of events.
pub const MAX_EVENTS_PAGE: u32 = 1000;
const DEFAULT_EVENTS_PAGE: u32 = 100;

/// Reads a page of the feed: state first, then events (see [`EventPage`]).
pub async fn event_page(
    store: &dyn meatspace_core::Store,
    task: Task,
    q: EventsQuery,
) -> Result<EventPage, ApiError> {
    if q.after < 0 {
        return Err(ApiError::bad_request(
            "invalid-query",
            "after must be 0 or greater",
        ));
    }
    let limit = q.limit.unwrap_or(DEFAULT_EVENTS_PAGE);
    if !(1..=MAX_EVENTS_PAGE).contains(&limit) {
        return Err(ApiError::bad_request(
            "invalid-query",
            format!("limit must be between 1 and {MAX_EVENTS_PAGE}"),
        ));
    }
    let mut events = store.events(task.id, q.after, limit + 1).await?;
    let has_more = events.len() > limit as usize;
    events.truncate(limit as usize);
    let next_cursor = events.last().map_or(q.after, |e| e.id);
    Ok(EventPage {
        task_id: task.id,
        task_state: task.state,
        terminal: task.state.is_terminal(),
        events,
        next_cursor,
        has_more,
    })
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
