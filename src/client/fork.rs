//! Forking: a new task that starts from a checkpoint of another, with a JSON merge patch
//! (RFC 7386) applied to its state, or (`from_phase`) from the start of one of its phases with
//! the outputs of the phases before it. The source is never touched.
//!
//! In a queue directory the new task gets its own copy of the checkpoint, a start point (the
//! phase and the outputs of the phases before it) and is then submitted through the inbox like
//! any task; in the shared queue all of it is one transaction. The new task's submitter is the
//! user who forks, never the original's.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use super::{writable_root, Backend, ClientError, ClientResult, QueueClient};
use crate::queue::QueueReader;
use crate::store::current_work::StartPoint;
use crate::store::events::Event;
use crate::store::{CheckpointStore, FileStorage, IterationCheckpoint, Storage};
use crate::task::{random_suffix, Task};
use crate::task_id::TaskId;

/// What to fork, and how.
#[derive(Debug, Clone)]
pub struct ForkRequest {
    /// The task to fork.
    pub id: TaskId,
    /// The checkpoint generation to start from (default: the latest). Not with `from_phase`.
    pub generation: Option<u64>,
    /// A merge patch: of the checkpoint's state, or with `from_phase` of the earlier phases'
    /// outputs (an object by phase name), which the restarted phase reads.
    pub patch: Option<Value>,
    /// The new task's id (default: the old one with a random suffix).
    pub new_id: Option<TaskId>,
    /// Start at the beginning of this phase instead of at a checkpoint.
    pub from_phase: Option<String>,
}

/// Where a fork starts: the phase, the outputs before it, and the checkpoint it continues
/// from (none when it restarts a phase).
struct Start {
    phase_index: usize,
    outputs: BTreeMap<String, Value>,
    checkpoint: Option<IterationCheckpoint>,
    generation: u64,
}

impl QueueClient {
    /// Fork as `cairn fork` does; the new task's id.
    pub fn fork(&self, request: &ForkRequest) -> ClientResult<TaskId> {
        if request.from_phase.is_some() && request.generation.is_some() {
            return Err(ClientError::usage(
                "--from-phase starts a phase from its beginning; it takes no --gen",
            ));
        }
        match &self.backend {
            Backend::Files { root, writable } => fork_file(writable_root(root, writable)?, request),
            #[cfg(feature = "postgres")]
            Backend::Database(shared) => fork_db(shared, request),
        }
    }
}

/// The index of phase `name` of `task`, which must not be its first (nothing to keep).
fn phase_named(task: &Task, id: &TaskId, name: &str) -> ClientResult<usize> {
    let names: Vec<&str> = task.phases.iter().map(|p| p.name.as_str()).collect();
    match names.iter().position(|n| *n == name) {
        Some(index) => Ok(index),
        None => Err(ClientError::usage(format_args!(
            "--from-phase: task {:?} has no phase {name:?} (its phases: {})",
            id.as_str(),
            names.join(", ")
        ))),
    }
}

/// Check that `checkpoint` is of a phase `task` has.
fn check_phase(checkpoint: &IterationCheckpoint, id: &TaskId, task: &Task) -> ClientResult<()> {
    let phase_index = checkpoint.phase_index;
    if task.phases.get(phase_index).map(|p| p.name.as_str()) != Some(checkpoint.phase.as_str()) {
        return Err(ClientError::failure(format_args!(
            "checkpoint generation {} of {:?} is for phase {:?} (index {phase_index}), which the \
             task does not have",
            checkpoint.generation,
            id.as_str(),
            checkpoint.phase
        )));
    }
    Ok(())
}

/// The outputs among `found` of the phases before `phase_index`, each of which is needed.
fn needed_outputs(
    mut found: BTreeMap<String, Value>,
    id: &TaskId,
    task: &Task,
    phase_index: usize,
    where_from: &dyn std::fmt::Display,
) -> ClientResult<BTreeMap<String, Value>> {
    let mut outputs = BTreeMap::new();
    for phase in &task.phases[..phase_index] {
        let name = phase.name.as_str();
        let value = found.remove(name).ok_or_else(|| {
            ClientError::failure(format_args!(
                "the output of phase {name:?} of {:?} is not available in {where_from} (the new \
                 task needs it as input)",
                id.as_str()
            ))
        })?;
        outputs.insert(name.to_string(), value);
    }
    Ok(outputs)
}

