//! `cairn bench queue`: the real daemon (`cairn run`, this very binary) against fresh queue
//! directories, with real task files renamed into `inbox/`, as users drop them.
//!
//! Five measurements, one JSON line each (the loop one twice):
//! - `throughput`: `--tasks` one-phase tasks running `true` renamed into the inbox of an idle
//!   daemon all at once; tasks/s from the first rename to the last task's `done` event. Their
//!   pickup latencies are printed too, but in a burst they are mostly queueing behind
//!   `--max-tasks`.
//! - `pickup`: `--paced-tasks` tasks dropped one at a time into an idle daemon (each after the
//!   previous one is done and `--pace` has passed): the latency from the rename into `inbox/` to
//!   the task being accepted and to its first phase starting.
//! - `loop`: one task with a `loop` phase of `--loop-iterations` iterations of `echo {}`; the
//!   phase's wall time per iteration, the same command's own run time (spawned as often from
//!   here, with the same stdin/stdout pipes), and the difference. Once with a checkpoint after
//!   every iteration (the default), once with only the final one.
//! - `resume`: `--resume-tasks` tasks in flight in `current_work.json`, as a daemon killed with
//!   SIGKILL leaves them (status `running`, one loop iteration done and checkpointed, one to
//!   go), built with the library's own types; then a daemon is started and timed until it is
//!   ready (READY=1 on `NOTIFY_SOCKET`), until every task has resumed (its new attempt durably
//!   on record and its phase under way), and until every task is done. Its `--max-tasks` is
//!   the number of tasks, since that many were running when the daemon was killed.
//! - `running`: `--running-tasks` tasks whose one command sleeps for an hour, in `inbox/` when
//!   a daemon with that `--max-tasks` starts; once they all run (or their number has not grown
//!   for `PLATEAU`, 30 s), how many ran at once, how long they took to start and the daemon's
//!   peak memory. The resume figure's commands end within milliseconds, so its tasks are never
//!   all running together; this one's are. The daemon is then stopped, which ends the commands.
//!
//! Times come from the daemon's own records: the event journal `runs/<id>/events.jsonl`
//! (nanosecond RFC 3339 timestamps from the same clock as the bench's), never from polling.
//! Peak memory is the daemon's `VmHWM`, read from `/proc/<pid>/status` before it is stopped.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context};
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{json, Value};

use super::proc_stats::cpu_times;
use super::{millis, percentile, round_to};
use cairn::queue::QueueDir;
use cairn::store::current_work::{ActiveStatus, ActiveTask, CurrentWork, PhaseTiming};
use cairn::store::journal::{self, Event, JournalEvent};
use cairn::store::{CheckpointStore, FileStorage, LoopCheckpointer, Storage, UnsyncedFileOps};
use cairn::task::Task;

/// What `cairn bench queue` measures, and how (its options, as `cli::bench` parses them).
#[derive(Debug, Clone)]
pub(crate) struct QueueOptions {
    /// Tasks dropped into the inbox at once for the throughput figure.
    pub tasks: usize,
    /// Tasks dropped one at a time into an idle daemon for the pickup-latency figure.
    pub paced_tasks: usize,
    /// The pause between a paced task being done and the next one being dropped.
    pub pace: Duration,
    /// Iterations of the loop-overhead task.
    pub loop_iterations: u64,
    /// Tasks in flight in current_work.json for the resume figure.
    pub resume_tasks: usize,
    /// One-command tasks run by cairn and by pueue (when installed) side by side.
    pub side_by_side_tasks: usize,
    /// The daemon's --max-tasks (and pueue's parallelism) in the throughput, pickup, loop and
    /// side-by-side runs.
    pub max_tasks: usize,
    /// The daemon's --max-tasks in the resume run (default: `resume_tasks`).
    pub resume_max_tasks: Option<usize>,
    /// Tasks started at once, and kept running, for the running figure.
    pub running_tasks: usize,
    /// Only these measurements; all of them when empty.
    pub only: Vec<Measurement>,
    /// Where run directories are made.
    pub dir: PathBuf,
    /// Keep the run's queues and daemon logs.
    pub keep: bool,
    /// Run the daemons on a shared queue in this PostgreSQL database (`--db`): the intake,
    /// pickup and resume figures only, see `queue_db`.
    pub db: Option<String>,
}

/// One of the benchmark's measurements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Measurement {
    Throughput,
    Pickup,
    Loop,
    Resume,
    /// cairn and pueue (when installed) on the same one-command tasks, same parallelism.
    SideBySide,
    /// --running-tasks tasks running at once: the daemon's peak memory with all of them.
    Running,
}

/// The command of the one-phase tasks: `true` prints nothing, and a `once` phase takes empty
/// stdout as the output `null` (see `runner/once.rs`).
pub(super) const ONCE_COMMAND: &[&str] = &["true"];

/// The command of the loop tasks: a loop reply must be JSON, and `{}` is the smallest valid
/// one (state `null`, not done).
const LOOP_COMMAND: &[&str] = &["echo", "{}"];

/// The reply of a resumed task's last iteration: done, so the loop ends there.
pub(super) const RESUME_COMMAND: &[&str] = &["echo", "{\"done\": true}"];

/// The command of the running figure's tasks: it outlives the measurement, and stopping the
/// daemon ends it.
const RUNNING_COMMAND: &[&str] = &["sleep", "3600"];

/// When the number of commands running has not grown for this long, the running figure is
/// taken with what runs (commands that found no descriptor wait their backoff to start).
const PLATEAU: Duration = Duration::from_secs(30);

/// With no task finishing for this long, the bench gives up (the daemon's log says why).
pub(super) const STALL_LIMIT: Duration = Duration::from_secs(120);

/// How long an idle daemon may take to exit after SIGTERM.
const STOP_LIMIT: Duration = Duration::from_secs(60);

