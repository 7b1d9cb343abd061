//! `worker` phases: one long-running process that does its own looping and reports checkpoints
//! through its channel (see [`super::channel`]).
//!
//! Each `checkpoint` message becomes an iteration checkpoint exactly like a `loop` iteration
//! (written every `checkpoint_every` messages, and always the latest on exit or stop). On a stop
//! the worker's process group gets SIGTERM at once, so it can send its last checkpoint and exit
//! 75; past the stop grace it is killed. A restarted worker gets `CAIRN_RESUME`, the path of
//! `{"iteration":N,"state":...}` (one line, keys in that order, compact), so that even a shell
//! script can read it. Exit 0 ends the phase (output: the last `output` message, else the last
//! checkpoint's state); 75 asks to be resumed; anything else fails the attempt.
//!
//! A message with `"ack": true` is answered on the worker's ack pipe (`CAIRN_ACK`) once it is
//! handled, that is after its checkpoint is durable when one was due, so that a worker that
//! waits for the answer never runs ahead of its committed checkpoints: a crash re-runs only the
//! iteration in flight. Every case that leaves a waiting worker without its answer (the daemon
//! dies, the worker is stopped for a failed write or its budget) ends the worker: the answer
//! goes out before the SIGTERM's effect matters, and SIGKILL follows.

use std::path::PathBuf;
use std::process::ExitStatus;

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use serde_json::Value;
use tokio::time::Instant;

use super::channel::{AckPipe, Channel, ChannelError, CheckpointMessage, Message};
use super::checkpointing::{Files, PhaseCheckpointer};
use super::child::{group_of, kill_group, open_log, spawn_in_group, KILL_AFTER};
use super::confinement::FileOwner;
use super::spawn::{CommandProcess, Environment, StdinFrom, StdoutTo};
use super::worker_supervision::{Event, KillReason, Supervision};
use super::{PhaseEnd, PhaseError, PhaseRun};

/// The scope name of the daemon's worker checkpoints.
pub(super) const WORKER_SCOPE: &str = "worker";

/// Exit status with which a worker asks to be resumed from its last checkpoint.
pub(super) const EXIT_RESUME_ME: i32 = 75;

/// What the worker has told the daemon so far, and where its supervision stands.
struct WorkerState<'r, 'a> {
    checkpoints: PhaseCheckpointer<'r, 'a>,
    count: u64,
    /// The iteration count of the last durable checkpoint (where a restart would resume).
    committed: u64,
    state: Value,
    output: Option<Value>,
    cost_since_checkpoint: bool,
    /// Why the worker must stop, once decided (a failed checkpoint write, its budget).
    stop: Option<PhaseError>,
    supervision: Supervision,
}

impl WorkerState<'_, '_> {
    /// Move the supervision on by `event`, signalling the worker's group as it says.
    fn supervise(&mut self, event: Event, group: Option<Pid>) {
        let (next, signal) = self.supervision.on(event, Instant::now(), KILL_AFTER);
        self.supervision = next;
        if let Some(signal) = signal {
            kill_group(group, signal);
        }
    }
}

/// A started worker process and its two pipes.
struct Launched {
    child: CommandProcess,
    group: Option<Pid>,
    channel: Channel,
    ack: AckPipe,
}

pub(super) async fn run(run: &PhaseRun<'_>) -> Result<PhaseEnd, PhaseError> {
    let mut checkpoints = PhaseCheckpointer::new(run, WORKER_SCOPE);
    let resumed = checkpoints.resume().await?;
    if let Some(cp) = resumed.as_ref().filter(|cp| cp.done) {
        return Ok(PhaseEnd::Completed(
            cp.output
                .clone()
                .unwrap_or_else(|| cp.partial_results.clone()),
        ));
    }
    // A spent budget starts no worker (a finished phase, above, is not held back by it).
    run.check_budget(true, "")?;
    let (count, state, files) = match &resumed {
        Some(cp) => (
            cp.iteration_count,
            cp.partial_results.clone(),
            cp.files
                .iter()
                .map(|(name, f)| (name.clone(), f.path.clone()))
                .collect(),
        ),
        None => (0, Value::Null, Files::new()),
    };
    run.command_may_start().await?;
    let resume = resumed.is_some().then_some((count, &state, &files));
    let mut launched = launch(run, resume).await?;
    tracing::info!(task_id = %run.task.id(), phase = %run.phase.name, iteration = count, "worker started");
    let worker = WorkerState {
        checkpoints,
        count,
        committed: count,
        state,
        output: None,
        cost_since_checkpoint: false,
        stop: None,
        supervision: Supervision::Running,
    };
    let watch = run
        .ctx
        .max_log_bytes
        .map(|max| super::log_cap::Watch::start(&run.log_path(), max));
    let supervised = supervise(run, worker, &mut launched).await;
    if let Some(watch) = watch {
        watch.finish(None).await;
    }
    let (status, mut worker) = supervised?;
    // Leftover group members (helpers the worker started) go with it.
    kill_group(launched.group, Signal::SIGKILL);
    let status = status.map_err(|e| {
        if super::spawn::late_start_failure(&e).is_some() {
            let e = super::child::wait_error(
                run.phase.run.first().map_or("", String::as_str),
                &run.cwd(),
                e,
            );
            return super::spawn_failure(&describe(run), e);
        }
        PhaseError::Command(format!("{}: waiting for the worker: {e}", describe(run)))
    })?;
    for message in launched.channel.drain().await {
        worker = handle(run, worker, message, None, &launched.ack).await?;
    }
    drop(launched);
    conclude(run, worker, status).await
}

