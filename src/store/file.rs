//! The file backend of [`Storage`]: one file per key under the queue root.
//!
//! Every `put` is a crash-safe replace: write a uniquely named temp file in the target's
//! directory, fsync it, rename it over the target, fsync the directory. In a directory with a
//! commit log ([`FileStorage::with_commit_log`]), the two fsyncs are replaced by a record in the
//! log and one fdatasync of it, before the rename (see `commit_log`); a save through the log
//! that finds no room commits by the replace instead, after checkpointing the log. There is no
//! fallback to a direct write: if any step fails, the old file stays as it was and the error
//! is returned.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::commit_log::{CommitLog, Record, Replayed, LOG_NAME};
use super::file_ops::{FileOps, RealFileOps, TempFile, TEMP_SUFFIX};
use super::group_commit::GroupCommit;
use super::Storage;

/// The top-level directory that belongs to users (their task files); temp-file cleanup skips it.
const INBOX_DIR: &str = "inbox";

/// How writes of checkpoint files are made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum CommitPath {
    /// Through the directory's commit log: one `fdatasync` per write, shared by concurrent
    /// writes; a restart replays the log (see `docs/reliability.md`).
    #[default]
    Log,
    /// The atomic replace alone: fsync the temp file, rename, fsync the directory. No log.
    Replace,
}

impl CommitPath {
    /// The environment variable that chooses the daemon's commit path: `log` or `replace`.
    pub const ENV: &'static str = "CAIRN_COMMIT_PATH";

    /// The path [`CommitPath::ENV`] names, the default when it is unset.
    pub fn from_env() -> io::Result<Self> {
        match std::env::var(Self::ENV) {
            Err(std::env::VarError::NotPresent) => Ok(Self::default()),
            Ok(value) if value == "log" => Ok(CommitPath::Log),
            Ok(value) if value == "replace" => Ok(CommitPath::Replace),
            Ok(value) => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}={value:?}: expected \"log\" or \"replace\"", Self::ENV),
            )),
            Err(err) => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: {err}", Self::ENV),
            )),
        }
    }
}

/// [`Storage`] on the local file system, rooted at the queue directory.
#[derive(Debug, Clone)]
pub struct FileStorage {
    /// The queue root; every key is a path relative to it.
    root: PathBuf,
    /// The syscalls of a write; real ones, or fault-injecting ones in tests.
    ops: Arc<dyn FileOps>,
    /// Per directory: the group commit that lets concurrent puts share one directory fsync.
    /// Shared by clones.
    dir_commits: Arc<std::sync::Mutex<std::collections::HashMap<PathBuf, Arc<GroupCommit>>>>,
    /// The commit log of one directory, if writes into it go through one (see
    /// [`FileStorage::with_commit_log`]). Shared by clones.
    log: Option<Arc<CommitLog>>,
    /// Directories checked for a commit log left by an earlier process, when this storage
    /// writes without one. Shared by clones.
    settled: Arc<std::sync::Mutex<std::collections::HashSet<PathBuf>>>,
}

/// Directories this process has made durable (see [`FileStorage::adopt_dir`]). Durability is a
/// fact about the file system and this process's history with it, not about one storage
/// value, so the set is shared by every `FileStorage` in the process.
fn adopted() -> std::sync::MutexGuard<'static, std::collections::HashSet<PathBuf>> {
    static ADOPTED: DirSet = std::sync::OnceLock::new();
    lock_dir_set(&ADOPTED)
}

/// A set of directories shared by the whole process.
type DirSet = std::sync::OnceLock<std::sync::Mutex<std::collections::HashSet<PathBuf>>>;

fn lock_dir_set(
    set: &'static DirSet,
) -> std::sync::MutexGuard<'static, std::collections::HashSet<PathBuf>> {
    set.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Directories where a rename was made whose directory fsync then failed: what they show may
