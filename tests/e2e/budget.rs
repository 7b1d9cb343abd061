//! Cost and `budget.max_cost` with the real daemon: a loop whose iterations report their cost
//! stops once the budget is reached, before the next iteration, and ends in `failed/` with
//! status `budget_exceeded`; unknown cost is not zero (a loop or worker that reports none stops
//! after its first iteration); the spent cost survives a stop; a worker over budget is
//! SIGTERMed; and a task within its budget finishes with its cost summed in the record.

use std::path::Path;

use crate::common::*;
use serde_json::{json, Value};

/// A loop task over `tests/fixtures/budget_loop.py` with a budget, each iteration reporting
/// `cost` (or nothing, with `None`).
fn budget_loop(id: &str, side: &Path, max_cost: f64, cost: Option<f64>, sleep: f64) -> Value {
    let mut run = vec![
        json!("python3"),
        json!(fixture("budget_loop.py")),
        json!(side),
        json!("--sleep"),
        json!(sleep.to_string()),
    ];
    if let Some(cost) = cost {
        run.extend([json!("--cost"), json!(cost.to_string())]);
    }
    json!({
        "id": id,
        "budget": {"max_cost": max_cost},
        "phases": [{"name": "spend", "kind": "loop", "run": run, "max_iterations": 10}],
    })
}

/// The failed record of a task stopped by its budget, with its common fields checked.
fn budget_record(queue: &TestQueue, id: &str) -> Value {
    let record = queue
        .failed(id)
        .unwrap_or_else(|| panic!("failed/{id}.json"));
    assert_eq!(record["status"], "budget_exceeded", "{record:#}");
    assert_eq!(record["task_id"], id);
    assert!(queue.done(id).is_none());
    assert!(queue.active_entry(id).is_none());
    record
}

fn error_of(record: &Value) -> &str {
    record["error"].as_str().expect("the record has an error")
}

#[test]
fn a_loop_stops_at_its_budget_before_the_next_iteration() {
    let queue = TestQueue::new();
    let side = queue.aux("spend.side");
    queue.seed_task(
        "spend.json",
        &budget_loop("spend", &side, 4.0, Some(1.5), 0.05),
    );
    queue.run_until_idle(&[]);

    let record = budget_record(&queue, "spend");
    // 1.5 + 1.5 + 1.5 = 4.5 ≥ 4 after the third iteration: no fourth.
    let error = error_of(&record);
    assert!(
        error.contains("budget.max_cost 4 reached (spent 4.5)")
            && !error.contains("budget: budget"),
        "{error:?}"
    );
    assert_eq!(record["cost"], 4.5);
    assert_eq!(record["phase"], "spend");
    assert_eq!(record["attempts"], 1);
    assert_eq!(ended_iterations(&side), vec![0, 1, 2]);
    assert_eq!(
        side_events(&side).len(),
        6,
        "an iteration started after the budget"
    );
    let checkpoint = queue.checkpoint("spend");
    assert_eq!(checkpoint.iteration_count, 3);
    assert_eq!(checkpoint.partial_results, json!({"done": [0, 1, 2]}));
    assert_eq!(checkpoint.cost, Some(4.5));
}

#[test]
fn a_loop_that_reports_no_cost_under_a_budget_stops_after_its_first_iteration() {
    let queue = TestQueue::new();
    let side = queue.aux("unknown.side");
    queue.seed_task(
        "unknown.json",
        &budget_loop("unknown", &side, 100.0, None, 0.05),
    );
    queue.run_until_idle(&[]);

    let record = budget_record(&queue, "unknown");
    let error = error_of(&record);
    assert!(
        error.contains("iteration 0 reported no cost") && error.contains("unknown cost"),
        "{error:?}"
    );
    assert_eq!(ended_iterations(&side), vec![0]);
    assert_eq!(
        side_events(&side).len(),
        2,
        "an iteration started after the unknown cost"
    );
}