fn describe(run: &PhaseRun<'_>) -> String {
    format!("phase {:?}", run.phase.name)
}

fn transient(what: &str, e: std::io::Error) -> PhaseError {
    PhaseError::Transient(format!("{what}: {e}"))
}

/// Start the worker with its environment, its resume file (when it resumes from `resume`:
/// the iteration count, state and files of its checkpoint) and fresh pipes.
async fn launch(
    run: &PhaseRun<'_>,
    resume: Option<(u64, &Value, &Files)>,
) -> Result<Launched, PhaseError> {
    let resumed = resume.is_some();
    let count = resume.map_or(0, |(count, _, _)| count);
    let task_id = run.task.id();
    let run_dir = run.ctx.queue.run_dir(task_id);
    let mut env = run.env(None);
    env.retain(|(k, _)| k != "CAIRN_IDEMPOTENCY_KEY");
    env.push((
        "CAIRN_IDEMPOTENCY_KEY".into(),
        format!("{task_id}:{}:{count}", run.phase.name),
    ));
    // A fresh name per attempt: a helper process orphaned by an earlier crash cannot write
    // into this attempt's channel.
    let files = WorkerFiles {
        resume_path: run_dir.join(format!("resume-{}.json", run.index)),
        resume_line: resume.map(|(count, state, files)| resume_line(count, state, files)),
        channel_path: run_dir.join(format!("channel-{}-{}", run.index, run.attempt)),
        ack_path: run_dir.join(format!("ack-{}-{}", run.index, run.attempt)),
        log_path: run.log_path(),
        log_header: run.log_header(None),
        owner: run.confinement.file_owner(),
    };
    if resumed {
        env.push((
            "CAIRN_RESUME".into(),
            files.resume_path.display().to_string(),
        ));
    }
    let channel_path = files.channel_path.clone();
    env.push(("CAIRN_CHANNEL".into(), channel_path.display().to_string()));
    env.push(("CAIRN_ACK".into(), files.ack_path.display().to_string()));
    let (ack, log) = super::blocking(move || files.make()).await??;
    let channel =
        Channel::open(&channel_path).map_err(|e| transient("opening the worker channel", e))?;
    let child = spawn_in_group(
        &run.phase.run,
        &run.cwd(),
        Environment {
            inherited: &run.ctx.inherited_env,
            task: &env,
        },
        log,
        StdinFrom::Null,
        StdoutTo::Log,
        &run.confinement.spawn,
    )
    .map_err(|e| super::spawn_failure(&describe(run), e))?;
    let group = group_of(&child);
    Ok(Launched {
        child,
        group,
        channel,
        ack,
    })
}

/// `{"iteration":N,"state":...}` (and `"files":{...}` when the checkpoint names files): one
/// compact line, keys in that order, so that a shell script can read it.
fn resume_line(count: u64, state: &Value, files: &Files) -> String {
    let state = serde_json::to_string(state).unwrap_or_else(|_| "null".into());
    if files.is_empty() {
        return format!("{{\"iteration\":{count},\"state\":{state}}}\n");
    }
    let files = serde_json::to_string(files).unwrap_or_else(|_| "{}".into());
    format!("{{\"iteration\":{count},\"state\":{state},\"files\":{files}}}\n")
}

/// The files a worker's start makes in its run directory, made on the blocking pool (each is
/// an inode to allocate, which can wait for the disk): its resume file, its channel and ack
/// FIFOs, its log.
struct WorkerFiles {
    resume_path: PathBuf,
    /// The resume file's line, when the worker resumes; without it a stale file is removed.
    resume_line: Option<String>,
    channel_path: PathBuf,
    ack_path: PathBuf,
    log_path: PathBuf,
    log_header: String,
    /// Who the files are handed to (the submitter, with `--run-as-submitter`).
    owner: FileOwner,
}

