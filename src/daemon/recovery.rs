//! Start-up: finish half-done intake, then line up the tasks that were in flight (resuming
//! them first) and the accepted tasks that never started.

use super::crash_blame::{self, Verdict};
use std::cmp::Reverse;
use std::collections::HashSet;
use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::{runner_blocking, DaemonError, Scheduler};
use crate::limits::SubmitterKey;
use crate::queue::Queue;
use crate::runner::RunContext;
use crate::store::current_work::{ActiveStatus, ActiveTask};
use crate::store::events::Event;
use crate::store::records::FailedRecord;
use crate::task::PhaseKind;
use crate::task::Task;
use crate::task_id::TaskId;

impl Scheduler {
    /// Finish half-done intake, then line up every task that was in flight and every accepted
    /// task that has not started, in that order.
    pub(super) async fn recover(&mut self) -> Result<(), DaemonError> {
        let queue = self.ctx.queue.clone();
        let recovered = runner_blocking(move || queue.backend().recover_intake()).await;
        // Accepted tasks are loaded from tasks/ below; only a failure needs saying here.
        if let Some(e) = recovered.error {
            tracing::error!("finishing interrupted intake: {e}");
        }
        if self.ctx.queue.backend().shares_queue() {
            // Nothing of a shared queue is this daemon's at start: it claims its work (what an
            // earlier process under its name held comes back once that lease expired).
            return Ok(());
        }

        // Everything recovery reads, read in one pass off the async thread: a queue may hold
        // thousands of tasks in flight.
        let entries = self.ctx.work.snapshot().active_tasks;
        // Recovery decides about these; none of them is a pending task, whatever it decides.
        let in_flight: HashSet<TaskId> = entries.iter().map(|e| e.task_id.clone()).collect();
        let ctx = Arc::clone(&self.ctx);
        let (records, prefetched) = runner_blocking(move || {
            let records = Records::list(&ctx.queue);
            // One read of every checkpoint generation for every task in flight, instead of one
            // per task at its first save (quadratic with thousands of tasks resuming at once).
            let in_flight = entries.iter().map(|entry| entry.task_id.as_str());
            if let Err(e) = ctx.queue.learn_generations(in_flight) {
                tracing::warn!("{e}; each task's first checkpoint save lists the directory itself");
            }
            let prefetched: Vec<Prefetched> = entries
                .into_iter()
                .map(|entry| Prefetched::read(&ctx, &records, entry))
                .collect();
            (records, prefetched)
        })
        .await;
        // Every entry the daemon died with an attempt running, finished or not: a crash is
        // evidence against a task only if it was in flight alone.
        let running_at_crash = prefetched
            .iter()
            .filter(|p| p.entry.status == ActiveStatus::Running)
            .count();
        let mut suspects = Vec::new();
        for entry in prefetched {
            if let Some(suspect) = self.recover_entry(entry, running_at_crash).await {
                suspects.push(suspect);
            }
        }
        crash_blame::trial_order(&mut suspects);
        self.suspects = suspects.into_iter().map(|(_, id)| id).collect();
        self.trial_width = crash_blame::trial_width(self.suspects.len());
        self.load_pending(&records, &in_flight).await?;
        if let Err(e) = self.ctx.work.persist().await {
            // Not fatal: every later change writes the whole file again.
            tracing::error!("{e}");
        }
        // Paused tasks are held until `cairn resume`; counted so an operator sees them.
        let paused = self.ctx.work.update(|work| {
            work.iter()
                .filter(|t| t.status == ActiveStatus::Paused)
                .count()
        });
        tracing::info!(
            resumed = self.resume.len(),
            crash_suspects = self.suspects.len(),
            waiting_retry = self.retries.len(),
            pending = self.pending.len(),
            paused,
            "recovered the queue"
        );
        Ok(())
    }

