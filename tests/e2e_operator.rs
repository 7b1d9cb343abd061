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
