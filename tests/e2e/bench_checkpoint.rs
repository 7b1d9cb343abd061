//! The checkpoint benchmark: its generator makes the workload's states byte for byte (checked
//! against the reference values of `bench/workload.md`), and `cairn bench checkpoint` writes
//! real checkpoints that `cairn checkpoint` decodes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use sha2::{Digest, Sha256};
use workload::{mean_canonical_bytes, SizeClass, TaskState};

/// The workload's generator, from the binary's source: the library has no benchmarks to link.
/// Accessors only the benchmark reads are unused here.
#[path = "../../src/bench/workload.rs"]
#[allow(dead_code)]
mod workload;

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn size_class(name: &str) -> SizeClass {
    match name {
        "1k" => SizeClass::K1,
        "64k" => SizeClass::K64,
        "1m" => SizeClass::M1,
        other => panic!("bench/workload.md: unknown size class {other:?}"),
    }
}

/// The cells of each row of the Markdown table under `heading` in `bench/workload.md`,
/// without the header and separator rows; numbers lose their thousands separators and hashes
/// their backquotes.
fn workload_table(heading: &str) -> Vec<Vec<String>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/workload.md");
    let spec = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let section = spec
        .split("\n## ")
        .find(|s| s.starts_with(heading))
        .unwrap_or_else(|| panic!("{}: no section {heading:?}", path.display()));
    let rows: Vec<Vec<String>> = section
        .lines()
        .filter(|line| line.starts_with('|'))
        .skip(2)
        .map(|line| {
            line.trim_matches('|')
                .split('|')
                .map(|cell| cell.trim().trim_matches('`').replace(',', ""))
                .collect()
        })
        .collect();
    assert!(
        !rows.is_empty(),
        "{}: empty table {heading:?}",
        path.display()
    );
    rows
}

fn state_at(task: u64, size: SizeClass, iteration: u64) -> TaskState {
    let mut state = TaskState::new(task, size);
    for _ in 0..iteration {
        state.advance();
    }
    state
}

#[test]
fn the_generator_makes_the_reference_states_byte_for_byte() {
    let rows = workload_table("Reference values");
    assert!(rows.len() >= 13, "only {} reference rows", rows.len());
    for row in rows {
        let [size, task, iteration, len, sha] = &row[..] else {
            panic!("bench/workload.md: reference row {row:?} has not five cells");
        };
        let state = state_at(
            task.parse().unwrap(),
            size_class(size),
            iteration.parse().unwrap(),
        )
        .canonical();
        assert_eq!(state.len().to_string(), *len, "{row:?}");
        assert_eq!(sha256_hex(&state), *sha, "{row:?}");
    }
}

#[test]
fn the_sizes_match_the_workload_table() {
    let rows = workload_table("Sizes");
    assert_eq!(rows.len(), 3, "{rows:?}");
    for row in rows {
        let [name, window, first_len, mean] = &row[..] else {
            panic!("bench/workload.md: size row {row:?} has not four cells");
        };
        let size = size_class(name);
        assert_eq!(size.name(), name);
        assert_eq!(size.window().to_string(), *window, "{row:?}");
        let first = TaskState::new(0, size).canonical();
        assert_eq!(first.len().to_string(), *first_len, "{row:?}");
        let iterations = size.iterations(1).unwrap();
        let ours = mean_canonical_bytes(size, iterations).round() as u64;
        assert_eq!(ours.to_string(), *mean, "{row:?}");
    }
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
    serde_json::from_slice(&state_at(task, size, iterations).canonical()).unwrap()
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
    assert_eq!(last, state_at(0, SizeClass::K1, 1999).canonical());
}

#[test]
fn the_append_reference_appends_the_canonical_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (line, queue) = bench(dir.path(), &["--size", "1k", "--raw", "append"]);
    assert_line(&line, "append", "durable", "1k", 1, 2000);
    let log = std::fs::read(queue.join("incremental/task-0000.log")).unwrap();
    let expected: Vec<u8> = (0..2000)
        .flat_map(|iteration| state_at(0, SizeClass::K1, iteration).canonical())
        .collect();
    assert_eq!(log, expected);
}

#[test]
fn both_commit_paths_write_checkpoints_that_cairn_checkpoint_decodes() {
    let dir = tempfile::tempdir().unwrap();
    for path in ["log", "replace"] {
        let (line, queue) = bench(dir.path(), &["--size", "64k", "--commit-path", path]);
        assert_line(&line, "cairn", "durable", "64k", 1, 500);
        assert_eq!(line["commit"], path, "{line}");
        let checkpoint = decoded(&queue, "task-0000");
        assert_eq!(
            checkpoint["partial_results"],
            state_after(0, SizeClass::K64, 499)
        );
    }
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

/// `cairn bench checkpoint` in `dir` with the default `--dir` (`bench/.data` there), keeping
/// nothing.
fn bench_in(dir: &Path, args: &[&str]) {
    let output = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .current_dir(dir)
        .args(["bench", "checkpoint"])
        .args(args)
        .output()
        .expect("cairn runs");
    assert!(
        output.status.success(),
        "cairn bench checkpoint {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The entries of `dir`, by name.
fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// A run that keeps nothing leaves nothing: not even the `bench/.data` it made for its run
/// directory (it used to stay behind, empty, in the current directory).
#[test]
fn a_run_that_keeps_nothing_leaves_no_directory_behind() {
    let cwd = tempfile::tempdir().unwrap();
    bench_in(cwd.path(), &["--size", "1k", "--conc", "100"]);
    assert_eq!(entries(cwd.path()), Vec::<String>::new());
    // A directory that was there before stays.
    std::fs::create_dir_all(cwd.path().join("bench/.data")).unwrap();
    bench_in(cwd.path(), &["--size", "1k", "--conc", "100"]);
    assert_eq!(entries(&cwd.path().join("bench")), [".data"]);
    assert_eq!(
        entries(&cwd.path().join("bench/.data")),
        Vec::<String>::new()
    );
}

/// The same with `--db`, whose run directory holds only the host's side of the shared queue.
#[test]
fn a_run_on_the_database_leaves_no_directory_behind() {
    let test = "a_run_on_the_database_leaves_no_directory_behind";
    let Some(cluster) = crate::common::postgres::PgCluster::start(test) else {
        return;
    };
    let url = cluster.create_database("cairn_bench");
    let cwd = tempfile::tempdir().unwrap();
    bench_in(cwd.path(), &["--db", &url, "--size", "1k", "--conc", "100"]);
    assert_eq!(entries(cwd.path()), Vec::<String>::new());
}
