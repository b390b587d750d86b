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

/// The names of a fieldless enum's variants, as the API, the database and
/// the wire (serde) spell them, from one table: `as_str`, its inverse
/// `parse`, `ALL` (every variant, in the table's order) and `Display`.
macro_rules! names {
    ($ty:ident { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $ty {
            /// Every variant, in the order of its names' table.
            pub const ALL: [$ty; [$($name),+].len()] = [$($ty::$variant),+];

            /// The variant's name.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $name,)+
                }
            }

            /// The variant named `s`, if it is one.
            pub fn parse(s: &str) -> Option<Self> {
                match s {
                    $($name => Some($ty::$variant),)+
                    _ => None,
                }
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}
pub(crate) use names;

pub mod clock;
mod command;
pub mod error_text;
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