    /// Line up one entry of `current_work.json`; `in_flight` is how many had an attempt
    /// running when the daemon died. Returns the task's crash count and id if it is a suspect
    /// to be tried alone.
    async fn recover_entry(
        &mut self,
        prefetched: Prefetched,
        in_flight: usize,
    ) -> Option<(u32, TaskId)> {
        let Prefetched {
            mut entry,
            has_record,
            task,
            progressed,
        } = prefetched;
        let id = entry.task_id.clone();
        if has_record {
            if let Some(record) = self.retried_record(&entry).await {
                // `cairn retry` wrote this entry but died before archiving the old record.
                self.archive_failure(&id, &record).await;
            } else {
                // Finished, but the daemon died before it removed the entry.
                self.ctx.work.update(|w| w.remove(&id));
                return None;
            }
        }
        let task = match task {
            Ok(task) => Arc::new(task),
            Err(error) => {
                tracing::error!(task_id = %id, "cannot resume: {error}");
                let task = Arc::new(unreadable_task(&id));
                self.give_up(&task, entry, error.to_string()).await;
                return None;
            }
        };
        let verdict = if entry.status == ActiveStatus::Running {
            let progressed = match progressed {
                Some(progressed) => progressed,
                None => self.attempt_progressed(&entry).await,
            };
            self.count_lost_iterations(&task, &mut entry);
            Some(self.judge_crash(&task, &mut entry, in_flight, progressed))
        } else {
            None
        };
        let line = line_up(
            entry.status,
            entry.suspect,
            verdict,
            entry.next_attempt_at,
            Utc::now(),
        );
        if let Line::Quarantine { crashes_alone } = line {
            let reason = crash_blame::quarantine_reason(crashes_alone);
            self.give_up(&task, entry, reason).await;
            return None;
        }
        if entry.status == ActiveStatus::Running {
            entry.status = ActiveStatus::Interrupted;
            tracing::info!(task_id = %id, phase = %entry.phase, suspect = entry.suspect, "resuming after a crash");
        }
        let mut suspect = None;
        match line {
            Line::Suspect => suspect = Some((entry.crashes_alone, id.clone())),
            Line::Resume => self.resume.push_back(id.clone()),
            Line::Hold | Line::Quarantine { .. } => {}
            Line::RetryAt(at) => self.retries.push((at, id.clone())),
        }
        self.ctx.work.update(|w| w.upsert(entry));
        self.tasks.insert(id, task);
        suspect
    }

    /// The daemon died during this task's attempt: the iterations of a loop or worker it had
    /// in flight (and the completed ones not yet checkpointed: at most `checkpoint_every` in
    /// all) were paid for but their cost was never committed, unless no command of the phase
    /// had started in that attempt. They count as spent, so that a
    /// budget holds whatever the kills; the count is durable before anything resumes (the
    /// attempt is persisted before its commands start).
    fn count_lost_iterations(&self, task: &Task, entry: &mut ActiveTask) {
        let Some(phase) = task.phases.get(entry.phase_index) else {
            return;
        };
        if !matches!(phase.kind, PhaseKind::Loop | PhaseKind::Worker) {
            return;
        }
        // Killed before a command of the phase started: nothing was paid for.
        if std::mem::take(&mut entry.no_iteration_started) {
            return;
        }
        let lost = phase.checkpoint_every();
        entry.lost_iterations = entry.lost_iterations.saturating_add(lost);
        let in_phase = entry.lost_by_phase.entry(entry.phase_index).or_insert(0);
        *in_phase = in_phase.saturating_add(lost);
        self.ctx.journal(
            &entry.task_id,
            Event::IterationsLost {
                phase: entry.phase.clone(),
                counted: lost,
                lost_iterations: entry.lost_iterations,
                lost_cost_estimate: entry.lost_cost_estimate(),
            },
        );
    }

    /// The daemon died during this task's attempt: a crash is not the task's failure (a power
    /// cut, an OOM kill of something else, an operator's SIGKILL), so it uses up no attempt.
    /// [`crash_blame::judge`] decides whether it counts against the task; its verdict is
    /// noted in the entry and the journal.
    fn judge_crash(
        &self,
        task: &Task,
        entry: &mut ActiveTask,
        in_flight: usize,
        progressed: bool,
    ) -> Verdict {
        let limit = crash_blame::crash_limit(task);
        let verdict = crash_blame::judge(in_flight, progressed, entry.crashes_alone, limit);
        let (suspect, crashes_alone) = match verdict {
            Verdict::Cleared => (false, 0),
            Verdict::Suspect { crashes_alone } | Verdict::CrashedAlone { crashes_alone } => {
                (true, crashes_alone)
            }
            Verdict::Quarantined { crashes_alone } => (false, crashes_alone),
        };
        entry.suspect = suspect;
        entry.crashes_alone = crashes_alone;
        self.ctx.journal(
            &entry.task_id,
            Event::ResumedAfterCrash {
                attempt: entry.attempt,
                phase: entry.phase.clone(),
                progressed,
                tasks_in_flight: in_flight,
                verdict: format!("{verdict:?}"),
                crashes_alone,
                limit,
            },
        );
        verdict
    }

    /// The failed record that `entry` was retried from, if it is still among the records.
    async fn retried_record(&self, entry: &ActiveTask) -> Option<FailedRecord> {
        let retry_of = entry.retry_of?;
        let (queue, id) = (self.ctx.queue.clone(), entry.task_id.clone());
        let record = runner_blocking(move || queue.backend().failed_record(&id))
            .await
            .ok()??;
        (record.failed_at == retry_of).then_some(record)
    }

