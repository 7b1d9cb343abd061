//! Starting a command's process without copying the daemon.
//!
//! Before its `exec`, a command's process must lead its own process group, join its task's
//! cgroup, enter its working directory and arm its parent-death signal, so that it dies with
//! the daemon. Only the new process itself can do those. A command run as its submitter
//! (`--run-as-submitter`) `exec`s cairn's trampoline instead, still as the daemon's user, which
//! becomes the submitter and `exec`s the command (see `trampoline`): the daemon's thread waits
//! for the new process only while it is the daemon's, so no stop the submitter sends can hold
//! it. The standard library does such work only in a full `fork`, which copies
//! the page tables of the whole daemon (with thousands of tasks in flight, most of the cost of
//! every command), and starting a helper binary that does them costs a second `exec` with its
//! dynamic linking, which cost more than the command itself did.
//!
//! So commands start the way `posix_spawn` starts them: `clone(CLONE_VM | CLONE_VFORK)` onto a
//! small stack of the spawning thread's. The new process shares the daemon's memory (nothing is
//! copied) while that thread waits; it does the steps above with plain system calls and `exec`s
//! the command, or records which step failed (in the shared memory) and exits. Everything it
//! needs is prepared before the clone, so it allocates nothing, takes no lock, and calls no libc
//! function that acts on the whole process: glibc's `setresuid`, for one, would try to change
//! the daemon's threads too (see `identity`). All signals stay blocked across the clone and
//! the new process resets every handler to the default before unblocking them, so no handler of
//! the daemon's ever runs in it.
//!
//! The new process also shares the daemon's descriptor table at first, and makes its own of the
//! few it needs before it changes any (see `Slots`): a copy of the whole table would have its
//! `exec` close every pipe and pidfd of thousands of commands in flight, one by one. Before its
//! `exec` it closes every descriptor but 0-2 (and the trampoline's two), so that one the daemon
//! inherited without close-on-exec reaches no command.
//!
//! The parent-death signal fires when the *thread* that started the process exits: the daemon
//! starts commands from its runtime's one thread, which lives as long as the daemon.

// unsafe: the clone, the child's steps before exec and the descriptor table are raw system
// calls the safe wrappers do not offer (each block says why it is sound).
#![allow(unsafe_code)]

use std::cell::{Cell, RefCell};
use std::ffi::{CStr, CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;

use nix::libc::{self, c_char, c_int, c_void};
use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;

use super::identity::SwitchTo;

/// Where a command's stdin comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StdinFrom {
    Null,
    /// A pipe the daemon writes: [`CommandProcess::stdin`].
    Pipe,
}

/// Where a command's stdout goes (its stderr always goes to its log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StdoutTo {
    /// A pipe the daemon reads: [`CommandProcess::stdout`].
    Pipe,
    Log,
}

/// What a command gets from the daemon's environment (`environment::daemon_env` chooses it),
/// prepared once as the `NAME=value` strings `execve` takes: reading and converting the
/// environment for every command was about a quarter of a spawn's time on the async thread.
/// Taken when the daemon starts (a process that runs threads cannot change its environment
/// safely anyway).
#[derive(Debug, Clone)]
pub struct InheritedEnv(std::sync::Arc<InheritedVars>);

#[derive(Debug)]
struct InheritedVars {
    /// `(name, "name=value")`, sorted by name, without the withheld names.
    vars: Vec<(OsString, CString)>,
    /// Names no command gets, neither from the daemon nor from its task.
    withheld: &'static [&'static str],
}

impl InheritedEnv {
    /// These variables (the last of a name wins), without the `withheld` names. A variable
    /// whose name or value holds a NUL byte cannot exist in an environment, so none is skipped.
    pub fn from_vars(
        vars: impl IntoIterator<Item = (OsString, OsString)>,
        withheld: &'static [&'static str],
    ) -> InheritedEnv {
        let mut vars: Vec<(OsString, CString)> = vars
            .into_iter()
            .filter(|(name, _)| !withheld.iter().any(|w| OsStr::new(w) == name))
            .filter_map(|(name, value)| {
                let mut pair = name.clone().into_vec();
                pair.push(b'=');
                pair.extend_from_slice(value.as_bytes());
                CString::new(pair).ok().map(|pair| (name, pair))
            })
            .collect();
        // Stable: of equal names the last given stays last, and `dedup_by` keeps the first
        // of a run, so reverse first.
        vars.reverse();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        vars.dedup_by(|a, b| a.0 == b.0);
        InheritedEnv(std::sync::Arc::new(InheritedVars { vars, withheld }))
    }

    /// The value of `name` as inherited.
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        let vars = &self.0.vars;
        let found = vars.binary_search_by(|(n, _)| n.as_os_str().cmp(OsStr::new(name)));
        found.ok().map(|i| &vars[i].1.as_bytes()[name.len() + 1..])
    }
}

/// A command's whole environment: the inherited one, with its task's variables over it (the
/// last of a name wins).
#[derive(Debug, Clone, Copy)]
pub struct Environment<'a> {
    pub inherited: &'a InheritedEnv,
    pub task: &'a [(String, String)],
}

/// A command's environment as `execve` takes it, made before the clone.
struct PreparedEnv<'a> {
    inherited: &'a InheritedEnv,
    /// The task's variables that reach the command: not withheld, the last of each name.
    task_vars: Vec<&'a (String, String)>,
    /// `task_vars` as `NAME=value` (the inherited strings are made already).
    task_strings: Vec<CString>,
}

