//! Typed Rust client of the meatspace HTTP API.
//!
//! One shared HTTP core ([`Client`]) and a typed handle per resource, the
//! way kube-client's `Api<K>` and octocrab's per-resource handlers work:
//!
//! * [`Client::create_task`] (an API key, [`ClientBuilder::api_key`], or
//!   the development key) creates a task and returns its [`TaskHandle`],
//!   which carries the task's own agent token; [`Client::task_owned`] is
//!   the handle of a task the key's principal owns, authorised by the key,
//!   and [`Client::tasks`] lists those tasks;
//! * [`TaskHandle`] publishes, reads, answers issues, cancels, extends and
//!   follows the task's event feed ([`Feed`]: SSE with long poll as the
//!   fallback, both resumable from a cursor);
//! * [`Client::register_worker`] returns a [`WorkerHandle`] for the worker
//!   API (list, claim, start, message, photo, issue, complete, stop, feed);
//! * an operator's handles: [`Client::keys`] ([`Keys`]: create, list, get,
//!   rotate, revoke), [`Client::workers_admin`] ([`WorkersAdmin`]: list,
//!   suspend, reinstate, rotate), [`Client::invites`] ([`Invites`]: list,
//!   revoke) and [`Client::audit`].
//!
//! The domain types ([`Task`], [`Event`], [`TaskState`], [`IssueKind`],
//! [`IssueAction`]) are the server's own, from `meatspace-domain`; the
//! envelopes around them live in [`types`].
//!
//! Every state-changing POST carries an `Idempotency-Key` generated once per
//! logical call, so the retries of transient failures (connection errors,
//! 429 and 503 with `Retry-After`) cannot apply a change twice. Errors the
//! server answers as `application/problem+json` become
//! [`Error::Problem`] with the status, type and detail.

mod error;
mod feed;
mod http;
mod key;
mod operator;
mod sse;
pub mod state;
mod task;
pub mod types;
mod worker;

pub use error::{Error, Problem};
pub use feed::{Feed, FeedBatch, Transport};
pub use http::{Client, ClientBuilder, RetryPolicy};
pub use key::Keys;
pub use meatspace_domain::{
    Actor, Event, EventType, IssueAction, IssueKind, Location, Position, Presence, Task, TaskState,
};
pub use operator::{Invites, WorkersAdmin};
pub use task::TaskHandle;
pub use worker::WorkerHandle;

/// Header carrying the development key, on the calls that act as a
/// principal when the client has no API key.
pub const DEV_KEY_HEADER: &str = "x-meatspace-dev-key";
/// Request header making a POST safe to retry.
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";
/// Header naming this client, sent with the development key: the server
/// scopes `Idempotency-Key` answers of the shared key to it.
pub const CLIENT_ID_HEADER: &str = "x-meatspace-client-id";
/// Response header the server sets on a replayed answer.
pub const IDEMPOTENCY_REPLAYED_HEADER: &str = "idempotency-replayed";
