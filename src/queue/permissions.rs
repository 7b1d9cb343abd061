//! Who may write into a queue, checked the way cron checks its crontabs.
//!
//! Everything a task file says runs as the daemon's user, so only that user (and root) may
//! write the daemon's own directories, and nobody but them and one group — the group that owns
//! `inbox/` (and `control/`, to steer tasks) — may drop files in. At start the daemon refuses a
//! queue whose directories are writable by anyone else; at intake it rejects a file owned by a
//! user who is neither the daemon's user nor a member of the inbox's group, and a file others
//! may write or that has more than one name.

use std::fs::Metadata;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::unistd::{Gid, Group, Uid, User};

use super::QueueDir;

/// Directories only the daemon writes.
const DAEMON_DIRS: [&str; 5] = ["tasks", "incremental", "runs", "done", "failed"];
/// Directories that a submitting group may be given write access to.
const SHARED_DIRS: [&str; 2] = ["inbox", "control"];

/// Why the daemon refuses to run a queue: a directory others could write to. Each says which
/// directory and what to run to fix it.
#[derive(Debug, thiserror::Error)]
pub enum UnsafeQueue {
    #[error("{}: {source}", .path.display())]
    Unreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is a symbolic link; the queue's directories must be real directories", .path.display())]
    Symlink { path: PathBuf },
    #[error("{} belongs to {owner}, not to the daemon's user {daemon_user}; fix it with: chown {daemon_login} {}", .path.display(), .path.display())]
    ForeignOwner {
        path: PathBuf,
        owner: String,
        daemon_user: String,
        daemon_login: String,
    },
    #[error("{} is writable by every user (mode {mode:o}), and anything dropped there would run as {daemon_user}; fix it with: chmod o-w {}", .path.display(), .path.display())]
    WorldWritable {
        path: PathBuf,
        mode: u32,
        daemon_user: String,
    },
    #[error("{} is writable by the group {group} (mode {mode:o}); only inbox/ and control/ may be shared with a group; fix it with: chmod g-w {}", .path.display(), .path.display())]
    GroupWritable {
        path: PathBuf,
        group: String,
        mode: u32,
    },
}

/// Refuse a queue that users other than the daemon's (and the inbox's group) could write to.
pub fn check_queue_permissions(queue: &QueueDir) -> Result<(), UnsafeQueue> {
    let me = Uid::effective();
    let check = |path: &Path, group_may_write: bool| -> Result<(), UnsafeQueue> {
        let path_buf = || path.to_path_buf();
        let meta = std::fs::symlink_metadata(path).map_err(|source| UnsafeQueue::Unreadable {
            path: path_buf(),
            source,
        })?;
        if meta.file_type().is_symlink() {
            return Err(UnsafeQueue::Symlink { path: path_buf() });
        }
        let mode = meta.permissions().mode();
        let owner = Uid::from_raw(meta.uid());
        if owner != me && !owner.is_root() {
            return Err(UnsafeQueue::ForeignOwner {
                path: path_buf(),
                owner: user_name(owner),
                daemon_user: user_name(me),
                daemon_login: bare_user_name(me),
            });
        }
        if mode & 0o002 != 0 {
            return Err(UnsafeQueue::WorldWritable {
                path: path_buf(),
                mode: mode & 0o7777,
                daemon_user: user_name(me),
            });
        }
        if mode & 0o020 != 0 && !group_may_write {
            return Err(UnsafeQueue::GroupWritable {
                path: path_buf(),
                group: group_name(Gid::from_raw(meta.gid())),
                mode: mode & 0o7777,
            });
        }
        Ok(())
    };
    check(queue.root(), false)?;
    for dir in DAEMON_DIRS {
        check(&queue.root().join(dir), false)?;
    }
    for dir in SHARED_DIRS {
        check(&queue.root().join(dir), true)?;
    }
    Ok(())
}

