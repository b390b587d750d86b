//! The state machine: [`decide`] turns a [`Command`] on a [`Task`] at `now`
//! into a [`Decision`] (new task, events, issue changes) or a [`Refusal`].

use chrono::{DateTime, Utc};
use serde_json::json;
use uuid::Uuid;

use super::{
    Actor, Due, EventType, Issue, IssueAction, IssueKind, IssueStatus, NewEvent, Task, TaskState,
};
use crate::Policy;
use crate::place::{Position, Presence};
use crate::review::{ReviewState, Verdict};

/// Something an agent, a worker or the controller wants done to one task.
#[derive(Debug, Clone)]
pub enum Command {
    /// Agent: draft → open.
    Publish,
    /// Agent: any non-terminal state → cancelled.
    Cancel { reason: Option<String> },
    /// Agent: answer the worker issue whose event id is `issue_event_id`.
    RespondToIssue {
        issue_event_id: i64,
        action: IssueAction,
        text: Option<String>,
    },
    /// Worker: open → assigned.
    Claim { worker: Uuid },
    /// Assigned worker: assigned → active, with the device's position when
    /// it sent one.
    Start {
        worker: Uuid,
        position: Option<Position>,
    },
    /// Assigned worker: a text message.
    Message { worker: Uuid, text: String },
    /// Assigned worker: a photo, already decoded and re-encoded, with the
    /// device's position when it sent one.
    Photo {
        worker: Uuid,
        photo: NewPhoto,
        position: Option<Position>,
    },
    /// Assigned worker: a typed issue for the agent.
    RaiseIssue {
        worker: Uuid,
        kind: IssueKind,
        text: String,
    },
    /// Assigned worker: active → completed, or, with review on, a
    /// submission the agent answers (the task stays active). `result` is
    /// the typed result a task with a result schema requires, already
    /// checked against it.
    Complete {
        worker: Uuid,
        note: Option<String>,
        result: Option<serde_json::Value>,
    },
    /// Agent: answer the waiting submission of a task with review.
    Review(Verdict),
    /// Assigned worker: assigned or active → stopped. Always allowed.
    Stop {
        worker: Uuid,
        reason: Option<String>,
    },
    /// Controller: apply whatever deadline has passed.
    Reconcile,
    /// Agent: move the end of the task's lifetime later (never earlier).
    Extend(Extension),
    /// Operator: `worker` was suspended; the task it holds (assigned or
    /// active) reopens for another worker, as a lapsed assignment does.
    Release { worker: Uuid },
}

/// How an agent extends a task's lifetime. `By` is relative to the deadline
/// read under the row lock, so two concurrent extensions both count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extension {
    /// The lifetime ends at this instant.
    Until(DateTime<Utc>),
    /// The lifetime ends this much later than it does now.
    By(chrono::TimeDelta),
}

impl Command {
    /// Verb for messages and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Publish => "publish",
            Command::Cancel { .. } => "cancel",
            Command::RespondToIssue { .. } => "respond to an issue on",
            Command::Claim { .. } => "claim",
            Command::Start { .. } => "start",
            Command::Message { .. } => "send a message on",
            Command::Photo { .. } => "send a photo on",
            Command::RaiseIssue { .. } => "raise an issue on",
            Command::Complete { .. } => "complete",
            Command::Review(_) => "review",
            Command::Stop { .. } => "stop",
            Command::Reconcile => "reconcile",
            Command::Extend { .. } => "extend",
            Command::Release { .. } => "release",
        }
    }

    /// Whether the per-task event limit applies to the command: it only
    /// adds to the feed (a message, photo, issue, answer or extension).
    /// Transitions never count against it, so a task whose feed is full
    /// can still be completed, stopped or cancelled, by an answer that
    /// cancels too.
    pub fn is_limited(&self) -> bool {
        match self {
            Command::Message { .. }
            | Command::Photo { .. }
            | Command::RaiseIssue { .. }
            | Command::Extend(_) => true,
            Command::RespondToIssue { action, .. } => *action != IssueAction::Cancel,
            Command::Publish
            | Command::Cancel { .. }
            | Command::Claim { .. }
            | Command::Start { .. }
            | Command::Complete { .. }
            | Command::Review(_)
            | Command::Stop { .. }
            | Command::Reconcile
            | Command::Release { .. } => false,
        }
    }

    /// Which rows besides the task the decision on this command reads: the
    /// store loads exactly these into the [`Context`] it passes to
    /// [`decide`], under the task's row lock. A command that needs nothing
    /// may be decided on the task row alone (PostgreSQL's optimistic write
    /// does that), so a rule that starts reading [`Context`] for a command
    /// must be declared here, or no backend loads what it reads. The
    /// `needs_nothing_means_the_context_is_not_read` test holds every
    /// command to that.
    pub fn needs(&self) -> Needs {
        let issue = match self {
            Command::RespondToIssue { issue_event_id, .. } => Some(*issue_event_id),
            _ => None,
        };
        Needs {
            issue,
            events: self.is_limited(),
        }
    }

    /// The worker a worker command acts for, if any (claim excluded: the
    /// claimant is not yet assigned).
    fn acting_worker(&self) -> Option<Uuid> {
        match self {
            Command::Start { worker, .. }
            | Command::Message { worker, .. }
            | Command::Photo { worker, .. }
            | Command::RaiseIssue { worker, .. }
            | Command::Complete { worker, .. }
            | Command::Stop { worker, .. }
            | Command::Release { worker } => Some(*worker),
            _ => None,
        }
    }
}

/// A photo ready to store: the bytes are the re-encoded image, with all
/// metadata of the upload gone.
#[derive(Clone, PartialEq, Eq, derive_more::Debug)]
pub struct NewPhoto {
    pub id: Uuid,
    pub content_type: String,
    pub width: u32,
    pub height: u32,
    #[debug("{} bytes", bytes.len())]
    pub bytes: Vec<u8>,
}

/// What a command's decision reads besides the task row (see
/// [`Command::needs`]): the store reads it under the task's row lock and
/// passes it to [`decide`] as the [`Context`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Needs {
    /// The issue opened by the `worker.issue` event with this id, if it is
    /// one of this task's.
    pub issue: Option<i64>,
    /// How many events the task's feed holds, counted up to
    /// [`Policy::max_task_events`]: every command that adds to the feed
    /// ([`Command::is_limited`]).
    pub events: bool,
}

impl Needs {
    /// True when the task row alone decides the command.
    pub fn is_empty(&self) -> bool {
        *self == Needs::default()
    }
}

/// Rows other than the task that [`decide`] needs, read under the same lock:
/// what [`Command::needs`] names, nothing else.
#[derive(Debug, Clone, Default)]
pub struct Context {
    /// The issue a `RespondToIssue` command refers to, if it exists on this task.
    pub issue: Option<Issue>,
    /// The events the task's feed holds, counted up to
    /// [`Policy::max_task_events`] (when [`Needs::events`]).
    pub events: u64,
}

/// Changes to the issues table that go with a decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IssueChange {
    /// The `worker.issue` event being appended opens an issue.
    Open { kind: IssueKind },
    /// The agent answered this issue.
    Resolve { event_id: i64, resolution: String },
    /// The task ended: close every open issue with this resolution.
    CloseAll { resolution: String },
}

