//! cairn under a service manager, with the real binary: the sd_notify messages a datagram
//! socket receives (READY, WATCHDOG while a task runs, STOPPING on SIGTERM), logs fit for the
//! journal, and the multi-user queue checks (a queue writable by others is refused; a task file
//! owned by someone outside the inbox's group is rejected).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

/// Everything the daemon sent to the socket until `until` matched or the deadline passed.
fn receive_until(
    socket: &UnixDatagram,
    until: impl Fn(&str) -> bool,
    deadline: Duration,
) -> Vec<String> {
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let start = Instant::now();
    let mut messages = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    while start.elapsed() < deadline {
        if let Ok(n) = socket.recv(&mut buf) {
            let message = String::from_utf8_lossy(&buf[..n]).to_string();
            let done = until(&message);
            messages.push(message);
            if done {
                break;
            }
        }
    }
    messages
}

#[test]
fn notifies_ready_watchdog_and_stopping() {
    let queue = TestQueue::new();
    let side = queue.aux("loop.side");
    queue.seed_task("svc.json", &loop_task("svc", &side, 30, 0.2));
    let socket_path = queue.aux("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();

    let stderr = std::fs::File::create(queue.aux("daemon.stderr")).unwrap();
    let mut daemon = queue
        .cairn()
        .args(["run", "--stop-grace", "10s"])
        .env("NOTIFY_SOCKET", &socket_path)
        .env("WATCHDOG_USEC", "1000000")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();

    let early = receive_until(&socket, |m| m.contains("READY=1"), DEADLINE);
    assert!(
        early.iter().any(|m| m.contains("READY=1")),
        "no READY=1: {early:?}"
    );
    wait_until("a few iterations", DEADLINE, || {
        ended_iterations(&side).len() >= 2
    });
    // Pings keep coming while the task runs (every half watchdog period, 0.5 s here): three of
    // them. How soon is the busy machine's business; the deadline only catches pings that stop.
    let window = Instant::now();
    let mut pings = 0;
    let mut statuses = Vec::new();
    while pings < 3 && window.elapsed() < DEADLINE {
        for m in receive_until(&socket, |_| true, Duration::from_millis(300)) {
            pings += m.lines().filter(|l| *l == "WATCHDOG=1").count();
            statuses.extend(
                m.lines()
                    .filter(|l| l.starts_with("STATUS="))
                    .map(str::to_string),
            );
        }
    }
    assert!(
        pings >= 3,
        "only {pings} WATCHDOG=1 in {:?}",
        window.elapsed()
    );
    assert!(
        ended_iterations(&side).len() < 30,
        "the task finished before the pings were counted"
    );
    let status = statuses.last().cloned().unwrap_or_default();
    assert!(
        status.is_empty() || status.contains("running 1"),
        "{status}"
    );

    nix::sys::signal::kill(nix::unistd::Pid::from_raw(daemon.id() as i32), SIGTERM).unwrap();
    let stopping = receive_until(&socket, |m| m.contains("STOPPING=1"), DEADLINE);
    let stop_message = stopping
        .iter()
        .find(|m| m.contains("STOPPING=1"))
        .unwrap_or_else(|| panic!("no STOPPING=1: {stopping:?}"));
    assert!(
        stop_message.contains("EXTEND_TIMEOUT_USEC="),
        "{stop_message}"
    );
    let status = daemon.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    // It flushed: the checkpoint holds every iteration that ended.
    assert_eq!(
        queue.checkpoint("svc").iteration_count,
        ended_iterations(&side).len() as u64
    );
    // The task's journal tells the stop.
    let journal = std::fs::read_to_string(queue.path("runs/svc/events.jsonl")).unwrap();
    for event in ["stop_requested", "interrupted", "checkpoint"] {
        assert!(
            journal.contains(&format!("\"event\":\"{event}\"")),
            "no {event} in the journal:\n{journal}"
        );
    }
    // Commands never see the notification socket.
    let log = std::fs::read_to_string(queue.path("runs/svc/0-count.log")).unwrap_or_default();
    assert!(!log.contains("NOTIFY_SOCKET"), "{log}");
}

#[test]
fn logs_without_timestamps_when_stderr_is_the_journal() {
    let queue = TestQueue::new();
    queue.seed_task(
        "quick.json",
        &once_task("quick", &serde_json::json!({"ok": true})),
    );
    let stderr_path = queue.aux("journal-like.stderr");
    let stderr = std::fs::File::create(&stderr_path).unwrap();
    let meta = stderr.metadata().unwrap();
    let status = queue
        .cairn()
        .args(["run", "--exit-when-idle"])
        .env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()))
        .stderr(stderr)
        .status()
        .unwrap();
    assert!(status.success());
    let text = std::fs::read_to_string(&stderr_path).unwrap();
    let journald_here = std::path::Path::new("/run/systemd/journal/socket").exists();
    if !journald_here {
        assert!(text.contains("cairn daemon started"), "{text}");
    }
    for line in text.lines() {
        assert!(
            !line.starts_with(|c: char| c.is_ascii_digit()),
            "a timestamp in a journal line: {line}"
        );
        assert!(
            !line.contains('\u{1b}'),
            "colour codes in a journal line: {line:?}"
        );
    }
}

