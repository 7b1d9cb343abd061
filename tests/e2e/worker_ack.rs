//! Worker acknowledgements on a slow disk (issue 14): a worker built on the Python helper
//! waits for cairn's answer to each checkpoint, so one SIGKILL of the daemon re-runs at most the
//! iteration in flight, however long the daemon's fsyncs take.
//!
//! The daemon runs under strace, which delays every `fsync`/`fdatasync` it makes by 0.7 s (a
//! checkpoint takes two: the file and its directory). It is SIGKILLed (by its own pid, not
//! strace's) once two checkpoints are on disk and iteration 2 has started, then restarted
//! without strace to finish the task. The worker logs each iteration it starts to a side file. The same run with the helper told
//! not to wait (`--no-wait`) re-runs several iterations, which shows the scenario can catch a
//! worker running ahead of its committed checkpoints. Also here: a stop during a slow commit,
//! `checkpoint_every: 3`, and a failed checkpoint write, none of which may leave a waiting
//! worker hanging.
//!
//! Needs `strace` (`.ci/run` installs it): without it the tests say so and pass, except under
//! `CI=true`, where they fail.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use cairn::daemon::{self, DaemonConfig, DaemonExit};
use cairn::shutdown::Shutdown;
use cairn::store::{decode_checkpoint, FaultMode, FaultyFileOps, FileStorage, Storage};
use nix::sys::signal::kill;
use nix::unistd::Pid;
use serde_json::{json, Value};

const TASK: &str = "slow-disk";
const ITERATIONS: u64 = 8;
/// How long strace holds each fsync of the daemon, in microseconds.
const FSYNC_DELAY_US: u64 = 700_000;

/// `cairn run` on this queue under strace, every fsync and fdatasync delayed.
fn start_slow_daemon(queue: &TestQueue) -> Daemon {
    let inject = format!("inject=fsync,fdatasync:delay_exit={FSYNC_DELAY_US}");
    queue.start_under_strace(
        &[
            "-f",
            "--seccomp-bpf",
            "-qq",
            "-o",
            "/dev/null",
            "-e",
            "trace=fsync,fdatasync",
            "-e",
            &inject,
        ],
        &[],
    )
}

/// The iteration count of the task's latest checkpoint on disk, if any.
fn checkpointed(queue: &TestQueue) -> Option<u64> {
    let bytes = fs::read(queue.path(&format!("incremental/{TASK}.json.gz"))).ok()?;
    decode_checkpoint(&bytes).ok().map(|cp| cp.iteration_count)
}

/// The iterations started, in order, per the fixture's side file.
fn starts(side: &Path) -> Vec<u64> {
    logged_iterations(&side_lines(side), "start")
}

/// The task: `worker_helper.py` over `ITERATIONS` iterations of 0.1 s, logging to `side`.
fn helper_task(side: &Path, worker_args: &[&str]) -> Value {
    let mut run = vec![
        json!("python3"),
        json!(fixture("worker_helper.py")),
        json!(side),
        json!("--iterations"),
        json!(ITERATIONS.to_string()),
        json!("--sleep"),
        json!("0.1"),
    ];
    run.extend(worker_args.iter().map(|a| json!(a)));
    json!({"id": TASK, "phases": [{"name": "work", "kind": "worker", "run": run}]})
}

/// What an uninterrupted run of the task ends with.
fn expected_result() -> Value {
    json!({
        "sum": (0..ITERATIONS).map(|i| i * i).sum::<u64>(),
        "last": ITERATIONS - 1,
    })
}

/// What one SIGKILL did to the worker.
struct Outcome {
    /// Starts beyond the first of each iteration.
    reruns: usize,
    /// The starts before and after the kill, for messages.
    before: Vec<u64>,
    after: Vec<u64>,
    /// Whether the worker had run its loop to the end before the kill.
    finished_before_kill: bool,
}

