//! Which open tasks a worker may see, open and claim: those whose
//! requirements its qualifications meet, of principals that have not
//! blocked it. Every worker surface (the JSON lists, the nearby list, one
//! task, the claim, the web app's pages) asks here, so a task a worker may
//! not take does not exist for it anywhere (404, as for a task that does
//! not exist). A task assigned to the worker stays its own whatever
//! happens to its qualifications.

use chrono::{DateTime, Utc};
use meatspace_domain::Task;
use meatspace_domain::qualification::{Qualification, all_met};
use tokio::sync::OnceCell;
use uuid::Uuid;

use crate::AppState;
use crate::http::error::ApiError;

/// What decides it for one worker, each part read at most once per
/// request and only when a task needs it (a task without requirements
/// never reads the worker's qualifications).
#[derive(Debug)]
pub(crate) struct Eligibility {
    worker: Uuid,
    held: OnceCell<Vec<Qualification>>,
    blocked_by: OnceCell<Vec<Uuid>>,
    now: DateTime<Utc>,
}

impl Eligibility {
    /// For `worker`, at the server's time now.
    pub(crate) fn of(state: &AppState, worker: Uuid) -> Eligibility {
        Eligibility {
            worker,
            held: OnceCell::new(),
            blocked_by: OnceCell::new(),
            now: state.clock.now(),
        }
    }

    /// Whether the worker may see and claim `task`: its own always; any
    /// other when every requirement holds and its owner has not blocked
    /// the worker.
    pub(crate) async fn admits(&self, state: &AppState, task: &Task) -> Result<bool, ApiError> {
        if task.worker_id == Some(self.worker) {
            return Ok(true);
        }
        if !task.requirements.is_empty() {
            let held = self
                .held
                .get_or_try_init(|| state.store.qualifications(self.worker))
                .await?;
            if !all_met(&task.requirements, held, self.now) {
                return Ok(false);
            }
        }
        let blocked_by = self
            .blocked_by
            .get_or_try_init(|| state.store.blocked_by(self.worker))
            .await?;
        if blocked_by.is_empty() {
            return Ok(true);
        }
        let owner = state.store.task_owner(task.id).await?;
        Ok(!owner.is_some_and(|o| blocked_by.contains(&o)))
    }

    /// The items of a listing whose task the worker may see, in order. A
    /// page may so hold fewer than its limit; its cursor still leads on.
    pub(crate) async fn keep<T>(
        &self,
        state: &AppState,
        items: Vec<T>,
        task_of: impl Fn(&T) -> &Task,
    ) -> Result<Vec<T>, ApiError> {
        let mut kept = Vec::with_capacity(items.len());
        for item in items {
            if self.admits(state, task_of(&item)).await? {
                kept.push(item);
            }
        }
        Ok(kept)
    }
}
