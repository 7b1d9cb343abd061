//! The per-task event journal, `runs/<id>/events.jsonl`: one JSON object per line, appended
//! by the daemon as it works, read by `cairn show` for a task's timeline.
//!
//! Each line is `{"at": "<RFC 3339>", "event": "<name>", ...details}`; the events and their
//! details are the variants of [`Event`].
//!
//! The journal is a log, not state: lines are appended with `O_APPEND` and not fsynced, so a
//! crash may lose its last lines (and tear the very last one, which readers skip). Nothing
//! cairn decides depends on it.
//!
//! The daemon appends through a [`JournalWriter`], which writes from a thread of its own: the
//! first line of a task creates its run directory and journal file, and the daemon's async
//! thread must not wait for the file system. Each event is stamped when it happens, not when
//! its line reaches the file. A line that finds no descriptor free (`EMFILE`, with thousands of
//! commands in flight) is held back and written before the next batch, up to a megabyte of them.

use std::collections::{HashMap, HashSet};
use std::io::{self, BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

pub use super::events::Event;

/// One journal line: when, then what.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JournalEvent {
    pub at: DateTime<Utc>,
    #[serde(flatten)]
    pub event: Event,
}

/// The journal file of a task.
pub fn journal_path(queue_root: &Path, task_id: &str) -> PathBuf {
    queue_root.join("runs").join(task_id).join("events.jsonl")
}

/// Append an event, stamped now. Failures are logged, never fatal: the journal must not stop
/// the work it describes.
pub fn append(queue_root: &Path, task_id: &str, event: Event) {
    write_line(queue_root, task_id, &encode(event));
}

/// One journal line, stamped now.
fn encode(event: Event) -> Vec<u8> {
    let entry = JournalEvent {
        at: Utc::now(),
        event,
    };
    // Plain data with string keys and a timestamp always serializes.
    let mut line = serde_json::to_vec(&entry).unwrap_or_default();
    line.push(b'\n');
    line
}

/// Append encoded lines to a task's journal, creating its run directory and journal file if
/// missing; failures are logged. Returns whether the lines were written.
fn write_line(queue_root: &Path, task_id: &str, lines: &[u8]) -> bool {
    match try_write_line(queue_root, task_id, lines) {
        Ok(()) => true,
        Err(e) => {
            warn_unwritten(task_id, lines, &journal_path(queue_root, task_id), &e);
            false
        }
    }
}

/// [`write_line`], handing the error back.
fn try_write_line(queue_root: &Path, task_id: &str, lines: &[u8]) -> io::Result<()> {
    let path = journal_path(queue_root, task_id);
    if let Some(dir) = path.parent() {
        super::modes::create_dir_all(dir)?;
    }
    // One write call, so concurrent appends never interleave within a line.
    super::modes::open_append(&path)?.write_all(lines)
}

/// Whether an append failed only because the daemon or the system had no descriptor free
/// (`EMFILE`, `ENFILE`): with thousands of commands in flight that passes as they end.
fn out_of_descriptors(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(nix::libc::EMFILE | nix::libc::ENFILE)
    )
}

fn warn_unwritten(task_id: &str, lines: &[u8], path: &Path, e: &io::Error) {
    // The name is worked out only here: the lines are all the writer keeps.
    let first = lines.split(|&b| b == b'\n').next().unwrap_or_default();
    let event = serde_json::from_slice::<JournalEvent>(first)
        .map(|entry| entry.event.name())
        .unwrap_or_default();
    tracing::warn!(task_id, event, "cannot append to {}: {e}", path.display());
}

/// How many journals the writer remembers as existing; past that it forgets them all (and
/// learns them again, one `mkdir` and create attempt each).
const MAX_KNOWN_JOURNALS: usize = 100_000;

/// The most bytes of lines the writer holds back for want of a descriptor (see
/// [`Appender::deferred`]); lines past it are lost, with a warning, as any unwritten line.
const MAX_DEFERRED_BYTES: usize = 1 << 20;

/// The writer thread's side: appends each batch of lines, one open and one write per task's
/// journal, and skips creating the run directory and journal of a task it has written to
/// before (with thousands of tasks in flight, those attempts were most of its system calls).
struct Appender {
    queue_root: PathBuf,
    /// Tasks whose journal this writer has created or appended to.
    known: HashSet<String>,
    /// Lines that found no descriptor free (`EMFILE`), by task, oldest first: written before
    /// the next batch, which comes as other work goes on and ends, and at the end.
    deferred: Vec<(String, Vec<u8>)>,
    /// The bytes in `deferred`.
    deferred_bytes: usize,
}