impl<'a> PreparedEnv<'a> {
    fn new(env: Environment<'a>) -> io::Result<PreparedEnv<'a>> {
        let (task, withheld) = (env.task, env.inherited.0.withheld);
        let task_vars: Vec<_> = task
            .iter()
            .enumerate()
            .filter(|(i, (name, _))| {
                !withheld.contains(&name.as_str()) && !task[i + 1..].iter().any(|(n, _)| n == name)
            })
            .map(|(_, var)| var)
            .collect();
        let task_strings = c_strings(
            task_vars
                .iter()
                .map(|(name, value)| format!("{name}={value}")),
            "an environment variable",
        )?;
        Ok(PreparedEnv {
            inherited: env.inherited,
            task_vars,
            task_strings,
        })
    }

    /// The value the command gets for `name`.
    fn get(&self, name: &str) -> Option<&[u8]> {
        match self.task_vars.iter().find(|(n, _)| n == name) {
            Some((_, value)) => Some(value.as_bytes()),
            None => self.inherited.get(name),
        }
    }

    /// The environment as owned `NAME=value` strings, in the order of [`Self::pointers`].
    fn strings(&self) -> Vec<CString> {
        let overridden = |name: &OsStr| self.task_vars.iter().any(|(n, _)| OsStr::new(n) == name);
        self.inherited
            .0
            .vars
            .iter()
            .filter(|(name, _)| !overridden(name))
            .map(|(_, pair)| pair.clone())
            .chain(self.task_strings.iter().cloned())
            .collect()
    }

    /// `envp`: the inherited strings the task does not override, then the task's.
    fn pointers(&self) -> Vec<*const c_char> {
        let overridden = |name: &OsStr| self.task_vars.iter().any(|(n, _)| OsStr::new(n) == name);
        self.inherited
            .0
            .vars
            .iter()
            .filter(|(name, _)| !overridden(name))
            .map(|(_, pair)| pair.as_ptr())
            .chain(self.task_strings.iter().map(|pair| pair.as_ptr()))
            .chain(std::iter::once(std::ptr::null()))
            .collect()
    }
}

/// What a new process is to become.
pub(super) struct ProcessSpec<'a> {
    /// The program as written (found through `PATH` if it has no `/`) and its arguments.
    pub argv: &'a [String],
    pub cwd: &'a Path,
    pub env: Environment<'a>,
    pub log: File,
    pub stdin: StdinFrom,
    pub stdout: StdoutTo,
    /// The `cgroup.procs` file to join, opened for writing.
    pub cgroup_procs: Option<&'a File>,
    pub run_as: Option<&'a SwitchTo>,
}

/// A started command: its pipes, and its exit to wait for. Dropping it before it was waited
/// for kills it (SIGKILL) and reaps it in the background.
#[derive(Debug)]
pub struct CommandProcess {
    pid: libc::pid_t,
    /// Readable once the process has exited; `None` once it has been reaped.
    pidfd: Option<AsyncFd<OwnedFd>>,
    status: Option<ExitStatus>,
    pub stdin: Option<pipe::Sender>,
    pub stdout: Option<pipe::Receiver>,
    /// Started through the trampoline: the read end of its report pipe, read once it exited
    /// (see `trampoline`).
    start_report: Option<OwnedFd>,
}

impl CommandProcess {
    /// The process id, until it has been reaped.
    pub fn id(&self) -> Option<u32> {
        self.status.is_none().then_some(self.pid as u32)
    }

    /// Wait for the process to exit and reap it (cancel-safe).
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        let Some(pidfd) = &self.pidfd else {
            return Err(io::Error::other("the process was reaped already"));
        };
        let status = wait_exit(self.pid, pidfd).await?;
        self.status = Some(status);
        self.pidfd = None;
        if let Some(report) = self.start_report.take() {
            if let Some(failure) = read_start_report(&report) {
                return Err(failure);
            }
        }
        Ok(status)
    }
}

/// The error a trampoline reported before it exited (written before its exit, so there by
/// now), or `None` when it `exec`ed the command (the pipe is close-on-exec, hence empty).
fn read_start_report(report: &OwnedFd) -> Option<io::Error> {
    let mut buf = [0u8; 1024];
    // SAFETY: read into a local buffer of the length given; the pipe is non-blocking.
    let n = unsafe { libc::read(report.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    let bytes = buf.get(..usize::try_from(n).ok()?)?;
    let (errno, step) = super::trampoline::parse_report(bytes)?;
    let error = io::Error::from_raw_os_error(errno);
    let error = match step {
        None => error,
        Some(step) => io::Error::new(error.kind(), format!("{step}: {error}")),
    };
    Some(io::Error::new(
        error.kind(),
        LateStartFailure { errno, error },
    ))
}

/// A start that failed after `start` returned: a step of the trampoline (`trampoline`). The
/// caller reports it as it reports a failed start ([`late_start_failure`]).
#[derive(Debug)]
struct LateStartFailure {
    errno: i32,
    error: io::Error,
}

impl std::fmt::Display for LateStartFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for LateStartFailure {}

/// When an error of [`CommandProcess::wait`] says that the command never started (a step of
/// the trampoline failed): the system's error number behind it.
pub(super) fn late_start_failure(error: &io::Error) -> Option<i32> {
    error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<LateStartFailure>())
        .map(|failure| failure.errno)
}

impl Drop for CommandProcess {
    fn drop(&mut self) {
        let Some(pidfd) = self.pidfd.take() else {
            return;
        };
        // SAFETY: kill with integers; the process is not reaped yet, so its pid is still ours.
        unsafe { libc::kill(self.pid, libc::SIGKILL) };
        let pid = self.pid;
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    let _ = wait_exit(pid, &pidfd).await;
                });
            }
            Err(_) => {
                let _ = reap(pid, 0);
            }
        }
    }
}

async fn wait_exit(pid: libc::pid_t, pidfd: &AsyncFd<OwnedFd>) -> io::Result<ExitStatus> {
    loop {
        let mut ready = pidfd.readable().await?;
        if let Some(status) = reap(pid, libc::WNOHANG)? {
            return Ok(status);
        }
        ready.clear_ready();
    }
}

/// `waitpid` for one child: its status once it has exited.
fn reap(pid: libc::pid_t, flags: c_int) -> io::Result<Option<ExitStatus>> {
    let mut status = 0;
    loop {
        // SAFETY: waitpid writes the status into our local.
        let reaped = unsafe { libc::waitpid(pid, &mut status, flags) };
        match reaped {
            0 => return Ok(None),
            -1 if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => continue,
            -1 => return Err(io::Error::last_os_error()),
            _ => return Ok(Some(ExitStatus::from_raw(status))),
        }
    }
}

