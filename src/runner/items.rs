//! `items` phases: one command run per item of a list, up to `concurrency` at once.
//!
//! Item `i` gets `{task_id, phase, index: i, item, inputs, attempt}` on stdin; its stdout (JSON)
//! is its result. Results are kept per item index in the checkpoint's state
//! (`{"results": {"<index>": result}}`, `iteration_count` = items completed), written every
//! `checkpoint_every` completed items and on a stop, so a resume runs only the items not yet
//! done. The phase output is the array of results in item order. A failing item fails the
//! attempt once the items in flight have finished (and been checkpointed); the task's retry
//! policy then runs the remaining items again.

use std::collections::BTreeMap;

use futures::stream::{FuturesUnordered, StreamExt};
use serde_json::{json, Map, Value};

use super::checkpointing::{Files, PhaseCheckpointer};
use super::{PhaseEnd, PhaseError, PhaseRun};

/// The scope name of the daemon's items checkpoints.
pub(super) const ITEMS_SCOPE: &str = "items";

/// The list the phase works through.
fn items_of(run: &PhaseRun<'_>) -> Result<Vec<Value>, PhaseError> {
    if let Some(items) = &run.phase.items {
        return Ok(items.clone());
    }
    let from = run.phase.items_from.as_deref().unwrap_or_default();
    match run.inputs.get(from) {
        Some(Value::Array(items)) => Ok(items.clone()),
        Some(other) => {
            let kind = match other {
                Value::Null => "null",
                Value::Bool(_) => "a boolean",
                Value::Number(_) => "a number",
                Value::String(_) => "a string",
                Value::Object(_) => "an object",
                Value::Array(_) => "an array",
            };
            Err(PhaseError::Command(format!(
                "phase {:?}: items_from {from:?}: that phase's output is {kind}, not a JSON array",
                run.phase.name
            )))
        }
        None => Err(PhaseError::Command(format!(
            "phase {:?}: items_from {from:?}: no output of that phase",
            run.phase.name
        ))),
    }
}

fn state_of(results: &BTreeMap<usize, Value>) -> Value {
    let map: Map<String, Value> = results
        .iter()
        .map(|(index, result)| (index.to_string(), result.clone()))
        .collect();
    json!({ "results": map })
}

/// Results from a checkpoint's state; indices outside the list are ignored.
fn results_of(state: &Value, len: usize) -> Result<BTreeMap<usize, Value>, PhaseError> {
    let Some(map) = state.get("results").and_then(Value::as_object) else {
        return Err(PhaseError::Command(
            "the items checkpoint has no `results` object".into(),
        ));
    };
    let mut results = BTreeMap::new();
    for (key, value) in map {
        match key.parse::<usize>() {
            Ok(index) if index < len => {
                results.insert(index, value.clone());
            }
            _ => {
                return Err(PhaseError::Command(format!(
                    "the items checkpoint has a result for {key:?}, which is not an item index"
                )))
            }
        }
    }
    Ok(results)
}

pub(super) async fn run(run: &PhaseRun<'_>) -> Result<PhaseEnd, PhaseError> {
    let items = items_of(run)?;
    let task_id = run.task.id().to_string();
    let mut checkpoints = PhaseCheckpointer::new(run, ITEMS_SCOPE);
    let resumed = checkpoints.resume().await?;
    let mut results = match resumed {
        Some(cp) if cp.done => {
            return Ok(PhaseEnd::Completed(cp.output.unwrap_or(cp.partial_results)))
        }
        Some(cp) => {
            let results = results_of(&cp.partial_results, items.len())?;
            tracing::info!(task_id, phase = %run.phase.name, done = results.len(), total = items.len(), "resuming items");
            results
        }
        None => BTreeMap::new(),
    };
    set_progress(run, results.len());
    // A spent budget starts no item (a finished phase, above, is not held back by it).
    run.check_budget(true, "")?;

    let concurrency = run.phase.concurrency.unwrap_or(1).max(1) as usize;
    let mut todo = (0..items.len())
        .filter(|i| !results.contains_key(i))
        .collect::<Vec<_>>()
        .into_iter();
    let mut in_flight = FuturesUnordered::new();
    let mut failure: Option<PhaseError> = None;
    let mut interrupted = false;
    loop {
        while failure.is_none() && !run.should_stop() && in_flight.len() < concurrency {
            let Some(index) = todo.next() else { break };
            in_flight.push(run_item(run, index, &items[index]));
        }
        let Some((index, outcome)) = in_flight.next().await else {
            break;
        };
        match outcome {
            Ok(Some(result)) => {
                results.insert(index, result);
                let count = results.len() as u64;
                let state = state_of(&results);
                if let Err(e) = checkpoints.checkpoint(count, state, Files::new()).await {
                    failure.get_or_insert(e);
                }
                set_progress(run, results.len());
            }
            Ok(None) => interrupted = true,
            Err(error) => {
                failure.get_or_insert(error);
            }
        }
    }

    if let Some(error) = failure {
        checkpoints.flush().await?;
        return Err(error);
    }
    if interrupted || results.len() < items.len() {
        checkpoints.flush().await?;
        return Ok(PhaseEnd::Interrupted);
    }
    let output = Value::Array(results.values().cloned().collect());
    let count = results.len() as u64;
    let state = state_of(&results);
    checkpoints
        .finish(count, state, Some(output.clone()), Files::new())
        .await?;
    Ok(PhaseEnd::Completed(output))
}

/// Run one item: `Ok(None)` when a stop interrupted it.
async fn run_item(
    run: &PhaseRun<'_>,
    index: usize,
    item: &Value,
) -> (usize, Result<Option<Value>, PhaseError>) {
    let request = json!({
        "task_id": run.task.id(),
        "phase": run.phase.name,
        "index": index,
        "item": item,
        "inputs": run.inputs,
        "attempt": run.attempt,
    });
    let iteration = Some(index as u64);
    let outcome = match run.call(&request, iteration).await {
        Ok(Some(stdout)) if stdout.iter().all(u8::is_ascii_whitespace) => Ok(Some(Value::Null)),
        Ok(Some(stdout)) => run.parse_reply(&stdout, iteration).map(Some),
        Ok(None) => Ok(None),
        Err(error) => Err(error),
    };
    let outcome = outcome.map_err(|error| match error {
        PhaseError::Command(message) => PhaseError::Command(format!("item {index}: {message}")),
        other => other,
    });
    (index, outcome)
}

fn set_progress(run: &PhaseRun<'_>, done: usize) {
    run.ctx.work.update(|w| {
        if let Some(entry) = w.get_mut(run.task.id()) {
            entry.iterations = done as u64;
        }
    });
}
