//! Starting a command without copying the daemon: the exec trampoline.
//!
//! A command must die with the daemon (`PR_SET_PDEATHSIG`), and only the child itself can arm
//! that signal. Arming it in a `pre_exec` closure makes the standard library give up
//! `posix_spawn` (a `vfork`-style clone that shares the daemon's memory) for a full `fork`, which
//! copies the page tables of the whole daemon: with thousands of tasks in flight that copy is
//! most of the cost of every command. So the cairn binary instead starts itself
//! (`/proc/self/exe`, the very file the daemon runs even if it was replaced on disk) through
//! `posix_spawn` in a hidden mode, [`TRAMPOLINE_ARG`]: that small fresh process arms the death
//! signal, checks that the daemon is still its parent, and `exec`s the command, which keeps the
//! signal, its pid, process group, working directory, environment and file descriptors. Before
//! that it joins the task's cgroup and becomes the task's submitter when asked (see
//! `confinement`): the daemon itself never changes identity.
//!
//! Only a program that knows the hidden mode can serve as the trampoline, so it is used only
//! once the cairn binary has called [`enable`] (`CAIRN_SPAWN_VIA_FORK` in its
//! environment keeps the fork path); a library user's process keeps the `fork` path.

use std::ffi::OsString;
use std::io::{self, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

use nix::sys::signal::{SigHandler, Signal};
use nix::unistd::AccessFlags;

use super::identity::SwitchTo;

/// The first argument that makes the cairn binary act as the trampoline:
/// `cairn __cairn-exec-trampoline <daemon pid> <identity> <cgroup.procs> <resolved program>
/// <argv0> [args…]`, where `<identity>` is `uid:gid:groups` or `-` (stay the daemon's user),
/// and `<cgroup.procs>` is the file to join a cgroup through, or `-`.
pub const TRAMPOLINE_ARG: &str = "__cairn-exec-trampoline";

/// The exit code of a trampoline that could not `exec` the command (as a shell's 127).
pub const EXEC_FAILED: u8 = 127;

/// The prefix under which the command's environment reaches the trampoline. The trampoline
/// runs with the daemon's privileges until it switches user (with `--run-as-submitter`, the
/// capabilities to become anyone), and the dynamic loader reads `LD_PRELOAD`,
/// `LD_LIBRARY_PATH`, `GLIBC_TUNABLES` and the like at its start, before any of our code: a
/// task's `env` must never be read by it as itself. So the trampoline's own environment holds
/// nothing but the command's variables under this prefix, which no loader or libc reads, and
/// the command gets them back under their names once the trampoline is the submitter.
pub const ENV_PREFIX: &str = "CAIRN_TRAMPOLINE_ENV_";

/// The environment to give the trampoline for a command whose environment is `command_env`.
pub fn wrapped_env(
    command_env: impl IntoIterator<Item = (OsString, OsString)>,
) -> Vec<(OsString, OsString)> {
    command_env
        .into_iter()
        .map(|(name, value)| {
            let mut wrapped = OsString::from(ENV_PREFIX);
            wrapped.push(name);
            (wrapped, value)
        })
        .collect()
}

/// The command's environment, out of the trampoline's (see [`ENV_PREFIX`]).
fn unwrapped_env(
    trampoline_env: impl IntoIterator<Item = (OsString, OsString)>,
) -> Vec<(OsString, OsString)> {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    trampoline_env
        .into_iter()
        .filter_map(|(name, value)| {
            let name = name.as_bytes().strip_prefix(ENV_PREFIX.as_bytes())?;
            Some((OsString::from_vec(name.to_vec()), value))
        })
        .collect()
}

static AVAILABLE: AtomicBool = AtomicBool::new(false);
static BY_DEFAULT: AtomicBool = AtomicBool::new(false);

/// Let commands be started through this binary's trampoline mode (by default, unless
/// `by_default` is false: then only where asked for, as by the spawn benchmark). Only the cairn
/// binary, whose `main` first calls [`run_if_requested`], may call this.
pub fn enable(by_default: bool) {
    AVAILABLE.store(true, Ordering::Relaxed);
    BY_DEFAULT.store(by_default, Ordering::Relaxed);
}

/// Whether this process can start commands through the trampoline.
pub fn is_available() -> bool {
    AVAILABLE.load(Ordering::Relaxed)
}

/// Whether commands are started through the trampoline unless a caller chooses otherwise.
pub fn is_default() -> bool {
    is_available() && BY_DEFAULT.load(Ordering::Relaxed)
}

/// If this process was started as the trampoline, arm the death signal and `exec` the command:
/// returns only if that failed (with the exit code to end with), else `None`: not a trampoline.
pub fn run_if_requested() -> Option<ExitCode> {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(TRAMPOLINE_ARG.as_ref()) {
        return None;
    }
    let rest: Vec<OsString> = args.collect();
    Some(ExitCode::from(trampoline(&rest)))
}

fn trampoline(args: &[OsString]) -> u8 {
    let [daemon_pid, identity, cgroup_procs, program, argv0, command_args @ ..] = args else {
        eprintln!(
            "cairn: {TRAMPOLINE_ARG} needs <daemon pid> <identity> <cgroup.procs> <program> <argv0> [args...]"
        );
        return EXEC_FAILED;
    };
    let Some(daemon_pid) = daemon_pid.to_str().and_then(|p| p.parse::<i32>().ok()) else {
        eprintln!("cairn: {TRAMPOLINE_ARG}: {daemon_pid:?} is not a process id");
        return EXEC_FAILED;
    };
    if let Err(message) = confine(identity, cgroup_procs) {
        eprintln!("cairn: {message}");
        return EXEC_FAILED;
    }
    // Armed after the switch of user, which clears it.
    if let Err(e) = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL) {
        eprintln!("cairn: cannot arm the parent-death signal: {e}");
        return EXEC_FAILED;
    }
    // The daemon may have died before the signal was armed: then die as it would have made us.
    if nix::unistd::getppid().as_raw() != daemon_pid {
        let _ = nix::sys::signal::raise(Signal::SIGKILL);
        return EXEC_FAILED;
    }
    // Rust's runtime ignored SIGPIPE in this process, and `exec` keeps ignored signals ignored:
    // give the command the default, as a spawn from the daemon does.
    // SAFETY: setting a default disposition installs no handler; this process has one thread.
    if let Err(e) = unsafe { nix::sys::signal::signal(Signal::SIGPIPE, SigHandler::SigDfl) } {
        eprintln!("cairn: cannot reset SIGPIPE: {e}");
        return EXEC_FAILED;
    }
    let error = std::process::Command::new(program)
        .arg0(argv0)
        .args(command_args)
        .env_clear()
        .envs(unwrapped_env(std::env::vars_os()))
        .exec();
    eprintln!("cairn: cannot start {argv0:?}: {error}");
    if error.kind() == io::ErrorKind::PermissionDenied {
        126
    } else {
        EXEC_FAILED
    }
}

