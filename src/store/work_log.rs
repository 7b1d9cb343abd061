//! The work state on disk: `current_work.json`, a snapshot of every task in flight, and
//! `current_work.log`, the entries written since, one line per write.
//!
//! Why a log: the work state used to be one document rewritten whole at every write (each
//! attempt start, phase end, record, progress every 2 s), so with 10,000 tasks in flight each
//! write cost 4.9 MB and a run was quadratic in the tasks. A write now appends one line holding
//! only the entries that changed and the ids that left, made durable by one fsync: one barrier
//! for a whole group of entries, and no new inode (a file per entry would allocate one per
//! write, which a journal-less ext4 makes expensive). A line is atomic: a line cut short by a
//! crash has no newline and is ignored, so a reader sees a write's entries all or none.
//!
//! Compaction writes the state as a new snapshot once the log has grown past the snapshot's
//! size (so the bytes written stay linear in what changed), whenever no task is left in
//! flight (so an idle queue's `current_work.json` is the whole state), and at the first write
//! of a process (which drops a torn tail and turns a `current_work.json` of an older cairn,
//! which had no log, into this form). Each snapshot carries a generation, and the log starts
//! with the generation it follows: the snapshot is replaced first (atomically), then the log;
//! a log whose generation is not the snapshot's is older than it (a crash between the two
//! replaces) and is ignored.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Deserialize;

use super::current_work::{ActiveTask, CurrentWork, CURRENT_WORK_VERSION};
use super::Storage;
use crate::task_id::TaskId;

/// Storage key of the snapshot.
pub const SNAPSHOT_KEY: &str = "current_work.json";

/// Storage key of the log of writes since the snapshot.
pub const LOG_KEY: &str = "current_work.log";

/// The log is compacted once it is larger than the snapshot, and never below this size.
pub const DEFAULT_COMPACT_AT: usize = 256 * 1024;

/// Why the work state on disk cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum WorkLogError {
    #[error("reading {key}: {source}")]
    Io { key: String, source: io::Error },
    #[error("{key} is not a valid current_work file: {source}")]
    Corrupt {
        key: String,
        source: serde_json::Error,
    },
    #[error("{key} line {line} is not a valid entry of the work log: {source}")]
    CorruptLine {
        key: String,
        line: usize,
        source: serde_json::Error,
    },
    #[error("{key} has version {found}; this cairn reads version {CURRENT_WORK_VERSION}")]
    Version { key: String, found: u32 },
}

/// The first line of a log: the snapshot generation it follows.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LogHeader {
    work_log: u64,
}

/// One write: entries put (whole), ids removed.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LogRecord {
    at: DateTime<Utc>,
    #[serde(default)]
    put: Vec<ActiveTask>,
    #[serde(default)]
    remove: Vec<TaskId>,
}

/// How a log relates to the snapshot it was read with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogState {
    /// No log (a queue of an older cairn, or a new one).
    Missing,
    /// The log follows the snapshot and was applied.
    Applied,
    /// The log is older than the snapshot (a compaction was cut short): ignored.
    Stale,
    /// The log is newer than the snapshot: a compaction happened between the two reads, so a
    /// reader reads both again.
    Newer,
}

/// The state as read from a snapshot and its log.
#[derive(Debug)]
pub struct Replayed {
    pub work: CurrentWork,
    pub log: LogState,
    /// The generation the log's first line names, when there is a log.
    pub log_generation: Option<u64>,
    /// The log ended in a line cut short by a crash (ignored).
    pub torn_tail: bool,
}

/// Parse a snapshot (a `current_work.json` of any cairn since version 1 of the layout).
pub fn parse_snapshot(bytes: &[u8]) -> Result<CurrentWork, WorkLogError> {
    let work: CurrentWork =
        serde_json::from_slice(bytes).map_err(|source| WorkLogError::Corrupt {
            key: SNAPSHOT_KEY.to_string(),
            source,
        })?;
    if work.version != CURRENT_WORK_VERSION {
        return Err(WorkLogError::Version {
            key: SNAPSHOT_KEY.to_string(),
            found: work.version,
        });
    }
    Ok(work)
}

