//! Names and floods from submitters, with the real binary: a control request or an inbox file
//! named with a newline and an escape sequence is shown escaped by `show` and `status`; a flood
//! of refused requests for one task adds a handful of journal entries and log lines, not one
//! each, and the `cairn` whose request was among the counted ones is still told it was refused.

use serde_json::json;

use crate::common::*;

/// A name whose newline would forge a line and whose escape sequence would reach a terminal.
const HOSTILE: &str = "evil\nFORGED LINE\u{1b}[31m";

fn assert_printable(what: &str, text: &str) {
    assert!(
        !text.contains('\u{1b}'),
        "{what} printed an escape sequence raw: {text:?}"
    );
    assert!(
        !text.lines().any(|line| line.starts_with("FORGED LINE")),
        "{what} printed a forged line: {text}"
    );
}

#[test]
fn hostile_names_are_shown_escaped_and_a_flood_of_refusals_is_bounded() {
    let queue = TestQueue::new();
    let side = queue.aux("victim.side");
    queue.seed_task("victim.json", &loop_task("victim", &side, 10_000, 0.2));
    queue.drop_bytes(&format!("{HOSTILE}.json"), b"not json", true);
    let mut daemon = queue.start(&[]);
    wait_until("the victim to run", DEADLINE, || {
        queue
            .active_entry("victim")
            .is_some_and(|e| e["status"] == "running")
    });

    // 200 requests the daemon refuses (the task is not paused), under hostile names.
    let request = json!({
        "action": "resume",
        "task_id": "victim",
        "requested_at": "2026-01-01T00:00:00Z",
    })
    .to_string();
    std::fs::create_dir_all(queue.path("control")).unwrap();
    for i in 0..200 {
        let name = format!("{i:05}-{HOSTILE}.json");
        let temp = queue.path(&format!("control/.{i}.tmp"));
        std::fs::write(&temp, &request).unwrap();
        std::fs::rename(&temp, queue.path(&format!("control/{name}"))).unwrap();
    }
    wait_until("the daemon to handle every request", DEADLINE, || {
        list_dir(&queue.path("control")).is_empty()
            && !list_dir(&queue.path("tasks"))
                .iter()
                .any(|n| n.starts_with(".control."))
    });

    // This user's next request is among the counted ones: still told it was refused.
    let resumed = queue.cairn_output(&["resume", "victim"], b"");
    let stderr = stderr_of(&resumed);
    assert_eq!(resumed.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("too many refused requests"), "{stderr}");

    let journal = std::fs::read_to_string(queue.path("runs/victim/events.jsonl")).unwrap();
    let refusals = journal
        .lines()
        .filter(|l| l.contains("\"control_refused\""))
        .count();
    assert!(
        (1..=7).contains(&refusals),
        "201 refused requests made {refusals} journal entries: {journal}"
    );
    let logged = daemon.stderr().matches("cannot resume task victim").count();
    assert!(
        (1..=7).contains(&logged),
        "201 refused requests made {logged} log lines"
    );

    let show = stdout_of(&queue.cairn_output(&["show", "victim"], b""));
    assert_printable("show victim", &show);
    assert!(show.contains("evil\\nFORGED LINE\\u{1b}[31m"), "{show}");

    let status = queue.cairn_output(&["status"], b"");
    assert_printable("status", &stdout_of(&status));
    let rejected = queue
        .rejections()
        .into_keys()
        .next()
        .expect("the hostile inbox file is rejected");
    assert!(rejected.contains("FORGED"), "{rejected:?}");
    let id = list_dir(&queue.path("failed"))
        .into_iter()
        .find_map(|n| n.strip_suffix(".json").map(str::to_string))
        .expect("a rejection record");
    let show = queue.cairn_output(&["show", &id], b"");
    let shown = stdout_of(&show);
    assert_printable("show of the rejection", &shown);
    assert!(shown.contains("evil\\nFORGED LINE"), "{shown}");

    daemon.signal(SIGTERM);
    daemon.wait_exit(DEADLINE);
}
