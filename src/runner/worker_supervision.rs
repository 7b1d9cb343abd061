//! Where the supervision of a running worker stands, and how each event moves it: a stop
//! request, a reason of the daemon's own to stop it (its budget, a failed checkpoint write), the
//! daemon's stop grace running out, a missed heartbeat, its timeout, a kill that falls due.
//! Pure: [`Supervision::on`] returns the next state and the signal its process group gets on
//! the way, and `worker::run` sends it.

use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::time::Instant;

/// Where the supervision of a running worker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Supervision {
    /// Working: its heartbeat and timeout are watched, and a stop request reaches it.
    Running,
    /// Sent SIGTERM while one of its messages was being handled (its budget is spent, or its
    /// checkpoint could not be written): the time it gets to exit starts once that message is
    /// handled, that is once it has its answer.
    Told,
    /// Sent SIGTERM: it may send its last checkpoint and exit. `kill_at` is when it is killed if
    /// still there; `None` on a daemon stop, whose grace is the daemon's to end.
    Terminating { kill_at: Option<Instant> },
    /// Sent SIGKILL: only its exit is awaited.
    Killed(KillReason),
}

/// Why a worker was killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum KillReason {
    /// Nothing on its channel for longer than its `heartbeat_timeout`.
    Silent,
    /// Its phase's `timeout` passed.
    TimedOut,
    /// The daemon's stop grace is over (or a second signal came).
    GraceOver,
    /// It did not exit within [`KILL_AFTER`](super::child::KILL_AFTER) of its SIGTERM.
    Lingered,
}

/// What the supervision reacts to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Event {
    /// The daemon stops (`daemon_stopping`), or an operator paused or cancelled the task.
    StopRequested {
        daemon_stopping: bool,
    },
    /// The daemon decided the worker must stop, while handling one of its messages.
    ToldToStop,
    /// The message being handled is handled.
    MessageHandled,
    /// The daemon's stop grace is over.
    GraceOver,
    HeartbeatMissed,
    TimedOut,
    /// The `kill_at` of [`Supervision::Terminating`] has come.
    KillDue,
}

impl Supervision {
    /// The next state after `event` at `now`, and the signal for the worker's group on the way.
    /// `kill_after` is how long a worker told to stop by other than the daemon's stop may take.
    pub(super) fn on(
        self,
        event: Event,
        now: Instant,
        kill_after: Duration,
    ) -> (Self, Option<Signal>) {
        use Supervision::{Killed, Running, Terminating, Told};
        let kill = |why| (Killed(why), Some(Signal::SIGKILL));
        match (self, event) {
            (Running, Event::StopRequested { daemon_stopping }) => {
                let kill_at = (!daemon_stopping).then(|| now + kill_after);
                (Terminating { kill_at }, Some(Signal::SIGTERM))
            }
            (Running, Event::ToldToStop) => (Told, Some(Signal::SIGTERM)),
            (Told, Event::MessageHandled) => (
                Terminating {
                    kill_at: Some(now + kill_after),
                },
                None,
            ),
            (Running, Event::HeartbeatMissed) => kill(KillReason::Silent),
            (Running | Told | Terminating { .. }, Event::TimedOut) => kill(KillReason::TimedOut),
            (Running | Told | Terminating { .. }, Event::GraceOver) => kill(KillReason::GraceOver),
            (Terminating { kill_at: Some(_) }, Event::KillDue) => kill(KillReason::Lingered),
            // SIGTERM goes out once, SIGKILL once; the rest changes nothing.
            (state, _) => (state, None),
        }
    }

    /// Whether a stop request still has to reach the worker.
    pub(super) fn awaits_stop_request(self) -> bool {
        self == Supervision::Running
    }

    /// Whether its silence is still watched (a worker told to stop may be busy saving).
    pub(super) fn watches_heartbeat(self) -> bool {
        self == Supervision::Running
    }

    /// Whether it is still alive as far as the daemon knows (its timeout and the end of the
    /// daemon's grace still apply).
    pub(super) fn not_killed(self) -> bool {
        !matches!(self, Supervision::Killed(_))
    }

