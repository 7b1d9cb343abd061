//! The work log's format and its writer: what a write, a crash and a reader see.

use std::fs;
use std::sync::Arc;

use super::{read, LogState, WorkLog, LOG_KEY, SNAPSHOT_KEY};
use crate::store::current_work::{ActiveTask, CurrentWork};
use crate::store::{FileStorage, Storage};
use crate::task_id::TaskId;

fn id(name: &str) -> TaskId {
    TaskId::parse(name).unwrap()
}

fn entry(name: &str, iterations: u64) -> ActiveTask {
    let mut entry = ActiveTask::new(&id(name), "p");
    entry.iterations = iterations;
    entry
}

fn storage(dir: &tempfile::TempDir) -> Arc<dyn Storage> {
    Arc::new(FileStorage::new(dir.path()))
}

/// The state a reader (the CLI's way: plain file reads) sees, as (id, iterations) pairs.
fn seen(dir: &tempfile::TempDir) -> Vec<(String, u64)> {
    let replayed = read(|key| match fs::read(dir.path().join(key)) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    })
    .unwrap();
    let mut seen: Vec<(String, u64)> = replayed
        .work
        .active_tasks
        .iter()
        .map(|e| (e.task_id.to_string(), e.iterations))
        .collect();
    seen.sort();
    seen
}

fn pairs(list: &[(&str, u64)]) -> Vec<(String, u64)> {
    list.iter().map(|(id, n)| (id.to_string(), *n)).collect()
}

#[test]
fn writes_append_only_what_changed_and_a_new_writer_loads_the_same_state() {
    let dir = tempfile::tempdir().unwrap();
    let log = WorkLog::new(storage(&dir));
    assert!(log.load().unwrap().active_tasks.is_empty());
    log.write(&[entry("a", 0), entry("b", 0)], &[]).unwrap();
    let snapshot = fs::read(dir.path().join(SNAPSHOT_KEY)).unwrap();
    log.write(&[entry("a", 5)], &[]).unwrap();
    log.write(&[entry("c", 1)], &[id("b")]).unwrap();
    // The first write of a process compacts; the later ones only append.
    assert_eq!(fs::read(dir.path().join(SNAPSHOT_KEY)).unwrap(), snapshot);
    let text = fs::read_to_string(dir.path().join(LOG_KEY)).unwrap();
    assert_eq!(text.lines().count(), 3, "{text}");
    assert!(
        !text.contains("\"b\",\"phase\""),
        "b was not written again: {text}"
    );
    let expected = pairs(&[("a", 5), ("c", 1)]);
    assert_eq!(seen(&dir), expected);

    let again = WorkLog::new(storage(&dir));
    let mut loaded: Vec<(String, u64)> = again
        .load()
        .unwrap()
        .active_tasks
        .iter()
        .map(|e| (e.task_id.to_string(), e.iterations))
        .collect();
    loaded.sort();
    assert_eq!(loaded, expected);
}

#[test]
fn a_current_work_file_of_an_older_cairn_is_read_and_turned_into_a_snapshot_with_a_log() {
    let dir = tempfile::tempdir().unwrap();
    let mut old = CurrentWork::default();
    old.active_tasks.push(entry("a", 2));
    old.active_tasks.push(entry("b", 3));
    let old_text = serde_json::to_string_pretty(&old).unwrap();
    assert!(!old_text.contains("log_generation"));
    fs::write(dir.path().join(SNAPSHOT_KEY), old_text).unwrap();
    assert_eq!(seen(&dir), pairs(&[("a", 2), ("b", 3)]));

    let log = WorkLog::new(storage(&dir));
    assert_eq!(log.load().unwrap().active_tasks, old.active_tasks);
    log.write(&[entry("a", 4)], &[]).unwrap();
    let snapshot: CurrentWork =
        serde_json::from_slice(&fs::read(dir.path().join(SNAPSHOT_KEY)).unwrap()).unwrap();
    assert_eq!(snapshot.log_generation, 1);
    assert_eq!(snapshot.active_tasks.len(), 2);
    assert_eq!(
        fs::read_to_string(dir.path().join(LOG_KEY)).unwrap(),
        "{\"work_log\":1}\n"
    );
    assert_eq!(seen(&dir), pairs(&[("a", 4), ("b", 3)]));
}

#[test]
fn a_line_cut_short_is_ignored_and_a_damaged_complete_line_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let log = WorkLog::new(storage(&dir));
    log.load().unwrap();
    log.write(&[entry("a", 1)], &[]).unwrap();
    log.write(&[entry("a", 2)], &[]).unwrap();
    let path = dir.path().join(LOG_KEY);
    let whole = fs::read(&path).unwrap();
    // A third write cut short by a crash: no newline.
    let mut torn = whole.clone();
    torn.extend_from_slice(b"{\"at\":\"2026-01-01T00:00:00Z\",\"put\":[{\"task_id\":\"a\"");
    fs::write(&path, &torn).unwrap();
    assert_eq!(seen(&dir), pairs(&[("a", 2)]));
    let reloaded = WorkLog::new(storage(&dir));
    assert_eq!(reloaded.load().unwrap().active_tasks[0].iterations, 2);
    // The next write starts over from a snapshot: nothing is ever appended after a torn line.
    reloaded.write(&[entry("a", 3)], &[]).unwrap();
    assert_eq!(fs::read(&path).unwrap().last(), Some(&b'\n'));
    assert_eq!(seen(&dir), pairs(&[("a", 3)]));

    // A complete line that does not parse is damage, not a crash: the start stops.
    let mut damaged = fs::read(&path).unwrap();
    damaged.extend_from_slice(b"{not json}\n");
    fs::write(&path, &damaged).unwrap();
    let err = WorkLog::new(storage(&dir)).load().unwrap_err();
    assert!(err.to_string().contains("current_work.log line"), "{err}");
}