/// Run the queue benchmarks on a queue directory, printing one JSON line per figure.
pub(super) fn run(args: &QueueOptions) -> anyhow::Result<()> {
    let wanted = |m: Measurement| args.only.is_empty() || args.only.contains(&m);
    let parent = super::RunDirParent::create(&args.dir)?;
    let root = fresh_root(&args.dir)?;
    let bench = QueueBench {
        root: root.clone(),
        max_tasks: args.max_tasks,
    };
    let result = (|| {
        if wanted(Measurement::Throughput) {
            print_line(&bench.throughput(args.tasks)?)?;
        }
        if wanted(Measurement::Pickup) {
            print_line(&bench.pickup(args.paced_tasks, args.pace)?)?;
        }
        if wanted(Measurement::Loop) {
            for line in bench.loop_overhead(args.loop_iterations)? {
                print_line(&line)?;
            }
        }
        if wanted(Measurement::SideBySide) {
            bench.side_by_side(args.side_by_side_tasks)?;
        }
        if wanted(Measurement::Resume) {
            let max_tasks = args.resume_max_tasks.unwrap_or(args.resume_tasks.max(1));
            print_line(&bench.resume(args.resume_tasks, max_tasks)?)?;
        }
        if wanted(Measurement::Running) {
            print_line(&bench.running(args.running_tasks.max(1))?)?;
        }
        anyhow::Ok(())
    })();
    if args.keep || result.is_err() {
        eprintln!("queues and daemon logs kept in {}", root.display());
    } else {
        fs::remove_dir_all(&root).with_context(|| format!("removing {}", root.display()))?;
        parent.remove_if_empty();
    }
    result
}

/// Print one result line at once (a long run shows each figure as it is measured).
pub(super) fn print_line(line: &impl Serialize) -> anyhow::Result<()> {
    let text = serde_json::to_string(line).context("printing a result")?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}").context("writing to stdout")?;
    out.flush().context("writing to stdout")
}

/// A new, empty directory for this run under `dir` (which exists).
pub(super) fn fresh_root(dir: &Path) -> anyhow::Result<PathBuf> {
    let root = tempfile::Builder::new()
        .prefix("cairn-queue-")
        .tempdir_in(dir)
        .with_context(|| format!("creating a run directory in {}", dir.display()))?;
    let root = root.keep();
    std::path::absolute(&root).with_context(|| format!("resolving {}", root.display()))
}

/// The `throughput` line.
#[derive(Debug, Serialize)]
pub(crate) struct ThroughputLine {
    pub(super) bench: &'static str,
    pub(super) what: &'static str,
    #[serde(rename = "impl")]
    pub(super) implementation: &'static str,
    pub(super) tasks: usize,
    pub(super) max_tasks: usize,
    pub(super) command: String,
    /// From the first rename into the inbox to the last task's `done` event.
    pub(super) seconds: f64,
    pub(super) tasks_s: f64,
    /// Rename into the inbox → first phase started, queueing behind `max_tasks` included.
    pub(super) pickup_p50_ms: f64,
    pub(super) pickup_p99_ms: f64,
    pub(super) peak_rss_mib: f64,
}

/// The `pickup` line.
#[derive(Debug, Serialize)]
pub(crate) struct PickupLine {
    pub(super) bench: &'static str,
    pub(super) what: &'static str,
    /// `cairn`, or `cairn-postgres` with `--db`.
    #[serde(rename = "impl")]
    pub(super) implementation: &'static str,
    pub(super) tasks: usize,
    pub(super) command: String,
    /// Rename into the inbox → accepted (`tasks/<id>.json` written durably).
    pub(super) accept_p50_ms: f64,
    pub(super) accept_p99_ms: f64,
    /// Rename into the inbox → first phase started (its command about to be spawned).
    pub(super) pickup_p50_ms: f64,
    pub(super) pickup_p99_ms: f64,
    pub(super) pickup_max_ms: f64,
    /// Rename into the inbox → `done` (record written).
    pub(super) done_p50_ms: f64,
    pub(super) peak_rss_mib: f64,
}

/// A `loop` line.
#[derive(Debug, Serialize)]
pub(crate) struct LoopLine {
    bench: &'static str,
    what: &'static str,
    iterations: u64,
    checkpoint_every: u64,
    command: String,
    /// The phase's wall time (`phase_started` → `phase_finished`) per iteration.
    per_iteration_ms: f64,
    /// The command's own run time, spawned from the bench with the same pipes, per run.
    command_ms: f64,
    /// The difference: what the daemon adds to each iteration.
    overhead_ms: f64,
    peak_rss_mib: f64,
}

/// The `running` line.
#[derive(Debug, Serialize)]
pub(crate) struct RunningLine {
    bench: &'static str,
    what: &'static str,
    tasks: usize,
    max_tasks: usize,
    command: String,
    /// The most commands the daemon had running at once (its children): `tasks`, unless some
    /// found no descriptor (or process) free and were still waiting to start.
    running_at_once: usize,
    /// Daemon spawned → that many running.
    all_running_ms: f64,
    /// The daemon's peak resident memory once they ran (issue 16's bar for 10,000: under
    /// 150 MB).
    peak_rss_mib: f64,
    /// The daemon's limit on open files, as it raised it (two per command in flight).
    open_files_limit: u64,
}

