//! Applying a control request to a task no daemon holds, in SQL, inside the transaction that
//! claimed the request (see [`super::control`]): the task's row is locked, and its new state,
//! record, history and journal event are written together, in the file daemon's shapes and
//! words.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

use serde_json::Value;
use tokio_postgres::Transaction;

use super::error::{json_text, During, PgError};
use super::row_state::RowState;
use crate::queue::control::{ControlAction, ControlRequest};
use crate::queue::control_rules::{
    check_retry, decide_control, ControlRefusal, Standing, Steer, CANCELLED_BY_OPERATOR,
};
use crate::queue::refusals::{Refusal, RefusalLimiter};
use crate::store::current_work::{ActiveStatus, ActiveTask, StartPoint, StoredOutput};
use crate::store::events::Event;
use crate::store::records::{to_record_bytes, FailedRecord, RecordStatus};
use crate::task::Task;
use crate::task_id::TaskId;

/// Move the task's final record into its history.
const ARCHIVE_RECORD: &str = "
WITH gone AS (DELETE FROM cairn_records WHERE task_id = $1 RETURNING *)
INSERT INTO cairn_record_history (task_id, status, record, finished_at)
SELECT task_id, status, record, finished_at FROM gone";

/// Where a task no daemon holds stands, from its row's state and its phase-level state if it
/// has one (`entry`); `None` for a running one, whose request its daemon applies.
fn standing(state: RowState, entry: Option<&ActiveTask>) -> Option<Standing> {
    Some(match (state, entry) {
        (RowState::Running, _) => return None,
        (RowState::Paused, entry) => Standing::InFlight {
            status: ActiveStatus::Paused,
            suspect: entry.is_some_and(|e| e.suspect),
        },
        (RowState::Queued, Some(entry)) => Standing::InFlight {
            status: entry.status,
            suspect: entry.suspect,
        },
        (RowState::Queued, None) => Standing::Pending,
        (RowState::Done | RowState::Failed | RowState::Cancelled, _) => Standing::Unknown,
    })
}

/// Why a request applied in SQL is refused: the rule's reasons, and what only the database's
/// copy of a task can lack.
#[derive(Debug, thiserror::Error)]
enum SqlRefusal {
    #[error(transparent)]
    Rule(#[from] ControlRefusal),
    #[error("its definition is unreadable: {0}")]
    Definition(crate::task::TaskError),
}

/// The bounds on journaling refusals, and whose refusals they count (the asker's uid).
pub(super) struct Refusals<'a> {
    pub(super) limiter: &'a Mutex<RefusalLimiter>,
    pub(super) asker: Option<u32>,
}

/// A task no daemon holds, locked in `tx` while a request is applied to it.
pub(super) struct Unheld<'a> {
    pub(super) tx: &'a Transaction<'a>,
    pub(super) node: &'a str,
    pub(super) task_id: &'a TaskId,
    pub(super) epoch: i64,
    pub(super) phase_state: Option<String>,
    pub(super) definition: String,
    pub(super) start_point: Option<String>,
}

