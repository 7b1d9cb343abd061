//! Where a task stands: the one state type that `status`, `show` and their `--json` output
//! use, made from what the queue holds — a `current_work.json` entry's [`ActiveStatus`] while
//! the task is in flight, its record's [`RecordStatus`] once it has ended.

use super::current_work::{ActiveStatus, ActiveTask};
use super::records::RecordStatus;

/// A task's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskState {
    /// In `inbox/`, not taken by a daemon yet (no daemon runs, or it has not got to it).
    Submitted,
    /// Accepted (`tasks/<id>.json`), not started yet.
    Pending,
    /// In `current_work.json`.
    InFlight(ActiveStatus),
    /// With a record in `done/` or `failed/`.
    Finished(RecordStatus),
}

impl TaskState {
    /// The state of a task in flight. An entry left `running` by a daemon that is no longer
    /// alive is `interrupted`: it resumes at the next start.
    pub fn of_entry(entry: &ActiveTask, daemon_alive: bool) -> TaskState {
        match entry.status {
            ActiveStatus::Running if !daemon_alive => {
                TaskState::InFlight(ActiveStatus::Interrupted)
            }
            status => TaskState::InFlight(status),
        }
    }

    /// The name `status` and `show` print (and `--json` holds).
    pub fn as_str(&self) -> &str {
        match self {
            TaskState::Submitted => "submitted",
            TaskState::Pending => "pending",
            TaskState::InFlight(status) => status.as_str(),
            TaskState::Finished(status) => status.as_str(),
        }
    }

    pub fn is_in_flight(&self) -> bool {
        matches!(self, TaskState::InFlight(_))
    }

    /// Submitted or accepted, and not started yet.
    pub fn not_started(&self) -> bool {
        matches!(self, TaskState::Submitted | TaskState::Pending)
    }

    /// Every phase finished.
    pub fn is_done(&self) -> bool {
        *self == TaskState::Finished(RecordStatus::Done)
    }

    /// A file refused at intake, not a task.
    pub fn is_rejected(&self) -> bool {
        *self == TaskState::Finished(RecordStatus::Rejected)
    }
}

impl From<ActiveStatus> for TaskState {
    fn from(status: ActiveStatus) -> TaskState {
        TaskState::InFlight(status)
    }
}

impl From<RecordStatus> for TaskState {
    fn from(status: RecordStatus) -> TaskState {
        TaskState::Finished(status)
    }
}

#[cfg(test)]
mod tests {
    use super::{ActiveStatus, ActiveTask, RecordStatus, TaskState};
    use crate::task_id::TaskId;

    #[test]
    fn entries_are_in_flight_and_a_dead_daemons_running_task_is_interrupted() {
        let mut entry = ActiveTask::new(&TaskId::parse("t1").unwrap(), "p");
        for (status, alive, name) in [
            (ActiveStatus::Running, true, "running"),
            (ActiveStatus::Running, false, "interrupted"),
            (ActiveStatus::Paused, false, "paused"),
            (ActiveStatus::Interrupted, true, "interrupted"),
            (ActiveStatus::WaitingRetry, true, "waiting_retry"),
        ] {
            entry.status = status;
            // `current_work.json` spells the status as the state is named.
            assert_eq!(serde_json::to_value(status).unwrap(), status.as_str());
            let state = TaskState::of_entry(&entry, alive);
            assert_eq!(state.as_str(), name);
            assert!(state.is_in_flight() && !state.not_started() && !state.is_done());
        }
        assert_eq!(
            TaskState::from(ActiveStatus::Paused),
            TaskState::InFlight(ActiveStatus::Paused)
        );
    }

    #[test]
    fn records_are_finished_under_their_status() {
        for (status, name) in [
            (RecordStatus::Done, "done"),
            (RecordStatus::Failed, "failed"),
            (RecordStatus::BudgetExceeded, "budget_exceeded"),
            (RecordStatus::Cancelled, "cancelled"),
            (RecordStatus::Rejected, "rejected"),
            (RecordStatus::Other("archived".into()), "archived"),
        ] {
            let state = TaskState::from(status.clone());
            assert_eq!(state.as_str(), name);
            assert!(!state.is_in_flight() && !state.not_started());
            assert_eq!(state.is_done(), status == RecordStatus::Done);
            assert_eq!(state.is_rejected(), status == RecordStatus::Rejected);
        }
        assert_eq!(TaskState::Submitted.as_str(), "submitted");
        assert_eq!(TaskState::Pending.as_str(), "pending");
        assert!(TaskState::Pending.not_started() && !TaskState::Pending.is_in_flight());
    }
}
