//! `cairn fork ID [--gen N] [--patch JSON] [--as NEW_ID]`: a new task that starts from a
//! checkpoint of another, with a JSON merge patch (RFC 7386) applied to its state.
//!
//! The new task gets its own copy of the checkpoint (`incremental/<new>.json.gz`, not marked
//! done, so its loop continues from there), a start point (`runs/<new>/start.json`: the phase
//! and the outputs of the phases before it), and is then submitted through the inbox like any
//! task. The original is not touched. The new task's submitter is the user who forks (the
//! owner of the file written into the inbox), never the original's.

use std::collections::BTreeMap;
use std::path::Path;

use clap::Args;
use serde_json::Value;

use super::error::{print_line, CliError, CliResult, ExitCodeExt};
use super::source::DbArg;
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

    #[command(flatten)]
    pub(super) db: DbArg,
}

pub fn run(queue: &Path, args: ForkArgs) -> CliResult {
    print_line(fork_any(queue, &args)?)
}

/// Fork as `cairn fork` does, in the queue directory or the shared queue `--db` names; the
/// new task's id.
fn fork_any(queue: &Path, args: &ForkArgs) -> CliResult<String> {
    if let Some(url) = args.db.url() {
        return Ok(fork_db(url, args)?.to_string());
    }
    Ok(fork(queue, args)?.to_string())
}

/// Fork the latest checkpoint of `id` with an optional merge `patch` (JSON text) as
/// `new_id` (else a fresh id), as `cairn fork` does: for the dashboard. The new task's id.
pub fn fork_latest(
    queue: &Path,
    db: Option<&str>,
    id: &str,
    patch: Option<String>,
    new_id: Option<String>,
) -> CliResult<String> {
    let args = ForkArgs {
        id: id.to_string(),
        generation: None,
        patch,
        new_id,
        db: DbArg::with_url(db.map(str::to_string)),
    };
    fork_any(queue, &args)
}

/// The patch of `--patch`, parsed.
fn patch_arg(args: &ForkArgs) -> CliResult<Option<Value>> {
    args.patch
        .as_deref()
        .map(serde_json::from_str)
        .transpose()
        .map_err(|e| CliError::usage(format!("--patch is not JSON: {e}")))
}

/// Make the forked checkpoint the new task's (see [`IterationCheckpoint::fork_as`]).
fn make_own(checkpoint: &mut IterationCheckpoint, new_id: &TaskId, patch: Option<&Value>) {
    checkpoint.fork_as(new_id.as_str(), patch);
}

/// Check that `checkpoint` is of a phase `task` has.
fn check_phase(checkpoint: &IterationCheckpoint, id: &str, task: &Task) -> CliResult {
    let phase_index = checkpoint.phase_index;
    if task.phases.get(phase_index).map(|p| p.name.as_str()) != Some(checkpoint.phase.as_str()) {
        return Err(CliError::failure(format!(
            "checkpoint generation {} of {id:?} is for phase {:?} (index {phase_index}), which the task does not have",
            checkpoint.generation, checkpoint.phase
        )));
    }
    Ok(())
}

/// The outputs among `found` of the phases before `phase_index`, each of which is needed.
fn needed_outputs(
    mut found: BTreeMap<String, Value>,
    id: &str,
    task: &Task,
    phase_index: usize,
    where_from: &dyn std::fmt::Display,
) -> CliResult<BTreeMap<String, Value>> {
    let mut outputs = BTreeMap::new();
    for phase in &task.phases[..phase_index] {
        let name = phase.name.as_str();
        let value = found.remove(name).ok_or_else(|| {
            CliError::failure(format_args!(
                "the output of phase {name:?} of {id:?} is not available in {where_from} (the new task needs it as input)"
            ))
        })?;
        outputs.insert(name.to_string(), value);
    }
    Ok(outputs)
}

