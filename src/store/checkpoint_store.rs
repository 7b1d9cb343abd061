//! Iteration checkpoints with generations: the API the daemon and embedding programs share.
//!
//! Layout under the queue root:
//! ```text
//! incremental/<id>.json.gz         the task's latest checkpoint
//! incremental/<id>.<gen>.json.gz   older generations, the newest `keep_generations` of them
//! ```
//! A save keeps the previous latest as an older generation (a hard link made durable together
//! with the new file), so a checkpoint that later fails to decode still has a fallback. Task ids
//! never end in `.<digits>`, so `<id>.<gen>.json.gz` cannot be mistaken for another task's
//! latest file.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::blobs::{BlobError, BlobStore};
use super::checkpoint::{
    decode_checkpoint, encode_checkpoint, CheckpointError, IterationCheckpoint, FORMAT_VERSION,
};
use super::file::{CommitPath, FileStorage};
use super::Storage;
use crate::task_id::TaskId;

/// The directory, relative to the queue root, that holds iteration checkpoints.
const INCREMENTAL_DIR: &str = "incremental";

/// The suffix of every checkpoint file name.
const CHECKPOINT_SUFFIX: &str = ".json.gz";

/// How many older generations are kept besides the latest, unless configured otherwise.
pub const DEFAULT_KEEP_GENERATIONS: usize = 3;

/// Why a checkpoint operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The storage failed; the message names the file and what was being done to it.
    #[error("{action} {key}: {source}")]
    Io {
        /// What was being done: "writing", "reading", "listing", "removing", "creating",
        /// "numbering", "opening the commit log of".
        action: &'static str,
        /// The storage key (path relative to the queue root) involved.
        key: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A checkpoint file exists but cannot be used (damaged, wrong version or wrong task).
    #[error("checkpoint {key} is unusable: {source}")]
    Corrupt {
        /// The file's storage key.
        key: String,
        /// Why it could not be used.
        #[source]
        source: CheckpointError,
    },
    /// The checkpoint could not be encoded; nothing was written.
    #[error("encoding the checkpoint of task {task_id:?}: {source}")]
    Encode {
        /// The task whose checkpoint was being saved.
        task_id: String,
        /// Why encoding failed.
        #[source]
        source: CheckpointError,
    },
    /// The asked-for generation is not on disk (pruned, or never written).
    #[error("task {task_id:?} has no checkpoint generation {generation} on disk (its history lists the ones there are)")]
    NoSuchGeneration {
        /// The task asked about.
        task_id: String,
        /// The generation asked for.
        generation: u64,
    },
    /// The task id cannot name checkpoint files.
    #[error("invalid task id {task_id:?}: {reason}")]
    InvalidTaskId {
        /// The id as given.
        task_id: String,
        /// What is wrong with it.
        reason: crate::task_id::InvalidName,
    },
    /// A loop's state could not be converted to or from JSON.
    #[error("the loop state could not be converted to or from JSON: {0}")]
    State(#[source] serde_json::Error),
    /// The store behind a [`CheckpointSink`](super::CheckpointSink) (a database) failed;
    /// `what` says what was being done.
    #[error("{what}: {source}")]
    Sink {
        /// What was being done, naming the task.
        what: String,
        /// The sink's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A file the checkpoint names could not be stored or restored (missing, unreadable, not
    /// a regular file, linked out of the scratch directory, or a blob that lost its bytes);
    /// nothing was written, so the previous checkpoint stays in force.
    #[error("the checkpoint of task {task_id:?} is refused: {source}; the previous checkpoint stays in force")]
    Files {
        /// The task whose checkpoint it was.
        task_id: String,
        /// What is wrong, naming the file.
        #[source]
        source: super::blobs::BlobError,
    },
    /// The writer's [`WriteFence`](super::WriteFence) refused the write (its lease on the task
    /// was lost): nothing was written, and the writer must stop writing for the task.
    #[error("{reason}")]
    Fenced {
        /// The task whose checkpoint was refused.
        task_id: String,
        /// Why, as the fence gave it.
        reason: String,
    },
}

/// What one durable checkpoint write did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SavedCheckpoint {
    pub generation: u64,
    pub iteration_count: u64,
    /// Size of the encoded (gzip) checkpoint.
    pub bytes: u64,
    /// From encoding to the directory fsync.
    pub elapsed: std::time::Duration,
}

/// A checkpoint read back by [`CheckpointStore::latest`], with what was skipped to find it.
#[derive(Debug, Clone)]
pub struct LoadedCheckpoint {
    /// The newest checkpoint that decodes.
    pub checkpoint: IterationCheckpoint,
    /// The storage key it was read from (the latest file, or an older generation's).
    pub key: String,
    /// Newer files that did not decode, newest first: `(key, reason)`.
    pub skipped: Vec<(String, String)>,
}

/// One checkpoint file of a task, as listed by [`CheckpointStore::history`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GenerationInfo {
    /// The generation number (for a latest file that does not decode: the number the next
    /// save will keep it under).
    pub generation: u64,
    /// The file's storage key.
    pub key: String,
    /// The file's size in bytes.
    pub bytes: u64,
    /// Completed iterations, when the file decodes.
    pub iteration_count: Option<u64>,
    /// When it was written, when the file decodes.
    pub last_checkpoint_at: Option<DateTime<Utc>>,
    /// Why the file does not decode, if it does not.
    pub error: Option<String>,
}