/// not be durable, so it is read only after a sync of the directory succeeds (see
/// [`FileStorage::ensure_synced`]). Shared by the process, like [`adopted`].
fn unsynced() -> std::sync::MutexGuard<'static, std::collections::HashSet<PathBuf>> {
    static UNSYNCED: DirSet = std::sync::OnceLock::new();
    lock_dir_set(&UNSYNCED)
}

impl FileStorage {
    /// A store rooted at `root` that uses the real syscalls.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self::with_ops(root, Arc::new(RealFileOps))
    }

    /// A store rooted at `root` that performs its write steps through `ops` (fault injection).
    pub fn with_ops(root: impl Into<PathBuf>, ops: Arc<dyn FileOps>) -> Self {
        Self {
            root: root.into(),
            ops,
            dir_commits: Arc::default(),
            log: None,
            settled: Arc::default(),
        }
    }

    /// Commit writes of files directly in `dir` (a key relative to the root, such as
    /// `incremental`) through its commit log: one `fdatasync` of the log per write (shared by
    /// concurrent writes) instead of an fsync of the file and of the directory. What a
    /// previous process left in the log is replayed first (see `commit_log`). Takes the log's
    /// lock: only one process at a time may write `dir` this way.
    pub fn with_commit_log(self, dir: &str) -> io::Result<Self> {
        self.with_commit_log_limit(dir, None)
    }

    /// [`with_commit_log`](Self::with_commit_log), checkpointing the log whenever it grows
    /// past `limit` bytes (tests make it small to exercise the checkpoints).
    #[cfg(feature = "test-doubles")]
    pub fn with_small_commit_log(self, dir: &str, limit: u64) -> io::Result<Self> {
        self.with_commit_log_limit(dir, Some(limit))
    }

    fn with_commit_log_limit(mut self, dir: &str, limit: Option<u64>) -> io::Result<Self> {
        let log = self.open_commit_log(dir)?;
        #[cfg(any(test, feature = "test-doubles"))]
        let log = match limit {
            Some(limit) => log.with_limit(limit),
            None => log,
        };
        #[cfg(not(any(test, feature = "test-doubles")))]
        let _ = limit;
        self.log = Some(Arc::new(log));
        Ok(self)
    }

    /// This storage with `dir`'s writes committed by `path`: through the commit log, or by
    /// the atomic replace alone after replaying any log an earlier process left.
    pub fn with_commit_path(self, dir: &str, path: CommitPath) -> io::Result<Self> {
        match path {
            CommitPath::Log => self.with_commit_log(dir),
            CommitPath::Replace => {
                self.recover_commit_log(dir)?;
                Ok(self)
            }
        }
    }

    /// Replay and cut a commit log an earlier process left in `dir`, if there is one, for a
    /// store that writes without it (the log would otherwise overwrite later writes at the
    /// next replay).
    pub fn recover_commit_log(&self, dir: &str) -> io::Result<()> {
        validate_dir_key(dir)?;
        let path = self.root.join(dir);
        if path.is_dir() {
            self.settle_leftover_log(&path)?;
        }
        Ok(())
    }

    /// Open (and replay) the log of `dir`, restoring files with unsynced replaces.
    fn open_commit_log(&self, dir: &str) -> io::Result<CommitLog> {
        validate_dir_key(dir)?;
        let path = self.root.join(dir);
        self.ensure_dir(&path)?;
        self.adopt_dir(&path)?;
        CommitLog::open(&path, Arc::clone(&self.ops), |key, replayed| {
            self.restore(key, replayed)
        })
    }

    /// Make the file at `key` hold what the log replayed, without fsync (the replay ends
    /// with a `syncfs`).
    fn restore(&self, key: &str, replayed: Replayed<'_>) -> io::Result<()> {
        let target = self.path_of(key)?;
        match replayed {
            Replayed::Removed => match self.ops.remove_file(&target) {
                Err(err) if err.kind() != io::ErrorKind::NotFound => Err(err),
                _ => Ok(()),
            },
            Replayed::Bytes(bytes) => {
                if self.get(key)?.as_deref() == Some(bytes) {
                    return Ok(());
                }
                let (Some(parent), Some(name)) = (target.parent(), target.file_name()) else {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("invalid storage key {key:?}: it names no file"),
                    ));
                };
                self.ensure_dir(parent)?;
                let mut temp = self.create_temp_in(parent, &name.to_string_lossy())?;
                let result = self
                    .ops
                    .write_all(&mut temp, bytes)
                    .and_then(|()| self.ops.rename(&temp.path, &target));
                if result.is_err() {
                    let _ = self.ops.remove_file(&temp.path);
                }
                result
            }
        }
    }

    /// Before this storage, which has no log for `dir`, first writes there: replay a log an
    /// earlier process left in it, so that a later replay cannot bring back older objects over
    /// this storage's writes. A log another process holds open is that process's to replay.
    fn settle_leftover_log(&self, dir: &Path) -> io::Result<()> {
        let mut settled = self
            .settled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if settled.contains(dir) {
            return Ok(());
        }
        let leftover = std::fs::metadata(dir.join(LOG_NAME)).is_ok_and(|meta| meta.len() > 0);
        if leftover {
            let opened = CommitLog::open(dir, Arc::clone(&self.ops), |key, replayed| {
                self.restore(key, replayed)
            });
            match opened {
                Ok(log) => drop(log),
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => {}
                Err(err) => return Err(err),
            }
        }
        settled.insert(dir.to_path_buf());
        Ok(())
    }

    /// The commit log, if it covers the directory `parent`.
    fn log_for(&self, parent: &Path) -> Option<&CommitLog> {
        self.log.as_deref().filter(|log| log.dir() == parent)
    }

    /// The directory every key is relative to.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Create the directory `dir` (a key relative to the root) and any missing ancestors,
    /// durably: each directory that receives a new entry is synced, so the new directory
    /// survives a crash along with the files later written into it.
    pub fn create_dir(&self, dir: &str) -> io::Result<()> {
        validate_dir_key(dir)?;
        self.ensure_dir(&self.root.join(dir))
    }

    /// The path of `key`, after checking that it stays inside the root.
    fn path_of(&self, key: &str) -> io::Result<PathBuf> {
        validate_key(key)?;
        Ok(self.root.join(key))
    }

    /// Create `dir` (and missing ancestors) and make each new entry durable by syncing the
    /// directory that received it.
    fn ensure_dir(&self, dir: &Path) -> io::Result<()> {
        // An adopted directory existed when it was adopted; if it has been removed since, the
        // temp file cannot be created and `put` forgets it and comes back here.
        if adopted().contains(dir) || dir.is_dir() {
            return Ok(());
        }
        // The directories that do not exist yet, outermost first.
        let mut missing: Vec<&Path> = dir
            .ancestors()
            .take_while(|ancestor| !ancestor.exists())
            .filter(|ancestor| !ancestor.as_os_str().is_empty())
            .collect();
        missing.reverse();
        super::modes::create_dir_all(dir)?;
        for created in &missing {
            let parent = match created.parent() {
                Some(parent) if !parent.as_os_str().is_empty() => parent,
                _ => Path::new("."),
            };
            if let Err(err) = self.ops.sync_dir(parent) {
                // Undo what we created so the next put creates (and syncs) it again; a
                // directory that exists but was never made durable would otherwise be trusted.
                for undo in missing.iter().rev() {
                    let _ = fs::remove_dir(undo);
                }
                return Err(err);
            }
        }
        // Each new directory's entry is durable now, and the directory is empty.
        let mut adopted = adopted();
        for created in missing {
            adopted.insert(created.to_path_buf());
        }
        Ok(())
    }

    /// Before a directory is first used by this process, make what an earlier process left in
    /// it durable: fsync the directory (renames it did without the final fsync, if it died
    /// there) and its ancestors up to the root's parent (a directory it created but never
    /// synced into its parent). Without this, a restart could resume from a checkpoint, or
    /// write into a directory, that a power cut would still take away. Once per directory
    /// per process.
    fn adopt_dir(&self, dir: &Path) -> io::Result<()> {
        if adopted().contains(dir) || !dir.is_dir() {
            return Ok(());
        }
        let stop = self.root.parent().unwrap_or(&self.root);
        for ancestor in dir.ancestors() {
            if ancestor.as_os_str().is_empty() {
                break;
            }
            self.ops.sync_dir(ancestor)?;
            if ancestor == stop || !ancestor.starts_with(&self.root) {
                break;
            }
        }
        adopted().insert(dir.to_path_buf());
        Ok(())
    }

    /// The steps of `put` after the temp file exists; the caller removes the temp file on error.
    /// Sets `renamed` once the temp file has become the target, so the caller knows there is
    /// no temp file left to remove.
    fn write_and_commit(
        &self,
        temp: &mut TempFile,
        bytes: &[u8],
        target: &Path,
        parent: &Path,
        keep: Option<&Path>,
        renamed: &mut bool,
    ) -> io::Result<()> {
        self.ops.write_all(temp, bytes)?;
        self.ops.sync_file(temp)?;
        if let Some(keep) = keep {
            self.keep_previous(target, keep)?;
            // The kept copy must be durable before the rename replaces the target; when it
            // lives in the target's directory, the final directory sync covers both.
            if let Some(keep_dir) = keep.parent() {
                if keep_dir != parent {
                    self.ops.sync_dir(keep_dir)?;
                }
            }
        }
        self.ops.rename(&temp.path, target)?;
        *renamed = true;
        self.dir_commit(parent)
            .barrier(|| self.ops.sync_dir(parent))
            .inspect_err(|_| {
                // The new file is in place but may not survive a power cut: the save failed,
                // and what is in the directory is not read until a sync of it succeeds, so a
                // retry never resumes from a checkpoint that was not made durable.
                unsynced().insert(parent.to_path_buf());
            })
    }

    /// Before reading `dir`: if a rename into it was not made durable (its fsync failed),
    /// sync it now; while that fails, reading fails too.
    fn ensure_synced(&self, dir: &Path) -> io::Result<()> {
        if !unsynced().contains(dir) {
            return Ok(());
        }
        self.ops.sync_dir(dir).map_err(|err| {
            io::Error::new(
                err.kind(),
                format!(
                    "{}: a checkpoint renamed into it was not made durable, and syncing it \
                     failed again: {err}",
                    dir.display()
                ),
            )
        })?;
        unsynced().remove(dir);
        Ok(())
    }

    /// Give the current target (if there is one) the second name `keep`, replacing whatever
    /// `keep` named. Tries the link first: the keep name is normally free, and a missing target
    /// (the first write) shows as `NotFound`, so the common case costs one syscall.
    fn keep_previous(&self, target: &Path, keep: &Path) -> io::Result<()> {
        match self.ops.hard_link(target, keep) {
            Ok(()) => Ok(()),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {
                match self.ops.remove_file(keep) {
                    Err(err) if err.kind() != io::ErrorKind::NotFound => return Err(err),
                    _ => {}
                }
                match self.ops.hard_link(target, keep) {
                    Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
                    other => other,
                }
            }
            Err(err) => Err(err),
        }
    }

    /// The group commit of `dir`'s fsyncs.
    fn dir_commit(&self, dir: &Path) -> Arc<GroupCommit> {
        let mut commits = self
            .dir_commits
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(commits.entry(dir.to_path_buf()).or_default())
    }

    /// [`write_object_once`](Self::write_object_once); when it finds no room and the commit
    /// log holds records, once more after checkpointing the log, which frees their room.
    fn write_object(
        &self,
        key: &str,
        bytes: &[u8],
        keep_previous_as: Option<&str>,
        retire: Option<&str>,
    ) -> io::Result<()> {
        self.with_room_from_the_log(|| self.write_object_once(key, bytes, keep_previous_as, retire))
    }

    /// `write`, and when it fails for want of room while the commit log holds records, the
    /// log checkpointed (its room given back) and `write` again.
    fn with_room_from_the_log(&self, write: impl Fn() -> io::Result<()>) -> io::Result<()> {
        match write() {
            Err(err) if is_out_of_space(&err) => match self.log.as_deref() {
                Some(log) if log.holds_records() => {
                    tracing::info!(
                        error = %err,
                        "no room for a write: checkpointing the commit log to free its room"
                    );
                    log.checkpoint()?;
                    write()
                }
                _ => Err(err),
            },
            other => other,
        }
    }

    /// [`Storage::put`], reusing the file at `retire` (if given) as the temp file when it is
    /// in the target's directory, and removing it otherwise.
    fn write_object_once(
        &self,
        key: &str,
        bytes: &[u8],
        keep_previous_as: Option<&str>,
        retire: Option<&str>,
    ) -> io::Result<()> {
        let target = self.path_of(key)?;
        let keep = keep_previous_as.map(|k| self.path_of(k)).transpose()?;
        if keep.as_deref() == Some(target.as_path()) {
            // Keeping the old object under its own key would remove it before the rename.
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cannot keep the previous object of {key:?} under the same key"),
            ));
        }
        let (Some(parent), Some(target_name)) = (target.parent(), target.file_name()) else {
            // validate_key guarantees a non-empty last component, so this is unreachable.
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("invalid storage key {key:?}: it names no file"),
            ));
        };
        let target_name = target_name.to_string_lossy();
        self.prepare_dirs(parent, keep.as_deref())?;

        // Retiring the target or the kept copy would destroy what this write keeps.
        let retire_key = retire;
        let retire = retire
            .map(|k| self.path_of(k))
            .transpose()?
            .filter(|r| *r != target && Some(r.as_path()) != keep.as_deref());
        let mut temp = self.temp_for(parent, &target_name, retire.as_deref())?;
        let mut renamed = false;
        let record = Record::Put {
            key,
            keep: keep_previous_as,
            retire: retire.as_ref().and(retire_key),
            bytes,
        };
        let result = self.commit_put(
            &record,
            &mut temp,
            &target,
            parent,
            keep.as_deref(),
            &mut renamed,
        );
        if result.is_err() && !renamed {
            // Best effort: the original error is what the caller needs to see. A temp file that
            // stays behind is removed by `remove_temp_files` at the next start.
            let _ = self.ops.remove_file(&temp.path);
        }
        result?;
        if let (Some(key), Some(_), false) = (retire_key, &retire, temp.reused) {
            super::remove_retired(self, key);
        }
        if let Some(log) = self.log_for(parent) {
            log.checkpoint_if_full();
        }
        Ok(())
    }

    /// The directories a put writes in, made and adopted first: the target's `parent` (its
    /// commit log settled if this store does not log there) and the kept copy's.
    fn prepare_dirs(&self, parent: &Path, keep: Option<&Path>) -> io::Result<()> {
        self.ensure_dir(parent)?;
        self.adopt_dir(parent)?;
        if self.log_for(parent).is_none() {
            self.settle_leftover_log(parent)?;
        }
        if let Some(keep_dir) = keep.and_then(Path::parent) {
            self.ensure_dir(keep_dir)?;
            self.adopt_dir(keep_dir)?;
        }
        Ok(())
    }

    /// The temp file of a put in `parent`: the retired file when it lives beside the target
    /// (the rename into place must stay within one directory), else a new one.
    fn temp_for(
        &self,
        parent: &Path,
        target_name: &str,
        retire: Option<&Path>,
    ) -> io::Result<TempFile> {
        let reused = match retire.filter(|r| r.parent() == Some(parent)) {
            Some(retire) => match self.ops.reuse_as_temp(retire, parent, target_name) {
                Ok(reused) => reused,
                Err(err) => {
                    // Reuse is only a saving: a retired file that cannot be opened or renamed
                    // (read-only, say) is removed after the write, as if never reused.
                    tracing::debug!(path = %retire.display(), error = %err, "not reusing a retired file");
                    None
                }
            },
            None => None,
        };
        match reused {
            Some(temp) => Ok(temp),
            None => self.create_temp_in(parent, target_name),
        }
    }

    /// Commit the put `record` from `temp`: through the commit log when `parent`, the target's
    /// directory, has one, by the atomic replace otherwise.
    fn commit_put(
        &self,
        record: &Record<'_>,
        temp: &mut TempFile,
        target: &Path,
        parent: &Path,
        keep: Option<&Path>,
        renamed: &mut bool,
    ) -> io::Result<()> {
        let Record::Put { key, bytes, .. } = *record else {
            return Err(io::Error::other("a put is committed as a put"));
        };
        let Some(log) = self.log_for(parent) else {
            return self.write_and_commit(temp, bytes, target, parent, keep, renamed);
        };
        match self.write_and_log(log, record, temp, target, keep, renamed) {
            Err(err) if !*renamed && is_out_of_space(&err) => {
                // The log holds a copy of every save since its last checkpoint: on a disk with
                // room for the files but not for that, checkpoint the log (which frees its
                // room) and commit this save by the atomic replace, from the same temp file,
                // needing no more room than that path does.
                tracing::info!(
                    key,
                    error = %err,
                    "no room to save a checkpoint through the commit log: \
                     checkpointing the log and saving by the atomic replace"
                );
                log.checkpoint()
                    .and_then(|()| io::Seek::rewind(&mut temp.file))
                    .and_then(|()| {
                        self.write_and_commit(temp, bytes, target, parent, keep, renamed)
                    })
            }
            other => other,
        }
    }

    /// The steps of a put through the commit log after the temp file exists: write it, log
    /// the record and sync the log (the one barrier), keep the previous object, rename. No
    /// fsync of the file or the directory: a replay restores both from the log.
    fn write_and_log(
        &self,
        log: &CommitLog,
        record: &Record<'_>,
        temp: &mut TempFile,
        target: &Path,
        keep: Option<&Path>,
        renamed: &mut bool,
    ) -> io::Result<()> {
        let Record::Put { key, bytes, .. } = *record else {
            return Err(io::Error::other("a put is logged as a put"));
        };
        self.ops.write_all(temp, bytes)?;
        let logged = log.commit(record, || self.get(key))?;
        if let Some(keep) = keep {
            self.keep_previous(target, keep)?;
        }
        self.ops.rename(&temp.path, target)?;
        *renamed = true;
        logged.finish();
        Ok(())
    }

    /// One try of [`Storage::append`].
    fn append_once(&self, key: &str, bytes: &[u8]) -> io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.path_of(key)?;
        // Opened for appending, never created (a log is created whole by a `put`), and written
        // and synced through the same steps as a temp file, so that fault injection and the
        // power-loss model see an append as a write and its fsync.
        let file = fs::OpenOptions::new()
            .append(true)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&path)?;
        let previous_len = file.metadata()?.len();
        let mut appended = TempFile {
            file,
            path,
            reused: false,
            previous_len,
        };
        self.ops.write_all(&mut appended, bytes)?;
        self.ops.sync_file(&mut appended)
    }

    /// A new temp file for `target_name` in `dir`, making the directory again if it was
    /// removed behind our back.
    fn create_temp_in(&self, dir: &Path, target_name: &str) -> io::Result<TempFile> {
        match self.ops.create_temp(dir, target_name) {
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                adopted().remove(dir);
                self.ensure_dir(dir)?;
                self.adopt_dir(dir)?;
                self.ops.create_temp(dir, target_name)
            }
            other => other,
        }
    }
}

