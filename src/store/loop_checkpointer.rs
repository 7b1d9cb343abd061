//! Checkpointing for one loop: resume where it stopped, save every N iterations, flush on stop.
//!
//! This is the small helper a Rust program wraps around its own loop (the daemon's loop phases
//! use it too):
//! ```no_run
//! # fn main() -> Result<(), cairn::store::StoreError> {
//! use cairn::store::{CheckpointStore, LoopCheckpointer};
//! let store = CheckpointStore::open("queue")?;
//! let mut checkpointer = LoopCheckpointer::new(store, "my-task", "sum").every(5);
//! let (start, mut sum) = checkpointer.resume::<u64>()?.unwrap_or((0, 0));
//! for i in start..100 {
//!     sum += i; // the expensive iteration
//!     checkpointer.checkpoint(i + 1, &sum)?;
//! }
//! checkpointer.finish(100, &sum, Some(serde_json::json!(sum)))?;
//! # Ok(())
//! # }
//! ```

use chrono::Utc;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::value::RawValue;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use super::blobs::{BlobError, StoredFile};
use super::checkpoint::{IterationCheckpoint, FORMAT_VERSION};
use super::checkpoint_store::{CheckpointStore, LoadedCheckpoint, SavedCheckpoint, StoreError};

/// Asked before every checkpoint write: may this writer still write for the task? The
/// daemon's checkpointers carry one backed by the task's lease (`queue::Lease`), so a writer
/// that lost its lease writes nothing. Called on the hot path: it must neither allocate nor
/// block when the write may go ahead.
pub trait WriteFence: Send + Sync + std::fmt::Debug {
    /// `Ok` when the write may go ahead; otherwise why not.
    fn check(&self) -> Result<(), StoreError>;
}

/// Where a [`LoopCheckpointer`] keeps checkpoints when not in a [`CheckpointStore`]'s files:
/// a queue in a database saves each one under the task's lease, in one statement. Object-safe,
/// so the state arrives serialized once, as raw JSON.
pub trait CheckpointSink: Send + Sync + std::fmt::Debug {
    /// The newest checkpoint of `task_id` that decodes, if any.
    fn latest(&self, task_id: &str) -> Result<Option<LoadedCheckpoint>, StoreError>;

    /// Durably store `checkpoint` as the task's next generation, setting its generation, format
    /// version and time as the file store does.
    fn save(
        &self,
        checkpoint: &mut IterationCheckpoint<&RawValue>,
    ) -> Result<SavedCheckpoint, StoreError>;
}

/// Where a loop's checkpoints go.
#[derive(Debug)]
enum Target {
    Files(CheckpointStore),
    Sink(Arc<dyn CheckpointSink>),
}

/// Writes one loop's iteration checkpoints through a [`CheckpointStore`] (or a
/// [`CheckpointSink`]).
///
/// Dropping it flushes the pending iteration, so a loop that stops early (an error, a
/// shutdown) still commits the last iteration it completed.
#[derive(Debug)]
pub struct LoopCheckpointer {
    /// Where checkpoints go.
    target: Target,
    /// The task the loop belongs to (names its checkpoint files).
    task_id: String,
    /// The phase's name, recorded in each checkpoint.
    phase: String,
    /// The phase's position; with `scope`, tells this loop's checkpoints from other loops'.
    phase_index: usize,
    /// Which loop of the phase this is.
    scope: String,
    /// The attempt recorded in each checkpoint.
    attempt: u32,
    /// Write every this many completed iterations (at least 1).
    every: u64,
    /// A completed iteration not yet written (between two `every` boundaries), its state
    /// already serialized.
    pending: Option<IterationCheckpoint<Box<RawValue>>>,
    /// The task's summed cost, stamped on the checkpoints written from now on.
    cost: Option<f64>,
    /// The last write, until [`LoopCheckpointer::take_last_saved`] takes it.
    last_saved: Option<SavedCheckpoint>,
    /// The iteration count of the last checkpoint committed (written, or found by resume).
    last_written: Option<u64>,
    /// Checked before every write (none: the caller owns the store alone).
    fence: Option<Arc<dyn WriteFence>>,
    /// The directory the files a checkpoint names are relative to, and who gets them back on
    /// a restore (uid, gid; none: the caller's).
    scratch: Option<(PathBuf, Option<(u32, u32)>)>,
    /// The files of the last checkpoint committed (written, or found by resume): the final
    /// checkpoint names them unless given its own.
    last_files: BTreeMap<String, StoredFile>,
}

