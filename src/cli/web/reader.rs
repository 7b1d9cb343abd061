//! The dashboard's reads of the queue, on threads of their own, so that a slow disk or
//! database holds up only them, never the daemon's thread.
//!
//! The status document is kept, not read per request: a thread keeps every task's view
//! ([`StatusCache`], for a queue directory) and refreshes the document at most once a second
//! while someone watches (a request came within [`WATCHED_FOR`]), reading again only what
//! changed. Requests are answered from the latest document ([`Snapshot`]), so ten browsers
//! cost the same as one; one older than [`SERVE_FOR`] (nobody watched for a while) is
//! refreshed first. The documents are those of `cairn status --json` and `cairn show --json`,
//! with every task's `env` values hidden.

use std::collections::{HashMap, HashSet};
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::sync::oneshot;

use super::error::WebError;
use crate::client::QueueClient as Source;
use crate::queue::{LoadOptions, QueueReader, QueueView, StatusCache, TaskView};
use crate::task_id::TaskId;

/// Where the dashboard reads: a queue directory, or a shared queue's database.
#[derive(Debug, Clone)]
pub(crate) struct ReadSource {
    pub queue: PathBuf,
    pub db: Option<String>,
}

/// How old the document may be before the thread, while someone watches, refreshes it.
const REFRESH_EVERY: Duration = Duration::from_secs(1);

/// How many times as long as a refresh took the thread waits before the next.
const IDLE_SHARE: u32 = 4;

/// How long after the last request the thread keeps the document fresh.
const WATCHED_FOR: Duration = Duration::from_secs(10);

/// How old a document a request is answered with; older, it is refreshed first.
const SERVE_FOR: Duration = Duration::from_secs(3);

/// The bytes of each phase log's tail the task page shows.
const LOG_TAIL_BYTES: u64 = 16 * 1024;

/// The rejected files the first screen lists.
const RECENT_REJECTED: usize = 10;

/// The status document of one moment, shared by every request until the next refresh.
#[derive(Debug)]
pub(super) struct Snapshot {
    pub at: Instant,
    pub document: Result<Value, WebError>,
    /// The whole document as text, made once, when first asked for.
    text: OnceLock<String>,
}

impl Snapshot {
    /// The whole document as text (the same for every request of this moment).
    pub(super) fn text(&self) -> Result<&str, WebError> {
        let document = self.document.as_ref().map_err(Clone::clone)?;
        Ok(self.text.get_or_init(|| document.to_string()))
    }
}

/// Refresh the status document if older than a second (`now`: whatever its age), and answer.
struct Refresh {
    now: bool,
    answer: oneshot::Sender<Arc<Snapshot>>,
}

/// A task's document.
struct TaskJob(String, oneshot::Sender<Result<Option<String>, WebError>>);

/// What the thread and the requests share: the latest document, and when it was last wanted.
#[derive(Debug, Default)]
struct Shared {
    latest: Mutex<Option<Arc<Snapshot>>>,
    wanted: Mutex<Option<Instant>>,
}

impl Shared {
    fn latest(&self) -> Option<Arc<Snapshot>> {
        self.latest
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn watched(&self) -> bool {
        let wanted = *self.wanted.lock().unwrap_or_else(|p| p.into_inner());
        wanted.is_some_and(|at| at.elapsed() < WATCHED_FOR)
    }
}

/// The handle requests send their reads through.
#[derive(Clone)]
pub(super) struct Reader {
    refreshes: mpsc::Sender<Refresh>,
    tasks: mpsc::Sender<TaskJob>,
    shared: Arc<Shared>,
}

impl Reader {
    /// Start the reading threads, one keeping the status document and one reading task
    /// pages (a task page does not wait for a refresh). Each opens the source itself (a
    /// database reader runs a runtime of its own, which must not start inside the
    /// listener's); the status thread reads the status once at its start, so that the first
    /// screen finds the views kept.
    pub(super) fn start(source: ReadSource) -> Reader {
        let (refreshes, refresh_jobs) = mpsc::channel();
        let (tasks, task_jobs) = mpsc::channel();
        let shared = Arc::new(Shared::default());
        let thread_shared = Arc::clone(&shared);
        let status_source = source.clone();
        let threads = [
            std::thread::Builder::new()
                .name("cairn-web-status".into())
                .spawn(move || keep_status(status_source, refresh_jobs, &thread_shared)),
            std::thread::Builder::new()
                .name("cairn-web-tasks".into())
                .spawn(move || read_tasks(source, task_jobs)),
        ];
        for spawned in threads {
            if let Err(e) = spawned {
                tracing::error!("cannot start a thread of the dashboard's reader: {e}");
            }
        }
        Reader {
            refreshes,
            tasks,
            shared,
        }
    }

    fn refresh(&self, now: bool) -> Result<oneshot::Receiver<Arc<Snapshot>>, WebError> {
        let (answer, answered) = oneshot::channel();
        self.refreshes
            .send(Refresh { now, answer })
            .map_err(|_| WebError::ReaderGone)?;
        Ok(answered)
    }