/// The `resume` line.
#[derive(Debug, Serialize)]
pub(crate) struct ResumeLine {
    pub(super) bench: &'static str,
    pub(super) what: &'static str,
    /// `cairn`, or `cairn-postgres` with `--db`.
    #[serde(rename = "impl")]
    pub(super) implementation: &'static str,
    pub(super) tasks: usize,
    pub(super) max_tasks: usize,
    pub(super) command: String,
    /// Size of the `current_work.json` the daemon starts from (files only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) current_work_bytes: Option<u64>,
    /// Daemon process spawned → READY=1 (queue locked, every task recovered and lined up).
    pub(super) ready_ms: f64,
    /// Daemon spawned → the first task resumed: its new attempt durably on record and its
    /// phase under way (the `phase_started` event, before the checkpoint is read).
    pub(super) first_resumed_ms: f64,
    /// Daemon spawned → the last task resumed (every task resumed).
    pub(super) all_resumed_ms: f64,
    /// Daemon spawned → the last task done.
    pub(super) all_done_ms: f64,
    /// The commands' own time: the same number of runs of the same command, spawned by the
    /// bench directly (no daemon) with as many at once as there are CPUs, each
    /// with its request on a stdin pipe and its reply read from a pipe, one after the other
    /// in that window, after the daemon has stopped.
    pub(super) commands_alone_ms: f64,
    /// `all_done_ms` − `commands_alone_ms`: what the daemon adds to the commands' own time
    /// (issue 16's bar for 10,000 tasks: under 15 s).
    pub(super) beyond_commands_ms: f64,
    /// CPU time of the daemon's own threads (user + system), and of the commands it ran and
    /// reaped, read from `/proc/<pid>/stat` before it is stopped: unlike the times above, these
    /// hardly move with what else the machine runs.
    pub(super) daemon_cpu_ms: f64,
    /// `daemon_cpu_ms` split into user and system time, and the part of it spent by the
    /// daemon's async thread (its main thread): where a run that takes more CPU than others
    /// spends it.
    pub(super) daemon_user_ms: f64,
    pub(super) daemon_system_ms: f64,
    pub(super) async_thread_ms: f64,
    pub(super) commands_cpu_ms: f64,
    pub(super) peak_rss_mib: f64,
}

struct QueueBench {
    /// The run directory; each measurement works in its own subdirectory.
    root: PathBuf,
    max_tasks: usize,
}

impl QueueBench {
    /// A fresh queue for one measurement, with a staging directory beside it on the same file
    /// system (task files are written there and renamed into the inbox).
    fn prepare(&self, name: &str) -> anyhow::Result<(PathBuf, PathBuf)> {
        let dir = self.root.join(name);
        let queue = dir.join("queue");
        let staging = dir.join("staging");
        fs::create_dir_all(&staging).with_context(|| format!("creating {}", staging.display()))?;
        QueueDir::new(&queue)
            .create_all()
            .with_context(|| format!("creating the queue {}", queue.display()))?;
        Ok((queue, staging))
    }

    fn throughput(&self, tasks: usize) -> anyhow::Result<ThroughputLine> {
        self.throughput_as("throughput", tasks)
    }

    /// The cairn line, then pueue's (or why there is none), of the same tasks run
    /// `max_tasks` at a time.
    fn side_by_side(&self, tasks: usize) -> anyhow::Result<()> {
        let mut cairn = self.throughput_as("side_by_side", tasks)?;
        cairn.implementation = "cairn";
        print_line(&cairn)?;
        let Some(pueue) = super::pueue::find() else {
            eprintln!(
                "side_by_side: pueue is not installed (no `pueue` and `pueued` on the PATH; \
                 `cargo install pueue` installs them): only cairn was measured"
            );
            return print_line(&serde_json::json!({
                "bench": "queue", "what": "side_by_side", "impl": "pueue",
                "skipped": "pueue and pueued not found on the PATH",
            }));
        };
        let dir = self.root.join("side_by_side").join("pueue");
        let line = super::pueue::run(pueue, &dir, tasks, self.max_tasks, &ONCE_COMMAND.join(" "))?;
        print_line(&line)
    }

    fn throughput_as(&self, what: &'static str, tasks: usize) -> anyhow::Result<ThroughputLine> {
        let (queue, staging) = self.prepare(what)?;
        let mut daemon = Daemon::start(&queue, self.max_tasks, None)?;
        warm_up(&mut daemon, &queue, &staging)?;
        let ids: Vec<String> = (0..tasks).map(|i| format!("t{i:06}")).collect();
        for id in &ids {
            stage(&staging, id, &once_task(id))?;
        }
        let started = SystemTime::now();
        let mut dropped = Vec::with_capacity(tasks);
        for id in &ids {
            dropped.push(drop_into_inbox(&staging, &queue, id)?);
        }
        wait_for_done(&mut daemon, &queue, tasks + 1)?;
        let peak = daemon.peak_rss_mib()?;
        daemon.stop()?;

        let mut pickups = Vec::with_capacity(tasks);
        let mut last_done = started;
        for (id, renamed) in ids.iter().zip(&dropped) {
            let events = TaskEvents::read(&queue, id)?;
            pickups.push(since(*renamed, events.last_phase_started(id)?));
            last_done = last_done.max(events.last_done(id)?);
        }
        pickups.sort_unstable();
        let elapsed = last_done.duration_since(started).unwrap_or_default();
        Ok(ThroughputLine {
            bench: "queue",
            what,
            implementation: "cairn",
            tasks,
            max_tasks: self.max_tasks,
            command: ONCE_COMMAND.join(" "),
            seconds: round_to(elapsed.as_secs_f64(), 3),
            tasks_s: round_to(tasks as f64 / elapsed.as_secs_f64().max(1e-9), 1),
            pickup_p50_ms: millis(percentile(&pickups, 0.50)),
            pickup_p99_ms: millis(percentile(&pickups, 0.99)),
            peak_rss_mib: peak,
        })
    }

