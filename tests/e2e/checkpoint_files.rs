//! Checkpoints that name files, under SIGKILL: a worker writes a model file and a small state
//! each iteration (two iterations in three leave the file as it is) and the real daemon is
//! SIGKILLed at random moments after each start's first checkpoint, half of them between the
//! worker writing the file and sending its checkpoint. Every resume must find the file of the checkpoint whose state it resumes
//! (the state records the hash the worker computed; the worker checks and fails otherwise),
//! the result must equal an uninterrupted run's, and the blobs left must be exactly the
//! distinct files of the kept generations.
//!
//! The quick test moves a few MB per iteration; the 200 MB variant is ignored by default:
//! `cargo test --release --test e2e checkpoint_files:: -- --ignored`.

use std::collections::BTreeSet;
use std::fs;
use std::time::Duration;

use crate::common::*;
use cairn::store::{decode_checkpoint, IterationCheckpoint};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const TASK: &str = "trainer";

/// What the fixture writes as the model of `version` (see `worker_files.py`).
fn model_bytes(version: u64, size: usize) -> Vec<u8> {
    let block = Sha256::digest(format!("model-{version}").as_bytes());
    block.iter().copied().cycle().take(size).collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The result of an uninterrupted run of `iterations`.
fn uninterrupted(iterations: u64, size: usize) -> Value {
    let last_version = (iterations - 1) / 3 * 3 + 1;
    json!({
        "iterations": iterations,
        "sum": (0..iterations).sum::<u64>(),
        "model_sha": hex(&Sha256::digest(model_bytes(last_version, size))),
    })
}

fn task(side: &std::path::Path, iterations: u64, size: usize) -> Value {
    json!({"id": TASK, "phases": [{"name": "train", "kind": "worker", "run": [
        "python3", fixture("worker_files.py"), side,
        "--iterations", iterations.to_string(), "--size", size.to_string(),
    ]}]})
}

/// Every checkpoint file of the task that decodes, read while no daemon runs.
fn kept_checkpoints(queue: &TestQueue) -> Vec<IterationCheckpoint> {
    queue
        .list("incremental")
        .iter()
        .filter(|name| name.starts_with(TASK) && name.ends_with(".json.gz"))
        .filter_map(|name| {
            let bytes = fs::read(queue.path(&format!("incremental/{name}"))).ok()?;
            decode_checkpoint(&bytes).ok()
        })
        .collect()
}

/// Each kept checkpoint's file is in the blob store, holding what its state says.
fn check_kept_files(queue: &TestQueue, after: &str) {
    for cp in kept_checkpoints(queue) {
        let Some(file) = cp.files.get("model") else {
            assert!(
                cp.partial_results["model_sha"].is_null(),
                "{after}: generation {} has a model in its state but names no file",
                cp.generation
            );
            continue;
        };
        assert_eq!(file.path, "ckpt/model.bin");
        assert_eq!(
            cp.partial_results["model_sha"].as_str(),
            Some(file.sha256.as_str()),
            "{after}: generation {} names another file than its state",
            cp.generation
        );
        let blob = fs::read(queue.path(&format!("blobs/{}", file.sha256)))
            .unwrap_or_else(|e| panic!("{after}: the blob of generation {}: {e}", cp.generation));
        assert_eq!(hex(&Sha256::digest(&blob)), file.sha256, "{after}");
        assert_eq!(blob.len() as u64, file.size, "{after}");
    }
}

/// The blobs on disk (temp files aside).
fn blobs(queue: &TestQueue) -> BTreeSet<String> {
    fs::read_dir(queue.path("blobs"))
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|name| name.len() == 64)
                .collect()
        })
        .unwrap_or_default()
}

