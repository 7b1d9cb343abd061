//! Final records: done, and failed (failed, budget-stopped, cancelled), written through the
//! queue's owner under the task's lease.

use std::sync::Arc;

use chrono::Utc;
use serde_json::Value;

use super::{runner_blocking, Scheduler};
use crate::queue::{Lease, TaskRecord};
use crate::runner::{self, RunContext};
use crate::store::current_work::ActiveTask;
use crate::store::events::Event;
use crate::store::records::{DoneRecord, FailedRecord, RecordStatus};
use crate::task::Task;

/// Finish a task whose every phase is done, inside its attempt's future (so the main loop never
/// waits for these writes): write the done record durably under the attempt's `lease`, then
/// drop the task from `current_work`. The record is durable before the entry can leave the
/// file. Returns the entry as it ended.
pub(super) async fn record_done(
    ctx: &Arc<RunContext>,
    task: &Task,
    lease: &Lease,
) -> Result<ActiveTask, RecordError> {
    let id = task.id();
    let entry = ctx
        .work
        .update(|w| w.get(id).cloned())
        .ok_or_else(|| RecordError::NotInFlight(id.to_string()))?;
    write_done(ctx, task, &entry, lease).await?;
    ctx.work.update(|w| w.remove(id));
    // Dropping the entry from the file is no durability step (a restart drops an entry whose
    // task has a record), so the task's slot is freed without waiting for it; the write joins
    // the next group commit. A failure is not fatal for the same reason.
    let work = Arc::clone(&ctx.work);
    tokio::spawn(async move {
        if let Err(e) = work.persist().await {
            tracing::error!("{e}");
        }
    });
    Ok(entry)
}

/// A final record that could not be written; the task keeps its `current_work` entry, so the
/// next start tries again.
#[derive(Debug, thiserror::Error)]
pub(super) enum RecordError {
    #[error("internal error: task {0} is not in current_work")]
    NotInFlight(String),
    #[error("{0}")]
    Outputs(#[from] runner::StateError),
    #[error(transparent)]
    Write(#[from] crate::queue::QueueError),
}

async fn write_done(
    ctx: &RunContext,
    task: &Task,
    entry: &ActiveTask,
    lease: &Lease,
) -> Result<(), RecordError> {
    let outputs = outputs_by_name(ctx, entry).await?;
    let result = task
        .phases
        .last()
        .and_then(|p| outputs.get(&p.name).cloned())
        .unwrap_or(Value::Null);
    let finished_at = Utc::now();
    let record = DoneRecord {
        status: RecordStatus::Done,
        task_id: entry.task_id.clone(),
        result,
        phase_outputs: outputs,
        attempts: entry.attempt,
        failed_attempts: entry.failed_attempts,
        started_at: entry.started_at,
        finished_at,
        duration_seconds: (finished_at - entry.started_at).num_milliseconds() as f64 / 1000.0,
        cost: entry.cost,
        lost_iterations: entry.lost_iterations,
        lost_cost_estimate: entry.lost_cost_estimate(),
        phases: entry.phases.clone(),
        submitted_by: task.submitted_by.clone(),
        max_cost: entry.spend_limit(task.budget.as_ref()),
        forked_from: entry.forked_from.clone(),
    };
    let (queue, lease) = (ctx.queue.clone(), lease.clone());
    runner_blocking(move || queue.backend().finish(&lease, &TaskRecord::Done(record)))
        .await
        .map_err(RecordError::Write)
}

impl Scheduler {
    /// The task has used up its attempts: record it in failed/ (its checkpoints stay).
    pub(super) async fn give_up(&mut self, task: &Arc<Task>, entry: ActiveTask, error: String) {
        self.record_failure(task, entry, error, RecordStatus::Failed)
            .await
    }

    /// Write the task's failed record with `status` ("failed", "budget_exceeded",
    /// "cancelled") and drop the task from current_work. No attempt of it runs: the record is
    /// written under a fresh claim.
    pub(super) async fn record_failure(
        &mut self,
        task: &Arc<Task>,
        entry: ActiveTask,
        error: String,
        status: RecordStatus,
    ) {
        let id = entry.task_id.clone();
        self.summary.add_failed(&id, &status);
        self.announce_failure(&entry, &error, &status);
        // The record is written even if an earlier phase's output cannot be read back, but
        // it says so: `cairn retry` restores outputs from this record.
        let (outputs, error) = match outputs_by_name(&self.ctx, &entry).await {
            Ok(outputs) => (outputs, error),
            Err(problem) => {
                tracing::error!(task_id = %id, "reading the outputs of earlier phases: {problem}");
                (
                    Default::default(),
                    format!(
                        "{error} (and the outputs of earlier phases could not be read: {problem})"
                    ),
                )
            }
        };
        let phase = task
            .phases
            .get(entry.phase_index)
            .map(|p| p.name.clone())
            .unwrap_or_else(|| entry.phase.clone());
        let record = FailedRecord::from_entry(&entry, status, error, phase, outputs)
            .submitted_by(task.submitted_by.clone())
            .with_limit(task.budget.as_ref());
        let (queue, claim_id) = (self.ctx.queue.clone(), id.clone());
        let written = runner_blocking(move || {
            // The events so far (a quarantine's, a takeover's) land under the lease they were
            // appended with, before the claim below raises a shared queue's epoch.
            queue.backend().flush_events();
            let lease = queue.backend().claim(&claim_id)?;
            queue.backend().finish(&lease, &TaskRecord::Failed(record))
        })
        .await;
        match written {
            Ok(()) => {
                self.ctx.work.update(|w| w.remove(&id));
            }
            Err(e) => {
                // Keep the entry: the next start will try again to record the failure.
                tracing::error!(task_id = %id, "{e}");
            }
        }
    }
}

impl Scheduler {
    /// Log and journal a task's end in `failed/` (`status`: "failed", "budget_exceeded",
    /// "cancelled").
    fn announce_failure(&self, entry: &ActiveTask, error: &str, status: &RecordStatus) {
        let id = &entry.task_id;
        let (attempts, name, error) = (entry.attempt, status.as_str(), error.to_string());
        // An operator's cancel is what they asked for, and a budget stop is the task's own
        // limit: neither is an error of the daemon's or the task's.
        let event = match status {
            RecordStatus::Cancelled => {
                tracing::info!(task_id = %id, attempts, status = name, "task cancelled: {error}");
                Event::Cancelled { error, attempts }
            }
            RecordStatus::BudgetExceeded => {
                tracing::warn!(task_id = %id, attempts, status = name, "task stopped by its budget: {error}");
                Event::BudgetStopped { error, attempts }
            }
            _ => {
                tracing::error!(task_id = %id, attempts, failed_attempts = entry.failed_attempts, status = name, "task failed: {error}");
                Event::Failed { error, attempts }
            }
        };
        self.ctx.journal(id, event);
    }
}

async fn outputs_by_name(
    ctx: &RunContext,
    entry: &ActiveTask,
) -> Result<std::collections::BTreeMap<String, Value>, runner::StateError> {
    match runner::load_inputs(ctx, &entry.phase_outputs).await? {
        Value::Object(map) => Ok(map.into_iter().collect()),
        _ => Ok(Default::default()),
    }
}
