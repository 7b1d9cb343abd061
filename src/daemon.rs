//! The daemon: lock the queue, recover what was in flight, take tasks from the inbox, run them,
//! and on a stop flush everything and return.
//!
//! [`run`] takes its stop signal as a [`Shutdown`] handle, so an embedding program or a test can
//! stop it without sending signals; the `cairn run` command wires SIGINT/SIGTERM to it.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::FutureExt;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::queue::{InboxHint, InboxWatcher, Intake, LockError, QueueDir, QueueLock};
use crate::runner::{self, AttemptEnd, RunContext, WorkState};
use crate::shutdown::Shutdown;
use crate::store::current_work::{ActiveStatus, ActiveTask};
use crate::store::records::{to_record_bytes, DoneRecord, FailedRecord};
use crate::store::{CheckpointStore, FileStorage, Storage};
use crate::task::Task;

/// How the daemon runs.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    pub queue_dir: PathBuf,
    /// Return once nothing is pending, running or waiting for a retry.
    pub exit_when_idle: bool,
    /// How long commands in flight may take to finish their iteration after a stop.
    pub stop_grace: Duration,
    /// Tasks run at once.
    pub max_tasks: usize,
    /// The slow re-scan of the inbox, in case a notification was lost.
    pub rescan_interval: Duration,
    /// The storage backend; `None` is the file backend on `queue_dir`. Tests pass a
    /// fault-injecting one.
    pub storage: Option<Arc<dyn Storage>>,
}

impl DaemonConfig {
    pub fn new(queue_dir: impl Into<PathBuf>) -> Self {
        DaemonConfig {
            queue_dir: queue_dir.into(),
            exit_when_idle: false,
            stop_grace: Duration::from_secs(30),
            max_tasks: 4,
            rescan_interval: Duration::from_secs(5),
            storage: None,
        }
    }
}

/// Why the daemon returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DaemonExit {
    /// `exit_when_idle` and the queue is drained.
    Idle,
    /// A stop request, with every task flushed.
    Stopped,
    /// A second stop request cut the grace short; committed work was flushed.
    StoppedImmediately,
}

/// Why the daemon could not run.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error("{0}")]
    Setup(String),
}

/// Run the daemon on a queue until it is stopped (or idle, with `exit_when_idle`).
pub async fn run(config: DaemonConfig, shutdown: Shutdown) -> Result<DaemonExit, DaemonError> {
    let root = std::path::absolute(&config.queue_dir)
        .map_err(|e| DaemonError::Setup(format!("queue {}: {e}", config.queue_dir.display())))?;
    let queue = QueueDir::new(&root);
    queue
        .create_all()
        .map_err(|e| DaemonError::Setup(e.to_string()))?;
    let _lock = QueueLock::acquire(&queue)?;
    tracing::info!(queue = %root.display(), pid = std::process::id(), "cairn daemon started");

    let storage: Arc<dyn Storage> = match &config.storage {
        Some(storage) => Arc::clone(storage),
        None => Arc::new(FileStorage::new(&root)),
    };
    match storage.remove_temp_files() {
        Ok(removed) if !removed.is_empty() => {
            tracing::info!(
                count = removed.len(),
                "removed temp files left by an earlier crash"
            )
        }
        Ok(_) => {}
        Err(e) => return Err(DaemonError::Setup(format!("cleaning temp files: {e}"))),
    }
    let work = match WorkState::load(Arc::clone(&storage)) {
        Ok(work) => work,
        Err(e) => {
            return Err(DaemonError::Setup(format!(
                "{e}; move {} aside to start without it (tasks then restart their phases, their loop checkpoints are kept)",
                queue.display_key(QueueDir::CURRENT_WORK_KEY)
            )))
        }
    };
    let ctx = Arc::new(RunContext {
        queue: queue.clone(),
        checkpoints: CheckpointStore::with_storage(Arc::clone(&storage)),
        storage: Arc::clone(&storage),
        work: Arc::new(work),
        shutdown: shutdown.clone(),
    });
    let mut scheduler = Scheduler {
        intake: Arc::new(Mutex::new(Intake::new(queue.clone(), Arc::clone(&storage)))),
        ctx,
        config,
        tasks: HashMap::new(),
        resume: VecDeque::new(),
        pending: BinaryHeap::new(),
        next_seq: 0,
        retries: Vec::new(),
        running: JoinSet::new(),
        inbox_deferred: false,
    };
    scheduler.recover().await?;
    let exit = scheduler.work_until_stopped().await;
    scheduler.drain().await;
    tracing::info!("cairn daemon stopped");
    Ok(if shutdown.is_immediate() {
        DaemonExit::StoppedImmediately
    } else {
        exit
    })
}

