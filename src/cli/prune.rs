//! `cairn prune [--older-than DURATION] [--keep-generations N] [--dry-run]`: remove what
//! finished tasks leave behind once their retention has passed, and files no task owns.
//!
//! - A finished task (done, failed, budget_exceeded, cancelled) whose record is older than the
//!   retention loses `runs/<id>/`, `incremental/<id>.json.gz` and its older generations,
//!   `tasks/<id>.json`, and last its record — so a prune cut short leaves a task that still
//!   reads as finished, never one that looks pending and would run again.
//! - A rejected intake file's record (`failed/rejected-*.json`) goes with its `.input`.
//! - `--keep-generations N` trims the older checkpoint generations of the finished tasks that
//!   stay to the newest N (the latest file is always kept).
//! - Orphans: `runs/<id>/` and `incremental/<id>*.json.gz` of no task at all, and control
//!   requests, once older than the retention.
//!
//! Never touched: a task in `current_work.json` (in flight) or pending (`tasks/<id>.json` without
//! a record), a task named by a file in `inbox/`, and anything younger than [`GRACE`] among
//! orphans and control requests (a fork or a retry being set up; the tasks such requests name are
//! kept too). If `current_work.json` cannot be read, nothing is removed.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::Args;
use serde_json::Value;

use super::error::{print, CliError, CliResult};
use super::queue_fs::{read_regular, OpenedQueue};
use super::view::{self, Record};
use crate::store::records::RecordStatus;

/// Orphans and control requests younger than this are left alone, whatever the retention.
pub const GRACE: Duration = Duration::from_secs(600);

#[derive(Debug, Args)]
#[command(after_help = "\
Removes, for finished tasks (done, failed, budget_exceeded, cancelled) whose record is older \
than --older-than: runs/<id>/, incremental/<id>*.json.gz, tasks/<id>.json and the record; \
rejected intake records with their .input; orphaned runs/ and incremental/ files and control \
requests older than the retention (and at least 10 minutes old). Tasks in flight and pending \
tasks are never touched. Each path removed is printed, then a summary.

Examples:
  cairn prune --dry-run                 what a prune with the 7-day default would remove
  cairn prune --older-than 0s           every finished task, now
  cairn prune --keep-generations 1      also keep one older checkpoint per remaining task")]
pub struct PruneArgs {
    /// Retention: prune tasks that finished longer ago than this (`0s`: every finished task).
    #[arg(long, value_name = "DURATION", default_value = "7d", value_parser = humantime::parse_duration)]
    older_than: Duration,

    /// Trim the older checkpoint generations of the finished tasks that remain to the newest N.
    #[arg(long, value_name = "N")]
    keep_generations: Option<usize>,

    /// Print what would be removed, remove nothing.
    #[arg(long)]
    dry_run: bool,
}

/// What one removal is for, for the summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Why {
    Finished,
    Rejected,
    Generation,
    Orphan,
    Control,
}

/// The plan: paths in removal order, each with its reason.
#[derive(Default)]
struct Plan {
    paths: Vec<(PathBuf, Why)>,
    finished_tasks: usize,
    rejected_records: usize,
}

pub fn run(queue: &Path, args: PruneArgs) -> CliResult {
    let root = std::path::absolute(queue).unwrap_or_else(|_| queue.to_path_buf());
    if !root.is_dir() {
        return Err(CliError::failure(format_args!(
            "queue {} does not exist",
            root.display()
        )));
    }
    // Refused before anything is read: a directory replaced by a link would lead the plan (and,
    // for root, the removals) outside the queue.
    let opened = OpenedQueue::open(&root)
        .map_err(|problem| CliError::failure(format_args!("refusing to prune: {problem:#}")))?;
    let plan = plan(&root, &args, Utc::now())
        .map_err(|e| CliError::failure(format_args!("{e:#}; nothing was removed")))?;
    let verb = if args.dry_run {
        "would remove"
    } else {
        "removed"
    };
    let mut not_removed: Vec<String> = Vec::new();
    let mut bytes = 0u64;
    let mut counts: BTreeMap<Why, usize> = BTreeMap::new();
    for (path, why) in &plan.paths {
        let size = disk_size(path);
        let result = if args.dry_run {
            Ok(fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()))
        } else {
            opened.remove(path.strip_prefix(&root).unwrap_or(path))
        };
        match result {
            Ok(is_dir) => {
                bytes += size;
                *counts.entry(*why).or_default() += 1;
                let slash = if is_dir { "/" } else { "" };
                print(&format!("{verb} {}{slash}\n", path.display()))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            // The others are still removed; the failures are the command's error at the end.
            Err(e) => not_removed.push(format!("{}: {e}", path.display())),
        }
    }
    let count = |why| counts.get(&why).copied().unwrap_or(0);
    let summary = format!(
        "{}: {} finished task(s), {} rejected file(s), {} old generation(s), {} orphan(s), \
         {} control request(s); {} path(s), {}\n",
        if args.dry_run {
            "prune --dry-run"
        } else {
            "prune"
        },
        plan.finished_tasks,
        plan.rejected_records,
        count(Why::Generation),
        count(Why::Orphan),
        count(Why::Control),
        counts.values().sum::<usize>(),
        view::format_bytes(bytes),
    );
    print(&summary)?;
    if not_removed.is_empty() {
        Ok(())
    } else {
        Err(CliError::failure(format_args!(
            "{} path(s) could not be removed: {}",
            not_removed.len(),
            not_removed.join("; ")
        )))
    }
}

