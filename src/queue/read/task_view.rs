//! One task as the read model sees it, and how it is put together from the queue's files.
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

use std::collections::HashMap;
use std::io;

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::liveness::DaemonInfo;
use super::rate::rate_from_events;
use super::record::Record;
use super::QueueReader;
use crate::queue::QueueDir;
use crate::store::current_work::{
    ActiveStatus, ActiveTask, CurrentWork, PolicyPause, StoredOutput,
};
use crate::store::journal::JournalEvent;
use crate::store::records::RecordStatus;
use crate::store::task_state::TaskState;
use crate::store::{IterationCheckpoint, LoadedCheckpoint};
use crate::submitter::Submitter;
use crate::task::{Phase, PhaseKind, Task};
use crate::task_id::TaskId;

/// How much of the end of a task's journal the model reads to work out a rate.
const JOURNAL_TAIL_BYTES: u64 = 256 * 1024;

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
    /// The spending limit in force: the one `cairn budget` set, else the definition's.
    pub max_cost: Option<f64>,
    /// Why a policy of the task's own paused it (its budget, its used-up attempts).
    pub paused_for: Option<PolicyPause>,
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
    /// The lease of a task a daemon holds, on a queue shared through a database (`None` on
    /// the file queue, where the one daemon's lock stands for every task).
    pub lease: Option<TaskLease>,
}

/// Which daemon holds a task of a shared queue, and until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskLease {
    pub node: String,
    pub epoch: i64,
    /// When the lease ends unless renewed (the database's clock).
    pub expires_at: DateTime<Utc>,
    /// Whether it had not ended when the queue was read.
    pub live: bool,
}

/// What the view of one task needs besides its definition, entry and record: its
/// checkpoints, stored outputs, recent events and start point. The file queue reads them
/// from its files; a queue shared through a database from its rows.
pub(crate) trait TaskFacts {
    /// The newest checkpoint of the task that decodes.
    fn latest_checkpoint(&self, id: &str) -> Result<Option<LoadedCheckpoint>, String>;
    /// How a warning names a storage key (a file's path, a row's name).
    fn describe_key(&self, key: &str) -> String;
    /// A phase output as the work state refers to it.
    fn stored_output(&self, stored: &StoredOutput) -> Option<Value>;
    /// The task's recent events, oldest first (enough to work out a rate).
    fn recent_events(&self, id: &str) -> Vec<JournalEvent>;
    /// The phase a task not started yet starts at (a fork's start point, else 0).
    fn start_phase(&self, id: &str) -> usize;
}

impl TaskFacts for QueueReader {
    fn latest_checkpoint(&self, id: &str) -> Result<Option<LoadedCheckpoint>, String> {
        self.checkpoints().latest(id).map_err(|e| e.to_string())
    }

    fn describe_key(&self, key: &str) -> String {
        self.path_of_key(key).display().to_string()
    }

    fn stored_output(&self, stored: &StoredOutput) -> Option<Value> {
        QueueReader::stored_output(self, stored).ok()
    }

    fn recent_events(&self, id: &str) -> Vec<JournalEvent> {
        super::files::read_journal_tail(&self.journal_file(id), JOURNAL_TAIL_BYTES)
            .unwrap_or_default()
    }

    fn start_phase(&self, id: &str) -> usize {
        QueueReader::start_phase(self, id)
    }
}

impl TaskView {
    pub(crate) fn new(id: &str, state: TaskState) -> TaskView {
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
            max_cost: None,
            paused_for: None,
            last_checkpoint_at: None,
            attempts: None,
            failed_attempts: None,
            error: None,
            task: None,
            entry: None,
            record: None,
            checkpoint: None,
            warnings: Vec::new(),
            definition_key: QueueDir::task_key(id),
            lease: None,
        }
    }

    /// Seconds since the last checkpoint, as of `now`.
    /// Who submitted the task: its stored definition says, or else its final record (a task
    /// still in the inbox, or accepted before cairn recorded submitters, has none).
    pub fn submitted_by(&self) -> Option<Submitter> {
        if let Some(submitter) = self.task.as_ref().and_then(Task::submitted_by) {
            return Some(submitter.clone());
        }
        let record = self.record.as_ref()?;
        serde_json::from_value(record.value.get("submitted_by")?.clone()).ok()
    }

    pub fn checkpoint_age(&self, now: DateTime<Utc>) -> Option<u64> {
        self.last_checkpoint_at
            .map(|at| (now - at).num_seconds().max(0) as u64)
    }
}

