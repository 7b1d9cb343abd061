//! Running a task's commands as its submitter (`cairn run --run-as-submitter`), as cron, at and
//! Slurm run a job as the user who submitted it.
//!
//! The daemon itself never changes identity: the switch happens in the trampoline the command
//! starts through, after the daemon's part of the start has ended (see `trampoline`), in the
//! order that leaves no way back: supplementary groups, then the group, then the user. Then every capability the daemon had is dropped (ambient ones would otherwise
//! survive the `exec` of a daemon that is not root), and the result is verified: all three user
//! ids and group ids are the submitter's, no capability is left, and `setuid(0)` fails.

// unsafe: reading the user and group databases (getpwnam_r, getgrouplist) through libc.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::path::PathBuf;

use nix::errno::Errno;
use nix::unistd::{Gid, Uid, User};

/// Who a task's commands run as: the numbers the switch needs, and the names and home
/// directory its environment gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    pub switch: SwitchTo,
    pub name: String,
    pub home: PathBuf,
    pub shell: PathBuf,
}

/// The numeric identity a command switches to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwitchTo {
    pub uid: Uid,
    pub gid: Gid,
    /// Supplementary groups, as `initgroups(3)` would set them (the primary group included).
    pub groups: Vec<Gid>,
}

/// Why a task cannot run as its submitter, or the daemon cannot switch users at all.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error(
        "the submitter's user id {uid} has no entry in the user database (was the user removed?)"
    )]
    UnknownUser { uid: u32 },
    #[error("looking up user id {uid}: {source}")]
    Lookup { uid: u32, source: Errno },
    #[error("user {name:?} has a name that cannot be passed to getgrouplist")]
    BadName { name: String },
    #[error(
        "--run-as-submitter needs the capabilities {missing} (the daemon switches each command to \
         its submitter's user and groups, gives it its run directory and signals its processes); \
         run the daemon as root, or give it AmbientCapabilities=CAP_SETUID CAP_SETGID CAP_CHOWN \
         CAP_KILL (docs/service.md, \"Run tasks as their submitters\")"
    )]
    MissingCapabilities { missing: String },
    #[error("reading the daemon's capabilities: {0}")]
    Capabilities(String),
}

/// The capabilities `--run-as-submitter` needs in the daemon's effective set: switching users
/// and groups, handing the submitter its scratch directory and FIFOs, and signalling processes
/// that are no longer the daemon's user's.
pub const NEEDED_CAPABILITIES: [caps::Capability; 4] = [
    caps::Capability::CAP_SETUID,
    caps::Capability::CAP_SETGID,
    caps::Capability::CAP_CHOWN,
    caps::Capability::CAP_KILL,
];

/// Refuse `--run-as-submitter` when this process lacks one of [`NEEDED_CAPABILITIES`].
pub fn check_capabilities() -> Result<(), IdentityError> {
    let effective = caps::read(None, caps::CapSet::Effective)
        .map_err(|e| IdentityError::Capabilities(e.to_string()))?;
    let missing: Vec<String> = NEEDED_CAPABILITIES
        .iter()
        .filter(|cap| !effective.contains(cap))
        .map(|cap| cap.to_string())
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(IdentityError::MissingCapabilities {
            missing: missing.join(", "),
        })
    }
}

impl RunAs {
    /// The identity of user `uid` as the user database has it now: primary group and the
    /// supplementary groups of `initgroups(3)`.
    pub fn of_uid(uid: u32) -> Result<RunAs, IdentityError> {
        let user = User::from_uid(Uid::from_raw(uid))
            .map_err(|source| IdentityError::Lookup { uid, source })?
            .ok_or(IdentityError::UnknownUser { uid })?;
        let name = CString::new(user.name.as_bytes()).map_err(|_| IdentityError::BadName {
            name: user.name.clone(),
        })?;
        let groups = nix::unistd::getgrouplist(&name, user.gid)
            .map_err(|source| IdentityError::Lookup { uid, source })?;
        Ok(RunAs {
            switch: SwitchTo {
                uid: user.uid,
                gid: user.gid,
                groups,
            },
            name: user.name,
            home: user.dir,
            shell: user.shell,
        })
    }

