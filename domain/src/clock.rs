//! Wall-clock access in one place.
//!
//! Timestamps are truncated to milliseconds so that both backends (PostgreSQL
//! keeps microseconds, our SQLite schema keeps milliseconds) round-trip the
//! same value.
//!
//! The server and the controller read the time from the [`Clock`] they are
//! given: the system's in production; in tests one that the test moves
//! forward ([`Clock::adjustable`], [`Clock::advance`]) to pass a deadline
//! at once instead of waiting for it.

use std::sync::Arc;

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use tokio::sync::watch;

/// Current time, truncated to whole milliseconds.
pub fn now() -> DateTime<Utc> {
    truncate(Utc::now())
}

/// Truncates a timestamp to whole milliseconds.
pub fn truncate(t: DateTime<Utc>) -> DateTime<Utc> {
    t.duration_trunc(TimeDelta::milliseconds(1)).unwrap_or(t)
}

/// Where the server and the controller read the time. Cheap to clone: the
/// clones of an adjustable clock move together.
#[derive(Debug, Clone, Default)]
pub struct Clock {
    /// How far this clock runs ahead of the system's; `None` for the
    /// system's own.
    ahead: Option<Arc<watch::Sender<TimeDelta>>>,
}

impl Clock {
    /// The system's clock.
    pub fn system() -> Clock {
        Clock { ahead: None }
    }

    /// A clock that runs with the system's, and jumps ahead by what
    /// [`Clock::advance`] adds: for tests.
    pub fn adjustable() -> Clock {
        Clock {
            ahead: Some(Arc::new(watch::Sender::new(TimeDelta::zero()))),
        }
    }

    /// The current time, truncated to whole milliseconds.
    pub fn now(&self) -> DateTime<Utc> {
        match &self.ahead {
            None => now(),
            Some(ahead) => truncate(Utc::now() + *ahead.borrow()),
        }
    }

    /// Moves the clock `by` ahead, and wakes every [`ClockWatch`].
    ///
    /// # Panics
    ///
    /// On the system's clock, which only time moves.
    pub fn advance(&self, by: TimeDelta) {
        let ahead = self
            .ahead
            .as_ref()
            .expect("only an adjustable clock can be moved");
        ahead.send_modify(|a| *a += by);
    }

    /// A watch that wakes when this clock is moved.
    pub fn watch(&self) -> ClockWatch {
        ClockWatch(self.ahead.as_ref().map(|a| a.subscribe()))
    }
}

/// Two clocks are equal when they read the same time: both the system's,
/// or clones of one adjustable clock.
impl PartialEq for Clock {
    fn eq(&self, other: &Clock) -> bool {
        match (&self.ahead, &other.ahead) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Eq for Clock {}

/// Wakes a waiter when its [`Clock`] is moved ahead (never, for the
/// system's clock). A move since the previous wake-up is not missed.
#[derive(Debug)]
pub struct ClockWatch(Option<watch::Receiver<TimeDelta>>);

impl ClockWatch {
    /// Resolves when the clock was moved since this watch last woke.
    pub async fn moved(&mut self) {
        if let Some(rx) = &mut self.0
            && rx.changed().await.is_ok()
        {
            return;
        }
        // The system's clock, or every clone of the clock is gone.
        std::future::pending().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_adjustable_clock_jumps_ahead_and_its_clones_with_it() {
        let clock = Clock::adjustable();
        let clone = clock.clone();
        let before = clock.now();
        clock.advance(TimeDelta::hours(1));
        let after = clone.now();
        assert!(after - before >= TimeDelta::hours(1), "{before} → {after}");
        assert!(after - before < TimeDelta::hours(1) + TimeDelta::minutes(1));
        assert_eq!(after, truncate(after), "whole milliseconds");
    }

    #[tokio::test]
    async fn a_watch_wakes_on_a_move_made_before_it_waits() {
        let clock = Clock::adjustable();
        let mut watch = clock.watch();
        clock.advance(TimeDelta::seconds(1));
        tokio::time::timeout(std::time::Duration::from_secs(10), watch.moved())
            .await
            .expect("the move wakes the watch");
    }
}
