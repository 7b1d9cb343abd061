//! The files a checkpoint names (model weights, optimizer state, any artifact of a loop),
//! stored beside the checkpoints as content-addressed, immutable blobs: `blobs/<sha256>`.
//!
//! A checkpoint that names files commits only after each of them is durable here: copied
//! into a temp file while hashed, synced, renamed to its hash, and the directory synced. A
//! blob is written once; a file whose content is stored already costs its hash, and a file
//! unchanged since this process last stored it (same inode, size and change time) costs not
//! even that. Blobs are never changed in place, so a resumed command gets a copy of each
//! (`restore`), never a link it could write through. [`BlobStore::sweep`] removes the blobs no
//! kept checkpoint names; the saves and the sweep exclude each other through an `flock` on
//! `blobs/.lock`, so a sweep never removes a blob whose checkpoint is being committed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use nix::fcntl::{Flock, FlockArg, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::file_ops::{FileOps, RealFileOps};

/// How much of a file is read, hashed and written at a time.
const CHUNK: usize = 1 << 20;

/// A file changed this recently may change again within the file system's timestamp
/// granularity without its times moving: its hash is not reused without reading it again.
const RACY_WINDOW: Duration = Duration::from_secs(2);

/// One file a checkpoint names: where it goes in the task's scratch directory, and which blob
/// holds its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoredFile {
    /// The file's path relative to the task's scratch directory.
    pub path: String,
    /// The SHA-256 of its bytes, in lower-case hex: also the blob's name.
    pub sha256: String,
    /// Its size in bytes.
    pub size: u64,
}

/// Why a file could not be stored or restored; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    /// The name given for the file is not a plain relative path.
    #[error("file {name:?}: {path:?} is not a relative path inside the scratch directory")]
    BadPath {
        /// The checkpoint's name for the file.
        name: String,
        /// The path as given.
        path: String,
    },
    /// The file is missing, unreadable, not a regular file, or reached through a link out of
    /// the scratch directory.
    #[error("file {name:?} ({path}): {reason}")]
    Refused {
        /// The checkpoint's name for the file.
        name: String,
        /// The path as given.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Reading, writing or syncing failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file it was done to.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The checkpoint names files, but nothing here keeps them.
    #[error(
        "this store keeps no files (a checkpoint with files needs a queue directory's blob store)"
    )]
    NoStore,
    /// The checkpoint names files, but the queue is shared (`--db`) and keeps none.
    #[error("a shared queue (--db) keeps no checkpoint files: run the task on a queue directory, or checkpoint without \"files\"")]
    SharedQueue,
    /// A stored blob does not hold the bytes its name says (the disk corrupted it).
    #[error("blob {sha256} holds other bytes than its name says (found {found})")]
    Corrupt {
        /// The blob's name.
        sha256: String,
        /// The hash of what it holds.
        found: String,
    },
}

/// What this process knows about a scratch file it stored: enough to tell it is unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
    sha256: String,
}

/// The blobs of a queue (or of an embedding program's checkpoint directory): `<root>/blobs/`.
#[derive(Debug)]
pub struct BlobStore {
    dir: PathBuf,
    ops: Arc<dyn FileOps>,
    /// Scratch files stored before, by their full path.
    seen: Mutex<HashMap<PathBuf, Seen>>,
    /// How many files were read (not found unchanged), for the tests.
    #[cfg(test)]
    reads: std::sync::atomic::AtomicUsize,
}