    fn pickup(&self, tasks: usize, pace: Duration) -> anyhow::Result<PickupLine> {
        let (queue, staging) = self.prepare("pickup")?;
        let mut daemon = Daemon::start(&queue, self.max_tasks, None)?;
        warm_up(&mut daemon, &queue, &staging)?;
        let mut accepts = Vec::with_capacity(tasks);
        let mut pickups = Vec::with_capacity(tasks);
        let mut dones = Vec::with_capacity(tasks);
        let mut dropped = Vec::with_capacity(tasks);
        for i in 0..tasks {
            let id = format!("p{i:06}");
            stage(&staging, &id, &once_task(&id))?;
            std::thread::sleep(pace);
            dropped.push((id.clone(), drop_into_inbox(&staging, &queue, &id)?));
            wait_for_record(&mut daemon, &queue, &id)?;
        }
        let peak = daemon.peak_rss_mib()?;
        daemon.stop()?;
        for (id, renamed) in &dropped {
            let events = TaskEvents::read(&queue, id)?;
            accepts.push(since(
                *renamed,
                events.last("accepted", id, |e| matches!(e, Event::Accepted { .. }))?,
            ));
            pickups.push(since(*renamed, events.last_phase_started(id)?));
            dones.push(since(*renamed, events.last_done(id)?));
        }
        for list in [&mut accepts, &mut pickups, &mut dones] {
            list.sort_unstable();
        }
        Ok(PickupLine {
            bench: "queue",
            what: "pickup",
            implementation: "cairn",
            tasks,
            command: ONCE_COMMAND.join(" "),
            accept_p50_ms: millis(percentile(&accepts, 0.50)),
            accept_p99_ms: millis(percentile(&accepts, 0.99)),
            pickup_p50_ms: millis(percentile(&pickups, 0.50)),
            pickup_p99_ms: millis(percentile(&pickups, 0.99)),
            pickup_max_ms: millis(percentile(&pickups, 1.0)),
            done_p50_ms: millis(percentile(&dones, 0.50)),
            peak_rss_mib: peak,
        })
    }

    fn loop_overhead(&self, iterations: u64) -> anyhow::Result<Vec<LoopLine>> {
        if iterations == 0 {
            bail!("--loop-iterations must be at least 1");
        }
        let (queue, staging) = self.prepare("loop")?;
        let mut daemon = Daemon::start(&queue, self.max_tasks, None)?;
        warm_up(&mut daemon, &queue, &staging)?;
        let mut walls = Vec::new();
        for every in [1, iterations] {
            let id = format!("loop-every-{every}");
            let task = json!({
                "id": id,
                "phases": [{
                    "name": "spin",
                    "kind": "loop",
                    "run": LOOP_COMMAND,
                    "max_iterations": iterations,
                    "checkpoint_every": every,
                }],
            });
            stage(&staging, &id, &task)?;
            drop_into_inbox(&staging, &queue, &id)?;
            wait_for_record(&mut daemon, &queue, &id)?;
            let events = TaskEvents::read(&queue, &id)?;
            let wall = events
                .last("phase_finished", &id, |e| {
                    matches!(e, Event::PhaseFinished { .. })
                })?
                .duration_since(events.last_phase_started(&id)?)
                .unwrap_or_default();
            walls.push((id, every, wall));
        }
        let peak = daemon.peak_rss_mib()?;
        daemon.stop()?;

        let command = own_run_time(&queue, iterations)?;
        Ok(walls
            .into_iter()
            .map(|(_, every, wall)| {
                let per_iteration = wall / iterations as u32;
                LoopLine {
                    bench: "queue",
                    what: "loop",
                    iterations,
                    checkpoint_every: every,
                    command: LOOP_COMMAND.join(" "),
                    per_iteration_ms: millis(per_iteration),
                    command_ms: millis(command),
                    overhead_ms: round_to(
                        (per_iteration.as_secs_f64() - command.as_secs_f64()) * 1e3,
                        4,
                    ),
                    peak_rss_mib: peak,
                }
            })
            .collect())
    }

    fn resume(&self, tasks: usize, max_tasks: usize) -> anyhow::Result<ResumeLine> {
        let (queue, _) = self.prepare("resume")?;
        let ids: Vec<String> = (0..tasks).map(|i| format!("r{i:06}")).collect();
        let current_work_bytes = build_crashed_queue(&queue, &ids)?;
        let notify = ReadyListener::start()?;
        let spawned = Instant::now();
        let spawned_at = SystemTime::now();
        let mut daemon = Daemon::start(&queue, max_tasks, Some(&notify.path))?;
        wait_for_done(&mut daemon, &queue, tasks)?;
        let ready = notify.ready_after(spawned)?;
        let peak = daemon.peak_rss_mib()?;
        let cpu = cpu_times(&format!("/proc/{}/stat", daemon.pid()))?;
        let async_thread = cpu_times(&format!("/proc/{0}/task/{0}/stat", daemon.pid()))?;
        daemon.stop()?;
        drop(notify);

        let mut first_resumed: Option<SystemTime> = None;
        let mut all_resumed = spawned_at;
        let mut all_done = spawned_at;
        for id in &ids {
            let events = TaskEvents::read(&queue, id)?;
            let resumed = events.last_phase_started(id)?;
            first_resumed = Some(first_resumed.map_or(resumed, |f| f.min(resumed)));
            all_resumed = all_resumed.max(resumed);
            all_done = all_done.max(events.last_done(id)?);
            check_resumed(&queue, id)?;
        }
        let after = |t: SystemTime| millis(t.duration_since(spawned_at).unwrap_or_default());
        let commands_alone = millis(commands_alone(&queue, tasks)?);
        let all_done_ms = after(all_done);
        Ok(ResumeLine {
            bench: "queue",
            what: "resume",
            implementation: "cairn",
            tasks,
            max_tasks,
            command: RESUME_COMMAND.join(" "),
            current_work_bytes: Some(current_work_bytes),
            ready_ms: millis(ready),
            first_resumed_ms: after(first_resumed.unwrap_or(spawned_at)),
            all_resumed_ms: after(all_resumed),
            all_done_ms,
            commands_alone_ms: commands_alone,
            beyond_commands_ms: round_to(all_done_ms - commands_alone, 4),
            daemon_cpu_ms: round_to(cpu.user_ms + cpu.system_ms, 1),
            daemon_user_ms: cpu.user_ms,
            daemon_system_ms: cpu.system_ms,
            async_thread_ms: async_thread.user_ms + async_thread.system_ms,
            commands_cpu_ms: cpu.children_ms,
            peak_rss_mib: peak,
        })
    }

