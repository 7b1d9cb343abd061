//! `cairn` run by root on a queue whose user planted links in it: `prune` refuses a queue whose
//! `control/` and `runs/` were replaced by links to a directory of old files, says why, and
//! leaves that directory untouched.

use std::fs;
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
