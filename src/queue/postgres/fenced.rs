//! Writes under a lease: each checks, in the same statement, that the lease is still held
//! (same node, same epoch, not expired by the database's clock) and writes nothing otherwise,
//! returning [`PgError::LeaseLost`]. A daemon that froze past its lease can therefore never
//! overwrite the work of the node that took its task over.
//!
//! Each statement starts with the `fence` CTE, an `UPDATE` of the task's row: it takes the
//! row's lock, so a claim of the same task waits for the write to commit (or the write waits
//! for the claim, and then finds the epoch raised).

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::connect::PgQueue;
use super::error::{in_range, During, PgError};
use super::lease::Lease;
use super::row_state::RowState;
use crate::store::{encode_checkpoint, IterationCheckpoint, SavedCheckpoint, FORMAT_VERSION};

/// The lease check every fenced statement starts with; `$1` task, `$2` node, `$3` epoch.
/// `extra` adds assignments (`, crash_count = 0`).
macro_rules! fenced {
    ($extra:literal, $rest:literal) => {
        concat!(
            "WITH fence AS (
                UPDATE cairn_tasks SET updated_at = now()",
            $extra,
            " WHERE id = $1 AND lease_node = $2 AND lease_epoch = $3
                  AND state = 'running' AND lease_expires_at > now()
                RETURNING id
            ) ",
            $rest
        )
    };
}

/// Store a batch of checkpoints of node `$1`'s tasks in one statement (one transaction, one WAL
/// flush), each row fenced on its own: `$2` task ids, `$3` the epochs their leases hold, `$4`
/// generations, `$5` gzip bytes, `$6` iteration counts (arrays in the same order, one task at
/// most once), `$7` older generations kept besides each new one. A row whose lease is no longer
/// held (another epoch, another node, expired) matches nothing in the fence and is written
/// nowhere; the others are stored. Returns the task ids stored.
///
/// The fence locks each held task's row (`FOR NO KEY UPDATE`, the lock a claim's `UPDATE`
/// takes): a claim of the same task waits for the batch to commit, or the batch waits for the
/// claim and then finds the epoch raised (the row is checked again once locked). The row is
/// rewritten only when the checkpoint is news to it: a committed checkpoint is progress, so
/// the first of a lease sets `progressed_epoch` and clears the crash count (an expiry of this
/// lease is then no crash of the task's, see [`super::lease`]); the later ones only lock it,
/// which spares the server a new version of the task's row (its definition with it) per
/// checkpoint. The same generation sent again under the same epoch (a save retried after its
/// answer was lost with the connection) stores it again rather than failing on the key.
const SAVE_CHECKPOINTS: &str = "
WITH fence AS (
    SELECT t.id, t.lease_epoch,
           t.progressed_epoch IS DISTINCT FROM t.lease_epoch OR t.crash_count <> 0 AS news
    FROM cairn_tasks t
    JOIN unnest($2::text[], $3::int8[]) AS held(id, epoch)
      ON t.id = held.id AND t.lease_epoch = held.epoch
    WHERE t.lease_node = $1 AND t.state = 'running' AND t.lease_expires_at > now()
    FOR NO KEY UPDATE OF t
), progressed AS (
    UPDATE cairn_tasks t
    SET updated_at = now(), crash_count = 0, progressed_epoch = f.lease_epoch
    FROM fence f
    WHERE t.id = f.id AND f.news
), saved AS (
    INSERT INTO cairn_checkpoints (task_id, generation, bytes, iteration_count, lease_epoch)
    SELECT w.id, w.generation, w.bytes, w.iterations, w.epoch
    FROM unnest($2::text[], $3::int8[], $4::int8[], $5::bytea[], $6::int8[])
         AS w(id, epoch, generation, bytes, iterations)
    JOIN fence f ON f.id = w.id AND f.lease_epoch = w.epoch
    ON CONFLICT (task_id, generation) DO UPDATE
    SET bytes = EXCLUDED.bytes, iteration_count = EXCLUDED.iteration_count,
        written_at = now()
    WHERE cairn_checkpoints.lease_epoch = EXCLUDED.lease_epoch
    RETURNING task_id, generation
), pruned AS (
    DELETE FROM cairn_checkpoints c USING saved s
    WHERE c.task_id = s.task_id AND c.generation < s.generation - $7
)
SELECT task_id FROM saved";

