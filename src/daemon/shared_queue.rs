//! The daemon's side of a queue shared with daemons on other hosts (PostgreSQL, see
//! `docs/cluster.md`). One scheduler drives both backends; on a shared queue it differs in four
//! places, all here:
//! - tasks are *claimed* from the queue when slots are free (expired leases first), instead of
//!   coming from intake and the work state;
//! - every lease is renewed in one step every lease/6, and a task whose lease could not be
//!   renewed has its commands stopped before the lease can expire;
//! - a task whose lease is lost is forgotten when its attempt ends: another daemon runs it now,
//!   and nothing is written for it;
//! - a task paused, or waiting for a retry's backoff, is handed back rather than kept.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::{JoinHandle, JoinSet};

use super::{runner_blocking, Scheduler};
use crate::queue::backend::{lease_stop_margin, renewal_period};
use crate::queue::{ClaimedWork, HandBack, QueueError};
use crate::runner::RunContext;
use crate::store::current_work::ActiveTask;
use crate::store::events::Event;
use crate::store::records::RecordStatus;
use crate::task_id::TaskId;

/// How often free slots look for claimable work when no wake-up came (a lost notification
/// delays work by at most this).
pub(super) const CLAIM_POLL: Duration = Duration::from_secs(1);

/// The claiming of work from a shared queue, as the main loop keeps it.
#[derive(Default)]
pub(super) struct Claiming {
    /// The claim running on the blocking pool.
    running: Option<JoinHandle<Result<Claimed, QueueError>>>,
    /// When the last claim started.
    last: Option<Instant>,
    /// The last claim found nothing, and no task waited or ran anywhere.
    drained: bool,
    /// A crash suspect's trial held claiming back: once it is over and this daemon idle,
    /// claim at once rather than at the next poll (suspects are tried one after another, and
    /// only by an idle daemon).
    held_by_trial: bool,
    /// When the leases were last checked against the tasks this daemon knows.
    leases_checked: Option<Instant>,
}

/// What one claim took, and whether the shared queue is drained (nothing taken, nothing
/// waiting or running anywhere).
pub(super) struct Claimed {
    work: Vec<ClaimedWork>,
    drained: bool,
}

impl Claiming {
    /// Whether nothing is being claimed and the last look found the shared queue drained.
    pub(super) fn is_idle(&self) -> bool {
        self.running.is_none() && self.drained
    }

    pub(super) fn is_running(&self) -> bool {
        self.running.is_some()
    }

    /// The claim under way, if any (pending forever otherwise, for `select!`).
    pub(super) async fn finished(
        &mut self,
    ) -> Result<Result<Claimed, QueueError>, tokio::task::JoinError> {
        let result = match &mut self.running {
            Some(handle) => handle.await,
            None => std::future::pending().await,
        };
        self.running = None;
        result
    }
}

impl Scheduler {
    /// Slots neither running nor promised to a task already lined up here.
    fn free_slots(&self) -> usize {
        let lined_up =
            self.running_ids.len() + self.resume.len() + self.pending.len() + self.suspects.len();
        self.config.max_tasks.saturating_sub(lined_up)
    }

    /// On a shared queue with free slots, claim work when the poll is due (or `now`). Nothing
    /// is claimed while a crash suspect is tried here: it runs alone, so that if this daemon
    /// dies, the blame falls on it alone.
    pub(super) fn claim_if_due(&mut self, now: bool) {
        if !self.ctx.queue.backend().shares_queue()
            || self.claiming.running.is_some()
            || self.ctx.shutdown.is_stopping()
        {
            return;
        }
        if !self.suspects.is_empty() {
            self.claiming.held_by_trial = true;
            return;
        }
        self.prune_trials();
        if !self.on_trial.is_empty() {
            self.claiming.held_by_trial = true;
            return;
        }
        let free = self.free_slots();
        if free == 0 {
            return;
        }
        let due = self
            .claiming
            .last
            .is_none_or(|at| at.elapsed() >= CLAIM_POLL);
        // The next suspect is claimed only by an idle daemon: after a trial, claim as soon as
        // the suspect's attempt has ended, not at the next poll.
        let idle = free == self.config.max_tasks;
        if !(now || due || (self.claiming.held_by_trial && idle)) {
            return;
        }
        if idle {
            self.claiming.held_by_trial = false;
        }
        self.claiming.last = Some(Instant::now());
        let queue = self.ctx.queue.clone();
        self.claiming.running = Some(tokio::task::spawn_blocking(move || {
            let work = queue.backend().claim_work(free, idle)?;
            let drained = work.is_empty() && queue.backend().drained()?;
            Ok(Claimed { work, drained })
        }));
    }