/// What the store must write, in one transaction.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The task after the command (the store sets `last_event_id`).
    pub task: Task,
    /// Events to append, in order.
    pub events: Vec<NewEvent>,
    pub issue_changes: Vec<IssueChange>,
    /// The photo to store, for photo commands.
    pub photo: Option<NewPhoto>,
    /// What the controller applied, for `Reconcile`.
    pub reconciled: Option<Due>,
}

/// Why a command is not allowed. Every variant is the client's or the
/// moment's fault, never the server's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the task is {state}, which is terminal: it cannot change any more")]
    Terminal { state: TaskState },
    #[error("cannot {action} a task that is {state}")]
    WrongState {
        action: &'static str,
        state: TaskState,
    },
    #[error("the task is not assigned to this worker")]
    NotYourTask,
    #[error("the task's deadline has passed; it is being expired or reopened")]
    DeadlinePassed,
    #[error("no worker.issue event with id {0} exists on this task")]
    IssueNotFound(i64),
    #[error("text is required to {0} an issue")]
    TextRequired(&'static str),
    #[error("issue {0} is already {status}", status = .1.as_str())]
    IssueNotOpen(i64, IssueStatus),
    #[error("nothing is due")]
    NothingDue,
    #[error(
        "the new deadline {requested} is not after the current one, {current}: a task can only be extended"
    )]
    NotAnExtension {
        current: DateTime<Utc>,
        requested: DateTime<Utc>,
    },
    #[error(
        "the new deadline {requested} is past the longest lifetime allowed, which ends at {limit}"
    )]
    BeyondMaxLifetime {
        limit: DateTime<Utc>,
        requested: DateTime<Utc>,
    },
    #[error(
        "the task's feed holds its limit of {limit} events: no more messages, photos, issues, \
         answers or extensions can be added; it can still be completed, stopped or cancelled"
    )]
    EventLimit { limit: u64 },
    #[error(
        "this task asks for the device's position when starting and with every photo: send \
         latitude, longitude and accuracy_m"
    )]
    PositionRequired,
    #[error(
        "the position sent is {distance_m} m from the task's place, which accepts positions \
         within {allowed_m} m (its radius plus the position's accuracy)"
    )]
    OffSite { distance_m: u64, allowed_m: u64 },
    #[error("this task asks for a typed result: send `result`, matching its result_schema")]
    ResultRequired,
    #[error("this task has no result_schema: complete it without `result` (a note is free text)")]
    ResultNotAsked,
    #[error(
        "the work was submitted and waits for the agent's review: it cannot be submitted again"
    )]
    AlreadySubmitted,
    #[error("nothing waits for review on this task (its review is {state})")]
    NothingToReview { state: ReviewState },
    #[error("this task was created without review: there is nothing to review")]
    NotReviewed,
    #[error("the agent has asked for the most revisions allowed ({limit}): accept or reject")]
    RevisionLimit { limit: u32 },
    #[error("text is required to {0} a submission")]
    VerdictTextRequired(&'static str),
}

/// What the event of a start or a photo records of the position the
/// worker's device sent: the position itself, the server's time and, when
/// the task has a place, the distance to it and (unless the agent asked for
/// nothing) whether it is off site. A task that requires presence refuses
/// a missing or off-site position.
fn sighting(
    task: &Task,
    position: Option<&Position>,
    now: DateTime<Utc>,
) -> Result<Option<serde_json::Value>, Refusal> {
    let Some(position) = position else {
        return match (&task.location, task.presence) {
            (Some(_), Presence::Require) => Err(Refusal::PositionRequired),
            _ => Ok(None),
        };
    };
    let mut data = json!({
        "latitude": position.latitude,
        "longitude": position.longitude,
        "accuracy_m": position.accuracy_m,
        "recorded_at": now,
    });
    if let Some(place) = &task.location {
        let seen = place.sighting(position);
        if seen.off_site && task.presence == Presence::Require {
            return Err(Refusal::OffSite {
                distance_m: seen.distance_m.round() as u64,
                allowed_m: (f64::from(place.radius_m) + position.accuracy_m).floor() as u64,
            });
        }
        // To the decimetre: more would be false precision.
        data["distance_m"] = json!((seen.distance_m * 10.0).round() / 10.0);
        if task.presence != Presence::None {
            data["off_site"] = json!(seen.off_site);
        }
    }
    Ok(Some(data))
}

