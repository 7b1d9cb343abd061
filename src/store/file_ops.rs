//! The syscalls of one atomic file write, one method per step.
//!
//! [`FileStorage`](super::FileStorage) never touches the file system for a write except through
//! [`FileOps`], so a test can replace [`RealFileOps`] with `FaultyFileOps` (feature
//! `test-doubles`) and make any single step fail, or make the process "die" at that step, and
//! then check what a restart finds on disk.

use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Suffix of every temp file cairn creates; startup cleanup removes files that end with it.
pub(crate) const TEMP_SUFFIX: &str = ".cairn.tmp";

/// Up to this many bytes, the parts of a log record are copied together and written at once.
const SMALL_APPEND: usize = 64 * 1024;

/// How many random names `create_temp` tries before giving up on collisions.
const TEMP_NAME_ATTEMPTS: usize = 16;

/// A temp file being written, with the path it must be renamed from (or removed at) later.
#[derive(Debug)]
pub struct TempFile {
    /// The open file, written and synced through [`FileOps`].
    pub file: File,
    /// Where the temp file lives: the same directory as its target, so the rename is atomic.
    pub path: PathBuf,
    /// Whether this is a retired file's inode reused (see [`FileOps::reuse_as_temp`]): its old
    /// bytes are overwritten, and cut off after the write if they were longer.
    pub reused: bool,
    /// The length the file had when it was opened (0 for a new one).
    pub previous_len: u64,
}

/// One method per syscall of an atomic write, so faults can be injected step by step.
pub trait FileOps: Send + Sync + Debug {
    /// Create a new uniquely named temp file in `dir` for the target file name `target_name`
    /// (named `.{target_name}.{random}.cairn.tmp`, created with `create_new`).
    fn create_temp(&self, dir: &Path, target_name: &str) -> io::Result<TempFile>;

    /// Turn the file at `old`, which is about to be removed anyway, into a temp file for the
    /// target `target_name` in `dir` (its own directory): rename it to a temp name and open it
    /// for overwriting. This saves allocating a new inode and freeing the old one, which some
    /// file systems make expensive. `Ok(None)` when `old` is missing or is not a file with a
    /// single name (overwriting a file that has another name would change that one too).
    fn reuse_as_temp(
        &self,
        old: &Path,
        dir: &Path,
        target_name: &str,
    ) -> io::Result<Option<TempFile>>;

    /// Write all of `bytes` to the temp file (from its start; a reused file is cut to their
    /// length).
    fn write_all(&self, temp: &mut TempFile, bytes: &[u8]) -> io::Result<()>;

    /// Flush the temp file's data and metadata to the disk (`fsync`).
    fn sync_file(&self, temp: &mut TempFile) -> io::Result<()>;

    /// Make `new` a second name of the file at `existing`.
    fn hard_link(&self, existing: &Path, new: &Path) -> io::Result<()>;

    /// Atomically replace `to` with `from`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;

    /// Make the directory's entries (creates, links, renames) durable: `fsync` on the directory.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;

    /// Remove the file at `path`.
    fn remove_file(&self, path: &Path) -> io::Result<()>;

    /// Open the commit log at `path` for reading and writing, creating it (empty) if missing.
    /// A created log's directory entry is durable only after a [`sync_dir`](Self::sync_dir).
    fn open_log(&self, path: &Path) -> io::Result<File>;

    /// Write `bytes` into the log at offset `at` (its end): an append not yet durable.
    fn append_log(&self, log: &File, at: u64, bytes: &[u8]) -> io::Result<()>;

    /// [`append_log`](Self::append_log) of the concatenation of `parts` (a record's head and
    /// a checkpoint's bytes). The default copies them together; the real syscalls write a
    /// large record's parts one after the other, so its bytes are not copied.
    fn append_log_parts(&self, log: &File, at: u64, parts: &[&[u8]]) -> io::Result<()> {
        self.append_log(log, at, &parts.concat())
    }

    /// Make the log's content durable (`fdatasync`): the one barrier of a logged commit.
    fn sync_log(&self, log: &File) -> io::Result<()>;

    /// Cut the log to `len` bytes (durable only at the next [`sync_log`](Self::sync_log)).
    fn truncate_log(&self, log: &File, len: u64) -> io::Result<()>;

    /// Make everything written on the file system that holds `dir` durable (`syncfs`): the
    /// files a commit log covers, and their directories, before the log is cut.
    fn sync_fs(&self, dir: &Path) -> io::Result<()>;
}

/// A fresh temp file name for `target_name` in `dir`: `.{target_name}.{random}.cairn.tmp`.
fn temp_path(dir: &Path, target_name: &str) -> PathBuf {
    let random: String = std::iter::repeat_with(fastrand::alphanumeric)
        .take(12)
        .collect();
    dir.join(format!(".{target_name}.{random}{TEMP_SUFFIX}"))
}

/// The real syscalls; what every store uses outside of fault-injection tests.
#[derive(Debug, Default, Clone)]
pub struct RealFileOps;

impl FileOps for RealFileOps {
    fn create_temp(&self, dir: &Path, target_name: &str) -> io::Result<TempFile> {
        let mut last_collision = None;
        for _ in 0..TEMP_NAME_ATTEMPTS {
            let path = temp_path(dir, target_name);
            match OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(super::modes::FILE_MODE)
                .open(&path)
            {
                Ok(file) => {
                    // 0640 whatever the umask (see `modes`); a failure leaves a temp file that
                    // the next start removes.
                    super::modes::fix_new_file(&file)?;
                    return Ok(TempFile {
                        file,
                        path,
                        reused: false,
                        previous_len: 0,
                    });
                }
                Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {
                    last_collision = Some(err);
                }
                Err(err) => return Err(err),
            }
        }
        Err(last_collision.unwrap_or_else(|| {
            io::Error::new(
                io::ErrorKind::AlreadyExists,
                "could not find an unused temp file name",
            )
        }))
    }

