//! `cairn run`: the daemon in the foreground, with SIGINT/SIGTERM wired to a clean stop.

use std::path::Path;
use std::time::Duration;

use clap::Args;
use futures::StreamExt;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook_tokio::Signals;

use super::error::{CliError, CliResult};
use super::exit;
use crate::daemon::{self, DaemonConfig, DaemonError, DaemonExit, DatabaseConfig, RunSummary};
use crate::limits::SubmitterLimits;
use crate::shutdown::Shutdown;

#[derive(Debug, Args)]
pub(super) struct RunArgs {
    /// Exit 0 once no task is pending, running or waiting for a retry. Paused tasks stay
    /// paused (until `cairn resume`) and do not keep the daemon running.
    #[arg(long)]
    exit_when_idle: bool,

    /// Exit 6 instead of 0 when a task of this run failed, was cancelled or stopped by its
    /// budget, or a file was rejected (for scripts and CI).
    #[arg(long)]
    fail_on_task_failure: bool,

    /// After SIGINT/SIGTERM, how long commands in flight may take to finish their iteration
    /// before they get SIGTERM (then SIGKILL 5s later). Keep it below systemd's TimeoutStopSec.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    stop_grace: Duration,

    /// Tasks run at once.
    #[arg(long, default_value_t = 4, value_name = "N")]
    max_tasks: usize,

    /// Unfinished tasks (waiting, running, waiting for a retry or paused) one submitter may have
    /// in the queue; a file beyond it is rejected at intake with a record saying why, and the
    /// other files go on. Tasks with no recorded submitter count as one submitter, "unknown";
    /// root is limited like anyone [default: unlimited]. Not with --db.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    max_queued_per_submitter: Option<u64>,

    /// Attempts of one submitter's tasks running at once; the others wait for one of theirs
    /// to end. Free slots are shared between submitters whatever the limits: the one with the
    /// fewest running goes first [default: unlimited].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    max_running_per_submitter: Option<u64>,

    /// The highest priority a task may ask for; a file asking for more is rejected at intake
    /// with a record saying why (not lowered silently) [default: unlimited].
    #[arg(long, value_name = "P", allow_negative_numbers = true)]
    max_priority_per_submitter: Option<i32>,

    /// Run each task's commands as the user who submitted it (the owner of its inbox file),
    /// with that user's groups, as cron and at do. Needs root or the capabilities CAP_SETUID,
    /// CAP_SETGID, CAP_CHOWN and CAP_KILL (see docs/security.md).
    #[arg(long)]
    run_as_submitter: bool,

    /// With --run-as-submitter: members of this group may pause, resume, cancel and retry
    /// every task. Without it only a task's submitter, the daemon's user and root may; other
    /// requests are refused (logged, in the task's journal, and told to the `cairn` that made
    /// them).
    #[arg(long, value_name = "GROUP", requires = "run_as_submitter")]
    operators_group: Option<String>,

