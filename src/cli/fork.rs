//! `cairn fork ID [--gen N] [--patch JSON] [--as NEW_ID]`: a new task that starts from a
//! checkpoint of another, with a JSON merge patch (RFC 7386) applied to its state.
//!
//! The new task gets its own copy of the checkpoint (`incremental/<new>.json.gz`, not marked
//! done, so its loop continues from there), a start point (`runs/<new>/start.json`: the phase
//! and the outputs of the phases before it), and is then submitted through the inbox like any
//! task. The original is not touched.

use std::collections::BTreeMap;
use std::path::Path;

use clap::Args;
use serde_json::Value;

use super::error::{print_line, CliError, CliResult, ExitCodeExt};
use super::{exit, format};
use crate::queue::{QueueDir, QueueReader};
use crate::store::current_work::StartPoint;
use crate::store::events::Event;
use crate::store::{CheckpointStore, FileStorage, IterationCheckpoint, Storage};
use crate::task::{random_suffix, Task};
use crate::task_id::TaskId;

#[derive(Debug, Args)]
pub struct ForkArgs {
    /// The task to fork.
    id: String,

    /// The checkpoint generation to start from (default: the latest; see `cairn history`).
    #[arg(long = "gen", value_name = "N")]
    generation: Option<u64>,

    /// A JSON merge patch (RFC 7386) applied to the checkpoint's state, e.g. '{"temperature": 0.2}'.
    #[arg(long, value_name = "JSON")]
    patch: Option<String>,

    /// The new task's id (default: the old one with a random suffix).
    #[arg(long = "as", value_name = "NEW_ID")]
    new_id: Option<String>,
}

pub fn run(queue: &Path, args: ForkArgs) -> CliResult {
    let new_id = fork(queue, &args)?;
    print_line(new_id)
}

fn fork(queue: &Path, args: &ForkArgs) -> CliResult<TaskId> {
    let failure = CliError::failure;
    let id = format::task_id_arg(&args.id).exit_code(exit::USAGE)?;
    let patch: Option<Value> = args
        .patch
        .as_deref()
        .map(serde_json::from_str)
        .transpose()
        .map_err(|e| CliError::usage(format!("--patch is not JSON: {e}")))?;
    let reader = QueueReader::open(queue);
    let storage = FileStorage::new(queue);
    let mut task = source_task(&reader, queue, &args.id)?;
    let new_id = new_task_id(&storage, queue, &id, args)?;
    let checkpoints = CheckpointStore::with_storage(std::sync::Arc::new(storage.clone()));
    let mut checkpoint = source_checkpoint(&reader, args, &task)?;
    let from_generation = checkpoint.generation;
    let phase_index = checkpoint.phase_index;
    let earlier_outputs = earlier_outputs(&reader, &args.id, &task, phase_index)?;

    if let Some(patch) = &patch {
        json_patch::merge(&mut checkpoint.partial_results, patch);
    }
    checkpoint.task_id = new_id.to_string();
    checkpoint.done = false;
    checkpoint.output = None;
    checkpoint.attempt = 0;
    checkpoint.cost = None;
    checkpoints
        .save(&mut checkpoint)
        .map_err(|e| failure(format!("writing the new task's checkpoint: {e}")))?;

    let start = StartPoint {
        phase_index,
        phase_outputs: earlier_outputs,
        forked_from: args.id.clone(),
        generation: from_generation,
    };
    let start_bytes = serde_json::to_vec_pretty(&start).map_err(|e| failure(e.to_string()))?;
    storage
        .put(&StartPoint::key(&new_id), &start_bytes, None)
        .map_err(|e| failure(format!("writing {}: {e}", StartPoint::key(&new_id))))?;

    task.id = Some(new_id.clone());
    let inbox_key = QueueDir::inbox_key(&new_id);
    storage
        .put(&inbox_key, &task.to_json_bytes(), None)
        .map_err(|e| failure(format!("writing {}: {e}", queue.join(&inbox_key).display())))?;
    crate::store::journal::append(
        queue,
        &id,
        Event::Forked {
            new_id: new_id.clone(),
            generation: from_generation,
            patched: patch.is_some(),
        },
    );
    Ok(new_id)
}

