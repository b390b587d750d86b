//! Time limits that shape a task's life, shared by the API server (which
//! stamps deadlines on transitions) and the controller (which acts on them).
//! Both binaries flatten [`PolicyArgs`] so they read the same flags and
//! environment variables.

use chrono::TimeDelta;

/// Deadlines and bounds, in seconds where they come from configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Lifetime of a task created without `expires_in_seconds`.
    pub default_lifetime: TimeDelta,
    /// Smallest `expires_in_seconds` a client may ask for.
    pub min_lifetime: TimeDelta,
    /// Largest `expires_in_seconds` a client may ask for.
    pub max_lifetime: TimeDelta,
    /// How long an assigned worker has to start before the task reopens.
    pub start_timeout: TimeDelta,
    /// How long a task may stay active before it expires.
    pub active_time_limit: TimeDelta,
}

impl Default for Policy {
    fn default() -> Self {
        PolicyArgs::default().into()
    }
}

/// Command-line and environment form of [`Policy`].
#[derive(Debug, Clone, clap::Args)]
pub struct PolicyArgs {
    /// Lifetime in seconds of a task created without `expires_in_seconds`.
    #[arg(long, env = "MEATSPACE_DEFAULT_LIFETIME_SECONDS", default_value_t = 7 * 24 * 3600)]
    pub default_lifetime_seconds: u32,
    /// Smallest `expires_in_seconds` accepted on task creation.
    #[arg(long, env = "MEATSPACE_MIN_LIFETIME_SECONDS", default_value_t = 1)]
    pub min_lifetime_seconds: u32,
    /// Largest `expires_in_seconds` accepted on task creation.
    #[arg(long, env = "MEATSPACE_MAX_LIFETIME_SECONDS", default_value_t = 30 * 24 * 3600)]
    pub max_lifetime_seconds: u32,
    /// Seconds an assigned worker has to start before the task reopens.
    #[arg(long, env = "MEATSPACE_START_TIMEOUT_SECONDS", default_value_t = 3600)]
    pub start_timeout_seconds: u32,
    /// Seconds a task may stay active before it expires.
    #[arg(long, env = "MEATSPACE_ACTIVE_TIME_LIMIT_SECONDS", default_value_t = 24 * 3600)]
    pub active_time_limit_seconds: u32,
}

impl Default for PolicyArgs {
    fn default() -> Self {
        Self {
            default_lifetime_seconds: 7 * 24 * 3600,
            min_lifetime_seconds: 1,
            max_lifetime_seconds: 30 * 24 * 3600,
            start_timeout_seconds: 3600,
            active_time_limit_seconds: 24 * 3600,
        }
    }
}

impl From<PolicyArgs> for Policy {
    fn from(a: PolicyArgs) -> Self {
        let s = |n: u32| TimeDelta::seconds(i64::from(n));
        Policy {
            default_lifetime: s(a.default_lifetime_seconds),
            min_lifetime: s(a.min_lifetime_seconds),
            max_lifetime: s(a.max_lifetime_seconds),
            start_timeout: s(a.start_timeout_seconds),
            active_time_limit: s(a.active_time_limit_seconds),
        }
    }
}
