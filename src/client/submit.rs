//! Submitting a task: written whole into the queue directory's inbox, or inserted once into
//! the shared queue. An id the queue has already is refused and nothing changes.

use std::path::Path;

use super::{Backend, ClientError, ClientResult, QueueClient};
use crate::queue::{QueueDir, QueueReader};
use crate::store::{FileStorage, Storage};
use crate::task::{random_suffix, Task};
use crate::task_id::TaskId;

/// A task taken in: its id, and for people where it went and what to run next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitted {
    pub id: TaskId,
    /// One line: where the task went, whether a daemon takes it, how to follow it.
    pub next: String,
}

impl QueueClient {
    /// Submit `task` (given an id made from `stem` when it has none). `named` is how messages
    /// name the definition (its file). A queue directory that does not exist is refused unless
    /// `create_queue`.
    pub fn submit(
        &self,
        mut task: Task,
        stem: &str,
        named: &str,
        create_queue: bool,
    ) -> ClientResult<Submitted> {
        task.id
            .get_or_insert_with(|| TaskId::generate(stem, &random_suffix()));
        match &self.backend {
            Backend::Files { root, .. } => submit_file(root, &task, named, create_queue),
            #[cfg(feature = "postgres")]
            Backend::Database(shared) => submit_db(shared, task, named),
        }
    }

    /// Is `id` free in the queue (what `submit` would not refuse)?
    pub fn id_is_free(&self, id: &TaskId) -> ClientResult<bool> {
        match &self.backend {
            Backend::Files { root, .. } => {
                let storage = FileStorage::new(root);
                for key in QueueDir::keys_of_id(id) {
                    if storage.get(&key).map_err(ClientError::failure)?.is_some() {
                        return Ok(false);
                    }
                }
                Ok(true)
            }
            #[cfg(feature = "postgres")]
            Backend::Database(shared) => {
                let exists = shared
                    .reader()?
                    .task_exists(id)
                    .map_err(|e| shared.error(e))?;
                Ok(!exists)
            }
        }
    }
}

fn submit_file(
    root: &Path,
    task: &Task,
    named: &str,
    create_queue: bool,
) -> ClientResult<Submitted> {
    let id = task.id();
    let queue_dir = QueueDir::new(root);
    if !root.is_dir() && !create_queue {
        let shown = std::path::absolute(root).unwrap_or_else(|_| root.to_path_buf());
        return Err(ClientError::failure(format_args!(
            "there is no queue at {} (nothing was submitted); name the queue with \
             --queue DIR or CAIRN_QUEUE, run from the directory that holds it, or create it \
             with `cairn submit --create-queue` or `cairn run`",
            shown.display()
        )));
    }
    // The inbox of a new queue is created; an existing one is left as its owner set it up.
    if !queue_dir.inbox().is_dir() {
        queue_dir
            .create_all()
            .map_err(|e| ClientError::failure(format_args!("creating {}: {e}", root.display())))?;
    }
    let storage = FileStorage::new(root);
    for key in QueueDir::keys_of_id(id) {
        match storage.get(&key) {
            Ok(None) => {}
            Ok(Some(_)) => {
                return Err(ClientError::invalid_task(format_args!(
                    "{named}: a task with id {id:?} already exists in the queue ({})",
                    queue_dir.display_key(&key)
                )));
            }
            // A submitter may not be allowed to read the daemon's directories; the daemon
            // refuses a duplicate id itself, so the early check is only a courtesy.
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {}
            Err(e) => {
                return Err(ClientError::failure(format_args!(
                    "reading {}: {e}",
                    queue_dir.display_key(&key)
                )));
            }
        }
    }
    // The inbox file appears whole or not at all: temp file, fsync, rename, directory fsync.
    let inbox_key = QueueDir::inbox_key(id);
    storage
        .put(&inbox_key, &task.to_json_bytes(), None)
        .map_err(|e| {
            ClientError::failure(format_args!(
                "writing {}: {e}",
                queue_dir.display_key(&inbox_key)
            ))
        })?;
    Ok(Submitted {
        id: id.clone(),
        next: what_next(root, id),
    })
}

/// Where the task went and what to run, for people.
fn what_next(root: &Path, id: &TaskId) -> String {
    let shown = std::path::absolute(root).unwrap_or_else(|_| root.to_path_buf());
    let cairn = if root == Path::new("./queue") {
        "cairn".to_string()
    } else {
        format!("cairn --queue {}", shown.display())
    };
    let reader = QueueReader::open(root);
    let daemon = if reader.daemon().running {
        "its daemon takes it within a second".to_string()
    } else {
        format!("no daemon runs on this queue: `{cairn} run` starts one")
    };
    format!(
        "submitted {id} to {}; {daemon}; follow it with `{cairn} status` or `{cairn} show {id}`",
        reader.dir().inbox().display()
    )
}

/// Insert `task` into the shared queue, once. Stored as a host's intake stores it, with its
/// submitter (the user running this, as intake takes the owner of the file), so that a task
/// is the same text however it came in.
#[cfg(feature = "postgres")]
fn submit_db(
    shared: &super::database::SharedQueue,
    mut task: Task,
    named: &str,
) -> ClientResult<Submitted> {
    use crate::queue::postgres::{NewTask, Submitted as Inserted};

    task.submitted_by = Some(crate::submitter::Submitter::current());
    let definition = String::from_utf8_lossy(&task.to_json_bytes()).into_owned();
    let inserted = shared
        .runtime
        .block_on(shared.db.submit(&NewTask::of(&task, &definition)))
        .map_err(|e| shared.error(format_args!("{e}; nothing was submitted")))?;
    let id = task.id().clone();
    if inserted == Inserted::AlreadyThere {
        return Err(ClientError::invalid_task(format_args!(
            "{named}: a task with id {:?} already exists in the shared queue ({}); nothing was \
             submitted",
            id.as_str(),
            shared.database
        )));
    }
    let next = format!(
        "submitted {id} to the shared queue ({}); a `cairn run --db` daemon takes it within a \
         second or two; follow it with `cairn status --db URL` or `cairn show --db URL {id}`",
        shared.database
    );
    Ok(Submitted { id, next })
}