    /// Share a queue in PostgreSQL with the daemons of other hosts (a postgresql:// URL or
    /// libpq's key=value form). The queue directory is then this host's: its inbox (files
    /// dropped there enter the shared queue), logs and scratch. See docs/cluster.md. Give a
    /// URL with a password in CAIRN_DATABASE_URL or --db-url-file, not here: every local user
    /// can read a command line. Tasks never get CAIRN_DATABASE_URL.
    #[arg(
        long,
        env = "CAIRN_DATABASE_URL",
        value_name = "URL",
        hide_env_values = true
    )]
    db: Option<String>,

    /// Read --db's URL from this file (its first line; the file must not be readable by
    /// every user).
    #[arg(long, value_name = "PATH")]
    db_url_file: Option<std::path::PathBuf>,

    /// The most a phase's log (its commands' stderr, runs/<id>/<n>-<phase>.log) keeps: past
    /// it, the log keeps its first and last halves with a note of what was cut between them
    /// (bytes, or with a suffix: 64MiB, 1GiB; 0 = unbounded).
    #[arg(long, default_value = "64MiB", value_parser = parse_bytes, value_name = "BYTES")]
    max_log_bytes: u64,

    /// The most memory one task's processes may use together (its cgroup's memory.max):
    /// bytes, or with a suffix (512MiB, 8GiB); 0 = unbounded [default: half the host's].
    #[arg(long, value_parser = parse_size, value_name = "BYTES")]
    task_memory_max: Option<u64>,

    /// The most processes and threads one task may have at once (its cgroup's pids.max;
    /// 0 = unbounded).
    #[arg(long, default_value_t = crate::runner::DEFAULT_PIDS_MAX, value_name = "N")]
    task_pids_max: u64,

    /// The checkpoint bytes one submitter's tasks in flight may hold together (each task's
    /// newest, as stored); past it their next checkpoint is refused and that attempt fails
    /// (bytes, or with a suffix; 0 = unbounded).
    #[arg(long, default_value = "1GiB", value_parser = parse_size, value_name = "BYTES")]
    max_checkpoint_bytes_per_submitter: u64,

    /// A variable of the daemon's environment that tasks' commands get too (repeatable, or a
    /// comma-separated list in CAIRN_PASS_ENV). Commands always get PATH, LANG, LANGUAGE,
    /// LC_*, TZ and the HOME, USER, LOGNAME and SHELL of the user they run as, besides their
    /// task's env and cairn's CAIRN_* variables; nothing else of the daemon's unless named
    /// here. CAIRN_DATABASE_URL and the service manager's NOTIFY_SOCKET are never passed.
    #[arg(
        long = "pass-env",
        env = "CAIRN_PASS_ENV",
        value_name = "NAME",
        value_delimiter = ','
    )]
    pass_env: Vec<String>,

    /// With --db: this daemon's name, unique among the live daemons [default: the host name].
    #[arg(long, value_name = "NAME")]
    node: Option<String>,

    /// With --db: how long a claim of a task holds without renewal (renewed every sixth of
    /// it). Another host takes a dead or frozen daemon's tasks over after this.
    #[arg(long, default_value = "30s", value_parser = parse_lease, value_name = "DURATION")]
    lease: Duration,

    #[command(flatten)]
    web: super::web::ListenArgs,
}

impl RunArgs {
    /// Read the database URL from `--db-url-file`, if given.
    pub(super) fn read_db_url_file(&mut self) -> CliResult {
        super::source::read_db_url_file(&mut self.db, self.db_url_file.as_deref())
    }
}

/// A value of `cairn run`'s options that does not parse.
#[derive(Debug, thiserror::Error)]
pub(super) enum OptionError {
    #[error("{0} is too small: a log keeps at least 64KiB (0: unbounded)")]
    LogTooSmall(String),
    #[error("{0:?} is not a size (a number of bytes, or with KiB, MiB, GiB)")]
    NotASize(String),
    #[error("{0:?} is not a unit (KiB, MiB or GiB)")]
    NotAUnit(String),
    #[error("{0} is too large")]
    TooLarge(String),
    #[error(transparent)]
    Duration(#[from] humantime::DurationError),
    #[error("{0} is too short: a lease is at least 1s")]
    LeaseTooShort(String),
}

/// A log's bound: a size of at least 64KiB, or 0.
fn parse_bytes(text: &str) -> Result<u64, OptionError> {
    let bytes = parse_size(text)?;
    if bytes > 0 && bytes < 64 << 10 {
        return Err(OptionError::LogTooSmall(text.to_string()));
    }
    Ok(bytes)
}

/// A size in bytes: a number, optionally with KiB, MiB or GiB.
fn parse_size(text: &str) -> Result<u64, OptionError> {
    let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => text.split_at(i),
        None => (text, ""),
    };
    let number: u64 = digits
        .parse()
        .map_err(|_| OptionError::NotASize(text.to_string()))?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" | "K" => 1 << 10,
        "MiB" | "M" => 1 << 20,
        "GiB" | "G" => 1 << 30,
        other => return Err(OptionError::NotAUnit(other.to_string())),
    };
    number
        .checked_mul(scale)
        .ok_or_else(|| OptionError::TooLarge(text.to_string()))
}

fn saturating_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// A lease long enough to renew (every sixth of it) without a storm of statements.
fn parse_lease(text: &str) -> Result<Duration, OptionError> {
    let lease = humantime::parse_duration(text)?;
    if lease < Duration::from_secs(1) {
        return Err(OptionError::LeaseTooShort(text.to_string()));
    }
    Ok(lease)
}

