//! The task domain as plain data and pure functions: states, transitions,
//! deadlines, events, issues, the policy of time limits, and what each reader
//! of a feed may see. Nothing here performs I/O or reads a clock (except
//! [`clock::now`], the one place that does): every decision takes `now` as an
//! argument so it can be unit-tested exhaustively.
//!
//! [`decide`] is the whole state machine: given a task, a [`Command`], the
//! [`Context`] the command [needs](Command::needs) and `now`, it returns the
//! new task and the events to append, or a [`Refusal`] that says why the
//! command is not allowed. The store (crate `meatspace-store`) writes a
//! decision in a transaction that holds the task's row lock, and only while
//! the task is still the one it was decided on.
//!
//! The derives that only some users need sit behind features: `utoipa`
//! (OpenAPI schemas), `schemars` (the MCP tools' result schemas) and `clap`
//! (the policy's flags), so the client and the CLI link neither a database
//! driver nor the server's frameworks.

pub mod clock;
mod command;
mod event;
pub mod identity;
mod issue;
pub mod notify;
pub mod place;
pub mod policy;
pub mod qualification;
pub mod result;
pub mod review;
mod task;
mod view;
pub mod webhook;
pub mod webhook_url;

pub use command::{
    Command, Context, Decision, Extension, IssueChange, Needs, NewPhoto, Refusal, decide,
};
pub use event::{Actor, Event, EventType, NewEvent};
pub use issue::{Issue, IssueAction, IssueKind, IssueStatus};
pub use place::{Location, Position, Presence};
pub use policy::Policy;
pub use review::{Review, ReviewState, Verdict};
pub use task::{Due, ExpiryReason, Task, TaskState};
pub use view::FeedView;

/// Largest task description, in characters (Unicode scalar values).
pub const MAX_DESCRIPTION_CHARS: usize = 4000;
/// Largest worker message, issue text or agent response, in characters.
pub const MAX_TEXT_CHARS: usize = 4000;