/// What the store knows of a task's generation numbers, so that a save need not list
/// `incremental/` (whose size grows with the number of tasks).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
enum KnownGeneration {
    /// Nothing: the next save lists `incremental/` to find the task's older files.
    #[default]
    Unknown,
    /// The newest of the task's older files (0: none), from one listing of the whole
    /// directory by [`CheckpointStore::learn_generations_on_disk`]. The next save still reads
    /// the latest file.
    NewestOlder(u64),
    /// The generation of the task's latest file, which this store wrote.
    Latest(u64),
}

/// One task's [`KnownGeneration`]; its mutex is held for a whole save.
type GenerationSlot = Arc<Mutex<KnownGeneration>>;

/// Reads and writes iteration checkpoints, keeping a few older generations of each task.
///
/// Clones share one generation cache, so clones may save for different tasks concurrently;
/// saves for one task are serialized.
#[derive(Debug, Clone)]
pub struct CheckpointStore {
    /// Where the files live.
    storage: Arc<dyn Storage>,
    /// How many older generations to keep besides the latest.
    keep_generations: usize,
    /// Per task: what is known of its generations, so a save needs no directory listing.
    /// The per-task mutex is held for a whole save, so one task's generations never race.
    latest_generations: Arc<Mutex<HashMap<String, GenerationSlot>>>,
    /// The blobs of the files checkpoints name, when this store keeps any.
    blobs: Option<Arc<BlobStore>>,
    /// Tasks whose checkpoints named files (saved or read here): a save that retires one of
    /// their generations may leave a blob nothing names, so it collects.
    with_files: Arc<Mutex<HashSet<String>>>,
}

impl CheckpointStore {
    /// A store of the files under `queue_root` (creating `incremental/` if it is missing),
    /// committing through the directory's commit log after replaying it. When another process
    /// holds the log (a daemon on the same queue), this store writes by the atomic replace
    /// alone: that process replays its log, and this one must not.
    pub fn open(queue_root: impl AsRef<Path>) -> Result<Self, StoreError> {
        match Self::open_with(queue_root.as_ref(), CommitPath::Log) {
            Err(StoreError::Io { source, .. }) if source.kind() == io::ErrorKind::WouldBlock => {
                tracing::debug!(error = %source, "writing checkpoints without the commit log");
                let storage = FileStorage::new(queue_root.as_ref());
                Ok(Self::with_storage(Arc::new(storage)))
            }
            other => other,
        }
    }

    /// [`open`](Self::open) with the given commit path: [`CommitPath::Replace`] writes
    /// without the log (replaying one an earlier process left).
    pub fn open_with(queue_root: impl AsRef<Path>, path: CommitPath) -> Result<Self, StoreError> {
        let storage = FileStorage::new(queue_root.as_ref());
        storage
            .create_dir(INCREMENTAL_DIR)
            .map_err(|source| StoreError::Io {
                action: "creating",
                key: INCREMENTAL_DIR.to_owned(),
                source,
            })?;
        let storage = storage
            .with_commit_path(INCREMENTAL_DIR, path)
            .map_err(|source| StoreError::Io {
                action: "opening the commit log of",
                key: INCREMENTAL_DIR.to_owned(),
                source,
            })?;
        Ok(Self::with_storage(Arc::new(storage)))
    }

    /// A store on any [`Storage`] backend (or on fault-injecting file operations in tests).
    pub fn with_storage(storage: Arc<dyn Storage>) -> Self {
        Self {
            storage,
            keep_generations: DEFAULT_KEEP_GENERATIONS,
            latest_generations: Arc::default(),
            blobs: None,
            with_files: Arc::default(),
        }
    }

    /// Keep the files checkpoints name in `blobs` (a queue's `blobs/`).
    pub fn with_blobs(mut self, blobs: Arc<BlobStore>) -> Self {
        self.blobs = Some(blobs);
        self
    }

    /// Keep the files checkpoints name in the blob store of the queue directory `root`, as
    /// it is on disk (nothing is created). `cairn fork` saves through this: the forked
    /// checkpoint names the blobs of the generation it copies, checked to be there and held
    /// from a collection until it is committed, so the new task resumes with those files.
    pub fn with_blobs_of_queue(self, root: &Path) -> Self {
        self.with_blobs(Arc::new(BlobStore::existing(root)))
    }

    /// The blob store, when this store keeps files.
    pub fn blobs(&self) -> Option<&Arc<BlobStore>> {
        self.blobs.as_ref()
    }

    /// How many older generations to keep besides the latest (default 3).
    pub fn keep_generations(mut self, n: usize) -> Self {
        self.keep_generations = n;
        self
    }

