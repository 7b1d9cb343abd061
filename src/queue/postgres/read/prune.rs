//! `cairn prune --db`: finished tasks past their retention go with all their rows (their
//! checkpoints, outputs, events and record follow the task's row: `ON DELETE CASCADE`).
//!
//! Only tasks whose state is final (`done`, `failed`, `cancelled`) and whose record was stored
//! longer ago than the retention, by the database's clock, are removed; the rows are locked
//! while they are counted and deleted, so a task brought back meanwhile (`cairn retry`) is
//! either removed before or kept. Queued, running and paused tasks are never touched.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::queue::postgres::error::{During, PgError};
use crate::queue::PRUNE_GRACE;

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
        let tasks: u64 = self
            .tasks
            .iter()
            .map(|t| 2 + t.checkpoints + t.outputs + t.events)
            .sum();
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
}

/// An older checkpoint generation removed from a finished task that stays.
#[derive(Debug, Clone)]
pub struct PrunedGeneration {
    pub task_id: String,
    pub generation: u64,
}

/// The finished tasks past the retention (`$1` seconds), locked, with their rows' counts.
const FINISHED_PAST_RETENTION: &str = "
SELECT t.id, r.status, r.finished_at,
       (SELECT count(*) FROM cairn_checkpoints c WHERE c.task_id = t.id),
       (SELECT count(*) FROM cairn_outputs o WHERE o.task_id = t.id),
       (SELECT count(*) FROM cairn_events e WHERE e.task_id = t.id)
FROM cairn_tasks t JOIN cairn_records r ON r.task_id = t.id
WHERE t.state IN ('done', 'failed', 'cancelled')
  AND r.finished_at <= now() - $1::float8 * interval '1 second'
ORDER BY t.id
FOR UPDATE OF t";

/// Older generations of the finished tasks beyond the newest `$1` besides the latest.
const TRIM_GENERATIONS: &str = "
DELETE FROM cairn_checkpoints c
USING cairn_tasks t
WHERE t.id = c.task_id AND t.state IN ('done', 'failed', 'cancelled')
  AND c.generation < (SELECT max(generation) FROM cairn_checkpoints l
                      WHERE l.task_id = c.task_id) - $1
RETURNING c.task_id, c.generation";

/// Handled control requests older than `$1` seconds.
const OLD_CONTROL_REQUESTS: &str = "
DELETE FROM cairn_control
WHERE handled_at IS NOT NULL AND handled_at <= now() - $1::float8 * interval '1 second'";

/// Run the prune in one transaction; `dry_run` rolls it back.
pub(super) async fn prune(
    client: &mut tokio_postgres::Client,
    older_than: Duration,
    keep_generations: Option<usize>,
    dry_run: bool,
) -> Result<DbPrune, PgError> {
    let tx = client.transaction().await.during("starting the prune")?;
    let retention = older_than.as_secs_f64();
    let tasks: Vec<PrunedTask> = tx
        .query(FINISHED_PAST_RETENTION, &[&retention])
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
        })
        .collect();
    let ids: Vec<&str> = tasks.iter().map(|t| t.id.as_str()).collect();
    tx.execute("DELETE FROM cairn_tasks WHERE id = ANY($1)", &[&ids])
        .await
        .during("removing the finished tasks")?;
    let mut generations = Vec::new();
    if let Some(keep) = keep_generations {
        let keep = i64::try_from(keep).unwrap_or(i64::MAX);
        for row in tx
            .query(TRIM_GENERATIONS, &[&keep])
            .await
            .during("trimming checkpoint generations")?
        {
            generations.push(PrunedGeneration {
                task_id: row.get(0),
                generation: count(row.get(1)),
            });
        }
        generations.sort_by(|a, b| (&a.task_id, a.generation).cmp(&(&b.task_id, b.generation)));
    }
    let control_retention = retention.max(PRUNE_GRACE.as_secs_f64());
    let control_requests = tx
        .execute(OLD_CONTROL_REQUESTS, &[&control_retention])
        .await
        .during("removing old control requests")?;
    if dry_run {
        tx.rollback().await.during("rolling the dry run back")?;
    } else {
        tx.commit().await.during("committing the prune")?;
    }
    Ok(DbPrune {
        tasks,
        generations,
        control_requests,
    })
}

fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}
