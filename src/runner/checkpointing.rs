//! The async face of [`LoopCheckpointer`] for the phase runners: each call runs the blocking
//! store work off the async thread, stamps the task's cost, maps errors to phase errors, and
//! records every durable write in the task's journal.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::{blocking, checkpoint_error, PhaseError, PhaseRun};
use crate::store::events::Event;
use crate::store::{IterationCheckpoint, LoopCheckpointer, SavedCheckpoint, StoreError};

/// The files a checkpoint names: the command's name for each → its path in the scratch
/// directory.
pub(super) type Files = std::collections::BTreeMap<String, String>;

/// One phase's checkpoints (`scope` is `loop`, `items` or `worker`).
pub(super) struct PhaseCheckpointer<'r, 'a> {
    run: &'r PhaseRun<'a>,
    /// Lent to the blocking pool during each call.
    inner: Option<LoopCheckpointer>,
    /// Why there is no checkpointer: the task's lease no longer held when the phase began.
    refused: Option<String>,
    /// When a checkpoint was last logged at INFO: one line a second at most shows a loop moving
    /// in a terminal without flooding a log with a fast one.
    last_logged: Option<Instant>,
}

/// At most one INFO line per phase in this time; every checkpoint is in the journal.
const CHECKPOINT_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// A phase that ends early (an error, a stop) drops its checkpointer, which then writes the
/// pending iteration: a blocking write (a file's fsync, a database's statement) that must
/// not run on the daemon's async thread, where a database backend cannot wait at all. It is
/// handed to the blocking pool instead, and the phase's end waits for it.
impl Drop for PhaseCheckpointer<'_, '_> {
    fn drop(&mut self) {
        let Some(checkpointer) = self.inner.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let flush = runtime.spawn_blocking(move || drop(checkpointer));
                *self
                    .run
                    .dropped_flush
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(flush);
            }
            // Outside a runtime (an embedding program's thread): blocking here is fine.
            Err(_) => drop(checkpointer),
        }
    }
}

impl<'r, 'a> PhaseCheckpointer<'r, 'a> {
    pub(super) fn new(run: &'r PhaseRun<'a>, scope: &str) -> Self {
        // Fenced by the task's lease: a save is refused once the lease is lost.
        match run.ctx.queue.checkpointer(run.lease, scope) {
            Ok(checkpointer) => PhaseCheckpointer {
                run,
                inner: Some(
                    checkpointer
                        .scratch(
                            run.confinement.scratch(),
                            run.confinement.file_owner().ids(),
                        )
                        .phase(run.phase.name.clone(), run.index)
                        .attempt(run.attempt)
                        .every(run.phase.checkpoint_every()),
                ),
                refused: None,
                last_logged: None,
            },
            Err(e) => PhaseCheckpointer {
                run,
                inner: None,
                refused: Some(format!("checkpoint: {e}")),
                last_logged: None,
            },
        }
    }

    /// Whose checkpoints these are, for the quota.
    fn submitter(&self) -> Option<u32> {
        self.run.task.submitted_by().map(|s| s.uid)
    }

    /// Refused when the task's submitter holds more checkpoint bytes than it may.
    fn within_quota(&self) -> Result<(), PhaseError> {
        self.run
            .ctx
            .checkpoint_quota
            .check(self.submitter())
            .map_err(|e| PhaseError::Command(e.to_string()))
    }

    async fn call<T: Send + 'static>(
        &mut self,
        work: impl FnOnce(&mut LoopCheckpointer) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, PhaseError> {
        let (checkpointer, result, saved) = self.lend(work)?.await?;
        self.inner = Some(checkpointer);
        if let Some(saved) = saved {
            self.log(&saved);
            self.note(saved);
        }
        result.map_err(checkpoint_error)
    }

