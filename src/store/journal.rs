//! The per-task event journal, `runs/<id>/events.jsonl`: one JSON object per line, appended
//! by the daemon as it works, read by `cairn show` for a task's timeline.
//!
//! Each line is `{"at": "<RFC 3339>", "event": "<name>", ...details}`. Events: `accepted`,
//! `attempt_started`, `phase_started`, `phase_finished`, `checkpoint` (phase, iteration,
//! generation, bytes, ms), `attempt_failed`, `stop_requested` (a daemon shutdown), `interrupted`,
//! `resumed_after_crash`, `pause_requested`, `paused`, `resumed`, `cancel_requested`,
//! `cancelled`, `control_refused`, `retried`, `forked`, `budget_stopped`, `done`, `failed`.
//!
//! The journal is a log, not state: lines are appended with `O_APPEND` and not fsynced, so a
//! crash may lose its last lines (and tear the very last one, which readers skip). Nothing
//! cairn decides depends on it.

use std::fs::OpenOptions;
use std::io::{self, BufRead, Write};
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// One journal line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JournalEvent {
    pub at: DateTime<Utc>,
    pub event: String,
    #[serde(flatten)]
    pub details: Map<String, Value>,
}

/// The journal file of a task.
pub fn journal_path(queue_root: &Path, task_id: &str) -> PathBuf {
    queue_root.join("runs").join(task_id).join("events.jsonl")
}

/// Append an event; `details` must be a JSON object (anything else is recorded as `value`).
/// Failures are logged, never fatal: the journal must not stop the work it describes.
pub fn append(queue_root: &Path, task_id: &str, event: &str, details: Value) {
    let details = match details {
        Value::Object(map) => map,
        Value::Null => Map::new(),
        other => Map::from_iter([("value".to_string(), other)]),
    };
    let entry = JournalEvent {
        at: Utc::now(),
        event: event.to_string(),
        details,
    };
    let path = journal_path(queue_root, task_id);
    let write = || -> io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut line = serde_json::to_vec(&entry).map_err(io::Error::other)?;
        line.push(b'\n');
        // One write call per line, so concurrent appends never interleave.
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)?
            .write_all(&line)
    };
    if let Err(e) = write() {
        tracing::warn!(task_id, event, "cannot append to {}: {e}", path.display());
    }
}

/// Read a task's journal; lines that do not parse (a line torn by a crash) are skipped.
/// A task without a journal has no events.
pub fn read(queue_root: &Path, task_id: &str) -> io::Result<Vec<JournalEvent>> {
    let path = journal_path(queue_root, task_id);
    let file = match std::fs::File::open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut events = Vec::new();
    for line in io::BufReader::new(file).lines() {
        if let Ok(event) = serde_json::from_str(&line?) {
            events.push(event);
        }
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn events_round_trip_and_torn_lines_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        append(
            dir.path(),
            "t1",
            "accepted",
            json!({"file": "inbox/t1.json"}),
        );
        append(
            dir.path(),
            "t1",
            "checkpoint",
            json!({"iteration": 3, "bytes": 120}),
        );
        let path = journal_path(dir.path(), "t1");
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(b"{\"at\": \"2026-").unwrap();
        let events = read(dir.path(), "t1").unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].event, "accepted");
        assert_eq!(events[1].details["iteration"], json!(3));
        assert!(read(dir.path(), "other").unwrap().is_empty());
    }
}
