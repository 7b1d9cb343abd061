//! The read model of a queue: what the operator commands (`status`, `show`, `history`,
//! `checkpoint`, `prune`, `fork`, `submit`) and the benches know about a queue, read from its
//! files without a daemon and without writing anything.
//!
//! [`QueueReader`] is opened on a queue directory and answers: the tasks and where each stands
//! ([`QueueView`], [`TaskView`]), a task's definition, record, progress, checkpoints (through
//! the [`CheckpointStore`]) and journal, the rejections of files dropped into the inbox, and
//! whether a daemon holds the queue ([`DaemonInfo`]). Formatting is the caller's.

pub(crate) mod files;
mod liveness;
mod paths;
mod rate;
mod record;
mod status_cache;
mod task_view;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde_json::Value;

pub use liveness::{daemon_info, DaemonInfo};
pub use rate::rate_from_events;
pub use record::{Record, RecordError};
pub use status_cache::StatusCache;
pub use task_view::{TaskLease, TaskView};

pub(crate) use crate::safe_fs::{list_names, read_regular};
pub(crate) use files::read_queue_file;
pub(crate) use files::{disk_size, json_stems, mtime, newest_mtime};

use crate::limits::PublishedLimits;
use crate::queue::QueueDir;
use crate::store::current_work::{CurrentWork, StartPoint, StoredOutput};
use crate::store::journal::{self, JournalEvent};
use crate::store::work_log::{self, WorkLogError};
use crate::store::{
    CheckpointStore, FileStorage, GenerationInfo, IterationCheckpoint, LoadedCheckpoint,
    ReplayedView, Storage, StoreError,
};
use crate::task::Task;
use crate::task_id::TaskId;
use files::quietly;
// The PostgreSQL read model builds its views with these.
#[cfg(feature = "postgres")]
pub(crate) use record::rank;
#[cfg(feature = "postgres")]
pub(crate) use task_view::{finished, in_flight, pending, TaskFacts};
use task_view::{rejected_view, submitted_view, task_view, Listing};

/// How many inbox files `status` reads to list submitted tasks; beyond that they are only
/// counted, so that a large drop does not make every status query read all of it.
const INBOX_READ_LIMIT: usize = 1000;

/// `current_work.json` could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CurrentWorkError {
    #[error("{} cannot be read: {source}", path.display())]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("reading {}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
}

/// A phase output kept in a file that could not be read.
#[derive(Debug, thiserror::Error)]
#[error("{}: {why}", path.display())]
pub struct OutputError {
    pub path: PathBuf,
    pub why: String,
}

/// A whole queue, as read at `now`.
#[derive(Debug)]
pub struct QueueView {
    pub root: PathBuf,
    pub now: DateTime<Utc>,
    pub daemon: DaemonInfo,
    /// In flight first, then pending, finished and rejected; by id within each.
    pub tasks: Vec<TaskView>,
    /// Task files in `inbox/` not taken yet.
    pub inbox: usize,
    /// Files rejected at intake (`failed/rejected-*.json`), listed in `tasks` or not.
    pub rejected: usize,
    /// Files that could not be read (each names the file and why).
    pub warnings: Vec<String>,
    /// Why `current_work.json` could not be read (also among `warnings`): what is in flight
    /// is unknown.
    pub current_work_problem: Option<String>,
    /// The daemons of a queue shared through a database (`None` for a queue directory).
    pub cluster: Option<ClusterView>,
    /// The limits the running daemon published (`None`: no daemon runs, it published none,
    /// or a database queue, whose daemons each have their own).
    pub limits: Option<PublishedLimits>,
}

/// The daemons sharing a queue kept in a database.
#[derive(Debug, Clone)]
pub struct ClusterView {
    /// The database, named without its password.
    pub database: String,
    /// By name.
    pub nodes: Vec<NodeView>,
}

impl ClusterView {
    /// Whether any daemon is alive.
    pub fn any_alive(&self) -> bool {
        self.nodes.iter().any(|node| node.alive)
    }
}

