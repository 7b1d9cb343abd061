//! The commit log: one durability barrier per checkpoint instead of two.
//!
//! The atomic replace needs two barriers (fsync the file, then its directory). With the log,
//! a write into the covered directory (`incremental/`) goes:
//!
//! 1. write the new bytes to a temp file (no fsync);
//! 2. append a record of the write (target, the name the previous object is kept under, the
//!    object it retires, the bytes) to `<dir>/.commit-log`;
//! 3. `fdatasync` the log, group-committed: one sync covers every record appended before it;
//! 4. link the kept copy and rename the temp file into place (no directory fsync).
//!
//! The write is acknowledged after step 4, so a reader sees it then; it survives a power cut
//! because the log holds its bytes. On open, the log is replayed before anything else touches
//! the directory: the records are applied in order to a map of key → bytes (or removed), each
//! file whose bytes differ is rewritten, everything is made durable with one `syncfs`, and the
//! log is cut to zero. The log is checkpointed the same way (`syncfs`, cut) when it grows past
//! its limit or past the room left on its file system, so it stays small and a replay stays
//! short, and cut and removed when the store is closed. A replay that fails leaves the log
//! whole (the open fails): it is removed only once its contents are durable in the files.
//!
//! Records carry their length and a CRC-32, so a torn tail (a power cut mid-append) is
//! recognised and dropped: only records whose sync had not finished can be torn, and none of
//! them was acknowledged.
//!
//! Why a record may name a key's previous content in a "pre-image" record: a save keeps the
//! previous object under a second name (a hard link), and replay must rebuild that copy too.
//! When the log has no record of the target since its last cut, its current bytes (durable
//! since the cut's `syncfs`) are logged first, in the same sync.
//!
//! Any failure after a record was appended (a failed sync, link or rename) leaves a record of
//! a write that did not happen; the log is then marked dirty and the next write checkpoints it
//! first (`syncfs` and cut), so such a record is never replayed over a later write.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard};

use nix::fcntl::{Flock, FlockArg};

use super::file_ops::FileOps;
use super::group_commit::GroupCommit;

/// The log's file name inside the directory it covers (hidden: listings skip it).
pub(crate) const LOG_NAME: &str = ".commit-log";

/// The log size past which it is checkpointed and cut.
const DEFAULT_LIMIT: u64 = 32 << 20;

/// How much the log grows between two looks at the room left on its file system.
const ROOM_CHECK_STEP: u64 = 64 << 10;

/// Record kinds (the first payload byte); 0 is never valid, so zeroed blocks end the log.
const KIND_PUT: u8 = 1;
const KIND_REMOVE: u8 = 2;

/// The largest payload a record may claim; anything larger is a torn or foreign header.
const MAX_PAYLOAD: u32 = 1 << 30;

/// One logged write, as replay applies it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Record<'a> {
    /// `key` now holds `bytes`; before that, the previous object of `key` became `keep` (if
    /// given) and `retire` was removed (if given).
    Put {
        key: &'a str,
        keep: Option<&'a str>,
        retire: Option<&'a str>,
        bytes: &'a [u8],
    },
    /// `key` was removed.
    Remove { key: &'a str },
}

impl<'a> Record<'a> {
    /// The record as it is appended: length, CRC-32 of the payload, payload.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let (mut out, bytes) = self.encode_parts();
        out.extend_from_slice(bytes);
        out
    }

    /// The record in two parts, appended one after the other: its head (length, CRC-32 of
    /// the payload, the payload up to the bytes) and the file's bytes, borrowed, so a large
    /// checkpoint is not copied to be logged.
    pub(crate) fn encode_parts(&self) -> (Vec<u8>, &'a [u8]) {
        let mut head = vec![0; 8];
        let bytes: &'a [u8] = match *self {
            Record::Put {
                key,
                keep,
                retire,
                bytes,
            } => {
                head.push(KIND_PUT);
                for name in [Some(key), keep, retire] {
                    put_name(&mut head, name.unwrap_or(""));
                }
                bytes
            }
            Record::Remove { key } => {
                head.push(KIND_REMOVE);
                put_name(&mut head, key);
                &[]
            }
        };
        let mut crc = crc32fast::Hasher::new();
        crc.update(&head[8..]);
        crc.update(bytes);
        let len = (head.len() - 8 + bytes.len()) as u32;
        head[..4].copy_from_slice(&len.to_le_bytes());
        head[4..8].copy_from_slice(&crc.finalize().to_le_bytes());
        (head, bytes)
    }
}

