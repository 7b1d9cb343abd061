//! The client's reads beyond the status views: a task's checkpoint generations, one decoded
//! checkpoint, and what `show` tells of a task besides its view (timeline, logs, outputs), from
//! a queue directory's files or the shared queue's rows alike.

use std::path::PathBuf;

use serde_json::{json, Map, Value};

use super::{readable, Backend, ClientError, ClientResult, QueueClient};
use crate::queue::{DaemonInfo, QueueReader, TaskView};
use crate::store::journal::JournalEvent;
use crate::store::{decode_checkpoint, GenerationInfo, IterationCheckpoint};

/// One checkpoint generation of a task.
#[derive(Debug, Clone)]
pub struct StoredGeneration {
    pub info: GenerationInfo,
    /// Where it is: the file's path, or its key in the database.
    pub location: String,
    /// Decoded, when it is one of cairn's that decodes.
    pub checkpoint: Option<IterationCheckpoint>,
    /// A file's bytes when it did not decode (it may be of another format); never for a row.
    pub undecoded: Option<Vec<u8>>,
}

/// A task's checkpoint as read, and newer ones that did not decode (`(location, why)`).
#[derive(Debug, Clone)]
pub struct ReadCheckpoint {
    pub checkpoint: IterationCheckpoint,
    pub location: String,
    pub skipped: Vec<(String, String)>,
}

/// One event of a task's timeline; on a shared queue, the node and lease epoch it was written
/// under.
#[derive(Debug, Clone)]
pub struct TimelineEntry {
    pub journal: JournalEvent,
    pub lease: Option<(String, i64)>,
}

/// What `show` reads about a task besides its view.
#[derive(Debug, Clone)]
pub struct TaskFacts {
    /// The queue: its directory, or the database without its password.
    pub queue: String,
    pub daemon: DaemonInfo,
    /// Where the timeline comes from (the journal file, or `cairn_events`).
    pub journal: String,
    /// The task's run directory (logs, scratch), on a queue directory.
    pub run_dir: Option<PathBuf>,
    pub timeline: Vec<TimelineEntry>,
    /// Earlier failed runs' records (a retried task's).
    pub earlier: Vec<Value>,
    /// Its phases' logs, with their sizes.
    pub logs: Vec<(PathBuf, u64)>,
    /// The outputs the work state of a task in flight refers to, by phase name.
    pub outputs: Map<String, Value>,
    /// What could not be read, for a warning.
    pub warnings: Vec<String>,
}

impl QueueClient {
    /// Does the queue have task `id` (accepted, in flight or finished)?
    pub fn task_exists(&self, id: &str) -> ClientResult<bool> {
        match &self.backend {
            Backend::Files { root, .. } => Ok(QueueReader::open(root).task_exists(id)),
            #[cfg(feature = "postgres")]
            Backend::Database(shared) => shared
                .reader()?
                .task_exists(id)
                .map_err(|e| shared.error(e)),
        }
    }

    /// Task `id`'s checkpoint generations, newest first.
    pub fn generations(&self, id: &str) -> ClientResult<Vec<StoredGeneration>> {
        match &self.backend {
            Backend::Files { root, .. } => {
                let reader = QueueReader::open(root);
                let history = reader.history(id).map_err(|e| {
                    ClientError::failure(format_args!(
                        "task {id:?} in queue {}: {e}",
                        root.display()
                    ))
                })?;
                Ok(history
                    .into_iter()
                    .map(|info| file_generation(&reader, info))
                    .collect())
            }
            #[cfg(feature = "postgres")]
            Backend::Database(shared) => {
                let history = shared.reader()?.history(id).map_err(|e| shared.error(e))?;
                Ok(history
                    .into_iter()
                    .map(|(info, checkpoint)| StoredGeneration {
                        location: info.key.clone(),
                        info,
                        checkpoint,
                        undecoded: None,
                    })
                    .collect())
            }
        }
    }

    /// Task `id`'s newest checkpoint that decodes (`None`: it has none), or `generation`.
    pub fn checkpoint(
        &self,
        id: &str,
        generation: Option<u64>,
    ) -> ClientResult<Option<ReadCheckpoint>> {
        match &self.backend {
            Backend::Files { root, .. } => {
                let reader = QueueReader::open(root);
                let named = |e: crate::store::StoreError| {
                    ClientError::failure(format_args!(
                        "task {id:?} in queue {}: {e}",
                        root.display()
                    ))
                };
                let shown = |key: &str| reader.path_of_key(key).display().to_string();
                read_checkpoint(
                    generation,
                    |g| reader.checkpoint_generation(id, g).map_err(named),
                    || reader.latest_checkpoint(id).map_err(named),
                    shown,
                )
            }
            #[cfg(feature = "postgres")]
            Backend::Database(shared) => {
                let reader = shared.reader()?;
                let named = |e: crate::queue::postgres::ReadError| {
                    ClientError::failure(format_args!(
                        "task {id:?} in the shared queue ({}): {e}",
                        shared.database
                    ))
                };
                read_checkpoint(
                    generation,
                    |g| reader.checkpoint_generation(id, g).map_err(named),
                    || reader.latest_checkpoint(id).map_err(named),
                    str::to_string,
                )
            }
        }
    }

