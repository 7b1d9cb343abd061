//! `cairn fork --db`: a new task in the shared queue that starts from a checkpoint of another.
//! What the file fork writes as three files (the new task's checkpoint, `runs/<id>/start.json`,
//! the task in the inbox) is one transaction here: the task's row with its start point
//! (`cairn_tasks.start_point`), its first checkpoint generation (a copy of the one forked
//! from, re-encoded for the new task), the `forked` event in the source's journal, and the
//! wake-up. The source is not touched otherwise.

use std::collections::BTreeMap;

use chrono::Utc;
use serde_json::Value;

use super::connect::PgQueue;
use super::error::{json_text, During, PgError};
use super::submit::NewTask;
use crate::store::current_work::{ActiveTask, StartPoint, StoredOutput};
use crate::store::events::Event;
use crate::store::{encode_checkpoint, IterationCheckpoint, FORMAT_VERSION};
use crate::task_id::TaskId;

/// Insert the forked task with its start point; nothing when the id is taken.
const INSERT_FORK: &str = "
INSERT INTO cairn_tasks (id, priority, crash_limit, definition, start_point)
VALUES ($1, $2, $3, $4::text::json, $5::text::json)
ON CONFLICT (id) DO NOTHING
RETURNING id";

/// What a fork starts from, besides the checkpoint.
#[derive(Debug, Clone)]
pub struct ForkSource {
    /// The source task's definition, as submitted.
    pub definition: String,
    /// The outputs of its finished phases, by name: from its final record if it has one,
    /// else from its phase-level state (large ones read from `cairn_outputs`). An output that
    /// cannot be read is missing.
    pub phase_outputs: BTreeMap<String, Value>,
}

/// Why a fork was not made.
#[derive(Debug, thiserror::Error)]
pub enum ForkError {
    #[error(transparent)]
    Db(#[from] PgError),
    /// The new id is taken.
    #[error("a task with id {0:?} already exists in the shared queue")]
    IdTaken(String),
}

impl PgQueue {
    /// The definition and finished phases' outputs of task `task_id`, if the queue has it.
    pub async fn fork_source(&self, task_id: &str) -> Result<Option<ForkSource>, PgError> {
        let client = self.client().await?;
        let Some(row) = client
            .query_opt(
                "SELECT t.definition::text, t.phase_state::text, r.record::text
                 FROM cairn_tasks t LEFT JOIN cairn_records r ON r.task_id = t.id
                 WHERE t.id = $1",
                &[&task_id],
            )
            .await
            .during("reading the task to fork")?
        else {
            return Ok(None);
        };
        // Done and failed records both keep the finished phases' outputs.
        let of_record: Option<BTreeMap<String, Value>> = row
            .get::<_, Option<&str>>(2)
            .and_then(|text| serde_json::from_str::<Value>(text).ok())
            .and_then(|record| serde_json::from_value(record["phase_outputs"].clone()).ok());
        let entry: Option<ActiveTask> = row
            .get::<_, Option<&str>>(1)
            .and_then(|text| serde_json::from_str(text).ok());
        let phase_outputs = match (of_record, entry) {
            (Some(outputs), _) => outputs,
            (None, Some(entry)) => self.resolve_outputs(&client, &entry).await?,
            (None, None) => BTreeMap::new(),
        };
        Ok(Some(ForkSource {
            definition: row.get(0),
            phase_outputs,
        }))
    }

    /// The outputs `entry` holds, the large ones read from `cairn_outputs` (an unreadable one
    /// is left out).
    async fn resolve_outputs(
        &self,
        client: &tokio_postgres::Client,
        entry: &ActiveTask,
    ) -> Result<BTreeMap<String, Value>, PgError> {
        let mut outputs = BTreeMap::new();
        for (name, stored) in &entry.phase_outputs {
            let value = match stored {
                StoredOutput::Inline(value) => Some(value.clone()),
                StoredOutput::File(reference) => {
                    let Some((task_id, index)) = super::backend::parse_output_reference(reference)
                    else {
                        continue;
                    };
                    client
                        .query_opt(
                            "SELECT output::text FROM cairn_outputs
                             WHERE task_id = $1 AND phase_index = $2",
                            &[&task_id, &index],
                        )
                        .await
                        .during("reading a phase output")?
                        .and_then(|row| serde_json::from_str(row.get::<_, &str>(0)).ok())
                }
            };
            if let Some(value) = value {
                outputs.insert(name.clone(), value);
            }
        }
        Ok(outputs)
    }