    /// Did the attempt recorded in `entry` finish a phase or write a checkpoint?
    pub(super) async fn attempt_progressed(&self, entry: &ActiveTask) -> bool {
        let ctx = Arc::clone(&self.ctx);
        let entry = entry.clone();
        runner_blocking(move || attempt_progressed(&ctx, &entry)).await
    }

    /// Accepted tasks that never started (not in current_work and without a record).
    async fn load_pending(
        &mut self,
        records: &Records,
        in_flight: &HashSet<TaskId>,
    ) -> Result<(), DaemonError> {
        let queue = self.ctx.queue.clone();
        let accepted = runner_blocking(move || queue.backend().accepted_ids())
            .await
            .map_err(|e| DaemonError::Setup(e.to_string()))?;
        let ids: Vec<TaskId> = accepted
            .into_iter()
            .filter(|id| !self.tasks.contains_key(id.as_str()) && !in_flight.contains(id.as_str()))
            .filter_map(|id| {
                TaskId::parse(id.as_str())
                    .map_err(|e| tracing::error!("skipping accepted task {id:?}: task id {e}"))
                    .ok()
            })
            .collect();
        let ctx = Arc::clone(&self.ctx);
        let records = records.clone();
        let found = runner_blocking(move || {
            let mut found = Vec::new();
            for id in ids {
                if records.has(&ctx.queue, &id) {
                    continue;
                }
                match read_task(&ctx, &id) {
                    Ok(task) => found.push((ctx.queue.backend().accepted_at(&id), task)),
                    Err(error) => tracing::error!(task_id = %id, "skipping task: {error}"),
                }
            }
            found.sort_by_key(|(accepted, _)| *accepted);
            found
        })
        .await;
        for (_, task) in found {
            self.add_pending(task);
        }
        Ok(())
    }

    pub(super) fn add_pending(&mut self, task: Task) {
        let id = task.id().clone();
        let key = SubmitterKey::of_task(&task);
        self.pending
            .push(key, (task.priority, Reverse(self.next_seq), id.clone()));
        self.next_seq += 1;
        self.tasks.insert(id, Arc::new(task));
    }

    pub(super) async fn read_task(&self, id: &str) -> Result<Task, DefinitionError> {
        let ctx = Arc::clone(&self.ctx);
        let id = id.to_string();
        runner_blocking(move || read_task(&ctx, &id)).await
    }
}

/// A stand-in for a task whose definition cannot be read, to record it failed: no phases, the
/// default policy.
fn unreadable_task(id: &TaskId) -> Task {
    Task {
        id: Some(id.clone()),
        priority: 0,
        cwd: None,
        env: Default::default(),
        retry: Default::default(),
        budget: None,
        phases: Vec::new(),
        meta: None,
        submitted_by: None,
    }
}

/// Where an entry of `current_work.json` goes at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Line {
    /// Tried alone before anything else starts (see `crash_blame`).
    Suspect,
    /// Resumed before new tasks.
    Resume,
    /// Paused: held until `cairn resume`.
    Hold,
    /// Waiting out its backoff until then.
    RetryAt(DateTime<Utc>),
    /// Taken for the cause of repeated crashes: recorded failed, with the reason.
    Quarantine { crashes_alone: u32 },
}