impl LoopCheckpointer {
    /// A checkpointer for the loop `scope` of `task_id`: phase named like the scope, index 0,
    /// attempt 1, a checkpoint after every iteration.
    pub fn new(
        store: CheckpointStore,
        task_id: impl Into<String>,
        scope: impl Into<String>,
    ) -> Self {
        Self::to_target(Target::Files(store), task_id.into(), scope.into())
    }

    /// A checkpointer like [`new`](Self::new) whose checkpoints go to `sink` instead of files.
    pub fn with_sink(
        sink: Arc<dyn CheckpointSink>,
        task_id: impl Into<String>,
        scope: impl Into<String>,
    ) -> Self {
        Self::to_target(Target::Sink(sink), task_id.into(), scope.into())
    }

    fn to_target(target: Target, task_id: String, scope: String) -> Self {
        Self {
            target,
            task_id,
            phase: scope.clone(),
            phase_index: 0,
            scope,
            attempt: 1,
            every: 1,
            pending: None,
            cost: None,
            last_saved: None,
            last_written: None,
            fence: None,
            scratch: None,
            last_files: BTreeMap::new(),
        }
    }

    /// Checkpoints may name files relative to `dir` ([`checkpoint_with_files`]
    /// (Self::checkpoint_with_files)); [`restore_files`](Self::restore_files) puts them back
    /// there, given to `owner` (uid, gid) when one is given.
    pub fn scratch(mut self, dir: impl Into<PathBuf>, owner: Option<(u32, u32)>) -> Self {
        self.scratch = Some((dir.into(), owner));
        self
    }

    /// Check `fence` before every write: a refused write returns its error and writes
    /// nothing (the iteration stays pending, as after any failed write).
    pub fn fenced(mut self, fence: Arc<dyn WriteFence>) -> Self {
        self.fence = Some(fence);
        self
    }

    /// The phase this loop runs in (name and position in the task).
    pub fn phase(mut self, name: impl Into<String>, index: usize) -> Self {
        self.phase = name.into();
        self.phase_index = index;
        self
    }

    /// The attempt recorded in the checkpoints (1 for the first run).
    pub fn attempt(mut self, attempt: u32) -> Self {
        self.attempt = attempt;
        self
    }

    /// Write a checkpoint every `n` completed iterations (0 is treated as 1). The pending
    /// iteration is still written by [`flush`](Self::flush), [`finish`](Self::finish) and drop.
    pub fn every(mut self, n: u64) -> Self {
        self.every = n.max(1);
        self
    }

    /// The last committed checkpoint of this loop, if any, as `(iteration_count, state)`:
    /// continue with iteration `iteration_count` (0-based). A checkpoint of another loop
    /// (different phase index or scope) is not this loop's, so it gives `None`.
    pub fn resume<S: DeserializeOwned>(&mut self) -> Result<Option<(u64, S)>, StoreError> {
        let Some(cp) = self.resume_checkpoint()? else {
            return Ok(None);
        };
        let state = serde_json::from_value(cp.partial_results).map_err(StoreError::State)?;
        Ok(Some((cp.iteration_count, state)))
    }

    /// Like [`resume`](Self::resume), but the whole checkpoint (with `done` and `output`).
    pub fn resume_checkpoint(&mut self) -> Result<Option<IterationCheckpoint>, StoreError> {
        let latest = match &self.target {
            Target::Files(store) => store.latest(&self.task_id)?,
            Target::Sink(sink) => sink.latest(&self.task_id)?,
        };
        let Some(loaded) = latest else {
            return Ok(None);
        };
        let cp = loaded.checkpoint;
        if cp.phase_index != self.phase_index || cp.scope != self.scope {
            return Ok(None);
        }
        self.last_written = Some(cp.iteration_count);
        self.last_files = cp.files.clone();
        Ok(Some(cp))
    }

