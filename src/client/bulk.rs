//! Steering in bulk: the tasks a filter selects (by state, submitter, phase, age), and the same
//! request for each, through the same path as for one task, so that each is judged by the
//! daemon as one would be (who may steer, which states a request applies to).

use chrono::{DateTime, Utc};

use super::{ClientError, ClientResult, QueueClient, RequestOutcome};
use crate::queue::control::ControlAction;
use crate::queue::{LoadOptions, TaskView};

/// Which tasks a bulk request is for. Every condition given must hold; an empty filter
/// selects nothing unless `all`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TaskFilter {
    /// State names as `status` prints them (`failed`, `paused`, `running`, ...); any of them.
    pub states: Vec<String>,
    /// The submitter's user name or uid.
    pub submitter: Option<String>,
    /// The phase the task is at.
    pub phase: Option<String>,
    /// Tasks whose last activity (finished, last checkpoint, or start) is at or after this.
    pub since: Option<DateTime<Utc>>,
    /// Tasks whose last activity is before this.
    pub older_than: Option<DateTime<Utc>>,
    /// Every task (the other conditions still narrow it).
    pub all: bool,
}

impl TaskFilter {
    /// Does the filter name any condition (or `all`)? A bulk request without one is refused.
    pub fn is_given(&self) -> bool {
        self.all
            || !self.states.is_empty()
            || self.submitter.is_some()
            || self.phase.is_some()
            || self.since.is_some()
            || self.older_than.is_some()
    }

    /// Does `task` pass every condition?
    pub fn matches(&self, task: &TaskView) -> bool {
        if task.state.is_rejected() {
            return false;
        }
        let state_ok =
            self.states.is_empty() || self.states.iter().any(|s| s == task.state.as_str());
        let submitter_ok = self.submitter.as_deref().is_none_or(|who| {
            task.submitted_by()
                .is_some_and(|by| by.user.as_deref() == Some(who) || by.uid.to_string() == who)
        });
        let phase_ok = self
            .phase
            .as_deref()
            .is_none_or(|phase| task.phase.as_deref() == Some(phase));
        let active = last_activity(task);
        let since_ok = self.since.is_none_or(|t| active.is_some_and(|a| a >= t));
        let older_ok = self
            .older_than
            .is_none_or(|t| active.is_some_and(|a| a < t));
        state_ok && submitter_ok && phase_ok && since_ok && older_ok
    }
}

/// When a task last did something: its record's time, its last checkpoint, or its start.
fn last_activity(task: &TaskView) -> Option<DateTime<Utc>> {
    task.record
        .as_ref()
        .and_then(|r| r.at)
        .or(task.last_checkpoint_at)
        .or_else(|| task.entry.as_ref().map(|e| e.started_at))
}

/// What became of one task's request in a bulk one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BulkOutcome {
    pub id: String,
    /// The state it was selected in.
    pub state: String,
    /// What the request came to, or why it was refused.
    pub result: Result<RequestOutcome, ClientError>,
}

impl QueueClient {
    /// The tasks `filter` selects, in the order `status` lists them.
    pub fn select(&self, filter: &TaskFilter) -> ClientResult<Vec<TaskView>> {
        if !filter.is_given() {
            return Err(ClientError::usage(
                "name the tasks: an id, or filters (--state, --submitter, --phase, --since, \
                 --older-than), or --all",
            ));
        }
        let view = self.status(LoadOptions::default())?;
        Ok(view
            .tasks
            .into_iter()
            .filter(|task| filter.matches(task))
            .collect())
    }

    /// `action` for each of `tasks`, each judged on its own. All are written first; then,
    /// with `wait`, each is waited for as a request for one task is (and so a refusal is
    /// reported per task).
    pub fn request_each(
        &self,
        action: ControlAction,
        tasks: &[TaskView],
        wait: bool,
    ) -> Vec<BulkOutcome> {
        let sent: Vec<(&TaskView, ClientResult<super::control::Sent>)> = tasks
            .iter()
            .map(|task| {
                let sent = QueueClient::task_id(&task.id).and_then(|id| self.send(action, &id));
                (task, sent)
            })
            .collect();
        sent.into_iter()
            .map(|(task, sent)| BulkOutcome {
                id: task.id.clone(),
                state: task.state.as_str().to_string(),
                result: sent.and_then(|sent| match wait {
                    true => self.outcome(&sent),
                    false => Ok(RequestOutcome::Waiting { why: None }),
                }),
            })
            .collect()
    }
}
