//! Spend an operator can steer on a queue shared in a real, throwaway PostgreSQL (see
//! `tests/common/postgres.rs`): a task with `budget.on_exceed: "pause"` is handed back paused
//! at its budget, shows why in `status --db`, has its limit raised by `cairn budget --db`
//! (applied in SQL, as no daemon holds a paused task; journaled with the database role that
//! asked), stays paused until `cairn resume --db`, and then finishes from its checkpoint; and a
//! limit raised while the task runs is handed to the daemon holding it, which applies it.

use serde_json::{json, Value};

use crate::common::postgres::{cairn_db, final_record, query_texts, PgCluster};
use crate::common::{fixture, side_events, stderr_of, stdout_of, wait_for, TestQueue, DEADLINE};

/// Run `cairn ARGS` on the shared queue at `url`, which must succeed; its stdout.
fn ok(url: &str, args: &[&str]) -> String {
    let output = cairn_db(url, args).output().expect("running cairn");
    assert!(
        output.status.success(),
        "cairn {args:?}: {}",
        stderr_of(&output)
    );
    stdout_of(&output)
}

fn state_of(url: &str, id: &str) -> Option<String> {
    query_texts(url, "SELECT state FROM cairn_tasks WHERE id = $1", &[id])
        .into_iter()
        .next()
        .and_then(|row| row.into_iter().next().flatten())
}

