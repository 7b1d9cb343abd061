//! The whole daemon on a storage backend that fails one write step: for every step of a run in
//! turn (task intake, current_work.json, each checkpoint, the done record), the write fails with
//! "no space left on device". The daemon must not lose or skip anything: the task still finishes
//! with the same result, and an iteration runs again only because its own checkpoint failed.

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cairn::daemon::{self, DaemonConfig, DaemonExit};
use cairn::shutdown::Shutdown;
use cairn::store::{FaultMode, FaultyFileOps, FileStorage, Storage};

const ITERATIONS: u64 = 4;

/// A loop whose state is the sum of (iteration + 1), logging each run to `runs.txt`.
fn write_task(queue: &Path) {
    fs::create_dir_all(queue.join("inbox")).unwrap();
    // Closed to other users: a queue every user may enter is refused while a task has `env`.
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(queue, fs::Permissions::from_mode(0o750)).unwrap();
    // `state` is a number (or null at first); iteration i adds i + 1.
    let step = r#"read -r request
state=$(printf '%s' "$request" | sed -n 's/.*"state":\([0-9]*\).*/\1/p')
echo "$CAIRN_ITERATION" >> "$RUNS_FILE"
echo "{\"state\": $(( ${state:-0} + CAIRN_ITERATION + 1 ))}""#;
    let task = serde_json::json!({
        "id": "faulty",
        "env": {"RUNS_FILE": queue.join("runs.txt")},
        "retry": {"max_attempts": 2, "backoff": "20ms", "max_backoff": "40ms"},
        "phases": [
            {"name": "first", "run": ["sh", "-c", "echo '{\"ready\": true}'"]},
            {"name": "sum", "kind": "loop", "run": ["sh", "-c", step],
             "max_iterations": ITERATIONS}
        ]
    });
    fs::write(queue.join("inbox/faulty.json"), task.to_string()).unwrap();
    // Old enough to be taken at once (no inotify hint is needed).
    let old = std::time::SystemTime::now() - Duration::from_secs(5);
    fs::File::options()
        .write(true)
        .open(queue.join("inbox/faulty.json"))
        .unwrap()
        .set_modified(old)
        .unwrap();
}

/// Run the daemon until idle; returns the done record and the iterations run, in order.
fn run(queue: &Path, ops: Arc<FaultyFileOps>) -> (serde_json::Value, Vec<u64>) {
    let storage: Arc<dyn Storage> = Arc::new(FileStorage::with_ops(queue, ops));
    let mut config = DaemonConfig::new(queue);
    config.exit_when_idle = true;
    config.storage = Some(storage);
    config.rescan_interval = Duration::from_millis(50);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let exit = runtime
        .block_on(async {
            tokio::time::timeout(
                Duration::from_secs(60),
                daemon::run(config, Shutdown::new()),
            )
            .await
        })
        .expect("the daemon did not finish within 60 s")
        .expect("the daemon failed to run");
    assert_eq!(exit, DaemonExit::Idle);
    let record = fs::read(queue.join("done/faulty.json")).unwrap_or_else(|e| {
        let failed = fs::read_to_string(queue.join("failed/faulty.json")).unwrap_or_default();
        panic!("no done record ({e}); failed record: {failed}")
    });
    let runs = fs::read_to_string(queue.join("runs.txt"))
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    (serde_json::from_slice(&record).unwrap(), runs)
}

#[test]
fn a_failed_write_at_any_step_delays_the_task_but_never_loses_it() {
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let reference_dir = tempfile::tempdir().unwrap();
    write_task(reference_dir.path());
    let counting = Arc::new(FaultyFileOps::new());
    let (reference, runs) = run(reference_dir.path(), Arc::clone(&counting));
    let steps = counting.steps();
    assert_eq!(reference["result"], serde_json::json!(10));
    assert_eq!(runs, vec![0, 1, 2, 3]);
    assert!(
        steps > 20,
        "a run makes more write steps than that: {steps}"
    );

    for step in 0..steps {
        eprintln!("--- a write fails at step {step} of {steps}");
        let dir = tempfile::tempdir().unwrap();
        write_task(dir.path());
        let ops = Arc::new(FaultyFileOps::fail_at(step, FaultMode::Error));
        let (record, runs) = run(dir.path(), Arc::clone(&ops));
        assert!(
            ops.steps() > step,
            "step {step}: the fault was never reached"
        );
        assert_eq!(
            record["result"], reference["result"],
            "step {step}: a different result"
        );
        assert_eq!(
            record["phase_outputs"], reference["phase_outputs"],
            "step {step}"
        );
        assert_eq!(
            record["failed_attempts"], 0,
            "step {step}: a storage error must not use up the task's attempts"
        );
        // Every iteration ran; at most one ran twice (the one whose checkpoint failed).
        let expected: Vec<u64> = (0..ITERATIONS).collect();
        let mut seen = runs.clone();
        seen.dedup();
        assert_eq!(
            seen, expected,
            "step {step}: iterations ran out of order: {runs:?}"
        );
        assert!(
            runs.len() as u64 <= ITERATIONS + 1,
            "step {step}: more than one iteration ran again: {runs:?}"
        );
        let leftovers: Vec<_> = walk(dir.path())
            .into_iter()
            .filter(|p| p.ends_with(".cairn.tmp"))
            .collect();
        assert!(
            leftovers.is_empty(),
            "step {step}: temp files left: {leftovers:?}"
        );
    }
}

fn walk(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(walk(&path));
        } else {
            found.push(path.display().to_string());
        }
    }
    found
}
