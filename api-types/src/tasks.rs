//! The agent's task resource: create, read, act, follow its feed.

use chrono::{DateTime, Utc};
use meatspace_domain::webhook::Webhook;
use meatspace_domain::{Event, IssueAction, Presence, Task, TaskState};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Body of `POST /api/v1/tasks`.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "utoipa", schema(as = CreateTaskRequest))]
#[serde(deny_unknown_fields)]
pub struct CreateTask {
    /// What to do, in plain text (1-4000 characters).
    #[cfg_attr(
        feature = "utoipa",
        schema(min_length = 1, max_length = 4000, pattern = r"\S")
    )]
    pub description: String,
    /// Lifetime of the task in seconds from now; bounds in the capabilities
    /// document. When it ends, a task that has not started expires.
    pub expires_in_seconds: Option<i64>,
    /// Where to POST every event of the task (Standard Webhooks 1.0,
    /// signed with the `webhook_secret` of the answer). http or https, to a
    /// public address unless the server's allow-list permits others.
    pub webhook_url: Option<String>,
    /// Where the task is done. Without it the task can be done anywhere
    /// and workers see it without a distance.
    pub location: Option<Place>,
    /// What to ask of the positions a worker's device sends when starting
    /// the task and with each photo (needs `location`; default `none`). A
    /// browser's position is evidence, not proof.
    pub presence: Option<Presence>,
    /// What the worker must send back: a JSON Schema object in the
    /// documented subset (the capabilities document's `result_schema`).
    /// The worker's app shows it as a form; the server refuses a result
    /// that does not match it. Without it the worker completes with a note.
    #[cfg_attr(feature = "utoipa", schema(value_type = Option<Object>))]
    pub result_schema: Option<serde_json::Value>,
    /// Review the work before it counts: the worker's complete becomes a
    /// submission the agent accepts, sends back for revision or rejects.
    pub review: Option<ReviewTerms>,
    /// Who may see and claim the task: every requirement must hold for the
    /// worker's qualifications (at most 20; see the capabilities
    /// document's qualifications). Without them, every worker.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requirements: Vec<meatspace_domain::qualification::Requirement>,
}

/// `review` of a create: how long a submission waits for the agent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ReviewTerms {
    /// Seconds after a submission at which it is accepted if the agent has
    /// not answered (60 to 2592000; default 172800, two days).
    #[cfg_attr(feature = "utoipa", schema(minimum = 60, maximum = 2592000))]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto_accept_seconds: Option<u32>,
}

/// What an agent answers to a submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ReviewAction {
    /// The work counts: the task completes with the submitted result.
    Accept,
    /// Send the work back with `text`; the worker submits again.
    Revise,
    /// The work does not count: the task is cancelled with `text` as the reason.
    Reject,
}

/// Body of `POST /api/v1/tasks/{id}/review`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "utoipa", schema(as = ReviewRequest))]
#[serde(deny_unknown_fields)]
pub struct ReviewAnswer {
    pub action: ReviewAction,
    /// Required to revise (what to change) and to reject (why).
    #[cfg_attr(
        feature = "utoipa",
        schema(min_length = 1, max_length = 4000, pattern = r"\S")
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

impl CreateTask {
    /// A task with the server's default lifetime, no webhook and no place.
    pub fn new(description: impl Into<String>) -> Self {
        CreateTask {
            description: description.into(),
            expires_in_seconds: None,
            webhook_url: None,
            location: None,
            presence: None,
            result_schema: None,
            review: None,
            requirements: Vec::new(),
        }
    }
}

/// A task's place as the agent gives it.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Place {
    /// WGS 84 latitude in degrees, -90 to 90.
    #[cfg_attr(feature = "utoipa", schema(minimum = -90, maximum = 90))]
    pub latitude: f64,
    /// WGS 84 longitude in degrees, -180 to 180.
    #[cfg_attr(feature = "utoipa", schema(minimum = -180, maximum = 180))]
    pub longitude: f64,
    /// Metres around the point that count as on site (1 to 50000; default 100).
    #[cfg_attr(feature = "utoipa", schema(minimum = 1, maximum = 50000))]
    pub radius_m: Option<u32>,
    /// An address line for the worker (1 to 300 characters).
    #[cfg_attr(
        feature = "utoipa",
        schema(min_length = 1, max_length = 300, pattern = r"\S")
    )]
    pub address: Option<String>,
}

