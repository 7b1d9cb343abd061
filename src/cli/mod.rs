//! The `cairn` command line: one file per subcommand. `main.rs` only calls [`main_with`], adding
//! the subcommands of its own ([`ExtraCommands`]).

mod as_owner;
mod budget;
mod checkpoint;
mod clients_path;
mod completions;
mod control;
#[cfg(feature = "postgres")]
mod db;
pub mod error;
mod extra;
mod fork;
mod format;
mod history;
mod prune;
mod python_json;
mod run;
#[cfg(feature = "postgres")]
mod show;
mod source;
mod status;
mod submit;
mod validate;
mod web;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, CommandFactory, Parser, Subcommand};

use error::CliResult;
pub use extra::{ExtraCommands, NoExtraCommands};

/// Exit codes, documented in `cairn --help`.
pub mod exit {
    /// Success.
    pub const OK: u8 = 0;
    /// A runtime failure (I/O, an unreadable queue, ...).
    pub const FAILURE: u8 = 1;
    /// Bad command-line usage.
    pub const USAGE: u8 = 2;
    /// The task file is invalid.
    pub const INVALID_TASK: u8 = 3;
    /// The queue is owned by another running daemon.
    pub const QUEUE_LOCKED: u8 = 4;
    /// The queue's directories are unsafe: writable by users other than the daemon's (and
    /// inbox/'s group), reachable through a parent others can write, or open to every user while
    /// they hold tokens.
    pub const UNSAFE_QUEUE: u8 = 5;
    /// `run --fail-on-task-failure`: a task of this run did not end done, or a file was
    /// rejected.
    pub const TASKS_FAILED: u8 = 6;
    /// A second stop signal cut the shutdown short (committed work was flushed).
    pub const STOPPED_AT_ONCE: u8 = 130;
}

const AFTER_HELP: &str = "\
Exit codes:
  0    success
  1    runtime failure (I/O error, unreadable queue, a steering request refused)
  2    bad usage
  3    invalid task file (submit, validate)
  4    the queue is owned by another running daemon (run)
  5    the queue's directories are unsafe: writable by other users, a shared one not
       sticky, a parent others can write (run), or open to every user while task
       definitions hold env (run, submit, fork, pause, resume, cancel, retry, budget,
       prune)
  6    with run --fail-on-task-failure: a task of this run failed, was cancelled or
       stopped by its budget, or a file was rejected
  130  a second SIGINT/SIGTERM stopped the daemon at once, after flushing committed work

The queue directory is --queue, else $CAIRN_QUEUE, else ./queue.";

/// cairn runs task files from a queue directory, phase by phase, and checkpoints every
/// iteration of their loops so that a crash, a reboot or Ctrl-C loses at most the iteration in
/// flight.
#[derive(Debug, Parser)]
#[command(name = "cairn", version, after_help = AFTER_HELP)]
pub struct Cli {
    #[command(flatten)]
    global: GlobalArgs,

    #[command(subcommand)]
    command: Command,
}

/// The options every subcommand takes, the program's own ([`ExtraCommands`]) too.
#[derive(Debug, Args)]
struct GlobalArgs {
    /// The queue directory.
    #[arg(
        long,
        global = true,
        env = "CAIRN_QUEUE",
        default_value = "./queue",
        value_name = "DIR"
    )]
    queue: PathBuf,

    /// More log output (-v debug, -vv trace); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the daemon in the foreground (Ctrl-C flushes checkpoints and exits).
    Run(run::RunArgs),
    /// Validate a task file and put it into the queue's inbox; prints the task id.
    Submit(submit::SubmitArgs),
    /// Check a task file without submitting it.
    Validate(validate::ValidateArgs),
    /// One line per task: state, phase, iteration, rate, ETA, cost, checkpoint age.
    Status(status::StatusArgs),
    /// A task's definition, phases, attempts, errors and timeline.
    Show(show::ShowArgs),
    /// The checkpoint generations kept for a task.
    History(history::HistoryArgs),
    /// Print a decoded checkpoint (of a task, or a .json.gz file).
    Checkpoint(checkpoint::CheckpointArgs),
    /// Start a new task from a checkpoint of another, optionally patching its state.
    Fork(fork::ForkArgs),
    /// Stop a task at its next iteration boundary, checkpointed.
    Pause(control::ControlArgs),
    /// Let a paused task continue.
    Resume(control::ControlArgs),
    /// Stop a task for good (its command gets SIGTERM, then SIGKILL) and record it cancelled.
    Cancel(control::ControlArgs),
    /// Put a failed or cancelled task back, resuming from its last checkpoint.
    Retry(control::ControlArgs),
    /// Set a task's spending limit (a paused task then continues with `cairn resume`).
    Budget(budget::BudgetArgs),
    /// Remove records, logs and checkpoints of finished tasks past their retention.
    Prune(prune::PruneArgs),
    /// Print a shell completion script.
    Completions(completions::CompletionsArgs),
    /// Print the directory of the worker helpers (cairn_worker.py, cairn.sh), writing them there
    /// first if needed.
    ClientsPath(clients_path::ClientsPathArgs),
    /// Serve the dashboard and the queue's metrics over HTTP without running tasks (a queue
    /// directory, or with --db a shared queue: every node's tasks).
    Serve(web::serve::ServeArgs),
    /// The PostgreSQL database of a queue shared by several hosts (`db migrate`).
    #[cfg(feature = "postgres")]
    Db(db::DbArgs),
}