/// Run the worker under a slow disk, SIGKILL the daemon once two checkpoints are on disk and
/// iteration 2 has started,
/// restart it to finish the task, and count the iterations that ran again.
fn kill_once_under_slow_fsyncs(worker_args: &[&str]) -> Outcome {
    let queue = TestQueue::new();
    let side = queue.aux("worker.side");
    queue.seed_task(&format!("{TASK}.json"), &helper_task(&side, worker_args));

    let mut strace = start_slow_daemon(&queue);
    let pid = queue.daemon_pid();
    // With acks, iteration 2 is then in flight (or its checkpoint on its way).
    wait_until(
        "two checkpoints are on disk and iteration 2 has started",
        DEADLINE,
        || checkpointed(&queue).is_some_and(|n| n >= 2) && starts(&side).contains(&2),
    );
    kill(Pid::from_raw(pid), SIGKILL).expect("SIGKILL to the daemon");
    strace.wait_exit(DEADLINE);
    let before = starts(&side);
    let finished_before_kill = fs::read_to_string(&side)
        .unwrap_or_default()
        .lines()
        .any(|line| line.starts_with("exit 0 "));

    queue.run_until_idle(&[]);
    let record = queue.wait_done(TASK);
    assert_eq!(
        record["result"],
        expected_result(),
        "the result of an uninterrupted run"
    );
    let all = starts(&side);
    let distinct: BTreeSet<u64> = all.iter().copied().collect();
    assert_eq!(
        distinct,
        (0..ITERATIONS).collect::<BTreeSet<u64>>(),
        "every iteration ran: {all:?}"
    );
    Outcome {
        reruns: all.len() - distinct.len(),
        after: all[before.len()..].to_vec(),
        before,
        finished_before_kill,
    }
}

#[test]
fn with_acks_one_sigkill_on_a_slow_disk_reruns_at_most_the_iteration_in_flight() {
    if !require_strace("worker_ack") {
        return;
    }
    let outcome = kill_once_under_slow_fsyncs(&[]);
    eprintln!(
        "with acks: {} iterations ran again (started before the kill {:?}, after {:?})",
        outcome.reruns, outcome.before, outcome.after
    );
    assert!(
        !outcome.finished_before_kill,
        "the kill should come mid-run; iterations started before it: {:?}",
        outcome.before
    );
    assert!(
        outcome.reruns <= 1,
        "{} iterations ran again after one SIGKILL (at most the one in flight may): \
         started before the kill {:?}, after {:?}",
        outcome.reruns,
        outcome.before,
        outcome.after
    );
}

/// The control: the same kill with a worker that does not wait re-runs more than the bound, so
/// the test above would catch a helper that runs ahead of its committed checkpoints.
#[test]
fn without_acks_the_same_sigkill_reruns_more_than_one_iteration() {
    if !require_strace("worker_ack") {
        return;
    }
    let outcome = kill_once_under_slow_fsyncs(&["--no-wait"]);
    eprintln!(
        "without acks: {} iterations ran again (started before the kill {:?}, after {:?})",
        outcome.reruns, outcome.before, outcome.after
    );
    assert!(
        outcome.reruns > 1,
        "without waiting, the worker should have run ahead of its checkpoints: \
         started before the kill {:?}, after {:?}",
        outcome.before,
        outcome.after
    );
}

