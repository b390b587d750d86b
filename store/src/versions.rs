//! [`TaskVersions`]: counters of the task changes a process knows about,
//! for caches of task data that must never answer with something older
//! than a change their process already acknowledged.
//!
//! A store bumps a task's counter right after each commit that touches the
//! task (whether or not the commit's answer arrived), before the call that
//! made it returns; whoever follows [`Store::changes`](super::Store::changes)
//! may bump it too for changes made elsewhere. A reader that takes
//! [`TaskVersions::current`] *before* it reads the database, and keeps what
//! it read only while the counter still has that value, holds data at least
//! as new as every change this process has finished writing: a commit the
//! read did not see bumps the counter after it, and so discards the copy.
//!
//! Counters are striped (several tasks may share one), which can only
//! discard a copy that was still good, never keep one that is stale.

use std::sync::atomic::{AtomicU64, Ordering};

use uuid::Uuid;

/// Number of counters; a power of two.
const STRIPES: usize = 4096;

/// Per-task change counters (striped). See the module documentation.
#[derive(Debug)]
pub struct TaskVersions {
    stripes: Box<[AtomicU64]>,
}

impl Default for TaskVersions {
    fn default() -> Self {
        TaskVersions {
            stripes: (0..STRIPES).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl TaskVersions {
    fn stripe(&self, id: Uuid) -> &AtomicU64 {
        let (high, low) = id.as_u64_pair();
        &self.stripes[((high ^ low) as usize) & (STRIPES - 1)]
    }

    /// The task's counter now: take it before reading the task.
    pub fn current(&self, id: Uuid) -> u64 {
        self.stripe(id).load(Ordering::SeqCst)
    }

    /// Records that the task changed (call after the commit).
    pub fn bump(&self, id: Uuid) {
        self.stripe(id).fetch_add(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bump_changes_the_task_counter_and_leaves_the_others_mostly_alone() {
        let v = TaskVersions::default();
        let (a, b) = (Uuid::from_u128(1), Uuid::from_u128(2));
        let (a0, b0) = (v.current(a), v.current(b));
        v.bump(a);
        assert_ne!(v.current(a), a0);
        assert_eq!(v.current(b), b0);
    }
}