/// Why intake refuses a task file; the text follows the file's name (`inbox/x.json is ...`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RefusedFile {
    #[error("is writable by every user (mode {mode:04o}), so anyone could have changed it; fix it with: chmod go-w, then drop it again")]
    WorldWritable { mode: u32 },
    #[error("is writable by its group {group} (mode {mode:04o}), so others could have changed it; fix it with: chmod g-w, then drop it again")]
    GroupWritable { group: String, mode: u32 },
    #[error("has {0} hard links; a task file must have one name only (copy it into the inbox, do not link it)")]
    HardLinks(u64),
    #[error("is owned by root, and this daemon runs as {daemon_user}: it takes root-owned files only when it runs as root; submit as {daemon_login} or a member of the group {group}")]
    OwnedByRoot {
        daemon_user: String,
        daemon_login: String,
        group: String,
    },
    #[error("is owned by {owner}, who is not allowed to submit tasks here: only {daemon_user} and members of the group {group} (the group of inbox/) may")]
    NotASubmitter {
        owner: String,
        daemon_user: String,
        group: String,
    },
}

/// May a task file, as `fstat` describes the descriptor intake reads, be taken? The checks
/// cron makes of a crontab and sshd's `StrictModes` of `authorized_keys`: nobody but its owner
/// may write it (a group- or world-writable file could have been changed by someone else), it
/// has one name only (a hard link lets whoever can write the other name change it, or plants
/// someone else's file), and its owner may submit ([`check_submitter`]).
pub fn check_task_file(file: &Metadata, inbox: &Metadata) -> Result<(), RefusedFile> {
    let mode = file.mode() & 0o7777;
    if mode & 0o002 != 0 {
        return Err(RefusedFile::WorldWritable { mode });
    }
    if mode & 0o020 != 0 {
        return Err(RefusedFile::GroupWritable {
            group: group_name(Gid::from_raw(file.gid())),
            mode,
        });
    }
    if file.nlink() > 1 {
        return Err(RefusedFile::HardLinks(file.nlink()));
    }
    check_submitter(file, inbox)
}

/// May the owner of a file dropped into the inbox submit tasks? The daemon's own user may
/// (root only when the daemon runs as root: a root-owned file in a service's inbox did not
/// come from a submitter); anyone else must belong to the group that owns `inbox/`.
pub fn check_submitter(file: &Metadata, inbox: &Metadata) -> Result<(), RefusedFile> {
    let owner = Uid::from_raw(file.uid());
    if owner == Uid::effective() {
        return Ok(());
    }
    let group = Gid::from_raw(inbox.gid());
    if owner.is_root() {
        return Err(RefusedFile::OwnedByRoot {
            daemon_user: user_name(Uid::effective()),
            daemon_login: bare_user_name(Uid::effective()),
            group: group_name(group),
        });
    }
    let member = match User::from_uid(owner) {
        Ok(Some(user)) => {
            user.gid == group
                || Group::from_gid(group)
                    .ok()
                    .flatten()
                    .is_some_and(|g| g.mem.contains(&user.name))
        }
        _ => false,
    };
    if member {
        Ok(())
    } else {
        Err(RefusedFile::NotASubmitter {
            owner: user_name(owner),
            daemon_user: user_name(Uid::effective()),
            group: group_name(group),
        })
    }
}

fn user_name(uid: Uid) -> String {
    match User::from_uid(uid) {
        Ok(Some(user)) => format!("user {} (uid {uid})", user.name),
        _ => format!("uid {uid}"),
    }
}

fn bare_user_name(uid: Uid) -> String {
    match User::from_uid(uid) {
        Ok(Some(user)) => user.name,
        _ => uid.to_string(),
    }
}

fn group_name(gid: Gid) -> String {
    match Group::from_gid(gid) {
        Ok(Some(group)) => format!("{} (gid {gid})", group.name),
        _ => format!("gid {gid}"),
    }
}
