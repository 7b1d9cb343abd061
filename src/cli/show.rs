//! `cairn show ID [--json]`: one task in full — its definition, each phase with its output or
//! progress, attempts, errors, and the timeline of its event journal (`runs/<id>/events.jsonl`).

use std::fs;
use std::path::Path;

use chrono::{DateTime, Utc};
use clap::Args;
use serde_json::{json, Map, Value};

use super::error::{print, CliError, CliResult, ExitCodeExt};
use super::exit;
use super::status::{iter_cell, phase_cell};
use super::view::{self, TaskView};
use crate::store::current_work::{PhaseTiming, StoredOutput};
use crate::store::journal::{self, JournalEvent};
use crate::store::task_state::TaskState;
use crate::task::PhaseKind;
use crate::task_id::TaskId;

#[derive(Debug, Args)]
#[command(after_help = "The --json document is described in docs/cli.md (\"version\": 1).")]
pub struct ShowArgs {
    /// The task id (or the name of a rejection record, rejected-…).
    id: String,

    /// Print a JSON document instead.
    #[arg(long)]
    json: bool,
}

/// One phase as `show` lists it.
struct PhaseRow {
    index: usize,
    name: String,
    kind: Option<PhaseKind>,
    state: PhaseState,
    output: Option<Value>,
    iteration: Option<u64>,
    total: Option<u64>,
    started_at: Option<DateTime<Utc>>,
    finished_at: Option<DateTime<Utc>>,
}

pub fn run(queue: &Path, args: ShowArgs) -> CliResult {
    let id = view::task_id_arg(&args.id).exit_code(exit::USAGE)?;
    let root = std::path::absolute(queue).unwrap_or_else(|_| queue.to_path_buf());
    let Some(task) = find(&root, &id) else {
        return Err(CliError::failure(format_args!(
            "queue {} has no task {:?} (no tasks/{id}.json, done/{id}.json, failed/{id}.json, \
             entry in current_work.json nor rejected inbox/{id}.json); `cairn status --all` lists \
             the tasks",
            root.display(),
            args.id,
            id = args.id
        )));
    };
    for warning in &task.warnings {
        eprintln!("warning: {warning}");
    }
    let daemon = view::daemon_info(&root);
    let timeline = match journal::read(&root, &id) {
        Ok(events) => events,
        Err(e) => {
            eprintln!(
                "warning: reading {}: {e}",
                journal::journal_path(&root, &id).display()
            );
            Vec::new()
        }
    };
    let phases = phase_rows(&root, &task);
    let earlier = earlier_failures(&root, &id);
    let logs = log_files(&root, &task.id);
    let now = Utc::now();
    let text = if args.json {
        let document = json!({
            "version": view::JSON_VERSION,
            "queue": root.display().to_string(),
            "daemon": daemon.to_json(),
            "id": task.id,
            "state": task.state.as_str(),
            "status": task.to_json(now),
            "definition": task.task.as_ref().map(|t| serde_json::to_value(t).unwrap_or(Value::Null)),
            "phases": phases.iter().map(phase_json).collect::<Vec<_>>(),
            "attempts": task.attempts,
            "failed_attempts": task.failed_attempts,
            "error": task.error,
            "record": task.record.as_ref().map(|r| r.value.clone()),
            "earlier_failures": earlier,
            "logs": logs.iter().map(|(path, bytes)| json!({"path": path.display().to_string(), "bytes": bytes})).collect::<Vec<_>>(),
            "timeline": timeline,
        });
        let mut text = serde_json::to_string_pretty(&document).unwrap_or_default();
        text.push('\n');
        text
    } else {
        let details = Details {
            phases: &phases,
            earlier: &earlier,
            logs: &logs,
            timeline: &timeline,
        };
        human(&root, &task, daemon, &details, now)
    };
    print(&text)
}

/// The task with this id; else the latest rejection of the inbox file of this name (others
/// are named on stderr).
fn find(root: &Path, id: &TaskId) -> Option<TaskView> {
    if let Some(task) = view::load_task(root, id) {
        return Some(task);
    }
    let rejections = view::rejections_of(root, id);
    let (latest, older) = rejections.split_first()?;
    if !older.is_empty() {
        eprintln!(
            "note: inbox/{id} was rejected {} times; this is the latest, the others are {}",
            rejections.len(),
            older.join(", ")
        );
    }
    view::load_task(root, &TaskId::parse(latest.as_str()).ok()?)
}

