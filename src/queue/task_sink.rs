//! Where intake puts the tasks it accepts. The checks that come before (the claim, the file's
//! kind, size, permissions, the task's validation) are the same whatever the queue; only this
//! last step differs: the file queue writes `tasks/<id>.json`, a shared queue (PostgreSQL)
//! inserts the task where every daemon claims from.

use std::fmt;
use std::io;
use std::sync::Arc;

use super::QueueDir;
use crate::store::Storage;
use crate::task::Task;

/// What a [`TaskSink`] did with a valid task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stored {
    /// Newly written to this daemon's queue: the daemon runs it (the intake report's
    /// `accepted`).
    Accepted,
    /// Newly submitted to a shared queue, which every daemon claims from (the report's
    /// `submitted`).
    Submitted,
    /// The same task is stored already (a crash between storing it and removing its claim, or
    /// the same file dropped into two hosts' inboxes): nothing more to do.
    Same,
    /// Another task has this id, `where` it is: the file is rejected.
    IdTaken { place: String },
}

/// The last step of intake: store a claimed, validated task exactly once per id.
pub trait TaskSink: Send + Sync + fmt::Debug {
    /// Store `task` (its id set; `normalized` is its definition's bytes) unless a task with
    /// its id exists. `recovering` is true for a claim an earlier daemon left, whose task may
    /// have been stored before the crash. Durable when it returns `Accepted` or `Submitted`;
    /// an error is a problem of the queue itself (the file then goes back to the inbox).
    fn store(&self, task: &Task, normalized: &[u8], recovering: bool) -> io::Result<Stored>;

    /// Whether a claim must be durable before [`store`](TaskSink::store) is called. A shared
    /// queue stores the task elsewhere than the claim, so a claim undone by a power loss
    /// would bring the file back to be taken (and given an id) again. The file queue needs
    /// none: its claims and the tasks it writes share `tasks/`, made durable by one fsync.
    fn wants_durable_claims(&self) -> bool {
        false
    }
}

/// The file queue's sink: `tasks/<id>.json`, refused when the id has a definition or a record.
#[derive(Debug)]
pub struct FileSink {
    storage: Arc<dyn Storage>,
}

impl FileSink {
    pub fn new(storage: Arc<dyn Storage>) -> FileSink {
        FileSink { storage }
    }
}

impl TaskSink for FileSink {
    fn store(&self, task: &Task, normalized: &[u8], recovering: bool) -> io::Result<Stored> {
        let id = task.id();
        let task_key = QueueDir::task_key(id);
        let existing = self.storage.get(&task_key)?;
        if recovering && existing.as_deref() == Some(normalized) {
            return Ok(Stored::Same);
        }
        let exists = existing.is_some()
            || self.storage.get(&QueueDir::done_key(id))?.is_some()
            || self.storage.get(&QueueDir::failed_key(id))?.is_some();
        if exists {
            return Ok(Stored::IdTaken {
                place: "this queue".to_string(),
            });
        }
        if let Err(e) = self.storage.put(&task_key, normalized, None) {
            // The task did not exist before; if the write got as far as the rename, undo it so
            // that taking the file again later does not find a "duplicate".
            let _ = self.storage.remove(&task_key);
            return Err(e);
        }
        Ok(Stored::Accepted)
    }
}
