//! `cairn db migrate --db URL`: create or upgrade cairn's schema in a PostgreSQL database,
//! for operators who apply schema changes themselves rather than at a daemon's start.

use clap::{Args, Subcommand};

use super::error::{print_line, CliError, CliResult};
use crate::queue::postgres::PgQueue;

#[derive(Debug, Args)]
pub struct DbArgs {
    #[command(subcommand)]
    command: DbCommand,
}

#[derive(Debug, Subcommand)]
enum DbCommand {
    /// Create or upgrade cairn's schema (idempotent; safe while daemons start).
    Migrate(MigrateArgs),
}

#[derive(Debug, Args)]
struct MigrateArgs {
    /// The database: a postgresql:// URL or libpq's key=value form (sslmode is honoured).
    /// A URL with a password is better given in CAIRN_DATABASE_URL or --db-url-file: every
    /// local user can read a command line.
    #[arg(
        long,
        env = "CAIRN_DATABASE_URL",
        value_name = "URL",
        hide_env_values = true,
        required_unless_present = "db_url_file"
    )]
    db: Option<String>,

    /// Read --db's URL from this file (its first line; not readable by every user).
    #[arg(long, value_name = "PATH")]
    db_url_file: Option<std::path::PathBuf>,
}

impl DbArgs {
    /// Read the database URL from `--db-url-file`, if given.
    pub(super) fn read_db_url_file(&mut self) -> CliResult {
        let DbCommand::Migrate(args) = &mut self.command;
        super::source::read_db_url_file(&mut args.db, args.db_url_file.as_deref())
    }
}

pub fn run(args: DbArgs) -> CliResult {
    let DbCommand::Migrate(args) = args.command;
    let url = args.db.filter(|url| !url.is_empty()).ok_or_else(|| {
        CliError::usage("cairn db migrate needs --db, --db-url-file or CAIRN_DATABASE_URL")
    })?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::failure(format_args!("cannot start the runtime: {e}")))?;
    let migrated = runtime.block_on(async {
        let queue = PgQueue::connect_with_pool_size(&url, 1)?;
        queue.migrate().await
    })?;
    if migrated.applied_any() {
        print_line(format_args!(
            "cairn schema migrated from version {} to {}",
            migrated.from, migrated.to
        ))
    } else {
        print_line(format_args!(
            "cairn schema already at version {}",
            migrated.to
        ))
    }
}