    /// How often free slots look for work: every [`CLAIM_POLL`], or every sixth of a short
    /// lease, so that a dead daemon's task is taken over soon after its lease expired.
    fn claim_poll(&self) -> Duration {
        let lease = self
            .ctx
            .queue
            .backend()
            .lease_length()
            .unwrap_or(CLAIM_POLL * 6);
        CLAIM_POLL.min(lease / 6)
    }

    /// How long the main loop may sleep before the next claim is due.
    pub(super) fn claim_tick(&self) -> Option<Duration> {
        (self.ctx.queue.backend().shares_queue() && self.free_slots() > 0)
            .then(|| self.claim_poll())
    }

    /// Line up what a claim took: a crash suspect goes on trial, a task that stood somewhere
    /// resumes there, a new one waits with the pending ones, and one that kept killing its
    /// daemons is recorded failed.
    pub(super) async fn take_claimed(
        &mut self,
        claimed: Result<Result<Claimed, QueueError>, tokio::task::JoinError>,
    ) {
        let claimed = match claimed {
            Ok(Ok(claimed)) => claimed,
            Ok(Err(error)) => {
                tracing::warn!(%error, "could not claim work from the shared queue");
                return;
            }
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => return tracing::error!("a claim of work was lost: {e}"),
        };
        self.claiming.drained = claimed.drained;
        for work in claimed.work {
            self.line_up_claimed(work).await;
        }
    }

    async fn line_up_claimed(&mut self, work: ClaimedWork) {
        let ClaimedWork {
            task,
            lease,
            entry,
            quarantine,
            on_trial,
            taken_over,
        } = work;
        let id = task.id().clone();
        tracing::info!(task_id = %id, epoch = lease.epoch(), resumes = entry.is_some(), on_trial, "claimed a task");
        if let Some(moved) = taken_over {
            tracing::info!(task_id = %id, from = %moved.from_node, from_epoch = moved.from_epoch, verdict = moved.verdict, "took the task over from an expired lease");
            self.ctx.journal(
                &id,
                Event::TakenOver {
                    from_node: moved.from_node,
                    from_epoch: moved.from_epoch,
                    verdict: moved.verdict.to_string(),
                    crashes: moved.crashes,
                    limit: moved.limit,
                },
            );
        }
        if let Some(crashes) = quarantine {
            self.ctx.journal(
                &id,
                Event::Quarantined {
                    crashes,
                    limit: task.retry.max_attempts + 2,
                },
            );
            let first = task
                .phases
                .first()
                .map(|p| p.name.clone())
                .unwrap_or_default();
            let entry = entry.unwrap_or_else(|| ActiveTask::new(&id, &first));
            let task = Arc::new(task);
            self.tasks.insert(id.clone(), Arc::clone(&task));
            let error = format!(
                "quarantined: the daemons running it died or lost its lease {crashes} times in a \
                 row while it ran alone on them, with no checkpoint or finished phase in between, \
                 so it is taken for their cause (`cairn retry --db` brings it back)"
            );
            self.record_failure(&task, entry, error, RecordStatus::Failed)
                .await;
            self.tasks.remove(&id);
            return;
        }
        self.claimed_leases.insert(id.clone(), lease);
        if on_trial {
            let first = task.phases.first().map(|p| p.name.clone());
            let mut entry =
                entry.unwrap_or_else(|| ActiveTask::new(&id, &first.unwrap_or_default()));
            // The runner clears the flag at the first progress, which ends the trial.
            entry.suspect = true;
            self.ctx.work.update(|w| w.upsert(entry));
            self.tasks.insert(id.clone(), Arc::new(task));
            self.suspects.push_back(id);
            return;
        }
        match entry {
            Some(entry) => {
                self.ctx.work.update(|w| w.upsert(entry));
                self.tasks.insert(id.clone(), Arc::new(task));
                self.resume.push_back(id);
            }
            None => self.add_pending(task),
        }
    }

