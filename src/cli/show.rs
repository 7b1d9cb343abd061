//! `cairn show ID [--json]`: one task in full — its definition, each phase with its output or
//! progress, attempts, errors, and the timeline of its event journal (`runs/<id>/events.jsonl`,
//! or with `--db` the task's rows in `cairn_events`, each with the node and lease epoch that
//! wrote it).

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use clap::Args;
use serde_json::{json, Map, Value};

use super::error::{print, CliError, CliResult, ExitCodeExt};
use super::exit;
use super::format;
use super::source::DbArg;
use super::status::{iter_cell, phase_cell};
use crate::client::{QueueClient, TaskFacts as ShowFacts, TimelineEntry};
use crate::queue::{QueueDir, QueueReader, TaskView};
use crate::store::current_work::{PauseReason, PhaseTiming, PolicyPause};
use crate::store::task_state::TaskState;
use crate::task::PhaseKind;
use crate::task_id::TaskId;

#[derive(Debug, Args)]
#[command(after_help = "The --json document is described in docs/cli.md (\"version\": 1).")]
pub(super) struct ShowArgs {
    /// The task id (or the name of a rejection record, rejected-…).
    id: String,

    /// Print a JSON document instead.
    #[arg(long)]
    json: bool,

    #[command(flatten)]
    pub(super) db: DbArg,
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

pub(super) fn run(queue: &Path, args: ShowArgs) -> CliResult {
    let id = format::task_id_arg(&args.id).exit_code(exit::USAGE)?;
    let client = QueueClient::open(queue, args.db.url())?;
    let (facts, task) = read(&client, &args.id, &id)?;
    for warning in &task.warnings {
        eprintln!("warning: {warning}");
    }
    let details = Details {
        phases: &phase_rows(&facts, &task),
        earlier: &facts.earlier,
        logs: &facts.logs,
        timeline: &facts.timeline,
    };
    let now = Utc::now();
    let text = if args.json {
        let mut text = serde_json::to_string_pretty(&document(&facts, &task, &details, now))
            .unwrap_or_default();
        text.push('\n');
        text
    } else {
        human(&facts, &task, &details, now)
    };
    print(&text)
}

/// The task `id` (asked for as `asked`) and what `show` reads about it; a task the queue does
/// not have is an error saying where it was looked for.
fn read(client: &QueueClient, asked: &str, id: &TaskId) -> CliResult<(ShowFacts, TaskView)> {
    let found = match client.root() {
        Some(root) => find(&QueueReader::open(root), id),
        None => client.task(id)?,
    };
    let Some(task) = found else {
        let places = match client.root() {
            Some(root) => QueueReader::open(root).places_of(id),
            None => "no row in cairn_tasks".to_string(),
        };
        return Err(CliError::failure(format_args!(
            "queue {} has no task {:?} ({places}); `cairn status --all` lists the tasks",
            client.location(),
            asked,
        )));
    };
    let facts = client.facts(id, &task)?;
    for warning in &facts.warnings {
        eprintln!("warning: {warning}");
    }
    Ok((facts, task))
}

/// The `cairn show --json` document of a task, for the dashboard's task page.
pub(super) fn json_document(client: &QueueClient, id: &TaskId) -> CliResult<Value> {
    let (facts, task) = read(client, id.as_str(), id)?;
    let details = Details {
        phases: &phase_rows(&facts, &task),
        earlier: &facts.earlier,
        logs: &facts.logs,
        timeline: &facts.timeline,
    };
    Ok(document(&facts, &task, &details, Utc::now()))
}

/// One event of the timeline as `--json` lists it; with `--db`, the node and lease epoch it was
/// written under.
fn timeline_json(entry: &TimelineEntry) -> Value {
    let mut value = serde_json::to_value(&entry.journal).unwrap_or(Value::Null);
    if let (Some((node, epoch)), Some(object)) = (&entry.lease, value.as_object_mut()) {
        object.insert("node".into(), json!(node));
        object.insert("lease_epoch".into(), json!(epoch));
    }
    value
}

/// The `--json` document (see docs/cli.md).
fn document(facts: &ShowFacts, task: &TaskView, lists: &Details, now: DateTime<Utc>) -> Value {
    let mut status = format::task_json(task, now);
    if facts.run_dir.is_none() {
        format::add_lease_json(&mut status, task);
    }
    let document = json!({
        "version": format::JSON_VERSION,
        "queue": facts.queue,
        "daemon": format::daemon_json(facts.daemon),
        "id": task.id,
        "state": task.state.as_str(),
        "submitted_by": task.submitted_by(),
        "status": status,
        "definition": task.task.as_ref().map(|t| serde_json::to_value(t).unwrap_or(Value::Null)),
        "phases": lists.phases.iter().map(phase_json).collect::<Vec<_>>(),
        "attempts": task.attempts,
        "failed_attempts": task.failed_attempts,
        "error": task.error,
        "record": task.record.as_ref().map(|r| r.value.clone()),
        "earlier_failures": lists.earlier,
        "logs": lists.logs.iter().map(|(path, bytes)| json!({"path": path.display().to_string(), "bytes": bytes})).collect::<Vec<_>>(),
        "timeline": lists.timeline.iter().map(timeline_json).collect::<Vec<_>>(),
    });
    document
}

/// The task with this id; else the latest rejection of the inbox file of this name (others
/// are named on stderr).
fn find(reader: &QueueReader, id: &TaskId) -> Option<TaskView> {
    if let Some(task) = reader.task(id) {
        return Some(task);
    }
    let rejections = reader.rejections_of(id);
    let (latest, older) = rejections.split_first()?;
    if !older.is_empty() {
        eprintln!(
            "note: {} was rejected {} times; this is the latest, the others are {}",
            QueueDir::inbox_name_key(id),
            rejections.len(),
            older.join(", ")
        );
    }
    reader.task(&TaskId::parse(latest.as_str()).ok()?)
}

fn phase_json(row: &PhaseRow) -> Value {
    json!({
        "index": row.index,
        "name": row.name,
        "kind": row.kind.map(|k| k.as_str()),
        "state": row.state.as_str(),
        "iteration": row.iteration,
        "total": row.total,
        "started_at": row.started_at.map(format::rfc3339),
        "finished_at": row.finished_at.map(format::rfc3339),
        "output": row.output,
    })
}

/// The task's phases: from its definition, else (definition lost) from its record's timings.
fn phase_rows(facts: &ShowFacts, task: &TaskView) -> Vec<PhaseRow> {
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
                phase_output(facts, task, &name)
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
                let iterations = timing.and_then(|t| t.iterations);
                let planned = definition_total(task, index).or(timing.and_then(|t| t.total));
                // A finished loop ran all it was going to, even when `"done": true` ended it early.
                let total = match kind {
                    Some(PhaseKind::Loop) if is_done => iterations.or(planned),
                    _ => planned,
                };
                (iterations, total)
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
fn phase_output(facts: &ShowFacts, task: &TaskView, name: &str) -> Option<Value> {
    if task.state.is_in_flight() {
        return facts.outputs.get(name).cloned();
    }
    task.record
        .as_ref()?
        .value
        .get("phase_outputs")?
        .get(name)
        .cloned()
}

/// Where to read what the commands printed on stderr.
fn logs_section(facts: &ShowFacts, id: &str, logs: &[(PathBuf, u64)]) -> String {
    let Some(run_dir) = &facts.run_dir else {
        return format!(
            "\nlogs  on the host of the node that ran it: {} in its --queue directory\n",
            QueueDir::new("").run_dir(id).display()
        );
    };
    let mut out = format!("\nlogs  {}\n", run_dir.display());
    if logs.is_empty() {
        out.push_str("  (none yet)\n");
    }
    for (path, bytes) in logs {
        out.push_str(&format!(
            "  {}  {}\n",
            path.display(),
            format::format_bytes(*bytes)
        ));
    }
    out
}

/// What `show` lists below a task's summary.
#[derive(Clone, Copy)]
struct Details<'a> {
    phases: &'a [PhaseRow],
    earlier: &'a [Value],
    logs: &'a [(PathBuf, u64)],
    timeline: &'a [TimelineEntry],
}

fn human(facts: &ShowFacts, task: &TaskView, lists: &Details, now: DateTime<Utc>) -> String {
    let mut out = String::new();
    // Values may quote what a submitter named (a file, a reason quoting it): printable.
    let mut field = |name: &str, value: String| {
        out.push_str(&format!("{name:<12}{}\n", format::printable(&value)));
    };
    field("task", task.id.clone());
    field("queue", facts.queue.clone());
    let state = match (&task.state, &task.lease) {
        (s, Some(lease)) => {
            let [node, left] = format::lease_cells(task, now);
            format!(
                "{} (node {node}, lease epoch {}, {left})",
                s.as_str(),
                lease.epoch
            )
        }
        (s, None) if s.is_in_flight() => format!(
            "{} (daemon {})",
            s.as_str(),
            format::describe_daemon(facts.daemon)
        ),
        (s, None) => s.as_str().to_string(),
    };
    field("state", state);
    if let Some(submitter) = task.submitted_by() {
        field("submitter", submitter.to_string());
    }
    if task.state.is_rejected() {
        rejection_fields(task, &mut field);
        return out;
    }
    progress_fields(task, now, &mut field);
    out.push_str(&definition_section(task));
    out.push_str(&phases_section(lists.phases));
    out.push_str(&earlier_section(lists.earlier));
    out.push_str(&logs_section(facts, &task.id, lists.logs));
    out.push_str(&timeline_section(facts, lists.timeline));
    out
}

/// What a rejection record says about the file it refused.
fn rejection_fields(task: &TaskView, field: &mut impl FnMut(&str, String)) {
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
}

/// Phase, iteration, rate, cost, attempts, checkpoint, record and error of a task.
fn progress_fields(task: &TaskView, now: DateTime<Utc>, field: &mut impl FnMut(&str, String)) {
    let kind = task
        .kind
        .map(|k| format!(", {}", k.as_str()))
        .unwrap_or_default();
    field("phase", format!("{}{kind}", phase_cell(task)));
    field("iteration", iter_cell(task));
    if let Some(rate) = task.rate_per_min {
        let eta = task
            .eta_seconds
            .map(|s| format!(", ETA {}", format::short_duration(s)))
            .unwrap_or_default();
        field("rate", format!("{}{eta}", format::format_rate(rate)));
    }
    field("cost", cost_field(task));
    if let Some(limit) = task.max_cost {
        field("budget", format!("limit {}", format::format_cost(limit)));
    }
    if let Some(pause) = &task.paused_for {
        field("paused for", paused_for_field(task, pause));
    }
    // Every start is an attempt (resumes after a stop, pause or crash too); only failed
    // attempts count against `retry.max_attempts`, so the two are shown apart.
    let allowed = task
        .task
        .as_ref()
        .map(|t| format!(" of {} allowed", t.retry.max_attempts))
        .unwrap_or_default();
    field(
        "attempts",
        match (task.attempts, task.failed_attempts) {
            (Some(a), Some(f)) => format!("{a} ({f} failed{allowed})"),
            (Some(a), None) => a.to_string(),
            _ => "-".into(),
        },
    );
    field(
        "checkpoint",
        match (task.last_checkpoint_at, &task.checkpoint) {
            (Some(at), cp) => {
                let age = format::short_duration((now - at).num_seconds().max(0) as u64);
                let generation = cp
                    .as_ref()
                    .map(|cp| format!(", generation {}", cp.generation))
                    .unwrap_or_default();
                format!("{} ({age} ago){generation}", format::rfc3339(at))
            }
            _ => "-".into(),
        },
    );
    if let Some(files) = task.checkpoint.as_ref().map(|cp| &cp.files) {
        if !files.is_empty() {
            field("files", checkpoint_files(files));
        }
    }
    if let Some(record) = &task.record {
        let at = record.at.map(format::rfc3339).unwrap_or("-".into());
        field("finished", format!("{at} ({})", record.path.display()));
    }
    field("error", task.error.clone().unwrap_or("-".into()));
}

/// Why a policy of the task's own paused it, and what lets it go on.
fn paused_for_field(task: &TaskView, pause: &PolicyPause) -> String {
    let id = &task.id;
    let next = match pause.reason {
        PauseReason::Budget => {
            format!(
                "`cairn budget {id} --max-cost X` raises the limit, `cairn resume {id}` continues"
            )
        }
        PauseReason::RetriesExhausted => {
            format!("fix the cause, then `cairn resume {id}` runs it again with fresh attempts")
        }
    };
    format!("{}; {next}", pause.describe())
}

/// The files the checkpoint names: `name path (size)` each, and the bytes they hold together.
fn checkpoint_files(
    files: &std::collections::BTreeMap<String, crate::store::blobs::StoredFile>,
) -> String {
    let total: u64 = files.values().map(|f| f.size).sum();
    let each: Vec<String> = files
        .iter()
        .map(|(name, f)| format!("{name} {} ({})", f.path, format::format_bytes(f.size)))
        .collect();
    format!(
        "{} — {} in all",
        each.join(", "),
        format::format_bytes(total)
    )
}

/// The committed cost, and the estimate for iterations lost to crashes apart.
fn cost_field(task: &TaskView) -> String {
    let lost = match task.lost_cost_estimate {
        Some(estimate) => format!(
            " committed, +{} estimated for {} iteration(s) in flight when the daemon died",
            format::format_cost(estimate),
            task.lost_iterations
        ),
        None => String::new(),
    };
    match (task.cost, task.lost_cost_estimate) {
        (None, None) => "-".into(),
        (cost, _) => format!("{}{lost}", format::format_cost(cost.unwrap_or(0.0))),
    }
}

/// The task's definition, pretty-printed.
fn definition_section(task: &TaskView) -> String {
    let mut out = format!("\ndefinition  {}\n", task.definition_key);
    match &task.task {
        Some(def) => {
            let pretty = serde_json::to_string_pretty(def).unwrap_or_default();
            for line in pretty.lines() {
                out.push_str(&format!("  {line}\n"));
            }
        }
        None => out.push_str("  (missing)\n"),
    }
    out
}

/// One row per phase.
fn phases_section(phases: &[PhaseRow]) -> String {
    let mut out = "\nphases\n".to_string();
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
    let table = format::render_table(&["#", "NAME", "KIND", "STATE", "ITER", "OUTPUT"], &rows);
    for line in table.lines() {
        out.push_str(&format!("  {line}\n"));
    }
    out
}

/// Earlier failures that `cairn retry` archived (nothing when there are none).
fn earlier_section(earlier: &[Value]) -> String {
    if earlier.is_empty() {
        return String::new();
    }
    let mut out = "\nearlier failures (retried)\n".to_string();
    for record in earlier {
        out.push_str(&format!(
            "  {}  {}  {}\n",
            format::printable(record["failed_at"].as_str().unwrap_or("-")),
            format::printable(record["status"].as_str().unwrap_or("-")),
            format::printable(record["error"].as_str().unwrap_or("-")),
        ));
    }
    out
}

/// The task's journal, one event a line.
fn timeline_section(facts: &ShowFacts, timeline: &[TimelineEntry]) -> String {
    let mut out = format!("\ntimeline  {}\n", facts.journal);
    if timeline.is_empty() {
        out.push_str("  (no events)\n");
    }
    for entry in timeline {
        let lease = entry
            .lease
            .as_ref()
            .map(|(node, epoch)| format!("node={node} epoch={epoch}  "))
            .unwrap_or_default();
        out.push_str(&format!(
            "  {}  {:<20}  {lease}{}\n",
            format::rfc3339(entry.journal.at),
            entry.journal.event.name(),
            details(&entry.journal.event.details())
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

/// `key=value` pairs, the usual keys first; strings unquoted but [`format::printable`] (a
/// control request's file name is its writer's choice), milliseconds rounded.
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
                Value::String(s) => format::printable(s).into_owned(),
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
