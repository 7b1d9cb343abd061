//! The client side of the queue's owner: what an operator, a program or a page asks of a queue
//! that a daemon owns. Submit a task, steer one or many (pause, resume, cancel, retry), fork
//! one, prune finished ones, and read the queue's views, for a queue directory and for a queue
//! shared in PostgreSQL behind one type, [`QueueClient`].
//!
//! The `cairn` commands, the dashboard's actions and the Python package's `Queue` all call it,
//! so that the same checks and the same messages apply whoever asks; they only parse and
//! format. Errors carry their class ([`ErrorKind`]), which the command line maps to its exit
//! codes and Python to its exceptions.

mod bulk;
mod control;
#[cfg(feature = "postgres")]
mod database;
mod error;
mod fork;
mod prune;
mod read;
mod submit;

use std::path::{Path, PathBuf};

pub use bulk::{BulkOutcome, TaskFilter};
pub use control::{RequestOutcome, Sent, WAIT_FOR_DAEMON};
pub use error::{ClientError, ClientResult, ErrorKind};
pub use fork::ForkRequest;
pub use prune::{DatabasePruneReport, FilePruneReport, PruneReport, PruneRequest};
pub use read::{ReadCheckpoint, StoredGeneration, TaskFacts, TimelineEntry};
pub use submit::Submitted;

use crate::queue::{LoadOptions, QueueReader, QueueView, TaskView};
use crate::task_id::TaskId;

#[cfg(feature = "postgres")]
use database::SharedQueue;

/// A queue as its clients see it: a queue directory, or a queue shared in PostgreSQL.
pub struct QueueClient {
    backend: Backend,
    /// How long a request waits for a running daemon to take it ([`WAIT_FOR_DAEMON`] unless
    /// told: `cairn pause --wait`).
    daemon_wait: std::time::Duration,
}

enum Backend {
    Files {
        root: PathBuf,
        /// Whether the directory may be written to (checked once, at the first write).
        writable: std::sync::OnceLock<Result<(), ClientError>>,
    },
    #[cfg(feature = "postgres")]
    Database(Box<SharedQueue>),
}

impl std::fmt::Debug for QueueClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueClient")
            .field("location", &self.location())
            .finish()
    }
}

impl QueueClient {
    /// The queue directory at `root` (which need not exist yet: `submit` can create it).
    pub fn files(root: impl Into<PathBuf>) -> QueueClient {
        QueueClient {
            backend: Backend::Files {
                root: root.into(),
                writable: std::sync::OnceLock::new(),
            },
            daemon_wait: WAIT_FOR_DAEMON,
        }
    }

    /// The queue shared in the database at `url`: connects and checks that its schema is this
    /// cairn's. A database that cannot be reached is a failure naming it without its password.
    pub fn database(url: &str) -> ClientResult<QueueClient> {
        #[cfg(feature = "postgres")]
        {
            Ok(QueueClient {
                backend: Backend::Database(Box::new(SharedQueue::open(url)?)),
                daemon_wait: WAIT_FOR_DAEMON,
            })
        }
        #[cfg(not(feature = "postgres"))]
        {
            let _ = url;
            Err(error::without_postgres())
        }
    }

    /// The database `db` names, else the queue directory `queue`.
    pub fn open(queue: &Path, db: Option<&str>) -> ClientResult<QueueClient> {
        match db {
            Some(url) => QueueClient::database(url),
            None => Ok(QueueClient::files(queue)),
        }
    }

    /// Wait up to `wait` for a running daemon to take each request (a busy host may take
    /// longer than [`WAIT_FOR_DAEMON`]).
    pub fn waiting_for_daemon(mut self, wait: std::time::Duration) -> QueueClient {
        self.daemon_wait = wait;
        self
    }

    /// Where the queue is: its directory, or the database without its password.
    pub fn location(&self) -> String {
        match &self.backend {
            Backend::Files { root, .. } => root.display().to_string(),
            #[cfg(feature = "postgres")]
            Backend::Database(shared) => shared.database.clone(),
        }
    }

    /// Is the queue shared in a database?
    pub fn is_shared(&self) -> bool {
        !matches!(self.backend, Backend::Files { .. })
    }

    /// The queue directory, when the queue is one.
    pub fn root(&self) -> Option<&Path> {
        match &self.backend {
            Backend::Files { root, .. } => Some(root),
            #[cfg(feature = "postgres")]
            Backend::Database(_) => None,
        }
    }

    /// The whole queue, as `cairn status` shows it.
    pub fn status(&self, options: LoadOptions) -> ClientResult<QueueView> {
        match &self.backend {
            Backend::Files { root, .. } => Ok(readable(root)?.status(options)),
            #[cfg(feature = "postgres")]
            Backend::Database(shared) => shared
                .reader()?
                .status(options)
                .map_err(|e| shared.error(e)),
        }
    }

    /// One task by id, as `cairn show` shows it; `None` when the queue has no such task.
    pub fn task(&self, id: &TaskId) -> ClientResult<Option<TaskView>> {
        match &self.backend {
            Backend::Files { root, .. } => Ok(readable(root)?.task(id)),
            #[cfg(feature = "postgres")]
            Backend::Database(shared) => shared.reader()?.task(id).map_err(|e| shared.error(e)),
        }
    }

    /// A task id given as text, checked: bad usage when it is not one.
    pub fn task_id(text: &str) -> ClientResult<TaskId> {
        TaskId::parse(text)
            .map_err(|e| ClientError::usage(format_args!("{text:?} is not a task id: {e}")))
    }
}

/// The queue directory, once it is known that writing to it exposes nothing: a queue where
/// every user can read a task definition with `env` (tokens) is refused, whoever writes.
fn writable_root<'a>(
    root: &'a Path,
    checked: &std::sync::OnceLock<Result<(), ClientError>>,
) -> ClientResult<&'a Path> {
    checked
        .get_or_init(|| {
            crate::queue::check_not_exposed(&crate::queue::QueueDir::new(root)).map_err(|e| {
                ClientError::new(
                    ErrorKind::UnsafeQueue,
                    format_args!("refusing to write to this queue: {e}"),
                )
            })
        })
        .clone()?;
    Ok(root)
}

/// The reader of the queue directory at `root`, refused when a directory cannot be listed.
fn readable(root: &Path) -> ClientResult<QueueReader> {
    let reader = QueueReader::open(root);
    if let Some((dir, e)) = reader.unlistable_dir() {
        return Err(ClientError::failure(format_args!(
            "cannot list {}: {e}; reading the queue needs read access to its directories (the \
             queue's group, see docs/service.md)",
            dir.display()
        )));
    }
    Ok(reader)
}
