//! `items` phases with the real daemon: a dozen items at concurrency 3, the daemon SIGKILLed
//! mid-batch and restarted → every result exactly once, in item order, equal to an uninterrupted
//! run, and no item that was in the last checkpoint before the kill runs again; a SIGTERM flushes
//! every finished item even between two scheduled checkpoints; `items_from` takes an earlier
//! phase's array output and fails clearly on anything else.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::time::Duration;

use crate::common::*;
use cairn::store::IterationCheckpoint;
use serde_json::{json, Value};

/// The batch: a dozen items.
const ITEMS: [i64; 12] = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8];

/// An `items` task over [`ITEMS`] at concurrency 3, each item taking `sleep` seconds in
/// `tests/fixtures/items_twice.py`, which logs its runs to `side`.
fn batch_task(id: &str, side: &Path, checkpoint_every: u64, sleep: f64) -> Value {
    json!({
        "id": id,
        // Plenty of attempts: the scenarios interrupt the task, they do not test retries.
        "retry": {"max_attempts": 5, "backoff": "100ms"},
        "phases": [{
            "name": "twice",
            "kind": "items",
            "items": ITEMS,
            "run": ["python3", fixture("items_twice.py"), side, "--sleep", sleep.to_string()],
            "concurrency": 3,
            "checkpoint_every": checkpoint_every,
        }],
    })
}

/// What `items_twice.py` returns for item `index`, given the earlier phases named `inputs`.
fn item_result(index: usize, item: &Value, inputs: &[&str]) -> Value {
    let twice = match item {
        Value::Number(n) => json!(n.as_i64().expect("an integer item") * 2),
        Value::String(s) => json!(s.repeat(2)),
        Value::Array(a) => Value::Array(a.iter().chain(a).cloned().collect()),
        other => panic!("items_twice.py cannot double {other}"),
    };
    json!({"index": index, "item": item, "twice": twice, "inputs": inputs})
}

/// The phase output of an uninterrupted run over [`ITEMS`].
fn batch_result() -> Value {
    Value::Array(
        ITEMS
            .iter()
            .enumerate()
            .map(|(i, item)| item_result(i, &json!(item), &[]))
            .collect(),
    )
}

/// The task's latest iteration checkpoint, if it has one yet.
fn checkpoint_if_any(queue: &TestQueue, id: &str) -> Option<IterationCheckpoint> {
    queue
        .path(&format!("incremental/{id}.json.gz"))
        .exists()
        .then(|| queue.checkpoint(id))
}

/// The item results held by an items checkpoint, by index.
fn checkpointed_results(checkpoint: &IterationCheckpoint) -> BTreeMap<usize, Value> {
    checkpoint.partial_results["results"]
        .as_object()
        .unwrap_or_else(|| panic!("no results object in {:#}", checkpoint.partial_results))
        .iter()
        .map(|(k, v)| (k.parse().expect("a result keyed by item index"), v.clone()))
        .collect()
}

/// The most items that ran at once in `attempt`, per the side file (an item counts from its
/// `start` line to its `end` line).
fn max_in_flight(side: &Path, attempt: u32) -> usize {
    let (mut now, mut max) = (0usize, 0usize);
    for e in side_events(side).iter().filter(|e| e.attempt == attempt) {
        if e.event == "start" {
            now += 1;
            max = max.max(now);
        } else {
            now -= 1;
        }
    }
    max
}

/// Indices started by the runs of `attempt`, with how often each was started.
fn starts_in_attempt(side: &Path, attempt: u32) -> BTreeMap<usize, usize> {
    let mut counts = BTreeMap::new();
    for e in side_events(side) {
        if e.event == "start" && e.attempt == attempt {
            *counts.entry(e.iteration as usize).or_default() += 1;
        }
    }
    counts
}

