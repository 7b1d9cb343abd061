//! The main loop: start what can start, react to task ends, inbox hints, control requests and
//! timers; and the drain after a stop.

use std::time::Instant;

use super::control::fresh_entry;
use super::fair_share::next_submitter;
use super::start_order::{next_to_start, Line, StartFacts};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use futures::FutureExt;
use tokio::sync::mpsc;

use super::{records, runner_blocking, AttemptOutcome, DaemonExit, Scheduler};
use crate::limits::SubmitterKey;
use crate::queue::{QueueHint, QueueWatcher};
use crate::runner::{self, AttemptEnd};
use crate::store::current_work::ActiveStatus;
use crate::store::events::Event;
use crate::task::Task;
use crate::task_id::TaskId;

/// How often the progress of running tasks is written to `current_work.json`.
const PROGRESS_WRITE_INTERVAL: Duration = Duration::from_secs(2);

/// Files taken per inbox scan: a large drop is taken in batches, and the first tasks start
/// while the rest are read.
const INTAKE_BATCH: usize = 256;

/// The inbox scan under way, if any (pending forever otherwise, for `select!`).
async fn wait_for_scan(
    scan: &mut Option<tokio::task::JoinHandle<crate::queue::IntakeReport>>,
) -> Result<crate::queue::IntakeReport, tokio::task::JoinError> {
    match scan {
        Some(handle) => handle.await,
        None => std::future::pending().await,
    }
}

/// The next wake-up of a shared queue (pending forever without one).
async fn next_notice(notices: &mut Option<mpsc::UnboundedReceiver<()>>) -> Option<()> {
    match notices {
        Some(notices) => notices.recv().await,
        None => std::future::pending().await,
    }
}

/// What the main loop keeps between its rounds.
struct MainLoop {
    /// `None` when the queue cannot be watched: periodic scans then find everything.
    watcher: Option<QueueWatcher>,
    hints: mpsc::UnboundedReceiver<QueueHint>,
    last_inbox_scan: Instant,
    last_progress_write: Instant,
    /// A shared queue's wake-ups: work may have arrived (`None` with files).
    work_notices: Option<mpsc::UnboundedReceiver<()>>,
}

/// What woke the main loop.
enum Wake {
    Stop,
    /// A notification from the queue's watcher (`None`: the watcher is gone).
    Hint(Option<QueueHint>),
    Scanned(Result<crate::queue::IntakeReport, tokio::task::JoinError>),
    Tick,
    AttemptEnded(Result<(TaskId, AttemptOutcome), tokio::task::JoinError>),
    /// A suspect showed progress: its trial is over, the next may start at once.
    TrialProgress,
    /// Work may have arrived in a shared queue (`false`: its notices ended).
    WorkNotice(bool),
    /// A claim of work from a shared queue returned.
    Claimed(
        Result<
            Result<super::shared_queue::Claimed, crate::queue::QueueError>,
            tokio::task::JoinError,
        >,
    ),
}

impl Scheduler {
    /// The main loop: start what can start, then wait for a task to end, an inbox hint, a timer
    /// or a stop, and react to it.
    pub(super) async fn work_until_stopped(&mut self) -> DaemonExit {
        let mut main = self.watch_queue();
        self.first_look().await;
        while !self.ctx.shutdown.is_stopping() {
            self.start_what_can_start();
            if self.idle_for_good().await {
                return DaemonExit::Idle;
            }
            self.report_status();
            match self.next_wake(&mut main).await {
                Wake::Stop => break,
                wake => self.react(wake, &mut main).await,
            }
            self.let_go_of_unknown_leases();
            self.write_progress_if_due(&mut main).await;
        }
        DaemonExit::Stopped
    }

