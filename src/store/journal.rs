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
//!
//! The daemon appends through a [`JournalWriter`], which writes from a thread of its own: the
//! first line of a task creates its run directory and journal file, and the daemon's async
//! thread must not wait for the file system. Each event is stamped when it happens, not when
//! its line reaches the file.

use std::io::{self, BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;

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
    write_line(queue_root, task_id, event, &encode(event, details));
}

/// One journal line, stamped now.
fn encode(event: &str, details: Value) -> Vec<u8> {
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
    // A map with string keys and a timestamp always serializes.
    let mut line = serde_json::to_vec(&entry).unwrap_or_default();
    line.push(b'\n');
    line
}

/// Append one encoded line to a task's journal; failures are logged.
fn write_line(queue_root: &Path, task_id: &str, event: &str, line: &[u8]) {
    let path = journal_path(queue_root, task_id);
    let write = || -> io::Result<()> {
        if let Some(dir) = path.parent() {
            super::modes::create_dir_all(dir)?;
        }
        // One write call per line, so concurrent appends never interleave.
        super::modes::open_append(&path)?.write_all(line)
    };
    if let Err(e) = write() {
        tracing::warn!(task_id, event, "cannot append to {}: {e}", path.display());
    }
}

/// What the writer thread is handed.
enum Message {
    Line {
        task_id: String,
        event: String,
        line: Vec<u8>,
    },
    /// Answer once every line handed over before this is written.
    Flush(mpsc::Sender<()>),
}

/// Appends the daemon's journal lines from a thread of its own, in the order they were handed
/// over. Dropping it writes what is still queued.
#[derive(Debug)]
pub struct JournalWriter {
    queue_root: PathBuf,
    /// `None` if the thread could not be started: lines are then written by the caller.
    sender: Option<mpsc::Sender<Message>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl JournalWriter {
    /// A writer for the journals of the queue at `queue_root`.
    pub fn start(queue_root: impl Into<PathBuf>) -> JournalWriter {
        let queue_root = queue_root.into();
        let (sender, receiver) = mpsc::channel::<Message>();
        let root = queue_root.clone();
        let thread = std::thread::Builder::new()
            .name("cairn-journal".into())
            .spawn(move || {
                for message in receiver {
                    match message {
                        Message::Line {
                            task_id,
                            event,
                            line,
                        } => write_line(&root, &task_id, &event, &line),
                        Message::Flush(done) => {
                            let _ = done.send(());
                        }
                    }
                }
            });
        match thread {
            Ok(thread) => JournalWriter {
                queue_root,
                sender: Some(sender),
                thread: Some(thread),
            },
            Err(e) => {
                tracing::warn!("cannot start the journal writer ({e}); appending directly");
                JournalWriter {
                    queue_root,
                    sender: None,
                    thread: None,
                }
            }
        }
    }

    /// Append an event (stamped now) to a task's journal; see [`append`].
    pub fn append(&self, task_id: &str, event: &str, details: Value) {
        let line = encode(event, details);
        let message = Message::Line {
            task_id: task_id.to_string(),
            event: event.to_string(),
            line,
        };
        let unsent = match &self.sender {
            Some(sender) => sender.send(message).err().map(|e| e.0),
            None => Some(message),
        };
        // The thread is gone (it cannot be, short of a panic): write here instead.
        if let Some(Message::Line {
            task_id,
            event,
            line,
        }) = unsent
        {
            write_line(&self.queue_root, &task_id, &event, &line);
        }
    }

    /// Wait until every line appended so far is written. Blocking.
    pub fn flush(&self) {
        let Some(sender) = &self.sender else {
            return;
        };
        let (done, written) = mpsc::channel();
        let sent = sender.send(Message::Flush(done));
        if sent.is_ok() {
            let _ = written.recv();
        }
    }
}

impl Drop for JournalWriter {
    fn drop(&mut self) {
        // Closing the channel ends the thread once it has written what is queued.
        self.sender = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
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
    use std::fs::OpenOptions;
    use std::io::Write;

    use super::{append, journal_path, read, JournalWriter};
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

    #[test]
    fn the_writer_keeps_order_and_flushes() {
        let dir = tempfile::tempdir().unwrap();
        let writer = JournalWriter::start(dir.path());
        for i in 0..200 {
            writer.append("t1", "checkpoint", json!({"iteration": i}));
        }
        writer.append("t2", "done", json!({}));
        writer.flush();
        let events = read(dir.path(), "t1").unwrap();
        let order: Vec<u64> = events
            .iter()
            .map(|e| e.details["iteration"].as_u64().unwrap())
            .collect();
        assert_eq!(order, (0..200).collect::<Vec<u64>>());
        assert!(events.windows(2).all(|w| w[0].at <= w[1].at));
        writer.append("t2", "after-flush", json!({}));
        drop(writer);
        let names: Vec<String> = read(dir.path(), "t2")
            .unwrap()
            .into_iter()
            .map(|e| e.event)
            .collect();
        assert_eq!(names, ["done", "after-flush"]);
    }
}