/// Answer of `POST /api/v1/tasks`.
#[derive(Clone, Serialize, Deserialize, derive_more::Debug)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct CreatedTask {
    pub task: Task,
    /// Task-scoped bearer credential. Shown only now; store it securely.
    #[debug(skip)]
    pub agent_token: String,
    /// With `webhook_url`: the `whsec_…` secret that signs the deliveries.
    /// Shown only now; store it securely.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[debug(skip)]
    pub webhook_secret: Option<String>,
}

/// The task resource (`GET /api/v1/tasks/{id}`): the task, plus its
/// webhook's delivery state when it has one (never the secret).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct TaskResource {
    #[serde(flatten)]
    pub task: Task,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<Webhook>,
}

/// Answer of every action: the task as it is now and the events the
/// action appended (in feed order).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct TaskChange {
    pub task: Task,
    pub events: Vec<Event>,
}

/// A page of a task's event feed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct EventPage {
    pub task_id: Uuid,
    /// The task's state when the page was read. It is read before the
    /// events, so when it is terminal the feed up to the terminal event is
    /// in this page or the pages after it.
    pub task_state: TaskState,
    /// True when `task_state` is terminal: stop polling once `has_more` is false.
    pub terminal: bool,
    /// Events with `id > after`, ascending.
    pub events: Vec<Event>,
    /// Pass as `after` next time: the last id in this page, or `after` when empty.
    pub next_cursor: i64,
    /// True when more events are available right now.
    pub has_more: bool,
}

crate::page! {
    /// A page of the caller's tasks (`GET /api/v1/tasks`), newest first.
    TaskPage { tasks: Task }
}

/// Body of `POST /api/v1/tasks/{id}/issues/{event_id}/respond`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "utoipa", schema(as = RespondRequest))]
#[serde(deny_unknown_fields)]
pub struct Respond {
    pub action: IssueAction,
    /// Required for clarify and acknowledge; optional for cancel.
    #[cfg_attr(
        feature = "utoipa",
        schema(min_length = 1, max_length = 4000, pattern = r"\S")
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

/// Body of `POST /api/v1/tasks/{id}/extend`: exactly one of the two. The
/// server only ever extends.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "utoipa", schema(as = ExtendRequest))]
#[serde(deny_unknown_fields)]
pub struct Extend {
    /// The new end of the task's lifetime (RFC 3339); must be later than
    /// the current `expires_at`.
    #[cfg_attr(feature = "utoipa", schema(nullable = false))]
    pub expires_at: Option<DateTime<Utc>>,
    /// Seconds to add to the current `expires_at` (at least 1).
    #[cfg_attr(feature = "utoipa", schema(nullable = false, minimum = 1))]
    pub add_seconds: Option<i64>,
}

impl Extend {
    /// A new end of the lifetime.
    pub fn until(expires_at: DateTime<Utc>) -> Self {
        Extend {
            expires_at: Some(expires_at),
            add_seconds: None,
        }
    }

    /// Seconds added to the current end.
    pub fn add_seconds(seconds: i64) -> Self {
        Extend {
            expires_at: None,
            add_seconds: Some(seconds),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_extension_is_one_member_object() {
        let at = DateTime::parse_from_rfc3339("2030-01-02T03:04:05Z")
            .unwrap()
            .to_utc();
        assert_eq!(
            serde_json::to_value(Extend::until(at)).unwrap(),
            serde_json::json!({ "expires_at": "2030-01-02T03:04:05Z" })
        );
        assert_eq!(
            serde_json::to_value(Extend::add_seconds(600)).unwrap(),
            serde_json::json!({ "add_seconds": 600 })
        );
    }

    #[test]
    fn optional_create_fields_are_left_out() {
        // The server refuses unknown fields.
        assert_eq!(
            serde_json::to_value(CreateTask::new("x")).unwrap(),
            serde_json::json!({ "description": "x" })
        );
        let mut full = CreateTask::new("x");
        full.expires_in_seconds = Some(60);
        full.webhook_url = Some("https://agent.example/hook".into());
        let sent = serde_json::to_value(&full).unwrap();
        assert_eq!(
            sent,
            serde_json::json!({
                "description": "x",
                "expires_in_seconds": 60,
                "webhook_url": "https://agent.example/hook"
            })
        );
        assert_eq!(serde_json::from_value::<CreateTask>(sent).unwrap(), full);
        assert!(
            serde_json::from_value::<CreateTask>(serde_json::json!({"description": "x", "x": 1}))
                .is_err()
        );
        assert!(
            serde_json::from_value::<CreateTask>(serde_json::json!(["x"])).is_err(),
            "a body is an object"
        );
    }
}
