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
use std::path::Path;

use nix::unistd::{Gid, Group, Uid, User};

use super::QueueDir;

/// Directories only the daemon writes.
const DAEMON_DIRS: [&str; 5] = ["tasks", "incremental", "runs", "done", "failed"];
/// Directories that a submitting group may be given write access to.
const SHARED_DIRS: [&str; 2] = ["inbox", "control"];

/// Refuse a queue that users other than the daemon's (and the inbox's group) could write to.
/// The error says which directory and what to run to fix it.
pub fn check_queue_permissions(queue: &QueueDir) -> Result<(), String> {
    let me = Uid::effective();
    let check = |path: &Path, group_may_write: bool| -> Result<(), String> {
        let meta =
            std::fs::symlink_metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
        if meta.file_type().is_symlink() {
            return Err(format!(
                "{} is a symbolic link; the queue's directories must be real directories",
                path.display()
            ));
        }
        let mode = meta.permissions().mode();
        let owner = Uid::from_raw(meta.uid());
        if owner != me && !owner.is_root() {
            return Err(format!(
                "{} belongs to {}, not to the daemon's user {}; fix it with: chown {} {}",
                path.display(),
                user_name(owner),
                user_name(me),
                bare_user_name(me),
                path.display()
            ));
        }
        if mode & 0o002 != 0 {
            return Err(format!(
                "{} is writable by every user (mode {:o}), and anything dropped there would run as {}; fix it with: chmod o-w {}",
                path.display(),
                mode & 0o7777,
                user_name(me),
                path.display()
            ));
        }
        if mode & 0o020 != 0 && !group_may_write {
            return Err(format!(
                "{} is writable by the group {} (mode {:o}); only inbox/ and control/ may be shared with a group; fix it with: chmod g-w {}",
                path.display(),
                group_name(Gid::from_raw(meta.gid())),
                mode & 0o7777,
                path.display()
            ));
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

/// May a task file, as `fstat` describes the descriptor intake reads, be taken? The checks
/// cron makes of a crontab and sshd's `StrictModes` of `authorized_keys`: nobody but its owner
/// may write it (a group- or world-writable file could have been changed by someone else), it
/// has one name only (a hard link lets whoever can write the other name change it, or plants
/// someone else's file), and its owner may submit ([`check_submitter`]).
pub fn check_task_file(file: &Metadata, inbox: &Metadata) -> Result<(), String> {
    let mode = file.mode() & 0o7777;
    if mode & 0o002 != 0 {
        return Err(format!(
            "is writable by every user (mode {mode:04o}), so anyone could have changed it; fix it with: chmod go-w, then drop it again"
        ));
    }
    if mode & 0o020 != 0 {
        return Err(format!(
            "is writable by its group {} (mode {mode:04o}), so others could have changed it; fix it with: chmod g-w, then drop it again",
            group_name(Gid::from_raw(file.gid()))
        ));
    }
    if file.nlink() > 1 {
        return Err(format!(
            "has {} hard links; a task file must have one name only (copy it into the inbox, do not link it)",
            file.nlink()
        ));
    }
    check_submitter(file, inbox)
}

/// May the owner of a file dropped into the inbox submit tasks? The daemon's own user may
/// (root only when the daemon runs as root: a root-owned file in a service's inbox did not
/// come from a submitter); anyone else must belong to the group that owns `inbox/`.
pub fn check_submitter(file: &Metadata, inbox: &Metadata) -> Result<(), String> {
    let owner = Uid::from_raw(file.uid());
    if owner == Uid::effective() {
        return Ok(());
    }
    if owner.is_root() {
        return Err(format!(
            "is owned by root, and this daemon runs as {}: it takes root-owned files only when it runs as root; submit as {} or a member of the group {}",
            user_name(Uid::effective()),
            bare_user_name(Uid::effective()),
            group_name(Gid::from_raw(inbox.gid()))
        ));
    }
    let group = Gid::from_raw(inbox.gid());
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
        Err(format!(
            "is owned by {}, who is not allowed to submit tasks here: only {} and members of the group {} (the group of inbox/) may",
            user_name(owner),
            user_name(Uid::effective()),
            group_name(group)
        ))
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
