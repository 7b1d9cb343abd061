//! A task's final record, as the read model gives it, and the order tasks are listed in.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::Value;

use super::files::mtime;
use crate::store::records::RecordStatus;
use crate::store::task_state::TaskState;

/// Sort rank: tasks in flight first, then pending (and submitted), finished, rejected.
pub(crate) fn rank(state: &TaskState) -> u8 {
    match state {
        s if s.is_in_flight() => 0,
        s if s.not_started() => 1,
        s if s.is_rejected() => 3,
        _ => 2,
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
    #[error("{}: \"status\": {source}", path.display())]
    Status {
        path: PathBuf,
        source: serde_json::Error,
    },
}

/// A final record in `done/` or `failed/`.
#[derive(Debug, Clone)]
pub struct Record {
    /// The record file.
    pub path: PathBuf,
    pub value: Value,
    /// Its `status` field.
    pub status: RecordStatus,
    /// When the task finished (`finished_at`, `failed_at`, `rejected_at`; else the file's
    /// modification time).
    pub at: Option<DateTime<Utc>>,
}

impl Record {
    pub fn read(path: &Path) -> Result<Record, RecordError> {
        let bytes = super::files::read_queue_file(path).map_err(|source| RecordError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let value: Value = serde_json::from_slice(&bytes).map_err(|source| RecordError::Json {
            path: path.to_path_buf(),
            source,
        })?;
        Record::from_value(path, value, mtime(path))
    }

    /// A record already read, from wherever it is kept (`path` names it in messages);
    /// `stored_at` is when it was stored, for a record that does not say when it finished.
    pub fn from_value(
        path: &Path,
        value: Value,
        stored_at: Option<DateTime<Utc>>,
    ) -> Result<Record, RecordError> {
        let status = match value.get("status") {
            Some(status) => {
                RecordStatus::deserialize(status).map_err(|source| RecordError::Status {
                    path: path.to_path_buf(),
                    source,
                })?
            }
            None => {
                return Err(RecordError::NoStatus {
                    path: path.to_path_buf(),
                })
            }
        };
        let at = ["finished_at", "failed_at", "cancelled_at", "rejected_at"]
            .iter()
            .find_map(|key| value[*key].as_str())
            .and_then(|text| DateTime::parse_from_rfc3339(text).ok())
            .map(|at| at.with_timezone(&Utc))
            .or(stored_at);
        Ok(Record {
            path: path.to_path_buf(),
            value,
            status,
            at,
        })
    }

    /// A rejection of a file at intake (not a task's record).
    pub fn is_rejection(&self) -> bool {
        self.status == RecordStatus::Rejected
    }

    pub(super) fn u32_field(&self, key: &str) -> Option<u32> {
        self.value[key].as_u64().and_then(|n| u32::try_from(n).ok())
    }
}
