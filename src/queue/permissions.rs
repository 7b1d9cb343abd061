//! Who may write into a queue, checked the way cron checks its crontabs.
//!
//! Everything a task file says runs as the daemon's user, so only that user (and root) may
//! write the daemon's own directories, and nobody but them and one group — the group that owns
//! `inbox/` (and `control/`, to steer tasks) — may drop files in. At start the daemon refuses a
//! queue whose directories are writable by anyone else; at intake it rejects a file owned by a
//! user who is neither the daemon's user nor a member of the inbox's group, and a file others
//! may write or that has more than one name.
//!
//! Like sshd's `StrictModes`, the checks reach past the queue: a shared directory must be
//! sticky, each parent of the queue up to `/` must be one that only root or the daemon's user
//! can change, and no task definition with tokens may be readable by every user
//! ([`check_not_exposed`]).

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
    #[error("{} is writable by the group {group} (mode {mode:o}) but not sticky, so any member could delete, rename or replace another member's pending file; fix it with: chmod +t {}", .path.display(), .path.display())]
    SharedNotSticky {
        path: PathBuf,
        group: String,
        mode: u32,
    },
    #[error("{}, a parent of the queue, belongs to {owner}, who could move the queue away and put another in its place; the queue's parents must belong to root or to {daemon_user}; fix it with: chown root {} (or move the queue)", .path.display(), .path.display())]
    ParentForeignOwner {
        path: PathBuf,
        owner: String,
        daemon_user: String,
    },
    #[error("{}, a parent of the queue, is writable by {who} (mode {mode:o}) and not sticky, so they could move the queue away and put another in its place; fix it with: chmod go-w {}", .path.display(), .path.display())]
    ParentWritable {
        path: PathBuf,
        who: &'static str,
        mode: u32,
    },
    #[error("{} holds a task definition with env that every user can read (mode {file_mode:o}, in directories every user can enter: {}): anyone on this host could read its tokens; fix it with: chmod o-rwx {}", .holder.display(), .path.display(), .path.display())]
    ExposesEnv {
        path: PathBuf,
        file_mode: u32,
        holder: PathBuf,
    },
}

/// Refuse a queue that users other than the daemon's (and the inbox's group) could write to,
/// change through one of its parents, or read the tokens of: the checks the daemon makes at
/// start.
pub fn check_queue_permissions(queue: &QueueDir) -> Result<(), UnsafeQueue> {
    check_queue_dirs(queue)?;
    check_parents(queue.root())?;
    check_not_exposed(queue)
}