fn sigkill_mid_batch_then_restart(checkpoint_every: u64) {
    let id = "batch";
    let mut reference = start_reference(|side| batch_task(id, side, checkpoint_every, 0.3));
    let queue = TestQueue::new();
    let side = queue.aux("batch.side");
    queue.seed_task("batch.json", &batch_task(id, &side, checkpoint_every, 0.3));

    let mut daemon = queue.start(&[]);
    wait_until("at least 4 items are checkpointed", DEADLINE, || {
        checkpoint_if_any(&queue, id).is_some_and(|cp| cp.iteration_count >= 4)
    });
    let status = daemon.kill_hard();
    assert_eq!(status.signal(), Some(9), "{status}");
    // A restart at once can be refused the lock: see
    // `a_restart_right_after_a_sigkill_is_not_refused_the_queue_lock`. This scenario is about
    // the batch, so it waits for the lock as a supervisor's restart delay would.
    queue.wait_lock_released();

    // The last checkpoint before the kill.
    let checkpoint = queue.checkpoint(id);
    assert_eq!(checkpoint.task_id, id);
    assert_eq!(checkpoint.phase, "twice");
    assert_eq!(checkpoint.phase_index, 0);
    assert_eq!(checkpoint.scope, "items");
    assert_eq!(checkpoint.attempt, 1);
    assert!(!checkpoint.done, "the batch finished before the kill");
    let saved = checkpointed_results(&checkpoint);
    assert_eq!(checkpoint.iteration_count, saved.len() as u64);
    assert!(
        (4..ITEMS.len()).contains(&saved.len()),
        "not mid-batch: {} items checkpointed",
        saved.len()
    );
    assert_eq!(
        saved.len() as u64 % checkpoint_every,
        0,
        "a checkpoint off the checkpoint_every {checkpoint_every} boundary: {saved:?}"
    );
    let expected = batch_result();
    for (index, result) in &saved {
        assert_eq!(
            result, &expected[*index],
            "checkpointed result of item {index}"
        );
    }
    let ended_before: BTreeSet<usize> = ended_iterations(&side)
        .into_iter()
        .map(|i| i as usize)
        .collect();
    for index in saved.keys() {
        assert!(
            ended_before.contains(index),
            "item {index} is checkpointed but never ended: {ended_before:?}"
        );
    }

    queue.run_until_idle(&[]);
    let done = queue.done(id).expect("done/batch.json after the restart");
    assert_eq!(done["status"], "done");
    assert_eq!(done["attempts"], 2);
    assert_eq!(done["failed_attempts"], 0);
    assert_eq!(done["phases"][0]["iterations"], ITEMS.len());
    let reference_result = reference_result(&mut reference, id);
    assert_eq!(reference_result, expected, "the reference run");
    // Every result present exactly once, in item order.
    assert_eq!(done["result"], expected);
    assert_eq!(done["phase_outputs"]["twice"], expected);

    // Nothing from the checkpoint ran again; everything else ran exactly once in the restart.
    // The checkpoint file read above may lag the durable checkpoint by one commit: the kill can
    // land after a commit reached the commit log and before its file was published, and the
    // restart replays the log first. So the restart may resume from `checkpoint_every` items
    // more than the file showed, each of them an item that ended before the kill.
    let rerun = starts_in_attempt(&side, 2);
    assert!(
        rerun.values().all(|runs| *runs == 1),
        "an item ran twice in the restart: {rerun:?}"
    );
    let kept: BTreeSet<usize> = (0..ITEMS.len())
        .filter(|i| !rerun.contains_key(i))
        .collect();
    assert!(
        saved.keys().all(|index| kept.contains(index)),
        "the restart ran checkpointed items again: checkpointed {:?}, rerun {rerun:?}",
        saved.keys().collect::<Vec<_>>()
    );
    let published_late = kept.len() - saved.len();
    assert!(
        published_late == 0 || published_late as u64 == checkpoint_every,
        "the restart resumed from {kept:?}, the checkpoint file showed {:?}",
        saved.keys().collect::<Vec<_>>()
    );
    for index in &kept {
        assert!(
            ended_before.contains(index),
            "item {index} was not run again but never ended before the kill: {ended_before:?}"
        );
    }
    let first_run = starts_in_attempt(&side, 1);
    for index in saved.keys() {
        assert_eq!(first_run.get(index), Some(&1), "item {index} in attempt 1");
    }
    let attempts: BTreeSet<u32> = side_events(&side).iter().map(|e| e.attempt).collect();
    assert_eq!(attempts, BTreeSet::from([1, 2]));
    // The side file shows a lower bound of what ran at once (an item that is slow to start
    // may log after another ended), so only the limit is exact.
    assert!(max_in_flight(&side, 1) <= 3, "concurrency 3");
    assert!(
        max_in_flight(&side, 2) <= 3,
        "concurrency 3 after the restart"
    );
    assert!(queue.active_entry(id).is_none());
}