#[test]
fn a_loop_within_its_budget_finishes_with_its_cost_summed() {
    let queue = TestQueue::new();
    let side = queue.aux("cheap.side");
    queue.seed_task(
        "cheap.json",
        &budget_loop("cheap", &side, 100.0, Some(1.25), 0.02),
    );
    queue.run_until_idle(&[]);

    let done = queue.done("cheap").expect("done/cheap.json");
    assert_eq!(done["status"], "done");
    assert_eq!(done["cost"], 12.5);
    assert_eq!(done["result"], json!({"done": (0..10).collect::<Vec<_>>()}));
    assert_eq!(queue.checkpoint("cheap").cost, Some(12.5));
    assert!(queue.failed("cheap").is_none());
}

#[test]
fn the_spent_cost_survives_a_stop_and_the_restart_stops_at_the_budget() {
    let queue = TestQueue::new();
    let side = queue.aux("resumed.side");
    queue.seed_task(
        "resumed.json",
        &budget_loop("resumed", &side, 4.0, Some(1.5), 0.3),
    );
    let mut daemon = queue.start(&[]);
    wait_until("the loop has finished an iteration", DEADLINE, || {
        !ended_iterations(&side).is_empty()
    });
    daemon.signal(SIGTERM);
    assert_eq!(daemon.wait_exit(DEADLINE).code(), Some(0));
    let completed = ended_iterations(&side).len() as u64;
    assert!(
        (1..3).contains(&completed),
        "{completed} iterations before the stop"
    );
    assert!(
        queue.failed("resumed").is_none(),
        "stopped by the budget early"
    );
    let checkpoint = queue.checkpoint("resumed");
    assert_eq!(checkpoint.iteration_count, completed);
    assert_eq!(checkpoint.cost, Some(1.5 * completed as f64));

    queue.run_until_idle(&[]);
    let record = budget_record(&queue, "resumed");
    assert!(
        error_of(&record).contains("budget.max_cost 4 reached (spent 4.5)"),
        "{record:#}"
    );
    assert_eq!(record["cost"], 4.5);
    // Three iterations in all, each once: the restart knew what had been spent.
    assert_eq!(ended_iterations(&side), vec![0, 1, 2]);
    assert!(start_counts(&side).values().all(|&n| n == 1));
}

/// A worker task over `tests/fixtures/worker_by_hand.py` with a budget.
fn budget_worker(id: &str, side: &Path, max_cost: f64, args: &[&str]) -> Value {
    let mut run = vec![
        json!("python3"),
        json!(fixture("worker_by_hand.py")),
        json!(side),
    ];
    run.extend(args.iter().map(|a| json!(a)));
    json!({
        "id": id,
        "budget": {"max_cost": max_cost},
        "phases": [{"name": "work", "kind": "worker", "run": run}],
    })
}

/// How long a worker iteration takes in the budget scenarios: the daemon writes the checkpoint
/// before it decides to stop the worker, so its SIGTERM comes after an fsync, which can take a
/// while on a busy machine. The worker should still be in the next iteration by then.
const SLOW: &str = "0.8";

/// The worker ran iterations 0.. in order and stopped soon after the first `stop_at`: the
/// daemon decides at that iteration's message, but the worker does not wait for it and may
/// finish another iteration or two before the SIGTERM arrives (on a busy machine the daemon
/// first spends a checkpoint fsync). Each iteration takes [`SLOW`], so two more is generous.
fn assert_stopped_after(ended: &[u64], stop_at: u64) {
    let n = ended.len() as u64;
    assert_eq!(ended, (0..n).collect::<Vec<_>>());
    assert!(
        (stop_at..=stop_at + 2).contains(&n),
        "{n} iterations ran; the stop was decided after {stop_at}"
    );
}

/// The checks shared by the worker scenarios: it was SIGTERMed, exited 75 and is gone.
fn assert_worker_was_stopped(lines: &[SideLine]) {
    let pid = match lines.first() {
        Some(line) if line.event == "fresh" => line.rest.clone(),
        other => panic!("the worker did not start fresh: {other:?}"),
    };
    assert!(
        lines.contains(&SideLine::new("sigterm", &pid)),
        "the worker got no SIGTERM: {lines:?}"
    );
    assert_eq!(
        lines.last(),
        Some(&SideLine::new("exit", &format!("75 {pid}"))),
        "{lines:?}"
    );
    assert!(!process_alive(pid.parse().unwrap()));
}

