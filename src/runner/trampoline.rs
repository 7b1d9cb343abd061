//! The trampoline a command run as its submitter starts through (`--run-as-submitter`).
//!
//! A new process that shares the daemon's memory (`spawn`: `clone(CLONE_VM | CLONE_VFORK)`)
//! keeps the daemon's one runtime thread waiting until it `exec`s. Had it become the submitter
//! before its `exec`, the submitter could stop it there (`SIGSTOP` is theirs to send to their
//! own processes) and with it the whole daemon: intake, steering, checkpoints, the watchdog.
//! So such a process does only what needs no one else's identity (its process group, stdio,
//! cgroup, death signal) and `exec`s this program, the daemon's own binary
//! (`/proc/self/exe`), while it is still the daemon's: from then on it is a process of its
//! own, and the daemon's thread is free. The trampoline then becomes the submitter, enters the
//! working directory as them, arms the death signal again (a change of user clears it), and
//! `exec`s the command. A submitter may stop it at any point now: that stops their own task.
//!
//! The trampoline starts with an empty environment and two descriptors: a sealed-off memory
//! file holding its [`StartPlan`] (who to become, where, what to run, with what environment)
//! and a report pipe. The task's variables are in the plan, never in the trampoline's own
//! environment: the dynamic loader reads `LD_PRELOAD` and the like when a program starts, and
//! this one starts with the daemon's privileges. A step that fails is written to the report
//! pipe (`errno`, then the step) before the trampoline exits 127; the pipe is close-on-exec, so
//! a command that started leaves it empty. The daemon reads it once the process has exited
//! (`spawn::CommandProcess::wait`): no wait of the daemon depends on the trampoline running.

// unsafe: switching user, rlimits and exec in the trampoline are raw system calls the safe
// wrappers do not offer async-signal-safely (each block says why it is sound).
#![allow(unsafe_code)]

use std::ffi::{CStr, CString, OsStr};
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, RawFd};

use nix::libc::{self, c_char};
use nix::unistd::{Gid, Uid};

use super::identity::SwitchTo;

/// The trampoline's `argv[0]`, by which the binary knows to be one.
pub const ARGV0: &str = "cairn-trampoline";

/// What the trampoline prints for `cairn-trampoline probe`: the daemon checks at start that
/// its binary is one (a program embedding the library must call [`main_if_asked`]).
pub const PROBE_REPLY: &str = "cairn-trampoline 1";

/// Everything the trampoline needs, as the daemon encodes it before starting the process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartPlan {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub cwd: CString,
    /// The files to try to `exec`, in order (`execvp`'s search, done ahead by the daemon).
    pub candidates: Vec<CString>,
    pub argv: Vec<CString>,
    /// `NAME=value`.
    pub env: Vec<CString>,
    /// The daemon's pid: the trampoline's parent, or the daemon died.
    pub daemon_pid: i32,
}

const VERSION: &[u8] = b"cairn-start-plan-1";

impl StartPlan {
    /// NUL-separated fields: the version, the numbers, then each list as its length and items.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let mut field = |bytes: &[u8]| {
            out.extend_from_slice(bytes);
            out.push(0);
        };
        field(VERSION);
        field(self.uid.to_string().as_bytes());
        field(self.gid.to_string().as_bytes());
        field(self.daemon_pid.to_string().as_bytes());
        field(self.groups.len().to_string().as_bytes());
        for group in &self.groups {
            field(group.to_string().as_bytes());
        }
        field(self.cwd.as_bytes());
        for list in [&self.candidates, &self.argv, &self.env] {
            field(list.len().to_string().as_bytes());
            for item in list {
                field(item.as_bytes());
            }
        }
        out
    }

    /// The plan [`encode`](Self::encode) wrote; anything else is refused.
    pub fn decode(bytes: &[u8]) -> Result<StartPlan, PlanError> {
        let mut fields = bytes
            .strip_suffix(b"\0")
            .ok_or(PlanError::NotNulTerminated)?
            .split(|b| *b == 0);
        let mut next = || fields.next().ok_or(PlanError::TooShort);
        if next()? != VERSION {
            return Err(PlanError::OtherVersion);
        }
        let uid = number(next()?)?;
        let gid = number(next()?)?;
        let daemon_pid = number(next()?)?;
        let group_count: usize = number(next()?)?;
        let groups = (0..group_count)
            .map(|_| number(next()?))
            .collect::<Result<_, _>>()?;
        let c_string = |bytes: &[u8]| CString::new(bytes).map_err(PlanError::from);
        let cwd = c_string(next()?)?;
        let mut list = || -> Result<Vec<CString>, PlanError> {
            let count: usize = number(next()?)?;
            (0..count).map(|_| c_string(next()?)).collect()
        };
        let candidates = list()?;
        let argv = list()?;
        let env = list()?;
        if argv.is_empty() || candidates.is_empty() {
            return Err(PlanError::NoCommand);
        }
        Ok(StartPlan {
            uid,
            gid,
            groups,
            cwd,
            candidates,
            argv,
            env,
            daemon_pid,
        })
    }
}

