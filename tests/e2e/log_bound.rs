//! A phase's log is bounded (`cairn run --max-log-bytes`): past the bound it keeps its head
//! and its tail, with a note of what was cut.

use serde_json::json;

use crate::common::*;

/// A command that writes 40 MiB on stderr leaves a log of about the bound: its first and last
/// halves, with a note of what was cut between them.
#[test]
fn a_phase_log_past_its_bound_keeps_its_head_and_tail() {
    let queue = TestQueue::new();
    let script = "i=0; while [ $i -lt 40 ]; do \
                  printf 'chunk %02d\\n' $i >&2; head -c 1048576 /dev/zero | tr '\\0' x >&2; \
                  echo >&2; i=$((i+1)); done; echo 'the last line' >&2; echo '{}'";
    queue.seed_task(
        "noisy.json",
        &json!({"id": "noisy", "phases": [{"name": "noise", "run": ["sh", "-c", script]}]}),
    );
    queue.run_until_idle(&["--max-log-bytes", "1MiB"]);
    queue.wait_done("noisy");
    let log = std::fs::read(queue.path("runs/noisy/0-noise.log")).unwrap();
    assert!(
        log.len() <= (1 << 20) + 2 * 65536,
        "the log is {} bytes",
        log.len()
    );
    let text = String::from_utf8_lossy(&log);
    assert!(text.contains("chunk 00"), "the head is gone");
    assert!(
        text.trim_end().ends_with("the last line"),
        "the tail is gone"
    );
    let note = text
        .lines()
        .find(|l| l.starts_with("[cairn: "))
        .expect("a note of the cut");
    let cut: u64 = note["[cairn: ".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(cut >= 38 << 20, "{note}");
}
