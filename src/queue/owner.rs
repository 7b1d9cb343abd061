//! [`Queue`]: the one owner of a queue, at the level of what the daemon does. Submissions are
//! taken in, tasks claimed (a [`Lease`] each), their checkpoints, phase state, outputs and
//! records written under that lease, control requests taken and events appended, all through
//! one [`QueueBackend`]. Nothing outside this module names a queue file or builds a key.
//!
//! A `Queue` derefs to its backend for the operations it passes on unchanged; the ones that
//! need the owner's lease or the local directory are its own.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::mpsc::UnboundedReceiver;

use super::backend::{ControlClaim, QueueBackend, QueueError};
use super::file_backend::FileBackend;
use super::lease::Lease;
use super::{LockError, QueueDir, QueueHint, QueueLock, QueueWatcher};
use crate::store::current_work::ActiveTask;
use crate::store::{
    CheckpointSink, CheckpointStore, CommitPath, FileStorage, IterationCheckpoint,
    LoadedCheckpoint, LoopCheckpointer, SavedCheckpoint, Storage, StoreError,
};
use crate::task_id::TaskId;

/// Why a queue could not be opened for owning.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Another daemon owns it.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// Its directories could not be made or found.
    #[error("{0}")]
    Setup(String),
    /// Someone other than the owner's user could write it (see `queue::permissions`).
    #[error("refusing to run this queue: {0}")]
    Unsafe(#[from] super::UnsafeQueue),
    /// The shared queue's database could not be opened (unreachable, refused, or this node's
    /// name is held by another live daemon).
    #[error("{0}")]
    Database(String),
}

/// Where a person finds the final records, for messages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecordLocations {
    /// A done task's record, with `<id>` for its id.
    pub done: String,
    /// The directory of failed tasks' and rejected files' records.
    pub failed: String,
}

impl RecordLocations {
    /// The records of the queue directory at `root`.
    pub fn of_queue_dir(root: &Path) -> RecordLocations {
        RecordLocations {
            done: format!("{}/<id>.json", root.join(QueueDir::DONE_DIR).display()),
            failed: format!("{}/", root.join(QueueDir::FAILED_DIR).display()),
        }
    }
}

/// The owner of one queue: a backend, and the local directory that holds the commands'
/// logs, scratch files and helpers. Cheap to clone (clones share the backend).
#[derive(Debug, Clone)]
pub struct Queue {
    backend: Arc<dyn QueueBackend>,
    /// This host's directory (absolute).
    local: QueueDir,
    /// The lock on this host's directory when the backend does not hold it (a database):
    /// one daemon per local directory.
    _local_lock: Option<Arc<QueueLock>>,
}

impl Queue {
    /// The backend itself, for what the owner adds nothing to: calls through it are the
    /// backend's alone (no owner's check), and read so at the call site.
    pub fn backend(&self) -> &dyn QueueBackend {
        self.backend.as_ref()
    }

    /// Own the queue directory at `root`: create its directories, take its lock (held while
    /// the returned queue lives) and check that nobody else may write it. `storage` replaces
    /// the file storage (tests pass a fault-injecting one).
    pub fn open_files(root: &Path, storage: Option<Arc<dyn Storage>>) -> Result<Queue, OpenError> {
        let root = std::path::absolute(root)
            .map_err(|e| OpenError::Setup(format!("queue {}: {e}", root.display())))?;
        let dir = QueueDir::new(&root);
        dir.create_all()
            .map_err(|e| OpenError::Setup(e.to_string()))?;
        let lock = QueueLock::acquire(&dir)?;
        super::check_queue_permissions(&dir).map_err(OpenError::Unsafe)?;
        let storage = match storage {
            Some(storage) => storage,
            None => Arc::new(commit_path_storage(&root)?),
        };
        Ok(Queue {
            backend: Arc::new(FileBackend::new(dir.clone(), lock, storage)),
            local: dir,
            _local_lock: None,
        })
    }