/// The queue's shared files, read once for a whole view.
pub(super) struct Listing<'a> {
    pub reader: &'a QueueReader,
    pub work: CurrentWork,
    pub daemon: DaemonInfo,
    /// The `retry_of` of the entries `cairn retry` wrote, by task id.
    pub retry_of: HashMap<String, DateTime<Utc>>,
    pub warnings: Vec<String>,
    /// Why `current_work.json` could not be read: what is in flight is unknown.
    pub work_problem: Option<String>,
}

impl Listing<'_> {
    pub(super) fn read(reader: &QueueReader) -> Listing<'_> {
        let mut warnings = Vec::new();
        let (work, work_problem) = match reader.current_work() {
            Ok(work) => (work, None),
            Err(e) => {
                warnings.push(e.to_string());
                (CurrentWork::default(), Some(e.to_string()))
            }
        };
        let retry_of = work
            .active_tasks
            .iter()
            .filter_map(|entry| Some((entry.task_id.to_string(), entry.retry_of?)))
            .collect();
        Listing {
            reader,
            work,
            daemon: reader.daemon(),
            retry_of,
            warnings,
            work_problem,
        }
    }
}

/// A task still in the inbox: where it will start, as for a pending one.
pub(super) fn submitted_view(reader: &QueueReader, name: &str, task: Task) -> TaskView {
    let mut view = TaskView::new(task.id(), TaskState::Submitted);
    view.definition_key = QueueDir::inbox_name_key(name);
    view.phase_count = Some(task.phases.len());
    view.task = Some(task);
    pending(reader, &mut view);
    view
}

/// A file refused at intake, by its record's stem.
pub(super) fn rejected_view(stem: &str, record: Record) -> TaskView {
    let mut view = TaskView::new(stem, RecordStatus::Rejected.into());
    view.error = record.value["reason"]
        .as_str()
        .or_else(|| record.value["problem"].as_str())
        .map(str::to_string);
    view.record = Some(record);
    view
}