/// Start the process `spec` describes, leading a new process group, dying with the daemon.
/// An error names the step that failed (the `exec` failing: the OS error alone, as
/// `std::process::Command` gives it).
pub(super) fn start(spec: ProcessSpec<'_>) -> io::Result<CommandProcess> {
    let command = PreparedCommand::new(&spec)?;
    // A command run as someone else starts through the trampoline (see `trampoline`): the
    // switch of user happens after this process's part has ended.
    let trampoline = spec
        .run_as
        .map(|run_as| command.trampoline(run_as))
        .transpose()?;
    let stdio = StdioEnds::open(spec.stdin, spec.stdout)?;
    let log = spec.log;
    let stdout_theirs = stdio
        .stdout_pipe
        .as_ref()
        .map_or(log.as_raw_fd(), AsRawFd::as_raw_fd);
    let Cloned {
        pid,
        pidfd,
        failure,
    } = clone_in_slots(
        &command,
        [
            stdio.stdin_theirs.as_raw_fd(),
            stdout_theirs,
            log.as_raw_fd(),
        ],
        spec.cgroup_procs.map(AsRawFd::as_raw_fd),
        trampoline.as_ref(),
    )?;
    drop((stdio.stdin_theirs, stdio.stdout_pipe, log));
    // The plan and the report's write end are the new process's alone now.
    let start_report = trampoline.map(TrampolineStart::into_report);
    if let Some((step, errno)) = failure {
        // It has exited (that ended the clone's wait); reap it.
        drop(pidfd);
        let _ = reap(pid, 0);
        return Err(failed_step(step, errno));
    }
    let mut process = CommandProcess {
        pid,
        pidfd: Some(register_pidfd(pid, pidfd)?),
        status: None,
        stdin: None,
        stdout: None,
        start_report,
    };
    // From here a failure drops `process`, which kills and reaps it.
    process.stdin = stdio
        .stdin_ours
        .map(pipe::Sender::from_owned_fd)
        .transpose()?;
    process.stdout = stdio
        .stdout_ours
        .map(pipe::Receiver::from_owned_fd)
        .transpose()?;
    Ok(process)
}

/// A command's strings as `execve` takes them, made before the clone (which may not
/// allocate).
struct PreparedCommand<'a> {
    argv: Vec<CString>,
    env: PreparedEnv<'a>,
    candidates: Vec<CString>,
    cwd: CString,
    daemon_pid: libc::pid_t,
}

impl<'a> PreparedCommand<'a> {
    fn new(spec: &ProcessSpec<'a>) -> io::Result<PreparedCommand<'a>> {
        let Some(program) = spec.argv.first() else {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty command"));
        };
        let argv = c_strings(spec.argv.iter().map(OsStr::new), "an argument")?;
        let env = PreparedEnv::new(spec.env)?;
        let candidates = candidates(program, &env)?;
        let cwd = c_string(spec.cwd.as_os_str(), "the working directory")?;
        // SAFETY: getpid has no preconditions.
        let daemon_pid = unsafe { libc::getpid() };
        Ok(PreparedCommand {
            argv,
            env,
            candidates,
            cwd,
            daemon_pid,
        })
    }

    /// The trampoline's plan and report pipe, to start this command as `run_as`.
    fn trampoline(&self, run_as: &SwitchTo) -> io::Result<TrampolineStart> {
        TrampolineStart::prepare(
            run_as,
            &self.candidates,
            &self.argv,
            &self.env,
            &self.cwd,
            self.daemon_pid,
        )
    }
}

/// The new process's ends of its stdin and stdout, and the daemon's ends of their pipes.
struct StdioEnds {
    stdin_ours: Option<OwnedFd>,
    stdin_theirs: OwnedFd,
    stdout_ours: Option<OwnedFd>,
    /// `None`: stdout goes to the log.
    stdout_pipe: Option<OwnedFd>,
}

impl StdioEnds {
    /// The new process's ends are put into this thread's slots (numbers above 2) for the
    /// clone, so they may be any descriptor here, 0 to 2 included.
    fn open(stdin: StdinFrom, stdout: StdoutTo) -> io::Result<StdioEnds> {
        let (stdin_ours, stdin_theirs): (_, OwnedFd) = match stdin {
            StdinFrom::Pipe => {
                let (read, write) = pipe_pair()?;
                (Some(write), read)
            }
            StdinFrom::Null => (None, File::open("/dev/null")?.into()),
        };
        let (stdout_ours, stdout_pipe) = match stdout {
            StdoutTo::Pipe => {
                let (read, write) = pipe_pair()?;
                (Some(read), Some(write))
            }
            StdoutTo::Log => (None, None),
        };
        Ok(StdioEnds {
            stdin_ours,
            stdin_theirs,
            stdout_ours,
            stdout_pipe,
        })
    }
}

/// A new process as the clone left it.
struct Cloned {
    pid: libc::pid_t,
    pidfd: OwnedFd,
    /// The step that failed in it, and the error number.
    failure: Option<(Step, i32)>,
}

/// Place `stdio`, `cgroup_procs` and the trampoline's descriptors in this thread's slots and
/// clone the new process from them.
fn clone_in_slots(
    command: &PreparedCommand<'_>,
    stdio: [RawFd; 3],
    cgroup_procs: Option<RawFd>,
    trampoline: Option<&TrampolineStart>,
) -> io::Result<Cloned> {
    let argv_ptrs = null_terminated(&command.argv);
    let env_ptrs = command.env.pointers();
    let no_env: [*const c_char; 1] = [std::ptr::null()];
    SLOTS.with(|slots| {
        let mut slots = slots.borrow_mut();
        let slots = match &mut *slots {
            Some(slots) => slots,
            None => slots.insert(Slots::open()?),
        };
        let placed = slots.place(stdio, cgroup_procs, trampoline.map(TrampolineStart::fds))?;
        // The trampoline's descriptors go just above the slots, which are closed before the
        // `exec`: nothing else of the daemon's reaches it.
        let targets = [slots.end, slots.end + 1];
        let trampoline_argv = match (trampoline, placed.trampoline) {
            (Some(_), Some(_)) => Some(trampoline_argv(targets)?),
            _ => None,
        };
        let trampoline_argv_ptrs = trampoline_argv.as_deref().map(null_terminated);
        let plan = Plan {
            candidates: &command.candidates,
            argv: argv_ptrs.as_ptr(),
            envp: env_ptrs.as_ptr(),
            cwd: &command.cwd,
            stdio: placed.stdio,
            cgroup_procs: placed.cgroup_procs,
            first_not_kept: slots.end,
            through_trampoline: placed.trampoline.zip(trampoline_argv_ptrs.as_ref()).map(
                |(sources, argv)| ThroughTrampoline {
                    sources,
                    targets,
                    program: super::trampoline::binary(),
                    argv: argv.as_ptr(),
                    envp: no_env.as_ptr(),
                },
            ),
            daemon_pid: command.daemon_pid,
            file_limit: super::fd_limit::for_commands(),
            failure: Cell::new(None),
        };
        let (pid, pidfd) = clone_and_exec(&plan)?;
        io::Result::Ok(Cloned {
            pid,
            pidfd,
            failure: plan.failure.get(),
        })
    })
}

/// The trampoline's `argv`: its name and the numbers of its plan and report descriptors.
fn trampoline_argv(targets: [RawFd; 2]) -> io::Result<Vec<CString>> {
    c_strings(
        [
            super::trampoline::ARGV0.to_string(),
            targets[0].to_string(),
            targets[1].to_string(),
        ]
        .iter(),
        "an argument",
    )
}

/// The error of a start whose `step` failed with `errno` in the new process.
fn failed_step(step: Step, errno: i32) -> io::Error {
    let error = io::Error::from_raw_os_error(errno);
    match step {
        Step::Exec => error,
        step => io::Error::new(error.kind(), format!("{}: {error}", step.describe())),
    }
}

/// The pidfd of the started process `pid`, registered with the runtime; the process is killed
/// and reaped when that fails.
fn register_pidfd(pid: libc::pid_t, pidfd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: the pidfd is an open descriptor owned by the `OwnedFd` handed over, which keeps
    // it open and unchanged for as long as the `AsyncFd` holds it.
    let registered =
        unsafe { AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE) };
    registered.map_err(|e| {
        // SAFETY: kill with integers; the process is ours and not reaped.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let _ = reap(pid, 0);
        e.into()
    })
}