    /// Watch for submissions and control requests, so that a new task or request is seen at once rather than
    /// at the next periodic scan.
    fn watch_queue(&self) -> MainLoop {
        let (watcher, hints) = match self.ctx.queue.watch() {
            Ok((watcher, hints)) => (Some(watcher), hints),
            Err(e) => {
                tracing::warn!("cannot watch the queue ({e}); relying on periodic scans");
                (None, mpsc::unbounded_channel().1)
            }
        };
        MainLoop {
            watcher,
            hints,
            last_inbox_scan: Instant::now(),
            last_progress_write: Instant::now(),
            work_notices: self.ctx.queue.backend().work_notices(),
        }
    }

    /// Read the inbox while the tasks that were in flight start, and apply the requests that
    /// waited for this daemon before anything starts.
    async fn first_look(&mut self) {
        self.start_scan();
        self.process_control().await;
    }

    /// Fill the free slots: retries whose backoff is over rejoin the line first.
    fn start_what_can_start(&mut self) {
        self.promote_due_retries();
        self.start_ready();
        self.claim_if_due(false);
    }

    /// With `exit_when_idle`: whether nothing is left to do, after a last look at the inbox and
    /// `control/` so that nothing that arrived unseen is left behind.
    async fn idle_for_good(&mut self) -> bool {
        if !(self.config.exit_when_idle && self.is_idle()) {
            return false;
        }
        self.scan_inbox().await;
        self.process_control().await;
        self.start_ready();
        self.is_idle()
    }

    /// Tell systemd how things stand (and feed its watchdog).
    fn report_status(&mut self) {
        let status = self.notifier.status_due().then(|| self.status_line());
        self.notifier.tick(status);
        if let Some(observer) = &self.ctx.observer {
            observer.turned();
            if observer.counts_due() {
                observer.publish(self.state_counts());
            }
        }
    }

    /// The tasks this daemon holds by state, for the metrics (`cairn_tasks`).
    fn state_counts(&self) -> crate::observe::StateCounts {
        let mut counts = crate::observe::StateCounts {
            pending: self.pending.len(),
            leases_held: self
                .ctx
                .queue
                .backend()
                .shares_queue()
                .then(|| self.running_ids.len() + self.claimed_leases.len()),
            ..Default::default()
        };
        self.ctx.work.update(|work| {
            for entry in work.iter() {
                match entry.status {
                    ActiveStatus::Running => counts.running += 1,
                    ActiveStatus::Paused => counts.paused += 1,
                    ActiveStatus::WaitingRetry => counts.waiting_retry += 1,
                    ActiveStatus::Interrupted => counts.interrupted += 1,
                }
            }
        });
        counts
    }

    /// Sleep until something needs the scheduler, at most until the next tick.
    async fn next_wake(&mut self, main: &mut MainLoop) -> Wake {
        let tick = self.next_tick();
        tokio::select! {
            _ = self.ctx.shutdown.stopped() => Wake::Stop,
            hint = main.hints.recv(), if main.watcher.is_some() => Wake::Hint(hint),
            scanned = wait_for_scan(&mut self.scan) => Wake::Scanned(scanned),
            _ = tokio::time::sleep(tick) => Wake::Tick,
            Some(joined) = self.running.join_next(), if !self.running.is_empty() => {
                Wake::AttemptEnded(joined)
            }
            _ = self.ctx.trial_progress.notified(), if !self.on_trial.is_empty() => {
                Wake::TrialProgress
            }
            claimed = self.claiming.finished(), if self.claiming.is_running() => {
                Wake::Claimed(claimed)
            }
            notice = next_notice(&mut main.work_notices) => Wake::WorkNotice(notice.is_some()),
        }
    }

    /// Do what the wake calls for; the next round starts whatever it made startable.
    async fn react(&mut self, wake: Wake, main: &mut MainLoop) {
        match wake {
            Wake::Stop | Wake::TrialProgress => {}
            Wake::Hint(hint) => self.take_hints(hint, main).await,
            Wake::Scanned(scanned) => {
                self.scan = None;
                self.scan_finished(scanned);
                if self.control_deferred {
                    self.process_control().await;
                }
            }
            Wake::Tick => {
                if self.inbox_deferred
                    || main.last_inbox_scan.elapsed() >= self.config.rescan_interval
                {
                    self.start_scan();
                    main.last_inbox_scan = Instant::now();
                }
                self.process_control().await;
            }
            Wake::AttemptEnded(joined) => self.attempt_finished(joined).await,
            Wake::Claimed(claimed) => self.take_claimed(claimed).await,
            Wake::WorkNotice(true) => {
                if let Some(notices) = &mut main.work_notices {
                    while notices.try_recv().is_ok() {}
                }
                self.claim_if_due(true);
            }
            // Polling finds the work from now on.
            Wake::WorkNotice(false) => main.work_notices = None,
        }
    }