/// Each directory of the queue: a real directory of the daemon's user (or root), written by
/// nobody else, except `inbox/` and `control/`, which a group may write when they are sticky.
fn check_queue_dirs(queue: &QueueDir) -> Result<(), UnsafeQueue> {
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
        if mode & 0o020 != 0 && mode & STICKY == 0 {
            return Err(UnsafeQueue::SharedNotSticky {
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

/// The sticky bit: in such a directory only an entry's owner (or the directory's, or root) may
/// rename or remove it.
const STICKY: u32 = 0o1000;

/// Each parent of the queue, from its real path up to `/`, must belong to root or the daemon's
/// user, and be writable by nobody else unless it is sticky (`/tmp`): whoever can rename the
/// queue's entry in a parent can swap the whole queue for one of theirs. sshd's `StrictModes`
/// makes this walk for `authorized_keys`; systemd-tmpfiles refuses the same unsafe transitions.
pub(super) fn check_parents(root: &Path) -> Result<(), UnsafeQueue> {
    let real = std::fs::canonicalize(root).map_err(|source| UnsafeQueue::Unreadable {
        path: root.to_path_buf(),
        source,
    })?;
    let me = Uid::effective();
    for parent in real.ancestors().skip(1) {
        let meta = std::fs::metadata(parent).map_err(|source| UnsafeQueue::Unreadable {
            path: parent.to_path_buf(),
            source,
        })?;
        let owner = Uid::from_raw(meta.uid());
        if owner != me && !owner.is_root() {
            return Err(UnsafeQueue::ParentForeignOwner {
                path: parent.to_path_buf(),
                owner: user_name(owner),
                daemon_user: user_name(me),
            });
        }
        let mode = meta.mode() & 0o7777;
        if mode & 0o022 != 0 && mode & STICKY == 0 {
            let who = if mode & 0o002 != 0 {
                "every user"
            } else {
                "its group"
            };
            return Err(UnsafeQueue::ParentWritable {
                path: parent.to_path_buf(),
                who,
                mode,
            });
        }
    }
    Ok(())
}

/// Refuse a queue where a task definition with `env` (tokens) can be read by every user: the
/// file readable by others, in a directory (`tasks/`, `inbox/`, `failed/`) others may enter,
/// under a queue root others may enter. A root open to every user exposes nothing by itself:
/// the directories cairn creates are `0750` and the files `0640` (`cairn submit`'s too), so a
/// checkout's `0755` queue is fine; what is refused is a definition someone opened up.
pub fn check_not_exposed(queue: &QueueDir) -> Result<(), UnsafeQueue> {
    let enterable_by_all =
        |path: &Path| std::fs::metadata(path).is_ok_and(|meta| meta.mode() & 0o001 != 0);
    if !enterable_by_all(queue.root()) {
        return Ok(());
    }
    match first_exposed_definition(queue, enterable_by_all) {
        Some((holder, file_mode)) => Err(UnsafeQueue::ExposesEnv {
            path: queue.root().to_path_buf(),
            file_mode,
            holder,
        }),
        None => Ok(()),
    }
}

/// The first file of the queue that every user can read (in a directory every user can
/// enter) and that holds a task definition with a non-empty `env`, with its mode.
fn first_exposed_definition(
    queue: &QueueDir,
    enterable_by_all: impl Fn(&Path) -> bool,
) -> Option<(PathBuf, u32)> {
    let places = [("tasks", ".json"), ("inbox", ".json"), ("failed", ".input")];
    places.into_iter().find_map(|(dir, suffix)| {
        let dir = queue.root().join(dir);
        if !enterable_by_all(&dir) {
            return None;
        }
        let entries = std::fs::read_dir(dir).ok()?;
        entries.flatten().find_map(|entry| {
            let path = entry.path();
            let named = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(suffix));
            let meta = std::fs::symlink_metadata(&path).ok()?;
            let mode = meta.mode() & 0o7777;
            let exposed = named
                && meta.is_file()
                && mode & 0o004 != 0
                && crate::safe_fs::read_regular(&path, crate::task::MAX_TASK_FILE_BYTES)
                    .is_some_and(|bytes| has_env(&bytes));
            exposed.then_some((path, mode))
        })
    })
}

/// Does this JSON text hold a task definition whose `env` is not empty?
fn has_env(bytes: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(bytes).is_ok_and(|value| {
        value
            .get("env")
            .and_then(|env| env.as_object())
            .is_some_and(|env| !env.is_empty())
    })
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

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    use super::{check_not_exposed, has_env, UnsafeQueue};
    use crate::queue::QueueDir;

    #[test]
    fn only_a_non_empty_env_object_counts() {
        assert!(has_env(br#"{"id": "a", "env": {"TOKEN": "x"}}"#));
        assert!(!has_env(br#"{"id": "a", "env": {}}"#));
        assert!(!has_env(br#"{"id": "a", "phases": []}"#));
        assert!(!has_env(br#"{"env": {"TOKEN": "x""#)); // torn: not a definition
        assert!(!has_env(br#"[{"env": {"TOKEN": "x"}}]"#));
    }

    #[test]
    fn only_a_definition_every_user_can_reach_and_read_is_exposed() {
        let tmp = tempfile::tempdir().unwrap();
        let queue = QueueDir::new(tmp.path().join("q"));
        queue.create_all().unwrap();
        let chmod = |path: &std::path::Path, mode| {
            fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
        };
        chmod(queue.root(), 0o755);
        let kept = queue.root().join("failed/rejected-x-1234.input");
        fs::write(&kept, br#"{"env": {"TOKEN": "x"}}"#).unwrap();
        chmod(&kept, 0o644);
        // `failed/` is 0750 as cairn makes it: nobody else gets in.
        assert!(check_not_exposed(&queue).is_ok());
        chmod(&queue.root().join("failed"), 0o755);
        for root_mode in [0o755, 0o751] {
            chmod(queue.root(), root_mode);
            match check_not_exposed(&queue) {
                Err(UnsafeQueue::ExposesEnv { holder, .. }) => assert_eq!(holder, kept),
                other => panic!("root mode {root_mode:o}: {other:?}"),
            }
        }
        // A root others may list but not enter, or a file others may not read, exposes nothing.
        chmod(queue.root(), 0o754);
        assert!(check_not_exposed(&queue).is_ok());
        chmod(queue.root(), 0o755);
        chmod(&kept, 0o640);
        assert!(check_not_exposed(&queue).is_ok());
    }
}