/// The task `id` of `cairn status --json --db`.
fn listed(url: &str, id: &str) -> Value {
    let status: Value = serde_json::from_str(&ok(url, &["status", "--json"])).unwrap();
    status["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("{id} is not listed: {status:#}"))
}

/// The task's journal events named `name`, from `cairn_events`.
fn events_named(url: &str, id: &str, name: &str) -> Vec<Value> {
    query_texts(
        url,
        "SELECT event::text FROM cairn_events WHERE task_id = $1 AND event->>'event' = $2 ORDER BY id",
        &[id, name],
    )
    .into_iter()
    .filter_map(|row| row.into_iter().next().flatten())
    .map(|text| serde_json::from_str(&text).unwrap())
    .collect()
}

#[test]
fn a_task_paused_by_its_budget_on_the_database_is_raised_resumed_and_finishes() {
    let test = "a_task_paused_by_its_budget_on_the_database_is_raised_resumed_and_finishes";
    let Some(cluster) = PgCluster::start(test) else {
        return;
    };
    let url = cluster.url();
    let host = TestQueue::new();
    ok(&url, &["db", "migrate"]);
    let side = host.aux("spend.side");
    let task = json!({
        "id": "spend",
        "budget": {"max_cost": 0.03, "on_exceed": "pause"},
        "phases": [{
            "name": "spend", "kind": "loop", "max_iterations": 6,
            "run": ["python3", fixture("budget_loop.py"), side, "--sleep", "0.1", "--cost", "0.01"],
        }],
    });
    let file = host.aux("spend.json");
    std::fs::write(&file, task.to_string()).unwrap();
    ok(&url, &["submit", file.to_str().unwrap()]);
    let mut daemon = host.start(&["--db", &url, "--node", "n1", "--lease", "5s"]);
    wait_for("the task is paused by its budget", DEADLINE, || {
        (state_of(&url, "spend").as_deref() == Some("paused")).then_some(())
    });

    let paused = listed(&url, "spend");
    assert_eq!(paused["state"], "paused", "{paused:#}");
    assert_eq!(paused["paused_for"]["reason"], "budget", "{paused:#}");
    assert_eq!(paused["paused_for"]["spent"], 0.03, "{paused:#}");
    assert_eq!(paused["paused_for"]["limit"], 0.03, "{paused:#}");
    assert_eq!(paused["max_cost"], 0.03, "{paused:#}");
    let ran_at_pause = side_events(&side).len();
    assert_eq!(ran_at_pause, 6, "three iterations, a start and an end each");

    let raised = ok(&url, &["budget", "spend", "--max-cost", "0.06"]);
    assert!(raised.contains("took the request"), "{raised}");
    assert_eq!(state_of(&url, "spend").as_deref(), Some("paused"));
    assert_eq!(listed(&url, "spend")["max_cost"], 0.06);
    let raise = events_named(&url, "spend", "budget_set");
    assert_eq!(raise.len(), 1, "{raise:?}");
    assert_eq!(
        (&raise[0]["from"], &raise[0]["to"]),
        (&json!(0.03), &json!(0.06))
    );
    let by = raise[0]["by"].as_str().unwrap();
    assert!(by.starts_with("database role "), "{by}");
    assert_eq!(
        side_events(&side).len(),
        ran_at_pause,
        "the raise alone ran an iteration"
    );

    ok(&url, &["resume", "spend"]);
    let record = wait_for("the task is done", DEADLINE, || {
        final_record(&url, "spend").filter(|r| r["status"] == "done")
    });
    daemon.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(daemon.wait_exit(DEADLINE).code(), Some(0));
    assert_eq!(
        record["result"],
        json!({"done": [0, 1, 2, 3, 4, 5]}),
        "{record:#}"
    );
    assert_eq!(record["cost"], 0.06, "{record:#}");
    assert_eq!(record["max_cost"], 0.06, "{record:#}");
    // Resumed from its checkpoint: each iteration ran once.
    assert_eq!(side_events(&side).len(), 12);
    // status --db sums the spend of the tasks it lists by submitter.
    let status: Value = serde_json::from_str(&ok(&url, &["status", "--json"])).unwrap();
    let spend = status["spend_by_submitter"].as_array().unwrap();
    assert_eq!(spend.len(), 1, "{status:#}");
    assert_eq!(
        (&spend[0]["tasks"], &spend[0]["cost"]),
        (&json!(1), &json!(0.06)),
        "{status:#}"
    );
}

#[test]
fn a_limit_raised_on_the_database_while_the_task_runs_is_applied_by_its_daemon() {
    let test = "a_limit_raised_on_the_database_while_the_task_runs_is_applied_by_its_daemon";
    let Some(cluster) = PgCluster::start(test) else {
        return;
    };
    let url = cluster.url();
    let host = TestQueue::new();
    ok(&url, &["db", "migrate"]);
    let gate = host.aux("gate");
    let file = host.aux("gated.json");
    let task = crate::budget_pause::gated_loop("gated", &gate, 0.01, 3);
    std::fs::write(&file, task.to_string()).unwrap();
    ok(&url, &["submit", file.to_str().unwrap()]);
    let mut daemon = host.start(&["--db", &url, "--node", "n1", "--lease", "5s"]);
    wait_for("the first iteration runs", DEADLINE, || {
        (state_of(&url, "gated").as_deref() == Some("running")).then_some(())
    });
    let raised = ok(&url, &["budget", "gated", "--max-cost", "0.05"]);
    assert!(raised.contains("took the request"), "{raised}");
    std::fs::write(&gate, b"").unwrap();
    let record = wait_for("the task has a record", DEADLINE, || {
        final_record(&url, "gated")
    });
    daemon.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(daemon.wait_exit(DEADLINE).code(), Some(0));
    assert_eq!(record["status"], "done", "{record:#}");
    assert_eq!(
        (&record["cost"], &record["max_cost"]),
        (&json!(0.03), &json!(0.05)),
        "{record:#}"
    );
    let raise = events_named(&url, "gated", "budget_set");
    assert_eq!(raise.len(), 1, "{raise:?}");
    assert_eq!(
        (&raise[0]["from"], &raise[0]["to"]),
        (&json!(0.01), &json!(0.05))
    );
    assert!(
        raise[0]["by"]
            .as_str()
            .unwrap()
            .starts_with("database role "),
        "{raise:?}"
    );
}
