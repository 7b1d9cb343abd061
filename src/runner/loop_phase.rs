//! `loop` phases: cairn drives the loop, one command run per iteration.
//!
//! Iteration `i` (0-based) gets `{task_id, phase, iteration: i, state, inputs, attempt}` on stdin
//! and replies `{state, done?, cost?, output?}`. After each completed iteration the state is
//! handed to the [`crate::store::LoopCheckpointer`], which writes every `checkpoint_every` iterations; on a stop
//! the latest completed iteration is flushed, so a clean stop never loses a finished iteration.
//! The loop ends on `"done": true` or at `max_iterations`; its output is the last reply's
//! `output`, else the final state. The final checkpoint is marked done, so a crash right after
//! it does not run the loop again. A reply may name files in the scratch directory (`files`),
//! kept with its checkpoint; each later request names the files of the state it carries, and
//! a resume finds the resumed checkpoint's files in place.

use serde::Deserialize;
use serde_json::{json, Value};

use super::checkpointing::{Files, PhaseCheckpointer};
use super::{PhaseEnd, PhaseError, PhaseRun};

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
    /// Files in the scratch directory the checkpoint keeps: name → relative path.
    #[serde(default)]
    files: Files,
}

pub(super) async fn run(run: &PhaseRun<'_>) -> Result<PhaseEnd, PhaseError> {
    let task_id = run.task.id().to_string();
    let mut checkpoints = PhaseCheckpointer::new(run, LOOP_SCOPE);
    let (mut count, mut files, mut state) = match checkpoints.resume().await? {
        Some(cp) if cp.done => {
            tracing::info!(task_id, phase = %run.phase.name, iterations = cp.iteration_count, "loop already finished");
            set_progress(run, cp.iteration_count);
            return Ok(PhaseEnd::Completed(cp.output.unwrap_or(cp.partial_results)));
        }
        Some(cp) => {
            tracing::info!(task_id, phase = %run.phase.name, iteration = cp.iteration_count, "resuming loop");
            (cp.iteration_count, named_files(&cp), cp.partial_results)
        }
        None => (0, Files::new(), initial_state(run)),
    };
    set_progress(run, count);
    // Whether the last iteration reported its cost (nothing is unknown before the first).
    let mut cost_known = true;

    loop {
        if run.phase.max_iterations.is_some_and(|max| count >= max) {
            checkpoints
                .finish(count, state.clone(), None, Files::new())
                .await?;
            return Ok(PhaseEnd::Completed(state));
        }
        if run.should_stop() {
            checkpoints.flush().await?;
            return Ok(PhaseEnd::Interrupted);
        }
        let reply = match next_reply(run, count, &state, &files, cost_known).await {
            Ok(Some(reply)) => reply,
            Ok(None) => {
                checkpoints.flush().await?;
                return Ok(PhaseEnd::Interrupted);
            }
            Err(error) => {
                // Keep the iterations that did complete, then report the failure.
                checkpoints.flush().await?;
                return Err(error);
            }
        };
        cost_known = reply.cost.is_some();
        count += 1;
        state = reply.state;
        files = reply.files;
        set_progress(run, count);
        tracing::debug!(task_id, phase = %run.phase.name, iteration = count - 1, "iteration done");
        if reply.done || run.phase.max_iterations.is_some_and(|max| count >= max) {
            let result = reply.output.clone().unwrap_or_else(|| state.clone());
            checkpoints
                .finish(count, state, reply.output, files)
                .await?;
            return Ok(PhaseEnd::Completed(result));
        }
        checkpoints
            .checkpoint(count, state.clone(), files.clone())
            .await?;
    }
}

/// Run iteration `count` on `state` and `files`, once the budget (its cost known or not
/// after the last iteration) and the daemon let a command start: its reply, its cost counted;
/// `None` when the run was stopped meanwhile.
async fn next_reply(
    run: &PhaseRun<'_>,
    count: u64,
    state: &Value,
    files: &Files,
    cost_known: bool,
) -> Result<Option<LoopReply>, PhaseError> {
    let iteration_before = format!("iteration {}", count.saturating_sub(1));
    run.check_budget(cost_known, &iteration_before)?;
    let request = request(run, count, state, files);
    run.command_may_start().await?;
    let Some(stdout) = run.call(&request, Some(count)).await? else {
        return Ok(None);
    };
    let reply = run.parse_reply::<LoopReply>(&stdout, Some(count))?;
    let reply = validate_cost(run, count, reply)?;
    if let Some(cost) = reply.cost {
        run.add_iteration_cost(cost).await?;
    }
    Ok(Some(reply))
}

/// Iteration `count`'s request; `files` are those the state's checkpoint names.
fn request(run: &PhaseRun<'_>, count: u64, state: &Value, files: &Files) -> Value {
    let mut request = json!({
        "task_id": run.task.id().as_str(),
        "phase": run.phase.name,
        "iteration": count,
        "state": state,
        "inputs": run.inputs,
        "attempt": run.attempt,
    });
    if !files.is_empty() {
        request["files"] = json!(files);
    }
    request
}

/// The state a loop starts from when no checkpoint of it exists.
fn initial_state(run: &PhaseRun<'_>) -> Value {
    run.phase.initial_state.clone().unwrap_or(Value::Null)
}

/// The files a checkpoint names, as a command names them: name → path.
fn named_files(cp: &crate::store::IterationCheckpoint) -> Files {
    cp.files
        .iter()
        .map(|(name, f)| (name.clone(), f.path.clone()))
        .collect()
}

fn validate_cost(
    run: &PhaseRun<'_>,
    iteration: u64,
    reply: LoopReply,
) -> Result<LoopReply, PhaseError> {
    match reply.cost {
        Some(cost) if !(cost.is_finite() && cost >= 0.0) => Err(PhaseError::Command(format!(
            "phase {:?} iteration {iteration}: cost must be a number of at least 0, not {cost}",
            run.phase.name
        ))),
        _ => Ok(reply),
    }
}

/// Note the loop's progress in the task's `current_work` entry (persisted with the next write).
fn set_progress(run: &PhaseRun<'_>, count: u64) {
    run.ctx.work.update(|w| {
        if let Some(entry) = w.get_mut(run.task.id()) {
            entry.iterations = count;
        }
    });
}
