//! The retention reconciler: deletes terminal tasks, with their events,
//! issues and photos, once they have been terminal for the retention period
//! (30 days by default). After that the API answers 404 for them, until
//! their tombstones are forgotten too (another 30 days by default). It also
//! deletes Idempotency-Key records whose replay window has ended, and the
//! web app's expired sessions and used or expired invites.
//!
//! Unlike expiry it polls, every [`ControllerConfig::retention_interval`]:
//! nobody waits on a deletion to the second, and a poll that finds nothing
//! old enough is one probe of the partial index on `ended_at`, so the cost
//! follows what is due, not the size of the table. Each pass deletes in
//! batches (each its own transaction, locked with `SKIP LOCKED` on
//! PostgreSQL) until a batch comes back short, so replicas share a backlog
//! and a kill between batches leaves only whole tasks deleted.

use std::sync::Arc;
use std::time::Duration;

use chrono::TimeDelta;
use meatspace_domain::clock::Clock;
use meatspace_store::Store;
use tracing::Instrument;

use crate::backoff::Backoff;
use crate::{ControllerConfig, Error, Shutdown, metrics};

const NAME: &str = "retention";

/// The retention reconciler of one controller replica.
#[derive(Debug)]
pub struct Retention {
    store: Arc<dyn Store>,
    clock: Clock,
    retention: TimeDelta,
    tombstone_retention: TimeDelta,
    interval: Duration,
    batch_size: u32,
}

impl Retention {
    pub(crate) fn new(store: Arc<dyn Store>, config: &ControllerConfig) -> Self {
        Retention {
            store,
            clock: config.clock.clone(),
            retention: config.retention,
            tombstone_retention: config.tombstone_retention,
            interval: config.retention_interval,
            batch_size: config.batch_size.max(1),
        }
    }

    pub(crate) async fn run(self, mut shutdown: Shutdown) {
        let mut backoff = Backoff::default();
        while !shutdown.is_requested() {
            match self.sweep().await {
                Ok(full) if full => continue,
                Ok(_) => {
                    backoff.reset();
                    tokio::select! {
                        () = shutdown.requested() => {}
                        () = tokio::time::sleep(self.interval) => {}
                    }
                }
                Err(e) => {
                    metrics::failed(NAME, e.metric_label());
                    tracing::warn!(error = %e, "deleting old terminal tasks failed; retrying");
                    backoff.wait(&mut shutdown).await;
                }
            }
        }
    }

    /// Deletes one batch; true if it was full (more may be waiting).
    async fn sweep(&self) -> Result<bool, Error> {
        let now = self.clock.now();
        let cutoff = now - self.retention;
        let span = tracing::info_span!(
            "reconcile",
            reconciler = NAME,
            %cutoff,
            purged = tracing::field::Empty
        );
        async {
            let started = std::time::Instant::now();
            let purged = self
                .store
                .purge_ended_before(cutoff, now, self.batch_size)
                .await?;
            let forgotten = self
                .store
                .forget_purged_before(now - self.tombstone_retention, self.batch_size)
                .await?;
            // Idempotency-Key answers (sealed, but holding credentials)
            // go when their replay window ends.
            let keys = self
                .store
                .purge_idempotency_keys(self.clock.now(), self.batch_size)
                .await?;
            // Expired sessions and used or expired invites: each sign-in
            // adds a row, which nothing else ever deletes.
            let sign_ins = self
                .store
                .purge_sign_ins(self.clock.now(), self.batch_size)
                .await?;
            // Console sessions past their absolute end, likewise.
            let consoles = self
                .store
                .purge_console_sessions(self.clock.now(), self.batch_size)
                .await?;
            metrics::reconciled(NAME, started.elapsed());
            metrics::purged(purged);
            tracing::Span::current().record("purged", purged);
            if purged > 0 {
                tracing::info!(purged, "deleted terminal tasks past retention");
            }
            Ok(purged.max(forgotten).max(keys).max(sign_ins).max(consoles)
                >= u64::from(self.batch_size))
        }
        .instrument(span)
        .await
    }
}