    /// Take every hint that is waiting: inbox hints go to the next scan (the intake is locked
    /// while a scan runs, and this thread must not wait for it), a control hint reads
    /// `control/` now.
    async fn take_hints(&mut self, first: Option<QueueHint>, main: &mut MainLoop) {
        let (mut inbox, mut control) = (false, false);
        let mut take = |hint: QueueHint| match hint {
            QueueHint::Control => control = true,
            QueueHint::InboxChanged => inbox = true,
            hint @ (QueueHint::InboxComplete(_) | QueueHint::InboxWriting(_)) => {
                self.intake_hints.push(hint);
                inbox = true;
            }
        };
        if let Some(hint) = first {
            take(hint);
        }
        while let Ok(hint) = main.hints.try_recv() {
            take(hint);
        }
        if inbox {
            self.start_scan();
            main.last_inbox_scan = Instant::now();
        }
        if control {
            self.process_control().await;
        }
    }

    /// Progress (iterations, cost, a worker's own account) reaches `current_work.json` at most
    /// every [`PROGRESS_WRITE_INTERVAL`], for `cairn status`.
    async fn write_progress_if_due(&mut self, main: &mut MainLoop) {
        if !self.running.is_empty() && main.last_progress_write.elapsed() >= PROGRESS_WRITE_INTERVAL
        {
            main.last_progress_write = Instant::now();
            self.persist().await;
        }
    }

    /// How long to sleep when nothing happens: control requests are looked at at least every
    /// second (in case a notification is lost), the inbox every `rescan_interval`.
    pub(super) fn next_tick(&self) -> Duration {
        let mut tick = if self.inbox_deferred {
            // After failed scans, no sooner than the pause allows (still every second at
            // least, for control requests).
            self.intake_retry
                .wait()
                .max(Duration::from_millis(250))
                .min(Duration::from_secs(1))
        } else {
            self.config.rescan_interval.min(Duration::from_secs(1))
        };
        if !self.running.is_empty() {
            tick = tick.min(PROGRESS_WRITE_INTERVAL);
        }
        if let Some(next) = self.retries.iter().map(|(at, _)| *at).min() {
            let until = (next - Utc::now()).to_std().unwrap_or(Duration::ZERO);
            tick = tick.min(until.max(Duration::from_millis(10)));
        }
        if let Some(watchdog) = self.notifier.max_sleep() {
            tick = tick.min(watchdog);
        }
        if let Some(claim) = self.claim_tick() {
            tick = tick.min(claim);
        }
        tick
    }

    /// The one-line summary systemd shows as the service's status.
    pub(super) fn status_line(&self) -> String {
        // Runs on every turn of the main loop: count under the lock, clone nothing.
        let (paused, iterations) = self.ctx.work.update(|work| {
            let paused = work
                .iter()
                .filter(|t| t.status == ActiveStatus::Paused)
                .count();
            let iterations: u64 = work.iter().map(|t| t.iterations).sum();
            (paused, iterations)
        });
        let line = format!(
            "running {}, pending {}, waiting retry {}, paused {}; {} iterations done in flight, {} tasks finished since start",
            self.running_ids.len(),
            self.pending.len() + self.resume.len() + self.suspects.len(),
            self.retries.len(),
            paused,
            iterations,
            self.finished
        );
        // A shared queue's link that eats a large share of the lease is the daemon's state
        // too, not only a log line.
        match self.ctx.queue.backend().latency_warning() {
            Some(warning) => format!("{line}; {warning}"),
            None => line,
        }
    }