    /// When it is to be killed for lingering after its SIGTERM.
    pub(super) fn kill_at(self) -> Option<Instant> {
        match self {
            Supervision::Terminating { kill_at } => kill_at,
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use nix::sys::signal::Signal;
    use tokio::time::Instant;

    use super::{Event, KillReason, Supervision};

    #[test]
    fn the_transition_table() {
        use Event::{
            GraceOver, HeartbeatMissed, KillDue, MessageHandled, StopRequested, TimedOut,
            ToldToStop,
        };
        use KillReason::{GraceOver as Grace, Lingered, Silent, TimedOut as OutOfTime};
        use Signal::{SIGKILL, SIGTERM};
        use Supervision::{Killed, Running, Terminating, Told};
        let now = Instant::now();
        let after = Duration::from_secs(5);
        let later = Some(now + after);
        let earlier = Some(now - Duration::from_secs(1));
        let stop = StopRequested {
            daemon_stopping: true,
        };
        let pause = StopRequested {
            daemon_stopping: false,
        };
        #[rustfmt::skip]
        let table = [
            // state                             event            → state                              signal
            // A daemon stop: SIGTERM at once, and the daemon's grace bounds it.
            ((Running,                           stop),            (Terminating { kill_at: None },      Some(SIGTERM))),
            // A pause or cancel: SIGTERM, and SIGKILL if it lingers.
            ((Running,                           pause),           (Terminating { kill_at: later },     Some(SIGTERM))),
            // Its budget or a failed write: SIGTERM before its answer, its time from the answer.
            ((Running,                           ToldToStop),      (Told,                               Some(SIGTERM))),
            ((Told,                              MessageHandled),  (Terminating { kill_at: later },     None)),
            ((Running,                           MessageHandled),  (Running,                            None)),
            // SIGTERM goes once: a later reason or request changes nothing.
            ((Told,                              ToldToStop),      (Told,                               None)),
            ((Terminating { kill_at: None },     ToldToStop),      (Terminating { kill_at: None },      None)),
            ((Terminating { kill_at: None },     MessageHandled),  (Terminating { kill_at: None },      None)),
            ((Terminating { kill_at: earlier },  pause),           (Terminating { kill_at: earlier },   None)),
            ((Killed(Silent),                    stop),            (Killed(Silent),                     None)),
            ((Killed(OutOfTime),                 ToldToStop),      (Killed(OutOfTime),                  None)),
            // Silence is watched only while it works.
            ((Running,                           HeartbeatMissed), (Killed(Silent),                     Some(SIGKILL))),
            ((Terminating { kill_at: None },     HeartbeatMissed), (Terminating { kill_at: None },      None)),
            ((Told,                              HeartbeatMissed), (Told,                               None)),
            // Its timeout and the end of the daemon's grace kill it in any live state.
            ((Running,                           TimedOut),        (Killed(OutOfTime),                  Some(SIGKILL))),
            ((Terminating { kill_at: later },    TimedOut),        (Killed(OutOfTime),                  Some(SIGKILL))),
            ((Running,                           GraceOver),       (Killed(Grace),                      Some(SIGKILL))),
            ((Terminating { kill_at: None },     GraceOver),       (Killed(Grace),                      Some(SIGKILL))),
            ((Told,                              GraceOver),       (Killed(Grace),                      Some(SIGKILL))),
            // A worker told to stop that lingers is killed; without a kill time, nothing is due.
            ((Terminating { kill_at: earlier },  KillDue),         (Killed(Lingered),                   Some(SIGKILL))),
            ((Terminating { kill_at: None },     KillDue),         (Terminating { kill_at: None },      None)),
            ((Running,                           KillDue),         (Running,                            None)),
            // SIGKILL goes once.
            ((Killed(Lingered),                  GraceOver),       (Killed(Lingered),                   None)),
            ((Killed(Grace),                     TimedOut),        (Killed(Grace),                      None)),
        ];
        for ((state, event), expected) in table {
            assert_eq!(
                state.on(event, now, after),
                expected,
                "{state:?} on {event:?}"
            );
        }
    }

    #[test]
    fn what_each_state_still_watches() {
        let now = Instant::now();
        // (state, stop request, heartbeat, alive, kill time)
        #[rustfmt::skip]
        let table = [
            (Supervision::Running,                            true,  true,  true,  None),
            (Supervision::Told,                               false, false, true,  None),
            (Supervision::Terminating { kill_at: None },      false, false, true,  None),
            (Supervision::Terminating { kill_at: Some(now) }, false, false, true,  Some(now)),
            (Supervision::Killed(KillReason::Silent),         false, false, false, None),
        ];
        for (state, stop, heartbeat, alive, kill_at) in table {
            assert_eq!(state.awaits_stop_request(), stop, "{state:?}");
            assert_eq!(state.watches_heartbeat(), heartbeat, "{state:?}");
            assert_eq!(state.not_killed(), alive, "{state:?}");
            assert_eq!(state.kill_at(), kill_at, "{state:?}");
        }
    }
}