    /// The latest status document: at most [`SERVE_FOR`] old, else refreshed first.
    pub(super) async fn snapshot(&self) -> Result<Arc<Snapshot>, WebError> {
        *self.shared.wanted.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        if let Some(latest) = self.shared.latest().filter(|s| s.at.elapsed() < SERVE_FOR) {
            return Ok(latest);
        }
        self.refresh(false)?.await.map_err(|_| WebError::ReaderGone)
    }

    /// The `cairn show --json` document of a task, with its checkpoint generations, its latest
    /// checkpoint decoded and the tail of each phase log (a queue directory's).
    pub(super) async fn task(&self, id: String) -> Result<Option<String>, WebError> {
        let (answer, answered) = oneshot::channel();
        self.tasks
            .send(TaskJob(id, answer))
            .map_err(|_| WebError::ReaderGone)?;
        answered.await.map_err(|_| WebError::ReaderGone)?
    }
}

/// The status thread: keep the document fresh while someone watches, and answer refreshes.
/// A refresh waits at least [`REFRESH_EVERY`], and [`IDLE_SHARE`] times as long as the last
/// one took, after it: on a large queue or a slow disk the thread takes a bounded share of a
/// core from the daemon.
fn keep_status(source: ReadSource, jobs: mpsc::Receiver<Refresh>, shared: &Shared) {
    let opened = open(&source);
    let mut kept = KeptStatus::default();
    let mut pause = REFRESH_EVERY;
    let mut refresh = |shared: &Shared, pause: &mut Duration| {
        let started = Instant::now();
        let document = match &opened {
            Ok(source) => read_status(source, &mut kept),
            Err(e) => Err(e.clone()),
        };
        *pause = REFRESH_EVERY.max(started.elapsed() * IDLE_SHARE);
        let snapshot = Arc::new(Snapshot {
            at: Instant::now(),
            document,
            text: OnceLock::new(),
        });
        *shared.latest.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::clone(&snapshot));
        snapshot
    };
    refresh(shared, &mut pause);
    loop {
        match jobs.recv_timeout(pause) {
            Ok(Refresh { now, answer }) => {
                let latest = match shared.latest() {
                    Some(latest) if !now && latest.at.elapsed() < pause => latest,
                    _ => refresh(shared, &mut pause),
                };
                let _ = answer.send(latest);
            }
            Err(RecvTimeoutError::Timeout) => {
                let stale = shared.latest().is_none_or(|s| s.at.elapsed() >= pause);
                if stale && shared.watched() {
                    refresh(shared, &mut pause);
                }
            }
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// The task thread: each task page's document, read when asked.
fn read_tasks(source: ReadSource, jobs: mpsc::Receiver<TaskJob>) {
    let opened = open(&source);
    for TaskJob(id, answer) in jobs {
        let document = match &opened {
            Ok(source) => task_document(source, &id),
            Err(e) => Err(e.clone()),
        };
        let _ = answer.send(document);
    }
}

fn open(source: &ReadSource) -> Result<Source, WebError> {
    Ok(Source::open(&source.queue, source.db.as_deref())?)
}

/// The status document now: a queue directory's from the views kept, a database's read.
fn read_status(source: &Source, kept: &mut KeptStatus) -> Result<Value, WebError> {
    let options = LoadOptions {
        rejected: RECENT_REJECTED,
    };
    match source.root() {
        Some(root) => Ok(kept.document(&QueueReader::open(root), options)),
        None => {
            let view = source.status(options)?;
            let tasks = view
                .tasks
                .iter()
                .map(|task| task_json(&view, task))
                .collect();
            Ok(document(&view, tasks))
        }
    }
}

/// The views of a queue directory's tasks and the JSON made of each, kept between refreshes:
/// a task's JSON is made again only when the cache built its view again.
#[derive(Default)]
struct KeptStatus {
    cache: StatusCache,
    /// By task id: the refresh that built the view, and its JSON.
    json: HashMap<String, (u64, Value)>,
}

impl KeptStatus {
    fn document(&mut self, reader: &QueueReader, options: LoadOptions) -> Value {
        let view = self.cache.status(reader, options);
        let age = view.now;
        let mut tasks = Vec::with_capacity(view.tasks.len());
        let mut seen = HashSet::with_capacity(view.tasks.len());
        for task in &view.tasks {
            let Some(built_at) = self.cache.built_at(&task.id) else {
                // Still in the inbox, or a rejection: built at every refresh.
                tasks.push(task_json(&view, task));
                continue;
            };
            seen.insert(task.id.as_str());
            let json = match self.json.get_mut(&task.id) {
                Some((at, json)) if *at == built_at => {
                    // The one field that moves with the clock alone.
                    json["last_checkpoint_age_seconds"] = json!(task.checkpoint_age(age));
                    json
                }
                _ => {
                    let entry = (built_at, task_json(&view, task));
                    &mut self
                        .json
                        .entry(task.id.clone())
                        .insert_entry(entry)
                        .into_mut()
                        .1
                }
            };
            tasks.push(json.clone());
        }
        self.json.retain(|id, _| seen.contains(id.as_str()));
        document(&view, tasks)
    }
}

/// The status document of `view` from its tasks' objects (whose `env` values are hidden
/// already), the rest with its `env` values hidden.
fn document(view: &QueueView, tasks: Vec<Value>) -> Value {
    let mut document = crate::cli::status::document(view, Vec::new());
    hide_env_values(&mut document);
    document["tasks"] = Value::Array(tasks);
    document
}

/// A task's object in the page's status document: `cairn status --json`'s, with its budget
/// (the page shows cost against budget) and `env` values hidden.
fn task_json(view: &QueueView, task: &TaskView) -> Value {
    let mut json = crate::cli::status::task_json(view, task);
    let budget = task.task.as_ref().and_then(|t| t.budget.as_ref());
    json["budget"] = json!(budget.map(|b| b.max_cost));
    hide_env_values(&mut json);
    json
}

fn task_document(source: &Source, id: &str) -> Result<Option<String>, WebError> {
    let Ok(id) = TaskId::parse(id) else {
        return Ok(None);
    };
    let files = source.root().map(QueueReader::open);
    let exists = match &files {
        Some(reader) => reader.task(&id).is_some(),
        None => source.task(&id)?.is_some(),
    };
    if !exists {
        return Ok(None);
    }
    let mut document = crate::cli::show::json_document(source, &id).map_err(WebError::command)?;
    document["checkpoints"] = checkpoints(source, &id);
    // The logs stay on the host that ran the task: a shared queue's page has none.
    if let Some(reader) = &files {
        document["log_tails"] = log_tails(reader, &id);
    }
    hide_env_values(&mut document);
    Ok(Some(document.to_string()))
}

/// The task's checkpoint generations and its newest checkpoint that decodes, state included.
fn checkpoints(source: &Source, id: &TaskId) -> Value {
    let generations = match source.generations(id) {
        Ok(generations) => json!(generations
            .into_iter()
            .map(|generation| generation.info)
            .collect::<Vec<_>>()),
        Err(e) => json!({ "unreadable": e.to_string() }),
    };
    let latest = match source.checkpoint(id, None) {
        Ok(Some(read)) => latest_json(&read),
        Ok(None) => Value::Null,
        Err(e) => json!({ "unreadable": e.to_string() }),
    };
    json!({ "generations": generations, "latest": latest })
}

fn latest_json(loaded: &crate::client::ReadCheckpoint) -> Value {
    json!({
        "key": loaded.location,
        "phase": loaded.checkpoint.phase,
        "iteration_count": loaded.checkpoint.iteration_count,
        "last_checkpoint_at": loaded.checkpoint.last_checkpoint_at,
        "state": loaded.checkpoint.partial_results,
    })
}

/// The last [`LOG_TAIL_BYTES`] of each phase log of the task, by file name.
fn log_tails(reader: &QueueReader, id: &TaskId) -> Value {
    let tails: Vec<Value> = reader
        .log_files(id.as_str())
        .into_iter()
        .map(|(path, bytes)| {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            match tail(&path, LOG_TAIL_BYTES) {
                Ok(text) => json!({ "name": name, "bytes": bytes, "tail": text }),
                Err(e) => json!({ "name": name, "bytes": bytes, "unreadable": e.to_string() }),
            }
        })
        .collect();
    json!(tails)
}

fn tail(path: &std::path::Path, bytes: u64) -> std::io::Result<String> {
    let mut file = crate::safe_fs::open_no_follow(path)?;
    let length = file.metadata()?.len();
    file.seek(SeekFrom::Start(length.saturating_sub(bytes)))?;
    let mut buffer = Vec::new();
    file.take(bytes).read_to_end(&mut buffer)?;
    Ok(String::from_utf8_lossy(&buffer).into_owned())
}

/// Replace the value of every variable under an `env` object: task definitions carry secrets
/// there, and no response of the listener shows them (their names stay, for people).
pub(super) fn hide_env_values(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, item) in map.iter_mut() {
                match item {
                    Value::Object(env) if key == "env" => {
                        for variable in env.values_mut() {
                            *variable = json!("(hidden)");
                        }
                    }
                    other => hide_env_values(other),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(hide_env_values),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_values_are_hidden_at_any_depth_and_their_names_kept() {
        let mut document = json!({
            "tasks": [{"definition": {"env": {"TOKEN": "s3cret"}, "phases": []}}],
            "env": {"A": "b"},
        });
        hide_env_values(&mut document);
        let text = document.to_string();
        assert!(
            !text.contains("s3cret") && !text.contains("\"b\""),
            "{text}"
        );
        assert!(text.contains("TOKEN"), "{text}");
    }
}