/// Replace the task's phase-level state with `$4` (JSON text). (Set in the fence itself: a
/// statement must not update one row twice.)
const SAVE_PHASE_STATE: &str = fenced!(", phase_state = $4::text::json", "SELECT id FROM fence");

/// Store the output `$6` (JSON text) of phase `$5` at index `$4`; an empty `$5` stands for
/// the name the task's definition gives phase `$4`. A finished phase is progress.
const SAVE_OUTPUT: &str = fenced!(
    ", crash_count = 0, progressed_epoch = $3",
    ", saved AS (
        INSERT INTO cairn_outputs (task_id, phase_index, phase, output, lease_epoch)
        SELECT f.id, $4,
               COALESCE(NULLIF($5, ''), t.definition -> 'phases' -> $4::int ->> 'name', ''),
               $6::text::json, $3
        FROM fence f JOIN cairn_tasks t ON t.id = f.id
        ON CONFLICT (task_id, phase_index) DO UPDATE
        SET phase = EXCLUDED.phase, output = EXCLUDED.output, lease_epoch = EXCLUDED.lease_epoch
        RETURNING task_id
    )
    SELECT task_id FROM saved"
);

/// Append the event `$4` (JSON text) to the task's journal.
const APPEND_EVENT: &str = fenced!(
    "",
    ", saved AS (
        INSERT INTO cairn_events (task_id, node, lease_epoch, event)
        SELECT id, $2, $3, $4::text::json FROM fence
        RETURNING task_id
    )
    SELECT task_id FROM saved"
);

/// Append the event `$4` (JSON text) to the journal of a task that node `$2` finished under
/// epoch `$3` (its record says so): the closing events follow the record that ended the lease.
const APPEND_AFTER_RECORD: &str = "
INSERT INTO cairn_events (task_id, node, lease_epoch, event)
SELECT task_id, $2, $3, $4::text::json FROM cairn_records WHERE task_id = $1 AND lease_epoch = $3
RETURNING task_id";

/// End the task in state `$4` with record `$6` (JSON text, status `$5`), and end the lease.
const FINISH: &str = fenced!(
    ", state = $4, lease_node = NULL, lease_expires_at = NULL, crash_count = 0",
    ", saved AS (
        INSERT INTO cairn_records (task_id, status, record, lease_epoch)
        SELECT id, $5, $6::text::json, $3 FROM fence
        RETURNING task_id
    )
    SELECT task_id FROM saved"
);

/// Hand the task back for a later attempt, not claimed for `$4` seconds (a retry's backoff);
/// `$5` clears the crash count (the attempt ended while its daemon lived).
const REQUEUE: &str = fenced!(
    ", state = 'queued', lease_node = NULL, lease_expires_at = NULL,
       not_before = now() + $4::float8 * interval '1 second',
       crash_count = CASE WHEN $5 THEN 0 ELSE crash_count END",
    "SELECT id FROM fence"
);

/// Hold the task (an operator's pause): not claimed until resumed.
const PAUSE: &str = fenced!(
    ", state = 'paused', lease_node = NULL, lease_expires_at = NULL, crash_count = 0",
    "SELECT id FROM fence"
);

/// Move the task's final record into its history (a retry under this lease brings it back).
const ARCHIVE_RECORD: &str = fenced!(
    "",
    ", gone AS (
        DELETE FROM cairn_records WHERE task_id = $1 AND EXISTS (SELECT 1 FROM fence)
        RETURNING task_id, status, record, finished_at
    ), archived AS (
        INSERT INTO cairn_record_history (task_id, status, record, finished_at)
        SELECT task_id, status, record, finished_at FROM gone
    )
    SELECT id FROM fence"
);

/// How a task ended, for its final state and record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Done,
    Failed,
    /// Stopped by its budget (state `failed`, status `budget_exceeded`).
    BudgetExceeded,
    Cancelled,
}

