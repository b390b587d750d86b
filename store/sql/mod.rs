//! The SQL both backends accept, written once: each backend compiles this
//! module (`#[path]` in its `lib.rs`) over its own `dialect` module, which
//! says how a value is bound and read back and does the few things only
//! one database does (see `identity.rs`).

pub(crate) mod console;
pub(crate) mod deliveries;
pub(crate) mod engine_writes;
pub(crate) mod identity;
pub(crate) mod notifications;
pub(crate) mod reads;
pub(crate) mod retention;