    /// Queue `task` (its definition `task.definition`, a fork of `start.forked_from`) starting
    /// at `start`, with `checkpoint` (already patched, of the new task) as its first
    /// generation; journal the fork in the source's journal and wake the daemons. One
    /// transaction: all of it, or nothing. Sets the checkpoint's generation (1), format
    /// version and time, as a save does.
    pub async fn submit_fork(
        &self,
        task: &NewTask<'_>,
        start: &StartPoint,
        checkpoint: Option<&mut IterationCheckpoint>,
        patched: bool,
    ) -> Result<(), ForkError> {
        let new_id = TaskId::parse(task.id).map_err(|reason| PgError::InvalidTaskId {
            task_id: task.id.to_owned(),
            reason,
        })?;
        let copied = checkpoint.map(encode_first_generation).transpose()?;
        let start_json = json_text("the fork's start", start)?;
        let crash_limit = i32::try_from(task.crash_limit).unwrap_or(i32::MAX);
        let mut client = self.client().await?;
        let tx = client.transaction().await.during("starting the fork")?;
        let inserted = tx
            .query_opt(
                INSERT_FORK,
                &[
                    &task.id,
                    &task.priority,
                    &crash_limit,
                    &task.definition,
                    &start_json,
                ],
            )
            .await
            .during("submitting the forked task")?;
        if inserted.is_none() {
            return Err(ForkError::IdTaken(task.id.to_owned()));
        }
        super::submit::journal_accepted(&tx, task).await?;
        if let Some((bytes, iterations)) = &copied {
            tx.execute(
                "INSERT INTO cairn_checkpoints (task_id, generation, bytes, iteration_count, lease_epoch)
                 VALUES ($1, 1, $2, $3, 0)",
                &[&task.id, bytes, iterations],
            )
            .await
            .during("copying the checkpoint forked from")?;
        }
        let event = Event::Forked {
            new_id,
            generation: start.generation,
            patched,
        };
        let event = json_text("the fork's event", &event)?;
        // Written by a command, not a daemon: no node, the source's epoch as it stands.
        tx.execute(
            "INSERT INTO cairn_events (task_id, node, lease_epoch, event)
             SELECT id, '', lease_epoch, $2::text::json FROM cairn_tasks WHERE id = $1",
            &[&start.forked_from, &event],
        )
        .await
        .during("journaling the fork")?;
        super::listen::notify_work(&tx, task.id).await?;
        tx.commit().await.during("committing the fork")?;
        Ok(())
    }

    /// Where task `task_id` starts instead of its first phase, if it was forked.
    pub async fn start_point(&self, task_id: &str) -> Result<Option<String>, PgError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT start_point::text FROM cairn_tasks WHERE id = $1",
                &[&task_id],
            )
            .await
            .during("reading a task's start point")?;
        Ok(row.and_then(|row| row.get(0)))
    }
}

/// `checkpoint` as the first generation of a forked task (generation 1, this format, now), as
/// a save sets them: its bytes and iteration count.
fn encode_first_generation(
    checkpoint: &mut IterationCheckpoint,
) -> Result<(Vec<u8>, i64), PgError> {
    checkpoint.generation = 1;
    checkpoint.format_version = FORMAT_VERSION;
    checkpoint.last_checkpoint_at = Utc::now();
    let bytes = encode_checkpoint(checkpoint).map_err(|source| PgError::Encode {
        task_id: checkpoint.task_id.clone(),
        source,
    })?;
    let iterations = i64::try_from(checkpoint.iteration_count).unwrap_or(i64::MAX);
    Ok((bytes, iterations))
}
