//! The kill-torture runner (`examples/torture.rs`) in its quick setting: five kills of the real
//! daemon over a mixed workload, every check of the soak. The soak itself is
//! `cargo run --release --example torture -- --kills 1000`.

use std::path::PathBuf;
use std::process::Command;

/// The example's binary, built first (`cargo test --test e2e` alone does not build
/// the examples) into `target/<profile>/examples/`, beside the `deps/` directory this test
/// runs from.
fn torture_binary() -> PathBuf {
    let mut build = Command::new(env!("CARGO"));
    build.args(["build", "--quiet", "--example", "torture"]);
    if !cfg!(debug_assertions) {
        build.arg("--release"); // the same profile as this test, so the same target directory
    }
    let status = build
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("running cargo build --example torture");
    assert!(status.success(), "cargo build --example torture: {status}");
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test binary lives in target/<profile>/deps");
    let examples = profile_dir.join("examples");
    let plain = examples.join("torture");
    if plain.exists() {
        return plain;
    }
    // Only the hashed name (`torture-<hash>`): take the newest.
    std::fs::read_dir(&examples)
        .expect("target/<profile>/examples exists")
        .filter_map(|e| e.ok())
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with("torture-") && !name.contains('.')
        })
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
        .map(|e| e.path())
        .expect("the torture example is built (cargo test builds the examples)")
}

#[test]
fn five_kills_of_a_mixed_workload_lose_and_repeat_nothing_beyond_what_they_allow() {
    let output = Command::new(torture_binary())
        .args(["--kills", "5", "--cairn", env!("CARGO_BIN_EXE_cairn")])
        .output()
        .expect("running the torture example");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the torture runner exited with {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    let summary = stdout
        .lines()
        .find(|line| line.starts_with("torture: ok:"))
        .unwrap_or_else(|| panic!("no summary line in:\n{stdout}\nstderr:\n{stderr}"));
    assert!(summary.contains("kills 5 ("), "{summary}");
    for figure in ["tasks ", "iterations run ", "re-runs ", "seconds "] {
        assert!(
            summary.contains(figure),
            "{figure:?} missing from {summary}"
        );
    }
}
