//! The queue directory: its layout, the one-owner lock, intake of task files from `inbox/`,
//! control requests in `control/`, the read model the operator commands and benches read
//! through ([`QueueReader`], which also tells whether a daemon holds the queue), and what
//! `prune` may remove with the removal itself ([`QueuePruner`]).

pub mod backend;
pub mod control;
pub mod control_rules;
mod file_backend;
mod intake;
mod layout;
pub mod lease;
mod lock;
mod owner;
#[cfg(test)]
mod path_literals;
mod permissions;
#[cfg(feature = "postgres")]
pub mod postgres;
mod prune;
pub mod read;
pub mod refusals;
mod safe_remove;
mod task_sink;
mod watch;

pub use backend::{
    ClaimedWork, ControlClaim, HandBack, LoadError, QueueBackend, QueueError, TaskRecord,
};
pub use file_backend::FileBackend;
pub use intake::{Intake, IntakeReport, Rejection};
pub use layout::{QueueDir, SUBDIRS};
pub use lease::{Lease, LeaseLost, OwnerLease};
pub use lock::{LockError, QueueLock};
pub use owner::{OpenError, Queue, RecordLocations};
pub use permissions::{
    check_not_exposed, check_queue_permissions, check_submitter, check_task_file, RefusedFile,
    UnsafeQueue,
};
pub use prune::{PruneItem, PrunePlan, PruneReason, PruneRules, QueuePruner, PRUNE_GRACE};
pub use read::{
    ClusterView, DaemonInfo, LoadOptions, NodeView, QueueReader, QueueView, StatusCache, TaskLease,
    TaskView,
};
pub use safe_remove::UnsafeQueueError;
pub use task_sink::{FileSink, Stored, TaskSink};
pub use watch::{QueueHint, QueueWatcher};
