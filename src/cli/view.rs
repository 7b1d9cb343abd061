//! One reader of a queue directory for the operator commands (`status`, `show`, `prune`, ...):
//! it turns the queue's files into a list of task views — state, phase, iteration, rate, ETA,
//! cost, checkpoint age, attempts, error — without a daemon and without writing anything.
//!
//! Where each fact comes from:
//! - `tasks/<id>.json`: the definition (phase names, kinds, `max_iterations`, `items`).
//! - `current_work.json`: tasks in flight and their status; a `running` entry while no daemon
//!   is alive means the daemon died, and is shown as `interrupted`.
//! - `done/<id>.json`, `failed/<id>.json`: finished tasks (`failed/rejected-*.json`: files
//!   refused at intake). A record wins over a `current_work` entry, except for the entry
//!   `cairn retry` writes (its `retry_of` is the record's `failed_at`).
//! - `incremental/<id>.json.gz`: the iteration of the phase in flight and when it was
//!   checkpointed, fresher than `current_work.json`'s counter.
//! - `runs/<id>/events.jsonl`: the rate, from this phase's `checkpoint` events.
//! - `.lock`: the daemon's pid. Whether it is alive is asked of the kernel (`kill(pid, 0)`, and
//!   `/proc/locks` to tell a reused pid apart); the lock itself is never taken, so a starting
//!   daemon cannot fail because of a status query.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, Context};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::store::current_work::{ActiveStatus, ActiveTask, CurrentWork, StoredOutput};
use crate::store::journal::{self, Event, JournalEvent};
use crate::store::records::RecordStatus;
use crate::store::task_state::TaskState;
use crate::store::{CheckpointStore, FileStorage, IterationCheckpoint};
use crate::task::{PhaseKind, Task};
use crate::task_id::TaskId;

/// The version of the `--json` documents of `status`, `show` and `history`.
pub const JSON_VERSION: u32 = 1;

/// How much of the end of a task's journal `status` reads to work out a rate.
const JOURNAL_TAIL_BYTES: u64 = 256 * 1024;

/// Is a daemon running on the queue, and which.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DaemonInfo {
    pub running: bool,
    /// The daemon's pid while it runs.
    pub pid: Option<i32>,
}

impl DaemonInfo {
    pub fn to_json(self) -> Value {
        json!({"running": self.running, "pid": self.pid})
    }

    /// "running (pid 12)" or "not running".
    pub fn describe(self) -> String {
        match (self.running, self.pid) {
            (true, Some(pid)) => format!("running (pid {pid})"),
            (true, None) => "running".into(),
            _ => "not running".into(),
        }
    }
}

/// Sort rank: tasks in flight first, then pending (and submitted), finished, rejected.
fn rank(state: &TaskState) -> u8 {
    match state {
        s if s.is_in_flight() => 0,
        s if s.not_started() => 1,
        s if s.is_rejected() => 3,
        _ => 2,
    }
}

/// A final record in `done/` or `failed/`.
#[derive(Debug, Clone)]
pub struct Record {
    /// The record file.
    pub path: PathBuf,
    pub value: Value,
    /// Its `status` field.
    pub status: RecordStatus,
    /// When the task finished (`finished_at`, `failed_at`, `rejected_at`; else the file's
    /// modification time).
    pub at: Option<DateTime<Utc>>,
}

impl Record {
    pub fn read(path: &Path) -> anyhow::Result<Record> {
        let bytes = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let value: Value = serde_json::from_slice(&bytes)
            .with_context(|| format!("{} is not valid JSON", path.display()))?;
        let status = match value.get("status") {
            Some(status) => RecordStatus::deserialize(status)
                .with_context(|| format!("{}: \"status\"", path.display()))?,
            None => return Err(anyhow!("{} has no \"status\"", path.display())),
        };
        let at = ["finished_at", "failed_at", "cancelled_at", "rejected_at"]
            .iter()
            .find_map(|key| value[*key].as_str())
            .and_then(|text| DateTime::parse_from_rfc3339(text).ok())
            .map(|at| at.with_timezone(&Utc))
            .or_else(|| mtime(path));
        Ok(Record {
            path: path.to_path_buf(),
            value,
            status,
            at,
        })
    }

    fn u32_field(&self, key: &str) -> Option<u32> {
        self.value[key].as_u64().and_then(|n| u32::try_from(n).ok())
    }
}

