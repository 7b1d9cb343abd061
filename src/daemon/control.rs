//! Operator requests (`cairn pause|resume|cancel|retry`), taken from `control/` and applied to
//! the scheduler's state; and where a new task's first attempt starts (a fork's start point).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use super::{runner_blocking, Scheduler};
use crate::queue::control::{ControlAction, ControlRequest};
use crate::queue::control_rules::{
    check_retry, decide_control, ControlRefusal, Standing, Steer, CANCELLED_BY_OPERATOR,
};
use crate::queue::refusals::Refusal;
use crate::runner::RunContext;
use crate::store::current_work::{ActiveStatus, ActiveTask};
use crate::store::events::Event;
use crate::store::records::{FailedRecord, RecordStatus};
use crate::task::Task;
use crate::task_id::TaskId;

impl Scheduler {
    /// Apply and remove every request waiting in `control/`, oldest first. A request for a
    /// task the daemon has not taken from the inbox yet stays for a later round (see
    /// [`Scheduler::may_still_arrive`]), and so do the requests for that task after it.
    pub(super) async fn process_control(&mut self) {
        let queue = self.ctx.queue.clone();
        let read = move || {
            let requests = queue.backend().take_control()?;
            // Which of the requested tasks still wait to be taken in.
            let in_inbox: HashSet<TaskId> = requests
                .iter()
                .map(|(_, r)| r.task_id.clone())
                .filter(|id| queue.backend().waiting_in_intake(id))
                .collect();
            Ok::<_, crate::queue::QueueError>((requests, in_inbox))
        };
        let (requests, in_inbox) = match runner_blocking(read).await {
            Ok(read) => read,
            Err(e) => {
                tracing::error!("{e}");
                return;
            }
        };
        self.control_deferred = false;
        self.close_refusal_windows();
        let mut deferred: HashSet<TaskId> = HashSet::new();
        for (claim, request) in requests {
            // A retry is for a failed record, never a task in the inbox: it waits only behind
            // an earlier request for the same task.
            if deferred.contains(&request.task_id)
                || (request.action != ControlAction::Retry
                    && self.may_still_arrive(&request.task_id, &in_inbox))
            {
                deferred.insert(request.task_id);
                self.control_deferred = true;
                continue;
            }
            self.applying_request = request.origin.as_ref().map(|o| o.name.clone());
            self.applying_uid = request
                .origin
                .as_ref()
                .map(|o| o.uid)
                .or(match &request.asker {
                    Some(crate::queue::control::DatabaseAsker::User { uid, .. }) => Some(*uid),
                    _ => None,
                });
            self.request_refused = false;
            self.apply_control(request).await;
            let refused = std::mem::take(&mut self.request_refused);
            self.applying_request = None;
            self.applying_uid = None;
            let queue = self.ctx.queue.clone();
            let removed = claim.clone();
            let removal = move || {
                // The refusal is in the journal before the request is gone: `cairn`, which
                // waits for that, then reads it there.
                if refused {
                    queue.backend().flush_events();
                }
                queue.remove_control_claim(&removed)
            };
            if let Err(e) = runner_blocking(removal).await {
                tracing::error!(request = %claim, "cannot remove a handled control request: {e}");
            }
        }
    }

    /// A task this daemon does not know yet that the intake may still bring: its file is in
    /// the inbox, or a scan of the inbox is under way or due. Its requests wait for it.
    fn may_still_arrive(&self, id: &str, in_inbox: &HashSet<TaskId>) -> bool {
        let known = self.tasks.contains_key(id) || self.ctx.work.update(|w| w.get(id).is_some());
        let intake_busy = self.scan.is_some() || self.scan_again || self.inbox_deferred;
        !known && (intake_busy || in_inbox.contains(id))
    }

