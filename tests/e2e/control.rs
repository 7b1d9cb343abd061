//! Steering a task through `control/` with the real binary: pause stops a running loop within
//! one iteration, resume continues it, cancel ends it as cancelled with its command gone, retry
//! brings it back from its checkpoint; requests made while no daemon runs take effect at its
//! start; and fork starts a new task from an earlier checkpoint with a patched state.

use std::time::Duration;

use crate::common::*;
use serde_json::json;

fn status_of(queue: &TestQueue, id: &str) -> Option<String> {
    queue
        .active_entry(id)
        .and_then(|e| e["status"].as_str().map(str::to_string))
}

#[test]
fn pause_resume_cancel_and_retry_a_running_loop() {
    let queue = TestQueue::new();
    let side = queue.aux("loop.side");
    queue.seed_task("steer.json", &loop_task("steer", &side, 40, 0.2));
    let mut daemon = queue.start(&[]);
    wait_until("three iterations", DEADLINE, || {
        ended_iterations(&side).len() >= 3
    });

    // Pause: the iteration in flight finishes and is checkpointed, then nothing runs.
    let out = queue.cairn_output(&["pause", "steer"], b"");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for("the task to be paused", DEADLINE, || {
        (status_of(&queue, "steer").as_deref() == Some("paused")).then_some(())
    });
    let at_pause = ended_iterations(&side).len();
    let starts_at_pause = side_events(&side)
        .iter()
        .filter(|e| e.event == "start")
        .count();
    assert_eq!(
        starts_at_pause, at_pause,
        "an iteration was left half-run by the pause"
    );
    assert_eq!(queue.checkpoint("steer").iteration_count, at_pause as u64);
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(
        ended_iterations(&side).len(),
        at_pause,
        "iterations ran while the task was paused"
    );

    // Resume: it continues from the checkpoint.
    let out = queue.cairn_output(&["resume", "steer"], b"");
    assert!(out.status.success());
    wait_until("two more iterations", DEADLINE, || {
        ended_iterations(&side).len() >= at_pause + 2
    });
    // A request that does not apply is refused, and the command that made it says why.
    let out = queue.cairn_output(&["resume", "steer"], b"");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("refused the request for steer: it is not paused"),
        "{stderr}"
    );
    assert!(
        start_counts(&side).values().all(|&n| n == 1),
        "an iteration ran twice around the pause: {:?}",
        start_counts(&side)
    );

    // Cancel: the command in flight is stopped and the task recorded as cancelled.
    let running_pid = wait_for("an iteration in flight", DEADLINE, || {
        let events = side_events(&side);
        let last = events.last()?;
        (last.event == "start").then_some(last.pid)
    });
    let out = queue.cairn_output(&["cancel", "steer"], b"");
    assert!(out.status.success());
    let record = queue.wait_failed("steer");
    assert_eq!(record["status"], "cancelled");
    wait_until("the cancelled command to be gone", DEADLINE, || {
        !process_alive(running_pid)
    });
    // The record is written first; current_work.json follows.
    wait_until("the task to leave current_work", DEADLINE, || {
        queue.active_entry("steer").is_none()
    });
    let done_at_cancel = ended_iterations(&side).len() as u64;

    // Retry: back from its last checkpoint, to the end.
    let out = queue.cairn_output(&["retry", "steer"], b"");
    assert!(out.status.success());
    let done = queue.wait_done("steer");
    assert_eq!(done["result"], loop_result(40));
    assert!(
        queue.failed("steer").is_none(),
        "the old record stayed in failed/"
    );
    let counts = start_counts(&side);
    let reruns: usize = counts.values().map(|n| n - 1).sum();
    assert!(
        reruns <= 1,
        "more than the cancelled iteration ran again: {counts:?}"
    );
    assert!(done_at_cancel > at_pause as u64);

    daemon.signal(SIGTERM);
    assert_eq!(daemon.wait_exit(DEADLINE).code(), Some(0));
    let events = std::fs::read_to_string(queue.path("runs/steer/events.jsonl")).unwrap();
    for event in ["paused", "resumed", "cancelled", "retried", "done"] {
        assert!(
            events.contains(&format!("\"event\":\"{event}\"")),
            "no {event} event in the journal:\n{events}"
        );
    }
}

