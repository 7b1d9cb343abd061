//! cairn: a checkpointing queue runner.
//!
//! Tasks dropped into a queue directory run phase by phase; every iteration of their loops is
//! checkpointed crash-safely, so a crash, a reboot or Ctrl-C loses at most the iteration in
//! flight. The `cairn` binary is a thin shell over this library.
//!
//! Embedding programs use [`store::CheckpointStore`] (save, latest, history, a generation,
//! delete) and [`store::LoopCheckpointer`] (resume, checkpoint, flush) to checkpoint their own
//! loops in the same format the daemon writes. [`daemon::run`] runs the daemon itself.
//!
//! Data flows one way: [`queue`] intake → [`runner`] → [`store`]; [`cli`] reads the queue
//! through [`queue::QueueReader`] and starts the daemon.

#[cfg(feature = "cli")]
pub mod cli;
pub mod client;
pub mod clients;
pub mod cost;
pub mod daemon;
pub mod limits;
pub mod observe;
pub mod queue;
pub mod runner;
pub mod safe_fs;
pub mod shutdown;
pub mod store;
pub mod submitter;
pub mod task;
pub mod task_id;

#[cfg(test)]
mod layering_tests;

pub use store::{CheckpointStore, IterationCheckpoint, LoopCheckpointer};
