//! The read model over a queue laid out by hand.

use std::fs;
use std::path::Path;

use crate::queue::{LoadOptions, QueueDir, QueueLock, QueueReader};
use crate::store::current_work::{ActiveStatus, ActiveTask, CurrentWork};
use crate::store::task_state::TaskState;
use crate::task_id::TaskId;

pub(super) fn id(id: &str) -> TaskId {
    TaskId::parse(id).unwrap()
}

pub(super) fn write(root: &Path, key: &str, text: &str) {
    let path = root.join(key);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
}

pub(super) fn task(id: &str) -> String {
    format!(
        r#"{{"id": "{id}", "phases": [{{"name": "a", "kind": "loop", "run": ["true"], "max_iterations": 5}}]}}"#
    )
}

/// Pending, running, finished, a task named like a rejection, a rejection and a submission.
pub(super) fn queue() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    QueueDir::new(root).create_all().unwrap();
    write(root, "tasks/p.json", &task("p"));
    write(root, "tasks/r.json", &task("r"));
    let mut work = CurrentWork::default();
    let mut entry = ActiveTask::new(&id("r"), "a");
    entry.attempt = 2;
    entry.iterations = 3;
    work.active_tasks.push(entry);
    write(
        root,
        "current_work.json",
        &serde_json::to_string(&work).unwrap(),
    );
    write(root, "tasks/d.json", &task("d"));
    write(
        root,
        "done/d.json",
        r#"{"status": "done", "finished_at": "2026-01-01T00:00:00Z", "attempts": 1}"#,
    );
    write(
        root,
        "failed/rejected-x.json",
        r#"{"status": "failed", "failed_at": "2026-01-01T00:00:00Z", "error": "boom"}"#,
    );
    write(
        root,
        "failed/rejected-bad-1a2b3c.json",
        r#"{"status": "rejected", "file": "inbox/bad.json", "reason": "not JSON",
            "rejected_at": "2026-01-02T00:00:00Z"}"#,
    );
    write(root, "inbox/s.json", &task("s"));
    tmp
}

#[test]
fn every_task_has_its_state_in_flight_first_and_rejections_last() {
    let tmp = queue();
    let reader = QueueReader::open(tmp.path());
    let view = reader.status(LoadOptions { rejected: 10 });
    let states: Vec<(&str, &str)> = view
        .tasks
        .iter()
        .map(|t| (t.id.as_str(), t.state.as_str()))
        .collect();
    assert_eq!(
        states,
        [
            // Running in current_work.json, but no daemon holds the queue.
            ("r", "interrupted"),
            ("p", "pending"),
            ("s", "submitted"),
            ("d", "done"),
            ("rejected-x", "failed"),
            ("rejected-bad-1a2b3c", "rejected"),
        ]
    );
    assert_eq!((view.inbox, view.rejected), (1, 1));
    assert_eq!(view.current_work_problem, None);
    let running = &view.tasks[0];
    assert_eq!((running.iteration, running.total), (Some(3), Some(5)));
    assert_eq!(running.attempts, Some(2));
    assert_eq!(reader.rejections_of("bad"), ["rejected-bad-1a2b3c"]);
    assert!(reader.rejections_of("rejected-x").is_empty());
}

#[test]
fn a_held_lock_makes_the_entry_running_and_one_task_reads_alone() {
    let tmp = queue();
    let reader = QueueReader::open(tmp.path());
    let _lock = QueueLock::acquire(reader.dir()).unwrap();
    assert!(reader.daemon().running);
    assert_eq!(
        reader.task(&id("r")).unwrap().state,
        TaskState::InFlight(ActiveStatus::Running)
    );
    assert_eq!(reader.task(&id("s")).unwrap().state, TaskState::Submitted);
    assert!(reader.in_inbox("s") && !reader.in_inbox("p"));
    assert!(reader.task(&id("nobody")).is_none());
    assert!(reader.task_exists("d") && !reader.task_exists("nobody"));
}

#[test]
fn an_unreadable_current_work_is_reported_with_its_path() {
    let tmp = queue();
    write(tmp.path(), "current_work.json", "{torn");
    let view = QueueReader::open(tmp.path()).status(LoadOptions::default());
    let problem = view.current_work_problem.expect("a problem");
    assert!(problem.contains("current_work.json"), "{problem}");
    assert!(view.warnings.contains(&problem));
}

/// A power cut after a save through the commit log, before any daemon replayed it: the latest
/// file still holds the save before (its rename was lost), the log holds the newer one.
#[test]
fn without_a_daemon_the_checkpoints_are_read_as_the_commit_log_will_restore_them() {
    use crate::store::{CheckpointStore, IterationCheckpoint};
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    QueueDir::new(root).create_all().unwrap();
    let store = CheckpointStore::open(root).unwrap();
    for iteration in [1, 2] {
        store
            .save(&mut IterationCheckpoint::of_loop("t", iteration))
            .unwrap();
    }
    // The process that saved died without closing the store (which would cut the log).
    std::mem::forget(store);
    let latest = root.join(CheckpointStore::latest_file_key("t"));
    let history = QueueReader::open(root).history("t").unwrap();
    let kept = root.join(CheckpointStore::generation_file_key(
        "t",
        history.last().unwrap().generation,
    ));
    fs::copy(&kept, &latest).unwrap();
    let iteration = |reader: &QueueReader| {
        let loaded = reader.latest_checkpoint("t").unwrap().unwrap();
        loaded.checkpoint.iteration_count
    };

    assert_eq!(
        iteration(&QueueReader::open(root)),
        2,
        "read through the log"
    );
    // While a daemon holds the queue its log may hold a save in flight: the files are read.
    let lock = QueueLock::acquire(&QueueDir::new(root)).unwrap();
    assert_eq!(
        iteration(&QueueReader::open(root)),
        1,
        "read from the files"
    );
    drop(lock);
}

/// A task whose only trace is its first checkpoint, whose file a power cut took (its rename
/// was lost) while the commit log kept the record: it exists, as the next daemon will restore it.
#[test]
fn a_task_known_only_from_the_commit_log_exists_without_a_daemon() {
    use crate::store::{CheckpointStore, IterationCheckpoint};
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    QueueDir::new(root).create_all().unwrap();
    let store = CheckpointStore::open(root).unwrap();
    store
        .save(&mut IterationCheckpoint::of_loop("first", 1))
        .unwrap();
    std::mem::forget(store);
    fs::remove_file(root.join(CheckpointStore::latest_file_key("first"))).unwrap();

    assert!(QueueReader::open(root).task_exists("first"));
    assert!(!QueueReader::open(root).task_exists("other"));
    // While a daemon holds the queue the log is not read, and the files hold no trace.
    let lock = QueueLock::acquire(&QueueDir::new(root)).unwrap();
    assert!(!QueueReader::open(root).task_exists("first"));
    drop(lock);
}
