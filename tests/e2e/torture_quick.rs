//! The kill-torture runner (`examples/torture.rs`) in its quick setting: five kills of the real
//! daemon over a mixed workload, every check of the soak. The soak itself is
//! `cargo run --release --example torture -- --kills 1000`.

use std::process::Command;

use crate::common::*;

#[test]
fn five_kills_of_a_mixed_workload_lose_and_repeat_nothing_beyond_what_they_allow() {
    let output = Command::new(example_binary("torture"))
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