fn kill_many_times(kills: u32, iterations: u64, size: usize) {
    let queue = TestQueue::new();
    let side = queue.aux("side.log");
    queue.drop_task("trainer.json", &task(&side, iterations, size));
    let mut rng = fastrand::Rng::with_seed(u64::from(kills) * 7919 + iterations);
    for kill in 0..kills {
        let mut daemon = queue.start(&[]);
        let lines_before = side_lines(&side).len();
        let finished = || queue.done(TASK).is_some() || queue.failed(TASK).is_some();
        let since_start = |event: &str| {
            side_lines(&side)[lines_before..]
                .iter()
                .filter(|l| l.event == event)
                .count()
        };
        // Each start commits a checkpoint before it is killed: kills faster than that, time
        // after time, are what a task that kills its daemon looks like (it would be
        // quarantined; see docs/tasks.md).
        wait_until("a checkpoint since the start", DEADLINE, || {
            since_start("acked") > 0 || finished()
        });
        if kill % 2 == 0 {
            // Between writing the file and sending its checkpoint: the worker has written
            // the next model and sleeps before it sends.
            let wrote = since_start("wrote");
            wait_until("the worker wrote the next model", DEADLINE, || {
                since_start("wrote") > wrote || finished()
            });
        } else {
            std::thread::sleep(Duration::from_millis(rng.u64(0..1200)));
        }
        if queue.done(TASK).is_some() || queue.failed(TASK).is_some() {
            break;
        }
        daemon.kill_hard();
        queue.wait_lock_released();
        check_kept_files(&queue, &format!("after kill {kill}"));
    }
    queue.run_until_idle(&[]);
    let violations: Vec<String> = fs::read_to_string(&side)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("VIOLATION") || l.starts_with("refused"))
        .map(str::to_owned)
        .collect();
    assert!(violations.is_empty(), "{violations:?}");
    let done = queue.done(TASK).unwrap_or_else(|| {
        panic!(
            "the task is not done: {:?}\nside file:\n{}",
            queue.failed(TASK),
            fs::read_to_string(&side).unwrap_or_default()
        )
    });
    assert_eq!(done["result"], uninterrupted(iterations, size));
    let resumes = side_lines(&side)
        .iter()
        .filter(|l| l.event == "resume")
        .count();
    assert!(resumes > 0, "no kill caught the worker before it finished");
    check_kept_files(&queue, "at the end");
    // Disk use: exactly the distinct files the kept generations name.
    let named: BTreeSet<String> = kept_checkpoints(&queue)
        .iter()
        .flat_map(|cp| cp.files.values().map(|f| f.sha256.clone()))
        .collect();
    assert_eq!(
        blobs(&queue),
        named,
        "blobs no kept generation names remain"
    );
    assert!(named.len() <= 4, "{named:?}");
}

/// The model's size: 3 MiB, or `CAIRN_MODEL_MB` MiB for the long run (docs/testing.md).
fn model_size() -> usize {
    let mb = std::env::var("CAIRN_MODEL_MB")
        .ok()
        .and_then(|mb| mb.parse::<usize>().ok())
        .unwrap_or(3);
    mb << 20
}

#[test]
fn a_worker_killed_at_random_moments_resumes_with_the_files_of_its_state() {
    kill_many_times(10, 24, model_size());
}

#[test]
fn a_checkpoint_naming_a_missing_file_is_refused_and_the_previous_one_stays() {
    let queue = TestQueue::new();
    let script = queue.aux("worker.sh");
    fs::write(
        &script,
        r#"set -e
cd "$CAIRN_SCRATCH"
echo one > a.bin
printf '%s\n' '{"checkpoint": {"iteration": 1, "state": 1, "files": {"a": "a.bin"}}, "ack": true}' >> "$CAIRN_CHANNEL"
read -r answer < "$CAIRN_ACK"
printf '%s\n' '{"checkpoint": {"iteration": 2, "state": 2, "files": {"a": "gone.bin"}}, "ack": true}' >> "$CAIRN_CHANNEL"
read -r answer < "$CAIRN_ACK"
echo "$answer" > "$CAIRN_SCRATCH/answer"
exit 0
"#,
    )
    .unwrap();
    queue.drop_task(
        "w.json",
        &json!({"id": "w", "retry": {"max_attempts": 1},
            "phases": [{"name": "w", "kind": "worker", "run": ["sh", script]}]}),
    );
    queue.run_until_idle(&[]);
    let failed = queue.failed("w").expect("the task failed");
    let error = failed.to_string();
    assert!(
        error.contains("gone.bin") && error.contains("no such file"),
        "{error}"
    );
    let cp = queue.checkpoint("w");
    assert_eq!(cp.iteration_count, 1);
    assert_eq!(cp.files["a"].sha256, hex(&Sha256::digest(b"one\n")));
}

