//! The queue directory: its layout, the one-owner lock, intake of task files from `inbox/`,
//! control requests in `control/`, the read model the operator commands and benches read
//! through ([`QueueReader`], which also tells whether a daemon holds the queue), and what
//! `prune` may remove with the removal itself ([`QueuePruner`]).

pub mod control;
mod intake;
mod layout;
mod lock;
#[cfg(test)]
mod path_literals;
mod permissions;
mod prune;
pub mod read;
mod safe_remove;
mod watch;

pub use intake::{Intake, IntakeReport, Rejection};
pub use layout::{QueueDir, SUBDIRS};
pub use lock::{LockError, QueueLock};
pub use permissions::{
    check_queue_permissions, check_submitter, check_task_file, RefusedFile, UnsafeQueue,
};
pub use prune::{PruneItem, PrunePlan, PruneReason, PruneRules, QueuePruner, PRUNE_GRACE};
pub use read::{DaemonInfo, LoadOptions, QueueReader, QueueView, TaskView};
pub use safe_remove::UnsafeQueueError;
pub use watch::{QueueHint, QueueWatcher};
