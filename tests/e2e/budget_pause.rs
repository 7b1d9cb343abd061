//! Spend an operator can steer, with the real daemon: a task with `budget.on_exceed: "pause"`
//! is held paused at its budget (also across SIGKILLs, the iterations they lost priced), shows
//! why in `status` and `show`, and continues from its checkpoint once `cairn budget` raised its
//! limit and `cairn resume` let it go, the raise journaled with who made it; a task with
//! `retry.on_exhausted: "pause"` is held with its last error once its attempts are used up,
//! and runs again, with fresh attempts, once the cause is fixed and it is resumed; a limit
//! raised while a task runs holds from its next iteration.

use std::path::Path;

use crate::common::*;
use serde_json::{json, Value};

/// A loop of `iterations` over `tests/fixtures/budget_loop.py`, each iteration billing 0.01 to
/// `charges` as it starts and taking `sleep` seconds, paused by a budget of `max_cost`.
fn paused_by_budget(
    id: &str,
    side: &Path,
    charges: &Path,
    max_cost: f64,
    iterations: u64,
) -> Value {
    json!({
        "id": id,
        "budget": {"max_cost": max_cost, "on_exceed": "pause"},
        "retry": {"max_attempts": 10, "backoff": "100ms"},
        "phases": [{
            "name": "spend", "kind": "loop", "max_iterations": iterations,
            "run": ["python3", fixture("budget_loop.py"), side, "--sleep", "1.0",
                    "--cost", "0.01", "--charges", charges],
        }],
    })
}

/// The task's entry's `status`, while it has one.
fn entry_status(queue: &TestQueue, id: &str) -> Option<String> {
    queue
        .active_entry(id)
        .and_then(|e| e["status"].as_str().map(str::to_string))
}

/// The iterations the task's checkpoints committed (0 before the first).
fn committed(queue: &TestQueue, id: &str) -> u64 {
    if queue.path(&format!("incremental/{id}.json.gz")).exists() {
        queue.checkpoint(id).iteration_count
    } else {
        0
    }
}

/// What `budget_loop.py --charges` billed, in cents (exact).
fn charged_cents(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|line| (line.parse::<f64>().unwrap() * 100.0).round() as u64)
        .sum()
}