    /// The backend, for callers that store other files next to the checkpoints.
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    /// Durably write `cp` as the task's latest checkpoint and return its generation.
    ///
    /// Sets `cp.generation` (previous latest + 1, or 1 for the first), `cp.format_version` and
    /// `cp.last_checkpoint_at` (now). The previous latest is kept as `<id>.<prevgen>.json.gz`;
    /// the generation `keep_generations` older than that is removed (a failure to remove it
    /// is logged, not returned: the new checkpoint is committed by then). On error the
    /// previous latest is intact.
    pub fn save<S: Serialize>(&self, cp: &mut IterationCheckpoint<S>) -> Result<u64, StoreError> {
        self.save_with_info(cp).map(|saved| saved.generation)
    }

    /// [`CheckpointStore::save`], telling also how many bytes were written and how long the
    /// durable write took (for the task's event journal).
    pub fn save_with_info<S: Serialize>(
        &self,
        cp: &mut IterationCheckpoint<S>,
    ) -> Result<SavedCheckpoint, StoreError> {
        if cp.files.is_empty() {
            let (saved, collect) = self.save_unlocked(cp)?;
            return self.collected_after(saved, collect, &cp.task_id);
        }
        // A checkpoint that names stored files already (a fork's, a loop's last): their
        // blobs must still be there, and stay while it is committed.
        let blobs = self.blobs_for(&cp.task_id)?;
        let held = blobs.hold_for_save().map_err(|source| StoreError::Io {
            action: "locking",
            key: BlobStore::DIR.to_owned(),
            source,
        })?;
        blobs
            .check_stored(&cp.files)
            .map_err(|source| StoreError::Files {
                task_id: cp.task_id.clone(),
                source,
            })?;
        let (saved, collect) = self.save_unlocked(cp)?;
        drop(held);
        self.collected_after(saved, collect, &cp.task_id)
    }

    /// [`save_with_info`](Self::save_with_info) of a checkpoint that names `files` (its name
    /// for each → the path relative to `scratch`): each is stored as a durable blob first, and
    /// the checkpoint, recording each one's hash and size, commits only after all of them
    /// are. A file that cannot be stored refuses the checkpoint and writes nothing.
    pub fn save_with_files<S: Serialize>(
        &self,
        cp: &mut IterationCheckpoint<S>,
        scratch: &Path,
        files: &BTreeMap<String, String>,
    ) -> Result<SavedCheckpoint, StoreError> {
        validate_task_id(&cp.task_id)?;
        let blobs = self.blobs_for(&cp.task_id)?;
        let held = blobs.hold_for_save().map_err(|source| StoreError::Io {
            action: "locking",
            key: BlobStore::DIR.to_owned(),
            source,
        })?;
        cp.files = blobs
            .store_files(scratch, files)
            .map_err(|source| StoreError::Files {
                task_id: cp.task_id.clone(),
                source,
            })?;
        let (saved, collect) = self.save_unlocked(cp)?;
        drop(held);
        self.collected_after(saved, collect, &cp.task_id)
    }

    /// The blob store, or why a checkpoint naming files cannot be kept here.
    fn blobs_for(&self, task_id: &str) -> Result<&Arc<BlobStore>, StoreError> {
        self.blobs.as_ref().ok_or_else(|| StoreError::Files {
            task_id: task_id.to_owned(),
            source: BlobError::NoStore,
        })
    }

    /// After a save: collect the blobs it may have left unnamed (a failure is logged: the
    /// checkpoint is committed, and a later collection removes them).
    fn collected_after(
        &self,
        saved: SavedCheckpoint,
        collect: bool,
        task_id: &str,
    ) -> Result<SavedCheckpoint, StoreError> {
        if collect {
            if let Err(err) = self.collect_blobs() {
                tracing::warn!(task_id, error = %err, "could not remove unused checkpoint files; a later collection retries");
            }
        }
        Ok(saved)
    }

