//! Power-loss simulation for tests: [`FileOps`] that run for real and remember what a power cut
//! would leave on the disk.
//!
//! [`PowerLossFileOps`] performs every call with [`RealFileOps`], so the store above it works
//! normally, and keeps a model of the durable state of one watched directory tree:
//! - a file's content is what it held at its last `sync_file`; a file never synced is empty;
//! - a directory's entries (name → file or directory) are those it had at its last `sync_dir`;
//!   an entry created, linked or renamed in since then is lost, and an entry removed or renamed
//!   away since then is still there (pointing to the file it named then);
//! - everything under the watched root when the simulation starts counts as synced.
//!
//! This is deliberately more pessimistic than ext4 (whose journal often makes more survive),
//! so a write sequence that survives the model survives the real thing.
//! [`PowerLossFileOps::crash_image`] writes the disk as it would look after a power cut at that
//! moment into a fresh directory, where a fresh store can be opened to check recovery.
//! Only regular files and directories are modelled (symlinks and other entries are left out of
//! the image). A test double, compiled only with the `test-doubles` feature.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsString;
use std::fmt;
use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::file_ops::{FileOps, RealFileOps, TempFile};

/// Index of a node (one file or directory, one generation of an inode) in the model.
type NodeId = usize;

/// `(device, inode)`: how a file on the real disk is recognised.
type InodeKey = (u64, u64);

/// What a power cut leaves of one file or directory.
#[derive(Debug)]
enum Durable {
    /// A file's content as of its last `sync_file`; `None` (never synced) reads as empty.
    File(Option<Vec<u8>>),
    /// A directory's entries as of its last `sync_dir`; `None` (never synced) is empty.
    Dir(Option<BTreeMap<OsString, NodeId>>),
}

/// The durable state of the watched tree.
#[derive(Debug, Default)]
struct Model {
    /// Every file and directory ever seen, by node id.
    nodes: Vec<Durable>,
    /// The node each live inode currently is. An inode whose last name was removed is dropped
    /// here, so a reused inode number becomes a new node and the old one keeps its content.
    inodes: HashMap<InodeKey, NodeId>,
    /// The watched root (durable by assumption: it existed when the simulation started).
    root: NodeId,
    /// Per file: bytes appended to it (a commit log) since its last sync, which a power cut
    /// may leave half-written after the synced content (see [`PowerLossFileOps::torn_image`]).
    pending_appends: HashMap<NodeId, Vec<u8>>,
}

/// The identity of the file `meta` describes.
fn key_of(meta: &fs::Metadata) -> InodeKey {
    (meta.dev(), meta.ino())
}

impl Model {
    /// A new node for `key`, replacing whatever node the inode was before.
    fn fresh(&mut self, key: InodeKey, durable: Durable) -> NodeId {
        let id = self.nodes.len();
        self.nodes.push(durable);
        self.inodes.insert(key, id);
        id
    }

    /// The node of `key`; a new, never-synced node if the inode is unknown (or was a file and
    /// is now a directory, or the reverse).
    fn node_for(&mut self, key: InodeKey, is_dir: bool) -> NodeId {
        if let Some(&id) = self.inodes.get(&key) {
            if matches!(self.nodes[id], Durable::Dir(_)) == is_dir {
                return id;
            }
        }
        let durable = if is_dir {
            Durable::Dir(None)
        } else {
            Durable::File(None)
        };
        self.fresh(key, durable)
    }