/// The name of this daemon among those sharing a queue: `--node`, else the host name.
fn node_name(given: Option<String>) -> CliResult<String> {
    let name = match given {
        Some(name) => name,
        None => nix::unistd::gethostname()
            .map_err(|e| {
                CliError::failure(format_args!("cannot read the host name for --node: {e}"))
            })?
            .to_string_lossy()
            .into_owned(),
    };
    if name.is_empty() || name.len() > 255 || name.chars().any(char::is_control) {
        return Err(CliError::usage(format_args!(
            "--node {name:?}: a node name is 1 to 255 characters, none of them control characters"
        )));
    }
    Ok(name)
}

/// Have glibc's allocator serve every thread from one arena, unless `MALLOC_ARENA_MAX` says
/// otherwise. With one arena per blocking thread (up to 16 on two cores), memory freed in one
/// arena (a work-state write's buffers, a checkpoint's) stays resident there while the next
/// such job allocates anew in another: about 20 MB of the daemon's peak with 10,000 tasks in
/// flight (154–163 MB against 133 MB in the resume figure of `docs/performance.md`). The blocking
/// threads mostly wait on the disk, so they hardly contend for the one arena's lock. Called
/// before any thread is started, as `mallopt` requires.
#[allow(unsafe_code)] // mallopt has no safe wrapper
fn one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only sets an allocator parameter; no other thread runs yet.
        unsafe {
            nix::libc::mallopt(nix::libc::M_ARENA_MAX, 1);
        }
    }
}

/// Raise the soft limit on open files to the hard one (see `runner::fd_limit`), and say so when
/// even that is too low for `max_tasks` commands at once: those past it wait and retry.
fn open_files_for(max_tasks: usize) {
    use crate::runner::fd_limit;
    let needed = fd_limit::needed_for(max_tasks);
    match fd_limit::raise_soft_limit() {
        Ok(limit) if limit.now < needed => tracing::warn!(
            limit = limit.now,
            max_tasks,
            "the limit on open files ({}) is below what {max_tasks} tasks at once may need \
             (about {needed}): commands that find no descriptor wait their backoff and start \
             later, without using up an attempt; raise LimitNOFILE= (or `ulimit -Hn`) to run \
             them all at once",
            limit.now
        ),
        Ok(limit) => tracing::debug!(was = limit.was, now = limit.now, "the limit on open files"),
        Err(e) => tracing::warn!("cannot raise the limit on open files: {e}"),
    }
}

/// Run the daemon until it is idle (`--exit-when-idle`) or stopped; `Ok` holds how it ended
/// as an exit code (0, 6 with `--fail-on-task-failure`, 130 after a second signal).
pub(super) fn run(queue: &Path, args: RunArgs) -> CliResult<u8> {
    one_malloc_arena();
    open_files_for(args.max_tasks);
    // One thread, as `daemon::run` requires: children get PR_SET_PDEATHSIG, which fires when
    // the spawning *thread* exits.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(crate::runner::MAX_BLOCKING_THREADS)
        .build()
        .map_err(|e| CliError::failure(format_args!("cannot start the runtime: {e}")))?;
    let fail_on_task_failure = args.fail_on_task_failure;
    let web_args = args.web.clone();
    let mut config = daemon_config(queue, args)?;
    let web = web_args.config(queue, config.database.as_ref().map(|d| d.url.clone()))?;
    if let Some(web) = &web {
        config.observer = Some(std::sync::Arc::clone(&web.observer));
    }

    let code = runtime.block_on(async move {
        let shutdown = Shutdown::new();
        let (handle, listener) = forward_signals(&shutdown)?;
        let serving = match web {
            Some(web) => Some(tokio::spawn(web.bind().await?)),
            None => None,
        };
        let outcome = daemon::run_with_summary(config, shutdown).await;
        if let Some(serving) = serving {
            serving.abort();
        }
        // The listener only forwards signals; it is not waited for, so a signal racing the
        // close cannot keep the process alive.
        handle.close();
        listener.abort();
        let (how, summary) = outcome.map_err(daemon_error)?;
        closing_summary(&summary);
        Ok(match how {
            DaemonExit::StoppedImmediately => exit::STOPPED_AT_ONCE,
            DaemonExit::Idle | DaemonExit::Stopped
                if fail_on_task_failure && summary.any_failed() =>
            {
                exit::TASKS_FAILED
            }
            DaemonExit::Idle | DaemonExit::Stopped => exit::OK,
        })
    });
    // Everything committed is flushed by now; a blocking job still running (a stuck file
    // system call) must not keep the process from exiting.
    runtime.shutdown_timeout(std::time::Duration::from_secs(10));
    code
}

