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
use crate::queue::control::{ControlAction, ControlRequest};
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

/// What the operator reads of refused requests and requests for finished tasks: the file
/// daemon's words (`daemon::control::decide_control`).
const NOT_THERE: &str = "it is neither pending nor in flight";
const NOT_PAUSED: &str = "it is not paused";
const NOT_FAILED: &str = "it has not failed or been cancelled";
const CANCELLED: &str = "cancelled by an operator";
const NOT_IN_FLIGHT: &str =
    "it is not in flight (a finished task's budget is renewed by `cairn retry`)";
const NOT_STARTED: &str =
    "it has not started: its limit is its definition's budget.max_cost until it runs";

/// What a request applied in SQL does to a task that no daemon holds. Pure.
#[derive(Debug, Clone, PartialEq, Eq)]
enum SqlSteer {
    Pause,
    Resume,
    Cancel,
    Retry,
    /// Set its spending limit in its phase state (`cairn budget`).
    SetLimit,
    /// It is so already.
    Nothing(&'static str),
    Refuse(String),
}

/// `action` on a task in `state` (not running) whose final record has `record` status;
/// `started`: whether it has a phase state (it ran, or was paused, before).
fn decide(
    action: ControlAction,
    state: &str,
    record: Option<&RecordStatus>,
    started: bool,
) -> SqlSteer {
    let waiting = matches!(state, "queued" | "paused");
    match action {
        ControlAction::Budget if waiting && started => SqlSteer::SetLimit,
        ControlAction::Budget if waiting => SqlSteer::Refuse(NOT_STARTED.to_string()),
        ControlAction::Budget => SqlSteer::Refuse(NOT_IN_FLIGHT.to_string()),
        ControlAction::Pause if state == "paused" => SqlSteer::Nothing("it is paused already"),
        ControlAction::Pause if waiting => SqlSteer::Pause,
        ControlAction::Resume if state == "paused" => SqlSteer::Resume,
        ControlAction::Resume => SqlSteer::Refuse(NOT_PAUSED.to_string()),
        ControlAction::Cancel if waiting => SqlSteer::Cancel,
        ControlAction::Pause | ControlAction::Cancel => SqlSteer::Refuse(NOT_THERE.to_string()),
        ControlAction::Retry => match record {
            None => SqlSteer::Refuse(NOT_FAILED.to_string()),
            Some(status) if status.is_retryable() => SqlSteer::Retry,
            Some(status) => {
                SqlSteer::Refuse(format!("its record's status is {:?}", status.as_str()))
            }
        },
    }
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
    /// Apply `action` to the task in `state`; returns the request's outcome. A refusal is
    /// journaled within the bounds of `refusals` (see [`Unheld::refuse`]).
    pub(super) async fn apply(
        &self,
        request: &ControlRequest,
        state: &str,
        refusals: &Refusals<'_>,
    ) -> Result<String, PgError> {
        let action = request.action;
        let record = if action == ControlAction::Retry {
            self.record().await?
        } else {
            None
        };
        let started = self.entry().is_some();
        let steer = decide(action, state, record.as_ref().map(|r| &r.status), started);
        let result = match steer {
            SqlSteer::SetLimit => self.set_limit(request).await,
            SqlSteer::Pause => self.hold().await,
            SqlSteer::Resume => self.resume().await,
            SqlSteer::Cancel => self.cancel().await,
            SqlSteer::Retry => match record {
                Some(record) => self.retry(record).await,
                None => Ok(Err(NOT_FAILED.to_string())),
            },
            SqlSteer::Nothing(why) => return Ok(format!("nothing to do: {why}")),
            SqlSteer::Refuse(why) => Ok(Err(why)),
        }?;
        match result {
            Ok(()) => Ok("applied".to_string()),
            Err(why) => self.refuse(action, why, refusals).await,
        }
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
    async fn set(&self, state: &str, entry: Option<&ActiveTask>) -> Result<(), PgError> {
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
                &[&self.task_id.as_str(), &state, &json],
            )
            .await
            .during("steering a task")?;
        Ok(())
    }

    /// Set the spending limit in the task's phase state, keeping its state (a paused task
    /// stays paused, a retry's backoff stands), and journal the old and new limit and who
    /// asked, as the file daemon does.
    async fn set_limit(&self, request: &ControlRequest) -> Result<Result<(), String>, PgError> {
        let (Some(mut entry), Some(to)) = (self.entry(), request.max_cost) else {
            return Ok(Err(NOT_STARTED.to_string()));
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
    async fn hold(&self) -> Result<Result<(), String>, PgError> {
        let entry = self.entry().map(|mut entry| {
            entry.status = ActiveStatus::Paused;
            entry
        });
        self.set("paused", entry.as_ref()).await?;
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
    async fn resume(&self) -> Result<Result<(), String>, PgError> {
        let entry = self.entry().map(|mut entry| {
            entry.resume_from_pause();
            entry
        });
        self.set("queued", entry.as_ref()).await?;
        self.journal(&Event::Resumed {}).await?;
        super::listen::notify_work(self.tx, self.task_id.as_str()).await?;
        Ok(Ok(()))
    }

    /// Record a queued or paused task cancelled, as the file daemon records it.
    async fn cancel(&self) -> Result<Result<(), String>, PgError> {
        let task = match Task::parse_stored(self.definition.as_bytes()) {
            Ok(task) => task,
            Err(e) => return Ok(Err(format!("its definition is unreadable: {e}"))),
        };
        let entry = self.entry().unwrap_or_else(|| self.fresh_entry(&task));
        let phase = task
            .phases
            .get(entry.phase_index)
            .map(|p| p.name.clone())
            .unwrap_or_else(|| entry.phase.clone());
        let mut error = CANCELLED.to_string();
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
        self.set("cancelled", None).await?;
        let (error, attempts) = (record.error, record.attempts);
        self.journal(&Event::Cancelled { error, attempts }).await?;
        Ok(Ok(()))
    }

    /// Bring back a failed, cancelled or budget-stopped task: its record goes to its history,
    /// and it is queued again where the record says it stopped, its failed attempts counted
    /// afresh (as the file daemon's retry).
    async fn retry(&self, record: FailedRecord) -> Result<Result<(), String>, PgError> {
        let task = match Task::parse_stored(self.definition.as_bytes()) {
            Ok(task) => task,
            Err(e) => return Ok(Err(format!("its definition is unreadable: {e}"))),
        };
        let entry = ActiveTask::for_retry(&record, task.phases.len());
        self.tx
            .execute(ARCHIVE_RECORD, &[&self.task_id.as_str()])
            .await
            .during("archiving the task's record")?;
        self.set("queued", Some(&entry)).await?;
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
    ) -> Result<Result<BTreeMap<String, Value>, String>, PgError> {
        let mut outputs = BTreeMap::new();
        for (name, stored) in &entry.phase_outputs {
            let value = match stored {
                StoredOutput::Inline(value) => value.clone(),
                StoredOutput::File(reference) => match self.stored_output(reference).await? {
                    Some(value) => value,
                    None => return Ok(Err(format!("{reference} is missing or unreadable"))),
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

#[cfg(test)]
mod tests {
    use super::{decide, SqlSteer};
    use crate::queue::control::ControlAction::{Budget, Cancel, Pause, Resume, Retry};
    use crate::store::records::RecordStatus;

    #[test]
    fn a_spending_limit_is_set_on_a_task_that_ran_and_waits() {
        let refuse = |why: &str| SqlSteer::Refuse(why.to_string());
        let not_started = refuse(super::NOT_STARTED);
        let not_in_flight = refuse(super::NOT_IN_FLIGHT);
        #[rustfmt::skip]
        let table = [
            (("paused",          true),  SqlSteer::SetLimit),
            (("queued",          true),  SqlSteer::SetLimit),
            (("queued",          false), not_started),
            (("failed",          true),  not_in_flight.clone()),
            (("done",            false), not_in_flight),
        ];
        for ((state, started), steer) in table {
            assert_eq!(
                decide(Budget, state, None, started),
                steer,
                "{state}, started {started}"
            );
        }
    }

    #[test]
    fn what_a_request_does_to_a_task_no_daemon_holds() {
        let refuse = |why: &str| SqlSteer::Refuse(why.to_string());
        let not_there = refuse("it is neither pending nor in flight");
        let (failed, done) = (RecordStatus::Failed, RecordStatus::Done);
        let budget = RecordStatus::BudgetExceeded;
        #[rustfmt::skip]
        let table = [
            ((Pause,  "queued",    None),          SqlSteer::Pause),
            ((Pause,  "paused",    None),          SqlSteer::Nothing("it is paused already")),
            ((Pause,  "done",      None),          not_there.clone()),
            ((Resume, "paused",    None),          SqlSteer::Resume),
            ((Resume, "queued",    None),          refuse("it is not paused")),
            ((Resume, "failed",    None),          refuse("it is not paused")),
            ((Cancel, "queued",    None),          SqlSteer::Cancel),
            ((Cancel, "paused",    None),          SqlSteer::Cancel),
            ((Cancel, "cancelled", None),          not_there),
            ((Retry,  "failed",    Some(&failed)), SqlSteer::Retry),
            ((Retry,  "failed",    Some(&budget)), SqlSteer::Retry),
            ((Retry,  "done",      Some(&done)),   refuse("its record's status is \"done\"")),
            ((Retry,  "queued",    None),          refuse("it has not failed or been cancelled")),
        ];
        for ((action, state, record), steer) in table {
            assert_eq!(
                decide(action, state, record, true),
                steer,
                "{action:?} on {state}"
            );
        }
    }
}
