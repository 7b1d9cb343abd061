//! Clean stops and restarts of the real daemon: SIGTERM mid-loop flushes the completed
//! iterations and exits 0, the restart finishes with the same result as an uninterrupted run
//! without running any iteration twice, in-flight tasks resume before new ones, and a second
//! signal cuts the grace short.

use crate::common::*;
use chrono::{DateTime, FixedOffset};
use serde_json::{json, Value};

const ITERATIONS: u64 = 20;
const SLEEP: f64 = 0.1;

#[test]
fn sigterm_mid_loop_flushes_exits_0_and_the_restart_matches_an_uninterrupted_run() {
    let mut reference = start_reference(|side| loop_task("sum", side, ITERATIONS, SLEEP));
    let queue = TestQueue::new();
    let side = queue.aux("sum.side");
    queue.seed_task("sum.json", &loop_task("sum", &side, ITERATIONS, SLEEP));

    let mut daemon = queue.start(&[]);
    wait_until("the loop has finished 3 iterations", DEADLINE, || {
        ended_iterations(&side).len() >= 3
    });
    daemon.signal(SIGTERM);
    let status = daemon.wait_exit(DEADLINE);
    assert_eq!(status.code(), Some(0), "SIGTERM: {status}");

    // The iteration in flight was not signalled: it finished during the grace.
    let started: Vec<u64> = side_events(&side)
        .iter()
        .filter(|e| e.event == "start")
        .map(|e| e.iteration)
        .collect();
    let ended = ended_iterations(&side);
    let completed = ended.len() as u64;
    assert_eq!(started, ended, "an iteration was cut off by the stop");
    assert_eq!(ended, (0..completed).collect::<Vec<_>>());
    assert!(
        completed < ITERATIONS,
        "the loop finished before the stop ({completed} iterations)"
    );

    let checkpoint = queue.checkpoint("sum");
    assert_eq!(checkpoint.task_id, "sum");
    assert_eq!(checkpoint.phase, "count");
    assert_eq!(checkpoint.phase_index, 0);
    assert_eq!(checkpoint.iteration_count, completed);
    assert_eq!(checkpoint.partial_results, loop_result(completed));
    assert_eq!(checkpoint.attempt, 1);
    assert!(!checkpoint.done);

    // Older generations are kept beside the latest: each decodes and holds fewer iterations.
    let generations: Vec<String> = queue
        .list("incremental")
        .into_iter()
        .filter(|n| n.starts_with("sum.") && n != "sum.json.gz")
        .collect();
    assert!(!generations.is_empty(), "no older generation kept");
    for name in &generations {
        let bytes = std::fs::read(queue.path(&format!("incremental/{name}"))).unwrap();
        let older = cairn::store::decode_checkpoint(&bytes).unwrap();
        assert_eq!(name, &format!("sum.{}.json.gz", older.generation));
        assert!(older.generation < checkpoint.generation, "{name}");
        assert!(older.iteration_count < completed, "{name}");
        assert_eq!(older.partial_results, loop_result(older.iteration_count));
    }

    let entry = queue
        .active_entry("sum")
        .expect("current_work.json lists the interrupted task");
    assert_eq!(entry["status"], "interrupted", "{entry:#}");
    assert_eq!(entry["phase"], "count");
    assert_eq!(entry["phase_index"], 0);
    assert_eq!(entry["iterations"], completed);
    assert_eq!(entry["attempt"], 1);
    assert!(queue.done("sum").is_none());

    queue.run_until_idle(&[]);
    let done = queue.done("sum").expect("done/sum.json after the restart");
    assert_eq!(done["status"], "done");
    assert_eq!(done["task_id"], "sum");
    assert_eq!(done["attempts"], 2);
    assert_eq!(done["failed_attempts"], 0);
    assert_eq!(done["phases"][0]["iterations"], ITERATIONS);
    let expected = reference_result(&mut reference, "sum");
    assert_eq!(expected, loop_result(ITERATIONS), "the reference run");
    assert_eq!(done["result"], expected);
    assert_eq!(done["phase_outputs"]["count"], expected);

    // No iteration ran twice, and the restart continued right after the checkpoint.
    let once_each: std::collections::BTreeMap<u64, usize> =
        (0..ITERATIONS).map(|i| (i, 1)).collect();
    assert_eq!(start_counts(&side), once_each);
    assert_eq!(ended_iterations(&side), (0..ITERATIONS).collect::<Vec<_>>());
    let first_of_restart = side_events(&side)
        .into_iter()
        .find(|e| e.attempt == 2)
        .expect("the restart ran iterations");
    assert_eq!(first_of_restart.iteration, completed);
    assert!(queue.active_entry("sum").is_none());
}

