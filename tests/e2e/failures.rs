//! Failing commands: retries with backoff that resume from the checkpoint, a task that uses up
//! its attempts ending in `failed/` with its checkpoints kept, and replies that are not JSON
//! quoted in the error.

use std::fs;

use crate::common::*;
use serde_json::json;

#[test]
fn a_command_that_fails_twice_succeeds_on_the_third_attempt() {
    let queue = TestQueue::new();
    let counter = queue.aux("flaky.runs");
    queue.seed_task(
        "flaky.json",
        &json!({
            "id": "flaky",
            "retry": {"max_attempts": 3, "backoff": "100ms"},
            "phases": [{
                "name": "try",
                "run": ["python3", fixture("flaky_once.py"), counter, "2"],
            }],
        }),
    );
    queue.run_until_idle(&[]);

    let done = queue.done("flaky").expect("done/flaky.json");
    assert_eq!(done["status"], "done");
    assert_eq!(done["attempts"], 3);
    assert_eq!(done["failed_attempts"], 2);
    assert_eq!(done["result"], json!({"runs": 3, "attempt": 3}));
    assert_eq!(
        fs::read_to_string(&counter).unwrap(),
        "run 1\nrun 2\nrun 3\n"
    );
    assert!(queue.failed("flaky").is_none());
    assert!(queue.active_entry("flaky").is_none());
}

#[test]
fn a_loop_that_always_fails_ends_in_failed_with_its_checkpoint_kept() {
    let queue = TestQueue::new();
    let side = queue.aux("doomed.side");
    let mut task = loop_task("doomed", &side, 10, 0.02);
    add_args(&mut task, &["--fail-from", "2"]);
    task["retry"] = json!({"max_attempts": 3, "backoff": "100ms"});
    queue.seed_task("doomed.json", &task);
    queue.run_until_idle(&[]);

    let failed = queue.failed("doomed").expect("failed/doomed.json");
    assert_eq!(failed["status"], "failed");
    assert_eq!(failed["task_id"], "doomed");
    assert_eq!(failed["phase"], "count");
    assert_eq!(failed["phase_index"], 0);
    assert_eq!(failed["attempts"], 3);
    assert_eq!(failed["failed_attempts"], 3);
    let error = failed["error"].as_str().unwrap();
    assert!(
        error.contains("phase \"count\" iteration 2"),
        "the error does not say where: {error}"
    );
    assert!(error.contains("exit status: 3"), "{error}");
    // The error points at the log, and the log holds the command's stderr.
    let log = queue.path("runs/doomed/0-count.log");
    assert!(
        error.contains(&log.display().to_string()),
        "the error does not name the log: {error}"
    );
    let log_text = fs::read_to_string(&log).unwrap();
    assert_eq!(
        log_text
            .matches("failing on purpose at iteration 2")
            .count(),
        3,
        "{log_text}"
    );
    assert!(queue.done("doomed").is_none());
    assert!(queue.active_entry("doomed").is_none());

    // The checkpoint is kept: the two completed iterations.
    let checkpoint = queue.checkpoint("doomed");
    assert_eq!(checkpoint.iteration_count, 2);
    assert_eq!(checkpoint.partial_results, loop_result(2));
    assert!(!checkpoint.done);

    // Each attempt resumed from the checkpoint: iterations 0 and 1 ran once, 2 once per attempt.
    let starts: Vec<(u64, u32)> = side_events(&side)
        .into_iter()
        .filter(|e| e.event == "start")
        .map(|e| (e.iteration, e.attempt))
        .collect();
    assert_eq!(starts, vec![(0, 1), (1, 1), (2, 1), (2, 2), (2, 3)]);
}

