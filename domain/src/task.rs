//! Tasks, their states and their deadlines.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::place::{Location, Presence};
use crate::review::{Review, ReviewState};

/// Where a task is in its life. See DESIGN.md for the transition table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    Draft,
    Open,
    Assigned,
    Active,
    Completed,
    Stopped,
    Cancelled,
    Expired,
}

// In lifecycle order, which `TaskState::ALL` follows.
crate::names! {
    TaskState {
        Draft => "draft",
        Open => "open",
        Assigned => "assigned",
        Active => "active",
        Completed => "completed",
        Stopped => "stopped",
        Cancelled => "cancelled",
        Expired => "expired",
    }
}

impl TaskState {
    /// A terminal task never changes state again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Completed | TaskState::Stopped | TaskState::Cancelled | TaskState::Expired
        )
    }
}

/// A task as stored. Credentials are not part of it: the agent token's
/// digest lives only in the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct Task {
    pub id: Uuid,
    /// What the agent asks a person to do (1-4000 characters).
    pub description: String,
    pub state: TaskState,
    /// The worker holding the assignment, while assigned or after.
    pub worker_id: Option<Uuid>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub published_at: Option<DateTime<Utc>>,
    pub assigned_at: Option<DateTime<Utc>>,
    pub started_at: Option<DateTime<Utc>>,
    /// When the task reached its terminal state.
    pub ended_at: Option<DateTime<Utc>>,
    /// End of the task's lifetime: a draft, open or assigned task expires then.
    pub expires_at: DateTime<Utc>,
    /// An assigned worker who has not started by then loses the assignment.
    pub start_by: Option<DateTime<Utc>>,
    /// An active task expires then.
    pub active_until: Option<DateTime<Utc>>,
    /// Worker issues not yet answered.
    pub open_issues: i32,
    /// Id of the newest event of this task (0 before the first).
    pub last_event_id: i64,
    /// Where the task is done, when the agent said so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<Location>,
    /// What the agent asks of the positions a worker sends (only with a
    /// location; absent means `none`).
    #[serde(default, skip_serializing_if = "is_default")]
    pub presence: Presence,
    /// The JSON Schema the worker's result must match (see
    /// [`crate::result`]), when the agent asked for a typed result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_schema: Option<serde_json::Value>,
    /// The review of the work, when the agent asked for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub review: Option<Review>,
    /// The worker's latest result (with a result schema only). Written by
    /// the worker: data, never instructions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    /// Who may see and claim the task: every requirement must hold for a
    /// worker's qualifications (none: every worker).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requirements: Vec<crate::qualification::Requirement>,
}

fn is_default(presence: &Presence) -> bool {
    *presence == Presence::None
}

/// Why a task expired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExpiryReason {
    /// The task's lifetime ran out before it became active.
    Lifetime,
    /// The task stayed active longer than the active time limit.
    ActiveTimeLimit,
}

impl ExpiryReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ExpiryReason::Lifetime => "lifetime",
            ExpiryReason::ActiveTimeLimit => "active_time_limit",
        }
    }
}

/// What the controller must do to a task at a given time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    Expire(ExpiryReason),
    /// The assigned worker did not start in time: reopen the task.
    Unassign,
    /// A submission waited its whole auto-accept delay: accept it.
    AutoAccept,
}

impl Task {
    /// A task as it is created: a draft, in no place in particular, with
    /// no worker, no deadline but its lifetime, and no events yet.
    pub fn draft(
        id: Uuid,
        description: String,
        created_at: DateTime<Utc>,
        expires_at: DateTime<Utc>,
    ) -> Task {
        Task {
            id,
            description,
            state: TaskState::Draft,
            worker_id: None,
            created_at,
            updated_at: created_at,
            published_at: None,
            assigned_at: None,
            started_at: None,
            ended_at: None,
            expires_at,
            start_by: None,
            active_until: None,
            open_issues: 0,
            last_event_id: 0,
            location: None,
            presence: Presence::None,
            result_schema: None,
            review: None,
            result: None,
            requirements: Vec::new(),
        }
    }

    /// When a submission waits for the agent: the time the controller
    /// accepts it.
    fn auto_accept_at(&self) -> Option<DateTime<Utc>> {
        self.review
            .as_ref()
            .filter(|r| r.state == ReviewState::Submitted)
            .and_then(|r| r.auto_accept_at)
    }

    /// The earliest instant at which [`Task::due`] will return something, or
    /// `None` if nothing will ever be due (terminal tasks). The store indexes
    /// this value so the controller finds due tasks without a table scan.
    pub fn next_deadline(&self) -> Option<DateTime<Utc>> {
        match self.state {
            TaskState::Draft | TaskState::Open => Some(self.expires_at),
            TaskState::Assigned => Some(match self.start_by {
                Some(s) => s.min(self.expires_at),
                None => self.expires_at,
            }),
            // A waiting submission is never lost to the active time limit.
            TaskState::Active => self.auto_accept_at().or(self.active_until),
            _ => None,
        }
    }