/// What a start through the trampoline needs besides the rest: its plan in a memory file, and
/// the report pipe.
struct TrampolineStart {
    plan: OwnedFd,
    report_read: OwnedFd,
    report_write: OwnedFd,
}

impl TrampolineStart {
    fn prepare(
        run_as: &SwitchTo,
        candidates: &[CString],
        argv: &[CString],
        env: &PreparedEnv<'_>,
        cwd: &CStr,
        daemon_pid: libc::pid_t,
    ) -> io::Result<TrampolineStart> {
        let plan = super::trampoline::StartPlan {
            uid: run_as.uid.as_raw(),
            gid: run_as.gid.as_raw(),
            groups: run_as.raw_groups(),
            cwd: cwd.to_owned(),
            candidates: candidates.to_vec(),
            argv: argv.to_vec(),
            env: env.strings(),
            daemon_pid,
        };
        // SAFETY: memfd_create with a NUL-terminated name; the descriptor is ours.
        let memfd = unsafe { libc::memfd_create(c"cairn-start-plan".as_ptr(), libc::MFD_CLOEXEC) };
        if memfd == -1 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: just made, owned by no one else.
        let mut file = unsafe { File::from_raw_fd(memfd) };
        use std::io::{Seek, Write};
        file.write_all(&plan.encode())?;
        file.rewind()?;
        let (report_read, report_write) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)?;
        Ok(TrampolineStart {
            plan: file.into(),
            report_read,
            report_write,
        })
    }

    /// The plan and the report's write end, to place for the new process.
    fn fds(&self) -> [RawFd; 2] {
        [self.plan.as_raw_fd(), self.report_write.as_raw_fd()]
    }

    /// What the daemon keeps: the report's read end.
    fn into_report(self) -> OwnedFd {
        self.report_read
    }
}

/// How the new process `exec`s the trampoline instead of the command.
struct ThroughTrampoline {
    /// The slots holding the plan and the report pipe's write end.
    sources: [RawFd; 2],
    /// The numbers they get, without close-on-exec (named in `argv`).
    targets: [RawFd; 2],
    program: &'static CStr,
    argv: *const *const c_char,
    /// Empty: the trampoline starts with the daemon's privileges, so no variable of the task's
    /// may reach its dynamic loader.
    envp: *const *const c_char,
}

/// Everything the new process needs, prepared before the clone.
struct Plan<'a> {
    /// The files to try to `exec`, in order (`execvp`'s search, done ahead).
    candidates: &'a [CString],
    argv: *const *const c_char,
    envp: *const *const c_char,
    cwd: &'a CStr,
    /// The descriptors that become 0, 1 and 2: this thread's [`Slots`], all above 2, so none
    /// is overwritten first.
    stdio: [RawFd; 3],
    /// The task's `cgroup.procs`, opened for writing, in its slot.
    cgroup_procs: Option<RawFd>,
    /// The new process keeps the descriptors below this one (the slots' end), not a copy of
    /// the daemon's whole table.
    first_not_kept: RawFd,
    /// With `Some`, the new process `exec`s the trampoline, which switches to `run_as` and
    /// `exec`s the command; the new process itself never changes identity.
    through_trampoline: Option<ThroughTrampoline>,
    daemon_pid: libc::pid_t,
    /// The open-files limit the command gets, when the daemon raised its own (`fd_limit`).
    file_limit: Option<libc::rlimit>,
    /// Written by the new process (which shares this memory) if a step failed.
    failure: Cell<Option<(Step, i32)>>,
}

