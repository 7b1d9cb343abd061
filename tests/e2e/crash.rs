//! Hard crashes of the real daemon: SIGKILL at random moments, several times in a row, loses at
//! most the iteration in flight per kill (at most `checkpoint_every` of them with N > 1), and
//! the task still ends with the result of an uninterrupted run. Children die with the daemon,
//! and a stop whose grace runs out still ends every command's process group.

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::Duration;

use crate::common::*;
use serde_json::{json, Value};

const ITERATIONS: u64 = 20;
const SLEEP: f64 = 0.1;
const KILLS: usize = 4;

/// The loop task of the SIGKILL scenarios. Its attempts are plentiful: a kill that lands before
/// an attempt has written a checkpoint counts as a failed attempt, which is not what is tested.
fn crash_task(side: &Path, checkpoint_every: u64) -> Value {
    let mut task = loop_task("crashy", side, ITERATIONS, SLEEP);
    task["retry"] = json!({"max_attempts": 50, "backoff": "100ms"});
    if checkpoint_every > 1 {
        task["phases"][0]["checkpoint_every"] = json!(checkpoint_every);
    }
    task
}

/// SIGKILL the daemon `KILLS` times at random moments, restart it, and check the result and
/// how much work each kill cost.
fn sigkill_repeatedly(checkpoint_every: u64) {
    let mut reference = start_reference(|side| crash_task(side, checkpoint_every));
    let queue = TestQueue::new();
    let side = queue.aux("crashy.side");
    queue.seed_task("crashy.json", &crash_task(&side, checkpoint_every));

    let mut kills = 0;
    for _ in 0..KILLS {
        let mut daemon = queue.start(&[]);
        // A random moment, not a wait for a state: that is the point of the scenario.
        std::thread::sleep(Duration::from_millis(300 + fastrand::u64(..1200)));
        if queue.done("crashy").is_some() {
            break;
        }
        let status = daemon.kill_hard();
        assert_eq!(status.signal(), Some(9), "{status}");
        kills += 1;

        // Whatever the kill interrupted, the last checkpoint decodes and is consistent.
        if queue.path("incremental/crashy.json.gz").exists() {
            let checkpoint = queue.checkpoint("crashy");
            let count = checkpoint.iteration_count;
            assert_eq!(checkpoint.partial_results, loop_result(count));
            let ended = ended_iterations(&side);
            assert!(
                count == 0 || ended.contains(&(count - 1)),
                "checkpoint {count} ahead of the iterations run: {ended:?}"
            );
        }
    }
    assert!(
        kills >= 2,
        "only {kills} kills landed before the task finished"
    );
    queue.run_until_idle(&[]);

    let done = queue.done("crashy").expect("done/crashy.json");
    assert_eq!(done["status"], "done");
    let expected = reference_result(&mut reference, "crashy");
    assert_eq!(expected, loop_result(ITERATIONS), "the reference run");
    assert_eq!(done["result"], expected);

    // Each daemon run (one attempt each) continues where the checkpoint left off.
    let events = side_events(&side);
    let mut attempts: Vec<u32> = events.iter().map(|e| e.attempt).collect();
    attempts.dedup();
    let mut sorted = attempts.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(attempts, sorted, "attempts interleave in the side file");
    let starts_of = |attempt: u32| -> Vec<u64> {
        events
            .iter()
            .filter(|e| e.attempt == attempt && e.event == "start")
            .map(|e| e.iteration)
            .collect()
    };
    let mut previous_last: Option<u64> = None;
    for &attempt in &attempts {
        let starts = starts_of(attempt);
        let first = starts[0];
        let consecutive: Vec<u64> = (first..first + starts.len() as u64).collect();
        assert_eq!(starts, consecutive, "attempt {attempt} skipped or repeated");
        match previous_last {
            None => assert_eq!(first, 0),
            Some(last) => {
                // Re-run: the iterations from the last checkpoint up to the one in flight.
                let rerun = (last + 1).checked_sub(first);
                assert!(
                    rerun.is_some_and(|n| n <= checkpoint_every),
                    "attempt {attempt} started at {first} after the previous one started {last}"
                );
                if first != last + 1 {
                    assert_eq!(first % checkpoint_every, 0, "resumed between checkpoints");
                }
            }
        }
        previous_last = starts.last().copied();
    }
    assert_eq!(previous_last, Some(ITERATIONS - 1));

    let counts = start_counts(&side);
    assert_eq!(counts.len() as u64, ITERATIONS);
    let reruns: usize = counts.values().map(|n| n - 1).sum();
    assert!(
        reruns <= kills * checkpoint_every as usize,
        "{reruns} re-runs after {kills} kills: {counts:?}"
    );
    if checkpoint_every == 1 {
        assert!(counts.values().all(|&n| n <= 1 + kills), "{counts:?}");
    }
    assert!(queue.active_entry("crashy").is_none());
    let leftovers: Vec<String> = queue
        .list("incremental")
        .into_iter()
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temp files left: {leftovers:?}");
}