    /// Remove every blob no checkpoint file here names. Before it looks, the removals of
    /// expired generations are made durable, so no power cut brings back a checkpoint whose
    /// blob is gone; it holds saves off while it looks and removes. Returns how many went.
    pub fn collect_blobs(&self) -> Result<usize, StoreError> {
        let Some(blobs) = &self.blobs else {
            return Ok(0);
        };
        let io = |action: &'static str, key: &str| {
            let key = key.to_owned();
            move |source: io::Error| StoreError::Io {
                action,
                key,
                source,
            }
        };
        self.storage
            .settle(INCREMENTAL_DIR)
            .map_err(io("syncing", INCREMENTAL_DIR))?;
        blobs
            .sweep_with(|| self.named_blobs().map_err(io::Error::other))
            .map_err(io("collecting", BlobStore::DIR))
    }

    /// The blobs every checkpoint file here names (a file that does not decode names none:
    /// it cannot be resumed from).
    fn named_blobs(&self) -> Result<HashSet<String>, StoreError> {
        let mut named = HashSet::new();
        for name in self.list_checkpoint_files()? {
            let Some(parsed) = Self::parse_file_name(&name) else {
                continue;
            };
            let key = format!("{INCREMENTAL_DIR}/{name}");
            if let Some(Ok(cp)) = self.read_checkpoint(parsed.task_id(), &key)? {
                named.extend(cp.files.into_values().map(|file| file.sha256));
            }
        }
        Ok(named)
    }

    /// Write `cp` (without the blob lock); whether blobs are to be collected afterwards.
    fn save_unlocked<S: Serialize>(
        &self,
        cp: &mut IterationCheckpoint<S>,
    ) -> Result<(SavedCheckpoint, bool), StoreError> {
        let started = std::time::Instant::now();
        validate_task_id(&cp.task_id)?;
        let slot = self.generation_slot(&cp.task_id);
        let mut cached = slot.lock().unwrap_or_else(PoisonError::into_inner);
        // Taken out, and put back only on success: after any failure the next save lists the
        // directory again, whatever state the failed write left behind.
        let previous = match std::mem::take(&mut *cached) {
            KnownGeneration::Latest(generation) => generation,
            KnownGeneration::NewestOlder(newest) => {
                self.last_generation_on_disk(&cp.task_id, Some(newest))?
            }
            KnownGeneration::Unknown => self.last_generation_on_disk(&cp.task_id, None)?,
        };
        // Only a hand-made file can hold u64::MAX; refuse rather than wrap around.
        let generation = previous.checked_add(1).ok_or_else(|| StoreError::Io {
            action: "numbering",
            key: latest_key(&cp.task_id),
            source: io::Error::new(
                io::ErrorKind::InvalidData,
                "generation numbers are exhausted (a file claims generation u64::MAX)",
            ),
        })?;
        cp.generation = generation;
        cp.format_version = FORMAT_VERSION;
        cp.last_checkpoint_at = Utc::now();
        let bytes = encode_checkpoint(cp).map_err(|source| StoreError::Encode {
            task_id: cp.task_id.clone(),
            source,
        })?;
        let key = latest_key(&cp.task_id);
        let keep_key = generation_key(&cp.task_id, previous);
        // The generation that falls out of the kept window with this save. When older
        // generations are kept, it is retired by the write itself (its file becomes the new
        // temp file); with none kept, it is the copy just made, removed after the write.
        let expired = previous
            .checked_sub(self.keep_generations as u64)
            .filter(|&expired| expired >= 1)
            .map(|expired| generation_key(&cp.task_id, expired));
        let written = match &expired {
            Some(retire) if self.keep_generations > 0 => {
                self.storage
                    .put_retiring(&key, &bytes, Some(&keep_key), retire)
            }
            _ => self.storage.put(&key, &bytes, Some(&keep_key)),
        };
        written.map_err(|source| StoreError::Io {
            action: "writing",
            key: key.clone(),
            source,
        })?;
        *cached = KnownGeneration::Latest(generation);
        drop(cached);
        let collect = expired.is_some() && self.note_files(&cp.task_id, !cp.files.is_empty());

        if let (Some(expired_key), 0) = (&expired, self.keep_generations) {
            if let Err(err) = self.storage.remove(expired_key) {
                tracing::warn!(
                    task_id = %cp.task_id,
                    key = %expired_key,
                    error = %err,
                    "could not remove an old checkpoint generation; it stays on disk"
                );
            }
        }
        let saved = SavedCheckpoint {
            generation,
            iteration_count: cp.iteration_count,
            bytes: bytes.len() as u64,
            elapsed: started.elapsed(),
        };
        Ok((saved, collect))
    }

    /// Note that `task_id`'s checkpoints name files (when `names_files`); whether they do.
    fn note_files(&self, task_id: &str, names_files: bool) -> bool {
        if self.blobs.is_none() {
            return false;
        }
        let mut with_files = self
            .with_files
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if names_files {
            with_files.insert(task_id.to_owned());
            return true;
        }
        with_files.contains(task_id)
    }

    /// The newest checkpoint of the task that decodes: the latest file, else older generations
    /// newest first. Files that do not decode (or belong to another task) are logged and
    /// listed in `skipped`. `Ok(None)` only when the task has no checkpoint file at all; when
    /// files exist but none decodes, the error of the newest one is returned. A task without a
    /// latest file whose older files a listing ([`CheckpointStore::learn_generations_on_disk`])
    /// found to be none is not listed again: files added by hand since are not seen.
    pub fn latest(&self, task_id: &str) -> Result<Option<LoadedCheckpoint>, StoreError> {
        validate_task_id(task_id)?;
        // Unusable files met on the way, newest first.
        let mut failures: Vec<(String, CheckpointError)> = Vec::new();
        // The older generations are listed only when the latest file is not usable.
        let mut older: Option<std::vec::IntoIter<u64>> = None;
        let mut key = latest_key(task_id);
        loop {
            match self.read_checkpoint(task_id, &key)? {
                Some(Ok(checkpoint)) => {
                    self.note_files(task_id, !checkpoint.files.is_empty());
                    if failures.is_empty() && older.is_none() {
                        self.learn_latest_read(task_id, checkpoint.generation);
                    }
                    let skipped = failures
                        .iter()
                        .map(|(key, err)| (key.clone(), err.to_string()))
                        .collect();
                    return Ok(Some(LoadedCheckpoint {
                        checkpoint,
                        key,
                        skipped,
                    }));
                }
                Some(Err(err)) => {
                    tracing::warn!(task_id, key = %key, error = %err, "skipping an unusable checkpoint");
                    failures.push((key, err));
                }
                // No latest file, and a listing made earlier found no older ones either (a new
                // task): nothing to look for.
                None if older.is_none() && self.knows_no_older_files(task_id) => break,
                // No such file (or an older one pruned since the listing): nothing to report.
                None => {}
            }
            let older = match &mut older {
                Some(older) => older,
                None => older.insert(self.older_generations(task_id)?.into_iter()),
            };
            match older.next() {
                Some(generation) => key = generation_key(task_id, generation),
                None => break,
            }
        }
        match failures.into_iter().next() {
            Some((key, source)) => Err(StoreError::Corrupt { key, source }),
            None => Ok(None),
        }
    }

    /// Every checkpoint file of the task, newest first: the latest file (with the generation
    /// recorded inside it), then the older generations.
    pub fn history(&self, task_id: &str) -> Result<Vec<GenerationInfo>, StoreError> {
        validate_task_id(task_id)?;
        let older = self.older_generations(task_id)?;
        let mut history = Vec::with_capacity(older.len() + 1);
        let key = latest_key(task_id);
        if let Some(bytes) = self.read(&key)? {
            let decoded = decode_for_key(task_id, &key, &bytes);
            let newest_older = older.first().copied().unwrap_or(0);
            let generation = match &decoded {
                Ok(cp) => cp.generation,
                // The number the next save keeps this file under (see last_generation_on_disk).
                Err(_) => newest_older.saturating_add(1),
            };
            history.push(generation_info(generation, key, &bytes, decoded));
        }
        for generation in older {
            let key = generation_key(task_id, generation);
            if let Some(bytes) = self.read(&key)? {
                let decoded = decode_for_key(task_id, &key, &bytes);
                history.push(generation_info(generation, key, &bytes, decoded));
            }
        }
        Ok(history)
    }

    /// The checkpoint of one generation (an older generation's file, or the latest file when
    /// it holds that generation).
    pub fn generation(
        &self,
        task_id: &str,
        generation: u64,
    ) -> Result<IterationCheckpoint, StoreError> {
        validate_task_id(task_id)?;
        let key = generation_key(task_id, generation);
        if let Some(result) = self.read_checkpoint(task_id, &key)? {
            return result.map_err(|source| StoreError::Corrupt { key, source });
        }
        let key = latest_key(task_id);
        if let Some(Ok(cp)) = self.read_checkpoint(task_id, &key)? {
            if cp.generation == generation {
                return Ok(cp);
            }
        }
        Err(StoreError::NoSuchGeneration {
            task_id: task_id.to_owned(),
            generation,
        })
    }

    /// Remove all of the task's checkpoint files.
    pub fn delete(&self, task_id: &str) -> Result<(), StoreError> {
        validate_task_id(task_id)?;
        let slot = self.generation_slot(task_id);
        let mut cached = slot.lock().unwrap_or_else(PoisonError::into_inner);
        *cached = KnownGeneration::Unknown;
        let mut keys = vec![latest_key(task_id)];
        keys.extend(
            self.older_generations(task_id)?
                .into_iter()
                .map(|generation| generation_key(task_id, generation)),
        );
        for key in keys {
            self.storage.remove(&key).map_err(|source| StoreError::Io {
                action: "removing",
                key,
                source,
            })?;
        }
        drop(cached);
        if self.blobs.as_ref().is_some_and(|b| b.holds_any()) {
            self.collect_blobs()?;
        }
        Ok(())
    }

    /// The ids of the tasks that have a latest checkpoint here, sorted: one listing of the
    /// directory, for callers that keep many tasks' checkpoints in one store.
    pub fn tasks(&self) -> Result<Vec<String>, StoreError> {
        let names = self.list_checkpoint_files()?;
        let mut ids: Vec<String> = names
            .iter()
            .filter_map(|name| match Self::parse_file_name(name) {
                Some(CheckpointFileName::Latest { task_id }) => Some(task_id.to_owned()),
                _ => None,
            })
            .collect();
        ids.sort_unstable();
        Ok(ids)
    }

    /// Learn the older generations of `task_ids` from one listing of `incremental/`, so that
    /// their first saves need not list it each: with thousands of tasks resuming at once,
    /// those listings made the first saves quadratic in the number of tasks. A first save
    /// still reads the task's latest file and numbers exactly as after a listing of its own.
    ///
    /// Older-generation files of these tasks that something other than this store adds
    /// afterwards are not seen by their first saves (as by any later save of a task): call it
    /// when nothing else writes these tasks' checkpoints, as the daemon does at start. Tasks
    /// this store has saved already, and invalid ids, are left as they are.
    pub fn learn_generations_on_disk<'a>(
        &self,
        task_ids: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), StoreError> {
        let names = self.list_checkpoint_files()?;
        let mut newest_older: HashMap<&str, u64> = HashMap::new();
        for (task_id, generation) in names.iter().filter_map(|name| split_generation(name)) {
            let newest = newest_older.entry(task_id).or_default();
            *newest = (*newest).max(generation);
        }
        for task_id in task_ids {
            if validate_task_id(task_id).is_err() {
                continue;
            }
            let slot = self.generation_slot(task_id);
            let mut known = slot.lock().unwrap_or_else(PoisonError::into_inner);
            if *known == KnownGeneration::Unknown {
                let newest = newest_older.get(task_id).copied().unwrap_or(0);
                *known = KnownGeneration::NewestOlder(newest);
            }
        }
        Ok(())
    }

    /// Take the word of the caller that `task_ids` have no older-generation files (ids it
    /// makes unique, such as a LangGraph saver's one entry per checkpoint), so that their
    /// first save and a read of one with no latest file need not list the directory to look
    /// for them: done for each new task, those listings make a store of many tasks quadratic.
    /// Tasks this store knows already, and invalid ids, are left as they are. A save still
    /// reads the latest file and numbers above it.
    pub fn assume_no_older_files<'a>(&self, task_ids: impl IntoIterator<Item = &'a str>) {
        for task_id in task_ids {
            if validate_task_id(task_id).is_err() {
                continue;
            }
            let slot = self.generation_slot(task_id);
            let mut known = slot.lock().unwrap_or_else(PoisonError::into_inner);
            if *known == KnownGeneration::Unknown {
                *known = KnownGeneration::NewestOlder(0);
            }
        }
    }

    /// Whether a listing told that the task has no older files, and no save happened since.
    fn knows_no_older_files(&self, task_id: &str) -> bool {
        self.existing_slot(task_id).is_some_and(|slot| {
            *slot.lock().unwrap_or_else(PoisonError::into_inner) == KnownGeneration::NewestOlder(0)
        })
    }

    /// The task's cache slot if it has one (none is made).
    fn existing_slot(&self, task_id: &str) -> Option<GenerationSlot> {
        self.latest_generations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(task_id)
            .cloned()
    }

    /// The task's cache slot, created empty on first use.
    fn generation_slot(&self, task_id: &str) -> GenerationSlot {
        let mut slots = self
            .latest_generations
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Arc::clone(slots.entry(task_id.to_owned()).or_default())
    }

    /// The generation of the task's latest file, worked out from disk, such that
    /// `generation_key(result)` is free to keep the latest under and `result + 1` is used by no
    /// file on disk. 0 when the task has no files. `newest_older` is the newest of the task's
    /// older files when a listing made beforehand told it; without it the directory is listed.
    fn last_generation_on_disk(
        &self,
        task_id: &str,
        newest_older: Option<u64>,
    ) -> Result<u64, StoreError> {
        let newest_older = match newest_older {
            Some(newest) => newest,
            None => self
                .older_generations(task_id)?
                .first()
                .copied()
                .unwrap_or(0),
        };
        let Some(bytes) = self.read(&latest_key(task_id))? else {
            return Ok(newest_older);
        };
        let decoded = decode_for_task(task_id, &bytes).ok();
        Ok(latest_generation_beside(
            decoded.map(|cp| cp.generation),
            newest_older,
        ))
    }

    /// After [`CheckpointStore::latest`] read the task's latest file: when a listing told the
    /// newest of its older files, the first save need not read the latest file again.
    fn learn_latest_read(&self, task_id: &str, generation: u64) {
        // Only a slot the listing made; a reader's store makes none.
        let Some(slot) = self.existing_slot(task_id) else {
            return;
        };
        let mut known = slot.lock().unwrap_or_else(PoisonError::into_inner);
        if let KnownGeneration::NewestOlder(newest_older) = *known {
            *known =
                KnownGeneration::Latest(latest_generation_beside(Some(generation), newest_older));
        }
    }

    /// The generation numbers of the task's older files, newest first.
    fn older_generations(&self, task_id: &str) -> Result<Vec<u64>, StoreError> {
        let names = self.list_checkpoint_files()?;
        let mut generations: Vec<u64> = names
            .iter()
            .filter_map(|name| parse_generation(task_id, name))
            .collect();
        generations.sort_unstable_by(|a, b| b.cmp(a));
        Ok(generations)
    }

    /// The names of every checkpoint file, of all tasks.
    fn list_checkpoint_files(&self) -> Result<Vec<String>, StoreError> {
        self.storage
            .list(INCREMENTAL_DIR)
            .map_err(|source| StoreError::Io {
                action: "listing",
                key: INCREMENTAL_DIR.to_owned(),
                source,
            })
    }

    /// The bytes at `key`, `None` when there is no such file.
    fn read(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.storage.get(key).map_err(|source| StoreError::Io {
            action: "reading",
            key: key.to_owned(),
            source,
        })
    }

    /// The checkpoint at `key`: `None` when there is no file, `Some(Err)` when it is unusable.
    fn read_checkpoint(
        &self,
        task_id: &str,
        key: &str,
    ) -> Result<Option<Result<IterationCheckpoint, CheckpointError>>, StoreError> {
        Ok(self
            .read(key)?
            .map(|bytes| decode_for_key(task_id, key, &bytes)))
    }
}