/// How often a reader tries again when a compaction replaced the files between its two reads.
const READ_ATTEMPTS: usize = 5;

/// Read the work state through `get` (a storage's or a plain file read of a key): the snapshot,
/// then its log. Never writes, so the CLI's readers use it too, while a daemon writes.
pub fn read(get: impl Fn(&str) -> io::Result<Option<Vec<u8>>>) -> Result<Replayed, WorkLogError> {
    let read_key = |key: &str| {
        get(key).map_err(|source| WorkLogError::Io {
            key: key.to_string(),
            source,
        })
    };
    let mut attempt = 0;
    loop {
        attempt += 1;
        let snapshot = match read_key(SNAPSHOT_KEY)? {
            Some(bytes) => parse_snapshot(&bytes)?,
            None => CurrentWork::default(),
        };
        let log = read_key(LOG_KEY)?;
        let replayed = replay(snapshot, log.as_deref())?;
        if replayed.log != LogState::Newer || attempt >= READ_ATTEMPTS {
            return Ok(replayed);
        }
    }
}

/// Apply `log` (when there is one) to `snapshot`. A last line without its newline is a write
/// cut short and is ignored; any other line that does not parse is an error.
pub fn replay(snapshot: CurrentWork, log: Option<&[u8]>) -> Result<Replayed, WorkLogError> {
    let unchanged = |work, log, log_generation| Replayed {
        work,
        log,
        log_generation,
        torn_tail: false,
    };
    let Some(log) = log.filter(|log| !log.is_empty()) else {
        return Ok(unchanged(snapshot, LogState::Missing, None));
    };
    let corrupt = |line: usize| {
        move |source| WorkLogError::CorruptLine {
            key: LOG_KEY.to_string(),
            line,
            source,
        }
    };
    // What follows the last newline is a line cut short (nothing, for a whole log).
    let complete = log.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let tail_len = log.len() - complete;
    let mut lines = log[..complete].split(|&b| b == b'\n');
    let header = match lines.next().filter(|line| !line.is_empty()) {
        Some(line) => serde_json::from_slice::<LogHeader>(line).map_err(corrupt(1))?,
        // Only a header cut short (it is written whole, by a replace): no log.
        None => return Ok(unchanged(snapshot, LogState::Missing, None)),
    };
    if header.work_log != snapshot.log_generation {
        let state = if header.work_log < snapshot.log_generation {
            LogState::Stale
        } else {
            LogState::Newer
        };
        return Ok(unchanged(snapshot, state, Some(header.work_log)));
    }
    let mut entries = Entries::from(snapshot.active_tasks);
    let mut updated_at = snapshot.updated_at;
    for (index, line) in lines.enumerate().filter(|(_, line)| !line.is_empty()) {
        let record: LogRecord = serde_json::from_slice(line).map_err(corrupt(index + 2))?;
        for entry in record.put {
            entries.put(entry);
        }
        for id in &record.remove {
            entries.remove(id);
        }
        updated_at = record.at;
    }
    Ok(Replayed {
        work: CurrentWork {
            version: snapshot.version,
            updated_at,
            log_generation: snapshot.log_generation,
            active_tasks: entries.into_vec(),
        },
        log: LogState::Applied,
        log_generation: Some(header.work_log),
        torn_tail: tail_len > 0,
    })
}

/// Entries in the order they were first put, replaced and removed by id in constant time.
struct Entries {
    slots: Vec<Option<ActiveTask>>,
    index: HashMap<TaskId, usize>,
}

impl From<Vec<ActiveTask>> for Entries {
    fn from(tasks: Vec<ActiveTask>) -> Self {
        let mut entries = Entries {
            slots: Vec::with_capacity(tasks.len()),
            index: HashMap::with_capacity(tasks.len()),
        };
        for task in tasks {
            entries.put(task);
        }
        entries
    }
}