    async fn apply_control(&mut self, request: ControlRequest) {
        let id = &request.task_id;
        let action = request.action;
        tracing::info!(task_id = %id, action = action.as_str(), "control request");
        if self.steering.enforced() {
            let submitter = self.submitter_of(id).await;
            let (rights, asked) = (self.steering.clone(), request.clone());
            let judged = runner_blocking(move || rights.check(&asked, submitter.as_ref())).await;
            if let Err(why) = judged {
                return self.refuse(id, action, &why.to_string());
            }
        }
        let in_flight = self.ctx.work.update(|w| w.get(id).cloned());
        let standing = if self.running_ids.contains(id) {
            Standing::Running
        } else if let Some(entry) = &in_flight {
            Standing::InFlight {
                status: entry.status,
                suspect: entry.suspect,
            }
        } else if self.pending.iter().any(|(_, _, p)| p == id) && self.tasks.contains_key(id) {
            Standing::Pending
        } else {
            Standing::Unknown
        };
        let steer = decide_control(request.action, standing, self.tasks.contains_key(id));
        match steer {
            Steer::Refuse(why) => self.refuse(id, action, &why.to_string()),
            Steer::Nothing(_) => {}
            Steer::Signal => {
                // The runner stops at its next iteration boundary (pause) or at once (cancel);
                // attempt_finished records the outcome.
                let control = self.ctx.control(id);
                let event = match request.action {
                    ControlAction::Pause => {
                        control.pause.cancel();
                        Event::PauseRequested {}
                    }
                    _ => {
                        control.cancel.cancel();
                        Event::CancelRequested {}
                    }
                };
                self.ctx.journal(id, event);
            }
            Steer::Pause | Steer::Resume | Steer::Cancel => {
                let Some(entry) = in_flight.or_else(|| self.queued_entry(id)) else {
                    return;
                };
                self.steer_entry(&steer, entry).await;
            }
            Steer::Retry => self.retry(id).await,
            Steer::SetLimit => self.set_limit(&request).await,
        }
    }

    /// `cairn budget`: set the task's spending limit in its entry, where a running attempt
    /// reads it before its next iteration; journaled with the old and the new limit and who
    /// asked. It does not resume a paused task: `cairn resume` does (docs/decisions.md).
    async fn set_limit(&mut self, request: &ControlRequest) {
        let id = &request.task_id;
        let Some(to) = request.max_cost else {
            let why = ControlRefusal::NoLimit.to_string();
            return self.refuse(id, ControlAction::Budget, &why);
        };
        let budget = self.tasks.get(id).and_then(|task| task.budget.clone());
        let from = self.ctx.work.update(|w| {
            let entry = w.get_mut(id)?;
            let from = entry.spend_limit(budget.as_ref());
            entry.max_cost = Some(to);
            Some(from)
        });
        let Some(from) = from else {
            let why = ControlRefusal::NotInFlight.to_string();
            return self.refuse(id, ControlAction::Budget, &why);
        };
        let by = request.requester();
        tracing::info!(task_id = %id, from = ?from, to, by = %by.escape_debug(), "spending limit set");
        self.ctx.journal(id, Event::BudgetSet { from, to, by });
        self.persist().await;
    }

    /// Carry out a pause, resume or cancel of a task that is not running.
    async fn steer_entry(&mut self, steer: &Steer, mut entry: ActiveTask) {
        let id = entry.task_id.clone();
        match steer {
            Steer::Pause => {
                self.unqueue(&id);
                entry.status = ActiveStatus::Paused;
                self.ctx.work.update(|w| w.upsert(entry));
                let (phase, iterations) = (None, None);
                let reason = None;
                self.ctx.journal(
                    &id,
                    Event::Paused {
                        phase,
                        iterations,
                        reason,
                    },
                );
            }
            Steer::Resume => {
                entry.resume_from_pause();
                // A crash suspect paused before its trial is still to be tried alone.
                let queue = if entry.suspect {
                    &mut self.suspects
                } else {
                    &mut self.resume
                };
                queue.push_back(id.clone());
                self.ctx.work.update(|w| w.upsert(entry));
                self.ctx.journal(&id, Event::Resumed {});
            }
            Steer::Cancel => {
                let Some(task) = self.tasks.get(&id).cloned() else {
                    return;
                };
                self.unqueue(&id);
                let error = CANCELLED_BY_OPERATOR.to_string();
                self.record_failure(&task, entry, error, RecordStatus::Cancelled)
                    .await;
                self.tasks.remove(&id);
            }
            Steer::Refuse(_)
            | Steer::Nothing(_)
            | Steer::Signal
            | Steer::Retry
            | Steer::SetLimit => return,
        }
        self.persist().await;
    }

    /// Leave the task as it is: log why, and journal it for the request's writer.
    fn refuse(&mut self, id: &str, action: ControlAction, why: &str) {
        let verb = action.as_str();
        let (reason, request) = match self.refusals.refuse(id, self.applying_uid, Instant::now()) {
            Refusal::InFull => (why.to_string(), self.applying_request.clone()),
            Refusal::Notice(notice) => (notice, None),
            // Counted, journaled with the others when the window ends (`refusals`).
            Refusal::Counted => return,
        };
        // Escaped: the reason may quote a user's name.
        tracing::warn!(
            task_id = id,
            "cannot {verb} task {id}: {}",
            reason.escape_debug()
        );
        self.request_refused = true;
        self.ctx.journal(
            id,
            Event::ControlRefused {
                action: verb.to_string(),
                reason,
                request,
            },
        );
    }

