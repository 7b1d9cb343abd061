//! Crash accounting of the real daemon: which task is taken for the cause of repeated crashes.
//! Progress or a clean stop clears a task's count, and only a task during which the daemon died
//! while it ran alone is ever put into `failed/` for it; an innocent task beside a task that
//! kills the daemon finishes.

use std::os::unix::process::ExitStatusExt;

use crate::common::*;
use serde_json::json;

/// Start a daemon and SIGKILL it once the given attempt of the task has started an iteration
/// (before that iteration can end, so the attempt commits no checkpoint).
fn kill_mid_iteration(queue: &TestQueue, side: &std::path::Path, attempt: u32) {
    let mut daemon = queue.start(&[]);
    wait_until(
        &format!("attempt {attempt} has started an iteration"),
        DEADLINE,
        || {
            side_events(side)
                .iter()
                .any(|e| e.event == "start" && e.attempt == attempt)
        },
    );
    let status = daemon.kill_hard();
    assert_eq!(status.signal(), Some(9), "{status}");
    assert!(
        !side_events(side)
            .iter()
            .any(|e| e.event == "end" && e.attempt == attempt),
        "attempt {attempt} finished an iteration before the kill; the scenario needs it not to"
    );
}

#[test]
fn progress_in_an_attempt_ended_by_a_clean_stop_resets_the_crash_count() {
    let queue = TestQueue::new();
    let side = queue.aux("steady.side");
    // max_attempts 3: five crashes in a row without progress would take the task for the
    // cause of them.
    let mut task = loop_task("steady", &side, 8, 1.0);
    task["retry"] = json!({"max_attempts": 3, "backoff": "100ms"});
    queue.seed_task("steady.json", &task);

    kill_mid_iteration(&queue, &side, 1);
    kill_mid_iteration(&queue, &side, 2);

    // Attempt 3 commits two checkpoints, then stops cleanly.
    let mut daemon = queue.start(&[]);
    wait_until("attempt 3 has finished two iterations", DEADLINE, || {
        side_events(&side)
            .iter()
            .filter(|e| e.event == "end" && e.attempt == 3)
            .count()
            >= 2
    });
    daemon.signal(SIGTERM);
    assert_eq!(daemon.wait_exit(DEADLINE).code(), Some(0));
    assert!(queue.checkpoint("steady").iteration_count >= 2);

    for attempt in 4..=6 {
        kill_mid_iteration(&queue, &side, attempt);
    }
    queue.run_until_idle(&[]);
    let done = queue.wait_done("steady");
    assert_eq!(done["result"], loop_result(8));
}

#[test]
fn a_task_that_kills_the_daemon_is_quarantined_and_the_innocent_task_beside_it_finishes() {
    let queue = TestQueue::new();
    let side = queue.aux("mail.side");
    // The command's parent is the daemon: this task kills the daemon at every start.
    queue.seed_task(
        "killer.json",
        &json!({"id": "killer", "phases": [{"name": "boom", "run": ["sh", "-c", "kill -9 $PPID; sleep 30"]}]}),
    );
    // Starts first, and is still running when the killer strikes.
    let send = format!(
        "echo sent >> '{}'; sleep 2; printf '\"sent\"'",
        side.display()
    );
    queue.seed_task(
        "mail.json",
        &json!({"id": "mail", "priority": 1, "phases": [{"name": "send", "run": ["sh", "-c", send]}]}),
    );

    let mut runs = 0;
    while queue.failed("killer").is_none() || queue.done("mail").is_none() {
        runs += 1;
        assert!(runs <= 20, "still not settled after 20 daemon runs");
        assert!(
            queue.failed("mail").is_none(),
            "{:#}",
            queue.failed("mail").unwrap()
        );
        let mut daemon = queue.start(&["--exit-when-idle"]);
        let status = daemon.wait_exit(DEADLINE);
        assert!(
            status.code() == Some(0) || status.signal() == Some(9),
            "{status}"
        );
    }
    let failed = queue.failed("killer").unwrap();
    assert_eq!(failed["status"], "failed", "{failed:#}");
    let error = failed["error"].as_str().unwrap();
    assert!(
        error.contains("alone") && error.contains("times in a row"),
        "the record does not say what convicted it: {error}"
    );
    assert_eq!(queue.done("mail").unwrap()["result"], json!("sent"));
    let sends = std::fs::read_to_string(&side).unwrap().lines().count();
    assert!(
        sends <= 2,
        "the innocent task's side effect ran {sends} times"
    );
}
