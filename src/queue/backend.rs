//! The backend seam of the queue's owner: what a backend (files today, PostgreSQL next) must do,
//! and the atomicity and fencing each operation promises.
//!
//! The daemon never calls a backend directly: it goes through [`Queue`](super::Queue), which
//! adds the local directory (logs, scratch) and the async hand-off. Every operation is
//! blocking: callers run it on the blocking pool, as the file work always was.
//!
//! # Fencing
//!
//! A backend gives an [`OwnerLease`] when it is opened (the file backend: the queue's `flock`
//! taken) and a [`Lease`] for each task it lets the owner [`claim`](QueueBackend::claim).
//! Every write *for a task* takes that task's lease and must write nothing unless the lease is
//! still current, checked **in the same atomic step as the write**:
//! - files: the `flock` makes this owner the queue's only writer for its whole life, so the
//!   epoch never changes and a check before the write is enough; a lease given by another
//!   owner (another queue, an earlier open) or after [`release`](QueueBackend::release) is
//!   refused with [`LeaseLost`];
//! - a database: a claim bumps the task's epoch, and each write is one statement whose
//!   `WHERE` clause (or a `SELECT ... FOR UPDATE` in its transaction) matches
//!   `task_id = $1 AND lease_epoch = $2 AND lease_owner = $3`; zero rows affected is
//!   [`QueueError::LeaseLost`], with nothing written.
//!
//! Writes that are not for one task (the work state's entries on files, removing a handled control
//! request) take the [`OwnerLease`] and are refused once it was released.
//!
//! # Shapes both backends honour
//!
//! - Checkpoints are saved and read through the backend
//!   ([`save_checkpoint`](QueueBackend::save_checkpoint),
//!   [`latest_checkpoint`](QueueBackend::latest_checkpoint)); the file store is exposed only
//!   by a backend that has one ([`checkpoint_files`](QueueBackend::checkpoint_files)), where
//!   the owner's loop checkpointers write it directly as before.
//! - The work state is handed over as the entries that changed and the ids that left, never
//!   whole; files append them to a log, a database writes one row per task, each fenced by
//!   that task's lease (see [`write_work_entries`](QueueBackend::write_work_entries)).

use std::collections::HashSet;
use std::fmt;
use std::io;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::Value;

use super::control::ControlRequest;
use super::lease::{Lease, LeaseLost, OwnerLease};
use super::{IntakeReport, QueueHint};
use crate::store::current_work::{ActiveTask, CurrentWork, StartPoint, CURRENT_WORK_VERSION};
use crate::store::events::Event;
use crate::store::records::{DoneRecord, FailedRecord};
use crate::store::work_log::WorkLogError;
use crate::store::{
    CheckpointStore, IterationCheckpoint, LoadedCheckpoint, SavedCheckpoint, StoreError, WriteFence,
};
use crate::task::Task;
use crate::task_id::TaskId;

/// Why a queue operation failed.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The write's lease no longer holds: nothing was written.
    #[error(transparent)]
    LeaseLost(#[from] LeaseLost),
    /// The owner's lease on the queue was released: nothing was written.
    #[error("the queue is no longer owned by this daemon: {what} was not written")]
    NotOwner { what: String },
    /// The backend failed; `what` names the object (a file, a row).
    #[error("{action} {what}: {source}")]
    Io {
        action: &'static str,
        what: String,
        #[source]
        source: io::Error,
    },
    /// The object exists but cannot be used.
    #[error("{what}: {problem}")]
    Unreadable { what: String, problem: String },
    /// A task's definition is missing.
    #[error("its definition {what} is missing")]
    MissingDefinition { what: String },
    /// A checkpoint operation failed.
    #[error(transparent)]
    Checkpoint(#[from] StoreError),
    /// The backend's store (a database) failed; `what` says what was being done.
    #[error("{what}: {source}")]
    Backend {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// This backend does not do this operation yet.
    #[error("{operation} is not supported by the {backend} backend yet")]
    Unsupported {
        operation: &'static str,
        backend: &'static str,
    },
}

/// Why the work state could not be read at start.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("reading {key}: {source}")]
    Io { key: String, source: io::Error },
    #[error("{key} is not a valid current_work file: {source}")]
    Corrupt {
        key: String,
        source: serde_json::Error,
    },
    #[error("{key} has version {found}; this cairn reads version {CURRENT_WORK_VERSION}")]
    Version { key: String, found: u32 },
}

impl From<WorkLogError> for LoadError {
    fn from(error: WorkLogError) -> Self {
        match error {
            WorkLogError::Io { key, source } => LoadError::Io { key, source },
            WorkLogError::Corrupt { key, source } => LoadError::Corrupt { key, source },
            WorkLogError::CorruptLine { key, line, source } => LoadError::Corrupt {
                key: format!("{key} line {line}"),
                source,
            },
            WorkLogError::Version { key, found } => LoadError::Version { key, found },
        }
    }
}

/// A task's final record.
#[derive(Debug, Clone)]
pub enum TaskRecord {
    Done(DoneRecord),
    Failed(FailedRecord),
}

/// A control request the owner claimed and has yet to apply; [`QueueBackend::remove_control`]
/// removes it once applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlClaim(pub(crate) String);

impl fmt::Display for ControlClaim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A task that a shared queue handed to this owner ([`QueueBackend::claim_work`]), leased.
#[derive(Debug)]
pub struct ClaimedWork {
    pub task: Task,
    pub lease: Lease,
    /// Where the task stood when its last holder let it go or died (`None`: it starts anew).
    pub entry: Option<ActiveTask>,
    /// The task's holders died this many times in a row while it ran alone on them: record
    /// it failed instead of running it (quarantine).
    pub quarantine: Option<u32>,
    /// A crash suspect, claimed to be tried alone: nothing starts or is claimed beside it
    /// until it makes progress or its attempt ends.
    pub on_trial: bool,
    /// Why the task moved to this owner, when it was taken over from an expired lease.
    pub taken_over: Option<TakeOver>,
}

/// A task taken over from another holder's expired lease, and how that expiry was judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TakeOver {
    /// The node whose lease expired (it died, froze, or lost the database).
    pub from_node: String,
    /// The epoch of that lease.
    pub from_epoch: i64,
    /// `cleared` (it made progress under that lease), `suspect` (it was in flight with
    /// others and is tried alone), or `crash` (in flight alone without progress: counted).
    pub verdict: &'static str,
    /// The task's count of such crashes in a row, and its limit.
    pub crashes: u32,
    pub limit: u32,
}

