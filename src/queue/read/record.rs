//! A task's state and its final record, as the read model gives them.

use std::fs;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::files::mtime;

/// Where a task stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// In `inbox/`, not taken by a daemon yet (no daemon runs, or it has not got to it).
    Submitted,
    /// Accepted (`tasks/<id>.json`), not started yet.
    Pending,
    Running,
    Paused,
    WaitingRetry,
    /// Stopped by a shutdown or a daemon that died; resumes at the next start.
    Interrupted,
    Done,
    Failed,
    BudgetExceeded,
    Cancelled,
    /// A file refused at intake.
    Rejected,
    /// A record with a status this cairn does not know (written by a newer one).
    Other(String),
}

impl State {
    pub fn as_str(&self) -> &str {
        match self {
            State::Submitted => "submitted",
            State::Pending => "pending",
            State::Running => "running",
            State::Paused => "paused",
            State::WaitingRetry => "waiting_retry",
            State::Interrupted => "interrupted",
            State::Done => "done",
            State::Failed => "failed",
            State::BudgetExceeded => "budget_exceeded",
            State::Cancelled => "cancelled",
            State::Rejected => "rejected",
            State::Other(status) => status,
        }
    }

    pub(super) fn from_record_status(status: &str) -> State {
        match status {
            "done" => State::Done,
            "failed" => State::Failed,
            "budget_exceeded" => State::BudgetExceeded,
            "cancelled" => State::Cancelled,
            "rejected" => State::Rejected,
            other => State::Other(other.to_string()),
        }
    }

    /// In `current_work.json`.
    pub fn is_in_flight(&self) -> bool {
        matches!(
            self,
            State::Running | State::Paused | State::WaitingRetry | State::Interrupted
        )
    }

    /// Submitted or accepted, and not started yet.
    pub fn not_started(&self) -> bool {
        matches!(self, State::Submitted | State::Pending)
    }

    /// Sort rank: tasks in flight first, then pending (and submitted), finished, rejected.
    pub(super) fn rank(&self) -> u8 {
        match self {
            s if s.is_in_flight() => 0,
            State::Pending | State::Submitted => 1,
            State::Rejected => 3,
            _ => 2,
        }
    }
}

/// Why a record could not be read; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("reading {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is not valid JSON: {source}", path.display())]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{} has no \"status\"", path.display())]
    NoStatus { path: PathBuf },
}

/// A final record in `done/` or `failed/`.
#[derive(Debug, Clone)]
pub struct Record {
    /// The record file.
    pub path: PathBuf,
    pub value: Value,
    /// Its `status` field.
    pub status: String,
    /// When the task finished (`finished_at`, `failed_at`, `rejected_at`; else the file's
    /// modification time).
    pub at: Option<DateTime<Utc>>,
}

impl Record {
    pub fn read(path: &Path) -> Result<Record, RecordError> {
        let bytes = fs::read(path).map_err(|source| RecordError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let value: Value = serde_json::from_slice(&bytes).map_err(|source| RecordError::Json {
            path: path.to_path_buf(),
            source,
        })?;
        let status = value["status"]
            .as_str()
            .ok_or_else(|| RecordError::NoStatus {
                path: path.to_path_buf(),
            })?
            .to_string();
        let at = ["finished_at", "failed_at", "cancelled_at", "rejected_at"]
            .iter()
            .find_map(|key| value[*key].as_str())
            .and_then(|text| DateTime::parse_from_rfc3339(text).ok())
            .map(|at| at.with_timezone(&Utc))
            .or_else(|| mtime(path));
        Ok(Record {
            path: path.to_path_buf(),
            value,
            status,
            at,
        })
    }

    /// A rejection of a file at intake (not a task's record).
    pub fn is_rejection(&self) -> bool {
        self.status == "rejected"
    }

    pub(super) fn u32_field(&self, key: &str) -> Option<u32> {
        self.value[key].as_u64().and_then(|n| u32::try_from(n).ok())
    }
}