    /// Lend the checkpointer to the blocking pool for `work`. The job is boxed, so that it
    /// takes room only while it runs: inline, the checkpointer and the job's state (about
    /// 2 KB) were part of every running phase's future, also while its command ran.
    #[allow(clippy::type_complexity)]
    fn lend<T: Send + 'static>(
        &mut self,
        work: impl FnOnce(&mut LoopCheckpointer) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<
        std::pin::Pin<
            Box<
                impl std::future::Future<
                    Output = Result<
                        (
                            LoopCheckpointer,
                            Result<T, StoreError>,
                            Option<SavedCheckpoint>,
                        ),
                        PhaseError,
                    >,
                >,
            >,
        >,
        PhaseError,
    > {
        let Some(mut checkpointer) = self.inner.take() else {
            return Err(PhaseError::Transient(self.refused.clone().unwrap_or_else(
                || "internal error: the checkpointer was lost".into(),
            )));
        };
        checkpointer.set_cost(self.run.cost());
        Ok(Box::pin(blocking(move || {
            let result = work(&mut checkpointer);
            let saved = checkpointer.take_last_saved();
            (checkpointer, result, saved)
        })))
    }

    /// A line at INFO for the first checkpoint of the phase and then at most one a second.
    fn log(&mut self, saved: &SavedCheckpoint) {
        if self
            .last_logged
            .is_some_and(|at| at.elapsed() < CHECKPOINT_LOG_INTERVAL)
        {
            return;
        }
        self.last_logged = Some(Instant::now());
        tracing::info!(
            task_id = %self.run.task.id(),
            phase = %self.run.phase.name,
            done = saved.iteration_count,
            "checkpoint committed"
        );
    }

    fn note(&self, saved: SavedCheckpoint) {
        let run = self.run;
        run.ctx
            .checkpoint_quota
            .note(self.submitter(), run.task.id(), saved.bytes);
        run.ctx.work.update(|w| {
            if let Some(entry) = w.get_mut(run.task.id()) {
                entry.last_checkpoint_at = Some(chrono::Utc::now());
                // Progress: the crashes before it say nothing against this task,
                // and a trial it was on is over (see `daemon::crash_blame`).
                entry.crashes_alone = 0;
                if std::mem::take(&mut entry.suspect) {
                    run.ctx.trial_progress.notify_one();
                }
            }
        });
        run.ctx.journal(
            run.task.id(),
            Event::Checkpoint {
                phase: run.phase.name.clone(),
                iteration: saved.iteration_count,
                generation: saved.generation,
                bytes: saved.bytes,
                ms: saved.elapsed.as_secs_f64() * 1000.0,
            },
        );
    }

    /// This phase's last committed checkpoint, if any; its cost becomes the task's. The files
    /// it names are put back in the scratch directory first (unless the phase is done).
    pub(super) async fn resume(&mut self) -> Result<Option<IterationCheckpoint>, PhaseError> {
        let resumed = self
            .call(|c| {
                let resumed = c.resume_checkpoint()?;
                if let Some(cp) = resumed.as_ref().filter(|cp| !cp.done) {
                    c.restore_files(cp)?;
                }
                Ok(resumed)
            })
            .await?;
        if let Some(cost) = resumed.as_ref().and_then(|cp| cp.cost) {
            self.run.set_cost(Some(cost));
        }
        Ok(resumed)
    }

    /// `count` iterations are complete with `state` and `files` (name → path in the scratch
    /// directory); written when due, and always when it names files. True if written.
    pub(super) async fn checkpoint(
        &mut self,
        count: u64,
        state: Value,
        files: Files,
    ) -> Result<bool, PhaseError> {
        self.within_quota()?;
        self.call(move |c| c.checkpoint_with_files(count, &state, &files))
            .await
    }

    /// The phase's final checkpoint (marked done, with its output), naming `files`, or the
    /// last checkpoint's when there are none.
    pub(super) async fn finish(
        &mut self,
        count: u64,
        state: Value,
        output: Option<Value>,
        files: Files,
    ) -> Result<(), PhaseError> {
        self.within_quota()?;
        self.call(move |c| c.finish_with_files(count, &state, output, &files))
            .await
    }

    /// Write the latest completed iteration if it is still pending.
    pub(super) async fn flush(&mut self) -> Result<(), PhaseError> {
        self.call(|c| c.flush()).await
    }
}
