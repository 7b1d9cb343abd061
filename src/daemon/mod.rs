//! The daemon: lock the queue, recover what was in flight, take tasks from the inbox, run them,
//! and on a stop flush everything and return.
//!
//! [`run`] takes its stop signal as a [`Shutdown`] handle, so an embedding program or a test can
//! stop it without sending signals; the `cairn run` command wires SIGINT/SIGTERM to it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::task::JoinSet;

mod after_attempt;
mod control;
mod crash_blame;
mod fair_share;
mod intake_retry;
mod known;
mod notify;
mod pending;
mod records;
mod recovery;
mod schedule;
mod shared_queue;
mod start_order;
mod steering;
mod summary;

pub use steering::OperatorsGroup;
pub use summary::RunSummary;

use crate::limits::{Admission, PublishedLimits, SubmitterLimits};
use crate::queue::{LockError, OpenError, Queue, QueueHint};
use crate::runner::{AttemptEnd, CgroupRoot, ConfineConfig, RunContext, WorkState};
use crate::shutdown::Shutdown;
use crate::store::current_work::{ActiveStatus, ActiveTask};
use crate::store::Storage;
use crate::task_id::TaskId;

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
    /// Run each task's commands as its submitter (`--run-as-submitter`). The caller checks
    /// first that the process may switch users (`runner::identity::check_capabilities`).
    /// Such commands start through this program's own binary as a trampoline: a program that
    /// embeds the library calls `cairn::runner::trampoline::main_if_asked()` first in `main`
    /// (the daemon refuses to start otherwise, `runner::trampoline::check_available`).
    pub run_as_submitter: bool,
    /// With `run_as_submitter`: the group whose members may steer every task, besides each
    /// task's submitter, the daemon's user and root (`--operators-group`).
    pub operators_group: Option<OperatorsGroup>,
    /// Share a queue in PostgreSQL with daemons on other hosts instead (`queue_dir` is then
    /// this host's directory: its inbox, logs and scratch).
    pub database: Option<DatabaseConfig>,
    /// Limits on each submitter's tasks (`crate::limits`); unlimited by default.
    pub submitter_limits: SubmitterLimits,
    /// Variables of the daemon's environment its commands get besides the short list they
    /// always get (`cairn run --pass-env`, `runner::daemon_env`); checked by the caller with
    /// `runner::check_pass_names`.
    pub pass_env: Vec<String>,
    /// The bound on each phase's log, kept as its head and tail (`runner::log_cap`;
    /// `cairn run --max-log-bytes`); `None`: unbounded.
    pub max_log_bytes: Option<u64>,
    /// The bounds of each task's cgroup (`memory.max`, `pids.max`), where it has one and the
    /// controllers are offered.
    pub task_limits: crate::runner::TaskLimits,
    /// The checkpoint bytes one submitter's tasks in flight may hold
    /// (`runner::checkpoint_quota`); `None`: unbounded.
    pub max_checkpoint_bytes_per_submitter: Option<u64>,
    /// Where the daemon records its metrics and the turns of its main loop, for an HTTP
    /// listener (`cairn run --listen`); `None`: nothing is recorded.
    pub observer: Option<Arc<crate::observe::Observer>>,
}

/// A queue in PostgreSQL shared by several daemons (`cairn run --db`, `docs/cluster.md`).
#[derive(Debug, Clone)]
pub struct DatabaseConfig {
    /// A `postgresql://` URL or libpq's `key=value` form.
    pub url: String,
    /// This daemon's name, unique among the live daemons (by default the host name).
    pub node: String,
    /// How long a claim holds without renewal; renewed every sixth of it.
    pub lease: Duration,
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
            run_as_submitter: false,
            operators_group: None,
            database: None,
            submitter_limits: SubmitterLimits::default(),
            pass_env: Vec::new(),
            max_log_bytes: Some(crate::runner::log_cap::DEFAULT_MAX_LOG_BYTES),
            task_limits: crate::runner::TaskLimits::host_default(),
            max_checkpoint_bytes_per_submitter: Some(
                crate::runner::checkpoint_quota::DEFAULT_MAX_CHECKPOINT_BYTES_PER_SUBMITTER,
            ),
            observer: None,
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
    /// Someone other than the daemon's user could write the queue (see `queue::permissions`).
    #[error("refusing to run this queue: {0}")]
    UnsafeQueue(#[source] crate::queue::UnsafeQueue),
    /// The shared queue's database could not be opened.
    #[error("{0}")]
    Database(String),
    /// [`run`] was called outside a current-thread tokio runtime (see there why it needs one).
    #[error(
        "the daemon must run on a current-thread tokio runtime \
         (tokio::runtime::Builder::new_current_thread), not a {0:?} one: its commands are \
         killed when the thread that started them exits"
    )]
    Runtime(tokio::runtime::RuntimeFlavor),
}