#[test]
fn requests_made_without_a_daemon_apply_when_it_starts() {
    let queue = TestQueue::new();
    let side_a = queue.aux("a.side");
    let side_b = queue.aux("b.side");
    queue.seed_task("a.json", &loop_task("a", &side_a, 3, 0.05));
    queue.seed_task("b.json", &loop_task("b", &side_b, 3, 0.05));
    // Accept both, run neither: a daemon that stops as soon as it has started.
    let mut first = queue.start(&["--max-tasks", "1"]);
    wait_until("both tasks accepted", DEADLINE, || {
        queue.path("tasks/a.json").exists() && queue.path("tasks/b.json").exists()
    });
    first.signal(SIGTERM);
    assert_eq!(first.wait_exit(DEADLINE).code(), Some(0));

    let out = queue.cairn_output(&["pause", "b"], b"");
    assert!(out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("no daemon is running"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    queue.run_until_idle(&[]);
    assert_eq!(queue.done("a").unwrap()["result"], loop_result(3));
    assert_eq!(status_of(&queue, "b").as_deref(), Some("paused"));
    assert!(queue.done("b").is_none());

    let out = queue.cairn_output(&["resume", "b"], b"");
    assert!(out.status.success());
    queue.run_until_idle(&[]);
    assert_eq!(queue.done("b").unwrap()["result"], loop_result(3));

    let out = queue.cairn_output(&["pause", "no-such-task"], b"");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no-such-task"));
}

#[test]
fn fork_an_earlier_generation_with_a_patched_state() {
    let queue = TestQueue::new();
    // state {total, step}: each iteration adds `step`; the first phase's output is an input.
    let step = "import json, sys\n\
                r = json.load(sys.stdin)\n\
                s = r['state']\n\
                s['total'] += s['step'] * r['inputs']['setup']['scale']\n\
                print(json.dumps({'state': s}))";
    let task = json!({
        "id": "acc",
        "phases": [
            {"name": "setup", "run": ["sh", "-c", "echo '{\"scale\": 2}'"]},
            {"name": "sum", "kind": "loop", "run": ["python3", "-c", step],
             "initial_state": {"total": 0, "step": 1}, "max_iterations": 6}
        ]
    });
    queue.seed_task("acc.json", &task);
    queue.run_until_idle(&[]);
    assert_eq!(
        queue.done("acc").unwrap()["result"],
        json!({"total": 12, "step": 1})
    );
    // Generation 3 holds 3 completed iterations (total 6); continue with step 10.
    let generation = queue.cairn_output(&["checkpoint", "acc", "--gen", "3"], b"");
    let out = queue.cairn_output(
        &[
            "fork",
            "acc",
            "--gen",
            "3",
            "--patch",
            r#"{"step": 10}"#,
            "--as",
            "acc-fork",
        ],
        b"",
    );
    assert!(
        out.status.success(),
        "fork failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "acc-fork");
    queue.run_until_idle(&[]);
    let forked = queue.done("acc-fork").unwrap();
    assert_eq!(
        forked["result"],
        json!({"total": 6 + 3 * 10 * 2, "step": 10}),
        "generation 3 was {}",
        String::from_utf8_lossy(&generation.stdout)
    );
    assert_eq!(forked["phase_outputs"]["setup"], json!({"scale": 2}));
    assert_eq!(
        forked["forked_from"],
        json!({"task_id": "acc", "generation": 3, "phase": "sum"})
    );
    // The original is untouched.
    assert_eq!(
        queue.done("acc").unwrap()["result"],
        json!({"total": 12, "step": 1})
    );
    let out = queue.cairn_output(&["fork", "acc", "--as", "acc-fork"], b"");
    assert_eq!(out.status.code(), Some(2), "a duplicate id must be refused");
}

/// A task that leaves `side` behind when its command runs.
fn marking_task(id: &str, side: &std::path::Path) -> serde_json::Value {
    json!({
        "id": id,
        "phases": [{"name": "mark", "run": ["sh", "-c", format!("touch '{}'; echo 1", side.display())]}],
    })
}

#[test]
fn a_task_still_in_the_inbox_is_listed_shown_and_steered_by_its_id() {
    let queue = TestQueue::new();
    let (side_a, side_b) = (queue.aux("a.ran"), queue.aux("b.ran"));
    for (id, side) in [("a", &side_a), ("b", &side_b)] {
        let task = serde_json::to_vec(&marking_task(id, side)).unwrap();
        let out = queue.cairn_output(&["submit", "-"], &task);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
    }
    assert_eq!(queue.list("inbox"), ["a.json", "b.json"]);

    // No daemon has taken them: status lists them, show finds them.
    let out = queue.cairn_output(&["status", "--json"], b"");
    let document: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let states: Vec<(String, String)> = document["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["id"].as_str().unwrap().into(),
                t["state"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        states,
        [
            ("a".into(), "submitted".into()),
            ("b".into(), "submitted".into())
        ]
    );
    let out = queue.cairn_output(&["show", "a"], b"");
    let show = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(show.contains("submitted"), "{show}");
    assert!(show.contains("definition  inbox/a.json"), "{show}");

    // Steered before any daemon accepted them.
    for (verb, id) in [("cancel", "a"), ("pause", "b")] {
        let out = queue.cairn_output(&[verb, id], b"");
        assert_eq!(out.status.code(), Some(0), "{verb} {id}: {out:?}");
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(said.contains("still in inbox/"), "{verb} {id}: {said}");
    }

    // The daemon takes them, applies the requests before either starts, and goes idle.
    queue.run_until_idle(&[]);
    let cancelled = queue.failed("a").expect("failed/a.json");
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    assert!(!side_a.exists(), "the cancelled task ran");
    assert_eq!(status_of(&queue, "b").as_deref(), Some("paused"));
    assert!(!side_b.exists(), "the paused task ran");
    assert!(
        queue.list("control").is_empty(),
        "{:?}",
        queue.list("control")
    );

    let out = queue.cairn_output(&["resume", "b"], b"");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    queue.run_until_idle(&[]);
    assert_eq!(queue.done("b").expect("done/b.json")["result"], json!(1));
    assert!(side_b.exists());
}

/// CPU time (user + system) the process has used so far.
fn cpu_time(pid: i32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("reading /proc stat");
    // Fields after the command name: state is field 3; utime and stime are fields 14 and 15.
    let (_, rest) = stat.rsplit_once(") ").expect("a /proc stat line");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    let per_second = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .unwrap()
        .expect("clock ticks per second") as u64;
    Duration::from_millis(ticks * 1000 / per_second)
}

/// Entries in `control/` that no one, root included, can read as a request: a directory, a
/// symbolic link to nothing and a link to a FIFO. Named to sort before any real request.
fn plant_unreadable_requests(queue: &TestQueue) {
    let control = queue.path("control");
    // Made beside the queue and renamed in whole: the daemon may take it at once.
    let dir = queue.aux("request-dir");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("inside"), b"{}").unwrap();
    std::fs::rename(&dir, control.join("0000-dir.json")).unwrap();
    std::os::unix::fs::symlink("/nonexistent/request", control.join("0001-dangling.json")).unwrap();
    let fifo = queue.aux("elsewhere.fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    std::os::unix::fs::symlink(&fifo, control.join("0002-fifo-link.json")).unwrap();
}

#[test]
fn unreadable_requests_neither_hold_up_a_cancel_nor_make_the_daemon_spin() {
    let queue = TestQueue::new();
    let side = queue.aux("victim.side");
    queue.seed_task("victim.json", &loop_task("victim", &side, 2000, 0.2));
    let daemon = queue.start(&[]);
    wait_until("an iteration", DEADLINE, || {
        !ended_iterations(&side).is_empty()
    });
    plant_unreadable_requests(&queue);

    // Let the daemon meet them, then measure its CPU over a window of several seconds.
    wait_until("the bad entries to be dealt with", DEADLINE, || {
        queue.list("control").is_empty()
    });
    let window = Duration::from_secs(5);
    let (before, started) = (cpu_time(daemon.pid()), std::time::Instant::now());
    std::thread::sleep(window);
    let (used, elapsed) = (cpu_time(daemon.pid()) - before, started.elapsed());
    eprintln!("daemon CPU beside bad control requests: {used:?} in {elapsed:?}");
    assert!(
        used < elapsed / 5,
        "the daemon used {used:?} of CPU in {elapsed:?} beside bad control requests"
    );

    let asked = std::time::Instant::now();
    let out = queue.cairn_output(&["cancel", "--no-wait", "victim"], b"");
    assert!(out.status.success(), "{out:?}");
    let record = queue.wait_failed("victim");
    let took = asked.elapsed();
    assert_eq!(record["status"], "cancelled", "{record}");
    assert!(took < Duration::from_secs(15), "the cancel took {took:?}");

    let log = daemon.stderr();
    let lines = log
        .lines()
        .filter(|l| l.contains("control request"))
        .count();
    assert!(
        lines < 20,
        "{lines} log lines about control requests:\n{log}"
    );
    for name in ["0000-dir.json", "0001-dangling.json", "0002-fifo-link.json"] {
        assert!(log.contains(name), "no log line names {name}:\n{log}");
    }
}

#[test]
fn a_fifo_swapped_into_control_does_not_stop_sigterm_from_stopping_the_daemon() {
    let queue = TestQueue::new();
    let mut daemon = queue.start(&[]);
    wait_until("the daemon to create control/", DEADLINE, || {
        queue.path("control").is_dir() && queue.path(".lock").exists()
    });
    // A request name that is a regular file one moment and a FIFO the next, for a few
    // seconds: a daemon that lists, then opens by name, meets the FIFO sooner or later.
    let name = queue.path("control/0000-swapped.json");
    let (regular, fifo) = (queue.path("control/.regular"), queue.path("control/.fifo"));
    let mode = nix::sys::stat::Mode::from_bits_truncate(0o622);
    let until = std::time::Instant::now() + Duration::from_secs(4);
    while std::time::Instant::now() < until {
        std::fs::write(&regular, b"{}").unwrap();
        std::fs::rename(&regular, &name).unwrap();
        std::thread::sleep(Duration::from_millis(2));
        nix::unistd::mkfifo(&fifo, mode).unwrap();
        std::fs::rename(&fifo, &name).unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    std::fs::write(&regular, b"{}").unwrap();
    std::fs::rename(&regular, &name).unwrap();
    daemon.signal(SIGTERM);
    assert_eq!(
        daemon.wait_exit(DEADLINE).code(),
        Some(0),
        "{}",
        daemon.stderr()
    );
}
