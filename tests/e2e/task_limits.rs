//! Each task's cgroup is bounded (`cairn run --task-memory-max`, `--task-pids-max`) where the
//! daemon's cgroup offers the memory and pids controllers; where it does not, the daemon says
//! so at start.

use serde_json::json;

use crate::common::*;

/// A task reads its own cgroup's `memory.max` and `pids.max`: they are the daemon's flags, or
/// the daemon said at start why tasks are not bounded.
#[test]
fn a_task_s_cgroup_carries_the_daemon_s_bounds_or_the_daemon_says_why_not() {
    let queue = TestQueue::new();
    let script = r#"
        cg=$(sed -n 's/^0:://p' /proc/self/cgroup)
        mnt=$(grep ' - cgroup2 ' /proc/self/mountinfo | head -n 1 | cut -d' ' -f5)
        read_or_none() { if [ -r "$mnt$cg/$1" ]; then cat "$mnt$cg/$1"; else echo none; fi; }
        printf '{"cgroup": "%s", "memory": "%s", "pids": "%s"}' \
            "$cg" "$(read_or_none memory.max)" "$(read_or_none pids.max)"
    "#;
    queue.seed_task(
        "bounded.json",
        &json!({"id": "bounded", "phases": [{"name": "look", "run": ["sh", "-c", script]}]}),
    );
    let mut daemon = queue.start(&[
        "--exit-when-idle",
        "--task-memory-max",
        "300MiB",
        "--task-pids-max",
        "123",
    ]);
    let status = daemon.wait_exit(DEADLINE);
    assert!(status.success(), "{}", daemon.stderr());
    let result = queue.wait_done("bounded")["result"].clone();
    let stderr = daemon.stderr();
    if stderr.contains("each task's cgroup is bounded") {
        assert_eq!(result["memory"], "314572800", "{result}");
        assert_eq!(result["pids"], "123", "{result}");
        assert!(
            result["cgroup"].as_str().unwrap().contains("/task-bounded"),
            "{result}"
        );
    } else {
        assert!(
            stderr.contains("tasks' memory and process counts are not bounded: "),
            "neither bounded nor said why: {stderr}"
        );
        eprintln!(
            "a_task_s_cgroup_carries_the_daemon_s_bounds_or_the_daemon_says_why_not: \
                   this host offers no bounds; the daemon said why ({result})"
        );
    }
}

/// A loop whose checkpoints are larger than what one submitter may hold has its next
/// checkpoint refused, and its attempt fails saying why; the same submitter's next task, with
/// small checkpoints, runs.
#[test]
fn a_submitter_s_checkpoints_past_the_bound_are_refused_with_the_reason() {
    let queue = TestQueue::new();
    let script = "import json, os, sys; r = json.load(sys.stdin); \
                  json.dump({'state': {'blob': os.urandom(100000).hex(), 'n': r['iteration']}}, sys.stdout)";
    queue.seed_task(
        "big.json",
        &json!({"id": "big", "retry": {"max_attempts": 1}, "phases": [{
            "name": "grow", "kind": "loop", "max_iterations": 5,
            "run": ["python3", "-c", script]}]}),
    );
    queue.run_until_idle(&["--max-checkpoint-bytes-per-submitter", "64KiB"]);
    let failed = queue.wait_failed("big");
    let error = failed["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("checkpoint refused") && error.contains("more than the 65536"),
        "{failed:#}"
    );
    queue.seed_task(
        "small.json",
        &json!({"id": "small", "phases": [{
            "name": "count", "kind": "loop", "max_iterations": 3,
            "run": ["python3", "-c",
                "import json, sys; r = json.load(sys.stdin); json.dump({'state': r['iteration']}, sys.stdout)"]}]}),
    );
    queue.run_until_idle(&["--max-checkpoint-bytes-per-submitter", "64KiB"]);
    queue.wait_done("small");
}
