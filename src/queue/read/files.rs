//! Small, read-only helpers over a queue's directories.

use std::fs;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

use chrono::{DateTime, Utc};

use crate::safe_fs::{list_names, open_no_follow};
use crate::store::journal::JournalEvent;

/// The stems of `dir/*.json`, dot-files left out, sorted.
pub(crate) fn json_stems(dir: &Path) -> Vec<String> {
    let mut stems: Vec<String> = list_names(dir)
        .into_iter()
        .filter(|name| !name.starts_with('.'))
        .filter_map(|name| name.strip_suffix(".json").map(str::to_string))
        .collect();
    stems.sort();
    stems
}

/// A file's modification time (of a link itself, not its target).
pub(crate) fn mtime(path: &Path) -> Option<DateTime<Utc>> {
    fs::symlink_metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .map(DateTime::<Utc>::from)
}

/// The latest modification time of a directory and the entries directly in it.
pub(crate) fn newest_mtime(dir: &Path) -> Option<DateTime<Utc>> {
    let mut newest = mtime(dir)?;
    for name in list_names(dir) {
        if let Some(at) = mtime(&dir.join(name)) {
            newest = newest.max(at);
        }
    }
    Some(newest)
}

/// Bytes under a path (a file's size, a directory's files summed; links are not followed).
pub(crate) fn disk_size(path: &Path) -> u64 {
    let Ok(meta) = fs::symlink_metadata(path) else {
        return 0;
    };
    if !meta.is_dir() {
        return meta.len();
    }
    list_names(path)
        .into_iter()
        .map(|name| disk_size(&path.join(name)))
        .sum()
}

/// The most the read model reads of one queue file (`current_work.json` of a very busy queue
/// is the largest): more is refused, so a planted huge file cannot exhaust memory.
pub(crate) const MAX_QUEUE_FILE_BYTES: u64 = 256 * 1024 * 1024;

/// A queue file's bytes, for commands that may run as root on a queue other users can write:
/// opened without following a link (a link is refused: `ELOOP`) or blocking (a FIFO), refused
/// unless a regular file of at most [`MAX_QUEUE_FILE_BYTES`] (`/dev/zero`, a device, a FIFO
/// planted in its place), and read through a cap. A missing file is `NotFound`, as `fs::read`.
pub(crate) fn read_queue_file(path: impl AsRef<Path>) -> io::Result<Vec<u8>> {
    let path = path.as_ref();
    let file = open_no_follow(path)?;
    let meta = file.metadata()?;
    let refuse = |why: String| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {why}", path.display()),
        )
    };
    if !meta.is_file() {
        return Err(refuse("not a regular file".into()));
    }
    if meta.len() > MAX_QUEUE_FILE_BYTES {
        return Err(refuse(format!(
            "{} bytes, more than the {MAX_QUEUE_FILE_BYTES} read of a queue file",
            meta.len()
        )));
    }
    let mut bytes = Vec::new();
    file.take(MAX_QUEUE_FILE_BYTES).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The events at the end of a journal file (at most about `max_bytes` of it; a line cut by
/// the start of the window is skipped, as are torn lines).
pub(crate) fn read_journal_tail(path: &Path, max_bytes: u64) -> io::Result<Vec<JournalEvent>> {
    let mut file = match open_no_follow(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: not a regular file", path.display()),
        ));
    }
    let len = meta.len();
    let start = len.saturating_sub(max_bytes);
    file.seek(SeekFrom::Start(start))?;
    let mut bytes = Vec::new();
    file.take(max_bytes).read_to_end(&mut bytes)?;
    let text = String::from_utf8_lossy(&bytes);
    let mut lines = text.lines();
    if start > 0 {
        lines.next();
    }
    Ok(lines
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect())
}

/// Run `f` with tracing silenced (the store logs what the read model reports itself).
pub(crate) fn quietly<T>(f: impl FnOnce() -> T) -> T {
    tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::default(), f)
}