/// The step of starting a process that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    ProcessGroup,
    Stdio,
    Cgroup,
    Descriptors,
    Trampoline,
    FileLimit,
    WorkingDir,
    DeathSignal,
    DaemonGone,
    SignalMask,
    Exec,
}

impl Step {
    fn describe(self) -> String {
        match self {
            Step::ProcessGroup => "cannot make it a process group leader".into(),
            Step::Stdio => "cannot set up its stdin, stdout and stderr".into(),
            Step::Cgroup => "cannot join the task's cgroup".into(),
            Step::Descriptors => "cannot make its own table of descriptors".into(),
            Step::Trampoline => "cannot start cairn's trampoline".into(),
            Step::FileLimit => "cannot set its limit on open files".into(),
            Step::WorkingDir => "cannot enter its working directory".into(),
            Step::DeathSignal => "cannot arm the parent-death signal".into(),
            Step::DaemonGone => "the daemon exited while it started".into(),
            Step::SignalMask => "cannot unblock its signals".into(),
            Step::Exec => "exec".into(),
        }
    }
}

/// The stack the new process runs on until its `exec`: one per spawning thread, reused (the
/// thread waits while the process uses it), with a guard page below it.
struct ChildStack {
    base: *mut c_void,
    len: usize,
}

const STACK_LEN: usize = 256 * 1024;
const GUARD_LEN: usize = 4096;

impl ChildStack {
    fn new() -> io::Result<ChildStack> {
        let len = STACK_LEN + GUARD_LEN;
        // SAFETY: a fresh anonymous private mapping; nothing else refers to it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the lowest page of the mapping made above.
        if unsafe { libc::mprotect(base, GUARD_LEN, libc::PROT_NONE) } != 0 {
            let error = io::Error::last_os_error();
            // SAFETY: unmapping what was mapped above.
            unsafe { libc::munmap(base, len) };
            return Err(error);
        }
        Ok(ChildStack { base, len })
    }

    /// The top of the stack (it grows down), 16-byte aligned.
    fn top(&self) -> *mut c_void {
        // SAFETY: one past the end of the mapping, which is page-aligned.
        unsafe { self.base.cast::<u8>().add(self.len).cast() }
    }
}

impl Drop for ChildStack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; no process runs on it (threads end after their
        // spawns returned).
        unsafe { libc::munmap(self.base, self.len) };
    }
}

thread_local! {
    static STACK: RefCell<Option<ChildStack>> = const { RefCell::new(None) };
    static SLOTS: RefCell<Option<Slots>> = const { RefCell::new(None) };
}

/// Descriptors a spawning thread keeps at fixed, low numbers (opened on `/dev/null` at its
/// first spawn, above 2), where a new process's stdin, stdout, stderr and cgroup file are put
/// for the clone.
///
/// An `exec` closes every close-on-exec descriptor of the process one by one, and a forked or
/// cloned process has a copy of the daemon's table: with thousands of commands in flight, each
/// holding a pidfd and a pipe there, every new command spent milliseconds closing them (29 %
/// of all the CPU time while 3,000 commands started, and growing with each). So the new
/// process shares the daemon's table (CLONE_FILES) and, before it changes anything, makes its
/// own holding only the descriptors below the slots' end (`close_range` with
/// `CLOSE_RANGE_UNSHARE`): the daemon's first few, and the slots.
struct Slots {
    null: OwnedFd,
    /// stdin, stdout, stderr, the cgroup file, the trampoline's plan and report pipe.
    fds: [OwnedFd; 6],
    /// One past the highest slot.
    end: RawFd,
}

/// The slot numbers a new process reads its descriptors from, while they are placed there.
struct Placed<'a> {
    slots: &'a Slots,
    stdio: [RawFd; 3],
    cgroup_procs: Option<RawFd>,
    trampoline: Option<[RawFd; 2]>,
}

impl Slots {
    fn open() -> io::Result<Slots> {
        let null: OwnedFd = File::options()
            .read(true)
            .write(true)
            .open("/dev/null")?
            .into();
        // Above 2 (a daemon started with a standard stream closed has its first files there),
        // so that setting up the new process's 0, 1 and 2 never overwrites a slot it has yet
        // to read.
        let slot = || -> io::Result<OwnedFd> {
            // SAFETY: F_DUPFD_CLOEXEC makes a new descriptor, which we own.
            let fd = unsafe { libc::fcntl(null.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
            if fd == -1 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: just made, owned by no one else.
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        };
        let fds = [slot()?, slot()?, slot()?, slot()?, slot()?, slot()?];
        let end = fds.iter().map(AsRawFd::as_raw_fd).max().unwrap_or(2) + 1;
        Ok(Slots { null, fds, end })
    }

    /// Put duplicates of `stdio`, `cgroup_procs` and the trampoline's descriptors into the
    /// slots, close-on-exec (so the slots themselves do not pass to the command), until the
    /// returned value is dropped.
    fn place(
        &self,
        stdio: [RawFd; 3],
        cgroup_procs: Option<RawFd>,
        trampoline: Option<[RawFd; 2]>,
    ) -> io::Result<Placed<'_>> {
        let mut placed = Placed {
            slots: self,
            stdio: [-1; 3],
            cgroup_procs: None,
            trampoline: None,
        };
        for (i, source) in stdio.into_iter().enumerate() {
            placed.stdio[i] = self.put(i, source)?;
        }
        if let Some(source) = cgroup_procs {
            placed.cgroup_procs = Some(self.put(3, source)?);
        }
        if let Some([plan, report]) = trampoline {
            placed.trampoline = Some([self.put(4, plan)?, self.put(5, report)?]);
        }
        Ok(placed)
    }

    /// Slot `i` becomes a duplicate of `source`; returns its number.
    fn put(&self, i: usize, source: RawFd) -> io::Result<RawFd> {
        let slot = self.fds[i].as_raw_fd();
        // SAFETY: dup3 onto a descriptor this value owns, which stays open (as another file).
        if unsafe { libc::dup3(source, slot, libc::O_CLOEXEC) } == -1 {
            return Err(io::Error::last_os_error());
        }
        Ok(slot)
    }
}

impl Drop for Placed<'_> {
    /// Back to `/dev/null`: the daemon must not keep the command's end of a pipe open (it would
    /// never see the command's stdout end).
    fn drop(&mut self) {
        let trampoline = self.trampoline.into_iter().flatten();
        for slot in self
            .stdio
            .into_iter()
            .chain(self.cgroup_procs)
            .chain(trampoline)
        {
            if slot < 0 {
                continue;
            }
            // SAFETY: dup3 onto a slot descriptor the `Slots` owns.
            let reset = unsafe { libc::dup3(self.slots.null.as_raw_fd(), slot, libc::O_CLOEXEC) };
            if reset == -1 {
                tracing::error!(slot, error = %io::Error::last_os_error(), "cannot put a spawn slot back on /dev/null: the command's end of a pipe stays open in the daemon");
            }
        }
    }
}

