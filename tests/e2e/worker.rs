//! `worker` phases with the real daemon, real workers and real signals: a Python worker that
//! speaks the protocol by hand and a shell worker using `printf >> "$CAIRN_CHANNEL"` are
//! SIGTERMed mid-run through the daemon, checkpoint their last iteration, exit 75, and resume
//! from `CAIRN_RESUME` to the output of an uninterrupted run. `checkpoint_every` > 1 never loses
//! a completed iteration on a clean stop (a loop and a worker). Garbage on the channel is
//! ignored, a failing worker uses up its attempts, and a silent one is killed by its
//! `heartbeat_timeout`.

use std::collections::BTreeMap;
use std::path::Path;

use crate::common::*;
use serde_json::{json, Value};

const ITERATIONS: u64 = 20;

/// The worker fixtures' state after `n` iterations.
fn state_after(n: u64) -> Value {
    let last = n.checked_sub(1).map_or(Value::Null, |l| json!(l));
    json!({"sum": (0..n).map(|i| i * i).sum::<u64>(), "last": last})
}

/// A one-phase worker task.
fn worker_task(id: &str, run: Vec<Value>) -> Value {
    json!({"id": id, "phases": [{"name": "work", "kind": "worker", "run": run}]})
}

fn python_worker(id: &str, side: &Path, args: &[&str]) -> Value {
    let mut run = vec![
        json!("python3"),
        json!(fixture("worker_by_hand.py")),
        json!(side),
    ];
    run.extend(args.iter().map(|a| json!(a)));
    worker_task(id, run)
}

fn shell_worker(id: &str, side: &Path) -> Value {
    worker_task(
        id,
        vec![
            json!("sh"),
            json!(fixture("worker_shell.sh")),
            json!(side),
            json!(ITERATIONS.to_string()),
            json!("0.1"),
        ],
    )
}

/// The scenario of both workers: SIGTERM the daemon mid-run, check what the worker did and what
/// the daemon kept, restart, and compare with an uninterrupted run.
fn sigterm_mid_run_then_resume(id: &str, make_task: impl Fn(&Path) -> Value, expected: Value) {
    let mut reference = start_reference(&make_task);
    let queue = TestQueue::new();
    let side = queue.aux("worker.side");
    queue.seed_task(&format!("{id}.json"), &make_task(&side));

    let mut daemon = queue.start(&[]);
    wait_until("the worker has finished 3 iterations", DEADLINE, || {
        logged_iterations(&side_lines(&side), "end").len() >= 3
    });
    daemon.signal(SIGTERM);
    let status = daemon.wait_exit(DEADLINE);
    assert_eq!(status.code(), Some(0), "SIGTERM: {status}");

    // The worker was told at once, not at the end of the 30 s stop grace (it would have run to
    // its end by then): it got SIGTERM, finished its iteration, checkpointed it and exited 75.
    let first_run = side_lines(&side);
    assert_eq!(first_run[0].event, "fresh", "{first_run:?}");
    let pid = first_run[0].rest.clone();
    let sigterms: Vec<&SideLine> = first_run.iter().filter(|l| l.event == "sigterm").collect();
    assert_eq!(sigterms.len(), 1, "{first_run:?}");
    assert_eq!(sigterms[0].rest, pid);
    assert_eq!(
        first_run.last().unwrap(),
        &SideLine {
            event: "exit".into(),
            rest: format!("75 {pid}")
        },
        "{first_run:?}"
    );
    let ended = logged_iterations(&first_run, "end");
    let completed = ended.len() as u64;
    assert_eq!(ended, (0..completed).collect::<Vec<_>>());
    assert_eq!(
        logged_iterations(&first_run, "start"),
        ended,
        "an iteration was cut"
    );
    assert!(
        completed < ITERATIONS,
        "the worker finished before the stop"
    );

    // The iteration checkpoint holds that last iteration.
    let checkpoint = queue.checkpoint(id);
    assert_eq!(checkpoint.task_id, id);
    assert_eq!(checkpoint.phase, "work");
    assert_eq!(checkpoint.scope, "worker");
    assert_eq!(checkpoint.iteration_count, completed);
    assert_eq!(checkpoint.partial_results, state_after(completed));
    assert_eq!(checkpoint.attempt, 1);
    assert!(!checkpoint.done);
    let entry = queue.active_entry(id).expect("the task is in flight");
    assert_eq!(entry["status"], "interrupted", "{entry:#}");
    assert!(queue.done(id).is_none());
    assert!(
        queue
            .list(&format!("runs/{id}"))
            .iter()
            .all(|n| !n.starts_with("channel")),
        "the channel FIFO was left behind"
    );

    // The restarted worker gets CAIRN_RESUME with that iteration and state.
    queue.run_until_idle(&[]);
    let all = side_lines(&side);
    let second_run = &all[first_run.len()..];
    assert_eq!(second_run[0].event, "resume", "{second_run:?}");
    let (pid2, resume_line) = second_run[0].rest.split_once(' ').unwrap();
    assert_eq!(
        resume_line,
        format!(
            "{{\"iteration\":{completed},\"state\":{}}}",
            serde_json::to_string(&state_after(completed)).unwrap()
        )
    );
    assert_eq!(
        logged_iterations(second_run, "start"),
        (completed..ITERATIONS).collect::<Vec<_>>()
    );
    assert_eq!(
        second_run.last().unwrap().rest,
        format!("0 {pid2}"),
        "{second_run:?}"
    );

    let done = queue.done(id).expect("done record after the restart");
    assert_eq!(done["status"], "done");
    assert_eq!(done["attempts"], 2);
    assert_eq!(done["failed_attempts"], 0);
    assert_eq!(done["phases"][0]["iterations"], ITERATIONS);
    let uninterrupted = reference_result(&mut reference, id);
    assert_eq!(uninterrupted, expected, "the reference run");
    assert_eq!(done["result"], expected);
    // No iteration ran twice.
    assert_eq!(
        logged_iterations(&all, "end"),
        (0..ITERATIONS).collect::<Vec<_>>()
    );
    assert!(queue.active_entry(id).is_none());
}

