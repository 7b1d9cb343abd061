//! Runs the worker helpers' own test suites: `clients/python` (unittest) and `clients/sh`
//! (a POSIX sh script). Both use a real FIFO as the channel and a real SIGTERM.

use std::path::Path;
use std::process::Command;

/// Run `program args` in `dir` (relative to the crate root); fail with its output unless it exits 0.
fn run_suite(dir: &str, program: &str, args: &[&str]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let result = Command::new(program)
        .args(args)
        .current_dir(root.join(dir))
        .env("PYTHONDONTWRITEBYTECODE", "1") // no __pycache__ in the source tree
        .env_remove("CAIRN_CHANNEL")
        .env_remove("CAIRN_RESUME")
        .env_remove("CAIRN_DEBUG")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program} (needed by this test): {e}"));
    assert!(
        result.status.success(),
        "`{program} {}` in {dir} failed with {}\n--- stdout:\n{}\n--- stderr:\n{}",
        args.join(" "),
        result.status,
        String::from_utf8_lossy(&result.stdout),
        String::from_utf8_lossy(&result.stderr),
    );
}

#[test]
fn python_helper() {
    run_suite("clients/python", "python3", &["-m", "unittest"]);
}

#[test]
fn shell_helper() {
    run_suite(".", "sh", &["clients/sh/test_cairn.sh"]);
}
