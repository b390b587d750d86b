//! What each reader of a task's feed may see. The agent reads every event of
//! its task. A worker reads only a task assigned to it, and of its feed only
//! what happened from its own assignment on: a task reopened after an
//! assignment lapsed (`task.unassigned`) belongs to its next worker from the
//! reopening, and what the previous worker sent, and the answers it got
//! (a door code, an address), are not the next worker's to read.
//!
//! The JSON feed, the web app and the event stream all ask [`FeedView`], so
//! the three cannot disagree.

use uuid::Uuid;

use super::{Event, Task};

/// The part of one task's feed a reader may see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeedView {
    /// The task's agent: everything.
    Agent,
    /// A worker: while the task is assigned to it, the events after `floor`.
    Worker {
        worker: Uuid,
        /// Id of the task's newest `task.unassigned` event (0 without one):
        /// it and everything before it belong to earlier assignments.
        floor: i64,
    },
}

impl FeedView {
    /// What `worker` may see of a task whose newest `task.unassigned` event
    /// is `last_unassigned` (the store's answer; `None` when the task never
    /// lost an assignment).
    pub fn worker(worker: Uuid, last_unassigned: Option<i64>) -> FeedView {
        FeedView::Worker {
            worker,
            floor: last_unassigned.unwrap_or(0).max(0),
        }
    }

    /// Whether the reader may read the task at all (a worker only while it
    /// holds the assignment).
    pub fn may_read(&self, task: &Task) -> bool {
        match self {
            FeedView::Agent => true,
            FeedView::Worker { worker, .. } => task.worker_id == Some(*worker),
        }
    }

    /// Id of the newest event the reader may not see (0: none hidden).
    pub fn floor(&self) -> i64 {
        match self {
            FeedView::Agent => 0,
            FeedView::Worker { floor, .. } => *floor,
        }
    }

    /// The cursor a read asked to continue after `after` really starts from.
    pub fn start(&self, after: i64) -> i64 {
        after.max(self.floor())
    }

    /// Whether the reader may see `event`.
    pub fn shows(&self, event: &Event) -> bool {
        event.id > self.floor()
    }
}

#[cfg(test)]
mod tests {
    use chrono::Utc;

    use super::*;
    use crate::{Actor, EventType};

    fn event(id: i64) -> Event {
        Event {
            id,
            task_id: Uuid::nil(),
            kind: EventType::WorkerMessage,
            created_at: Utc::now(),
            actor: Actor::Worker,
            untrusted: true,
            data: serde_json::json!({ "text": "the door code is 4711" }),
        }
    }

    #[test]
    fn a_worker_sees_only_what_followed_the_last_unassignment() {
        let b = Uuid::new_v4();
        let view = FeedView::worker(b, Some(7));
        assert!(!view.shows(&event(3)), "the previous worker's message");
        assert!(!view.shows(&event(7)), "the unassignment itself");
        assert!(view.shows(&event(8)));
        // Reading from the start, or from any cursor before the floor,
        // starts after it; a later cursor is kept.
        assert_eq!(view.start(0), 7);
        assert_eq!(view.start(5), 7);
        assert_eq!(view.start(12), 12);
    }

    #[test]
    fn a_worker_of_a_task_never_unassigned_sees_the_whole_feed() {
        let view = FeedView::worker(Uuid::new_v4(), None);
        assert_eq!(view.floor(), 0);
        assert!(view.shows(&event(1)));
        assert_eq!(view.start(0), 0);
    }

    #[test]
    fn a_worker_reads_only_a_task_assigned_to_it() {
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let mut task = crate::task::tests::task(crate::TaskState::Assigned);
        task.worker_id = Some(b);
        assert!(FeedView::worker(b, Some(7)).may_read(&task));
        assert!(!FeedView::worker(a, None).may_read(&task));
        task.worker_id = None;
        assert!(!FeedView::worker(b, None).may_read(&task));
        assert!(FeedView::Agent.may_read(&task));
    }

    #[test]
    fn the_agent_sees_everything() {
        let view = FeedView::Agent;
        assert!(view.shows(&event(1)));
        assert_eq!(view.start(3), 3);
    }
}