#[test]
fn a_python_worker_by_hand_is_sigtermed_checkpoints_exits_75_and_resumes() {
    sigterm_mid_run_then_resume(
        "py",
        |side| python_worker("py", side, &["--output", "--sleep", "0.1"]),
        json!({"sum": 2470, "iterations": ITERATIONS}),
    );
}

#[test]
fn a_shell_worker_with_printf_is_sigtermed_checkpoints_exits_75_and_resumes() {
    // No output message: the phase output is the last checkpoint's state.
    sigterm_mid_run_then_resume(
        "sh",
        |side| shell_worker("sh", side),
        state_after(ITERATIONS),
    );
}

#[test]
fn a_loop_with_checkpoint_every_3_stopped_after_iteration_7_keeps_8_iterations() {
    let queue = TestQueue::new();
    let side = queue.aux("every3.side");
    let mut task = loop_task("every3", &side, 10, 0.05);
    task["phases"][0]["checkpoint_every"] = json!(3);
    // Iteration 7 is slow in the first attempt, so the stop lands while it runs even if the
    // test is slow to notice its start (a busy machine); it ends well within the 30 s grace.
    add_args(&mut task, &["--slow", "7:5"]);
    queue.seed_task("every3.json", &task);

    let mut daemon = queue.start(&[]);
    wait_until("iteration 7 has started", DEADLINE, || {
        side_events(&side)
            .iter()
            .any(|e| e.event == "start" && e.iteration == 7)
    });
    // The scheduled checkpoints are at 3 and 6 completed iterations.
    let scheduled = queue.checkpoint("every3");
    assert_eq!(scheduled.iteration_count, 6);
    assert_eq!(scheduled.checkpoint_interval, 3);
    daemon.signal(SIGTERM);
    let status = daemon.wait_exit(DEADLINE);
    assert_eq!(status.code(), Some(0), "SIGTERM: {status}");

    // Iteration 7 finished during the grace and was flushed: 8 completed, not 6.
    assert_eq!(ended_iterations(&side), (0..8).collect::<Vec<_>>());
    let checkpoint = queue.checkpoint("every3");
    assert_eq!(checkpoint.iteration_count, 8);
    assert_eq!(checkpoint.partial_results, loop_result(8));
    assert!(!checkpoint.done);
    assert_eq!(queue.active_entry("every3").unwrap()["iterations"], 8);

    queue.run_until_idle(&[]);
    let done = queue.done("every3").expect("done/every3.json");
    assert_eq!(done["result"], loop_result(10));
    let once_each: BTreeMap<u64, usize> = (0..10).map(|i| (i, 1)).collect();
    assert_eq!(start_counts(&side), once_each, "an iteration ran twice");
}