    /// Put the files `cp` names back at their paths in the scratch directory, each checked
    /// against its hash (call it with the checkpoint [`resume_checkpoint`]
    /// (Self::resume_checkpoint) gave, before the loop's command runs).
    pub fn restore_files(&self, cp: &IterationCheckpoint) -> Result<(), StoreError> {
        if cp.files.is_empty() {
            return Ok(());
        }
        let refused = |source| StoreError::Files {
            task_id: self.task_id.clone(),
            source,
        };
        let Target::Files(store) = &self.target else {
            return Err(refused(BlobError::SharedQueue));
        };
        let (Some(blobs), Some((dir, owner))) = (store.blobs(), &self.scratch) else {
            return Err(refused(BlobError::NoStore));
        };
        blobs.restore(&cp.files, dir, *owner).map_err(refused)
    }

    /// [`checkpoint`](Self::checkpoint) naming `files` (the command's name for each → its
    /// path relative to the scratch directory): written now whatever `every` says, once each
    /// file is a durable blob. A file that cannot be stored refuses the checkpoint: nothing is
    /// written and nothing is kept pending, so the previous checkpoint stays in force.
    pub fn checkpoint_with_files<S: Serialize>(
        &mut self,
        iteration_count: u64,
        state: &S,
        files: &BTreeMap<String, String>,
    ) -> Result<bool, StoreError> {
        if files.is_empty() {
            return self.checkpoint(iteration_count, state);
        }
        self.pending = None;
        let mut cp = self.envelope(iteration_count, state, false, None);
        self.save_files(&mut cp, files)?;
        Ok(true)
    }

    /// [`finish`](Self::finish) naming `files` (see [`checkpoint_with_files`]
    /// (Self::checkpoint_with_files)); with none, the final checkpoint names the last one's.
    pub fn finish_with_files<S: Serialize>(
        &mut self,
        iteration_count: u64,
        state: &S,
        output: Option<serde_json::Value>,
        files: &BTreeMap<String, String>,
    ) -> Result<(), StoreError> {
        if files.is_empty() {
            return self.finish(iteration_count, state, output);
        }
        self.pending = None;
        let mut cp = self.envelope(iteration_count, state, true, output);
        self.save_files(&mut cp, files)
    }

    /// Store `files` and write `cp` naming them, fenced like every write.
    fn save_files<S: Serialize>(
        &mut self,
        cp: &mut IterationCheckpoint<&S>,
        files: &BTreeMap<String, String>,
    ) -> Result<(), StoreError> {
        if let Some(fence) = &self.fence {
            fence.check()?;
        }
        let refused = |source| StoreError::Files {
            task_id: self.task_id.clone(),
            source,
        };
        let Target::Files(store) = &self.target else {
            return Err(refused(BlobError::SharedQueue));
        };
        let Some((dir, _)) = &self.scratch else {
            return Err(refused(BlobError::NoStore));
        };
        let saved = store.save_with_files(cp, dir, files)?;
        self.last_saved = Some(saved);
        self.last_written = Some(cp.iteration_count);
        self.last_files = cp.files.clone();
        Ok(())
    }

    /// Record that `iteration_count` iterations are complete, leaving `state`. Writes the
    /// checkpoint when `iteration_count` is a multiple of `every` and returns `Ok(true)`;
    /// otherwise keeps it pending and returns `Ok(false)`.
    pub fn checkpoint<S: Serialize>(
        &mut self,
        iteration_count: u64,
        state: &S,
    ) -> Result<bool, StoreError> {
        if iteration_count.is_multiple_of(self.every) {
            self.save_now(self.envelope(iteration_count, state, false, None))?;
            Ok(true)
        } else {
            self.pending = Some(self.pending_copy(iteration_count, state, false, None)?);
            Ok(false)
        }
    }

    /// Write the loop's final checkpoint (`done`, with `output`); always written.
    pub fn finish<S: Serialize>(
        &mut self,
        iteration_count: u64,
        state: &S,
        output: Option<serde_json::Value>,
    ) -> Result<(), StoreError> {
        let mut cp = self.envelope(iteration_count, state, true, output);
        cp.files = self.last_files.clone();
        self.save_now(cp)
    }