/// A task the queue knows by id: accepted, in flight or finished.
pub(super) fn task_view(listing: &Listing, id: &TaskId) -> TaskView {
    let reader = listing.reader;
    let mut view = TaskView::new(id, TaskState::Pending);
    read_definition(reader, &mut view, id);
    view.phase_count = view.task.as_ref().map(|t| t.phases.len());

    let mut record = None;
    for path in [reader.dir().done_file(id), reader.dir().failed_file(id)] {
        if path.exists() {
            match Record::read(&path) {
                Ok(r) => {
                    record = Some(r);
                    break;
                }
                Err(e) => view.warnings.push(e.to_string()),
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
        (Some(entry), None) => in_flight(reader, listing.daemon.running, &mut view, entry),
        (Some(entry), Some(_)) if retried => {
            in_flight(reader, listing.daemon.running, &mut view, entry)
        }
        (_, Some(record)) => finished(reader, &mut view, record),
        (None, None) => pending(reader, &mut view),
    }
    view
}

/// `tasks/<id>.json`, noting a file that does not read.
fn read_definition(reader: &QueueReader, view: &mut TaskView, id: &TaskId) {
    let task_path = reader.dir().task_file(&view.id);
    match super::files::read_queue_file(&task_path) {
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
}

/// A task in flight, from its work-state entry (`daemon_alive`: whether the daemon that
/// wrote a `running` entry still runs).
pub(crate) fn in_flight(
    facts: &dyn TaskFacts,
    daemon_alive: bool,
    view: &mut TaskView,
    entry: ActiveTask,
) {
    view.state = TaskState::of_entry(&entry, daemon_alive);
    let index = entry.phase_index;
    view.phase = Some(entry.phase.clone());
    view.phase_index = Some(index);
    view.attempts = Some(entry.attempt);
    view.failed_attempts = Some(entry.failed_attempts);
    view.error = entry.last_error.clone();
    view.cost = entry.cost;
    view.lost_iterations = entry.lost_iterations;
    view.lost_cost_estimate = entry.lost_cost_estimate();
    view.max_cost = entry.spend_limit(view.task.as_ref().and_then(|t| t.budget.as_ref()));
    if entry.status == ActiveStatus::Paused {
        view.paused_for = entry.paused_for.clone();
    }
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
        latest_in_flight(facts, view, &entry);
    }
    if let (Some(PhaseKind::Worker), Some(progress)) = (view.kind, entry.progress) {
        view.iteration = Some(view.iteration.unwrap_or(0).max(progress.done));
    }
    if let Some(phase) = &phase {
        view.total = match phase.kind {
            PhaseKind::Once => None,
            PhaseKind::Loop => phase.max_iterations,
            PhaseKind::Items => {
                items_total(facts, phase, |name| entry.phase_outputs.get(name).cloned())
            }
            PhaseKind::Worker => entry.progress.and_then(|p| p.total),
        };
    }
    if view.state == TaskState::InFlight(ActiveStatus::Running) && iterative {
        view.rate_per_min = rate_from_events(&facts.recent_events(&view.id), &entry.phase);
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

/// The latest checkpoint of a task in flight, when it is of the phase in flight: its
/// iteration, time and (for this attempt) cost are fresher than the entry's.
fn latest_in_flight(facts: &dyn TaskFacts, view: &mut TaskView, entry: &ActiveTask) {
    match facts.latest_checkpoint(&view.id) {
        Ok(Some(loaded)) => {
            for (key, why) in &loaded.skipped {
                view.warnings.push(format!(
                    "{}: {why} (an older generation is used)",
                    facts.describe_key(key)
                ));
            }
            let cp = loaded.checkpoint;
            if cp.phase_index == entry.phase_index {
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

/// A task with a final record.
pub(crate) fn finished(facts: &dyn TaskFacts, view: &mut TaskView, record: Record) {
    view.state = record.status.clone().into();
    let value = &record.value;
    view.attempts = record.u32_field("attempts");
    view.failed_attempts = record.u32_field("failed_attempts");
    view.cost = value["cost"].as_f64();
    view.lost_iterations = value["lost_iterations"].as_u64().unwrap_or(0);
    view.lost_cost_estimate = value["lost_cost_estimate"].as_f64();
    view.max_cost = value["max_cost"].as_f64().or_else(|| {
        let budget = view.task.as_ref()?.budget.as_ref()?;
        Some(budget.max_cost)
    });
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
        if let Ok(Some(loaded)) = facts.latest_checkpoint(&view.id) {
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
            // A loop that ended on `"done": true` ran all the iterations it was going to.
            PhaseKind::Loop if view.state.is_done() => view.iteration.or(phase.max_iterations),
            PhaseKind::Loop => phase.max_iterations,
            PhaseKind::Items => items_total(facts, phase, |name| {
                outputs.get(name).cloned().map(StoredOutput::Inline)
            }),
            PhaseKind::Worker => timing.as_ref().and_then(|t| t["total"].as_u64()),
            PhaseKind::Once => None,
        };
    }
    view.record = Some(record);
}

/// Accepted and not started: where it will start (phase 0, or a fork's start point).
pub(crate) fn pending(facts: &dyn TaskFacts, view: &mut TaskView) {
    let start = facts.start_phase(&view.id);
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
    view.max_cost = view
        .task
        .as_ref()
        .and_then(|t| t.budget.as_ref())
        .map(|b| b.max_cost);
}

/// The number of items of an items phase: its literal list, or the array an earlier phase put
/// out (inline in `current_work.json`, in a per-task file, or in a record).
fn items_total(
    facts: &dyn TaskFacts,
    phase: &Phase,
    output_of: impl Fn(&str) -> Option<StoredOutput>,
) -> Option<u64> {
    if let Some(items) = &phase.items {
        return Some(items.len() as u64);
    }
    let output: Value = match output_of(phase.items_from.as_deref()?)? {
        StoredOutput::Inline(value) => value,
        stored => facts.stored_output(&stored)?,
    };
    output.as_array().map(|items| items.len() as u64)
}