impl Entries {
    fn put(&mut self, task: ActiveTask) {
        match self.index.get(&task.task_id) {
            Some(&slot) => self.slots[slot] = Some(task),
            None => {
                self.index.insert(task.task_id.clone(), self.slots.len());
                self.slots.push(Some(task));
            }
        }
    }

    fn remove(&mut self, id: &TaskId) {
        if let Some(slot) = self.index.remove(id) {
            self.slots[slot] = None;
        }
    }

    fn into_vec(self) -> Vec<ActiveTask> {
        self.slots.into_iter().flatten().collect()
    }
}

fn timestamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// A snapshot holding `entries` (each one entry's JSON), one entry per line.
fn encode_snapshot<'a>(
    generation: u64,
    at: DateTime<Utc>,
    entries: impl ExactSizeIterator<Item = &'a String>,
) -> Vec<u8> {
    let mut out = format!(
        "{{\n  \"version\": {CURRENT_WORK_VERSION},\n  \"updated_at\": \"{}\",\n  \"log_generation\": {generation},\n  \"active_tasks\": [",
        timestamp(at)
    )
    .into_bytes();
    let count = entries.len();
    for (i, entry) in entries.enumerate() {
        out.extend_from_slice(b"\n    ");
        out.extend_from_slice(entry.as_bytes());
        if i + 1 < count {
            out.push(b',');
        }
    }
    out.extend_from_slice(if count == 0 { b"]\n}\n" } else { b"\n  ]\n}\n" });
    out
}

/// One write's line: the entries put (each one entry's JSON) and the ids removed.
fn encode_record(at: DateTime<Utc>, put: &[&String], remove: &[TaskId]) -> Vec<u8> {
    let mut out = format!("{{\"at\":\"{}\",\"put\":[", timestamp(at)).into_bytes();
    for (i, entry) in put.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(entry.as_bytes());
    }
    out.extend_from_slice(b"],\"remove\":");
    // Task ids are plain strings; serializing them cannot fail.
    out.extend_from_slice(&serde_json::to_vec(remove).unwrap_or_else(|_| b"[]".to_vec()));
    out.extend_from_slice(b"}\n");
    out
}

/// Why a write of the work state failed: the storage, or an entry that cannot be encoded.
#[derive(Debug, thiserror::Error)]
pub enum WorkWriteError {
    #[error("writing {key}: {source}")]
    Io {
        key: &'static str,
        source: io::Error,
    },
    #[error("encoding the work state entry of {task_id}: {source}")]
    Encode {
        task_id: TaskId,
        source: serde_json::Error,
    },
}

/// The one writer of a queue's work state (see the module docs). Blocking.
#[derive(Debug, Clone)]
pub struct WorkLog {
    storage: Arc<dyn Storage>,
    compact_at: usize,
    state: Arc<Mutex<WriterState>>,
}

#[derive(Debug)]
struct WriterState {
    /// Every entry in flight, encoded, by id: what a compaction writes.
    entries: BTreeMap<TaskId, String>,
    /// The generation of the snapshot on disk (0 before the first compaction).
    generation: u64,
    snapshot_bytes: usize,
    log_bytes: usize,
    /// The next write compacts instead of appending: the first of a process, and any after
    /// a failed append (whose tail may be torn; nothing may follow it).
    compact_next: bool,
}

impl WorkLog {
    /// The writer of the work state in `storage`; [`load`](WorkLog::load) it before writing.
    pub fn new(storage: Arc<dyn Storage>) -> WorkLog {
        WorkLog {
            storage,
            compact_at: DEFAULT_COMPACT_AT,
            state: Arc::new(Mutex::new(WriterState {
                entries: BTreeMap::new(),
                generation: 0,
                snapshot_bytes: 0,
                log_bytes: 0,
                compact_next: true,
            })),
        }
    }

    /// Compact once the log exceeds `bytes` (and the snapshot's size); tests make it small.
    pub fn compact_at(mut self, bytes: usize) -> WorkLog {
        self.compact_at = bytes;
        self
    }