/// Whether `err` says the file system (or the user's quota) has no room left.
fn is_out_of_space(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(nix::libc::ENOSPC) | Some(nix::libc::EDQUOT)
    )
}

/// Reject keys that could leave the root or name no file: empty, absolute, `..`, `.` or empty
/// components.
fn validate_key(key: &str) -> io::Result<()> {
    let invalid = |why: &str| {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("invalid storage key {key:?}: {why}"),
        ))
    };
    if key.is_empty() {
        return invalid("it is empty");
    }
    if Path::new(key).is_absolute() {
        return invalid("it is absolute");
    }
    for part in key.split('/') {
        match part {
            "" => return invalid("it has an empty path component"),
            "." | ".." => return invalid("it has a `.` or `..` component"),
            _ => {}
        }
    }
    Ok(())
}

/// Like [`validate_key`], but the empty key (the root itself) is allowed.
fn validate_dir_key(dir: &str) -> io::Result<()> {
    if dir.is_empty() {
        Ok(())
    } else {
        validate_key(dir)
    }
}

impl Storage for FileStorage {
    fn put(&self, key: &str, bytes: &[u8], keep_previous_as: Option<&str>) -> io::Result<()> {
        self.write_object(key, bytes, keep_previous_as, None)
    }

    fn put_retiring(
        &self,
        key: &str,
        bytes: &[u8],
        keep_previous_as: Option<&str>,
        retire: &str,
    ) -> io::Result<()> {
        self.write_object(key, bytes, keep_previous_as, Some(retire))
    }