impl WorkerFiles {
    /// Blocking. The channel is made here and opened by the caller, on the runtime.
    fn make(self) -> Result<(AckPipe, std::fs::File), PhaseError> {
        match &self.resume_line {
            Some(line) => {
                // Removed first: with --run-as-submitter the last one belongs to the submitter.
                let _ = std::fs::remove_file(&self.resume_path);
                crate::store::modes::write_file(&self.resume_path, line.as_bytes())
                    .and_then(|()| self.owner.hand_over(&self.resume_path, 0o600))
                    .map_err(|e| transient("writing the resume file", e))?;
            }
            None => match std::fs::remove_file(&self.resume_path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(transient("removing a stale resume file", e));
                }
                _ => {}
            },
        }
        Channel::make(&self.channel_path)
            .map_err(|e| transient("creating the worker channel", e))?;
        self.owner
            .hand_over(&self.channel_path, 0o600)
            .map_err(|e| transient("handing the worker channel to the submitter", e))?;
        let ack = AckPipe::create(&self.ack_path)
            .map_err(|e| transient("creating the worker's ack pipe", e))?;
        self.owner
            .hand_over(ack.path(), 0o600)
            .map_err(|e| transient("handing the worker's ack pipe to the submitter", e))?;
        let log = open_log(&self.log_path, &self.log_header)
            .map_err(|e| transient("opening the log", e))?;
        Ok((ack, log))
    }
}

/// Handle the worker's messages until it exits, moving its supervision on at every stop
/// request, deadline and decision to stop it.
async fn supervise<'r, 'a>(
    run: &PhaseRun<'_>,
    mut worker: WorkerState<'r, 'a>,
    launched: &mut Launched,
) -> Result<(std::io::Result<ExitStatus>, WorkerState<'r, 'a>), PhaseError> {
    let started = Instant::now();
    let mut last_heard = Instant::now();
    let group = launched.group;
    loop {
        let heartbeat_deadline = run.phase.heartbeat_timeout.map(|t| last_heard + t);
        let timeout_deadline = run.phase.timeout.map(|t| started + t);
        let now = worker.supervision;
        let event = tokio::select! {
            status = launched.child.wait() => return Ok((status, worker)),
            message = launched.channel.next() => {
                worker = handle(run, worker, message, group, &launched.ack).await?;
                // After the handling too: a slow disk is not the worker's silence.
                last_heard = Instant::now();
                Event::MessageHandled
            }
            _ = run.stop_requested(), if now.awaits_stop_request() => Event::StopRequested {
                daemon_stopping: run.ctx.shutdown.is_stopping(),
            },
            _ = run.ctx.shutdown.terminating(), if now.not_killed() => Event::GraceOver,
            _ = sleep_until(heartbeat_deadline), if now.watches_heartbeat() => Event::HeartbeatMissed,
            _ = sleep_until(timeout_deadline), if now.not_killed() => Event::TimedOut,
            _ = sleep_until(now.kill_at()), if now.not_killed() => Event::KillDue,
        };
        worker.supervise(event, group);
    }
}