#[test]
fn sigkill_mid_batch_then_restart_gives_every_result_once_without_rerunning_checkpointed_items() {
    sigkill_mid_batch_then_restart(1);
}

#[test]
fn sigkill_mid_batch_with_checkpoint_every_2_gives_every_result_once() {
    sigkill_mid_batch_then_restart(2);
}

/// A daemon restarted the moment the previous one was SIGKILLed and reaped (a supervisor loop,
/// systemd with `RestartSec=0`) must get the queue: the dead owner's lock is the kernel's to
/// release. While a batch of quick items runs, the daemon forks all the time, and a child
/// between fork and exec shares the lock's open file description, so the kill often lands in
/// such a window.
#[test]
fn a_restart_right_after_a_sigkill_is_not_refused_the_queue_lock() {
    const CYCLES: usize = 25;
    let queue = TestQueue::new();
    let items: Vec<u64> = (0..20_000).collect();
    queue.seed_task(
        "quick.json",
        &json!({
            "id": "quick",
            // Kills before any checkpoint count as failed attempts; they are not the point here.
            "retry": {"max_attempts": 1000, "backoff": "10ms"},
            "phases": [{
                "name": "quick",
                "kind": "items",
                "items": items,
                "run": ["true"],
                "concurrency": 8,
                "checkpoint_every": 1_000_000,
            }],
        }),
    );
    // The test is the supervisor: it reaps the killed daemon itself and restarts it at once.
    let mut started = 0;
    let mut start = || {
        started += 1;
        Supervised::start(&queue, started)
    };
    let mut daemon = start();
    let mut refused = Vec::new();
    for cycle in 0..CYCLES {
        wait_until("the daemon runs the batch", DEADLINE, || {
            daemon.stderr().contains("phase started")
        });
        // A random moment while items are being started.
        std::thread::sleep(Duration::from_millis(20 + fastrand::u64(..150)));
        let status = daemon.kill_and_reap();
        assert_eq!(status.signal(), Some(9), "cycle {cycle}: {status}");
        daemon = start();
        let exited = wait_for("the new daemon takes the queue or exits", DEADLINE, || {
            if daemon.stderr().contains("cairn daemon started") {
                return Some(None);
            }
            daemon
                .child
                .try_wait()
                .expect("checking on the daemon")
                .map(Some)
        });
        if let Some(status) = exited {
            refused.push(format!(
                "cycle {cycle}: {status}: {}",
                daemon.stderr().trim()
            ));
            queue.wait_lock_released();
            daemon = start();
        }
    }
    daemon.kill_and_reap();
    assert!(
        refused.is_empty(),
        "{} of {CYCLES} restarts right after a SIGKILL were refused the queue:\n{}",
        refused.join("\n").lines().count(),
        refused.join("\n")
    );
}

/// A `cairn run` that this file's test reaps itself; killed when dropped.
struct Supervised {
    child: Child,
    stderr_path: PathBuf,
}

impl Supervised {
    fn start(queue: &TestQueue, n: usize) -> Supervised {
        let stderr_path = queue.aux(&format!("supervised-{n}.log"));
        let stderr = File::create(&stderr_path).expect("creating the daemon's stderr file");
        let child = queue
            .cairn()
            .arg("run")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("starting cairn run");
        Supervised { child, stderr_path }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// SIGKILL, then wait(2) for it, as a supervisor does.
    fn kill_and_reap(&mut self) -> ExitStatus {
        let _ = self.child.kill();
        self.child.wait().expect("reaping the daemon")
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.kill_and_reap();
        }
    }
}

