//! Child processes: one command run with a JSON request on stdin and its reply on stdout.
//!
//! Every child leads its own process group (so a stop reaches its helpers too) and is killed by
//! the kernel if the daemon dies (`PR_SET_PDEATHSIG`), so a restarted daemon never races an
//! orphan doing the same work. The daemon runs on a single-threaded runtime, which matters here:
//! the death signal fires when the *thread* that spawned the child exits.

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use tokio_util::sync::CancellationToken;

use super::identity::SwitchTo;
use super::spawn::{
    self, CommandProcess, Environment, InheritedEnv, ProcessSpec, StdinFrom, StdoutTo,
};
use crate::shutdown::Shutdown;

/// What a command is confined by, applied in the new process before its `exec`: the cgroup it
/// joins (while it still has the daemon's identity, which may write there) and the user it
/// becomes.
#[derive(Debug, Clone, Default)]
pub struct Confinement {
    /// Become this identity (`--run-as-submitter`).
    pub run_as: Option<SwitchTo>,
    /// Join the cgroup whose `cgroup.procs` this is.
    pub cgroup_procs: Option<PathBuf>,
}

/// Time between SIGTERM and SIGKILL when a child is stopped.
pub const KILL_AFTER: Duration = Duration::from_secs(5);

/// Largest reply read from a command's stdout.
pub const MAX_REPLY_BYTES: usize = 64 * 1024 * 1024;

/// One command run.
#[derive(Debug)]
pub struct CommandRun {
    pub argv: Vec<String>,
    pub cwd: PathBuf,
    /// The task's variables, over what it gets from the daemon's environment.
    pub env: Vec<(String, String)>,
    pub inherited_env: InheritedEnv,
    pub stdin: Vec<u8>,
    /// stderr is appended here, after `log_header`.
    pub log: PathBuf,
    pub log_header: String,
    /// The bound on the log (`log_cap`); `None`: unbounded.
    pub max_log_bytes: Option<u64>,
    pub timeout: Option<Duration>,
    pub confinement: Confinement,
}

/// How a command run ended.
#[derive(Debug)]
pub enum RunEnd {
    Exited {
        status: ExitStatus,
        stdout: Vec<u8>,
    },
    /// Stopped by the daemon's shutdown (SIGTERM/SIGKILL to its group).
    Interrupted,
    TimedOut,
    /// It printed more than [`MAX_REPLY_BYTES`] on stdout.
    ReplyTooLarge,
}

/// Start `argv` as the leader of a new process group that dies with the daemon (see
/// `spawn`). `log` receives stderr (and stdout, with [`StdoutTo::Log`]).
pub fn spawn_in_group(
    argv: &[String],
    cwd: &std::path::Path,
    env: Environment<'_>,
    log: std::fs::File,
    stdin: StdinFrom,
    stdout: StdoutTo,
    confinement: &Confinement,
) -> io::Result<CommandProcess> {
    let program = argv.first().map_or("", String::as_str);
    // Opened here: the new process only writes to it.
    let cgroup_procs = match &confinement.cgroup_procs {
        Some(procs) => Some(
            std::fs::OpenOptions::new()
                .write(true)
                .open(procs)
                .map_err(|e| spawn_error(program, cwd, e))?,
        ),
        None => None,
    };
    spawn::start(ProcessSpec {
        argv,
        cwd,
        env,
        log,
        stdin,
        stdout,
        cgroup_procs: cgroup_procs.as_ref(),
        run_as: confinement.run_as.as_ref(),
    })
    .map_err(|e| spawn_error(program, cwd, e))
}