/// Where an entry goes at start, from its status and suspect flag as stored, and for an entry
/// whose attempt the daemon died in, the verdict on that crash. Pure.
pub(super) fn line_up(
    status: ActiveStatus,
    suspect: bool,
    verdict: Option<Verdict>,
    next_attempt_at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Line {
    match (status, verdict) {
        (_, Some(Verdict::Quarantined { crashes_alone })) => Line::Quarantine { crashes_alone },
        (_, Some(Verdict::Suspect { .. } | Verdict::CrashedAlone { .. })) => Line::Suspect,
        (_, Some(Verdict::Cleared)) => Line::Resume,
        (ActiveStatus::Paused, None) => Line::Hold,
        (ActiveStatus::WaitingRetry, None) => Line::RetryAt(next_attempt_at.unwrap_or(now)),
        (ActiveStatus::Running | ActiveStatus::Interrupted, None) if suspect => Line::Suspect,
        (ActiveStatus::Running | ActiveStatus::Interrupted, None) => Line::Resume,
    }
}

/// Why a task's definition cannot be read back (the owner's error names what and why).
pub(super) type DefinitionError = crate::queue::QueueError;

/// An accepted task's definition. Blocking.
fn read_task(ctx: &RunContext, id: &str) -> Result<Task, DefinitionError> {
    ctx.queue.backend().task(id)
}

/// Did the attempt recorded in `entry` finish a phase or write a checkpoint? Blocking.
fn attempt_progressed(ctx: &RunContext, entry: &ActiveTask) -> bool {
    if entry.phase_index > entry.attempt_started_phase {
        return true;
    }
    match ctx.queue.backend().latest_checkpoint(&entry.task_id) {
        Ok(Some(loaded)) => {
            loaded.checkpoint.attempt == entry.attempt
                && loaded.checkpoint.phase_index == entry.phase_index
        }
        _ => false,
    }
}

/// Which tasks have a final record, from one read of them all, instead of looking up each
/// task's record to learn whether it exists.
#[derive(Debug, Clone)]
struct Records {
    /// `None` when the read failed: each task is then looked up on its own.
    ids: Option<HashSet<String>>,
}

impl Records {
    /// Blocking.
    fn list(queue: &Queue) -> Records {
        match queue.backend().finished_ids() {
            Ok(ids) => Records { ids: Some(ids) },
            Err(e) => {
                tracing::warn!("{e}; looking up each task's record instead");
                Records { ids: None }
            }
        }
    }

    /// Whether the task has a final record. Blocking.
    fn has(&self, queue: &Queue, id: &str) -> bool {
        match &self.ids {
            Some(ids) => ids.contains(id),
            None => queue.backend().has_record(id).unwrap_or(false),
        }
    }
}

/// What recovery needs to know about one entry of `current_work.json`, read off the async
/// thread.
struct Prefetched {
    entry: ActiveTask,
    has_record: bool,
    task: Result<Task, DefinitionError>,
    /// For an entry whose attempt the daemon died in: whether that attempt made progress.
    progressed: Option<bool>,
}

impl Prefetched {
    /// Blocking.
    fn read(ctx: &RunContext, records: &Records, entry: ActiveTask) -> Prefetched {
        let has_record = records.has(&ctx.queue, &entry.task_id);
        let task = read_task(ctx, &entry.task_id);
        let progressed = (!has_record && task.is_ok() && entry.status == ActiveStatus::Running)
            .then(|| attempt_progressed(ctx, &entry));
        Prefetched {
            entry,
            has_record,
            task,
            progressed,
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, TimeZone, Utc};

    use super::{line_up, Line};
    use crate::daemon::crash_blame::Verdict;
    use crate::store::current_work::ActiveStatus;

    fn at(hour: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 1, hour, 0, 0).unwrap()
    }

    #[test]
    fn where_each_entry_goes_at_start() {
        use ActiveStatus::{Interrupted, Paused, Running, WaitingRetry};
        use Line::{Hold, Quarantine, Resume, RetryAt, Suspect};
        let now = at(12);
        let cleared = Some(Verdict::Cleared);
        let beside_others = Some(Verdict::Suspect { crashes_alone: 1 });
        let alone = Some(Verdict::CrashedAlone { crashes_alone: 2 });
        let convicted = Some(Verdict::Quarantined { crashes_alone: 5 });
        // (status stored, suspect flag stored, verdict on its crash, next attempt) → line
        #[rustfmt::skip]
        let table = [
            // The daemon died during its attempt: the verdict decides.
            ((Running,      false, cleared,       None),          Resume),
            ((Running,      true,  cleared,       None),          Resume),
            ((Running,      false, beside_others, None),          Suspect),
            ((Running,      false, alone,         None),          Suspect),
            ((Running,      true,  convicted,     None),          Quarantine { crashes_alone: 5 }),
            // Stopped cleanly: a suspect not tried yet stays one.
            ((Interrupted,  false, None,          None),          Resume),
            ((Interrupted,  true,  None,          None),          Suspect),
            // A pause holds, whatever the flag.
            ((Paused,       true,  None,          None),          Hold),
            ((Paused,       false, None,          None),          Hold),
            // A retry keeps its time; one without a time is due now.
            ((WaitingRetry, false, None,          Some(at(13))),  RetryAt(at(13))),
            ((WaitingRetry, true,  None,          Some(at(1))),   RetryAt(at(1))),
            ((WaitingRetry, false, None,          None),          RetryAt(now)),
        ];
        for ((status, suspect, verdict, next_attempt_at), line) in table {
            assert_eq!(
                line_up(status, suspect, verdict, next_attempt_at, now),
                line,
                "{status:?}, suspect {suspect}, {verdict:?}, {next_attempt_at:?}"
            );
        }
    }
}