/// Decides the effect of `command` on `task` at `now`.
pub fn decide(
    task: &Task,
    ctx: &Context,
    command: Command,
    now: DateTime<Utc>,
    policy: &Policy,
) -> Result<Decision, Refusal> {
    use TaskState::*;

    if let Some(worker) = command.acting_worker()
        && task.worker_id != Some(worker)
    {
        return Err(Refusal::NotYourTask);
    }
    if task.state.is_terminal() {
        return Err(Refusal::Terminal { state: task.state });
    }
    // Storage per task is bounded. After the two checks above, so that the
    // limit reveals nothing to someone who may not act on the task.
    if command.is_limited() && ctx.events >= policy.max_task_events {
        return Err(Refusal::EventLimit {
            limit: policy.max_task_events,
        });
    }
    let action = command.name();
    let wrong_state = || Refusal::WrongState {
        action,
        state: task.state,
    };
    // Stop, cancel (directly or as the answer to an issue) and the
    // controller act whatever the deadlines say; every other command waits
    // for the controller to apply a passed deadline.
    let deadline_exempt = matches!(
        command,
        Command::Stop { .. }
            | Command::Cancel { .. }
            | Command::Reconcile
            | Command::Release { .. }
            | Command::RespondToIssue {
                action: IssueAction::Cancel,
                ..
            }
    );
    if !deadline_exempt && task.due(now).is_some() {
        return Err(Refusal::DeadlinePassed);
    }

    let mut next = task.clone();
    next.updated_at = now;
    let mut d = Decision {
        task: next,
        events: Vec::new(),
        issue_changes: Vec::new(),
        photo: None,
        reconciled: None,
    };
    let worker_id = task.worker_id;

    match command {
        Command::Publish => {
            if task.state != Draft {
                return Err(wrong_state());
            }
            d.task.state = Open;
            d.task.published_at = Some(now);
            d.push(EventType::TaskPublished, Actor::Agent, json!({}));
        }
        Command::Claim { worker } => {
            if task.state != Open {
                return Err(wrong_state());
            }
            let start_by = now + policy.start_timeout;
            d.task.state = Assigned;
            d.task.worker_id = Some(worker);
            d.task.assigned_at = Some(now);
            d.task.start_by = Some(start_by);
            d.push(
                EventType::TaskAssigned,
                Actor::Worker,
                json!({ "worker_id": worker, "start_by": start_by }),
            );
        }
        Command::Start { worker, position } => {
            if task.state != Assigned {
                return Err(wrong_state());
            }
            let seen = sighting(task, position.as_ref(), now)?;
            let active_until = now + policy.active_time_limit;
            d.task.state = Active;
            d.task.started_at = Some(now);
            d.task.active_until = Some(active_until);
            let mut data = json!({ "worker_id": worker, "active_until": active_until });
            if let Some(seen) = seen {
                data["position"] = seen;
            }
            d.push(EventType::TaskStarted, Actor::Worker, data);
        }
        Command::Message { text, .. } => {
            if !matches!(task.state, Assigned | Active) {
                return Err(wrong_state());
            }
            d.push(
                EventType::WorkerMessage,
                Actor::Worker,
                json!({ "text": text }),
            );
        }
        Command::Photo {
            photo, position, ..
        } => {
            if !matches!(task.state, Assigned | Active) {
                return Err(wrong_state());
            }
            let seen = sighting(task, position.as_ref(), now)?;
            let mut data = json!({
                "photo_id": photo.id,
                "content_type": photo.content_type,
                "width": photo.width,
                "height": photo.height,
                "size_bytes": photo.bytes.len(),
                "path": format!("/api/v1/tasks/{}/photos/{}", task.id, photo.id),
            });
            if let Some(seen) = seen {
                data["position"] = seen;
            }
            d.push(EventType::WorkerPhoto, Actor::Worker, data);
            d.photo = Some(photo);
        }
        Command::RaiseIssue { kind, text, .. } => {
            if !matches!(task.state, Assigned | Active) {
                return Err(wrong_state());
            }
            d.task.open_issues += 1;
            d.push(
                EventType::WorkerIssue,
                Actor::Worker,
                json!({ "kind": kind, "text": text }),
            );
            d.issue_changes.push(IssueChange::Open { kind });
        }
        Command::RespondToIssue {
            issue_event_id,
            action,
            text,
        } => {
            let issue = ctx
                .issue
                .as_ref()
                .filter(|i| i.event_id == issue_event_id && i.task_id == task.id)
                .ok_or(Refusal::IssueNotFound(issue_event_id))?;
            if issue.status != IssueStatus::Open {
                return Err(Refusal::IssueNotOpen(issue_event_id, issue.status));
            }
            // Checked after the state, so a terminal task answers "terminal"
            // (409) whatever the body says.
            if action.requires_text() && text.is_none() {
                return Err(Refusal::TextRequired(action.as_str()));
            }
            d.task.open_issues = (d.task.open_issues - 1).max(0);
            d.push(
                EventType::AgentIssueResponse,
                Actor::Agent,
                json!({ "issue_event_id": issue_event_id, "action": action, "text": text }),
            );
            d.issue_changes.push(IssueChange::Resolve {
                event_id: issue_event_id,
                resolution: action.as_str().to_owned(),
            });
            if action == IssueAction::Cancel {
                d.end(
                    Cancelled,
                    now,
                    EventType::TaskCancelled,
                    Actor::Agent,
                    json!({ "reason": text, "issue_event_id": issue_event_id }),
                );
            }
        }
        Command::Cancel { reason } => {
            d.end(
                Cancelled,
                now,
                EventType::TaskCancelled,
                Actor::Agent,
                json!({ "reason": reason }),
            );
        }
        Command::Complete { note, result, .. } => {
            if task.state != Active {
                return Err(wrong_state());
            }
            match (&task.result_schema, &result) {
                (Some(_), None) => return Err(Refusal::ResultRequired),
                (None, Some(_)) => return Err(Refusal::ResultNotAsked),
                _ => {}
            }
            d.task.result = result.clone();
            match &mut d.task.review {
                Some(review) => {
                    if review.is_waiting() {
                        return Err(Refusal::AlreadySubmitted);
                    }
                    let auto_accept_at = review.submit(now);
                    let mut data = json!({
                        "worker_id": worker_id,
                        "note": note,
                        "revision": review.revisions,
                        "auto_accept_at": auto_accept_at,
                    });
                    with_result(&mut data, result);
                    d.push(EventType::TaskSubmitted, Actor::Worker, data);
                }
                None => {
                    // Without a schema the event is what it always was.
                    let mut data = json!({ "worker_id": worker_id, "note": note });
                    with_result(&mut data, result);
                    d.end(
                        Completed,
                        now,
                        EventType::TaskCompleted,
                        Actor::Worker,
                        data,
                    );
                }
            }
        }
        Command::Review(verdict) => review(&mut d, task, verdict, now, policy)?,
        Command::Stop { reason, .. } => {
            if !matches!(task.state, Assigned | Active) {
                return Err(wrong_state());
            }
            d.end(
                Stopped,
                now,
                EventType::TaskStopped,
                Actor::Worker,
                json!({ "worker_id": worker_id, "reason": reason }),
            );
        }
        Command::Reconcile => {
            let due = task.due(now).ok_or(Refusal::NothingDue)?;
            d.reconciled = Some(due);
            match due {
                Due::AutoAccept => d.accept(now, Actor::System, ReviewState::AutoAccepted),
                Due::Expire(reason) => d.end(
                    Expired,
                    now,
                    EventType::TaskExpired,
                    Actor::System,
                    json!({ "reason": reason, "previous_state": task.state }),
                ),
                Due::Unassign => d.unassign("start_timeout", "assignment_lapsed"),
            }
        }
        Command::Extend(extension) => extend(&mut d, task, extension, policy)?,
        Command::Release { .. } => {
            if !matches!(task.state, Assigned | Active) {
                return Err(wrong_state());
            }
            d.unassign("worker_suspended", "worker_suspended");
            // The work started goes with the worker too: neither its result
            // nor a review of it may reach the next worker.
            d.task.started_at = None;
            d.task.active_until = None;
            d.task.result = None;
            if let Some(review) = &mut d.task.review {
                *review = crate::Review::new(review.auto_accept_seconds);
            }
        }
    }
    Ok(d)
}

/// `Extend`: the new end of the lifetime must be later than the current one
/// (extend only: shortening would let an agent expire a task a worker is
/// about to claim) and within the longest lifetime counted from creation,
/// the same bound creation enforces, so extending cannot keep a task alive
/// forever. The active time limit is separate and unchanged: once a worker
/// has started, `active_until` governs. A task whose deadline has already
/// passed was refused before this point (`DeadlinePassed`): the controller
/// is expiring it.
fn extend(
    d: &mut Decision,
    task: &Task,
    extension: Extension,
    policy: &Policy,
) -> Result<(), Refusal> {
    let expires_at = match extension {
        Extension::Until(t) => t,
        Extension::By(delta) => task.expires_at + delta,
    };
    if expires_at <= task.expires_at {
        return Err(Refusal::NotAnExtension {
            current: task.expires_at,
            requested: expires_at,
        });
    }
    let limit = task.created_at + policy.max_lifetime;
    if expires_at > limit {
        return Err(Refusal::BeyondMaxLifetime {
            limit,
            requested: expires_at,
        });
    }
    d.task.expires_at = expires_at;
    d.push(
        EventType::TaskExtended,
        Actor::Agent,
        json!({ "previous_expires_at": task.expires_at, "expires_at": expires_at }),
    );
    Ok(())
}

/// `Review`: the agent answers the waiting submission. Accept completes
/// the task with the submitted result; revise sends the work back with a
/// text (at most `max_revisions` times) and gives the worker a fresh active
/// time limit; reject cancels the task with the reason.
fn review(
    d: &mut Decision,
    task: &Task,
    verdict: Verdict,
    now: DateTime<Utc>,
    policy: &Policy,
) -> Result<(), Refusal> {
    let review = task.review.as_ref().ok_or(Refusal::NotReviewed)?;
    if task.state != TaskState::Active || !review.is_waiting() {
        return Err(Refusal::NothingToReview {
            state: review.state,
        });
    }
    match verdict {
        Verdict::Accept => d.accept(now, Actor::Agent, ReviewState::Accepted),
        Verdict::Revise { text } => {
            if text.trim().is_empty() {
                return Err(Refusal::VerdictTextRequired("revise"));
            }
            if review.revisions >= review.max_revisions {
                return Err(Refusal::RevisionLimit {
                    limit: review.max_revisions,
                });
            }
            let active_until = now + policy.active_time_limit;
            let next = d.task.review.as_mut().expect("checked above");
            next.close(ReviewState::RevisionRequested);
            next.revisions += 1;
            next.feedback = Some(text.clone());
            let revision = next.revisions;
            d.task.active_until = Some(active_until);
            d.push(
                EventType::TaskRevisionRequested,
                Actor::Agent,
                json!({ "text": text, "revision": revision, "active_until": active_until }),
            );
        }
        Verdict::Reject { reason } => {
            if reason.trim().is_empty() {
                return Err(Refusal::VerdictTextRequired("reject"));
            }
            if let Some(next) = &mut d.task.review {
                next.close(ReviewState::Rejected);
            }
            d.end(
                TaskState::Cancelled,
                now,
                EventType::TaskCancelled,
                Actor::Agent,
                json!({ "reason": reason, "review": ReviewState::Rejected }),
            );
        }
    }
    Ok(())
}