impl Appender {
    /// Append a task's lines; lines that found no descriptor free are deferred, others that
    /// cannot be written are logged and lost.
    fn append(&mut self, task_id: &str, lines: Vec<u8>) {
        let Err(e) = self.try_append(task_id, &lines) else {
            return;
        };
        if out_of_descriptors(&e) && self.deferred_bytes + lines.len() <= MAX_DEFERRED_BYTES {
            self.deferred_bytes += lines.len();
            self.deferred.push((task_id.to_string(), lines));
        } else {
            warn_unwritten(
                task_id,
                &lines,
                &journal_path(&self.queue_root, task_id),
                &e,
            );
        }
    }

    fn try_append(&mut self, task_id: &str, lines: &[u8]) -> io::Result<()> {
        if self.known.contains(task_id) {
            let path = journal_path(&self.queue_root, task_id);
            match super::modes::open_append_existing(&path).and_then(|mut f| f.write_all(lines)) {
                Ok(()) => return Ok(()),
                // Removed since (`cairn prune`): create it again below.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    self.known.remove(task_id);
                }
                Err(e) => return Err(e),
            }
        }
        try_write_line(&self.queue_root, task_id, lines)?;
        if self.known.len() >= MAX_KNOWN_JOURNALS {
            self.known.clear();
        }
        self.known.insert(task_id.to_string());
        Ok(())
    }

    /// Try the deferred lines once more; those that fail now are logged and lost.
    fn finish(&mut self) {
        self.deferred_bytes = 0;
        for (task_id, lines) in std::mem::take(&mut self.deferred) {
            if let Err(e) = self.try_append(&task_id, &lines) {
                warn_unwritten(
                    &task_id,
                    &lines,
                    &journal_path(&self.queue_root, &task_id),
                    &e,
                );
            }
        }
    }

    /// Write the deferred lines, then what `first` and the messages already queued behind it
    /// hold, grouped by task (each task's lines in order), then answer the flushes among them.
    fn drain(&mut self, first: Message, receiver: &mpsc::Receiver<Message>) {
        let mut tasks: Vec<(String, Vec<u8>)> = Vec::new();
        let mut index: HashMap<String, usize> = HashMap::new();
        self.deferred_bytes = 0;
        for (task_id, lines) in std::mem::take(&mut self.deferred) {
            match index.get(&task_id) {
                Some(&i) => tasks[i].1.extend_from_slice(&lines),
                None => {
                    index.insert(task_id.clone(), tasks.len());
                    tasks.push((task_id, lines));
                }
            }
        }
        let mut flushes = Vec::new();
        let mut next = Some(first);
        let mut taken = 0;
        while let Some(message) = next.take() {
            match message {
                Message::Line { task_id, line } => match index.get(&task_id) {
                    Some(&i) => tasks[i].1.extend_from_slice(&line),
                    None => {
                        index.insert(task_id.clone(), tasks.len());
                        tasks.push((task_id, line));
                    }
                },
                Message::Flush(done) => flushes.push(done),
            }
            taken += 1;
            if taken < MAX_BATCH {
                next = receiver.try_recv().ok();
            }
        }
        for (task_id, lines) in tasks {
            self.append(&task_id, lines);
        }
        for done in flushes {
            let _ = done.send(());
        }
    }
}

/// The most messages the writer takes at once.
const MAX_BATCH: usize = 4096;

