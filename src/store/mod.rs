//! The checkpoint store: everything cairn keeps on disk goes through here.
//!
//! Two layers:
//! - [`Storage`] is the file backend's object layer: durable key → bytes objects (keys are paths
//!   relative to the queue root, such as `incremental/t1.json.gz`), with no precondition. The
//!   daemon does not call it: it goes through the queue's owner (`queue::Queue`), whose
//!   backend seam (`queue::QueueBackend`) fences every write with the task's lease.
//! - [`CheckpointStore`] is the checkpoint format on top of it: gzip JSON iteration checkpoints
//!   with generations, the one implementation the daemon and embedding programs share.
//!
//! Checkpoint files are made durable through the checkpoint directory's commit log (one
//! group-committed fdatasync per save, replayed when the store is opened), or by the atomic
//! replace alone ([`CommitPath`]).
//!
//! [`FileStorage`] performs its syscalls through [`FileOps`], so tests can swap in
//! `FaultyFileOps` and fail or "crash" at every write step in turn, or `PowerLossFileOps` and
//! see what a power cut would leave. Both are test doubles, compiled only with the
//! `test-doubles` feature (which `cargo test` turns on), so the shipped library has none.

pub mod blobs;
mod checkpoint;
mod checkpoint_store;
mod commit_log;
pub mod current_work;
pub mod events;
#[cfg(feature = "test-doubles")]
mod faulty;
mod file;
mod file_ops;
#[cfg(test)]
mod generation_tests;
mod group_commit;
mod gzip;
pub mod journal;
mod loop_checkpointer;
pub mod modes;
#[cfg(feature = "test-doubles")]
mod power_loss;
pub mod records;
mod replayed_view;
pub mod task_state;
pub mod work_log;

pub use checkpoint::{
    decode_checkpoint, encode_checkpoint, CheckpointError, IterationCheckpoint, FORMAT_VERSION,
};
pub use checkpoint_store::{
    CheckpointFileName, CheckpointStore, GenerationInfo, LoadedCheckpoint, SavedCheckpoint,
    StoreError, DEFAULT_KEEP_GENERATIONS,
};
#[cfg(feature = "test-doubles")]
pub use faulty::{FaultMode, FaultyFileOps};
pub use file::{CommitPath, FileStorage};
pub(crate) use file_ops::TEMP_SUFFIX;
pub use file_ops::{FileOps, RealFileOps, TempFile, UnsyncedFileOps};
pub use loop_checkpointer::{CheckpointSink, LoopCheckpointer, WriteFence};
#[cfg(feature = "test-doubles")]
pub use power_loss::PowerLossFileOps;
pub use replayed_view::ReplayedView;

use std::io;

/// Durable objects addressed by keys relative to the queue root (`dir/name`, `/`-separated).
///
/// Every `put` is atomic (a reader sees the old or the new bytes, never a mix) and durable when it
/// returns `Ok`. An `Err` from `put` leaves the previous object intact.
pub trait Storage: Send + Sync + std::fmt::Debug {
    /// Atomically and durably replace the object at `key` with `bytes`.
    ///
    /// When `keep_previous_as` is given and an object exists at `key`, the previous object stays
    /// readable under that key as well (the file backend hard-links it), made durable by the same
    /// barrier as the new object.
    fn put(&self, key: &str, bytes: &[u8], keep_previous_as: Option<&str>) -> io::Result<()>;

    /// [`put`](Storage::put), and the object at `retire` (one that is to go anyway, such as an
    /// expired generation) is gone afterwards: a backend may reuse its storage for the new
    /// object instead of allocating anew, as the file backend reuses the retired file's inode.
    /// Failing to remove `retire` after a committed put is logged, not returned. On error the
    /// previous object at `key` is intact, and `retire` may or may not be gone.
    fn put_retiring(
        &self,
        key: &str,
        bytes: &[u8],
        keep_previous_as: Option<&str>,
        retire: &str,
    ) -> io::Result<()> {
        self.put(key, bytes, keep_previous_as)?;
        remove_retired(self, retire);
        Ok(())
    }

    /// The object's bytes, or `None` when there is no object at `key`.
    fn get(&self, key: &str) -> io::Result<Option<Vec<u8>>>;

    /// The names (not keys) of the objects directly in `dir`, temp files excluded, sorted.
    /// A missing directory lists as empty.
    fn list(&self, dir: &str) -> io::Result<Vec<String>>;

    /// Durably append `bytes` to the existing object at `key` (`Ok` once they are durable). Not
    /// atomic: a crash or an error may leave any prefix of `bytes` appended, so the caller's
    /// format must tell a write cut short, and must not append after a failed one. The default
    /// rewrites the whole object (atomic, but as costly as the object is large).
    fn append(&self, key: &str, bytes: &[u8]) -> io::Result<()> {
        let mut whole = self.get(key)?.ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("{key} does not exist"))
        })?;
        whole.extend_from_slice(bytes);
        self.put(key, &whole, None)
    }

    /// Remove the object at `key`; a missing object is not an error.
    fn remove(&self, key: &str) -> io::Result<()>;

    /// Make the removals in `dir` durable (a power cut brings none of them back). The
    /// default does nothing: a backend whose removals are durable when they return.
    fn settle(&self, dir: &str) -> io::Result<()> {
        let _ = dir;
        Ok(())
    }

    /// Remove temp files left behind by writes that never finished (a crash mid-write).
    /// Returns the keys removed. Called once at daemon start, while the queue lock is held.
    fn remove_temp_files(&self) -> io::Result<Vec<String>>;
}

/// Remove an object a committed put retired; a failure leaves it on disk and is logged.
fn remove_retired(storage: &(impl Storage + ?Sized), retire: &str) {
    if let Err(err) = storage.remove(retire) {
        tracing::warn!(
            key = %retire,
            error = %err,
            "could not remove a retired object (an old checkpoint generation); it stays on disk"
        );
    }
}