impl Outcome {
    /// The task's final state in `cairn_tasks`.
    fn state(self) -> RowState {
        match self {
            Outcome::Done => RowState::Done,
            Outcome::Failed | Outcome::BudgetExceeded => RowState::Failed,
            Outcome::Cancelled => RowState::Cancelled,
        }
    }

    /// The record's status, as in the file queue's records.
    pub fn status(self) -> &'static str {
        match self {
            Outcome::Done => "done",
            Outcome::Failed => "failed",
            Outcome::BudgetExceeded => "budget_exceeded",
            Outcome::Cancelled => "cancelled",
        }
    }
}

/// One stored checkpoint generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredCheckpoint {
    pub generation: u64,
    /// The gzip bytes, exactly as a checkpoint file holds them (`decode_checkpoint` reads them).
    pub bytes: Vec<u8>,
    pub iteration_count: u64,
    /// The epoch of the lease it was written under.
    pub lease_epoch: i64,
    pub written_at: DateTime<Utc>,
}

/// A checkpoint encoded and numbered for a lease, ready to be stored
/// ([`PgQueue::save_checkpoints`]): what a save sends, the same bytes on every try.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointWrite {
    pub task_id: String,
    /// The epoch of the lease it is written under.
    pub epoch: i64,
    pub generation: i64,
    /// The gzip bytes, exactly as a checkpoint file holds them.
    pub bytes: Vec<u8>,
    pub iterations: i64,
}

impl CheckpointWrite {
    /// Number `cp` as the next generation of `lease` and encode it. Sets `cp.generation`,
    /// `cp.format_version` and `cp.last_checkpoint_at` as the file store does; the lease's
    /// count moves on only once the write is stored.
    pub fn encode<S: Serialize>(
        lease: &Lease,
        cp: &mut IterationCheckpoint<S>,
    ) -> Result<CheckpointWrite, PgError> {
        let generation = lease.last_generation + 1;
        cp.generation = in_range("checkpoint generation", generation)?;
        cp.format_version = FORMAT_VERSION;
        cp.last_checkpoint_at = Utc::now();
        let bytes = encode_checkpoint(cp).map_err(|source| PgError::Encode {
            task_id: cp.task_id.clone(),
            source,
        })?;
        Ok(CheckpointWrite {
            task_id: lease.task_id.clone(),
            epoch: lease.epoch,
            generation,
            bytes,
            iterations: in_range("iteration count", cp.iteration_count)?,
        })
    }

    /// What a stored write reports, `elapsed` after its save started.
    pub fn saved(&self, elapsed: std::time::Duration) -> SavedCheckpoint {
        SavedCheckpoint {
            generation: u64::try_from(self.generation).unwrap_or(0),
            iteration_count: u64::try_from(self.iterations).unwrap_or(0),
            bytes: self.bytes.len() as u64,
            elapsed,
        }
    }

    /// The error of a write its lease's fence refused.
    pub fn lease_lost(&self, node: &str) -> PgError {
        PgError::LeaseLost {
            task_id: self.task_id.clone(),
            node: node.to_owned(),
            epoch: self.epoch,
        }
    }
}

impl PgQueue {
    /// Durably store `cp` as the task's next checkpoint generation, keeping
    /// `keep_generations` older ones. Sets `cp.generation`, `cp.format_version` and
    /// `cp.last_checkpoint_at` as the file store does. Returns what was written. The lease
    /// counts the generations, so a task's saves go through one `Lease` value (a stale clone
    /// would reuse a number, and its save fail on the generation's key).
    pub async fn save_checkpoint<S: Serialize>(
        &self,
        lease: &mut Lease,
        cp: &mut IterationCheckpoint<S>,
        keep_generations: u32,
    ) -> Result<SavedCheckpoint, PgError> {
        let started = std::time::Instant::now();
        let write = CheckpointWrite::encode(lease, cp)?;
        let stored = self
            .save_checkpoints(&lease.node, &[&write], keep_generations)
            .await?;
        if stored.first() != Some(&true) {
            return Err(write.lease_lost(&lease.node));
        }
        lease.last_generation = write.generation;
        Ok(write.saved(started.elapsed()))
    }