/// The number a save keeps the latest file under, given the generation recorded in it
/// (`None`: it does not decode) and the newest of the task's older files (0: none), such that
/// the kept name is free and the next number is used by no file on disk.
fn latest_generation_beside(latest: Option<u64>, newest_older: u64) -> u64 {
    match latest {
        // Equal happens when an earlier save linked the latest but failed before its rename:
        // that older file is a copy of the latest and may be replaced.
        Some(generation) if generation >= newest_older => generation,
        // The latest does not decode, or is older than a kept generation (restored by hand):
        // keep it under a number above every file on disk, so nothing is replaced.
        _ => newest_older.saturating_add(1),
    }
}

/// Decode the checkpoint file at `key` and check that it belongs to `task_id` and, for an
/// older generation's file, that it holds no later generation than its name gives (a
/// hand-restored older file is fine; a reused file left by an interrupted save is not).
fn decode_for_key(
    task_id: &str,
    key: &str,
    bytes: &[u8],
) -> Result<IterationCheckpoint, CheckpointError> {
    let cp = decode_for_task(task_id, bytes)?;
    let name = key.rsplit('/').next().unwrap_or(key);
    match parse_generation(task_id, name) {
        Some(named) if cp.generation > named => Err(CheckpointError::NotItsGeneration {
            named,
            found: cp.generation,
        }),
        _ => Ok(cp),
    }
}

