//! `cairn bench queue --db URL`: the intake, pickup and resume figures of `cairn bench queue`
//! on a shared queue in PostgreSQL. The daemon is the real `cairn run --db` (this binary) with
//! a fresh local directory; task files are renamed into its `inbox/` as on files, and its
//! intake takes them into the database.
//!
//! - `throughput`: `--tasks` one-phase tasks dropped at once; tasks/s from the first rename to
//!   the last record.
//! - `pickup`: `--paced-tasks` tasks dropped one at a time into an idle daemon: rename →
//!   accepted (the task inserted into the shared queue), → its phase started, → its record.
//! - `resume`: `--resume-tasks` tasks left running by a node that died (claimed under a short
//!   lease, a loop checkpoint after the first of two iterations and their phase state written,
//!   then the lease left to expire); a daemon is started and timed until ready, until every
//!   task resumed and until every task is done, each checked to have resumed from its
//!   checkpoint.
//!
//! Times come from what the database recorded (`PgQueue::times_of`: the acceptance, the last
//! `phase_started` event as the journal appended it, the record), set against this host's
//! clock by the offset measured at the start. The benchmark adds its tasks and removes them
//! afterwards, so it wants a database of its own with no tasks (`createdb cairn_bench`).

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context};
use chrono::{DateTime, Utc};
use serde_json::json;

use super::proc_stats::cpu_times;
use super::queue::{
    commands_alone, drop_into_inbox, fresh_root, once_task, print_line, since, stage, Daemon,
    Measurement, PickupLine, QueueOptions, ReadyListener, ResumeLine, ThroughputLine, ONCE_COMMAND,
    RESUME_COMMAND, STALL_LIMIT,
};
use super::{millis, percentile, round_to};
use cairn::queue::postgres::{CheckpointWrite, NewTask, PgQueue, TaskTimes};
use cairn::queue::QueueDir;
use cairn::store::current_work::{ActiveStatus, ActiveTask, PhaseTiming};
use cairn::store::IterationCheckpoint;
use cairn::task_id::TaskId;

/// The lease of the node that "died" holding the resume figure's tasks: it has to run out
/// before the daemon can take them over, and is short so the bench does not wait long.
const DEAD_NODE_LEASE: Duration = Duration::from_secs(2);

/// Checkpoints written per statement while setting up the resume figure.
const SETUP_BATCH: usize = 500;

/// Run the intake, pickup and resume figures on the database at `url`.
pub(super) fn run(args: &QueueOptions, url: &str) -> anyhow::Result<()> {
    let supported = [
        Measurement::Throughput,
        Measurement::Pickup,
        Measurement::Resume,
    ];
    if let Some(other) = args.only.iter().find(|m| !supported.contains(m)) {
        bail!(
            "--db measures throughput, pickup and resume only, not {other:?}: drop it from \
             --only, or run it without --db"
        );
    }
    if args.max_tasks == 0 || args.resume_max_tasks == Some(0) {
        bail!("--max-tasks and --resume-max-tasks must be at least 1");
    }
    let wanted = |m: Measurement| args.only.is_empty() || args.only.contains(&m);
    let parent = super::RunDirParent::create(&args.dir)?;
    let root = fresh_root(&args.dir)?;
    let bench = DbBench::open(url, root.clone(), args.max_tasks)?;
    let result = (|| {
        if wanted(Measurement::Throughput) {
            print_line(&bench.throughput(args.tasks)?)?;
        }
        if wanted(Measurement::Pickup) {
            print_line(&bench.pickup(args.paced_tasks, args.pace)?)?;
        }
        if wanted(Measurement::Resume) {
            let max_tasks = args.resume_max_tasks.unwrap_or(args.resume_tasks.max(1));
            print_line(&bench.resume(args.resume_tasks, max_tasks)?)?;
        }
        anyhow::Ok(())
    })();
    bench.remove_tasks();
    if args.keep || result.is_err() {
        eprintln!("queues and daemon logs kept in {}", root.display());
    } else {
        std::fs::remove_dir_all(&root).with_context(|| format!("removing {}", root.display()))?;
        parent.remove_if_empty();
    }
    result
}

