//! What happens to a task when one of its attempts ends: [`decide_after_attempt`] decides from
//! what is known (how the attempt ended, the task's retry policy and count of failed attempts,
//! an operator's requests, the clock), and [`Scheduler::attempt_finished`] carries the decision
//! out. The rules are pure, so the unit tests below hold them as a table, one row per rule.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{AttemptOutcome, Scheduler};
use crate::queue::HandBack;
use crate::runner::AttemptEnd;
use crate::store::current_work::{ActiveStatus, ActiveTask, PolicyPause};
use crate::store::events::Event;
use crate::store::records::RecordStatus;
use crate::task::{OnExceed, OnExhausted, RetryPolicy, Task};
use crate::task_id::TaskId;

/// What the scheduler knows when an attempt's future returns.
pub(super) struct AttemptFacts<'a> {
    pub outcome: AttemptOutcome,
    /// The task's failed attempts before this one, from its entry in `current_work`; `None`
    /// when it has no entry any more.
    pub failed_attempts: Option<u32>,
    pub retry: &'a RetryPolicy,
    /// What a spent budget does to the task (`budget.on_exceed`).
    pub on_exceed: OnExceed,
    /// `cairn cancel` arrived while the attempt ran.
    pub cancel_requested: bool,
    /// `cairn pause` arrived while the attempt ran.
    pub pause_requested: bool,
    pub now: DateTime<Utc>,
}

/// When a task that waits out its backoff tries again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RetryAt {
    pub at: DateTime<Utc>,
    pub delay: Duration,
}

/// After a failed attempt: try again, or give up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AfterFailure {
    Retry(RetryAt),
    /// The attempt used up the task's last one: it goes to `failed/`.
    GiveUp,
    /// The attempt used up the task's last one and `retry.on_exhausted` is `pause`: it is
    /// held, its last error shown, until `cairn resume`.
    Pause,
}

/// What becomes of a task whose attempt ended.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Decision {
    /// The task has left `current_work` while the attempt ran: nothing to change. An error of
    /// an unrecorded finish is still worth a log line.
    Gone { error: Option<String> },
    /// Every phase finished and `done/` holds the record: the task is forgotten. Holds its
    /// entry as it ended.
    Finished(Box<ActiveTask>),
    /// Every phase finished but the done record is not written: try again after the backoff,
    /// using up no attempt. `ran` is false when the record's write failed (the attempt's own
    /// end was never seen), true for a finish that reached the scheduler unrecorded.
    RecordAgain {
        error: String,
        retry: RetryAt,
        ran: bool,
    },
    /// The attempt failed (`counts`: against `retry.max_attempts`); the task has
    /// `failed_attempts` failures now, and retries or gives up.
    AttemptFailed {
        error: String,
        counts: bool,
        failed_attempts: u32,
        then: AfterFailure,
    },
    /// An operator's cancel: recorded `cancelled` (it wins over every end but a finish).
    Cancel,
    /// The budget is spent: recorded `budget_exceeded` with the reason.
    StopForBudget { reason: String },
    /// The budget is spent and `budget.on_exceed` is `pause`: held with its checkpoints, the
    /// reason shown, until `cairn resume` (after `cairn budget` raised the limit).
    PauseForBudget { reason: String },
    /// Stopped at an iteration boundary for an operator's pause: held until `cairn resume`.
    Pause,
    /// Stopped by a shutdown: resumed at the next start.
    LeaveForResume,
}

/// What an attempt's end says about the task's crash record (`suspect`, `crashes_alone`; see
/// `crash_blame`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CrashRecord {
    /// Unchanged: the attempt's own end was never seen.
    Untouched,
    /// No longer a suspect, but its count stays: a failure of cairn's own (a full disk) may not
    /// have run the task at all.
    ClearSuspicion,
    /// The attempt ended while the daemon lived: no crash so far says anything against it.
    Clear,
}

