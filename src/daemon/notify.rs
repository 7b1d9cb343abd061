//! Telling systemd how the daemon is doing (`sd_notify`): READY once the queue is locked and
//! recovered, STATUS as the work changes, WATCHDOG from the main loop (a wedged loop stops
//! pinging and systemd restarts it), STOPPING and EXTEND_TIMEOUT_USEC during a stop. Without
//! `NOTIFY_SOCKET` every call does nothing.

use std::time::{Duration, Instant};

use sd_notify::NotifyState;

#[derive(Debug)]
pub(crate) struct ServiceNotifier {
    /// Half the watchdog timeout, when systemd asked for pings.
    watchdog_every: Option<Duration>,
    last_ping: Option<Instant>,
    last_status: String,
    /// When the status was last worked out: at most every [`STATUS_EVERY`].
    last_status_at: Option<Instant>,
    /// Whether a service manager listens (`NOTIFY_SOCKET`): else no status is worked out.
    listened_to: bool,
}

/// How often the status line is worked out at most. It counts over every task in flight, which
/// at thousands of tasks and a main-loop turn per event was a tenth of the daemon's thread; the
/// loop ticks at least every second, so a change shows within about a second.
const STATUS_EVERY: Duration = Duration::from_millis(250);

impl ServiceNotifier {
    pub(super) fn new() -> Self {
        let watchdog_every = sd_notify::watchdog_enabled().map(|timeout| timeout / 2);
        ServiceNotifier {
            watchdog_every,
            last_ping: None,
            last_status: String::new(),
            last_status_at: None,
            listened_to: std::env::var_os("NOTIFY_SOCKET").is_some_and(|s| !s.is_empty()),
        }
    }

    fn send(&self, states: &[NotifyState]) {
        if let Err(e) = sd_notify::notify(states) {
            tracing::warn!("cannot notify the service manager: {e}");
        }
    }

    pub(super) fn ready(&mut self, status: String) {
        self.send(&[NotifyState::Ready, NotifyState::Status(&status)]);
        self.last_status = status;
        self.last_ping = Some(Instant::now());
    }

    /// Whether a status line should be worked out for the next [`ServiceNotifier::tick`].
    pub(super) fn status_due(&self) -> bool {
        self.listened_to
            && self
                .last_status_at
                .is_none_or(|last| last.elapsed() >= STATUS_EVERY)
    }

    /// Send STATUS= when it changed (`None`: not worked out, see [`ServiceNotifier::status_due`]),
    /// and WATCHDOG=1 when one is due.
    pub(super) fn tick(&mut self, status: Option<String>) {
        if let Some(status) = status {
            self.last_status_at = Some(Instant::now());
            if status != self.last_status {
                self.send(&[NotifyState::Status(&status)]);
                self.last_status = status;
            }
        }
        if let Some(every) = self.watchdog_every {
            if self.last_ping.is_none_or(|last| last.elapsed() >= every) {
                self.send(&[NotifyState::Watchdog]);
                self.last_ping = Some(Instant::now());
            }
        }
    }

    /// The longest sleep that still keeps the watchdog fed.
    pub(super) fn max_sleep(&self) -> Option<Duration> {
        self.watchdog_every
    }

    /// STOPPING=1, and more time for the stop: the grace, the kill window and the flush.
    pub(super) fn stopping(&mut self, allowance: Duration) {
        let usec = u32::try_from(allowance.as_micros()).unwrap_or(u32::MAX);
        self.send(&[
            NotifyState::Stopping,
            NotifyState::ExtendTimeoutUsec(usec),
            NotifyState::Status("stopping: flushing checkpoints"),
        ]);
    }
}
