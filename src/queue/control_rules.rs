//! What a control request (`cairn pause|resume|cancel|retry|budget`) does to a task: one rule
//! for both backends. The file daemon asks it of the tasks it schedules
//! (`daemon::control`); a shared queue asks it, in SQL, of a task no daemon holds
//! (`postgres::steer`). Each backend only says where the task stands and carries out the
//! answer, so the same request on the same task does the same thing, in the same words.

use crate::queue::control::ControlAction;
use crate::store::current_work::ActiveStatus;
use crate::store::records::RecordStatus;

/// The error of a task's record when an operator cancelled it.
pub const CANCELLED_BY_OPERATOR: &str = "cancelled by an operator";

/// Where a task named by a control request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// An attempt of it runs now.
    Running,
    /// It has phase-level state (interrupted, paused, waiting for a retry) and no attempt
    /// running.
    InFlight { status: ActiveStatus, suspect: bool },
    /// Accepted, never started.
    Pending,
    /// Neither: finished, failed, or never seen.
    Unknown,
}

/// What a control request does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Steer {
    /// Tell the running attempt (its pause or cancel token): it stops at its next boundary or
    /// at once, and the attempt's end records how.
    Signal,
    /// Take it out of every line and hold it until `cairn resume`.
    Pause,
    /// Put it back in line (with the crash suspects if it is one).
    Resume,
    /// Record it cancelled.
    Cancel,
    /// Bring its failed record back, once [`check_retry`] accepts the record.
    Retry,
    /// Set its spending limit (`cairn budget`), running or not.
    SetLimit,
    /// Nothing to do: it is so already.
    Nothing(AlreadySo),
    /// The request does not apply, for this reason.
    Refuse(ControlRefusal),
}

/// Why a request changes nothing although it applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AlreadySo {
    #[error("it is paused already")]
    Paused,
}

/// Why a control request does not apply to its task: for the log, the journal and the
/// requester.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlRefusal {
    #[error("it is neither pending nor in flight")]
    NotThere,
    #[error("it is not paused")]
    NotPaused,
    #[error("its definition is not loaded")]
    DefinitionNotLoaded,
    #[error("it has not failed or been cancelled")]
    NotFailed,
    #[error("its record's status is {:?}", .0.as_str())]
    NotRetryable(RecordStatus),
    #[error("it is not in flight (a finished task's budget is renewed by `cairn retry`)")]
    NotInFlight,
    #[error("it has not started: its limit is its definition's budget.max_cost until it runs")]
    NotStarted,
    #[error("it names no limit")]
    NoLimit,
}

/// What `action` does to a task that stands at `standing`; `definition_loaded`: whether the
/// backend has the task's definition at hand (a cancel records the task's phases). Pure.
pub fn decide_control(action: ControlAction, standing: Standing, definition_loaded: bool) -> Steer {
    use ControlAction::{Budget, Cancel, Pause, Resume, Retry};
    let paused = |status| status == ActiveStatus::Paused;
    match (action, standing) {
        (Retry, _) => Steer::Retry,
        (Budget, Standing::Running | Standing::InFlight { .. }) => Steer::SetLimit,
        (Budget, Standing::Pending) => Steer::Refuse(ControlRefusal::NotStarted),
        (Budget, Standing::Unknown) => Steer::Refuse(ControlRefusal::NotInFlight),
        (Pause | Cancel, Standing::Running) => Steer::Signal,
        (Pause | Cancel, Standing::Unknown) => Steer::Refuse(ControlRefusal::NotThere),
        (Pause, Standing::InFlight { status, .. }) if paused(status) => {
            Steer::Nothing(AlreadySo::Paused)
        }
        (Pause, _) => Steer::Pause,
        (Resume, Standing::InFlight { status, .. }) if paused(status) => Steer::Resume,
        (Resume, _) => Steer::Refuse(ControlRefusal::NotPaused),
        (Cancel, _) if !definition_loaded => Steer::Refuse(ControlRefusal::DefinitionNotLoaded),
        (Cancel, _) => Steer::Cancel,
    }
}