/// Work out everything to remove, reading the queue once.
fn plan(root: &Path, args: &PruneArgs, now: DateTime<Utc>) -> anyhow::Result<Plan> {
    let retention = chrono::Duration::from_std(args.older_than).unwrap_or(chrono::Duration::MAX);
    let cutoff = now
        .checked_sub_signed(retention)
        .unwrap_or(DateTime::<Utc>::MIN_UTC);
    let grace_cutoff = now - chrono::Duration::from_std(GRACE).unwrap_or_default();
    let orphan_cutoff = cutoff.min(grace_cutoff);

    // What must stay: tasks in flight, pending tasks, tasks named in the inbox or by a
    // fresh control request.
    let work = view::read_current_work(root)?;
    let in_flight: BTreeSet<String> = work
        .active_tasks
        .iter()
        .map(|t| t.task_id.to_string())
        .collect();
    let defined: BTreeSet<String> = view::json_stems(&root.join("tasks")).into_iter().collect();
    let done: BTreeSet<String> = view::json_stems(&root.join("done")).into_iter().collect();
    let mut failed = BTreeSet::new();
    let mut rejected = Vec::new();
    for stem in view::json_stems(&root.join("failed")) {
        let path = root.join("failed").join(format!("{stem}.json"));
        match Record::read(&path) {
            Ok(record) if record.status == RecordStatus::Rejected => rejected.push((stem, record)),
            _ => {
                failed.insert(stem);
            }
        }
    }
    let finished: BTreeSet<String> = done.union(&failed).cloned().collect();
    let pending: BTreeSet<String> = defined.difference(&finished).cloned().collect();
    let mut protected: BTreeSet<String> = in_flight.union(&pending).cloned().collect();
    protected.extend(inbox_ids(root));

    let mut plan = Plan::default();
    let control_dir = root.join("control");
    for name in view::list_names(&control_dir) {
        if name.starts_with('.') {
            continue;
        }
        let path = control_dir.join(&name);
        let task_id = read_regular(&path, crate::queue::control::MAX_REQUEST_BYTES)
            .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
            .and_then(|v| v["task_id"].as_str().map(str::to_string));
        let age_ok = view::mtime(&path).is_some_and(|at| at <= orphan_cutoff);
        let names_live_task = task_id.as_ref().is_some_and(|id| protected.contains(id));
        if age_ok && !names_live_task {
            plan.paths.push((path, Why::Control));
        } else if let Some(id) = task_id {
            // A request still to be applied keeps its task (a retry of a failed task).
            protected.insert(id);
        }
    }

    let generations = checkpoint_files(root);
    for id in &finished {
        if protected.contains(id) {
            continue;
        }
        let record = ["done", "failed"]
            .iter()
            .map(|dir| root.join(dir).join(format!("{id}.json")))
            .find(|p| p.exists());
        let Some(record_path) = record else { continue };
        let at = Record::read(&record_path)
            .ok()
            .and_then(|r| r.at)
            .or_else(|| view::mtime(&record_path));
        let expired = at.is_some_and(|at| at <= cutoff);
        if expired {
            plan.finished_tasks += 1;
            push_task_files(&mut plan, root, id, &generations);
            plan.paths
                .push((root.join("tasks").join(format!("{id}.json")), Why::Finished));
            for dir in ["done", "failed"] {
                plan.paths
                    .push((root.join(dir).join(format!("{id}.json")), Why::Finished));
            }
        } else if let Some(keep) = args.keep_generations {
            if let Some((_, older)) = generations.get(id) {
                for generation in older.iter().skip(keep) {
                    plan.paths
                        .push((generation_path(root, id, *generation), Why::Generation));
                }
            }
        }
    }
    plan.paths
        .retain(|(path, why)| *why != Why::Finished || path.exists() || path.is_symlink());

    for (stem, record) in rejected {
        if record.at.is_some_and(|at| at <= cutoff) {
            let input = record.value["input"]
                .as_str()
                .filter(|key| key.starts_with("failed/") && !key.contains(".."))
                .map(|key| root.join(key))
                .unwrap_or_else(|| root.join("failed").join(format!("{stem}.input")));
            if input.exists() {
                plan.paths.push((input, Why::Rejected));
            }
            plan.paths.push((record.path, Why::Rejected));
            plan.rejected_records += 1;
        }
    }

    // Orphans: files of no task at all.
    let known = |id: &str| finished.contains(id) || defined.contains(id) || protected.contains(id);
    for name in view::list_names(&root.join("runs")) {
        let path = root.join("runs").join(&name);
        if name.starts_with('.') || known(&name) || !path.is_dir() {
            continue;
        }
        if newest_mtime(&path).is_some_and(|at| at <= orphan_cutoff) {
            plan.paths.push((path, Why::Orphan));
        }
    }
    for (id, (latest, older)) in &generations {
        if known(id) {
            continue;
        }
        let mut files: Vec<PathBuf> = older
            .iter()
            .map(|g| generation_path(root, id, *g))
            .collect();
        if *latest {
            files.push(root.join("incremental").join(format!("{id}.json.gz")));
        }
        for path in files {
            if view::mtime(&path).is_some_and(|at| at <= orphan_cutoff) {
                plan.paths.push((path, Why::Orphan));
            }
        }
    }
    Ok(plan)
}

