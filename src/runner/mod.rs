//! Running tasks: one attempt of a task, phase by phase, resuming from its checkpoints.
//!
//! The scheduler (the `daemon` module) decides which task runs when and what happens after an
//! attempt; this module runs the attempt itself. One file per phase kind; `child` runs commands.

pub mod channel;
pub mod checkpoint_quota;
mod checkpointing;
mod child;
mod confinement;
mod environment;
pub mod fd_limit;
pub mod identity;
mod items;
pub mod log_cap;
mod loop_phase;
mod once;
mod orphans;
mod spawn;
mod task_processes;
pub mod trampoline;
mod work_state;
mod worker;
mod worker_supervision;

pub use checkpoint_quota::CheckpointQuota;
pub use child::{spawn_in_group, Confinement};
pub use child::{CommandRun, RunEnd, KILL_AFTER, MAX_REPLY_BYTES};
pub use confinement::ConfineConfig;
pub use environment::{check_pass_names, daemon_env, PassEnvError, NOTIFY_ENV, PASSED_FROM_DAEMON};
/// The scope of loop phases' checkpoints, for programs that build such checkpoints themselves
/// (the binary's queue benchmark).
pub use loop_phase::LOOP_SCOPE;
pub use orphans::kill_orphans;
pub use spawn::{CommandProcess, Environment, InheritedEnv, StdinFrom, StdoutTo};
pub use task_processes::{CgroupRoot, TaskLimits, DEFAULT_PIDS_MAX};
pub use work_state::WorkState;

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::Arc;

use chrono::Utc;
use serde_json::{Map, Value};

use crate::queue::{Lease, Queue, QueueError};
use tokio_util::sync::CancellationToken;

use crate::shutdown::Shutdown;
use crate::store::current_work::{PhaseTiming, Progress, StoredOutput, INLINE_OUTPUT_LIMIT};
use crate::store::events::Event;
use crate::store::StoreError;
use crate::task::{Phase, PhaseKind, Task};

/// An operator's requests for one running task (`cairn pause` / `cairn cancel`).
#[derive(Debug, Clone, Default)]
pub struct TaskControl {
    /// Stop at the next iteration boundary, checkpointed, and stay paused.
    pub pause: CancellationToken,
    /// Stop now (commands get SIGTERM, then SIGKILL) and record the task cancelled.
    pub cancel: CancellationToken,
}

/// What every running task shares.
#[derive(Debug)]
pub struct RunContext {
    /// The queue's owner: every read and write of the queue goes through it. Its root is
    /// absolute (commands run in it by default).
    pub queue: Queue,
    pub work: Arc<WorkState>,
    pub shutdown: Shutdown,
    /// Operator requests for the tasks running now, by task id.
    pub controls: std::sync::Mutex<std::collections::HashMap<String, TaskControl>>,
    /// Signalled when a crash suspect shows progress, so the scheduler can end its trial and
    /// start the next one at once instead of at its next tick.
    pub trial_progress: tokio::sync::Notify,
    /// Who commands run as and how their processes are tracked.
    pub confine: ConfineConfig,
    /// Tasks whose lease this daemon lost (a shared queue): their commands are being stopped,
    /// and their attempt's end writes nothing.
    pub lost_leases: std::sync::Mutex<std::collections::HashSet<String>>,
    /// What every command gets from the daemon's environment, under its task's variables
    /// (`environment`: a short list, not the daemon's whole environment).
    pub inherited_env: InheritedEnv,
    /// The bound on each phase's log (`log_cap`); `None`: unbounded.
    pub max_log_bytes: Option<u64>,
    /// The checkpoint bytes each submitter's tasks in flight hold (`checkpoint_quota`).
    pub checkpoint_quota: CheckpointQuota,
    /// Where events are also counted as metrics (`cairn run --listen`).
    pub observer: Option<Arc<crate::observe::Observer>>,
}

