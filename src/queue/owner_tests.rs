//! The owner's fencing and the file backend behind it, on real queue directories.

use serde_json::json;

use super::Queue;
use crate::queue::{QueueBackend, QueueError, TaskRecord};
use crate::store::current_work::CurrentWork;
use crate::store::records::FailedRecord;
use crate::store::StoreError;

fn open(dir: &tempfile::TempDir) -> Queue {
    Queue::open_files(dir.path(), None).expect("the queue opens")
}

fn failed_record(id: &str) -> FailedRecord {
    serde_json::from_value(json!({
        "status": "failed", "task_id": id, "error": "boom", "phase": "p", "phase_index": 0,
        "attempts": 1, "failed_attempts": 1, "started_at": "2026-11-23T10:00:00Z",
        "failed_at": "2026-11-23T10:01:02.345Z", "phase_outputs": {}, "phases": []
    }))
    .expect("a failed record")
}

#[test]
fn a_write_under_a_lease_of_another_queue_is_refused_and_writes_nothing() {
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (open(&dir_a), open(&dir_b));
    let lease_a = a.backend().claim("t1").unwrap();
    let record = TaskRecord::Failed(failed_record("t1"));

    let refused = b.backend().finish(&lease_a, &record).unwrap_err();
    assert!(matches!(refused, QueueError::LeaseLost(_)), "{refused}");
    assert!(!b.backend().has_record("t1").unwrap());
    let refused = b.backend().put_output(&lease_a, 0, b"{}").unwrap_err();
    assert!(matches!(refused, QueueError::LeaseLost(_)), "{refused}");
    assert!(b.checkpointer(&lease_a, "loop").is_err());

    a.backend().finish(&lease_a, &record).unwrap();
    assert!(a.backend().has_record("t1").unwrap());
    assert_eq!(
        a.backend().finished_ids().unwrap(),
        ["t1".to_string()].into()
    );
}

#[test]
fn once_released_no_write_lands_not_even_a_checkpoint_of_a_running_phase() {
    let dir = tempfile::tempdir().unwrap();
    let queue = open(&dir);
    let lease = queue.backend().claim("t1").unwrap();
    let mut checkpointer = queue.checkpointer(&lease, "loop").unwrap();
    assert!(checkpointer.checkpoint(1, &json!({"n": 1})).unwrap());

    queue.backend().release();
    let refused = checkpointer.checkpoint(2, &json!({"n": 2})).unwrap_err();
    assert!(
        matches!(&refused, StoreError::Fenced { task_id, .. } if task_id == "t1"),
        "{refused}"
    );
    drop(checkpointer);
    let latest = queue.backend().latest_checkpoint("t1").unwrap().unwrap();
    assert_eq!(
        latest.checkpoint.iteration_count, 1,
        "the refused save left no trace"
    );

    assert!(queue.backend().renew(&lease).is_err());
    assert!(queue.backend().claim("t2").is_err());
    let refused = queue
        .backend()
        .finish(&lease, &TaskRecord::Failed(failed_record("t1")))
        .unwrap_err();
    assert!(matches!(refused, QueueError::LeaseLost(_)), "{refused}");
    assert!(!queue.backend().has_record("t1").unwrap());
    let refused = queue.write_work_state(&[], &[]).unwrap_err();
    assert!(matches!(refused, QueueError::NotOwner { .. }), "{refused}");
}

#[test]
fn the_work_state_written_by_the_owner_is_the_state_loaded_at_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut work = CurrentWork::default();
    work.active_tasks
        .push(crate::store::current_work::ActiveTask::new(
            &crate::task_id::TaskId::parse("t1").unwrap(),
            "p",
        ));
    {
        let queue = open(&dir);
        assert_eq!(
            queue.backend().load_work().unwrap().active_tasks,
            Vec::new()
        );
        queue.write_work_state(&work.active_tasks, &[]).unwrap();
    }
    let queue = open(&dir);
    assert_eq!(
        queue.backend().load_work().unwrap().active_tasks,
        work.active_tasks
    );
}

#[test]
fn a_second_owner_of_the_same_directory_is_refused_while_the_first_lives() {
    let dir = tempfile::tempdir().unwrap();
    let first = open(&dir);
    let second = Queue::open_files(dir.path(), None);
    assert!(
        matches!(second, Err(super::OpenError::Lock(_))),
        "{second:?}"
    );
    drop(first);
    open(&dir);
}

#[test]
fn a_failed_record_is_read_and_archived_out_of_the_records() {
    let dir = tempfile::tempdir().unwrap();
    let queue = open(&dir);
    let lease = queue.backend().claim("t1").unwrap();
    let record = failed_record("t1");
    queue
        .backend()
        .finish(&lease, &TaskRecord::Failed(record.clone()))
        .unwrap();
    assert_eq!(
        queue.backend().failed_record("t1").unwrap(),
        Some(record.clone())
    );

    queue.backend().archive_failed(&lease, &record).unwrap();
    assert_eq!(queue.backend().failed_record("t1").unwrap(), None);
    assert!(!queue.backend().has_record("t1").unwrap());
    let archived = queue.run_dir("t1").join("failed-20261123T100102.345Z.json");
    assert!(archived.is_file(), "{}", archived.display());
}

#[test]
fn large_outputs_are_stored_under_the_lease_and_read_back_by_their_reference() {
    let dir = tempfile::tempdir().unwrap();
    let queue = open(&dir);
    let lease = queue.backend().claim("t1").unwrap();
    let reference = queue
        .backend()
        .put_output(&lease, 2, br#"{"big":[1,2,3]}"#)
        .unwrap();
    assert_eq!(
        queue.backend().read_output(&reference).unwrap(),
        Some(json!({"big": [1, 2, 3]}))
    );
    assert_eq!(
        queue
            .backend()
            .read_output("runs/t1/output-9.json")
            .unwrap(),
        None
    );
}

#[test]
fn a_backend_is_usable_as_a_trait_object() {
    let dir = tempfile::tempdir().unwrap();
    let queue = open(&dir);
    let backend: &dyn QueueBackend = queue.backend();
    let lease = backend.claim("t1").unwrap();
    assert_eq!(lease.task_id(), "t1");
    assert_eq!(lease.epoch(), backend.owner().epoch());
}

#[test]
fn record_locations_name_the_records_of_the_queue_directory() {
    let locations = super::RecordLocations::of_queue_dir(std::path::Path::new("/q"));
    assert_eq!(locations.done, "/q/done/<id>.json");
    assert_eq!(locations.failed, "/q/failed/");
}