impl Decision {
    /// How a task leaves a shared queue's daemon after this decision without a final record:
    /// paused, or waiting for a retry (a file queue keeps such tasks in its work state).
    pub(super) fn hand_back(&self) -> Option<HandBack> {
        match self {
            Decision::Pause
            | Decision::PauseForBudget { .. }
            | Decision::AttemptFailed {
                then: AfterFailure::Pause,
                ..
            } => Some(HandBack::Paused),
            Decision::RecordAgain { retry, .. }
            | Decision::AttemptFailed {
                then: AfterFailure::Retry(retry),
                ..
            } => Some(HandBack::RetryAfter(retry.delay)),
            _ => None,
        }
    }

    /// The rule for the crash record that goes with this decision.
    pub(super) fn crash_record(&self) -> CrashRecord {
        match self {
            Decision::Gone { .. } | Decision::Finished(_) => CrashRecord::Untouched,
            Decision::RecordAgain { ran: false, .. } => CrashRecord::Untouched,
            Decision::AttemptFailed { counts: false, .. } => CrashRecord::ClearSuspicion,
            _ => CrashRecord::Clear,
        }
    }
}

impl CrashRecord {
    fn apply_to(self, entry: &mut ActiveTask) {
        match self {
            CrashRecord::Untouched => {}
            CrashRecord::ClearSuspicion => entry.suspect = false,
            CrashRecord::Clear => {
                entry.suspect = false;
                entry.crashes_alone = 0;
            }
        }
    }
}

/// The backoff before the next attempt of a task with `failed_attempts` failures (at least
/// one backoff, also after a failure that used up no attempt).
fn retry_at(retry: &RetryPolicy, failed_attempts: u32, now: DateTime<Utc>) -> RetryAt {
    let delay = retry.delay_after(failed_attempts.max(1));
    let at = now + chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::zero());
    RetryAt { at, delay }
}

/// Decide what becomes of a task whose attempt ended. Pure: the scheduler applies the result.
pub(super) fn decide_after_attempt(facts: AttemptFacts<'_>) -> Decision {
    let AttemptFacts {
        outcome,
        failed_attempts,
        retry,
        on_exceed,
        cancel_requested,
        pause_requested,
        now,
    } = facts;
    let end = match (outcome, failed_attempts) {
        // Finished and recorded (an operator's cancel does not undo that).
        (AttemptOutcome::Recorded(entry), _) => return Decision::Finished(entry),
        (AttemptOutcome::RecordFailed(error), None) => {
            return Decision::Gone { error: Some(error) }
        }
        (AttemptOutcome::RecordFailed(error), Some(failed)) => {
            let retry = retry_at(retry, failed, now);
            return Decision::RecordAgain {
                error,
                retry,
                ran: false,
            };
        }
        (AttemptOutcome::Ended(_), None) => return Decision::Gone { error: None },
        (AttemptOutcome::Ended(end), Some(failed)) => (end, failed),
    };
    match end {
        // Recorded in the attempt's future; only an outcome built elsewhere lands here.
        (AttemptEnd::Done, failed) => Decision::RecordAgain {
            error: "internal error: the finished task was not recorded".into(),
            retry: retry_at(retry, failed, now),
            ran: true,
        },
        _ if cancel_requested => Decision::Cancel,
        (AttemptEnd::Interrupted, _) if pause_requested => Decision::Pause,
        (AttemptEnd::Interrupted, _) => Decision::LeaveForResume,
        (AttemptEnd::BudgetStopped { reason }, _) => match on_exceed {
            OnExceed::Fail => Decision::StopForBudget { reason },
            OnExceed::Pause => Decision::PauseForBudget { reason },
        },
        (AttemptEnd::Failed { error, counts }, failed) => {
            let failed_attempts = if counts { failed + 1 } else { failed };
            let then = if counts && failed_attempts >= retry.max_attempts {
                match retry.on_exhausted {
                    OnExhausted::Fail => AfterFailure::GiveUp,
                    OnExhausted::Pause => AfterFailure::Pause,
                }
            } else {
                AfterFailure::Retry(retry_at(retry, failed_attempts, now))
            };
            Decision::AttemptFailed {
                error,
                counts,
                failed_attempts,
                then,
            }
        }
    }
}

