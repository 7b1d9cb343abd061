//! `cairn run --listen`: a real Prometheus scrapes the daemon's `/metrics`, and what its query
//! API returns agrees with `cairn status --json`; `/healthz` turns unhealthy while the main loop
//! stalls on a frozen file system, and healthy again once it thaws.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::http::{free_port, get};
use crate::common::*;

/// A process this test started, killed (and reaped) when the test ends, however it ends.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_prometheus(
    queue: &TestQueue,
    prometheus: &Path,
    target: SocketAddr,
) -> (KillOnDrop, SocketAddr) {
    let config = queue.aux("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: cairn\n    static_configs:\n      - targets: ['{target}']\n"
        ),
    )
    .expect("writing prometheus.yml");
    let api: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let log = std::fs::File::create(queue.aux("prometheus.log")).expect("prometheus.log");
    let child = Command::new(prometheus)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            queue.aux("prometheus-data").display()
        ))
        .arg(format!("--web.listen-address={api}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("starting prometheus");
    (KillOnDrop(child), api)
}

/// The value of the one series `query` selects, as Prometheus answers it now.
fn prometheus_value(api: SocketAddr, query: &str) -> Option<f64> {
    let encoded: String = query
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect();
    let answer = get(api, &format!("/api/v1/query?query={encoded}"))?;
    let document: Value = serde_json::from_str(&answer.body).ok()?;
    let result = document["data"]["result"].as_array()?;
    if result.len() != 1 {
        return None;
    }
    result[0]["value"][1].as_str()?.parse().ok()
}

/// `cairn status --json`'s tasks counted by state.
fn status_counts(queue: &TestQueue) -> std::collections::BTreeMap<String, u64> {
    let output = queue.cairn_output(&["status", "--json"], b"");
    let document: Value = serde_json::from_slice(&output.stdout).expect("status --json");
    let mut counts = std::collections::BTreeMap::new();
    for task in document["tasks"].as_array().expect("tasks") {
        *counts
            .entry(task["state"].as_str().unwrap().to_string())
            .or_insert(0) += 1;
    }
    counts
}

#[test]
fn prometheus_scrapes_the_daemon_and_its_series_match_cairn_status() {
    let Some(prometheus) = require_tool(
        "prometheus_scrapes_the_daemon_and_its_series_match_cairn_status",
        "prometheus",
        "prometheus",
    ) else {
        return;
    };
    let queue = TestQueue::new();
    for id in ["ok1", "ok2"] {
        queue.seed_task(
            &format!("{id}.json"),
            &loop_task(id, &queue.aux(&format!("{id}.side")), 2, 0.0),
        );
    }
    queue.seed_task(
        "bad.json",
        &json!({"id": "bad", "retry": {"max_attempts": 1}, "phases": [{"name": "fail", "run": ["false"]}]}),
    );
    let listen: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut daemon = queue.start(&["--max-tasks", "1", "--listen", &listen.to_string()]);
    queue.wait_done("ok1");
    queue.wait_done("ok2");
    queue.wait_failed("bad");
    assert!(
        daemon
            .stderr()
            .contains(&format!("listening on http://{listen}/ (loopback only")),
        "{}",
        daemon.stderr()
    );
    // One task running for good, one waiting behind it (one slot).
    queue.drop_task(
        "long.json",
        &loop_task("long", &queue.aux("long.side"), 1_000_000, 0.2),
    );
    wait_until("long runs", DEADLINE, || {
        queue
            .active_entry("long")
            .is_some_and(|e| e["status"] == "running")
    });
    queue.drop_task(
        "waiting.json",
        &loop_task("waiting", &queue.aux("w.side"), 2, 0.0),
    );
    wait_until("waiting is pending", DEADLINE, || {
        status_counts(&queue).get("pending") == Some(&1)
    });
    assert_eq!(get(listen, "/readyz").map(|a| a.status), Some(200));
    assert_eq!(get(listen, "/healthz").map(|a| a.status), Some(200));

    let (_prometheus, api) = start_prometheus(&queue, &prometheus, listen);
    let series = [
        ("running", "cairn_tasks{state=\"running\"}"),
        ("pending", "cairn_tasks{state=\"pending\"}"),
        ("paused", "cairn_tasks{state=\"paused\"}"),
        ("done", "cairn_tasks_finished_total{status=\"done\"}"),
        ("failed", "cairn_tasks_finished_total{status=\"failed\"}"),
    ];
    let mut last = String::new();
    wait_until(
        "Prometheus's series agree with cairn status --json",
        DEADLINE,
        || {
            let counts = status_counts(&queue);
            let pairs: Vec<(u64, Option<f64>)> = series
                .iter()
                .map(|(state, query)| {
                    (
                        *counts.get(*state).unwrap_or(&0),
                        prometheus_value(api, query),
                    )
                })
                .collect();
            last = format!("{pairs:?}");
            pairs.iter().all(|(want, got)| *got == Some(*want as f64))
        },
    );
    assert!(last.contains("(1, Some(1.0))"), "{last}");
    // The exposition parsed: the target is up with no scrape error.
    let targets = get(api, "/api/v1/targets").expect("prometheus targets");
    let targets: Value = serde_json::from_str(&targets.body).unwrap();
    let target = &targets["data"]["activeTargets"][0];
    assert_eq!(target["health"], "up", "{target}");
    assert_eq!(target["lastError"], "", "{target}");
    // Counts only: no series names a task.
    let answer = get(listen, "/metrics").expect("/metrics");
    assert!(
        answer
            .header("content-type")
            .is_some_and(|t| t.starts_with("application/openmetrics-text")),
        "{answer:?}"
    );
    let exposition = answer.body;
    for id in ["ok1", "ok2", "bad", "long", "waiting"] {
        assert!(!exposition.contains(&format!("\"{id}\"")), "{exposition}");
    }
    assert!(
        exposition.contains("cairn_checkpoints_total"),
        "{exposition}"
    );
    assert!(
        exposition.contains("cairn_build_info{version="),
        "{exposition}"
    );
    daemon.signal(SIGTERM);
    daemon.wait_exit(DEADLINE);
}

/// A loop-mounted ext4 file system, frozen and thawed with `fsfreeze`; thawed, unmounted and
/// its image removed when the test ends, however it ends.
struct FreezableMount {
    mount: std::path::PathBuf,
    image: std::path::PathBuf,
}

impl FreezableMount {
    fn new(queue: &TestQueue) -> FreezableMount {
        let image = queue.aux("fs.img");
        let mount = queue.aux("mnt");
        std::fs::create_dir_all(&mount).unwrap();
        let run = |program: &str, args: &[&std::ffi::OsStr]| {
            let status = Command::new(program).args(args).status().expect(program);
            assert!(status.success(), "{program} {args:?} failed");
        };
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(64 << 20))
            .expect("the image");
        run("mkfs.ext4", &["-q".as_ref(), image.as_os_str()]);
        run(
            "mount",
            &[
                "-o".as_ref(),
                "loop".as_ref(),
                image.as_os_str(),
                mount.as_os_str(),
            ],
        );
        FreezableMount { mount, image }
    }

    /// Freeze the file system until the guard is dropped. Declared after the daemon, the guard
    /// thaws first when a test fails: a process waiting on a frozen file system cannot exit,
    /// not even on SIGKILL, until it thaws.
    fn freeze(&self) -> Frozen<'_> {
        fsfreeze("-f", &self.mount);
        Frozen(self)
    }
}

