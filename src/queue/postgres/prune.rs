//! `cairn prune --db`: finished tasks past their retention go with all their rows (their
//! checkpoints, outputs, events, record and record history follow the task's row:
//! `ON DELETE CASCADE`).
//!
//! Only tasks whose state is final (`done`, `failed`, `cancelled`), that no daemon holds and
//! no pending control request names (a `cairn retry` not yet handled), and whose record was
//! stored longer ago than the retention by the database's clock (`now()`, never a host's) are
//! removed. They go in batches, one transaction each, their rows locked while they are counted
//! and deleted, so a task brought back meanwhile is either removed before or kept. Queued,
//! running and paused tasks are never touched. A dry run makes the same statements and rolls
//! each batch back: what it says is what a prune would do.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::connect::PgQueue;
use super::error::{During, PgError};
use crate::queue::PRUNE_GRACE;

/// Tasks removed per transaction: short transactions and locks, whatever the backlog.
pub const PRUNE_BATCH: i64 = 500;

/// What to prune.
#[derive(Debug, Clone, Copy)]
pub struct PruneRules {
    /// Finished tasks whose record is older than this go.
    pub older_than: Duration,
    /// Trim the older checkpoint generations of the finished tasks that stay to the newest N.
    pub keep_generations: Option<usize>,
    /// Roll every batch back.
    pub dry_run: bool,
    /// Tasks per transaction ([`PRUNE_BATCH`]; tests make it small).
    pub batch: i64,
}

impl PruneRules {
    /// Prune finished tasks older than `older_than`, in batches of [`PRUNE_BATCH`].
    pub fn older_than(older_than: Duration) -> PruneRules {
        PruneRules {
            older_than,
            keep_generations: None,
            dry_run: false,
            batch: PRUNE_BATCH,
        }
    }
}

/// What a prune removed (or, dry, would remove).
#[derive(Debug, Clone, Default)]
pub struct DbPrune {
    /// By id.
    pub tasks: Vec<PrunedTask>,
    /// Older checkpoint generations of the finished tasks that stay, beyond `keep_generations`.
    pub generations: Vec<PrunedGeneration>,
    /// Handled control requests past the retention.
    pub control_requests: u64,
}

impl DbPrune {
    /// Rows removed in all.
    pub fn rows(&self) -> u64 {
        let tasks: u64 = self.tasks.iter().map(PrunedTask::rows).sum();
        tasks + self.generations.len() as u64 + self.control_requests
    }
}

/// A finished task removed, and how many rows went with it.
#[derive(Debug, Clone)]
pub struct PrunedTask {
    pub id: String,
    /// Its record's status.
    pub status: String,
    pub finished_at: DateTime<Utc>,
    pub checkpoints: u64,
    pub outputs: u64,
    pub events: u64,
    /// Final records a retry replaced.
    pub old_records: u64,
}

impl PrunedTask {
    /// Its rows: the task's, its record's, and those that hang off it.
    pub fn rows(&self) -> u64 {
        2 + self.checkpoints + self.outputs + self.events + self.old_records
    }
}

/// An older checkpoint generation removed from a finished task that stays.
#[derive(Debug, Clone)]
pub struct PrunedGeneration {
    pub task_id: String,
    pub generation: u64,
}

/// Finished tasks after id `$2`, that nobody holds or steers, whose record is older than
/// `$1` seconds by the database's clock: the next batch (`$3`), locked, with its rows' counts.
const FINISHED_PAST_RETENTION: &str = "
SELECT t.id, r.status, r.finished_at,
       (SELECT count(*) FROM cairn_checkpoints c WHERE c.task_id = t.id),
       (SELECT count(*) FROM cairn_outputs o WHERE o.task_id = t.id),
       (SELECT count(*) FROM cairn_events e WHERE e.task_id = t.id),
       (SELECT count(*) FROM cairn_record_history h WHERE h.task_id = t.id)
FROM cairn_tasks t JOIN cairn_records r ON r.task_id = t.id
WHERE t.state IN ('done', 'failed', 'cancelled') AND t.lease_node IS NULL
  AND r.finished_at <= now() - $1::float8 * interval '1 second'
  AND NOT EXISTS (SELECT 1 FROM cairn_control q WHERE q.task_id = t.id AND q.handled_at IS NULL)
  AND t.id > $2
ORDER BY t.id
LIMIT $3
FOR UPDATE OF t";

/// The next batch (`$2`) of finished tasks after id `$1` that stay (not in `$3`, the tasks
/// pruned), locked.
const FINISHED_STAYING: &str = "
SELECT t.id FROM cairn_tasks t
WHERE t.state IN ('done', 'failed', 'cancelled') AND t.id > $1 AND NOT (t.id = ANY($3))
ORDER BY t.id
LIMIT $2
FOR UPDATE OF t";

/// Older generations of the tasks `$2` beyond the newest `$1` besides the latest.
const TRIM_GENERATIONS: &str = "
DELETE FROM cairn_checkpoints c
WHERE c.task_id = ANY($2)
  AND c.generation < (SELECT max(generation) FROM cairn_checkpoints l
                      WHERE l.task_id = c.task_id) - $1