/// Join the cgroup (with the daemon's identity, which may write it), then become the identity:
/// groups, group, user, capabilities dropped, verified (see `identity`). The working directory
/// is entered again as the new user, so a task cannot run in a directory its submitter may not
/// enter.
fn confine(identity: &OsString, cgroup_procs: &OsString) -> Result<(), String> {
    if cgroup_procs != "-" {
        std::fs::OpenOptions::new()
            .write(true)
            .open(cgroup_procs)
            .and_then(|mut procs| procs.write_all(b"0"))
            .map_err(|e| format!("cannot join the task's cgroup {cgroup_procs:?}: {e}"))?;
    }
    if identity == "-" {
        return Ok(());
    }
    let switch = identity
        .to_str()
        .and_then(SwitchTo::from_arg)
        .ok_or_else(|| format!("{TRAMPOLINE_ARG}: {identity:?} is not uid:gid:groups"))?;
    switch
        .assume()
        .map_err(|(step, e)| format!("cannot run as user {}: {step}: {e}", switch.uid))?;
    nix::unistd::chdir(".").map_err(|e| {
        format!(
            "user {} may not enter the working directory: {e}",
            switch.uid
        )
    })
}

/// The file `program` names, found the way `execvp` finds it (through the command's `PATH`,
/// from `env` or else the daemon's), so that a missing or non-executable program is reported by
/// the spawn itself, as without the trampoline, and not as the trampoline's exit code.
pub fn resolve_program(program: &str, cwd: &Path, env: &[(String, String)]) -> io::Result<PathBuf> {
    if program.contains('/') {
        let path = cwd.join(program);
        return executable(&path).map(|()| path);
    }
    let path_var = env
        .iter()
        .rev()
        .find(|(name, _)| name == "PATH")
        .map(|(_, value)| OsString::from(value))
        .or_else(|| std::env::var_os("PATH"))
        .unwrap_or_else(|| OsString::from("/bin:/usr/bin"));
    let mut denied = None;
    for dir in std::env::split_paths(&path_var) {
        let candidate = cwd.join(dir).join(program);
        match executable(&candidate) {
            Ok(()) => return Ok(candidate),
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => denied = Some(e),
            Err(_) => {}
        }
    }
    Err(denied.unwrap_or_else(|| io::Error::from_raw_os_error(nix::libc::ENOENT)))
}