/// How the phase ends, once the worker has exited and its last messages are handled.
async fn conclude(
    run: &PhaseRun<'_>,
    worker: WorkerState<'_, '_>,
    status: ExitStatus,
) -> Result<PhaseEnd, PhaseError> {
    let WorkerState {
        mut checkpoints,
        count,
        state,
        output,
        stop,
        supervision,
        ..
    } = worker;
    checkpoints.flush().await?;
    let what = describe(run);
    let log_note = format!("its output is in {}", run.log_path().display());
    if let Some(stop) = stop {
        return Err(stop);
    }
    match supervision {
        Supervision::Killed(KillReason::Silent) => {
            return Err(PhaseError::Command(format!(
                "{what}: the worker sent nothing on its channel for {} (heartbeat_timeout) and was killed; {log_note}",
                humantime::format_duration(run.phase.heartbeat_timeout.unwrap_or_default())
            )))
        }
        Supervision::Killed(KillReason::TimedOut) => {
            return Err(PhaseError::Command(format!(
                "{what}: the worker timed out after {}; {log_note}",
                humantime::format_duration(run.phase.timeout.unwrap_or_default())
            )))
        }
        _ => {}
    }
    match status.code() {
        Some(0) => {
            let result = output.unwrap_or_else(|| state.clone());
            checkpoints
                .finish(count, state, Some(result.clone()), Files::new())
                .await?;
            Ok(PhaseEnd::Completed(result))
        }
        _ if run.should_stop() => {
            tracing::info!(task_id = %run.task.id(), phase = %run.phase.name, iteration = count, %status, "worker stopped");
            Ok(PhaseEnd::Interrupted)
        }
        Some(EXIT_RESUME_ME) => Err(PhaseError::Transient(format!(
            "{what}: the worker exited {EXIT_RESUME_ME} (resume me) at iteration {count}"
        ))),
        _ => Err(PhaseError::Command(format!(
            "{what}: the worker failed ({status}); {log_note}"
        ))),
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Take one channel message into account, and answer it on the ack pipe if it asked.
async fn handle<'r, 'a>(
    run: &PhaseRun<'_>,
    mut worker: WorkerState<'r, 'a>,
    message: Result<Message, ChannelError>,
    group: Option<Pid>,
    ack: &AckPipe,
) -> Result<WorkerState<'r, 'a>, PhaseError> {
    let message = match message {
        Ok(message) => message,
        Err(problem) => {
            tracing::warn!(task_id = %run.task.id(), phase = %run.phase.name, "worker channel: {problem}");
            note_in_log(run, &format!("cairn: ignored a channel line: {problem}"));
            // A helper waiting for its answer must not wait for ever.
            ack.refuse(&problem.to_string());
            return Ok(worker);
        }
    };
    if let Some(cost) = message.cost {
        take_cost(run, &mut worker, cost, group).await;
    }
    if let Some(progress) = message.progress {
        run.set_progress(progress.done, progress.total);
    }
    if let Some(output) = message.output {
        worker.output = Some(output);
    }
    let acknowledged = match message.checkpoint {
        Some(checkpoint) => {
            let iteration = checkpoint.iteration;
            worker = take_checkpoint(run, worker, checkpoint, group).await;
            iteration
        }
        None => worker.count,
    };
    if message.ack == Some(true) {
        ack.acknowledge(acknowledged, worker.committed);
    }
    Ok(worker)
}

/// Add a reported cost; reaching the budget stops the worker at once, checkpoint or not.
async fn take_cost(
    run: &PhaseRun<'_>,
    worker: &mut WorkerState<'_, '_>,
    cost: f64,
    group: Option<Pid>,
) {
    if !(cost.is_finite() && cost >= 0.0) {
        note_in_log(
            run,
            &format!("cairn: ignored a cost of {cost}: it must be a number of at least 0"),
        );
        return;
    }
    if let Err(e) = run.add_iteration_cost(cost).await {
        stop_worker(worker, e, group);
    }
    worker.cost_since_checkpoint = true;
    // Reaching the budget stops the worker at once, checkpoint or not.
    if let Err(stop) = run.check_budget(true, "") {
        stop_worker(worker, stop, group);
    }
}

/// Record a checkpoint message: written now when due (see `checkpoint_every`).
async fn take_checkpoint<'r, 'a>(
    run: &PhaseRun<'_>,
    mut worker: WorkerState<'r, 'a>,
    checkpoint: CheckpointMessage,
    group: Option<Pid>,
) -> WorkerState<'r, 'a> {
    if checkpoint.iteration < worker.count {
        note_in_log(
            run,
            &format!(
                "cairn: ignored a checkpoint of iteration {}, older than {}",
                checkpoint.iteration, worker.count
            ),
        );
        return worker;
    }
    // Only new iterations must have reported their cost; a repeated checkpoint (the last
    // one again, sent on a stop) adds no work.
    let advanced = checkpoint.iteration > worker.count;
    let cost_known = !advanced || std::mem::take(&mut worker.cost_since_checkpoint);
    worker.count = checkpoint.iteration;
    worker.state = checkpoint.state;
    let count = worker.count;
    let files = checkpoint.files;
    // Decide on the budget before the (fsynced) write, so that a worker over its budget
    // gets SIGTERM without waiting for the disk, and starts no further paid iteration.
    if let Err(stop) = run.check_budget(cost_known, &format!("the work up to checkpoint {count}")) {
        stop_worker(&mut worker, stop, group);
    }
    let written = worker
        .checkpoints
        .checkpoint(count, worker.state.clone(), files)
        .await;
    run.ctx.work.update(|w| {
        if let Some(entry) = w.get_mut(run.task.id()) {
            entry.iterations = count;
        }
    });
    match written {
        Ok(true) => worker.committed = count,
        Ok(false) => {}
        // SIGTERM before the answer, so that a helper reading "not committed" already
        // knows it is stopping.
        Err(e) => stop_worker(&mut worker, e, group),
    }
    worker
}

/// Decide that the worker must stop (the first reason wins) and send it SIGTERM once.
fn stop_worker(worker: &mut WorkerState<'_, '_>, why: PhaseError, group: Option<Pid>) {
    worker.supervise(Event::ToldToStop, group);
    worker.stop.get_or_insert(why);
}

fn note_in_log(run: &PhaseRun<'_>, line: &str) {
    use std::io::Write;
    if let Ok(mut log) = std::fs::OpenOptions::new()
        .append(true)
        .open(run.log_path())
    {
        let _ = writeln!(log, "{line}");
    }
}