/// Adds the typed result to an event's data, when there is one.
fn with_result(data: &mut serde_json::Value, result: Option<serde_json::Value>) {
    if let Some(result) = result {
        data["result"] = result;
    }
}

impl Decision {
    /// The waiting submission counts: the task completes with its result,
    /// accepted by the agent or, when the delay ran out, by the controller.
    fn accept(&mut self, now: DateTime<Utc>, actor: Actor, outcome: ReviewState) {
        if let Some(review) = &mut self.task.review {
            review.close(outcome);
        }
        let mut data = json!({
            "worker_id": self.task.worker_id,
            "review": outcome,
            "automatic": outcome == ReviewState::AutoAccepted,
        });
        with_result(&mut data, self.task.result.clone());
        self.end(
            TaskState::Completed,
            now,
            EventType::TaskCompleted,
            actor,
            data,
        );
    }

    /// The task reopens without its worker: a `task.unassigned` event by
    /// the system says why (`reason`), and the worker's issues go with its
    /// assignment (closed with `resolution`), so that an answer never
    /// reaches the next worker.
    fn unassign(&mut self, reason: &str, resolution: &str) {
        let worker_id = self.task.worker_id.take();
        self.task.state = TaskState::Open;
        self.task.assigned_at = None;
        self.task.start_by = None;
        self.task.open_issues = 0;
        self.push(
            EventType::TaskUnassigned,
            Actor::System,
            json!({ "worker_id": worker_id, "reason": reason }),
        );
        self.issue_changes.push(IssueChange::CloseAll {
            resolution: resolution.to_owned(),
        });
    }

    fn push(&mut self, kind: EventType, actor: Actor, data: serde_json::Value) {
        self.events.push(NewEvent { kind, actor, data });
    }