impl From<OpenError> for DaemonError {
    fn from(error: OpenError) -> Self {
        match error {
            OpenError::Lock(e) => DaemonError::Lock(e),
            OpenError::Setup(e) => DaemonError::Setup(e),
            OpenError::Unsafe(e) => DaemonError::UnsafeQueue(e),
            OpenError::Database(e) => DaemonError::Database(e),
        }
    }
}

/// Run the daemon on a queue until it is stopped (or idle, with `exit_when_idle`).
///
/// It must be awaited on a **current-thread** tokio runtime, and it refuses any other with
/// [`DaemonError::Runtime`]: every command it starts gets `PR_SET_PDEATHSIG`, so that it dies
/// with the daemon, and the kernel sends that signal when the *thread* that started the command
/// exits, not the process. On a current-thread runtime that thread is the one blocked in
/// `block_on`, which lives as long as the daemon; a multi-thread runtime may start a command
/// on a worker thread that ends before it does. `cairn run` builds its runtime this way:
///
/// ```no_run
/// use cairn::daemon::{self, DaemonConfig};
/// use cairn::shutdown::Shutdown;
///
/// let runtime = tokio::runtime::Builder::new_current_thread()
///     .enable_all()
///     // Keeps the blocking pool to what the daemon uses (tokio's default is 512 threads).
///     .max_blocking_threads(cairn::runner::MAX_BLOCKING_THREADS)
///     .build()?;
/// let config = DaemonConfig::new("queue");
/// let exit = runtime.block_on(daemon::run(config, Shutdown::new()))?;
/// println!("the daemon returned: {exit:?}");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub async fn run(config: DaemonConfig, shutdown: Shutdown) -> Result<DaemonExit, DaemonError> {
    run_with_summary(config, shutdown)
        .await
        .map(|(exit, _)| exit)
}

/// [`run`], also returning what this run did: tasks done, failed and rejected, and what it left
/// paused or unfinished. The same current-thread runtime is needed.
pub async fn run_with_summary(
    config: DaemonConfig,
    shutdown: Shutdown,
) -> Result<(DaemonExit, RunSummary), DaemonError> {
    let flavor = tokio::runtime::Handle::current().runtime_flavor();
    if flavor != tokio::runtime::RuntimeFlavor::CurrentThread {
        return Err(DaemonError::Runtime(flavor));
    }
    // Commands run as their submitters start through this program's trampoline.
    if config.run_as_submitter {
        crate::runner::trampoline::check_available()
            .map_err(|e| DaemonError::Setup(e.to_string()))?;
    }
    // Owned (its lock held) for as long as the queue lives.
    let queue = open_queue(&config).await?;
    let admission = admit_by_limits(&queue, &config).await?;
    let confine = ConfineConfig {
        run_as_submitter: config.run_as_submitter,
        cgroups: CgroupRoot::for_queue(&queue.runs_dir())
            .map(|cgroups| cgroups.with_limits(config.task_limits)),
    };
    prepare_queue(&queue, &confine).await;
    clean_after_crash(&queue);
    let work = load_work(&queue)?;
    let ctx = Arc::new(RunContext {
        queue,
        work: Arc::new(work),
        shutdown: shutdown.clone(),
        controls: Default::default(),
        trial_progress: tokio::sync::Notify::new(),
        confine: confine.clone(),
        lost_leases: Default::default(),
        inherited_env: crate::runner::daemon_env(&config.pass_env),
        max_log_bytes: config.max_log_bytes,
        checkpoint_quota: crate::runner::CheckpointQuota::new(
            config.max_checkpoint_bytes_per_submitter,
        ),
        observer: config.observer.clone(),
    });
    let leases = ctx
        .queue
        .backend()
        .lease_length()
        .map(|lease| tokio::spawn(shared_queue::keep_leases(Arc::clone(&ctx), lease)));
    let mut scheduler = Scheduler::new(ctx, config, admission);
    scheduler.recover().await?;
    // The queue is locked and what was in flight is lined up again.
    let status = scheduler.status_line();
    scheduler.notifier.ready(status);
    if let Some(observer) = &scheduler.ctx.observer {
        observer.ready();
    }
    let exit = scheduler.work_until_stopped().await;
    scheduler.drain().await;
    let summary = scheduler.close().await;
    if let Some(leases) = leases {
        leases.abort();
    }
    if let Some(cgroups) = &confine.cgroups {
        cgroups.remove_if_empty();
    }
    let exit = if shutdown.is_immediate() {
        DaemonExit::StoppedImmediately
    } else {
        exit
    };
    Ok((exit, summary))
}