/// A name as a 2-byte length and its bytes (keys are short paths).
fn put_name(out: &mut Vec<u8>, name: &str) {
    out.extend_from_slice(&(name.len() as u16).to_le_bytes());
    out.extend_from_slice(name.as_bytes());
}

/// The records of a log's bytes, in order, up to the first that is torn or damaged.
pub(crate) fn decode_records(mut log: &[u8]) -> Vec<Record<'_>> {
    let mut records = Vec::new();
    while let Some((record, rest)) = decode_one(log) {
        records.push(record);
        log = rest;
    }
    records
}

/// The first record of `log` and what follows it; `None` at the end or at a bad record.
fn decode_one(log: &[u8]) -> Option<(Record<'_>, &[u8])> {
    let len = u32::from_le_bytes(log.get(..4)?.try_into().ok()?);
    let crc = u32::from_le_bytes(log.get(4..8)?.try_into().ok()?);
    if len == 0 || len > MAX_PAYLOAD {
        return None;
    }
    let payload = log.get(8..8 + len as usize)?;
    if crc32fast::hash(payload) != crc {
        return None;
    }
    let rest = &log[8 + len as usize..];
    let (&kind, body) = payload.split_first()?;
    let record = match kind {
        KIND_PUT => {
            let (key, body) = take_name(body)?;
            let (keep, body) = take_name(body)?;
            let (retire, bytes) = take_name(body)?;
            Record::Put {
                key: (!key.is_empty()).then_some(key)?,
                keep: (!keep.is_empty()).then_some(keep),
                retire: (!retire.is_empty()).then_some(retire),
                bytes,
            }
        }
        KIND_REMOVE => {
            let (key, _) = take_name(body)?;
            Record::Remove {
                key: (!key.is_empty()).then_some(key)?,
            }
        }
        _ => return None,
    };
    Some((record, rest))
}

/// A name written by [`put_name`], and what follows it.
fn take_name(bytes: &[u8]) -> Option<(&str, &[u8])> {
    let len = u16::from_le_bytes(bytes.get(..2)?.try_into().ok()?) as usize;
    let name = std::str::from_utf8(bytes.get(2..2 + len)?).ok()?;
    Some((name, &bytes[2 + len..]))
}

/// What a key holds after the records are applied in order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Replayed<'a> {
    Bytes(&'a [u8]),
    Removed,
}

/// Apply `records` in order, as the writes they log did: the end state of every key they
/// touch. A kept copy of a key the log has no bytes for is left as the disk has it.
pub(crate) fn replay<'a>(records: &[Record<'a>]) -> HashMap<&'a str, Replayed<'a>> {
    let mut state: HashMap<&str, Replayed> = HashMap::new();
    for record in records {
        match *record {
            Record::Put {
                key,
                keep,
                retire,
                bytes,
            } => {
                if let Some(retire) = retire {
                    state.insert(retire, Replayed::Removed);
                }
                if let Some(keep) = keep {
                    if let Some(Replayed::Bytes(previous)) = state.get(key).cloned() {
                        state.insert(keep, Replayed::Bytes(previous));
                    }
                }
                state.insert(key, Replayed::Bytes(bytes));
            }
            Record::Remove { key } => {
                state.insert(key, Replayed::Removed);
            }
        }
    }
    state
}

/// The end of the log and what it knows, guarded together.
#[derive(Debug, Default)]
struct Tail {
    /// The log's length: where the next record goes.
    len: u64,
    /// Keys with a record since the last cut (replay knows their content).
    logged: HashSet<String>,
    /// A record of a write that did not happen may be in the log: checkpoint before the next
    /// write.
    dirty: bool,
    /// The length at which the room left on the file system was last looked at.
    room_checked_at: u64,
}

/// A directory's commit log, held open (and `flock`ed) while a store uses it.
#[derive(Debug)]
pub(crate) struct CommitLog {
    /// The directory whose files it covers.
    dir: PathBuf,
    /// The open log, locked so that no other process writes the directory through a log.
    file: Flock<File>,
    ops: Arc<dyn FileOps>,
    tail: Mutex<Tail>,
    /// One `fdatasync` covers every record appended before it started.
    commit: GroupCommit,
    /// Held shared by a write from its append to its rename, exclusively by a checkpoint, so
    /// a cut never drops the record of a write still being renamed into place.
    gate: RwLock<()>,
    /// Checkpoint when the log grows past this.
    limit: u64,
    /// Whether what the log held when it was opened was replayed and made durable. Until
    /// then the log holds checkpoints the files may not: it is never cut or removed.
    replayed: bool,
}