/// Decode a checkpoint file and check that it belongs to `task_id`.
fn decode_for_task(task_id: &str, bytes: &[u8]) -> Result<IterationCheckpoint, CheckpointError> {
    let cp = decode_checkpoint(bytes)?;
    if cp.task_id != task_id {
        return Err(CheckpointError::WrongTask {
            expected: task_id.to_owned(),
            found: cp.task_id,
        });
    }
    Ok(cp)
}

/// One history row.
fn generation_info(
    generation: u64,
    key: String,
    bytes: &[u8],
    decoded: Result<IterationCheckpoint, CheckpointError>,
) -> GenerationInfo {
    let (iteration_count, last_checkpoint_at, error) = match decoded {
        Ok(cp) => (Some(cp.iteration_count), Some(cp.last_checkpoint_at), None),
        Err(err) => (None, None, Some(err.to_string())),
    };
    GenerationInfo {
        generation,
        key,
        bytes: bytes.len() as u64,
        iteration_count,
        last_checkpoint_at,
        error,
    }
}

/// What a name in `incremental/` is, by the rules the store names its files with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointFileName<'a> {
    /// `<id>.json.gz`: a task's latest checkpoint.
    Latest { task_id: &'a str },
    /// `<id>.<gen>.json.gz`: an older generation.
    Older { task_id: &'a str, generation: u64 },
}

impl CheckpointFileName<'_> {
    /// The task the file belongs to.
    pub fn task_id(&self) -> &str {
        match self {
            CheckpointFileName::Latest { task_id } | CheckpointFileName::Older { task_id, .. } => {
                task_id
            }
        }
    }
}