/// Held while files are stored and their checkpoint committed (shared), or while a sweep
/// removes blobs (exclusive).
pub struct BlobLock(#[allow(dead_code)] Flock<File>);

impl BlobStore {
    /// The directory, relative to the queue root, that holds the blobs.
    pub const DIR: &'static str = "blobs";

    /// The blob store of the queue or checkpoint directory `root` (created if needed).
    pub fn open(root: impl AsRef<Path>) -> io::Result<Self> {
        Self::open_with(root, Arc::new(RealFileOps))
    }

    /// [`BlobStore::open`] with the file operations given (fault injection in tests).
    pub fn open_with(root: impl AsRef<Path>, ops: Arc<dyn FileOps>) -> io::Result<Self> {
        let dir = root.as_ref().join(Self::DIR);
        match fs::DirBuilder::new()
            .mode(super::modes::DIR_MODE)
            .create(&dir)
        {
            Ok(()) => {}
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
            Err(err) => return Err(err),
        }
        // Made here, by the daemon, so that a command run by another user (a fork's) only
        // opens it.
        drop(lock_file(&dir.join(".lock"))?);
        Ok(BlobStore {
            dir,
            ops,
            seen: Mutex::default(),
            #[cfg(test)]
            reads: Default::default(),
        })
    }

    /// The blob store of `root` as it is on disk, made by nobody: for a command that names
    /// blobs a daemon stored (`cairn fork`), which must not create the daemon's directories.
    pub fn existing(root: impl AsRef<Path>) -> Self {
        BlobStore {
            dir: root.as_ref().join(Self::DIR),
            ops: Arc::new(RealFileOps),
            seen: Mutex::default(),
            #[cfg(test)]
            reads: Default::default(),
        }
    }

    /// Where the blob `sha256` is.
    pub fn blob_path(&self, sha256: &str) -> PathBuf {
        self.dir.join(sha256)
    }

    fn lock(&self, arg: FlockArg) -> io::Result<BlobLock> {
        let file = lock_file(&self.dir.join(".lock"))?;
        Flock::lock(file, arg)
            .map(BlobLock)
            .map_err(|(_, errno)| io::Error::from(errno))
    }

    /// Hold off sweeps while files are stored and the checkpoint naming them is committed:
    /// keep the returned lock until the checkpoint is durable.
    pub fn hold_for_save(&self) -> io::Result<BlobLock> {
        self.lock(FlockArg::LockShared)
    }

    /// Store every file of `files` (the checkpoint's name for each → its path relative to
    /// `scratch`), durably: when this returns, each is a synced blob in a synced directory.
    /// The first file that cannot be stored refuses them all, with the reason.
    pub fn store_files(
        &self,
        scratch: &Path,
        files: &BTreeMap<String, String>,
    ) -> Result<BTreeMap<String, StoredFile>, BlobError> {
        let scratch_dir = open_dir(scratch).map_err(|source| BlobError::Io {
            action: "opening",
            path: scratch.to_owned(),
            source,
        })?;
        let mut stored = BTreeMap::new();
        for (name, path) in files {
            let file = self.store_file(&scratch_dir, scratch, name, path)?;
            stored.insert(name.clone(), file);
        }
        // Synced whenever the checkpoint names a file, not only when a blob was renamed here:
        // a blob found in place may be one whose earlier save failed before its directory was
        // synced, and the checkpoint about to name it must not outlive its entry.
        if !stored.is_empty() {
            self.ops
                .sync_dir(&self.dir)
                .map_err(|source| BlobError::Io {
                    action: "syncing",
                    path: self.dir.clone(),
                    source,
                })?;
        }
        Ok(stored)
    }

    /// Store one file (its blob's directory entry still to be synced by the caller).
    fn store_file(
        &self,
        scratch_dir: &File,
        scratch: &Path,
        name: &str,
        path: &str,
    ) -> Result<StoredFile, BlobError> {
        let refused = |reason: String| BlobError::Refused {
            name: name.to_owned(),
            path: path.to_owned(),
            reason,
        };
        check_relative(path).map_err(|()| BlobError::BadPath {
            name: name.to_owned(),
            path: path.to_owned(),
        })?;
        let full = scratch.join(path);
        let mut source = open_beneath(scratch_dir, path).map_err(|err| {
            refused(match err.raw_os_error() {
                Some(nix::libc::ENOENT) => "no such file".to_owned(),
                Some(nix::libc::EXDEV) | Some(nix::libc::ELOOP) => {
                    "reached through a link out of the scratch directory".to_owned()
                }
                _ => format!("cannot be opened: {err}"),
            })
        })?;
        let before = source.metadata().map_err(|source| BlobError::Io {
            action: "reading the metadata of",
            path: full.clone(),
            source,
        })?;
        if !before.file_type().is_file() {
            return Err(refused("not a regular file".to_owned()));
        }
        // A hard link could be to a file outside the scratch directory (one the command may
        // not read itself); cairn stores only files with one name.
        if before.nlink() > 1 {
            return Err(refused(format!(
                "it has {} hard links; a checkpoint stores only a file with one name",
                before.nlink()
            )));
        }
        if let Some(sha256) = self.unchanged(&full, &before) {
            if self.blob_path(&sha256).exists() {
                let size = before.size();
                return Ok(StoredFile {
                    path: path.to_owned(),
                    sha256,
                    size,
                });
            }
        }
        let (sha256, size, after) = self.copy_into_blob(&mut source, &full, &before, refused)?;
        self.remember(full, &after, &sha256);
        Ok(StoredFile {
            path: path.to_owned(),
            sha256,
            size,
        })
    }

    /// Copy the open `source` into a blob named by its hash (unless one exists): the hash,
    /// size, and the file's metadata after the copy.
    fn copy_into_blob(
        &self,
        source: &mut File,
        full: &Path,
        before: &fs::Metadata,
        refused: impl Fn(String) -> BlobError,
    ) -> Result<(String, u64, fs::Metadata), BlobError> {
        let mut temp = self
            .ops
            .create_temp(&self.dir, "incoming")
            .map_err(|source| BlobError::Io {
                action: "creating a temp file in",
                path: self.dir.clone(),
                source,
            })?;
        #[cfg(test)]
        self.reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let copied = copy_hashing(source, &mut temp.file);
        let (sha256, size) = match copied {
            Ok(done) => done,
            Err(source) => {
                let _ = self.ops.remove_file(&temp.path);
                return Err(BlobError::Io {
                    action: "copying",
                    path: full.to_owned(),
                    source,
                });
            }
        };
        let after = source.metadata().map_err(|source| BlobError::Io {
            action: "reading the metadata of",
            path: full.to_owned(),
            source,
        })?;
        if changed(before, &after) || after.size() != size {
            let _ = self.ops.remove_file(&temp.path);
            return Err(refused(
                "it changed while it was being stored (write it completely before the checkpoint)"
                    .to_owned(),
            ));
        }
        let target = self.blob_path(&sha256);
        if target.exists() {
            let _ = self.ops.remove_file(&temp.path);
        } else {
            let synced = self
                .ops
                .sync_file(&mut temp)
                .and_then(|()| self.ops.rename(&temp.path, &target));
            if let Err(source) = synced {
                let _ = self.ops.remove_file(&temp.path);
                return Err(BlobError::Io {
                    action: "storing",
                    path: target,
                    source,
                });
            }
        }
        Ok((sha256, size, after))
    }

    /// The hash of `full` if this process stored it before and it has not changed since.
    fn unchanged(&self, full: &Path, meta: &fs::Metadata) -> Option<String> {
        let seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let known = seen.get(full)?;
        (known.dev == meta.dev()
            && known.ino == meta.ino()
            && known.size == meta.size()
            && known.mtime_ns == mtime_ns(meta)
            && known.ctime_ns == ctime_ns(meta))
        .then(|| known.sha256.clone())
    }

    /// Remember `full` as stored, unless it changed too recently to be told apart from a
    /// change right after (then the next checkpoint reads it again).
    fn remember(&self, full: PathBuf, meta: &fs::Metadata, sha256: &str) {
        let changed_at = SystemTime::UNIX_EPOCH
            + Duration::from_nanos(u64::try_from(ctime_ns(meta)).unwrap_or(0));
        let settled = SystemTime::now()
            .duration_since(changed_at)
            .is_ok_and(|age| age > RACY_WINDOW);
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if settled {
            seen.insert(
                full,
                Seen {
                    dev: meta.dev(),
                    ino: meta.ino(),
                    size: meta.size(),
                    mtime_ns: mtime_ns(meta),
                    ctime_ns: ctime_ns(meta),
                    sha256: sha256.to_owned(),
                },
            );
        } else {
            seen.remove(&full);
        }
    }

    /// Put a copy of each stored file at its path under `scratch` (directories made as
    /// needed), checked against its hash while copied; an existing file there is replaced.
    /// Nothing a command left in `scratch` is followed: every directory on the way is opened
    /// without following links and the copy is renamed into place inside it, so a planted
    /// link cannot send the daemon's write elsewhere. With `owner`, the copies and the
    /// directories made are given to that uid and gid (the submitter's).
    pub fn restore(
        &self,
        files: &BTreeMap<String, StoredFile>,
        scratch: &Path,
        owner: Option<(u32, u32)>,
    ) -> Result<(), BlobError> {
        let root = open_dir(scratch).map_err(|source| BlobError::Io {
            action: "opening",
            path: scratch.to_owned(),
            source,
        })?;
        for (name, file) in files {
            check_relative(&file.path).map_err(|()| BlobError::BadPath {
                name: name.clone(),
                path: file.path.clone(),
            })?;
            // What fails on the scratch side is the command's doing (a link or a directory in
            // the file's way), not the store's.
            let refused = |action: &'static str| {
                move |source: io::Error| BlobError::Refused {
                    name: name.clone(),
                    path: file.path.clone(),
                    reason: format!(
                        "cannot be put back in the scratch directory ({action}): {source}"
                    ),
                }
            };
            let (dir, leaf) =
                open_parent(&root, &file.path, owner).map_err(refused("opening its directory"))?;
            self.restore_one(file, &dir, leaf, owner)
                .map_err(|err| match err {
                    RestoreError::Io(action, source) => refused(action)(source),
                    RestoreError::Blob(err) => err,
                })?;
        }
        Ok(())
    }

    /// Copy the blob of `file` to `leaf` in the open directory `dir`, by a temp file there.
    fn restore_one(
        &self,
        file: &StoredFile,
        dir: &File,
        leaf: &str,
        owner: Option<(u32, u32)>,
    ) -> Result<(), RestoreError> {
        let blob = self.blob_path(&file.sha256);
        let mut source = File::open(&blob).map_err(|source| {
            RestoreError::Blob(BlobError::Io {
                action: "opening",
                path: blob.clone(),
                source,
            })
        })?;
        let temp = format!(".{leaf}.restoring");
        let _ = nix::unistd::unlinkat(dir, temp.as_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
        let fd = nix::fcntl::openat(
            dir,
            temp.as_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(|e| RestoreError::Io("creating a copy beside", e.into()))?;
        let mut out = File::from(fd);
        let copied = copy_hashing(&mut source, &mut out);
        let unlink = || {
            let _ =
                nix::unistd::unlinkat(dir, temp.as_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
        };
        let found = match copied {
            Ok((found, _)) => found,
            Err(source) => {
                unlink();
                return Err(RestoreError::Blob(BlobError::Io {
                    action: "copying",
                    path: blob,
                    source,
                }));
            }
        };
        if found != file.sha256 {
            unlink();
            return Err(RestoreError::Blob(BlobError::Corrupt {
                sha256: file.sha256.clone(),
                found,
            }));
        }
        if let Some((uid, gid)) = owner {
            let given = nix::unistd::fchown(&out, Some(uid.into()), Some(gid.into()));
            if let Err(e) = given {
                unlink();
                return Err(RestoreError::Io("handing over", e.into()));
            }
        }
        nix::fcntl::renameat(dir, temp.as_str(), dir, leaf).map_err(|e| {
            unlink();
            RestoreError::Io("renaming into place", e.into())
        })
    }

    /// Check that every file of `files` has its blob here (a fork names the blobs of the
    /// checkpoint it copies). Hold [`hold_for_save`](Self::hold_for_save) meanwhile and
    /// until the checkpoint naming them is committed.
    pub fn check_stored(&self, files: &BTreeMap<String, StoredFile>) -> Result<(), BlobError> {
        for (name, file) in files {
            let blob = self.blob_path(&file.sha256);
            match fs::symlink_metadata(&blob) {
                Ok(meta) if meta.is_file() && meta.size() == file.size => {}
                Ok(_) => {
                    return Err(BlobError::Refused {
                        name: name.clone(),
                        path: file.path.clone(),
                        reason: format!("its blob {} is not the size recorded", file.sha256),
                    })
                }
                Err(source) => {
                    return Err(BlobError::Io {
                        action: "finding the blob of",
                        path: blob,
                        source,
                    })
                }
            }
        }
        Ok(())
    }

    /// Remove every blob not in `kept` (the hashes the kept checkpoints name), and leftover
    /// temp files; returns how many blobs went. Waits for saves in progress to commit first,
    /// and holds them off meanwhile, so it never removes a blob a checkpoint being committed
    /// names. A crash part way leaves blobs to a later sweep, never a kept one removed.
    pub fn sweep(&self, kept: &HashSet<String>) -> io::Result<usize> {
        self.sweep_with(|| Ok(kept.clone()))
    }

    /// [`sweep`](Self::sweep), with the kept hashes worked out by `kept` while saves are held
    /// off: what it reads is every checkpoint committed, none half-way.
    pub fn sweep_with(
        &self,
        kept: impl FnOnce() -> io::Result<HashSet<String>>,
    ) -> io::Result<usize> {
        let _exclusive = self.lock(FlockArg::LockExclusive)?;
        let kept = kept()?;
        let mut removed = 0;
        for entry in fs::read_dir(&self.dir)? {
            let entry = entry?;
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            let is_blob = name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit());
            let is_temp = name.starts_with('.') && name.ends_with(super::file_ops::TEMP_SUFFIX);
            if (is_blob && !kept.contains(&name)) || is_temp {
                self.ops.remove_file(&entry.path())?;
                removed += usize::from(is_blob);
            }
        }
        if removed > 0 {
            self.ops.sync_dir(&self.dir)?;
        }
        Ok(removed)
    }

    /// Whether any blob is stored (a collection has something to look at).
    pub fn holds_any(&self) -> bool {
        self.blobs().is_ok_and(|blobs| !blobs.is_empty())
    }

    /// The hashes of every blob stored, sorted.
    pub fn blobs(&self) -> io::Result<Vec<String>> {
        let mut names: Vec<String> = fs::read_dir(&self.dir)?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.len() == 64 && n.bytes().all(|b| b.is_ascii_hexdigit()))
            .collect();
        names.sort();
        Ok(names)
    }
}

/// The lock file, opened for reading (an `flock` needs no more, so a user who may only read
/// the queue can hold it), made if missing.
fn lock_file(path: &Path) -> io::Result<File> {
    let flags = nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC;
    match fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)
    {
        Err(err) if err.kind() == io::ErrorKind::NotFound => fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(super::modes::FILE_MODE)
            .custom_flags(flags)
            .open(path),
        other => other,
    }
}