/// Field `bytes` of a start plan as a number.
fn number<T: std::str::FromStr>(bytes: &[u8]) -> Result<T, PlanError> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| PlanError::NotANumber(String::from_utf8_lossy(bytes).into_owned()))
}

/// Why the trampoline could not read its start plan: it reports that and runs nothing.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Read(#[from] std::io::Error),
    #[error("not NUL-terminated")]
    NotNulTerminated,
    #[error("too short")]
    TooShort,
    #[error("not a start plan of this cairn")]
    OtherVersion,
    #[error("{0:?} is not a number")]
    NotANumber(String),
    #[error(transparent)]
    Nul(#[from] std::ffi::NulError),
    #[error("no command")]
    NoCommand,
}

/// Be the trampoline if this process was started as one (`argv[0]` is [`ARGV0`]), and never
/// return then; else return at once. The `cairn` binary calls it first thing; a program that
/// embeds the library and runs its daemon with `run_as_submitter` must do the same.
pub fn main_if_asked() {
    let mut args = std::env::args_os();
    if args.next().as_deref() != Some(OsStr::new(ARGV0)) {
        return;
    }
    let rest: Vec<_> = args.collect();
    if rest.len() == 1 && rest[0] == "probe" {
        println!("{PROBE_REPLY}");
        std::process::exit(0);
    }
    let fd = |arg: &std::ffi::OsString| -> Option<RawFd> {
        arg.to_str()?.parse().ok().filter(|fd: &RawFd| *fd > 2)
    };
    match (
        rest.len(),
        rest.first().and_then(fd),
        rest.get(1).and_then(fd),
    ) {
        (2, Some(plan), Some(report)) if plan != report => run(plan, report),
        _ => {
            eprintln!("{ARGV0}: started by cairn only, with its plan's and report's descriptors");
            std::process::exit(127);
        }
    }
}