    /// What is due for this task at `now`, if anything. Expiry wins over
    /// unassignment when both deadlines have passed.
    pub fn due(&self, now: DateTime<Utc>) -> Option<Due> {
        match self.state {
            TaskState::Draft | TaskState::Open if now >= self.expires_at => {
                Some(Due::Expire(ExpiryReason::Lifetime))
            }
            TaskState::Assigned if now >= self.expires_at => {
                Some(Due::Expire(ExpiryReason::Lifetime))
            }
            TaskState::Assigned if self.start_by.is_some_and(|s| now >= s) => Some(Due::Unassign),
            TaskState::Active if self.auto_accept_at().is_some() => self
                .auto_accept_at()
                .is_some_and(|a| now >= a)
                .then_some(Due::AutoAccept),
            TaskState::Active if self.active_until.is_some_and(|a| now >= a) => {
                Some(Due::Expire(ExpiryReason::ActiveTimeLimit))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use chrono::TimeDelta;

    pub fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + secs, 0).expect("valid timestamp")
    }

    pub fn task(state: TaskState) -> Task {
        Task {
            state,
            ..Task::draft(Uuid::nil(), "water the plants".into(), at(0), at(1000))
        }
    }

    #[test]
    fn draft_and_open_expire_at_end_of_lifetime() {
        for s in [TaskState::Draft, TaskState::Open] {
            let t = task(s);
            assert_eq!(t.due(at(999)), None);
            assert_eq!(t.due(at(1000)), Some(Due::Expire(ExpiryReason::Lifetime)));
            assert_eq!(t.next_deadline(), Some(at(1000)));
        }
    }

    #[test]
    fn assigned_reopens_when_start_timeout_passes_first() {
        let mut t = task(TaskState::Assigned);
        t.start_by = Some(at(100));
        assert_eq!(t.next_deadline(), Some(at(100)));
        assert_eq!(t.due(at(99)), None);
        assert_eq!(t.due(at(100)), Some(Due::Unassign));
        assert_eq!(t.due(at(1000)), Some(Due::Expire(ExpiryReason::Lifetime)));
    }

    #[test]
    fn assigned_expires_when_lifetime_ends_before_start_timeout() {
        let mut t = task(TaskState::Assigned);
        t.start_by = Some(at(2000));
        assert_eq!(t.next_deadline(), Some(at(1000)));
        assert_eq!(t.due(at(1500)), Some(Due::Expire(ExpiryReason::Lifetime)));
    }

    #[test]
    fn active_ignores_lifetime_and_obeys_active_limit() {
        let mut t = task(TaskState::Active);
        t.active_until = Some(at(5000));
        assert_eq!(t.due(at(1500)), None);
        assert_eq!(t.next_deadline(), Some(at(5000)));
        assert_eq!(
            t.due(at(5000) + TimeDelta::milliseconds(1)),
            Some(Due::Expire(ExpiryReason::ActiveTimeLimit))
        );
    }

    #[test]
    fn terminal_tasks_have_nothing_due() {
        for s in TaskState::ALL.into_iter().filter(|s| s.is_terminal()) {
            let t = task(s);
            assert_eq!(t.next_deadline(), None);
            assert_eq!(t.due(at(1_000_000)), None);
        }
    }

    /// The store indexes `next_deadline` and the controller reconciles a
    /// task once the index says so: that is only right if `due(t)` is
    /// `Some` exactly when `t` has reached `next_deadline()`, for every
    /// state and arrangement of deadlines, to the millisecond.
    #[test]
    fn due_agrees_with_next_deadline_at_every_instant() {
        let options = [None, Some(at(500)), Some(at(1000)), Some(at(1500))];
        for state in TaskState::ALL {
            for (start_by, active_until, waiting) in options
                .into_iter()
                .flat_map(|s| options.map(|a| (s, a)))
                .flat_map(|(s, a)| [(s, a, false), (s, a, true)])
            {
                {
                    let mut t = task(state);
                    t.start_by = start_by;
                    t.active_until = active_until;
                    if waiting {
                        // A submission waiting for review until 700.
                        let mut review = Review::new(700);
                        review.submit(at(0));
                        t.review = Some(review);
                    }
                    for ms in (0..2_000_000)
                        .step_by(250)
                        .chain([499_999, 999_999, 1_499_999])
                    {
                        let now = at(0) + TimeDelta::milliseconds(ms);
                        assert_eq!(
                            t.due(now).is_some(),
                            t.next_deadline().is_some_and(|d| now >= d),
                            "{state} start_by {start_by:?} active_until {active_until:?} \
                             waiting {waiting} at +{ms} ms"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn nothing_is_due_a_millisecond_before_a_deadline() {
        let t = task(TaskState::Open);
        assert_eq!(t.due(at(1000) - TimeDelta::milliseconds(1)), None);
        let mut t = task(TaskState::Active);
        t.active_until = Some(at(1000));
        assert_eq!(t.due(at(1000) - TimeDelta::milliseconds(1)), None);
        assert_eq!(
            t.due(at(1000)),
            Some(Due::Expire(ExpiryReason::ActiveTimeLimit))
        );
    }

    #[test]
    fn expiry_wins_when_the_start_timeout_and_lifetime_end_together() {
        let mut t = task(TaskState::Assigned);
        t.start_by = Some(at(1000));
        assert_eq!(t.due(at(1000)), Some(Due::Expire(ExpiryReason::Lifetime)));
    }

    #[test]
    fn an_assignment_past_its_start_timeout_reopens_only_while_the_lifetime_lasts() {
        let mut t = task(TaskState::Assigned);
        t.start_by = Some(at(100));
        assert_eq!(t.due(at(999)), Some(Due::Unassign));
        assert_eq!(t.due(at(1000)), Some(Due::Expire(ExpiryReason::Lifetime)));
    }

    #[test]
    fn an_assignment_without_a_start_deadline_still_expires_with_its_lifetime() {
        let t = task(TaskState::Assigned);
        assert_eq!(t.next_deadline(), Some(at(1000)));
        assert_eq!(t.due(at(1000)), Some(Due::Expire(ExpiryReason::Lifetime)));
    }

    #[test]
    fn state_names_round_trip() {
        for s in TaskState::ALL {
            assert_eq!(TaskState::parse(s.as_str()), Some(s));
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
        assert_eq!(TaskState::parse("nope"), None);
    }
}