/// Everything known about one task.
#[derive(Debug, Clone)]
pub struct TaskView {
    pub id: String,
    pub state: TaskState,
    pub phase: Option<String>,
    /// 0-based.
    pub phase_index: Option<usize>,
    pub phase_count: Option<usize>,
    pub kind: Option<PhaseKind>,
    /// Completed iterations (items, worker checkpoints) of the phase.
    pub iteration: Option<u64>,
    pub total: Option<u64>,
    pub rate_per_min: Option<f64>,
    pub eta_seconds: Option<u64>,
    /// The cost committed by checkpoints.
    pub cost: Option<f64>,
    /// Iterations in flight when the daemon died, counted as spent, and their estimated cost
    /// (not in `cost`).
    pub lost_iterations: u64,
    pub lost_cost_estimate: Option<f64>,
    pub last_checkpoint_at: Option<DateTime<Utc>>,
    /// Runs started (resumes after a stop, pause or crash included), and how many attempts
    /// failed; only the failures count against `retry.max_attempts`.
    pub attempts: Option<u32>,
    pub failed_attempts: Option<u32>,
    pub error: Option<String>,
    /// The definition, when `tasks/<id>.json` reads.
    pub task: Option<Task>,
    /// The `current_work.json` entry, while in flight.
    pub entry: Option<ActiveTask>,
    pub record: Option<Record>,
    /// The checkpoint the iteration was read from (its phase is the current one).
    pub checkpoint: Option<IterationCheckpoint>,
    /// Files of this task that could not be read.
    pub warnings: Vec<String>,
    /// Where the definition was read: `tasks/<id>.json`, or `inbox/<name>` while submitted.
    pub definition_key: String,
}

impl TaskView {
    fn new(id: &str, state: TaskState) -> TaskView {
        TaskView {
            id: id.to_string(),
            state,
            phase: None,
            phase_index: None,
            phase_count: None,
            kind: None,
            iteration: None,
            total: None,
            rate_per_min: None,
            eta_seconds: None,
            cost: None,
            lost_iterations: 0,
            lost_cost_estimate: None,
            last_checkpoint_at: None,
            attempts: None,
            failed_attempts: None,
            error: None,
            task: None,
            entry: None,
            record: None,
            checkpoint: None,
            warnings: Vec::new(),
            definition_key: format!("tasks/{id}.json"),
        }
    }

    /// Seconds since the last checkpoint, as of `now`.
    pub fn checkpoint_age(&self, now: DateTime<Utc>) -> Option<u64> {
        self.last_checkpoint_at
            .map(|at| (now - at).num_seconds().max(0) as u64)
    }

    /// The task as `status --json` lists it (documented in docs/cli.md).
    pub fn to_json(&self, now: DateTime<Utc>) -> Value {
        json!({
            "id": self.id,
            "state": self.state.as_str(),
            "phase": self.phase,
            "phase_index": self.phase_index,
            "phase_count": self.phase_count,
            "iteration": self.iteration,
            "total": self.total,
            "rate_per_min": self.rate_per_min.map(round2),
            "eta_seconds": self.eta_seconds,
            "cost": self.cost,
            "lost_cost_estimate": self.lost_cost_estimate,
            "last_checkpoint_at": self.last_checkpoint_at.map(rfc3339),
            "last_checkpoint_age_seconds": self.checkpoint_age(now),
            "attempts": self.attempts,
            "failed_attempts": self.failed_attempts,
            "error": self.error,
        })
    }
}

/// A whole queue, as read at `now`.
#[derive(Debug)]
pub struct QueueView {
    pub root: PathBuf,
    pub now: DateTime<Utc>,
    pub daemon: DaemonInfo,
    /// In flight first, then pending, finished and rejected; by id within each.
    pub tasks: Vec<TaskView>,
    /// Task files in `inbox/` not taken yet.
    pub inbox: usize,
    /// Files rejected at intake (`failed/rejected-*.json`), listed in `tasks` or not.
    pub rejected: usize,
    /// Files that could not be read (each names the file and why).
    pub warnings: Vec<String>,
}

/// What to read besides the basics.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoadOptions {
    /// How many rejected intake files (`failed/rejected-*.json`) to list, the most recent ones
    /// (`usize::MAX`: all).
    pub rejected: usize,
}

/// The queue's files, listed once.
struct Listing {
    root: PathBuf,
    work: CurrentWork,
    store: CheckpointStore,
    daemon: DaemonInfo,
    /// The `retry_of` of the entries `cairn retry` wrote, by task id.
    retry_of: HashMap<String, DateTime<Utc>>,
    warnings: Vec<String>,
}

impl Listing {
    fn read(root: &Path) -> Listing {
        let mut warnings = Vec::new();
        let work = match read_current_work(root) {
            Ok(work) => work,
            Err(e) => {
                warnings.push(format!("{e:#}"));
                CurrentWork::default()
            }
        };
        Listing {
            root: root.to_path_buf(),
            work,
            store: CheckpointStore::with_storage(Arc::new(FileStorage::new(root))),
            daemon: daemon_info(root),
            retry_of: read_retry_of(root),
            warnings,
        }
    }
}

