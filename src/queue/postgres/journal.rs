//! The event journal of the database backend: events are appended in the order they were
//! given, by one task on the backend's runtime, so a caller never waits for the database (a
//! journal is a log, not state) and `cairn history` reads them in order. The events queued
//! while an append was in flight go in the next one, one statement for all of them (one
//! commit, as checkpoints are group-committed), each fenced by its own lease.

use std::time::{Duration, Instant};

use tokio::runtime::Runtime;
use tokio::sync::{mpsc, oneshot};

use super::connect::PgQueue;
use super::error::{During, PgError};
use super::lease::Lease;

/// The most events one statement appends.
const MOST_EVENTS: usize = 1024;

/// Append events `$4` (JSON text, in the order `$7`) of tasks `$1` under the leases of nodes
/// `$2` with epochs `$3`, each fenced on its own. An event with `$5` false needs its lease
/// held (the task's row locked, `FOR NO KEY UPDATE` as a claim's `UPDATE` takes it, so no claim
/// crosses the append); one with `$5` true follows the record that ended its lease, and needs
/// that record written under its epoch. Returns the positions (`$7`) appended.
const APPEND_EVENTS: &str = "
WITH batch AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::int8[], $4::text[], $5::bool[], $6::int8[])
        AS b(task_id, node, epoch, event, after_record, ord)
), live AS (
    SELECT t.id, t.lease_node, t.lease_epoch FROM cairn_tasks t
    WHERE t.id = ANY($1) AND t.state = 'running' AND t.lease_expires_at > now()
    ORDER BY t.id
    FOR NO KEY UPDATE
), accepted AS (
    SELECT b.* FROM batch b
    WHERE CASE WHEN b.after_record
        THEN EXISTS (SELECT 1 FROM cairn_records r
                     WHERE r.task_id = b.task_id AND r.lease_epoch = b.epoch)
        ELSE EXISTS (SELECT 1 FROM live l
                     WHERE l.id = b.task_id AND l.lease_node = b.node
                       AND l.lease_epoch = b.epoch)
    END
), saved AS (
    INSERT INTO cairn_events (task_id, node, lease_epoch, event)
    SELECT task_id, node, epoch, event::json FROM accepted ORDER BY ord
)
SELECT ord FROM accepted";

/// One event to append: under `lease`, or after the record that ended it (`after_record`).
pub(super) struct EventAppend {
    pub(super) lease: Lease,
    pub(super) json: String,
    pub(super) after_record: bool,
}

impl PgQueue {
    /// Append `events` in their order in one statement, each fenced by its own lease (see
    /// [`APPEND_EVENTS`]); says for each whether it was appended (`false`: its lease, or the
    /// record it follows, is not there). An error means none was.
    pub(super) async fn append_events(&self, events: &[EventAppend]) -> Result<Vec<bool>, PgError> {
        const ACTION: &str = "appending events";
        let ids: Vec<&str> = events.iter().map(|e| e.lease.task_id.as_str()).collect();
        let nodes: Vec<&str> = events.iter().map(|e| e.lease.node.as_str()).collect();
        let epochs: Vec<i64> = events.iter().map(|e| e.lease.epoch).collect();
        let jsons: Vec<&str> = events.iter().map(|e| e.json.as_str()).collect();
        let after: Vec<bool> = events.iter().map(|e| e.after_record).collect();
        let order: Vec<i64> = (0..events.len() as i64).collect();
        let client = self.client().await?;
        let prepared = client.prepare_cached(APPEND_EVENTS).await.during(ACTION)?;
        let rows = client
            .query(&prepared, &[&ids, &nodes, &epochs, &jsons, &after, &order])
            .await
            .during(ACTION)?;
        let mut appended = vec![false; events.len()];
        for row in rows {
            if let Some(slot) = usize::try_from(row.get::<_, i64>(0))
                .ok()
                .and_then(|i| appended.get_mut(i))
            {
                *slot = true;
            }
        }
        Ok(appended)
    }
}

/// What the journal's task is asked to do.
enum Job {
    /// Append an event (see [`EventAppend`]).
    Append(EventAppend),
    /// Say when every append asked for before is done.
    Flush(oneshot::Sender<()>),
}

/// The sending side of the journal's task.
#[derive(Debug)]
pub(super) struct EventJournal {
    jobs: mpsc::UnboundedSender<Job>,
}

impl EventJournal {
    /// Start the journal's task on `runtime`; it ends when the journal is dropped. An append
    /// that fails for a reason that may pass (the database restarting) is tried again for up
    /// to `retry_for`, the events after it waiting in order.
    pub(super) fn start(runtime: &Runtime, db: PgQueue, retry_for: Duration) -> EventJournal {
        let (jobs, mut queued) = mpsc::unbounded_channel();
        runtime.spawn(async move {
            let mut failing_since: Option<Instant> = None;
            let mut next: Option<Job> = None;
            loop {
                let job = match next.take() {
                    Some(job) => job,
                    None => match queued.recv().await {
                        Some(job) => job,
                        None => break,
                    },
                };
                let first = match job {
                    Job::Flush(done) => {
                        let _ = done.send(());
                        continue;
                    }
                    Job::Append(event) => event,
                };
                // The events queued behind it, up to the next flush, go in the same append.
                let mut batch = vec![first];
                while batch.len() < MOST_EVENTS {
                    match queued.try_recv() {
                        Ok(Job::Append(event)) => batch.push(event),
                        Ok(flush @ Job::Flush(_)) => {
                            next = Some(flush);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                append_in_order(&db, &batch, &mut failing_since, retry_for).await;
            }
        });
        EventJournal { jobs }
    }

    /// Queue an append of `json` under `lease`; `after_record`: the task was finished under
    /// it.
    pub(super) fn append(&self, lease: Lease, json: String, after_record: bool) {
        let _ = self.jobs.send(Job::Append(EventAppend {
            lease,
            json,
            after_record,
        }));
    }

    /// Resolves once every append queued before is done.
    pub(super) async fn flushed(&self) {
        let (done, flushed) = oneshot::channel();
        if self.jobs.send(Job::Flush(done)).is_ok() {
            let _ = flushed.await;
        }
    }
}

/// Append `batch` in one statement. One outage is waited out once: while appends keep failing
/// for a reason that may pass, they are tried again until `retry_for` after the first failure;
/// after that, each batch is tried once until one goes through again. Events refused by their
/// fence, or given up on, are logged.
async fn append_in_order(
    db: &PgQueue,
    batch: &[EventAppend],
    failing_since: &mut Option<Instant>,
    retry_for: Duration,
) {
    let mut pause = Duration::from_millis(100);
    let appended = loop {
        let appended = db.append_events(batch).await;
        let failing = match &appended {
            Err(error) if error.is_transient() => {
                Some(*failing_since.get_or_insert_with(Instant::now))
            }
            _ => {
                *failing_since = None;
                None
            }
        };
        let again = failing.is_some_and(|since| Instant::now() + pause < since + retry_for);
        match appended {
            Err(_) if again => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            other => break other,
        }
    };
    match appended {
        Ok(appended) => {
            for (event, _) in batch.iter().zip(appended).filter(|(_, ok)| !ok) {
                let error = PgError::LeaseLost {
                    task_id: event.lease.task_id.clone(),
                    node: event.lease.node.clone(),
                    epoch: event.lease.epoch,
                };
                tracing::warn!(task_id = %event.lease.task_id, %error, "an event was not journaled");
            }
        }
        Err(error) => {
            for event in batch {
                tracing::warn!(task_id = %event.lease.task_id, %error, "an event was not journaled");
            }
        }
    }
}