/// Name what is missing when a spawn fails: `execve` reports a missing working directory and
/// a missing program alike as "No such file or directory", so the directory is checked here,
/// after the failure (a successful spawn costs no extra system call).
fn spawn_error(program: &str, cwd: &std::path::Path, error: io::Error) -> io::Error {
    let cwd_problem = match std::fs::metadata(cwd) {
        Ok(meta) if meta.is_dir() => None,
        Ok(_) => Some("is not a directory".to_string()),
        Err(e) => Some(e.to_string()),
    };
    let message = match cwd_problem {
        Some(problem) => format!(
            "cannot start {program:?}: its working directory {} (the task's cwd): {problem}",
            cwd.display()
        ),
        None => format!("cannot start {program:?}: {error}"),
    };
    StartFailure::wrap(&error, message)
}

/// The error inside an `io::Error` of a failed start. A message that says what failed replaces
/// the system's error number in a plain `io::Error`, and an `ErrorKind` does not tell every
/// number apart (`EMFILE` has none of its own), so the number is kept here for
/// [`is_resource_exhaustion`].
#[derive(Debug)]
struct StartFailure {
    message: String,
    errno: Option<i32>,
}

impl StartFailure {
    /// `error`'s kind and number under `message`.
    fn wrap(error: &io::Error, message: String) -> io::Error {
        io::Error::new(
            error.kind(),
            StartFailure {
                message,
                errno: errno_of(error),
            },
        )
    }
}

impl std::fmt::Display for StartFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for StartFailure {}

/// The system's error number behind `error`, also through a [`StartFailure`] or a failure
/// the trampoline reported.
fn errno_of(error: &io::Error) -> Option<i32> {
    error
        .raw_os_error()
        .or_else(|| {
            error
                .get_ref()
                .and_then(|inner| inner.downcast_ref::<StartFailure>())
                .and_then(|failure| failure.errno)
        })
        .or_else(|| spawn::late_start_failure(error))
}

/// An error of waiting for a command: when its trampoline reported that it never started,
/// the failed start it is (named as [`spawn_in_group`] names one), else the wait's own.
pub(super) fn wait_error(program: &str, cwd: &std::path::Path, error: io::Error) -> io::Error {
    if spawn::late_start_failure(&error).is_some() {
        spawn_error(program, cwd, error)
    } else {
        error
    }
}

/// A failed start as a [`RunError`]: a passing shortage, or the command's fault.
fn start_failure(e: io::Error) -> RunError {
    if is_resource_exhaustion(&e) {
        RunError::Exhausted(e)
    } else {
        RunError::Command(e)
    }
}

/// Open a command's log for appending and write its header line.
pub(super) fn open_log(path: &std::path::Path, header: &str) -> io::Result<std::fs::File> {
    let mut log = crate::store::modes::open_append(path).map_err(|e| log_error(path, e))?;
    writeln!(log, "{header}")?;
    Ok(log)
}

/// [`open_log`] from the async thread, which must not wait for the disk: a phase's log exists
/// after its first command and is only opened here; creating it (an inode to allocate, the
/// directory locked) is left to the blocking pool.
async fn open_log_from_async(path: &std::path::Path, header: &str) -> io::Result<std::fs::File> {
    match crate::store::modes::open_append_existing(path) {
        Ok(mut log) => {
            writeln!(log, "{header}")?;
            Ok(log)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let (path, header) = (path.to_path_buf(), header.to_string());
            super::spawn_limited(move || open_log(&path, &header))
                .await
                .map_err(io::Error::other)?
        }
        Err(e) => Err(log_error(path, e)),
    }
}

fn log_error(path: &std::path::Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("opening log {}: {e}", path.display()))
}

/// The process group a spawned child leads.
pub(super) fn group_of(child: &CommandProcess) -> Option<Pid> {
    child.id().map(|id| Pid::from_raw(id as i32))
}