    /// Own a share of the queue in the PostgreSQL database at `url`, as node `node` with
    /// leases of `lease`, with `root` as this host's directory (its inbox, logs and scratch;
    /// locked, one daemon each). Blocking: call it off the async thread. A node name still
    /// held by a live daemon is waited for up to one lease (a restarted daemon finds its
    /// earlier process's registration until that expires), then refused.
    #[cfg(feature = "postgres")]
    pub fn open_postgres(
        root: &Path,
        url: &str,
        node: &str,
        lease: std::time::Duration,
        vouch_for_submitters: bool,
    ) -> Result<Queue, OpenError> {
        use super::postgres::{PgBackend, PgError};
        let root = std::path::absolute(root)
            .map_err(|e| OpenError::Setup(format!("queue {}: {e}", root.display())))?;
        let dir = QueueDir::new(&root);
        dir.create_all()
            .map_err(|e| OpenError::Setup(e.to_string()))?;
        let lock = QueueLock::acquire(&dir)?;
        super::check_queue_permissions(&dir).map_err(OpenError::Unsafe)?;
        let give_up = std::time::Instant::now() + lease + std::time::Duration::from_secs(2);
        let backend = loop {
            match PgBackend::open(url, node, lease) {
                Ok(backend) => break backend.with_inbox(dir.clone()),
                Err(PgError::NodeNameInUse { .. }) if std::time::Instant::now() < give_up => {
                    tracing::info!(node, "the node name is held by a daemon seen within the lease; waiting for it to lapse");
                    std::thread::sleep(std::time::Duration::from_secs(1));
                }
                Err(e) => return Err(OpenError::Database(e.to_string())),
            }
        };
        let backend = if vouch_for_submitters {
            backend
                .vouching_for_submitters()
                .map_err(|e| OpenError::Database(e.to_string()))?
        } else {
            backend
        };
        Ok(Queue {
            backend: Arc::new(backend),
            local: dir,
            _local_lock: Some(Arc::new(lock)),
        })
    }

    /// An owner on any backend, with `local` as this host's directory.
    pub fn with_backend(backend: Arc<dyn QueueBackend>, local: QueueDir) -> Queue {
        Queue {
            backend,
            local,
            _local_lock: None,
        }
    }

    /// This host's queue directory (commands run in it by default).
    pub fn root(&self) -> &Path {
        self.local.root()
    }

    /// A task's directory of logs and scratch files (it may not exist yet).
    pub fn run_dir(&self, task_id: &str) -> PathBuf {
        self.local.run_dir(task_id)
    }

    /// The directory holding every task's [`run_dir`](Queue::run_dir).
    pub fn runs_dir(&self) -> PathBuf {
        self.local.runs()
    }

    /// Create a task's run directory if it is missing; returns it. Blocking.
    pub fn create_run_dir(&self, task_id: &str) -> io::Result<PathBuf> {
        let dir = self.run_dir(task_id);
        crate::store::modes::create_dir_all(&dir)
            .map_err(|e| io::Error::new(e.kind(), format!("creating {}: {e}", dir.display())))?;
        Ok(dir)
    }

    /// Watch for submissions and control requests.
    pub fn watch(&self) -> notify::Result<(QueueWatcher, UnboundedReceiver<QueueHint>)> {
        QueueWatcher::start(&self.local.inbox(), &self.local.control())
    }

    /// Where a person finds the final records.
    pub fn record_locations(&self) -> RecordLocations {
        if self.backend.shares_queue() {
            let table = "the shared queue's cairn_records (cairn show --db URL <id>)".to_string();
            return RecordLocations {
                done: table.clone(),
                failed: table,
            };
        }
        RecordLocations::of_queue_dir(self.root())
    }

    /// The name of the work state, for messages (the file to move aside).
    /// Publish the limits this daemon runs with in this host's directory, for `cairn status`
    /// (see [`QueueDir::LIMITS_KEY`]). Crash-safe like every write; blocking.
    pub fn publish_limits(&self, limits: &crate::limits::PublishedLimits) -> std::io::Result<()> {
        let mut bytes = serde_json::to_vec_pretty(limits).map_err(std::io::Error::other)?;
        bytes.push(b'\n');
        FileStorage::new(self.local.root()).put(QueueDir::LIMITS_KEY, &bytes, None)
    }