#[test]
fn a_worker_with_checkpoint_every_3_keeps_its_last_iteration_on_a_stop() {
    let queue = TestQueue::new();
    let side = queue.aux("w3.side");
    let mut task = python_worker("w3", &side, &["--sleep", "0.1"]);
    task["phases"][0]["checkpoint_every"] = json!(3);
    queue.seed_task("w3.json", &task);

    let mut daemon = queue.start(&[]);
    let mut seen = Vec::new();
    wait_until("the worker has finished 4 iterations", DEADLINE, || {
        let path = queue.path("incremental/w3.json.gz");
        if path.exists() {
            seen.push(queue.checkpoint("w3").iteration_count);
        }
        logged_iterations(&side_lines(&side), "end").len() >= 4
    });
    assert!(
        seen.iter().all(|n| n.is_multiple_of(3)),
        "a checkpoint written between the scheduled ones: {seen:?}"
    );
    daemon.signal(SIGTERM);
    assert_eq!(daemon.wait_exit(DEADLINE).code(), Some(0));
    let ended = logged_iterations(&side_lines(&side), "end");
    let completed = ended.len() as u64;
    let checkpoint = queue.checkpoint("w3");
    assert_eq!(checkpoint.iteration_count, completed, "ended: {ended:?}");
    assert_eq!(checkpoint.partial_results, state_after(completed));

    queue.run_until_idle(&[]);
    assert_eq!(
        queue.done("w3").expect("done/w3.json")["result"],
        state_after(ITERATIONS)
    );
    assert_eq!(
        logged_iterations(&side_lines(&side), "end"),
        (0..ITERATIONS).collect::<Vec<_>>()
    );
}

#[test]
fn garbage_on_the_channel_is_ignored_and_the_worker_runs_to_completion() {
    let queue = TestQueue::new();
    let side = queue.aux("garbage.side");
    let args = [
        "--garbage",
        "--iterations",
        "5",
        "--sleep",
        "0.05",
        "--output",
    ];
    queue.seed_task("garbage.json", &python_worker("garbage", &side, &args));
    queue.run_until_idle(&[]);

    let done = queue.done("garbage").expect("done/garbage.json");
    assert_eq!(done["result"], json!({"sum": 30, "iterations": 5}));
    assert_eq!(done["attempts"], 1);
    assert_eq!(done["phases"][0]["iterations"], 5);
    let log = std::fs::read_to_string(queue.path("runs/garbage/0-work.log")).unwrap();
    assert!(
        log.contains("cairn: ignored a channel line") && log.contains("this is not JSON"),
        "the log does not note the ignored lines:\n{log}"
    );
    assert_eq!(
        logged_iterations(&side_lines(&side), "end"),
        (0..5).collect::<Vec<_>>()
    );
}

