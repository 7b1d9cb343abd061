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
use std::path::{Component, Path};

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fstatat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};

use crate::queue::SUBDIRS;

/// An opened queue root whose directories were checked to be real directories.
#[derive(Debug)]
pub struct OpenedQueue {
    root: OwnedFd,
}

impl OpenedQueue {
    /// Open `root` (the path the user gave, links in it followed: that is their choice) and
    /// refuse it if one of its directories is a symbolic link or not a directory. The error
    /// names the directory and says why.
    pub fn open(root: &Path) -> anyhow::Result<OpenedQueue> {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let fd = nix::fcntl::open(root, flags, Mode::empty())
            .map_err(|e| anyhow::anyhow!("cannot open the queue {}: {e}", root.display()))?;
        for dir in SUBDIRS {
            let stat = match fstatat(&fd, dir, AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(stat) => stat,
                Err(Errno::ENOENT) => continue,
                Err(e) => anyhow::bail!("{}: {e}", root.join(dir).display()),
            };
            let kind = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT;
            if kind != SFlag::S_IFDIR {
                let what = if kind == SFlag::S_IFLNK {
                    "a symbolic link"
                } else {
                    "not a directory"
                };
                anyhow::bail!(
                    "{} is {what}; a queue's directories must be real directories (whoever can \
                     write the queue could point it anywhere), so nothing is touched",
                    root.join(dir).display()
                );
            }
        }
        Ok(OpenedQueue { root: fd })
    }

    /// Remove `<dir>/<name>` (relative to the queue root): a file, or a directory with all it
    /// holds. Only names of the form cairn creates are taken. Returns whether it was a
    /// directory; a missing name is `NotFound`.
    pub fn remove(&self, relative: &Path) -> io::Result<bool> {
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

/// A small file's bytes, or `None` unless it is a regular file (not a link, FIFO or device) of
/// at most `cap` bytes: reading never blocks and never runs away.
pub fn read_regular(path: &Path, cap: u64) -> Option<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() || meta.len() > cap {
        return None;
    }
    let mut bytes = Vec::new();
    file.take(cap).read_to_end(&mut bytes).ok()?;
    Some(bytes)
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
        let refused = OpenedQueue::open(&root).unwrap_err().to_string();
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