    /// `tasks` long commands started at once; see the module doc.
    fn running(&self, tasks: usize) -> anyhow::Result<RunningLine> {
        let (queue, _) = self.prepare("running")?;
        let inbox = QueueDir::new(&queue).inbox();
        for i in 0..tasks {
            let id = format!("w{i:06}");
            let task = json!({"id": id, "phases": [{"name": "hold", "run": RUNNING_COMMAND}]});
            // Into the inbox itself: no daemon watches it yet.
            stage(&inbox, &id, &task)?;
        }
        let spawned = Instant::now();
        let mut daemon = Daemon::start(&queue, tasks, None)?;
        let (mut most, mut grew_at) = (0, Instant::now());
        let mut all_running = Duration::ZERO;
        while most < tasks && grew_at.elapsed() < PLATEAU {
            std::thread::sleep(Duration::from_millis(100));
            daemon.check_running()?;
            let running = children_of(daemon.pid());
            if running > most {
                (most, grew_at) = (running, Instant::now());
                all_running = spawned.elapsed();
            }
        }
        let peak = daemon.peak_rss_mib()?;
        let open_files_limit = open_files_limit(daemon.pid())?;
        daemon.stop()?;
        Ok(RunningLine {
            bench: "queue",
            what: "running",
            tasks,
            max_tasks: tasks,
            command: RUNNING_COMMAND.join(" "),
            running_at_once: most,
            all_running_ms: millis(all_running),
            peak_rss_mib: peak,
            open_files_limit,
        })
    }
}

/// How many child processes `pid` has (`/proc/<pid>/task/*/children`).
fn children_of(pid: i32) -> usize {
    let Ok(threads) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    threads
        .filter_map(Result::ok)
        .filter_map(|thread| fs::read_to_string(thread.path().join("children")).ok())
        .map(|children| children.split_whitespace().count())
        .sum()
}

/// The soft limit on open files of process `pid` (`/proc/<pid>/limits`).
fn open_files_limit(pid: i32) -> anyhow::Result<u64> {
    let path = format!("/proc/{pid}/limits");
    let limits = fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    limits
        .lines()
        .find_map(|line| {
            let rest = line.strip_prefix("Max open files")?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .with_context(|| format!("no \"Max open files\" in {path}"))
}

/// A one-phase task running [`ONCE_COMMAND`].
pub(super) fn once_task(id: &str) -> Value {
    json!({"id": id, "phases": [{"name": "noop", "run": ONCE_COMMAND}]})
}

/// Write a task file into the staging directory (not watched by the daemon).
pub(super) fn stage(staging: &Path, id: &str, task: &Value) -> anyhow::Result<()> {
    let path = staging.join(format!("{id}.json"));
    let bytes = serde_json::to_vec(task).context("encoding a task")?;
    fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))
}

/// Rename a staged task file into the inbox; returns when it got there.
pub(super) fn drop_into_inbox(
    staging: &Path,
    queue: &Path,
    id: &str,
) -> anyhow::Result<SystemTime> {
    let name = format!("{id}.json");
    let (from, to) = (
        staging.join(&name),
        QueueDir::new(queue).inbox().join(&name),
    );
    fs::rename(&from, &to)
        .with_context(|| format!("renaming {} to {}", from.display(), to.display()))?;
    Ok(SystemTime::now())
}

/// Run one task through the fresh daemon first, so what is measured afterwards is its steady
/// state (the queue's directories adopted, the watch running).
fn warm_up(daemon: &mut Daemon, queue: &Path, staging: &Path) -> anyhow::Result<()> {
    stage(staging, "warmup", &once_task("warmup"))?;
    drop_into_inbox(staging, queue, "warmup")?;
    wait_for_record(daemon, queue, "warmup")
}

