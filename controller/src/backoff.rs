//! The one backoff of every reconciler's retry loop: after an error a
//! reconciler waits, twice as long after each further error, and starts
//! again from the shortest wait once a round succeeds.

use std::time::Duration;

use crate::Shutdown;

/// Exponential backoff between retries after an error: 100 ms doubling to 5 s.
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    failures: u32,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(5);

    pub(crate) fn reset(&mut self) {
        self.failures = 0;
    }

    pub(crate) fn next_delay(&mut self) -> Duration {
        let delay = Self::FIRST
            .saturating_mul(1 << self.failures.min(16))
            .min(Self::MAX);
        self.failures = self.failures.saturating_add(1);
        delay
    }

    pub(crate) async fn wait(&mut self, shutdown: &mut Shutdown) {
        let delay = self.next_delay();
        tokio::select! {
            () = shutdown.requested() => {}
            () = tokio::time::sleep(delay) => {}
        }
    }
}

/// The delay before delivery attempt number `attempts` (1 for the first
/// retry) of a webhook or a notification: `base` doubled per attempt up to
/// `max`, with equal jitter (half the delay fixed, half random), so the
/// retries of many deliveries do not arrive in step.
pub(crate) fn retry_delay(base: Duration, max: Duration, attempts: u32) -> chrono::TimeDelta {
    use rand::Rng;
    let exp = attempts.clamp(1, 30) - 1;
    let delay = base.saturating_mul(2u32.saturating_pow(exp)).min(max);
    let half = delay / 2;
    let jitter = rand::thread_rng().gen_range(0..=half.as_millis().max(1) as u64);
    chrono::TimeDelta::from_std(half + Duration::from_millis(jitter))
        .unwrap_or(chrono::TimeDelta::seconds(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_a_ceiling_and_resets() {
        let mut b = Backoff::default();
        let delays: Vec<_> = (0..8).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(delays, vec![100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(100));
    }
}
