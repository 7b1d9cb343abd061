//! The file backend: a queue directory owned through its `flock` (see `queue/README.md` for the
//! layout). Every write goes through [`Storage`] (temp file, fsync, rename, directory fsync),
//! as before the owner existed; the owner adds the lease check in front of each.

use std::collections::HashSet;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use serde_json::Value;

use super::backend::{ControlClaim, LoadError, QueueBackend, QueueError, TaskRecord};
use super::control::{self, ControlRequest};
use super::lease::{Lease, OwnerLease};
use super::{Intake, IntakeReport, QueueDir, QueueHint, QueueLock};
use crate::store::current_work::{ActiveTask, CurrentWork, StartPoint};
use crate::store::events::Event;
use crate::store::journal::JournalWriter;
use crate::store::records::{to_record_bytes, FailedRecord};
use crate::store::work_log::{WorkLog, WorkWriteError};
use crate::store::{
    CheckpointStore, IterationCheckpoint, LoadedCheckpoint, SavedCheckpoint, Storage, StoreError,
    WriteFence,
};
use crate::task::{PhaseKind, Task};
use crate::task_id::TaskId;

/// The file backend's one epoch: the `flock` is held for the owner's whole life, so no other
/// writer can ever claim a task of this queue meanwhile.
const FLOCK_EPOCH: u64 = 1;

/// A queue directory owned by this process (its lock is held while this lives).
#[derive(Debug)]
pub struct FileBackend {
    dir: QueueDir,
    storage: Arc<dyn Storage>,
    checkpoints: CheckpointStore,
    owner: OwnerLease,
    intake: Mutex<Intake>,
    /// Control entries already logged as impossible to take or remove, so that one bad entry
    /// costs one log line, not one a round.
    control_reported: Mutex<HashSet<String>>,
    journal: JournalWriter,
    /// The work state's one writer (`current_work.json` and its log).
    work: WorkLog,
    /// Dropped last: the lock outlives every write above.
    _lock: QueueLock,
}

/// The checkpoint store with the queue's blob store for the files checkpoints name; without
/// one (its directory cannot be made), a checkpoint naming files is refused, saying why.
fn with_blobs(store: CheckpointStore, root: &std::path::Path) -> CheckpointStore {
    match crate::store::blobs::BlobStore::open(root) {
        Ok(blobs) => store.with_blobs(Arc::new(blobs)),
        Err(err) => {
            tracing::warn!(error = %err, "the queue's blob store cannot be opened; checkpoints naming files are refused");
            store
        }
    }
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl FileBackend {
    /// Own the queue at `dir` (absolute), holding `lock`, writing through `storage`.
    pub(crate) fn new(dir: QueueDir, lock: QueueLock, storage: Arc<dyn Storage>) -> FileBackend {
        FileBackend {
            checkpoints: with_blobs(
                CheckpointStore::with_storage(Arc::clone(&storage)),
                dir.root(),
            ),
            owner: OwnerLease::new(FLOCK_EPOCH),
            intake: Mutex::new(Intake::new(dir.clone(), Arc::clone(&storage))),
            control_reported: Mutex::default(),
            journal: JournalWriter::start(dir.root()),
            work: WorkLog::new(Arc::clone(&storage)),
            storage,
            dir,
            _lock: lock,
        }
    }

    /// Refuse a write under `lease` unless it is this owner's and the owner still holds.
    fn fence(&self, lease: &Lease) -> Result<(), QueueError> {
        Ok(self.owner.check(lease)?)
    }

    fn put(&self, key: &str, bytes: &[u8]) -> Result<(), QueueError> {
        self.storage
            .put(key, bytes, None)
            .map_err(|source| QueueError::Io {
                action: "writing",
                what: key.to_string(),
                source,
            })
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, QueueError> {
        self.storage.get(key).map_err(|source| QueueError::Io {
            action: "reading",
            what: key.to_string(),
            source,
        })
    }

    /// The JSON object at `key`, or `None` when there is none; `unreadable` says what is wrong
    /// with bytes that do not parse.
    fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        key: &str,
        unreadable: impl FnOnce(serde_json::Error) -> QueueError,
    ) -> Result<Option<T>, QueueError> {
        let Some(bytes) = self.get(key)? else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes).map(Some).map_err(unreadable)
    }

    fn list(&self, dir: &str) -> Result<Vec<String>, QueueError> {
        self.storage.list(dir).map_err(|source| QueueError::Io {
            action: "listing",
            what: format!("{dir}/"),
            source,
        })
    }
}

impl QueueBackend for FileBackend {
    fn owner(&self) -> &OwnerLease {
        &self.owner
    }

    fn claim(&self, task_id: &str) -> Result<Lease, QueueError> {
        let lease = self.owner.lease(task_id, FLOCK_EPOCH);
        self.fence(&lease)?;
        Ok(lease)
    }