/// Wait until `done/<id>.json` exists (failing if the task failed instead).
fn wait_for_record(daemon: &mut Daemon, queue: &Path, id: &str) -> anyhow::Result<()> {
    let done = queue.join(QueueDir::done_key(id));
    let failed = queue.join(QueueDir::failed_key(id));
    let since = Instant::now();
    loop {
        if done.exists() {
            return Ok(());
        }
        if failed.exists() {
            bail!("task {id} failed; see {}", failed.display());
        }
        daemon.check_running()?;
        if since.elapsed() > STALL_LIMIT {
            bail!(
                "task {id} was not done after {STALL_LIMIT:?}; see {}",
                daemon.log.display()
            );
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Wait until `done/` holds `expected` records, failing on any record in `failed/` or when no
/// task finishes for [`STALL_LIMIT`].
fn wait_for_done(daemon: &mut Daemon, queue: &Path, expected: usize) -> anyhow::Result<()> {
    let dir = QueueDir::new(queue);
    let (done_dir, failed_dir) = (dir.done_dir(), dir.failed_dir());
    let mut last = (0, Instant::now());
    loop {
        let done = count_records(&done_dir)?;
        if done >= expected {
            return Ok(());
        }
        if let Some(name) = first_entry(&failed_dir)? {
            bail!("a task failed; see {}", failed_dir.join(name).display());
        }
        daemon.check_running()?;
        if done != last.0 {
            last = (done, Instant::now());
        } else if last.1.elapsed() > STALL_LIMIT {
            bail!(
                "no task finished for {STALL_LIMIT:?} ({done} of {expected} done); see {}",
                daemon.log.display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn count_records(dir: &Path) -> anyhow::Result<usize> {
    let entries = fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
    let mut count = 0;
    for entry in entries {
        let entry = entry.with_context(|| format!("reading {}", dir.display()))?;
        if entry.file_name().to_string_lossy().ends_with(".json") {
            count += 1;
        }
    }
    Ok(count)
}

fn first_entry(dir: &Path) -> anyhow::Result<Option<String>> {
    let mut entries = fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
    Ok(entries
        .next()
        .transpose()
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|e| e.file_name().to_string_lossy().into_owned()))
}

/// The time from `earlier` to `later`, zero if the clock says otherwise.
pub(super) fn since(earlier: SystemTime, later: SystemTime) -> Duration {
    later.duration_since(earlier).unwrap_or_default()
}

/// A task's journal.
struct TaskEvents(Vec<JournalEvent>);

impl TaskEvents {
    fn read(queue: &Path, id: &str) -> anyhow::Result<TaskEvents> {
        journal::read(queue, id)
            .map(TaskEvents)
            .with_context(|| format!("reading {}", journal::journal_path(queue, id).display()))
    }

    /// When the last event of a kind (`name` for the error) was recorded.
    fn last(
        &self,
        name: &str,
        id: &str,
        of_kind: fn(&Event) -> bool,
    ) -> anyhow::Result<SystemTime> {
        self.0
            .iter()
            .rev()
            .find(|e| of_kind(&e.event))
            .map(|e| SystemTime::from(e.at))
            .with_context(|| format!("task {id}'s journal has no {name:?} event"))
    }

    fn last_phase_started(&self, id: &str) -> anyhow::Result<SystemTime> {
        self.last("phase_started", id, |e| {
            matches!(e, Event::PhaseStarted { .. })
        })
    }

    fn last_done(&self, id: &str) -> anyhow::Result<SystemTime> {
        self.last("done", id, |e| matches!(e, Event::Done { .. }))
    }
}

/// The mean time of one run of [`LOOP_COMMAND`] spawned from here as the daemon spawns it: the
/// iteration's request on a stdin pipe, stdout read from a pipe, stderr appended to a log, in
/// the queue directory.
fn own_run_time(queue: &Path, runs: u64) -> anyhow::Result<Duration> {
    let log_path = queue.join("baseline.log");
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("opening {}", log_path.display()))?;
    let started = Instant::now();
    for iteration in 0..runs {
        let request = json!({
            "task_id": "loop-every-1",
            "phase": "spin",
            "iteration": iteration,
            "state": null,
            "inputs": {},
            "attempt": 1,
        });
        let stdin = serde_json::to_vec(&request).context("encoding a request")?;
        let mut child = Command::new(LOOP_COMMAND[0])
            .args(&LOOP_COMMAND[1..])
            .current_dir(queue)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log.try_clone().context("duplicating the log")?))
            .spawn()
            .with_context(|| format!("starting {LOOP_COMMAND:?}"))?;
        if let Some(mut pipe) = child.stdin.take() {
            // A command that does not read its stdin is fine, as in the daemon.
            let _ = pipe.write_all(&stdin);
        }
        let mut reply = Vec::new();
        if let Some(mut pipe) = child.stdout.take() {
            pipe.read_to_end(&mut reply).context("reading the reply")?;
        }
        let status = child.wait().context("waiting for the command")?;
        if !status.success() {
            bail!("{LOOP_COMMAND:?} failed: {status}");
        }
    }
    Ok(started.elapsed() / runs as u32)
}

/// How long `runs` runs of [`RESUME_COMMAND`] take by themselves: spawned from here, as many
/// at once as there are CPUs (a new one as the oldest ends), each with a request on a stdin
/// pipe, its reply read from a pipe and its stderr appended to a log, in the queue directory.
pub(super) fn commands_alone(queue: &Path, runs: usize) -> anyhow::Result<Duration> {
    let log_path = queue.join("commands-alone.log");
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("opening {}", log_path.display()))?;
    let window = std::thread::available_parallelism().map_or(2, |n| n.get());
    let request = serde_json::to_vec(&json!({
        "task_id": "r000000",
        "phase": "spin",
        "iteration": 1,
        "state": {"resumable": true},
        "inputs": {},
        "attempt": 2,
    }))
    .context("encoding a request")?;
    let finish = |mut child: Child| -> anyhow::Result<()> {
        let mut reply = Vec::new();
        if let Some(mut pipe) = child.stdout.take() {
            pipe.read_to_end(&mut reply).context("reading a reply")?;
        }
        let status = child.wait().context("waiting for a command")?;
        if !status.success() {
            bail!("{RESUME_COMMAND:?} failed: {status}");
        }
        Ok(())
    };
    let started = Instant::now();
    let mut running = std::collections::VecDeque::with_capacity(window);
    for _ in 0..runs {
        if running.len() >= window {
            if let Some(child) = running.pop_front() {
                finish(child)?;
            }
        }
        let mut child = Command::new(RESUME_COMMAND[0])
            .args(&RESUME_COMMAND[1..])
            .current_dir(queue)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log.try_clone().context("duplicating the log")?))
            .spawn()
            .with_context(|| format!("starting {RESUME_COMMAND:?}"))?;
        if let Some(mut pipe) = child.stdin.take() {
            // A command that does not read its stdin is fine, as in the daemon.
            let _ = pipe.write_all(&request);
        }
        running.push_back(child);
    }
    for child in running {
        finish(child)?;
    }
    Ok(started.elapsed())
}