/// Clone the new process onto this thread's child stack and wait until it has `exec`ed or
/// exited; returns its pid and pidfd.
fn clone_and_exec(plan: &Plan<'_>) -> io::Result<(libc::pid_t, OwnedFd)> {
    STACK.with(|slot| {
        let mut slot = slot.borrow_mut();
        if slot.is_none() {
            *slot = Some(ChildStack::new()?);
        }
        let Some(stack) = slot.as_ref() else {
            return Err(io::Error::other("no stack for the new process"));
        };
        let mut pidfd: c_int = -1;
        // CLONE_FILES: the new process shares the daemon's descriptor table until it makes its
        // own of the few it needs (see `Slots`), instead of the kernel copying all of it.
        let flags = libc::CLONE_VM
            | libc::CLONE_VFORK
            | libc::CLONE_FILES
            | libc::CLONE_PIDFD
            | libc::SIGCHLD;
        // SAFETY: every signal is blocked in this thread across the clone (restored after), so
        // no handler runs on the new process's stack before it resets them; the new process
        // runs `child_main` on its own stack with `plan`, which outlives it (this thread waits
        // until it has exec'ed or exited: CLONE_VFORK), and `child_main` never returns.
        let pid = unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut before: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut before);
            let pid = libc::clone(
                child_main,
                stack.top(),
                flags,
                (plan as *const Plan<'_>).cast_mut().cast(),
                &mut pidfd as *mut c_int,
            );
            let error = io::Error::last_os_error();
            libc::pthread_sigmask(libc::SIG_SETMASK, &before, std::ptr::null_mut());
            if pid == -1 {
                return Err(error);
            }
            pid
        };
        // SAFETY: CLONE_PIDFD stored a new descriptor, which is ours alone.
        Ok((pid, unsafe { OwnedFd::from_raw_fd(pidfd) }))
    })
}

/// The new process: set itself up and `exec`, or record the failed step and exit 127.
extern "C" fn child_main(plan: *mut c_void) -> c_int {
    // SAFETY: `clone_and_exec` passed a `Plan` that outlives this process's use of it.
    let plan = unsafe { &*plan.cast_const().cast::<Plan<'_>>() };
    let failure = match (prepare(plan), &plan.through_trampoline) {
        (Ok(()), None) => exec(plan),
        (Ok(()), Some(trampoline)) => {
            // SAFETY: NUL-terminated strings and NULL-terminated arrays prepared before the
            // clone.
            unsafe {
                libc::execve(
                    trampoline.program.as_ptr(),
                    trampoline.argv,
                    trampoline.envp,
                )
            };
            let errno = io::Error::last_os_error().raw_os_error().unwrap_or(0);
            (Step::Trampoline, errno)
        }
        (Err(failure), _) => failure,
    };
    plan.failure.set(Some(failure));
    // SAFETY: ends this process only (it is its own thread group).
    unsafe { libc::_exit(127) }
}

/// The steps before `exec`, in order. Only async-signal-safe system calls: see the module doc.
fn prepare(plan: &Plan<'_>) -> Result<(), (Step, i32)> {
    // SAFETY: for every call below, plain system calls with integers, or pointers into `plan`
    // and locals, which live through them.
    unsafe {
        reset_signal_handlers();
        // First, before anything changes a descriptor: a table of its own, of the descriptors
        // below the slots' end only (CLOSE_RANGE_UNSHARE copies just those: Linux 5.9), or on
        // an older kernel a copy of the whole table, as a fork makes.
        let unshared = libc::syscall(
            libc::SYS_close_range,
            plan.first_not_kept as libc::c_uint,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_UNSHARE,
        );
        if unshared != 0 {
            check(libc::unshare(libc::CLONE_FILES), Step::Descriptors)?;
        }
        check(libc::setpgid(0, 0), Step::ProcessGroup)?;
        for (target, &source) in plan.stdio.iter().enumerate() {
            check(libc::dup2(source, target as c_int), Step::Stdio)?;
        }
        if let Some(procs) = plan.cgroup_procs {
            let written = libc::write(procs, b"0".as_ptr().cast(), 1);
            check(written as c_int, Step::Cgroup)?;
        }
        // Nothing of the daemon's but 0-2 reaches the command: an inherited descriptor without
        // close-on-exec among the daemon's first few would otherwise pass (the slots are done
        // with now). The trampoline's two stay, at their numbers above the slots.
        match &plan.through_trampoline {
            None => close_from(3),
            Some(trampoline) => {
                for (&source, &target) in trampoline.sources.iter().zip(&trampoline.targets) {
                    check(libc::dup2(source, target), Step::Descriptors)?;
                }
                let [first, last] = trampoline.targets;
                libc::syscall(libc::SYS_close_range, 3, first - 1, 0);
                close_from(last + 1);
            }
        }
        // The soft limit the daemon started with (lowering it needs no privilege).
        if let Some(limit) = &plan.file_limit {
            check(libc::setrlimit(libc::RLIMIT_NOFILE, limit), Step::FileLimit)?;
        }
        // Run as the daemon's user, the command enters its directory here; run as someone
        // else, the trampoline enters it as them.
        if plan.through_trampoline.is_none() {
            check(libc::chdir(plan.cwd.as_ptr()), Step::WorkingDir)?;
        }
        // Armed last (the trampoline arms it again after its switch of user, which clears it).
        check(
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0),
            Step::DeathSignal,
        )?;
        // The daemon may have died before the signal was armed: then die as it would have
        // made us.
        if libc::getppid() != plan.daemon_pid {
            libc::kill(libc::getpid(), libc::SIGKILL);
            return Err((Step::DaemonGone, libc::ESRCH));
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        check(
            libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut()),
            Step::SignalMask,
        )?;
    }
    Ok(())
}

