//! `cairn bench queue` at tiny sizes: every measurement runs the real daemon and prints one
//! JSON line with the fields it promises, counts as asked and plausible figures. No timing is
//! asserted: speed is what the benchmark reports, not what a test checks.

use std::process::Command;

use serde_json::Value;

/// Run the benchmark with tiny sizes in a temp directory; returns its result lines.
fn run_bench(dir: &std::path::Path) -> Vec<Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args([
            "bench",
            "queue",
            "--tasks",
            "20",
            "--paced-tasks",
            "5",
            "--pace",
            "5ms",
            "--loop-iterations",
            "10",
            "--resume-tasks",
            "20",
            "--side-by-side-tasks",
            "10",
            "--running-tasks",
            "20",
            "--dir",
        ])
        .arg(dir)
        .output()
        .expect("running cairn bench queue");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "cairn bench queue failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
        .collect()
}

/// The number at `field`, which must be there.
fn num(line: &Value, field: &str) -> f64 {
    line[field]
        .as_f64()
        .unwrap_or_else(|| panic!("no number {field:?} in {line}"))
}

#[test]
fn every_measurement_prints_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let lines = run_bench(dir.path());
    let whats: Vec<&str> = lines.iter().map(|l| l["what"].as_str().unwrap()).collect();
    assert_eq!(
        whats,
        [
            "throughput",
            "pickup",
            "loop",
            "loop",
            "side_by_side",
            "side_by_side",
            "resume",
            "running"
        ]
    );
    assert!(lines.iter().all(|l| l["bench"] == "queue"));
    // pueue's line says why it was skipped when pueue is not installed.
    for line in lines.iter().filter(|l| l.get("skipped").is_none()) {
        assert!(num(line, "peak_rss_mib") > 0.0, "{line}");
    }

    let throughput = &lines[0];
    assert_eq!(throughput["tasks"], 20);
    assert_eq!(throughput["max_tasks"], 4);
    assert_eq!(throughput["command"], "true");
    assert!(num(throughput, "seconds") > 0.0 && num(throughput, "tasks_s") > 0.0);
    assert!(num(throughput, "pickup_p50_ms") > 0.0);
    assert!(num(throughput, "pickup_p99_ms") >= num(throughput, "pickup_p50_ms"));

    // Each task's pickup comes after its acceptance and before it is done, so the
    // percentiles keep that order.
    let pickup = &lines[1];
    assert_eq!(pickup["tasks"], 5);
    assert!(num(pickup, "accept_p50_ms") > 0.0);
    assert!(num(pickup, "accept_p99_ms") >= num(pickup, "accept_p50_ms"));
    assert!(num(pickup, "pickup_p50_ms") >= num(pickup, "accept_p50_ms"));
    assert!(num(pickup, "pickup_p99_ms") >= num(pickup, "pickup_p50_ms"));
    assert!(num(pickup, "pickup_max_ms") >= num(pickup, "pickup_p99_ms"));
    assert!(num(pickup, "done_p50_ms") >= num(pickup, "pickup_p50_ms"));

    let every: Vec<u64> = lines[2..4]
        .iter()
        .map(|l| l["checkpoint_every"].as_u64().unwrap())
        .collect();
    assert_eq!(every, [1, 10]);
    for line in &lines[2..4] {
        assert_eq!(line["iterations"], 10);
        assert_eq!(line["command"], "echo {}");
        let (per_iteration, command) = (num(line, "per_iteration_ms"), num(line, "command_ms"));
        assert!(per_iteration > 0.0 && command > 0.0, "{line}");
        // The overhead is the difference of the two (each rounded to 4 decimals).
        assert!(
            (num(line, "overhead_ms") - (per_iteration - command)).abs() < 0.001,
            "{line}"
        );
    }

    let (cairn, peer) = (&lines[4], &lines[5]);
    assert_eq!(cairn["impl"], "cairn");
    assert_eq!(cairn["tasks"], 10);
    assert!(num(cairn, "tasks_s") > 0.0, "{cairn}");
    assert_eq!(peer["impl"], "pueue");
    if peer.get("skipped").is_none() {
        assert_eq!(peer["tasks"], 10);
        assert_eq!(peer["max_tasks"], 4);
        assert!(num(peer, "tasks_s") > 0.0, "{peer}");
    }

    let resume = &lines[6];
    assert_eq!(resume["tasks"], 20);
    assert_eq!(resume["max_tasks"], 20);
    assert!(num(resume, "current_work_bytes") > 0.0);
    assert!(num(resume, "ready_ms") > 0.0);
    assert!(num(resume, "first_resumed_ms") > 0.0);
    assert!(num(resume, "all_resumed_ms") >= num(resume, "first_resumed_ms"));
    assert!(num(resume, "all_done_ms") >= num(resume, "all_resumed_ms"));
    assert!(num(resume, "commands_alone_ms") > 0.0);
    let beyond = num(resume, "all_done_ms") - num(resume, "commands_alone_ms");
    assert!(
        (num(resume, "beyond_commands_ms") - beyond).abs() < 0.01,
        "{resume}"
    );

    // All twenty commands ran at once: nothing here limits twenty.
    let running = &lines[7];
    assert_eq!(running["tasks"], 20);
    assert_eq!(running["command"], "sleep 3600");
    assert_eq!(running["running_at_once"], 20, "{running}");
    assert!(num(running, "all_running_ms") > 0.0, "{running}");
    assert!(num(running, "open_files_limit") >= 40.0, "{running}");

    // Without --keep, the run's queues are removed.
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "the run left {left:?}");
}

