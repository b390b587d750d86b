//! The bodies the HTTP API takes and answers, declared once: the server
//! serialises and reads them (and derives its OpenAPI document from them
//! with the `utoipa` feature), the client and the MCP tools read and send
//! the same types. A field added here is in the document, the client and
//! the tools at once.
//!
//! The OpenAPI document keeps the schema names it has always had
//! (`CreateTaskRequest`, `KeyView`, …: `schema(as = …)`), so clients
//! generated from it keep working.
//!
//! Requests refuse unknown fields (`deny_unknown_fields`) and leave absent
//! options out when sent, so what a client sends is exactly what it set.
//! Secrets shown once (tokens, key secrets) stay out of `Debug` output.
//!
//! The nouns inside the bodies (`Task`, `Event`, `Worker`, the principals
//! and scopes) are the domain's own (`meatspace-domain`).

mod audit;
mod invites;
mod keys;
mod problem;
mod tasks;
mod workers;

pub use audit::{AuditEntry, AuditPage};
pub use invites::{CreateInvite, CreatedInvite, Invite, InvitePage};
pub use keys::{CreateKey, Key, KeyPage, KeySecret, RevokeKey, RevokedKey, RotateKey};
pub use meatspace_domain::notify::{Area, Preferences};
pub use problem::Problem;
pub use tasks::{
    CreateTask, CreatedTask, EventPage, Extend, Place, Respond, ReviewAction, ReviewAnswer,
    ReviewTerms, TaskChange, TaskPage, TaskResource,
};
pub use workers::{
    Block, BlockList, EndWork, Grant, ListedTask, Message, NewPushSubscription, OpenTaskPage,
    PushKey, PushKeys, PushSubscriptionState, QualificationList, RaiseIssue, RegisterWorker,
    RegisteredWorker, RotatedWorker, StartWork, Suspend, WorkerPage,
};

/// A page of a listing: its items under `$field`, and the cursor of the
/// next page, left out on the last one.
macro_rules! page {
    ($(#[$doc:meta])* $name:ident { $field:ident: $item:ty }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
        #[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
        pub struct $name {
            pub $field: Vec<$item>,
            /// Pass as `cursor` for the next page; absent on the last page.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub next_cursor: Option<String>,
        }
    };
}
pub(crate) use page;