/// `Ok` if `path` is a file this process may execute, else the error `execve` would give.
fn executable(path: &Path) -> io::Result<()> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(io::Error::from_raw_os_error(nix::libc::EACCES));
    }
    nix::unistd::access(path, AccessFlags::X_OK).map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::{resolve_program, unwrapped_env, wrapped_env};
    use std::ffi::OsString;
    use std::path::Path;

    #[test]
    fn the_commands_environment_crosses_the_trampoline_under_names_no_loader_reads() {
        use std::os::unix::ffi::OsStringExt;
        let env: Vec<(OsString, OsString)> = [
            ("LD_PRELOAD", "/tmp/x.so"),
            ("GLIBC_TUNABLES", "glibc.malloc.check=3"),
            ("PATH", "/bin"),
        ]
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .chain([(
            OsString::from_vec(b"NOT_UTF8_\xff".to_vec()),
            OsString::from_vec(b"\xfe".to_vec()),
        )])
        .collect();
        let wrapped = wrapped_env(env.clone());
        for (name, _) in &wrapped {
            let name = name.to_string_lossy();
            assert!(name.starts_with("CAIRN_TRAMPOLINE_ENV_"), "{name}");
        }
        // What the daemon's own environment might add beside them is not the command's.
        let mut seen = wrapped.clone();
        seen.push(("HOME".into(), "/root".into()));
        assert_eq!(unwrapped_env(seen), env);
    }

    #[test]
    fn programs_are_found_through_the_commands_path_and_the_working_directory() {
        let root = Path::new("/");
        let sh = resolve_program("sh", root, &[]).expect("sh on the PATH");
        assert!(sh.is_absolute() && sh.ends_with("sh"), "{sh:?}");
        let missing = resolve_program("sh", root, &[("PATH".into(), "/nonexistent".into())]);
        assert_eq!(missing.unwrap_err().kind(), std::io::ErrorKind::NotFound);
        let relative = resolve_program("./bin/sh", Path::new("/usr"), &[]);
        assert_eq!(relative.unwrap(), Path::new("/usr/./bin/sh"));
        let directory = resolve_program("/usr", root, &[]);
        assert_eq!(
            directory.unwrap_err().kind(),
            std::io::ErrorKind::PermissionDenied
        );
    }
}
