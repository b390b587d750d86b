//! Keeps every reconciler running: a reconciler that panics (or returns
//! before shutdown, which none should) is logged, counted in
//! `meatspace_reconciler_restarts_total` and started again after a capped
//! exponential backoff, so that one bad task or bug cannot silently stop
//! tasks from expiring while the API keeps serving.
//!
//! Each run of a reconciler is its own Tokio task, so a panic unwinds only
//! that task; the supervisor sees it as a failed `JoinHandle`. A run that
//! lasted longer than the longest backoff counts as healthy, and the
//! backoff starts again from its first step.

use std::future::Future;
use std::time::Duration;

use crate::{Shutdown, metrics};

/// First pause before a restart, doubling up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// Runs the reconciler that `start` builds until shutdown, restarting it
/// whenever it ends before shutdown. Returns once shutdown is requested and
/// the current run has finished.
pub(crate) async fn supervise<F, Fut>(name: &'static str, mut start: F, mut shutdown: Shutdown)
where
    F: FnMut(Shutdown) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut failures = 0u32;
    loop {
        let started = tokio::time::Instant::now();
        let mut run = Run(tokio::spawn(start(shutdown.clone())));
        let ended = run.await_end().await;
        if shutdown.is_requested() {
            if let Err(e) = ended {
                tracing::error!(reconciler = name, error = %e, "reconciler failed while shutting down");
            }
            return;
        }
        match ended {
            Ok(()) => tracing::error!(
                reconciler = name,
                "reconciler returned by itself; restarting it"
            ),
            Err(e) => {
                tracing::error!(reconciler = name, error = %e, "reconciler panicked; restarting it")
            }
        }
        metrics::restarted(name);
        if started.elapsed() > MAX_BACKOFF {
            failures = 0;
        }
        let delay = FIRST_BACKOFF
            .saturating_mul(1 << failures.min(16))
            .min(MAX_BACKOFF);
        failures = failures.saturating_add(1);
        tokio::select! {
            () = shutdown.requested() => return,
            () = tokio::time::sleep(delay) => {}
        }
    }
}

/// One run of a reconciler; aborted if the supervisor itself is dropped.
struct Run(tokio::task::JoinHandle<()>);

impl Run {
    async fn await_end(&mut self) -> Result<(), tokio::task::JoinError> {
        (&mut self.0).await
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use tokio::sync::watch;

    use super::*;

    /// A reconciler that panics on its first `panics` runs, then works
    /// (counts its turns) until shutdown.
    fn flaky(
        panics: u32,
        runs: Arc<AtomicU32>,
        turns: Arc<AtomicU32>,
    ) -> impl FnMut(Shutdown) -> futures::future::BoxFuture<'static, ()> {
        move |mut shutdown| {
            let runs = runs.clone();
            let turns = turns.clone();
            Box::pin(async move {
                let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
                assert!(run > panics, "reconciler bug on run {run}");
                while !shutdown.is_requested() {
                    turns.fetch_add(1, Ordering::SeqCst);
                    tokio::select! {
                        () = shutdown.requested() => {}
                        () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_reconciler_is_restarted_with_growing_backoff() {
        let (stop, stopped) = watch::channel(false);
        let (runs, turns) = (Arc::default(), Arc::default());
        let supervisor = tokio::spawn(supervise(
            "test",
            flaky(3, Arc::clone(&runs), Arc::clone(&turns)),
            Shutdown(stopped),
        ));
        // Three panics: restarts after 0.5 s, 1 s and 2 s of backoff.
        let t0 = tokio::time::Instant::now();
        while runs.load(Ordering::SeqCst) < 4 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let restarted_after = t0.elapsed();
        assert!(
            restarted_after >= Duration::from_millis(3500)
                && restarted_after < Duration::from_millis(3600),
            "fourth run after {restarted_after:?}"
        );
        // The fourth run works and keeps working.
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 4);
        assert!(turns.load(Ordering::SeqCst) >= 30);
        stop.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(1), supervisor)
            .await
            .expect("the supervisor stops with the reconciler")
            .expect("no panic escapes the supervisor");
    }

    #[tokio::test(start_paused = true)]
    async fn the_backoff_is_capped_and_shutdown_ends_the_wait() {
        let (stop, stopped) = watch::channel(false);
        let runs = Arc::new(AtomicU32::new(0));
        let supervisor = tokio::spawn(supervise(
            "test",
            flaky(u32::MAX, Arc::clone(&runs), Arc::default()),
            Shutdown(stopped),
        ));
        // 0.5+1+2+4+8+16+32+60+60 s of backoff: ten runs within 184 s.
        tokio::time::sleep(Duration::from_secs(184)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 10);
        // Shutdown during a backoff returns at once.
        stop.send(true).unwrap();
        tokio::time::timeout(Duration::from_millis(10), supervisor)
            .await
            .expect("shutdown ends the backoff")
            .unwrap();
    }
}