    fn reuse_as_temp(
        &self,
        old: &Path,
        dir: &Path,
        target_name: &str,
    ) -> io::Result<Option<TempFile>> {
        let meta = match std::fs::symlink_metadata(old) {
            Ok(meta) => meta,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(err) => return Err(err),
        };
        if !meta.is_file() || meta.nlink() != 1 {
            return Ok(None);
        }
        // Renamed first, so that nothing is ever opened for writing under a checkpoint's
        // name. The random part makes the name unused (temp names are only made this way).
        let path = temp_path(dir, target_name);
        std::fs::rename(old, &path)?;
        let file = match OpenOptions::new()
            .write(true)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&path)
        {
            Ok(file) => file,
            Err(err) => {
                // The file was on its way out anyway; best effort, and a leftover temp file is
                // removed at the next start.
                let _ = std::fs::remove_file(&path);
                return Err(err);
            }
        };
        Ok(Some(TempFile {
            file,
            path,
            reused: true,
            previous_len: meta.len(),
        }))
    }

    fn write_all(&self, temp: &mut TempFile, bytes: &[u8]) -> io::Result<()> {
        temp.file.write_all(bytes)?;
        if temp.reused && temp.previous_len > bytes.len() as u64 {
            // Overwritten in place, so the blocks stay allocated; only the tail of a longer
            // old content needs cutting.
            temp.file.set_len(bytes.len() as u64)?;
        }
        Ok(())
    }

    fn sync_file(&self, temp: &mut TempFile) -> io::Result<()> {
        temp.file.sync_all()
    }

    fn hard_link(&self, existing: &Path, new: &Path) -> io::Result<()> {
        std::fs::hard_link(existing, new)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        // O_RDONLY is what `read(true)` gives; O_DIRECTORY makes opening a non-directory fail
        // instead of silently syncing the wrong thing.
        OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_DIRECTORY)
            .open(dir)?
            .sync_all()
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn open_log(&self, path: &Path) -> io::Result<File> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(super::modes::FILE_MODE)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(path)?;
        super::modes::fix_new_file(&file)?;
        Ok(file)
    }

    fn append_log(&self, log: &File, at: u64, bytes: &[u8]) -> io::Result<()> {
        log.write_all_at(bytes, at)
    }

    fn append_log_parts(&self, log: &File, at: u64, parts: &[&[u8]]) -> io::Result<()> {
        let total: usize = parts.iter().map(|part| part.len()).sum();
        if total <= SMALL_APPEND {
            // One write: copying a small record costs less than a second syscall.
            return log.write_all_at(&parts.concat(), at);
        }
        // A large record part by part, without copying the checkpoint's bytes.
        let mut at = at;
        for part in parts {
            log.write_all_at(part, at)?;
            at += part.len() as u64;
        }
        Ok(())
    }

    fn sync_log(&self, log: &File) -> io::Result<()> {
        log.sync_data()
    }

    fn truncate_log(&self, log: &File, len: u64) -> io::Result<()> {
        log.set_len(len)
    }

    fn sync_fs(&self, dir: &Path) -> io::Result<()> {
        let dir = OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_DIRECTORY)
            .open(dir)?;
        nix::unistd::syncfs(&dir).map_err(io::Error::from)
    }
}

/// The real syscalls without the fsyncs: a replace survives a crash of the process but not of
/// the kernel or a power cut. Only for measuring what durability costs (`cairn bench
/// checkpoint --durability none`); the daemon never uses it.
#[derive(Debug, Default, Clone)]
pub struct UnsyncedFileOps;

impl FileOps for UnsyncedFileOps {
    fn create_temp(&self, dir: &Path, target_name: &str) -> io::Result<TempFile> {
        RealFileOps.create_temp(dir, target_name)
    }

    fn reuse_as_temp(
        &self,
        old: &Path,
        dir: &Path,
        target_name: &str,
    ) -> io::Result<Option<TempFile>> {
        RealFileOps.reuse_as_temp(old, dir, target_name)
    }

    fn write_all(&self, temp: &mut TempFile, bytes: &[u8]) -> io::Result<()> {
        RealFileOps.write_all(temp, bytes)
    }

    fn sync_file(&self, _temp: &mut TempFile) -> io::Result<()> {
        Ok(())
    }

    fn hard_link(&self, existing: &Path, new: &Path) -> io::Result<()> {
        RealFileOps.hard_link(existing, new)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        RealFileOps.rename(from, to)
    }

    fn sync_dir(&self, _dir: &Path) -> io::Result<()> {
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        RealFileOps.remove_file(path)
    }

    fn open_log(&self, path: &Path) -> io::Result<File> {
        RealFileOps.open_log(path)
    }

    fn append_log(&self, log: &File, at: u64, bytes: &[u8]) -> io::Result<()> {
        RealFileOps.append_log(log, at, bytes)
    }

    fn append_log_parts(&self, log: &File, at: u64, parts: &[&[u8]]) -> io::Result<()> {
        RealFileOps.append_log_parts(log, at, parts)
    }

    fn sync_log(&self, _log: &File) -> io::Result<()> {
        Ok(())
    }

    fn truncate_log(&self, log: &File, len: u64) -> io::Result<()> {
        RealFileOps.truncate_log(log, len)
    }

    fn sync_fs(&self, _dir: &Path) -> io::Result<()> {
        Ok(())
    }
}