    /// Store the checkpoints `writes` of node `node`'s tasks (each task at most once) in one
    /// statement, keeping `keep_generations` older generations of each: one transaction and
    /// one WAL flush for all, each still fenced by its own lease. Says for each write, in
    /// order, whether it was stored (`false`: its lease is no longer held, and nothing of it
    /// was written). An error means none was.
    pub async fn save_checkpoints(
        &self,
        node: &str,
        writes: &[&CheckpointWrite],
        keep_generations: u32,
    ) -> Result<Vec<bool>, PgError> {
        const ACTION: &str = "saving checkpoints";
        let ids: Vec<&str> = writes.iter().map(|w| w.task_id.as_str()).collect();
        let epochs: Vec<i64> = writes.iter().map(|w| w.epoch).collect();
        let generations: Vec<i64> = writes.iter().map(|w| w.generation).collect();
        let bytes: Vec<&[u8]> = writes.iter().map(|w| w.bytes.as_slice()).collect();
        let iterations: Vec<i64> = writes.iter().map(|w| w.iterations).collect();
        let keep = i64::from(keep_generations);
        let client = self.client().await?;
        let prepared = client
            .prepare_cached(SAVE_CHECKPOINTS)
            .await
            .during(ACTION)?;
        let rows = client
            .query(
                &prepared,
                &[
                    &node,
                    &ids,
                    &epochs,
                    &generations,
                    &bytes,
                    &iterations,
                    &keep,
                ],
            )
            .await
            .during(ACTION)?;
        let stored: std::collections::HashSet<String> =
            rows.iter().map(|row| row.get::<_, String>(0)).collect();
        Ok(writes.iter().map(|w| stored.contains(&w.task_id)).collect())
    }

    /// Replace the task's phase-level state (JSON text).
    pub async fn save_phase_state(&self, lease: &Lease, state_json: &str) -> Result<(), PgError> {
        self.fenced_write(
            lease,
            SAVE_PHASE_STATE,
            &[&state_json],
            "saving the phase state",
        )
        .await
    }

    /// Store a finished phase's output (JSON text); an empty `phase` is read from the task's
    /// definition.
    pub async fn save_output(
        &self,
        lease: &Lease,
        phase_index: u32,
        phase: &str,
        output_json: &str,
    ) -> Result<(), PgError> {
        let index: i32 = in_range("phase index", phase_index)?;
        self.fenced_write(
            lease,
            SAVE_OUTPUT,
            &[&index, &phase, &output_json],
            "saving a phase output",
        )
        .await
    }

    /// Append an event (JSON text) to the task's journal.
    pub async fn append_event(&self, lease: &Lease, event_json: &str) -> Result<(), PgError> {
        self.fenced_write(lease, APPEND_EVENT, &[&event_json], "appending an event")
            .await
    }

    /// Append an event (JSON text) to the journal of a task this lease finished: refused
    /// unless its record was written under this lease.
    pub async fn append_event_after_record(
        &self,
        lease: &Lease,
        event_json: &str,
    ) -> Result<(), PgError> {
        self.fenced_write(
            lease,
            APPEND_AFTER_RECORD,
            &[&event_json],
            "appending an event after the record",
        )
        .await
    }

    /// End the task with its final record (JSON text); the lease ends with it.
    pub async fn finish(
        &self,
        lease: &Lease,
        outcome: Outcome,
        record_json: &str,
    ) -> Result<(), PgError> {
        self.fenced_write(
            lease,
            FINISH,
            &[&outcome.state().as_str(), &outcome.status(), &record_json],
            "finishing the task",
        )
        .await
    }

    /// End the lease and queue the task again, claimable once `after` has passed (by the
    /// database's clock): a failed attempt waiting for its backoff, or an attempt given back.
    /// `clear_crash_count` when the attempt's end shows the task did not kill its daemon.
    pub async fn requeue(
        &self,
        lease: &Lease,
        after: Duration,
        clear_crash_count: bool,
    ) -> Result<(), PgError> {
        self.fenced_write(
            lease,
            REQUEUE,
            &[&after.as_secs_f64(), &clear_crash_count],
            "queueing the task again",
        )
        .await
    }