fn phase_json(row: &PhaseRow) -> Value {
    json!({
        "index": row.index,
        "name": row.name,
        "kind": row.kind.map(|k| k.as_str()),
        "state": row.state.as_str(),
        "iteration": row.iteration,
        "total": row.total,
        "started_at": row.started_at.map(view::rfc3339),
        "finished_at": row.finished_at.map(view::rfc3339),
        "output": row.output,
    })
}

/// The task's phases: from its definition, else (definition lost) from its record's timings.
fn phase_rows(root: &Path, task: &TaskView) -> Vec<PhaseRow> {
    let timings: Vec<PhaseTiming> = match (&task.entry, &task.record) {
        (Some(entry), _) if task.state.is_in_flight() => entry.phases.clone(),
        (_, Some(record)) => {
            serde_json::from_value(record.value["phases"].clone()).unwrap_or_default()
        }
        _ => Vec::new(),
    };
    let names: Vec<(String, Option<PhaseKind>)> = match &task.task {
        Some(def) => def
            .phases
            .iter()
            .map(|p| (p.name.clone(), Some(p.kind)))
            .collect(),
        None => {
            let mut names: Vec<(String, Option<PhaseKind>)> = Vec::new();
            for t in &timings {
                if !names.iter().any(|(n, _)| n == &t.name) {
                    names.push((t.name.clone(), None));
                }
            }
            names
        }
    };
    let current = task.phase_index;
    names
        .into_iter()
        .enumerate()
        .map(|(index, (name, kind))| {
            let timing = timings.iter().rev().find(|t| t.name == name);
            let state = phase_state(task, index, current);
            let is_done = state == PhaseState::Done;
            let is_current = Some(index) == current && !is_done;
            let output = if is_done {
                phase_output(root, task, &name)
            } else {
                None
            };
            let (iteration, total) = if is_current || task.state.not_started() {
                if Some(index) == current {
                    (task.iteration, task.total)
                } else {
                    (None, definition_total(task, index))
                }
            } else {
                (
                    timing.and_then(|t| t.iterations),
                    definition_total(task, index).or(timing.and_then(|t| t.total)),
                )
            };
            PhaseRow {
                index,
                name,
                kind,
                state,
                output,
                iteration,
                total,
                started_at: timing.map(|t| t.started_at),
                finished_at: timing.and_then(|t| t.finished_at),
            }
        })
        .collect()
}

/// Where one phase of a task stands.
#[derive(Debug, Clone, PartialEq)]
enum PhaseState {
    Done,
    Pending,
    /// The phase the task is at: the task's own state.
    Current(TaskState),
    /// After the phase that ended the task.
    NotRun,
}

impl PhaseState {
    fn as_str(&self) -> &str {
        match self {
            PhaseState::Done => "done",
            PhaseState::Pending => "pending",
            PhaseState::Current(state) => state.as_str(),
            PhaseState::NotRun => "not_run",
        }
    }
}

fn phase_state(task: &TaskView, index: usize, current: Option<usize>) -> PhaseState {
    match (&task.state, current) {
        (state, _) if state.is_done() => PhaseState::Done,
        (state, _) if state.not_started() => PhaseState::Pending,
        (_, Some(c)) if index < c => PhaseState::Done,
        (state, Some(c)) if index == c => PhaseState::Current(state.clone()),
        (state, _) if state.is_in_flight() => PhaseState::Pending,
        _ => PhaseState::NotRun,
    }
}

/// A literal item count or a loop's `max_iterations`.
fn definition_total(task: &TaskView, index: usize) -> Option<u64> {
    let phase = task.task.as_ref()?.phases.get(index)?;
    match phase.kind {
        PhaseKind::Loop => phase.max_iterations,
        PhaseKind::Items => phase.items.as_ref().map(|i| i.len() as u64),
        _ => None,
    }
}

/// A finished phase's output, from the entry in flight or the record.
fn phase_output(root: &Path, task: &TaskView, name: &str) -> Option<Value> {
    if task.state.is_in_flight() {
        return match task.entry.as_ref()?.phase_outputs.get(name)? {
            StoredOutput::Inline(value) => Some(value.clone()),
            StoredOutput::File(key) => {
                let path = root.join(key);
                match fs::read(&path)
                    .map_err(|e| e.to_string())
                    .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
                {
                    Ok(value) => Some(value),
                    Err(e) => Some(json!({"unreadable": format!("{}: {e}", path.display())})),
                }
            }
        };
    }
    task.record
        .as_ref()?
        .value
        .get("phase_outputs")?
        .get(name)
        .cloned()
}