impl Scheduler {
    /// An attempt's future returned: decide what becomes of the task, and do it.
    pub(super) async fn attempt_finished(
        &mut self,
        joined: Result<(TaskId, AttemptOutcome), tokio::task::JoinError>,
    ) {
        let (id, outcome) = match joined {
            Ok(result) => result,
            Err(e) => {
                tracing::error!("a task runner was lost: {e}");
                return;
            }
        };
        self.running_ids.remove(&id);
        self.running_by.ended(&id);
        // The daemon outlived this attempt: a trial it was on is over.
        self.on_trial.remove(&id);
        if !matches!(outcome, AttemptOutcome::Recorded(_)) && self.forget_if_lease_lost(&id).await {
            return;
        }
        let control = self.ctx.drop_control(&id).unwrap_or_default();
        let Some(task) = self.tasks.get(&id).cloned() else {
            return;
        };
        let entry = self.ctx.work.update(|w| w.get(&id).cloned());
        let decision = decide_after_attempt(AttemptFacts {
            outcome,
            failed_attempts: entry.as_ref().map(|e| e.failed_attempts),
            retry: &task.retry,
            on_exceed: task
                .budget
                .as_ref()
                .map(|b| b.on_exceed)
                .unwrap_or_default(),
            cancel_requested: control.cancel.is_cancelled(),
            pause_requested: control.pause.is_cancelled(),
            now: Utc::now(),
        });
        self.apply_after_attempt(&task, entry, decision).await;
    }

    /// Carry out a [`Decision`]: log and journal it, update or record the task's entry, and
    /// write `current_work.json`.
    async fn apply_after_attempt(
        &mut self,
        task: &Arc<Task>,
        entry: Option<ActiveTask>,
        decision: Decision,
    ) {
        let id = task.id().clone();
        let mut entry = match (&decision, entry) {
            (Decision::Finished(ended), _) => return self.forget_finished(&id, ended),
            (Decision::Gone { error }, _) => {
                if let Some(error) = error {
                    tracing::error!(task_id = %id, "{error}");
                }
                return;
            }
            (_, Some(entry)) => entry,
            // Every other decision is made about an entry.
            (_, None) => return,
        };
        decision.crash_record().apply_to(&mut entry);
        let hand_back = decision.hand_back();
        match decision {
            Decision::Gone { .. } | Decision::Finished(_) => {}
            Decision::RecordAgain { error, retry, .. } => {
                tracing::error!(task_id = %id, "{error}");
                self.schedule_retry(&mut entry, error, retry, false);
            }
            Decision::AttemptFailed {
                error,
                counts,
                failed_attempts,
                then,
            } => {
                self.attempt_failed(task, entry, error, counts, failed_attempts, then)
                    .await
            }
            Decision::Cancel => {
                self.record_failure(
                    task,
                    entry,
                    "cancelled by an operator".into(),
                    RecordStatus::Cancelled,
                )
                .await;
                self.tasks.remove(&id);
            }
            Decision::StopForBudget { reason } => {
                self.record_failure(task, entry, reason, RecordStatus::BudgetExceeded)
                    .await;
                self.tasks.remove(&id);
            }
            Decision::PauseForBudget { reason } => {
                let limit = entry.spend_limit(task.budget.as_ref()).unwrap_or(0.0);
                entry.paused_for = Some(PolicyPause::budget(entry.spent(), limit));
                tracing::warn!(task_id = %id, "task paused by its budget: {reason}");
                entry.last_error = Some(reason);
                self.hold(entry, ActiveStatus::Paused);
            }
            Decision::Pause => self.hold(entry, ActiveStatus::Paused),
            Decision::LeaveForResume => self.hold(entry, ActiveStatus::Interrupted),
        }
        self.persist().await;
        self.hand_back_if_shared(&id, hand_back).await;
    }