    pub(super) fn is_idle(&self) -> bool {
        self.running.is_empty()
            && self.resume.is_empty()
            && self.suspects.is_empty()
            && self.pending.is_empty()
            && self.retries.is_empty()
            && !self.inbox_deferred
            && self.scan.is_none()
            && !self.scan_again
            && (!self.ctx.queue.backend().shares_queue() || self.claiming.is_idle())
    }

    /// Start a scan of the inbox on the blocking pool, handing it the hints gathered since the
    /// last one; if one is running, another follows it. After failed scans, none starts before
    /// the pause is over (the timer then starts it).
    pub(super) fn start_scan(&mut self) {
        if self.scan.is_some() {
            self.scan_again = true;
            return;
        }
        if self.intake_retry.wait() > Duration::ZERO {
            self.inbox_deferred = true;
            return;
        }
        self.scan_again = false;
        let hints = std::mem::take(&mut self.intake_hints);
        let queue = self.ctx.queue.clone();
        self.scan = Some(tokio::task::spawn_blocking(move || {
            queue.backend().scan_intake(hints, INTAKE_BATCH)
        }));
    }

    /// Take in what a scan accepted, even if it then stopped on an error (the tasks are on disk
    /// and must run now, not after a restart); scan again if it left files or hints arrived
    /// meanwhile, or after a pause if it failed.
    pub(super) fn scan_finished(
        &mut self,
        scanned: Result<crate::queue::IntakeReport, tokio::task::JoinError>,
    ) {
        let report = match scanned {
            Ok(report) => report,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => crate::queue::IntakeReport {
                error: Some(std::io::Error::other(e)),
                ..Default::default()
            },
        };
        for task in report.accepted {
            let priority = task.priority;
            let submitted_by = task.submitted_by.clone();
            self.ctx.journal(
                task.id(),
                Event::Accepted {
                    priority,
                    submitted_by,
                },
            );
            self.add_pending(task);
        }
        for rejection in report.rejected {
            if let Some(observer) = &self.ctx.observer {
                observer.rejected(&rejection.error);
            }
            self.summary.rejected.add(rejection.record_name());
        }
        if let Some(error) = report.error {
            self.intake_retry.failed(&error);
            self.inbox_deferred = true;
            return;
        }
        self.intake_retry.succeeded();
        // A batch that stopped early has not looked at every file; the next one will.
        if !report.more {
            self.inbox_deferred = report.deferred > 0;
        }
        if report.more || self.scan_again {
            self.start_scan();
        }
    }

    /// Scan the inbox until every complete file is taken (waiting for a scan under way).
    pub(super) async fn scan_inbox(&mut self) {
        loop {
            if self.scan.is_none() {
                self.start_scan();
            }
            if self.scan.is_none() {
                // Pausing after failed scans: the timer starts the next one.
                return;
            }
            let scanned = wait_for_scan(&mut self.scan).await;
            self.scan = None;
            // Anything this scan leaves (a full batch, hints meanwhile) starts the next one.
            self.scan_finished(scanned);
            if self.scan.is_none() {
                return;
            }
        }
    }

    pub(super) fn promote_due_retries(&mut self) {
        let now = Utc::now();
        let (due, waiting): (Vec<_>, Vec<_>) =
            self.retries.drain(..).partition(|(at, _)| *at <= now);
        self.retries = waiting;
        for (_, id) in due {
            self.resume.push_back(id);
        }
    }

