//! Whether the daemon's main loop still turns (`/healthz`) and whether it is ready (`/readyz`):
//! the same two moments systemd is told about, `WATCHDOG=1` from each turn and `READY=1` once
//! the queue is locked and recovered (`daemon/notify.rs`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long the main loop may go without a turn before it counts as stalled when systemd set
/// no watchdog: the `WatchdogSec=` of the shipped units.
pub const DEFAULT_STALL_LIMIT: Duration = Duration::from_secs(30);

/// The main loop's last turn and the ready moment, written by the daemon's thread and read by
/// the HTTP listener's handlers.
#[derive(Debug)]
pub struct Health {
    started: Instant,
    /// Milliseconds after `started` of the main loop's last turn.
    last_turn_ms: AtomicU64,
    ready: AtomicBool,
    stall_limit: Duration,
}

/// What `/healthz` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// Recovery is still under way: the loop has not started turning yet.
    Starting,
    /// The loop turned this long ago, within the limit.
    Turning(Duration),
    /// The loop has not turned for this long, past the limit.
    Stalled(Duration),
}

impl Health {
    /// A stall limit from systemd's watchdog when it set one (`WATCHDOG_USEC`, the whole
    /// timeout, as systemd judges it), else [`DEFAULT_STALL_LIMIT`].
    pub fn new() -> Health {
        Health::with_stall_limit(sd_notify::watchdog_enabled().unwrap_or(DEFAULT_STALL_LIMIT))
    }

    pub fn with_stall_limit(stall_limit: Duration) -> Health {
        Health {
            started: Instant::now(),
            last_turn_ms: AtomicU64::new(0),
            ready: AtomicBool::new(false),
            stall_limit,
        }
    }

    pub fn stall_limit(&self) -> Duration {
        self.stall_limit
    }

    /// The main loop turned (called where it feeds systemd's watchdog).
    pub fn turned(&self) {
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_turn_ms.store(ms, Ordering::Relaxed);
    }

    /// The queue is locked and recovered (called where `READY=1` is sent).
    pub fn set_ready(&self) {
        self.turned();
        self.ready.store(true, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    pub fn liveness(&self) -> Liveness {
        if !self.is_ready() {
            return Liveness::Starting;
        }
        let last = Duration::from_millis(self.last_turn_ms.load(Ordering::Relaxed));
        let since = self.started.elapsed().saturating_sub(last);
        if since > self.stall_limit {
            Liveness::Stalled(since)
        } else {
            Liveness::Turning(since)
        }
    }
}

impl Default for Health {
    fn default() -> Self {
        Health::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loop_that_stops_turning_is_stalled_once_past_the_limit() {
        let health = Health::with_stall_limit(Duration::from_millis(50));
        assert_eq!(health.liveness(), Liveness::Starting);
        health.set_ready();
        assert!(matches!(health.liveness(), Liveness::Turning(_)));
        std::thread::sleep(Duration::from_millis(120));
        assert!(matches!(health.liveness(), Liveness::Stalled(_)));
        health.turned();
        assert!(matches!(health.liveness(), Liveness::Turning(_)));
    }
}
