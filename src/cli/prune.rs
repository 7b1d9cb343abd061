//! `cairn prune [--older-than DURATION] [--keep-generations N] [--dry-run]`: remove what
//! finished tasks leave behind once their retention has passed, and files no task owns. What
//! may go, and the removal itself, are the queue's (`queue::prune`, which says what is never
//! touched); this prints each path and a summary. With `--db URL`, the finished tasks of the
//! queue shared in PostgreSQL go with all their rows (`PgQueue::prune`), judged by the
//! database's clock.

use std::path::Path;
use std::time::Duration;

use clap::Args;

use super::error::{print, CliError, CliResult};
use super::format;
use super::source::DbArg;
#[cfg(feature = "postgres")]
use crate::client::DatabasePruneReport;
use crate::client::{FilePruneReport, PruneReport, PruneRequest, QueueClient};
use crate::queue::PruneReason;

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
pub(super) struct PruneArgs {
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

pub(super) fn run(queue: &Path, args: PruneArgs) -> CliResult {
    let client = QueueClient::open(queue, args.db.url())?;
    let request = PruneRequest {
        older_than: args.older_than,
        keep_generations: args.keep_generations,
        dry_run: args.dry_run,
    };
    match client.prune(&request)? {
        PruneReport::Files(report) => print_files(&report, args.dry_run),
        #[cfg(feature = "postgres")]
        PruneReport::Database(report) => print(&database_text(&report, args.dry_run)),
    }
}

fn verb(dry_run: bool) -> &'static str {
    if dry_run {
        "would remove"
    } else {
        "removed"
    }
}

/// Each path removed, the summary, and the paths that could not be removed as the error.
fn print_files(report: &FilePruneReport, dry_run: bool) -> CliResult {
    let mut text = String::new();
    for (path, is_dir) in &report.removed {
        let slash = if *is_dir { "/" } else { "" };
        text.push_str(&format!("{} {}{slash}\n", verb(dry_run), path.display()));
    }
    if report.collected_blobs > 0 {
        text.push_str(&format!(
            "removed {} checkpoint file(s) no checkpoint names\n",
            report.collected_blobs
        ));
    }
    text.push_str(&summary(report, dry_run));
    print(&text)?;
    if report.not_removed.is_empty() {
        Ok(())
    } else {
        Err(CliError::failure(format_args!(
            "{} path(s) could not be removed: {}",
            report.not_removed.len(),
            report.not_removed.join("; ")
        )))
    }
}

/// The last line: what was (or would be) removed, by reason, and the bytes freed.
fn summary(report: &FilePruneReport, dry_run: bool) -> String {
    let count = |why| report.counts.get(&why).copied().unwrap_or(0);
    format!(
        "{}: {} finished task(s), {} rejected file(s), {} old generation(s), {} orphan(s), \
         {} control request(s); {} path(s), {}\n",
        if dry_run { "prune --dry-run" } else { "prune" },
        report.finished_tasks,
        report.rejected_records,
        count(PruneReason::Generation),
        count(PruneReason::Orphan),
        count(PruneReason::Control),
        report.counts.values().sum::<usize>(),
        format::format_bytes(report.bytes),
    )
}

/// Each task (and trimmed generation) removed from the shared queue, then a summary.
#[cfg(feature = "postgres")]
fn database_text(report: &DatabasePruneReport, dry_run: bool) -> String {
    let pruned = &report.pruned;
    let verb = verb(dry_run);
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
        if dry_run { "prune --dry-run" } else { "prune" },
        pruned.tasks.len(),
        pruned.generations.len(),
        pruned.control_requests,
        pruned.rows(),
        report.database,
    ));
    text
}
