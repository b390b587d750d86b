//! The request and response envelopes of the HTTP API.
//!
//! The domain types inside them (`Task`, `Event`, `TaskState`, …) are the
//! server's own from `meatspace-domain`. The envelopes are defined in the
//! server crate with only the serde direction the server needs, so they are
//! mirrored here field for field; the black-box suite
//! (`tests/tests/cli_client.rs`) reads real server answers through them on
//! both backends, which is what keeps the two in step.

use chrono::{DateTime, Utc};
use meatspace_domain::{Event, IssueAction, IssueKind, Task, TaskState};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Body of `POST /api/v1/tasks`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CreateTask {
    /// What to do, in plain text (1-4000 characters).
    pub description: String,
    /// Lifetime in seconds from now; the server's default when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_in_seconds: Option<i64>,
    /// Endpoint that receives the task's events as signed webhooks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub webhook_url: Option<String>,
}

impl CreateTask {
    pub fn new(description: impl Into<String>) -> Self {
        CreateTask {
            description: description.into(),
            expires_in_seconds: None,
            webhook_url: None,
        }
    }
}

/// Answer of `POST /api/v1/tasks`.
#[derive(Debug, Clone, Deserialize)]
pub struct CreatedTask {
    pub task: Task,
    /// Task-scoped bearer credential, shown only in this answer.
    pub agent_token: String,
    /// The webhook endpoint's signing secret (`whsec_…`), shown only in
    /// this answer, when the task was created with a `webhook_url`.
    #[serde(default)]
    pub webhook_secret: Option<String>,
}

/// Answer of every action: the task as it is now and the events the
/// action appended.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct TaskChange {
    pub task: Task,
    pub events: Vec<Event>,
}

/// A page of a task's event feed.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct EventPage {
    pub task_id: Uuid,
    pub task_state: TaskState,
    /// True when `task_state` is terminal: the feed ends once `has_more`
    /// is false.
    pub terminal: bool,
    pub events: Vec<Event>,
    /// `after` for the next page.
    pub next_cursor: i64,
    pub has_more: bool,
}

/// Body of `POST /api/v1/tasks/{id}/issues/{event_id}/respond`.
#[derive(Debug, Clone, Serialize)]
pub struct Respond {
    pub action: IssueAction,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

/// Body of `POST /api/v1/tasks/{id}/extend`: a new deadline, or seconds to
/// add to the current one. The server only ever extends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Extension {
    /// `{"expires_at": …}`
    ExpiresAt(DateTime<Utc>),
    /// `{"add_seconds": …}`
    AddSeconds(i64),
}

/// A registered worker.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Worker {
    pub id: Uuid,
    pub name: String,
    pub created_at: DateTime<Utc>,
}

/// Answer of `POST /api/v1/workers`.
#[derive(Debug, Clone, Deserialize)]
pub struct RegisteredWorker {
    pub worker: Worker,
    /// Bearer credential for the worker API, shown only in this answer.
    pub worker_token: String,
}

/// A page of open tasks.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct OpenTaskPage {
    pub tasks: Vec<Task>,
    /// `cursor` of the next page; absent on the last page.
    pub next_cursor: Option<String>,
}

/// Body of `POST /api/v1/worker/tasks/{id}/issues`.
#[derive(Debug, Clone, Serialize)]
pub struct RaiseIssue {
    pub kind: IssueKind,
    pub text: String,
}

/// A photo as the server serves it to the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Photo {
    pub content_type: String,
    pub bytes: Vec<u8>,
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
            serde_json::to_value(Extension::ExpiresAt(at)).unwrap(),
            serde_json::json!({ "expires_at": "2030-01-02T03:04:05Z" })
        );
        assert_eq!(
            serde_json::to_value(Extension::AddSeconds(600)).unwrap(),
            serde_json::json!({ "add_seconds": 600 })
        );
    }

    #[test]
    fn optional_create_fields_are_left_out() {
        // The server rejects unknown or null fields it does not expect.
        assert_eq!(
            serde_json::to_value(CreateTask::new("x")).unwrap(),
            serde_json::json!({ "description": "x" })
        );
        let mut full = CreateTask::new("x");
        full.expires_in_seconds = Some(60);
        full.webhook_url = Some("https://agent.example/hook".into());
        assert_eq!(
            serde_json::to_value(full).unwrap(),
            serde_json::json!({
                "description": "x",
                "expires_in_seconds": 60,
                "webhook_url": "https://agent.example/hook"
            })
        );
    }
}