RETURNING c.task_id, c.generation";

/// Handled control requests older than `$1` seconds.
const OLD_CONTROL_REQUESTS: &str = "
DELETE FROM cairn_control
WHERE handled_at IS NOT NULL AND handled_at <= now() - $1::float8 * interval '1 second'";

impl PgQueue {
    /// Remove the finished tasks past `rules.older_than` with all their rows, trim the older
    /// checkpoint generations of the finished tasks that stay, and drop handled control
    /// requests past the retention (and [`PRUNE_GRACE`]); see the module's notes.
    pub async fn prune(&self, rules: &PruneRules) -> Result<DbPrune, PgError> {
        let mut client = self.client().await?;
        let mut pruned = DbPrune {
            tasks: prune_finished_tasks(&mut client, rules).await?,
            ..DbPrune::default()
        };
        if let Some(keep) = rules.keep_generations {
            let keep = i64::try_from(keep).unwrap_or(i64::MAX);
            let gone: Vec<&str> = pruned.tasks.iter().map(|t| t.id.as_str()).collect();
            let mut generations = trim_generations(&mut client, rules, keep, &gone).await?;
            generations.sort_by(|a, b| (&a.task_id, a.generation).cmp(&(&b.task_id, b.generation)));
            pruned.generations = generations;
        }
        let retention = rules.older_than.as_secs_f64();
        let control_retention = retention.max(PRUNE_GRACE.as_secs_f64());
        let tx = client.transaction().await.during("starting the prune")?;
        pruned.control_requests = tx
            .execute(OLD_CONTROL_REQUESTS, &[&control_retention])
            .await
            .during("removing old control requests")?;
        end(tx, rules.dry_run).await?;
        Ok(pruned)
    }
}

/// Remove the finished tasks past `rules.older_than`, a batch a transaction, by id.
async fn prune_finished_tasks(
    client: &mut deadpool_postgres::Object,
    rules: &PruneRules,
) -> Result<Vec<PrunedTask>, PgError> {
    let retention = rules.older_than.as_secs_f64();
    let batch = rules.batch.max(1);
    let mut pruned = Vec::new();
    let mut after = String::new();
    loop {
        let tx = client
            .transaction()
            .await
            .during("starting a prune batch")?;
        let batch: Vec<PrunedTask> = tx
            .query(FINISHED_PAST_RETENTION, &[&retention, &after, &batch])
            .await
            .during("finding the finished tasks to prune")?
            .iter()
            .map(|row| PrunedTask {
                id: row.get(0),
                status: row.get(1),
                finished_at: row.get(2),
                checkpoints: count(row.get(3)),
                outputs: count(row.get(4)),
                events: count(row.get(5)),
                old_records: count(row.get(6)),
            })
            .collect();
        let Some(last) = batch.last() else {
            tx.rollback().await.during("ending the prune batch")?;
            return Ok(pruned);
        };
        after = last.id.clone();
        let ids: Vec<&str> = batch.iter().map(|t| t.id.as_str()).collect();
        tx.execute("DELETE FROM cairn_tasks WHERE id = ANY($1)", &[&ids])
            .await
            .during("removing the finished tasks")?;
        end(tx, rules.dry_run).await?;
        pruned.extend(batch);
    }
}

/// Trim the older checkpoint generations of the finished tasks that stay (not in `gone`) to
/// the newest `keep` besides the latest, a batch a transaction.
async fn trim_generations(
    client: &mut deadpool_postgres::Object,
    rules: &PruneRules,
    keep: i64,
    gone: &[&str],
) -> Result<Vec<PrunedGeneration>, PgError> {
    let batch = rules.batch.max(1);
    let mut trimmed = Vec::new();
    let mut after = String::new();
    loop {
        let tx = client.transaction().await.during("starting a trim batch")?;
        let ids: Vec<String> = tx
            .query(FINISHED_STAYING, &[&after, &batch, &gone])
            .await
            .during("finding the finished tasks that stay")?
            .iter()
            .map(|row| row.get(0))
            .collect();
        let Some(last) = ids.last() else {
            tx.rollback().await.during("ending the trim batch")?;
            return Ok(trimmed);
        };
        after = last.clone();
        for row in tx
            .query(TRIM_GENERATIONS, &[&keep, &ids])
            .await
            .during("trimming checkpoint generations")?
        {
            trimmed.push(PrunedGeneration {
                task_id: row.get(0),
                generation: count(row.get(1)),
            });
        }
        end(tx, rules.dry_run).await?;
    }
}

/// Commit a batch, or roll it back for a dry run.
async fn end(tx: deadpool_postgres::Transaction<'_>, dry_run: bool) -> Result<(), PgError> {
    if dry_run {
        tx.rollback().await.during("rolling the dry run back")
    } else {
        tx.commit().await.during("committing the prune")
    }
}

fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}
