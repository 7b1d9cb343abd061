//! The queue directory: its layout, the one-owner lock, and intake of task files from `inbox/`.

mod intake;
mod layout;
mod lock;
mod watch;

pub use intake::{Intake, IntakeReport, Rejection};
pub use layout::QueueDir;
pub use lock::{LockError, QueueLock};
pub use watch::{InboxHint, InboxWatcher};