    /// A failed attempt: journal it, count it, then retry after the backoff or give up.
    async fn attempt_failed(
        &mut self,
        task: &Arc<Task>,
        mut entry: ActiveTask,
        error: String,
        counts: bool,
        failed_attempts: u32,
        then: AfterFailure,
    ) {
        let id = task.id().clone();
        tracing::warn!(task_id = %id, attempt = entry.attempt, "attempt failed: {error}");
        self.ctx.journal(
            &id,
            Event::AttemptFailed {
                attempt: entry.attempt,
                error: error.clone(),
                counts,
            },
        );
        entry.failed_attempts = failed_attempts;
        match then {
            AfterFailure::Retry(retry) => self.schedule_retry(&mut entry, error, retry, true),
            AfterFailure::GiveUp => {
                self.give_up(task, entry, error).await;
                self.tasks.remove(&id);
            }
            AfterFailure::Pause => {
                tracing::warn!(task_id = %id, failed_attempts, "attempts used up: task paused until `cairn resume`");
                entry.paused_for = Some(PolicyPause::retries_exhausted(
                    failed_attempts,
                    error.clone(),
                ));
                entry.last_error = Some(error);
                self.hold(entry, ActiveStatus::Paused);
            }
        }
    }

    /// Keep the task in flight without running it: paused by an operator, or interrupted by a
    /// stop and resumed at the next start.
    fn hold(&mut self, mut entry: ActiveTask, status: ActiveStatus) {
        entry.status = status;
        let id = entry.task_id.clone();
        let (phase, iterations) = (entry.phase.clone(), entry.iterations);
        if status == ActiveStatus::Paused {
            tracing::info!(task_id = %id, phase = %phase, iterations, "task paused");
            let (phase, iterations) = (Some(phase), Some(iterations));
            let reason = entry.paused_for.as_ref().map(PolicyPause::describe);
            self.ctx.journal(
                &id,
                Event::Paused {
                    phase,
                    iterations,
                    reason,
                },
            );
        } else {
            tracing::info!(task_id = %id, phase = %phase, iterations, "task interrupted");
            self.ctx
                .journal(&id, Event::Interrupted { phase, iterations });
        }
        self.ctx.work.update(|w| w.upsert(entry));
    }

    /// A task done and recorded leaves the scheduler.
    fn forget_finished(&mut self, id: &str, ended: &ActiveTask) {
        tracing::info!(task_id = %id, attempts = ended.attempt, failed_attempts = ended.failed_attempts, "task done");
        self.ctx.journal(
            id,
            Event::Done {
                attempts: ended.attempt,
                cost: ended.cost,
            },
        );
        self.tasks.remove(id);
        self.finished += 1;
        self.summary.done.add(id.to_string());
    }