/// Read the whole queue.
pub fn load(root: &Path, options: LoadOptions) -> QueueView {
    let now = Utc::now();
    // The store logs unusable checkpoints; they are reported here instead, once per view.
    let listing = quietly(|| Listing::read(root));
    let mut warnings = listing.warnings.clone();

    let mut ids: BTreeSet<String> = BTreeSet::new();
    ids.extend(json_stems(&root.join("tasks")));
    ids.extend(json_stems(&root.join("done")));
    let mut rejected = Vec::new();
    for stem in json_stems(&root.join("failed")) {
        if stem.starts_with("rejected-") {
            // A task may be named rejected-x too: its record says which it is.
            match Record::read(&root.join("failed").join(format!("{stem}.json"))) {
                Ok(record) if record.status == RecordStatus::Rejected => {
                    rejected.push((stem, record));
                    continue;
                }
                _ => {}
            }
        }
        ids.insert(stem);
    }
    ids.extend(
        listing
            .work
            .active_tasks
            .iter()
            .map(|t| t.task_id.to_string()),
    );

    let mut tasks: Vec<TaskView> = quietly(|| {
        ids.iter()
            .filter_map(|name| TaskId::parse(name.as_str()).ok())
            .map(|id| task_view(&listing, &id))
            .collect()
    });
    // A file in the inbox whose id is taken already will be rejected, not run.
    tasks.extend(
        inbox_tasks(root)
            .into_iter()
            .filter(|(_, task)| !ids.contains(task.id().as_str()))
            .map(|(name, task)| submitted_view(root, &name, task)),
    );
    let rejected_count = rejected.len();
    // Most recent first; ties (same time) by name.
    rejected.sort_by(|(a_stem, a), (b_stem, b)| b.at.cmp(&a.at).then_with(|| a_stem.cmp(b_stem)));
    tasks.extend(
        rejected
            .into_iter()
            .take(options.rejected)
            .map(|(stem, record)| rejected_view(&stem, record)),
    );
    tasks.sort_by(|a, b| {
        rank(&a.state)
            .cmp(&rank(&b.state))
            .then_with(|| a.id.cmp(&b.id))
    });
    for task in &tasks {
        warnings.extend(task.warnings.iter().cloned());
    }
    let inbox = fs::read_dir(root.join("inbox"))
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .filter(|e| {
                    let name = e.file_name();
                    let name = name.to_string_lossy();
                    !name.starts_with('.') && !name.ends_with(".tmp")
                })
                .count()
        })
        .unwrap_or(0);
    QueueView {
        root: root.to_path_buf(),
        now,
        daemon: listing.daemon,
        tasks,
        inbox,
        rejected: rejected_count,
        warnings,
    }
}

/// One task, by id (rejected records included); `None` when the queue knows no such task.
pub fn load_task(root: &Path, id: &TaskId) -> Option<TaskView> {
    let listing = quietly(|| Listing::read(root));
    let known = root.join("tasks").join(format!("{id}.json")).exists()
        || root.join("done").join(format!("{id}.json")).exists()
        || root.join("failed").join(format!("{id}.json")).exists()
        || listing.work.get(id).is_some();
    if !known {
        return inbox_tasks(root)
            .into_iter()
            .find(|(_, task)| task.id() == id)
            .map(|(name, task)| submitted_view(root, &name, task));
    }
    if let Ok(record) = Record::read(&root.join("failed").join(format!("{id}.json"))) {
        if record.status == RecordStatus::Rejected {
            return Some(rejected_view(id, record));
        }
    }
    let mut view = quietly(|| task_view(&listing, id));
    view.warnings.splice(0..0, listing.warnings);
    Some(view)
}

/// How many inbox files `status` reads to list submitted tasks; beyond that they are only
/// counted, so that a large drop does not make every status query read all of it.
const INBOX_READ_LIMIT: usize = 1000;

/// The task files waiting in `inbox/` that name their id (as `cairn submit` writes them), by
/// file name. Files without an id get one only when the daemon takes them; files that do not
/// parse will be rejected: neither is listed.
pub fn inbox_tasks(root: &Path) -> Vec<(String, Task)> {
    let inbox = root.join("inbox");
    list_names(&inbox)
        .into_iter()
        .filter(|name| !name.starts_with('.') && name.ends_with(".json"))
        .take(INBOX_READ_LIMIT)
        .filter_map(|name| {
            let path = inbox.join(&name);
            // Only regular files, and not a huge one: the daemon will refuse those anyway.
            let meta = fs::symlink_metadata(&path).ok()?;
            if !meta.is_file() || meta.len() > crate::task::MAX_TASK_FILE_BYTES {
                return None;
            }
            let task = Task::parse(&fs::read(&path).ok()?).ok()?;
            task.id.is_some().then_some((name, task))
        })
        .collect()
}