/// A path a checkpoint may name: relative, without `..`, not empty.
fn check_relative(path: &str) -> Result<(), ()> {
    let p = Path::new(path);
    let plain = !path.is_empty()
        && p.is_relative()
        && p.components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
    plain.then_some(()).ok_or(())
}

fn open_dir(path: &Path) -> io::Result<File> {
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_DIRECTORY | nix::libc::O_CLOEXEC)
        .open(path)
}

/// Why one file could not be restored: an I/O step on the scratch side, or the blob itself.
enum RestoreError {
    Io(&'static str, io::Error),
    Blob(BlobError),
}

/// Open (making it as needed) the directory that holds `rel` under `root`, never following a
/// link; returns it and the file's name in it.
fn open_parent<'a>(
    root: &File,
    rel: &'a str,
    owner: Option<(u32, u32)>,
) -> io::Result<(File, &'a str)> {
    let (parents, leaf) = match rel.rsplit_once('/') {
        Some((parents, leaf)) => (Some(parents), leaf),
        None => (None, rel),
    };
    let mut dir = root.try_clone()?;
    for part in parents.into_iter().flat_map(|p| p.split('/')) {
        match nix::sys::stat::mkdirat(&dir, part, Mode::from_bits_truncate(0o750)) {
            Ok(()) => {
                if let Some((uid, gid)) = owner {
                    nix::unistd::fchownat(
                        &dir,
                        part,
                        Some(uid.into()),
                        Some(gid.into()),
                        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
                    )?;
                }
            }
            Err(nix::errno::Errno::EEXIST) => {}
            Err(e) => return Err(e.into()),
        }
        let fd = nix::fcntl::openat(
            &dir,
            part,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        dir = File::from(fd);
    }
    Ok((dir, leaf))
}

/// Open `rel` for reading without leaving `dir`, whatever links are on the way.
fn open_beneath(dir: &File, rel: &str) -> io::Result<File> {
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOCTTY | OFlag::O_NONBLOCK)
        .mode(Mode::empty())
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let fd = nix::fcntl::openat2(dir.as_fd(), rel, how).map_err(io::Error::from)?;
    let file = File::from(fd);
    // Reads block again (the open was non-blocking only so a FIFO could not hang it).
    let flags = nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_GETFL).map_err(io::Error::from)?;
    let flags = OFlag::from_bits_truncate(flags) & !OFlag::O_NONBLOCK;
    nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_SETFL(flags)).map_err(io::Error::from)?;
    Ok(file)
}

/// Copy all of `source` into `out`, returning the SHA-256 (hex) and length of what was read.
fn copy_hashing(source: &mut File, out: &mut File) -> io::Result<(String, u64)> {
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; CHUNK];
    let mut size = 0u64;
    loop {
        let n = match source.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(err),
        };
        hasher.update(&buffer[..n]);
        out.write_all(&buffer[..n])?;
        size += n as u64;
    }
    Ok((hex(&hasher.finalize()), size))
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn mtime_ns(meta: &fs::Metadata) -> i128 {
    i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec())
}

fn ctime_ns(meta: &fs::Metadata) -> i128 {
    i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec())
}

/// Whether the file changed between two looks at it.
fn changed(before: &fs::Metadata, after: &fs::Metadata) -> bool {
    before.ino() != after.ino()
        || before.size() != after.size()
        || mtime_ns(before) != mtime_ns(after)
        || ctime_ns(before) != ctime_ns(after)
}

#[cfg(test)]
#[path = "blobs_tests.rs"]
mod tests;