    /// Record the whole tree under `dir` as durable, as it is now.
    fn seed(&mut self, dir: &Path) -> io::Result<NodeId> {
        let meta = fs::symlink_metadata(dir)?;
        let id = self.fresh(key_of(&meta), Durable::Dir(None));
        let mut entries = BTreeMap::new();
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            let meta = entry.metadata()?;
            let key = key_of(&meta);
            let child = if meta.is_dir() {
                self.seed(&entry.path())?
            } else if meta.is_file() {
                match self.inodes.get(&key) {
                    // A second name of a file already seen (a hard link).
                    Some(&existing) => existing,
                    None => self.fresh(key, Durable::File(Some(fs::read(entry.path())?))),
                }
            } else {
                continue;
            };
            entries.insert(entry.file_name(), child);
        }
        self.nodes[id] = Durable::Dir(Some(entries));
        Ok(id)
    }

    /// The entries `dir` has on the real disk now, as nodes.
    fn current_entries(&mut self, dir: &Path) -> io::Result<BTreeMap<OsString, NodeId>> {
        let mut entries = BTreeMap::new();
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            // DirEntry::metadata does not follow symlinks.
            let meta = entry.metadata()?;
            if !(meta.is_file() || meta.is_dir()) {
                continue;
            }
            let id = self.node_for(key_of(&meta), meta.is_dir());
            entries.insert(entry.file_name(), id);
        }
        Ok(entries)
    }

    /// Make everything under `dir` durable as it is now (a `syncfs`).
    fn sync_tree(&mut self, dir: &Path) -> io::Result<()> {
        let id = self.node_for(key_of(&fs::metadata(dir)?), true);
        let entries = self.current_entries(dir)?;
        for (name, &child) in &entries {
            let path = dir.join(name);
            match self.nodes[child] {
                Durable::Dir(_) => self.sync_tree(&path)?,
                Durable::File(_) => {
                    self.nodes[child] = Durable::File(Some(fs::read(&path)?));
                    self.pending_appends.remove(&child);
                }
            }
        }
        self.nodes[id] = Durable::Dir(Some(entries));
        Ok(())
    }

    /// Forget the inode behind `before` if the operation just removed its last name.
    fn forget_if_unlinked(&mut self, before: Option<fs::Metadata>) {
        if let Some(meta) = before {
            if meta.is_file() && meta.nlink() <= 1 {
                self.inodes.remove(&key_of(&meta));
            }
        }
    }

    /// Write the durable entries of directory `id` into the existing directory `into`.
    /// `written` maps each file node already written to its path (so hard links stay links) and
    /// marks directories already written (so a cycle cannot recurse forever).
    fn write_image(
        &self,
        id: NodeId,
        into: &Path,
        written: &mut HashMap<NodeId, PathBuf>,
        dirs: &mut HashSet<NodeId>,
        torn: bool,
    ) -> io::Result<()> {
        let Durable::Dir(Some(entries)) = &self.nodes[id] else {
            return Ok(());
        };
        for (name, &child) in entries {
            let path = into.join(name);
            match &self.nodes[child] {
                Durable::Dir(_) => {
                    if dirs.insert(child) {
                        fs::create_dir(&path)?;
                        self.write_image(child, &path, written, dirs, torn)?;
                    }
                }
                Durable::File(content) => match written.get(&child) {
                    Some(first) => fs::hard_link(first, &path)?,
                    None => {
                        let mut bytes = content.clone().unwrap_or_default();
                        if let (true, Some(pending)) = (torn, self.pending_appends.get(&child)) {
                            bytes.extend_from_slice(&pending[..pending.len() / 2]);
                        }
                        fs::write(&path, bytes)?;
                        written.insert(child, path);
                    }
                },
            }
        }
        Ok(())
    }
}

/// [`FileOps`] that run for real and model what would survive a power cut (see the module
/// documentation for the rules). Calls outside the watched root run for real and are not
/// modelled.
pub struct PowerLossFileOps {
    /// The syscalls that actually run.
    real: RealFileOps,
    /// The watched root, canonical.
    root: PathBuf,
    /// The durable state; also held for the whole of each call so the model follows the
    /// real calls in order.
    model: Mutex<Model>,
    /// Calls made so far.
    steps: AtomicU64,
}

impl fmt::Debug for PowerLossFileOps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PowerLossFileOps")
            .field("root", &self.root)
            // try_lock: Debug may run while a call holds the model.
            .field(
                "nodes",
                &self.model.try_lock().ok().map(|model| model.nodes.len()),
            )
            .field("steps", &self.steps())
            .finish()
    }
}

impl PowerLossFileOps {
    /// Watch the existing directory `root`: everything under it now counts as durable.
    pub fn new(root: impl AsRef<Path>) -> io::Result<Self> {
        let root = fs::canonicalize(root.as_ref())?;
        let mut model = Model::default();
        model.root = model.seed(&root)?;
        Ok(Self {
            real: RealFileOps,
            root,
            model: Mutex::new(model),
            steps: AtomicU64::new(0),
        })
    }

    /// The watched root (canonical).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// How many calls were made so far.
    pub fn steps(&self) -> u64 {
        self.steps.load(Ordering::SeqCst)
    }

    /// Write the watched tree as it would be after a power cut now into `into` (created if
    /// missing; it must be empty): only synced directory entries, each file with its synced
    /// content.
    pub fn crash_image(&self, into: &Path) -> io::Result<()> {
        self.write_crash_image(into, false)
    }

    /// [`crash_image`](Self::crash_image), but every file appended to since its last sync (a
    /// commit log) ends with the first half of what was appended: a torn tail.
    pub fn torn_image(&self, into: &Path) -> io::Result<()> {
        self.write_crash_image(into, true)
    }

    fn write_crash_image(&self, into: &Path, torn: bool) -> io::Result<()> {
        fs::create_dir_all(into)?;
        if fs::read_dir(into)?.next().is_some() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("crash image target {} is not empty", into.display()),
            ));
        }
        let model = self.lock();
        let mut dirs = HashSet::from([model.root]);
        model.write_image(model.root, into, &mut HashMap::new(), &mut dirs, torn)
    }

    /// The model, counting the call.
    fn step(&self) -> MutexGuard<'_, Model> {
        self.steps.fetch_add(1, Ordering::SeqCst);
        self.lock()
    }

    /// The model (a panic elsewhere leaves it usable: each update is a single assignment).
    fn lock(&self) -> MutexGuard<'_, Model> {
        self.model.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `dir` lies in the watched tree.
    fn watched(&self, dir: &Path) -> bool {
        fs::canonicalize(dir).is_ok_and(|dir| dir.starts_with(&self.root))
    }
}

