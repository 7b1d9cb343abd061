//! Which queue an operator command reads: the queue directory (`--queue`), or with `--db URL`
//! the queue several hosts share in PostgreSQL. Both readers give the same views, so a
//! command formats them once; the commands hold no SQL.

use std::path::Path;

use clap::Args;

use super::error::{CliError, CliResult};
use crate::queue::{LoadOptions, QueueReader, QueueView, TaskView};

#[cfg(feature = "postgres")]
pub use crate::queue::postgres::PgReader;

/// `--db URL` (or `--db-url-file PATH`), on the commands that work on a shared queue.
#[derive(Debug, Clone, Args)]
pub struct DbArg {
    /// Use the queue several hosts share in this PostgreSQL database instead of the queue
    /// directory: a postgresql:// URL or libpq's key=value form. A URL with a password is
    /// better given in CAIRN_DATABASE_URL or --db-url-file: every local user can read a
    /// command line.
    #[arg(
        long,
        env = "CAIRN_DATABASE_URL",
        value_name = "URL",
        hide_env_values = true
    )]
    db: Option<String>,

    /// Read --db's URL from this file (its first line; the file must not be readable by
    /// every user), so that the password appears on no command line and in no environment.
    #[arg(long, value_name = "PATH")]
    db_url_file: Option<std::path::PathBuf>,
}

/// Put the URL `file` holds into `db` (`--db-url-file`); both given is a usage error.
pub fn read_db_url_file(db: &mut Option<String>, file: Option<&Path>) -> CliResult {
    let Some(file) = file else {
        return Ok(());
    };
    if db.as_deref().is_some_and(|url| !url.is_empty()) {
        return Err(CliError::usage(format_args!(
            "--db-url-file {} and --db (or CAIRN_DATABASE_URL) both name a database: give one",
            file.display()
        )));
    }
    *db = Some(url_from_file(file)?);
    Ok(())
}

/// The URL in `file`: its first line, trimmed. A file every user may read or write is refused,
/// as libpq refuses such a password file.
fn url_from_file(file: &Path) -> CliResult<String> {
    use std::os::unix::fs::MetadataExt;
    let named = |what: &str| format!("--db-url-file {}: {what}", file.display());
    let opened = std::fs::File::open(file)
        .map_err(|e| CliError::failure(named(&format!("cannot open it: {e}"))))?;
    let mode = opened
        .metadata()
        .map_err(|e| CliError::failure(named(&format!("cannot read its metadata: {e}"))))?
        .mode();
    if mode & 0o007 != 0 {
        return Err(CliError::failure(named(&format!(
            "every user may read or write it (mode {:o}); it holds the database's password:              chmod o-rwx it",
            mode & 0o7777
        ))));
    }
    let mut text = String::new();
    use std::io::Read;
    opened
        .take(64 * 1024)
        .read_to_string(&mut text)
        .map_err(|e| CliError::failure(named(&format!("cannot read it as text: {e}"))))?;
    let url = text.lines().next().unwrap_or("").trim();
    if url.is_empty() {
        return Err(CliError::usage(named("its first line is empty")));
    }
    Ok(url.to_string())
}

impl DbArg {
    /// Read `--db-url-file`, if given, into the URL.
    pub fn read_url_file(&mut self) -> CliResult {
        read_db_url_file(&mut self.db, self.db_url_file.as_deref())
    }

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
        Source::open_at(queue, db.url())
    }

    /// The database `url` names, else the queue directory.
    pub fn open_at(queue: &Path, url: Option<&str>) -> CliResult<Source> {
        match url {
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
