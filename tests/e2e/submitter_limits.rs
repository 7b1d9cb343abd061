//! Per-submitter limits and fair sharing (`cairn run --max-queued-per-submitter`,
//! `--max-running-per-submitter`, `--max-priority-per-submitter`): one submitter's flood of
//! top-priority tasks does not starve another's, a file past a limit is rejected with a record
//! that names it while the others go on, and `cairn status` shows the limits and the counts.
//!
//! Two submitters need two file owners: the tests that need them run as root (the daemon's
//! user, so root's files are one submitter) and create a second user for the other, member of
//! the inbox's group, removed at the end.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::*;

/// A system user made for one test (with its own group), removed when dropped.
struct TempUser {
    name: String,
    uid: u32,
    gid: u32,
}

impl TempUser {
    /// A new user, or `None` (a loud skip outside CI) without root or `useradd`.
    fn create(test: &str) -> Option<TempUser> {
        if !require_root(test, "it creates a second user to own task files") {
            return None;
        }
        require_tool(test, "useradd", "passwd")?;
        let name = format!("cairnlim{:08x}", fastrand::u32(..));
        // useradd fails while another holds the lock on /etc/passwd: tests run in parallel.
        let mut last = String::new();
        for _ in 0..50 {
            let output = Command::new("useradd")
                .args(["--system", "--user-group", "--no-create-home"])
                .args(["--shell", "/usr/sbin/nologin", &name])
                .output()
                .expect("running useradd");
            if output.status.success() {
                let user = nix::unistd::User::from_name(&name)
                    .expect("reading the user database")
                    .expect("the user just made");
                return Some(TempUser {
                    name,
                    uid: user.uid.as_raw(),
                    gid: user.gid.as_raw(),
                });
            }
            last = stderr_of(&output);
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("useradd {name}: {last}");
    }

    /// Let this user submit to `queue`: its group owns `inbox/`.
    fn may_submit_to(&self, queue: &TestQueue) {
        std::os::unix::fs::chown(queue.path("inbox"), None, Some(self.gid))
            .expect("giving the inbox to the user's group");
    }
}

impl Drop for TempUser {
    fn drop(&mut self) {
        for _ in 0..50 {
            let status = Command::new("userdel").arg(&self.name).status();
            if status.is_ok_and(|s| s.success()) {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        eprintln!("could not remove the test user {}", self.name);
    }
}

/// Put `task` into `inbox/<name>` owned by `uid` (`None`: this process's user), the way a
/// submitter does: a dot-file, owned and closed before it is renamed in. `backdate` lets the
/// daemon's first scan take it at once.
fn drop_as(queue: &TestQueue, name: &str, task: &Value, uid: Option<u32>, backdate: bool) {
    queue.drop_bytes_owned_by(name, &serde_json::to_vec(task).unwrap(), backdate, uid);
}

/// A task that logs `start <id>` and `end <id>` to `side` around a sleep of `seconds`.
fn logged_task(id: &str, priority: i32, side: &Path, seconds: f64) -> Value {
    let script = format!(
        "echo \"start $CAIRN_TASK_ID\" >> '{side}'; sleep {seconds}; \
         echo \"end $CAIRN_TASK_ID\" >> '{side}'; printf '{{}}'",
        side = side.display()
    );
    json!({
        "id": id,
        "priority": priority,
        "phases": [{"name": "work", "run": ["sh", "-c", script]}],
    })
}

/// The side file's events in order: (`start` or `end`, task id).
fn events(side: &Path) -> Vec<(String, String)> {
    side_lines(side)
        .into_iter()
        .map(|line| (line.event, line.rest))
        .collect()
}

/// The ids in the order they started.
fn starts(side: &Path) -> Vec<String> {
    events(side)
        .into_iter()
        .filter(|(event, _)| event == "start")
        .map(|(_, id)| id)
        .collect()
}

#[test]
fn a_flood_of_top_priority_tasks_from_one_submitter_does_not_starve_another() {
    let test = "a_flood_of_top_priority_tasks_from_one_submitter_does_not_starve_another";
    let Some(bob) = TempUser::create(test) else {
        return;
    };
    let queue = TestQueue::new();
    bob.may_submit_to(&queue);
    let side = queue.aux("starts.side");
    // Root (the daemon's user) floods the queue at the top priority, then bob adds one task.
    for n in 0..20 {
        let task = logged_task(&format!("a{n:02}"), 1000, &side, 1.5);
        drop_as(&queue, &format!("a{n:02}.json"), &task, None, true);
    }
    let first = logged_task("b-first", 0, &side, 0.1);
    drop_as(&queue, "b-first.json", &first, Some(bob.uid), true);
    let mut daemon = queue.start(&["--max-tasks", "2"]);

    // Bob's task takes the second slot, not the twenty-first: the first scan took every file,
    // and bob had nothing running.
    queue.wait_done("b-first");
    let order = starts(&side);
    let b_at = order.iter().position(|id| id == "b-first").unwrap();
    assert!(b_at <= 2, "bob's task started {}th: {order:?}", b_at + 1);
    assert_eq!(
        queue.done("b-first").unwrap()["submitted_by"]["uid"],
        bob.uid
    );

    // A task bob drops while root's flood runs starts at the next free slot.
    let second = logged_task("b-second", 0, &side, 0.1);
    drop_as(&queue, "b-second.json", &second, Some(bob.uid), false);
    queue.wait_done("b-second");
    for n in 0..20 {
        queue.wait_done(&format!("a{n:02}"));
    }
    let order = starts(&side);
    let b_at = order.iter().position(|id| id == "b-second").unwrap();
    let root_after = order[b_at..]
        .iter()
        .filter(|id| id.starts_with('a'))
        .count();
    assert!(
        root_after >= 5,
        "bob's second task waited for root's flood ({root_after} of root's started after it): {order:?}"
    );
    daemon.signal(SIGTERM);
    daemon.wait_exit(DEADLINE);
}

#[test]
fn a_file_past_the_queued_limit_is_rejected_and_the_others_go_on() {
    let test = "a_file_past_the_queued_limit_is_rejected_and_the_others_go_on";
    let Some(bob) = TempUser::create(test) else {
        return;
    };
    let queue = TestQueue::new();
    bob.may_submit_to(&queue);
    let side = queue.aux("queued.side");
    for n in 1..=4 {
        let task = logged_task(&format!("a{n}"), 0, &side, 0.2);
        drop_as(&queue, &format!("a{n}.json"), &task, None, true);
    }
    let task = logged_task("b1", 0, &side, 0.2);
    drop_as(&queue, "b1.json", &task, Some(bob.uid), true);
    let mut daemon = queue.start(&["--max-tasks", "1", "--max-queued-per-submitter", "3"]);

    for id in ["a1", "a2", "a3", "b1"] {
        queue.wait_done(id);
    }
    let rejections = queue.rejections();
    let record = rejections
        .get("inbox/a4.json")
        .unwrap_or_else(|| panic!("a4 is not rejected: {rejections:?}"));
    let reason = record["reason"].as_str().unwrap();
    assert!(
        reason.contains("--max-queued-per-submitter 3") && reason.contains("already has 3"),
        "{reason}"
    );
    assert!(
        reason.contains("root"),
        "the submitter is not named: {reason}"
    );
    assert_eq!(rejections.len(), 1, "{rejections:?}");
    assert!(queue.done("a4").is_none());

    // Once root's tasks are done, root may queue again.
    let again = logged_task("a5", 0, &side, 0.1);
    drop_as(&queue, "a5.json", &again, None, false);
    queue.wait_done("a5");
    daemon.signal(SIGTERM);
    daemon.wait_exit(DEADLINE);
}

#[test]
fn no_submitter_runs_more_attempts_at_once_than_allowed() {
    let test = "no_submitter_runs_more_attempts_at_once_than_allowed";
    let Some(bob) = TempUser::create(test) else {
        return;
    };
    let queue = TestQueue::new();
    bob.may_submit_to(&queue);
    let side = queue.aux("running.side");
    for n in 0..4 {
        let task = logged_task(&format!("a{n}"), 100, &side, 1.0);
        drop_as(&queue, &format!("a{n}.json"), &task, None, true);
    }
    for n in 0..2 {
        let task = logged_task(&format!("b{n}"), 0, &side, 1.0);
        drop_as(&queue, &format!("b{n}.json"), &task, Some(bob.uid), true);
    }
    queue.run_until_idle(&["--max-tasks", "4", "--max-running-per-submitter", "1"]);

    let (mut running, mut peak_root, mut peak_all) = ([0usize; 2], 0, 0);
    for (event, id) in events(&side) {
        let who = usize::from(id.starts_with('b'));
        match event.as_str() {
            "start" => running[who] += 1,
            _ => running[who] -= 1,
        }
        assert!(
            running[who] <= 1,
            "two of one submitter's tasks ran at once: {:?}",
            events(&side)
        );
        peak_root = peak_root.max(running[0]);
        peak_all = peak_all.max(running[0] + running[1]);
    }
    assert_eq!(starts(&side).len(), 6, "{:?}", events(&side));
    // The limit is per submitter: bob's ran beside root's.
    assert_eq!((peak_root, peak_all), (1, 2), "{:?}", events(&side));
}

#[test]
fn a_task_asking_for_more_than_the_highest_priority_allowed_is_rejected() {
    let queue = TestQueue::new();
    let side = queue.aux("priority.side");
    queue.seed_task("high.json", &logged_task("high", 11, &side, 0.0));
    queue.seed_task("top.json", &logged_task("top", 10, &side, 0.0));
    queue.seed_task("low.json", &logged_task("low", -5, &side, 0.0));
    queue.run_until_idle(&["--max-priority-per-submitter", "10"]);

    queue.wait_done("top");
    queue.wait_done("low");
    let rejections = queue.rejections();
    let record = &rejections["inbox/high.json"];
    assert_eq!(record["field"], "priority", "{record}");
    let reason = record["reason"].as_str().unwrap();
    assert!(
        reason.contains("11") && reason.contains("--max-priority-per-submitter 10"),
        "{reason}"
    );
    assert!(!starts(&side).contains(&"high".to_string()));
}

#[test]
fn status_shows_the_limits_in_effect_and_each_submitters_counts() {
    let queue = TestQueue::new();
    let side = queue.aux("status.side");
    for n in 0..3 {
        queue.seed_task(
            &format!("s{n}.json"),
            &logged_task(&format!("s{n}"), 0, &side, 3600.0),
        );
    }
    let mut daemon = queue.start(&[
        "--max-tasks",
        "4",
        "--max-queued-per-submitter",
        "5",
        "--max-running-per-submitter",
        "1",
        "--stop-grace",
        "1s",
    ]);
    wait_until("one task running", DEADLINE, || starts(&side).len() == 1);
    let me = fs::metadata(queue.root()).unwrap().uid();
    let document = wait_for("status to count the running task", DEADLINE, || {
        let output = queue.cairn_output(&["status", "--json"], b"");
        assert!(output.status.success(), "{}", stderr_of(&output));
        let document: Value = serde_json::from_slice(&output.stdout).unwrap();
        (document["submitters"][0]["running"] == 1).then_some(document)
    });
    assert_eq!(
        document["limits"],
        json!({
            "max_tasks": 4,
            "max_queued_per_submitter": 5,
            "max_running_per_submitter": 1,
            "max_priority_per_submitter": null,
        })
    );
    let submitters = document["submitters"].as_array().unwrap();
    assert_eq!(submitters.len(), 1, "{document}");
    assert_eq!(submitters[0]["submitted_by"]["uid"], me);
    assert_eq!(submitters[0]["queued"], 3);

    let output = queue.cairn_output(&["status"], b"");
    let text = stdout_of(&output);
    assert!(
        text.contains("limits per submitter: queued 5, running 1, priority unlimited; max tasks 4"),
        "{text}"
    );
    let row = text
        .lines()
        .skip_while(|line| !line.starts_with("SUBMITTER"))
        .nth(1)
        .unwrap_or_else(|| panic!("no submitter row: {text}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[1..], ["3/5", "1/1"], "{text}");

    daemon.signal(SIGTERM);
    daemon.wait_exit(DEADLINE);
    // A stopped daemon's limits are no longer shown as in effect.
    let output = queue.cairn_output(&["status", "--json"], b"");
    let document: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(document["limits"], Value::Null, "{document}");
    assert_eq!(document["submitters"][0]["queued"], 3, "{document}");
}

/// `cairn retry` brings a finished task back into the queue as a new file would: past the
/// submitter's `--max-queued-per-submitter` it is refused, naming the limit, and the task stays
/// failed; once the submitter has room, the same retry is applied.
#[test]
fn a_retry_counts_against_the_queued_limit() {
    let queue = TestQueue::new();
    let failing = json!({
        "id": "fails",
        "retry": {"max_attempts": 1},
        "phases": [{"name": "work", "run": ["sh", "-c", "exit 3"]}],
    });
    queue.seed_task("fails.json", &failing);
    let mut daemon = queue.start(&["--max-queued-per-submitter", "1"]);
    queue.wait_failed("fails");
    // The one unfinished task root may have: waiting for its marker to go.
    let marker = queue.aux("hold");
    fs::write(&marker, "").unwrap();
    let holding = json!({
        "id": "holds",
        "phases": [{"name": "wait", "run": ["sh", "-c",
            format!("while [ -e '{}' ]; do sleep 0.1; done; printf '{{}}'", marker.display())]}],
    });
    queue.drop_task("holds.json", &holding);
    wait_until("the holding task to run", DEADLINE, || {
        queue
            .active_entry("holds")
            .is_some_and(|e| e["status"] == "running")
    });

    let retried = queue.cairn_output(&["retry", "fails"], b"");
    let stderr = stderr_of(&retried);
    assert_eq!(retried.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("refused the request for fails")
            && stderr.contains("--max-queued-per-submitter 1")
            && stderr.contains("already has 1"),
        "{stderr}"
    );
    assert!(
        queue.failed("fails").is_some(),
        "the refused retry moved the record"
    );
    assert!(queue.active_entry("fails").is_none());

    fs::remove_file(&marker).unwrap();
    queue.wait_done("holds");
    let retried = queue.cairn_output(&["retry", "fails"], b"");
    assert!(retried.status.success(), "{}", stderr_of(&retried));
    queue.wait_failed("fails");
    daemon.signal(SIGTERM);
    daemon.wait_exit(DEADLINE);
}