struct Scheduler {
    ctx: Arc<RunContext>,
    config: DaemonConfig,
    intake: Arc<Mutex<Intake>>,
    /// Definitions of the tasks this daemon knows to be unfinished.
    tasks: HashMap<String, Arc<Task>>,
    /// Tasks that were in flight: they go before new ones.
    resume: VecDeque<String>,
    /// New tasks: highest priority first, then in order of acceptance.
    pending: BinaryHeap<(i32, Reverse<u64>, String)>,
    next_seq: u64,
    /// Tasks waiting for their backoff to pass.
    retries: Vec<(DateTime<Utc>, String)>,
    running: JoinSet<(String, AttemptEnd)>,
    /// The last scan left files in the inbox that may still be being written.
    inbox_deferred: bool,
}

impl Scheduler {
    /// Finish half-done intake, then line up every task that was in flight and every accepted
    /// task that has not started, in that order.
    async fn recover(&mut self) -> Result<(), DaemonError> {
        let intake = Arc::clone(&self.intake);
        let recovered = runner_blocking(move || lock(&intake).recover_claims()).await;
        if let Err(e) = recovered {
            tracing::error!("finishing interrupted intake: {e}");
        }

        let entries = self.ctx.work.snapshot().active_tasks;
        for entry in entries {
            self.recover_entry(entry).await;
        }
        self.load_pending().await?;
        if let Err(e) = self.ctx.work.persist().await {
            // Not fatal: every later change writes the whole file again.
            tracing::error!("{e}");
        }
        tracing::info!(
            resumed = self.resume.len(),
            waiting_retry = self.retries.len(),
            pending = self.pending.len(),
            "recovered the queue"
        );
        Ok(())
    }

    async fn recover_entry(&mut self, mut entry: ActiveTask) {
        let id = entry.task_id.clone();
        if self.has_record(&id).await {
            // Finished, but the daemon died before it removed the entry.
            self.ctx.work.update(|w| w.remove(&id));
            return;
        }
        let task = match self.read_task(&id).await {
            Ok(task) => Arc::new(task),
            Err(error) => {
                tracing::error!(task_id = %id, "cannot resume: {error}");
                let task = Task {
                    id: Some(id.clone()),
                    priority: 0,
                    cwd: None,
                    env: Default::default(),
                    retry: Default::default(),
                    budget: None,
                    phases: Vec::new(),
                    meta: None,
                };
                self.give_up(&Arc::new(task), entry, error).await;
                return;
            }
        };
        match entry.status {
            ActiveStatus::Running => {
                // The daemon died during this attempt. It counts as a failed attempt only if it
                // made no progress, so a task that keeps crashing the daemon ends in failed/
                // while a long task interrupted by power cuts keeps going.
                let progressed = self.attempt_progressed(&entry).await;
                self.ctx.journal(
                    &id,
                    "resumed_after_crash",
                    serde_json::json!({"attempt": entry.attempt, "phase": entry.phase, "counts_as_failure": !progressed}),
                );
                if !progressed {
                    entry.failed_attempts += 1;
                    entry.last_error = Some(format!(
                        "the daemon stopped unexpectedly during attempt {} without a checkpoint",
                        entry.attempt
                    ));
                }
                if entry.failed_attempts >= task.retry.max_attempts {
                    let error = entry.last_error.clone().unwrap_or_default();
                    self.give_up(&task, entry, error).await;
                    return;
                }
                tracing::info!(task_id = %id, phase = %entry.phase, "resuming after a crash");
                entry.status = ActiveStatus::Interrupted;
                self.resume.push_back(id.clone());
            }
            ActiveStatus::Interrupted | ActiveStatus::Paused => {
                entry.status = ActiveStatus::Interrupted;
                self.resume.push_back(id.clone());
            }
            ActiveStatus::WaitingRetry => {
                let at = entry.next_attempt_at.unwrap_or_else(Utc::now);
                self.retries.push((at, id.clone()));
            }
        }
        self.ctx.work.update(|w| w.upsert(entry));
        self.tasks.insert(id, task);
    }