#[test]
fn a_worker_that_reports_cost_per_checkpoint_is_stopped_at_its_budget() {
    let queue = TestQueue::new();
    let side = queue.aux("wspend.side");
    queue.seed_task(
        "wspend.json",
        &budget_worker("wspend", &side, 4.0, &["--cost", "1.5", "--sleep", SLOW]),
    );
    queue.run_until_idle(&[]);

    let record = budget_record(&queue, "wspend");
    assert!(
        error_of(&record).contains("budget.max_cost 4 reached (spent 4.5)"),
        "{record:#}"
    );
    let lines = side_lines(&side);
    assert_worker_was_stopped(&lines);
    // The budget was reached at checkpoint 3 (the error's "spent 4.5"); the worker finishes
    // the iteration it is in when the SIGTERM comes, checkpoints it and exits.
    assert_stopped_after(&logged_iterations(&lines, "end"), 3);
    let ended = logged_iterations(&lines, "end");
    let spent = 1.5 * ended.len() as f64;
    assert_eq!(record["cost"], spent);
    let checkpoint = queue.checkpoint("wspend");
    assert_eq!(checkpoint.iteration_count, ended.len() as u64);
    assert_eq!(checkpoint.cost, Some(spent));
}

#[test]
fn a_worker_that_reports_no_cost_under_a_budget_is_stopped_after_its_first_checkpoint() {
    let queue = TestQueue::new();
    let side = queue.aux("wunknown.side");
    queue.seed_task(
        "wunknown.json",
        &budget_worker("wunknown", &side, 100.0, &["--sleep", SLOW]),
    );
    queue.run_until_idle(&[]);

    let record = budget_record(&queue, "wunknown");
    let error = error_of(&record);
    assert!(
        error.contains("checkpoint 1 reported no cost") && error.contains("unknown cost"),
        "{error:?}"
    );
    let lines = side_lines(&side);
    assert_worker_was_stopped(&lines);
    assert_stopped_after(&logged_iterations(&lines, "end"), 1);
}

/// A task whose first phase spends its whole budget and still finishes (the last of its three
/// iterations crosses the budget: 4.5 ≥ 4), followed by `next`.
fn spent_then(id: &str, side: &Path, next: Value) -> Value {
    json!({
        "id": id,
        "budget": {"max_cost": 4.0},
        "phases": [
            {
                "name": "spend",
                "kind": "loop",
                "run": ["python3", fixture("budget_loop.py"), side, "--cost", "1.5", "--sleep", "0.02"],
                "max_iterations": 3,
            },
            next,
        ],
    })
}

/// Once the budget is spent, no later phase of the task may start: whatever its kind, its first
/// command run would be an iteration past the budget.
fn no_phase_starts_once_the_budget_is_spent(kind: &str) {
    let queue = TestQueue::new();
    let side = queue.aux("first.side");
    let next_side = queue.aux("next.side");
    let next_run = |script: &str, extra: &[&str]| {
        let mut run = vec![json!("python3"), json!(fixture(script)), json!(next_side)];
        run.extend(extra.iter().map(|a| json!(a)));
        run
    };
    let next = match kind {
        "loop" => json!({
            "name": "next", "kind": "loop", "max_iterations": 3,
            "run": next_run("budget_loop.py", &["--cost", "1", "--sleep", "0.02"]),
        }),
        "items" => json!({
            "name": "next", "kind": "items", "items": [1, 2, 3],
            "run": next_run("items_twice.py", &["--sleep", "0.02"]),
        }),
        "worker" => json!({
            "name": "next", "kind": "worker",
            "run": next_run("worker_by_hand.py", &["--cost", "1", "--iterations", "3", "--sleep", "0.02"]),
        }),
        other => panic!("no such kind {other}"),
    };
    let id = format!("then-{kind}");
    queue.seed_task(&format!("{id}.json"), &spent_then(&id, &side, next));
    queue.run_until_idle(&[]);

    assert_eq!(ended_iterations(&side), vec![0, 1, 2]);
    let record = budget_record(&queue, &id);
    assert_eq!(record["phase"], "next", "{record:#}");
    assert_eq!(record["phase_outputs"]["spend"], json!({"done": [0, 1, 2]}));
    assert!(
        error_of(&record).contains("budget.max_cost 4 reached (spent 4.5)"),
        "{record:#}"
    );
    assert_eq!(record["cost"], 4.5);
    let ran = std::fs::read_to_string(&next_side).unwrap_or_default();
    assert!(
        ran.is_empty(),
        "the {kind} phase ran after the budget was spent:\n{ran}"
    );
}