/// Own the queue the configuration names: files, or a share of a database's.
async fn open_queue(config: &DaemonConfig) -> Result<Queue, DaemonError> {
    let Some(database) = config.database.clone() else {
        return Ok(Queue::open_files(
            &config.queue_dir,
            config.storage.clone(),
        )?);
    };
    #[cfg(feature = "postgres")]
    {
        let root = config.queue_dir.clone();
        let vouch = config.run_as_submitter;
        let opened = runner_blocking(move || {
            Queue::open_postgres(&root, &database.url, &database.node, database.lease, vouch)
        })
        .await?;
        Ok(opened)
    }
    #[cfg(not(feature = "postgres"))]
    {
        let _ = database;
        Err(DaemonError::Database(
            "this cairn was built without PostgreSQL (the cargo feature `postgres`)".into(),
        ))
    }
}

/// Hold intake to the per-submitter limits, and publish them (with `max_tasks`) for
/// `cairn status`.
async fn admit_by_limits(
    queue: &Queue,
    config: &DaemonConfig,
) -> Result<Arc<Admission>, DaemonError> {
    let limits = config.submitter_limits;
    if limits.max_queued.is_some() && queue.backend().shares_queue() {
        // Each daemon knows only the tasks it claimed, not what waits in the database.
        return Err(DaemonError::Setup(
            "--max-queued-per-submitter is not supported with --db: a daemon does not count \
             the tasks that wait in the shared queue"
                .into(),
        ));
    }
    let admission = Arc::new(Admission::new(limits));
    queue.backend().set_admission(Arc::clone(&admission));
    let published = PublishedLimits {
        version: PublishedLimits::VERSION,
        pid: std::process::id() as i32,
        max_tasks: config.max_tasks.max(1),
        per_submitter: limits,
    };
    let publisher = queue.clone();
    // Not fatal: only `cairn status` reads it.
    if let Err(e) = runner_blocking(move || publisher.publish_limits(&published)).await {
        tracing::error!("publishing the limits for cairn status: {e}");
    }
    Ok(admission)
}

/// Kill what a daemon that died left running (so nothing races the tasks about to resume),
/// and write the worker helpers.
async fn prepare_queue(queue: &Queue, confine: &ConfineConfig) {
    let root = queue.root().to_path_buf();
    let runs_dir = queue.runs_dir();
    let cgroups = confine.cgroups.clone();
    let orphans =
        runner_blocking(move || crate::runner::kill_orphans(&runs_dir, cgroups.as_ref())).await;
    if orphans > 0 {
        tracing::warn!(
            count = orphans,
            "killed processes left running by a daemon that died"
        );
    }
    tracing::info!(queue = %root.display(), pid = std::process::id(), "cairn daemon started");
    let clients_root = root.to_path_buf();
    // Not fatal: only tasks whose workers use the helpers need them, and their error names
    // the missing file.
    if let Err(e) = runner_blocking(move || crate::clients::install(&clients_root)).await {
        tracing::error!("writing the worker helpers: {e}");
    }
}