/// `cairn status --json`'s object for task `id`.
fn listed(queue: &TestQueue, id: &str) -> (Value, Value) {
    let out = queue.cairn_output(&["status", "--json"], b"");
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    let task = status["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("{id} is not listed: {status:#}"));
    (task, status)
}

/// Run `cairn ARGS`, which must succeed; its stdout.
fn cairn_ok(queue: &TestQueue, args: &[&str]) -> String {
    let out = queue.cairn_output(args, b"");
    assert!(out.status.success(), "cairn {args:?}: {}", stderr_of(&out));
    stdout_of(&out)
}

/// Start the daemon up to `kills` times, and SIGKILL it each time a new iteration is committed
/// and the next one has started (and billed), until the task is paused; then start it once
/// more, and return it with the task paused. Returns the kills made too.
fn kill_until_paused(queue: &TestQueue, id: &str, side: &Path, kills: u32) -> (Daemon, u32) {
    let paused = |queue: &TestQueue| entry_status(queue, id).as_deref() == Some("paused");
    let mut made = 0;
    while made < kills && !paused(queue) {
        let mut daemon = queue.start(&[]);
        let before = committed(queue, id);
        let settled = wait_for(
            "a new commit and the next iteration started",
            DEADLINE,
            || {
                if paused(queue) {
                    return Some(false);
                }
                let count = committed(queue, id);
                let started = side_events(side)
                    .iter()
                    .any(|e| e.event == "start" && e.iteration == count);
                (count > before && started).then_some(true)
            },
        );
        daemon.kill_hard();
        if !settled {
            break;
        }
        made += 1;
    }
    let daemon = queue.start(&[]);
    wait_until("the task is paused by its budget", DEADLINE, || {
        paused(queue)
    });
    (daemon, made)
}

#[test]
fn a_task_paused_by_its_budget_across_sigkills_continues_once_raised_and_resumed() {
    let queue = TestQueue::new();
    let side = queue.aux("paid.side");
    let charges = queue.aux("paid.charges");
    queue.seed_task(
        "paid.json",
        &paused_by_budget("paid", &side, &charges, 0.05, 7),
    );
    let (mut daemon, kills) = kill_until_paused(&queue, "paid", &side, 3);
    // Each kill lost the iteration in flight, priced at 0.01: with a commit or two between
    // kills, 0.05 is reached after two or three of them.
    assert!(
        kills >= 2,
        "the daemon was killed {kills} times before the pause"
    );
    let entry = queue.active_entry("paid").unwrap();
    assert_eq!(entry["lost_iterations"], kills, "{entry:#}");

    // Paused, not failed, at most one iteration past the budget, its checkpoint kept.
    assert!(queue.failed("paid").is_none());
    let entry = queue.active_entry("paid").unwrap();
    assert_eq!(entry["paused_for"]["reason"], "budget", "{entry:#}");
    assert_eq!(entry["paused_for"]["limit"], 0.05, "{entry:#}");
    let spent = entry["paused_for"]["spent"].as_f64().unwrap();
    assert!((0.05..=0.06).contains(&spent), "{entry:#}");
    let at_pause = charged_cents(&charges);
    assert!(
        at_pause <= 6,
        "billed {at_pause} cents with a budget of 5 ({kills} kills)"
    );
    let committed_at_pause = committed(&queue, "paid");
    assert!(committed_at_pause >= 1, "{entry:#}");

    // status and show say why, with what was spent and the limit.
    let (task, status) = listed(&queue, "paid");
    assert_eq!(task["state"], "paused", "{status:#}");
    assert_eq!(task["paused_for"]["reason"], "budget", "{status:#}");
    assert_eq!(task["max_cost"], 0.05, "{status:#}");
    // The spend of the submitter's tasks listed: this one task's.
    let spend = status["spend_by_submitter"].as_array().unwrap();
    assert_eq!(spend.len(), 1, "{status:#}");
    assert_eq!(spend[0]["tasks"], 1, "{status:#}");
    assert_eq!(spend[0]["cost"], task["cost"], "{status:#}");
    assert_eq!(
        spend[0]["lost_cost_estimate"], task["lost_cost_estimate"],
        "{status:#}"
    );
    assert_eq!(spend[0]["submitted_by"], task["submitted_by"], "{status:#}");
    let table = cairn_ok(&queue, &["status"]);
    assert!(table.contains("paused(budget)"), "{table}");
    assert!(table.contains("cost by submitter"), "{table}");
    assert!(
        table.contains(&format!("budget: spent {spent} of 0.05")),
        "{table}"
    );
    let show = cairn_ok(&queue, &["show", "paid"]);
    assert!(
        show.contains("paused for") && show.contains("cairn budget paid"),
        "{show}"
    );

    // Raising does not resume: the task stays paused, nothing runs.
    let raised = cairn_ok(&queue, &["budget", "paid", "--max-cost", "0.10"]);
    assert!(raised.contains("took the request"), "{raised}");
    let (task, _) = listed(&queue, "paid");
    assert_eq!(task["state"], "paused");
    assert_eq!(task["max_cost"], 0.1);
    assert_eq!(
        charged_cents(&charges),
        at_pause,
        "the raise alone ran an iteration"
    );

    cairn_ok(&queue, &["resume", "paid"]);
    let done = queue.wait_done("paid");
    daemon.signal(SIGTERM);
    assert_eq!(daemon.wait_exit(DEADLINE).code(), Some(0));

    // Every iteration ran, from the checkpoint on, each at most once more than the kills
    // allow; the whole spend stayed within the new limit plus one iteration.
    assert_eq!(
        done["result"],
        json!({"done": (0..7).collect::<Vec<u64>>()}),
        "{done:#}"
    );
    assert_eq!(done["max_cost"], 0.1, "{done:#}");
    let billed = charged_cents(&charges);
    assert!(
        billed <= 11,
        "billed {billed} cents with a limit of 10 ({kills} kills)"
    );
    let starts = start_counts(&side);
    assert_eq!(
        starts.keys().copied().collect::<Vec<_>>(),
        (0..7).collect::<Vec<_>>()
    );
    let repeated: usize = starts.values().map(|n| n - 1).sum();
    assert!(
        repeated <= kills as usize,
        "{repeated} repeated runs after {kills} kills: {starts:?}"
    );
    let spent = crate_cost(&done);
    assert!(spent <= 0.11, "{done:#}");

    // The journal names the raise, the old and new limit, and who made it.
    let journal = std::fs::read_to_string(queue.path("runs/paid/events.jsonl")).unwrap();
    let raise: Value = journal
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .find(|e| e["event"] == "budget_set")
        .unwrap_or_else(|| panic!("no budget_set event: {journal}"));
    assert_eq!(
        (raise["from"].clone(), raise["to"].clone()),
        (json!(0.05), json!(0.1))
    );
    let uid = nix::unistd::geteuid().as_raw();
    let by = raise["by"].as_str().unwrap();
    assert!(by.contains(&format!("uid {uid}")), "{raise}");
    assert!(journal.contains("\"reason\":\"budget: spent"), "{journal}");
}

/// The committed cost plus the estimate for lost iterations of a record.
fn crate_cost(record: &Value) -> f64 {
    record["cost"].as_f64().unwrap_or(0.0) + record["lost_cost_estimate"].as_f64().unwrap_or(0.0)
}

#[test]
fn a_task_whose_attempts_are_used_up_pauses_and_runs_again_once_fixed_and_resumed() {
    let queue = TestQueue::new();
    let fixed = queue.aux("fixed");
    queue.seed_task(
        "flaky.json",
        &json!({
            "id": "flaky",
            "retry": {"max_attempts": 3, "backoff": "100ms", "on_exhausted": "pause"},
            "phases": [{"name": "check", "run": ["sh", "-c", "test -f \"$0\"", fixed]}],
        }),
    );
    let mut daemon = queue.start(&[]);
    wait_until(
        "the task is paused with its attempts used up",
        DEADLINE,
        || entry_status(&queue, "flaky").as_deref() == Some("paused"),
    );
    assert!(queue.failed("flaky").is_none());
    let (task, status) = listed(&queue, "flaky");
    assert_eq!(
        task["paused_for"]["reason"], "retries_exhausted",
        "{status:#}"
    );
    assert_eq!(task["paused_for"]["failed_attempts"], 3, "{status:#}");
    assert_eq!(task["failed_attempts"], 3, "{status:#}");
    let error = task["error"].as_str().unwrap();
    assert!(error.contains("command failed"), "{status:#}");
    let table = cairn_ok(&queue, &["status"]);
    assert!(table.contains("paused(retries_exhausted)"), "{table}");
    let show = cairn_ok(&queue, &["show", "flaky"]);
    assert!(
        show.contains("retries exhausted: 3 failed attempt(s)"),
        "{show}"
    );

    std::fs::write(&fixed, b"").unwrap();
    cairn_ok(&queue, &["resume", "flaky"]);
    let done = queue.wait_done("flaky");
    daemon.signal(SIGTERM);
    assert_eq!(daemon.wait_exit(DEADLINE).code(), Some(0));
    // A fourth attempt, numbered on; the failures before the resume are counted afresh.
    assert_eq!(done["attempts"], 4, "{done:#}");
    assert_eq!(done["failed_attempts"], 0, "{done:#}");
}

#[test]
fn a_budget_request_names_a_limit_and_a_task_in_flight() {
    let queue = TestQueue::new();
    for bad in ["--max-cost=-1", "--max-cost=inf", "--max-cost=NaN"] {
        let out = queue.cairn_output(&["budget", "nosuch", bad], b"");
        assert_eq!(out.status.code(), Some(2), "{bad}: {}", stderr_of(&out));
        assert!(
            stderr_of(&out).contains("--max-cost must be a number of at least 0"),
            "{bad}: {}",
            stderr_of(&out)
        );
    }
    let side = queue.aux("done.side");
    queue.seed_task("quick.json", &loop_task("quick", &side, 1, 0.0));
    queue.run_until_idle(&[]);
    let mut daemon = queue.start(&[]);
    let out = queue.cairn_output(&["budget", "quick", "--max-cost", "1"], b"");
    daemon.signal(SIGTERM);
    daemon.wait_exit(DEADLINE);
    assert!(!out.status.success(), "{}", stdout_of(&out));
    assert!(
        stderr_of(&out).contains("not in flight"),
        "{}",
        stderr_of(&out)
    );
}

/// A loop of `iterations` whose every iteration waits for the file `gate`, then bills 0.01.
pub(crate) fn gated_loop(id: &str, gate: &Path, max_cost: f64, iterations: u64) -> Value {
    let wait_then_bill =
        "while [ ! -f \"$0\" ]; do sleep 0.05; done; printf '{\"state\": null, \"cost\": 0.01}'";
    json!({
        "id": id,
        "budget": {"max_cost": max_cost},
        "phases": [{
            "name": "spend", "kind": "loop", "max_iterations": iterations,
            "run": ["sh", "-c", wait_then_bill, gate],
        }],
    })
}

#[test]
fn a_limit_raised_while_the_task_runs_holds_from_its_next_iteration() {
    let queue = TestQueue::new();
    let gate = queue.aux("gate");
    // Its first iteration alone would reach the budget and fail it.
    queue.seed_task("gated.json", &gated_loop("gated", &gate, 0.01, 3));
    let mut daemon = queue.start(&[]);
    wait_until("the first iteration runs", DEADLINE, || {
        entry_status(&queue, "gated").as_deref() == Some("running")
    });
    let raised = cairn_ok(&queue, &["budget", "gated", "--max-cost", "0.05"]);
    assert!(raised.contains("took the request"), "{raised}");
    std::fs::write(&gate, b"").unwrap();
    let done = queue.wait_done("gated");
    daemon.signal(SIGTERM);
    assert_eq!(daemon.wait_exit(DEADLINE).code(), Some(0));
    assert_eq!(
        (&done["cost"], &done["max_cost"]),
        (&json!(0.03), &json!(0.05)),
        "{done:#}"
    );
    assert!(queue.failed("gated").is_none());
}
