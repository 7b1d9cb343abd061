//! The queue directory: its layout, the one-owner lock, intake of task files from `inbox/`,
//! and control requests in `control/`.

pub mod control;
mod intake;
mod layout;
mod lock;
mod permissions;
mod watch;

pub use intake::{Intake, IntakeReport, Rejection};
pub use layout::{QueueDir, SUBDIRS};
pub use lock::{LockError, QueueLock};
pub use permissions::{
    check_queue_permissions, check_submitter, check_task_file, RefusedFile, UnsafeQueue,
};
pub use watch::{QueueHint, QueueWatcher};
