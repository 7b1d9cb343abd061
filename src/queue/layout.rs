//! Where everything lives inside a queue directory (see `queue/README.md`).

use std::io;
use std::path::{Path, PathBuf};

/// A queue directory and the names of its parts.
#[derive(Debug, Clone)]
pub struct QueueDir {
    root: PathBuf,
}

/// Subdirectories cairn creates when it opens a queue.
pub const SUBDIRS: [&str; 7] = [
    "inbox",
    "tasks",
    "incremental",
    "runs",
    "done",
    "failed",
    "control",
];

impl QueueDir {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        QueueDir { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Create the queue (and its missing parents) and its directories if they are missing,
    /// `0750` whatever the umask: writable by their owner only, entered by its group, closed to
    /// everyone else. Existing directories keep their mode, so an administrator may share
    /// `inbox/` (and `control/`) with a group.
    pub fn create_all(&self) -> io::Result<()> {
        for dir in SUBDIRS {
            let path = self.root.join(dir);
            crate::store::modes::create_dir_all(&path).map_err(|e| {
                io::Error::new(e.kind(), format!("creating {}: {e}", path.display()))
            })?;
        }
        Ok(())
    }

    pub fn inbox(&self) -> PathBuf {
        self.root.join("inbox")
    }

    pub fn control(&self) -> PathBuf {
        self.root.join("control")
    }

    pub fn tasks(&self) -> PathBuf {
        self.root.join("tasks")
    }

    /// Every task's directory of logs and scratch files.
    pub fn runs(&self) -> PathBuf {
        self.root.join("runs")
    }

    pub fn lock_file(&self) -> PathBuf {
        self.root.join(".lock")
    }

    /// Per-task working files (logs, large phase outputs).
    pub fn run_dir(&self, task_id: &str) -> PathBuf {
        self.root.join("runs").join(task_id)
    }

    /// Storage key of a task's accepted definition.
    pub fn task_key(task_id: &str) -> String {
        format!("tasks/{task_id}.json")
    }

    /// Storage key of a finished task's record.
    pub fn done_key(task_id: &str) -> String {
        format!("done/{task_id}.json")
    }

    /// Storage key of a failed task's (or rejected file's) record.
    pub fn failed_key(task_id: &str) -> String {
        format!("failed/{task_id}.json")
    }

    /// Storage key of a large phase output kept outside `current_work.json`.
    pub fn phase_output_key(task_id: &str, phase_index: usize) -> String {
        format!("runs/{task_id}/output-{phase_index}.json")
    }

    /// The work state's snapshot; the writes since are in [`WORK_LOG_KEY`](Self::WORK_LOG_KEY).
    pub const CURRENT_WORK_KEY: &'static str = crate::store::work_log::SNAPSHOT_KEY;

    /// The work state's log of writes since its snapshot.
    pub const WORK_LOG_KEY: &'static str = crate::store::work_log::LOG_KEY;

    /// The limits the daemon holding the queue runs with (`crate::limits::PublishedLimits`),
    /// written at its start for `cairn status`.
    pub const LIMITS_KEY: &'static str = "limits.json";

    /// Storage directory of accepted task definitions.
    pub const TASKS_DIR: &'static str = "tasks";

    /// Storage directory of finished tasks' records.
    pub const DONE_DIR: &'static str = "done";

    /// Storage directory of failed tasks' (and rejected files') records.
    pub const FAILED_DIR: &'static str = "failed";

    /// A path inside the queue, for messages.
    pub fn display_key(&self, key: &str) -> String {
        self.root.join(key).display().to_string()
    }
}
