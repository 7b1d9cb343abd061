//! Steering in bulk and restarting from a phase, with the real binary: `retry --state failed`
//! brings back exactly the failed tasks, a bulk request is listed first and needs `--yes`
//! without a terminal, `pause --submitter` touches only that submitter's tasks and another
//! submitter's tasks are refused one by one; `fork --from-phase` re-runs only that phase and
//! after, with the source's earlier outputs.

use crate::common::*;
use crate::run_as_submitter::{cairn_as, share_with_group};
use serde_json::{json, Value};

/// A task that fails until `flag` exists (one attempt allowed), and then outputs 1.
fn flaky_task(id: &str, flag: &std::path::Path) -> Value {
    json!({
        "id": id,
        "retry": {"max_attempts": 1},
        "phases": [{"name": "check", "run": ["sh", "-c",
            format!("test -e '{}' && echo 1", flag.display())]}],
    })
}

fn json_of(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}\n{}", stdout_of(out), stderr_of(out)))
}

/// The ids a bulk command's `--json` lists.
fn listed_ids(document: &Value) -> Vec<String> {
    let mut ids: Vec<String> = document["tasks"]
        .as_array()
        .expect("a task list")
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

#[test]
fn retry_by_state_brings_back_exactly_the_failed_tasks() {
    let queue = TestQueue::new();
    let flag = queue.aux("fixed");
    let never_failing = queue.aux("");
    let mut failing: Vec<String> = Vec::new();
    for n in 0..20 {
        let id = format!("t{n:02}");
        // Every third task fails; the others check for a directory that exists.
        let task = if n % 3 == 0 {
            failing.push(id.clone());
            flaky_task(&id, &flag)
        } else {
            flaky_task(&id, &never_failing)
        };
        queue.seed_task(&format!("{id}.json"), &task);
    }
    queue.run_until_idle(&[]);
    for id in &failing {
        assert!(queue.failed(id).is_some(), "{id} should have failed");
    }

    // Listed, not sent: a dry run, and a run without --yes whose stdin is not a terminal.
    let dry = queue.cairn_output(&["retry", "--state", "failed", "--dry-run", "--json"], b"");
    assert!(dry.status.success(), "{}", stderr_of(&dry));
    assert_eq!(listed_ids(&json_of(&dry)), failing);
    let unconfirmed = queue.cairn_output(&["retry", "--state", "failed"], b"");
    assert_eq!(
        unconfirmed.status.code(),
        Some(2),
        "{}",
        stderr_of(&unconfirmed)
    );
    assert!(
        stderr_of(&unconfirmed).contains("--yes"),
        "{}",
        stderr_of(&unconfirmed)
    );
    assert!(
        queue.list("control").is_empty(),
        "a request was sent without --yes"
    );

    // Fixed and retried: exactly the failed ones run again, and finish.
    std::fs::write(&flag, b"").unwrap();
    let retried = queue.cairn_output(&["retry", "--state", "failed", "--yes", "--json"], b"");
    assert!(retried.status.success(), "{}", stderr_of(&retried));
    let report = json_of(&retried);
    assert_eq!(listed_ids(&report), failing);
    assert!(
        report["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["result"] == "requested"),
        "{report:#}"
    );
    queue.run_until_idle(&[]);
    for n in 0..20 {
        let id = format!("t{n:02}");
        let done = queue
            .done(&id)
            .unwrap_or_else(|| panic!("{id} did not finish done"));
        let attempts = done["attempts"].as_u64().unwrap();
        let expected = if failing.contains(&id) { 2 } else { 1 };
        assert_eq!(attempts, expected, "{id}: {done:#}");
    }
    let nothing = queue.cairn_output(&["retry", "--state", "failed", "--yes"], b"");
    assert!(nothing.status.success(), "{}", stderr_of(&nothing));
    assert!(
        stdout_of(&nothing).contains("no task matches"),
        "{}",
        stdout_of(&nothing)
    );
}

#[test]
fn fork_from_a_phase_reruns_only_that_phase_and_after_with_the_earlier_outputs() {
    let queue = TestQueue::new();
    let setup_runs = queue.aux("setup.runs");
    let step = "import json, sys\n\
                r = json.load(sys.stdin)\n\
                s = r['state']\n\
                s['total'] += r['inputs']['setup']['scale']\n\
                print(json.dumps({'state': s}))";
    let task = json!({
        "id": "acc",
        "phases": [
            {"name": "setup", "run": ["sh", "-c",
                format!("echo run >> '{}'; echo '{{\"scale\": 2}}'", setup_runs.display())]},
            {"name": "sum", "kind": "loop", "run": ["python3", "-c", step],
             "initial_state": {"total": 0}, "max_iterations": 4},
            {"name": "report", "run": ["python3", "-c",
                "import json, sys; r = json.load(sys.stdin); print(json.dumps({'seen': r['inputs']['sum']['total']}))"]},
        ]
    });
    queue.seed_task("acc.json", &task);
    queue.run_until_idle(&[]);
    let source = queue.done("acc").expect("the source finished");
    assert_eq!(source["result"], json!({"seen": 8}), "{source:#}");

    let bad = queue.cairn_output(&["fork", "acc", "--from-phase", "nope"], b"");
    assert_eq!(bad.status.code(), Some(2), "{}", stderr_of(&bad));
    assert!(
        stderr_of(&bad).contains("no phase \"nope\""),
        "{}",
        stderr_of(&bad)
    );

    let out = queue.cairn_output(
        &["fork", "acc", "--from-phase", "sum", "--as", "acc-rerun"],
        b"",
    );
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_eq!(stdout_of(&out).trim(), "acc-rerun");
    // A patch with --from-phase patches the earlier outputs the restarted phase reads.
    let out = queue.cairn_output(
        &[
            "fork",
            "acc",
            "--from-phase",
            "sum",
            "--patch",
            r#"{"setup": {"scale": 5}}"#,
            "--as",
            "acc-scaled",
        ],
        b"",
    );
    assert!(out.status.success(), "{}", stderr_of(&out));
    queue.run_until_idle(&[]);

    let rerun = queue.done("acc-rerun").expect("the fork finished");
    assert_eq!(
        rerun["phase_outputs"]["setup"],
        source["phase_outputs"]["setup"]
    );
    assert_eq!(rerun["result"], json!({"seen": 8}), "{rerun:#}");
    assert_eq!(
        rerun["forked_from"],
        json!({"task_id": "acc", "generation": 0, "phase": "sum"}),
        "{rerun:#}"
    );
    let scaled = queue.done("acc-scaled").expect("the patched fork finished");
    assert_eq!(scaled["result"], json!({"seen": 20}), "{scaled:#}");
    let runs = std::fs::read_to_string(&setup_runs).unwrap();
    assert_eq!(
        runs.lines().count(),
        1,
        "the setup phase ran again: {runs:?}"
    );
    // The source's journal names the fork.
    let shown = queue.cairn_output(&["show", "acc"], b"");
    assert!(
        stdout_of(&shown).contains("acc-rerun"),
        "{}",
        stdout_of(&shown)
    );
}

/// Alice and Bob each run two slow loops on a queue shared as `docs/service.md` sets it up,
/// under a daemon that runs tasks as their submitters: Alice's `pause --all` pauses her two
/// and is refused, task by task, for Bob's, which keep running; root's
/// `pause --submitter BOB` then pauses only Bob's.
#[test]
fn bulk_pause_touches_only_what_the_asker_may_steer() {
    const TEST: &str = "bulk_pause_touches_only_what_the_asker_may_steer";
    if !require_root(TEST, "it creates users and runs tasks as them")
        || require_tool(TEST, "setpriv", "util-linux").is_none()
        || require_tool(TEST, "useradd", "passwd").is_none()
    {
        return;
    }
    let users = SystemUsers::create(&["a", "b"]);
    let (alice, bob) = (&users.users[0], &users.users[1]);
    let queue = TestQueue::new();
    share_with_group(&queue, 0, users.gid);
    let mut daemon = queue.start_wrapped(
        &[
            "setpriv",
            &format!("--regid={}", users.gid),
            "--clear-groups",
        ],
        &["--run-as-submitter"],
    );
    let fixture = fixture("logging_loop.py");
    let slow_loop = |id: &str| {
        json!({"id": id, "phases": [{"name": "count", "kind": "loop", "max_iterations": 600,
            "run": ["sh", "-c", "exec python3 \"$0\" \"$CAIRN_SCRATCH/side\" --sleep 0.5",
                    fixture.to_str().unwrap()]}]})
    };
    for (user, ids) in [(alice, ["a1", "a2"]), (bob, ["b1", "b2"])] {
        for id in ids {
            let out = cairn_as(
                &queue,
                &users,
                user,
                &["submit", "-"],
                slow_loop(id).to_string().as_bytes(),
            );
            assert!(
                out.status.success(),
                "{}'s submit: {}",
                user.name,
                stderr_of(&out)
            );
        }
    }
    let state = |id: &str| {
        work_entry(queue.root(), id).and_then(|e| e["status"].as_str().map(str::to_string))
    };
    wait_until("all four to run", DEADLINE, || {
        ["a1", "a2", "b1", "b2"]
            .iter()
            .all(|id| state(id).as_deref() == Some("running"))
    });

    let out = cairn_as(&queue, &users, alice, &["pause", "--all", "--yes"], b"");
    let (stdout, stderr) = (stdout_of(&out), stderr_of(&out));
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    for id in ["b1", "b2"] {
        assert!(
            stdout.contains(&format!("refused the request for {id}")),
            "{stdout}"
        );
    }
    assert!(
        stdout.contains("2 of 4 task(s) asked, 2 refused"),
        "{stdout}"
    );
    wait_until("alice's tasks to pause", DEADLINE, || {
        ["a1", "a2"]
            .iter()
            .all(|id| state(id).as_deref() == Some("paused"))
    });
    assert_eq!(state("b1").as_deref(), Some("running"));
    assert_eq!(state("b2").as_deref(), Some("running"));

    let out = queue.cairn_output(&["pause", "--submitter", &bob.name, "--yes", "--json"], b"");
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_eq!(listed_ids(&json_of(&out)), ["b1", "b2"]);
    wait_until("bob's tasks to pause", DEADLINE, || {
        ["b1", "b2"]
            .iter()
            .all(|id| state(id).as_deref() == Some("paused"))
    });
    daemon.signal(nix::sys::signal::Signal::SIGTERM);
    daemon.wait_exit(DEADLINE);
}
