//! Final task records: `done/<id>.json` and `failed/<id>.json`.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use super::current_work::ForkedFrom;
use super::current_work::{ActiveStatus, ActiveTask, PhaseTiming, StoredOutput};
use crate::submitter::Submitter;
use crate::task_id::TaskId;

/// How a task ended, as its record's `status` says.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordStatus {
    /// Every phase finished (`done/`).
    Done,
    /// Its attempts were used up, or it was quarantined (`failed/`).
    Failed,
    /// Stopped by its `budget.max_cost` (`failed/`).
    BudgetExceeded,
    /// Cancelled by an operator (`failed/`).
    Cancelled,
    /// A file refused at intake (`failed/rejected-*.json`), not a task.
    Rejected,
    /// A status this cairn does not know (written by a newer one).
    #[serde(untagged)]
    Other(String),
}

impl RecordStatus {
    pub fn as_str(&self) -> &str {
        match self {
            RecordStatus::Done => "done",
            RecordStatus::Failed => "failed",
            RecordStatus::BudgetExceeded => "budget_exceeded",
            RecordStatus::Cancelled => "cancelled",
            RecordStatus::Rejected => "rejected",
            RecordStatus::Other(status) => status,
        }
    }

    /// A task's end that `cairn retry` can bring back.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            RecordStatus::Failed | RecordStatus::Cancelled | RecordStatus::BudgetExceeded
        )
    }
}

/// Written once a task's last phase has finished.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DoneRecord {
    /// Always [`RecordStatus::Done`].
    pub status: RecordStatus,
    pub task_id: TaskId,
    /// The last phase's output.
    pub result: Value,
    pub phase_outputs: BTreeMap<String, Value>,
    /// Runs started (the first, and each resume after a stop, pause, crash or retry; the name
    /// is kept for compatibility), and how many attempts failed.
    pub attempts: u32,
    pub failed_attempts: u32,
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
    pub duration_seconds: f64,
    /// Summed cost reported by the task's loops and workers, if any reported one: the cost its
    /// checkpoints committed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
    /// Iterations in flight when the daemon died, whose cost is not in `cost`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub lost_iterations: u64,
    /// Their estimated cost, at the largest cost an iteration reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost_cost_estimate: Option<f64>,
    pub phases: Vec<PhaseTiming>,
    /// Who submitted the task (see [`crate::submitter`]); absent for a task accepted before
    /// cairn recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitted_by: Option<Submitter>,
    /// The spending limit in force when it ended (the definition's, or the one `cairn budget`
    /// set); absent without a budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost: Option<f64>,
    /// Where a forked task came from; absent for a task that was not forked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<ForkedFrom>,
}

/// Written when a task has used up its attempts, or was stopped by its budget (its
/// checkpoints are kept).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailedRecord {
    /// [`RecordStatus::Failed`], [`RecordStatus::BudgetExceeded`] or
    /// [`RecordStatus::Cancelled`].
    pub status: RecordStatus,
    /// As in [`DoneRecord`]: the committed cost, and the estimate for lost iterations apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub lost_iterations: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost_cost_estimate: Option<f64>,
    pub task_id: TaskId,
    pub error: String,
    /// The phase that failed.
    pub phase: String,
    pub phase_index: usize,
    pub attempts: u32,
    pub failed_attempts: u32,
    pub started_at: DateTime<Utc>,
    pub failed_at: DateTime<Utc>,
    pub phase_outputs: BTreeMap<String, Value>,
    pub phases: Vec<PhaseTiming>,
    /// As in [`DoneRecord`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitted_by: Option<Submitter>,
    /// As in [`DoneRecord`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost: Option<f64>,
}

impl ActiveTask {
    /// The entry that brings back a failed, cancelled or budget-stopped task (`cairn retry`):
    /// where its record says it stopped (within the task's `phase_count` phases), with its
    /// outputs, runs and timings, its failed attempts counted afresh, and a budget stop given
    /// a fresh budget (the operator asked for more). `retry_of` names the record it replaces.
    pub fn for_retry(record: &FailedRecord, phase_count: usize) -> ActiveTask {
        let mut entry = ActiveTask::new(&record.task_id, &record.phase);
        entry.phase_index = record.phase_index.min(phase_count);
        entry.phase_outputs = record
            .phase_outputs
            .iter()
            .map(|(name, value)| (name.clone(), StoredOutput::Inline(value.clone())))
            .collect();
        entry.started_at = record.started_at;
        entry.attempt = record.attempts;
        entry.status = ActiveStatus::Interrupted;
        entry.phases = record.phases.clone();
        entry.cost = (record.status != RecordStatus::BudgetExceeded)
            .then_some(record.cost)
            .flatten();
        entry.last_error = Some(record.error.clone());
        entry.retry_of = Some(record.failed_at);
        entry.max_cost = record.max_cost;
        entry
    }
}

impl FailedRecord {
    /// The record of a task in flight as `entry` that ends now with `status` (failed,
    /// budget stopped, cancelled) and `error`: `phase` names the phase it stopped in,
    /// `outputs` are those of the phases it finished. One shape for every backend.
    pub fn from_entry(
        entry: &ActiveTask,
        status: RecordStatus,
        error: String,
        phase: String,
        outputs: BTreeMap<String, Value>,
    ) -> FailedRecord {
        FailedRecord {
            status,
            cost: entry.cost,
            lost_iterations: entry.lost_iterations,
            lost_cost_estimate: entry.lost_cost_estimate(),
            task_id: entry.task_id.clone(),
            error,
            phase,
            phase_index: entry.phase_index,
            attempts: entry.attempt,
            failed_attempts: entry.failed_attempts,
            started_at: entry.started_at,
            failed_at: Utc::now(),
            phase_outputs: outputs,
            phases: entry.phases.clone(),
            submitted_by: None,
            max_cost: entry.max_cost,
        }
    }

    /// The same record, with the spending limit in force (the definition's unless
    /// `cairn budget` set one).
    pub fn with_limit(mut self, budget: Option<&crate::task::Budget>) -> FailedRecord {
        self.max_cost = self.max_cost.or(budget.map(|b| b.max_cost));
        self
    }

    /// The same record, naming the task's submitter.
    pub fn submitted_by(mut self, submitter: Option<Submitter>) -> FailedRecord {
        self.submitted_by = submitter;
        self
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A record as JSON bytes, pretty-printed for people reading `done/` and `failed/`.
pub fn to_record_bytes<T: Serialize>(record: &T) -> Vec<u8> {
    // Records hold plain data with string keys, which always serializes.
    let mut bytes = serde_json::to_vec_pretty(record).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

#[cfg(test)]
mod tests {
    use super::RecordStatus;

    #[test]
    fn statuses_read_and_write_as_their_names() {
        for (status, name) in [
            (RecordStatus::Done, "done"),
            (RecordStatus::Failed, "failed"),
            (RecordStatus::BudgetExceeded, "budget_exceeded"),
            (RecordStatus::Cancelled, "cancelled"),
            (RecordStatus::Rejected, "rejected"),
            (RecordStatus::Other("archived".into()), "archived"),
        ] {
            let json = serde_json::to_string(&status).unwrap();
            assert_eq!(json, format!("{name:?}"));
            assert_eq!(serde_json::from_str::<RecordStatus>(&json).unwrap(), status);
            assert_eq!(status.as_str(), name);
        }
        assert!(serde_json::from_str::<RecordStatus>("3").is_err());
    }
}
