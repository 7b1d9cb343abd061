//! The queue directory: its layout, the one-owner lock, intake of task files from `inbox/`,
//! and control requests in `control/`.

pub mod backend;
pub mod control;
mod file_backend;
mod intake;
mod layout;
pub mod lease;
mod lock;
mod owner;
mod permissions;
mod watch;

pub use backend::{ControlClaim, LoadError, QueueBackend, QueueError, TaskRecord};
pub use file_backend::FileBackend;
pub use intake::{Intake, IntakeReport, Rejection};
pub use layout::{QueueDir, SUBDIRS};
pub use lease::{Lease, LeaseLost, OwnerLease};
pub use lock::{LockError, QueueLock};
pub use owner::{OpenError, Queue, RecordLocations};
pub use permissions::{
    check_queue_permissions, check_submitter, check_task_file, RefusedFile, UnsafeQueue,
};
pub use watch::{QueueHint, QueueWatcher};