impl CheckpointStore {
    /// The directory, relative to the queue root, that holds the checkpoint files.
    pub const DIR: &'static str = INCREMENTAL_DIR;

    /// What the file `name` in [`DIR`](Self::DIR) is; `None` for a name the store never
    /// writes (another suffix, a hidden or temp file).
    pub fn parse_file_name(name: &str) -> Option<CheckpointFileName<'_>> {
        if name.starts_with('.') {
            return None;
        }
        let stem = name.strip_suffix(CHECKPOINT_SUFFIX)?;
        Some(match split_generation(name) {
            Some((task_id, generation)) => CheckpointFileName::Older {
                task_id,
                generation,
            },
            None => CheckpointFileName::Latest { task_id: stem },
        })
    }

    /// The key of a task's latest checkpoint file.
    pub fn latest_file_key(task_id: &str) -> String {
        latest_key(task_id)
    }

    /// The key of an older generation's file.
    pub fn generation_file_key(task_id: &str, generation: u64) -> String {
        generation_key(task_id, generation)
    }
}

/// `incremental/<id>.json.gz`
fn latest_key(task_id: &str) -> String {
    format!("{INCREMENTAL_DIR}/{task_id}{CHECKPOINT_SUFFIX}")
}

/// `incremental/<id>.<gen>.json.gz`
fn generation_key(task_id: &str, generation: u64) -> String {
    format!("{INCREMENTAL_DIR}/{task_id}.{generation}{CHECKPOINT_SUFFIX}")
}

/// The generation in `name` if it is one of the task's older files (`<id>.<gen>.json.gz`,
/// `gen` written as `generation_key` writes it, so every number has exactly one name).
fn parse_generation(task_id: &str, name: &str) -> Option<u64> {
    split_generation(name)
        .filter(|(id, _)| *id == task_id)
        .map(|(_, generation)| generation)
}