#[test]
fn sigkill_at_random_moments_reruns_at_most_the_iteration_in_flight() {
    sigkill_repeatedly(1);
}

#[test]
fn sigkill_with_checkpoint_every_3_reruns_at_most_3_iterations_per_kill() {
    sigkill_repeatedly(3);
}

#[test]
fn a_command_dies_with_the_daemon() {
    let queue = TestQueue::new();
    let side = queue.aux("sleepy.side");
    // An hour-long iteration: it can only be gone within the deadline if it was killed.
    queue.seed_task("sleepy.json", &loop_task("sleepy", &side, 3, 3600.0));
    let mut daemon = queue.start(&[]);
    let child = wait_for("the command has started", DEADLINE, || {
        side_events(&side).into_iter().next()
    });
    let _cleanup = KillGroupOnDrop(child.pid);
    assert!(process_alive(child.pid));
    daemon.kill_hard();
    wait_until(
        &format!("the command (pid {}) is gone", child.pid),
        DEADLINE,
        || !process_alive(child.pid),
    );
    assert!(ended_iterations(&side).is_empty());
}

#[test]
fn a_restarted_daemon_never_races_an_orphan_of_the_daemon_that_died() {
    // `sh -c "python3 step.py"` is a common command. dash does not exec the last command, so
    // python is the shell's child: PR_SET_PDEATHSIG ends the shell with the daemon, not python.
    // docs/reliability.md: commands die with the daemon, "and a restarted daemon never races an
    // orphan doing the same work".
    let queue = TestQueue::new();
    let side = queue.aux("wrapped.side");
    let mut task = loop_task("wrapped", &side, 5, 0.05);
    task["phases"][0]["run"] = json!([
        "sh",
        "-c",
        "python3 \"$0\" \"$1\" --sleep 0.05 --slow 2:6",
        fixture("logging_loop.py"),
        side,
    ]);
    queue.seed_task("wrapped.json", &task);
    let mut daemon = queue.start(&[]);
    let in_flight = wait_for("iteration 2 has started", DEADLINE, || {
        side_events(&side)
            .into_iter()
            .find(|e| e.event == "start" && e.iteration == 2)
    });
    let _cleanup = KillGroupOnDrop(process_group_of(in_flight.pid).unwrap_or(in_flight.pid));
    daemon.kill_hard();

    queue.run_until_idle(&[]);
    assert_eq!(queue.done("wrapped").unwrap()["result"], loop_result(5));
    wait_until(
        &format!("the first daemon's command (pid {}) is gone", in_flight.pid),
        DEADLINE,
        || !process_alive(in_flight.pid),
    );
    let orphan_work: Vec<SideEvent> = side_events(&side)
        .into_iter()
        .filter(|e| e.attempt == 1 && e.event == "end" && e.iteration == 2)
        .collect();
    assert!(
        orphan_work.is_empty(),
        "iteration 2 of the killed daemon's attempt kept running beside the restarted \
         daemon and finished: {orphan_work:?}"
    );
}