#[test]
fn sigterm_mid_batch_flushes_every_finished_item_between_scheduled_checkpoints() {
    let id = "flush";
    let queue = TestQueue::new();
    let side = queue.aux("flush.side");
    // No scheduled checkpoint can happen: the batch has fewer items than checkpoint_every.
    queue.seed_task("flush.json", &batch_task(id, &side, 20, 0.3));
    let mut daemon = queue.start(&[]);
    wait_until("4 items have finished", DEADLINE, || {
        ended_iterations(&side).len() >= 4
    });
    assert!(
        checkpoint_if_any(&queue, id).is_none(),
        "a checkpoint before the stop"
    );
    daemon.signal(SIGTERM);
    let status = daemon.wait_exit(DEADLINE);
    assert_eq!(status.code(), Some(0), "SIGTERM: {status}");

    // The items in flight finished during the grace, and every finished item was flushed.
    let started: BTreeSet<u64> = side_events(&side)
        .iter()
        .filter(|e| e.event == "start")
        .map(|e| e.iteration)
        .collect();
    let ended: BTreeSet<u64> = ended_iterations(&side).into_iter().collect();
    assert_eq!(started, ended, "an item was cut off by the stop");
    assert!(
        ended.len() < ITEMS.len(),
        "the batch finished before the stop"
    );
    let checkpoint = queue.checkpoint(id);
    assert!(!checkpoint.done);
    let saved = checkpointed_results(&checkpoint);
    let saved_indices: BTreeSet<u64> = saved.keys().map(|&i| i as u64).collect();
    assert_eq!(saved_indices, ended);
    assert_eq!(checkpoint.iteration_count, ended.len() as u64);
    let entry = queue.active_entry(id).expect("the task is in flight");
    assert_eq!(entry["status"], "interrupted", "{entry:#}");

    queue.run_until_idle(&[]);
    let done = queue.done(id).expect("done/flush.json");
    assert_eq!(done["result"], batch_result());
    let once_each: BTreeMap<u64, usize> = (0..ITEMS.len() as u64).map(|i| (i, 1)).collect();
    assert_eq!(start_counts(&side), once_each, "an item ran twice");
    assert!(max_in_flight(&side, 2) <= 3, "concurrency 3 in the restart");
}

#[test]
fn an_item_that_keeps_failing_fails_the_task_with_its_index_and_error() {
    let queue = TestQueue::new();
    let side = queue.aux("bad.side");
    let mut task = batch_task("bad", &side, 1, 0.1);
    add_args(&mut task, &["--fail-index", "5"]);
    task["retry"] = json!({"max_attempts": 2, "backoff": "100ms"});
    queue.seed_task("bad.json", &task);
    queue.run_until_idle(&[]);

    let failed = queue.failed("bad").expect("failed/bad.json");
    assert_eq!(failed["status"], "failed", "{failed:#}");
    assert_eq!(failed["phase"], "twice");
    assert_eq!(failed["attempts"], 2);
    assert_eq!(failed["failed_attempts"], 2);
    let error = failed["error"].as_str().unwrap();
    assert!(
        error.contains("item 5") && error.contains("exit status: 3"),
        "the error does not name the item and its exit status: {error:?}"
    );
    assert!(queue.done("bad").is_none());

    // Item 5 ran once per attempt; every other item at most once: what finished was kept.
    let counts = start_counts(&side);
    assert_eq!(counts.get(&5), Some(&2), "{counts:?}");
    for (index, n) in &counts {
        assert!(
            *index == 5 || *n == 1,
            "item {index} ran {n} times: {counts:?}"
        );
    }
    // The items in flight beside the failing one finished and were checkpointed.
    let checkpoint = queue.checkpoint("bad");
    let saved: BTreeSet<u64> = checkpointed_results(&checkpoint)
        .keys()
        .map(|&i| i as u64)
        .collect();
    let ended: BTreeSet<u64> = ended_iterations(&side).into_iter().collect();
    assert_eq!(saved, ended);
    assert!(!saved.contains(&5));
}