/// Build the queue a daemon killed with SIGKILL leaves behind with `ids` in flight: each task's
/// definition in `tasks/`, a loop checkpoint after its first of two iterations, and its entry in
/// `current_work.json` with status `running`. Written with the library's own types, without
/// fsync (a `sync` at the end), since this setup is not what is measured. Returns the size of
/// `current_work.json`.
fn build_crashed_queue(queue: &Path, ids: &[String]) -> anyhow::Result<u64> {
    QueueDir::new(queue)
        .create_all()
        .with_context(|| format!("creating the queue {}", queue.display()))?;
    let storage: Arc<dyn Storage> = Arc::new(FileStorage::with_ops(
        queue,
        Arc::new(UnsyncedFileOps) as Arc<dyn cairn::store::FileOps>,
    ));
    let checkpoints = CheckpointStore::with_storage(Arc::clone(&storage));
    let crashed_at = Utc::now();
    let mut work = CurrentWork::default();
    for id in ids {
        let task = write_checkpointed_task(queue, storage.as_ref(), &checkpoints, id)?;
        work.active_tasks.push(running_entry(&task, crashed_at));
        write_attempt_files(queue, id, crashed_at)?;
    }
    work.updated_at = crashed_at;
    let written = write_current_work(queue, storage.as_ref(), &work)?;
    nix::unistd::sync();
    Ok(written)
}

/// Task `id`'s definition in `tasks/` (one loop phase of two iterations) and its loop
/// checkpoint after the first iteration.
fn write_checkpointed_task(
    queue: &Path,
    storage: &dyn Storage,
    checkpoints: &CheckpointStore,
    id: &str,
) -> anyhow::Result<Task> {
    let file = json!({
        "id": id,
        "phases": [{
            "name": "spin",
            "kind": "loop",
            "run": RESUME_COMMAND,
            "max_iterations": 2,
        }],
    });
    let bytes = serde_json::to_vec(&file).context("encoding a task")?;
    let task = Task::parse(&bytes).map_err(|e| anyhow::anyhow!("the resume task: {e}"))?;
    let key = QueueDir::task_key(id);
    storage
        .put(&key, &task.to_json_bytes(), None)
        .with_context(|| format!("writing {}", queue.join(&key).display()))?;
    let mut checkpointer =
        LoopCheckpointer::new(checkpoints.clone(), id, cairn::runner::LOOP_SCOPE)
            .phase("spin", 0)
            .attempt(1)
            .every(1);
    checkpointer
        .checkpoint(1, &json!({"resumable": true}))
        .with_context(|| format!("checkpointing {id}"))?;
    Ok(task)
}

/// `task`'s entry in `current_work.json`: running its first attempt, one iteration done and
/// checkpointed at `crashed_at`.
fn running_entry(task: &Task, crashed_at: DateTime<Utc>) -> ActiveTask {
    let mut entry = ActiveTask::new(task.id(), "spin");
    entry.attempt = 1;
    entry.status = ActiveStatus::Running;
    entry.iterations = 1;
    entry.last_checkpoint_at = Some(crashed_at);
    entry.phases.push(PhaseTiming {
        name: "spin".into(),
        started_at: entry.started_at,
        finished_at: None,
        iterations: None,
        total: None,
    });
    entry
}

/// What the killed daemon had made for task `id`'s attempt: its run directory with the journal
/// of its start, the phase's log with the header of its first iteration, and the scratch
/// directory (`$CAIRN_SCRATCH`).
fn write_attempt_files(queue: &Path, id: &str, crashed_at: DateTime<Utc>) -> anyhow::Result<()> {
    let run_dir = QueueDir::new(queue).run_dir(id);
    fs::create_dir_all(run_dir.join("scratch"))
        .with_context(|| format!("creating {}", run_dir.display()))?;
    for event in [
        Event::AttemptStarted {
            attempt: 1,
            phase: "spin".into(),
        },
        Event::PhaseStarted {
            phase: "spin".into(),
            phase_index: 0,
            kind: cairn::task::PhaseKind::Loop,
            attempt: 1,
        },
    ] {
        journal::append(queue, id, event);
    }
    let log = run_dir.join("0-spin.log");
    fs::write(
        &log,
        format!(
            "=== {} attempt 1 iteration 1 ===\n",
            crashed_at.to_rfc3339()
        ),
    )
    .with_context(|| format!("writing {}", log.display()))
}

/// Write `work` as the queue's `current_work.json`; the bytes written.
fn write_current_work(
    queue: &Path,
    storage: &dyn Storage,
    work: &CurrentWork,
) -> anyhow::Result<u64> {
    let bytes = serde_json::to_vec_pretty(work)
        .with_context(|| format!("encoding {}", QueueDir::CURRENT_WORK_KEY))?;
    storage
        .put(QueueDir::CURRENT_WORK_KEY, &bytes, None)
        .with_context(|| {
            format!(
                "writing {}",
                queue.join(QueueDir::CURRENT_WORK_KEY).display()
            )
        })?;
    Ok(bytes.len() as u64)
}

/// The daemon resumed the task from its checkpoint: its loop ran one iteration after the one
/// checkpointed (two in all), rather than starting over (which would end after one).
fn check_resumed(queue: &Path, id: &str) -> anyhow::Result<()> {
    let path = queue.join(QueueDir::done_key(id));
    let bytes = fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    let record: Value =
        serde_json::from_slice(&bytes).with_context(|| format!("parsing {}", path.display()))?;
    let iterations = record["phases"]
        .as_array()
        .and_then(|phases| phases.last())
        .and_then(|phase| phase["iterations"].as_u64());
    if iterations != Some(2) {
        bail!(
            "task {id} did not resume from its checkpoint: {} says its loop ran {iterations:?} iterations, not 2",
            path.display()
        );
    }
    Ok(())
}

/// A `cairn run` child process on a queue, its stderr in `daemon.log` beside the queue.
pub(super) struct Daemon {
    child: Child,
    pub(super) log: PathBuf,
}