#[test]
fn a_stop_whose_grace_runs_out_ends_the_command_group_and_exits_0() {
    let queue = TestQueue::new();
    let pid_file = queue.aux("stubborn.pid");
    let script = format!(
        "echo $$ > {}; sleep 3600; echo '{{\"ok\": true}}'",
        pid_file.display()
    );
    queue.seed_task(
        "stubborn.json",
        &json!({"id": "stubborn", "phases": [{"name": "wait", "run": ["sh", "-c", script]}]}),
    );
    let mut daemon = queue.start(&["--stop-grace", "1s"]);
    let group = wait_for("the command has started", DEADLINE, || {
        std::fs::read_to_string(&pid_file)
            .ok()?
            .trim()
            .parse::<i32>()
            .ok()
    });
    let _cleanup = KillGroupOnDrop(group);
    wait_until("the command's sleep has started", DEADLINE, || {
        group_members(group) >= 2
    });
    daemon.signal(SIGTERM);
    // The command would take an hour: the daemon exits within the deadline only if it ended it.
    let status = daemon.wait_exit(DEADLINE);
    assert_eq!(status.code(), Some(0), "{status}");
    assert!(
        !group_alive(group),
        "the command's process group {group} outlived the daemon"
    );
    let entry = queue
        .active_entry("stubborn")
        .expect("the task is in flight");
    assert_eq!(entry["status"], "interrupted", "{entry:#}");
    assert!(queue.done("stubborn").is_none());
    assert!(queue.failed("stubborn").is_none());
}

#[test]
fn sigkill_in_a_later_phase_resumes_that_phase_and_keeps_the_earlier_outputs() {
    let queue = TestQueue::new();
    let first_side = queue.aux("first.side");
    let second_side = queue.aux("second.side");
    let logging_loop = |name: &str, side: &Path, iterations: u64, sleep: &str| {
        json!({
            "name": name,
            "kind": "loop",
            "run": ["python3", fixture("logging_loop.py"), side, "--sleep", sleep],
            "max_iterations": iterations,
        })
    };
    let report = "import json, sys; inputs = json.load(sys.stdin)['inputs']; \
                  print(json.dumps({'first': inputs['first']['sum'], 'second': inputs['second']['sum']}))";
    queue.seed_task(
        "pipeline.json",
        &json!({
            "id": "pipeline",
            "phases": [
                logging_loop("first", &first_side, 4, "0.02"),
                logging_loop("second", &second_side, 8, "0.15"),
                {"name": "report", "run": ["python3", "-c", report]},
            ],
        }),
    );
    let mut daemon = queue.start(&[]);
    wait_until(
        "the second loop has finished 2 iterations",
        DEADLINE,
        || ended_iterations(&second_side).len() >= 2,
    );
    daemon.kill_hard();
    let entry = queue
        .active_entry("pipeline")
        .expect("the task is in flight");
    assert_eq!(entry["phase_index"], 1, "{entry:#}");
    assert_eq!(entry["phase_outputs"]["first"]["inline"], loop_result(4));

    queue.run_until_idle(&[]);
    let done = queue.done("pipeline").expect("done/pipeline.json");
    assert_eq!(done["result"], json!({"first": 14, "second": 140}));
    assert_eq!(done["phase_outputs"]["first"], loop_result(4));
    assert_eq!(done["phase_outputs"]["second"], loop_result(8));
    assert_eq!(done["attempts"], 2);
    // The finished phase did not run again; the interrupted one lost at most one iteration.
    assert!(start_counts(&first_side).values().all(|&n| n == 1));
    let second = start_counts(&second_side);
    assert_eq!(second.len(), 8);
    assert!(second.values().sum::<usize>() <= 9, "{second:?}");
}