/// `--db`: the intake, pickup and resume figures on a shared queue, each task run by the real
/// daemon on PostgreSQL (the resumed ones checked by the bench to have resumed from their
/// checkpoints), and nothing of the bench's left in the database afterwards.
#[test]
fn on_a_database_intake_pickup_and_resume_print_their_lines_and_leave_no_task() {
    let test = "on_a_database_intake_pickup_and_resume_print_their_lines_and_leave_no_task";
    let Some(cluster) = crate::common::postgres::PgCluster::start(test) else {
        return;
    };
    let url = cluster.create_database("cairn_bench");
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args([
            "bench",
            "queue",
            "--db",
            &url,
            "--tasks",
            "20",
            "--paced-tasks",
            "3",
            "--pace",
            "5ms",
            "--resume-tasks",
            "20",
            "--dir",
        ])
        .arg(dir.path())
        .output()
        .expect("running cairn bench queue --db");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "cairn bench queue --db failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
        .collect();
    let whats: Vec<&str> = lines.iter().map(|l| l["what"].as_str().unwrap()).collect();
    assert_eq!(whats, ["throughput", "pickup", "resume"]);
    for line in &lines {
        assert_eq!(line["impl"], "cairn-postgres", "{line}");
        assert!(num(line, "peak_rss_mib") > 0.0, "{line}");
    }
    assert_eq!(lines[0]["tasks"], 20);
    assert!(num(&lines[0], "tasks_s") > 0.0, "{}", lines[0]);
    assert_eq!(lines[1]["tasks"], 3);
    let pickup = &lines[1];
    assert!(
        num(pickup, "accept_p50_ms") <= num(pickup, "pickup_p50_ms")
            && num(pickup, "pickup_p50_ms") <= num(pickup, "done_p50_ms"),
        "accepted, then started, then done: {pickup}"
    );
    let resume = &lines[2];
    assert_eq!(resume["tasks"], 20);
    assert!(
        num(resume, "first_resumed_ms") <= num(resume, "all_resumed_ms")
            && num(resume, "all_resumed_ms") <= num(resume, "all_done_ms"),
        "{resume}"
    );

    let empty = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(connection);
            let row = client
                .query_one(
                    "SELECT (SELECT count(*) FROM cairn_tasks), (SELECT count(*) FROM cairn_nodes)",
                    &[],
                )
                .await
                .unwrap();
            (row.get::<_, i64>(0), row.get::<_, i64>(1))
        });
    assert_eq!(empty, (0, 0), "the bench removed its tasks and nodes");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "and its run directory"
    );
}
