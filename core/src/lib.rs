//! The heart of meatspace: the task domain (states, transitions, deadlines,
//! events) as pure functions, and the store that persists it in PostgreSQL or
//! SQLite behind one trait.
//!
//! Nothing in [`domain`] performs I/O or reads a clock: every decision takes
//! `now` as an argument so it can be unit-tested exhaustively. The [`store`]
//! wraps each decision in one database transaction.

pub mod clock;
pub mod domain;
pub mod policy;
pub mod secret;
pub mod store;
pub mod token;

pub use domain::*;
pub use policy::Policy;
pub use store::{Change, Store, StoreError};