    /// An attempt of a task whose lease was lost ended: forget the task (its new holder owns
    /// its state now). True if that was the case.
    pub(super) async fn forget_if_lease_lost(&mut self, id: &TaskId) -> bool {
        let lost = self.ctx.take_lost_lease(id);
        if !lost && self.ctx.queue.backend().holds(id) {
            return false;
        }
        // Whether another daemon has it is not known here (the lease may have expired unclaimed,
        // or renewals may just not have come back): say what is known.
        tracing::warn!(task_id = %id, "the task's lease was lost or could not be confirmed: its commands were stopped, and the task is handed back (or its lease left to expire) for a daemon to take up");
        // Stopped because renewals failed, the lease may still be this daemon's: hand it back
        // (refused, and harmless, when another daemon has it; let go of when the database
        // cannot be reached, see `QueueBackend::let_go`).
        self.hand_back_if_shared(id, Some(HandBack::RetryAfter(Duration::ZERO)))
            .await;
        self.forget_task(id);
        true
    }

    /// Drop every trace of a task this daemon no longer holds.
    fn forget_task(&mut self, id: &TaskId) {
        // Never renew a lease for a task this daemon does not run.
        self.ctx.queue.backend().let_go(id);
        self.tasks.remove(id);
        self.claimed_leases.remove(id);
        self.retries.retain(|(_, waiting)| waiting != id);
        self.ctx.drop_control(id);
        self.ctx.work.update(|w| w.remove(id));
    }

    /// On a shared queue, let go of every lease the backend renews for a task this daemon no
    /// longer knows (a record or hand-back that failed, any path that dropped a task): its
    /// lease must expire, or be handed back, so that another daemon takes the task up,
    /// rather than be renewed for ever with nobody running it. Not while a claim is on its
    /// way (its leases are the backend's before they are lined up here).
    pub(super) fn let_go_of_unknown_leases(&mut self) {
        if !self.ctx.queue.backend().shares_queue() || self.claiming.is_running() {
            return;
        }
        // Once a second at most: it lists every lease held.
        if self
            .claiming
            .leases_checked
            .is_some_and(|at| at.elapsed() < CLAIM_POLL)
        {
            return;
        }
        self.claiming.leases_checked = Some(Instant::now());
        for task_id in self.ctx.queue.backend().renewed_tasks() {
            if !self.tasks.contains_key(task_id.as_str())
                && !self.running_ids.contains(task_id.as_str())
            {
                tracing::warn!(%task_id, "this daemon holds the lease of a task it does not run: letting it go");
                self.ctx.queue.backend().let_go(&task_id);
            }
        }
    }

    /// On a shared queue, give a paused or retrying task back (its entry was written) and
    /// forget it; any daemon takes it up when it is resumed or its backoff is over.
    pub(super) async fn hand_back_if_shared(&mut self, id: &TaskId, how: Option<HandBack>) {
        let Some(how) = how.filter(|_| self.ctx.queue.backend().shares_queue()) else {
            return;
        };
        let (queue, task_id) = (self.ctx.queue.clone(), id.to_string());
        match runner_blocking(move || queue.backend().hand_back(&task_id, how)).await {
            Ok(()) => {}
            Err(QueueError::LeaseLost(_)) => {}
            // Its lease then expires and another claim takes it up, from the entry written.
            Err(error) => tracing::warn!(task_id = %id, %error, "could not hand the task back"),
        }
        self.forget_task(id);
    }
}

