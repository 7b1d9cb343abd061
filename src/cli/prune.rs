//! `cairn prune [--older-than DURATION] [--keep-generations N] [--dry-run]`: remove what
//! finished tasks leave behind once their retention has passed, and files no task owns. What
//! may go, and the removal itself, are the queue's (`queue::prune`, which says what is never
//! touched); this prints each path and a summary. With `--db URL`, the finished tasks of the
//! queue shared in PostgreSQL go with all their rows (`PgQueue::prune`), judged by the
//! database's clock.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use chrono::Utc;
use clap::Args;

use super::error::{print, CliError, CliResult};
use super::format;
use super::source::DbArg;
use crate::queue::{PrunePlan, PruneReason, PruneRules, QueuePruner, QueueReader};

#[derive(Debug, Args)]
#[command(after_help = "\
Removes, for finished tasks (done, failed, budget_exceeded, cancelled) whose record is older \
than --older-than: runs/<id>/, incremental/<id>*.json.gz, tasks/<id>.json and the record; \
rejected intake records with their .input; orphaned runs/ and incremental/ files and control \
requests older than the retention (and at least 10 minutes old). Tasks in flight and pending \
tasks are never touched. Each path removed is printed, then a summary.

With --db URL, finished tasks of the shared queue whose record is older than --older-than by \
the database's clock go with all their rows (checkpoints, outputs, events, records), in \
batches of one transaction each; tasks queued, running, paused, held by a daemon or named by a \
pending control request are never touched. Each task removed is printed, then a summary. Each \
host's local directory (runs/ logs, rejected files) is pruned by `cairn prune` there.

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

    #[command(flatten)]
    pub(super) db: DbArg,
}

pub fn run(queue: &Path, args: PruneArgs) -> CliResult {
    if let Some(url) = args.db.url() {
        return prune_db(url, &args);
    }
    let reader = QueueReader::open(queue);
    if !reader.exists() {
        return Err(CliError::failure(format_args!(
            "queue {} does not exist",
            reader.root().display()
        )));
    }
    // Refused before anything is read: a directory replaced by a link would lead the plan (and,
    // for root, the removals) outside the queue.
    let pruner = QueuePruner::open(&reader)
        .map_err(|problem| CliError::failure(format_args!("refusing to prune: {problem}")))?;
    let rules = PruneRules {
        older_than: args.older_than,
        keep_generations: args.keep_generations,
    };
    let plan = reader
        .prune_plan(&rules, Utc::now())
        .map_err(|e| CliError::failure(format_args!("{e}; nothing was removed")))?;
    let verb = if args.dry_run {
        "would remove"
    } else {
        "removed"
    };
    let mut not_removed: Vec<String> = Vec::new();
    let mut bytes = 0u64;
    let mut counts: BTreeMap<PruneReason, usize> = BTreeMap::new();
    for item in &plan.items {
        let size = item.disk_size();
        let result = if args.dry_run {
            Ok(item.is_dir())
        } else {
            pruner.remove(item)
        };
        match result {
            Ok(is_dir) => {
                bytes += size;
                *counts.entry(item.reason).or_default() += 1;
                let slash = if is_dir { "/" } else { "" };
                print(&format!("{verb} {}{slash}\n", item.path.display()))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            // The others are still removed; the failures are the command's error at the end.
            Err(e) => not_removed.push(format!("{}: {e}", item.path.display())),
        }
    }
    // The files the removed checkpoints named, unless another checkpoint names them.
    match (!args.dry_run).then(|| pruner.collect_blobs()) {
        Some(Ok(n)) if n > 0 => print(&format!(
            "removed {n} checkpoint file(s) no checkpoint names\n"
        ))?,
        Some(Err(e)) => not_removed.push(format!("checkpoint files: {e}")),
        _ => {}
    }
    print(&summary(&plan, &counts, bytes, args.dry_run))?;
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

/// The last line: what was (or would be) removed, by reason, and the bytes freed.
fn summary(
    plan: &PrunePlan,
    counts: &BTreeMap<PruneReason, usize>,
    bytes: u64,
    dry_run: bool,
) -> String {
    let count = |why| counts.get(&why).copied().unwrap_or(0);
    format!(
        "{}: {} finished task(s), {} rejected file(s), {} old generation(s), {} orphan(s), \
         {} control request(s); {} path(s), {}\n",
        if dry_run { "prune --dry-run" } else { "prune" },
        plan.finished_tasks,
        plan.rejected_records,
        count(PruneReason::Generation),
        count(PruneReason::Orphan),
        count(PruneReason::Control),
        counts.values().sum::<usize>(),
        format::format_bytes(bytes),
    )
}

/// `cairn prune --db URL`: the shared queue's finished tasks past their retention, with all
/// their rows; each task (and trimmed generation) is printed, then a summary.
#[cfg(feature = "postgres")]
fn prune_db(url: &str, args: &PruneArgs) -> CliResult {
    use crate::queue::postgres::PruneRules;

    let shared = super::shared_queue::SharedQueue::open(url)?;
    let rules = PruneRules {
        keep_generations: args.keep_generations,
        dry_run: args.dry_run,
        ..PruneRules::older_than(args.older_than)
    };
    // Batches already committed stay removed when a later one fails; the error says so.
    let pruned = shared
        .runtime
        .block_on(shared.db.prune(&rules))
        .map_err(|e| {
            shared.error(format_args!(
                "{e}; tasks of the batches before were removed, the others were not"
            ))
        })?;
    let verb = if args.dry_run {
        "would remove"
    } else {
        "removed"
    };
    let mut text = String::new();
    for task in &pruned.tasks {
        text.push_str(&format!(
            "{verb} task {} ({}, finished {}): {} checkpoint(s), {} output(s), {} event(s), \
             {} earlier record(s)\n",
            task.id,
            task.status,
            format::rfc3339(task.finished_at),
            task.checkpoints,
            task.outputs,
            task.events,
            task.old_records,
        ));
    }
    for generation in &pruned.generations {
        text.push_str(&format!(
            "{verb} checkpoint generation {} of {}\n",
            generation.generation, generation.task_id
        ));
    }
    text.push_str(&format!(
        "{}: {} finished task(s), {} old generation(s), {} control request(s); {} row(s) in {}\n",
        if args.dry_run {
            "prune --dry-run"
        } else {
            "prune"
        },
        pruned.tasks.len(),
        pruned.generations.len(),
        pruned.control_requests,
        pruned.rows(),
        shared.database,
    ));
    print(&text)
}

#[cfg(not(feature = "postgres"))]
fn prune_db(_url: &str, _args: &PruneArgs) -> CliResult {
    Err(super::source::without_postgres())
}