/// What the writer thread is handed.
enum Message {
    Line {
        task_id: String,
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
                let mut appender = Appender {
                    queue_root: root,
                    known: HashSet::new(),
                    deferred: Vec::new(),
                    deferred_bytes: 0,
                };
                while let Ok(first) = receiver.recv() {
                    appender.drain(first, &receiver);
                }
                appender.finish();
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
    pub fn append(&self, task_id: &str, event: Event) {
        let message = Message::Line {
            task_id: task_id.to_string(),
            line: encode(event),
        };
        let unsent = match &self.sender {
            Some(sender) => sender.send(message).err().map(|e| e.0),
            None => Some(message),
        };
        // The thread is gone (it cannot be, short of a panic): write here instead.
        if let Some(Message::Line { task_id, line }) = unsent {
            write_line(&self.queue_root, &task_id, &line);
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
/// A task without a journal has no events. A line torn by a power cut has no newline, so the
/// next event appended after the restart continues it: that event is read from where it
/// begins (see [`parse_line`]).
pub fn read(queue_root: &Path, task_id: &str) -> io::Result<Vec<JournalEvent>> {
    let path = journal_path(queue_root, task_id);
    let file = match crate::safe_fs::open_no_follow(&path) {
        Ok(file) if !file.metadata()?.is_file() => {
            let why = format!("{}: not a regular file", path.display());
            return Err(io::Error::new(io::ErrorKind::InvalidData, why));
        }
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut events = Vec::new();
    // As bytes: a torn line may end inside a character, and must not make the rest unreadable.
    for line in io::BufReader::new(file).split(b'\n') {
        if let Some(event) = parse_line(&line?) {
            events.push(event);
        }
    }
    Ok(events)
}

/// Every line begins with this, and it cannot occur inside one (a string's quotes are escaped).
const LINE_START: &[u8] = br#"{"at":""#;

/// The event of a journal line: the whole line, or else the last whole line appended after a
/// torn one (which left no newline), found where a line begins.
fn parse_line(line: &[u8]) -> Option<JournalEvent> {
    if let Ok(event) = serde_json::from_slice(line) {
        return Some(event);
    }
    (1..line.len())
        .filter(|&at| line[at..].starts_with(LINE_START))
        .find_map(|at| serde_json::from_slice(&line[at..]).ok())
}

#[cfg(test)]
mod tests {
    use std::fs::OpenOptions;
    use std::io::Write;

    use super::{append, journal_path, read, Event, JournalWriter};

    fn checkpoint(iteration: u64) -> Event {
        Event::Checkpoint {
            phase: "p".into(),
            iteration,
            generation: iteration,
            bytes: 120,
            ms: 0.5,
        }
    }

    #[test]
    fn events_round_trip_and_torn_lines_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        append(
            dir.path(),
            "t1",
            Event::Accepted {
                priority: 0,
                submitted_by: None,
            },
        );
        append(dir.path(), "t1", checkpoint(3));
        let path = journal_path(dir.path(), "t1");
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(b"{\"at\": \"2026-").unwrap();
        let events = read(dir.path(), "t1").unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(
            events[0].event,
            Event::Accepted {
                priority: 0,
                submitted_by: None,
            }
        );
        assert_eq!(events[1].event, checkpoint(3));
        assert!(read(dir.path(), "other").unwrap().is_empty());
    }

    /// A line torn by a power cut (no newline, maybe not even whole characters) does not
    /// take the event appended after the restart with it, nor the lines after that.
    #[test]
    fn the_event_appended_after_a_torn_line_is_read() {
        let dir = tempfile::tempdir().unwrap();
        append(dir.path(), "t1", checkpoint(1));
        let path = journal_path(dir.path(), "t1");
        for torn in [
            &b"{\"at\":\"2026-"[..],
            b"{\"at\":\"2026-11-20T10:00:00Z\",\"event\":\"no\xc3",
            b"\0\0\0",
        ] {
            let mut file = OpenOptions::new().append(true).open(&path).unwrap();
            file.write_all(torn).unwrap();
            append(dir.path(), "t1", checkpoint(2));
            append(dir.path(), "t1", checkpoint(3));
            let iterations: Vec<u64> = read(dir.path(), "t1")
                .unwrap()
                .into_iter()
                .map(|e| match e.event {
                    Event::Checkpoint { iteration, .. } => iteration,
                    _ => panic!("not a checkpoint: {e:?}"),
                })
                .collect();
            assert_eq!(iterations, [1, 2, 3], "after {torn:?}");
            std::fs::write(&path, b"").unwrap();
            append(dir.path(), "t1", checkpoint(1));
        }
    }

    /// Lines as cairn wrote them before events had a type still read, each as its variant,
    /// and a line of an event this version does not know is kept as `Unknown`.
    #[test]
    fn an_old_journal_reads() {
        let dir = tempfile::tempdir().unwrap();
        let path = journal_path(dir.path(), "t1");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(
            &path,
            concat!(
                r#"{"at":"2026-11-20T10:00:00.000001Z","event":"accepted","priority":0}"#,
                "\n",
                r#"{"at":"2026-11-20T10:00:01Z","event":"phase_started","phase":"sum","phase_index":0,"kind":"loop","attempt":1}"#,
                "\n",
                r#"{"at":"2026-11-20T10:00:02Z","event":"checkpoint","phase":"sum","iteration":1,"generation":1,"bytes":93,"ms":0.412345}"#,
                "\n",
                r#"{"at":"2026-11-20T10:00:03Z","event":"weather_report","sky":"clear"}"#,
                "\n",
                r#"{"at":"2026-11-20T10:00:04Z","event":"done","attempts":1,"cost":null}"#,
                "\n",
            ),
        )
        .unwrap();
        let events: Vec<Event> = read(dir.path(), "t1")
            .unwrap()
            .into_iter()
            .map(|e| e.event)
            .collect();
        assert_eq!(events.len(), 5);
        assert_eq!(
            events[0],
            Event::Accepted {
                priority: 0,
                submitted_by: None,
            }
        );
        assert!(
            matches!(&events[1], Event::PhaseStarted { phase, attempt: 1, .. } if phase == "sum")
        );
        assert!(matches!(events[2], Event::Checkpoint { iteration: 1, ms, .. } if ms == 0.412345));
        assert!(matches!(&events[3], Event::Unknown { event, .. } if event == "weather_report"));
        assert_eq!(
            events[4],
            Event::Done {
                attempts: 1,
                cost: None
            }
        );
    }

    /// A line is written as it was before events had a type: time, name, then the details.
    #[test]
    fn lines_keep_their_layout() {
        let dir = tempfile::tempdir().unwrap();
        append(dir.path(), "t1", checkpoint(7));
        let text = std::fs::read_to_string(journal_path(dir.path(), "t1")).unwrap();
        let (at, rest) = text.split_once(r#"","event""#).unwrap();
        assert!(at.starts_with(r#"{"at":""#), "{text}");
        assert_eq!(
            rest,
            ":\"checkpoint\",\"phase\":\"p\",\"iteration\":7,\"generation\":7,\"bytes\":120,\"ms\":0.5}\n"
        );
    }

    /// The writer remembers the journals it made; one removed since (by `cairn prune`) is
    /// made again, with its run directory.
    #[test]
    fn a_journal_removed_behind_the_writer_is_made_again() {
        let dir = tempfile::tempdir().unwrap();
        let writer = JournalWriter::start(dir.path());
        writer.append("t1", checkpoint(1));
        writer.flush();
        let run_dir = journal_path(dir.path(), "t1")
            .parent()
            .unwrap()
            .to_path_buf();
        std::fs::remove_dir_all(&run_dir).unwrap();
        writer.append("t1", checkpoint(2));
        writer.append("t1", checkpoint(3));
        writer.flush();
        let iterations: Vec<u64> = read(dir.path(), "t1")
            .unwrap()
            .into_iter()
            .map(|e| match e.event {
                Event::Checkpoint { iteration, .. } => iteration,
                _ => panic!("not a checkpoint: {e:?}"),
            })
            .collect();
        assert_eq!(iterations, [2, 3]);
    }

    #[test]
    fn the_writer_keeps_order_and_flushes() {
        let dir = tempfile::tempdir().unwrap();
        let writer = JournalWriter::start(dir.path());
        for i in 0..200 {
            writer.append("t1", checkpoint(i));
        }
        let done = Event::Done {
            attempts: 1,
            cost: None,
        };
        writer.append("t2", done.clone());
        writer.flush();
        let events = read(dir.path(), "t1").unwrap();
        let order: Vec<u64> = events
            .iter()
            .map(|e| match e.event {
                Event::Checkpoint { iteration, .. } => iteration,
                _ => panic!("not a checkpoint: {e:?}"),
            })
            .collect();
        assert_eq!(order, (0..200).collect::<Vec<u64>>());
        assert!(events.windows(2).all(|w| w[0].at <= w[1].at));
        writer.append("t2", Event::Resumed {});
        drop(writer);
        let written: Vec<Event> = read(dir.path(), "t2")
            .unwrap()
            .into_iter()
            .map(|e| e.event)
            .collect();
        assert_eq!(written, [done, Event::Resumed {}]);
    }
}