    fn renew(&self, lease: &Lease) -> Result<(), QueueError> {
        self.fence(lease)
    }

    fn release(&self) {
        self.owner.release();
    }

    fn clean_after_crash(&self) -> io::Result<Vec<String>> {
        self.storage.remove_temp_files()
    }

    fn load_work(&self) -> Result<CurrentWork, LoadError> {
        Ok(self.work.load()?)
    }

    fn recover_intake(&self) -> IntakeReport {
        locked(&self.intake).recover_claims()
    }

    fn scan_intake(&self, hints: Vec<QueueHint>, limit: usize) -> IntakeReport {
        let mut intake = locked(&self.intake);
        for hint in hints {
            match hint {
                QueueHint::InboxComplete(name) => intake.hint_complete(name),
                QueueHint::InboxWriting(name) => intake.hint_writing(name),
                QueueHint::InboxChanged | QueueHint::Control => {}
            }
        }
        let report = intake.scan_batch(limit);
        drop(intake);
        // One listing of `incremental/` for the whole batch, so that the first saves of
        // thousands of new tasks do not list it each (quadratic), and only for tasks with a
        // phase that checkpoints (a queue of `once` tasks never lists it). A failure only
        // costs that saving: the first saves then list as they would have.
        let checkpointing: Vec<&str> = report
            .accepted
            .iter()
            .filter(|task| task.phases.iter().any(|p| p.kind != PhaseKind::Once))
            .map(|task| task.id().as_str())
            .collect();
        if checkpointing.is_empty() {
            return report;
        }
        if let Err(err) = self.checkpoints.learn_generations_on_disk(checkpointing) {
            tracing::warn!(error = %err, "could not list the checkpoints of newly taken tasks; their first saves list them");
        }
        report
    }

    fn set_admission(&self, admission: Arc<crate::limits::Admission>) {
        locked(&self.intake).set_admission(admission);
    }

    fn waiting_in_intake(&self, task_id: &str) -> bool {
        // The name `cairn submit` uses; a stat neither follows into nor opens what is there.
        self.dir
            .inbox()
            .join(format!("{task_id}.json"))
            .symlink_metadata()
            .is_ok()
    }

    fn task(&self, task_id: &str) -> Result<Task, QueueError> {
        let key = QueueDir::task_key(task_id);
        let bytes = self
            .get(&key)?
            .ok_or_else(|| QueueError::MissingDefinition { what: key.clone() })?;
        let mut task = Task::parse_stored(&bytes).map_err(|e| QueueError::Unreadable {
            what: key,
            problem: e.to_string(),
        })?;
        // The id names the file just read, so it is one; a name that is not is refused.
        task.id = Some(TaskId::parse(task_id).map_err(|e| QueueError::Unreadable {
            what: QueueDir::task_key(task_id),
            problem: format!("task id {e}"),
        })?);
        Ok(task)
    }

    fn accepted_ids(&self) -> Result<Vec<String>, QueueError> {
        let names = self.list(QueueDir::TASKS_DIR)?;
        Ok(names
            .iter()
            .filter_map(|name| name.strip_suffix(".json"))
            .map(str::to_string)
            .collect())
    }

    fn accepted_at(&self, task_id: &str) -> Option<SystemTime> {
        std::fs::metadata(self.dir.root().join(QueueDir::task_key(task_id)))
            .and_then(|m| m.modified())
            .ok()
    }

    fn finished_ids(&self) -> Result<HashSet<String>, QueueError> {
        let mut ids = HashSet::new();
        for dir in [QueueDir::DONE_DIR, QueueDir::FAILED_DIR] {
            for name in self.list(dir)? {
                if let Some(id) = name.strip_suffix(".json") {
                    ids.insert(id.to_string());
                }
            }
        }
        Ok(ids)
    }

    fn has_record(&self, task_id: &str) -> Result<bool, QueueError> {
        Ok(self.get(&QueueDir::done_key(task_id))?.is_some()
            || self.get(&QueueDir::failed_key(task_id))?.is_some())
    }

    fn failed_record(&self, task_id: &str) -> Result<Option<FailedRecord>, QueueError> {
        let key = QueueDir::failed_key(task_id);
        self.get_json(&key, |e| QueueError::Unreadable {
            what: key.clone(),
            problem: format!("not a task record: {e}"),
        })
    }

    fn start_point(&self, task_id: &str) -> Result<Option<StartPoint>, QueueError> {
        let key = StartPoint::key(task_id);
        self.get_json(&key, |e| QueueError::Unreadable {
            what: key.clone(),
            problem: e.to_string(),
        })
    }

    fn read_output(&self, reference: &str) -> Result<Option<Value>, QueueError> {
        self.get_json(reference, |e| QueueError::Unreadable {
            what: format!("reading {reference}"),
            problem: e.to_string(),
        })
    }