impl RunContext {
    /// The control handle of a running task (a fresh one if it has none yet).
    pub fn control(&self, task_id: &str) -> TaskControl {
        let mut controls = self
            .controls
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        controls.entry(task_id.to_string()).or_default().clone()
    }

    /// The task's lease is lost: stop its commands (SIGTERM, then SIGKILL), and have its
    /// attempt's end write nothing, since another daemon may run the task now.
    pub fn lose_lease(&self, task_id: &str) {
        self.lost_leases
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(task_id.to_string());
        if let Some(observer) = &self.observer {
            observer.lease_lost();
        }
        self.control(task_id).cancel.cancel();
    }

    /// Whether the task's lease was lost (forgetting that it was).
    pub fn take_lost_lease(&self, task_id: &str) -> bool {
        self.lost_leases
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(task_id)
    }

    /// Forget a task's control handle (its attempt has ended).
    pub fn drop_control(&self, task_id: &str) -> Option<TaskControl> {
        self.controls
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(task_id)
    }

    /// Append to the task's event journal (see [`crate::store::journal`]); never waits for
    /// the disk.
    pub fn journal(&self, task_id: &str, event: Event) {
        if let Some(observer) = &self.observer {
            observer.event(task_id, &event);
        }
        self.queue.backend().append_event(task_id, event);
    }
}

/// How one attempt of a task ended.
#[derive(Debug, Clone, PartialEq)]
pub enum AttemptEnd {
    /// Every phase has finished; the outputs are in the task's `current_work` entry.
    Done,
    /// The attempt failed. `counts` is false for failures of cairn's own storage (a full disk),
    /// which are retried without using up the task's attempts.
    Failed { error: String, counts: bool },
    /// Stopped by a shutdown; resumes at the next start.
    Interrupted,
    /// Stopped for good by its budget.
    BudgetStopped { reason: String },
}

/// Why a phase did not finish.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PhaseError {
    /// The command failed, timed out or replied badly.
    #[error("{0}")]
    Command(String),
    /// Not the task's fault, so it does not use up an attempt: cairn could not write its own
    /// state (a full disk), or a worker asked to be resumed (exit 75).
    #[error("{0}")]
    Transient(String),
    /// The task reached its `budget.max_cost` (or reported no cost while it has a budget).
    #[error("{0}")]
    Budget(String),
}

