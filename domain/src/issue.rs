//! Typed issues a worker raises and the agent answers.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The fixed list of issue kinds a worker may raise. Published in the
/// capabilities document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[cfg_attr(
    feature = "clap",
    derive(clap::ValueEnum),
    value(rename_all = "snake_case")
)]
#[serde(rename_all = "snake_case")]
pub enum IssueKind {
    /// The instructions are ambiguous or incomplete.
    UnclearInstructions,
    /// The worker cannot reach or enter the place.
    AccessBlocked,
    /// What the task is about is missing, closed or sold out.
    ItemUnavailable,
    /// Doing the task as described would be unsafe.
    SafetyConcern,
    /// The task will take longer than expected.
    NeedsMoreTime,
    /// Anything else; the text says what.
    Other,
}

crate::names! {
    IssueKind {
        UnclearInstructions => "unclear_instructions",
        AccessBlocked => "access_blocked",
        ItemUnavailable => "item_unavailable",
        SafetyConcern => "safety_concern",
        NeedsMoreTime => "needs_more_time",
        Other => "other",
    }
}

/// How an agent answers a worker issue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum IssueAction {
    /// Answer with more information (text required).
    Clarify,
    /// Accept the issue and let the worker carry on (text required).
    Acknowledge,
    /// Cancel the task (text optional).
    Cancel,
}

crate::names! {
    IssueAction {
        Clarify => "clarify",
        Acknowledge => "acknowledge",
        Cancel => "cancel",
    }
}

impl IssueAction {
    pub fn requires_text(self) -> bool {
        !matches!(self, IssueAction::Cancel)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IssueStatus {
    Open,
    /// The agent answered it.
    Resolved,
    /// The task ended before the agent answered.
    Closed,
}

crate::names! {
    IssueStatus {
        Open => "open",
        Resolved => "resolved",
        Closed => "closed",
    }
}

/// A worker issue; its id is the id of the `worker.issue` event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issue {
    pub event_id: i64,
    pub task_id: Uuid,
    pub kind: IssueKind,
    pub status: IssueStatus,
    /// How it ended: the agent's action, or `task_<state>` when the task
    /// ended first.
    pub resolution: Option<String>,
    pub resolved_at: Option<DateTime<Utc>>,
}