/// A daemon stop during a slow commit: the worker (told by SIGTERM) still gets its answer,
/// finishes cleanly with status 75, the daemon exits 0, and the restart runs no iteration again.
#[test]
fn a_stop_during_a_slow_commit_answers_the_worker_and_reruns_nothing() {
    if !require_strace("worker_ack") {
        return;
    }
    let queue = TestQueue::new();
    let side = queue.aux("worker.side");
    queue.seed_task(&format!("{TASK}.json"), &helper_task(&side, &[]));
    let mut strace = start_slow_daemon(&queue);
    let pid = queue.daemon_pid();
    wait_until("two checkpoints are on disk", DEADLINE, || {
        checkpointed(&queue).is_some_and(|n| n >= 2)
    });
    kill(Pid::from_raw(pid), SIGTERM).expect("SIGTERM to the daemon");
    let status = strace.wait_exit(DEADLINE);
    assert_eq!(
        status.code(),
        Some(0),
        "the daemon (through strace) exited with {status}"
    );
    let text = fs::read_to_string(&side).unwrap_or_default();
    assert!(
        text.lines().any(|line| line.starts_with("exit 75 ")),
        "the worker should have exited 75 on its own after its last answer:\n{text}"
    );
    queue.run_until_idle(&[]);
    assert_eq!(queue.wait_done(TASK)["result"], expected_result());
    let all = starts(&side);
    assert_eq!(
        all,
        (0..ITERATIONS).collect::<Vec<_>>(),
        "each iteration ran once"
    );
}

/// `checkpoint_every: 3`: the answers to the checkpoints between two writes come at once (with
/// the committed count behind), so a waiting worker runs through; a clean stop flushes the
/// latest iteration and nothing runs again.
#[test]
fn with_checkpoint_every_3_a_waiting_worker_runs_through_and_a_stop_reruns_nothing() {
    let queue = TestQueue::new();
    let side = queue.aux("worker.side");
    let mut task = helper_task(&side, &[]);
    task["phases"][0]["checkpoint_every"] = json!(3);
    queue.seed_task(&format!("{TASK}.json"), &task);
    let mut daemon = queue.start(&[]);
    wait_until("iteration 4 has started", DEADLINE, || {
        starts(&side).contains(&4)
    });
    daemon.signal(SIGTERM);
    let status = daemon.wait_exit(DEADLINE);
    assert_eq!(status.code(), Some(0), "the daemon exited with {status}");
    queue.run_until_idle(&[]);
    assert_eq!(queue.wait_done(TASK)["result"], expected_result());
    let all = starts(&side);
    assert_eq!(
        all,
        (0..ITERATIONS).collect::<Vec<_>>(),
        "each iteration ran once"
    );
}

/// Run the daemon in this process on a storage backend whose `ops` may fail a write, until the
/// queue is idle.
fn run_in_process(queue: &Path, ops: Arc<FaultyFileOps>) {
    let storage: Arc<dyn Storage> = Arc::new(FileStorage::with_ops(queue, ops));
    let mut config = DaemonConfig::new(queue);
    config.exit_when_idle = true;
    config.storage = Some(storage);
    config.rescan_interval = Duration::from_millis(50);
    // The daemon needs a current-thread runtime (see `daemon::run`).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let exit = runtime
        .block_on(async {
            tokio::time::timeout(
                Duration::from_secs(120),
                daemon::run(config, Shutdown::new()),
            )
            .await
        })
        .expect("the daemon did not finish within 120 s")
        .expect("the daemon failed to run");
    assert_eq!(exit, DaemonExit::Idle);
}