/// Read the plan, become its user, and `exec` its command; report a failed step and exit 127.
fn run(plan_fd: RawFd, report_fd: RawFd) -> ! {
    // SAFETY: both descriptors were placed there for this process by the daemon (checked
    // distinct and above 2 by the caller); they are owned here from now on.
    let (plan_file, mut report) = unsafe {
        (
            std::fs::File::from_raw_fd(plan_fd),
            std::fs::File::from_raw_fd(report_fd),
        )
    };
    // The report pipe must not reach the command.
    // SAFETY: fcntl on a descriptor this process owns.
    unsafe { libc::fcntl(report_fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    let plan = match read_plan(plan_file) {
        Ok(plan) => plan,
        Err(e) => fail(
            &mut report,
            libc::EINVAL,
            &format!("cannot read its start plan: {e}"),
        ),
    };
    let switch = SwitchTo {
        uid: Uid::from_raw(plan.uid),
        gid: Gid::from_raw(plan.gid),
        groups: plan.groups.iter().copied().map(Gid::from_raw).collect(),
    };
    if let Err((step, errno)) = switch.assume() {
        let message = format!("cannot run as user {}: {step}", plan.uid);
        fail(&mut report, errno as i32, &message);
    }
    // SAFETY: for each call below, plain system calls with integers or NUL-terminated strings
    // that live through them.
    unsafe {
        // Entered as the submitter, who must be allowed to.
        if libc::chdir(plan.cwd.as_ptr()) != 0 {
            fail(&mut report, errno(), "cannot enter its working directory");
        }
        // The change of user cleared the death signal the daemon's side armed.
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
            fail(&mut report, errno(), "cannot arm the parent-death signal");
        }
        if libc::getppid() != plan.daemon_pid {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
        // Rust's runtime ignores SIGPIPE in this program; commands expect the default.
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let argv = null_terminated(&plan.argv);
    let envp = null_terminated(&plan.env);
    let errno = exec_first(&plan.candidates, &argv, &envp);
    fail(&mut report, errno, "")
}

/// The plan the daemon wrote to `plan_file`, which is closed once read.
fn read_plan(mut plan_file: std::fs::File) -> Result<StartPlan, PlanError> {
    let mut bytes = Vec::new();
    plan_file.read_to_end(&mut bytes)?;
    drop(plan_file);
    StartPlan::decode(&bytes)
}

/// `execve` each candidate in turn, as `execvp` searches (see `spawn::exec`); returns the
/// error to report when none ran.
fn exec_first(candidates: &[CString], argv: &[*const c_char], envp: &[*const c_char]) -> i32 {
    let mut denied = false;
    let mut last = libc::ENOENT;
    for program in candidates {
        // SAFETY: NUL-terminated strings and NULL-terminated arrays that outlive the call.
        unsafe { libc::execve(program.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
        let errno = errno();
        match errno {
            libc::EACCES => denied = true,
            libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
            other => return other,
        }
        last = errno;
    }
    if denied {
        libc::EACCES
    } else {
        last
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Write `errno` and the failed step (empty: the `exec`) to the report pipe and exit 127.
fn fail(report: &mut std::fs::File, errno: i32, step: &str) -> ! {
    let _ = report.write_all(format!("{errno}\0{step}").as_bytes());
    // SAFETY: ends this process; nothing of it needs flushing.
    unsafe { libc::_exit(127) }
}

fn null_terminated(strings: &[CString]) -> Vec<*const c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// A failed start as the trampoline reported it: `errno`, and the step (`None`: the `exec`).
pub(crate) fn parse_report(bytes: &[u8]) -> Option<(i32, Option<String>)> {
    let (errno, step) = bytes.split_at(bytes.iter().position(|b| *b == 0)?);
    let errno = std::str::from_utf8(errno).ok()?.parse().ok()?;
    let step = String::from_utf8_lossy(&step[1..]).into_owned();
    Some((errno, (!step.is_empty()).then_some(step)))
}

/// The path the daemon `exec`s as the trampoline: its own binary.
pub(crate) fn binary() -> &'static CStr {
    c"/proc/self/exe"
}

/// Check that this process's binary serves as the trampoline (`cairn` does; a program that
/// embeds the library must call [`main_if_asked`] first thing): a command run as its submitter
/// could not start otherwise.
pub fn check_available() -> Result<(), TrampolineUnavailable> {
    use std::os::unix::process::CommandExt;
    let output = std::process::Command::new("/proc/self/exe")
        .arg0(ARGV0)
        .arg("probe")
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .map_err(TrampolineUnavailable::Start)?;
    let reply = String::from_utf8_lossy(&output.stdout);
    if output.status.success() && reply.trim() == PROBE_REPLY {
        Ok(())
    } else {
        Err(TrampolineUnavailable::NotServing {
            reply: reply.trim().to_owned(),
            status: output.status,
        })
    }
}

/// Why this program's binary cannot serve as the trampoline ([`check_available`]).
#[derive(Debug, thiserror::Error)]
pub enum TrampolineUnavailable {
    #[error("cannot start this program as the trampoline: {0}")]
    Start(#[source] std::io::Error),
    #[error(
        "this program does not serve as cairn's trampoline (a program embedding the \
         library must call cairn::runner::trampoline::main_if_asked() first in main); \
         it replied {reply:?} and {status}"
    )]
    NotServing {
        reply: String,
        status: std::process::ExitStatus,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_reads_back_as_written_and_garbage_is_refused() {
        let plan = StartPlan {
            uid: 1001,
            gid: 100,
            groups: vec![100, 27],
            cwd: c"/srv/q".into(),
            candidates: vec![c"/usr/bin/sh".into(), c"/bin/sh".into()],
            argv: vec![c"sh".into(), c"-c".into(), c"".into()],
            env: vec![c"A=b=c".into(), c"EMPTY=".into()],
            daemon_pid: 42,
        };
        assert_eq!(StartPlan::decode(&plan.encode()).ok(), Some(plan.clone()));
        let encoded = plan.encode();
        assert!(StartPlan::decode(&encoded[..encoded.len() - 3]).is_err());
        let other = StartPlan::decode(b"other\0").map(|_| ());
        assert_eq!(
            other.map_err(|e| e.to_string()),
            Err("not a start plan of this cairn".to_string())
        );
        assert_eq!(parse_report(b"2\0"), Some((2, None)));
        assert_eq!(
            parse_report(b"13\0cannot enter its working directory"),
            Some((13, Some("cannot enter its working directory".into())))
        );
    }
}