    /// End the lease and hold the task until it is resumed.
    pub async fn pause(&self, lease: &Lease) -> Result<(), PgError> {
        self.fenced_write(lease, PAUSE, &[], "pausing the task")
            .await
    }

    /// Move the task's final record into its history, keeping it there (a retry).
    pub async fn archive_record(&self, lease: &Lease) -> Result<(), PgError> {
        self.fenced_write(lease, ARCHIVE_RECORD, &[], "archiving the task's record")
            .await
    }

    /// Whether the task's final record was written under `lease` (a finish whose answer was
    /// lost may have landed).
    pub async fn has_record_of(&self, lease: &Lease) -> Result<bool, PgError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT 1 FROM cairn_records WHERE task_id = $1 AND lease_epoch = $2",
                &[&lease.task_id, &lease.epoch],
            )
            .await
            .during("looking for the task's record")?;
        Ok(row.is_some())
    }

    /// Run a `fenced!` statement with the lease as `$1..$3` and `params` after them.
    async fn fenced_write(
        &self,
        lease: &Lease,
        statement: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        action: &'static str,
    ) -> Result<(), PgError> {
        let client = self.client().await?;
        // Prepared once per connection (the pool keeps the statements with it): a checkpoint or
        // a renewal is then one round trip, not two, and the server parses nothing again.
        let prepared = client.prepare_cached(statement).await.during(action)?;
        let mut all: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
            vec![&lease.task_id, &lease.node, &lease.epoch];
        all.extend_from_slice(params);
        let written = client.query_opt(&prepared, &all).await.during(action)?;
        match written {
            Some(_) => Ok(()),
            None => Err(PgError::LeaseLost {
                task_id: lease.task_id.clone(),
                node: lease.node.clone(),
                epoch: lease.epoch,
            }),
        }
    }

    /// The task's stored checkpoint generations, newest first.
    pub async fn checkpoints(&self, task_id: &str) -> Result<Vec<StoredCheckpoint>, PgError> {
        let client = self.client().await?;
        let rows = client
            .query(ALL_CHECKPOINTS, &[&task_id])
            .await
            .during("reading checkpoints")?;
        Ok(rows.iter().map(stored_checkpoint).collect())
    }

    /// The task's newest stored checkpoint, read alone (a resume needs only its bytes).
    pub async fn latest_checkpoint(
        &self,
        task_id: &str,
    ) -> Result<Option<StoredCheckpoint>, PgError> {
        let client = self.client().await?;
        let newest = client
            .prepare_cached(NEWEST_CHECKPOINT)
            .await
            .during("reading the newest checkpoint")?;
        let row = client
            .query_opt(&newest, &[&task_id])
            .await
            .during("reading the newest checkpoint")?;
        Ok(row.as_ref().map(stored_checkpoint))
    }
}

/// Task `$1`'s checkpoint generations, newest first, as [`stored_checkpoint`] reads a row.
macro_rules! select_checkpoints {
    ($tail:literal) => {
        concat!(
            "SELECT generation, bytes, iteration_count, lease_epoch, written_at
             FROM cairn_checkpoints WHERE task_id = $1 ORDER BY generation DESC",
            $tail
        )
    };
}
const ALL_CHECKPOINTS: &str = select_checkpoints!("");
const NEWEST_CHECKPOINT: &str = select_checkpoints!(" LIMIT 1");

/// A row of [`select_checkpoints`]: `generation, bytes, iteration_count, lease_epoch,
/// written_at`.
fn stored_checkpoint(row: &tokio_postgres::Row) -> StoredCheckpoint {
    StoredCheckpoint {
        generation: u64::try_from(row.get::<_, i64>(0)).unwrap_or(0),
        bytes: row.get(1),
        iteration_count: u64::try_from(row.get::<_, i64>(2)).unwrap_or(0),
        lease_epoch: row.get(3),
        written_at: row.get(4),
    }
}
