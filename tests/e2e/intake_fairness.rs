//! Intake takes the inbox's files one submitter at a time: a flood of bad files from one
//! submitter, named to sort first, does not hold back another submitter's task.

use crate::common::*;

/// The uid of `nobody`, the flooding submitter here (its files are only ever rejected).
const FLOODER: u32 = 65534;

#[test]
fn a_flood_of_bad_files_from_one_submitter_does_not_hold_back_anothers_task() {
    let test = "a_flood_of_bad_files_from_one_submitter_does_not_hold_back_anothers_task";
    if !require_root(test, "it gives the flood's files to another user") {
        return;
    }
    let queue = TestQueue::new();
    for i in 0..1500 {
        queue.drop_bytes_owned_by(&format!("a-{i:05}.json"), b"not json", true, Some(FLOODER));
    }
    queue.seed_task(
        "z-mine.json",
        &once_task("mine", &serde_json::json!({"ok": true})),
    );
    let mut daemon = queue.start(&[]);
    queue.wait_done("mine");
    // When the task was accepted, how many of the flood had been rejected before it. The
    // daemon journals what a batch of intake (256 files) accepted when the batch ends: taken in
    // turns, the task is in the first batch; taken by name, after all 1500.
    let journal = std::fs::read_to_string(queue.path("runs/mine/events.jsonl")).unwrap();
    let accepted_at = journal
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .find(|event| event["event"] == "accepted")
        .and_then(|event| event["at"].as_str().map(str::to_string))
        .unwrap_or_else(|| panic!("no accepted event: {journal}"));
    let accepted_at = chrono::DateTime::parse_from_rfc3339(&accepted_at).unwrap();
    wait_until("the flood to be rejected", DEADLINE, || {
        queue.rejections().len() == 1500
    });
    let before = queue
        .rejections()
        .values()
        .filter(|record| {
            let at = record["rejected_at"].as_str().unwrap();
            chrono::DateTime::parse_from_rfc3339(at).unwrap() < accepted_at
        })
        .count();
    assert!(
        before < 256,
        "{before} of the other submitter's 1500 bad files were taken before this task"
    );
    daemon.signal(SIGTERM);
    daemon.wait_exit(DEADLINE);
}

/// Rejected files count against their submitter: with `--max-queued-per-submitter 5`, once 5
/// of one submitter's files were rejected, the rest of theirs wait in the inbox unread (no
/// record, no copy) while another submitter's tasks are taken.
#[test]
fn rejected_files_count_against_the_submitter_who_dropped_them() {
    let test = "rejected_files_count_against_the_submitter_who_dropped_them";
    if !require_root(test, "it gives the flood's files to another user") {
        return;
    }
    let queue = TestQueue::new();
    for i in 0..20 {
        queue.drop_bytes_owned_by(&format!("a-{i:05}.json"), b"not json", true, Some(FLOODER));
    }
    queue.seed_task("z-first.json", &once_task("first", &serde_json::json!(1)));
    let mut daemon = queue.start(&["--max-queued-per-submitter", "5"]);
    queue.wait_done("first");
    // A file dropped later is taken by a later scan, which passes the held files again.
    queue.drop_task("z-second.json", &once_task("second", &serde_json::json!(2)));
    queue.wait_done("second");
    let rejected = queue.rejections().len();
    assert_eq!(rejected, 5, "{:?}", queue.rejections().keys());
    let waiting = list_dir(&queue.path("inbox"))
        .into_iter()
        .filter(|n| n.starts_with("a-"))
        .count();
    assert_eq!(waiting, 15);
    daemon.signal(SIGTERM);
    daemon.wait_exit(DEADLINE);
}