#[test]
fn a_worker_that_exits_3_fails_its_attempts_and_ends_in_failed() {
    let queue = TestQueue::new();
    let side = queue.aux("exit3.side");
    let mut task = python_worker(
        "exit3",
        &side,
        &["--fail-after", "2", "--iterations", "10", "--sleep", "0.05"],
    );
    task["retry"] = json!({"max_attempts": 2, "backoff": "100ms"});
    queue.seed_task("exit3.json", &task);
    queue.run_until_idle(&[]);

    let failed = queue.failed("exit3").expect("failed/exit3.json");
    assert_eq!(failed["status"], "failed", "{failed:#}");
    assert_eq!(failed["attempts"], 2);
    assert_eq!(failed["failed_attempts"], 2);
    assert_eq!(failed["phase"], "work");
    let error = failed["error"].as_str().unwrap();
    assert!(
        error.contains("exit status: 3"),
        "the error does not name the exit status: {error:?}"
    );
    assert!(queue.done("exit3").is_none());

    // The retry resumed from the failed attempt's last checkpoint.
    let all = side_lines(&side);
    let starts: Vec<&SideLine> = all
        .iter()
        .filter(|l| l.event == "fresh" || l.event == "resume")
        .collect();
    assert_eq!(starts.len(), 2, "{all:?}");
    assert_eq!(starts[0].event, "fresh");
    assert_eq!(starts[1].event, "resume");
    assert!(
        starts[1].rest.ends_with(&format!(
            " {{\"iteration\":2,\"state\":{}}}",
            serde_json::to_string(&state_after(2)).unwrap()
        )),
        "{:?}",
        starts[1]
    );
    assert_eq!(logged_iterations(&all, "end"), vec![0, 1, 2, 3]);
    assert_eq!(
        all.iter().filter(|l| l.event == "exit").count(),
        2,
        "{all:?}"
    );
    assert_eq!(queue.checkpoint("exit3").iteration_count, 4);
}

#[test]
fn a_silent_worker_is_killed_by_its_heartbeat_timeout() {
    let queue = TestQueue::new();
    let side = queue.aux("silent.side");
    let mut task = python_worker(
        "silent",
        &side,
        &["--silent", "3600", "--iterations", "3", "--sleep", "0.05"],
    );
    // Seconds, not one: the timeout also covers the worker's start, which a busy machine slows.
    task["phases"][0]["heartbeat_timeout"] = json!("8s");
    task["retry"] = json!({"max_attempts": 1});
    queue.seed_task("silent.json", &task);
    let mut daemon = queue.start(&["--exit-when-idle"]);

    let pid: i32 = wait_for("the worker goes silent", DEADLINE, || {
        side_lines(&side)
            .into_iter()
            .find(|l| l.event == "silent")
            .map(|l| l.rest.parse().unwrap())
    });
    let _cleanup = KillGroupOnDrop(pid);
    // The worker stays silent for an hour: it fails within the deadline only by the timeout.
    let failed = queue.wait_failed("silent");
    assert!(!process_alive(pid), "the silent worker is still running");
    assert_eq!(failed["status"], "failed", "{failed:#}");
    let error = failed["error"].as_str().unwrap();
    assert!(
        error.contains("heartbeat_timeout") && error.contains("8s"),
        "{error:?}"
    );
    assert_eq!(daemon.wait_exit(DEADLINE).code(), Some(0));
    let all = side_lines(&side);
    assert_eq!(logged_iterations(&all, "end"), vec![0]);
    assert!(all.iter().all(|l| l.event != "exit"), "{all:?}");
}

#[test]
fn heartbeats_keep_a_quiet_worker_alive() {
    let queue = TestQueue::new();
    let side = queue.aux("beats.side");
    let mut task = python_worker(
        "beats",
        &side,
        &[
            "--silent",
            "12",
            "--heartbeat",
            "--iterations",
            "3",
            "--sleep",
            "0.05",
        ],
    );
    // Silent for 12 s, longer than the timeout, with a heartbeat every 0.2 s; the timeout is
    // seconds, not one, because it also covers the worker's start on a busy machine.
    task["phases"][0]["heartbeat_timeout"] = json!("8s");
    task["retry"] = json!({"max_attempts": 1});
    queue.seed_task("beats.json", &task);
    queue.run_until_idle(&[]);
    let done = queue.done("beats").expect("done/beats.json");
    assert_eq!(done["result"], state_after(3));
    assert_eq!(logged_iterations(&side_lines(&side), "end"), vec![0, 1, 2]);
}