    fn checkpoint_files(&self) -> Option<&CheckpointStore> {
        Some(&self.checkpoints)
    }

    fn latest_checkpoint(&self, task_id: &str) -> Result<Option<LoadedCheckpoint>, QueueError> {
        Ok(self.checkpoints.latest(task_id)?)
    }

    fn write_work_entries(
        &self,
        owner: &OwnerLease,
        changed: &[ActiveTask],
        removed: &[TaskId],
    ) -> Result<(), QueueError> {
        if !self.owner.holds(owner) {
            return Err(QueueError::NotOwner {
                what: QueueDir::CURRENT_WORK_KEY.to_string(),
            });
        }
        self.work.write(changed, removed).map_err(|e| match e {
            WorkWriteError::Io { key, source } => QueueError::Io {
                action: "writing",
                what: key.to_string(),
                source,
            },
            encode @ WorkWriteError::Encode { .. } => QueueError::Unreadable {
                what: QueueDir::CURRENT_WORK_KEY.to_string(),
                problem: encode.to_string(),
            },
        })
    }

    fn put_output(
        &self,
        lease: &Lease,
        phase_index: usize,
        bytes: &[u8],
    ) -> Result<String, QueueError> {
        self.fence(lease)?;
        let key = QueueDir::phase_output_key(lease.task_id(), phase_index);
        self.put(&key, bytes)?;
        Ok(key)
    }

    fn finish(&self, lease: &Lease, record: &TaskRecord) -> Result<(), QueueError> {
        self.fence(lease)?;
        let (key, bytes) = match record {
            TaskRecord::Done(done) => (QueueDir::done_key(lease.task_id()), to_record_bytes(done)),
            TaskRecord::Failed(failed) => (
                QueueDir::failed_key(lease.task_id()),
                to_record_bytes(failed),
            ),
        };
        self.put(&key, &bytes)
    }

    fn archive_failed(&self, lease: &Lease, record: &FailedRecord) -> Result<(), QueueError> {
        self.fence(lease)?;
        let id = lease.task_id();
        let from = self.dir.root().join(QueueDir::failed_key(id));
        let to = self.dir.run_dir(id).join(format!(
            "failed-{}.json",
            record.failed_at.format("%Y%m%dT%H%M%S%.3fZ")
        ));
        let moved = crate::store::modes::create_dir_all(&self.dir.run_dir(id))
            .and_then(|()| std::fs::rename(&from, &to));
        moved.map_err(|source| QueueError::Io {
            action: "archiving",
            what: from.display().to_string(),
            source,
        })
    }

    fn save_checkpoint(
        &self,
        lease: &Lease,
        checkpoint: &mut IterationCheckpoint<&serde_json::value::RawValue>,
    ) -> Result<SavedCheckpoint, QueueError> {
        self.fence(lease)?;
        Ok(self.checkpoints.save_with_info(checkpoint)?)
    }

    fn checkpoint_fence(&self, lease: &Lease) -> Result<Arc<dyn WriteFence>, QueueError> {
        self.fence(lease)?;
        Ok(Arc::new(LeaseFence {
            owner: self.owner.clone(),
            lease: lease.clone(),
        }))
    }

    fn take_control(&self) -> Result<Vec<(ControlClaim, ControlRequest)>, QueueError> {
        let mut reported = locked(&self.control_reported);
        let requests =
            control::take(&self.dir, &mut reported).map_err(|source| QueueError::Io {
                action: "reading",
                what: "control requests".to_string(),
                source,
            })?;
        Ok(requests
            .into_iter()
            .map(|(key, request)| (ControlClaim(key), request))
            .collect())
    }

    fn remove_control(&self, owner: &OwnerLease, claim: &ControlClaim) -> Result<(), QueueError> {
        if !self.owner.holds(owner) {
            return Err(QueueError::NotOwner {
                what: claim.to_string(),
            });
        }
        self.storage
            .remove(&claim.0)
            .map_err(|source| QueueError::Io {
                action: "removing",
                what: claim.to_string(),
                source,
            })
    }

    fn append_event(&self, task_id: &str, event: Event) {
        self.journal.append(task_id, event);
    }

    fn flush_events(&self) {
        self.journal.flush();
    }
}

/// The checkpoint fence of one task's phase: the owner still holds and the lease is its.
#[derive(Debug)]
struct LeaseFence {
    owner: OwnerLease,
    lease: Lease,
}

impl WriteFence for LeaseFence {
    fn check(&self) -> Result<(), StoreError> {
        self.owner
            .check(&self.lease)
            .map_err(|lost| StoreError::Fenced {
                task_id: lost.task_id.clone(),
                reason: lost.to_string(),
            })
    }
}