    /// Put the task in line for another attempt at `retry.at`, with `error` as its last one.
    fn schedule_retry(
        &mut self,
        entry: &mut ActiveTask,
        error: String,
        retry: RetryAt,
        announce: bool,
    ) {
        if announce {
            tracing::info!(task_id = %entry.task_id, "retrying in {}", humantime::format_duration(retry.delay));
        }
        entry.status = ActiveStatus::WaitingRetry;
        entry.next_attempt_at = Some(retry.at);
        entry.last_error = Some(error);
        self.retries.push((retry.at, entry.task_id.clone()));
        let entry = entry.clone();
        self.ctx.work.update(|w| w.upsert(entry));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use chrono::{DateTime, TimeZone, Utc};

    use super::{decide_after_attempt, AfterFailure, AttemptFacts, CrashRecord, Decision, RetryAt};
    use crate::daemon::AttemptOutcome;
    use crate::queue::HandBack;
    use crate::runner::AttemptEnd;
    use crate::store::current_work::ActiveTask;
    use crate::task::{OnExceed, OnExhausted, RetryPolicy};
    use crate::task_id::TaskId;

    /// The operator's requests that arrived while the attempt ran.
    #[derive(Debug, Clone, Copy)]
    enum Asked {
        Nothing,
        Pause,
        Cancel,
        PauseAndCancel,
    }

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 1, 12, 0, 0).unwrap()
    }

    /// The default policy: 3 attempts, 10 s backoff doubled up to 10 min.
    fn policy() -> RetryPolicy {
        RetryPolicy::default()
    }

    fn ended_entry() -> Box<ActiveTask> {
        let mut entry = ActiveTask::new(&TaskId::parse("t").unwrap(), "last");
        entry.started_at = now();
        Box::new(entry)
    }

    fn recorded() -> AttemptOutcome {
        AttemptOutcome::Recorded(ended_entry())
    }
    fn record_failed() -> AttemptOutcome {
        AttemptOutcome::RecordFailed("writing the done record of t: disk full".into())
    }
    fn ended(end: AttemptEnd) -> AttemptOutcome {
        AttemptOutcome::Ended(end)
    }
    fn failed(counts: bool) -> AttemptOutcome {
        ended(AttemptEnd::Failed {
            error: "boom".into(),
            counts,
        })
    }
    fn budget() -> AttemptOutcome {
        ended(AttemptEnd::BudgetStopped {
            reason: "spent".into(),
        })
    }

    fn after(seconds: u64) -> RetryAt {
        RetryAt {
            at: now() + chrono::Duration::seconds(seconds as i64),
            delay: Duration::from_secs(seconds),
        }
    }
    fn record_again(ran: bool, error: Option<&str>, seconds: u64) -> Decision {
        Decision::RecordAgain {
            error: error.unwrap_or_default().into(),
            retry: after(seconds),
            ran,
        }
    }
    fn retry(counts: bool, failed_attempts: u32, seconds: u64) -> Decision {
        Decision::AttemptFailed {
            error: "boom".into(),
            counts,
            failed_attempts,
            then: AfterFailure::Retry(after(seconds)),
        }
    }
    fn give_up(failed_attempts: u32) -> Decision {
        Decision::AttemptFailed {
            error: "boom".into(),
            counts: true,
            failed_attempts,
            then: AfterFailure::GiveUp,
        }
    }

    fn gone(error: Option<&str>) -> Decision {
        Decision::Gone {
            error: error.map(str::to_string),
        }
    }
    fn budget_stop() -> Decision {
        Decision::StopForBudget {
            reason: "spent".into(),
        }
    }

    #[test]
    fn the_decision_table() {
        use Asked::{Cancel, Nothing, Pause, PauseAndCancel};
        use CrashRecord::{Clear, ClearSuspicion, Untouched};
        use Decision::{Cancel as Cancelled, LeaveForResume, Pause as Paused};
        let finished = || Decision::Finished(ended_entry());
        let interrupted = || ended(AttemptEnd::Interrupted);
        let done_unrecorded = || ended(AttemptEnd::Done);
        let disk_full = Some("writing the done record of t: disk full");
        let internal = "internal error: the finished task was not recorded";
        // Failed attempts before this one: None when the task has no entry left. The default
        // policy: 3 attempts, 10 s backoff doubled per failure.
        #[rustfmt::skip]
        let table = [
            // how it ended    failed   asked        → decision                          crash record
            // A recorded finish is final, whatever was asked meanwhile.
            ((recorded(),        None,    Nothing),     (finished(),                        Untouched)),
            ((recorded(),        None,    Cancel),      (finished(),                        Untouched)),
            // A finish whose record failed writes it again after a backoff, using up no
            // attempt; no crash count moves (the attempt's own end was never seen).
            ((record_failed(),   Some(0), Nothing),     (record_again(false, disk_full, 10), Untouched)),
            ((record_failed(),   Some(2), Cancel),      (record_again(false, disk_full, 20), Untouched)),
            ((record_failed(),   None,    Nothing),     (gone(disk_full),                   Untouched)),
            // A task that left current_work meanwhile is left alone.
            ((interrupted(),     None,    Cancel),      (gone(None),                        Untouched)),
            ((failed(true),      None,    Nothing),     (gone(None),                        Untouched)),
            // A finish that reached the scheduler unrecorded is recorded again, even if cancelled.
            ((done_unrecorded(), Some(0), Cancel),      (record_again(true, Some(internal), 10), Clear)),
            // An operator's cancel wins over every other end.
            ((interrupted(),     Some(0), Cancel),      (Cancelled,                         Clear)),
            ((interrupted(),     Some(0), PauseAndCancel), (Cancelled,                      Clear)),
            ((failed(true),      Some(2), Cancel),      (Cancelled,                         Clear)),
            ((failed(false),     Some(0), Cancel),      (Cancelled,                         Clear)),
            ((budget(),          Some(0), Cancel),      (Cancelled,                         Clear)),
            // A pause holds an attempt stopped at a boundary; a shutdown leaves it to resume.
            ((interrupted(),     Some(1), Pause),       (Paused,                            Clear)),
            ((interrupted(),     Some(1), Nothing),     (LeaveForResume,                    Clear)),
            // A spent budget is final; a pause does not hold it.
            ((budget(),          Some(0), Nothing),     (budget_stop(),                     Clear)),
            ((budget(),          Some(0), Pause),       (budget_stop(),                     Clear)),
            // A failure counts and waits a backoff doubled per failure...
            ((failed(true),      Some(0), Nothing),     (retry(true, 1, 10),                Clear)),
            ((failed(true),      Some(1), Nothing),     (retry(true, 2, 20),                Clear)),
            // ...until the attempts are used up.
            ((failed(true),      Some(2), Nothing),     (give_up(3),                        Clear)),
            ((failed(true),      Some(7), Nothing),     (give_up(8),                        Clear)),
            // A pause does not hold a failed attempt: it is retried.
            ((failed(true),      Some(0), Pause),       (retry(true, 1, 10),                Clear)),
            // A failure of cairn's own (a full disk) uses up no attempt, never gives up, waits
            // at least one backoff, and keeps the crash count (the task may not have run).
            ((failed(false),     Some(0), Nothing),     (retry(false, 0, 10),               ClearSuspicion)),
            ((failed(false),     Some(2), Nothing),     (retry(false, 2, 20),               ClearSuspicion)),
            ((failed(false),     Some(9), Pause),       (retry(false, 9, 600),              ClearSuspicion)),
        ];
        let policy = policy();
        for ((outcome, failed_attempts, asked), (decision, crash_record)) in table {
            let row = format!("{outcome:?}, failed before {failed_attempts:?}, asked {asked:?}");
            let (pause_requested, cancel_requested) = match asked {
                Nothing => (false, false),
                Pause => (true, false),
                Cancel => (false, true),
                PauseAndCancel => (true, true),
            };
            let decided = decide_after_attempt(AttemptFacts {
                outcome,
                failed_attempts,
                retry: &policy,
                on_exceed: OnExceed::Fail,
                cancel_requested,
                pause_requested,
                now: now(),
            });
            assert_eq!(decided, decision, "{row}");
            assert_eq!(decided.crash_record(), crash_record, "{row}");
        }
    }

    /// With the policies that pause (`budget.on_exceed`, `retry.on_exhausted`): a spent
    /// budget and used-up attempts hold the task instead of failing it, and a shared queue's
    /// daemon hands it back paused. Everything else is as with the policies that fail.
    #[test]
    fn the_decision_table_of_the_pausing_policies() {
        use Asked::{Cancel, Nothing, Pause};
        let pause_for_budget = || Decision::PauseForBudget {
            reason: "spent".into(),
        };
        let pause_exhausted = |failed_attempts| Decision::AttemptFailed {
            error: "boom".into(),
            counts: true,
            failed_attempts,
            then: AfterFailure::Pause,
        };
        let fail = (OnExceed::Fail, OnExhausted::Fail);
        let budget_pauses = (OnExceed::Pause, OnExhausted::Fail);
        let exhaustion_pauses = (OnExceed::Fail, OnExhausted::Pause);
        let both = (OnExceed::Pause, OnExhausted::Pause);
        #[rustfmt::skip]
        let table = [
            // how it ended  failed   asked    policies           → decision               hand back
            // A spent budget pauses the task, whatever an operator's pause asked; a cancel wins.
            ((budget(),       Some(0), Nothing, budget_pauses),     (pause_for_budget(),     Some(HandBack::Paused))),
            ((budget(),       Some(2), Pause,   both),              (pause_for_budget(),     Some(HandBack::Paused))),
            ((budget(),       Some(0), Cancel,  budget_pauses),     (Decision::Cancel,       None)),
            ((budget(),       Some(0), Nothing, exhaustion_pauses), (budget_stop(),          None)),
            ((budget(),       Some(0), Nothing, fail),              (budget_stop(),          None)),
            // The last attempt's failure pauses it; one before the last is retried as ever.
            ((failed(true),   Some(2), Nothing, exhaustion_pauses), (pause_exhausted(3),     Some(HandBack::Paused))),
            ((failed(true),   Some(2), Nothing, both),              (pause_exhausted(3),     Some(HandBack::Paused))),
            ((failed(true),   Some(5), Nothing, exhaustion_pauses), (pause_exhausted(6),     Some(HandBack::Paused))),
            ((failed(true),   Some(1), Nothing, exhaustion_pauses), (retry(true, 2, 20),     Some(HandBack::RetryAfter(Duration::from_secs(20))))),
            ((failed(true),   Some(2), Nothing, budget_pauses),     (give_up(3),             None)),
            ((failed(true),   Some(2), Cancel,  exhaustion_pauses), (Decision::Cancel,       None)),
            // A failure of cairn's own never uses up an attempt, so it never pauses.
            ((failed(false),  Some(2), Nothing, exhaustion_pauses), (retry(false, 2, 20),    Some(HandBack::RetryAfter(Duration::from_secs(20))))),
        ];
        for ((outcome, failed_attempts, asked, (on_exceed, on_exhausted)), (decision, hand_back)) in
            table
        {
            let row = format!(
                "{outcome:?}, failed before {failed_attempts:?}, asked {asked:?}, {on_exceed:?}/{on_exhausted:?}"
            );
            let policy = RetryPolicy {
                on_exhausted,
                ..policy()
            };
            let decided = decide_after_attempt(AttemptFacts {
                outcome,
                failed_attempts,
                retry: &policy,
                on_exceed,
                cancel_requested: matches!(asked, Cancel),
                pause_requested: matches!(asked, Pause),
                now: now(),
            });
            assert_eq!(decided, decision, "{row}");
            assert_eq!(decided.hand_back(), hand_back, "{row}");
        }
    }

    #[test]
    fn the_backoff_follows_the_tasks_own_policy() {
        let policy = RetryPolicy {
            max_attempts: 10,
            backoff: Duration::from_secs(3),
            max_backoff: Duration::from_secs(20),
            ..RetryPolicy::default()
        };
        let delays: Vec<u64> = (0..6)
            .map(|failed_before| {
                let decided = decide_after_attempt(AttemptFacts {
                    outcome: failed(true),
                    failed_attempts: Some(failed_before),
                    retry: &policy,
                    on_exceed: OnExceed::Fail,
                    cancel_requested: false,
                    pause_requested: false,
                    now: now(),
                });
                match decided {
                    Decision::AttemptFailed {
                        then: AfterFailure::Retry(retry),
                        ..
                    } => {
                        assert_eq!(
                            retry.at - now(),
                            chrono::Duration::from_std(retry.delay).unwrap()
                        );
                        retry.delay.as_secs()
                    }
                    other => panic!("failed before {failed_before}: {other:?}"),
                }
            })
            .collect();
        assert_eq!(delays, [3, 6, 12, 20, 20, 20]);
    }
}