/// Close every descriptor from `first` on (`close_range`, Linux 5.9; one by one before).
///
/// # Safety
/// Only in the new process, with its own table of descriptors.
unsafe fn close_from(first: c_int) {
    if libc::syscall(
        libc::SYS_close_range,
        first as libc::c_uint,
        libc::c_uint::MAX,
        0,
    ) != 0
    {
        let mut limit: libc::rlimit = std::mem::zeroed();
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        let end = c_int::try_from(limit.rlim_cur)
            .unwrap_or(c_int::MAX)
            .min(1 << 20);
        for fd in first..end {
            libc::close(fd);
        }
    }
}

/// Every signal with a handler gets the default disposition (handlers are the daemon's code,
/// which must not run here), and so does SIGPIPE, which Rust's runtime ignores in the daemon
/// (ignored signals stay ignored across `exec`; commands expect the default). Other ignored
/// signals stay ignored, as with any spawn.
///
/// # Safety
/// Only in the new process, with every signal blocked.
unsafe fn reset_signal_handlers() {
    let mut default: libc::sigaction = std::mem::zeroed();
    default.sa_sigaction = libc::SIG_DFL;
    for signal in 1..65 {
        if signal == libc::SIGKILL || signal == libc::SIGSTOP {
            continue;
        }
        let mut current: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(signal, std::ptr::null(), &mut current) != 0 {
            continue; // a signal glibc keeps for itself
        }
        let handled =
            current.sa_sigaction != libc::SIG_DFL && current.sa_sigaction != libc::SIG_IGN;
        if handled || signal == libc::SIGPIPE {
            libc::sigaction(signal, &default, std::ptr::null_mut());
        }
    }
}

/// `execve` each candidate in turn, as `execvp` searches: a missing file or directory tries the
/// next; a file that may not be executed is remembered (reported if nothing else runs); any
/// other error stops the search.
fn exec(plan: &Plan<'_>) -> (Step, i32) {
    let mut denied = false;
    let mut last = libc::ENOENT;
    for program in plan.candidates {
        // SAFETY: NUL-terminated strings and NULL-terminated arrays prepared before the clone.
        unsafe { libc::execve(program.as_ptr(), plan.argv, plan.envp) };
        let errno = io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::ENOENT);
        match errno {
            libc::EACCES => denied = true,
            libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
            other => return (Step::Exec, other),
        }
        last = errno;
    }
    (Step::Exec, if denied { libc::EACCES } else { last })
}

fn check(result: c_int, step: Step) -> Result<(), (Step, i32)> {
    if result == -1 {
        Err((step, io::Error::last_os_error().raw_os_error().unwrap_or(0)))
    } else {
        Ok(())
    }
}

/// The files `execvp` would try for `program`: itself if it names a path (relative to the
/// working directory, which the new process has entered), else each directory of the command's
/// `PATH` (from its environment; else `/bin:/usr/bin`, as glibc's default).
fn candidates(program: &str, env: &PreparedEnv<'_>) -> io::Result<Vec<CString>> {
    if program.contains('/') {
        return Ok(vec![c_string(OsStr::new(program), "the program")?]);
    }
    let path = env
        .get("PATH")
        .map_or(OsStr::new("/bin:/usr/bin"), OsStr::from_bytes);
    std::env::split_paths(path)
        .map(|dir| {
            let mut file = dir.into_os_string().into_vec();
            if !file.is_empty() && !file.ends_with(b"/") {
                file.push(b'/');
            }
            file.extend_from_slice(program.as_bytes());
            c_string(OsStr::from_bytes(&file), "the program")
        })
        .collect()
}

fn c_string(value: &OsStr, what: &str) -> io::Result<CString> {
    CString::new(value.as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{what} {value:?} holds a NUL byte"),
        )
    })
}

fn c_strings<'a, S: AsRef<OsStr> + 'a>(
    values: impl Iterator<Item = S>,
    what: &str,
) -> io::Result<Vec<CString>> {
    values.map(|value| c_string(value.as_ref(), what)).collect()
}