/// `patch` applied to the earlier phases' outputs, which must stay the same phases.
fn patch_outputs(
    outputs: BTreeMap<String, Value>,
    patch: &Value,
) -> ClientResult<BTreeMap<String, Value>> {
    let mut doc = Value::Object(outputs.into_iter().collect());
    json_patch::merge(&mut doc, patch);
    let Value::Object(patched) = doc else {
        return Err(ClientError::usage(
            "--patch with --from-phase patches the earlier phases' outputs: an object by phase \
             name",
        ));
    };
    Ok(patched.into_iter().collect())
}

/// Where the fork starts, given the source's `task`, its checkpoints and its phases' outputs
/// (read only when needed: a restart at the first phase needs none).
fn start_of(
    request: &ForkRequest,
    task: &Task,
    checkpoint: impl FnOnce() -> ClientResult<IterationCheckpoint>,
    outputs: impl FnOnce() -> ClientResult<BTreeMap<String, Value>>,
    where_from: &dyn std::fmt::Display,
) -> ClientResult<Start> {
    let id = &request.id;
    let (phase_index, checkpoint) = match &request.from_phase {
        Some(name) => (phase_named(task, id, name)?, None),
        None => {
            let mut checkpoint = checkpoint()?;
            check_phase(&checkpoint, id, task)?;
            let index = checkpoint.phase_index;
            let new_id = request.new_id.as_ref().unwrap_or(id);
            checkpoint.fork_as(new_id.as_str(), request.patch.as_ref());
            (index, Some(checkpoint))
        }
    };
    let found = if phase_index == 0 {
        BTreeMap::new()
    } else {
        outputs()?
    };
    let mut outputs = needed_outputs(found, id, task, phase_index, where_from)?;
    if let (Some(patch), None) = (&request.patch, &checkpoint) {
        outputs = patch_outputs(outputs, patch)?;
    }
    let generation = checkpoint.as_ref().map_or(0, |c| c.generation);
    Ok(Start {
        phase_index,
        outputs,
        checkpoint,
        generation,
    })
}

impl Start {
    fn point(&self, forked_from: &TaskId) -> StartPoint {
        StartPoint {
            phase_index: self.phase_index,
            phase_outputs: self.outputs.clone(),
            forked_from: forked_from.to_string(),
            generation: self.generation,
        }
    }
}

/// `new_id`, or a new id made from the old one.
fn new_id_of(request: &ForkRequest) -> TaskId {
    request
        .new_id
        .clone()
        .unwrap_or_else(|| TaskId::generate(&request.id, &random_suffix()))
}

fn fork_file(root: &Path, request: &ForkRequest) -> ClientResult<TaskId> {
    let id = &request.id;
    let reader = QueueReader::open(root);
    let storage = FileStorage::new(root);
    let mut task = source_task(&reader, root, id)?;
    let new_id = new_id_of(request);
    if !super::QueueClient::files(root).id_is_free(&new_id)? {
        return Err(ClientError::usage(format_args!(
            "a task with id {:?} already exists in the queue {}",
            new_id.as_str(),
            root.display()
        )));
    }
    let request = ForkRequest {
        new_id: Some(new_id.clone()),
        ..request.clone()
    };
    let start = start_of(
        &request,
        &task,
        || source_checkpoint(&reader, &request),
        || Ok(reader.phase_outputs(id)),
        &reader.root().display(),
    )?;
    if let Some(mut checkpoint) = start.checkpoint.clone() {
        let checkpoints = CheckpointStore::with_storage(std::sync::Arc::new(storage.clone()))
            .with_blobs_of_queue(root);
        checkpoints.save(&mut checkpoint).map_err(|e| {
            ClientError::failure(format_args!("writing the new task's checkpoint: {e}"))
        })?;
    }
    let start_bytes = serde_json::to_vec_pretty(&start.point(id)).map_err(ClientError::failure)?;
    let start_key = StartPoint::key(&new_id);
    storage
        .put(&start_key, &start_bytes, None)
        .map_err(|e| ClientError::failure(format_args!("writing {start_key}: {e}")))?;
    task.id = Some(new_id.clone());
    // The new task is the forking user's: intake records the owner of the file written here
    // (this user) as its submitter, and refuses a file that names one.
    task.submitted_by = None;
    let inbox_key = crate::queue::QueueDir::inbox_key(&new_id);
    storage
        .put(&inbox_key, &task.to_json_bytes(), None)
        .map_err(|e| {
            ClientError::failure(format_args!(
                "writing {}: {e}",
                root.join(&inbox_key).display()
            ))
        })?;
    crate::store::journal::append(
        root,
        id,
        Event::Forked {
            new_id: new_id.clone(),
            generation: start.generation,
            patched: request.patch.is_some(),
        },
    );
    Ok(new_id)
}