/// The stderr logs of a task's commands (`runs/<id>/<index>-<phase>.log`), with their sizes.
fn log_files(root: &Path, id: &str) -> Vec<(std::path::PathBuf, u64)> {
    let dir = root.join("runs").join(id);
    view::list_names(&dir)
        .into_iter()
        .filter(|name| name.ends_with(".log"))
        .filter_map(|name| {
            let path = dir.join(name);
            let bytes = fs::metadata(&path).ok()?.len();
            Some((path, bytes))
        })
        .collect()
}

/// Where to read what the commands printed on stderr.
fn logs_section(root: &Path, id: &str, logs: &[(std::path::PathBuf, u64)]) -> String {
    let mut out = format!("\nlogs  {}\n", root.join("runs").join(id).display());
    if logs.is_empty() {
        out.push_str("  (none yet)\n");
    }
    for (path, bytes) in logs {
        out.push_str(&format!(
            "  {}  {}\n",
            path.display(),
            view::format_bytes(*bytes)
        ));
    }
    out
}

/// Records of earlier failures that `cairn retry` archived as `runs/<id>/failed-*.json`.
fn earlier_failures(root: &Path, id: &str) -> Vec<Value> {
    let dir = root.join("runs").join(id);
    view::list_names(&dir)
        .into_iter()
        .filter(|n| n.starts_with("failed-") && n.ends_with(".json"))
        .filter_map(|n| serde_json::from_slice(&fs::read(dir.join(n)).ok()?).ok())
        .collect()
}

/// What `show` lists below a task's summary.
#[derive(Clone, Copy)]
struct Details<'a> {
    phases: &'a [PhaseRow],
    earlier: &'a [Value],
    logs: &'a [(std::path::PathBuf, u64)],
    timeline: &'a [JournalEvent],
}