    /// Start attempts while a slot is free and a task waits, in the order [`next_to_start`]
    /// gives; among new tasks, whose goes first is [`next_submitter`]'s choice. A task whose
    /// submitter has as many attempts running as `--max-running-per-submitter` allows waits
    /// (crash suspects excepted: they are tried one at a time, before anything else).
    pub(super) fn start_ready(&mut self) {
        // Looked up once per call, not per start: thousands of suspects may be on trial. A trial
        // that ends meanwhile is seen at the next call (its progress wakes the main loop).
        self.prune_trials();
        loop {
            let resume_at = self.startable_resume();
            let pending_of = self.startable_pending();
            let Some(line) =
                next_to_start(self.start_facts(resume_at.is_some(), pending_of.is_some()))
            else {
                break;
            };
            let next = match line {
                Line::Suspects => self.suspects.pop_front(),
                Line::Resume => resume_at.and_then(|at| self.resume.remove(at)),
                Line::Pending => pending_of.and_then(|key| self.pending.pop_of(key)),
            };
            let Some(id) = next else {
                break;
            };
            let Some(task) = self.tasks.get(&id).cloned() else {
                continue;
            };
            if line == Line::Suspects {
                tracing::info!(task_id = %id, width = self.trial_width, "trying a crash suspect");
                let width = self.trial_width;
                self.ctx.journal(&id, Event::CrashTrialStarted { width });
                self.on_trial.insert(id);
            }
            self.start_attempt(task);
        }
    }

    /// The submitter of a task this daemon holds ("unknown" for one it does not).
    fn submitter_key_of(&self, id: &str) -> SubmitterKey {
        self.tasks
            .get(id)
            .map_or(SubmitterKey::Unknown, |task| SubmitterKey::of_task(task))
    }

    /// Where the first task of the resume line is whose submitter may run one more attempt.
    /// The line is short (tasks that were in flight, retries now due), and without a limit
    /// its first task is taken at once.
    fn startable_resume(&self) -> Option<usize> {
        let limits = self.config.submitter_limits;
        if limits.max_running.is_none() {
            return (!self.resume.is_empty()).then_some(0);
        }
        self.resume
            .iter()
            .position(|id| limits.may_run(self.running_by.of(self.submitter_key_of(id))))
    }

    /// The submitter whose first new task starts next, if one may start.
    fn startable_pending(&self) -> Option<SubmitterKey> {
        let running = |key| self.running_by.of(key);
        next_submitter(self.pending.waiting(running), &self.config.submitter_limits)
    }

    /// What [`next_to_start`] decides from; `resume` and `pending` say whether those lines
    /// hold a task that may start.
    fn start_facts(&self, resume: bool, pending: bool) -> StartFacts {
        StartFacts {
            running: self.running.len(),
            max_tasks: self.config.max_tasks,
            stopping: self.ctx.shutdown.is_stopping(),
            suspects: self.suspects.len(),
            on_trial: self.on_trial.len(),
            trial_width: self.trial_width,
            resume,
            pending,
        }
    }

    /// Forget the trials that are over: a trial ends early when the suspect makes progress
    /// (its runner clears the flag).
    pub(super) fn prune_trials(&mut self) {
        if !self.on_trial.is_empty() {
            let on_trial = &mut self.on_trial;
            self.ctx
                .work
                .update(|w| on_trial.retain(|id| w.get(id).is_some_and(|e| e.suspect)));
        }
    }

