//! A command's conditional write on PostgreSQL, grouped: writes that arrive
//! while others are being written share one statement
//! ([`PgStore::write_in_one_statement`]) and one transaction. They pay one
//! round trip, one executor start-up, one commit and one notification
//! signal between them. PostgreSQL serializes the commits that notify (a
//! lock on the notification queue, held to the end of each), so under load
//! those are what each write of a task's lifecycle would otherwise wait on,
//! as creates did before [`crate::creates`] grouped them.
//!
//! Each write in a group is still conditional on its own: it writes only if
//! its task is still as it was decided on, and otherwise writes nothing, so
//! one write's lost race is never another's. A group locks its tasks in the
//! order of their ids, as every group does, so two groups never wait for
//! each other in a cycle. A group of writes to distinct tasks is one
//! statement, which is its own transaction; a second write of a task
//! already in the group follows in a statement of its own, and then the
//! two run in one transaction.
//!
//! Nothing waits to fill a group. A writer takes the first write queued
//! and whatever else is queued at that moment (up to [`MAX_GROUP`]); a lone
//! write is written at once, in its own statement and transaction, as
//! before grouping. [`WRITERS`] groups can be in flight at once. Every write
//! is answered only after its group commits. A group that fails for
//! anything but an outage is written again one write at a time, so one
//! write's fault is never another's.

use std::sync::Arc;

use meatspace_domain::{Decision, Task};
use meatspace_store::{Applied, StoreError};
use sqlx::PgPool;
use tokio::sync::{Mutex, mpsc, oneshot};

use crate::PgStore;
use crate::creates::{GroupKind, count_fallback, count_group, next_group, share};

/// Groups written at once (each takes a pooled connection). Two: while one
/// group is written the next one gathers, and larger groups are cheaper
/// per write; more writers make smaller groups under load, and each
/// costs a round trip of its own.
const WRITERS: usize = 2;
/// Most writes in one transaction.
const MAX_GROUP: usize = 32;

/// What a conditional write did: the write, or `None` when its task had
/// changed and nothing was written.
type Outcome = Result<Option<Applied>, StoreError>;

#[derive(Debug)]
struct Queued {
    before: Task,
    decision: Decision,
    done: oneshot::Sender<Outcome>,
}

/// The queue of conditional writes and its writers; the writers stop when
/// the last clone of the queue is dropped.
#[derive(Debug, Clone)]
pub(super) struct GroupCommit {
    queue: mpsc::UnboundedSender<Queued>,
}

impl GroupCommit {
    /// Starts the writers, which use `pool`.
    pub fn start(pool: PgPool) -> Self {
        let (queue, queued) = mpsc::unbounded_channel();
        let queued = Arc::new(Mutex::new(queued));
        for _ in 0..WRITERS {
            tokio::spawn(write_groups(pool.clone(), Arc::clone(&queued)));
        }
        GroupCommit { queue }
    }

    /// Writes `decision`, decided on `before`, if the task is still
    /// `before`; returns once committed.
    pub async fn write(&self, before: Task, decision: Decision) -> Outcome {
        let (done, answer) = oneshot::channel();
        self.queue
            .send(Queued {
                before,
                decision,
                done,
            })
            .map_err(|_| closed())?;
        answer.await.map_err(|_| closed())?
    }
}

fn closed() -> StoreError {
    StoreError::Unavailable(sqlx::Error::PoolClosed)
}

/// One writer: takes a group off the queue, writes it, answers its writes.
async fn write_groups(pool: PgPool, queued: Arc<Mutex<mpsc::UnboundedReceiver<Queued>>>) {
    while let Some(mut group) = next_group(&queued, MAX_GROUP).await {
        // Callers that went away need no write.
        group.retain(|q| !q.done.is_closed());
        if group.len() <= 1 {
            for q in group {
                let alone = PgStore::write_one(&pool, &q.before, &q.decision).await;
                let _ = q.done.send(alone);
            }
            continue;
        }
        group.sort_by_key(|q| q.before.id);
        count_group(GroupKind::Command, group.len());
        match write_group(&pool, &group).await {
            Ok(outcomes) => {
                for (q, outcome) in group.into_iter().zip(outcomes) {
                    let _ = q.done.send(Ok(outcome));
                }
            }
            Err(e) if !e.is_unavailable() => {
                // Find the fault's owner: each alone. Nothing of the group
                // was committed.
                count_fallback(GroupKind::Command);
                for q in group {
                    let alone = PgStore::write_one(&pool, &q.before, &q.decision).await;
                    let _ = q.done.send(alone);
                }
            }
            Err(e) => {
                let shared = share(&e);
                let mut group = group.into_iter();
                if let Some(q) = group.next() {
                    let _ = q.done.send(Err(e));
                }
                for q in group {
                    let _ = q.done.send(Err(shared()));
                }
            }
        }
    }
}

/// Writes the group (sorted by task id) in one transaction and commits it;
/// each write's outcome, in the group's order. The first write of each
/// task goes into one statement for all; a second write of a task follows
/// in its own statement, which sees the first one's change, as it would
/// have seen it committed.
async fn write_group(pool: &PgPool, group: &[Queued]) -> Result<Vec<Option<Applied>>, StoreError> {
    let (firsts, again): (Vec<usize>, Vec<usize>) =
        (0..group.len()).partition(|&i| i == 0 || group[i - 1].before.id != group[i].before.id);
    let together: Vec<(&Task, &Decision)> = firsts
        .iter()
        .map(|&i| (&group[i].before, &group[i].decision))
        .collect();
    if again.is_empty() {
        // One statement is its own transaction (autocommit): no BEGIN and
        // COMMIT round trips, each of which wakes PostgreSQL's backend.
        return PgStore::write_in_one_statement(pool, &together).await;
    }
    let mut tx = pool.begin().await?;
    let mut outcomes: Vec<Option<Applied>> = (0..group.len()).map(|_| None).collect();
    let written = PgStore::write_in_one_statement(&mut *tx, &together).await?;
    for (i, outcome) in firsts.into_iter().zip(written) {
        outcomes[i] = outcome;
    }
    for i in again {
        outcomes[i] = PgStore::write_one(&mut *tx, &group[i].before, &group[i].decision).await?;
    }
    tx.commit().await?;
    Ok(outcomes)
}