/// What one renewal returns: the tasks whose lease was lost.
type LostLeases = Result<Vec<String>, QueueError>;

/// Renewals on their way at once at most: on a slow link the next goes out before the last
/// came back, so a lease's confirmation lags by one round trip, not by a round trip and a
/// period. Each holds one of the backend's pooled connections while it waits.
const RENEWALS_IN_FLIGHT: usize = 2;

/// Renew this daemon's leases every lease/6 until the daemon ends, each renewal judged by its
/// own answer as soon as it comes (pipelined: the next one does not wait for it). A lease
/// found lost has its task's commands stopped. Each lease surely holds until the sending of
/// its claim or of its last answered renewal plus the lease, whatever the clocks say (the
/// backend keeps that deadline, see `QueueBackend::lease_deadlines`); the commands of a task
/// are stopped once less than the stop margin (a renewal period) of it is left, at that
/// moment, not at the next tick. A claim asks for its leases' first renewal at once.
pub(super) async fn keep_leases(ctx: Arc<RunContext>, lease: Duration) {
    let every = renewal_period(lease);
    let margin = lease_stop_margin(lease);
    let renew_soon = ctx.queue.backend().renewal_wanted().unwrap_or_default();
    let mut renewals: JoinSet<LostLeases> = JoinSet::new();
    let mut next_renewal = Instant::now() + every;
    // Tasks whose commands were stopped because their lease ran out unconfirmed.
    let mut stopped: HashSet<String> = HashSet::new();
    loop {
        let next_stop = stop_unconfirmed(&ctx, margin, &mut stopped);
        let wake = next_stop.map_or(next_renewal, |at| at.min(next_renewal));
        tokio::select! {
            _ = tokio::time::sleep_until(wake.into()) => {}
            _ = renew_soon.notified() => next_renewal = Instant::now(),
            Some(answer) = renewals.join_next(), if !renewals.is_empty() => match answer {
                Ok(Ok(lost)) => {
                    for task_id in lost {
                        tracing::warn!(%task_id, "a lease could not be renewed (it expired or another daemon claimed the task): stopping the task's commands");
                        ctx.lose_lease(&task_id);
                    }
                }
                Ok(Err(error)) => tracing::warn!(%error, "renewing the leases failed"),
                Err(error) => tracing::error!(%error, "a lease renewal was lost"),
            },
        }
        if Instant::now() >= next_renewal && renewals.len() < RENEWALS_IN_FLIGHT {
            let queue = ctx.queue.clone();
            renewals.spawn_blocking(move || queue.backend().renew_leases());
            next_renewal = Instant::now() + every;
        }
    }
}

/// Stop the commands of every task whose lease may run out within `margin` without a renewal
/// having confirmed it (once per task); returns when the next one would be due.
fn stop_unconfirmed(
    ctx: &RunContext,
    margin: Duration,
    stopped: &mut HashSet<String>,
) -> Option<Instant> {
    let now = Instant::now();
    let mut next = None::<Instant>;
    let deadlines = ctx.queue.backend().lease_deadlines();
    stopped.retain(|task_id| deadlines.iter().any(|(held, _)| held == task_id));
    for (task_id, until) in deadlines {
        let stop_at = until.checked_sub(margin).unwrap_or(now);
        if stop_at > now {
            next = Some(next.map_or(stop_at, |next| next.min(stop_at)));
        } else if stopped.insert(task_id.clone()) {
            tracing::warn!(%task_id, "no renewal confirmed the task's lease in time: stopping its commands before the lease can expire");
            ctx.lose_lease(&task_id);
        }
    }
    next
}
