//! The checkpoint benchmark: its generator makes the shared workload's states byte for byte,
//! and `cairn bench checkpoint` writes real checkpoints that `cairn checkpoint` decodes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use cairn::bench::workload::{mean_canonical_bytes, SizeClass, TaskState};
use serde_json::Value;
use sha2::{Digest, Sha256};

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The table of `bench/workload.md`: size, canonical bytes and SHA-256 at iteration 0, and the
/// mean size over the sequential variant's iterations.
const REFERENCE: [(SizeClass, usize, &str, u64); 3] = [
    (
        SizeClass::K1,
        897,
        "4db96e48a2c35ff512141a28ec523dec7caefa570310abb78e333ee8918c1218",
        1202,
    ),
    (
        SizeClass::K64,
        65_728,
        "4c3c0492e64872b2885e7c658cbfc5b32dc745682aef899b9e1585c835c4c79c",
        65_542,
    ),
    (
        SizeClass::M1,
        1_054_046,
        "a369371ef88fb0f782614ae229705da7d3e10a03fa81d7441117dfd2c48649c2",
        1_054_983,
    ),
];

#[test]
fn the_generator_makes_the_reference_states_byte_for_byte() {
    for (size, len, sha, mean) in REFERENCE {
        let state = TaskState::new(0, size).canonical();
        assert_eq!(state.len(), len, "{size:?}");
        assert_eq!(sha256_hex(&state), sha, "{size:?}");
        let iterations = size.iterations(1).unwrap();
        assert_eq!(
            mean_canonical_bytes(size, iterations).round() as u64,
            mean,
            "{size:?}"
        );
    }
}

/// The reference generator, when the shared directory is beside the repository (it is in CI).
fn reference_generator() -> Option<PathBuf> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/bench/workload.py");
    if path.exists() {
        return Some(path);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{} is missing in CI",
        path.display()
    );
    eprintln!("skipping: {} is not there", path.display());
    None
}

#[test]
fn later_iterations_of_other_tasks_match_the_reference_generator() {
    let Some(script) = reference_generator() else {
        return;
    };
    let cases = [(7u64, "1k", 13u64), (99, "64k", 9), (3, "1k", 1999)];
    let case_list = cases
        .iter()
        .map(|(t, s, i)| format!("({t}, {s:?}, {i})"))
        .collect::<Vec<_>>()
        .join(", ");
    let program = format!(
        "import sys, hashlib\nsys.path.insert(0, {dir:?})\nimport workload\n\
         for t, size, i in [{case_list}]:\n    \
             ts = workload.TaskState(t, size)\n    \
             for _ in range(i): ts.advance()\n    \
             print(hashlib.sha256(workload.canonical(ts.state())).hexdigest())\n",
        dir = script.parent().unwrap().display().to_string(),
    );
    let output = Command::new("python3")
        .arg("-c")
        .arg(&program)
        .output()
        .expect("python3 runs");
    assert!(output.status.success(), "{output:?}");
    let expected: Vec<String> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    let ours: Vec<String> = cases
        .iter()
        .map(|&(task, size, iteration)| {
            let size = match size {
                "1k" => SizeClass::K1,
                _ => SizeClass::K64,
            };
            let mut state = TaskState::new(task, size);
            for _ in 0..iteration {
                state.advance();
            }
            sha256_hex(&state.canonical())
        })
        .collect();
    assert_eq!(ours, expected);
}