#[test]
fn a_loop_phase_does_not_start_once_the_budget_is_spent() {
    no_phase_starts_once_the_budget_is_spent("loop");
}

#[test]
fn an_items_phase_does_not_start_once_the_budget_is_spent() {
    no_phase_starts_once_the_budget_is_spent("items");
}

#[test]
fn a_worker_phase_does_not_start_once_the_budget_is_spent() {
    no_phase_starts_once_the_budget_is_spent("worker");
}

#[test]
fn a_worker_that_reports_cost_without_checkpoints_is_stopped_at_its_budget() {
    // A worker may ignore checkpoints (it then restarts from scratch) and still report what it
    // spends; the budget must hold for it too.
    let queue = TestQueue::new();
    let side = queue.aux("nocp.side");
    let args = ["--cost", "1.5", "--no-checkpoints", "--sleep", SLOW];
    queue.seed_task("nocp.json", &budget_worker("nocp", &side, 4.0, &args));
    queue.run_until_idle(&[]);

    let record = budget_record(&queue, "nocp");
    assert!(
        error_of(&record).contains("budget.max_cost 4 reached (spent 4.5)"),
        "{record:#}"
    );
    let lines = side_lines(&side);
    assert_worker_was_stopped(&lines);
    assert_stopped_after(&logged_iterations(&lines, "end"), 3);
}

/// The iterations the task's checkpoints committed (0 before the first).
fn committed_iterations(queue: &TestQueue, id: &str) -> u64 {
    if queue.path(&format!("incremental/{id}.json.gz")).exists() {
        queue.checkpoint(id).iteration_count
    } else {
        0
    }
}

/// What `budget_loop.py --charges` billed: the sum of its lines, in cents (exact).
fn charged_cents(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|line| {
            let cost: f64 = line.parse().unwrap_or_else(|e| panic!("{line:?}: {e}"));
            (cost * 100.0).round() as u64
        })
        .sum()
}

#[test]
fn iterations_lost_to_sigkills_count_against_the_budget() {
    let queue = TestQueue::new();
    let side = queue.aux("paid.side");
    let charges = queue.aux("paid.charges");
    // Each iteration bills 0.01 as it starts, like a paid API, and takes a second.
    let mut task = budget_loop("paid", &side, 0.05, Some(0.01), 1.0);
    task["phases"][0]["max_iterations"] = json!(20);
    add_args(&mut task, &["--charges", charges.to_str().unwrap()]);
    task["retry"] = json!({"max_attempts": 10, "backoff": "100ms"});
    queue.seed_task("paid.json", &task);

    let committed = |queue: &TestQueue| committed_iterations(queue, "paid");
    let mut kills = 0;
    while kills < 4 && queue.failed("paid").is_none() {
        let mut daemon = queue.start(&[]);
        // After an iteration is committed, kill the daemon once the next one has billed.
        let before = committed(&queue);
        let settled = wait_for(
            "a new iteration is committed and the next one started",
            DEADLINE,
            || {
                if queue.failed("paid").is_some() {
                    return Some(false);
                }
                let count = committed(&queue);
                let started = side_events(&side)
                    .iter()
                    .any(|e| e.event == "start" && e.iteration == count);
                (count > before && started).then_some(true)
            },
        );
        if !settled {
            break;
        }
        daemon.kill_hard();
        kills += 1;
    }
    queue.run_until_idle(&[]);

    let record = budget_record(&queue, "paid");
    let cents = charged_cents(&charges);
    assert!(
        cents <= 6,
        "the task was billed {cents} cents with a budget of 5 (after {kills} kills): {record:#}"
    );
    assert!(record["cost"].as_f64().unwrap() <= 0.05, "{record:#}");
    let estimate = record["lost_cost_estimate"].as_f64();
    assert!(
        estimate.is_some_and(|c| c > 0.0) && record["lost_iterations"].as_u64() > Some(0),
        "the estimate for the iterations lost is not in the record: {record:#}"
    );
    // status and show give the committed cost and the estimate apart.
    let status = queue.cairn_output(&["status", "--json"], b"");
    let status: Value = serde_json::from_slice(&status.stdout).unwrap();
    let listed = &status["tasks"][0];
    assert_eq!(listed["cost"], record["cost"], "{status:#}");
    assert_eq!(
        listed["lost_cost_estimate"].as_f64(),
        estimate,
        "{status:#}"
    );
    let show = queue.cairn_output(&["show", "paid"], b"");
    let show = String::from_utf8_lossy(&show.stdout);
    assert!(
        show.contains("estimated for") && show.contains("in flight when the daemon died"),
        "{show}"
    );
}