impl FileOps for PowerLossFileOps {
    fn create_temp(&self, dir: &Path, target_name: &str) -> io::Result<TempFile> {
        let mut model = self.step();
        let temp = self.real.create_temp(dir, target_name)?;
        // Always a new node: the inode number may be one a removed file had.
        model.fresh(key_of(&temp.file.metadata()?), Durable::File(None));
        Ok(temp)
    }

    fn reuse_as_temp(
        &self,
        old: &Path,
        dir: &Path,
        target_name: &str,
    ) -> io::Result<Option<TempFile>> {
        let mut model = self.step();
        let reused = self.real.reuse_as_temp(old, dir, target_name)?;
        if let Some(temp) = &reused {
            // The old name may survive a power cut (the rename is not synced yet), and the
            // content is about to be overwritten in place: until the next `sync_file` a power
            // cut leaves it torn, which reads as empty here.
            let id = model.node_for(key_of(&temp.file.metadata()?), false);
            model.nodes[id] = Durable::File(None);
        }
        Ok(reused)
    }

    fn write_all(&self, temp: &mut TempFile, bytes: &[u8]) -> io::Result<()> {
        let _model = self.step();
        self.real.write_all(temp, bytes)
    }

    fn sync_file(&self, temp: &mut TempFile) -> io::Result<()> {
        let mut model = self.step();
        self.real.sync_file(temp)?;
        let key = key_of(&temp.file.metadata()?);
        // Read through the descriptor, whatever name the file has now.
        let content = fs::read(format!("/proc/self/fd/{}", temp.file.as_raw_fd()))?;
        let id = model.node_for(key, false);
        model.nodes[id] = Durable::File(Some(content));
        Ok(())
    }

    fn hard_link(&self, existing: &Path, new: &Path) -> io::Result<()> {
        // A new entry: durable only at the next sync of its directory.
        let _model = self.step();
        self.real.hard_link(existing, new)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut model = self.step();
        let moved = fs::symlink_metadata(from).ok();
        let replaced = fs::symlink_metadata(to)
            .ok()
            .filter(|to| moved.as_ref().is_none_or(|from| key_of(from) != key_of(to)));
        self.real.rename(from, to)?;
        model.forget_if_unlinked(replaced);
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut model = self.step();
        self.real.sync_dir(dir)?;
        if self.watched(dir) {
            let id = model.node_for(key_of(&fs::metadata(dir)?), true);
            let entries = model.current_entries(dir)?;
            model.nodes[id] = Durable::Dir(Some(entries));
        }
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut model = self.step();
        let before = fs::symlink_metadata(path).ok();
        self.real.remove_file(path)?;
        model.forget_if_unlinked(before);
        Ok(())
    }

    fn open_log(&self, path: &Path) -> io::Result<fs::File> {
        let mut model = self.step();
        let log = self.real.open_log(path)?;
        // A log created now is a new, never-synced node; an existing one keeps its node.
        model.node_for(key_of(&log.metadata()?), false);
        Ok(log)
    }

    fn append_log(&self, log: &fs::File, at: u64, bytes: &[u8]) -> io::Result<()> {
        let mut model = self.step();
        self.real.append_log(log, at, bytes)?;
        let id = model.node_for(key_of(&log.metadata()?), false);
        model
            .pending_appends
            .entry(id)
            .or_default()
            .extend_from_slice(bytes);
        Ok(())
    }

    fn sync_log(&self, log: &fs::File) -> io::Result<()> {
        let mut model = self.step();
        self.real.sync_log(log)?;
        let content = fs::read(format!("/proc/self/fd/{}", log.as_raw_fd()))?;
        let id = model.node_for(key_of(&log.metadata()?), false);
        model.nodes[id] = Durable::File(Some(content));
        model.pending_appends.remove(&id);
        Ok(())
    }

    fn truncate_log(&self, log: &fs::File, len: u64) -> io::Result<()> {
        let mut model = self.step();
        self.real.truncate_log(log, len)?;
        // What was appended and not synced is gone; the synced content stays until a sync.
        let id = model.node_for(key_of(&log.metadata()?), false);
        model.pending_appends.remove(&id);
        Ok(())
    }

    fn sync_fs(&self, dir: &Path) -> io::Result<()> {
        let mut model = self.step();
        self.real.sync_fs(dir)?;
        let root = self.root.clone();
        model.sync_tree(&root)
    }
}