/// The task id and generation of an older generation's file name, `None` for any other name.
/// Unambiguous because task ids never end in `.<digits>`.
fn split_generation(name: &str) -> Option<(&str, u64)> {
    let (task_id, digits) = name.strip_suffix(CHECKPOINT_SUFFIX)?.rsplit_once('.')?;
    if task_id.is_empty() || digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let generation: u64 = digits.parse().ok()?;
    (generation.to_string() == digits).then_some((task_id, generation))
}

/// Task ids name checkpoint files: checked as [`TaskId`] checks every id.
fn validate_task_id(task_id: &str) -> Result<(), StoreError> {
    TaskId::parse(task_id)
        .map(drop)
        .map_err(|reason| StoreError::InvalidTaskId {
            task_id: task_id.to_owned(),
            reason,
        })
}

#[cfg(test)]
mod tests {
    use super::{parse_generation, split_generation, validate_task_id};

    #[test]
    fn generation_names_parse_only_for_their_task() {
        assert_eq!(parse_generation("t1", "t1.7.json.gz"), Some(7));
        assert_eq!(parse_generation("t1", "t1.json.gz"), None);
        assert_eq!(parse_generation("t1", "t1.07.json.gz"), None);
        assert_eq!(parse_generation("t1", "t1.x.json.gz"), None);
        assert_eq!(parse_generation("t1", "t1.a.7.json.gz"), None);
        assert_eq!(parse_generation("t1.a", "t1.a.7.json.gz"), Some(7));
        assert_eq!(parse_generation("t", "t1.7.json.gz"), None);
        assert_eq!(split_generation("t1.a.7.json.gz"), Some(("t1.a", 7)));
        assert_eq!(split_generation("t1.a.json.gz"), None);
        assert_eq!(split_generation(".7.json.gz"), None);
        assert_eq!(split_generation("t1.7.json"), None);
    }

    #[test]
    fn task_ids_that_would_be_ambiguous_are_rejected() {
        for bad in ["", ".hidden", "a/b", "..", "t.12", "x y", &"a".repeat(129)] {
            assert!(validate_task_id(bad).is_err(), "{bad:?}");
        }
        for good in [
            "t1",
            "lit-review-42",
            "a.b_c",
            "v1.2a",
            "t.",
            &"a".repeat(128),
        ] {
            validate_task_id(good).unwrap();
        }
    }

    #[test]
    fn tasks_lists_each_task_with_a_latest_checkpoint_once() {
        use crate::store::{CheckpointStore, IterationCheckpoint};
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(dir.path()).unwrap();
        assert!(store.tasks().unwrap().is_empty());
        for (task, saves) in [("b", 5), ("a.1x", 1), ("c", 2)] {
            for i in 1..=saves {
                store
                    .save(&mut IterationCheckpoint::of_loop(task, i))
                    .unwrap();
            }
        }
        assert_eq!(store.tasks().unwrap(), ["a.1x", "b", "c"]);
        store.delete("b").unwrap();
        assert_eq!(store.tasks().unwrap(), ["a.1x", "c"]);
    }

    #[test]
    fn tasks_assumed_new_are_saved_and_read_like_any_other() {
        use crate::store::{CheckpointStore, IterationCheckpoint};
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(dir.path()).unwrap();
        store
            .save(&mut IterationCheckpoint::of_loop("known", 1))
            .unwrap();
        store.assume_no_older_files(["known", "fresh", "never-saved", "bad/id"]);
        assert!(store.latest("never-saved").unwrap().is_none());
        for i in 1..=5 {
            let generation = store
                .save(&mut IterationCheckpoint::of_loop("fresh", i))
                .unwrap();
            assert_eq!(generation, i);
        }
        assert_eq!(
            store
                .save(&mut IterationCheckpoint::of_loop("known", 2))
                .unwrap(),
            2
        );
        let kept: Vec<u64> = store
            .history("fresh")
            .unwrap()
            .iter()
            .map(|g| g.generation)
            .collect();
        assert_eq!(kept, [5, 4, 3, 2]);
        assert_eq!(
            store
                .latest("fresh")
                .unwrap()
                .unwrap()
                .checkpoint
                .iteration_count,
            5
        );
    }

    #[test]
    fn a_fork_takes_the_patched_state_and_none_of_the_old_tasks_outcome() {
        use crate::store::IterationCheckpoint;
        let mut cp = IterationCheckpoint::of_loop("old", 4);
        cp.partial_results = serde_json::json!({"a": 1, "b": {"c": 2, "d": 3}});
        cp.done = true;
        cp.output = Some(serde_json::json!("out"));
        cp.cost = Some(0.5);
        cp.fork_as("new", Some(&serde_json::json!({"b": {"c": null, "e": 5}})));
        assert_eq!(cp.task_id, "new");
        assert_eq!(
            cp.partial_results,
            serde_json::json!({"a": 1, "b": {"d": 3, "e": 5}})
        );
        assert_eq!(
            (cp.done, cp.output, cp.cost, cp.attempt),
            (false, None, None, 0)
        );
        assert_eq!(cp.iteration_count, 4);
    }
}