/// `runs/<id>/` and every checkpoint file of a task being pruned.
fn push_task_files(
    plan: &mut Plan,
    root: &Path,
    id: &str,
    generations: &BTreeMap<String, (bool, Vec<u64>)>,
) {
    let run_dir = root.join("runs").join(id);
    if run_dir.exists() {
        plan.paths.push((run_dir, Why::Finished));
    }
    if let Some((latest, older)) = generations.get(id) {
        for generation in older {
            plan.paths
                .push((generation_path(root, id, *generation), Why::Finished));
        }
        if *latest {
            plan.paths.push((
                root.join("incremental").join(format!("{id}.json.gz")),
                Why::Finished,
            ));
        }
    }
}

/// Per task id: whether its latest file exists, and its older generations, newest first.
/// `<id>.<digits>.json.gz` is always a generation: task ids never end in `.<digits>`.
fn checkpoint_files(root: &Path) -> BTreeMap<String, (bool, Vec<u64>)> {
    let mut files: BTreeMap<String, (bool, Vec<u64>)> = BTreeMap::new();
    for name in view::list_names(&root.join("incremental")) {
        if name.starts_with('.') {
            continue;
        }
        let Some(stem) = name.strip_suffix(".json.gz") else {
            continue;
        };
        let generation = stem.rsplit_once('.').and_then(|(id, digits)| {
            let canonical = !digits.is_empty()
                && digits.bytes().all(|b| b.is_ascii_digit())
                && digits.parse::<u64>().ok()?.to_string() == digits;
            canonical.then(|| (id.to_string(), digits.parse::<u64>().ok()))
        });
        match generation {
            Some((id, Some(generation))) => files.entry(id).or_default().1.push(generation),
            _ => files.entry(stem.to_string()).or_default().0 = true,
        }
    }
    for (_, older) in files.values_mut() {
        older.sort_unstable_by(|a, b| b.cmp(a));
    }
    files
}

fn generation_path(root: &Path, id: &str, generation: u64) -> PathBuf {
    root.join("incremental")
        .join(format!("{id}.{generation}.json.gz"))
}

/// The ids named by the task files waiting in `inbox/` (a fork's task, say).
fn inbox_ids(root: &Path) -> Vec<String> {
    let inbox = root.join("inbox");
    view::list_names(&inbox)
        .into_iter()
        .filter_map(|name| {
            let bytes = read_regular(&inbox.join(name), crate::task::MAX_TASK_FILE_BYTES)?;
            let value: Value = serde_json::from_slice(&bytes).ok()?;
            value["id"].as_str().map(str::to_string)
        })
        .collect()
}

/// The latest modification time of a directory and the entries directly in it.
fn newest_mtime(dir: &Path) -> Option<DateTime<Utc>> {
    let mut newest = view::mtime(dir)?;
    for name in view::list_names(dir) {
        if let Some(at) = view::mtime(&dir.join(name)) {
            newest = newest.max(at);
        }
    }
    Some(newest)
}

/// Bytes under a path (a file's size, a directory's files summed).
fn disk_size(path: &Path) -> u64 {
    let Ok(meta) = fs::symlink_metadata(path) else {
        return 0;
    };
    if !meta.is_dir() {
        return meta.len();
    }
    view::list_names(path)
        .into_iter()
        .map(|name| disk_size(&path.join(name)))
        .sum()
}
