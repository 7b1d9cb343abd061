//! How far a set of tasks got, read in one statement each: for `cairn bench queue --db`, which
//! waits for tasks to finish and times them by what the database recorded (the files' bench
//! reads the journals in `runs/`).

use chrono::{DateTime, Utc};

use super::connect::PgQueue;
use super::error::{During, PgError};

/// What the database recorded of one task's way through the queue.
#[derive(Debug, Clone)]
pub struct TaskTimes {
    pub task_id: String,
    /// When it was taken into the shared queue (its `accepted` event's transaction).
    pub accepted_at: DateTime<Utc>,
    /// When its last `phase_started` event was journaled, if any. The journal appends events
    /// off the daemon's path, so this is when the event reached the database, a little after
    /// the phase started.
    pub phase_started_at: Option<DateTime<Utc>>,
    /// When its final record was written, with its status and the record (JSON), if any.
    pub finished_at: Option<DateTime<Utc>>,
    pub status: Option<String>,
    /// The record's JSON text.
    pub record: Option<String>,
}

/// Each of tasks `$1`: accepted, last phase started, record.
const TIMES: &str = "
SELECT t.id, t.submitted_at,
       (SELECT max(e.at) FROM cairn_events e
        WHERE e.task_id = t.id AND e.event ->> 'event' = 'phase_started'),
       r.finished_at, r.status, r.record::text
FROM cairn_tasks t LEFT JOIN cairn_records r ON r.task_id = t.id
WHERE t.id = ANY($1)
ORDER BY t.id";

impl PgQueue {
    /// How many of the tasks `ids` have a final record: done, and any other status.
    pub async fn records_of(&self, ids: &[String]) -> Result<(u64, u64), PgError> {
        let client = self.client().await?;
        let row = client
            .query_one(
                "SELECT count(*) FILTER (WHERE status = 'done'),
                        count(*) FILTER (WHERE status <> 'done')
                 FROM cairn_records WHERE task_id = ANY($1)",
                &[&ids],
            )
            .await
            .during("counting records")?;
        let count = |i| u64::try_from(row.get::<_, i64>(i)).unwrap_or(0);
        Ok((count(0), count(1)))
    }

    /// What the database recorded of each of the tasks `ids` it holds, by id.
    pub async fn times_of(&self, ids: &[String]) -> Result<Vec<TaskTimes>, PgError> {
        let client = self.client().await?;
        let rows = client
            .query(TIMES, &[&ids])
            .await
            .during("reading the tasks' times")?;
        Ok(rows
            .iter()
            .map(|row| TaskTimes {
                task_id: row.get(0),
                accepted_at: row.get(1),
                phase_started_at: row.get(2),
                finished_at: row.get(3),
                status: row.get(4),
                record: row.get(5),
            })
            .collect())
    }

    /// The database's clock now, to set times it records against this host's.
    pub async fn database_now(&self) -> Result<DateTime<Utc>, PgError> {
        let client = self.client().await?;
        let row = client
            .query_one("SELECT clock_timestamp()", &[])
            .await
            .during("reading the database's clock")?;
        Ok(row.get(0))
    }
}