    pub fn work_state_name(&self) -> String {
        format!(
            "{} (and {} beside it)",
            self.local.display_key(QueueDir::CURRENT_WORK_KEY),
            QueueDir::WORK_LOG_KEY
        )
    }

    /// Durably write the work state's entries that changed, and drop those that left, as this
    /// queue's owner.
    pub fn write_work_state(
        &self,
        changed: &[ActiveTask],
        removed: &[TaskId],
    ) -> Result<(), QueueError> {
        self.backend
            .write_work_entries(self.backend.owner(), changed, removed)
    }

    /// Remove a control request once applied, as this queue's owner.
    pub fn remove_control_claim(&self, claim: &ControlClaim) -> Result<(), QueueError> {
        self.backend.remove_control(self.backend.owner(), claim)
    }

    /// A checkpointer for one phase of the task `lease` is on, fenced by it: each save is
    /// refused (and writes nothing) once the lease no longer holds.
    pub fn checkpointer(&self, lease: &Lease, scope: &str) -> Result<LoopCheckpointer, QueueError> {
        let fence = self.backend.checkpoint_fence(lease)?;
        let checkpointer = match self.backend.checkpoint_files() {
            Some(store) => LoopCheckpointer::new(store.clone(), lease.task_id(), scope),
            None => {
                let sink = Arc::new(LeaseSink {
                    backend: Arc::clone(&self.backend),
                    lease: lease.clone(),
                });
                LoopCheckpointer::with_sink(sink, lease.task_id(), scope)
            }
        };
        Ok(checkpointer.fenced(fence))
    }

    /// Learn the checkpoint generations of the tasks in flight in one read (at start), so that
    /// their first saves need not list them one by one.
    pub fn learn_generations<'a>(
        &self,
        task_ids: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), QueueError> {
        // A backend without checkpoint files learns a task's generation when it claims it.
        match self.backend.checkpoint_files() {
            Some(store) => Ok(store.learn_generations_on_disk(task_ids)?),
            None => Ok(()),
        }
    }
}

/// The checkpoints of a backend without checkpoint files: each saved through the backend under
/// the task's lease (a database checks it in the save's own statement).
#[derive(Debug)]
struct LeaseSink {
    backend: Arc<dyn QueueBackend>,
    lease: Lease,
}

impl LeaseSink {
    fn store_error(&self, error: QueueError) -> StoreError {
        match error {
            QueueError::Checkpoint(error) => error,
            QueueError::LeaseLost(lost) => StoreError::Fenced {
                task_id: lost.task_id.clone(),
                reason: lost.to_string(),
            },
            other => StoreError::Sink {
                what: format!("the checkpoint of task {}", self.lease.task_id()),
                source: Box::new(other),
            },
        }
    }
}

impl CheckpointSink for LeaseSink {
    fn latest(&self, task_id: &str) -> Result<Option<LoadedCheckpoint>, StoreError> {
        self.backend
            .latest_checkpoint(task_id)
            .map_err(|e| self.store_error(e))
    }

    fn save(
        &self,
        checkpoint: &mut IterationCheckpoint<&serde_json::value::RawValue>,
    ) -> Result<SavedCheckpoint, StoreError> {
        self.backend
            .save_checkpoint(&self.lease, checkpoint)
            .map_err(|e| self.store_error(e))
    }
}

#[cfg(test)]
#[path = "owner_tests.rs"]
mod tests;

/// The file storage of the queue at `root`, its checkpoints committed by the path
/// `CAIRN_COMMIT_PATH` chooses (the commit log by default). Opening it replays what a previous
/// daemon left in the log, before anything resumes; the queue's lock is held by then.
fn commit_path_storage(root: &Path) -> Result<FileStorage, OpenError> {
    let setup = |err: io::Error| OpenError::Setup(format!("queue {}: {err}", root.display()));
    let path = CommitPath::from_env().map_err(setup)?;
    let storage = FileStorage::new(root);
    storage.create_dir(CheckpointStore::DIR).map_err(setup)?;
    storage
        .with_commit_path(CheckpointStore::DIR, path)
        .map_err(|err| {
            OpenError::Setup(format!(
                "queue {}: opening the commit log of {}: {err}",
                root.display(),
                CheckpointStore::DIR
            ))
        })
}
