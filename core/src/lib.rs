//! The store of meatspace: persists the task domain (crate
//! `meatspace-domain`, re-exported here) in PostgreSQL or SQLite behind one
//! trait, [`Store`]. The store wraps each decision in one database
//! transaction.

pub mod secret;
pub mod store;
pub mod token;

pub use meatspace_domain::*;
pub use store::{Change, Store, StoreError};