    /// Write `cp` now, serializing its borrowed state straight into the file's encoder. On
    /// error it stays pending (as a copy), so a later flush can retry it.
    fn save_now<S: Serialize>(
        &mut self,
        mut cp: IterationCheckpoint<&S>,
    ) -> Result<(), StoreError> {
        // A newer iteration supersedes whatever was pending.
        self.pending = None;
        match self.save(&mut cp) {
            Ok(()) => Ok(()),
            Err(err) => {
                let IterationCheckpoint {
                    iteration_count,
                    partial_results,
                    done,
                    output,
                    ..
                } = cp;
                match self.pending_copy(iteration_count, partial_results, done, output) {
                    Ok(copy) => self.pending = Some(copy),
                    Err(copy_err) => tracing::error!(
                        task_id = %self.task_id,
                        error = %copy_err,
                        "the failed checkpoint could not be kept for a retry"
                    ),
                }
                Err(err)
            }
        }
    }

    /// Write the pending iteration, if any (call it when the loop stops). Idempotent; on
    /// error the iteration stays pending, so a later flush can retry it.
    pub fn flush(&mut self) -> Result<(), StoreError> {
        let Some(mut cp) = self.pending.take() else {
            return Ok(());
        };
        self.save(&mut cp).inspect_err(|_| self.pending = Some(cp))
    }

    /// Write `cp` durably and remember it as the last write.
    fn save<S: Serialize>(&mut self, cp: &mut IterationCheckpoint<S>) -> Result<(), StoreError> {
        if let Some(fence) = &self.fence {
            fence.check()?;
        }
        let saved = match &self.target {
            Target::Files(store) => store.save_with_info(cp)?,
            Target::Sink(_) if !cp.files.is_empty() => {
                return Err(StoreError::Files {
                    task_id: self.task_id.clone(),
                    source: BlobError::SharedQueue,
                })
            }
            Target::Sink(sink) => {
                let state = serde_json::value::to_raw_value(&cp.partial_results)
                    .map_err(StoreError::State)?;
                let mut raw = cp.with_state(state.as_ref());
                let saved = sink.save(&mut raw)?;
                cp.generation = raw.generation;
                cp.format_version = raw.format_version;
                cp.last_checkpoint_at = raw.last_checkpoint_at;
                saved
            }
        };
        self.last_saved = Some(saved);
        self.last_written = Some(cp.iteration_count);
        self.last_files = cp.files.clone();
        Ok(())
    }

    /// Record the task's summed cost so far; later checkpoints carry it.
    pub fn set_cost(&mut self, total: Option<f64>) {
        self.cost = total;
    }

    /// The last durable write since this was last asked (for journals and metrics).
    pub fn take_last_saved(&mut self) -> Option<SavedCheckpoint> {
        self.last_saved.take()
    }

    /// The iteration count of the last checkpoint committed (written, or found by resume).
    pub fn last_committed(&self) -> Option<u64> {
        self.last_written
    }

    /// A checkpoint of this loop holding `state`; `save` fills in the generation and the time.
    fn envelope<T>(
        &self,
        iteration_count: u64,
        state: T,
        done: bool,
        output: Option<serde_json::Value>,
    ) -> IterationCheckpoint<T> {
        IterationCheckpoint {
            format_version: FORMAT_VERSION,
            task_id: self.task_id.clone(),
            phase: self.phase.clone(),
            phase_index: self.phase_index,
            scope: self.scope.clone(),
            iteration_count,
            checkpoint_interval: self.every,
            partial_results: state,
            last_checkpoint_at: Utc::now(),
            attempt: self.attempt,
            generation: 0,
            done,
            output,
            cost: self.cost,
            files: BTreeMap::new(),
        }
    }

    /// A checkpoint to keep pending: the state is serialized now, since the caller's state
    /// moves on with the next iteration.
    fn pending_copy<S: Serialize + ?Sized>(
        &self,
        iteration_count: u64,
        state: &S,
        done: bool,
        output: Option<serde_json::Value>,
    ) -> Result<IterationCheckpoint<Box<RawValue>>, StoreError> {
        let state = serde_json::value::to_raw_value(state).map_err(StoreError::State)?;
        Ok(self.envelope(iteration_count, state, done, output))
    }
}

impl Drop for LoopCheckpointer {
    fn drop(&mut self) {
        if let Err(err) = self.flush() {
            tracing::error!(
                task_id = %self.task_id,
                phase = %self.phase,
                error = %err,
                "could not write the loop's last completed iteration on drop"
            );
        }
    }
}
