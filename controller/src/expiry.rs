//! The expiry reconciler: applies every passed deadline (lifetime and active
//! time limit → `expired`; start timeout → back to `open`) within
//! milliseconds of it.
//!
//! It is deadline-driven rather than interval-driven. Each turn it reads the
//! earliest deadline of any non-terminal task (one probe of the partial
//! index on `next_deadline`), and either reconciles a batch of due tasks or
//! sleeps until that deadline. Writes to any task arrive as change
//! notifications (PostgreSQL `LISTEN`, or the in-process signal of SQLite)
//! and wake it early to re-read the deadline, so a task created with a
//! short lifetime while the controller sleeps towards a later one is still
//! expired on time. [`ControllerConfig::max_sleep`] bounds every sleep, in
//! case a notification was lost.
//!
//! Each change is the store's conditional write with its event in the same
//! transaction, under `FOR UPDATE SKIP LOCKED` (or SQLite's write lock). A
//! worker completing at the same instant either commits first (the
//! controller then finds nothing due) or waits for the row and finds the
//! task expired: one terminal event either way.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use futures::StreamExt;
use futures::stream::BoxStream;
use meatspace_domain::clock::{Clock, ClockWatch};
use meatspace_domain::{Due, ExpiryReason};
use meatspace_store::{Change, Store};
use tracing::Instrument;

use crate::backoff::Backoff;
use crate::{ControllerConfig, Error, Shutdown, metrics};

const NAME: &str = "expiry";

/// How long to wait before retrying when due tasks remain that this replica
/// could not lock. Another replica holds them; its commit normally wakes us
/// sooner through a change notification.
const CONTENDED_RETRY: TimeDelta = TimeDelta::milliseconds(250);

/// How long after a task change the earliest deadline is re-read; changes
/// arriving meanwhile share that one read.
const COALESCE: Duration = Duration::from_millis(20);

/// What the expiry loop does next, decided from what the store reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Something is due: reconcile a batch now.
    Sweep,
    /// Nothing this replica can do before then, unless a task changes.
    Sleep(DateTime<Utc>),
}

/// Decides the next step at `now`, given the earliest deadline in the store
/// and, if the previous sweep came back short of a full batch, when it ran.
///
/// A deadline that was already due at that short sweep belongs to a task
/// the sweep could not lock (another replica is writing it), so sweeping
/// again at once would spin; wait for that replica to commit instead.
pub(crate) fn plan(
    earliest: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
    short_sweep_at: Option<DateTime<Utc>>,
    max_sleep: TimeDelta,
) -> Step {
    let horizon = now + max_sleep;
    match earliest {
        Some(d) if d <= now => match short_sweep_at {
            Some(swept) if d <= swept => Step::Sleep(now + CONTENDED_RETRY),
            _ => Step::Sweep,
        },
        Some(d) => Step::Sleep(d.min(horizon)),
        None => Step::Sleep(horizon),
    }
}

/// The expiry reconciler of one controller replica.
#[derive(Debug)]
pub struct Expiry {
    store: Arc<dyn Store>,
    clock: Clock,
    batch_size: u32,
    max_sleep: TimeDelta,
}

/// Task changes anywhere, or `None` until subscribed.
pub(crate) type Changes = Option<BoxStream<'static, Change>>;

impl Expiry {
    pub(crate) fn new(store: Arc<dyn Store>, config: &ControllerConfig) -> Self {
        Expiry {
            store,
            clock: config.clock.clone(),
            batch_size: config.batch_size.max(1),
            max_sleep: TimeDelta::from_std(config.max_sleep).unwrap_or(TimeDelta::seconds(10)),
        }
    }

    pub(crate) async fn run(self, mut shutdown: Shutdown) {
        let mut changes: Changes = None;
        let mut moved = self.clock.watch();
        let mut short_sweep_at = None;
        let mut backoff = Backoff::default();
        while !shutdown.is_requested() {
            if changes.is_none() {
                // Subscribe before reading the deadline, so that a task
                // created between the read and the sleep still wakes us.
                match self.store.changes().await {
                    Ok(stream) => changes = Some(stream),
                    Err(e) => self.failed(&e.into(), "subscribing to task changes"),
                }
            }
            let now = self.clock.now();
            let earliest = match self.store.next_deadline().await {
                Ok(earliest) => earliest,
                Err(e) => {
                    self.failed(&e.into(), "reading the earliest deadline");
                    backoff.wait(&mut shutdown).await;
                    continue;
                }
            };
            match plan(earliest, now, short_sweep_at, self.max_sleep) {
                Step::Sweep => match self.sweep(now).await {
                    Ok(n) => {
                        backoff.reset();
                        short_sweep_at = (n < self.batch_size as usize).then_some(now);
                    }
                    Err(e) => {
                        self.failed(&e, "reconciling due tasks");
                        backoff.wait(&mut shutdown).await;
                    }
                },
                Step::Sleep(until) => {
                    // Waiting for another writer to release due rows: its
                    // commit is the change to react to, at once.
                    let coalesce = if short_sweep_at.is_some() {
                        Duration::ZERO
                    } else {
                        COALESCE
                    };
                    backoff.reset();
                    short_sweep_at = None;
                    let wake = instant_at(until, self.clock.now());
                    wait(wake, coalesce, &mut changes, &mut moved, &mut shutdown).await;
                }
            }
        }
    }