/// The daemon's configuration from `cairn run`'s options, each checked.
fn daemon_config(queue: &Path, args: RunArgs) -> CliResult<DaemonConfig> {
    // Named before anything else is checked: a group that does not exist is a usage error.
    let operators_group = args
        .operators_group
        .as_deref()
        .map(daemon::OperatorsGroup::named)
        .transpose()
        .map_err(|e| CliError::usage(format_args!("--operators-group: {e}")))?;
    if args.run_as_submitter {
        crate::runner::identity::check_capabilities()
            .map_err(|e| CliError::new(exit::INVALID_TASK, e))?;
    }
    crate::runner::check_pass_names(&args.pass_env)
        .map_err(|e| CliError::usage(format_args!("--pass-env: {e}")))?;
    let mut config = DaemonConfig::new(queue);
    config.pass_env = args.pass_env;
    config.max_log_bytes = (args.max_log_bytes > 0).then_some(args.max_log_bytes);
    if let Some(bytes) = args.task_memory_max {
        config.task_limits.memory_max = (bytes > 0).then_some(bytes);
    }
    config.task_limits.pids_max = (args.task_pids_max > 0).then_some(args.task_pids_max);
    config.max_checkpoint_bytes_per_submitter = (args.max_checkpoint_bytes_per_submitter > 0)
        .then_some(args.max_checkpoint_bytes_per_submitter);
    config.run_as_submitter = args.run_as_submitter;
    config.operators_group = operators_group;
    config.exit_when_idle = args.exit_when_idle;
    config.stop_grace = args.stop_grace;
    config.max_tasks = args.max_tasks;
    config.submitter_limits = SubmitterLimits {
        max_queued: args.max_queued_per_submitter.map(saturating_usize),
        max_running: args.max_running_per_submitter.map(saturating_usize),
        max_priority: args.max_priority_per_submitter,
    };
    let db = args.db.filter(|url| !url.is_empty());
    if config.submitter_limits.max_queued.is_some() && db.is_some() {
        return Err(CliError::usage(
            "--max-queued-per-submitter cannot be used with --db: a daemon does not count the \
             tasks that wait in the shared queue (--max-running-per-submitter and \
             --max-priority-per-submitter can)",
        ));
    }
    if db.is_none() && args.node.is_some() {
        return Err(CliError::usage(
            "--node names this daemon among those sharing a queue: it needs --db, \
             --db-url-file or CAIRN_DATABASE_URL",
        ));
    }
    if let Some(url) = db {
        config.database = Some(DatabaseConfig {
            url,
            node: node_name(args.node)?,
            lease: args.lease,
        });
    }
    Ok(config)
}

/// Turn SIGINT and SIGTERM into a stop (a second one: a stop at once); the handle closes the
/// signals, the task forwards them.
fn forward_signals(
    shutdown: &Shutdown,
) -> CliResult<(signal_hook_tokio::Handle, tokio::task::JoinHandle<()>)> {
    let signals = Signals::new([SIGINT, SIGTERM])
        .map_err(|e| CliError::failure(format_args!("cannot install signal handlers: {e}")))?;
    let handle = signals.handle();
    let on_signal = shutdown.clone();
    let listener = tokio::spawn(async move {
        let mut signals = signals;
        while let Some(signal) = signals.next().await {
            if on_signal.is_stopping() {
                tracing::warn!(
                    signal,
                    "second stop signal: flushing committed work and exiting now"
                );
                on_signal.request_immediate();
            } else {
                tracing::info!(
                    signal,
                    "stop signal: finishing iterations in flight, then exiting"
                );
                on_signal.request_stop();
            }
        }
    });
    Ok((handle, listener))
}

/// A daemon that could not run, with the exit code its cause is documented with.
fn daemon_error(error: DaemonError) -> CliError {
    let code = match &error {
        DaemonError::Lock(crate::queue::LockError::Held { .. }) => exit::QUEUE_LOCKED,
        DaemonError::UnsafeQueue(_) => exit::UNSAFE_QUEUE,
        _ => exit::FAILURE,
    };
    CliError::new(code, error)
}

/// The closing summary on stderr, after the daemon's last log line. A closed stderr is not an
/// error worth failing the run for.
fn closing_summary(summary: &RunSummary) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(summary.render().as_bytes());
}
