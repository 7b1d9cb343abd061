//! Workers at the edges of the channel protocol, with the real binary: one that never opens
//! its channel (it ignores the protocol, so it just runs), and one that writes a line longer
//! than the channel accepts (the line is skipped, the worker's later messages still count).

use crate::common::*;
use serde_json::json;

#[test]
fn a_worker_that_never_opens_its_channel_still_runs_to_the_end() {
    let queue = TestQueue::new();
    let marker = queue.aux("ran.txt");
    queue.seed_task(
        "silent.json",
        &json!({
            "id": "silent",
            "phases": [{
                "name": "work",
                "kind": "worker",
                "run": ["sh", "-c", "echo ran > \"$0\"", marker],
            }],
        }),
    );
    queue.run_until_idle(&[]);
    let record = queue.done("silent").expect("the task finished");
    assert_eq!(record["result"], json!(null));
    assert_eq!(std::fs::read_to_string(&marker).unwrap().trim(), "ran");
    assert!(
        queue
            .list("runs/silent")
            .iter()
            .all(|n| !n.starts_with("channel-") && !n.starts_with("ack-")),
        "the channel or ack FIFO was left behind: {:?}",
        queue.list("runs/silent")
    );
}

#[test]
fn a_line_longer_than_the_channel_accepts_is_skipped_and_later_messages_count() {
    let queue = TestQueue::new();
    // 65 MiB of one line (over the 64 MiB limit), then a real checkpoint and an output.
    let script = "import os\n\
                  with open(os.environ['CAIRN_CHANNEL'], 'a') as channel:\n\
                  \x20   channel.write('{\"output\": \"' + 'x' * (65 * 1024 * 1024) + '\"}\\n')\n\
                  \x20   channel.flush()\n\
                  \x20   channel.write('{\"checkpoint\": {\"iteration\": 1, \"state\": {\"n\": 1}}}\\n')\n\
                  \x20   channel.write('{\"output\": {\"fine\": true}}\\n')\n";
    queue.seed_task(
        "huge.json",
        &json!({
            "id": "huge",
            "phases": [{"name": "work", "kind": "worker", "run": ["python3", "-c", script]}],
        }),
    );
    queue.run_until_idle(&[]);
    let record = queue.done("huge").expect("the task finished");
    assert_eq!(record["result"], json!({"fine": true}));
    let checkpoint = queue.checkpoint("huge");
    assert!(checkpoint.done);
    assert_eq!(checkpoint.iteration_count, 1);
    assert_eq!(checkpoint.partial_results, json!({"n": 1}));
    let log = std::fs::read_to_string(queue.path("runs/huge/0-work.log")).unwrap();
    assert!(
        log.contains("longer than"),
        "the skipped line is not noted in the log:\n{}",
        &log[..log.len().min(2000)]
    );
}
