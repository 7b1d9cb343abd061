//! Pruning: what finished tasks leave behind once their retention has passed. What may go,
//! and the removal itself, are the queue's (`queue::prune` for a directory, which says what is
//! never touched; `PgQueue::prune` for the shared queue, judged by the database's clock); the
//! client carries the plan out and reports each thing removed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::Utc;

use super::{writable_root, Backend, ClientError, ClientResult, QueueClient};
use crate::queue::{PrunePlan, PruneReason, PruneRules, QueuePruner, QueueReader};

/// What to prune.
#[derive(Debug, Clone, Copy)]
pub struct PruneRequest {
    /// Prune tasks that finished longer ago than this.
    pub older_than: Duration,
    /// Trim the older checkpoint generations of the finished tasks that remain to the newest N.
    pub keep_generations: Option<usize>,
    /// Say what would go, remove nothing.
    pub dry_run: bool,
}

/// What a prune did (or, dry, would do).
#[derive(Debug)]
pub enum PruneReport {
    Files(FilePruneReport),
    #[cfg(feature = "postgres")]
    Database(DatabasePruneReport),
}

/// A queue directory's prune: each path removed (and whether it was a directory), counts by
/// reason, bytes freed, and the paths that could not be removed.
#[derive(Debug)]
pub struct FilePruneReport {
    pub removed: Vec<(PathBuf, bool)>,
    pub finished_tasks: usize,
    pub rejected_records: usize,
    pub counts: BTreeMap<PruneReason, usize>,
    pub bytes: u64,
    /// Each with why; the others were still removed.
    pub not_removed: Vec<String>,
    /// Checkpoint files (blobs) removed because no checkpoint kept names them any more.
    pub collected_blobs: usize,
}

/// The shared queue's prune: the rows removed, task by task.
#[cfg(feature = "postgres")]
#[derive(Debug)]
pub struct DatabasePruneReport {
    pub pruned: crate::queue::postgres::DbPrune,
    /// The database, without its password.
    pub database: String,
}

/// Without PostgreSQL support there is no database report.
#[cfg(not(feature = "postgres"))]
#[derive(Debug)]
pub enum DatabasePruneReport {}

impl QueueClient {
    /// Prune the queue as `request` says.
    pub fn prune(&self, request: &PruneRequest) -> ClientResult<PruneReport> {
        match &self.backend {
            Backend::Files { root, writable } => {
                prune_files(writable_root(root, writable)?, request).map(PruneReport::Files)
            }
            #[cfg(feature = "postgres")]
            Backend::Database(shared) => prune_db(shared, request).map(PruneReport::Database),
        }
    }
}

fn prune_files(root: &Path, request: &PruneRequest) -> ClientResult<FilePruneReport> {
    let reader = QueueReader::open(root);
    if !reader.exists() {
        return Err(ClientError::failure(format_args!(
            "queue {} does not exist",
            reader.root().display()
        )));
    }
    // Refused before anything is read: a directory replaced by a link would lead the plan (and,
    // for root, the removals) outside the queue.
    let pruner = QueuePruner::open(&reader)
        .map_err(|problem| ClientError::failure(format_args!("refusing to prune: {problem}")))?;
    let rules = PruneRules {
        older_than: request.older_than,
        keep_generations: request.keep_generations,
    };
    let plan: PrunePlan = reader
        .prune_plan(&rules, Utc::now())
        .map_err(|e| ClientError::failure(format_args!("{e}; nothing was removed")))?;
    let mut report = FilePruneReport {
        removed: Vec::new(),
        finished_tasks: plan.finished_tasks,
        rejected_records: plan.rejected_records,
        counts: BTreeMap::new(),
        bytes: 0,
        not_removed: Vec::new(),
        collected_blobs: 0,
    };
    for item in &plan.items {
        let size = item.disk_size();
        let result = if request.dry_run {
            Ok(item.is_dir())
        } else {
            pruner.remove(item)
        };
        match result {
            Ok(is_dir) => {
                report.bytes += size;
                *report.counts.entry(item.reason).or_default() += 1;
                report.removed.push((item.path.clone(), is_dir));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => report
                .not_removed
                .push(format!("{}: {e}", item.path.display())),
        }
    }
    // The files the removed checkpoints named, unless another checkpoint names them.
    if !request.dry_run {
        match pruner.collect_blobs() {
            Ok(n) => report.collected_blobs = n,
            Err(e) => report.not_removed.push(format!("checkpoint files: {e}")),
        }
    }
    Ok(report)
}

/// The shared queue's finished tasks past their retention, with all their rows. Batches
/// already committed stay removed when a later one fails; the error says so.
#[cfg(feature = "postgres")]
fn prune_db(
    shared: &super::database::SharedQueue,
    request: &PruneRequest,
) -> ClientResult<DatabasePruneReport> {
    use crate::queue::postgres::PruneRules;

    let rules = PruneRules {
        keep_generations: request.keep_generations,
        dry_run: request.dry_run,
        ..PruneRules::older_than(request.older_than)
    };
    let pruned = shared
        .runtime
        .block_on(shared.db.prune(&rules))
        .map_err(|e| {
            shared.error(format_args!(
                "{e}; tasks of the batches before were removed, the others were not"
            ))
        })?;
    Ok(DatabasePruneReport {
        pruned,
        database: shared.database.clone(),
    })
}