/// Why a command could not be run.
#[derive(Debug, thiserror::Error)]
pub(super) enum RunError {
    /// cairn could not open or write the command's log: its own storage (a full disk).
    #[error("{0}")]
    Log(io::Error),
    /// The command could not be started or waited for.
    #[error("{0}")]
    Command(#[from] io::Error),
    /// The system or the daemon is out of processes, memory or open files (`EAGAIN`,
    /// `ENOMEM`, `EMFILE`, `ENFILE` while starting it): a passing condition, often other tasks'
    /// doing, so no fault of this task.
    #[error("{0}")]
    Exhausted(io::Error),
}

/// Whether starting a process failed because the system ran out of processes or memory
/// (`EAGAIN`, `ENOMEM`), or the daemon or the system out of file descriptors (`EMFILE`,
/// `ENFILE`: the pipes and the pidfd of every command in flight count), which passes, rather
/// than because of the command itself.
pub(super) fn is_resource_exhaustion(e: &io::Error) -> bool {
    match errno_of(e) {
        Some(errno) => matches!(
            errno,
            nix::libc::EAGAIN | nix::libc::ENOMEM | nix::libc::EMFILE | nix::libc::ENFILE
        ),
        // No number (an error made with a kind only): EAGAIN's kind, or ENOMEM's.
        None => matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::OutOfMemory
        ),
    }
}

/// Run the command to its end, or until the shutdown's grace runs out, `cancel` fires (an
/// operator's `cairn cancel`) or its timeout passes.
pub(super) async fn run_command(
    run: CommandRun,
    shutdown: &Shutdown,
    cancel: &CancellationToken,
) -> Result<RunEnd, RunError> {
    let log = open_log_from_async(&run.log, &run.log_header)
        .await
        .map_err(RunError::Log)?;
    // Kept to read the log's size at the end; the command gets its own.
    let log_probe = run.max_log_bytes.and_then(|_| log.try_clone().ok());
    let watch = run
        .max_log_bytes
        .map(|max| super::log_cap::Watch::start(&run.log, max));
    let mut child = spawn_in_group(
        &run.argv,
        &run.cwd,
        Environment {
            inherited: &run.inherited_env,
            task: &run.env,
        },
        log,
        StdinFrom::Pipe,
        StdoutTo::Pipe,
        &run.confinement,
    )
    .map_err(start_failure)?;
    let group = group_of(&child);
    let mut stdin = child.stdin.take();
    let mut stdout = child.stdout.take();
    let timeout = async {
        match run.timeout {
            Some(t) => tokio::time::sleep(t).await,
            None => std::future::pending().await,
        }
    };
    let replied = tokio::select! {
        out = exchange(&mut stdin, &mut stdout, &run.stdin) => Some(out),
        _ = shutdown.terminating() => None,
        _ = cancel.cancelled() => None,
        _ = timeout => {
            stop_group(group, &mut child, shutdown).await;
            return Ok(RunEnd::TimedOut);
        }
    };
    let end = settle(replied, &mut child, group, shutdown, cancel).await;
    if let Some(watch) = watch {
        watch.finish(log_probe.as_ref()).await;
    }
    // A trampoline that failed a step exited with its report: a failed start, not a failed
    // command.
    let program = run.argv.first().map_or("", String::as_str);
    let end = end.map_err(|e| match e {
        RunError::Command(e) if spawn::late_start_failure(&e).is_some() => {
            start_failure(wait_error(program, &run.cwd, e))
        }
        other => other,
    });
    // The pipes stay open until the command has exited, as while it was stopped.
    drop((stdin, stdout));
    end
}

/// Write the request on the command's stdin (then close it) while reading its reply, up to
/// one byte past [`MAX_REPLY_BYTES`].
async fn exchange(
    stdin: &mut Option<tokio::net::unix::pipe::Sender>,
    stdout: &mut Option<tokio::net::unix::pipe::Receiver>,
    request: &[u8],
) -> io::Result<Vec<u8>> {
    let write = async {
        if let Some(mut pipe) = stdin.take() {
            // A command that does not read its stdin is fine: ignore EPIPE.
            let _ = pipe.write_all(request).await;
        }
    };
    let read = async {
        let mut buf = Vec::new();
        if let Some(pipe) = stdout.as_mut() {
            pipe.take(MAX_REPLY_BYTES as u64 + 1)
                .read_to_end(&mut buf)
                .await?;
        }
        io::Result::Ok(buf)
    };
    let ((), out) = tokio::join!(write, read);
    out
}

