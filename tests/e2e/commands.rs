//! What a command sees: the request on stdin, its identity in the environment (stable
//! idempotency keys across attempts), and the queue directory as its working directory.

use crate::common::*;
use serde_json::json;

/// Replies with the request it read and the CAIRN_* environment it was given.
const ECHO: &str = "import json, os, sys
request = json.load(sys.stdin)
env = {k: v for k, v in os.environ.items() if k.startswith('CAIRN_') and k != 'CAIRN_RUN_DIR'}
reply = {'request': request, 'env': env, 'cwd': os.getcwd()}
if 'iteration' in request:
    seen = (request['state'] or []) + [reply]
    reply = {'state': seen}
print(json.dumps(reply))";

#[test]
fn commands_get_the_request_their_identity_and_the_queue_as_cwd() {
    let queue = TestQueue::new();
    queue.seed_task(
        "ident.json",
        &json!({
            "id": "ident",
            "env": {"MODEL": "tiny"},
            "phases": [
                {"name": "first", "run": ["python3", "-c", ECHO]},
                {"name": "steps", "kind": "loop", "run": ["python3", "-c", ECHO], "max_iterations": 2},
            ],
        }),
    );
    queue.run_until_idle(&[]);
    let done = queue.done("ident").expect("done/ident.json");
    let root = std::fs::canonicalize(queue.root()).unwrap();

    let first = &done["phase_outputs"]["first"];
    assert_eq!(
        first["request"],
        json!({"task_id": "ident", "phase": "first", "inputs": {}, "attempt": 1})
    );
    assert_eq!(
        first["env"],
        json!({
            "CAIRN_TASK_ID": "ident",
            "CAIRN_PHASE": "first",
            "CAIRN_ATTEMPT": "1",
            "CAIRN_IDEMPOTENCY_KEY": "ident:first:0",
            "CAIRN_CLIENTS": queue.path("clients"),
            "CAIRN_SCRATCH": queue.path("runs/ident/scratch"),
        })
    );
    assert_eq!(first["cwd"], json!(root));

    let steps = done["result"]
        .as_array()
        .expect("the loop's state is its output");
    assert_eq!(steps.len(), 2);
    for (i, step) in steps.iter().enumerate() {
        let request = &step["request"];
        assert_eq!(request["iteration"], i);
        assert_eq!(request["phase"], "steps");
        assert_eq!(request["attempt"], 1);
        assert_eq!(request["inputs"], json!({"first": first}));
        assert_eq!(step["env"]["CAIRN_ITERATION"], i.to_string());
        assert_eq!(
            step["env"]["CAIRN_IDEMPOTENCY_KEY"],
            format!("ident:steps:{i}")
        );
        assert_eq!(step["env"]["CAIRN_PHASE"], "steps");
    }
    // Iteration 1 got the state iteration 0 left.
    assert_eq!(steps[1]["request"]["state"], json!([steps[0]]));
}

#[test]
fn the_task_env_reaches_the_command() {
    let queue = TestQueue::new();
    queue.seed_task(
        "env.json",
        &json!({
            "id": "env",
            "env": {"MODEL": "tiny", "GREETING": "it's \"quoted\""},
            "phases": [{
                "name": "show",
                "run": ["python3", "-c", "import json, os; print(json.dumps([os.environ['MODEL'], os.environ['GREETING']]))"],
            }],
        }),
    );
    queue.run_until_idle(&[]);
    assert_eq!(
        queue.done("env").unwrap()["result"],
        json!(["tiny", "it's \"quoted\""])
    );
}

/// The pids of processes whose command line holds `marker` (a `sleep` duration no other
/// process uses); a zombie's command line is empty, so it does not count.
fn processes_with(marker: &str) -> Vec<i32> {
    list_dir(std::path::Path::new("/proc"))
        .into_iter()
        .filter_map(|name| name.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
                cmdline
                    .split(|b| *b == 0)
                    .any(|arg| arg == marker.as_bytes())
            })
        })
        .collect()
}

/// A `sleep` duration unique to this test run, found again in `/proc/*/cmdline`.
fn unique_sleep() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("1000.{}{nanos:09}", std::process::id())
}

/// Kills, by pid, the processes this test started (found by their unique marker) if the test
/// fails before the daemon did.
struct KillMarkedOnDrop(String);

impl Drop for KillMarkedOnDrop {
    fn drop(&mut self) {
        for pid in processes_with(&self.0) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

#[test]
fn a_helper_started_with_setsid_does_not_outlive_its_finished_task() {
    let queue = TestQueue::new();
    let marker = unique_sleep();
    let _cleanup = KillMarkedOnDrop(marker.clone());
    // The helper leaves the command's process group (setsid), so stopping the group misses it.
    let script = format!("setsid sleep {marker} </dev/null >/dev/null 2>&1 & echo '{{}}'");
    queue.seed_task(
        "leaves.json",
        &json!({"id": "leaves", "phases": [{"name": "only", "run": ["sh", "-c", script]}]}),
    );
    let mut daemon = queue.start(&[]);
    queue.wait_done("leaves");
    wait_until(
        "the helper to be gone",
        std::time::Duration::from_secs(60),
        || processes_with(&marker).is_empty(),
    );
    assert!(daemon.is_running(), "the daemon itself was killed");
    daemon.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(daemon
        .wait_exit(std::time::Duration::from_secs(60))
        .success());
}

#[test]
fn a_helper_started_with_setsid_does_not_outlive_its_cancelled_task() {
    let queue = TestQueue::new();
    let marker = unique_sleep();
    let _cleanup = KillMarkedOnDrop(marker.clone());
    let script = format!("setsid sleep {marker} </dev/null >/dev/null 2>&1 & exec sleep 1000");
    queue.seed_task(
        "stays.json",
        &json!({"id": "stays", "phases": [{"name": "only", "run": ["sh", "-c", script]}]}),
    );
    let mut daemon = queue.start(&[]);
    let minute = std::time::Duration::from_secs(60);
    wait_until("the helper to start", minute, || {
        !processes_with(&marker).is_empty()
    });
    let out = queue.cairn_output(&["cancel", "stays"], b"");
    assert!(out.status.success(), "{out:?}");
    let record = queue.wait_failed("stays");
    assert_eq!(record["status"], "cancelled", "{record}");
    wait_until("the helper to be gone", minute, || {
        processes_with(&marker).is_empty()
    });
    assert!(daemon.is_running(), "the daemon itself was killed");
    daemon.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(daemon.wait_exit(minute).success());
}
