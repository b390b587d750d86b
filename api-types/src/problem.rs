//! The error body of every refusal.

use meatspace_domain::TaskState;
use meatspace_domain::result::FieldError;
use serde::{Deserialize, Serialize};

/// An RFC 9457 problem document (`application/problem+json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct Problem {
    /// Stable identifier of the kind of problem (a URI whose last segment
    /// is the slug).
    #[serde(rename = "type", default)]
    pub kind: String,
    #[serde(default)]
    pub title: String,
    /// HTTP status of the answer.
    pub status: u16,
    /// What went wrong, for the caller to act on.
    #[serde(default)]
    pub detail: String,
    /// The task's current state, for state conflicts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_state: Option<TaskState>,
    /// Each thing wrong with a result schema or a result, at its JSON
    /// pointer (`invalid-result-schema`, `invalid-result`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldError>,
}

impl Problem {
    /// The last segment of `type` (`https://…/problems/wrong-state` →
    /// `wrong-state`).
    pub fn slug(&self) -> &str {
        self.kind.rsplit('/').next().unwrap_or(&self.kind)
    }
}