/// Remove what writes a crash cut short left behind, before anything is read.
fn clean_after_crash(queue: &Queue) {
    match queue.backend().clean_after_crash() {
        Ok(removed) if !removed.is_empty() => {
            tracing::info!(
                count = removed.len(),
                "removed temp files left by an earlier crash"
            )
        }
        Ok(_) => {}
        // Not fatal: leftover temp files are only litter, and the directories are synced
        // again before they are written to.
        Err(e) => tracing::error!("cleaning temp files and syncing the queue's directories: {e}"),
    }
}

/// What was in flight when the last daemon stopped; a damaged work state stops the start,
/// saying how to start without it.
fn load_work(queue: &Queue) -> Result<WorkState, DaemonError> {
    WorkState::load(queue.clone()).map_err(|e| {
        DaemonError::Setup(format!(
            "{e}; move {} aside to start without it (tasks then restart their phases, their loop checkpoints are kept)",
            queue.work_state_name()
        ))
    })
}

pub(crate) struct Scheduler {
    ctx: Arc<RunContext>,
    config: DaemonConfig,
    /// Definitions of the tasks this daemon knows to be unfinished, counted per submitter.
    tasks: known::KnownTasks,
    /// Tasks that were in flight: they go before new ones.
    resume: VecDeque<TaskId>,
    /// Crash suspects waiting to be tried alone, in trial order: they go before everything.
    suspects: VecDeque<TaskId>,
    /// Suspects running on trial (nothing starts beside them) until they make progress.
    on_trial: HashSet<TaskId>,
    /// How many suspects may be on trial at once (`crash_blame::trial_width`).
    trial_width: usize,
    /// New tasks, per submitter: highest priority first, then in order of acceptance.
    pending: pending::PendingQueues,
    next_seq: u64,
    /// Tasks waiting for their backoff to pass.
    retries: Vec<(DateTime<Utc>, TaskId)>,
    running: JoinSet<(TaskId, AttemptOutcome)>,
    /// Ids of the tasks with an attempt running now.
    running_ids: HashSet<TaskId>,
    /// Those attempts, counted per submitter.
    running_by: known::RunningBySubmitter,
    /// The last scan left files in the inbox that may still be being written.
    inbox_deferred: bool,
    /// The inbox scan running on the blocking pool.
    scan: Option<tokio::task::JoinHandle<crate::queue::IntakeReport>>,
    /// Start another scan when the running one ends (hints arrived meanwhile).
    scan_again: bool,
    /// Pauses and rate-limits scans that keep failing.
    intake_retry: intake_retry::IntakeRetry,
    /// Inbox hints for the next scan.
    intake_hints: Vec<QueueHint>,
    notifier: notify::ServiceNotifier,
    /// Tasks finished since start, for the service status.
    finished: u64,
    /// Control requests wait in `control/` for a task still in the inbox: look again as soon
    /// as a scan has taken tasks in, before any of them starts.
    control_deferred: bool,
    /// What this run did, for the closing summary.
    summary: RunSummary,
    /// Claiming work from a shared queue (unused with files).
    claiming: shared_queue::Claiming,
    /// Leases a shared queue's claim gave, kept for the task's first attempt.
    claimed_leases: HashMap<TaskId, crate::queue::Lease>,
    /// Who may steer which task (judged only with `--run-as-submitter`).
    steering: steering::SteeringRights,
    /// The file name of the control request being applied, for the `control_refused` event
    /// that tells its requester (see `control.rs`).
    applying_request: Option<String>,
    /// The owner of the request being applied (who asks), for the bounds on refusals.
    applying_uid: Option<u32>,
    /// Refused requests per task and requester, journaled and logged within bounds.
    refusals: crate::queue::refusals::RefusalLimiter,
    /// Whether the request being applied was refused (its event is then flushed before the
    /// request is removed, so that `cairn` sees the refusal once its request is gone).
    request_refused: bool,
}