/// Parse the process's command line, run the subcommand, and map the outcome to an exit code.
pub fn main() -> ExitCode {
    main_with::<NoExtraCommands>()
}

/// [`main`] with the program's own subcommands `E` added to the library's.
pub fn main_with<E: ExtraCommands>() -> ExitCode {
    ExitCode::from(run_args_with::<E, _, _>(std::env::args_os()))
}

/// [`main`] for the command line `args` (the program's name first): the exit code. The Python
/// package's `cairn` command calls it with its own `sys.argv`.
pub fn run_args<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    run_args_with::<NoExtraCommands, I, T>(args)
}

/// [`run_args`] with the subcommands `E` added to the library's: `E` runs those it names, the
/// library all others.
pub fn run_args_with<E, I, T>(args: I) -> u8
where
    E: ExtraCommands,
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let parsed = command_line::<E>()
        .try_get_matches_from(args)
        .and_then(|matches| extra::Invocation::<E>::from_matches(&matches));
    let (global, invocation) = match parsed {
        Ok(parsed) => parsed,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            };
        }
    };
    init_logging(global.verbose);
    let outcome = match invocation {
        extra::Invocation::Own(command) => dispatch(&global.queue, *command, command_line::<E>),
        extra::Invocation::Extra(command) => command.run(),
    };
    match outcome {
        Ok(code) => code,
        // The reader of stdout went away (`cairn status | head -1`): how a pipe ends.
        Err(error) if error.is_broken_pipe() => exit::OK,
        Err(error) => {
            // A closed stderr leaves only the exit code to tell; it must not panic.
            let _ = writeln!(std::io::stderr(), "error: {}", error.message());
            error.code()
        }
    }
}

/// The command line's definition: the library's subcommands, then `E`'s.
fn command_line<E: ExtraCommands>() -> clap::Command {
    // Every `cairn help COMMAND` lists the exit codes too, from the one table above.
    E::augment_subcommands(Cli::command()).mut_subcommands(|command| {
        let own = command.get_after_help().map(|own| format!("{own}\n\n"));
        command.after_help(format!("{}{AFTER_HELP}", own.unwrap_or_default()))
    })
}

/// Run the subcommand. `Ok` holds the exit code of a command that did its work: 0, or for
/// `run` how the daemon ended (6, 130). `definition` makes the whole command line's, which
/// `completions` writes a script for (a fresh one: parsing leaves it built for one line).
fn dispatch(
    queue: &Path,
    mut command: Command,
    definition: fn() -> clap::Command,
) -> CliResult<u8> {
    command.read_db_url_file()?;
    // With `--db` the queue is in the database: the queue directory's checks do not apply.
    let local = !command.uses_database();
    if local && command.writes_queue() {
        refuse_exposed_queue(queue)?;
    }
    if local && command.runs_as_queue_owner() {
        as_owner::become_queue_owner(queue)?;
    }
    let done = |()| exit::OK;
    match command {
        Command::Run(args) => run::run(queue, args),
        Command::Submit(args) => submit::run(queue, args).map(done),
        Command::Validate(args) => validate::run(args).map(done),
        Command::Status(args) => status::run(queue, args).map(done),
        Command::Show(args) => show::run(queue, args).map(done),
        Command::Serve(args) => web::serve::run(queue, args).map(done),
        Command::History(args) => history::run(queue, args).map(done),
        Command::Checkpoint(args) => checkpoint::run(queue, args).map(done),
        Command::Fork(args) => fork::run(queue, args).map(done),
        Command::Pause(args) => control::run(queue, control::Action::Pause, args).map(done),
        Command::Resume(args) => control::run(queue, control::Action::Resume, args).map(done),
        Command::Cancel(args) => control::run(queue, control::Action::Cancel, args).map(done),
        Command::Retry(args) => control::run(queue, control::Action::Retry, args).map(done),
        Command::Budget(args) => budget::run(queue, args).map(done),
        Command::Prune(args) => prune::run(queue, args).map(done),
        Command::Completions(args) => completions::run(args, definition).map(done),
        Command::ClientsPath(args) => clients_path::run(queue, args).map(done),
        #[cfg(feature = "postgres")]
        Command::Db(args) => db::run(args).map(done),
    }
}