/// The definition of the task to fork.
fn source_task(reader: &QueueReader, queue: &Path, id: &str) -> CliResult<Task> {
    let task_bytes = reader
        .definition_bytes(id)
        .map_err(|e| {
            CliError::failure(format!(
                "reading {}: {e}",
                reader.dir().task_file(id).display()
            ))
        })?
        .ok_or_else(|| {
            CliError::failure(format!("queue {} has no task {id:?}", queue.display()))
        })?;
    Task::parse_stored(&task_bytes)
        .map_err(|e| CliError::failure(format!("{}: {e}", QueueDir::task_key(id))))
}

/// `--as`, or a new id made from the old one; refused when the queue has it already.
fn new_task_id(
    storage: &FileStorage,
    queue: &Path,
    id: &TaskId,
    args: &ForkArgs,
) -> CliResult<TaskId> {
    let new_id = match &args.new_id {
        Some(new_id) => {
            TaskId::parse(new_id.as_str()).map_err(|e| CliError::usage(format!("--as: {e}")))?
        }
        None => TaskId::generate(id, &random_suffix()),
    };
    for key in QueueDir::keys_of_id(&new_id) {
        let found = storage.get(&key).map_err(|e| {
            CliError::failure(format!("reading {}: {e}", queue.join(&key).display()))
        })?;
        if found.is_some() {
            return Err(CliError::usage(format!(
                "a task with id {new_id:?} already exists ({key})"
            )));
        }
    }
    Ok(new_id)
}

/// The checkpoint to start from (`--gen`, or the latest), checked to be of a phase the task
/// has.
fn source_checkpoint(
    reader: &QueueReader,
    args: &ForkArgs,
    task: &Task,
) -> CliResult<IterationCheckpoint> {
    let failure = CliError::failure;
    let checkpoints = reader.checkpoints();
    let checkpoint = match args.generation {
        Some(generation) => checkpoints
            .generation(&args.id, generation)
            .map_err(|e| failure(e.to_string()))?,
        None => checkpoints
            .latest(&args.id)
            .map_err(|e| failure(e.to_string()))?
            .map(|loaded| loaded.checkpoint)
            .ok_or_else(|| failure(format!("task {:?} has no checkpoint to fork from", args.id)))?,
    };
    let phase_index = checkpoint.phase_index;
    if task.phases.get(phase_index).map(|p| p.name.as_str()) != Some(checkpoint.phase.as_str()) {
        return Err(failure(format!(
            "checkpoint generation {} of {:?} is for phase {:?} (index {phase_index}), which the task does not have",
            checkpoint.generation, args.id, checkpoint.phase
        )));
    }
    Ok(checkpoint)
}

/// The outputs of the phases before `phase_index`: from the task's record if it has finished,
/// else from `current_work.json`.
fn earlier_outputs(
    reader: &QueueReader,
    id: &str,
    task: &Task,
    phase_index: usize,
) -> CliResult<BTreeMap<String, Value>> {
    let needed: Vec<&str> = task.phases[..phase_index]
        .iter()
        .map(|p| p.name.as_str())
        .collect();
    if needed.is_empty() {
        return Ok(BTreeMap::new());
    }
    let mut found = reader.phase_outputs(id);
    let mut outputs = BTreeMap::new();
    for name in needed {
        let value = found.remove(name).ok_or_else(|| {
            CliError::failure(format_args!(
                "the output of phase {name:?} of {id:?} is not available in {} (the new task needs it as input)",
                reader.root().display()
            ))
        })?;
        outputs.insert(name.to_string(), value);
    }
    Ok(outputs)
}