    fn get(&self, key: &str) -> io::Result<Option<Vec<u8>>> {
        let path = self.path_of(key)?;
        if let Some(dir) = path.parent() {
            self.ensure_synced(dir)?;
        }
        match fs::read(path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(err) => Err(err),
        }
    }

    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        validate_dir_key(dir)?;
        self.ensure_synced(&self.root.join(dir))?;
        let entries = match fs::read_dir(self.root.join(dir)) {
            Ok(entries) => entries,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(err) => return Err(err),
        };
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry?;
            if !entry.file_type()?.is_file() {
                continue;
            }
            // Keys are UTF-8; a file whose name is not cannot be addressed by a key anyway.
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            if !name.starts_with('.') {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }

    fn append(&self, key: &str, bytes: &[u8]) -> io::Result<()> {
        let result = self.append_once(key, bytes);
        if let (Err(err), Some(log)) = (&result, self.log.as_deref()) {
            // Not tried again (an append that failed may have left part of its bytes, and
            // nothing is appended after a failed append), but the next write finds the room.
            if is_out_of_space(err) && log.holds_records() {
                let _ = log.checkpoint();
            }
        }
        result
    }

    fn remove(&self, key: &str) -> io::Result<()> {
        let path = self.path_of(key)?;
        // Logged first, so that a replay never brings back what was removed.
        let parent = path.parent().unwrap_or(&self.root);
        let logged = match self.log_for(parent) {
            Some(log) => match log.log_removal(key) {
                Ok(logged) => Some(logged),
                // A removal frees room; its record must not need any. Once the log is
                // checkpointed it holds nothing a replay could bring the file back from.
                Err(err) if is_out_of_space(&err) => {
                    log.checkpoint()?;
                    None
                }
                Err(err) => return Err(err),
            },
            None => {
                if parent.is_dir() {
                    self.settle_leftover_log(parent)?;
                }
                None
            }
        };
        match self.ops.remove_file(&path) {
            Err(err) if err.kind() != io::ErrorKind::NotFound => return Err(err),
            _ => {}
        }
        if let Some(logged) = logged {
            logged.finish();
        }
        Ok(())
    }

