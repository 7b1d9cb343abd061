//! `--db URL` (or `--db-url-file PATH`): the queue several hosts share in PostgreSQL, for the
//! commands that work on one. Which queue a command then reads or writes is the client's
//! (`client::QueueClient`); the commands hold no SQL.

use std::path::Path;

use clap::Args;

use super::error::{CliError, CliResult};

/// `--db URL` (or `--db-url-file PATH`), on the commands that work on a shared queue.
#[derive(Debug, Clone, Args)]
pub(super) struct DbArg {
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
pub(super) fn read_db_url_file(db: &mut Option<String>, file: Option<&Path>) -> CliResult {
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
    pub(super) fn read_url_file(&mut self) -> CliResult {
        read_db_url_file(&mut self.db, self.db_url_file.as_deref())
    }

    /// The database's URL, if one was given. An empty value (`CAIRN_DATABASE_URL=` exported
    /// empty) counts as none, as an unset variable would.
    pub(super) fn url(&self) -> Option<&str> {
        self.db.as_deref().filter(|url| !url.is_empty())
    }
}
