//! `cairn db`: what the owner of a shared queue's tables does to its database.
//!
//! - `migrate`: create or upgrade cairn's schema, for operators who apply schema changes
//!   themselves rather than at a daemon's start.
//! - `grant daemon ROLE` / `grant submitter ROLE --user NAME` / `revoke ROLE` / `roles`: the
//!   roles of the queue (docs/security.md, "PostgreSQL roles").
//!
//! All of them run with the URL of the role that owns cairn's tables.

use clap::{Args, Subcommand};

use super::error::{print_line, CliError, CliResult};
use crate::queue::postgres::{PgQueue, RoleKind};

#[derive(Debug, Args)]
#[command(after_help = "\
Run with the URL of the role that owns cairn's tables (the one that migrated them). With roles
registered by `grant`, a daemon that runs tasks as their submitters (`cairn run --db URL
--run-as-submitter`) runs each task as the local user its submitter's role is mapped to, and
refuses to start without them. See docs/security.md, \"PostgreSQL roles\".")]
pub(super) struct DbArgs {
    #[command(subcommand)]
    command: DbCommand,

    #[command(flatten)]
    db: OwnerUrl,
}

#[derive(Debug, Subcommand)]
enum DbCommand {
    /// Create or upgrade cairn's schema (idempotent; safe while daemons start).
    Migrate,
    /// Register a role (it must exist) and grant it the rights of its part; turns row-level
    /// security on. Run again after changing a role's user; idempotent.
    Grant(GrantArgs),
    /// Take a role's rights on cairn's tables away and forget it.
    Revoke {
        /// The PostgreSQL role.
        role: String,
    },
    /// List the registered roles.
    Roles,
}

#[derive(Debug, Args)]
struct GrantArgs {
    #[command(subcommand)]
    part: Part,
}

#[derive(Debug, Subcommand)]
enum Part {
    /// A daemon's role: reads and writes the queue's rows, creates nothing, may not change
    /// the roles. Tasks it inserts from a host's inbox keep the submitter it checked there.
    Daemon {
        /// The PostgreSQL role.
        role: String,
    },
    /// A submitter's role: inserts tasks and control requests, reads only its own; its tasks
    /// run as --user on every daemon's host (with --run-as-submitter).
    Submitter {
        /// The PostgreSQL role.
        role: String,
        /// The local user its tasks run as (a user name every daemon's host has).
        #[arg(long, value_name = "NAME")]
        user: String,
    },
}

#[derive(Debug, Args)]
struct OwnerUrl {
    /// The database, as the owner of cairn's tables: a postgresql:// URL or libpq's key=value
    /// form. A URL with a password is better given in CAIRN_DATABASE_URL or --db-url-file:
    /// every local user can read a command line.
    #[arg(
        long,
        global = true,
        env = "CAIRN_DATABASE_URL",
        value_name = "URL",
        hide_env_values = true
    )]
    db: Option<String>,

    /// Read --db's URL from this file (its first line; not readable by every user).
    #[arg(long, global = true, value_name = "PATH")]
    db_url_file: Option<std::path::PathBuf>,
}

impl DbArgs {
    /// Read the database URL from `--db-url-file`, if given.
    pub(super) fn read_db_url_file(&mut self) -> CliResult {
        super::source::read_db_url_file(&mut self.db.db, self.db.db_url_file.as_deref())
    }
}

pub(super) fn run(args: DbArgs) -> CliResult {
    let url = args.db.db.filter(|url| !url.is_empty()).ok_or_else(|| {
        CliError::usage("cairn db needs --db, --db-url-file or CAIRN_DATABASE_URL")
    })?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::failure(format_args!("cannot start the runtime: {e}")))?;
    let queue = PgQueue::connect_with_pool_size(&url, 1)?;
    match args.command {
        DbCommand::Migrate => {
            let migrated = runtime.block_on(queue.migrate())?;
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
        DbCommand::Grant(GrantArgs { part }) => {
            let (role, kind) = match part {
                Part::Daemon { role } => (role, RoleKind::Daemon),
                Part::Submitter { role, user } => {
                    if user.is_empty() || user.chars().any(|c| c.is_control() || c == ':') {
                        return Err(CliError::usage(format_args!(
                            "--user {:?} is not a user name",
                            user.escape_debug().to_string()
                        )));
                    }
                    (role, RoleKind::Submitter { local_user: user })
                }
            };
            runtime.block_on(async {
                queue.migrate().await?;
                queue.grant_role(&role, &kind).await
            })?;
            match kind {
                RoleKind::Daemon => print_line(format_args!("role {role} is a daemon")),
                RoleKind::Submitter { local_user } => print_line(format_args!(
                    "role {role} is a submitter; its tasks run as {local_user}"
                )),
            }
        }
        DbCommand::Revoke { role } => {
            let removed = runtime.block_on(queue.revoke_role(&role))?;
            if removed {
                print_line(format_args!(
                    "role {role} has no rights on cairn's tables now"
                ))
            } else {
                print_line(format_args!(
                    "role {role} was not registered (its rights on cairn's tables are revoked)"
                ))
            }
        }
        DbCommand::Roles => {
            let roles = runtime.block_on(queue.roles())?;
            for role in roles {
                match role.kind {
                    RoleKind::Daemon => print_line(format_args!("{}\tdaemon", role.role))?,
                    RoleKind::Submitter { local_user } => {
                        print_line(format_args!("{}\tsubmitter\t{local_user}", role.role))?
                    }
                }
            }
            Ok(())
        }
    }
}