    fn settle(&self, dir: &str) -> io::Result<()> {
        validate_dir_key(dir)?;
        self.ops.sync_dir(&self.root.join(dir))
    }

    fn remove_temp_files(&self) -> io::Result<Vec<String>> {
        let mut removed = Vec::new();
        let mut pending_dirs = vec![(self.root.clone(), String::new())];
        while let Some((dir, dir_key)) = pending_dirs.pop() {
            let entries = match fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
                Err(err) => return Err(err),
            };
            for entry in entries {
                let entry = entry?;
                let Ok(name) = entry.file_name().into_string() else {
                    continue;
                };
                let key = if dir_key.is_empty() {
                    name.clone()
                } else {
                    format!("{dir_key}/{name}")
                };
                let file_type = entry.file_type()?;
                if file_type.is_dir() {
                    if !(dir_key.is_empty() && name == INBOX_DIR) {
                        pending_dirs.push((entry.path(), key));
                    }
                } else if name.starts_with('.') && name.ends_with(TEMP_SUFFIX) {
                    match self.ops.remove_file(&entry.path()) {
                        Ok(()) => removed.push(key),
                        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                        Err(err) => return Err(err),
                    }
                }
            }
        }
        // This runs once at start, before anything resumes: make what the previous process
        // left durable, in case it died between a rename and its directory fsync (a resume
        // must not start from a checkpoint that a power cut could still take away). The
        // queue's own directories only; `runs/` holds logs and outputs that the daemon's
        // records point to only after they were synced.
        let mut to_sync = vec![self.root.clone()];
        for entry in fs::read_dir(&self.root)? {
            let entry = entry?;
            let name = entry.file_name();
            if entry.file_type()?.is_dir() && name != INBOX_DIR && name != "runs" {
                to_sync.push(entry.path());
            }
        }
        for dir in to_sync {
            self.ops.sync_dir(&dir)?;
            adopted().insert(dir);
        }
        removed.sort();
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::{validate_key, FileStorage};
    use crate::store::Storage;
    use std::{fs, io};