    /// Reconciles one batch of tasks due at `now`; returns how many changed.
    async fn sweep(&self, now: DateTime<Utc>) -> Result<usize, Error> {
        let span = tracing::info_span!(
            "reconcile",
            reconciler = NAME,
            expired = tracing::field::Empty,
            unassigned = tracing::field::Empty
        );
        async {
            let started = std::time::Instant::now();
            let applied = self.store.reconcile_due(now, self.batch_size).await?;
            // The lag a client sees ends when the change became visible,
            // i.e. now, after the commit.
            let committed = Utc::now();
            metrics::reconciled(NAME, started.elapsed());
            let (mut expired, mut unassigned) = (0u32, 0u32);
            for a in &applied {
                match a.reconciled {
                    Some(Due::Expire(reason)) => {
                        expired += 1;
                        let deadline = match reason {
                            ExpiryReason::Lifetime => a.task.expires_at,
                            ExpiryReason::ActiveTimeLimit => {
                                a.task.active_until.unwrap_or(a.task.expires_at)
                            }
                        };
                        let lag = (committed - deadline).to_std().unwrap_or_default();
                        metrics::expired(reason, lag);
                        tracing::debug!(task_id = %a.task.id, reason = reason.as_str(),
                            lag_ms = lag.as_millis() as u64, "expired");
                    }
                    Some(Due::AutoAccept) => {
                        metrics::auto_accepted();
                        tracing::debug!(task_id = %a.task.id, "accepted: the agent did not review in time");
                    }
                    Some(Due::Unassign) => {
                        unassigned += 1;
                        metrics::unassigned();
                        tracing::debug!(task_id = %a.task.id, "reopened: the worker did not start in time");
                    }
                    None => {}
                }
            }
            let span = tracing::Span::current();
            span.record("expired", expired);
            span.record("unassigned", unassigned);
            tracing::debug!("swept");
            Ok(applied.len())
        }
        .instrument(span)
        .await
    }

    fn failed(&self, error: &Error, doing: &str) {
        metrics::failed(NAME, error.metric_label());
        tracing::warn!(error = %error, "{doing} failed; retrying");
    }
}

/// Sleeps until `until`, or shutdown, or `coalesce` after a task changes.
///
/// Normally a change wakes the loop [`COALESCE`] later rather than at once,
/// so that a burst of writes costs one re-read of the earliest deadline
/// instead of one per write. That delay cannot make an expiry late: every
/// deadline a write creates lies at least a second ahead (the shortest
/// lifetime, start timeout or active time limit).
pub(crate) async fn wait(
    mut wake: tokio::time::Instant,
    coalesce: Duration,
    changes: &mut Changes,
    moved: &mut ClockWatch,
    shutdown: &mut Shutdown,
) {
    let mut changed = false;
    loop {
        let change = async {
            match changes.as_mut() {
                Some(stream) => stream.next().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            () = shutdown.requested() => return,
            () = tokio::time::sleep_until(wake) => return,
            // The clock was moved (in a test): deadlines may have passed.
            () = moved.moved() => return,
            // A task change may bring an earlier deadline; a gap (lost
            // notifications) may hide one: either way, re-read it.
            change = change => match change {
                Some(Change::Task(_) | Change::Gap) if !changed => {
                    changed = true;
                    wake = wake.min(tokio::time::Instant::now() + coalesce);
                }
                Some(_) => {}
                None => {
                    // Resubscribe on the next turn, not now: a stream that
                    // keeps ending must not turn this into a busy loop.
                    tracing::warn!("task change stream ended; relying on the timer until resubscribed");
                    *changes = None;
                }
            },
        }
    }
}

/// The Tokio instant at which a clock reading `now` now reads `t` (now if
/// past).
fn instant_at(t: DateTime<Utc>, now: DateTime<Utc>) -> tokio::time::Instant {
    let wait = (t - now).to_std().unwrap_or(Duration::ZERO);
    tokio::time::Instant::now() + wait
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(1_800_000_000_000 + ms).unwrap()
    }

    const MAX: TimeDelta = TimeDelta::seconds(10);

    #[test]
    fn sleeps_until_the_earliest_deadline() {
        assert_eq!(
            plan(Some(at(1500)), at(0), None, MAX),
            Step::Sleep(at(1500))
        );
    }

    #[test]
    fn never_sleeps_longer_than_the_safety_net() {
        assert_eq!(
            plan(Some(at(3_600_000)), at(0), None, MAX),
            Step::Sleep(at(10_000))
        );
        assert_eq!(plan(None, at(0), None, MAX), Step::Sleep(at(10_000)));
    }

    #[test]
    fn sweeps_as_soon_as_a_deadline_is_reached() {
        assert_eq!(plan(Some(at(1000)), at(1000), None, MAX), Step::Sweep);
        assert_eq!(plan(Some(at(999)), at(1000), None, MAX), Step::Sweep);
    }

    #[test]
    fn keeps_sweeping_while_full_batches_come_back() {
        // A full batch leaves no short-sweep mark: the next turn sweeps again.
        assert_eq!(plan(Some(at(0)), at(5), None, MAX), Step::Sweep);
    }

    #[test]
    fn does_not_spin_on_tasks_another_replica_holds() {
        // The short sweep at 1000 could not take the task due at 900.
        assert_eq!(
            plan(Some(at(900)), at(1010), Some(at(1000)), MAX),
            Step::Sleep(at(1010) + CONTENDED_RETRY)
        );
    }

    #[test]
    fn sweeps_again_for_deadlines_reached_after_a_short_sweep() {
        assert_eq!(
            plan(Some(at(1005)), at(1010), Some(at(1000)), MAX),
            Step::Sweep
        );
    }
}