/// A daemon killed after it recorded an attempt but before the loop's command started (here
/// held up reading the checkpoint to resume from, by strace) lost no iteration: the restart
/// counts none as spent. Only the kill while an iteration ran is priced.
#[test]
fn a_crash_before_the_loops_command_started_is_not_priced() {
    const TEST: &str = "a_crash_before_the_loops_command_started_is_not_priced";
    if !require_strace(TEST) {
        return;
    }
    let queue = TestQueue::new();
    let side = queue.aux("early.side");
    let mut task = budget_loop("early", &side, 0.05, Some(0.01), 1.0);
    task["retry"] = json!({"max_attempts": 10, "backoff": "100ms"});
    queue.seed_task("early.json", &task);
    let committed = |queue: &TestQueue| committed_iterations(queue, "early");

    // A kill while an iteration runs: one iteration lost.
    let mut daemon = queue.start(&[]);
    wait_until(
        "an iteration is committed and the next one started",
        DEADLINE,
        || {
            let count = committed(&queue);
            count > 0
                && side_events(&side)
                    .iter()
                    .any(|e| e.event == "start" && e.iteration == count)
        },
    );
    daemon.kill_hard();
    let starts_before = side_events(&side).len();

    // A kill after the next attempt is on record, while the daemon reads the checkpoint it
    // resumes from (each open of it held up 5 s), before any command of the attempt.
    let checkpoint = queue.path("incremental/early.json.gz");
    let mut held = queue.start_under_strace(
        &[
            "-f",
            "-qq",
            "-o",
            "/dev/null",
            "-P",
            checkpoint.to_str().unwrap(),
            "-e",
            "trace=openat",
            "-e",
            "inject=openat:delay_enter=5000000",
        ],
        &[],
    );
    let pid = queue.daemon_pid();
    wait_until("the next attempt is on record", DEADLINE, || {
        queue.active_entry("early").is_some_and(|entry| {
            entry["attempt"] == json!(2) && entry["status"] == json!("running")
        })
    });
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), SIGKILL).unwrap();
    held.wait_exit(DEADLINE);
    assert_eq!(
        side_events(&side).len(),
        starts_before,
        "a command of the second attempt started before the kill: the case is not the one meant"
    );

    queue.run_until_idle(&[]);
    let record = budget_record(&queue, "early");
    assert_eq!(
        record["lost_iterations"],
        json!(1),
        "only the kill while an iteration ran loses one: {record:#}"
    );
}

#[test]
fn costs_are_summed_without_float_noise() {
    let queue = TestQueue::new();
    let side = queue.aux("cents.side");
    let mut task = budget_loop("cents", &side, 1.0, Some(0.01), 0.01);
    task["phases"][0]["max_iterations"] = json!(6);
    queue.seed_task("cents.json", &task);
    queue.run_until_idle(&[]);
    let done = queue.wait_done("cents");
    assert_eq!(done["cost"], json!(0.06), "{done:#}");
    let text = std::fs::read_to_string(queue.path("done/cents.json")).unwrap();
    assert!(
        text.contains("\"cost\": 0.06\n") || text.contains("\"cost\": 0.06,"),
        "{text}"
    );
}