/// Logs go to stderr. Under systemd (stderr is the journal, per `JOURNAL_STREAM`) they go to
/// the journal natively, keeping levels and fields (`task_id`, `phase`, ...), or, when its
/// socket is not reachable, to stderr without timestamps, which the journal adds itself.
impl Command {
    /// Read the database URL from `--db-url-file`, for the commands that take one.
    fn read_db_url_file(&mut self) -> CliResult {
        let db = match self {
            Command::Submit(args) => &mut args.db,
            Command::Validate(args) => &mut args.db,
            Command::Status(args) => &mut args.db,
            Command::Show(args) => &mut args.db,
            Command::History(args) => &mut args.db,
            Command::Checkpoint(args) => &mut args.db,
            Command::Fork(args) => &mut args.db,
            Command::Pause(args)
            | Command::Resume(args)
            | Command::Cancel(args)
            | Command::Retry(args) => &mut args.db,
            Command::Budget(args) => &mut args.db,
            Command::Prune(args) => &mut args.db,
            Command::Serve(args) => &mut args.db,
            Command::Run(args) => return args.read_db_url_file(),
            #[cfg(feature = "postgres")]
            Command::Db(args) => return args.read_db_url_file(),
            _ => return Ok(()),
        };
        db.read_url_file()
    }

    /// Does the command work on the queue shared in PostgreSQL (`--db URL`, or
    /// `CAIRN_DATABASE_URL`) rather than on the queue directory? (`run` uses both.)
    fn uses_database(&self) -> bool {
        let db = match self {
            Command::Submit(args) => &args.db,
            Command::Validate(args) => &args.db,
            Command::Status(args) => &args.db,
            Command::Show(args) => &args.db,
            Command::History(args) => &args.db,
            Command::Checkpoint(args) => &args.db,
            Command::Fork(args) => &args.db,
            Command::Pause(args)
            | Command::Resume(args)
            | Command::Cancel(args)
            | Command::Retry(args) => &args.db,
            Command::Budget(args) => &args.db,
            Command::Prune(args) => &args.db,
            Command::Serve(args) => &args.db,
            _ => return false,
        };
        db.url().is_some()
    }

    /// Does the command add to or change a queue (so must not feed one that leaks tokens)?
    /// `submit` makes its own check, with the task it adds.
    fn writes_queue(&self) -> bool {
        matches!(
            self,
            Command::Fork(_)
                | Command::Pause(_)
                | Command::Resume(_)
                | Command::Cancel(_)
                | Command::Retry(_)
                | Command::Budget(_)
                | Command::Prune(_)
        ) || matches!(self, Command::Serve(args) if args.listen.allow_actions)
    }

    /// Does root run the command as the queue's owner (see `as_owner`)? `submit` does so itself,
    /// once it has read the task file; `prune` removes through opened directories instead.
    fn runs_as_queue_owner(&self) -> bool {
        matches!(
            self,
            Command::Status(_)
                | Command::Show(_)
                | Command::History(_)
                | Command::Checkpoint(_)
                | Command::Fork(_)
                | Command::Pause(_)
                | Command::Resume(_)
                | Command::Cancel(_)
                | Command::Retry(_)
                | Command::Budget(_)
                | Command::Serve(_)
        )
    }
}

/// Refuse (exit 5) a queue where every user can read a task definition with `env` (see
/// `queue::check_not_exposed`).
pub fn refuse_exposed_queue(queue: &Path) -> CliResult {
    crate::queue::check_not_exposed(&crate::queue::QueueDir::new(queue)).map_err(|e| {
        error::CliError::new(
            exit::UNSAFE_QUEUE,
            anyhow::Error::new(e).context("refusing to write to this queue"),
        )
    })
}

fn init_logging(verbose: u8) {
    use tracing_subscriber::prelude::*;

    let default = match verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    if stderr_is_journal() {
        if let Ok(journald) = tracing_journald::layer() {
            let _ = tracing_subscriber::registry()
                .with(filter)
                .with(journald.with_syslog_identifier("cairn".into()))
                .try_init();
            return;
        }
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .without_time()
            .with_target(false)
            .try_init();
        return;
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}

/// `JOURNAL_STREAM` holds `device:inode` of the journal stream systemd connected; it counts only
/// if stderr is still that stream (not redirected by a wrapper script).
fn stderr_is_journal() -> bool {
    use std::os::unix::fs::MetadataExt;
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = stream.to_str().and_then(|s| s.split_once(':')) else {
        return false;
    };
    let Ok(stderr) = std::fs::metadata("/proc/self/fd/2") else {
        return false;
    };
    dev.parse() == Ok(stderr.dev()) && ino.parse() == Ok(stderr.ino())
}

/// The documents `cairn status --json` and `cairn show --json` print, for the programs that
/// embed the command line (the Python package's `Queue`).
pub mod documents {
    use std::path::Path;

    use serde_json::Value;

    use super::error::CliResult;
    use crate::client::QueueClient;
    use crate::queue::LoadOptions;
    use crate::task_id::TaskId;

    /// The queue's `status --json` document (the queue directory, or the database `db`).
    pub fn status(queue: &Path, db: Option<&str>) -> CliResult<Value> {
        let client = QueueClient::open(queue, db)?;
        Ok(super::status::to_json(
            &client.status(LoadOptions::default())?,
        ))
    }

    /// Task `id`'s `show --json` document.
    pub fn show(queue: &Path, db: Option<&str>, id: &TaskId) -> CliResult<Value> {
        super::show::json_document(&QueueClient::open(queue, db)?, id)
    }
}
