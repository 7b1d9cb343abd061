//! `loop` phases: cairn drives the loop, one command run per iteration.
//!
//! Iteration `i` (0-based) gets `{task_id, phase, iteration: i, state, inputs, attempt}` on stdin
//! and replies `{state, done?, cost?, output?}`. After each completed iteration the state is
//! handed to the [`LoopCheckpointer`], which writes every `checkpoint_every` iterations; on a stop
//! the latest completed iteration is flushed, so a clean stop never loses a finished iteration.
//! The loop ends on `"done": true` or at `max_iterations`; its output is the last reply's
//! `output`, else the final state. The final checkpoint is marked done, so a crash right after
//! it does not run the loop again.

use chrono::Utc;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{blocking, checkpoint_error, PhaseEnd, PhaseError, PhaseRun};
use crate::store::LoopCheckpointer;

/// The scope name of the daemon's loop checkpoints.
pub const LOOP_SCOPE: &str = "loop";

/// One iteration's reply.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LoopReply {
    #[serde(default)]
    state: Value,
    #[serde(default)]
    done: bool,
    /// What the iteration cost; summed per task and checked against `budget.max_cost`.
    #[serde(default)]
    cost: Option<f64>,
    #[serde(default)]
    output: Option<Value>,
}

pub(super) async fn run(run: &PhaseRun<'_>) -> Result<PhaseEnd, PhaseError> {
    let task_id = run.task.id().to_string();
    let mut checkpointer = LoopCheckpointer::new(run.ctx.checkpoints.clone(), &task_id, LOOP_SCOPE)
        .phase(run.phase.name.clone(), run.index)
        .attempt(run.attempt)
        .every(run.phase.checkpoint_every());
    let (returned, resumed) = blocking(move || {
        let resumed = checkpointer.resume_checkpoint();
        (checkpointer, resumed)
    })
    .await?;
    checkpointer = returned;
    let resumed = resumed.map_err(checkpoint_error)?;

    let (mut count, mut state) = match resumed {
        Some(cp) if cp.done => {
            tracing::info!(task_id, phase = %run.phase.name, iterations = cp.iteration_count, "loop already finished");
            set_progress(run, cp.iteration_count, true);
            return Ok(PhaseEnd::Completed(cp.output.unwrap_or(cp.partial_results)));
        }
        Some(cp) => {
            tracing::info!(task_id, phase = %run.phase.name, iteration = cp.iteration_count, "resuming loop");
            if cp.cost.is_some() {
                run.set_cost(cp.cost);
            }
            (cp.iteration_count, cp.partial_results)
        }
        None => (0, run.phase.initial_state.clone().unwrap_or(Value::Null)),
    };
    set_progress(run, count, false);
    // Whether the last iteration reported its cost (nothing is unknown before the first).
    let mut cost_known = true;

    loop {
        if run.phase.max_iterations.is_some_and(|max| count >= max) {
            set_progress(run, count, true);
            return finish(checkpointer, count, state, None).await;
        }
        if run.ctx.shutdown.is_stopping() {
            return interrupted(checkpointer).await;
        }
        let iteration_before = format!("iteration {}", count.saturating_sub(1));
        if let Err(stop) = run.check_budget(cost_known, &iteration_before) {
            return failed(checkpointer, stop).await;
        }
        let request = json!({
            "task_id": task_id,
            "phase": run.phase.name,
            "iteration": count,
            "state": state,
            "inputs": run.inputs,
            "attempt": run.attempt,
        });
        let stdout = match run.call(&request, Some(count)).await {
            Ok(Some(stdout)) => stdout,
            Ok(None) => return interrupted(checkpointer).await,
            Err(error) => return failed(checkpointer, error).await,
        };
        let reply: LoopReply = match run.parse_reply(&stdout, Some(count)) {
            Ok(reply) => reply,
            Err(error) => return failed(checkpointer, error).await,
        };
        cost_known = reply.cost.is_some();
        if let Some(cost) = reply.cost {
            if !(cost.is_finite() && cost >= 0.0) {
                let error = PhaseError::Command(format!(
                    "phase {:?} iteration {count}: cost must be a number of at least 0, not {cost}",
                    run.phase.name
                ));
                return failed(checkpointer, error).await;
            }
            run.add_cost(cost);
        }
        checkpointer.set_cost(run.cost());
        count += 1;
        state = reply.state;
        tracing::debug!(task_id, phase = %run.phase.name, iteration = count - 1, "iteration done");
        let last = reply.done || run.phase.max_iterations.is_some_and(|max| count >= max);
        if last {
            let end = finish(checkpointer, count, state, reply.output).await;
            set_progress(run, count, end.is_ok());
            return end;
        }
        let to_save = state.clone();
        let (returned, written) = blocking(move || {
            let written = checkpointer.checkpoint(count, &to_save);
            (checkpointer, written)
        })
        .await?;
        checkpointer = returned;
        let written = written.map_err(checkpoint_error)?;
        set_progress(run, count, written);
    }
}

/// Note the loop's progress in the task's `current_work` entry (persisted with the next write).
fn set_progress(run: &PhaseRun<'_>, count: u64, checkpointed: bool) {
    run.ctx.work.update(|w| {
        if let Some(entry) = w.get_mut(run.task.id()) {
            entry.iterations = count;
            if checkpointed {
                entry.last_checkpoint_at = Some(Utc::now());
            }
        }
    });
}

async fn finish(
    mut checkpointer: LoopCheckpointer,
    count: u64,
    state: Value,
    output: Option<Value>,
) -> Result<PhaseEnd, PhaseError> {
    let result = output.clone().unwrap_or_else(|| state.clone());
    blocking(move || checkpointer.finish(count, &state, output))
        .await?
        .map_err(checkpoint_error)?;
    Ok(PhaseEnd::Completed(result))
}

/// A stop: write the latest completed iteration if it is still pending.
async fn interrupted(mut checkpointer: LoopCheckpointer) -> Result<PhaseEnd, PhaseError> {
    blocking(move || checkpointer.flush())
        .await?
        .map_err(checkpoint_error)?;
    Ok(PhaseEnd::Interrupted)
}

/// A failed iteration: keep the completed ones (flush), then report the failure.
async fn failed(
    mut checkpointer: LoopCheckpointer,
    error: PhaseError,
) -> Result<PhaseEnd, PhaseError> {
    blocking(move || checkpointer.flush())
        .await?
        .map_err(checkpoint_error)?;
    Err(error)
}