    fn lock(&self) -> MutexGuard<'_, WriterState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Read the work state (empty for a new queue) and take it as what is on disk.
    pub fn load(&self) -> Result<CurrentWork, WorkLogError> {
        let replayed = read(|key| self.storage.get(key))?;
        // The next snapshot goes above both files' generations, so that no log left on disk
        // (one newer than a snapshot restored by hand) can ever follow it.
        let generation = replayed
            .work
            .log_generation
            .max(replayed.log_generation.unwrap_or(0));
        if replayed.torn_tail {
            tracing::warn!("the work log ends in a write cut short by a crash; it is ignored");
        }
        let mut entries = BTreeMap::new();
        for entry in &replayed.work.active_tasks {
            let encoded = encode_entry(entry).map_err(|source| WorkLogError::Corrupt {
                key: format!("the entry of {}", entry.task_id),
                source,
            })?;
            entries.insert(entry.task_id.clone(), encoded);
        }
        let mut state = self.lock();
        state.entries = entries;
        state.generation = generation;
        state.compact_next = true;
        Ok(replayed.work)
    }

    /// Durably write the entries that changed and remove those that left: atomic as a whole
    /// (a reader, and a restart after a crash, sees all of it or none) and durable when `Ok`.
    /// On error, what is on disk is the state before this write or after it, and the next
    /// write rewrites everything.
    pub fn write(&self, changed: &[ActiveTask], removed: &[TaskId]) -> Result<(), WorkWriteError> {
        let mut state = self.lock();
        let mut put = Vec::with_capacity(changed.len());
        for entry in changed {
            let encoded = encode_entry(entry).map_err(|source| WorkWriteError::Encode {
                task_id: entry.task_id.clone(),
                source,
            })?;
            state.entries.insert(entry.task_id.clone(), encoded);
            put.push(entry.task_id.clone());
        }
        for id in removed {
            state.entries.remove(id);
        }
        let at = Utc::now();
        let grown = state.log_bytes > self.compact_at.max(state.snapshot_bytes);
        let idle = state.entries.is_empty() && state.log_bytes > header(state.generation).len();
        if state.compact_next || grown || idle {
            return self.compact(&mut state, at);
        }
        let lines: Vec<&String> = put.iter().filter_map(|id| state.entries.get(id)).collect();
        let record = encode_record(at, &lines, removed);
        if let Err(source) = self.storage.append(LOG_KEY, &record) {
            state.compact_next = true;
            return Err(WorkWriteError::Io {
                key: LOG_KEY,
                source,
            });
        }
        state.log_bytes += record.len();
        Ok(())
    }

    /// Write every entry as the next snapshot, then start its log.
    fn compact(&self, state: &mut WriterState, at: DateTime<Utc>) -> Result<(), WorkWriteError> {
        state.compact_next = true;
        let generation = state.generation + 1;
        let snapshot = encode_snapshot(generation, at, state.entries.values());
        self.storage
            .put(SNAPSHOT_KEY, &snapshot, None)
            .map_err(|source| WorkWriteError::Io {
                key: SNAPSHOT_KEY,
                source,
            })?;
        state.generation = generation;
        state.snapshot_bytes = snapshot.len();
        // The state is durable now; a log left at an older generation is ignored by readers,
        // so a failure here only means the next write compacts again.
        let header = header(generation);
        match self.storage.put(LOG_KEY, &header, None) {
            Ok(()) => {
                state.log_bytes = header.len();
                state.compact_next = false;
            }
            Err(error) => {
                tracing::warn!(%error, "could not start a new work log; the next write compacts again");
            }
        }
        Ok(())
    }
}

/// A log's first line.
fn header(generation: u64) -> Vec<u8> {
    format!("{{\"work_log\":{generation}}}\n").into_bytes()
}

fn encode_entry(entry: &ActiveTask) -> serde_json::Result<String> {
    serde_json::to_string(entry)
}

#[cfg(test)]
#[path = "work_log_tests.rs"]
mod tests;
