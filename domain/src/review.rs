//! Review: with it on, a worker's complete is a submission the agent
//! answers. The task stays `active` while the submission waits; the agent
//! accepts it (→ `completed`), asks for a revision with a text (the worker
//! submits again, at most [`MAX_REVISIONS`] times) or rejects it
//! (→ `cancelled`, with the reason). An agent that does not answer within
//! the auto-accept delay has the controller accept for it. A waiting
//! submission is never lost to the active time limit: while it waits the
//! only deadline is the auto-accept time.

use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};

/// Auto-accept delay of a review created without one: two days.
pub const DEFAULT_AUTO_ACCEPT_SECONDS: u32 = 2 * 24 * 3600;
/// Shortest auto-accept delay an agent may ask for: one minute.
pub const MIN_AUTO_ACCEPT_SECONDS: u32 = 60;
/// Longest auto-accept delay an agent may ask for: thirty days.
pub const MAX_AUTO_ACCEPT_SECONDS: u32 = 30 * 24 * 3600;
/// Revision requests per task, at most; after that the agent accepts or
/// rejects.
pub const MAX_REVISIONS: u32 = 3;

/// Where a reviewed task's work stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ReviewState {
    /// Nothing submitted yet (or the worker is revising: see `revisions`).
    AwaitingSubmission,
    /// The worker submitted; the agent answers before `auto_accept_at`.
    Submitted,
    /// The agent asked for changes; the worker submits again.
    RevisionRequested,
    /// The agent accepted the submission: the task completed.
    Accepted,
    /// Nobody answered in time: the controller accepted it.
    AutoAccepted,
    /// The agent rejected the submission: the task was cancelled.
    Rejected,
}

crate::names! {
    ReviewState {
        AwaitingSubmission => "awaiting_submission",
        Submitted => "submitted",
        RevisionRequested => "revision_requested",
        Accepted => "accepted",
        AutoAccepted => "auto_accepted",
        Rejected => "rejected",
    }
}

/// A task's review: the terms the agent set at create and where it stands.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct Review {
    /// Seconds after a submission at which the controller accepts it if
    /// the agent has not answered.
    pub auto_accept_seconds: u32,
    pub state: ReviewState,
    /// While a submission waits: when the controller accepts it.
    pub auto_accept_at: Option<DateTime<Utc>>,
    /// Revisions the agent has asked for (at most `max_revisions`).
    pub revisions: u32,
    /// The most revisions the agent may ask for.
    pub max_revisions: u32,
    /// The agent's latest revision request, shown to the worker. Written by
    /// the agent.
    pub feedback: Option<String>,
}

impl Review {
    /// The review of a new task: nothing submitted yet.
    pub fn new(auto_accept_seconds: u32) -> Review {
        Review {
            auto_accept_seconds,
            state: ReviewState::AwaitingSubmission,
            auto_accept_at: None,
            revisions: 0,
            max_revisions: MAX_REVISIONS,
            feedback: None,
        }
    }

    /// The review terms an agent asked for at create: `auto_accept_seconds`
    /// or the default. Out of bounds is refused with the bounds.
    pub fn requested(auto_accept_seconds: Option<u32>) -> Result<Review, (u32, u32)> {
        let seconds = auto_accept_seconds.unwrap_or(DEFAULT_AUTO_ACCEPT_SECONDS);
        if (MIN_AUTO_ACCEPT_SECONDS..=MAX_AUTO_ACCEPT_SECONDS).contains(&seconds) {
            Ok(Review::new(seconds))
        } else {
            Err((MIN_AUTO_ACCEPT_SECONDS, MAX_AUTO_ACCEPT_SECONDS))
        }
    }

    /// Whether a submission waits for the agent.
    pub fn is_waiting(&self) -> bool {
        self.state == ReviewState::Submitted
    }

    /// The submission was made at `now`: it waits until the auto-accept time.
    pub(crate) fn submit(&mut self, now: DateTime<Utc>) -> DateTime<Utc> {
        let at = now + TimeDelta::seconds(i64::from(self.auto_accept_seconds));
        self.state = ReviewState::Submitted;
        self.auto_accept_at = Some(at);
        at
    }

    /// The review ended with `state`; nothing waits any more.
    pub(crate) fn close(&mut self, state: ReviewState) {
        self.state = state;
        self.auto_accept_at = None;
    }
}

/// What an agent answers to a submission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The work counts: the task completes.
    Accept,
    /// The worker must change the work and submit again.
    Revise { text: String },
    /// The work does not count: the task is cancelled.
    Reject { reason: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delay_defaults_and_is_bounded() {
        assert_eq!(
            Review::requested(None).unwrap().auto_accept_seconds,
            DEFAULT_AUTO_ACCEPT_SECONDS
        );
        assert_eq!(Review::requested(Some(60)).unwrap().auto_accept_seconds, 60);
        let bounds = (MIN_AUTO_ACCEPT_SECONDS, MAX_AUTO_ACCEPT_SECONDS);
        assert_eq!(Review::requested(Some(59)), Err(bounds));
        assert_eq!(
            Review::requested(Some(MAX_AUTO_ACCEPT_SECONDS + 1)),
            Err(bounds)
        );
    }

    #[test]
    fn state_names_are_the_wire_names() {
        for s in [
            ReviewState::AwaitingSubmission,
            ReviewState::Submitted,
            ReviewState::RevisionRequested,
            ReviewState::Accepted,
            ReviewState::AutoAccepted,
            ReviewState::Rejected,
        ] {
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
    }
}
