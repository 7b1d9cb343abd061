//! A command that cannot be started because the system is out of processes or memory (`EAGAIN`,
//! `ENOMEM` from fork) or the daemon out of descriptors (`EMFILE`) is retried after the backoff
//! without using up an attempt: a fork bomb in one task, or many tasks at once, must not fail
//! the others for good. The fork failures are injected into the real daemon's forks with
//! strace (`.ci/run` installs it); the descriptors run out under a low `ulimit -n`.

use crate::common::*;
use serde_json::{json, Value};
use std::fs;

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
            log.contains("out of processes, memory or open files"),
            "{errno}: no failed spawn was reported: {log}"
        );
    }
}

/// Run the daemon until idle under `ulimit -Sn soft` and `-Hn hard`, with room for `tasks` at
/// once; returns what it logged, once it has exited 0.
fn run_with_file_limits(queue: &TestQueue, soft: u32, hard: u32, tasks: usize) -> String {
    // Soft first: a hard limit below the soft one is refused.
    let script = format!("ulimit -Sn {soft} && ulimit -Hn {hard} && exec \"$0\" \"$@\"");
    let max_tasks = tasks.to_string();
    let mut daemon = queue.start_wrapped(
        &["bash", "-c", &script],
        &["--max-tasks", &max_tasks, "--exit-when-idle"],
    );
    let status = daemon.wait_exit(DEADLINE);
    let log = daemon.stderr();
    assert_eq!(status.code(), Some(0), "{status}: {log}");
    log
}

/// `count` tasks of one attempt each whose command sleeps a second, so that they are all in
/// flight at once, and replies with its soft and hard limits on open files.
fn seed_sleepers(queue: &TestQueue, count: usize) -> Vec<String> {
    let ids: Vec<String> = (0..count).map(|i| format!("s{i:02}")).collect();
    for id in &ids {
        queue.seed_task(
            &format!("{id}.json"),
            &json!({
                "id": id,
                "retry": {"max_attempts": 1, "backoff": "100ms"},
                "phases": [{
                    "name": "limits",
                    "run": ["sh", "-c", "sleep 1; echo \"\\\"$(ulimit -Sn) $(ulimit -Hn)\\\"\""],
                }],
            }),
        );
    }
    ids
}

#[test]
fn a_daemon_out_of_descriptors_starts_the_rest_later_without_using_up_attempts() {
    let queue = TestQueue::new();
    // Sixty commands at once hold about 120 descriptors in the daemon (a pidfd and a pipe
    // each), beside its own: far past 48.
    let ids = seed_sleepers(&queue, 60);
    let log = run_with_file_limits(&queue, 48, 48, ids.len());
    assert!(
        log.contains("the limit on open files (48) is below"),
        "no warning about the limit at start: {log}"
    );
    assert!(
        log.contains("Too many open files") && log.contains("without using up an attempt"),
        "no command found the descriptors exhausted, so nothing was tested: {log}"
    );
    assert!(
        !log.contains("events.jsonl: Too many open files"),
        "journal lines were lost: {log}"
    );
    for id in &ids {
        let done = queue.wait_done(id);
        assert_eq!(done["failed_attempts"], 0, "{id}: {done:#}");
        assert_eq!(done["result"], json!("48 48"), "{id}: {done:#}");
        // Journal lines that found no descriptor were written later, not lost: every command
        // that could not start had its phase start journaled first, and so had the one run.
        let journal = fs::read_to_string(queue.path(&format!("runs/{id}/events.jsonl"))).unwrap();
        let events: Vec<Value> = journal
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        let named = |name: &'static str| events.iter().filter(move |e| e["event"] == name);
        let started: Vec<&Value> = named("phase_started").map(|e| &e["attempt"]).collect();
        for failed in named("attempt_failed") {
            if failed["error"]
                .as_str()
                .unwrap_or_default()
                .contains("cannot start")
            {
                assert!(started.contains(&&failed["attempt"]), "{id}: {journal}");
            }
        }
        assert_eq!(named("accepted").count(), 1, "{id}: {journal}");
        assert_eq!(named("phase_finished").count(), 1, "{id}: {journal}");
        assert_eq!(named("done").count(), 1, "{id}: {journal}");
    }
}

#[test]
fn the_daemon_raises_its_soft_limit_and_commands_get_the_one_it_started_with() {
    let queue = TestQueue::new();
    let ids = seed_sleepers(&queue, 30);
    // 48 would run out as in the test above; the hard limit leaves room for all thirty.
    let log = run_with_file_limits(&queue, 48, 4096, ids.len());
    assert!(
        !log.contains("Too many open files") && !log.contains("limit on open files"),
        "the daemon did not raise its soft limit: {log}"
    );
    for id in &ids {
        let done = queue.wait_done(id);
        assert_eq!(done["attempts"], 1, "{id}: {done:#}");
        // What `select()` users were started with, not the daemon's raised limit.
        assert_eq!(done["result"], json!("48 4096"), "{id}: {done:#}");
    }
}