    /// Did the attempt recorded in `entry` finish a phase or write a checkpoint?
    async fn attempt_progressed(&self, entry: &ActiveTask) -> bool {
        if entry.phase_index > entry.attempt_started_phase {
            return true;
        }
        let checkpoints = self.ctx.checkpoints.clone();
        let id = entry.task_id.clone();
        match runner_blocking(move || checkpoints.latest(&id)).await {
            Ok(Some(loaded)) => {
                loaded.checkpoint.attempt == entry.attempt
                    && loaded.checkpoint.phase_index == entry.phase_index
            }
            _ => false,
        }
    }

    /// Accepted tasks that never started (not in current_work and without a record).
    async fn load_pending(&mut self) -> Result<(), DaemonError> {
        let storage = Arc::clone(&self.ctx.storage);
        let names = runner_blocking(move || storage.list("tasks"))
            .await
            .map_err(|e| DaemonError::Setup(format!("listing tasks/: {e}")))?;
        let mut found = Vec::new();
        for name in names {
            let Some(id) = name.strip_suffix(".json") else {
                continue;
            };
            if self.tasks.contains_key(id) || self.has_record(id).await {
                continue;
            }
            match self.read_task(id).await {
                Ok(task) => {
                    let accepted = std::fs::metadata(self.ctx.queue.tasks().join(&name))
                        .and_then(|m| m.modified())
                        .ok();
                    found.push((accepted, task));
                }
                Err(error) => tracing::error!(task_id = id, "skipping task: {error}"),
            }
        }
        found.sort_by_key(|(accepted, _)| *accepted);
        for (_, task) in found {
            self.add_pending(task);
        }
        Ok(())
    }

    fn add_pending(&mut self, task: Task) {
        let id = task.id().to_string();
        self.pending
            .push((task.priority, Reverse(self.next_seq), id.clone()));
        self.next_seq += 1;
        self.tasks.insert(id, Arc::new(task));
    }

    async fn has_record(&self, id: &str) -> bool {
        let storage = Arc::clone(&self.ctx.storage);
        let (done, failed) = (QueueDir::done_key(id), QueueDir::failed_key(id));
        runner_blocking(move || {
            matches!(storage.get(&done), Ok(Some(_))) || matches!(storage.get(&failed), Ok(Some(_)))
        })
        .await
    }

    async fn read_task(&self, id: &str) -> Result<Task, String> {
        let storage = Arc::clone(&self.ctx.storage);
        let key = QueueDir::task_key(id);
        let get_key = key.clone();
        let bytes = runner_blocking(move || storage.get(&get_key))
            .await
            .map_err(|e| format!("reading {key}: {e}"))?
            .ok_or_else(|| format!("its definition {key} is missing"))?;
        let mut task = Task::parse(&bytes).map_err(|e| format!("{key}: {e}"))?;
        task.id = Some(id.to_string());
        Ok(task)
    }