#[test]
fn a_damaged_latest_checkpoint_falls_back_to_the_previous_generation() {
    let queue = TestQueue::new();
    let side = queue.aux("damaged.side");
    queue.seed_task("damaged.json", &loop_task("damaged", &side, 8, 0.05));
    let mut daemon = queue.start(&[]);
    wait_until("the loop has finished 4 iterations", DEADLINE, || {
        ended_iterations(&side).len() >= 4
    });
    daemon.signal(SIGTERM);
    assert_eq!(daemon.wait_exit(DEADLINE).code(), Some(0));
    let completed = queue.checkpoint("damaged").iteration_count;
    assert_eq!(completed, ended_iterations(&side).len() as u64);

    // Cut the latest file in half, as a broken disk or a careless copy would.
    let latest = queue.path("incremental/damaged.json.gz");
    let bytes = std::fs::read(&latest).unwrap();
    std::fs::write(&latest, &bytes[..bytes.len() / 2]).unwrap();

    let mut restart = queue.start(&["--exit-when-idle"]);
    assert_eq!(restart.wait_exit(DEADLINE).code(), Some(0));
    assert!(
        restart.stderr().contains("damaged.json.gz"),
        "the damaged checkpoint is not reported: {}",
        restart.stderr()
    );
    assert_eq!(queue.done("damaged").unwrap()["result"], loop_result(8));
    // Resumed from the generation before: exactly the last completed iteration ran again.
    let restarted_at = side_events(&side)
        .into_iter()
        .find(|e| e.attempt == 2)
        .expect("the restart ran iterations");
    assert_eq!(restarted_at.iteration, completed - 1);
    let counts = start_counts(&side);
    assert_eq!(counts[&(completed - 1)], 2, "{counts:?}");
    assert_eq!(counts.values().sum::<usize>(), 9, "{counts:?}");
}

#[test]
fn sigkill_during_intake_loses_and_duplicates_nothing() {
    let queue = TestQueue::new();
    let mut id = 0;
    for _round in 0..3 {
        let mut daemon = queue.start(&[]);
        wait_until("the daemon watches the inbox", DEADLINE, || {
            daemon.stderr().contains("recovered the queue")
        });
        for _ in 0..15 {
            let name = format!("t{id:02}");
            queue.drop_task(&format!("{name}.json"), &once_task(&name, &json!(id)));
            id += 1;
        }
        // A random moment while the files are being claimed, accepted and run.
        std::thread::sleep(Duration::from_millis(fastrand::u64(..200)));
        daemon.kill_hard();
    }
    queue.run_until_idle(&[]);

    for n in 0..id {
        let record = queue.wait_done(&format!("t{n:02}"));
        assert_eq!(record["result"], json!(n));
    }
    assert_eq!(queue.list("done").len(), id, "{:?}", queue.list("done"));
    assert!(queue.rejections().is_empty(), "{:#?}", queue.rejections());
    assert!(
        queue.list("failed").is_empty(),
        "{:?}",
        queue.list("failed")
    );
    assert!(queue.list("inbox").is_empty(), "{:?}", queue.list("inbox"));
    let tasks = queue.list("tasks");
    assert_eq!(tasks.len(), id, "leftovers in tasks/: {tasks:?}");
    assert!(tasks.iter().all(|n| !n.starts_with('.')), "{tasks:?}");
}

#[test]
fn a_restart_removes_the_temp_files_a_crash_left_but_not_the_users() {
    let queue = TestQueue::new();
    for dir in ["incremental", "done", "tasks"] {
        std::fs::create_dir_all(queue.path(dir)).unwrap();
    }
    let stale = [
        "incremental/.t1.json.gz.x1y2z3.cairn.tmp",
        "done/.t1.json.a1b2c3.cairn.tmp",
        ".current_work.json.q9w8e7.cairn.tmp",
    ];
    for path in &stale {
        std::fs::write(queue.path(path), b"half a write").unwrap();
    }
    // A user's file being written into the inbox is theirs, not a cairn temp file.
    let users = "inbox/.report.json.cairn.tmp";
    std::fs::write(queue.path(users), b"{\"phases\": [").unwrap();
    queue.run_until_idle(&[]);
    for path in &stale {
        assert!(!queue.path(path).exists(), "{path} was left behind");
    }
    assert!(
        queue.path(users).exists(),
        "the user's inbox file was removed"
    );
}

#[test]
fn a_damaged_current_work_file_stops_the_start_with_a_clear_error() {
    let queue = TestQueue::new();
    std::fs::write(
        queue.path("current_work.json"),
        b"{\"version\": 1, \"active_ta",
    )
    .unwrap();
    let output = queue.cairn_output(&["run", "--exit-when-idle"], b"");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("current_work.json"), "{stderr}");
    assert!(stderr.contains("aside"), "no way out offered: {stderr}");
    // Nothing was overwritten: the operator decides.
    assert_eq!(
        std::fs::read(queue.path("current_work.json")).unwrap(),
        b"{\"version\": 1, \"active_ta"
    );
}