/// Whether a task whose final record has `record` status (`None`: it has no record that reads
/// as a failed one) may be retried. Pure.
pub fn check_retry(record: Option<&RecordStatus>) -> Result<(), ControlRefusal> {
    match record {
        None => Err(ControlRefusal::NotFailed),
        Some(status) if status.is_retryable() => Ok(()),
        Some(status) => Err(ControlRefusal::NotRetryable(status.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::{check_retry, decide_control, AlreadySo, ControlRefusal, Standing, Steer};
    use crate::queue::control::ControlAction;
    use crate::store::current_work::ActiveStatus;
    use crate::store::records::RecordStatus;

    #[test]
    fn what_each_request_does() {
        use ActiveStatus::{Interrupted, Paused, WaitingRetry};
        use ControlAction::{Budget, Cancel, Pause, Resume, Retry};
        use ControlRefusal::{DefinitionNotLoaded, NotInFlight, NotPaused, NotStarted, NotThere};
        use Standing::{Pending, Running, Unknown};
        let in_flight = |status| Standing::InFlight {
            status,
            suspect: false,
        };
        let suspect = |status| Standing::InFlight {
            status,
            suspect: true,
        };
        let refuse = Steer::Refuse;
        // (request, where the task stands, definition loaded) → what it does
        #[rustfmt::skip]
        let table = [
            // A running attempt is told, and stops at its next boundary (pause) or at once.
            ((Pause,  Running,                   true),  Steer::Signal),
            ((Cancel, Running,                   true),  Steer::Signal),
            ((Cancel, Running,                   false), Steer::Signal),
            // Waiting tasks are paused or cancelled where they wait.
            ((Pause,  in_flight(Interrupted),    true),  Steer::Pause),
            ((Pause,  in_flight(WaitingRetry),   true),  Steer::Pause),
            ((Pause,  Pending,                   true),  Steer::Pause),
            ((Pause,  in_flight(Paused),         true),  Steer::Nothing(AlreadySo::Paused)),
            ((Cancel, in_flight(WaitingRetry),   true),  Steer::Cancel),
            ((Cancel, in_flight(Paused),         true),  Steer::Cancel),
            ((Cancel, Pending,                   true),  Steer::Cancel),
            ((Cancel, in_flight(Interrupted),    false), refuse(DefinitionNotLoaded)),
            // Only a paused task resumes (a suspect back to its trial, by the flag).
            ((Resume, in_flight(Paused),         true),  Steer::Resume),
            ((Resume, suspect(Paused),           true),  Steer::Resume),
            ((Resume, Running,                   true),  refuse(NotPaused)),
            ((Resume, in_flight(Interrupted),    true),  refuse(NotPaused)),
            ((Resume, Pending,                   true),  refuse(NotPaused)),
            ((Resume, Unknown,                   false), refuse(NotPaused)),
            // Nothing to pause or cancel.
            ((Pause,  Unknown,                   false), refuse(NotThere)),
            ((Cancel, Unknown,                   true),  refuse(NotThere)),
            // A retry is for a failed record, wherever the task stands.
            ((Retry,  Unknown,                   false), Steer::Retry),
            ((Retry,  Running,                   true),  Steer::Retry),
            // A spending limit is set on a task in flight, running or held (a paused one
            // stays paused); one that never started or has finished has none to set.
            ((Budget, Running,                   true),  Steer::SetLimit),
            ((Budget, in_flight(Paused),         true),  Steer::SetLimit),
            ((Budget, in_flight(WaitingRetry),   false), Steer::SetLimit),
            ((Budget, suspect(Interrupted),      true),  Steer::SetLimit),
            ((Budget, Pending,                   true),  refuse(NotStarted)),
            ((Budget, Unknown,                   false), refuse(NotInFlight)),
        ];
        for ((action, standing, loaded), steer) in table {
            assert_eq!(
                decide_control(action, standing, loaded),
                steer,
                "{action:?}, {standing:?}, definition loaded {loaded}"
            );
        }
    }

    #[test]
    fn a_retry_is_for_a_record_that_failed_was_cancelled_or_ran_out_of_budget() {
        use RecordStatus::{BudgetExceeded, Cancelled, Done, Failed};
        assert_eq!(check_retry(Some(&Failed)), Ok(()));
        assert_eq!(check_retry(Some(&Cancelled)), Ok(()));
        assert_eq!(check_retry(Some(&BudgetExceeded)), Ok(()));
        let done = check_retry(Some(&Done)).unwrap_err();
        assert_eq!(done.to_string(), "its record's status is \"done\"");
        let none = check_retry(None).unwrap_err();
        assert_eq!(none.to_string(), "it has not failed or been cancelled");
    }
}
