//! Workers: registering, the worker's own task API, and what operators do
//! to workers.

use meatspace_domain::identity::Worker;
use meatspace_domain::{IssueKind, Position, Task};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Body of `POST /api/v1/workers`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "utoipa", schema(as = RegisterWorkerRequest))]
#[serde(deny_unknown_fields)]
pub struct RegisterWorker {
    /// Display name (1-200 characters).
    #[cfg_attr(
        feature = "utoipa",
        schema(min_length = 1, max_length = 200, pattern = r"\S")
    )]
    pub name: String,
}

/// Answer of `POST /api/v1/workers`.
#[derive(Clone, Serialize, Deserialize, derive_more::Debug)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct RegisteredWorker {
    pub worker: Worker,
    /// Bearer credential for the worker API. Shown only now.
    #[debug(skip)]
    pub worker_token: String,
}

/// A page of open tasks (`GET /api/v1/worker/tasks`): oldest first, or
/// with `near`, those with a place nearest first and then those without.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct OpenTaskPage {
    pub tasks: Vec<ListedTask>,
    /// Pass as `cursor` for the next page; absent on the last page.
    #[serde(default)]
    pub next_cursor: Option<String>,
}

/// An open task in a worker's list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct ListedTask {
    #[serde(flatten)]
    pub task: Task,
    /// With `near`: metres from the point to the task's place; absent for a
    /// task without a place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distance_m: Option<f64>,
}

/// Optional body of `POST /api/v1/worker/tasks/{id}/start`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct StartWork {
    /// The device's position now: recorded in the `task.started` event with
    /// its distance from the task's place (required by a task whose
    /// `presence` is `require`). Untrusted, like worker text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub position: Option<Position>,
}

/// Body of `POST /api/v1/worker/tasks/{id}/messages`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "utoipa", schema(as = MessageRequest))]
#[serde(deny_unknown_fields)]
pub struct Message {
    /// 1-4000 characters.
    #[cfg_attr(
        feature = "utoipa",
        schema(min_length = 1, max_length = 4000, pattern = r"\S")
    )]
    pub text: String,
}

/// Body of `POST /api/v1/worker/tasks/{id}/issues`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "utoipa", schema(as = IssueRequest))]
#[serde(deny_unknown_fields)]
pub struct RaiseIssue {
    pub kind: IssueKind,
    /// 1-4000 characters.
    #[cfg_attr(
        feature = "utoipa",
        schema(min_length = 1, max_length = 4000, pattern = r"\S")
    )]
    pub text: String,
}

/// Optional body of `POST /api/v1/worker/tasks/{id}/complete` and `…/stop`.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "utoipa", schema(as = EndRequest))]
#[serde(deny_unknown_fields)]
pub struct EndWork {
    /// Optional note for the agent (completion note or reason to stop).
    #[cfg_attr(
        feature = "utoipa",
        schema(min_length = 1, max_length = 4000, pattern = r"\S")
    )]
    pub text: Option<String>,
    /// The typed result, for a complete of a task with a `result_schema`
    /// (required then, refused otherwise and on a stop).
    #[cfg_attr(feature = "utoipa", schema(value_type = Option<Object>))]
    pub result: Option<serde_json::Value>,
}

crate::page! {
    /// A page of registered workers (`GET /api/v1/workers`), by id.
    WorkerPage { workers: Worker }
}

/// Optional body of `POST /api/v1/workers/{id}/suspend`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "utoipa", schema(as = SuspendRequest))]
#[serde(deny_unknown_fields)]
pub struct Suspend {
    /// Why, for the audit trail (at most 1000 characters).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Answer of `POST /api/v1/workers/{id}/rotate`.
#[derive(Clone, Serialize, Deserialize, derive_more::Debug)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "utoipa", schema(as = RotatedWorkerToken))]
pub struct RotatedWorker {
    pub worker: Worker,
    /// The new token; the old one stopped working. Shown only now.
    #[debug(skip)]
    pub worker_token: String,
}

/// Body of `PUT /api/v1/workers/{id}/qualifications/{name}`: the value and
/// expiry of the grant (both optional).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "utoipa", schema(as = GrantRequest))]
#[serde(deny_unknown_fields)]
pub struct Grant {
    /// A text (1-200 characters) or an integer.
    pub value: Option<meatspace_domain::qualification::QualificationValue>,
    /// When the grant lapses (RFC 3339); it counts as absent from then on.
    pub expires_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// A worker's qualifications, by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct QualificationList {
    pub worker_id: Uuid,
    pub qualifications: Vec<meatspace_domain::qualification::Qualification>,
}

/// One worker a principal has blocked from all of its tasks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct Block {
    pub worker_id: Uuid,
    pub blocked_at: chrono::DateTime<chrono::Utc>,
}

/// The caller's principal's blocked workers (`GET /api/v1/blocks`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct BlockList {
    pub blocks: Vec<Block>,
}

/// Body of `POST /api/v1/worker/push-subscriptions`: what the browser's
/// `PushSubscription.toJSON()` gives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct NewPushSubscription {
    /// The push service's URL for this browser (at most 2048 characters).
    pub endpoint: String,
    pub keys: PushKeys,
}

/// A subscription's keys (RFC 8291), base64url.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct PushKeys {
    /// The browser's P-256 public key (65 bytes, uncompressed).
    pub p256dh: String,
    /// The browser's authentication secret (16 bytes).
    pub auth: String,
}

/// Answer of `GET /api/v1/worker/push-key`: what the worker app subscribes
/// with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct PushKey {
    /// The server's VAPID public key (RFC 8292), base64url: the Push API's
    /// `applicationServerKey`.
    pub public_key: String,
}

/// Answer of adding or removing a push subscription.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct PushSubscriptionState {
    pub endpoint: String,
    /// Whether notifications go to this browser now.
    pub subscribed: bool,
}