    /// Moves the task to a terminal state: one terminal event, open issues
    /// closed with a recorded resolution.
    fn end(
        &mut self,
        state: TaskState,
        now: DateTime<Utc>,
        kind: EventType,
        actor: Actor,
        data: serde_json::Value,
    ) {
        self.task.state = state;
        self.task.ended_at = Some(now);
        self.task.open_issues = 0;
        self.push(kind, actor, data);
        self.issue_changes.push(IssueChange::CloseAll {
            resolution: format!("task_{state}"),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ExpiryReason;
    use crate::task::tests::{at, task};

    const W: Uuid = Uuid::from_u128(7);
    const OTHER: Uuid = Uuid::from_u128(8);

    fn run(t: &Task, c: Command, secs: i64) -> Result<Decision, Refusal> {
        decide(t, &Context::default(), c, at(secs), &Policy::default())
    }

    /// Worker `W` starts, from `position`.
    fn start(position: Option<Position>) -> Command {
        Command::Start {
            worker: W,
            position,
        }
    }

    /// Worker `W` completes, with a note and `result`.
    fn complete(result: Option<serde_json::Value>) -> Command {
        Command::Complete {
            worker: W,
            note: Some("done".into()),
            result,
        }
    }

    /// A one-pixel photo.
    fn pixel() -> NewPhoto {
        NewPhoto {
            id: Uuid::nil(),
            content_type: "image/png".into(),
            width: 1,
            height: 1,
            bytes: vec![0],
        }
    }

    /// The issue changes of a decision that closes every open issue.
    fn closes_all(resolution: &str) -> Vec<IssueChange> {
        vec![IssueChange::CloseAll {
            resolution: resolution.into(),
        }]
    }

    /// One command of every variant (and both kinds of answer to an issue),
    /// acting for worker `W`. The match below has no wildcard, so a new
    /// variant does not compile until it is listed here, and the assertion
    /// fails until a sample of it is.
    fn every_command() -> Vec<Command> {
        let photo = NewPhoto {
            id: Uuid::from_u128(9),
            content_type: "image/png".into(),
            width: 1,
            height: 1,
            bytes: vec![1, 2, 3],
        };
        let commands = vec![
            Command::Publish,
            Command::Cancel { reason: None },
            Command::RespondToIssue {
                issue_event_id: 4,
                action: IssueAction::Clarify,
                text: Some("left door".into()),
            },
            Command::RespondToIssue {
                issue_event_id: 4,
                action: IssueAction::Cancel,
                text: None,
            },
            Command::Claim { worker: W },
            start(None),
            Command::Message {
                worker: W,
                text: "on my way".into(),
            },
            Command::Photo {
                worker: W,
                photo,
                position: None,
            },
            Command::RaiseIssue {
                worker: W,
                kind: IssueKind::AccessBlocked,
                text: "locked".into(),
            },
            complete(None),
            Command::Review(Verdict::Accept),
            Command::Stop {
                worker: W,
                reason: None,
            },
            Command::Reconcile,
            Command::Extend(Extension::By(chrono::TimeDelta::seconds(60))),
            Command::Release { worker: W },
        ];
        let mut seen = [false; 14];
        for c in &commands {
            let i = match c {
                Command::Publish => 0,
                Command::Cancel { .. } => 1,
                Command::RespondToIssue { .. } => 2,
                Command::Claim { .. } => 3,
                Command::Start { .. } => 4,
                Command::Message { .. } => 5,
                Command::Photo { .. } => 6,
                Command::RaiseIssue { .. } => 7,
                Command::Complete { .. } => 8,
                Command::Stop { .. } => 9,
                Command::Reconcile => 10,
                Command::Extend(_) => 11,
                Command::Release { .. } => 12,
                Command::Review(_) => 13,
            };
            seen[i] = true;
        }
        assert!(seen.iter().all(|s| *s), "a command variant has no sample");
        commands
    }

    #[test]
    fn needs_nothing_means_the_context_is_not_read() {
        // A context with everything loaded: an open issue of this task, and
        // one already answered, at the id the sample answer refers to.
        let issue = |status| Issue {
            event_id: 4,
            task_id: Uuid::nil(),
            kind: IssueKind::AccessBlocked,
            status,
            resolution: None,
            resolved_at: None,
        };
        // And a feed past any limit.
        let loaded = [
            Context {
                issue: Some(issue(IssueStatus::Open)),
                events: u64::MAX,
            },
            Context {
                issue: Some(issue(IssueStatus::Resolved)),
                events: u64::MAX,
            },
        ];
        let policy = Policy::default();
        let mut checked = 0;
        for command in every_command().into_iter().filter(|c| c.needs().is_empty()) {
            for state in TaskState::ALL {
                for worker in [None, Some(W), Some(OTHER)] {
                    for secs in [10, 999, 1000, 5000] {
                        let mut t = task(state);
                        t.worker_id = worker;
                        t.open_issues = 1;
                        t.start_by = Some(at(500));
                        t.active_until = Some(at(2000));
                        let bare =
                            decide(&t, &Context::default(), command.clone(), at(secs), &policy);
                        for ctx in &loaded {
                            let with = decide(&t, ctx, command.clone(), at(secs), &policy);
                            assert_eq!(
                                with,
                                bare,
                                "{} on a {state} task at {secs}s reads the context \
                                 but does not declare it in Command::needs()",
                                command.name()
                            );
                        }
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 0);
    }

    #[test]
    fn an_answer_needs_the_issue_it_answers() {
        for command in every_command() {
            let expected = match &command {
                Command::RespondToIssue { issue_event_id, .. } => Some(*issue_event_id),
                _ => None,
            };
            assert_eq!(command.needs().issue, expected, "{}", command.name());
        }
    }

    #[test]
    fn an_addition_to_the_feed_needs_its_count() {
        for command in every_command() {
            assert_eq!(
                command.needs().events,
                command.is_limited(),
                "{}",
                command.name()
            );
        }
    }

    #[test]
    fn only_additions_to_the_feed_count_against_the_event_limit() {
        let respond = |action| Command::RespondToIssue {
            issue_event_id: 1,
            action,
            text: None,
        };
        for limited in [
            Command::Message {
                worker: W,
                text: "x".into(),
            },
            Command::RaiseIssue {
                worker: W,
                kind: IssueKind::AccessBlocked,
                text: "x".into(),
            },
            respond(IssueAction::Clarify),
            respond(IssueAction::Acknowledge),
            Command::Extend(Extension::By(chrono::TimeDelta::hours(1))),
        ] {
            assert!(limited.is_limited(), "{}", limited.name());
        }
        for free in [
            respond(IssueAction::Cancel),
            Command::Cancel { reason: None },
            complete(None),
            Command::Stop {
                worker: W,
                reason: None,
            },
            start(None),
            Command::Claim { worker: W },
            Command::Publish,
            Command::Reconcile,
        ] {
            assert!(!free.is_limited(), "{}", free.name());
        }
    }

    #[test]
    fn the_event_limit_answers_after_whose_task_and_whether_it_ended() {
        let policy = Policy {
            max_task_events: 5,
            ..Policy::default()
        };
        let full = Context {
            events: 5,
            ..Context::default()
        };
        let mut t = task(TaskState::Active);
        t.worker_id = Some(W);
        let msg = |worker| Command::Message {
            worker,
            text: "x".into(),
        };
        let refusal = |t: &Task, ctx: &Context, command: Command| {
            decide(t, ctx, command, at(10), &policy).err()
        };
        let below = Context {
            events: 4,
            ..Context::default()
        };
        assert_eq!(refusal(&t, &below, msg(W)), None, "room for one more");
        assert_eq!(
            refusal(&t, &full, msg(W)),
            Some(Refusal::EventLimit { limit: 5 })
        );
        let photo = Command::Photo {
            worker: W,
            photo: pixel(),
            position: None,
        };
        assert_eq!(
            refusal(&t, &full, photo),
            Some(Refusal::EventLimit { limit: 5 }),
            "a photo is refused as a message is"
        );
        assert_eq!(refusal(&t, &full, msg(OTHER)), Some(Refusal::NotYourTask));
        let extend = Command::Extend(Extension::By(chrono::TimeDelta::hours(1)));
        assert_eq!(
            refusal(&t, &full, extend),
            Some(Refusal::EventLimit { limit: 5 })
        );
        // Endings are not additions: a full feed can still end.
        assert_eq!(refusal(&t, &full, complete(None)), None);
        t.state = TaskState::Completed;
        assert_eq!(
            refusal(&t, &full, msg(W)),
            Some(Refusal::Terminal {
                state: TaskState::Completed
            })
        );
    }

    fn assigned() -> Task {
        let mut t = task(TaskState::Assigned);
        t.worker_id = Some(W);
        t.start_by = Some(at(500));
        t
    }

    fn active() -> Task {
        let mut t = assigned();
        t.state = TaskState::Active;
        t.active_until = Some(at(5000));
        t
    }

    fn kinds(d: &Decision) -> Vec<EventType> {
        d.events.iter().map(|e| e.kind).collect()
    }

    #[test]
    fn happy_path_through_every_non_terminal_state() {
        let t = task(TaskState::Draft);
        let d = run(&t, Command::Publish, 1).unwrap();
        assert_eq!(
            (d.task.state, kinds(&d)),
            (TaskState::Open, vec![EventType::TaskPublished])
        );

        let d = run(&d.task, Command::Claim { worker: W }, 2).unwrap();
        assert_eq!(d.task.state, TaskState::Assigned);
        assert_eq!(d.task.worker_id, Some(W));
        assert_eq!(
            d.task.start_by,
            Some(at(2) + Policy::default().start_timeout)
        );

        let d = run(&d.task, start(None), 3).unwrap();
        assert_eq!(d.task.state, TaskState::Active);
        assert_eq!(
            d.task.active_until,
            Some(at(3) + Policy::default().active_time_limit)
        );

        let d = run(&d.task, complete(None), 4).unwrap();
        assert_eq!(d.task.state, TaskState::Completed);
        assert_eq!(d.task.ended_at, Some(at(4)));
        assert_eq!(kinds(&d), vec![EventType::TaskCompleted]);
        assert_eq!(d.task.next_deadline(), None);
    }

    #[test]
    fn only_drafts_publish_and_only_open_tasks_are_claimed() {
        let open = task(TaskState::Open);
        assert!(matches!(
            run(&open, Command::Publish, 1),
            Err(Refusal::WrongState { .. })
        ));
        assert!(matches!(
            run(&assigned(), Command::Claim { worker: OTHER }, 1),
            Err(Refusal::WrongState {
                state: TaskState::Assigned,
                ..
            })
        ));
    }

    #[test]
    fn worker_commands_need_the_assignment() {
        for c in [
            Command::Start {
                worker: OTHER,
                position: None,
            },
            Command::Message {
                worker: OTHER,
                text: "hi".into(),
            },
            Command::Stop {
                worker: OTHER,
                reason: None,
            },
            Command::Complete {
                worker: OTHER,
                note: None,
                result: None,
            },
        ] {
            assert_eq!(run(&active(), c, 1).unwrap_err(), Refusal::NotYourTask);
        }
    }

    #[test]
    fn stop_is_allowed_from_assigned_and_active_even_past_deadlines() {
        for t in [assigned(), active()] {
            let d = run(
                &t,
                Command::Stop {
                    worker: W,
                    reason: Some("rain".into()),
                },
                99_999,
            )
            .unwrap();
            assert_eq!(d.task.state, TaskState::Stopped);
            assert_eq!(kinds(&d), vec![EventType::TaskStopped]);
        }
    }

    #[test]
    fn terminal_tasks_refuse_everything() {
        for s in TaskState::ALL.into_iter().filter(|s| s.is_terminal()) {
            let mut t = active();
            t.state = s;
            for c in [
                Command::Publish,
                Command::Cancel { reason: None },
                Command::Stop {
                    worker: W,
                    reason: None,
                },
                Command::Message {
                    worker: W,
                    text: "x".into(),
                },
                Command::Reconcile,
            ] {
                assert_eq!(run(&t, c, 1).unwrap_err(), Refusal::Terminal { state: s });
            }
        }
    }

    #[test]
    fn cancel_from_every_non_terminal_state_closes_open_issues() {
        for s in [
            TaskState::Draft,
            TaskState::Open,
            TaskState::Assigned,
            TaskState::Active,
        ] {
            let mut t = active();
            t.state = s;
            t.open_issues = 2;
            let d = run(&t, Command::Cancel { reason: None }, 1).unwrap();
            assert_eq!(d.task.state, TaskState::Cancelled);
            assert_eq!(d.task.open_issues, 0);
            assert_eq!(d.issue_changes, closes_all("task_cancelled"));
        }
    }

    #[test]
    fn commands_wait_for_a_passed_deadline_to_be_applied() {
        let t = task(TaskState::Open);
        assert_eq!(
            run(&t, Command::Claim { worker: W }, 1000).unwrap_err(),
            Refusal::DeadlinePassed
        );
        assert_eq!(
            run(&assigned(), start(None), 500).unwrap_err(),
            Refusal::DeadlinePassed
        );
    }

    /// What the controller writes at a deadline: one terminal event by the
    /// system naming the reason and the state the task was in, and every
    /// open issue closed with the resolution `task_expired`.
    #[test]
    fn expiry_records_why_and_from_where_and_closes_open_issues() {
        let mut t = active();
        t.open_issues = 2;
        let d = run(&t, Command::Reconcile, 5000).unwrap();
        assert_eq!(d.task.state, TaskState::Expired);
        assert_eq!(d.task.ended_at, Some(at(5000)));
        assert_eq!(d.task.open_issues, 0);
        assert_eq!(d.task.next_deadline(), None);
        assert_eq!(kinds(&d), vec![EventType::TaskExpired]);
        assert_eq!(
            d.events[0].data,
            json!({ "reason": "active_time_limit", "previous_state": "active" })
        );
        assert_eq!(d.issue_changes, closes_all("task_expired"));
    }

    /// A lapsed assignment reopens the task within its lifetime, and the
    /// lapsed worker's issues close with it, so an answer can never reach
    /// the next worker.
    #[test]
    fn a_reopened_task_waits_for_a_new_claim_and_keeps_its_lifetime() {
        let mut t = assigned();
        t.open_issues = 2;
        let d = run(&t, Command::Reconcile, 500).unwrap();
        assert_eq!(d.reconciled, Some(Due::Unassign));
        assert_eq!(d.task.state, TaskState::Open);
        assert_eq!(d.task.expires_at, assigned().expires_at);
        assert_eq!(d.task.next_deadline(), Some(at(1000)));
        assert_eq!(d.events[0].actor, Actor::System);
        assert_eq!(
            d.events[0].data,
            json!({ "worker_id": W, "reason": "start_timeout" })
        );
        assert_eq!(d.task.open_issues, 0);
        assert_eq!(d.issue_changes, closes_all("assignment_lapsed"));
        let claimed = run(&d.task, Command::Claim { worker: OTHER }, 600).unwrap();
        assert_eq!(claimed.task.worker_id, Some(OTHER));
    }

    /// Suspending a worker reopens the task it holds, started or
    /// not, closes its issues, and no other worker's task is touched.
    #[test]
    fn releasing_a_suspended_workers_task_reopens_it() {
        for mut t in [assigned(), active()] {
            t.open_issues = 1;
            let d = run(&t, Command::Release { worker: W }, 100).unwrap();
            assert_eq!(d.task.state, TaskState::Open);
            assert_eq!(d.task.worker_id, None);
            assert_eq!((d.task.start_by, d.task.active_until), (None, None));
            assert_eq!(d.task.open_issues, 0);
            assert_eq!(d.events[0].kind, EventType::TaskUnassigned);
            assert_eq!(d.events[0].data["reason"], "worker_suspended");
            let other = Command::Release {
                worker: Uuid::from_u128(77),
            };
            assert_eq!(run(&t, other, 100).unwrap_err(), Refusal::NotYourTask);
        }
        assert!(
            run(
                &task(TaskState::Completed),
                Command::Release { worker: W },
                100
            )
            .is_err()
        );
    }

    /// Answering with `cancel` is a cancel: like `POST /cancel` it does not
    /// wait for the controller to apply a passed deadline. Other answers do.
    #[test]
    fn cancel_as_an_answer_works_past_the_deadline_like_cancel() {
        let respond = |action, text: Option<&str>| Command::RespondToIssue {
            issue_event_id: 42,
            action,
            text: text.map(str::to_owned),
        };
        let past = at(5000);
        let d = decide(
            &active(),
            &issue(IssueStatus::Open),
            respond(IssueAction::Cancel, None),
            past,
            &Policy::default(),
        )
        .unwrap();
        assert_eq!(d.task.state, TaskState::Cancelled);
        let err = decide(
            &active(),
            &issue(IssueStatus::Open),
            respond(IssueAction::Clarify, Some("left")),
            past,
            &Policy::default(),
        )
        .unwrap_err();
        assert_eq!(err, Refusal::DeadlinePassed);
    }

    /// A missing text is reported only for a task that could take the
    /// answer: a terminal task says it is terminal.
    #[test]
    fn text_is_checked_after_the_state() {
        let clarify = Command::RespondToIssue {
            issue_event_id: 42,
            action: IssueAction::Clarify,
            text: None,
        };
        let err = decide(
            &active(),
            &issue(IssueStatus::Open),
            clarify.clone(),
            at(3),
            &Policy::default(),
        )
        .unwrap_err();
        assert_eq!(err, Refusal::TextRequired("clarify"));
        let mut done = active();
        done.state = TaskState::Completed;
        let err = decide(
            &done,
            &issue(IssueStatus::Open),
            clarify,
            at(3),
            &Policy::default(),
        )
        .unwrap_err();
        assert_eq!(
            err,
            Refusal::Terminal {
                state: TaskState::Completed
            }
        );
    }

    #[test]
    fn reconcile_expires_or_unassigns() {
        assert_eq!(
            run(&task(TaskState::Open), Command::Reconcile, 999).unwrap_err(),
            Refusal::NothingDue
        );

        let d = run(&task(TaskState::Open), Command::Reconcile, 1000).unwrap();
        assert_eq!(d.task.state, TaskState::Expired);
        assert_eq!(d.reconciled, Some(Due::Expire(ExpiryReason::Lifetime)));
        assert_eq!(d.events[0].actor, Actor::System);

        let d = run(&assigned(), Command::Reconcile, 600).unwrap();
        assert_eq!(d.task.state, TaskState::Open);
        assert_eq!(d.task.worker_id, None);
        assert_eq!(d.task.start_by, None);
        assert_eq!(kinds(&d), vec![EventType::TaskUnassigned]);

        let d = run(&active(), Command::Reconcile, 5000).unwrap();
        assert_eq!(
            d.reconciled,
            Some(Due::Expire(ExpiryReason::ActiveTimeLimit))
        );
    }

    fn issue(status: IssueStatus) -> Context {
        Context {
            issue: Some(Issue {
                event_id: 42,
                task_id: Uuid::nil(),
                kind: IssueKind::AccessBlocked,
                status,
                resolution: None,
                resolved_at: None,
            }),
            ..Context::default()
        }
    }

    #[test]
    fn issues_open_and_resolve_once() {
        let d = run(
            &active(),
            Command::RaiseIssue {
                worker: W,
                kind: IssueKind::AccessBlocked,
                text: "gate locked".into(),
            },
            1,
        )
        .unwrap();
        assert_eq!(d.task.open_issues, 1);
        assert_eq!(
            d.issue_changes,
            vec![IssueChange::Open {
                kind: IssueKind::AccessBlocked
            }]
        );

        let respond = |action| Command::RespondToIssue {
            issue_event_id: 42,
            action,
            text: Some("use the side door".into()),
        };
        let d = decide(
            &d.task,
            &issue(IssueStatus::Open),
            respond(IssueAction::Clarify),
            at(2),
            &Policy::default(),
        )
        .unwrap();
        assert_eq!(d.task.open_issues, 0);
        assert_eq!(kinds(&d), vec![EventType::AgentIssueResponse]);

        let err = decide(
            &active(),
            &issue(IssueStatus::Resolved),
            respond(IssueAction::Clarify),
            at(2),
            &Policy::default(),
        )
        .unwrap_err();
        assert_eq!(err, Refusal::IssueNotOpen(42, IssueStatus::Resolved));
        let err = run(&active(), respond(IssueAction::Clarify), 2).unwrap_err();
        assert_eq!(err, Refusal::IssueNotFound(42));
    }

    #[test]
    fn answering_an_issue_with_cancel_ends_the_task() {
        let d = decide(
            &active(),
            &issue(IssueStatus::Open),
            Command::RespondToIssue {
                issue_event_id: 42,
                action: IssueAction::Cancel,
                text: None,
            },
            at(3),
            &Policy::default(),
        )
        .unwrap();
        assert_eq!(d.task.state, TaskState::Cancelled);
        assert_eq!(
            kinds(&d),
            vec![EventType::AgentIssueResponse, EventType::TaskCancelled]
        );
        assert_eq!(d.events.iter().filter(|e| e.kind.is_terminal()).count(), 1);
    }

    #[test]
    fn extend_moves_the_lifetime_later_within_the_maximum() {
        let t = task(TaskState::Open);
        let later = at(2000);
        let d = run(&t, Command::Extend(Extension::Until(later)), 10).unwrap();
        assert_eq!(d.task.expires_at, later);
        assert_eq!(d.task.state, TaskState::Open);
        assert_eq!(d.task.next_deadline(), Some(later));
        assert_eq!(kinds(&d), vec![EventType::TaskExtended]);
        assert_eq!(d.events[0].actor, Actor::Agent);
        assert_eq!(
            d.events[0].data,
            json!({ "previous_expires_at": at(1000), "expires_at": later })
        );
        // Nothing is due any more at the old deadline.
        assert_eq!(d.task.due(at(1000)), None);
    }

    #[test]
    fn extend_never_shortens_and_stays_within_the_maximum_lifetime() {
        let t = task(TaskState::Open);
        for secs in [999, 1000] {
            assert!(matches!(
                run(&t, Command::Extend(Extension::Until(at(secs))), 10),
                Err(Refusal::NotAnExtension { .. })
            ));
        }
        let limit = t.created_at + Policy::default().max_lifetime;
        let d = run(&t, Command::Extend(Extension::Until(limit)), 10).unwrap();
        assert_eq!(d.task.expires_at, limit);
        let past = limit + chrono::TimeDelta::milliseconds(1);
        assert_eq!(
            run(&t, Command::Extend(Extension::Until(past)), 10).unwrap_err(),
            Refusal::BeyondMaxLifetime {
                limit,
                requested: past
            }
        );
    }

    #[test]
    fn extend_is_refused_on_terminal_tasks_and_after_the_deadline() {
        for s in TaskState::ALL.into_iter().filter(|s| s.is_terminal()) {
            let t = task(s);
            assert_eq!(
                run(&t, Command::Extend(Extension::Until(at(2000))), 10).unwrap_err(),
                Refusal::Terminal { state: s }
            );
        }
        assert_eq!(
            run(
                &task(TaskState::Open),
                Command::Extend(Extension::Until(at(2000))),
                1000
            )
            .unwrap_err(),
            Refusal::DeadlinePassed
        );
    }

    #[test]
    fn extend_by_counts_from_the_current_deadline() {
        let t = task(TaskState::Open);
        let by = Command::Extend(Extension::By(chrono::TimeDelta::seconds(60)));
        let d = run(&t, by.clone(), 10).unwrap();
        assert_eq!(d.task.expires_at, at(1060));
        let d = run(&d.task, by, 11).unwrap();
        assert_eq!(d.task.expires_at, at(1120));
        let zero = Command::Extend(Extension::By(chrono::TimeDelta::zero()));
        assert!(matches!(
            run(&t, zero, 10),
            Err(Refusal::NotAnExtension { .. })
        ));
    }

    #[test]
    fn extending_an_assigned_task_keeps_its_start_deadline() {
        let d = run(&assigned(), Command::Extend(Extension::Until(at(3000))), 10).unwrap();
        assert_eq!(d.task.start_by, Some(at(500)));
        assert_eq!(d.task.next_deadline(), Some(at(500)));
    }

    fn located(presence: Presence) -> Task {
        let mut t = assigned();
        t.location = Some(crate::Location::new(52.52, 13.405, Some(100), None).unwrap());
        t.presence = presence;
        t
    }

    fn at_distance(metres: f64, accuracy_m: f64) -> Option<Position> {
        // About 111 km per degree of latitude: metres north of the place.
        Some(Position::new(52.52 + metres / 111_250.0, 13.405, accuracy_m).unwrap())
    }

    #[test]
    fn a_start_records_the_position_its_distance_and_the_servers_time() {
        let d = run(&located(Presence::Flag), start(at_distance(300.0, 20.0)), 5).unwrap();
        let data = &d.events[0].data["position"];
        assert!((data["distance_m"].as_f64().unwrap() - 300.0).abs() < 2.0);
        assert_eq!(data["off_site"], true, "300 m > 100 m + 20 m");
        assert_eq!(data["accuracy_m"], 20.0);
        assert_eq!(data["recorded_at"], serde_json::json!(at(5)));
        let stored = d.events[0].clone().stored(1, d.task.id, at(5));
        assert!(stored.untrusted, "a position is worker-sent data");

        let d = run(&located(Presence::Flag), start(at_distance(150.0, 60.0)), 5).unwrap();
        assert_eq!(
            d.events[0].data["position"]["off_site"], false,
            "the accuracy counts"
        );
        let d = run(&located(Presence::None), start(at_distance(5000.0, 5.0)), 5).unwrap();
        assert!(d.events[0].data["position"]["off_site"].is_null());
        assert!(d.events[0].data["position"]["distance_m"].is_number());
    }

    #[test]
    fn a_task_that_requires_presence_refuses_a_missing_or_distant_position() {
        let t = located(Presence::Require);
        assert_eq!(
            run(&t, start(None), 5).unwrap_err(),
            Refusal::PositionRequired
        );
        match run(&t, start(at_distance(1000.0, 50.0)), 5).unwrap_err() {
            Refusal::OffSite {
                distance_m,
                allowed_m,
            } => {
                assert!((995..=1005).contains(&distance_m), "{distance_m}");
                assert_eq!(allowed_m, 150);
            }
            other => panic!("{other:?}"),
        }
        let photo = |position| Command::Photo {
            worker: W,
            photo: pixel(),
            position,
        };
        assert!(matches!(
            run(&t, photo(at_distance(1000.0, 50.0)), 5),
            Err(Refusal::OffSite { .. })
        ));
        let d = run(&t, photo(at_distance(90.0, 5.0)), 5).unwrap();
        assert_eq!(d.events[0].data["position"]["off_site"], false);
        // Without a place, nothing is required and a position is only recorded.
        let d = run(&assigned(), start(None), 5).unwrap();
        assert!(d.events[0].data.get("position").is_none());
        assert!(!d.events[0].clone().stored(1, d.task.id, at(5)).untrusted);
    }

    fn reviewed(schema: bool) -> Task {
        let mut t = task(TaskState::Active);
        t.worker_id = Some(W);
        t.active_until = Some(at(500));
        t.review = Some(crate::Review::new(100));
        if schema {
            t.result_schema = Some(json!({"type": "object"}));
        }
        t
    }

    fn verdict(v: Verdict) -> Command {
        Command::Review(v)
    }

    #[test]
    fn with_review_a_complete_is_a_submission_and_the_task_stays_active() {
        let d = run(&reviewed(true), complete(Some(json!({"ok": true}))), 10).unwrap();
        assert_eq!(d.task.state, TaskState::Active);
        assert_eq!(kinds(&d), vec![EventType::TaskSubmitted]);
        let review = d.task.review.as_ref().unwrap();
        assert_eq!(review.state, ReviewState::Submitted);
        assert_eq!(review.auto_accept_at, Some(at(110)));
        assert_eq!(d.task.result, Some(json!({"ok": true})));
        assert_eq!(d.events[0].data["result"], json!({"ok": true}));
        // The wait replaces the active time limit as the deadline.
        assert_eq!(d.task.next_deadline(), Some(at(110)));
        assert_eq!(d.task.due(at(600)), Some(Due::AutoAccept));
        assert_eq!(d.task.due(at(109)), None);
        assert_eq!(
            run(&d.task, complete(Some(json!({}))), 11).unwrap_err(),
            Refusal::AlreadySubmitted
        );
    }

    #[test]
    fn a_schema_requires_a_result_and_no_schema_refuses_one() {
        assert_eq!(
            run(&reviewed(true), complete(None), 1).unwrap_err(),
            Refusal::ResultRequired
        );
        assert_eq!(
            run(&reviewed(false), complete(Some(json!({}))), 1).unwrap_err(),
            Refusal::ResultNotAsked
        );
        // Without review, a typed result completes the task and is carried.
        let mut t = reviewed(true);
        t.review = None;
        let d = run(&t, complete(Some(json!({"n": 1}))), 1).unwrap();
        assert_eq!(d.task.state, TaskState::Completed);
        assert_eq!(d.events[0].data["result"], json!({"n": 1}));
    }

    #[test]
    fn accept_completes_with_the_submitted_result() {
        let submitted = run(&reviewed(true), complete(Some(json!({"a": 1}))), 10).unwrap();
        let d = run(&submitted.task, verdict(Verdict::Accept), 20).unwrap();
        assert_eq!(d.task.state, TaskState::Completed);
        assert_eq!(d.events[0].kind, EventType::TaskCompleted);
        assert_eq!(d.events[0].actor, Actor::Agent);
        assert_eq!(d.events[0].data["result"], json!({"a": 1}));
        assert_eq!(d.events[0].data["automatic"], json!(false));
        assert_eq!(d.task.review.unwrap().state, ReviewState::Accepted);
    }

    #[test]
    fn the_controller_accepts_when_the_delay_runs_out() {
        let submitted = run(&reviewed(false), complete(None), 10).unwrap().task;
        assert_eq!(
            run(&submitted, Command::Reconcile, 109).unwrap_err(),
            Refusal::NothingDue
        );
        // Long past the active time limit (500): still accepted, not expired.
        let d = run(&submitted, Command::Reconcile, 110).unwrap();
        assert_eq!(d.reconciled, Some(Due::AutoAccept));
        assert_eq!(d.task.state, TaskState::Completed);
        assert_eq!(d.events[0].actor, Actor::System);
        assert_eq!(d.events[0].data["automatic"], json!(true));
        assert_eq!(d.task.review.unwrap().state, ReviewState::AutoAccepted);
        // The agent's late answer waits for the controller.
        assert_eq!(
            run(&submitted, verdict(Verdict::Accept), 110).unwrap_err(),
            Refusal::DeadlinePassed
        );
    }

    #[test]
    fn revise_sends_the_work_back_up_to_the_limit() {
        let mut t = reviewed(false);
        for n in 1..=crate::review::MAX_REVISIONS {
            t = run(&t, complete(None), 10).unwrap().task;
            let d = run(
                &t,
                verdict(Verdict::Revise {
                    text: "blurry".into(),
                }),
                20,
            )
            .unwrap();
            assert_eq!(kinds(&d), vec![EventType::TaskRevisionRequested]);
            assert_eq!(d.events[0].data["revision"], json!(n));
            let review = d.task.review.as_ref().unwrap();
            assert_eq!(review.state, ReviewState::RevisionRequested);
            assert_eq!(review.feedback.as_deref(), Some("blurry"));
            assert_eq!(review.auto_accept_at, None);
            assert_eq!(
                d.task.active_until,
                Some(at(20) + Policy::default().active_time_limit)
            );
            t = d.task;
        }
        let t = run(&t, complete(None), 30).unwrap().task;
        assert_eq!(
            run(
                &t,
                verdict(Verdict::Revise {
                    text: "again".into()
                }),
                40
            )
            .unwrap_err(),
            Refusal::RevisionLimit {
                limit: crate::review::MAX_REVISIONS
            }
        );
        assert_eq!(
            run(&t, verdict(Verdict::Revise { text: " ".into() }), 40).unwrap_err(),
            Refusal::VerdictTextRequired("revise")
        );
    }

    #[test]
    fn reject_cancels_with_the_reason() {
        let t = run(&reviewed(false), complete(None), 10).unwrap().task;
        let d = run(
            &t,
            verdict(Verdict::Reject {
                reason: "wrong door".into(),
            }),
            20,
        )
        .unwrap();
        assert_eq!(d.task.state, TaskState::Cancelled);
        assert_eq!(d.events[0].kind, EventType::TaskCancelled);
        assert_eq!(d.events[0].data["reason"], "wrong door");
        assert_eq!(d.task.review.unwrap().state, ReviewState::Rejected);
    }

    #[test]
    fn nothing_to_review_before_a_submission_or_without_review() {
        assert_eq!(
            run(&reviewed(false), verdict(Verdict::Accept), 1).unwrap_err(),
            Refusal::NothingToReview {
                state: ReviewState::AwaitingSubmission
            }
        );
        let mut t = reviewed(false);
        t.review = None;
        assert_eq!(
            run(&t, verdict(Verdict::Accept), 1).unwrap_err(),
            Refusal::NotReviewed
        );
    }

    #[test]
    fn the_workers_stop_and_a_cancel_end_a_waiting_submission() {
        let t = run(&reviewed(false), complete(None), 10).unwrap().task;
        let stop = Command::Stop {
            worker: W,
            reason: None,
        };
        assert_eq!(run(&t, stop, 20).unwrap().task.state, TaskState::Stopped);
        let cancel = Command::Cancel { reason: None };
        assert_eq!(
            run(&t, cancel, 20).unwrap().task.state,
            TaskState::Cancelled
        );
    }
}