fn fork(queue: &Path, args: &ForkArgs) -> CliResult<TaskId> {
    let failure = CliError::failure;
    let id = format::task_id_arg(&args.id).exit_code(exit::USAGE)?;
    let patch = patch_arg(args)?;
    let reader = QueueReader::open(queue);
    let storage = FileStorage::new(queue);
    let mut task = source_task(&reader, queue, &args.id)?;
    let new_id = new_task_id(&storage, queue, &id, args)?;
    let checkpoints = CheckpointStore::with_storage(std::sync::Arc::new(storage.clone()))
        .with_blobs_of_queue(queue);
    let mut checkpoint = source_checkpoint(&reader, args, &task)?;
    let from_generation = checkpoint.generation;
    let phase_index = checkpoint.phase_index;
    let earlier_outputs = earlier_outputs(&reader, &args.id, &task, phase_index)?;

    make_own(&mut checkpoint, &new_id, patch.as_ref());
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
    // The new task is the forking user's: intake records the owner of the file written here
    // (this user) as its submitter, and refuses a file that names one.
    task.submitted_by = None;
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
    check_phase(&checkpoint, &args.id, task)?;
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
    if phase_index == 0 {
        return Ok(BTreeMap::new());
    }
    let found = reader.phase_outputs(id);
    needed_outputs(found, id, task, phase_index, &reader.root().display())
}

/// The fork in the queue shared in the database at `url`: the same checks and the same new
/// task as [`fork`], written in one transaction (see `queue::postgres::fork`).
#[cfg(feature = "postgres")]
fn fork_db(url: &str, args: &ForkArgs) -> CliResult<TaskId> {
    use crate::queue::postgres::{ForkError, NewTask};

    let failure = CliError::failure;
    let id = format::task_id_arg(&args.id).exit_code(exit::USAGE)?;
    let patch = patch_arg(args)?;
    let shared = super::shared_queue::SharedQueue::open(url)?;
    let (runtime, db) = (&shared.runtime, &shared.db);
    let source = runtime
        .block_on(db.fork_source(&id))?
        .ok_or_else(|| failure(format!("the shared queue has no task {:?}", args.id)))?;
    let mut task = Task::parse_stored(source.definition.as_bytes())
        .map_err(|e| failure(format!("task {:?} in the shared queue: {e}", args.id)))?;
    let new_id = match &args.new_id {
        Some(new_id) => {
            TaskId::parse(new_id.as_str()).map_err(|e| CliError::usage(format!("--as: {e}")))?
        }
        None => TaskId::generate(&id, &random_suffix()),
    };
    let stored = runtime.block_on(db.checkpoints(&args.id))?;
    let mut checkpoint = pick_checkpoint(&stored, args)?;
    check_phase(&checkpoint, &args.id, &task)?;
    let (from_generation, phase_index) = (checkpoint.generation, checkpoint.phase_index);
    let phase_outputs = needed_outputs(
        source.phase_outputs,
        &args.id,
        &task,
        phase_index,
        &"the shared queue",
    )?;
    make_own(&mut checkpoint, &new_id, patch.as_ref());
    let start = StartPoint {
        phase_index,
        phase_outputs,
        forked_from: args.id.clone(),
        generation: from_generation,
    };
    task.id = Some(new_id.clone());
    // The new task is the forking user's, not the original's submitter's.
    task.submitted_by = Some(crate::submitter::Submitter::current());
    let definition = String::from_utf8_lossy(&task.to_json_bytes()).into_owned();
    let new_task = NewTask::of(&task, &definition);
    match runtime.block_on(db.submit_fork(&new_task, &start, &mut checkpoint, patch.is_some())) {
        Ok(()) => Ok(new_id),
        Err(ForkError::IdTaken(_)) => Err(CliError::usage(format!(
            "a task with id {new_id:?} already exists in the shared queue"
        ))),
        Err(ForkError::Db(e)) => Err(e.into()),
    }
}

#[cfg(not(feature = "postgres"))]
fn fork_db(_url: &str, _args: &ForkArgs) -> CliResult<TaskId> {
    Err(super::source::without_postgres())
}

/// The stored generation `--gen` names, or the newest that decodes.
#[cfg(feature = "postgres")]
fn pick_checkpoint(
    stored: &[crate::queue::postgres::StoredCheckpoint],
    args: &ForkArgs,
) -> CliResult<IterationCheckpoint> {
    let failure = CliError::failure;
    let id = &args.id;
    match args.generation {
        Some(generation) => {
            let found = stored
                .iter()
                .find(|c| c.generation == generation)
                .ok_or_else(|| {
                    failure(format!(
                        "task {id:?} has no checkpoint generation {generation} (see `cairn history`)"
                    ))
                })?;
            crate::store::decode_checkpoint(&found.bytes)
                .map_err(|e| failure(format!("checkpoint generation {generation} of {id:?}: {e}")))
        }
        None => stored
            .iter()
            .find_map(|c| crate::store::decode_checkpoint(&c.bytes).ok())
            .ok_or_else(|| failure(format!("task {id:?} has no checkpoint to fork from"))),
    }
}
