//! The audit trail of privileged actions.

use chrono::{DateTime, Utc};
use meatspace_domain::identity::{AuditAction, PrincipalRef};
use serde::{Deserialize, Serialize};

/// One privileged action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "utoipa", schema(as = AuditEntryView))]
pub struct AuditEntry {
    /// Ascending with time; the trail is append-only.
    pub id: i64,
    pub at: DateTime<Utc>,
    /// Who acted.
    pub principal: PrincipalRef,
    pub action: AuditAction,
    /// What was acted on: `key:<id>`, `worker:<id>`, `invite:<id>`, `task:<id>`, `route:<path>`.
    pub target: String,
    /// The client's address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<serde_json::Value>,
}

crate::page! {
    /// A page of the audit trail, newest first.
    AuditPage { entries: AuditEntry }
}