/// A write in progress through the log: holds the gate until it is renamed into place.
pub(crate) struct LoggedWrite<'a> {
    log: &'a CommitLog,
    _gate: RwLockReadGuard<'a, ()>,
    done: bool,
}

impl LoggedWrite<'_> {
    /// The write is in place: the log may be checkpointed past it.
    pub(crate) fn finish(mut self) {
        self.done = true;
    }
}

impl Drop for LoggedWrite<'_> {
    /// A write abandoned after its record was appended: the record must never be replayed.
    fn drop(&mut self) {
        if !self.done {
            self.log.lock_tail().dirty = true;
        }
    }
}

impl CommitLog {
    /// Open the log of `dir` (creating it durably if missing), take its lock, replay what it
    /// holds with `restore` and cut it. `restore(key, replayed)` makes the file at `key` (a
    /// path relative to `dir`'s parent) hold what the log says, without fsync: a `syncfs`
    /// follows.
    pub(crate) fn open(
        dir: &Path,
        ops: Arc<dyn FileOps>,
        restore: impl FnMut(&str, Replayed<'_>) -> io::Result<()>,
    ) -> io::Result<CommitLog> {
        let path = dir.join(LOG_NAME);
        let mut existed = path.exists();
        let file = match ops.open_log(&path) {
            // An empty log another user left (a queue handed over with `chown`) holds nothing
            // to replay: make a new one of our own.
            Err(err)
                if err.kind() == io::ErrorKind::PermissionDenied
                    && std::fs::metadata(&path).is_ok_and(|meta| meta.len() == 0) =>
            {
                ops.remove_file(&path)?;
                existed = false;
                ops.open_log(&path)?
            }
            other => other?,
        };
        let file = Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| {
            if errno == nix::errno::Errno::EWOULDBLOCK {
                io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!(
                        "{} is in use by another process writing these checkpoints",
                        path.display()
                    ),
                )
            } else {
                io::Error::from(errno)
            }
        })?;
        if !existed {
            ops.sync_dir(dir)?;
        }
        let mut log = CommitLog {
            dir: dir.to_path_buf(),
            file,
            ops,
            tail: Mutex::default(),
            commit: GroupCommit::default(),
            gate: RwLock::new(()),
            limit: DEFAULT_LIMIT,
            replayed: false,
        };
        // On failure the log is dropped unreplayed, which leaves it as it is: the next open
        // replays it again (a failed replay changed nothing the log cannot redo).
        log.replay_and_cut(restore).map_err(|err| {
            io::Error::new(
                err.kind(),
                format!(
                    "cannot replay the commit log {} (it is kept, to be replayed at the next \
                     start: it may hold the only durable copy of recent checkpoints): {err}",
                    path.display()
                ),
            )
        })?;
        log.replayed = true;
        Ok(log)
    }

    /// The directory it covers.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// A log checkpointed once it holds more than `limit` bytes (tests make it small).
    #[cfg(any(test, feature = "test-doubles"))]
    pub(crate) fn with_limit(mut self, limit: u64) -> Self {
        self.limit = limit;
        self
    }

    /// Apply the log's records and cut it.
    fn replay_and_cut(
        &self,
        mut restore: impl FnMut(&str, Replayed<'_>) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut bytes = Vec::new();
        (&*self.file).read_to_end(&mut bytes)?;
        if bytes.is_empty() {
            return Ok(());
        }
        let records = decode_records(&bytes);
        let state = replay(&records);
        let mut keys: Vec<_> = state.into_iter().collect();
        // Removals first, so a rewritten file never shares a name with one going away.
        keys.sort_by_key(|(key, replayed)| (*replayed != Replayed::Removed, *key));
        for (key, replayed) in keys {
            restore(key, replayed)?;
        }
        self.cut()
    }

    /// Make everything the log covers durable, then cut the log to nothing.
    fn cut(&self) -> io::Result<()> {
        self.ops.sync_fs(&self.dir)?;
        self.ops.truncate_log(&self.file, 0)?;
        self.ops.sync_log(&self.file)?;
        *self.lock_tail() = Tail::default();
        Ok(())
    }

    /// Log a write and make the record durable. `current` reads the key's present bytes, for
    /// the pre-image a kept copy needs when the log has no record of the key since its cut.
    /// The returned guard must be [`finish`](LoggedWrite::finish)ed once the write is in
    /// place; dropping it unfinished marks the log for a checkpoint.
    pub(crate) fn commit(
        &self,
        record: &Record<'_>,
        current: impl FnOnce() -> io::Result<Option<Vec<u8>>>,
    ) -> io::Result<LoggedWrite<'_>> {
        self.checkpoint_if_dirty()?;
        let gate = self.gate.read().unwrap_or_else(PoisonError::into_inner);
        let write = LoggedWrite {
            log: self,
            _gate: gate,
            done: false,
        };
        let (key, needs_pre_image) = match record {
            Record::Put { key, keep, .. } => (*key, keep.is_some()),
            Record::Remove { key } => (*key, false),
        };
        let pre_image = if needs_pre_image && !self.lock_tail().logged.contains(key) {
            current()?
        } else {
            None
        };
        let pre_image = pre_image.as_deref().map(|bytes| {
            Record::Put {
                key,
                keep: None,
                retire: None,
                bytes,
            }
            .encode_parts()
        });
        let (head, bytes) = record.encode_parts();
        let mut parts: Vec<&[u8]> = Vec::with_capacity(4);
        if let Some((pre_head, pre_bytes)) = &pre_image {
            parts.extend([pre_head.as_slice(), pre_bytes]);
        }
        parts.extend([head.as_slice(), bytes]);
        self.append(&parts, key)?;
        self.commit.barrier(|| self.ops.sync_log(&self.file))?;
        Ok(write)
    }

    /// Log a removal without waiting for it to be durable (a removal is not made durable on
    /// its own in either path): the next synced record covers it.
    pub(crate) fn log_removal(&self, key: &str) -> io::Result<LoggedWrite<'_>> {
        self.checkpoint_if_dirty()?;
        let gate = self.gate.read().unwrap_or_else(PoisonError::into_inner);
        let write = LoggedWrite {
            log: self,
            _gate: gate,
            done: false,
        };
        self.append(&[&Record::Remove { key }.encode()], key)?;
        Ok(write)
    }

    /// Append the concatenation of `parts` at the end; on failure, cut back what may have been
    /// written, so no torn record sits before later ones.
    fn append(&self, parts: &[&[u8]], key: &str) -> io::Result<()> {
        let mut tail = self.lock_tail();
        if let Err(err) = self.ops.append_log_parts(&self.file, tail.len, parts) {
            if self.ops.truncate_log(&self.file, tail.len).is_err() {
                tail.dirty = true;
            }
            return Err(err);
        }
        tail.len += parts.iter().map(|part| part.len() as u64).sum::<u64>();
        tail.logged.insert(key.to_owned());
        Ok(())
    }

    /// Checkpoint if the log has grown past its limit, or holds more than the room left on
    /// its file system (so that on a small disk it takes at most about half of what the
    /// queue's other writes could use). Errors are logged: the write that triggered it is
    /// committed, and the next write retries.
    pub(crate) fn checkpoint_if_full(&self) {
        let crowded = self.crowds_its_disk();
        if self.lock_tail().len <= self.limit && !crowded {
            return;
        }
        let _gate = self.gate.write().unwrap_or_else(PoisonError::into_inner);
        let len = self.lock_tail().len;
        if len == 0 || (len <= self.limit && !crowded) {
            return;
        }
        if let Err(err) = self.cut() {
            tracing::warn!(
                log = %self.dir.join(LOG_NAME).display(),
                error = %err,
                "could not checkpoint the commit log; the next checkpoint write retries"
            );
            self.lock_tail().dirty = true;
        }
    }

    /// Make everything the log covers durable and cut it now (a save that found no room for
    /// its record frees the log's space this way). On failure the next write retries.
    pub(crate) fn checkpoint(&self) -> io::Result<()> {
        let _gate = self.gate.write().unwrap_or_else(PoisonError::into_inner);
        self.cut().inspect_err(|_| self.lock_tail().dirty = true)
    }

    /// Whether the log holds more than the room left on its file system; looked at each
    /// time it has grown by [`ROOM_CHECK_STEP`].
    fn crowds_its_disk(&self) -> bool {
        let len = {
            let mut tail = self.lock_tail();
            if tail.len < tail.room_checked_at + ROOM_CHECK_STEP {
                return false;
            }
            tail.room_checked_at = tail.len;
            tail.len
        };
        match nix::sys::statvfs::fstatvfs(&*self.file) {
            Ok(stat) => {
                let room = stat.blocks_available().saturating_mul(stat.fragment_size());
                len > room
            }
            Err(_) => false,
        }
    }

    /// Whether the log holds any record.
    pub(crate) fn holds_records(&self) -> bool {
        self.lock_tail().len > 0
    }

    /// Before a write: if a record of a write that did not happen may be in the log, make
    /// the disk durable as it is and cut the log.
    fn checkpoint_if_dirty(&self) -> io::Result<()> {
        if !self.lock_tail().dirty {
            return Ok(());
        }
        let _gate = self.gate.write().unwrap_or_else(PoisonError::into_inner);
        if self.lock_tail().dirty {
            self.cut()?;
        }
        Ok(())
    }

    fn lock_tail(&self) -> MutexGuard<'_, Tail> {
        self.tail.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for CommitLog {
    /// A store closed cleanly leaves no log (cut, then removed), so that nothing is replayed
    /// over writes made later without it, and the next owner of the directory (another user,
    /// after a `chown` of the queue) creates its own. A log whose replay failed is left
    /// whole: it may hold the only copy of acknowledged checkpoints.
    fn drop(&mut self) {
        if !self.replayed {
            return;
        }
        let _gate = self.gate.write().unwrap_or_else(PoisonError::into_inner);
        let tail = self.lock_tail();
        let empty = tail.len == 0 && !tail.dirty;
        drop(tail);
        let path = self.dir.join(LOG_NAME);
        let closed = if empty { Ok(()) } else { self.cut() };
        // An empty log and no log mean the same to a replay, so the removal needs no sync.
        if let Err(err) = closed.and_then(|()| self.ops.remove_file(&path)) {
            tracing::debug!(
                log = %path.display(),
                error = %err,
                "could not cut and remove the commit log on close; the next open replays it"
            );
        }
    }
}