/// A task still in the inbox: where it will start, as for a pending one.
fn submitted_view(root: &Path, name: &str, task: Task) -> TaskView {
    let mut view = TaskView::new(task.id(), TaskState::Submitted);
    view.definition_key = format!("inbox/{name}");
    view.phase_count = Some(task.phases.len());
    view.task = Some(task);
    pending(root, &mut view);
    view
}

/// Does the queue have any file of this task (definition, record, entry or checkpoint)?
pub fn task_exists(root: &Path, id: &str) -> bool {
    ["tasks", "done", "failed"]
        .iter()
        .any(|dir| root.join(dir).join(format!("{id}.json")).exists())
        || root
            .join("incremental")
            .join(format!("{id}.json.gz"))
            .exists()
        || read_current_work(root).is_ok_and(|work| work.get(id).is_some())
}

/// The names of the rejection records (`failed/rejected-*.json`) of files that were dropped as
/// `inbox/<file>` or `inbox/<file>.json`, the most recent first: a person knows the file name,
/// not the suffix intake gave the record.
pub fn rejections_of(root: &Path, file: &str) -> Vec<String> {
    let wanted = [format!("inbox/{file}"), format!("inbox/{file}.json")];
    let mut found: Vec<(Option<DateTime<Utc>>, String)> = json_stems(&root.join("failed"))
        .into_iter()
        .filter(|stem| stem.starts_with("rejected-"))
        .filter_map(|stem| {
            let record = Record::read(&root.join("failed").join(format!("{stem}.json"))).ok()?;
            let named = record.value["file"].as_str()?;
            (record.status == RecordStatus::Rejected && wanted.iter().any(|w| w == named))
                .then_some((record.at, stem))
        })
        .collect();
    found.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    found.into_iter().map(|(_, stem)| stem).collect()
}

fn rejected_view(stem: &str, record: Record) -> TaskView {
    let mut view = TaskView::new(stem, RecordStatus::Rejected.into());
    view.error = record.value["reason"]
        .as_str()
        .or_else(|| record.value["problem"].as_str())
        .map(str::to_string);
    view.record = Some(record);
    view
}