fn null_terminated(strings: &[CString]) -> Vec<*const c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// A pipe, both ends close-on-exec: (read, write).
fn pipe_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    static INHERITED: std::sync::LazyLock<InheritedEnv> =
        std::sync::LazyLock::new(|| InheritedEnv::from_vars(std::env::vars_os(), &[]));

    fn spec<'a>(argv: &'a [String], stdin: StdinFrom, stdout: StdoutTo) -> ProcessSpec<'a> {
        ProcessSpec {
            argv,
            cwd: Path::new("/"),
            env: Environment {
                inherited: &INHERITED,
                task: &[],
            },
            log: File::options().append(true).open("/dev/null").unwrap(),
            stdin,
            stdout,
            cgroup_procs: None,
            run_as: None,
        }
    }

    fn argv(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| w.to_string()).collect()
    }

    #[tokio::test]
    async fn a_command_gets_its_stdio_and_none_of_the_descriptors_opened_after_the_first_spawn() {
        use tokio::io::AsyncReadExt;
        // The thread's slots are made by its first spawn.
        let words = argv(&["true"]);
        let mut first = start(spec(&words, StdinFrom::Null, StdoutTo::Pipe)).unwrap();
        first.wait().await.unwrap();
        // Inheritable (not close-on-exec, as a `fork` would pass it) and far above the slots.
        let null = File::open("/dev/null").unwrap();
        // SAFETY: dup2 onto a number this test owns from here on.
        let high = unsafe { libc::dup2(null.as_raw_fd(), 900) };
        assert_eq!(high, 900, "{}", io::Error::last_os_error());
        let words = argv(&["sh", "-c", "ls /proc/$$/fd"]);
        let mut process = start(spec(&words, StdinFrom::Null, StdoutTo::Pipe)).unwrap();
        let mut listing = String::new();
        let mut stdout = process.stdout.take().unwrap();
        stdout.read_to_string(&mut listing).await.unwrap();
        process.wait().await.unwrap();
        // SAFETY: closing the descriptor made above.
        unsafe { libc::close(900) };
        let fds: Vec<&str> = listing.split_whitespace().collect();
        for stdio in ["0", "1", "2"] {
            assert!(fds.contains(&stdio), "{listing}");
        }
        assert!(
            !fds.contains(&"900"),
            "the command got the daemon's descriptor: {listing}"
        );
    }

    #[tokio::test]
    async fn a_command_inherits_the_environment_under_its_tasks_variables_without_the_withheld() {
        use tokio::io::AsyncReadExt;
        let inherited = InheritedEnv::from_vars(std::env::vars_os(), &["HOME"]);
        let task_path = "/nonexistent-cairn-dir:/usr/bin:/bin".to_string();
        let task = [
            ("CAIRN_TEST_VAR".to_string(), "first".to_string()),
            ("PATH".to_string(), task_path.clone()),
            ("HOME".to_string(), "/nonexistent-cairn-home".to_string()),
            ("CAIRN_TEST_VAR".to_string(), "last".to_string()),
        ];
        let words = argv(&["env"]);
        let mut command = spec(&words, StdinFrom::Null, StdoutTo::Pipe);
        command.env = Environment {
            inherited: &inherited,
            task: &task,
        };
        // `env` is found through the task's PATH, not the daemon's.
        let mut process = start(command).unwrap();
        let mut listing = String::new();
        let mut stdout = process.stdout.take().unwrap();
        stdout.read_to_string(&mut listing).await.unwrap();
        process.wait().await.unwrap();
        let lines: Vec<&str> = listing.lines().collect();
        let named = |name: &str| -> Vec<&str> {
            let prefix = format!("{name}=");
            lines
                .iter()
                .copied()
                .filter(|l| l.starts_with(&prefix))
                .collect()
        };
        assert_eq!(
            named("CAIRN_TEST_VAR"),
            ["CAIRN_TEST_VAR=last"],
            "{listing}"
        );
        assert_eq!(named("PATH"), [format!("PATH={task_path}")], "{listing}");
        assert!(
            named("HOME").is_empty(),
            "a withheld name reached the command: {listing}"
        );
        let others: Vec<(String, String)> = std::env::vars()
            .filter(|(name, value)| {
                !["HOME", "PATH"].contains(&name.as_str()) && !value.contains('\n')
            })
            .collect();
        for (name, value) in &others {
            assert_eq!(named(name), [format!("{name}={value}")], "{listing}");
        }
    }

    #[tokio::test]
    async fn a_command_gets_its_stdin_and_its_reply_comes_back() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let words = argv(&["sh", "-c", "read line; echo \"got $line\"; exit 3"]);
        let mut process = start(spec(&words, StdinFrom::Pipe, StdoutTo::Pipe)).unwrap();
        let mut stdin = process.stdin.take().unwrap();
        stdin.write_all(b"hello\n").await.unwrap();
        drop(stdin);
        let mut reply = String::new();
        let mut stdout = process.stdout.take().unwrap();
        stdout.read_to_string(&mut reply).await.unwrap();
        assert_eq!(reply, "got hello\n");
        let status = process.wait().await.unwrap();
        assert_eq!(status.code(), Some(3));
        assert_eq!(process.id(), None);
    }

    #[tokio::test]
    async fn a_missing_program_or_directory_is_an_error_of_the_start() {
        let words = argv(&["cairn-test-no-such-program"]);
        let error = start(spec(&words, StdinFrom::Null, StdoutTo::Log)).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::NotFound, "{error}");
        let words = argv(&["true"]);
        let mut nowhere = spec(&words, StdinFrom::Null, StdoutTo::Log);
        nowhere.cwd = Path::new("/nonexistent-cairn-dir");
        let error = start(nowhere).unwrap_err();
        assert!(error.to_string().contains("working directory"), "{error}");
    }

    #[tokio::test]
    async fn the_new_process_leads_its_group_with_no_signal_blocked_and_sigpipe_default() {
        use tokio::io::AsyncReadExt;
        let words = argv(&[
            "sh",
            "-c",
            "echo $(cut -d' ' -f5 /proc/$$/stat) $$ $(grep -E '^SigIgn|^SigBlk' /proc/$$/status | tr -d '\\t ')",
        ]);
        let mut process = start(spec(&words, StdinFrom::Null, StdoutTo::Pipe)).unwrap();
        let pid = process.id().unwrap();
        let mut out = String::new();
        process
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .await
            .unwrap();
        assert!(process.wait().await.unwrap().success());
        let fields: Vec<&str> = out.split_whitespace().collect();
        assert_eq!(fields[0], pid.to_string(), "{out}");
        assert_eq!(fields[1], pid.to_string(), "{out}");
        // Nothing blocked, SIGPIPE (bit 13) not ignored.
        assert!(out.contains("SigBlk:0000000000000000"), "{out}");
        let ignored = fields
            .iter()
            .find_map(|f| f.strip_prefix("SigIgn:"))
            .map(|hex| u64::from_str_radix(hex, 16).unwrap())
            .unwrap();
        assert_eq!(ignored & (1 << 12), 0, "{out}");
    }

    #[tokio::test]
    async fn dropping_an_unwaited_process_kills_it() {
        let words = argv(&["sleep", "600"]);
        let process = start(spec(&words, StdinFrom::Null, StdoutTo::Log)).unwrap();
        let pid = process.id().unwrap() as i32;
        drop(process);
        // The reaper runs on this runtime: give it turns until the pid is gone.
        for _ in 0..1000 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            if nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err() {
                return;
            }
        }
        panic!("process {pid} outlived its handle");
    }
}
