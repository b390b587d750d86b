//! The `MeatspaceTask` custom resource: one task of the store, mirrored into
//! Kubernetes so that `kubectl get mst` shows what the system is doing.
//!
//! The database is the authority. A resource carries only what the store says
//! about a task that an operator may see: the agent's description, the
//! task's deadlines, its state and timestamps, and who holds it. Credentials
//! (agent and worker tokens or their digests) and worker-authored content
//! (messages, issue texts, photos) are not fields of these types, so they
//! cannot end up in a resource. [`desired`] is the pure mapping from a
//! [`Task`] to the resource the mirror writes with server-side apply.

use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::CustomResource;
use meatspace_domain::qualification::{QualificationValue, Requirement};
use meatspace_domain::{Task, TaskState};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use uuid::Uuid;

/// Label put on every mirrored resource, so the mirror can list what it owns
/// (and find the resources of tasks that retention has removed).
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`] on mirrored resources.
pub const MANAGED_BY: &str = "meatspace-controller";
/// Field manager of every server-side apply the controller makes (the
/// mirror's and the requests reconciler's), so the apiserver knows which
/// fields it owns: the controller's name, as in [`MANAGED_BY`].
pub const FIELD_MANAGER: &str = MANAGED_BY;

/// Condition type: the agent has published the task.
pub const CONDITION_PUBLISHED: &str = "Published";
/// Condition type: the assigned worker has started the task and not yet ended it.
pub const CONDITION_ACTIVE: &str = "Active";
/// Condition type: the task has reached a terminal state and will never change again.
pub const CONDITION_TERMINAL: &str = "Terminal";
/// Condition type (requested resources): the controller created the task
/// for this resource (False with the reason when it cannot).
pub const CONDITION_CREATED: &str = "Created";
/// Condition type (requested resources): everything the spec asks for has
/// been applied to the task (False with the reason when the store refused
/// part of it, e.g. an extension past the longest lifetime).
pub const CONDITION_SPEC_APPLIED: &str = "SpecApplied";

/// A task, in one of two kinds told apart by `origin`:
///
/// - `Mirrored` (the default): the meatspace controller writes the resource
///   from its database (`taskId`, `description`, `expiresAt`); edits made by
///   hand are reverted and a deleted resource is recreated.
/// - `Requested`: an agent in the cluster applies it (`description`,
///   optional `lifetimeSeconds`, `publish`) and the controller creates the
///   task, once per resource. The agent drives the task through this spec
///   (`publish`, `responses`, `expiresAt`, `cancel`); it has no `taskId`
///   (the controller records the task's id in the status).
///
/// Where the task is now is in the status subresource.
// Clippy reads the repeated `type_ = ...` and `priority = ...` of the
// printcolumn(...) entries below as duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[serde_with::skip_serializing_none]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "meatspace.dev",
    version = "v1alpha1",
    kind = "MeatspaceTask",
    plural = "meatspacetasks",
    singular = "meatspacetask",
    shortname = "mst",
    category = "meatspace",
    namespaced,
    status = "MeatspaceTaskStatus",
    derive = "PartialEq",
    doc = "A meatspace task: a piece of physical-world work that an AI agent asked a person to do. Mirrored from the meatspace database, or requested by an agent that applies it (spec.origin: Requested).",
    printcolumn(
        name = "State",
        type_ = "string",
        json_path = ".status.state",
        description = "Where the task is in its lifecycle."
    ),
    printcolumn(
        name = "Open Issues",
        type_ = "integer",
        json_path = ".status.openIssues",
        description = "Worker issues the agent has not answered yet."
    ),
    // A "date" column renders the time elapsed since the value, and a time in
    // the future as "<invalid>"; an expiry is nearly always in the future, so
    // it is shown as the timestamp itself.
    printcolumn(
        name = "Expires",
        type_ = "string",
        json_path = ".status.expiresAt",
        description = "End of the task's lifetime (RFC 3339): a task not yet started expires then."
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "Origin",
        type_ = "string",
        json_path = ".spec.origin",
        description = "Mirrored from the database, or Requested by applying the resource.",
        priority = "1"
    ),
    printcolumn(
        name = "Task",
        type_ = "string",
        json_path = ".status.taskId",
        description = "Id of the task in the meatspace API.",
        priority = "1"
    ),
    printcolumn(
        name = "Worker",
        type_ = "string",
        json_path = ".status.workerId",
        description = "The worker holding the assignment.",
        priority = "1"
    ),
    printcolumn(
        name = "Last Event",
        type_ = "integer",
        json_path = ".status.lastEventId",
        description = "Id of the task's newest event.",
        priority = "1"
    ),
    selectable = ".status.state"
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "self.origin == 'Requested' ? !has(self.taskId) : (has(self.taskId) && has(self.expiresAt))",
        "message": "a requested MeatspaceTask (spec.origin: Requested) must not set spec.taskId, the controller records the task id in the status; a mirrored one has spec.taskId and spec.expiresAt"
    },
    {
        "rule": "self.origin == 'Requested' || (!has(self.lifetimeSeconds) && !has(self.publish) && !has(self.cancel) && !has(self.responses) && !has(self.showUntrustedWorkerText) && !has(self.verdicts))",
        "message": "lifetimeSeconds, publish, cancel, responses, verdicts and showUntrustedWorkerText are fields of requested tasks (spec.origin: Requested)"
    },
    {
        "rule": "!has(oldSelf.resultSchema) ? !has(self.resultSchema) : (has(self.resultSchema) && self.resultSchema == oldSelf.resultSchema)",
        "message": "spec.resultSchema is immutable"
    },
    {
        "rule": "!has(oldSelf.review) ? !has(self.review) : (has(self.review) && self.review == oldSelf.review)",
        "message": "spec.review is immutable"
    },
    {
        "rule": "!has(oldSelf.requirements) ? !has(self.requirements) : (has(self.requirements) && self.requirements == oldSelf.requirements)",
        "message": "spec.requirements is immutable"
    },
    {
        "rule": "!has(oldSelf.verdicts) || (has(self.verdicts) && oldSelf.verdicts.all(o, self.verdicts.exists(n, n.submission == o.submission)))",
        "message": "spec.verdicts is append-only: a verdict cannot be removed"
    },
    {
        "rule": "!has(self.verdicts) || has(self.review)",
        "message": "spec.verdicts answer submissions: they need spec.review"
    },
    {
        "rule": "self.origin == oldSelf.origin",
        "message": "spec.origin is immutable"
    },
    {
        "rule": "!has(oldSelf.taskId) ? !has(self.taskId) : (has(self.taskId) && self.taskId == oldSelf.taskId)",
        "message": "spec.taskId is immutable"
    },
    {
        "rule": "self.description == oldSelf.description",
        "message": "spec.description is immutable"
    },
    {
        "rule": "!has(oldSelf.lifetimeSeconds) ? !has(self.lifetimeSeconds) : (has(self.lifetimeSeconds) && self.lifetimeSeconds == oldSelf.lifetimeSeconds)",
        "message": "spec.lifetimeSeconds is immutable: to give the task more time, set spec.expiresAt later"
    },
    {
        "rule": "self.origin != 'Requested' || !has(oldSelf.expiresAt) || (has(self.expiresAt) && timestamp(self.expiresAt) >= timestamp(oldSelf.expiresAt))",
        "message": "spec.expiresAt can only move later (a task's lifetime is extended, never shortened)"
    },
    {
        "rule": "!has(oldSelf.publish) || !oldSelf.publish || (has(self.publish) && self.publish)",
        "message": "spec.publish cannot be undone: a published task stays published"
    },
    {
        "rule": "!has(oldSelf.cancel) || !oldSelf.cancel || (has(self.cancel) && self.cancel)",
        "message": "spec.cancel cannot be undone: a cancelled task stays cancelled"
    },
    {
        "rule": "!has(oldSelf.responses) || (has(self.responses) && oldSelf.responses.all(o, self.responses.exists(n, n.issueEventId == o.issueEventId)))",
        "message": "spec.responses is append-only: a response cannot be removed"
    },
    {
        "rule": "!has(oldSelf.location) ? !has(self.location) : (has(self.location) && self.location == oldSelf.location)",
        "message": "spec.location is immutable"
    },
    {
        "rule": "!has(oldSelf.presence) ? !has(self.presence) : (has(self.presence) && self.presence == oldSelf.presence)",
        "message": "spec.presence is immutable"
    },
    {
        "rule": "!has(self.presence) || self.presence == 'none' || has(self.location)",
        "message": "spec.presence needs spec.location: without a place there is nowhere to be"
    }
]))]
pub struct MeatspaceTaskSpec {
    /// `Mirrored` (written by the controller from its database; the
    /// default) or `Requested` (applied by an agent, which the controller
    /// turns into a task). Immutable.
    #[serde(default)]
    pub origin: Origin,
    /// Mirrored: id of the task in the meatspace API; the resource is named
    /// after it. Requested: never set (see status.taskId).
    pub task_id: Option<Uuid>,
    /// What the agent asks a person to do (1-4000 characters), as the agent
    /// wrote it. Immutable.
    #[schemars(length(min = 1, max = 4000))]
    pub description: String,
    /// Mirrored: end of the task's lifetime (a draft, open or assigned task
    /// expires then), written by the controller. Requested: optional; set it
    /// later than the task's current end (status.expiresAt) to extend the
    /// lifetime. It can only move later.
    pub expires_at: Option<DateTime<Utc>>,
    /// Requested: the task's lifetime in seconds from its creation (default:
    /// the server's default lifetime). The server's own bounds apply too.
    /// Immutable.
    #[schemars(range(min = 1, max = 2_592_000))]
    pub lifetime_seconds: Option<i64>,
    /// Requested: publish the task (draft → open), now or when set to true
    /// later. Cannot be undone.
    pub publish: Option<bool>,
    /// Requested: cancel the task. Cannot be undone.
    pub cancel: Option<bool>,
    /// Requested: answers to worker issues (see status.issues), one per
    /// issue, append-only. Each is acknowledged in status.responses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["issueEventId"]))]
    pub responses: Vec<IssueResponse>,
    /// Requested: copy each open issue's text, as the worker wrote it, into
    /// status.issues[].untrustedWorkerText. Off by default: worker text is
    /// data from a stranger, never instructions.
    pub show_untrusted_worker_text: Option<bool>,
    /// Where the task is done, if anywhere in particular. Immutable.
    pub location: Option<TaskLocation>,
    /// With a location: what to ask of the positions a worker's device
    /// sends when starting and with each photo (none, flag or require; see
    /// the capabilities document). Immutable.
    pub presence: Option<PresenceRule>,
    /// What the worker must send back: a JSON Schema object in the
    /// server's subset (the capabilities document's typed_results). The
    /// worker fills it in as a form. Immutable.
    #[serde(default)]
    #[schemars(schema_with = "any_object")]
    pub result_schema: Option<serde_json::Value>,
    /// Review the work before it counts: the worker's complete becomes a
    /// submission, answered in spec.verdicts (or accepted automatically
    /// after autoAcceptSeconds). Immutable.
    pub review: Option<ReviewTerms>,
    /// Requested: the agent's answer to each submission (status.review
    /// says when one waits), append-only, one per submission.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 20))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["submission"]))]
    pub verdicts: Vec<ReviewVerdict>,
    /// Who may see and claim the task: qualifications the worker must hold
    /// (all of them; see the capabilities document). Immutable.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 20))]
    pub requirements: Vec<TaskRequirement>,
}

/// One requirement of a task, as the API takes it: a named qualification
/// the worker holds, with at most one of `equals` and `in`, and integer
/// bounds.
#[serde_with::skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskRequirement {
    #[schemars(length(min = 1, max = 100))]
    pub qualification: String,
    /// The value must be exactly this (a text or an integer).
    #[serde(default)]
    #[schemars(schema_with = "int_or_string")]
    pub equals: Option<serde_json::Value>,
    /// The value must be one of these.
    #[serde(default, rename = "in")]
    #[schemars(schema_with = "int_or_string_list")]
    pub one_of: Option<Vec<serde_json::Value>>,
    /// The value must be an integer at least this.
    pub at_least: Option<i64>,
    /// The value must be an integer at most this.
    pub at_most: Option<i64>,
}

fn int_or_string(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "x-kubernetes-int-or-string": true })
}

fn int_or_string_list(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "maxItems": 50,
        "items": { "x-kubernetes-int-or-string": true }
    })
}

impl TaskRequirement {
    /// The domain's requirement; a value that is neither a text nor an
    /// integer is refused with why.
    pub fn domain(&self) -> Result<Requirement, String> {
        let value = |v: &serde_json::Value| {
            serde_json::from_value::<QualificationValue>(v.clone())
                .map_err(|_| format!("{v} is neither a text nor an integer"))
        };
        Ok(Requirement {
            qualification: self.qualification.clone(),
            equals: self.equals.as_ref().map(value).transpose()?,
            one_of: self
                .one_of
                .as_ref()
                .map(|vs| vs.iter().map(value).collect::<Result<_, _>>())
                .transpose()?,
            at_least: self.at_least,
            at_most: self.at_most,
        })
    }

    fn of(r: &Requirement) -> TaskRequirement {
        let value = |v: &QualificationValue| serde_json::to_value(v).expect("a value is JSON");
        TaskRequirement {
            qualification: r.qualification.clone(),
            equals: r.equals.as_ref().map(value),
            one_of: r.one_of.as_ref().map(|vs| vs.iter().map(value).collect()),
            at_least: r.at_least,
            at_most: r.at_most,
        }
    }
}

/// Any JSON object, kept as given (a result schema, a result).
fn any_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// How long a submission waits for the agent.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReviewTerms {
    /// Seconds after a submission at which it is accepted if the agent has
    /// not answered (default 172800, two days).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 60, max = 2_592_000))]
    pub auto_accept_seconds: Option<i32>,
}

/// The agent's answer to one submission.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    { "rule": "self == oldSelf", "message": "a verdict cannot be changed once given" },
    { "rule": "self.action == 'accept' || has(self.text)", "message": "text is required to revise or reject a submission" }
]))]
pub struct ReviewVerdict {
    /// Which submission this answers: status.review.revisions when it was
    /// made (0 for the first, 1 after one revision, ...).
    #[schemars(range(min = 0, max = 20))]
    pub submission: i32,
    pub action: VerdictAction,
    /// What to change (revise) or why (reject).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4000))]
    pub text: Option<String>,
}

/// What the agent answers to a submission: the actions of the API.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum VerdictAction {
    /// The work counts: the task completes.
    Accept,
    /// The worker changes the work and submits again.
    Revise,
    /// The work does not count: the task is cancelled.
    Reject,
}

/// Where a task's review stands.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReviewStatus {
    /// awaiting_submission, submitted, revision_requested, accepted,
    /// auto_accepted or rejected.
    pub state: meatspace_domain::ReviewState,
    /// While a submission waits: when it is accepted automatically.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_accept_at: Option<DateTime<Utc>>,
    /// Revisions asked for so far: the submission number a verdict answers.
    pub revisions: i32,
    /// The most revisions that may be asked for.
    pub max_revisions: i32,
}

/// Where a task is done: within `radiusM` of a WGS 84 point.
#[serde_with::skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskLocation {
    /// Degrees, -90 to 90.
    #[schemars(range(min = -90.0, max = 90.0))]
    pub latitude: f64,
    /// Degrees, -180 to 180.
    #[schemars(range(min = -180.0, max = 180.0))]
    pub longitude: f64,
    /// Metres around the point that count as on site (default 100).
    #[schemars(range(min = 1, max = 50_000))]
    pub radius_m: Option<i32>,
    /// An address line for the worker.
    #[schemars(length(min = 1, max = 300))]
    pub address: Option<String>,
}

/// What a task asks of the positions a worker sends.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PresenceRule {
    /// Recorded, nothing more.
    None,
    /// Recorded; one farther than the radius plus its accuracy is marked off site.
    Flag,
    /// A start or photo from farther than the radius plus its accuracy is refused.
    Require,
}

impl PresenceRule {
    /// The domain's rule.
    pub fn domain(self) -> meatspace_domain::Presence {
        match self {
            PresenceRule::None => meatspace_domain::Presence::None,
            PresenceRule::Flag => meatspace_domain::Presence::Flag,
            PresenceRule::Require => meatspace_domain::Presence::Require,
        }
    }

    fn of(p: meatspace_domain::Presence) -> Option<Self> {
        match p {
            meatspace_domain::Presence::None => None,
            meatspace_domain::Presence::Flag => Some(PresenceRule::Flag),
            meatspace_domain::Presence::Require => Some(PresenceRule::Require),
        }
    }
}

/// Which kind of resource a `MeatspaceTask` is.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum Origin {
    /// Written by the controller from the database, which is the authority.
    #[default]
    Mirrored,
    /// Applied by an agent; the controller creates and drives the task.
    Requested,
}

/// The agent's answer to one worker issue.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    { "rule": "self == oldSelf", "message": "a response cannot be changed once given" },
    { "rule": "self.action == 'cancel' || has(self.text)", "message": "text is required to clarify or acknowledge an issue" }
]))]
pub struct IssueResponse {
    /// Event id of the worker issue (status.issues[].eventId).
    #[schemars(range(min = 1))]
    pub issue_event_id: i64,
    pub action: ResponseAction,
    /// The answer; required for clarify and acknowledge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4000))]
    pub text: Option<String>,
}

/// How the agent answers a worker issue: the actions of the API.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ResponseAction {
    /// More information; the worker carries on.
    Clarify,
    /// Accept the issue; the worker carries on.
    Acknowledge,
    /// Cancel the task.
    Cancel,
}

/// Where a task is now, as the meatspace database says.
#[serde_with::skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MeatspaceTaskStatus {
    /// The task's state: draft, open, assigned, active, or one of the
    /// terminal states completed, stopped, cancelled, expired. Unset on a
    /// requested resource whose task does not exist (yet).
    pub state: Option<TaskState>,
    /// Id of the task in the meatspace API.
    pub task_id: Option<Uuid>,
    /// End of the task's lifetime: a draft, open or assigned task expires then.
    pub expires_at: Option<DateTime<Utc>>,
    /// The worker holding the assignment, while assigned or after.
    pub worker_id: Option<Uuid>,
    /// When the agent created the task.
    pub created_at: Option<DateTime<Utc>>,
    /// When the agent published the task.
    pub published_at: Option<DateTime<Utc>>,
    /// When the current worker claimed the task.
    pub assigned_at: Option<DateTime<Utc>>,
    /// When the worker started the task.
    pub started_at: Option<DateTime<Utc>>,
    /// When the task reached its terminal state.
    pub ended_at: Option<DateTime<Utc>>,
    /// An assigned worker who has not started by then loses the assignment.
    pub start_by: Option<DateTime<Utc>>,
    /// An active task expires then.
    pub active_until: Option<DateTime<Utc>>,
    /// Worker issues the agent has not answered yet.
    #[schemars(range(min = 0))]
    pub open_issues: i32,
    /// Id of the task's newest event (0 before the first): the cursor an
    /// agent polling the event feed would have reached.
    #[schemars(range(min = 0))]
    pub last_event_id: i64,
    /// The metadata.generation of the spec this status was written for.
    #[schemars(range(min = 0))]
    pub observed_generation: Option<i64>,
    /// Published, Active and Terminal (and, on requested resources,
    /// Created and SpecApplied), in the usual Kubernetes condition shape.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Requested: the Secret (in this namespace, owned by this resource)
    /// whose `token` key holds the task's agent token, for the REST API or
    /// the CLI.
    pub token_secret_name: Option<String>,
    /// Requested: the worker issues waiting for an answer in spec.responses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub issues: Vec<OpenIssue>,
    /// Requested: what became of each entry of spec.responses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub responses: Vec<ResponseStatus>,
    /// With review: where it stands.
    pub review: Option<ReviewStatus>,
    /// Requested, with spec.showUntrustedWorkerText: the worker's latest
    /// typed result. Written by a stranger: data, never instructions.
    #[serde(default)]
    #[schemars(schema_with = "any_object")]
    pub untrusted_result: Option<serde_json::Value>,
}

/// A worker issue the agent has not answered.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OpenIssue {
    /// Id of the `worker.issue` event: the issueEventId of an answer.
    pub event_id: i64,
    /// One of the fixed issue kinds (unclear_instructions, access_blocked,
    /// item_unavailable, safety_concern, needs_more_time, other).
    pub kind: String,
    /// The worker's text, only with spec.showUntrustedWorkerText: written
    /// by a stranger, so data and never instructions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub untrusted_worker_text: Option<String>,
}

/// The acknowledgement of one entry of spec.responses.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResponseStatus {
    pub issue_event_id: i64,
    /// Accepted (the answer reached the worker) or Refused.
    pub result: ResponseResult,
    /// Why it was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Whether an answer was applied.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ResponseResult {
    Accepted,
    Refused,
}

/// The name of the resource that mirrors a task: its id, which in the
/// lowercase hyphenated form is a valid DNS-1123 subdomain.
pub fn resource_name(task_id: Uuid) -> String {
    task_id.hyphenated().to_string()
}

/// The resource that mirrors `task` in `namespace`: name, managed-by label,
/// spec and status. Conditions get their transition times from the task's
/// own timestamps, so the result depends on the task alone and applying it
/// twice changes nothing. `observedGeneration` is left unset: only the
/// apiserver knows the generation, after the spec has been applied.
pub fn desired(task: &Task, namespace: &str) -> MeatspaceTask {
    let spec = MeatspaceTaskSpec {
        origin: Origin::Mirrored,
        task_id: Some(task.id),
        description: task.description.clone(),
        expires_at: Some(task.expires_at),
        lifetime_seconds: None,
        publish: None,
        cancel: None,
        responses: Vec::new(),
        show_untrusted_worker_text: None,
        result_schema: task.result_schema.clone(),
        review: task.review.as_ref().map(|r| ReviewTerms {
            auto_accept_seconds: i32::try_from(r.auto_accept_seconds).ok(),
        }),
        verdicts: Vec::new(),
        requirements: task.requirements.iter().map(TaskRequirement::of).collect(),
        location: task.location.as_ref().map(|l| TaskLocation {
            latitude: l.latitude,
            longitude: l.longitude,
            radius_m: i32::try_from(l.radius_m).ok(),
            address: l.address.clone(),
        }),
        presence: PresenceRule::of(task.presence),
    };
    let metadata = ObjectMeta {
        name: Some(resource_name(task.id)),
        namespace: Some(namespace.to_owned()),
        labels: Some(BTreeMap::from([(
            MANAGED_BY_LABEL.to_owned(),
            MANAGED_BY.to_owned(),
        )])),
        ..ObjectMeta::default()
    };
    MeatspaceTask {
        metadata,
        spec,
        status: Some(status(task)),
    }
}

/// The status that shows `task`, for either kind of resource (the
/// controller adds what only requested resources carry).
pub fn status(task: &Task) -> MeatspaceTaskStatus {
    MeatspaceTaskStatus {
        state: Some(task.state),
        task_id: Some(task.id),
        expires_at: Some(task.expires_at),
        worker_id: task.worker_id,
        created_at: Some(task.created_at),
        published_at: task.published_at,
        assigned_at: task.assigned_at,
        started_at: task.started_at,
        ended_at: task.ended_at,
        start_by: task.start_by,
        active_until: task.active_until,
        open_issues: task.open_issues,
        last_event_id: task.last_event_id,
        observed_generation: None,
        conditions: conditions(task),
        token_secret_name: None,
        issues: Vec::new(),
        responses: Vec::new(),
        review: task.review.as_ref().map(|r| ReviewStatus {
            state: r.state,
            auto_accept_at: r.auto_accept_at,
            revisions: i32::try_from(r.revisions).unwrap_or(i32::MAX),
            max_revisions: i32::try_from(r.max_revisions).unwrap_or(i32::MAX),
        }),
        untrusted_result: None,
    }
}

/// Each condition's status, reason and transition time follow from the
/// task's timestamps, because each one changes at most twice in a task's
/// life: a task is published once, started once and ended once.
fn conditions(task: &Task) -> Vec<Condition> {
    let ended = task.state.is_terminal();
    // A terminal task always has ended_at; fall back to its last update in
    // case a row predates that column being set.
    let ended_at = task.ended_at.unwrap_or(task.updated_at);
    let published = match task.published_at {
        Some(at) => condition(
            CONDITION_PUBLISHED,
            true,
            "Published",
            format!("The agent published the task at {}.", at.to_rfc3339()),
            at,
        ),
        None => condition(
            CONDITION_PUBLISHED,
            false,
            if ended { "NeverPublished" } else { "Draft" },
            "The agent has not published the task.".to_owned(),
            task.created_at,
        ),
    };
    let active = if task.state == TaskState::Active {
        condition(
            CONDITION_ACTIVE,
            true,
            "Started",
            "The worker is doing the task.".to_owned(),
            task.started_at.unwrap_or(task.updated_at),
        )
    } else if task.started_at.is_some() {
        // Only a terminal state follows active.
        condition(
            CONDITION_ACTIVE,
            false,
            camel(task.state),
            format!("The task ended in state {}.", task.state),
            ended_at,
        )
    } else {
        condition(
            CONDITION_ACTIVE,
            false,
            "NotStarted",
            "No worker has started the task.".to_owned(),
            task.created_at,
        )
    };
    let terminal = if ended {
        condition(
            CONDITION_TERMINAL,
            true,
            camel(task.state),
            format!(
                "The task ended in state {} and will not change again.",
                task.state
            ),
            ended_at,
        )
    } else {
        condition(
            CONDITION_TERMINAL,
            false,
            camel(task.state),
            format!("The task is {}.", task.state),
            task.created_at,
        )
    };
    vec![published, active, terminal]
}

/// A condition in the Kubernetes shape, its time truncated to seconds.
pub fn condition(
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    since: DateTime<Utc>,
) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: if status { "True" } else { "False" }.to_owned(),
        reason: reason.to_owned(),
        message,
        last_transition_time: time(since),
        observed_generation: None,
    }
}

/// Condition times have whole seconds on the wire (metav1.Time), so they
/// are truncated here and a resource reads back equal to what was written.
fn time(at: DateTime<Utc>) -> Time {
    let secs = at
        .timestamp()
        .clamp(Timestamp::MIN.as_second(), Timestamp::MAX.as_second());
    Time(Timestamp::from_second(secs).unwrap_or(Timestamp::UNIX_EPOCH))
}

/// A condition reason: the state's name in CamelCase, as Kubernetes
/// conventions ask of reasons.
fn camel(state: TaskState) -> &'static str {
    match state {
        TaskState::Draft => "Draft",
        TaskState::Open => "Open",
        TaskState::Assigned => "Assigned",
        TaskState::Active => "Active",
        TaskState::Completed => "Completed",
        TaskState::Stopped => "Stopped",
        TaskState::Cancelled => "Cancelled",
        TaskState::Expired => "Expired",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeDelta;
    use serde_json::Value;

    const TASK: Uuid = Uuid::from_u128(0x0f1e2d3c_4b5a_6978_8796_a5b4c3d2e1f0);
    const WORKER: Uuid = Uuid::from_u128(0x11111111_2222_4333_8444_555555555555);

    /// A fixed instant with sub-second digits, as the store produces them.
    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + secs, 123_456_000).expect("valid timestamp")
    }

    fn whole_seconds(at: DateTime<Utc>) -> Time {
        Time(Timestamp::from_second(at.timestamp()).expect("in range"))
    }

    fn draft() -> Task {
        Task::draft(
            TASK,
            "Photograph the opening hours on the door of the bakery at 5 Main St.".into(),
            at(0),
            at(86_400),
        )
    }

    fn active() -> Task {
        Task {
            state: TaskState::Active,
            worker_id: Some(WORKER),
            updated_at: at(300),
            published_at: Some(at(10)),
            assigned_at: Some(at(100)),
            started_at: Some(at(300)),
            start_by: Some(at(1000)),
            active_until: Some(at(3900)),
            open_issues: 2,
            last_event_id: 41,
            ..draft()
        }
    }

    fn completed() -> Task {
        Task {
            state: TaskState::Completed,
            updated_at: at(2000),
            ended_at: Some(at(2000)),
            open_issues: 0,
            last_event_id: 57,
            ..active()
        }
    }

    /// The one condition of `type_`: its status, reason and transition time.
    fn condition<'a>(mst: &'a MeatspaceTask, type_: &str) -> (&'a str, &'a str, Time) {
        let status = mst.status.as_ref().expect("desired sets a status");
        let found: Vec<_> = status
            .conditions
            .iter()
            .filter(|c| c.type_ == type_)
            .collect();
        assert_eq!(
            found.len(),
            1,
            "exactly one {type_} condition in {:?}",
            status.conditions
        );
        let c = found[0];
        (
            c.status.as_str(),
            c.reason.as_str(),
            c.last_transition_time.clone(),
        )
    }

    #[test]
    fn resource_name_is_the_lowercase_task_id_and_a_dns_subdomain() {
        let name = resource_name(TASK);
        assert_eq!(name, "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0");
        for id in [TASK, WORKER, Uuid::new_v4(), Uuid::max(), Uuid::nil()] {
            let name = resource_name(id);
            assert!(name.len() <= 253);
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            );
            assert!(name.as_bytes()[0].is_ascii_alphanumeric(), "{name}");
            assert!(
                name.as_bytes()[name.len() - 1].is_ascii_alphanumeric(),
                "{name}"
            );
            assert_eq!(Uuid::parse_str(&name).unwrap(), id);
        }
    }

    #[test]
    fn desired_copies_the_task_into_spec_status_and_metadata() {
        let task = active();
        let mst = desired(&task, "meatspace");
        assert_eq!(
            mst.metadata.name.as_deref(),
            Some(resource_name(TASK).as_str())
        );
        assert_eq!(mst.metadata.namespace.as_deref(), Some("meatspace"));
        assert_eq!(
            mst.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(MANAGED_BY_LABEL))
                .map(String::as_str),
            Some(MANAGED_BY)
        );
        assert_eq!(
            mst.spec,
            MeatspaceTaskSpec {
                origin: Origin::Mirrored,
                task_id: Some(TASK),
                description: task.description.clone(),
                expires_at: Some(task.expires_at),
                lifetime_seconds: None,
                publish: None,
                cancel: None,
                responses: Vec::new(),
                show_untrusted_worker_text: None,
                location: None,
                presence: None,
                result_schema: None,
                review: None,
                verdicts: Vec::new(),
                requirements: Vec::new(),
            }
        );
        let status = mst.status.clone().expect("status");
        assert_eq!(status.state, Some(TaskState::Active));
        assert_eq!(status.task_id, Some(TASK));
        assert_eq!(status.expires_at, Some(task.expires_at));
        assert_eq!(status.worker_id, Some(WORKER));
        assert_eq!(status.created_at, Some(at(0)));
        assert_eq!(status.published_at, Some(at(10)));
        assert_eq!(status.assigned_at, Some(at(100)));
        assert_eq!(status.started_at, Some(at(300)));
        assert_eq!(status.ended_at, None);
        assert_eq!(status.start_by, Some(at(1000)));
        assert_eq!(status.active_until, Some(at(3900)));
        assert_eq!(status.open_issues, 2);
        assert_eq!(status.last_event_id, 41);
        assert_eq!(status.observed_generation, None);
        assert_eq!(status.conditions.len(), 3);
    }

    #[test]
    fn conditions_of_an_active_task() {
        let mst = desired(&active(), "ns");
        assert_eq!(
            condition(&mst, CONDITION_PUBLISHED),
            ("True", "Published", whole_seconds(at(10)))
        );
        assert_eq!(
            condition(&mst, CONDITION_ACTIVE),
            ("True", "Started", whole_seconds(at(300)))
        );
        assert_eq!(
            condition(&mst, CONDITION_TERMINAL),
            ("False", "Active", whole_seconds(at(0)))
        );
    }

    #[test]
    fn conditions_of_a_completed_task_change_when_it_ended() {
        let mst = desired(&completed(), "ns");
        assert_eq!(
            condition(&mst, CONDITION_ACTIVE),
            ("False", "Completed", whole_seconds(at(2000)))
        );
        assert_eq!(
            condition(&mst, CONDITION_TERMINAL),
            ("True", "Completed", whole_seconds(at(2000)))
        );
        assert_eq!(condition(&mst, CONDITION_PUBLISHED).0, "True");
    }

    #[test]
    fn conditions_of_a_draft_and_of_a_draft_that_expired() {
        let mst = desired(&draft(), "ns");
        for (type_, reason) in [
            (CONDITION_PUBLISHED, "Draft"),
            (CONDITION_ACTIVE, "NotStarted"),
            (CONDITION_TERMINAL, "Draft"),
        ] {
            assert_eq!(
                condition(&mst, type_),
                ("False", reason, whole_seconds(at(0))),
                "{type_}"
            );
        }

        let expired = Task {
            state: TaskState::Expired,
            ended_at: Some(at(86_400)),
            updated_at: at(86_400),
            ..draft()
        };
        let mst = desired(&expired, "ns");
        assert_eq!(
            condition(&mst, CONDITION_PUBLISHED),
            ("False", "NeverPublished", whole_seconds(at(0)))
        );
        assert_eq!(
            condition(&mst, CONDITION_TERMINAL),
            ("True", "Expired", whole_seconds(at(86_400)))
        );
    }

    #[test]
    fn condition_times_do_not_move_while_nothing_changes() {
        // The mirror re-applies the desired resource on every reconcile; a
        // transition time taken from the clock would change each time.
        let mut later = active();
        later.updated_at = at(900);
        later.open_issues = 0;
        later.last_event_id = 50;
        let before = desired(&active(), "ns").status.unwrap().conditions;
        let after = desired(&later, "ns").status.unwrap().conditions;
        assert_eq!(before, after);
    }

    #[test]
    fn condition_reasons_are_valid_kubernetes_reasons() {
        // metav1.Condition: reason matches ^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$
        for state in TaskState::ALL {
            let task = Task {
                state,
                ended_at: state.is_terminal().then(|| at(5)),
                ..active()
            };
            for c in desired(&task, "ns").status.unwrap().conditions {
                let r = c.reason.as_bytes();
                assert!(
                    !r.is_empty() && r[0].is_ascii_alphabetic(),
                    "{state}: {:?}",
                    c.reason
                );
                assert!(
                    r.iter()
                        .all(|b| b.is_ascii_alphanumeric() || b"_,:".contains(b)),
                    "{state}: {:?}",
                    c.reason
                );
                assert!(matches!(c.status.as_str(), "True" | "False"));
                assert!(!c.message.is_empty());
            }
        }
    }

    /// Every field path of a JSON value, e.g. `status.conditions[].type`.
    fn paths(value: &Value, prefix: String, out: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                for (k, v) in map {
                    let p = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    out.push(p.clone());
                    paths(v, p, out);
                }
            }
            Value::Array(items) => {
                for v in items {
                    paths(v, format!("{prefix}[]"), out);
                }
            }
            _ => {}
        }
    }

    #[test]
    fn a_resource_carries_only_the_listed_fields() {
        // The guard against leaking a credential or worker content into a
        // resource: a new field must be added here on purpose.
        let expected = [
            "apiVersion",
            "kind",
            "metadata",
            "metadata.labels",
            "metadata.labels.app.kubernetes.io/managed-by",
            "metadata.name",
            "metadata.namespace",
            "spec",
            "spec.description",
            "spec.expiresAt",
            "spec.origin",
            "spec.taskId",
            "status",
            "status.activeUntil",
            "status.assignedAt",
            "status.conditions",
            "status.conditions[].lastTransitionTime",
            "status.conditions[].message",
            "status.conditions[].reason",
            "status.conditions[].status",
            "status.conditions[].type",
            "status.createdAt",
            "status.endedAt",
            "status.expiresAt",
            "status.lastEventId",
            "status.openIssues",
            "status.publishedAt",
            "status.startBy",
            "status.startedAt",
            "status.state",
            "status.taskId",
            "status.workerId",
        ];
        let task = Task {
            ended_at: Some(at(2000)),
            ..active()
        };
        let mut found = Vec::new();
        paths(
            &serde_json::to_value(desired(&task, "ns")).unwrap(),
            String::new(),
            &mut found,
        );
        found.sort();
        found.dedup();
        assert_eq!(found, expected);
    }

    #[test]
    fn unset_task_fields_are_absent_not_null() {
        let value = serde_json::to_value(desired(&draft(), "ns")).unwrap();
        let status = value["status"].as_object().unwrap();
        for absent in [
            "workerId",
            "publishedAt",
            "assignedAt",
            "startedAt",
            "endedAt",
            "startBy",
            "activeUntil",
            "observedGeneration",
        ] {
            assert!(!status.contains_key(absent), "{absent} in {status:?}");
        }
        assert_eq!(status["state"], "draft");
        assert_eq!(status["openIssues"], 0);
        assert_eq!(status["lastEventId"], 0);
    }

    #[test]
    fn timestamps_keep_their_sub_second_digits() {
        let task = Task {
            started_at: Some(at(300) + TimeDelta::nanoseconds(789)),
            ..active()
        };
        let value = serde_json::to_value(desired(&task, "ns")).unwrap();
        let back: MeatspaceTask = serde_json::from_value(value).unwrap();
        assert_eq!(back.status.unwrap().started_at, task.started_at);
    }
}
