//! What an operator sees around a run, with the real binary: errors that name what is missing,
//! the daemon's start and closing lines, log levels of an operator's own actions, and how runs
//! and failed attempts are counted.

mod common;

use common::*;
use serde_json::json;

/// A directory that exists nowhere.
const MISSING_DIR: &str = "/nonexistent-cairn-test-dir/work";

fn missing_cwd_task(id: &str) -> serde_json::Value {
    json!({
        "id": id,
        "cwd": MISSING_DIR,
        "retry": {"max_attempts": 1},
        "phases": [{"name": "say", "run": ["python3", "-c", "print(1)"]}],
    })
}

#[test]
fn a_missing_cwd_is_named_in_the_error_and_warned_about_at_validate_and_submit() {
    let queue = TestQueue::new();
    let file = queue.aux("lost.json");
    std::fs::write(&file, missing_cwd_task("lost").to_string()).unwrap();

    for command in ["validate", "submit"] {
        let out = queue.cairn_output(&[command, file.to_str().unwrap()], b"");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{command} must accept the task: {stderr}"
        );
        assert!(
            stderr.contains("warning:") && stderr.contains(MISSING_DIR),
            "{command} must warn about the missing cwd: {stderr:?}"
        );
    }

    queue.run_until_idle(&[]);
    let record = queue.wait_failed("lost");
    let error = record["error"].as_str().expect("the record has an error");
    assert!(
        error.contains(MISSING_DIR) && error.contains("working directory"),
        "the error must name the missing directory: {error:?}"
    );
}

#[test]
fn an_existing_cwd_draws_no_warning() {
    let queue = TestQueue::new();
    let file = queue.aux("fine.json");
    let mut task = missing_cwd_task("fine");
    task["cwd"] = json!(queue.aux(""));
    std::fs::write(&file, task.to_string()).unwrap();
    let out = queue.cairn_output(&["validate", file.to_str().unwrap()], b"");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("warning"), "no warning expected: {stderr:?}");
}

/// The daemon's log lines that carry `level` (`ERROR`, `WARN`, `INFO`).
fn lines_at(stderr: &str, level: &str) -> Vec<String> {
    stderr
        .lines()
        .filter(|line| line.split_whitespace().nth(1) == Some(level))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_cancel_is_logged_as_information_and_runs_are_not_counted_as_failures() {
    let queue = TestQueue::new();
    let side = queue.aux("loop.side");
    queue.seed_task("steer.json", &loop_task("steer", &side, 200, 0.2));
    let mut daemon = queue.start(&[]);
    wait_until("two iterations", DEADLINE, || {
        ended_iterations(&side).len() >= 2
    });

    // Pause and resume: two runs, no failure.
    for action in ["pause", "resume"] {
        let out = queue.cairn_output(&[action, "steer"], b"");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        if action == "pause" {
            wait_until("the task is paused", DEADLINE, || {
                queue.active_entry("steer").map(|e| e["status"] == "paused") == Some(true)
            });
        }
    }
    wait_until("the second run", DEADLINE, || {
        queue.active_entry("steer").map(|e| e["attempt"] == 2 && e["status"] == "running")
            == Some(true)
    });
    let out = queue.cairn_output(&["cancel", "steer"], b"");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let record = queue.wait_failed("steer");
    assert_eq!(record["status"], "cancelled");
    assert_eq!(record["attempts"], 2, "{record:#}");
    assert_eq!(record["failed_attempts"], 0, "{record:#}");

    daemon.signal(SIGTERM);
    assert_eq!(daemon.wait_exit(DEADLINE).code(), Some(0));
    let stderr = daemon.stderr();
    assert!(
        lines_at(&stderr, "INFO")
            .iter()
            .any(|l| l.contains("task cancelled") && l.contains("steer")),
        "the cancel must be logged at INFO:\n{stderr}"
    );
    assert_eq!(
        lines_at(&stderr, "ERROR"),
        Vec::<String>::new(),
        "an operator's cancel is no error:\n{stderr}"
    );

    // show names runs and failed attempts apart.
    let out = queue.cairn_output(&["show", "steer"], b"");
    let show = String::from_utf8_lossy(&out.stdout);
    let runs = show
        .lines()
        .find(|l| l.starts_with("runs "))
        .unwrap_or_else(|| panic!("no runs line in\n{show}"));
    assert_eq!(
        runs.split_whitespace().collect::<Vec<_>>().join(" "),
        "runs 2 (0 failed attempts of 3 allowed)"
    );
}
