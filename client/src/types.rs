//! The request and response envelopes of the HTTP API.
//!
//! The domain types inside them (`Task`, `Event`, `TaskState`, the
//! principals and scopes of `identity`, …) are the server's own from
//! `meatspace-domain`. The envelopes are defined in the
//! server crate with only the serde direction the server needs, so they are
//! mirrored here field for field; the black-box suite
//! (`tests/tests/cli_client.rs`, `cli_identity.rs`) reads real server answers through them on
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
    /// Set while an operator has suspended the worker: its token and
    /// sessions are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspended_at: Option<DateTime<Utc>>,
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

/// A page of the caller's own tasks (`GET /api/v1/tasks`), newest first:
/// the same envelope as the worker's page of open tasks.
pub type TaskPage = OpenTaskPage;

/// The identity types are the server's own (`meatspace_domain::identity`).
pub use meatspace_domain::identity::{PrincipalKind, PrincipalRef, Scope};

/// An API key as the server shows it (never its secret).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Key {
    /// The id embedded in the key (`msk_<id>_…`).
    pub id: Uuid,
    pub name: String,
    /// Whom the key acts as.
    pub principal: PrincipalRef,
    pub scopes: Vec<Scope>,
    pub created_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_used_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotated_at: Option<DateTime<Utc>>,
    /// After a rotation, the old secret works until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_valid_until: Option<DateTime<Utc>>,
}

/// Body of `POST /api/v1/keys`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CreateKey {
    /// What the key is for (`billing-agent`).
    pub name: String,
    /// The kind of a new principal (the server's default: agent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<PrincipalKind>,
    /// Another key for this existing principal (then `kind` is ignored).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub principal_id: Option<Uuid>,
    /// The default for the kind when absent (agent: tasks; operator:
    /// operator).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scopes: Option<Vec<Scope>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<DateTime<Utc>>,
}

impl CreateKey {
    pub fn new(name: impl Into<String>) -> Self {
        CreateKey {
            name: name.into(),
            kind: None,
            principal_id: None,
            scopes: None,
            expires_at: None,
        }
    }
}

/// A key and its secret (`msk_…`), shown only in this answer: of a
/// create, or of a rotation (the same id, a new secret).
#[derive(Clone, Deserialize, Serialize)]
pub struct KeySecret {
    pub key: Key,
    pub secret: String,
}

impl std::fmt::Debug for KeySecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeySecret")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

/// Answer of `POST /api/v1/keys/{id}/revoke`.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct RevokedKey {
    pub key: Key,
    /// Tasks of the key's principal cancelled with it (`cancel_tasks`).
    pub cancelled_tasks: i64,
}

/// A page of API keys.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct KeyPage {
    pub keys: Vec<Key>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// A page of registered workers.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct WorkerPage {
    pub workers: Vec<Worker>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// Answer of `POST /api/v1/workers/{id}/rotate`: the worker's new token,
/// shown only here (the old one stops working at once).
#[derive(Clone, Deserialize)]
pub struct RotatedWorker {
    pub worker: Worker,
    pub worker_token: String,
}

impl std::fmt::Debug for RotatedWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RotatedWorker")
            .field("worker", &self.worker)
            .finish_non_exhaustive()
    }
}

/// A worker invite, as an operator lists it (never its link).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Invite {
    pub id: Uuid,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<DateTime<Utc>>,
    /// The id of the principal whose key created it.
    pub created_by: Uuid,
}

/// A page of invites.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct InvitePage {
    pub invites: Vec<Invite>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// One privileged action in the audit trail.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct AuditEntry {
    /// Ascending with time; the trail is append-only.
    pub id: i64,
    pub at: DateTime<Utc>,
    /// Who did it.
    pub principal: PrincipalRef,
    /// `key.created`, `worker.suspended`, `dev_key.refused`, … (text, so a
    /// newer server's actions still read).
    pub action: String,
    /// What it was done to: `key:<id>`, `worker:<id>`, `task:<id>`, …
    pub target: String,
    /// The client's address, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<serde_json::Value>,
}

/// A page of the audit trail, newest first.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct AuditPage {
    pub entries: Vec<AuditEntry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// Which audit entries to read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditFilter {
    /// Only this principal's actions.
    pub principal: Option<Uuid>,
    /// At or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Before this time.
    pub until: Option<DateTime<Utc>>,
    pub limit: Option<u32>,
    /// The previous page's `next_cursor`.
    pub cursor: Option<String>,
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
    fn a_key_reads_with_its_optional_fields_absent_or_set() {
        let key: Key = serde_json::from_value(serde_json::json!({
            "id": "0123456789abcdef0123456789abcdef",
            "name": "billing-agent",
            "principal": {"id": "00000000-0000-0000-0000-00000000de00", "kind": "agent", "name": "billing"},
            "scopes": ["tasks", "workers:register"],
            "created_at": "2030-01-01T00:00:00Z",
        }))
        .unwrap();
        assert_eq!(
            key.id.simple().to_string(),
            "0123456789abcdef0123456789abcdef"
        );
        assert_eq!(key.scopes, [Scope::Tasks, Scope::RegisterWorkers]);
        assert_eq!(key.principal.kind, PrincipalKind::Agent);
        assert!(key.revoked_at.is_none() && key.previous_valid_until.is_none());
        let rotated: KeySecret = serde_json::from_value(serde_json::json!({
            "key": {
                "id": key.id, "name": "n", "principal": key.principal, "scopes": ["operator"],
                "created_at": "2030-01-01T00:00:00Z", "rotated_at": "2030-01-02T00:00:00Z",
                "previous_valid_until": "2030-01-03T00:00:00Z",
            },
            "secret": "msk_0123456789abcdef0123456789abcdef_s3cret",
        }))
        .unwrap();
        assert!(rotated.key.previous_valid_until.is_some());
        assert!(
            !format!("{rotated:?}").contains("s3cret"),
            "the secret stays out of debug output"
        );
    }

    #[test]
    fn a_new_key_sends_only_what_was_chosen() {
        assert_eq!(
            serde_json::to_value(CreateKey::new("a")).unwrap(),
            serde_json::json!({ "name": "a" })
        );
        let mut full = CreateKey::new("a");
        full.kind = Some(PrincipalKind::Operator);
        full.scopes = Some(vec![Scope::Invites, Scope::RegisterWorkers]);
        assert_eq!(
            serde_json::to_value(full).unwrap(),
            serde_json::json!({ "name": "a", "kind": "operator", "scopes": ["invites", "workers:register"] })
        );
        for s in Scope::ALL {
            assert_eq!(Scope::parse(s.as_str()), Some(s));
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
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