fn fsfreeze(flag: &str, mount: &Path) {
    let status = Command::new("fsfreeze")
        .arg(flag)
        .arg(mount)
        .status()
        .expect("fsfreeze");
    assert!(status.success(), "fsfreeze {flag} failed");
}

/// The file system frozen; thawed when dropped.
struct Frozen<'a>(&'a FreezableMount);

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        let _ = Command::new("fsfreeze")
            .arg("-u")
            .arg(&self.0.mount)
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for FreezableMount {
    fn drop(&mut self) {
        let _ = Command::new("fsfreeze")
            .arg("-u")
            .arg(&self.mount)
            .stderr(Stdio::null())
            .status();
        // The commands of a killed daemon may still be leaving the file system for a moment.
        let deadline = std::time::Instant::now() + DEADLINE;
        let unmounted = loop {
            let status = Command::new("umount")
                .arg(&self.mount)
                .stderr(Stdio::null())
                .status();
            if status.is_ok_and(|s| s.success()) {
                break true;
            }
            if std::time::Instant::now() >= deadline {
                break false;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        if !unmounted {
            let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
        }
        let _ = std::fs::remove_file(&self.image);
    }
}

#[test]
fn healthz_is_unhealthy_while_the_main_loop_stalls_on_a_frozen_file_system() {
    let test = "healthz_is_unhealthy_while_the_main_loop_stalls_on_a_frozen_file_system";
    if !require_root(test, "it mounts a loop file system and freezes it")
        || require_tool(test, "fsfreeze", "util-linux").is_none()
        || require_tool(test, "mkfs.ext4", "e2fsprogs").is_none()
    {
        return;
    }
    let outer = TestQueue::new();
    let mount = FreezableMount::new(&outer);
    let root = mount.mount.join("queue");
    std::fs::create_dir_all(root.join("inbox")).unwrap();
    let task = loop_task("long", &outer.aux("long.side"), 1_000_000, 0.2);
    std::fs::write(root.join("inbox/long.json"), task.to_string()).unwrap();
    let listen: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    // systemd's watchdog of 3 s, as a unit with WatchdogSec=3s would set it.
    let stderr_path = outer.aux("daemon.stderr");
    let stderr = std::fs::File::create(&stderr_path).unwrap();
    let daemon = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .arg("--queue")
        .arg(&root)
        .args(["run", "--listen", &listen.to_string()])
        .env("WATCHDOG_USEC", "3000000")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("starting cairn run");
    let daemon = KillOnDrop(daemon);
    let answer = |path: &str| get(listen, path).map(|a| (a.status, a.body));
    wait_until("the daemon is ready and its loop turns", DEADLINE, || {
        answer("/readyz").is_some_and(|(s, _)| s == 200)
            && answer("/healthz").is_some_and(|(s, _)| s == 200)
            && work_entry(&root, "long").is_some_and(|e| e["status"] == "running")
    });

    let frozen = mount.freeze();
    // The loop waits on a write that the frozen file system holds; the listener still answers.
    let mut last = None;
    wait_until("/healthz reports the stall", DEADLINE, || {
        last = answer("/healthz");
        last.as_ref().is_some_and(|(s, _)| *s == 503)
    });
    let (_, body) = last.unwrap();
    assert!(body.contains("has not turned for"), "{body}");
    drop(frozen);
    wait_until("/healthz is healthy again after the thaw", DEADLINE, || {
        answer("/healthz").is_some_and(|(s, _)| s == 200)
    });
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(daemon.0.id() as i32), SIGTERM).unwrap();
    let mut daemon = daemon;
    wait_until("the daemon exits", DEADLINE, || {
        daemon.0.try_wait().ok().flatten().is_some()
    });
    let _ = std::fs::read_to_string(&stderr_path);
}