/// One daemon registered in the database.
#[derive(Debug, Clone)]
pub struct NodeView {
    pub name: String,
    pub started_at: DateTime<Utc>,
    pub last_seen_at: DateTime<Utc>,
    /// Renewed recently enough to hold leases (see `docs/cluster.md`).
    pub alive: bool,
    /// Tasks it holds an unexpired lease on.
    pub leases: usize,
}

/// What to read besides the basics.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoadOptions {
    /// How many rejected intake files (`failed/rejected-*.json`) to list, the most recent ones
    /// (`usize::MAX`: all).
    pub rejected: usize,
}

/// A reader of one queue directory; it never writes and never takes the queue's lock.
#[derive(Debug, Clone)]
pub struct QueueReader {
    dir: QueueDir,
    store: CheckpointStore,
}

impl QueueReader {
    /// A reader of the queue at `root` (made absolute, so that what it names is unambiguous).
    pub fn open(root: &Path) -> QueueReader {
        let root = std::path::absolute(root).unwrap_or_else(|_| root.to_path_buf());
        let dir = QueueDir::new(root);
        QueueReader {
            store: CheckpointStore::with_storage(checkpoint_files(&dir)),
            dir,
        }
    }

    pub fn dir(&self) -> &QueueDir {
        &self.dir
    }

    pub fn root(&self) -> &Path {
        self.dir.root()
    }

    /// Whether the queue directory exists.
    pub fn exists(&self) -> bool {
        self.root().is_dir()
    }

    /// The first of the directories holding the queue's state (the queue, `tasks/`,
    /// `incremental/`, `done/`, `failed/`) that exists but cannot be listed by this user, with
    /// the error: the read model would show it as empty, so a command says so instead of
    /// listing a queue that looks emptier than it is. `inbox/` and `control/` are left out: a
    /// reader who may not submit (not in `inbox/`'s group) may still read the queue.
    pub fn unlistable_dir(&self) -> Option<(PathBuf, std::io::Error)> {
        const STATE_DIRS: [&str; 4] = [
            QueueDir::TASKS_DIR,
            "incremental",
            QueueDir::DONE_DIR,
            QueueDir::FAILED_DIR,
        ];
        std::iter::once(self.root().to_path_buf())
            .chain(STATE_DIRS.iter().map(|dir| self.root().join(dir)))
            .find_map(|dir| match std::fs::read_dir(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Some((dir, e)),
                _ => None,
            })
    }

    /// The path of a storage key, for messages and for reading a file the store named.
    pub fn path_of_key(&self, key: &str) -> PathBuf {
        self.root().join(key)
    }

    /// Whether a daemon holds the queue, and its pid.
    pub fn daemon(&self) -> DaemonInfo {
        daemon_info(&self.dir)
    }

