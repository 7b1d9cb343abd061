//! Removing files inside a queue without following a link planted in it, for commands that may
//! run as root on a queue other users can write to.
//!
//! Each queue directory is opened with `O_NOFOLLOW` and checked to be a real directory, and
//! names are removed relative to that descriptor (`unlinkat`), directories depth-first through
//! descriptors too — as systemd-tmpfiles does since CVE-2018-6954. A directory swapped for a
//! link between planning and removing makes the removal fail; it never reaches outside.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fstatat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};

use super::SUBDIRS;

/// Why a queue was not opened for removals; each names the directory.
#[derive(Debug, thiserror::Error)]
pub enum UnsafeQueueError {
    #[error("cannot open the queue {}: {source}", root.display())]
    Open { root: PathBuf, source: Errno },
    #[error("{}: {source}", path.display())]
    Stat { path: PathBuf, source: Errno },
    #[error(
        "{} is {what}; a queue's directories must be real directories (whoever can write the \
         queue could point it anywhere), so nothing is touched",
        path.display()
    )]
    NotARealDirectory { path: PathBuf, what: &'static str },
}

/// An opened queue root whose directories were checked to be real directories.
#[derive(Debug)]
pub(super) struct OpenedQueue {
    root: OwnedFd,
}

impl OpenedQueue {
    /// Open `root` (the path the user gave, links in it followed: that is their choice) and
    /// refuse it if one of its directories is a symbolic link or not a directory. The error
    /// names the directory and says why.
    pub(super) fn open(root: &Path) -> Result<OpenedQueue, UnsafeQueueError> {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let fd = nix::fcntl::open(root, flags, Mode::empty()).map_err(|source| {
            UnsafeQueueError::Open {
                root: root.to_path_buf(),
                source,
            }
        })?;
        for dir in SUBDIRS {
            let stat = match fstatat(&fd, dir, AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(stat) => stat,
                Err(Errno::ENOENT) => continue,
                Err(source) => {
                    return Err(UnsafeQueueError::Stat {
                        path: root.join(dir),
                        source,
                    })
                }
            };
            let kind = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT;
            if kind != SFlag::S_IFDIR {
                let what = if kind == SFlag::S_IFLNK {
                    "a symbolic link"
                } else {
                    "not a directory"
                };
                return Err(UnsafeQueueError::NotARealDirectory {
                    path: root.join(dir),
                    what,
                });
            }
        }
        Ok(OpenedQueue { root: fd })
    }

    /// Remove `<dir>/<name>` (relative to the queue root): a file, or a directory with all it
    /// holds. Only names of the form cairn creates are taken. Returns whether it was a
    /// directory; a missing name is `NotFound`.
    pub(super) fn remove(&self, relative: &Path) -> io::Result<bool> {
        let (dir, name) = split_queue_name(relative)?;
        let parent = open_dir_at(&self.root, dir)?;
        let stat = fstatat(&parent, name, AtFlags::AT_SYMLINK_NOFOLLOW)?;
        if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR {
            remove_tree(&parent, name)?;
            Ok(true)
        } else {
            unlinkat(&parent, name, UnlinkatFlags::NoRemoveDir)?;
            Ok(false)
        }
    }
}

/// `<dir>/<name>` with `dir` one of the queue's directories and `name` one cairn gives there.
fn split_queue_name(relative: &Path) -> io::Result<(&OsStr, &OsStr)> {
    let refuse = || {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a name cairn creates", relative.display()),
        )
    };
    let parts: Vec<&OsStr> = relative
        .components()
        .map(|c| match c {
            Component::Normal(part) => Ok(part),
            _ => Err(refuse()),
        })
        .collect::<io::Result<_>>()?;
    let [dir, name] = parts[..] else {
        return Err(refuse());
    };
    let name_str = name.to_str().ok_or_else(refuse)?;
    let fits = match dir.as_bytes() {
        b"tasks" | b"done" | b"control" => name_str.ends_with(".json"),
        b"failed" => name_str.ends_with(".json") || name_str.ends_with(".input"),
        b"incremental" => name_str.ends_with(".json.gz"),
        b"runs" => crate::task_id::TaskId::parse(name_str).is_ok(),
        _ => false,
    };
    if !fits || name_str.starts_with('.') {
        return Err(refuse());
    }
    Ok((dir, name))
}

/// Open a directory under `parent` without following a link.
fn open_dir_at(parent: &impl AsFd, name: &OsStr) -> io::Result<OwnedFd> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    openat(parent, name, flags, Mode::empty()).map_err(|e| match e {
        Errno::ELOOP | Errno::ENOTDIR => io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a real directory", name.to_string_lossy()),
        ),
        e => e.into(),
    })
}

/// Remove the directory `name` under `parent` and everything in it, through descriptors.
fn remove_tree(parent: &impl AsFd, name: &OsStr) -> io::Result<()> {
    let mut dir = Dir::from_fd(open_dir_at(parent, name)?)?;
    let mut entries = Vec::new();
    for entry in dir.iter() {
        let entry = entry?;
        let entry_name = entry.file_name().to_bytes();
        if entry_name != b"." && entry_name != b".." {
            entries.push(OsStr::from_bytes(entry_name).to_os_string());
        }
    }
    for entry in entries {
        let stat = match fstatat(&dir, entry.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(stat) => stat,
            Err(Errno::ENOENT) => continue,
            Err(e) => return Err(e.into()),
        };
        if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR {
            remove_tree(&dir, &entry)?;
        } else {
            match unlinkat(&dir, entry.as_os_str(), UnlinkatFlags::NoRemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    drop(dir);
    unlinkat(parent, name, UnlinkatFlags::RemoveDir)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::OpenedQueue;
    use std::fs;
    use std::path::Path;

    #[test]
    fn a_directory_swapped_for_a_link_after_the_check_stops_the_removal() {
        let tmp = tempfile::tempdir().unwrap();
        let (root, outside) = (tmp.path().join("queue"), tmp.path().join("outside"));
        fs::create_dir_all(root.join("runs/t1/deeper")).unwrap();
        fs::write(root.join("runs/t1/deeper/log"), b"x").unwrap();
        fs::create_dir_all(outside.join("t2")).unwrap();
        let opened = OpenedQueue::open(&root).unwrap();
        assert!(opened.remove(Path::new("runs/t1")).unwrap(), "a directory");
        assert!(!root.join("runs/t1").exists());

        fs::remove_dir(root.join("runs")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("runs")).unwrap();
        assert!(opened.remove(Path::new("runs/t2")).is_err());
        assert!(outside.join("t2").is_dir(), "removed through a link");
        let refused = OpenedQueue::open(&root).unwrap_err();
        let refused = refused.to_string();
        assert!(refused.contains("is a symbolic link"), "{refused}");
    }

    #[test]
    fn only_names_cairn_creates_are_removed() {
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir_all(tmp.path().join("tasks")).unwrap();
        fs::write(tmp.path().join("tasks/notes.txt"), b"x").unwrap();
        let opened = OpenedQueue::open(tmp.path()).unwrap();
        for name in [
            "tasks/notes.txt",
            "tasks/../x.json",
            "x.json",
            "etc/a.json",
            "runs/a/b",
        ] {
            assert!(opened.remove(Path::new(name)).is_err(), "{name}");
        }
        assert!(tmp.path().join("tasks/notes.txt").exists());
    }
}
