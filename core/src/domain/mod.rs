//! The task domain as plain data and pure functions.
//!
//! [`decide`] is the whole state machine: given a task, a [`Command`] and
//! `now`, it returns the new task and the events to append, or a
//! [`Refusal`] that says why the command is not allowed. The store writes
//! a decision in a transaction that holds the task's row lock, and only
//! while the task is still the one it was decided on.

mod command;
mod event;
mod issue;
mod task;
mod view;

pub use command::{
    Command, Context, Decision, Extension, IssueChange, NewPhoto, Refusal, decide, over_event_limit,
};
pub use event::{Actor, Event, EventType, NewEvent};
pub use issue::{Issue, IssueAction, IssueKind, IssueStatus};
pub use task::{Due, ExpiryReason, Task, TaskState};
pub use view::FeedView;

/// Largest task description, in characters (Unicode scalar values).
pub const MAX_DESCRIPTION_CHARS: usize = 4000;
/// Largest worker message, issue text or agent response, in characters.
pub const MAX_TEXT_CHARS: usize = 4000;
