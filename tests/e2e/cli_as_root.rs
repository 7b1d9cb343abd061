//! `cairn` run by root on a queue whose user planted links in it: `prune` refuses a queue whose
//! `control/` and `runs/` were replaced by links to a directory of old files, says why, and
//! leaves that directory untouched.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use crate::common::*;

/// Every path under `dir` with its modification time, depth first.
fn snapshot(dir: &Path) -> Vec<(String, SystemTime)> {
    let mut found = Vec::new();
    for name in list_dir(dir) {
        let path = dir.join(&name);
        let meta = fs::symlink_metadata(&path).unwrap();
        found.push((path.display().to_string(), meta.modified().unwrap()));
        if meta.is_dir() {
            found.extend(snapshot(&path));
        }
    }
    found
}

fn set_old(path: &Path, old: SystemTime) {
    fs::File::open(path).unwrap().set_modified(old).unwrap();
}

#[test]
fn prune_as_root_refuses_control_and_runs_replaced_by_links_and_touches_nothing_outside() {
    if !require_root(
        "prune_as_root_refuses_control_and_runs_replaced_by_links_and_touches_nothing_outside",
        "it shows what root's cairn does",
    ) {
        return;
    }
    let queue = TestQueue::new();
    for dir in ["tasks", "done", "failed", "incremental"] {
        fs::create_dir_all(queue.path(dir)).unwrap();
    }
    // A directory outside the queue, such as /etc, whose files are a month old.
    let outside = queue.aux("outside");
    fs::create_dir_all(outside.join("old-dir")).unwrap();
    fs::write(outside.join("old-dir/kept"), b"precious").unwrap();
    fs::write(outside.join("0001-request.json"), br#"{"task_id":"x"}"#).unwrap();
    fs::write(outside.join("old-file.json"), b"{}").unwrap();
    let old = SystemTime::now() - Duration::from_secs(30 * 24 * 3600);
    for path in [
        outside.join("old-dir/kept"),
        outside.join("old-dir"),
        outside.join("0001-request.json"),
        outside.join("old-file.json"),
    ] {
        set_old(&path, old);
    }
    for dir in ["control", "runs"] {
        std::os::unix::fs::symlink(&outside, queue.path(dir)).unwrap();
    }
    let before = snapshot(&outside);

    for args in [&["prune"][..], &["prune", "--older-than", "0s"]] {
        let out = queue.cairn_output(args, b"");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
        assert!(
            stderr.contains("refusing to prune") && stderr.contains("is a symbolic link"),
            "{args:?} did not say why it refused: {stderr}"
        );
        assert_eq!(
            snapshot(&outside),
            before,
            "{args:?} changed the outside directory"
        );
    }
}

/// The user `nobody`, who owns the queue in the tests below: the queue's user who plants links.
const QUEUE_USER: u32 = 65534;

/// A queue owned by [`QUEUE_USER`] (reachable by that user) holding one finished loop task,
/// `src`, with its checkpoints and journal; `None` (after a loud skip) without root.
fn queue_of_another_user(test: &str) -> Option<TestQueue> {
    if !require_root(
        test,
        "it shows what root's cairn does on another user's queue",
    ) {
        return None;
    }
    let queue = TestQueue::new();
    queue.seed_task("src.json", &loop_task("src", &queue.aux("side"), 2, 0.0));
    queue.run_until_idle(&[]);
    queue.wait_done("src");
    let parent = queue.root().parent().unwrap();
    fs::set_permissions(parent, fs::Permissions::from_mode(0o755)).unwrap();
    chown_tree(queue.root(), QUEUE_USER);
    Some(queue)
}

fn chown_tree(path: &Path, uid: u32) {
    std::os::unix::fs::lchown(path, Some(uid), Some(uid)).unwrap();
    if fs::symlink_metadata(path).unwrap().is_dir() {
        for name in list_dir(path) {
            chown_tree(&path.join(name), uid);
        }
    }
}

/// Run `cairn <args>` as root on the queue with at most `memory` bytes of address space,
/// killed (and reported as `None`) if it has not ended within a minute.
#[allow(unsafe_code)] // a pre_exec hook sets the child's address-space limit
fn cairn_bounded(queue: &TestQueue, args: &[&str], memory: u64) -> Option<std::process::Output> {
    use std::os::unix::process::CommandExt;
    let mut command = queue.cairn();
    command
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    // SAFETY: setrlimit is async-signal-safe and allocates nothing.
    unsafe {
        command.pre_exec(move || {
            let limit = nix::libc::rlimit {
                rlim_cur: memory,
                rlim_max: memory,
            };
            if nix::libc::setrlimit(nix::libc::RLIMIT_AS, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn().expect("starting cairn");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(child.wait_with_output().unwrap())
}

#[test]
fn show_as_root_neither_reads_dev_zero_nor_hangs_on_a_fifo_planted_in_the_queue() {
    let test = "show_as_root_neither_reads_dev_zero_nor_hangs_on_a_fifo_planted_in_the_queue";
    let Some(queue) = queue_of_another_user(test) else {
        return;
    };
    // The definition of `src` replaced by a link to /dev/zero, its record by a FIFO.
    fs::remove_file(queue.path("tasks/src.json")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", queue.path("tasks/src.json")).unwrap();
    fs::remove_file(queue.path("done/src.json")).unwrap();
    nix::unistd::mkfifo(
        &queue.path("done/src.json"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    for args in [
        &["show", "src"][..],
        &["status"],
        &["show", "--json", "src"],
    ] {
        let out = cairn_bounded(&queue, args, 2 << 30)
            .unwrap_or_else(|| panic!("`cairn {args:?}` hung on the FIFO"));
        let stderr = stderr_of(&out);
        assert!(
            !stderr.contains("memory") && out.status.code().is_some(),
            "`cairn {args:?}` ran out of memory reading /dev/zero: {out:?}"
        );
        if args == ["status"] {
            assert!(
                stderr.contains("done/src.json: not a regular file"),
                "status did not name the FIFO: {stderr}"
            );
        }
    }
}

#[test]
fn fork_as_root_does_not_append_through_a_linked_journal() {
    let test = "fork_as_root_does_not_append_through_a_linked_journal";
    let Some(queue) = queue_of_another_user(test) else {
        return;
    };
    // A root-only file elsewhere, and the source task's journal replaced by a link to it.
    let secret = queue.aux("root-only");
    fs::write(&secret, b"root's\n").unwrap();
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).unwrap();
    let journal = queue.path("runs/src/events.jsonl");
    fs::remove_file(&journal).unwrap();
    std::os::unix::fs::symlink(&secret, &journal).unwrap();
    let out = queue.cairn_output(&["fork", "src", "--as", "copy"], b"");
    assert_eq!(
        fs::read(&secret).unwrap(),
        b"root's\n",
        "fork appended to a root-only file through the link: {out:?}"
    );
}

#[test]
fn submit_as_root_does_not_write_through_a_linked_inbox() {
    let test = "submit_as_root_does_not_write_through_a_linked_inbox";
    let Some(queue) = queue_of_another_user(test) else {
        return;
    };
    // A root-only directory elsewhere, and inbox/ replaced by a link to it.
    let elsewhere = queue.aux("root-only-dir");
    fs::create_dir(&elsewhere).unwrap();
    fs::set_permissions(&elsewhere, fs::Permissions::from_mode(0o700)).unwrap();
    fs::remove_dir_all(queue.path("inbox")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, queue.path("inbox")).unwrap();
    let task = queue.aux("task.json");
    fs::write(&task, br#"{"phases": [{"name": "a", "run": ["true"]}]}"#).unwrap();
    let out = queue.cairn_output(&["submit", task.to_str().unwrap()], b"");
    assert_eq!(
        list_dir(&elsewhere),
        Vec::<String>::new(),
        "submit wrote into a root-only directory through the link: {out:?}"
    );
    assert!(!out.status.success(), "{out:?}");
}