/// Start the daemon, wait until the worker writing `side` has committed a new checkpoint
/// (`committed` counts them) and started the next iteration, and SIGKILL the daemon there.
/// False, with nothing killed but the daemon, when `ended` says the task finished first.
fn kill_once_the_next_iteration_started(
    queue: &TestQueue,
    side: &Path,
    committed: impl Fn(&TestQueue) -> u64,
    ended: impl Fn(&TestQueue) -> bool,
) -> bool {
    let mut daemon = queue.start(&[]);
    let before = committed(queue);
    let settled = wait_for(
        "a new checkpoint and the next iteration started",
        DEADLINE,
        || {
            if ended(queue) {
                return Some(false);
            }
            let count = committed(queue);
            let started = logged_iterations(&side_lines(side), "start");
            (count > before && started.last() == Some(&count)).then_some(true)
        },
    );
    daemon.kill_hard();
    settled
}

#[test]
fn a_workers_iterations_lost_to_sigkills_count_against_the_budget() {
    let queue = TestQueue::new();
    let side = queue.aux("wpaid.side");
    // Each iteration bills 0.01 as it starts (a "start" line) and takes a second.
    let mut task = budget_worker("wpaid", &side, 0.05, &["--cost", "0.01", "--sleep", "1.0"]);
    task["retry"] = json!({"max_attempts": 10, "backoff": "100ms"});
    queue.seed_task("wpaid.json", &task);
    let started = || -> Vec<u64> { logged_iterations(&side_lines(&side), "start") };
    let mut kills = 0;
    while kills < 4 && queue.failed("wpaid").is_none() {
        let killed = kill_once_the_next_iteration_started(
            &queue,
            &side,
            |queue| committed_iterations(queue, "wpaid"),
            |queue| queue.failed("wpaid").is_some(),
        );
        if !killed {
            break;
        }
        kills += 1;
    }
    queue.run_until_idle(&[]);

    let record = budget_record(&queue, "wpaid");
    let billed = started().len();
    // The budget is reached at 5 billed iterations; the worker may start one or two more
    // before its SIGTERM arrives (see assert_stopped_after). Without the lost iterations
    // counted, every kill adds one more.
    assert!(
        billed <= 7,
        "the worker was billed {billed} iterations with a budget of 5 (after {kills} kills): {record:#}"
    );
    assert!(
        record["lost_cost_estimate"]
            .as_f64()
            .is_some_and(|c| c > 0.0),
        "{record:#}"
    );
}

/// Iterations lost in a phase are priced at that phase's own largest iteration cost: SIGKILLs
/// during a worker billing 0.01 after a loop billing 0.05 add 0.01 each, not 0.05.
#[test]
fn iterations_lost_in_a_phase_are_priced_at_that_phases_cost() {
    let queue = TestQueue::new();
    let loop_side = queue.aux("two.loop.side");
    let worker_side = queue.aux("two.worker.side");
    let task = json!({
        "id": "two",
        "budget": {"max_cost": 10.0},
        "retry": {"max_attempts": 10, "backoff": "100ms"},
        "phases": [
            {"name": "plan", "kind": "loop", "max_iterations": 2,
             "run": ["python3", fixture("budget_loop.py"), loop_side, "--sleep", "0", "--cost", "0.05"]},
            {"name": "work", "kind": "worker",
             "run": ["python3", fixture("worker_by_hand.py"), &worker_side,
                     "--iterations", "8", "--cost", "0.01", "--sleep", "1.0"]},
        ],
    });
    queue.seed_task("two.json", &task);
    let committed_in_worker = |queue: &TestQueue| -> u64 {
        if !queue.path("incremental/two.json.gz").exists() {
            return 0;
        }
        let checkpoint = queue.checkpoint("two");
        if checkpoint.phase_index == 1 {
            checkpoint.iteration_count
        } else {
            0
        }
    };
    for _ in 0..2 {
        let killed = kill_once_the_next_iteration_started(
            &queue,
            &worker_side,
            committed_in_worker,
            |queue| queue.done("two").is_some(),
        );
        assert!(killed, "the worker finished before it was killed twice");
    }
    queue.run_until_idle(&[]);

    let record = queue.done("two").expect("the task is done");
    assert_eq!(record["lost_iterations"], 2, "{record:#}");
    // Two lost worker iterations at 0.01, not at the loop's 0.05.
    assert_eq!(record["lost_cost_estimate"], json!(0.02), "{record:#}");
}