#[cfg(test)]
impl<'a> Record<'a> {
    /// A put that retires nothing (unit tests).
    pub(crate) fn put(key: &'a str, keep: Option<&'a str>, bytes: &'a [u8]) -> Record<'a> {
        Record::Put {
            key,
            keep,
            retire: None,
            bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{decode_records, replay, Record, Replayed};

    #[test]
    fn records_round_trip_and_a_torn_or_damaged_tail_is_dropped() {
        let records = vec![
            Record::put("d/a", None, b"one"),
            Record::Put {
                key: "d/a",
                keep: Some("d/a.1"),
                retire: Some("d/a.0"),
                bytes: b"",
            },
            Record::Remove { key: "d/b" },
        ];
        let log: Vec<u8> = records.iter().flat_map(Record::encode).collect();
        assert_eq!(decode_records(&log), records);
        for cut in 0..log.len() {
            let decoded = decode_records(&log[..cut]);
            assert!(decoded.len() < records.len(), "cut at {cut}");
            assert_eq!(decoded[..], records[..decoded.len()], "cut at {cut}");
        }
        let mut damaged = log.clone();
        let last = damaged.len() - 2;
        damaged[last] ^= 1;
        assert_eq!(decode_records(&damaged), records[..2]);
        // Zeroed blocks (a size made durable before the data) end the log.
        let mut zeroed = log.clone();
        zeroed.extend_from_slice(&[0; 64]);
        assert_eq!(decode_records(&zeroed), records);
    }

    #[test]
    fn replay_rebuilds_kept_copies_and_removals_in_order() {
        let records = vec![
            Record::put("d/t", None, b"g1"),
            Record::put("d/t", Some("d/t.1"), b"g2"),
            Record::Put {
                key: "d/t",
                keep: Some("d/t.2"),
                retire: Some("d/t.1"),
                bytes: b"g3",
            },
            Record::put("d/u", Some("d/u.4"), b"u5"),
            Record::Remove { key: "d/v" },
        ];
        let state = replay(&records);
        assert_eq!(state["d/t"], Replayed::Bytes(b"g3"));
        assert_eq!(state["d/t.2"], Replayed::Bytes(b"g2"));
        assert_eq!(state["d/t.1"], Replayed::Removed);
        assert_eq!(state["d/u"], Replayed::Bytes(b"u5"));
        // The log never had u's previous bytes: its kept copy is left as the disk has it.
        assert!(!state.contains_key("d/u.4"));
        assert_eq!(state["d/v"], Replayed::Removed);
    }
}