#[test]
fn sigint_is_a_clean_stop_too() {
    let queue = TestQueue::new();
    let side = queue.aux("int.side");
    queue.seed_task("int.json", &loop_task("int", &side, 6, 0.1));
    let mut daemon = queue.start(&[]);
    wait_until("the loop has finished 2 iterations", DEADLINE, || {
        ended_iterations(&side).len() >= 2
    });
    daemon.signal(SIGINT);
    assert_eq!(daemon.wait_exit(DEADLINE).code(), Some(0));
    let completed = ended_iterations(&side).len() as u64;
    assert_eq!(queue.checkpoint("int").iteration_count, completed);
    assert_eq!(queue.active_entry("int").unwrap()["status"], "interrupted");

    queue.run_until_idle(&[]);
    assert_eq!(queue.done("int").unwrap()["result"], loop_result(6));
    assert!(start_counts(&side).values().all(|&n| n == 1));
}

#[test]
fn a_restart_resumes_the_interrupted_task_before_new_ones() {
    let queue = TestQueue::new();
    let side = queue.aux("order.side");
    queue.seed_task("a.json", &loop_task("a", &side, 8, 0.15));
    let mut daemon = queue.start(&["--max-tasks", "1"]);
    wait_until("task a has finished an iteration", DEADLINE, || {
        !ended_iterations(&side).is_empty()
    });

    // B1 arrives while A runs: accepted, but it has to wait for the one task slot. Its higher
    // priority must not let it overtake A after the restart.
    let mut b1 = loop_task("b1", &side, 2, 0.05);
    b1["priority"] = json!(10);
    queue.drop_task("b1.json", &b1);
    wait_until("task b1 is accepted", DEADLINE, || {
        queue.path("tasks/b1.json").exists()
    });
    wait_until("task a has finished 2 iterations", DEADLINE, || {
        ended_iterations(&side).len() >= 2
    });
    daemon.signal(SIGTERM);
    assert_eq!(daemon.wait_exit(DEADLINE).code(), Some(0));
    assert_eq!(queue.active_entry("a").unwrap()["status"], "interrupted");
    assert!(queue.active_entry("b1").is_none(), "b1 started early");
    assert!(side_events(&side).iter().all(|e| e.task == "a"));

    // B2 arrives while the daemon is down.
    let mut b2 = loop_task("b2", &side, 2, 0.05);
    b2["priority"] = json!(10);
    queue.seed_task("b2.json", &b2);
    queue.run_until_idle(&["--max-tasks", "1"]);

    let a = queue.done("a").expect("done/a.json");
    assert_eq!(a["result"], loop_result(8));
    for b in ["b1", "b2"] {
        let record = queue.done(b).unwrap_or_else(|| panic!("done/{b}.json"));
        assert_eq!(record["result"], loop_result(2));
        let a_finished = timestamp(&a["finished_at"]);
        let b_started = timestamp(&record["started_at"]);
        assert!(
            a_finished <= b_started,
            "{b} started at {b_started}, before a finished at {a_finished}"
        );
    }
    let tasks_in_order: Vec<String> = side_events(&side).into_iter().map(|e| e.task).collect();
    let last_a = tasks_in_order.iter().rposition(|t| t == "a").unwrap();
    let first_b = tasks_in_order.iter().position(|t| t != "a").unwrap();
    assert!(
        last_a < first_b,
        "a task ran before the interrupted one finished: {tasks_in_order:?}"
    );
    assert!(start_counts(&side).values().all(|&n| n <= 3));
}

