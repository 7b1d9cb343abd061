//! Small, read-only helpers over a queue's directories.

use std::fs;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

use chrono::{DateTime, Utc};

use crate::store::journal::JournalEvent;

/// The stems of `dir/*.json`, dot-files left out, sorted.
pub fn json_stems(dir: &Path) -> Vec<String> {
    let mut stems: Vec<String> = list_names(dir)
        .into_iter()
        .filter(|name| !name.starts_with('.'))
        .filter_map(|name| name.strip_suffix(".json").map(str::to_string))
        .collect();
    stems.sort();
    stems
}

/// The names in a directory (empty when it does not exist), sorted.
pub fn list_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// A file's modification time (of a link itself, not its target).
pub fn mtime(path: &Path) -> Option<DateTime<Utc>> {
    fs::symlink_metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .map(DateTime::<Utc>::from)
}

/// The latest modification time of a directory and the entries directly in it.
pub fn newest_mtime(dir: &Path) -> Option<DateTime<Utc>> {
    let mut newest = mtime(dir)?;
    for name in list_names(dir) {
        if let Some(at) = mtime(&dir.join(name)) {
            newest = newest.max(at);
        }
    }
    Some(newest)
}

/// Bytes under a path (a file's size, a directory's files summed; links are not followed).
pub fn disk_size(path: &Path) -> u64 {
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

/// A small file's bytes, or `None` unless it is a regular file (not a link, FIFO or device) of
/// at most `cap` bytes: reading never blocks and never runs away.
pub fn read_regular(path: &Path, cap: u64) -> Option<Vec<u8>> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() || meta.len() > cap {
        return None;
    }
    let mut bytes = Vec::new();
    file.take(cap).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

/// The events at the end of a journal file (at most about `max_bytes` of it; a line cut by
/// the start of the window is skipped, as are torn lines).
pub fn read_journal_tail(path: &Path, max_bytes: u64) -> io::Result<Vec<JournalEvent>> {
    let mut file = match fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let len = file.metadata()?.len();
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
pub fn quietly<T>(f: impl FnOnce() -> T) -> T {
    tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::default(), f)
}