/// How an attempt's future ended, as the main loop sees it.
#[derive(Debug)]
pub(crate) enum AttemptOutcome {
    /// Every phase finished, `done/<id>.json` is written and the task has left
    /// `current_work`; this is its entry as it ended.
    Recorded(Box<ActiveTask>),
    /// Every phase finished, but the done record could not be written (the error).
    RecordFailed(String),
    /// Any other end, which the main loop handles.
    Ended(AttemptEnd),
}

impl Scheduler {
    /// A scheduler with nothing lined up yet ([`Scheduler::recover`] lines up the queue).
    fn new(ctx: Arc<RunContext>, config: DaemonConfig, admission: Arc<Admission>) -> Scheduler {
        let records = ctx.queue.record_locations();
        let steering =
            steering::SteeringRights::new(config.run_as_submitter, config.operators_group.clone());
        if steering.enforced() {
            ctx.queue.backend().set_control_judge(steering.judge());
        }
        Scheduler {
            ctx,
            config,
            tasks: known::KnownTasks::new(admission),
            resume: VecDeque::new(),
            suspects: VecDeque::new(),
            on_trial: HashSet::new(),
            trial_width: 1,
            pending: Default::default(),
            next_seq: 0,
            retries: Vec::new(),
            running: JoinSet::new(),
            running_ids: HashSet::new(),
            running_by: Default::default(),
            inbox_deferred: false,
            scan: None,
            scan_again: false,
            intake_retry: intake_retry::IntakeRetry::default(),
            intake_hints: Vec::new(),
            notifier: notify::ServiceNotifier::new(),
            finished: 0,
            control_deferred: false,
            summary: RunSummary {
                records,
                ..RunSummary::default()
            },
            claiming: Default::default(),
            claimed_leases: HashMap::new(),
            steering,
            applying_request: None,
            applying_uid: None,
            refusals: Default::default(),
            request_refused: false,
        }
    }

    /// After the drain: flush the journals and tell what this run did and what it leaves.
    async fn close(&mut self) -> RunSummary {
        let ctx = Arc::clone(&self.ctx);
        runner_blocking(move || {
            ctx.queue.backend().flush_events();
            if ctx.queue.backend().shares_queue() {
                // After the drain wrote every entry: the tasks are queued again at once, for
                // another daemon to take over in milliseconds rather than after the lease.
                ctx.queue.backend().release();
            }
        })
        .await;
        let mut summary = std::mem::take(&mut self.summary);
        summary.shared_queue = self.ctx.queue.backend().shares_queue();
        self.ctx.work.update(|work| {
            for entry in work.iter() {
                if entry.status == ActiveStatus::Paused {
                    summary.paused.add(entry.task_id.as_str());
                } else {
                    summary.unfinished += 1;
                }
            }
        });
        tracing::info!(
            done = summary.done.count,
            failed = summary.failed.count,
            rejected = summary.rejected.count,
            paused = summary.paused.count,
            unfinished = summary.unfinished,
            "cairn daemon stopped"
        );
        summary
    }
}

/// Run blocking file work off the async thread; a panic there is re-raised here.
async fn runner_blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    match crate::runner::spawn_limited(work).await {
        Ok(value) => value,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

#[cfg(test)]
mod tests {
    use super::{run, DaemonConfig, DaemonError};
    use crate::shutdown::Shutdown;

    /// On a multi-thread runtime the daemon refuses to start, before it touches the queue.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_multi_thread_runtime_is_refused_before_the_queue_is_touched() {
        let dir = tempfile::tempdir().unwrap();
        let queue = dir.path().join("queue");
        let error = run(DaemonConfig::new(&queue), Shutdown::new())
            .await
            .expect_err("a multi-thread runtime");
        assert!(matches!(error, DaemonError::Runtime(_)), "{error}");
        assert!(error.to_string().contains("current-thread"), "{error}");
        assert!(!queue.exists(), "the queue was created");
    }
}