    /// The main loop: start what can start, then wait for a task to end, an inbox hint, a timer
    /// or a stop.
    async fn work_until_stopped(&mut self) -> DaemonExit {
        let (watcher, mut hints) = match InboxWatcher::start(&self.ctx.queue.inbox()) {
            Ok((watcher, hints)) => (Some(watcher), hints),
            Err(e) => {
                tracing::warn!("cannot watch the inbox ({e}); relying on periodic scans");
                (None, mpsc::unbounded_channel().1)
            }
        };
        self.scan_inbox().await;
        loop {
            if self.ctx.shutdown.is_stopping() {
                break;
            }
            self.promote_due_retries();
            self.start_ready();
            if self.config.exit_when_idle && self.is_idle() {
                // Make sure nothing arrived unseen before leaving.
                self.scan_inbox().await;
                self.start_ready();
                if self.is_idle() {
                    drop(watcher);
                    return DaemonExit::Idle;
                }
            }
            let tick = self.next_tick();
            tokio::select! {
                _ = self.ctx.shutdown.stopped() => break,
                hint = hints.recv(), if watcher.is_some() => {
                    self.take_hint(hint);
                    while let Ok(hint) = hints.try_recv() {
                        self.take_hint(Some(hint));
                    }
                    self.scan_inbox().await;
                }
                _ = tokio::time::sleep(tick) => self.scan_inbox().await,
                Some(joined) = self.running.join_next(), if !self.running.is_empty() => {
                    self.attempt_finished(joined).await;
                }
            }
        }
        drop(watcher);
        DaemonExit::Stopped
    }

    fn take_hint(&mut self, hint: Option<InboxHint>) {
        if let Some(InboxHint::Complete(name)) = hint {
            lock(&self.intake).hint_complete(name);
        }
    }

    fn next_tick(&self) -> Duration {
        let mut tick = if self.inbox_deferred {
            Duration::from_millis(250)
        } else {
            self.config.rescan_interval
        };
        if let Some(next) = self.retries.iter().map(|(at, _)| *at).min() {
            let until = (next - Utc::now()).to_std().unwrap_or(Duration::ZERO);
            tick = tick.min(until.max(Duration::from_millis(10)));
        }
        tick
    }

    fn is_idle(&self) -> bool {
        self.running.is_empty()
            && self.resume.is_empty()
            && self.pending.is_empty()
            && self.retries.is_empty()
            && !self.inbox_deferred
    }

    async fn scan_inbox(&mut self) {
        let intake = Arc::clone(&self.intake);
        match runner_blocking(move || lock(&intake).scan()).await {
            Ok(report) => {
                self.inbox_deferred = report.deferred > 0;
                for task in report.accepted {
                    self.ctx.journal(
                        task.id(),
                        "accepted",
                        serde_json::json!({"priority": task.priority}),
                    );
                    self.add_pending(task);
                }
            }
            Err(e) => {
                tracing::error!("scanning the inbox: {e}; trying again shortly");
                self.inbox_deferred = true;
            }
        }
    }

    fn promote_due_retries(&mut self) {
        let now = Utc::now();
        let (due, waiting): (Vec<_>, Vec<_>) =
            self.retries.drain(..).partition(|(at, _)| *at <= now);
        self.retries = waiting;
        for (_, id) in due {
            self.resume.push_back(id);
        }
    }

    fn start_ready(&mut self) {
        while self.running.len() < self.config.max_tasks.max(1) && !self.ctx.shutdown.is_stopping()
        {
            let next = match self.resume.pop_front() {
                Some(id) => id,
                None => match self.pending.pop() {
                    Some((_, _, id)) => id,
                    None => break,
                },
            };
            let Some(task) = self.tasks.get(&next).cloned() else {
                continue;
            };
            self.start_attempt(task);
        }
    }

    fn start_attempt(&mut self, task: Arc<Task>) {
        let id = task.id().to_string();
        let first_phase = task.phases.first().map(|p| p.name.as_str()).unwrap_or("");
        self.ctx.work.update(|w| {
            if w.get(&id).is_none() {
                w.upsert(ActiveTask::new(&id, first_phase));
            }
            if let Some(entry) = w.get_mut(&id) {
                entry.attempt += 1;
                entry.status = ActiveStatus::Running;
                entry.attempt_started_phase = entry.phase_index;
                entry.next_attempt_at = None;
            }
        });
        let (attempt, phase) = self
            .ctx
            .work
            .update(|w| w.get(&id).map(|e| (e.attempt, e.phase.clone())))
            .unwrap_or_default();
        self.ctx.journal(
            &id,
            "attempt_started",
            serde_json::json!({"attempt": attempt, "phase": phase}),
        );
        let ctx = Arc::clone(&self.ctx);
        self.running.spawn(async move {
            // The attempt is on record before any command runs, so a crash is accounted for.
            if let Err(e) = ctx.work.persist().await {
                let end = AttemptEnd::Failed {
                    error: format!("cannot record the attempt: {e}"),
                    counts: false,
                };
                return (id, end);
            }
            let end = std::panic::AssertUnwindSafe(runner::run_attempt(&ctx, &task))
                .catch_unwind()
                .await
                .unwrap_or_else(|_| AttemptEnd::Failed {
                    error: "internal error: the task runner panicked".into(),
                    counts: true,
                });
            (id, end)
        });
    }