    /// The tasks in flight: `current_work.json` and the log of writes since (missing files:
    /// nothing in flight).
    pub fn current_work(&self) -> Result<CurrentWork, CurrentWorkError> {
        let read = |key: &str| match read_queue_file(self.path_of_key(key)) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        };
        work_log::read(read)
            .map(|replayed| replayed.work)
            .map_err(|e| match e {
                WorkLogError::Io { key, source } => CurrentWorkError::Io {
                    path: self.path_of_key(&key),
                    source,
                },
                WorkLogError::Corrupt { key, source } => CurrentWorkError::Json {
                    path: self.path_of_key(&key),
                    source,
                },
                WorkLogError::CorruptLine { key, line, source } => CurrentWorkError::Json {
                    path: self.path_of_key(&format!("{key}:{line}")),
                    source,
                },
                version @ WorkLogError::Version { .. } => CurrentWorkError::Io {
                    path: self.dir.current_work_file(),
                    source: io::Error::other(version.to_string()),
                },
            })
    }

    /// Read the whole queue: a refresh of an empty [`StatusCache`], so that the one-off read
    /// and the kept one cannot differ.
    pub fn status(&self, options: LoadOptions) -> QueueView {
        StatusCache::read_once(self, options)
    }

    /// The limits the daemon running now published at its start; a file an earlier daemon
    /// left (another pid) is not in effect.
    fn published_limits(&self, daemon: DaemonInfo) -> Option<PublishedLimits> {
        let pid = daemon.pid.filter(|_| daemon.running)?;
        let bytes = read_regular(&self.root().join(QueueDir::LIMITS_KEY), 64 * 1024)?;
        let limits: PublishedLimits = serde_json::from_slice(&bytes).ok()?;
        (limits.pid == pid && limits.version == PublishedLimits::VERSION).then_some(limits)
    }

    /// The record `failed/<stem>.json` if it is a rejection. A task may be named rejected-x
    /// too: its record says which it is.
    fn rejection(&self, stem: &str) -> Option<Record> {
        if !stem.starts_with("rejected-") {
            return None;
        }
        Record::read(&self.dir.failed_file(stem))
            .ok()
            .filter(Record::is_rejection)
    }

    /// Entries in `inbox/` not taken yet (hidden and temp files left out).
    fn inbox_count(&self) -> usize {
        list_names(&self.dir.inbox())
            .iter()
            .filter(|name| !name.starts_with('.') && !name.ends_with(".tmp"))
            .count()
    }

    /// One task, by id (rejected records included); `None` when the queue knows no such task.
    pub fn task(&self, id: &TaskId) -> Option<TaskView> {
        let listing = quietly(|| Listing::read(self));
        let known = self.dir.task_file(id).exists()
            || self.dir.done_file(id).exists()
            || self.dir.failed_file(id).exists()
            || listing.work.get(id).is_some();
        if !known {
            return self
                .inbox_tasks()
                .into_iter()
                .find(|(_, task)| task.id() == id)
                .map(|(name, task)| submitted_view(self, &name, task));
        }
        if let Ok(record) = Record::read(&self.dir.failed_file(id)) {
            if record.is_rejection() {
                return Some(rejected_view(id, record));
            }
        }
        let mut view = quietly(|| task_view(&listing, id));
        view.warnings.splice(0..0, listing.warnings);
        Some(view)
    }

    /// Where [`task`](Self::task) looks for a task, for a message saying it found none.
    pub fn places_of(&self, id: &str) -> String {
        let in_root = |path: PathBuf| {
            path.strip_prefix(self.root())
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        };
        format!(
            "no {}, {}, {}, entry in {} nor rejected {}",
            QueueDir::task_key(id),
            QueueDir::done_key(id),
            QueueDir::failed_key(id),
            in_root(self.dir.current_work_file()),
            QueueDir::inbox_key(id),
        )
    }

    /// The task files waiting in `inbox/` that name their id (as `cairn submit` writes them),
    /// by file name. Files without an id get one only when the daemon takes them; files that
    /// do not parse will be rejected: neither is listed.
    pub fn inbox_tasks(&self) -> Vec<(String, Task)> {
        let inbox = self.dir.inbox();
        list_names(&inbox)
            .into_iter()
            .filter(|name| !name.starts_with('.') && name.ends_with(".json"))
            .take(INBOX_READ_LIMIT)
            .filter_map(|name| {
                let path = inbox.join(&name);
                // Only regular files, and not a huge one: the daemon will refuse those anyway.
                let meta = fs::symlink_metadata(&path).ok()?;
                if !meta.is_file() || meta.len() > crate::task::MAX_TASK_FILE_BYTES {
                    return None;
                }
                let task = Task::parse(&read_queue_file(&path).ok()?).ok()?;
                task.id.is_some().then_some((name, task))
            })
            .collect()
    }

    /// Is a task with this id waiting in `inbox/` (as `cairn submit` names it, or inside a
    /// file named otherwise)?
    pub fn in_inbox(&self, id: &str) -> bool {
        self.inbox_tasks().iter().any(|(_, task)| task.id() == id)
    }

    /// The ids named by every task file waiting in `inbox/`, read without following links and
    /// without blocking (a fork's task, say).
    pub fn inbox_ids(&self) -> Vec<String> {
        let inbox = self.dir.inbox();
        list_names(&inbox)
            .into_iter()
            .filter_map(|name| {
                let bytes = read_regular(&inbox.join(name), crate::task::MAX_TASK_FILE_BYTES)?;
                let value: Value = serde_json::from_slice(&bytes).ok()?;
                value["id"].as_str().map(str::to_string)
            })
            .collect()
    }

    /// Does the queue have any file of this task (definition, record, entry or checkpoint)?
    pub fn task_exists(&self, id: &str) -> bool {
        self.dir.task_file(id).exists()
            || self.dir.done_file(id).exists()
            || self.dir.failed_file(id).exists()
            || self.has_latest_checkpoint(id)
            || self.current_work().is_ok_and(|work| work.get(id).is_some())
    }

    /// Whether the task's latest checkpoint exists: its file, or else what the commit log will
    /// restore (a first save whose file a power cut took, before a daemon replays the log).
    fn has_latest_checkpoint(&self, id: &str) -> bool {
        let key = CheckpointStore::latest_file_key(id);
        self.path_of_key(&key).exists()
            || quietly(|| self.store.storage().get(&key)).is_ok_and(|bytes| bytes.is_some())
    }

    /// The names of the rejection records (`failed/rejected-*.json`) of files that were
    /// dropped as `inbox/<file>` or `inbox/<file>.json`, the most recent first: a person knows
    /// the file name, not the suffix intake gave the record.
    pub fn rejections_of(&self, file: &str) -> Vec<String> {
        let wanted = QueueDir::inbox_names(file);
        let mut found: Vec<(Option<DateTime<Utc>>, String)> = json_stems(&self.dir.failed_dir())
            .into_iter()
            .filter_map(|stem| {
                let record = self.rejection(&stem)?;
                let named = record.value["file"].as_str()?;
                wanted
                    .iter()
                    .any(|w| w == named)
                    .then_some((record.at, stem))
            })
            .collect();
        found.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        found.into_iter().map(|(_, stem)| stem).collect()
    }

    /// A task's definition as accepted (`tasks/<id>.json`); `None` when there is none.
    pub fn definition_bytes(&self, id: &str) -> io::Result<Option<Vec<u8>>> {
        match read_queue_file(self.dir.task_file(id)) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The phase a pending task starts at: 0, or a fork's start point.
    fn start_phase(&self, id: &str) -> usize {
        read_queue_file(self.path_of_key(&StartPoint::key(id)))
            .ok()
            .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
            .and_then(|v| v["phase_index"].as_u64())
            .unwrap_or(0) as usize
    }

    /// The outputs of finished phases the queue still has for a task: from its records, then
    /// (for those not there) from its entry in `current_work.json`.
    pub fn phase_outputs(&self, id: &str) -> BTreeMap<String, Value> {
        let mut found: BTreeMap<String, Value> = BTreeMap::new();
        for path in [self.dir.done_file(id), self.dir.failed_file(id)] {
            if let Ok(bytes) = read_queue_file(path) {
                let record: Value = serde_json::from_slice(&bytes).unwrap_or_default();
                if let Some(Value::Object(outputs)) = record.get("phase_outputs") {
                    found.extend(outputs.iter().map(|(k, v)| (k.clone(), v.clone())));
                }
            }
        }
        if let Ok(work) = self.current_work() {
            if let Some(entry) = work.get(id) {
                for (name, stored) in &entry.phase_outputs {
                    if let Ok(value) = self.stored_output(stored) {
                        found.entry(name.clone()).or_insert(value);
                    }
                }
            }
        }
        found
    }

    /// A phase output as `current_work.json` holds it: inline, or in a file of the queue.
    pub fn stored_output(&self, stored: &StoredOutput) -> Result<Value, OutputError> {
        let key = match stored {
            StoredOutput::Inline(value) => return Ok(value.clone()),
            StoredOutput::File(key) => key,
        };
        let path = self.path_of_key(key);
        let failed = |why: String| OutputError {
            path: path.clone(),
            why,
        };
        if !is_plain_key(key) {
            return Err(failed("not a file inside the queue".into()));
        }
        let bytes = read_queue_file(&path).map_err(|e| failed(e.to_string()))?;
        serde_json::from_slice(&bytes).map_err(|e| failed(e.to_string()))
    }

    /// A task's journal file, `runs/<id>/events.jsonl`.
    pub fn journal_file(&self, id: &str) -> PathBuf {
        journal::journal_path(self.root(), id)
    }

    /// A task's whole journal (torn lines skipped).
    pub fn journal(&self, id: &str) -> io::Result<Vec<JournalEvent>> {
        journal::read(self.root(), id)
    }

    /// A task's working directory, `runs/<id>/`.
    pub fn run_dir(&self, id: &str) -> PathBuf {
        self.dir.run_dir(id)
    }

    /// The stderr logs of a task's commands (`runs/<id>/<index>-<phase>.log`), with sizes.
    pub fn log_files(&self, id: &str) -> Vec<(PathBuf, u64)> {
        let dir = self.run_dir(id);
        list_names(&dir)
            .into_iter()
            .filter(|name| name.ends_with(".log"))
            .filter_map(|name| {
                let path = dir.join(name);
                let bytes = fs::metadata(&path).ok()?.len();
                Some((path, bytes))
            })
            .collect()
    }

    /// Records of earlier failures that `cairn retry` archived as `runs/<id>/failed-*.json`.
    pub fn earlier_failures(&self, id: &str) -> Vec<Value> {
        let dir = self.run_dir(id);
        list_names(&dir)
            .into_iter()
            .filter(|n| n.starts_with("failed-") && n.ends_with(".json"))
            .filter_map(|n| serde_json::from_slice(&read_queue_file(dir.join(n)).ok()?).ok())
            .collect()
    }

    /// The queue's checkpoint store (reading only).
    pub fn checkpoints(&self) -> &CheckpointStore {
        &self.store
    }

    /// Every checkpoint file of a task, newest first (the store's warnings silenced: callers
    /// report each file's error themselves).
    pub fn history(&self, id: &str) -> Result<Vec<GenerationInfo>, StoreError> {
        quietly(|| self.store.history(id))
    }

    /// The newest checkpoint of a task that decodes, with the files skipped on the way.
    pub fn latest_checkpoint(&self, id: &str) -> Result<Option<LoadedCheckpoint>, StoreError> {
        quietly(|| self.store.latest(id))
    }

    /// One generation of a task's checkpoint.
    pub fn checkpoint_generation(
        &self,
        id: &str,
        generation: u64,
    ) -> Result<IterationCheckpoint, StoreError> {
        quietly(|| self.store.generation(id, generation))
    }

    /// The bytes of a file the store named by key (`None` when it cannot be read).
    pub fn read_key(&self, key: &str) -> Option<Vec<u8>> {
        read_queue_file(self.path_of_key(key)).ok()
    }
}

/// The checkpoint files as the next daemon will resume from them: while no daemon runs, with
/// what the checkpoint directory's commit log holds laid over them (a power cut may have left
/// files older than their committed saves; see `store::ReplayedView`). A log that cannot be
/// read leaves the files as they are: they are what every reader saw before.
fn checkpoint_files(dir: &QueueDir) -> Arc<dyn Storage> {
    let files = FileStorage::new(dir.root());
    match ReplayedView::open(files.clone(), CheckpointStore::DIR, || {
        daemon_info(dir).running
    }) {
        Ok(Some(view)) => Arc::new(view),
        Ok(None) => Arc::new(files),
        Err(e) => {
            tracing::warn!(
                error = %e,
                "cannot read the checkpoints' commit log: checkpoints are shown as their files \
                 hold them, which after a power cut may be older than what the next daemon \
                 restores"
            );
            Arc::new(files)
        }
    }
}

/// A storage key that stays inside the queue.
fn is_plain_key(key: &str) -> bool {
    !key.starts_with('/') && key.split('/').all(|part| part != ".." && !part.is_empty())
}