#[test]
fn a_second_signal_exits_at_once_with_130_keeping_the_committed_iterations() {
    let queue = TestQueue::new();
    let side = queue.aux("slow.side");
    // Iteration 2 takes an hour in the first attempt: the grace (default 30 s) cannot be waited
    // out, and the command is gone within the deadline only if it was ended.
    let mut task = loop_task("slow", &side, 5, 0.05);
    add_args(&mut task, &["--slow", "2:3600"]);
    queue.seed_task("slow.json", &task);
    let mut daemon = queue.start(&[]);
    let in_flight = wait_for("iteration 2 has started", DEADLINE, || {
        side_events(&side)
            .into_iter()
            .find(|e| e.event == "start" && e.iteration == 2)
    });
    let _cleanup = KillGroupOnDrop(process_group_of(in_flight.pid).unwrap_or(in_flight.pid));
    daemon.signal(SIGTERM);
    wait_until("the daemon logs the stop", DEADLINE, || {
        daemon.stderr().contains("stop signal")
    });
    assert!(daemon.is_running(), "the daemon left during the grace");
    daemon.signal(SIGTERM);
    let status = daemon.wait_exit(DEADLINE);
    assert_eq!(status.code(), Some(130), "second signal: {status}");
    wait_until("the iteration's command is gone", DEADLINE, || {
        !process_alive(in_flight.pid)
    });

    let checkpoint = queue.checkpoint("slow");
    assert_eq!(checkpoint.iteration_count, 2);
    assert_eq!(checkpoint.partial_results, loop_result(2));
    let entry = queue
        .active_entry("slow")
        .expect("the task is still in flight");
    assert_eq!(entry["status"], "interrupted", "{entry:#}");

    queue.run_until_idle(&[]);
    assert_eq!(queue.done("slow").unwrap()["result"], loop_result(5));
    let counts = start_counts(&side);
    assert_eq!(counts[&0], 1);
    assert_eq!(counts[&1], 1);
    assert_eq!(counts[&2], 2, "the cut-off iteration runs again, once");
    assert_eq!(counts[&3], 1);
}

fn timestamp(value: &Value) -> DateTime<FixedOffset> {
    let text = value
        .as_str()
        .unwrap_or_else(|| panic!("not a timestamp: {value}"));
    DateTime::parse_from_rfc3339(text).unwrap_or_else(|e| panic!("{text:?}: {e}"))
}

#[test]
fn pending_tasks_start_by_priority() {
    let queue = TestQueue::new();
    let side = queue.aux("order.side");
    // Names sort the other way round, so that name order cannot pass for priority order.
    for (name, priority) in [("a-low", 0), ("b-high", 5), ("c-middle", 1), ("d-high", 5)] {
        let mut task = loop_task(name, &side, 1, 0.0);
        task["priority"] = json!(priority);
        queue.seed_task(&format!("{name}.json"), &task);
    }
    queue.run_until_idle(&["--max-tasks", "1"]);
    let order: Vec<String> = side_events(&side)
        .into_iter()
        .filter(|e| e.event == "start")
        .map(|e| e.task)
        .collect();
    assert_eq!(order, vec!["b-high", "d-high", "c-middle", "a-low"]);
}

/// In the foreground a loop shows it is moving: the first checkpoint of a phase and then at
/// most one a second get an INFO line, so "press Ctrl-C after a few iterations" needs no
/// second terminal.
#[test]
fn a_foreground_run_logs_checkpoints_at_info_at_most_once_a_second() {
    let queue = TestQueue::new();
    let side = queue.aux("sum.side");
    queue.seed_task("sum.json", &loop_task("sum", &side, 40, 0.05));
    let mut daemon = queue.start(&["--exit-when-idle"]);
    let status = daemon.wait_exit(DEADLINE);
    assert_eq!(status.code(), Some(0), "{status}");
    let stderr = daemon.stderr();
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains("INFO") && line.contains("checkpoint committed"))
        .collect();
    assert!(
        lines.first().is_some_and(|line| line.contains("done=1")),
        "the first checkpoint is logged: {stderr}"
    );
    // Forty checkpoints over at least 2 s: more than one line, and fewer than one per
    // checkpoint (all forty only if every iteration took a second or more).
    assert!(
        (2..40).contains(&lines.len()),
        "{} lines: {stderr}",
        lines.len()
    );
}