    async fn attempt_finished(
        &mut self,
        joined: Result<(String, AttemptEnd), tokio::task::JoinError>,
    ) {
        let (id, end) = match joined {
            Ok(result) => result,
            Err(e) => {
                tracing::error!("a task runner was lost: {e}");
                return;
            }
        };
        let Some(task) = self.tasks.get(&id).cloned() else {
            return;
        };
        let Some(mut entry) = self.ctx.work.update(|w| w.get(&id).cloned()) else {
            return;
        };
        match end {
            AttemptEnd::Done => match self.write_done(&task, &entry).await {
                Ok(()) => {
                    tracing::info!(task_id = %id, attempts = entry.attempt, "task done");
                    self.ctx.journal(
                        &id,
                        "done",
                        serde_json::json!({"attempts": entry.attempt, "cost": entry.cost}),
                    );
                    self.ctx.work.update(|w| w.remove(&id));
                    self.tasks.remove(&id);
                }
                Err(error) => {
                    tracing::error!(task_id = %id, "{error}");
                    self.schedule_retry(&task, &mut entry, error, false);
                }
            },
            AttemptEnd::Interrupted => {
                entry.status = ActiveStatus::Interrupted;
                tracing::info!(task_id = %id, phase = %entry.phase, iterations = entry.iterations, "task interrupted");
                self.ctx.journal(
                    &id,
                    "interrupted",
                    serde_json::json!({"phase": entry.phase, "iterations": entry.iterations}),
                );
                self.ctx.work.update(|w| w.upsert(entry));
            }
            AttemptEnd::BudgetStopped { reason } => {
                self.record_failure(&task, entry, reason, "budget_exceeded")
                    .await;
                self.tasks.remove(&id);
            }
            AttemptEnd::Failed { error, counts } => {
                tracing::warn!(task_id = %id, attempt = entry.attempt, "attempt failed: {error}");
                self.ctx.journal(
                    &id,
                    "attempt_failed",
                    serde_json::json!({"attempt": entry.attempt, "error": error, "counts": counts}),
                );
                if counts {
                    entry.failed_attempts += 1;
                }
                if counts && entry.failed_attempts >= task.retry.max_attempts {
                    self.give_up(&task, entry, error).await;
                    self.tasks.remove(&id);
                } else {
                    self.schedule_retry(&task, &mut entry, error, true);
                }
            }
        }
        if let Err(e) = self.ctx.work.persist().await {
            tracing::error!("{e}");
        }
    }

