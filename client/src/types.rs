//! The request and response bodies of the HTTP API: the server's own
//! (`meatspace-api-types`), with the domain nouns inside them
//! (`meatspace-domain`), and what only the client needs.

use chrono::{DateTime, Utc};
use uuid::Uuid;

pub use meatspace_api_types::{
    AuditEntry, AuditPage, CreateInvite, CreateKey, CreateTask, CreatedInvite, CreatedTask,
    EndWork, EventPage, Extend, Invite, InvitePage, Key, KeyPage, KeySecret, ListedTask, Message,
    OpenTaskPage, Place, RaiseIssue, RegisterWorker, RegisteredWorker, Respond, ReviewAction,
    ReviewAnswer, ReviewTerms, RevokeKey, RevokedKey, RotateKey, RotatedWorker, StartWork, Suspend,
    TaskChange, TaskPage, TaskResource, WorkerPage,
};
pub use meatspace_api_types::{Block, BlockList, Grant, QualificationList};
pub use meatspace_domain::identity::{PrincipalKind, PrincipalRef, Scope, Scopes, Worker};
pub use meatspace_domain::qualification::{Qualification, QualificationValue, Requirement};

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

/// A photo as the server serves it to the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Photo {
    pub content_type: String,
    pub bytes: Vec<u8>,
}