    /// Journal the count of each window of refusals that is over (see `refusals`).
    fn close_refusal_windows(&mut self) {
        for summary in self.refusals.close_expired(Instant::now()) {
            tracing::warn!(task_id = summary.task, "{}", summary.reason);
            self.ctx.journal(
                &summary.task,
                Event::ControlRefused {
                    action: "requests".to_string(),
                    reason: summary.reason,
                    request: None,
                },
            );
        }
    }

    /// The submitter of task `id`, from its definition (loaded, or read for a finished task).
    async fn submitter_of(&self, id: &TaskId) -> Option<crate::submitter::Submitter> {
        if let Some(task) = self.tasks.get(id) {
            return task.submitted_by().cloned();
        }
        self.read_task(id).await.ok()?.submitted_by
    }

    /// A new entry for a task that is pending (accepted, never started), if it is.
    fn queued_entry(&self, id: &str) -> Option<ActiveTask> {
        let pending = self.pending.iter().any(|(_, _, p)| p == id);
        let task = self.tasks.get(id)?;
        pending.then(|| fresh_entry(&self.ctx, task))
    }

    /// Take a task out of every queue it waits in.
    fn unqueue(&mut self, id: &str) {
        self.resume.retain(|r| r != id);
        self.suspects.retain(|r| r != id);
        self.pending.retain(|(_, _, p)| p != id);
        self.retries.retain(|(_, r)| r != id);
    }

    /// Write `current_work.json`; a failure is logged (every later change writes it again).
    pub(super) async fn persist(&self) {
        if let Err(e) = self.ctx.work.persist().await {
            tracing::error!("{e}");
        }
    }

    /// Bring a failed, cancelled or budget-stopped task back: it resumes from its last
    /// checkpoint with its attempts counted afresh. The entry is written before the record is
    /// archived (`retry_of` tells recovery which of the two is current).
    async fn retry(&mut self, id: &TaskId) {
        let retry = ControlAction::Retry;
        let (queue, read_id) = (self.ctx.queue.clone(), id.to_string());
        let record = match runner_blocking(move || queue.backend().failed_record(&read_id)).await {
            Ok(record) => record,
            Err(e) => return self.refuse(id, retry, &e.to_string()),
        };
        if let Err(why) = check_retry(record.as_ref().map(|r| &r.status)) {
            return self.refuse(id, retry, &why.to_string());
        }
        let Some(record) = record else { return };
        let task = match self.read_task(id).await {
            Ok(task) => Arc::new(task),
            Err(e) => return self.refuse(id, retry, &e.to_string()),
        };
        // Counted like a new file of its submitter's: a retry must not take them past
        // --max-queued-per-submitter.
        if let Err(full) = self.tasks.check_queued(&task) {
            let why = format!("{full}; retry it once one of theirs has finished");
            return self.refuse(id, retry, &why);
        }
        let entry = ActiveTask::for_retry(&record, task.phases.len());
        self.ctx.work.update(|w| w.upsert(entry));
        if let Err(e) = self.ctx.work.persist().await {
            self.ctx.work.update(|w| w.remove(id));
            return self.refuse(id, retry, &format!("cannot record the retry: {e}"));
        }
        self.archive_failure(id, &record).await;
        self.tasks.insert(id.clone(), task);
        self.resume.push_back(id.clone());
        let (previous_status, phase) = (record.status, record.phase);
        self.ctx.journal(
            id,
            Event::Retried {
                previous_status,
                phase,
            },
        );
    }

    /// Move a failed record out of the records into the task's history.
    pub(super) async fn archive_failure(&self, id: &str, record: &FailedRecord) {
        let (queue, id_owned, record) = (self.ctx.queue.clone(), id.to_string(), record.clone());
        let moved = runner_blocking(move || {
            let lease = queue.backend().claim(&id_owned)?;
            queue.backend().archive_failed(&lease, &record)
        })
        .await;
        if let Err(e) = moved {
            tracing::error!(task_id = id, "cannot archive the failed record: {e}");
        }
    }
}

/// The entry a task starts its first attempt with: at its first phase, or where `cairn fork`
/// said (its start point). Blocking: call it off the async thread.
pub(super) fn fresh_entry(ctx: &RunContext, task: &Task) -> ActiveTask {
    let start = ctx
        .queue
        .backend()
        .start_point(task.id())
        .unwrap_or_else(|e| {
            tracing::error!(task_id = %task.id(), "ignoring an unreadable start point: {e}");
            None
        });
    ActiveTask::first(task, start)
}
