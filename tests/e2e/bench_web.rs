//! `cairn bench web` at a tiny size: it runs the real daemon with --listen and prints one JSON
//! line with the figures it promises, the throughput runs with the listener off and on
//! included (off, on and idle, on and polled). No timing is asserted.

use std::process::Command;

use serde_json::Value;

#[test]
fn bench_web_prints_the_first_screen_and_metrics_latencies() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["bench", "web", "--tasks", "30", "--rounds", "2"])
        .args(["--iterations", "20", "--turns", "1", "--dir"])
        .arg(dir.path())
        .output()
        .expect("running cairn bench web");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "cairn bench web failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let line: Value = serde_json::from_str(stdout.trim()).expect("one JSON line");
    assert_eq!(line["bench"], "web");
    assert_eq!(line["tasks"], 30);
    assert_eq!(line["rounds"], 2);
    for field in [
        "first_screen_ms_p50",
        "first_screen_ms_max",
        "metrics_ms_p50",
        "metrics_ms_max",
        "status_document_ms_p50",
        "task_page_ms_p50",
        "status_cli_ms",
    ] {
        assert!(
            line[field].as_f64().is_some_and(|ms| ms > 0.0),
            "{field}: {line}"
        );
    }
    let throughput = &line["throughput"];
    assert_eq!(throughput["iterations"], 20, "{line}");
    for side in ["listener_off", "listener_on", "polled"] {
        let rates = &throughput[format!("checkpoints_per_s_{side}")];
        assert!(
            rates
                .as_array()
                .is_some_and(|r| r.len() == 1 && r[0].as_f64() > Some(0.0)),
            "{side}: {line}"
        );
    }
    assert!(
        line["status_bytes"].as_u64().is_some_and(|b| b > 30 * 50),
        "{line}"
    );
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "the run directory was left behind");
}