fn human(
    root: &Path,
    task: &TaskView,
    daemon: view::DaemonInfo,
    lists: &Details,
    now: DateTime<Utc>,
) -> String {
    let Details {
        phases,
        earlier,
        logs,
        timeline,
    } = *lists;
    let mut out = String::new();
    let mut field = |name: &str, value: String| {
        out.push_str(&format!("{name:<12}{value}\n"));
    };
    field("task", task.id.clone());
    field("queue", root.display().to_string());
    let state = match &task.state {
        s if s.is_in_flight() => format!("{} (daemon {})", s.as_str(), daemon.describe()),
        s => s.as_str().to_string(),
    };
    field("state", state);
    if task.state.is_rejected() {
        let record = task.record.as_ref().map(|r| &r.value);
        let get = |key: &str| {
            record
                .and_then(|r| r.get(key))
                .and_then(Value::as_str)
                .unwrap_or("-")
                .to_string()
        };
        field("file", get("file"));
        field("reason", get("reason"));
        field("input", get("input"));
        field("rejected", get("rejected_at"));
        return out;
    }
    let kind = task
        .kind
        .map(|k| format!(", {}", k.as_str()))
        .unwrap_or_default();
    field("phase", format!("{}{kind}", phase_cell(task)));
    field("iteration", iter_cell(task));
    if let Some(rate) = task.rate_per_min {
        let eta = task
            .eta_seconds
            .map(|s| format!(", ETA {}", view::short_duration(s)))
            .unwrap_or_default();
        field("rate", format!("{}{eta}", view::format_rate(rate)));
    }
    let lost = match task.lost_cost_estimate {
        Some(estimate) => format!(
            " committed, +{} estimated for {} iteration(s) in flight when the daemon died",
            view::format_cost(estimate),
            task.lost_iterations
        ),
        None => String::new(),
    };
    field(
        "cost",
        match (task.cost, task.lost_cost_estimate) {
            (None, None) => "-".into(),
            (cost, _) => format!("{}{lost}", view::format_cost(cost.unwrap_or(0.0))),
        },
    );
    // Every start counts as a run (resumes after a stop, pause or crash too); only failed
    // attempts count against `retry.max_attempts`, so the two are shown apart.
    let allowed = task
        .task
        .as_ref()
        .map(|t| format!(" of {} allowed", t.retry.max_attempts))
        .unwrap_or_default();
    field(
        "runs",
        match (task.attempts, task.failed_attempts) {
            (Some(a), Some(f)) => format!("{a} ({f} failed attempts{allowed})"),
            (Some(a), None) => a.to_string(),
            _ => "-".into(),
        },
    );
    field(
        "checkpoint",
        match (task.last_checkpoint_at, &task.checkpoint) {
            (Some(at), cp) => {
                let age = view::short_duration((now - at).num_seconds().max(0) as u64);
                let generation = cp
                    .as_ref()
                    .map(|cp| format!(", generation {}", cp.generation))
                    .unwrap_or_default();
                format!("{} ({age} ago){generation}", view::rfc3339(at))
            }
            _ => "-".into(),
        },
    );
    if let Some(record) = &task.record {
        let at = record.at.map(view::rfc3339).unwrap_or("-".into());
        field("finished", format!("{at} ({})", record.path.display()));
    }
    field("error", task.error.clone().unwrap_or("-".into()));

    out.push_str(&format!("\ndefinition  {}\n", task.definition_key));
    match &task.task {
        Some(def) => {
            let pretty = serde_json::to_string_pretty(def).unwrap_or_default();
            for line in pretty.lines() {
                out.push_str(&format!("  {line}\n"));
            }
        }
        None => out.push_str("  (missing)\n"),
    }

    out.push_str("\nphases\n");
    let rows: Vec<Vec<String>> = phases
        .iter()
        .map(|p| {
            let iter = match (p.iteration, p.total) {
                (Some(i), Some(t)) => format!("{i}/{t}"),
                (Some(i), None) => i.to_string(),
                (None, Some(t)) => format!("0/{t}"),
                _ => "-".into(),
            };
            vec![
                format!("{}/{}", p.index + 1, phases.len()),
                p.name.clone(),
                p.kind.map(|k| k.as_str()).unwrap_or("-").to_string(),
                p.state.as_str().to_string(),
                iter,
                p.output.as_ref().map(short_json).unwrap_or("-".into()),
            ]
        })
        .collect();
    let table = view::render_table(&["#", "NAME", "KIND", "STATE", "ITER", "OUTPUT"], &rows);
    for line in table.lines() {
        out.push_str(&format!("  {line}\n"));
    }

    if !earlier.is_empty() {
        out.push_str("\nearlier failures (retried)\n");
        for record in earlier {
            out.push_str(&format!(
                "  {}  {}  {}\n",
                record["failed_at"].as_str().unwrap_or("-"),
                record["status"].as_str().unwrap_or("-"),
                record["error"].as_str().unwrap_or("-"),
            ));
        }
    }

    out.push_str(&logs_section(root, &task.id, logs));
    out.push_str(&format!("\ntimeline  runs/{}/events.jsonl\n", task.id));
    if timeline.is_empty() {
        out.push_str("  (no events)\n");
    }
    for entry in timeline {
        out.push_str(&format!(
            "  {}  {:<20}  {}\n",
            view::rfc3339(entry.at),
            entry.event.name(),
            details(&entry.event.details())
        ));
    }
    out
}

/// Compact JSON, cut at 60 characters.
fn short_json(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() > 60 {
        let cut: String = text.chars().take(57).collect();
        format!("{cut}...")
    } else {
        text
    }
}

/// `key=value` pairs, the usual keys first; strings unquoted, milliseconds rounded.
fn details(details: &Map<String, Value>) -> String {
    const FIRST: [&str; 7] = [
        "phase",
        "phase_index",
        "iteration",
        "generation",
        "bytes",
        "ms",
        "attempt",
    ];
    let mut keys: Vec<&String> = details.keys().collect();
    keys.sort_by_key(|k| {
        (
            FIRST.iter().position(|f| f == k).unwrap_or(FIRST.len()),
            k.as_str(),
        )
    });
    keys.into_iter()
        .map(|key| {
            let value = &details[key];
            let text = match value {
                Value::String(s) => s.clone(),
                Value::Number(n) if key == "ms" => {
                    format!("{:.1}", n.as_f64().unwrap_or_default())
                }
                other => other.to_string(),
            };
            format!("{key}={text}")
        })
        .collect::<Vec<_>>()
        .join(" ")
}