    #[test]
    fn rejects_keys_that_leave_the_root() {
        for key in ["", "/etc/passwd", "../x", "a/../b", "a//b", "./a", "a/"] {
            let err = validate_key(key).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{key:?}");
        }
        validate_key("incremental/t1.json.gz").unwrap();
    }

    #[test]
    fn put_get_list_remove_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStorage::new(dir.path().join("q"));
        assert_eq!(store.get("a/b.txt").unwrap(), None);
        assert!(store.list("a").unwrap().is_empty());
        store.put("a/b.txt", b"one", None).unwrap();
        store.put("a/b.txt", b"two", Some("a/b.1.txt")).unwrap();
        assert_eq!(store.get("a/b.txt").unwrap().as_deref(), Some(&b"two"[..]));
        assert_eq!(
            store.get("a/b.1.txt").unwrap().as_deref(),
            Some(&b"one"[..])
        );
        assert_eq!(store.list("a").unwrap(), vec!["b.1.txt", "b.txt"]);
        store.remove("a/b.txt").unwrap();
        store.remove("a/b.txt").unwrap();
        assert_eq!(store.get("a/b.txt").unwrap(), None);
    }

    #[test]
    fn keeping_the_previous_object_elsewhere_or_nowhere() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStorage::new(dir.path());
        store.put("a/x", b"one", None).unwrap();
        let err = store.put("a/x", b"two", Some("a/x")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(store.get("a/x").unwrap().as_deref(), Some(&b"one"[..]));
        store.put("a/x", b"two", Some("old/x")).unwrap();
        assert_eq!(store.get("old/x").unwrap().as_deref(), Some(&b"one"[..]));
        // Nothing to keep on a first write: the keep key stays absent.
        store.put("b/y", b"new", Some("b/y.1")).unwrap();
        assert_eq!(store.get("b/y.1").unwrap(), None);
    }

    #[test]
    fn temp_files_are_listed_never_and_cleaned_outside_the_inbox() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStorage::new(dir.path());
        fs::create_dir_all(dir.path().join("incremental/deep")).unwrap();
        fs::create_dir_all(dir.path().join("inbox")).unwrap();
        let stale = ".t1.json.gz.abc.cairn.tmp";
        fs::write(dir.path().join("incremental").join(stale), b"x").unwrap();
        fs::write(dir.path().join("incremental/deep").join(stale), b"x").unwrap();
        fs::write(dir.path().join("inbox").join(stale), b"user's").unwrap();
        fs::write(dir.path().join("incremental/.keep"), b"").unwrap();
        assert!(store.list("incremental").unwrap().is_empty());
        let removed = store.remove_temp_files().unwrap();
        assert_eq!(
            removed,
            vec![
                format!("incremental/{stale}"),
                format!("incremental/deep/{stale}")
            ]
        );
        assert!(dir.path().join("inbox").join(stale).exists());
        assert!(dir.path().join("incremental/.keep").exists());
    }
}