#[test]
fn a_sigkilled_daemon_takes_its_worker_along_and_the_restart_resumes_from_the_checkpoint() {
    let make_task = |side: &Path| python_worker("crash", side, &["--output", "--sleep", "0.1"]);
    let mut reference = start_reference(make_task);
    let queue = TestQueue::new();
    let side = queue.aux("crash.side");
    queue.seed_task("crash.json", &make_task(&side));
    let mut daemon = queue.start(&[]);
    wait_until("3 iterations are checkpointed", DEADLINE, || {
        queue.path("incremental/crash.json.gz").exists()
            && queue.checkpoint("crash").iteration_count >= 3
    });
    daemon.kill_hard();
    let first_run = side_lines(&side);
    let pid: i32 = first_run[0].rest.parse().unwrap();
    wait_until("the worker died with the daemon", DEADLINE, || {
        !process_alive(pid)
    });
    let _cleanup = KillGroupOnDrop(pid);
    let checkpoint = queue.checkpoint("crash");
    let saved = checkpoint.iteration_count;
    assert!(saved < ITERATIONS, "the worker finished before the kill");
    assert_eq!(checkpoint.partial_results, state_after(saved));
    // The worker does not wait for the daemon: on a busy disk the committed checkpoint may lag
    // a few iterations behind it, and those iterations run again after the restart.
    let ended_before = logged_iterations(&side_lines(&side), "end").len() as u64;
    assert!(
        saved <= ended_before,
        "checkpoint {saved} ahead of the {ended_before} iterations that ended"
    );
    queue.wait_lock_released();

    queue.run_until_idle(&[]);
    let all = side_lines(&side);
    let second_run: Vec<SideLine> = all
        .iter()
        .skip_while(|l| l.event != "resume")
        .cloned()
        .collect();
    assert!(
        !second_run.is_empty(),
        "the worker was not resumed: {all:?}"
    );
    assert!(
        second_run[0].rest.ends_with(&format!(
            " {{\"iteration\":{saved},\"state\":{}}}",
            serde_json::to_string(&state_after(saved)).unwrap()
        )),
        "{:?}",
        second_run[0]
    );
    assert_eq!(
        logged_iterations(&second_run, "start"),
        (saved..ITERATIONS).collect::<Vec<_>>()
    );
    let done = queue.done("crash").expect("done/crash.json");
    assert_eq!(done["attempts"], 2);
    let expected = json!({"sum": 2470, "iterations": ITERATIONS});
    assert_eq!(reference_result(&mut reference, "crash"), expected);
    assert_eq!(done["result"], expected);
}

#[test]
fn a_worker_that_ignores_sigterm_is_killed_after_the_stop_grace_and_resumes_later() {
    let queue = TestQueue::new();
    let side = queue.aux("stubborn.side");
    let args = ["--ignore-sigterm", "--sleep", "0.1", "--output"];
    queue.seed_task("stubborn.json", &python_worker("stubborn", &side, &args));
    let mut daemon = queue.start(&["--stop-grace", "1s"]);
    wait_until("the worker has finished 2 iterations", DEADLINE, || {
        logged_iterations(&side_lines(&side), "end").len() >= 2
    });
    daemon.signal(SIGTERM);
    let status = daemon.wait_exit(DEADLINE);
    assert_eq!(status.code(), Some(0), "SIGTERM: {status}");

    let first_run = side_lines(&side);
    let pid = first_run[0].rest.clone();
    assert!(
        first_run.contains(&SideLine {
            event: "sigterm".into(),
            rest: pid.clone()
        }),
        "{first_run:?}"
    );
    assert!(first_run.iter().all(|l| l.event != "exit"), "{first_run:?}");
    assert!(!process_alive(pid.parse().unwrap()));
    let ended = logged_iterations(&first_run, "end").len() as u64;
    let saved = queue.checkpoint("stubborn").iteration_count;
    assert!(
        saved == ended || saved + 1 == ended,
        "checkpoint {saved} after {ended} iterations ended"
    );
    let entry = queue
        .active_entry("stubborn")
        .expect("the task is in flight");
    assert_eq!(entry["status"], "interrupted", "{entry:#}");

    queue.run_until_idle(&[]);
    let done = queue.done("stubborn").expect("done/stubborn.json");
    assert_eq!(
        done["result"],
        json!({"sum": 2470, "iterations": ITERATIONS})
    );
    let resumed = side_lines(&side)
        .into_iter()
        .find(|l| l.event == "resume")
        .expect("the worker was resumed");
    assert!(
        resumed.rest.contains(&format!("{{\"iteration\":{saved},")),
        "{resumed:?}"
    );
}
