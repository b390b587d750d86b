//! The audit trail of privileged actions.

pub use meatspace_domain::identity::AuditEntry;

crate::page! {
    /// A page of the audit trail, newest first.
    AuditPage { entries: AuditEntry }
}
