//! Failing fast while the database is down.
//!
//! Without this, every request during an outage waits for the pool's
//! acquire timeout (sqlx keeps retrying a refused connection until then)
//! before it answers 503, and readiness takes as long to say so. Instead
//! one [`Availability`] per process knows whether the database answers:
//!
//! - a monitor pings it every [`PROBE_INTERVAL`] (on the store's own probe
//!   connection, so a busy pool does not look like an outage) and marks it
//!   down after one failed or slow ping, up after one good one;
//! - while it is down, API requests answer 503 + `Retry-After` without
//!   touching the database, and `/readyz` says 503 from the same state.
//!
//! Only the monitor decides: a request that meets a busy SQLite file (another
//! process holding the write lock) gets its own 503, but reads still work,
//! so one such answer must not turn every request away.
//!
//! So an outage turns into 503s within about one probe interval plus the
//! probe timeout (under a second), and recovery is seen within one probe
//! interval. A 503 never acknowledges anything: a write that was cut short
//! may or may not have committed, exactly as with a lost connection, and
//! the client retries it (with an `Idempotency-Key` where it matters).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use meatspace_store::Store;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::AppState;
use crate::http::error::ApiError;

/// Time between two pings of the database.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(250);
/// A ping slower than this counts as a failure.
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(700);

/// Whether the database answers, shared by every request. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Availability {
    up: Arc<AtomicBool>,
}

impl Availability {
    /// Starts the monitor of `store`; it runs until every clone of the
    /// returned value is dropped. The database counts as up until a probe
    /// or a request says otherwise.
    pub fn start(store: Arc<dyn Store>) -> Availability {
        let availability = Availability::assume_up();
        tokio::spawn(monitor(store, Arc::downgrade(&availability.up)));
        availability
    }

    /// An availability without a monitor, for tests of the logic.
    pub fn assume_up() -> Availability {
        Availability {
            up: Arc::new(AtomicBool::new(true)),
        }
    }

    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// Records what a probe found.
    pub fn set(&self, up: bool) {
        if self.up.swap(up, Ordering::Relaxed) == up {
            return;
        }
        if up {
            tracing::info!("the database answers again");
        } else {
            tracing::warn!("the database is unavailable: answering 503 until it is back");
        }
        metrics::gauge!("meatspace_database_up").set(if up { 1.0 } else { 0.0 });
    }
}

async fn monitor(store: Arc<dyn Store>, up: std::sync::Weak<AtomicBool>) {
    let mut ticks = tokio::time::interval(PROBE_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let ok = matches!(
            tokio::time::timeout(PROBE_TIMEOUT, store.ping()).await,
            Ok(Ok(()))
        );
        let Some(up) = up.upgrade() else { return };
        Availability { up }.set(ok);
    }
}

/// Middleware of the API routes: answers 503 at once while the database is
/// down. A request already running when it goes down is not cut short: a
/// long poll holds no connection while it waits and may well outlive a
/// short outage, and one blocked on the database fails within the pool's
/// acquire timeout (a second by default).
pub async fn guard(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if !state.availability.is_up() {
        return ApiError::Unavailable.into_response();
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_report_wins() {
        let a = Availability::assume_up();
        let seen_by_requests = a.clone();
        assert!(seen_by_requests.is_up());
        a.set(false);
        assert!(!seen_by_requests.is_up());
        a.set(false);
        a.set(true);
        assert!(seen_by_requests.is_up());
    }
}
