//! What the views of tasks need besides their rows in `cairn_tasks` — checkpoints, stored
//! outputs, recent events — read for all the tasks of a view at once and handed to the
//! shared view builders through [`TaskFacts`].

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::queue::postgres::fenced::StoredCheckpoint;
use crate::queue::read::TaskFacts;
use crate::store::current_work::StoredOutput;
use crate::store::events::Event;
use crate::store::journal::JournalEvent;
use crate::store::{
    decode_checkpoint, CheckpointError, GenerationInfo, IterationCheckpoint, LoadedCheckpoint,
    StoreError,
};

/// The rows a view of some tasks needs, by task id.
#[derive(Debug, Default)]
pub(super) struct DbFacts {
    /// Newest first.
    pub checkpoints: HashMap<String, Vec<StoredCheckpoint>>,
    /// By task id and phase index.
    pub outputs: HashMap<(String, usize), Value>,
    /// Oldest first.
    pub events: HashMap<String, Vec<JournalEvent>>,
}

impl TaskFacts for DbFacts {
    fn latest_checkpoint(&self, id: &str) -> Result<Option<LoadedCheckpoint>, String> {
        let stored = self.checkpoints.get(id).cloned().unwrap_or_default();
        decode_newest(id, stored).map_err(|e| e.to_string())
    }

    fn describe_key(&self, key: &str) -> String {
        key.to_string()
    }

    fn stored_output(&self, stored: &StoredOutput) -> Option<Value> {
        match stored {
            StoredOutput::Inline(value) => Some(value.clone()),
            StoredOutput::File(reference) => {
                let (task_id, index) = parse_output_reference(reference)?;
                self.outputs.get(&(task_id.to_string(), index)).cloned()
            }
        }
    }

    fn recent_events(&self, id: &str) -> Vec<JournalEvent> {
        self.events.get(id).cloned().unwrap_or_default()
    }

    fn start_phase(&self, _id: &str) -> usize {
        // A fork's start point is not kept in the database (yet): every task starts at 0.
        0
    }
}

/// How messages name a checkpoint generation of the database (as the owner's backend does).
pub(super) fn checkpoint_key(task_id: &str, generation: u64) -> String {
    format!("cairn_checkpoints/{task_id}/{generation}")
}

/// The newest of `stored` (newest first) that decodes with the store's decoder, with the
/// generations skipped on the way; an error when there are some and none decodes.
pub fn decode_newest(
    task_id: &str,
    stored: Vec<StoredCheckpoint>,
) -> Result<Option<LoadedCheckpoint>, StoreError> {
    let mut skipped = Vec::new();
    let mut first_error = None;
    for generation in stored {
        let key = checkpoint_key(task_id, generation.generation);
        match decode_checkpoint(&generation.bytes) {
            Ok(checkpoint) => {
                return Ok(Some(LoadedCheckpoint {
                    checkpoint,
                    key,
                    skipped,
                }))
            }
            Err(error) => {
                skipped.push((key.clone(), error.to_string()));
                first_error.get_or_insert((key, error));
            }
        }
    }
    match first_error {
        Some((key, source)) => Err(StoreError::Corrupt { key, source }),
        None => Ok(None),
    }
}

/// What a stored generation says, for `cairn history`: decoded as a checkpoint file is, and
/// refused as one of another task (as the file store refuses a file under the wrong name).
pub(super) fn generation_info(
    task_id: &str,
    stored: &StoredCheckpoint,
) -> (GenerationInfo, Option<IterationCheckpoint>) {
    let decoded = decode_checkpoint(&stored.bytes).and_then(|cp| {
        if cp.task_id == task_id {
            Ok(cp)
        } else {
            Err(CheckpointError::WrongTask {
                expected: task_id.to_owned(),
                found: cp.task_id,
            })
        }
    });
    let (iteration_count, last_checkpoint_at, error) = match &decoded {
        Ok(cp) => (Some(cp.iteration_count), Some(cp.last_checkpoint_at), None),
        Err(error) => (None, None, Some(error.to_string())),
    };
    let info = GenerationInfo {
        generation: stored.generation,
        key: checkpoint_key(task_id, stored.generation),
        bytes: stored.bytes.len() as u64,
        iteration_count,
        last_checkpoint_at,
        error,
    };
    (info, decoded.ok())
}

/// An event row as the journal's type (an event this cairn does not know is left out).
pub(super) fn journal_event(at: DateTime<Utc>, event_json: String) -> Option<JournalEvent> {
    let event: Event = serde_json::from_str(&event_json).ok()?;
    Some(JournalEvent { at, event })
}

/// `cairn_outputs/<task>/<index>`, the reference the owner's backend gives a stored output.
fn parse_output_reference(reference: &str) -> Option<(&str, usize)> {
    let rest = reference.strip_prefix("cairn_outputs/")?;
    let (task_id, index) = rest.rsplit_once('/')?;
    Some((task_id, index.parse().ok()?))
}