fn task_view(listing: &Listing, id: &TaskId) -> TaskView {
    let root = &listing.root;
    let mut view = TaskView::new(id, TaskState::Pending);

    let task_path = root.join("tasks").join(format!("{id}.json"));
    match fs::read(&task_path) {
        Ok(bytes) => match Task::parse_stored(&bytes) {
            Ok(mut task) => {
                task.id = Some(id.clone());
                view.task = Some(task);
            }
            Err(e) => view.warnings.push(format!("{}: {e}", task_path.display())),
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => view
            .warnings
            .push(format!("reading {}: {e}", task_path.display())),
    }
    view.phase_count = view.task.as_ref().map(|t| t.phases.len());

    let mut record = None;
    for dir in ["done", "failed"] {
        let path = root.join(dir).join(format!("{id}.json"));
        if path.exists() {
            match Record::read(&path) {
                Ok(r) => {
                    record = Some(r);
                    break;
                }
                Err(e) => view.warnings.push(format!("{e:#}")),
            }
        }
    }
    let entry = listing.work.get(id).cloned();
    // The entry `cairn retry` writes stands beside the record it brings back until the daemon
    // archives that record; then the entry is what is current.
    let retried = match (&entry, &record) {
        (Some(_), Some(record)) => listing
            .retry_of
            .get(id.as_str())
            .is_some_and(|at| Some(*at) == record.at),
        _ => false,
    };
    match (entry, record) {
        (Some(entry), None) => in_flight(listing, &mut view, entry),
        (Some(entry), Some(_)) if retried => in_flight(listing, &mut view, entry),
        (_, Some(record)) => finished(listing, &mut view, record),
        (None, None) => pending(root, &mut view),
    }
    view
}

/// A task in `current_work.json`.
fn in_flight(listing: &Listing, view: &mut TaskView, entry: ActiveTask) {
    view.state = TaskState::of_entry(&entry, listing.daemon.running);
    let index = entry.phase_index;
    view.phase = Some(entry.phase.clone());
    view.phase_index = Some(index);
    view.attempts = Some(entry.attempt);
    view.failed_attempts = Some(entry.failed_attempts);
    view.error = entry.last_error.clone();
    view.cost = entry.cost;
    view.lost_iterations = entry.lost_iterations;
    view.lost_cost_estimate = entry.lost_cost_estimate();
    view.last_checkpoint_at = entry.last_checkpoint_at;
    let phase = view
        .task
        .as_ref()
        .and_then(|t| t.phases.get(index))
        .cloned();
    view.kind = phase.as_ref().map(|p| p.kind);
    let iterative = view.kind.is_some_and(|k| k != PhaseKind::Once);
    if iterative {
        view.iteration = Some(entry.iterations);
        match listing.store.latest(&view.id) {
            Ok(Some(loaded)) => {
                for (key, why) in &loaded.skipped {
                    view.warnings.push(format!(
                        "{}: {why} (an older generation is used)",
                        listing.root.join(key).display()
                    ));
                }
                let cp = loaded.checkpoint;
                if cp.phase_index == index {
                    view.iteration = Some(cp.iteration_count);
                    view.last_checkpoint_at = Some(cp.last_checkpoint_at);
                    if cp.attempt == entry.attempt && cp.cost.is_some() {
                        view.cost = cp.cost;
                    }
                    view.checkpoint = Some(cp);
                }
            }
            Ok(None) => {}
            Err(e) => view.warnings.push(format!("task {}: {e}", view.id)),
        }
    }
    if let (Some(PhaseKind::Worker), Some(progress)) = (view.kind, entry.progress) {
        view.iteration = Some(view.iteration.unwrap_or(0).max(progress.done));
    }
    if let Some(phase) = &phase {
        view.total = match phase.kind {
            PhaseKind::Once => None,
            PhaseKind::Loop => phase.max_iterations,
            PhaseKind::Items => items_total(&listing.root, phase, |name| {
                entry.phase_outputs.get(name).cloned()
            }),
            PhaseKind::Worker => entry.progress.and_then(|p| p.total),
        };
    }
    if view.state == TaskState::InFlight(ActiveStatus::Running) && iterative {
        view.rate_per_min = rate_per_min(&listing.root, &view.id, &entry.phase);
        if let (Some(rate), Some(total), Some(done)) =
            (view.rate_per_min, view.total, view.iteration)
        {
            if rate > 0.0 && total >= done {
                view.eta_seconds = Some(((total - done) as f64 / rate * 60.0).ceil() as u64);
            }
        }
    }
    view.entry = Some(entry);
}

/// A task with a record in `done/` or `failed/`.
fn finished(listing: &Listing, view: &mut TaskView, record: Record) {
    view.state = record.status.clone().into();
    let value = &record.value;
    view.attempts = record.u32_field("attempts");
    view.failed_attempts = record.u32_field("failed_attempts");
    view.cost = value["cost"].as_f64();
    view.lost_iterations = value["lost_iterations"].as_u64().unwrap_or(0);
    view.lost_cost_estimate = value["lost_cost_estimate"].as_f64();
    view.error = value["error"].as_str().map(str::to_string);
    let phase_count = view.phase_count;
    let index = match value["phase_index"].as_u64() {
        Some(i) => Some(i as usize),
        // A done record: its last phase.
        None => phase_count.and_then(|n| n.checked_sub(1)),
    };
    view.phase_index = index;
    view.phase = value["phase"].as_str().map(str::to_string).or_else(|| {
        let task = view.task.as_ref()?;
        Some(task.phases.get(index?)?.name.clone())
    });
    let phase = view
        .task
        .as_ref()
        .and_then(|t| t.phases.get(index?))
        .cloned();
    view.kind = phase.as_ref().map(|p| p.kind);
    // Iterations of that phase (and a worker's total), as the record's timings tell.
    let timing = match (&view.phase, value["phases"].as_array()) {
        (Some(name), Some(timings)) => timings
            .iter()
            .rev()
            .find(|t| t["name"].as_str() == Some(name))
            .cloned(),
        _ => None,
    };
    view.iteration = timing.as_ref().and_then(|t| t["iterations"].as_u64());
    if !view.state.is_done() && view.kind.is_some_and(|k| k != PhaseKind::Once) {
        // Stopped mid-phase: its checkpoints are kept for a retry.
        if let Ok(Some(loaded)) = listing.store.latest(&view.id) {
            if Some(loaded.checkpoint.phase_index) == index {
                view.iteration = Some(loaded.checkpoint.iteration_count);
                view.last_checkpoint_at = Some(loaded.checkpoint.last_checkpoint_at);
                view.checkpoint = Some(loaded.checkpoint);
            }
        }
    }
    if let Some(phase) = &phase {
        let outputs = value["phase_outputs"].clone();
        view.total = match phase.kind {
            PhaseKind::Loop => phase.max_iterations,
            PhaseKind::Items => items_total(&listing.root, phase, |name| {
                outputs.get(name).cloned().map(StoredOutput::Inline)
            }),
            PhaseKind::Worker => timing.as_ref().and_then(|t| t["total"].as_u64()),
            PhaseKind::Once => None,
        };
    }
    view.record = Some(record);
}

/// Accepted and not started: where it will start (phase 0, or a fork's start point).
fn pending(root: &Path, view: &mut TaskView) {
    let start = fs::read(root.join("runs").join(&view.id).join("start.json"))
        .ok()
        .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
        .and_then(|v| v["phase_index"].as_u64())
        .unwrap_or(0) as usize;
    if let Some(phase) = view.task.as_ref().and_then(|t| t.phases.get(start)) {
        view.phase = Some(phase.name.clone());
        view.phase_index = Some(start);
        view.kind = Some(phase.kind);
        view.total = match phase.kind {
            PhaseKind::Loop => phase.max_iterations,
            PhaseKind::Items => phase.items.as_ref().map(|items| items.len() as u64),
            _ => None,
        };
    }
    view.attempts = Some(0);
}

/// The number of items of an items phase: its literal list, or the array an earlier phase put
/// out (inline in `current_work.json`, in a per-task file, or in a record).
fn items_total(
    root: &Path,
    phase: &crate::task::Phase,
    output_of: impl Fn(&str) -> Option<StoredOutput>,
) -> Option<u64> {
    if let Some(items) = &phase.items {
        return Some(items.len() as u64);
    }
    let output = match output_of(phase.items_from.as_deref()?)? {
        StoredOutput::Inline(value) => value,
        StoredOutput::File(key) => {
            if !is_plain_key(&key) {
                return None;
            }
            serde_json::from_slice(&fs::read(root.join(&key)).ok()?).ok()?
        }
    };
    output.as_array().map(|items| items.len() as u64)
}

/// A storage key that stays inside the queue.
fn is_plain_key(key: &str) -> bool {
    !key.starts_with('/') && key.split('/').all(|part| part != ".." && !part.is_empty())
}

/// Iterations per minute of the phase in flight, from the `checkpoint` events of its current
/// run (since its last `phase_started`): first to last checkpoint; with a single checkpoint,
/// from the phase's start (at the iteration it resumed from).
fn rate_per_min(root: &Path, id: &str, phase: &str) -> Option<f64> {
    let events = read_journal_tail(root, id, JOURNAL_TAIL_BYTES).ok()?;
    rate_from_events(&events, phase)
}

/// See [`rate_per_min`].
pub fn rate_from_events(events: &[JournalEvent], phase: &str) -> Option<f64> {
    let checkpoint_iteration = |e: &JournalEvent| match &e.event {
        Event::Checkpoint {
            phase: of,
            iteration,
            ..
        } if of == phase => Some(*iteration),
        _ => None,
    };
    let started = events
        .iter()
        .rposition(|e| matches!(&e.event, Event::PhaseStarted { phase: of, .. } if of == phase));
    let run = &events[started.map_or(0, |i| i + 1)..];
    let points: Vec<(DateTime<Utc>, u64)> = run
        .iter()
        .filter_map(|e| Some((e.at, checkpoint_iteration(e)?)))
        .collect();
    let (first, last) = match (points.first(), points.last()) {
        (Some(first), Some(last)) if points.len() >= 2 => (*first, *last),
        (Some(last), _) => {
            // One checkpoint in this run: measure from the phase's start, at the iteration
            // the run resumed from (the last checkpoint before it; 0 when there is none).
            let start = &events[started?];
            let before = &events[..started?];
            let resumed_from = before.iter().rev().find_map(checkpoint_iteration);
            let resumed_from = match resumed_from {
                Some(n) => n,
                // Nothing earlier: 0 only if the journal is whole (it starts with `accepted`)
                // and holds every checkpoint the task wrote — a forked task starts from a
                // checkpoint its journal does not list (its generation numbers tell).
                None if events
                    .first()
                    .is_some_and(|e| matches!(e.event, Event::Accepted { .. })) =>
                {
                    let written_before = before
                        .iter()
                        .filter(|e| matches!(e.event, Event::Checkpoint { .. }))
                        .count();
                    let generation = run.iter().find_map(|e| match e.event {
                        Event::Checkpoint { generation, .. }
                            if checkpoint_iteration(e).is_some() =>
                        {
                            Some(generation)
                        }
                        _ => None,
                    });
                    if generation.is_some_and(|g| g != written_before as u64 + 1) {
                        return None;
                    }
                    0
                }
                None => return None,
            };
            ((start.at, resumed_from), *last)
        }
        _ => return None,
    };
    let minutes = (last.0 - first.0).num_milliseconds() as f64 / 60_000.0;
    if minutes <= 0.0 || last.1 <= first.1 {
        return None;
    }
    Some((last.1 - first.1) as f64 / minutes)
}

/// The events at the end of a task's journal (at most about `max_bytes` of it; a line cut by
/// the start of the window is skipped, as are torn lines).
pub fn read_journal_tail(root: &Path, id: &str, max_bytes: u64) -> io::Result<Vec<JournalEvent>> {
    let path = journal::journal_path(root, id);
    let mut file = match fs::File::open(&path) {
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

/// Read `current_work.json` (missing: nothing in flight).
pub fn read_current_work(root: &Path) -> anyhow::Result<CurrentWork> {
    let path = root.join("current_work.json");
    match fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .with_context(|| format!("{} cannot be read", path.display())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(CurrentWork::default()),
        Err(e) => Err(anyhow::Error::new(e).context(format!("reading {}", path.display()))),
    }
}

/// The `retry_of` stamps in `current_work.json`, read from its JSON so that this reader does
/// not depend on the field's type.
fn read_retry_of(root: &Path) -> HashMap<String, DateTime<Utc>> {
    let Ok(bytes) = fs::read(root.join("current_work.json")) else {
        return HashMap::new();
    };
    let Ok(value) = serde_json::from_slice::<Value>(&bytes) else {
        return HashMap::new();
    };
    let entries = value["active_tasks"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    entries
        .iter()
        .filter_map(|entry| {
            let id = entry["task_id"].as_str()?;
            let at = DateTime::parse_from_rfc3339(entry["retry_of"].as_str()?).ok()?;
            Some((id.to_string(), at.with_timezone(&Utc)))
        })
        .collect()
}

/// Is a daemon alive on this queue: the pid in `.lock` names a live process that holds a
/// lock. The lock is never taken here.
pub fn daemon_info(root: &Path) -> DaemonInfo {
    let lock = root.join(".lock");
    let pid = fs::read_to_string(&lock)
        .ok()
        .and_then(|text| text.trim().parse::<i32>().ok())
        .filter(|pid| *pid > 0);
    let running = pid.is_some_and(|pid| process_alive(pid) && holds_a_lock(&lock, pid));
    DaemonInfo {
        running,
        pid: pid.filter(|_| running),
    }
}

/// The process exists and is not a zombie.
fn process_alive(pid: i32) -> bool {
    use nix::errno::Errno;
    use nix::sys::signal::kill;
    match kill(nix::unistd::Pid::from_raw(pid), None) {
        Ok(()) | Err(Errno::EPERM) => {}
        Err(_) => return false,
    }
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_none_or(|(_, rest)| !rest.starts_with('Z')),
        // No /proc: the kernel's answer above is all there is.
        Err(_) => true,
    }
}

/// After a reboot the pid in `.lock` may belong to an unrelated process. `/proc/locks` lists
/// every `flock` with its owner's pid and the file's inode: a daemon holds one on `.lock`.
/// Where `/proc/locks` cannot be read, the pid is trusted.
fn holds_a_lock(lock: &Path, pid: i32) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(locks) = fs::read_to_string("/proc/locks") else {
        return true;
    };
    let inode = fs::metadata(lock).map(|m| m.ino()).ok();
    locks.lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF" (blocked waiters have "->").
        let fields: Vec<&str> = fields.into_iter().filter(|f| *f != "->").collect();
        if fields.get(1) != Some(&"FLOCK") {
            return false;
        }
        let owner = fields.get(4).and_then(|p| p.parse::<i32>().ok());
        let file_inode = fields
            .get(5)
            .and_then(|dev_ino| dev_ino.rsplit(':').next())
            .and_then(|ino| ino.parse::<u64>().ok());
        owner == Some(pid) || (inode.is_some() && file_inode == inode)
    })
}

