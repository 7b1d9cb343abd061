//! A command that cannot be started because the system is out of processes or memory (`EAGAIN`,
//! `ENOMEM` from fork) is retried after the backoff without using up an attempt: a fork bomb in
//! one task must not fail the others for good. The failures are injected into the real daemon's
//! forks with strace (`.ci/run` installs it).

use crate::common::*;
use serde_json::json;

/// Run the daemon until idle under strace, its first `failures` forks failing with `errno`;
/// returns what it logged.
fn run_with_failing_forks(queue: &TestQueue, errno: &str, failures: u32) -> String {
    // Without -f only the daemon's main thread is traced: commands are started with its
    // `clone` calls, while threads are started with `clone3`.
    let inject = format!("inject=clone:error={errno}:when=1..{failures}");
    let mut daemon = queue.start_wrapped(
        &[
            "strace",
            "-qq",
            "-o",
            "/dev/null",
            "-e",
            "trace=clone",
            "-e",
            &inject,
            "--",
        ],
        &["--exit-when-idle"],
    );
    let status = daemon.wait_exit(DEADLINE);
    assert_eq!(status.code(), Some(0), "{status}");
    daemon.stderr()
}

#[test]
fn a_spawn_failing_with_eagain_or_enomem_uses_up_no_attempt() {
    if !require_strace("a_spawn_failing_with_eagain_or_enomem_uses_up_no_attempt") {
        return;
    }
    for errno in ["EAGAIN", "ENOMEM"] {
        let queue = TestQueue::new();
        // One attempt each: a single counted failure would fail them for good.
        let retry = json!({"max_attempts": 1, "backoff": "100ms"});
        let mut once = once_task("mail", &json!("sent"));
        once["retry"] = retry.clone();
        queue.seed_task("mail.json", &once);
        queue.seed_task(
            "work.json",
            &json!({
                "id": "work",
                "retry": retry,
                "phases": [{"name": "run", "kind": "worker", "run": ["sh", "-c", "exit 0"]}],
            }),
        );
        let log = run_with_failing_forks(&queue, errno, 4);

        let mail = queue.wait_done("mail");
        assert_eq!(mail["result"], json!("sent"));
        assert_eq!(mail["failed_attempts"], 0, "{errno}: {mail:#}");
        let work = queue.wait_done("work");
        assert_eq!(work["failed_attempts"], 0, "{errno}: {work:#}");
        assert!(
            log.contains("out of processes or memory"),
            "{errno}: no failed spawn was reported: {log}"
        );
    }
}
