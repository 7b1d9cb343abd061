//! `cairn db migrate --db URL`: create or upgrade cairn's schema in a PostgreSQL database,
//! for operators who apply schema changes themselves rather than at a daemon's start.

use clap::{Args, Subcommand};

use super::exit;
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
    #[arg(
        long,
        env = "CAIRN_DATABASE_URL",
        value_name = "URL",
        hide_env_values = true
    )]
    db: String,
}

pub fn run(args: DbArgs) -> u8 {
    let DbCommand::Migrate(args) = args.command;
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return exit::FAILURE;
        }
    };
    let migrated = runtime.block_on(async {
        let queue = PgQueue::connect_with_pool_size(&args.db, 1)?;
        queue.migrate().await
    });
    match migrated {
        Ok(migrated) if migrated.applied_any() => {
            println!(
                "cairn schema migrated from version {} to {}",
                migrated.from, migrated.to
            );
            exit::OK
        }
        Ok(migrated) => {
            println!("cairn schema already at version {}", migrated.to);
            exit::OK
        }
        Err(e) => {
            eprintln!("error: {e}");
            exit::FAILURE
        }
    }
}