/// A loop command that names `out.txt` in each reply: iteration i writes `v<i>`. Given
/// `"files"` in its request (every request after the first), it checks the file holds what its state says and
/// records each check in the state; attempt 1 fails at iteration 2 after scribbling over it.
const LOOP_SCRIPT: &str = r#"
import json, os, sys
req = json.load(sys.stdin)
path = os.path.join(os.environ["CAIRN_SCRATCH"], "out.txt")
state = req["state"] or {"content": None, "checked": []}
if "files" in req:
    found = open(path).read() if os.path.exists(path) else None
    state["checked"].append([req["iteration"], req["files"] == {"out": "out.txt"} and found == state["content"]])
if req["iteration"] == 2 and req["attempt"] == 1 and not req["task_id"].startswith("fork"):
    open(path, "w").write("scribbled by a failed attempt")
    sys.exit(1)
open(path, "w").write("v%d" % req["iteration"])
state["content"] = "v%d" % req["iteration"]
print(json.dumps({"state": state, "files": {"out": "out.txt"}}))
"#;

#[test]
fn a_loops_files_come_back_on_a_retry_and_in_a_fork_and_prune_collects_them() {
    let queue = TestQueue::new();
    let script = queue.aux("loop.py");
    fs::write(&script, LOOP_SCRIPT).unwrap();
    let task = |id: &str| {
        json!({"id": id, "retry": {"max_attempts": 3, "backoff": "1s"},
            "phases": [{"name": "l", "kind": "loop", "max_iterations": 4,
                "run": ["python3", &script]}]})
    };
    queue.drop_task("l.json", &task("l"));
    queue.run_until_idle(&[]);
    let done = queue.done("l").expect("the loop is done");
    // Each request after the first names the file of the state it carries; the retry at
    // iteration 2 found v1 restored over what the failed attempt scribbled.
    assert_eq!(
        done["result"]["checked"],
        json!([[1, true], [2, true], [3, true]]),
        "{done}"
    );
    assert_eq!(done["attempts"], 2);
    assert_eq!(done["result"]["content"], "v3");

    // A fork of generation 1 (after iteration 0) starts with that generation's file.
    let out = queue.cairn_output(&["fork", "l", "--gen", "1", "--as", "fork-l"], b"");
    assert!(out.status.success(), "{}", stderr_of(&out));
    queue.run_until_idle(&[]);
    let fork = queue.done("fork-l").expect("the fork is done");
    assert_eq!(
        fork["result"]["checked"],
        json!([[1, true], [2, true], [3, true]]),
        "{fork}"
    );
    assert!(!blobs(&queue).is_empty());

    // The operator commands show the files and write them out.
    let history = stdout_of(&queue.cairn_output(&["history", "l"], b""));
    assert!(
        history.contains("FILES") && history.contains("out 2B"),
        "{history}"
    );
    let out_dir = queue.aux("files-out");
    let written = queue.cairn_output(
        &[
            "checkpoint",
            "l",
            "--gen",
            "2",
            "--files-to",
            out_dir.to_str().unwrap(),
        ],
        b"",
    );
    assert!(written.status.success(), "{}", stderr_of(&written));
    assert_eq!(fs::read_to_string(out_dir.join("out.txt")).unwrap(), "v1");

    // Once both tasks are pruned, nothing names their files.
    let out = queue.cairn_output(&["prune", "--older-than", "0s"], b"");
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(
        stdout_of(&out).contains("checkpoint file(s) no checkpoint names"),
        "{}",
        stdout_of(&out)
    );
    assert!(blobs(&queue).is_empty(), "{:?}", blobs(&queue));
}