fn cairn(args: &[&str]) -> Output {
    let output = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(args)
        .output()
        .expect("cairn runs");
    assert!(
        output.status.success(),
        "cairn {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// Run the benchmark, keeping its checkpoints; returns the result line and the queue it wrote.
fn bench(dir: &Path, args: &[&str]) -> (Value, PathBuf) {
    let mut all = vec![
        "bench",
        "checkpoint",
        "--keep",
        "--dir",
        dir.to_str().unwrap(),
    ];
    all.extend_from_slice(args);
    let output = cairn(&all);
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "one line: {stdout}");
    let line: Value = serde_json::from_str(&stdout).unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    let kept = stderr
        .lines()
        .find_map(|l| l.strip_prefix("checkpoints kept in "))
        .unwrap_or_else(|| panic!("no kept directory in {stderr}"));
    (line, PathBuf::from(kept))
}

/// `cairn checkpoint` of one bench task, as JSON.
fn decoded(queue: &Path, task: &str) -> Value {
    let output = cairn(&["--queue", queue.to_str().unwrap(), "checkpoint", task]);
    serde_json::from_slice(&output.stdout).unwrap()
}

/// The state task `task` holds after `iterations` iterations, as JSON.
fn state_after(task: u64, size: SizeClass, iterations: u64) -> Value {
    let mut state = TaskState::new(task, size);
    for _ in 0..iterations {
        state.advance();
    }
    serde_json::from_slice(&state.canonical()).unwrap()
}

fn assert_line(line: &Value, implementation: &str, mode: &str, size: &str, conc: u64, n: u64) {
    assert_eq!(line["impl"], implementation, "{line}");
    assert_eq!(line["mode"], mode, "{line}");
    assert_eq!(line["size"], size, "{line}");
    assert_eq!(line["conc"], conc, "{line}");
    assert_eq!(line["n"], n, "{line}");
    for field in ["json_bytes", "stored_bytes", "p50_ms", "p99_ms", "ops_s"] {
        assert!(line[field].as_f64().unwrap() > 0.0, "{field}: {line}");
    }
    assert!(line["p99_ms"].as_f64() >= line["p50_ms"].as_f64(), "{line}");
}

#[test]
fn sequential_runs_write_checkpoints_that_cairn_checkpoint_decodes() {
    let dir = tempfile::tempdir().unwrap();
    let (line, queue) = bench(dir.path(), &["--size", "1k"]);
    assert_line(&line, "cairn", "durable", "1k", 1, 2000);
    assert_eq!(line["json_bytes"], 1202);
    // Compressed: the stored checkpoint (envelope included) is smaller than the state.
    assert!(line["stored_bytes"].as_u64().unwrap() < 1202, "{line}");
    let checkpoint = decoded(&queue, "task-0000");
    assert_eq!(checkpoint["iteration_count"], 2000);
    // The last state written is the one of iteration 1999 (0-based).
    assert_eq!(
        checkpoint["partial_results"],
        state_after(0, SizeClass::K1, 1999)
    );

    // A 1 MiB state goes through the multi-block compression and still decodes exactly.
    let (line, queue) = bench(dir.path(), &["--size", "1m"]);
    assert_line(&line, "cairn", "durable", "1m", 1, 100);
    assert_eq!(line["json_bytes"], 1_054_983);
    let checkpoint = decoded(&queue, "task-0000");
    assert_eq!(
        checkpoint["partial_results"],
        state_after(0, SizeClass::M1, 99)
    );
}

#[test]
fn concurrent_runs_checkpoint_every_task() {
    let dir = tempfile::tempdir().unwrap();
    let (line, queue) = bench(dir.path(), &["--size", "1k", "--conc", "100"]);
    assert_line(&line, "cairn", "durable", "1k", 100, 5000);
    for task in [0u64, 42, 99] {
        let checkpoint = decoded(&queue, &format!("task-{task:04}"));
        assert_eq!(checkpoint["iteration_count"], 50);
        assert_eq!(
            checkpoint["partial_results"],
            state_after(task, SizeClass::K1, 49)
        );
    }
    let (line, _) = bench(
        dir.path(),
        &["--size", "64k", "--conc", "100", "--durability", "none"],
    );
    assert_line(&line, "cairn", "published", "64k", 100, 1000);
}

#[test]
fn the_raw_reference_replaces_the_canonical_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (line, queue) = bench(dir.path(), &["--size", "1k", "--raw"]);
    assert_line(&line, "raw", "durable", "1k", 1, 2000);
    assert_eq!(line["stored_bytes"], 1202);
    let last = std::fs::read(queue.join("incremental/task-0000.json")).unwrap();
    let mut state = TaskState::new(0, SizeClass::K1);
    for _ in 0..1999 {
        state.advance();
    }
    assert_eq!(last, state.canonical());
}

#[test]
fn a_size_without_a_concurrent_variant_is_refused() {
    let output = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["bench", "checkpoint", "--size", "1m", "--conc", "100"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("no concurrent variant for size 1m"),
        "{stderr}"
    );
}