/// A failed checkpoint write (disk full) at each write step of a run in turn: a worker waiting
/// for that checkpoint's answer gets it (not committed) and SIGTERM, and exits 75 on its own,
/// never left hanging until SIGKILL; the task is retried and finishes with the right result.
#[test]
fn a_failed_checkpoint_write_answers_the_waiting_worker_which_exits_75() {
    let setup = |dir: &Path| -> PathBuf {
        let queue = dir.join("queue");
        fs::create_dir_all(queue.join("inbox")).expect("creating the inbox");
        let side = dir.join("worker.side");
        let mut task = helper_task(&side, &[]);
        task["phases"][0]["run"][4] = json!("3"); // iterations
        task["phases"][0]["run"][6] = json!("0.01"); // seconds each
        task["retry"] = json!({"max_attempts": 2, "backoff": "20ms", "max_backoff": "40ms"});
        let path = queue.join(format!("inbox/{TASK}.json"));
        fs::write(&path, task.to_string()).expect("writing the task");
        let old = std::time::SystemTime::now() - Duration::from_secs(600);
        let file = fs::File::options()
            .write(true)
            .open(&path)
            .expect("the task");
        file.set_modified(old).expect("backdating the task");
        side
    };
    let reference = tempfile::tempdir().expect("a temp dir");
    setup(reference.path());
    let counting = Arc::new(FaultyFileOps::new());
    run_in_process(&reference.path().join("queue"), Arc::clone(&counting));
    let steps = counting.steps();

    // Four runs at a time: each mostly waits (worker start-up, retry backoff).
    let next_step = AtomicU64::new(0);
    let stopped_for_a_failed_write = AtomicU64::new(0);
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| loop {
                let step = next_step.fetch_add(1, Ordering::SeqCst);
                if step >= steps {
                    break;
                }
                if fail_at_step(step, &setup) {
                    stopped_for_a_failed_write.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
    });
    let stopped_for_a_failed_write = stopped_for_a_failed_write.into_inner();
    eprintln!("{stopped_for_a_failed_write} of {steps} failing steps stopped the worker");
    assert!(
        stopped_for_a_failed_write > 0,
        "no failing step hit a worker checkpoint ({steps} steps)"
    );
}

/// One run whose write step `step` fails; true if a worker was stopped by it (exited 75).
fn fail_at_step(step: u64, setup: &impl Fn(&Path) -> PathBuf) -> bool {
    let dir = tempfile::tempdir().expect("a temp dir");
    let side = setup(dir.path());
    let queue = dir.path().join("queue");
    run_in_process(
        &queue,
        Arc::new(FaultyFileOps::fail_at(step, FaultMode::Error)),
    );
    let record = read_json(&queue.join(format!("done/{TASK}.json")));
    let sum: u64 = (0..3u64).map(|i| i * i).sum();
    assert_eq!(
        record["result"],
        json!({"sum": sum, "last": 2}),
        "step {step}"
    );
    // Every worker process that started also exited on its own (none was killed).
    let text = fs::read_to_string(&side).unwrap_or_default();
    let pids = |prefixes: &[&str]| -> Vec<String> {
        let mut pids: Vec<String> = text
            .lines()
            .filter(|l| prefixes.iter().any(|p| l.starts_with(p)))
            .filter_map(|l| l.rsplit(' ').next().map(str::to_string))
            .collect();
        pids.sort();
        pids
    };
    assert_eq!(
        pids(&["fresh ", "resume "]),
        pids(&["exit "]),
        "step {step}: a worker did not exit on its own:\n{text}"
    );
    text.lines().any(|l| l.starts_with("exit 75 "))
}

/// A worker that asks for answers and never reads them (well past the FIFO's 64 KiB) does not
/// stall the daemon: the answers that do not fit are dropped, and its later messages count.
#[test]
fn answers_nobody_reads_never_stall_the_daemon() {
    let queue = TestQueue::new();
    let script = "import os\n\
                  with open(os.environ['CAIRN_CHANNEL'], 'a') as channel:\n\
                  \x20   for n in range(5000):\n\
                  \x20       channel.write('{\"heartbeat\": true, \"ack\": true}\\n')\n\
                  \x20   channel.write('{\"checkpoint\": {\"iteration\": 1, \"state\": 7}, \"ack\": true}\\n')\n\
                  \x20   channel.write('{\"output\": \"after 5000 answers\"}\\n')\n";
    queue.seed_task(
        "deaf.json",
        &json!({"id": "deaf", "phases": [{"name": "work", "kind": "worker",
                                          "run": ["python3", "-c", script]}]}),
    );
    queue.run_until_idle(&[]);
    let record = queue.wait_done("deaf");
    assert_eq!(record["result"], json!("after 5000 answers"));
}
