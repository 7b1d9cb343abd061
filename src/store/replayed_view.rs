//! A reader's view of a directory's files with what its commit log would restore laid over
//! them.
//!
//! A checkpoint saved through the commit log is durable in the log before it is durable as a
//! file (see `commit_log`). After a power cut, the file may be missing, empty or older until
//! the next daemon replays the log, which it does before anything resumes. A reader that comes
//! first (`cairn checkpoint`, `history`, `fork`, `show`) reads through this view, so it sees
//! what the daemon will resume from, not what the disk happened to keep.
//!
//! Only for a log no process writes through: a live writer's log holds records of saves still in
//! flight, which must not be shown. Once the log changes (a daemon started and replayed it, or
//! writes through it now), the view reads the files alone from then on.

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use super::commit_log::{decode_records, replay, Replayed, LOG_NAME};
use super::{FileStorage, Storage};

/// Which log the overlay was read from: its inode and length then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LogIdentity {
    inode: u64,
    len: u64,
}

impl LogIdentity {
    fn of(path: &std::path::Path) -> Option<LogIdentity> {
        let meta = std::fs::metadata(path).ok()?;
        Some(LogIdentity {
            inode: meta.ino(),
            len: meta.len(),
        })
    }
}

/// [`Storage`] for reading only: `files`, with the end state of every key the log of one
/// directory names laid over them (its bytes, or its absence).
#[derive(Debug)]
pub struct ReplayedView {
    files: FileStorage,
    log: PathBuf,
    read_from: LogIdentity,
    /// Key → bytes, or `None` for a key the log removed.
    overlay: HashMap<String, Option<Vec<u8>>>,
    /// Set once the log is no longer the one read: the overlay is then ignored.
    stale: AtomicBool,
}

impl ReplayedView {
    /// `files` seen through the commit log of `dir` (a key relative to their root, such as
    /// `incremental`), or `None` when that log is missing, empty or holds no whole record, or
    /// when `written` says that a process writes through it. `written` is asked only about a
    /// log that holds something (a queue at rest has none), so its cost is not paid by every
    /// reader.
    pub fn open(
        files: FileStorage,
        dir: &str,
        written: impl FnOnce() -> bool,
    ) -> io::Result<Option<ReplayedView>> {
        let log = files.root().join(dir).join(LOG_NAME);
        let Some(read_from) = LogIdentity::of(&log).filter(|id| id.len > 0) else {
            return Ok(None);
        };
        if written() {
            return Ok(None);
        }
        let bytes = match std::fs::read(&log) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let records = decode_records(&bytes);
        let overlay: HashMap<String, Option<Vec<u8>>> = replay(&records)
            .into_iter()
            .map(|(key, state)| {
                let bytes = match state {
                    Replayed::Bytes(bytes) => Some(bytes.to_vec()),
                    Replayed::Removed => None,
                };
                (key.to_string(), bytes)
            })
            .collect();
        if overlay.is_empty() {
            return Ok(None);
        }
        Ok(Some(ReplayedView {
            files,
            log,
            read_from,
            overlay,
            stale: AtomicBool::new(false),
        }))
    }

    /// The overlay, while the log is still the one it was read from.
    fn overlay(&self) -> Option<&HashMap<String, Option<Vec<u8>>>> {
        if self.stale.load(Ordering::Relaxed) {
            return None;
        }
        if LogIdentity::of(&self.log) != Some(self.read_from) {
            self.stale.store(true, Ordering::Relaxed);
            return None;
        }
        Some(&self.overlay)
    }
}

/// A view is for reading: what writes through it would not be what the log replays.
fn read_only() -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        "this view of the checkpoint files is for reading only",
    )
}

impl Storage for ReplayedView {
    fn put(&self, _key: &str, _bytes: &[u8], _keep_previous_as: Option<&str>) -> io::Result<()> {
        Err(read_only())
    }

    fn get(&self, key: &str) -> io::Result<Option<Vec<u8>>> {
        match self.overlay().and_then(|overlay| overlay.get(key)) {
            Some(logged) => Ok(logged.clone()),
            None => self.files.get(key),
        }
    }

    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        let mut names = self.files.list(dir)?;
        let Some(overlay) = self.overlay() else {
            return Ok(names);
        };
        for (key, bytes) in overlay {
            let Some(name) = key
                .strip_prefix(dir)
                .and_then(|rest| rest.strip_prefix('/'))
                .filter(|name| !name.contains('/'))
            else {
                continue;
            };
            match bytes {
                Some(_) if !names.iter().any(|n| n == name) => names.push(name.to_string()),
                Some(_) => {}
                None => names.retain(|n| n != name),
            }
        }
        names.sort();
        Ok(names)
    }

    fn remove(&self, _key: &str) -> io::Result<()> {
        Err(read_only())
    }

    fn remove_temp_files(&self) -> io::Result<Vec<String>> {
        Err(read_only())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::commit_log::Record;

    fn write_log(root: &std::path::Path, records: &[Record<'_>]) {
        let bytes: Vec<u8> = records.iter().flat_map(Record::encode).collect();
        std::fs::write(root.join("d").join(LOG_NAME), bytes).unwrap();
    }

    #[test]
    fn the_logged_end_state_is_read_over_the_files_until_the_log_changes() {
        let root = tempfile::tempdir().unwrap();
        let files = FileStorage::new(root.path());
        std::fs::create_dir(root.path().join("d")).unwrap();
        // What a power cut left: the latest file holds the older save, another file is gone.
        std::fs::write(root.path().join("d/t"), b"g1").unwrap();
        std::fs::write(root.path().join("d/gone"), b"x").unwrap();
        write_log(
            root.path(),
            &[
                Record::put("d/t", None, b"g1"),
                Record::put("d/t", Some("d/t.1"), b"g2"),
                Record::Remove { key: "d/gone" },
            ],
        );
        let in_use = ReplayedView::open(files.clone(), "d", || true).unwrap();
        assert!(
            in_use.is_none(),
            "a log a process writes through is not read"
        );
        let view = ReplayedView::open(files.clone(), "d", || false)
            .unwrap()
            .unwrap();
        assert_eq!(view.get("d/t").unwrap().as_deref(), Some(&b"g2"[..]));
        assert_eq!(view.get("d/t.1").unwrap().as_deref(), Some(&b"g1"[..]));
        assert_eq!(view.get("d/gone").unwrap(), None);
        assert_eq!(view.list("d").unwrap(), ["t", "t.1"]);
        assert!(view.put("d/t", b"g3", None).is_err());

        // A daemon replayed and cut the log: the files are the truth again.
        std::fs::write(root.path().join("d").join(LOG_NAME), b"").unwrap();
        assert_eq!(view.get("d/t").unwrap().as_deref(), Some(&b"g1"[..]));
        assert_eq!(view.list("d").unwrap(), ["gone", "t"]);
    }

    #[test]
    fn a_missing_empty_or_torn_log_gives_no_view() {
        let root = tempfile::tempdir().unwrap();
        let files = FileStorage::new(root.path());
        std::fs::create_dir(root.path().join("d")).unwrap();
        let unused = || false;
        assert!(ReplayedView::open(files.clone(), "d", unused)
            .unwrap()
            .is_none());
        write_log(root.path(), &[]);
        assert!(ReplayedView::open(files.clone(), "d", unused)
            .unwrap()
            .is_none());
        let mut torn = Record::put("d/t", None, b"g1").encode();
        torn.truncate(torn.len() - 1);
        std::fs::write(root.path().join("d").join(LOG_NAME), torn).unwrap();
        assert!(ReplayedView::open(files, "d", unused).unwrap().is_none());
    }
}