    pub(super) fn start_attempt(&mut self, task: Arc<Task>) {
        let id = task.id().clone();
        let fresh = self.ctx.work.update(|w| w.get(&id).is_none());
        // Requests meant for an earlier attempt do not carry over.
        self.ctx.drop_control(&id);
        self.running_ids.insert(id.clone());
        self.running_by.started(&id, SubmitterKey::of_task(&task));
        if let Some(observer) = &self.ctx.observer {
            observer.know_submitter(&id, task.submitted_by.as_ref());
        }
        let ctx = Arc::clone(&self.ctx);
        // A shared queue's claim already leased the task: its first attempt runs under that.
        let claimed = self
            .claimed_leases
            .remove(&id)
            .filter(|_| ctx.queue.backend().holds(&id));
        self.running.spawn(async move {
            // The task's lease: every write of this attempt is fenced by it.
            let (queue, claim_id) = (ctx.queue.clone(), id.clone());
            let claim = move || match claimed {
                Some(lease) => Ok(lease),
                None => queue.backend().claim(&claim_id),
            };
            let lease = match runner_blocking(claim).await {
                Ok(lease) => lease,
                Err(e) => {
                    let end = AttemptEnd::Failed {
                        error: format!("cannot claim the task: {e}"),
                        counts: false,
                    };
                    return (id, AttemptOutcome::Ended(end));
                }
            };
            if fresh {
                // Where a new task starts (a fork's start point) is read off the async thread.
                // Its entry exists only from then on, so no write of current_work.json can
                // record it at the wrong phase.
                let (read_ctx, read_task) = (Arc::clone(&ctx), Arc::clone(&task));
                let entry = runner_blocking(move || fresh_entry(&read_ctx, &read_task)).await;
                ctx.work.update(|w| w.upsert(entry));
            }
            let (attempt, phase) = ctx
                .work
                .update(|w| {
                    w.get_mut(&id).map(|entry| {
                        entry.attempt += 1;
                        entry.status = ActiveStatus::Running;
                        entry.attempt_started_phase = entry.phase_index;
                        entry.no_iteration_started = true;
                        entry.next_attempt_at = None;
                        (entry.attempt, entry.phase.clone())
                    })
                })
                .unwrap_or_default();
            ctx.journal(&id, Event::AttemptStarted { attempt, phase });
            // The attempt is on record before any command runs, so a crash is accounted for.
            if let Err(e) = ctx.work.persist().await {
                let end = AttemptEnd::Failed {
                    error: format!("cannot record the attempt: {e}"),
                    counts: false,
                };
                return (id, AttemptOutcome::Ended(end));
            }
            let end = std::panic::AssertUnwindSafe(runner::run_attempt(&ctx, &task, &lease))
                .catch_unwind()
                .await
                .unwrap_or_else(|_| AttemptEnd::Failed {
                    error: "internal error: the task runner panicked".into(),
                    counts: true,
                });
            // A finished task is recorded here, off the main loop: its writes then overlap
            // with other tasks' work instead of holding up the whole scheduler.
            let outcome = match end {
                AttemptEnd::Done => match records::record_done(&ctx, &task, &lease).await {
                    Ok(entry) => AttemptOutcome::Recorded(Box::new(entry)),
                    Err(error) => AttemptOutcome::RecordFailed(error.to_string()),
                },
                other => AttemptOutcome::Ended(other),
            };
            (id, outcome)
        });
    }

    /// After a stop: give running commands the grace to finish their iteration, then terminate
    /// them; record every task's state and write `current_work.json` one last time.
    pub(super) async fn drain(&mut self) {
        if !self.running.is_empty() {
            tracing::info!(
                running = self.running.len(),
                grace = %humantime::format_duration(self.config.stop_grace),
                "stopping: letting commands in flight finish their iteration"
            );
        }
        self.notifier
            .stopping(self.config.stop_grace + crate::runner::KILL_AFTER + Duration::from_secs(10));
        let how = if self.ctx.shutdown.is_immediate() {
            "at once (second signal)"
        } else {
            "after the iteration in flight"
        };
        for id in &self.running_ids {
            self.ctx.journal(
                id,
                Event::StopRequested {
                    by: "daemon shutdown (SIGINT/SIGTERM or the embedding program)".into(),
                    stops: how.into(),
                },
            );
        }
        let grace = tokio::time::sleep(self.config.stop_grace);
        tokio::pin!(grace);
        let mut terminating = false;
        while !self.running.is_empty() {
            self.report_status();
            tokio::select! {
                Some(joined) = self.running.join_next() => self.attempt_finished(joined).await,
                _ = tokio::time::sleep(self.notifier.max_sleep().unwrap_or(Duration::from_secs(1))) => {}
                _ = &mut grace, if !terminating => {
                    terminating = true;
                    if !self.ctx.shutdown.is_immediate() {
                        tracing::warn!("stop grace is over: terminating the commands still running");
                    }
                    self.ctx.shutdown.request_terminate();
                }
            }
        }
        if let Err(e) = self.ctx.work.persist().await {
            tracing::error!("{e}");
        }
    }
}