    /// What `show` tells of `task` besides its view; `id` is the one asked for (a rejection's
    /// record has a name of its own).
    pub fn facts(&self, id: &str, task: &TaskView) -> ClientResult<TaskFacts> {
        match &self.backend {
            Backend::Files { root, .. } => Ok(file_facts(&readable(root)?, id, task)),
            #[cfg(feature = "postgres")]
            Backend::Database(shared) => {
                database_facts(shared.reader()?, task).map_err(|e| shared.error(e))
            }
        }
    }

    /// Whether a daemon holds the queue (on a shared queue: whether any node is alive).
    pub fn daemon(&self) -> ClientResult<DaemonInfo> {
        match &self.backend {
            Backend::Files { root, .. } => Ok(QueueReader::open(root).daemon()),
            #[cfg(feature = "postgres")]
            Backend::Database(shared) => {
                let nodes = shared.reader()?.daemons().map_err(|e| shared.error(e))?;
                Ok(DaemonInfo {
                    running: nodes.iter().any(|node| node.alive),
                    pid: None,
                })
            }
        }
    }
}

/// One generation file: decoded when it is one of cairn's, its bytes kept when it is not.
fn file_generation(reader: &QueueReader, info: GenerationInfo) -> StoredGeneration {
    let bytes = reader.read_key(&info.key);
    let location = reader.path_of_key(&info.key).display().to_string();
    let checkpoint = bytes
        .as_deref()
        .and_then(|bytes| decode_checkpoint(bytes).ok())
        .filter(|_| info.error.is_none());
    let undecoded = if checkpoint.is_none() { bytes } else { None };
    StoredGeneration {
        info,
        location,
        checkpoint,
        undecoded,
    }
}

/// One generation (`generation`), or the newest that decodes, through a backend's reads.
fn read_checkpoint(
    generation: Option<u64>,
    one: impl FnOnce(u64) -> ClientResult<IterationCheckpoint>,
    latest: impl FnOnce() -> ClientResult<Option<crate::store::LoadedCheckpoint>>,
    shown: impl Fn(&str) -> String,
) -> ClientResult<Option<ReadCheckpoint>> {
    if let Some(generation) = generation {
        return Ok(Some(ReadCheckpoint {
            checkpoint: one(generation)?,
            location: String::new(),
            skipped: Vec::new(),
        }));
    }
    Ok(latest()?.map(|loaded| ReadCheckpoint {
        checkpoint: loaded.checkpoint,
        location: shown(&loaded.key),
        skipped: loaded
            .skipped
            .iter()
            .map(|(key, why)| (shown(key), why.clone()))
            .collect(),
    }))
}

fn file_facts(reader: &QueueReader, id: &str, task: &TaskView) -> TaskFacts {
    let mut warnings = Vec::new();
    let timeline = reader.journal(id).unwrap_or_else(|e| {
        warnings.push(format!(
            "reading {}: {e}",
            reader.journal_file(id).display()
        ));
        Vec::new()
    });
    let journal = reader.journal_file(id);
    let journal = journal.strip_prefix(reader.root()).unwrap_or(&journal);
    let outputs = task
        .entry
        .iter()
        .flat_map(|entry| &entry.phase_outputs)
        .map(|(name, stored)| {
            let value = reader
                .stored_output(stored)
                .unwrap_or_else(|e| json!({"unreadable": e.to_string()}));
            (name.clone(), value)
        })
        .collect();
    TaskFacts {
        queue: reader.root().display().to_string(),
        daemon: reader.daemon(),
        journal: journal.display().to_string(),
        run_dir: Some(reader.run_dir(&task.id)),
        timeline: timeline
            .into_iter()
            .map(|journal| TimelineEntry {
                journal,
                lease: None,
            })
            .collect(),
        earlier: reader.earlier_failures(id),
        logs: reader.log_files(&task.id),
        outputs,
        warnings,
    }
}

#[cfg(feature = "postgres")]
fn database_facts(
    db: &crate::queue::postgres::PgReader,
    task: &TaskView,
) -> Result<TaskFacts, crate::queue::postgres::PgError> {
    use crate::store::current_work::StoredOutput;

    let id = task.id.as_str();
    let stored = db.outputs(id)?;
    let outputs = task
        .entry
        .iter()
        .flat_map(|entry| &entry.phase_outputs)
        .filter_map(|(name, output)| {
            let value = match output {
                StoredOutput::Inline(value) => value.clone(),
                StoredOutput::File(reference) => {
                    let index = reference.rsplit('/').next()?.parse::<usize>().ok()?;
                    stored.iter().find(|(i, _)| *i == index)?.1.clone()
                }
            };
            Some((name.clone(), value))
        })
        .collect();
    Ok(TaskFacts {
        queue: db.database().to_string(),
        daemon: DaemonInfo {
            running: db.daemons()?.iter().any(|node| node.alive),
            pid: None,
        },
        journal: "cairn_events".to_string(),
        run_dir: None,
        timeline: db
            .events(id)?
            .into_iter()
            .map(|event| TimelineEntry {
                journal: event.journal,
                lease: Some((event.node, event.lease_epoch)),
            })
            .collect(),
        earlier: Vec::new(),
        logs: Vec::new(),
        outputs,
        warnings: Vec::new(),
    })
}