/// How the command ends once its stdout is closed (`replied`), or once a stop or cancel cut
/// the exchange short (`None`).
async fn settle(
    replied: Option<io::Result<Vec<u8>>>,
    child: &mut CommandProcess,
    group: Option<Pid>,
    shutdown: &Shutdown,
    cancel: &CancellationToken,
) -> Result<RunEnd, RunError> {
    match replied {
        Some(Ok(out)) if out.len() > MAX_REPLY_BYTES => {
            kill_group(group, Signal::SIGKILL);
            child.wait().await?;
            Ok(RunEnd::ReplyTooLarge)
        }
        Some(Ok(out)) => {
            let status = tokio::select! {
                status = child.wait() => status?,
                _ = shutdown.terminating() => {
                    stop_group(group, child, shutdown).await;
                    return Ok(RunEnd::Interrupted);
                }
                _ = cancel.cancelled() => {
                    stop_group(group, child, shutdown).await;
                    return Ok(RunEnd::Interrupted);
                }
            };
            Ok(RunEnd::Exited {
                status,
                stdout: out,
            })
        }
        Some(Err(e)) => {
            kill_group(group, Signal::SIGKILL);
            child.wait().await?;
            Err(e.into())
        }
        None => {
            stop_group(group, child, shutdown).await;
            Ok(RunEnd::Interrupted)
        }
    }
}

/// SIGTERM the group, give it [`KILL_AFTER`] (none after a second signal), then SIGKILL it.
pub(super) async fn stop_group(
    group: Option<Pid>,
    child: &mut CommandProcess,
    shutdown: &Shutdown,
) {
    if shutdown.is_immediate() {
        kill_group(group, Signal::SIGKILL);
    } else {
        kill_group(group, Signal::SIGTERM);
        tokio::select! {
            _ = child.wait() => {}
            _ = tokio::time::sleep(KILL_AFTER) => {}
            _ = shutdown.immediately() => {}
        }
        kill_group(group, Signal::SIGKILL);
    }
    let _ = child.wait().await;
}

pub(super) fn kill_group(group: Option<Pid>, signal: Signal) {
    if let Some(group) = group {
        // ESRCH: the group is already gone, which is what we want.
        let _ = killpg(group, signal);
    }
}

#[cfg(test)]
mod tests {
    use super::{is_resource_exhaustion, spawn_error};
    use nix::libc;
    use std::io;

    #[test]
    fn running_out_of_processes_memory_or_descriptors_passes_even_behind_a_message() {
        let cwd = std::env::temp_dir();
        for errno in [libc::EAGAIN, libc::ENOMEM, libc::EMFILE, libc::ENFILE] {
            let raw = io::Error::from_raw_os_error(errno);
            assert!(is_resource_exhaustion(&raw), "{raw}");
            let wrapped = spawn_error("sleep", &cwd, io::Error::from_raw_os_error(errno));
            assert!(
                wrapped.raw_os_error().is_none(),
                "the message replaced the number"
            );
            assert!(is_resource_exhaustion(&wrapped), "{wrapped}");
            assert!(
                wrapped.to_string().starts_with("cannot start \"sleep\": "),
                "{wrapped}"
            );
        }
        for errno in [libc::ENOENT, libc::EACCES, libc::ENOEXEC] {
            let wrapped = spawn_error("sleep", &cwd, io::Error::from_raw_os_error(errno));
            assert!(!is_resource_exhaustion(&wrapped), "{wrapped}");
        }
        // An error with a kind only, as a step of the start reports it.
        let kind_only = io::Error::new(io::ErrorKind::WouldBlock, "cannot run as user 1000");
        assert!(is_resource_exhaustion(&kind_only));
    }
}