/// How a task leaves this owner without a final record ([`QueueBackend::hand_back`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandBack {
    /// An operator paused it: nobody runs it until it is resumed.
    Paused,
    /// A failed attempt waits for its backoff: any owner may claim it once `after` has passed.
    RetryAfter(Duration),
}

/// The end of a lease kept free: the commands of a task whose lease was not confirmed are
/// stopped this long before it could expire, and a write is not tried again past it. One
/// renewal period (a sixth of the lease), judged at that moment, not at the next tick.
pub fn lease_stop_margin(lease: Duration) -> Duration {
    renewal_period(lease)
}

/// How often a daemon renews its leases: a sixth of the lease (at least 100 ms).
pub fn renewal_period(lease: Duration) -> Duration {
    (lease / 6).max(Duration::from_millis(100))
}

/// The operations of one queue backend. See the module docs for the fencing contract; each
/// method's docs give its atomicity.
pub trait QueueBackend: Send + Sync + fmt::Debug {
    // ---- Ownership ----

    /// The ownership this backend was opened with.
    fn owner(&self) -> &OwnerLease;

    /// Claim `task_id` to run it: its lease. Files: always this owner's, epoch constant.
    /// A database: `UPDATE ... SET lease_epoch = lease_epoch + 1, lease_owner = $me,
    /// lease_expires = now() + $lease WHERE task_id = $1 AND (lease_owner = $me OR
    /// lease_expires < now())` (expiry by the database's clock), returning the new epoch;
    /// a task leased by a live other owner is [`QueueError::LeaseLost`].
    fn claim(&self, task_id: &str) -> Result<Lease, QueueError>;

    /// Extend `lease` (a database: one statement for all of an owner's leases, every lease/6).
    /// `Err(LeaseLost)` means another owner may run the task now: stop its commands.
    fn renew(&self, lease: &Lease) -> Result<(), QueueError>;

    /// Whether other owners (daemons on other hosts) share this queue: tasks then come from
    /// [`claim_work`](QueueBackend::claim_work), leases must be renewed, and a task paused or
    /// waiting for a retry is handed back rather than kept. Files: false.
    fn shares_queue(&self) -> bool {
        false
    }

    /// This owner's name among those sharing the queue (commands get it as `CAIRN_NODE`).
    fn node(&self) -> Option<&str> {
        None
    }

    /// How long a lease holds without renewal, for a backend whose leases expire.
    fn lease_length(&self) -> Option<Duration> {
        None
    }

    /// Claim up to `limit` tasks that wait in a shared queue (expired leases first, then by
    /// priority and age), each with its lease and where it stood. While crash suspects wait,
    /// an owner that holds nothing (`idle`) claims one of them to try alone and the others
    /// claim nothing. Files: none (tasks come from intake and the work state).
    fn claim_work(&self, _limit: usize, _idle: bool) -> Result<Vec<ClaimedWork>, QueueError> {
        Ok(Vec::new())
    }