/// The definition of the task to fork.
fn source_task(reader: &QueueReader, root: &Path, id: &TaskId) -> ClientResult<Task> {
    let task_bytes = reader
        .definition_bytes(id)
        .map_err(|e| {
            ClientError::failure(format_args!(
                "reading {}: {e}",
                reader.dir().task_file(id).display()
            ))
        })?
        .ok_or_else(|| {
            ClientError::failure(format_args!(
                "queue {} has no task {:?}",
                root.display(),
                id.as_str()
            ))
        })?;
    Task::parse_stored(&task_bytes).map_err(|e| {
        ClientError::failure(format_args!(
            "{}: {e}",
            crate::queue::QueueDir::task_key(id)
        ))
    })
}

/// The checkpoint to start from (the request's generation, or the latest).
fn source_checkpoint(
    reader: &QueueReader,
    request: &ForkRequest,
) -> ClientResult<IterationCheckpoint> {
    let checkpoints = reader.checkpoints();
    let id = &request.id;
    match request.generation {
        Some(generation) => checkpoints
            .generation(id, generation)
            .map_err(ClientError::failure),
        None => checkpoints
            .latest(id)
            .map_err(ClientError::failure)?
            .map(|loaded| loaded.checkpoint)
            .ok_or_else(|| {
                ClientError::failure(format_args!(
                    "task {:?} has no checkpoint to fork from",
                    id.as_str()
                ))
            }),
    }
}

/// The fork in the shared queue: the same checks and the same new task as in a directory,
/// written in one transaction (see `queue::postgres::fork`).
#[cfg(feature = "postgres")]
fn fork_db(shared: &super::database::SharedQueue, request: &ForkRequest) -> ClientResult<TaskId> {
    use crate::queue::postgres::{ForkError, NewTask};

    let id = &request.id;
    let source = shared.block_on(shared.db.fork_source(id))?.ok_or_else(|| {
        ClientError::failure(format_args!(
            "the shared queue has no task {:?}",
            id.as_str()
        ))
    })?;
    let mut task = Task::parse_stored(source.definition.as_bytes()).map_err(|e| {
        ClientError::failure(format_args!(
            "task {:?} in the shared queue: {e}",
            id.as_str()
        ))
    })?;
    let new_id = new_id_of(request);
    let request = ForkRequest {
        new_id: Some(new_id.clone()),
        ..request.clone()
    };
    let start = start_of(
        &request,
        &task,
        || {
            let stored = shared.block_on(shared.db.checkpoints(id))?;
            pick_checkpoint(&stored, &request)
        },
        || Ok(source.phase_outputs.clone()),
        &"the shared queue",
    )?;
    task.id = Some(new_id.clone());
    // The new task is the forking user's, not the original's submitter's.
    task.submitted_by = Some(crate::submitter::Submitter::current());
    let definition = String::from_utf8_lossy(&task.to_json_bytes()).into_owned();
    let new_task = NewTask::of(&task, &definition);
    let mut checkpoint = start.checkpoint.clone();
    let point = start.point(id);
    let patched = request.patch.is_some();
    match shared.runtime.block_on(shared.db.submit_fork(
        &new_task,
        &point,
        checkpoint.as_mut(),
        patched,
    )) {
        Ok(()) => Ok(new_id),
        Err(ForkError::IdTaken(_)) => Err(ClientError::usage(format_args!(
            "a task with id {:?} already exists in the shared queue",
            new_id.as_str()
        ))),
        Err(ForkError::Db(e)) => Err(shared.error(e)),
    }
}

/// The stored generation the request names, or the newest that decodes.
#[cfg(feature = "postgres")]
fn pick_checkpoint(
    stored: &[crate::queue::postgres::StoredCheckpoint],
    request: &ForkRequest,
) -> ClientResult<IterationCheckpoint> {
    let id = request.id.as_str();
    match request.generation {
        Some(generation) => {
            let found = stored
                .iter()
                .find(|c| c.generation == generation)
                .ok_or_else(|| {
                    ClientError::failure(format_args!(
                        "task {id:?} has no checkpoint generation {generation} (see `cairn history`)"
                    ))
                })?;
            crate::store::decode_checkpoint(&found.bytes).map_err(|e| {
                ClientError::failure(format_args!(
                    "checkpoint generation {generation} of {id:?}: {e}"
                ))
            })
        }
        None => stored
            .iter()
            .find_map(|c| crate::store::decode_checkpoint(&c.bytes).ok())
            .ok_or_else(|| {
                ClientError::failure(format_args!("task {id:?} has no checkpoint to fork from"))
            }),
    }
}