struct DbBench {
    url: String,
    db: PgQueue,
    runtime: tokio::runtime::Runtime,
    /// The database's clock minus this host's, measured at the start.
    clock_offset: chrono::Duration,
    /// The run directory; each measurement works in its own subdirectory.
    root: PathBuf,
    max_tasks: usize,
    /// The tasks the bench added, removed at the end; and the nodes it named.
    added: Mutex<(Vec<String>, Vec<String>)>,
}

impl DbBench {
    /// Connect, migrate, refuse a database that holds tasks, and measure the clock offset.
    fn open(url: &str, root: PathBuf, max_tasks: usize) -> anyhow::Result<DbBench> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting a runtime for the database")?;
        let db = PgQueue::connect(url).context("connecting to the database")?;
        let clock_offset = runtime.block_on(async {
            db.migrate().await?;
            let count = db.count_tasks().await?;
            if count > 0 {
                bail!(
                    "the database holds {count} tasks; the benchmark adds and removes tasks of \
                     its own, so give it an empty database (createdb cairn_bench)"
                );
            }
            let before = Utc::now();
            let database = db.database_now().await?;
            let after = Utc::now();
            anyhow::Ok(database - (before + (after - before) / 2))
        })?;
        Ok(DbBench {
            url: url.to_owned(),
            db,
            runtime,
            clock_offset,
            root,
            max_tasks,
            added: Mutex::default(),
        })
    }

    /// A time the database recorded, on this host's clock.
    fn local(&self, at: DateTime<Utc>) -> SystemTime {
        SystemTime::from(at - self.clock_offset)
    }

    /// Note tasks and a node the bench added, to remove at the end.
    fn added(&self, ids: &[String], node: Option<&str>) {
        let mut added = self.added.lock().unwrap_or_else(|p| p.into_inner());
        added.0.extend_from_slice(ids);
        added.1.extend(node.map(str::to_owned));
    }

    fn remove_tasks(&self) {
        let (ids, nodes) =
            std::mem::take(&mut *self.added.lock().unwrap_or_else(|p| p.into_inner()));
        for node in nodes {
            if let Err(error) = self.runtime.block_on(self.db.remove_tasks(&ids, &node)) {
                eprintln!("warning: removing the benchmark's tasks: {error}");
            }
        }
    }

    /// A fresh local directory for one measurement's daemon, with a staging directory beside
    /// it, and the daemon's node name.
    fn prepare(&self, name: &str) -> anyhow::Result<(PathBuf, PathBuf, String)> {
        let dir = self.root.join(name);
        let queue = dir.join("queue");
        let staging = dir.join("staging");
        std::fs::create_dir_all(&staging)
            .with_context(|| format!("creating {}", staging.display()))?;
        QueueDir::new(&queue)
            .create_all()
            .with_context(|| format!("creating the queue {}", queue.display()))?;
        let node = format!("cairn-bench-{}-{name}", std::process::id());
        self.added(&[], Some(&node));
        Ok((queue, staging, node))
    }

    fn start_daemon(
        &self,
        queue: &Path,
        node: &str,
        max_tasks: usize,
        notify: Option<&Path>,
    ) -> anyhow::Result<Daemon> {
        Daemon::start_on(queue, max_tasks, notify, Some((&self.url, node)))
    }

    /// Run one task through the fresh daemon first, so that what is measured is its steady
    /// state (connections made, statements prepared).
    fn warm_up(
        &self,
        daemon: &mut Daemon,
        queue: &Path,
        staging: &Path,
        name: &str,
    ) -> anyhow::Result<()> {
        let id = format!("warmup-{name}");
        self.added(std::slice::from_ref(&id), None);
        stage(staging, &id, &once_task(&id))?;
        drop_into_inbox(staging, queue, &id)?;
        self.wait_for_records(daemon, std::slice::from_ref(&id))
    }

    /// Wait until every task of `ids` has a record, failing on any that did not end done or
    /// when none finishes for [`STALL_LIMIT`].
    fn wait_for_records(&self, daemon: &mut Daemon, ids: &[String]) -> anyhow::Result<()> {
        let mut last = (0, Instant::now());
        loop {
            let (done, other) = self.runtime.block_on(self.db.records_of(ids))?;
            if other > 0 {
                bail!(
                    "{other} task(s) did not end done; see `cairn --db ... status` and {}",
                    daemon.log.display()
                );
            }
            if done as usize >= ids.len() {
                return Ok(());
            }
            daemon.check_running()?;
            if done != last.0 {
                last = (done, Instant::now());
            } else if last.1.elapsed() > STALL_LIMIT {
                bail!(
                    "no task finished for {STALL_LIMIT:?} ({done} of {} done); see {}",
                    ids.len(),
                    daemon.log.display()
                );
            }
            let pause = if ids.len() == 1 { 1 } else { 100 };
            std::thread::sleep(Duration::from_millis(pause));
        }
    }

    /// What the database recorded of `ids`, by id, each with its record.
    fn times(&self, ids: &[String]) -> anyhow::Result<Vec<TaskTimes>> {
        let times = self.runtime.block_on(self.db.times_of(ids))?;
        if times.len() != ids.len() {
            bail!(
                "the database holds {} of the {} tasks dropped",
                times.len(),
                ids.len()
            );
        }
        Ok(times)
    }

    fn phase_started(&self, times: &TaskTimes) -> anyhow::Result<SystemTime> {
        times
            .phase_started_at
            .map(|at| self.local(at))
            .with_context(|| format!("task {} has no phase_started event", times.task_id))
    }

    fn finished(&self, times: &TaskTimes) -> anyhow::Result<SystemTime> {
        times
            .finished_at
            .map(|at| self.local(at))
            .with_context(|| format!("task {} has no record", times.task_id))
    }

    fn throughput(&self, tasks: usize) -> anyhow::Result<ThroughputLine> {
        let (queue, staging, node) = self.prepare("throughput")?;
        let mut daemon = self.start_daemon(&queue, &node, self.max_tasks, None)?;
        self.warm_up(&mut daemon, &queue, &staging, "throughput")?;
        let ids: Vec<String> = (0..tasks).map(|i| format!("t{i:06}")).collect();
        self.added(&ids, None);
        for id in &ids {
            stage(&staging, id, &once_task(id))?;
        }
        let started = SystemTime::now();
        let mut dropped = Vec::with_capacity(tasks);
        for id in &ids {
            dropped.push(drop_into_inbox(&staging, &queue, id)?);
        }
        self.wait_for_records(&mut daemon, &ids)?;
        let peak = daemon.peak_rss_mib()?;
        daemon.stop()?;

        let mut pickups = Vec::with_capacity(tasks);
        let mut last_done = started;
        for (times, renamed) in self.times(&ids)?.iter().zip(&dropped) {
            pickups.push(since(*renamed, self.phase_started(times)?));
            last_done = last_done.max(self.finished(times)?);
        }
        pickups.sort_unstable();
        let elapsed = last_done.duration_since(started).unwrap_or_default();
        Ok(ThroughputLine {
            bench: "queue",
            what: "throughput",
            implementation: "cairn-postgres",
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
        let (queue, staging, node) = self.prepare("pickup")?;
        let mut daemon = self.start_daemon(&queue, &node, self.max_tasks, None)?;
        self.warm_up(&mut daemon, &queue, &staging, "pickup")?;
        let mut dropped = Vec::with_capacity(tasks);
        let mut ids = Vec::with_capacity(tasks);
        for i in 0..tasks {
            let id = format!("p{i:06}");
            self.added(std::slice::from_ref(&id), None);
            stage(&staging, &id, &once_task(&id))?;
            std::thread::sleep(pace);
            dropped.push(drop_into_inbox(&staging, &queue, &id)?);
            self.wait_for_records(&mut daemon, std::slice::from_ref(&id))?;
            ids.push(id);
        }
        let peak = daemon.peak_rss_mib()?;
        daemon.stop()?;
        let (mut accepts, mut pickups, mut dones) = (Vec::new(), Vec::new(), Vec::new());
        for (times, renamed) in self.times(&ids)?.iter().zip(&dropped) {
            accepts.push(since(*renamed, self.local(times.accepted_at)));
            pickups.push(since(*renamed, self.phase_started(times)?));
            dones.push(since(*renamed, self.finished(times)?));
        }
        for list in [&mut accepts, &mut pickups, &mut dones] {
            list.sort_unstable();
        }
        Ok(PickupLine {
            bench: "queue",
            what: "pickup",
            implementation: "cairn-postgres",
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

    fn resume(&self, tasks: usize, max_tasks: usize) -> anyhow::Result<ResumeLine> {
        let (queue, _, node) = self.prepare("resume")?;
        let ids: Vec<String> = (0..tasks).map(|i| format!("r{i:06}")).collect();
        self.added(&ids, None);
        self.leave_in_flight(&ids)?;
        let notify = ReadyListener::start()?;
        let spawned = Instant::now();
        let spawned_at = SystemTime::now();
        let mut daemon = self.start_daemon(&queue, &node, max_tasks, Some(&notify.path))?;
        self.wait_for_records(&mut daemon, &ids)?;
        let ready = notify.ready_after(spawned)?;
        let peak = daemon.peak_rss_mib()?;
        let cpu = cpu_times(&format!("/proc/{}/stat", daemon.pid()))?;
        let async_thread = cpu_times(&format!("/proc/{0}/task/{0}/stat", daemon.pid()))?;
        daemon.stop()?;
        drop(notify);

        let mut first_resumed: Option<SystemTime> = None;
        let mut all_resumed = spawned_at;
        let mut all_done = spawned_at;
        for times in self.times(&ids)? {
            let resumed = self.phase_started(&times)?;
            first_resumed = Some(first_resumed.map_or(resumed, |f| f.min(resumed)));
            all_resumed = all_resumed.max(resumed);
            all_done = all_done.max(self.finished(&times)?);
            check_resumed(&times)?;
        }
        let after = |t: SystemTime| millis(t.duration_since(spawned_at).unwrap_or_default());
        let commands_alone = millis(commands_alone(&queue, tasks)?);
        let all_done_ms = after(all_done);
        Ok(ResumeLine {
            bench: "queue",
            what: "resume",
            implementation: "cairn-postgres",
            tasks,
            max_tasks,
            command: RESUME_COMMAND.join(" "),
            current_work_bytes: None,
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

    /// Leave `ids` as a node that died leaves its tasks: submitted, claimed by that node under
    /// [`DEAD_NODE_LEASE`], each with a loop checkpoint after the first of its two iterations
    /// and its phase state; then wait (by the database's clock) until the lease ran out.
    fn leave_in_flight(&self, ids: &[String]) -> anyhow::Result<()> {
        let dead = format!("cairn-bench-{}-died", std::process::id());
        self.added(&[], Some(&dead));
        self.runtime.block_on(async {
            for id in ids {
                let definition = json!({
                    "id": id,
                    "phases": [{
                        "name": "spin",
                        "kind": "loop",
                        "run": RESUME_COMMAND,
                        "max_iterations": 2,
                    }],
                })
                .to_string();
                self.db
                    .submit(&NewTask {
                        id,
                        priority: 0,
                        crash_limit: 5,
                        definition: &definition,
                        submitted_by: None,
                    })
                    .await?;
            }
            let mut leases = Vec::with_capacity(ids.len());
            while leases.len() < ids.len() {
                let want = u32::try_from(ids.len() - leases.len()).unwrap_or(u32::MAX);
                let claimed = self.db.claim(&dead, want, DEAD_NODE_LEASE, true).await?;
                if claimed.is_empty() {
                    bail!(
                        "only {} of {} tasks could be claimed",
                        leases.len(),
                        ids.len()
                    );
                }
                leases.extend(claimed.into_iter().map(|c| c.lease));
            }
            let crashed_at = Utc::now();
            for chunk in leases.chunks(SETUP_BATCH) {
                let mut writes = Vec::with_capacity(chunk.len());
                for lease in chunk {
                    let mut checkpoint = first_iteration(&lease.task_id, crashed_at);
                    writes.push(CheckpointWrite::encode(lease, &mut checkpoint)?);
                }
                let batch: Vec<&CheckpointWrite> = writes.iter().collect();
                let stored = self.db.save_checkpoints(&dead, &batch, 3).await?;
                if stored.iter().any(|stored| !stored) {
                    bail!("the dead node's lease ran out while the bench set it up; retry");
                }
                for lease in chunk {
                    let entry = running_entry(&lease.task_id, crashed_at)?;
                    let state = serde_json::to_string(&entry).context("encoding a phase state")?;
                    self.db.save_phase_state(lease, &state).await?;
                }
            }
            let until = leases
                .iter()
                .map(|lease| lease.expires_at)
                .max()
                .unwrap_or_else(Utc::now);
            while self.db.database_now().await? <= until {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            anyhow::Ok(())
        })
    }
}

/// The loop checkpoint after the first of two iterations, as the dead node wrote it.
fn first_iteration(task_id: &str, at: DateTime<Utc>) -> IterationCheckpoint {
    IterationCheckpoint {
        format_version: 0,
        task_id: task_id.to_owned(),
        phase: "spin".to_owned(),
        phase_index: 0,
        scope: cairn::runner::LOOP_SCOPE.to_owned(),
        iteration_count: 1,
        checkpoint_interval: 1,
        partial_results: json!({"resumable": true}),
        last_checkpoint_at: at,
        attempt: 1,
        generation: 0,
        done: false,
        output: None,
        cost: None,
        files: Default::default(),
    }
}

/// The phase state of a task in its first attempt's loop, as the dead node wrote it.
fn running_entry(task_id: &str, at: DateTime<Utc>) -> anyhow::Result<ActiveTask> {
    let id = TaskId::parse(task_id).map_err(|e| anyhow::anyhow!("task id {task_id}: {e}"))?;
    let mut entry = ActiveTask::new(&id, "spin");
    entry.attempt = 1;
    entry.status = ActiveStatus::Running;
    entry.iterations = 1;
    entry.last_checkpoint_at = Some(at);
    entry.phases.push(PhaseTiming {
        name: "spin".into(),
        started_at: entry.started_at,
        finished_at: None,
        iterations: None,
        total: None,
    });
    Ok(entry)
}

/// The task resumed from its checkpoint: its loop ran two iterations in all, not one.
fn check_resumed(times: &TaskTimes) -> anyhow::Result<()> {
    let record: serde_json::Value = times
        .record
        .as_deref()
        .map(serde_json::from_str)
        .transpose()
        .with_context(|| format!("the record of task {}", times.task_id))?
        .with_context(|| format!("task {} has no record", times.task_id))?;
    let iterations = record["phases"]
        .as_array()
        .and_then(|phases| phases.last())
        .and_then(|phase| phase["iterations"].as_u64());
    if iterations != Some(2) {
        bail!(
            "task {} did not resume from its checkpoint: its record says its loop ran \
             {iterations:?} iterations, not 2",
            times.task_id
        );
    }
    Ok(())
}