impl Daemon {
    /// Start `cairn run` (this binary) on `queue`; `notify` becomes its `NOTIFY_SOCKET` (see
    /// [`ReadyListener`]).
    pub(super) fn start(
        queue: &Path,
        max_tasks: usize,
        notify: Option<&Path>,
    ) -> anyhow::Result<Daemon> {
        Daemon::start_on(queue, max_tasks, notify, None)
    }

    /// [`Daemon::start`], on the shared queue `db` (its URL, given in `CAIRN_DATABASE_URL`
    /// rather than on the command line, and this daemon's node name) when given.
    pub(super) fn start_on(
        queue: &Path,
        max_tasks: usize,
        notify: Option<&Path>,
        db: Option<(&str, &str)>,
    ) -> anyhow::Result<Daemon> {
        let exe = std::env::current_exe().context("finding the cairn binary")?;
        let log = queue.with_file_name("daemon.log");
        let log_file = fs::File::create(&log)
            .with_context(|| format!("creating the daemon log {}", log.display()))?;
        let mut command = Command::new(exe);
        command
            .arg("--queue")
            .arg(queue)
            .args(["run", "--stop-grace", "5s", "--max-tasks"])
            .arg(max_tasks.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log_file));
        command.env_remove("CAIRN_DATABASE_URL");
        if let Some((url, node)) = db {
            command
                .env("CAIRN_DATABASE_URL", url)
                .args(["--node", node]);
        }
        for name in cairn::runner::NOTIFY_ENV {
            command.env_remove(name);
        }
        command.env_remove("JOURNAL_STREAM");
        if let Some(socket) = notify {
            command.env("NOTIFY_SOCKET", socket);
        }
        let child = command.spawn().context("starting cairn run")?;
        Ok(Daemon { child, log })
    }

    pub(super) fn pid(&self) -> i32 {
        // A pid always fits: Linux caps pids at 2^22.
        self.child.id() as i32
    }

    /// Fail if the daemon has exited.
    pub(super) fn check_running(&mut self) -> anyhow::Result<()> {
        match self.child.try_wait().context("checking on the daemon")? {
            None => Ok(()),
            Some(status) => bail!(
                "the daemon exited early ({status}); see {}",
                self.log.display()
            ),
        }
    }

    /// The daemon's peak resident memory so far (`VmHWM`), in MiB.
    pub(super) fn peak_rss_mib(&self) -> anyhow::Result<f64> {
        super::proc_stats::peak_rss_mib(self.pid())
    }

    /// SIGTERM, and wait for a clean exit ([`STOP_LIMIT`] at most: a daemon that does not
    /// exit is killed and reported, not waited for forever).
    pub(super) fn stop(&mut self) -> anyhow::Result<()> {
        use nix::sys::signal::{kill, Signal};
        kill(nix::unistd::Pid::from_raw(self.pid()), Signal::SIGTERM)
            .context("signalling the daemon")?;
        let since = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().context("waiting for the daemon")? {
                break status;
            }
            if since.elapsed() > STOP_LIMIT {
                let _ = self.child.kill();
                let _ = self.child.wait();
                bail!(
                    "the daemon did not exit within {STOP_LIMIT:?} of SIGTERM; see {}",
                    self.log.display()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        if !status.success() {
            bail!(
                "the daemon exited with {status} after SIGTERM; see {}",
                self.log.display()
            );
        }
        Ok(())
    }
}

impl Drop for Daemon {
    /// A bench that fails half-way leaves no daemon behind.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The bench's end of the daemon's `NOTIFY_SOCKET`: a thread notes when READY=1 arrives and
/// keeps reading every later message (STATUS= on each change), since a full socket would block
/// the daemon's sends.
pub(super) struct ReadyListener {
    pub(super) path: PathBuf,
    ready_at: Arc<Mutex<Option<Instant>>>,
    stop: Arc<AtomicBool>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl ReadyListener {
    /// The socket's path. A Unix socket path must stay under 108 bytes, so it lives in the
    /// system's temp directory rather than beside the queue, named after the bench's pid.
    fn path() -> PathBuf {
        std::env::temp_dir().join(format!("cairn-bench-notify-{}.sock", std::process::id()))
    }

    /// Bind the socket and start reading it.
    pub(super) fn start() -> anyhow::Result<ReadyListener> {
        let path = Self::path();
        let _ = fs::remove_file(&path);
        let socket = UnixDatagram::bind(&path)
            .with_context(|| format!("binding the notify socket {}", path.display()))?;
        socket
            .set_read_timeout(Some(Duration::from_millis(50)))
            .context("setting the notify socket's timeout")?;
        let ready_at: Arc<Mutex<Option<Instant>>> = Arc::default();
        let stop: Arc<AtomicBool> = Arc::default();
        let (thread_ready, thread_stop) = (Arc::clone(&ready_at), Arc::clone(&stop));
        let reader = std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            while !thread_stop.load(Ordering::Relaxed) {
                let Ok(len) = socket.recv(&mut buf) else {
                    continue;
                };
                let now = Instant::now();
                let message = String::from_utf8_lossy(&buf[..len]);
                if message.lines().any(|line| line == "READY=1") {
                    let mut ready = thread_ready.lock().unwrap_or_else(|p| p.into_inner());
                    ready.get_or_insert(now);
                }
            }
        });
        Ok(ReadyListener {
            path,
            ready_at,
            stop,
            reader: Some(reader),
        })
    }

    /// How long after `spawned` READY=1 arrived.
    pub(super) fn ready_after(&self, spawned: Instant) -> anyhow::Result<Duration> {
        let ready_at = *self.ready_at.lock().unwrap_or_else(|p| p.into_inner());
        ready_at
            .map(|at| at.saturating_duration_since(spawned))
            .context("the daemon never sent READY=1")
    }
}

impl Drop for ReadyListener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        let _ = fs::remove_file(&self.path);
    }
}