/// cairn could not read or write a task's own state: a phase output, `current_work.json`.
/// Not the task's fault, so the attempt it ends does not count.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{0}")]
    Blocking(#[from] PhaseError),
    #[error("{0}")]
    Encode(#[source] serde_json::Error),
    /// The queue's owner could not write or read it (the message names what).
    #[error(transparent)]
    Queue(#[from] QueueError),
    #[error("the output of phase {phase:?} ({key}) is missing")]
    MissingOutput { phase: String, key: String },
    #[error("{0}")]
    Persist(#[source] std::io::Error),
}

/// How a phase run ended without error.
#[derive(Debug)]
pub enum PhaseEnd {
    Completed(Value),
    Interrupted,
}

/// Run the task from where its `current_work` entry stands to its end (or to a stop/failure),
/// writing under `lease`. The entry must exist and carry the attempt number.
pub async fn run_attempt(ctx: &Arc<RunContext>, task: &Arc<Task>, lease: &Lease) -> AttemptEnd {
    let confinement = match confinement::prepare(ctx, task).await {
        Ok(confinement) => confinement,
        Err(end) => return end,
    };
    let end = run_phases(ctx, task, lease, &confinement).await;
    confinement::end(task.id(), confinement).await;
    let submitter = task.submitted_by().map(|s| s.uid);
    ctx.checkpoint_quota.forget(submitter, task.id());
    end
}

/// The phases of one attempt, from where the task's entry stands.
async fn run_phases(
    ctx: &Arc<RunContext>,
    task: &Arc<Task>,
    lease: &Lease,
    confinement: &confinement::TaskConfinement,
) -> AttemptEnd {
    loop {
        let run = match start_phase(ctx, task, lease, confinement).await {
            ControlFlow::Continue(run) => run,
            ControlFlow::Break(end) => return end,
        };
        // Each kind's future is boxed: inline, every task in flight would hold as much memory
        // as the largest kind needs (with thousands in flight, most of the daemon's heap).
        let result = match run.phase.kind {
            PhaseKind::Once => Box::pin(once::run(&run)).await,
            PhaseKind::Loop => Box::pin(loop_phase::run(&run)).await,
            PhaseKind::Items => Box::pin(items::run(&run)).await,
            PhaseKind::Worker => Box::pin(worker::run(&run)).await,
        };
        let dropped_flush = run
            .dropped_flush
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some(flush) = dropped_flush {
            let _ = flush.await;
        }
        if let ControlFlow::Break(end) = end_phase(ctx, task, &run, result).await {
            return end;
        }
    }
}

/// The next phase to run, with its inputs, marked started in the task's entry; or how the
/// attempt ends instead (every phase done, a stop or an operator's request, unreadable
/// inputs).
async fn start_phase<'a>(
    ctx: &'a RunContext,
    task: &'a Task,
    lease: &'a Lease,
    confinement: &'a confinement::TaskConfinement,
) -> ControlFlow<AttemptEnd, PhaseRun<'a>> {
    let id = task.id();
    let Some(entry) = ctx.work.update(|w| w.get(id).cloned()) else {
        return ControlFlow::Break(AttemptEnd::Failed {
            error: format!("internal error: task {id} is not in current_work"),
            counts: false,
        });
    };
    let index = entry.phase_index;
    let Some(phase) = task.phases.get(index) else {
        return ControlFlow::Break(AttemptEnd::Done);
    };
    let control = ctx.control(id);
    if ctx.shutdown.is_stopping() || control.pause.is_cancelled() || control.cancel.is_cancelled() {
        return ControlFlow::Break(AttemptEnd::Interrupted);
    }
    let inputs = match load_inputs(ctx, &entry.phase_outputs).await {
        Ok(inputs) => inputs,
        Err(error) => {
            return ControlFlow::Break(AttemptEnd::Failed {
                error: error.to_string(),
                counts: false,
            })
        }
    };
    ctx.work.update(|w| {
        if let Some(e) = w.get_mut(id) {
            e.phase = phase.name.clone();
            let started = e
                .phases
                .last()
                .is_some_and(|t| t.name == phase.name && t.finished_at.is_none());
            if !started {
                e.phases.push(PhaseTiming {
                    name: phase.name.clone(),
                    started_at: Utc::now(),
                    finished_at: None,
                    iterations: None,
                    total: None,
                });
            }
        }
    });
    tracing::info!(task_id = %id, phase = %phase.name, attempt = entry.attempt, "phase started");
    ctx.journal(
        id,
        Event::PhaseStarted {
            phase: phase.name.clone(),
            phase_index: index,
            kind: phase.kind,
            attempt: entry.attempt,
        },
    );
    ControlFlow::Continue(PhaseRun {
        ctx,
        task,
        index,
        phase,
        attempt: entry.attempt,
        inputs,
        control,
        lease,
        confinement,
        dropped_flush: Default::default(),
    })
}

/// Record a finished phase and go on to the next, or end the attempt as the phase ended.
async fn end_phase(
    ctx: &Arc<RunContext>,
    task: &Task,
    run: &PhaseRun<'_>,
    result: Result<PhaseEnd, PhaseError>,
) -> ControlFlow<AttemptEnd> {
    let index = run.index;
    let end = match result {
        Ok(PhaseEnd::Completed(output)) => {
            if let Err(error) = finish_phase(ctx, task, run.lease, index, output).await {
                return ControlFlow::Break(AttemptEnd::Failed {
                    error: error.to_string(),
                    counts: false,
                });
            }
            return ControlFlow::Continue(());
        }
        Ok(PhaseEnd::Interrupted) => AttemptEnd::Interrupted,
        Err(PhaseError::Command(error)) => AttemptEnd::Failed {
            error,
            counts: true,
        },
        Err(PhaseError::Transient(error)) => AttemptEnd::Failed {
            error,
            counts: false,
        },
        Err(PhaseError::Budget(reason)) => AttemptEnd::BudgetStopped { reason },
    };
    ControlFlow::Break(end)
}

/// Record a phase's output and move the task to its next phase, durably.
async fn finish_phase(
    ctx: &Arc<RunContext>,
    task: &Task,
    lease: &Lease,
    index: usize,
    output: Value,
) -> Result<(), StateError> {
    let id = task.id().to_string();
    let bytes = serde_json::to_vec(&output).map_err(StateError::Encode)?;
    let stored = if bytes.len() <= INLINE_OUTPUT_LIMIT {
        StoredOutput::Inline(output)
    } else {
        let (queue, lease) = (ctx.queue.clone(), lease.clone());
        let reference =
            blocking(move || queue.backend().put_output(&lease, index, &bytes)).await??;
        StoredOutput::File(reference)
    };
    let next = task.phases.get(index + 1).map(|p| p.name.clone());
    ctx.work.update(|w| {
        if let Some(e) = w.get_mut(&id) {
            e.phase_outputs
                .insert(task.phases[index].name.clone(), stored);
            e.phase_index = index + 1;
            // Progress: the crashes before it say nothing against this task,
            // and a trial it was on is over (see `daemon::crash_blame`).
            e.crashes_alone = 0;
            if std::mem::take(&mut e.suspect) {
                ctx.trial_progress.notify_one();
            }
            if let Some(timing) = e.phases.last_mut() {
                timing.finished_at = Some(Utc::now());
                if task.phases[index].kind != PhaseKind::Once {
                    timing.iterations = Some(e.iterations);
                }
            }
            e.iterations = 0;
            if let Some(next) = next {
                e.phase = next;
            }
        }
    });
    // Journaled once the work state holds the output: from here the phase is not run again in
    // this daemon, even when the persist below fails and fails the attempt.
    let phase = &task.phases[index].name;
    tracing::info!(task_id = %id, phase = %phase, "phase finished");
    ctx.journal(
        &id,
        Event::PhaseFinished {
            phase: phase.clone(),
            phase_index: index,
        },
    );
    ctx.work.persist().await.map_err(StateError::Persist)
}

/// The outputs of the finished phases, by name, as given to commands in `inputs`.
pub async fn load_inputs(
    ctx: &RunContext,
    outputs: &std::collections::BTreeMap<String, StoredOutput>,
) -> Result<Value, StateError> {
    let mut inputs = Map::new();
    for (name, stored) in outputs {
        let value = match stored {
            StoredOutput::Inline(value) => value.clone(),
            StoredOutput::File(key) => {
                let queue = ctx.queue.clone();
                let reference = key.clone();
                blocking(move || queue.backend().read_output(&reference))
                    .await??
                    .ok_or_else(|| StateError::MissingOutput {
                        phase: name.clone(),
                        key: key.clone(),
                    })?
            }
        };
        inputs.insert(name.clone(), value);
    }
    Ok(Value::Object(inputs))
}

/// A checkpoint store error as a phase error: an I/O error (a full disk) is retried without
/// using up attempts; a checkpoint that cannot be used at all (every generation damaged) fails
/// the attempt, so the task ends in `failed/` with the reason instead of retrying forever.
pub(crate) fn checkpoint_error(e: StoreError) -> PhaseError {
    match e {
        StoreError::Io { .. }
        | StoreError::Files {
            source: crate::store::blobs::BlobError::Io { .. },
            ..
        } => PhaseError::Transient(format!("checkpoint storage: {e}")),
        // The lease was lost: stop without using up an attempt; nothing was written.
        StoreError::Fenced { .. } => PhaseError::Transient(format!("checkpoint: {e}")),
        // The queue's database failed for longer than the lease let the save be tried again:
        // cairn's own storage, not the task's fault, so no attempt is used up.
        StoreError::Sink { .. } => PhaseError::Transient(format!("checkpoint storage: {e}")),
        other => PhaseError::Command(format!("checkpoint: {other}")),
    }
}

/// A command that could not be started: out of processes, memory or open files (`EAGAIN`,
/// `ENOMEM`, `EMFILE`, `ENFILE`) is transient and retried without using up an attempt (a fork
/// bomb in one task, or thousands of tasks at once, must not fail others for good); anything
/// else is the command's failure.
pub(crate) fn spawn_failure(what: &str, e: std::io::Error) -> PhaseError {
    if child::is_resource_exhaustion(&e) {
        PhaseError::Transient(format!(
            "{what}: {e} (out of processes, memory or open files; retried without using up an attempt)"
        ))
    } else {
        PhaseError::Command(format!("{what}: {e}"))
    }
}

/// Blocking jobs of the runners and the scheduler that run at once. Thousands of tasks in
/// flight would otherwise grow tokio's blocking pool to hundreds of threads: each one's stack
/// and malloc arena add to the daemon's memory, and every fork of the daemon (one per command
/// run) copies the page tables of all of it. The disk is no faster for more than a few dozen
/// writers, whose directory fsyncs are group-committed anyway.
const MAX_BLOCKING_JOBS: usize = 64;

/// The most threads the daemon's runtime gives its blocking pool (`max_blocking_threads`): the
/// capped jobs above, plus room for the few that run outside the cap (the work state's writer,
/// the inbox scan, lease claims and renewals). The cap on jobs alone did not cap threads: under
/// load, a thread that has finished a job is not yet back among the idle ones when the next job
/// is handed in, so tokio starts another, up to its default of 512 (which added up to about
/// 100 MB at 10,000 tasks in flight). A job past the threads waits in tokio's queue; none waits
/// for another, so none can wait for itself.
pub const MAX_BLOCKING_THREADS: usize = MAX_BLOCKING_JOBS + 16;

static BLOCKING_SLOTS: tokio::sync::Semaphore =
    tokio::sync::Semaphore::const_new(MAX_BLOCKING_JOBS);

/// Run blocking work on tokio's blocking pool, at most [`MAX_BLOCKING_JOBS`] at once (callers
/// past that wait as futures). The work must not wait for other such work.
pub(crate) async fn spawn_limited<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, tokio::task::JoinError> {
    // The semaphore is never closed, so acquiring cannot fail; were it closed, the work would
    // just run without a slot.
    let _slot = BLOCKING_SLOTS.acquire().await.ok();
    tokio::task::spawn_blocking(work).await
}

/// Run blocking work (file I/O, fsync) off the daemon's async thread.
pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, PhaseError> {
    spawn_limited(work)
        .await
        .map_err(|e| PhaseError::Transient(format!("internal error in a blocking task: {e}")))
}

/// One phase of one attempt: what its kind's runner needs.
pub(crate) struct PhaseRun<'a> {
    pub ctx: &'a RunContext,
    pub task: &'a Task,
    pub index: usize,
    pub phase: &'a Phase,
    pub attempt: u32,
    pub inputs: Value,
    pub control: TaskControl,
    /// The task's lease: every write of this phase is fenced by it.
    pub lease: &'a Lease,
    /// Who its commands run as, which cgroup they join.
    pub confinement: &'a confinement::TaskConfinement,
    /// The write of the pending iteration by a checkpointer dropped early, on the blocking
    /// pool: the phase's end waits for it, so it lands before the attempt's end is decided.
    pub dropped_flush: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl PhaseRun<'_> {
    /// Run the phase's command once with `request` on stdin. `Ok(None)` means a stop interrupted
    /// it; `Ok(Some(stdout))` means it exited 0.
    pub(crate) async fn call(
        &self,
        request: &Value,
        iteration: Option<u64>,
    ) -> Result<Option<Vec<u8>>, PhaseError> {
        let log = self.log_path();
        let env = self.env(iteration);
        let header = self.log_header(iteration);
        let stdin = serde_json::to_vec(request)
            .map_err(|e| PhaseError::Command(format!("encoding the request: {e}")))?;
        let run = CommandRun {
            argv: self.phase.run.clone(),
            cwd: self.cwd(),
            env,
            inherited_env: self.ctx.inherited_env.clone(),
            stdin,
            log: log.clone(),
            log_header: header,
            max_log_bytes: self.ctx.max_log_bytes,
            timeout: self.phase.timeout,
            confinement: self.confinement.spawn.clone(),
        };
        let what = self.describe(iteration);
        let end = child::run_command(run, &self.ctx.shutdown, &self.control.cancel)
            .await
            .map_err(|e| match e {
                // cairn's own storage (a full disk): retried without using up an attempt.
                child::RunError::Log(e) => PhaseError::Transient(format!("{what}: {e}")),
                child::RunError::Command(e) => PhaseError::Command(format!("{what}: {e}")),
                child::RunError::Exhausted(e) => spawn_failure(&what, e),
            })?;
        let log_note = format!("its stderr is in {}", log.display());
        match end {
            RunEnd::Exited { status, stdout } if status.success() => Ok(Some(stdout)),
            RunEnd::Exited { status, .. } => Err(PhaseError::Command(format!(
                "{what}: command failed ({status}); {log_note}"
            ))),
            RunEnd::Interrupted => Ok(None),
            RunEnd::TimedOut => Err(PhaseError::Command(format!(
                "{what}: command timed out after {}; {log_note}",
                humantime::format_duration(self.phase.timeout.unwrap_or_default())
            ))),
            RunEnd::ReplyTooLarge => Err(PhaseError::Command(format!(
                "{what}: command printed more than {MAX_REPLY_BYTES} bytes on stdout"
            ))),
        }
    }

    /// Parse a command's stdout as JSON, quoting the start of it when it is not.
    pub(crate) fn parse_reply<T: serde::de::DeserializeOwned>(
        &self,
        stdout: &[u8],
        iteration: Option<u64>,
    ) -> Result<T, PhaseError> {
        serde_json::from_slice(stdout).map_err(|e| {
            let text = String::from_utf8_lossy(stdout);
            let start: String = text.chars().take(200).collect();
            let more = if text.chars().count() > 200 {
                "..."
            } else {
                ""
            };
            // Text that is not JSON at all is most often log lines printed on stdout.
            let hint = if e.is_syntax() {
                format!(
                    " (stdout carries only the JSON reply; print log lines to stderr, which goes to {})",
                    self.log_path().display()
                )
            } else {
                String::new()
            };
            PhaseError::Command(format!(
                "{}: the reply on stdout is not valid: {e}; it printed: {start:?}{more}{hint}",
                self.describe(iteration)
            ))
        })
    }

    /// Start no further iteration or item: the daemon stops, or an operator paused or
    /// cancelled the task.
    pub(crate) fn should_stop(&self) -> bool {
        self.ctx.shutdown.is_stopping()
            || self.control.pause.is_cancelled()
            || self.control.cancel.is_cancelled()
    }

    /// Resolves once [`PhaseRun::should_stop`] turns true.
    pub(crate) async fn stop_requested(&self) {
        tokio::select! {
            _ = self.ctx.shutdown.stopped() => {}
            _ = self.control.pause.cancelled() => {}
            _ = self.control.cancel.cancelled() => {}
        }
    }

    /// The task's summed cost so far (`None` while nothing has reported a cost).
    pub(crate) fn cost(&self) -> Option<f64> {
        self.ctx
            .work
            .update(|w| w.get(self.task.id()).and_then(|e| e.cost))
    }

    /// Set the task's summed cost (from a checkpoint being resumed).
    pub(crate) fn set_cost(&self, total: Option<f64>) {
        self.ctx.work.update(|w| {
            if let Some(entry) = w.get_mut(self.task.id()) {
                entry.cost = total;
            }
        });
    }

    /// Add a reported cost of one iteration (summed exactly). Returns true when it is the
    /// largest so far of the task or of its phase, the prices of iterations lost to crashes:
    /// the caller makes that durable.
    fn add_cost(&self, amount: f64) -> bool {
        self.ctx.work.update(|w| {
            let Some(entry) = w.get_mut(self.task.id()) else {
                return false;
            };
            entry.cost = Some(crate::cost::add(entry.cost.unwrap_or(0.0), amount));
            let largest = entry.max_iteration_cost.is_none_or(|max| amount > max);
            if largest {
                entry.max_iteration_cost = Some(amount);
            }
            // The price of this phase's lost iterations.
            let largest_of_phase = match entry.max_cost_by_phase.get(&entry.phase_index) {
                Some(max) if *max >= amount => false,
                _ => {
                    entry.max_cost_by_phase.insert(entry.phase_index, amount);
                    true
                }
            };
            largest || largest_of_phase
        })
    }

    /// Right before a loop's or worker's command starts: if it is the first of this attempt,
    /// record durably that one may have started. From then on a crash may lose an iteration
    /// that was paid for, and the restart counts it as spent (see `daemon::recovery`); before,
    /// a crash costs nothing.
    pub(crate) async fn command_may_start(&self) -> Result<(), PhaseError> {
        let first = self.ctx.work.update(|w| {
            w.get_mut(self.task.id())
                .is_some_and(|e| std::mem::take(&mut e.no_iteration_started))
        });
        if first {
            self.ctx.work.persist().await.map_err(|e| {
                PhaseError::Transient(format!(
                    "recording that phase {:?} starts its commands: {e}",
                    self.phase.name
                ))
            })?;
        }
        Ok(())
    }

    /// Add one iteration's reported cost. When it is the largest so far it prices the
    /// iterations a crash loses, so it is made durable before the work goes on: a restart that
    /// did not know it could not count them against the budget.
    pub(crate) async fn add_iteration_cost(&self, amount: f64) -> Result<(), PhaseError> {
        if self.add_cost(amount) {
            self.ctx.work.persist().await.map_err(|e| {
                PhaseError::Transient(format!("recording the largest iteration cost: {e}"))
            })?;
        }
        Ok(())
    }

    /// With a budget: refuse to go on once it is spent, or when the cost of the work done so
    /// far is unknown (`cost_known` false) — unknown cost is not zero. What is spent includes
    /// the estimate for the iterations lost to crashes.
    pub(crate) fn check_budget(&self, cost_known: bool, what: &str) -> Result<(), PhaseError> {
        // The limit is read each time: `cairn budget` may raise it while the task runs.
        let (limit, committed, lost, estimate) = self
            .ctx
            .work
            .update(|w| {
                w.get(self.task.id()).map(|e| {
                    let limit = e.spend_limit(self.task.budget.as_ref());
                    (limit, e.cost, e.lost_iterations, e.lost_cost_estimate())
                })
            })
            .unwrap_or((self.task.budget.as_ref().map(|b| b.max_cost), None, 0, None));
        let Some(limit) = limit else {
            return Ok(());
        };
        if !cost_known {
            return Err(PhaseError::Budget(format!(
                "budget: {what} reported no cost; with budget.max_cost set every iteration must report its cost (unknown cost is not zero)"
            )));
        }
        let spent = crate::cost::add(committed.unwrap_or(0.0), estimate.unwrap_or(0.0));
        if spent >= limit {
            let lost = match estimate {
                Some(estimate) => format!(
                    ", of which {estimate} is the estimate for {lost} iteration(s) in flight when the daemon died"
                ),
                None => String::new(),
            };
            return Err(PhaseError::Budget(format!(
                "budget.max_cost {limit} reached (spent {spent}{lost})"
            )));
        }
        Ok(())
    }

    /// Note a worker's progress for `status`.
    pub(crate) fn set_progress(&self, done: u64, total: Option<u64>) {
        self.ctx.work.update(|w| {
            if let Some(entry) = w.get_mut(self.task.id()) {
                entry.progress = Some(Progress { done, total });
                if let Some(timing) = entry.phases.last_mut().filter(|_| total.is_some()) {
                    timing.total = total;
                }
            }
        });
    }

    /// The environment every command of this phase gets.
    pub(crate) fn env(&self, iteration: Option<u64>) -> Vec<(String, String)> {
        let id = self.task.id();
        // The submitter's USER, HOME, ... first: the task's own env may override them.
        let mut env = self.confinement.login_env();
        env.extend(self.task.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        env.push(self.confinement.scratch_env());
        env.extend([
            ("CAIRN_TASK_ID".to_string(), id.to_string()),
            ("CAIRN_PHASE".to_string(), self.phase.name.clone()),
            ("CAIRN_ATTEMPT".to_string(), self.attempt.to_string()),
            (
                "CAIRN_IDEMPOTENCY_KEY".to_string(),
                format!("{id}:{}:{}", self.phase.name, iteration.unwrap_or(0)),
            ),
            (
                "CAIRN_RUN_DIR".to_string(),
                self.ctx.queue.run_dir(id).display().to_string(),
            ),
        ]);
        if let Some(iteration) = iteration {
            env.push(("CAIRN_ITERATION".to_string(), iteration.to_string()));
        }
        // On a shared queue, who runs the task under which claim: external systems fence
        // their own writes with these as cairn fences its own.
        if let Some(node) = self.ctx.queue.backend().node() {
            env.push(("CAIRN_NODE".to_string(), node.to_string()));
            env.push((
                "CAIRN_LEASE_EPOCH".to_string(),
                self.lease.epoch().to_string(),
            ));
        }
        // The worker helpers the daemon wrote at start (see `crate::clients`).
        let clients = crate::clients::clients_dir(self.ctx.queue.root());
        let passed_python_path = self
            .ctx
            .inherited_env
            .get("PYTHONPATH")
            .map(String::from_utf8_lossy);
        env.extend(crate::clients::command_env(
            &clients,
            &self.task.env,
            passed_python_path.as_deref(),
        ));
        env
    }

    /// The log header of one command run.
    pub(crate) fn log_header(&self, iteration: Option<u64>) -> String {
        match iteration {
            Some(i) => format!(
                "=== {} attempt {} iteration {i} ===",
                Utc::now().to_rfc3339(),
                self.attempt
            ),
            None => format!(
                "=== {} attempt {} ===",
                Utc::now().to_rfc3339(),
                self.attempt
            ),
        }
    }

    fn describe(&self, iteration: Option<u64>) -> String {
        match iteration {
            Some(i) => format!("phase {:?} iteration {i}", self.phase.name),
            None => format!("phase {:?}", self.phase.name),
        }
    }

    pub(crate) fn log_path(&self) -> PathBuf {
        self.ctx
            .queue
            .run_dir(self.task.id())
            .join(format!("{}-{}.log", self.index, self.phase.name))
    }

    pub(crate) fn cwd(&self) -> PathBuf {
        match &self.task.cwd {
            Some(cwd) => self.ctx.queue.root().join(cwd),
            None => self.ctx.queue.root().to_path_buf(),
        }
    }
}