#[test]
fn a_queue_writable_by_others_is_refused() {
    for (dir, mode, what) in [
        ("inbox", 0o777, "writable by every user"),
        ("tasks", 0o775, "writable by the group"),
        ("", 0o777, "writable by every user"),
    ] {
        let queue = TestQueue::new();
        std::fs::create_dir_all(queue.path("inbox")).unwrap();
        let output = queue.cairn_output(&["run", "--exit-when-idle"], b"");
        assert_eq!(
            output.status.code(),
            Some(0),
            "a fresh queue must be accepted"
        );
        let target = if dir.is_empty() {
            queue.root().to_path_buf()
        } else {
            queue.path(dir)
        };
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(mode)).unwrap();
        let output = queue.cairn_output(&["run", "--exit-when-idle"], b"");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(5), "{dir:?} {mode:o}: {stderr}");
        assert!(stderr.contains(what), "{stderr}");
        assert!(stderr.contains(&target.display().to_string()), "{stderr}");
    }
    // A group-writable, sticky inbox is how a queue is shared: accepted.
    let queue = TestQueue::new();
    let output = queue.cairn_output(&["run", "--exit-when-idle"], b"");
    assert!(output.status.success());
    std::fs::set_permissions(queue.path("inbox"), std::fs::Permissions::from_mode(0o3770)).unwrap();
    let output = queue.cairn_output(&["run", "--exit-when-idle"], b"");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn a_task_file_from_outside_the_inbox_group_is_rejected() {
    if !require_root(
        "a_task_file_from_outside_the_inbox_group_is_rejected",
        "it gives a task file to another user",
    ) {
        return;
    }
    let queue = TestQueue::new();
    let output = queue.cairn_output(&["run", "--exit-when-idle"], b"");
    assert!(output.status.success());
    // nobody (65534) is not in root's group, which owns inbox/ here.
    queue.seed_task(
        "stranger.json",
        &once_task("stranger", &serde_json::json!(1)),
    );
    let path = queue.path("inbox/stranger.json");
    std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
    queue.seed_task("mine.json", &once_task("mine", &serde_json::json!(2)));
    queue.run_until_idle(&[]);
    assert_eq!(queue.done("mine").unwrap()["result"], serde_json::json!(2));
    assert!(queue.done("stranger").is_none());
    let rejections = queue.rejections();
    let reason = rejections
        .values()
        .map(|r| r["reason"].as_str().unwrap_or_default().to_string())
        .find(|r| r.contains("stranger.json"))
        .unwrap_or_else(|| panic!("no rejection for stranger.json: {rejections:?}"));
    assert!(reason.contains("not allowed to submit"), "{reason}");
    assert!(reason.contains("65534"), "{reason}");
}

#[test]
fn exit_codes_are_in_the_help() {
    let output = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&output.stdout);
    for line in [
        "0    success",
        "4    the queue is owned",
        "5    the queue's directories",
    ] {
        assert!(help.contains(line), "{help}");
    }
}