    /// Wake-ups when work may have arrived in a shared queue (a submission, a release, a
    /// resume), so that free slots claim it at once rather than at their next poll. Files:
    /// none (their watcher says it).
    fn work_notices(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<()>> {
        None
    }

    /// Whether no task of a shared queue waits or runs anywhere (paused ones aside): a daemon
    /// asked to exit when idle exits only then. Files: true (their own lines say it).
    fn drained(&self) -> Result<bool, QueueError> {
        Ok(true)
    }

    /// Renew every lease this owner holds, in one step; returns the tasks whose lease could
    /// not be renewed (another owner may run them now: stop their commands). An `Err` says
    /// nothing was learned (the database unreachable): the caller judges from the last
    /// successful renewal how long the leases still hold.
    fn renew_leases(&self) -> Result<Vec<String>, QueueError> {
        Ok(Vec::new())
    }

    /// Until when (local time) each lease this owner renews surely holds: the sending of
    /// its claim or of its last renewal that was answered, plus the lease. The commands of a
    /// task must be stopped before its deadline passes. Files: none (their lease is the lock).
    fn lease_deadlines(&self) -> Vec<(String, std::time::Instant)> {
        Vec::new()
    }

    /// Fires when a renewal should go out now rather than at its period: a claim just gave
    /// leases that only their claim's sending holds. Files: none.
    fn renewal_wanted(&self) -> Option<Arc<tokio::sync::Notify>> {
        None
    }

    /// The tasks whose lease this owner renews, for the scheduler to let go of those it does
    /// not run ([`let_go`](QueueBackend::let_go)). Files: none.
    fn renewed_tasks(&self) -> Vec<String> {
        Vec::new()
    }

    /// Stop renewing `task_id`'s lease: this owner no longer runs the task. The backend still
    /// hands it back when it can (without a crash counted) while the lease holds; otherwise the
    /// lease expires and another owner takes the task. Never blocks. Files: nothing to do.
    fn let_go(&self, _task_id: &str) {}

    /// How the database's round trip compares with the lease, as last measured: a warning
    /// to show (log and status) when it eats a large share of the lease. Files: none.
    fn latency_warning(&self) -> Option<String> {
        None
    }

    /// Whether this owner still holds `task_id`'s lease, as far as it knows (a write refused
    /// for a lost lease forgets it).
    fn holds(&self, _task_id: &str) -> bool {
        true
    }

    /// Give up `task_id` without a final record, after its entry was written: paused, or
    /// waiting for a retry. Only for a shared queue; files keep such tasks in the work state.
    fn hand_back(&self, _task_id: &str, _how: HandBack) -> Result<(), QueueError> {
        Err(QueueError::Unsupported {
            operation: "handing a task back",
            backend: "file",
        })
    }

    /// End the ownership: every lease under it is refused from now on (a database hands the
    /// leases back so that another owner takes the tasks over at once).
    fn release(&self);

    // ---- Start ----

    /// Remove what writes cut short by a crash left behind, and make durable what an earlier
    /// process left visible but not durable. Returns what was removed, for the log. Called once
    /// at start, before anything is read.
    fn clean_after_crash(&self) -> io::Result<Vec<String>>;

    /// The work state as last written (empty for a new queue).
    fn load_work(&self) -> Result<CurrentWork, LoadError>;

    /// Finish intake a crash interrupted (run once at start); processing twice yields the same.
    fn recover_intake(&self) -> IntakeReport;

    // ---- Intake ----

    /// Accept up to `limit` complete submissions: each accepted task's definition is durable
    /// before its submission is gone, exactly once whatever the crash.
    fn scan_intake(&self, hints: Vec<QueueHint>, limit: usize) -> IntakeReport;

    /// Hold every new submission to the per-submitter limits of `admission` (see
    /// `crate::limits`), counting what is accepted there.
    fn set_admission(&self, admission: std::sync::Arc<crate::limits::Admission>);

    /// Whether a submission of `task_id` waits to be accepted (its requests then wait too).
    fn waiting_in_intake(&self, task_id: &str) -> bool;

    /// Judge requests with `judge` before a backend applies them itself (a database applies
    /// requests for tasks no daemon holds); a backend that hands every request to the daemon
    /// ignores it.
    fn set_control_judge(&self, judge: crate::queue::control::ControlJudge) {
        let _ = judge;
    }

    // ---- Reads ----

    /// An accepted task's definition.
    fn task(&self, task_id: &str) -> Result<Task, QueueError>;

    /// Ids of every accepted task (finished or not).
    fn accepted_ids(&self) -> Result<Vec<String>, QueueError>;

    /// When `task_id` was accepted, when known (orders the pending tasks at start).
    fn accepted_at(&self, task_id: &str) -> Option<SystemTime>;

    /// Ids that have a final record, in one read (at start, for every task at once).
    fn finished_ids(&self) -> Result<HashSet<String>, QueueError>;

    /// Whether `task_id` has a final record.
    fn has_record(&self, task_id: &str) -> Result<bool, QueueError>;

    /// `task_id`'s failed (or cancelled, budget-stopped) record, if it has one.
    fn failed_record(&self, task_id: &str) -> Result<Option<FailedRecord>, QueueError>;

    /// Where a new task starts instead of its first phase (`cairn fork`), if set.
    fn start_point(&self, task_id: &str) -> Result<Option<StartPoint>, QueueError>;

    /// A large phase output by the reference [`put_output`](QueueBackend::put_output) gave.
    fn read_output(&self, reference: &str) -> Result<Option<Value>, QueueError>;

    /// The checkpoint files, when this backend keeps checkpoints as files (the owner's
    /// checkpointers then write them directly, fenced by
    /// [`checkpoint_fence`](QueueBackend::checkpoint_fence)); `None` for a backend that keeps
    /// them elsewhere (a database), whose checkpoints go through
    /// [`save_checkpoint`](QueueBackend::save_checkpoint) and
    /// [`latest_checkpoint`](QueueBackend::latest_checkpoint) only.
    ///
    /// (Changed from a `&CheckpointStore` every backend had to expose: a database has no
    /// store of files to hand out.)
    fn checkpoint_files(&self) -> Option<&CheckpointStore>;

    /// The newest checkpoint of `task_id` that decodes (older generations are tried when the
    /// newest does not). Required of each backend, since not every backend has files.
    fn latest_checkpoint(&self, task_id: &str) -> Result<Option<LoadedCheckpoint>, QueueError>;

    // ---- Writes ----

    /// Durably write the work state's entries that changed (phase, outputs, attempt and crash
    /// accounting of a task in flight) and drop those of tasks that left it. Files: the
    /// entries are appended to the work log as one line, atomic as a group (a reader sees all
    /// of them or none) and durable when `Ok`, under the owner lease (`store::work_log`). A
    /// database: one row per entry, each written only while its task's lease holds (entries
    /// whose lease was lost are skipped and reported); a task leaves with its final record.
    fn write_work_entries(
        &self,
        owner: &OwnerLease,
        changed: &[ActiveTask],
        removed: &[TaskId],
    ) -> Result<(), QueueError>;

    /// Durably store a phase output too large for the work state, atomically; returns the
    /// reference to keep in the state. Fenced by `lease`.
    fn put_output(
        &self,
        lease: &Lease,
        phase_index: usize,
        bytes: &[u8],
    ) -> Result<String, QueueError>;

    /// Durably write the task's final record, atomically, fenced by `lease`. Exactly one record
    /// per task: the caller removes the task from the work state afterwards (a restart drops an
    /// entry whose task has a record). A database does both, and ends the lease, in one
    /// transaction.
    fn finish(&self, lease: &Lease, record: &TaskRecord) -> Result<(), QueueError>;

    /// Move a failed record out of the way before the task is retried (`cairn retry`), keeping
    /// it in the task's history. Fenced by `lease`. The retry's entry is written before (its
    /// `retry_of` tells recovery which of the two is current).
    fn archive_failed(&self, lease: &Lease, record: &FailedRecord) -> Result<(), QueueError>;

    /// Durably store `checkpoint` as the task's next generation, atomically, fenced by `lease`
    /// in the same step (a database: in the same statement). Sets its generation, format
    /// version and time as the file store does; returns the generation. The backend-neutral
    /// way to save a checkpoint (files: the same write as the owner's checkpointers). The
    /// state comes serialized once, as the loop checkpointers hold it.
    fn save_checkpoint(
        &self,
        lease: &Lease,
        checkpoint: &mut IterationCheckpoint<&serde_json::value::RawValue>,
    ) -> Result<SavedCheckpoint, QueueError>;

    /// A fence for the checkpoint writes of one phase under `lease`, checked before each save
    /// (see [`WriteFence`]). Checking must not allocate or block.
    fn checkpoint_fence(&self, lease: &Lease) -> Result<Arc<dyn WriteFence>, QueueError>;

    // ---- Control requests ----

    /// Claim every waiting control request and read each claim, oldest first. A bad entry is
    /// removed (or, if it cannot be, logged once) and never holds up the others.
    fn take_control(&self) -> Result<Vec<(ControlClaim, ControlRequest)>, QueueError>;

    /// Remove a request once it is applied (a missing one is not an error).
    fn remove_control(&self, owner: &OwnerLease, claim: &ControlClaim) -> Result<(), QueueError>;

    // ---- Events ----

    /// Append to the task's event journal: a log, not state; never fails the caller and never
    /// waits for the disk.
    fn append_event(&self, task_id: &str, event: Event);

    /// Wait until every event appended so far is written.
    fn flush_events(&self);
}