#[test]
fn a_log_older_than_the_snapshot_is_ignored_and_a_newer_one_is_read_again() {
    let dir = tempfile::tempdir().unwrap();
    let log = WorkLog::new(storage(&dir));
    log.load().unwrap();
    log.write(&[entry("a", 1)], &[]).unwrap();
    log.write(&[entry("a", 2)], &[]).unwrap();
    let old_log = fs::read(dir.path().join(LOG_KEY)).unwrap();
    // A compaction cut short after its snapshot: the old log is still there.
    let second = WorkLog::new(storage(&dir));
    second.load().unwrap();
    second.write(&[entry("a", 7)], &[]).unwrap();
    fs::write(dir.path().join(LOG_KEY), &old_log).unwrap();
    let replayed = read(|key| Ok(fs::read(dir.path().join(key)).ok())).unwrap();
    assert_eq!(replayed.log, LogState::Stale);
    assert_eq!(seen(&dir), pairs(&[("a", 7)]));
}

#[test]
fn the_log_is_compacted_once_larger_than_the_snapshot_and_when_nothing_is_left() {
    let dir = tempfile::tempdir().unwrap();
    let log = WorkLog::new(storage(&dir)).compact_at(0);
    log.load().unwrap();
    let many: Vec<ActiveTask> = (0..20).map(|i| entry(&format!("t{i}"), 0)).collect();
    log.write(&many, &[]).unwrap();
    let snapshot_len = fs::metadata(dir.path().join(SNAPSHOT_KEY)).unwrap().len();
    for round in 1..=200 {
        log.write(&[entry("t3", round)], &[]).unwrap();
        let log_len = fs::metadata(dir.path().join(LOG_KEY)).unwrap().len();
        assert!(
            log_len <= 2 * snapshot_len + 512,
            "round {round}: {log_len}"
        );
    }
    let snapshot: CurrentWork =
        serde_json::from_slice(&fs::read(dir.path().join(SNAPSHOT_KEY)).unwrap()).unwrap();
    assert!(snapshot.log_generation > 1, "never compacted");
    assert_eq!(seen(&dir).len(), 20);
    assert!(seen(&dir).contains(&("t3".to_string(), 200)));

    let ids: Vec<TaskId> = many.iter().map(|e| e.task_id.clone()).collect();
    log.write(&[], &ids).unwrap();
    let snapshot: CurrentWork =
        serde_json::from_slice(&fs::read(dir.path().join(SNAPSHOT_KEY)).unwrap()).unwrap();
    assert!(
        snapshot.active_tasks.is_empty(),
        "an idle queue's snapshot is the whole state"
    );
    assert!(seen(&dir).is_empty());
}

#[test]
fn a_snapshot_restored_by_hand_over_a_newer_log_is_read_alone_and_the_next_one_goes_above_both() {
    let dir = tempfile::tempdir().unwrap();
    let log = WorkLog::new(storage(&dir)).compact_at(0);
    log.load().unwrap();
    for round in 0..6 {
        log.write(&[entry("a", round)], &[]).unwrap();
    }
    let header = fs::read_to_string(dir.path().join(LOG_KEY)).unwrap();
    let old_generation: u64 =
        serde_json::from_str::<serde_json::Value>(header.lines().next().unwrap()).unwrap()
            ["work_log"]
            .as_u64()
            .unwrap();
    assert!(old_generation >= 2, "{header}");
    // An operator puts back a snapshot of an older cairn (generation 0).
    let mut restored = CurrentWork::default();
    restored.active_tasks.push(entry("b", 1));
    fs::write(
        dir.path().join(SNAPSHOT_KEY),
        serde_json::to_string(&restored).unwrap(),
    )
    .unwrap();
    assert_eq!(
        seen(&dir),
        pairs(&[("b", 1)]),
        "the newer log is not applied"
    );

    let again = WorkLog::new(storage(&dir));
    again.load().unwrap();
    again.write(&[entry("b", 2)], &[]).unwrap();
    let snapshot: CurrentWork =
        serde_json::from_slice(&fs::read(dir.path().join(SNAPSHOT_KEY)).unwrap()).unwrap();
    assert!(
        snapshot.log_generation > old_generation,
        "{} is not above the old log's {old_generation}",
        snapshot.log_generation
    );
    assert_eq!(seen(&dir), pairs(&[("b", 2)]));
}
