//! The daemon's limit on open files, and its commands'.
//!
//! Every command in flight holds descriptors in the daemon: its pidfd and its stdout pipe (a
//! worker: its channel and ack pipe instead of the pipe). Under systemd the soft limit is
//! 1,024 while the hard limit is far higher, so a few hundred tasks at once would run out. As
//! `systemd.exec(5)` advises for programs that do not use `select()`, the daemon raises its
//! soft limit to the hard one at start, and gives each command the soft limit it had before,
//! so that commands that do use `select()` keep the limit they were written for.
//!
//! A command that cannot be started because descriptors ran out anyway (`EMFILE`, `ENFILE`)
//! waits its backoff and is tried again without using up an attempt (`child`).

// unsafe: getrlimit and setrlimit through libc.
#![allow(unsafe_code)]

use std::sync::OnceLock;

use nix::libc;

/// The soft limit the daemon was started with, once [`raise_soft_limit`] has raised it.
static FOR_COMMANDS: OnceLock<libc::rlimit> = OnceLock::new();

/// The limits before and after [`raise_soft_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileLimit {
    /// The soft limit the process had.
    pub was: u64,
    /// The soft limit it has now (the hard limit, when raising it worked).
    pub now: u64,
}

/// Raise this process's soft limit on open files to its hard limit, and remember the old one
/// for the commands it starts (`for_commands`). For the `cairn run` process only: a program
/// that embeds the library keeps the limits it chose.
pub fn raise_soft_limit() -> std::io::Result<FileLimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct it is given, which lives through the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let was = limit.rlim_cur;
    if limit.rlim_cur >= limit.rlim_max {
        return Ok(FileLimit { was, now: was });
    }
    let raised = libc::rlimit {
        rlim_cur: limit.rlim_max,
        rlim_max: limit.rlim_max,
    };
    // SAFETY: setrlimit reads the struct it is given, which lives through the call.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let _ = FOR_COMMANDS.set(limit);
    Ok(FileLimit {
        was,
        now: raised.rlim_cur,
    })
}

/// The limit a new command gets instead of the daemon's, if [`raise_soft_limit`] raised it.
pub(crate) fn for_commands() -> Option<libc::rlimit> {
    FOR_COMMANDS.get().copied()
}

/// The descriptors `max_tasks` commands in flight may hold in the daemon at once, with room for
/// the daemon's own (its journals, logs being opened, the blocking pool's files).
pub fn needed_for(max_tasks: usize) -> u64 {
    const PER_TASK: u64 = 3;
    const OWN: u64 = 128;
    (max_tasks as u64)
        .saturating_mul(PER_TASK)
        .saturating_add(OWN)
}