    /// The variables a login would set, as cron sets them for a job: the command sees its
    /// submitter's name and home, not the daemon's.
    pub fn login_env(&self) -> [(String, String); 4] {
        [
            ("USER".into(), self.name.clone()),
            ("LOGNAME".into(), self.name.clone()),
            ("HOME".into(), self.home.display().to_string()),
            ("SHELL".into(), self.shell.display().to_string()),
        ]
    }
}

impl SwitchTo {
    /// Become this identity for good, for the whole process (glibc's wrappers change every
    /// thread's credentials): the trampoline does, before it `exec`s the command. An error
    /// names the step.
    pub fn assume(&self) -> Result<(), (&'static str, Errno)> {
        // SAFETY: prctl with integer arguments only.
        let cleared = unsafe {
            nix::libc::prctl(
                nix::libc::PR_CAP_AMBIENT,
                nix::libc::PR_CAP_AMBIENT_CLEAR_ALL,
                0,
                0,
                0,
            )
        };
        Errno::result(cleared).map_err(|e| ("clearing the ambient capabilities", e))?;
        nix::unistd::setgroups(&self.groups).map_err(|e| ("setgroups", e))?;
        nix::unistd::setresgid(self.gid, self.gid, self.gid).map_err(|e| ("setresgid", e))?;
        nix::unistd::setresuid(self.uid, self.uid, self.uid).map_err(|e| ("setresuid", e))?;
        if !self.uid.is_root() {
            drop_all_capabilities().map_err(|e| ("dropping the capabilities", e))?;
        }
        self.verify()
    }

    /// The supplementary groups as `setgroups(2)` takes them.
    pub(crate) fn raw_groups(&self) -> Vec<nix::libc::gid_t> {
        self.groups.iter().map(|g| g.as_raw()).collect()
    }

    /// Check that the switch holds and cannot be undone.
    fn verify(&self) -> Result<(), (&'static str, Errno)> {
        let uids = nix::unistd::getresuid().map_err(|e| ("getresuid", e))?;
        let gids = nix::unistd::getresgid().map_err(|e| ("getresgid", e))?;
        let same_user = [uids.real, uids.effective, uids.saved] == [self.uid; 3];
        let same_group = [gids.real, gids.effective, gids.saved] == [self.gid; 3];
        if !same_user || !same_group {
            return Err(("verifying the user and group ids", Errno::EPERM));
        }
        if self.uid.is_root() {
            return Ok(());
        }
        let (effective, permitted) = capabilities().map_err(|e| ("capget", e))?;
        if effective != 0 || permitted != 0 {
            return Err(("verifying that no capability is left", Errno::EPERM));
        }
        // SAFETY: a raw setuid with an integer; success here would be the failure we check
        // for.
        if unsafe { nix::libc::syscall(nix::libc::SYS_setuid, 0) } == 0 {
            return Err(("verifying that root cannot be regained", Errno::EPERM));
        }
        Ok(())
    }
}

/// `struct __user_cap_header_struct` of `capget(2)`/`capset(2)`.
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

/// `struct __user_cap_data_struct`; version 3 uses two of them (64 capability bits).
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// Empty this process's effective, permitted and inheritable sets (a raw `capset`, which unlike
/// the `caps` crate does not allocate).
fn drop_all_capabilities() -> Result<(), Errno> {
    let header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [CapData::default(); 2];
    // SAFETY: the header and two data structs are the layout capset(2) reads.
    let done = unsafe { nix::libc::syscall(nix::libc::SYS_capset, &header, data.as_ptr()) };
    Errno::result(done).map(drop)
}

/// This process's effective and permitted sets, as bit masks (low 32 bits ORed with high).
fn capabilities() -> Result<(u32, u32), Errno> {
    let mut header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: the header and two data structs are the layout capget(2) writes.
    let done = unsafe { nix::libc::syscall(nix::libc::SYS_capget, &mut header, data.as_mut_ptr()) };
    Errno::result(done)?;
    Ok((
        data[0].effective | data[1].effective,
        data[0].permitted | data[1].permitted,
    ))
}

#[cfg(test)]
mod tests {
    use super::RunAs;
    use nix::unistd::Gid;

    #[test]
    fn root_is_found_with_its_groups() {
        let root = RunAs::of_uid(0).expect("root is in the user database");
        assert_eq!(root.name, "root");
        assert!(root.switch.groups.contains(&Gid::from_raw(0)));
        assert!(RunAs::of_uid(u32::MAX - 7).is_err());
    }
}