#[test]
fn a_once_reply_that_is_not_json_is_quoted_in_the_error() {
    let queue = TestQueue::new();
    queue.seed_task(
        "chatty.json",
        &json!({
            "id": "chatty",
            "retry": {"max_attempts": 1},
            "phases": [{"name": "talk", "run": ["sh", "-c", "echo 'Loading model... done'; echo '{}'"]}],
        }),
    );
    queue.run_until_idle(&[]);
    let failed = queue.failed("chatty").expect("failed/chatty.json");
    assert_eq!(failed["status"], "failed");
    assert_eq!(failed["attempts"], 1);
    let error = failed["error"].as_str().unwrap();
    assert!(error.contains("phase \"talk\""), "{error}");
    assert!(error.contains("not valid"), "{error}");
    assert!(
        error.contains(r#"it printed: "Loading model... done\n{}\n""#),
        "the error does not quote the reply: {error}"
    );
    // Log lines on stdout are the usual cause: the error says where they belong.
    assert!(
        error.contains("print log lines to stderr, which goes to")
            && error.contains("runs/chatty/0-talk.log"),
        "no hint about stderr: {error}"
    );
}

#[test]
fn a_loop_reply_that_is_not_json_is_quoted_by_its_start() {
    let queue = TestQueue::new();
    let side = queue.aux("noisy.side");
    let noise = format!("Traceback (most recent call last): {}", "x".repeat(400));
    let mut task = loop_task("noisy", &side, 5, 0.0);
    add_args(&mut task, &["--print", &noise]);
    task["retry"] = json!({"max_attempts": 1});
    queue.seed_task("noisy.json", &task);
    queue.run_until_idle(&[]);

    let failed = queue.failed("noisy").expect("failed/noisy.json");
    let error = failed["error"].as_str().unwrap();
    assert!(error.contains("phase \"count\" iteration 0"), "{error}");
    // The first 200 characters, quoted, then "...": never the whole output.
    let start: String = noise.chars().take(200).collect();
    assert!(
        error.contains(&format!("it printed: \"{start}\"...")),
        "the error does not quote the start of the reply: {error}"
    );
    assert!(!error.contains(&noise[..201]), "{error}");
    assert_eq!(failed["failed_attempts"], 1);
}

#[test]
fn a_retry_waiting_for_its_backoff_survives_a_stop() {
    let queue = TestQueue::new();
    let counter = queue.aux("patient.runs");
    queue.seed_task(
        "patient.json",
        &json!({
            "id": "patient",
            "retry": {"max_attempts": 3, "backoff": "2s"},
            "phases": [{
                "name": "try",
                "run": ["python3", fixture("flaky_once.py"), counter, "1"],
            }],
        }),
    );
    let mut daemon = queue.start(&[]);
    let entry = wait_for("the task waits for its retry", DEADLINE, || {
        queue
            .active_entry("patient")
            .filter(|e| e["status"] == "waiting_retry")
    });
    assert_eq!(entry["failed_attempts"], 1);
    assert!(entry["next_attempt_at"].is_string(), "{entry:#}");
    assert!(
        entry["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("command failed")),
        "{entry:#}"
    );
    daemon.signal(SIGTERM);
    assert_eq!(daemon.wait_exit(DEADLINE).code(), Some(0));
    let kept = queue
        .active_entry("patient")
        .expect("the retry is remembered");
    assert_eq!(kept["status"], "waiting_retry", "{kept:#}");
    assert_eq!(kept["next_attempt_at"], entry["next_attempt_at"]);

    queue.run_until_idle(&[]);
    let done = queue.done("patient").expect("done/patient.json");
    assert_eq!(done["attempts"], 2);
    assert_eq!(done["failed_attempts"], 1);
    assert_eq!(done["result"], json!({"runs": 2, "attempt": 2}));
    // The backoff was kept across the restart, not skipped.
    let next_at =
        chrono::DateTime::parse_from_rfc3339(entry["next_attempt_at"].as_str().unwrap()).unwrap();
    let finished =
        chrono::DateTime::parse_from_rfc3339(done["finished_at"].as_str().unwrap()).unwrap();
    assert!(
        finished >= next_at,
        "the retry ran before its backoff ended at {next_at} (finished at {finished})"
    );
}

#[test]
fn a_command_that_times_out_fails_its_attempt_and_its_process_group_is_ended() {
    let queue = TestQueue::new();
    let pid_file = queue.aux("slowpoke.pid");
    // An hour-long command: the run ends within the deadline only if the timeout ended it.
    let script = format!("echo $$ >> {}; sleep 3600; echo '{{}}'", pid_file.display());
    queue.seed_task(
        "slowpoke.json",
        &json!({
            "id": "slowpoke",
            "retry": {"max_attempts": 1},
            "phases": [{"name": "wait", "run": ["sh", "-c", script], "timeout": "3s"}],
        }),
    );
    queue.run_until_idle(&[]);
    let failed = queue.failed("slowpoke").expect("failed/slowpoke.json");
    let error = failed["error"].as_str().unwrap();
    assert!(error.contains("timed out after 3s"), "{error}");
    let group: i32 = fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let _cleanup = KillGroupOnDrop(group);
    assert!(
        !group_alive(group),
        "the command's group {group} is still running"
    );
}
