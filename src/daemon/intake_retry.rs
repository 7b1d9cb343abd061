//! Back-off and a rate limit for inbox scans that fail for a reason of the queue itself (an
//! unreadable inbox, a full disk): such a failure repeats at every scan, and the daemon's own
//! renames in the inbox wake the watcher, so without these it would retry in a tight loop and
//! write an error line each time.

use std::io;
use std::time::{Duration, Instant};

/// The first pause after a failed scan; it doubles with each failure in a row.
const FIRST_PAUSE: Duration = Duration::from_millis(250);
/// The longest pause between two scans while they keep failing.
const LONGEST_PAUSE: Duration = Duration::from_secs(10);
/// At most one error line in this time; the ones held back are counted in the next.
const LOG_INTERVAL: Duration = Duration::from_secs(60);

#[derive(Debug, Default)]
pub(super) struct IntakeRetry {
    failures: u32,
    not_before: Option<Instant>,
    last_logged: Option<Instant>,
    held_back: u32,
}

impl IntakeRetry {
    /// A scan failed: pause the next one, and log unless a line was written lately.
    pub(super) fn failed(&mut self, error: &io::Error) {
        self.failures = self.failures.saturating_add(1);
        let doublings = self.failures.saturating_sub(1).min(16);
        let pause = FIRST_PAUSE
            .saturating_mul(1 << doublings)
            .min(LONGEST_PAUSE);
        let now = Instant::now();
        self.not_before = Some(now + pause);
        if self
            .last_logged
            .is_some_and(|at| now.duration_since(at) < LOG_INTERVAL)
        {
            self.held_back += 1;
            return;
        }
        let held_back = std::mem::take(&mut self.held_back);
        self.last_logged = Some(now);
        tracing::error!(
            failures_in_a_row = self.failures,
            similar_errors_not_logged = held_back,
            "scanning the inbox: {error}; trying again in {}",
            humantime::format_duration(pause)
        );
    }

    /// A scan went through: scans run whenever asked again.
    pub(super) fn succeeded(&mut self) {
        if self.failures > 0 {
            tracing::info!(failures = self.failures, "scanning the inbox works again");
        }
        *self = IntakeRetry::default();
    }

    /// How long until the next scan may start (zero: now).
    pub(super) fn wait(&self) -> Duration {
        self.not_before
            .map(|at| at.saturating_duration_since(Instant::now()))
            .unwrap_or(Duration::ZERO)
    }
}

#[cfg(test)]
mod tests {
    use super::IntakeRetry;
    use std::time::Duration;

    #[test]
    fn pauses_double_up_to_the_longest_and_reset_after_a_success() {
        let mut retry = IntakeRetry::default();
        let error = std::io::Error::other("disk full");
        let mut pauses = Vec::new();
        for _ in 0..8 {
            retry.failed(&error);
            pauses.push(retry.not_before.unwrap() - std::time::Instant::now());
        }
        assert!(pauses[0] <= Duration::from_millis(250));
        assert!(pauses[1] > Duration::from_millis(250), "{pauses:?}");
        assert!(pauses[7] <= Duration::from_secs(10), "{pauses:?}");
        assert!(pauses[7] > Duration::from_secs(9), "{pauses:?}");
        assert_eq!(retry.held_back, 7, "one line per minute at most");
        retry.succeeded();
        assert_eq!(retry.wait(), Duration::ZERO);
    }
}