/// The stems of `dir/*.json`, dot-files left out.
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

/// A file's modification time.
pub fn mtime(path: &Path) -> Option<DateTime<Utc>> {
    fs::symlink_metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .map(DateTime::<Utc>::from)
}

/// Run `f` with tracing silenced (the store logs what the views report themselves).
pub fn quietly<T>(f: impl FnOnce() -> T) -> T {
    tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::default(), f)
}

/// RFC 3339 with milliseconds, UTC.
pub fn rfc3339(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// A duration for people: `45s`, `3m05s`, `2h05m`, `3d04h`.
pub fn short_duration(seconds: u64) -> String {
    let (d, h, m, s) = (
        seconds / 86_400,
        seconds / 3600 % 24,
        seconds / 60 % 60,
        seconds % 60,
    );
    if d > 0 {
        format!("{d}d{h:02}h")
    } else if h > 0 {
        format!("{h}h{m:02}m")
    } else if m > 0 {
        format!("{m}m{s:02}s")
    } else {
        format!("{s}s")
    }
}

/// The committed cost, and apart from it the estimate for iterations lost to crashes:
/// `0.03+~0.02`, without spaces, as table cells are (`None` when neither is known).
pub fn cost_cell(task: &TaskView) -> Option<String> {
    match (task.cost, task.lost_cost_estimate) {
        (None, None) => None,
        (cost, None) => cost.map(format_cost),
        (cost, Some(estimate)) => Some(format!(
            "{}+~{}",
            format_cost(cost.unwrap_or(0.0)),
            format_cost(estimate)
        )),
    }
}

/// A cost for people: up to 4 decimals, trailing zeros dropped.
pub fn format_cost(cost: f64) -> String {
    let text = format!("{cost:.4}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text.is_empty() || text == "-" {
        "0".into()
    } else {
        text.to_string()
    }
}

/// A rate for people: `2.5/min`, `40/min`.
pub fn format_rate(per_min: f64) -> String {
    if per_min >= 10.0 {
        format!("{per_min:.0}/min")
    } else if per_min >= 0.1 {
        format!("{per_min:.1}/min")
    } else {
        format!("{:.1}/h", per_min * 60.0)
    }
}

/// A size for people: `512 B`, `1.2 KiB`, `3.4 MiB`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// Left-aligned columns separated by two spaces; the last column is not padded.
pub fn render_table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        let last = cells.len().saturating_sub(1);
        for (i, cell) in cells.iter().enumerate() {
            out.push_str(cell);
            if i < last {
                let pad = widths[i] - cell.chars().count() + 2;
                out.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push('\n');
        out
    };
    let mut out = line(header.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// A task id as given on the command line, checked before it names any file.
pub fn task_id_arg(id: &str) -> anyhow::Result<TaskId> {
    TaskId::parse(id).with_context(|| format!("{id:?} is not a task id"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(at_ms: i64, event: Event) -> JournalEvent {
        JournalEvent {
            at: DateTime::from_timestamp_millis(1_700_000_000_000 + at_ms).unwrap(),
            event,
        }
    }

    fn checkpoint(at_ms: i64, iteration: u64, generation: u64) -> JournalEvent {
        event(
            at_ms,
            Event::Checkpoint {
                phase: "p".into(),
                iteration,
                generation,
                bytes: 100,
                ms: 1.0,
            },
        )
    }

    fn accepted() -> JournalEvent {
        event(0, Event::Accepted { priority: 0 })
    }

    #[test]
    fn rate_is_measured_over_the_current_run_of_the_phase() {
        // Generations as the task wrote them: one per checkpoint.
        let cp = |ms, i| checkpoint(ms, i, i);
        let started = |ms| {
            event(
                ms,
                Event::PhaseStarted {
                    phase: "p".into(),
                    phase_index: 0,
                    kind: PhaseKind::Loop,
                    attempt: 1,
                },
            )
        };
        // An earlier run, a day ago, must not dilute the rate of this one.
        let events = vec![
            accepted(),
            started(0),
            cp(1_000, 1),
            cp(2_000, 2),
            started(86_400_000),
            cp(86_401_000, 3),
            cp(86_403_000, 5),
            cp(86_405_000, 7),
        ];
        // 4 iterations in 4 s.
        assert_eq!(rate_from_events(&events, "p"), Some(60.0));
        // One checkpoint in this run: from the phase's start, resumed at 2.
        assert_eq!(rate_from_events(&events[..6], "p"), Some(60.0));
        // Another phase's checkpoints do not count.
        assert_eq!(rate_from_events(&events, "q"), None);
        // A single checkpoint after a start with nothing before it: from 0 only when the
        // journal is whole.
        let fresh = vec![accepted(), started(0), cp(30_000, 1)];
        assert_eq!(rate_from_events(&fresh, "p"), Some(2.0));
        assert_eq!(rate_from_events(&fresh[1..], "p"), None);
        // A fork starts from a checkpoint (generation 1) its own journal does not list.
        let forked = vec![accepted(), started(0), checkpoint(30_000, 6, 2)];
        assert_eq!(rate_from_events(&forked, "p"), None);
    }

    #[test]
    fn people_formats() {
        assert_eq!(short_duration(5), "5s");
        assert_eq!(short_duration(65), "1m05s");
        assert_eq!(short_duration(7_500), "2h05m");
        assert_eq!(short_duration(90_000), "1d01h");
        assert_eq!(format_cost(0.125), "0.125");
        assert_eq!(format_cost(2.0), "2");
        assert_eq!(format_rate(2.54), "2.5/min");
        assert_eq!(format_rate(40.4), "40/min");
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(1536), "1.5 KiB");
        assert_eq!(
            render_table(&["A", "BB"], &[vec!["xyz".into(), "1".into()]]),
            "A    BB\nxyz  1\n"
        );
    }
}