    fn schedule_retry(&mut self, task: &Task, entry: &mut ActiveTask, error: String, log: bool) {
        let delay = task.retry.delay_after(entry.failed_attempts.max(1));
        let at = Utc::now() + chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::zero());
        if log {
            tracing::info!(task_id = %entry.task_id, "retrying in {}", humantime::format_duration(delay));
        }
        entry.status = ActiveStatus::WaitingRetry;
        entry.next_attempt_at = Some(at);
        entry.last_error = Some(error);
        self.retries.push((at, entry.task_id.clone()));
        let entry = entry.clone();
        self.ctx.work.update(|w| w.upsert(entry));
    }

    async fn write_done(&self, task: &Task, entry: &ActiveTask) -> Result<(), String> {
        let outputs = self.outputs_by_name(entry).await?;
        let result = task
            .phases
            .last()
            .and_then(|p| outputs.get(&p.name).cloned())
            .unwrap_or(Value::Null);
        let finished_at = Utc::now();
        let record = DoneRecord {
            status: "done".into(),
            task_id: entry.task_id.clone(),
            result,
            phase_outputs: outputs,
            attempts: entry.attempt,
            failed_attempts: entry.failed_attempts,
            started_at: entry.started_at,
            finished_at,
            duration_seconds: (finished_at - entry.started_at).num_milliseconds() as f64 / 1000.0,
            cost: entry.cost,
            phases: entry.phases.clone(),
        };
        self.put_record(QueueDir::done_key(&entry.task_id), to_record_bytes(&record))
            .await
    }

    /// The task has used up its attempts: record it in failed/ (its checkpoints stay).
    async fn give_up(&mut self, task: &Arc<Task>, entry: ActiveTask, error: String) {
        self.record_failure(task, entry, error, "failed").await
    }

    /// Write `failed/<id>.json` with `status` ("failed", "budget_exceeded") and drop the task
    /// from current_work.
    async fn record_failure(
        &mut self,
        task: &Arc<Task>,
        entry: ActiveTask,
        error: String,
        status: &str,
    ) {
        let id = entry.task_id.clone();
        tracing::error!(task_id = %id, attempts = entry.attempt, status, "task ended: {error}");
        let event = if status == "budget_exceeded" {
            "budget_stopped"
        } else {
            status
        };
        self.ctx.journal(
            &id,
            event,
            serde_json::json!({"error": error, "attempts": entry.attempt}),
        );
        let outputs = self.outputs_by_name(&entry).await.unwrap_or_default();
        let record = FailedRecord {
            status: status.into(),
            cost: entry.cost,
            task_id: id.clone(),
            error,
            phase: task
                .phases
                .get(entry.phase_index)
                .map(|p| p.name.clone())
                .unwrap_or_else(|| entry.phase.clone()),
            phase_index: entry.phase_index,
            attempts: entry.attempt,
            failed_attempts: entry.failed_attempts,
            started_at: entry.started_at,
            failed_at: Utc::now(),
            phase_outputs: outputs,
            phases: entry.phases.clone(),
        };
        match self
            .put_record(QueueDir::failed_key(&id), to_record_bytes(&record))
            .await
        {
            Ok(()) => {
                self.ctx.work.update(|w| w.remove(&id));
            }
            Err(e) => {
                // Keep the entry: the next start will try again to record the failure.
                tracing::error!(task_id = %id, "{e}");
            }
        }
    }

    async fn outputs_by_name(
        &self,
        entry: &ActiveTask,
    ) -> Result<std::collections::BTreeMap<String, Value>, String> {
        match runner::load_inputs(&self.ctx, &entry.phase_outputs).await? {
            Value::Object(map) => Ok(map.into_iter().collect()),
            _ => Ok(Default::default()),
        }
    }

    async fn put_record(&self, key: String, bytes: Vec<u8>) -> Result<(), String> {
        let storage = Arc::clone(&self.ctx.storage);
        let put_key = key.clone();
        runner_blocking(move || storage.put(&put_key, &bytes, None))
            .await
            .map_err(|e| format!("writing {key}: {e}"))
    }

    /// After a stop: give running commands the grace to finish their iteration, then terminate
    /// them; record every task's state and write `current_work.json` one last time.
    async fn drain(&mut self) {
        if !self.running.is_empty() {
            tracing::info!(
                running = self.running.len(),
                grace = %humantime::format_duration(self.config.stop_grace),
                "stopping: letting commands in flight finish their iteration"
            );
        }
        let grace = tokio::time::sleep(self.config.stop_grace);
        tokio::pin!(grace);
        let mut terminating = false;
        while !self.running.is_empty() {
            tokio::select! {
                Some(joined) = self.running.join_next() => self.attempt_finished(joined).await,
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

fn lock(intake: &Mutex<Intake>) -> std::sync::MutexGuard<'_, Intake> {
    intake
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Run blocking file work off the async thread; a panic there is re-raised here.
async fn runner_blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(work).await {
        Ok(value) => value,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}
