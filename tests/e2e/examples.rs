//! The library examples as a user meets them: the README quotes `examples/embed/src/main.rs`
//! whole, it
//! runs in a directory of its own, and `examples/checkpoint_loop.rs` run again after it finished
//! writes no new generation; the README states the default retry policy the code has.

use std::path::Path;
use std::process::{Command, Output};

use crate::common::example_binary;

fn run_in(binary: &Path, dir: &Path, args: &[&str]) -> String {
    let output: Output = Command::new(binary)
        .args(args)
        .current_dir(dir)
        .output()
        .expect("running an example");
    assert!(
        output.status.success(),
        "{} exited with {}: {}",
        binary.display(),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn the_readme_quotes_the_embedding_example_whole() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let source = std::fs::read_to_string(root.join("examples/embed/src/main.rs")).unwrap();
    let program = &source[source.find("use cairn").expect("the example uses cairn")..];
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let quoted = readme
        .split_once("## Embedding the library")
        .and_then(|(_, rest)| rest.split_once("```rust\n"))
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("README has a rust block under 'Embedding the library'")
        .0;
    assert_eq!(
        quoted, program,
        "README's snippet differs from examples/embed/src/main.rs"
    );
}

#[test]
fn the_embedding_example_uses_its_own_directory_and_a_second_run_runs_nothing() {
    let binary = example_binary("embed");
    let dir = tempfile::tempdir().unwrap();
    let first = run_in(&binary, dir.path(), &[]);
    assert_eq!(first.trim(), "total 4950 (started at iteration 0)");
    assert_eq!(names(dir.path()), ["my-job-checkpoints"]);
    let incremental = dir.path().join("my-job-checkpoints/incremental");
    let files = names(&incremental);
    let second = run_in(&binary, dir.path(), &[]);
    assert_eq!(second.trim(), "total 4950 (started at iteration 100)");
    assert_eq!(names(&incremental), files);
}

#[test]
fn rerunning_a_finished_checkpoint_loop_writes_no_new_generation() {
    let binary = example_binary("checkpoint_loop");
    let dir = tempfile::tempdir().unwrap();
    let queue = dir.path().join("loop");
    let queue_arg = queue.to_str().unwrap();
    let first = run_in(&binary, dir.path(), &[queue_arg, "3"]);
    assert!(first.contains("sum of 1..=3 = 6"), "{first}");
    let latest = queue.join("incremental/checkpoint-loop-example.json.gz");
    let before = (
        names(&queue.join("incremental")),
        std::fs::read(&latest).unwrap(),
    );
    for _ in 0..2 {
        let again = run_in(&binary, dir.path(), &[queue_arg, "3"]);
        assert!(
            again.contains("already finished: sum of 1..=3 = 6"),
            "{again}"
        );
    }
    let after = (
        names(&queue.join("incremental")),
        std::fs::read(&latest).unwrap(),
    );
    assert_eq!(before, after, "a rerun changed the checkpoints");
}

#[test]
fn the_task_reference_states_the_default_retry_policy() {
    use cairn::task::RetryPolicy;
    let reference =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/tasks.md"))
            .unwrap();
    let stated = reference
        .split_once("the default is\n  `")
        .and_then(|(_, rest)| rest.split_once('`'))
        .expect("docs/tasks.md states the default retry policy")
        .0;
    let stated: RetryPolicy = serde_json::from_str(stated).unwrap();
    assert_eq!(stated, RetryPolicy::default());
    assert_eq!(
        stated.delay_after(2),
        2 * stated.backoff,
        "docs/tasks.md: the third attempt waits twice the backoff"
    );
}

/// A program that embeds the library with `default-features = false` (as the README says)
/// compiles none of the command line's crates.
#[test]
fn the_library_without_default_features_depends_on_no_cli_crate() {
    let output = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "--no-default-features",
            "--edges",
            "normal",
        ])
        .args(["--prefix", "none", "--format", "{p}"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("running cargo tree");
    assert!(
        output.status.success(),
        "cargo tree: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let tree = String::from_utf8_lossy(&output.stdout);
    let crates: Vec<&str> = tree.lines().filter_map(|l| l.split(' ').next()).collect();
    assert!(crates.contains(&"cairn"), "{tree}");
    for cli_crate in [
        "clap",
        "clap_complete",
        "indicatif",
        "signal-hook",
        "signal-hook-tokio",
        "tracing-journald",
        "tracing-subscriber",
    ] {
        assert!(!crates.contains(&cli_crate), "{cli_crate} is built: {tree}");
    }
}
