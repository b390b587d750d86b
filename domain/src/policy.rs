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
    /// Most events one task's feed may hold: past it, commands that only
    /// add to the feed ([`Command::is_limited`](crate::Command::is_limited))
    /// are refused, whichever surface sends them.
    pub max_task_events: u64,
}

/// A policy whose values contradict each other.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("{0} must be at least one second")]
    NotPositive(&'static str),
    #[error(
        "the minimum lifetime ({min}s) is above the maximum lifetime ({max}s): no task could be created"
    )]
    MinAboveMax { min: i64, max: i64 },
    #[error(
        "the default lifetime ({default}s) is outside the accepted lifetimes ({min}s to {max}s)"
    )]
    DefaultOutOfBounds { default: i64, min: i64, max: i64 },
}

impl Policy {
    /// The lifetime of a new task: `requested` seconds, or the default
    /// without a request. A request outside the bounds is refused with
    /// them, `Err((min, max))` in seconds, for the caller's message.
    pub fn lifetime(&self, requested: Option<i64>) -> Result<TimeDelta, (i64, i64)> {
        let Some(seconds) = requested else {
            return Ok(self.default_lifetime);
        };
        let (min, max) = (
            self.min_lifetime.num_seconds(),
            self.max_lifetime.num_seconds(),
        );
        if (min..=max).contains(&seconds) {
            Ok(TimeDelta::seconds(seconds))
        } else {
            Err((min, max))
        }
    }

    /// Checks that the values make sense together; both binaries refuse to
    /// start with a policy that does not.
    pub fn check(&self) -> Result<(), PolicyError> {
        let fields = [
            ("the default lifetime", self.default_lifetime),
            ("the minimum lifetime", self.min_lifetime),
            ("the maximum lifetime", self.max_lifetime),
            ("the start timeout", self.start_timeout),
            ("the active time limit", self.active_time_limit),
        ];
        for (name, value) in fields {
            if value < TimeDelta::seconds(1) {
                return Err(PolicyError::NotPositive(name));
            }
        }
        let (min, max) = (self.min_lifetime, self.max_lifetime);
        if min > max {
            return Err(PolicyError::MinAboveMax {
                min: min.num_seconds(),
                max: max.num_seconds(),
            });
        }
        if !(min..=max).contains(&self.default_lifetime) {
            return Err(PolicyError::DefaultOutOfBounds {
                default: self.default_lifetime.num_seconds(),
                min: min.num_seconds(),
                max: max.num_seconds(),
            });
        }
        Ok(())
    }
}

impl Default for Policy {
    fn default() -> Self {
        PolicyArgs::default().into()
    }
}

/// Command-line and environment form of [`Policy`].
#[derive(Debug, Clone)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct PolicyArgs {
    /// Lifetime in seconds of a task created without `expires_in_seconds`.
    #[cfg_attr(feature = "clap", arg(long, env = "MEATSPACE_DEFAULT_LIFETIME_SECONDS", default_value_t = 7 * 24 * 3600,
          value_parser = clap::value_parser!(u32).range(1..)))]
    pub default_lifetime_seconds: u32,
    /// Smallest `expires_in_seconds` accepted on task creation.
    #[cfg_attr(feature = "clap", arg(long, env = "MEATSPACE_MIN_LIFETIME_SECONDS", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..)))]
    pub min_lifetime_seconds: u32,
    /// Largest `expires_in_seconds` accepted on task creation.
    #[cfg_attr(feature = "clap", arg(long, env = "MEATSPACE_MAX_LIFETIME_SECONDS", default_value_t = 30 * 24 * 3600,
          value_parser = clap::value_parser!(u32).range(1..)))]
    pub max_lifetime_seconds: u32,
    /// Seconds an assigned worker has to start before the task reopens.
    #[cfg_attr(feature = "clap", arg(long, env = "MEATSPACE_START_TIMEOUT_SECONDS", default_value_t = 3600,
          value_parser = clap::value_parser!(u32).range(1..)))]
    pub start_timeout_seconds: u32,
    /// Seconds a task may stay active before it expires.
    #[cfg_attr(feature = "clap", arg(long, env = "MEATSPACE_ACTIVE_TIME_LIMIT_SECONDS", default_value_t = 24 * 3600,
          value_parser = clap::value_parser!(u32).range(1..)))]
    pub active_time_limit_seconds: u32,
    /// Most events one task's feed may hold. Past it, messages, photos,
    /// issues, answers and extensions are refused with 409
    /// (`task-event-limit`), from every surface (API, web app, MCP, photo
    /// uploads, requested tasks); the task can still be completed, stopped
    /// or cancelled.
    #[cfg_attr(feature = "clap", arg(long, env = "MEATSPACE_MAX_EVENTS_PER_TASK", default_value_t = 2_000,
          value_parser = clap::value_parser!(u64).range(10..=1_000_000)))]
    pub max_events_per_task: u64,
}

impl Default for PolicyArgs {
    fn default() -> Self {
        Self {
            default_lifetime_seconds: 7 * 24 * 3600,
            min_lifetime_seconds: 1,
            max_lifetime_seconds: 30 * 24 * 3600,
            start_timeout_seconds: 3600,
            active_time_limit_seconds: 24 * 3600,
            max_events_per_task: 2_000,
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
            max_task_events: a.max_events_per_task,
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_requested_lifetime_is_kept_within_the_bounds() {
        let policy = Policy::default();
        assert_eq!(policy.lifetime(None), Ok(policy.default_lifetime));
        assert_eq!(policy.lifetime(Some(60)), Ok(TimeDelta::seconds(60)));
        let bounds = (
            policy.min_lifetime.num_seconds(),
            policy.max_lifetime.num_seconds(),
        );
        assert_eq!(policy.lifetime(Some(bounds.1 + 1)), Err(bounds));
        assert_eq!(policy.lifetime(Some(0)), Err(bounds));
    }

    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        policy: PolicyArgs,
    }

    fn parse(args: &[&str]) -> Result<Policy, String> {
        let cli = Cli::try_parse_from([&["test"], args].concat()).map_err(|e| e.to_string())?;
        let policy = Policy::from(cli.policy);
        policy.check().map_err(|e| e.to_string())?;
        Ok(policy)
    }

    #[test]
    fn the_defaults_are_consistent() {
        assert_eq!(Policy::default().check(), Ok(()));
        assert_eq!(parse(&[]), Ok(Policy::default()));
    }

    #[test]
    fn zero_durations_are_refused_at_parse_time() {
        for flag in [
            "--default-lifetime-seconds",
            "--min-lifetime-seconds",
            "--max-lifetime-seconds",
            "--start-timeout-seconds",
            "--active-time-limit-seconds",
        ] {
            let err = parse(&[flag, "0"]).unwrap_err();
            assert!(err.contains("0 is not in 1.."), "{flag}: {err}");
        }
    }

    #[test]
    fn contradictions_are_refused() {
        let err = parse(&[
            "--min-lifetime-seconds",
            "100",
            "--max-lifetime-seconds",
            "10",
        ]);
        assert!(
            err.unwrap_err()
                .contains("minimum lifetime (100s) is above")
        );
        let err = parse(&[
            "--default-lifetime-seconds",
            "5",
            "--min-lifetime-seconds",
            "10",
        ]);
        assert!(
            err.unwrap_err()
                .contains("default lifetime (5s) is outside")
        );
        let zero = Policy {
            start_timeout: TimeDelta::zero(),
            ..Policy::default()
        };
        assert_eq!(
            zero.check(),
            Err(PolicyError::NotPositive("the start timeout"))
        );
    }
}
