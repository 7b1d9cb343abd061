//! Which queue an operator command reads: the queue directory (`--queue`), or with `--db URL`
//! the queue several hosts share in PostgreSQL. Both readers give the same views, so a
//! command formats them once; the commands hold no SQL.

use std::path::Path;

use clap::Args;

use super::error::{CliError, CliResult};
use crate::queue::{LoadOptions, QueueReader, QueueView, TaskView};

#[cfg(feature = "postgres")]
pub use crate::queue::postgres::PgReader;

/// `--db URL`, on the commands that work on a shared queue.
#[derive(Debug, Clone, Args)]
pub struct DbArg {
    /// Use the queue several hosts share in this PostgreSQL database instead of the queue
    /// directory: a postgresql:// URL or libpq's key=value form.
    #[arg(
        long,
        env = "CAIRN_DATABASE_URL",
        value_name = "URL",
        hide_env_values = true
    )]
    db: Option<String>,
}

impl DbArg {
    /// The database's URL, if one was given. An empty value (`CAIRN_DATABASE_URL=` exported
    /// empty) counts as none, as an unset variable would.
    pub fn url(&self) -> Option<&str> {
        self.db.as_deref().filter(|url| !url.is_empty())
    }
}

/// The queue a command reads.
pub enum Source {
    Files(QueueReader),
    #[cfg(feature = "postgres")]
    Database(Box<PgReader>),
}

impl Source {
    /// The database when `--db` names one, else the queue directory.
    pub fn open(queue: &Path, db: &DbArg) -> CliResult<Source> {
        match db.url() {
            None => {
                let reader = QueueReader::open(queue);
                if let Some((dir, e)) = reader.unlistable_dir() {
                    return Err(CliError::failure(format_args!(
                        "cannot list {}: {e}; reading the queue needs read access to its \
                         directories (the queue's group, see docs/service.md)",
                        dir.display()
                    )));
                }
                Ok(Source::Files(reader))
            }
            Some(url) => open_database(url).map(database_source),
        }
    }

    /// Where the queue is: its directory, or the database without its password.
    pub fn location(&self) -> String {
        match self {
            Source::Files(reader) => reader.root().display().to_string(),
            #[cfg(feature = "postgres")]
            Source::Database(db) => db.database().to_string(),
        }
    }

    /// The queue directory's reader, when the queue is one.
    pub fn files(&self) -> Option<&QueueReader> {
        match self {
            Source::Files(reader) => Some(reader),
            #[cfg(feature = "postgres")]
            Source::Database(_) => None,
        }
    }

    /// The whole queue.
    pub fn status(&self, options: LoadOptions) -> CliResult<QueueView> {
        match self {
            Source::Files(reader) => Ok(reader.status(options)),
            #[cfg(feature = "postgres")]
            Source::Database(db) => db.status(options).map_err(|e| database_error(db, e)),
        }
    }

    /// One task by id; `None` when the queue has no such task.
    pub fn task(&self, id: &crate::task_id::TaskId) -> CliResult<Option<TaskView>> {
        match self {
            Source::Files(reader) => Ok(reader.task(id)),
            #[cfg(feature = "postgres")]
            Source::Database(db) => db.task(id).map_err(|e| database_error(db, e)),
        }
    }
}

#[cfg(feature = "postgres")]
fn database_source(reader: PgReader) -> Source {
    Source::Database(Box::new(reader))
}

#[cfg(not(feature = "postgres"))]
fn database_source(never: std::convert::Infallible) -> Source {
    match never {}
}

/// Connect to the database `--db` names, checking its schema. A database that cannot be
/// reached is a runtime failure (exit 1) naming it without its password.
#[cfg(feature = "postgres")]
pub fn open_database(url: &str) -> CliResult<PgReader> {
    PgReader::open(url).map_err(|e| {
        CliError::failure(format_args!(
            "database {}: {e}",
            crate::queue::postgres::redacted_url(url)
        ))
    })
}

/// Without PostgreSQL support, `--db` is bad usage.
#[cfg(not(feature = "postgres"))]
pub fn open_database(_url: &str) -> CliResult<std::convert::Infallible> {
    Err(without_postgres())
}

/// The error of `--db` in a cairn built without PostgreSQL support: bad usage.
#[cfg(not(feature = "postgres"))]
pub fn without_postgres() -> CliError {
    CliError::usage(
        "--db: this cairn was built without PostgreSQL support (the `postgres` feature)",
    )
}

/// A failed statement, naming the database.
#[cfg(feature = "postgres")]
pub fn database_error(db: &PgReader, error: impl std::fmt::Display) -> CliError {
    CliError::failure(format_args!("database {}: {error}", db.database()))
}