impl Unheld<'_> {
    /// Apply `request` to the task, whose row is in `state`; returns the request's outcome, or
    /// `None` when the task runs (its daemon applies the request). A refusal is journaled
    /// within the bounds of `refusals` (see [`Unheld::refuse`]).
    pub(super) async fn apply(
        &self,
        request: &ControlRequest,
        state: RowState,
        refusals: &Refusals<'_>,
    ) -> Result<Option<String>, PgError> {
        let action = request.action;
        let entry = self.entry();
        let Some(standing) = standing(state, entry.as_ref()) else {
            return Ok(None);
        };
        let result = match decide_control(action, standing, true) {
            Steer::SetLimit => self.set_limit(request).await?,
            Steer::Pause => self.hold().await?,
            Steer::Resume => self.resume().await?,
            Steer::Cancel => self.cancel().await?,
            Steer::Retry => self.retry().await?,
            Steer::Nothing(why) => return Ok(Some(format!("nothing to do: {why}"))),
            Steer::Refuse(why) => Err(why.into()),
            // Never: a running task's request is its daemon's (`standing`).
            Steer::Signal => return Ok(None),
        };
        let outcome = match result {
            Ok(()) => "applied".to_string(),
            Err(why) => self.refuse(action, why.to_string(), refusals).await?,
        };
        Ok(Some(outcome))
    }

    /// Refuse `action` for `why`: logged and journaled in the task's journal as the daemon
    /// does, within the bounds of `refusals` (per task and asker, a few in full, then one
    /// notice, then only a count journaled when the window ends). Returns the outcome.
    pub(super) async fn refuse(
        &self,
        action: ControlAction,
        why: String,
        refusals: &Refusals<'_>,
    ) -> Result<String, PgError> {
        let verb = action.as_str();
        let outcome = format!("refused: {why}");
        let refusal = refusals
            .limiter
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .refuse(self.task_id.as_str(), refusals.asker, Instant::now());
        let reason = match refusal {
            Refusal::InFull => why,
            Refusal::Notice(notice) => notice,
            Refusal::Counted => return Ok(outcome),
        };
        tracing::warn!(task_id = %self.task_id, "cannot {verb} task {}: {}", self.task_id, reason.escape_debug());
        self.journal(&Event::ControlRefused {
            action: verb.to_string(),
            reason,
            request: None,
        })
        .await?;
        Ok(outcome)
    }

    /// The task's final record, if it has one that reads as a failed record.
    async fn record(&self) -> Result<Option<FailedRecord>, PgError> {
        let row = self
            .tx
            .query_opt(
                "SELECT record::text FROM cairn_records WHERE task_id = $1",
                &[&self.task_id.as_str()],
            )
            .await
            .during("reading the task's record")?;
        Ok(row.and_then(|row| serde_json::from_str(row.get::<_, &str>(0)).ok()))
    }

    /// The task's phase-level state, if it has one that reads.
    fn entry(&self) -> Option<ActiveTask> {
        serde_json::from_str(self.phase_state.as_deref()?).ok()
    }

    /// Append `event` to the task's journal, by this node under the task's current epoch.
    async fn journal(&self, event: &Event) -> Result<(), PgError> {
        let json = json_text("a control request's event", event)?;
        self.tx
            .execute(
                "INSERT INTO cairn_events (task_id, node, lease_epoch, event)
                 VALUES ($1, $2, $3, $4::text::json)",
                &[&self.task_id.as_str(), &self.node, &self.epoch, &json],
            )
            .await
            .during("journaling a control request")?;
        Ok(())
    }

    /// Set the task's state and phase-level state (`None` keeps it) and ends any lease.
    async fn set(&self, state: RowState, entry: Option<&ActiveTask>) -> Result<(), PgError> {
        let json = entry
            .map(|e| json_text("the task's phase state", e))
            .transpose()?;
        self.tx
            .execute(
                "UPDATE cairn_tasks
                 SET state = $2, phase_state = COALESCE($3::text::json, phase_state),
                     not_before = NULL, lease_node = NULL, lease_expires_at = NULL,
                     crash_count = 0, updated_at = now()
                 WHERE id = $1",
                &[&self.task_id.as_str(), &state.as_str(), &json],
            )
            .await
            .during("steering a task")?;
        Ok(())
    }

    /// Set the spending limit in the task's phase state, keeping its state (a paused task
    /// stays paused, a retry's backoff stands), and journal the old and new limit and who
    /// asked, as the file daemon does.
    async fn set_limit(&self, request: &ControlRequest) -> Result<Result<(), SqlRefusal>, PgError> {
        let Some(to) = request.max_cost else {
            return Ok(Err(ControlRefusal::NoLimit.into()));
        };
        let Some(mut entry) = self.entry() else {
            return Ok(Err(ControlRefusal::NotStarted.into()));
        };
        let budget = Task::parse_stored(self.definition.as_bytes())
            .ok()
            .and_then(|task| task.budget);
        let from = entry.spend_limit(budget.as_ref());
        entry.max_cost = Some(to);
        let json = json_text("the task's phase state", &entry)?;
        self.tx
            .execute(
                "UPDATE cairn_tasks SET phase_state = $2::text::json, updated_at = now()
                 WHERE id = $1",
                &[&self.task_id.as_str(), &json],
            )
            .await
            .during("setting a task's spending limit")?;
        let by = request.requester();
        self.journal(&Event::BudgetSet { from, to, by }).await?;
        Ok(Ok(()))
    }

    /// Pause a queued task: not claimed until resumed.
    async fn hold(&self) -> Result<Result<(), SqlRefusal>, PgError> {
        // A task that never started is held with its first entry, as the file daemon holds it:
        // its spending limit can then be set while it waits.
        let first = || {
            let task = Task::parse_stored(self.definition.as_bytes()).ok()?;
            Some(self.fresh_entry(&task))
        };
        let entry = self.entry().or_else(first).map(|mut entry| {
            entry.status = ActiveStatus::Paused;
            entry
        });
        self.set(RowState::Paused, entry.as_ref()).await?;
        let (phase, iterations) = (None, None);
        let reason = None;
        self.journal(&Event::Paused {
            phase,
            iterations,
            reason,
        })
        .await?;
        Ok(Ok(()))
    }

    /// Queue a paused task again, at once (a retry's backoff is over), and wake the daemons.
    async fn resume(&self) -> Result<Result<(), SqlRefusal>, PgError> {
        let entry = self.entry().map(|mut entry| {
            entry.resume_from_pause();
            entry
        });
        self.set(RowState::Queued, entry.as_ref()).await?;
        self.journal(&Event::Resumed {}).await?;
        super::listen::notify_work(self.tx, self.task_id.as_str()).await?;
        Ok(Ok(()))
    }

    /// Record a queued or paused task cancelled, as the file daemon records it.
    async fn cancel(&self) -> Result<Result<(), SqlRefusal>, PgError> {
        let task = match Task::parse_stored(self.definition.as_bytes()) {
            Ok(task) => task,
            Err(e) => return Ok(Err(SqlRefusal::Definition(e))),
        };
        let entry = self.entry().unwrap_or_else(|| self.fresh_entry(&task));
        let phase = task
            .phases
            .get(entry.phase_index)
            .map(|p| p.name.clone())
            .unwrap_or_else(|| entry.phase.clone());
        let mut error = CANCELLED_BY_OPERATOR.to_string();
        let outputs = match self.outputs(&entry).await? {
            Ok(outputs) => outputs,
            Err(problem) => {
                error = format!(
                    "{error} (and the outputs of earlier phases could not be read: {problem})"
                );
                BTreeMap::new()
            }
        };
        let record =
            FailedRecord::from_entry(&entry, RecordStatus::Cancelled, error, phase, outputs)
                .submitted_by(task.submitted_by.clone());
        let json = String::from_utf8_lossy(&to_record_bytes(&record)).into_owned();
        self.tx
            .execute(
                "INSERT INTO cairn_records (task_id, status, record, lease_epoch)
                 VALUES ($1, $2, $3::text::json, $4)",
                &[
                    &self.task_id.as_str(),
                    &RecordStatus::Cancelled.as_str(),
                    &json,
                    &self.epoch,
                ],
            )
            .await
            .during("recording a task cancelled")?;
        self.set(RowState::Cancelled, None).await?;
        let (error, attempts) = (record.error, record.attempts);
        self.journal(&Event::Cancelled { error, attempts }).await?;
        Ok(Ok(()))
    }

    /// Bring back a failed, cancelled or budget-stopped task: its record goes to its history,
    /// and it is queued again where the record says it stopped, its failed attempts counted
    /// afresh (as the file daemon's retry).
    async fn retry(&self) -> Result<Result<(), SqlRefusal>, PgError> {
        let record = self.record().await?;
        if let Err(why) = check_retry(record.as_ref().map(|r| &r.status)) {
            return Ok(Err(why.into()));
        }
        let Some(record) = record else {
            return Ok(Err(ControlRefusal::NotFailed.into()));
        };
        let task = match Task::parse_stored(self.definition.as_bytes()) {
            Ok(task) => task,
            Err(e) => return Ok(Err(SqlRefusal::Definition(e))),
        };
        let entry = ActiveTask::for_retry(&record, task.phases.len());
        self.tx
            .execute(ARCHIVE_RECORD, &[&self.task_id.as_str()])
            .await
            .during("archiving the task's record")?;
        self.set(RowState::Queued, Some(&entry)).await?;
        let (previous_status, phase) = (record.status, record.phase);
        self.journal(&Event::Retried {
            previous_status,
            phase,
        })
        .await?;
        super::listen::notify_work(self.tx, self.task_id.as_str()).await?;
        Ok(Ok(()))
    }

    /// The entry of a task that never started: at its first phase, or its start point.
    fn fresh_entry(&self, task: &Task) -> ActiveTask {
        let start: Option<StartPoint> = self
            .start_point
            .as_deref()
            .and_then(|text| serde_json::from_str(text).ok());
        ActiveTask::first(task, start)
    }

    /// The outputs of the phases `entry` finished, the large ones read from `cairn_outputs`.
    async fn outputs(
        &self,
        entry: &ActiveTask,
    ) -> Result<Result<BTreeMap<String, Value>, UnreadableOutput>, PgError> {
        let mut outputs = BTreeMap::new();
        for (name, stored) in &entry.phase_outputs {
            let value = match stored {
                StoredOutput::Inline(value) => value.clone(),
                StoredOutput::File(reference) => match self.stored_output(reference).await? {
                    Some(value) => value,
                    None => return Ok(Err(UnreadableOutput(reference.clone()))),
                },
            };
            outputs.insert(name.clone(), value);
        }
        Ok(Ok(outputs))
    }

    async fn stored_output(&self, reference: &str) -> Result<Option<Value>, PgError> {
        let Some((task_id, index)) = super::backend::parse_output_reference(reference) else {
            return Ok(None);
        };
        let row = self
            .tx
            .query_opt(
                "SELECT output::text FROM cairn_outputs WHERE task_id = $1 AND phase_index = $2",
                &[&task_id, &index],
            )
            .await
            .during("reading a phase output")?;
        Ok(row.and_then(|row| serde_json::from_str(row.get::<_, &str>(0)).ok()))
    }
}

/// A phase output the task's state names that the database does not have.
#[derive(Debug, thiserror::Error)]
#[error("{0} is missing or unreadable")]
struct UnreadableOutput(String);

#[cfg(test)]
mod tests {
    use super::{standing, RowState};
    use crate::queue::control_rules::Standing;
    use crate::store::current_work::ActiveStatus;

    /// The rule itself is `control_rules`' (tested there); here, where each row stands.
    #[test]
    fn where_a_row_stands() {
        use RowState::{Cancelled, Done, Failed, Paused, Queued, Running};
        let paused = Standing::InFlight {
            status: ActiveStatus::Paused,
            suspect: false,
        };
        assert_eq!(standing(Running, None), None);
        assert_eq!(standing(Queued, None), Some(Standing::Pending));
        assert_eq!(standing(Paused, None), Some(paused));
        for finished in [Done, Failed, Cancelled] {
            assert_eq!(standing(finished, None), Some(Standing::Unknown));
        }
    }
}
