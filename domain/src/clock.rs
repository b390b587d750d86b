//! Wall-clock access in one place.
//!
//! Timestamps are truncated to milliseconds so that both backends (PostgreSQL
//! keeps microseconds, our SQLite schema keeps milliseconds) round-trip the
//! same value.

use chrono::{DateTime, DurationRound, TimeDelta, Utc};

/// Current time, truncated to whole milliseconds.
pub fn now() -> DateTime<Utc> {
    truncate(Utc::now())
}

/// Truncates a timestamp to whole milliseconds.
pub fn truncate(t: DateTime<Utc>) -> DateTime<Utc> {
    t.duration_trunc(TimeDelta::milliseconds(1)).unwrap_or(t)
}