/// A task whose first phase (`once`) prints `list_output`, and whose second phase runs
/// `items_twice.py` over it.
fn items_from_task(id: &str, side: &Path, list_output: &str) -> Value {
    json!({
        "id": id,
        "retry": {"max_attempts": 1},
        "phases": [
            {"name": "list", "run": ["sh", "-c", format!("printf '%s' '{list_output}'")]},
            {
                "name": "each",
                "kind": "items",
                "items_from": "list",
                "run": ["python3", fixture("items_twice.py"), side, "--sleep", "0.05"],
                "concurrency": 2,
            },
        ],
    })
}

#[test]
fn items_from_runs_over_an_earlier_phases_array_output() {
    let queue = TestQueue::new();
    let side = queue.aux("from.side");
    let list = json!(["ab", 7, [1, 2], "z", 0]);
    queue.seed_task(
        "from.json",
        &items_from_task("from", &side, &list.to_string()),
    );
    queue.run_until_idle(&[]);

    let done = queue.done("from").expect("done/from.json");
    let expected: Vec<Value> = list
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, item)| item_result(i, item, &["list"]))
        .collect();
    assert_eq!(done["result"], json!(expected));
    assert_eq!(done["phase_outputs"]["list"], list);
    assert_eq!(done["phase_outputs"]["each"], json!(expected));
    assert_eq!(done["phases"][1]["iterations"], 5);
    let once_each: BTreeMap<u64, usize> = (0..5).map(|i| (i, 1)).collect();
    assert_eq!(start_counts(&side), once_each);
    assert!(
        max_in_flight(&side, 1) <= 2,
        "more than concurrency 2 at once"
    );
}

#[test]
fn items_from_a_large_output_kept_in_a_file_runs_every_item() {
    // Phase outputs over 4 KiB are stored in runs/<id>/, not inline in current_work.json.
    let queue = TestQueue::new();
    let list: Vec<String> = (0..600).map(|i| format!("item-{i:05}")).collect();
    let list = json!(list);
    assert!(list.to_string().len() > 4096);
    let script = format!("printf '%s' '{list}'");
    queue.seed_task(
        "large.json",
        &json!({
            "id": "large",
            "retry": {"max_attempts": 1},
            "phases": [
                {"name": "list", "run": ["sh", "-c", script]},
                {
                    "name": "each",
                    "kind": "items",
                    "items_from": "list",
                    // Empty stdout: each result is null.
                    "run": ["true"],
                    "concurrency": 4,
                    "checkpoint_every": 100,
                },
            ],
        }),
    );
    queue.run_until_idle(&[]);

    let done = queue.done("large").expect("done/large.json");
    assert_eq!(done["phase_outputs"]["list"], list);
    assert_eq!(done["result"], json!(vec![Value::Null; 600]));
    assert_eq!(done["phases"][1]["iterations"], 600);
}

#[test]
fn items_from_an_output_that_is_not_an_array_fails_saying_so() {
    let queue = TestQueue::new();
    let side = queue.aux("not-array.side");
    // An object, and an empty stdout (the output null).
    queue.seed_task(
        "obj.json",
        &items_from_task("obj", &side, r#"{"items": [1, 2]}"#),
    );
    queue.seed_task("nothing.json", &items_from_task("nothing", &side, ""));
    queue.run_until_idle(&[]);

    for (id, kind, output) in [
        ("obj", "an object", json!({"items": [1, 2]})),
        ("nothing", "null", Value::Null),
    ] {
        let failed = queue
            .failed(id)
            .unwrap_or_else(|| panic!("failed/{id}.json"));
        assert_eq!(failed["status"], "failed", "{failed:#}");
        assert_eq!(failed["phase"], "each");
        assert_eq!(failed["phase_index"], 1);
        assert_eq!(failed["phase_outputs"]["list"], output);
        let error = failed["error"].as_str().expect("an error message");
        for part in [
            "items_from \"list\"",
            &format!("output is {kind}"),
            "not a JSON array",
        ] {
            assert!(error.contains(part), "{id}: {error:?} lacks {part:?}");
        }
        assert!(queue.done(id).is_none());
    }
    assert!(!side.exists(), "an item ran: {:?}", side_events(&side));
}
