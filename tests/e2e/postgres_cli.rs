//! The operator commands on a queue shared in a real, throwaway PostgreSQL (see
//! `tests/common/postgres.rs`), through the real `cairn` binary: `submit --db` (a taken id
//! refused, nothing changed), `validate --db`, a `cairn run --db --exit-when-idle` daemon
//! running what was submitted, `status --db` and `show --db` while it runs and after (node,
//! definition), `history --db` and `checkpoint --db` printing what the file queue prints for
//! the same run, and `prune --db` removing only finished tasks past their retention, with all
//! their rows.

use std::fs;
use std::process::{Output, Stdio};

use serde_json::{json, Value};

use crate::common::postgres::{cairn_db, query_texts, PgCluster};
use crate::common::{
    loop_result, loop_task, once_task, stderr_of, stdout_of, wait_for, Daemon, TestQueue, DEADLINE,
};

/// Run `cairn ARGS` on the shared queue at `url` to its end.
fn run(url: &str, args: &[&str]) -> Output {
    cairn_db(url, args).output().expect("running cairn")
}

/// Run `cairn ARGS` and expect it to succeed; its stdout.
fn ok(url: &str, args: &[&str]) -> String {
    let output = run(url, args);
    assert!(
        output.status.success(),
        "cairn {args:?}: {}\n{}",
        output.status,
        stderr_of(&output)
    );
    stdout_of(&output)
}

/// Run `cairn ARGS` and expect a JSON document on stdout.
fn ok_json(url: &str, args: &[&str]) -> Value {
    let text = ok(url, args);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("cairn {args:?}: {e}: {text}"))
}

/// One text value `statement` returns (its first column of its first row).
fn one(url: &str, statement: &str, params: &[&str]) -> Option<String> {
    query_texts(url, statement, params)
        .into_iter()
        .next()
        .and_then(|row| row.into_iter().next().flatten())
}

/// How many rows of `table` belong to task `id`.
fn rows_of(url: &str, table: &str, id: &str) -> u64 {
    let column = if table == "cairn_tasks" {
        "id"
    } else {
        "task_id"
    };
    one(
        url,
        &format!("SELECT count(*)::text FROM {table} WHERE {column} = $1"),
        &[id],
    )
    .and_then(|n| n.parse().ok())
    .expect("a count")
}

fn state_of(url: &str, id: &str) -> Option<String> {
    one(url, "SELECT state FROM cairn_tasks WHERE id = $1", &[id])
}

/// Write `task` as a task file named `name` beside `host`'s queue.
fn task_file(host: &TestQueue, name: &str, task: &Value) -> String {
    let path = host.aux(name);
    fs::write(&path, serde_json::to_vec_pretty(task).unwrap()).unwrap();
    path.display().to_string()
}

/// The task of `id` in a `status --json` document.
fn status_task<'a>(status: &'a Value, id: &str) -> Option<&'a Value> {
    status["tasks"]
        .as_array()
        .expect("status --json lists tasks")
        .iter()
        .find(|task| task["id"] == id)
}

/// The line of task `id` in `status`'s table.
fn status_line(table: &str, id: &str) -> String {
    table
        .lines()
        .find(|line| line.split_whitespace().next() == Some(id))
        .unwrap_or_else(|| panic!("no line for {id} in:\n{table}"))
        .to_string()
}

/// `cairn run --db` on the local directory `host`, as node `node`, until the shared queue is
/// idle.
fn start_daemon(host: &TestQueue, url: &str, node: &str) -> Daemon {
    host.start(&[
        "--db",
        url,
        "--node",
        node,
        "--lease",
        "5s",
        "--exit-when-idle",
    ])
}

/// A decoded checkpoint without the time it was written (the one field two runs differ in).
fn timeless(mut checkpoint: Value) -> Value {
    let object = checkpoint
        .as_object_mut()
        .expect("a checkpoint is an object");
    assert!(
        object.remove("last_checkpoint_at").is_some(),
        "{checkpoint:?}"
    );
    checkpoint
}

/// The keys of a JSON object, in order.
fn keys(value: &Value) -> Vec<String> {
    value
        .as_object()
        .expect("an object")
        .keys()
        .cloned()
        .collect()
}

const ITERATIONS: u64 = 10;

#[test]
fn submit_validate_status_show_history_and_checkpoint_with_db() {
    let test = "submit_validate_status_show_history_and_checkpoint_with_db";
    let Some(cluster) = PgCluster::start(test) else {
        return;
    };
    let url = cluster.url();
    let host = TestQueue::new();

    // The same loop in a file queue, as the reference for what history and checkpoint print.
    let reference = TestQueue::new();
    let reference_task = loop_task("lp", &reference.aux("lp.side"), ITERATIONS, 0.05);
    reference.drop_task("lp.json", &reference_task);
    let mut reference_daemon = reference.start(&["--exit-when-idle"]);

    // No schema yet: the commands say so rather than create it.
    let task = loop_task("lp", &host.aux("lp.side"), ITERATIONS, 0.5);
    let file = task_file(&host, "lp.json", &task);
    let output = run(&url, &["submit", "--db", &url, &file]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr_of(&output));
    assert!(
        stderr_of(&output).contains("no cairn schema"),
        "{}",
        stderr_of(&output)
    );
    assert!(ok(&url, &["db", "migrate"]).contains("migrated"));

    // validate --db: valid, and the id is free.
    let said = ok(&url, &["validate", &file]);
    assert!(said.contains("valid; phases: count (loop)"), "{said}");
    assert!(
        said.contains("id \"lp\" is free in the shared queue"),
        "{said}"
    );

    // submit --db: the id on stdout, the task queued in the database.
    assert_eq!(ok(&url, &["submit", &file]).trim(), "lp");
    assert_eq!(state_of(&url, "lp").as_deref(), Some("queued"));
    let stored = one(
        &url,
        "SELECT definition::text FROM cairn_tasks WHERE id = $1",
        &["lp"],
    )
    .unwrap();

    // The same id again, or another task under it: refused as the file queue refuses a
    // duplicate (exit 3), and nothing changes.
    let mut other = once_task("lp", &json!({"other": true}));
    other["priority"] = json!(5);
    let other_file = task_file(&host, "other.json", &other);
    for again in [&file, &other_file] {
        let output = run(&url, &["submit", again]);
        assert_eq!(output.status.code(), Some(3), "{}", stderr_of(&output));
        let error = stderr_of(&output);
        assert!(
            error.contains(again.as_str())
                && error.contains("a task with id \"lp\" already exists in the shared queue"),
            "{error}"
        );
        assert!(stdout_of(&output).is_empty(), "{}", stdout_of(&output));
    }
    let count = one(&url, "SELECT count(*)::text FROM cairn_tasks", &[]);
    assert_eq!(count.as_deref(), Some("1"));
    assert_eq!(
        one(
            &url,
            "SELECT definition::text FROM cairn_tasks WHERE id = $1",
            &["lp"]
        )
        .as_deref(),
        Some(stored.as_str())
    );
    // validate --db now reports the id taken, as submit would.
    let output = run(&url, &["validate", "--db", &url, &other_file]);
    assert_eq!(output.status.code(), Some(3), "{}", stderr_of(&output));
    assert!(
        stderr_of(&output).contains("a task with id \"lp\" already exists in the shared queue"),
        "{}",
        stderr_of(&output)
    );

    // A bad file: exit 3 naming it, nothing submitted.
    let broken = host.aux("broken.json");
    fs::write(&broken, b"{\"phases\": [").unwrap();
    let broken = broken.display().to_string();
    for command in ["submit", "validate"] {
        let output = run(&url, &[command, &broken]);
        assert_eq!(output.status.code(), Some(3), "{}", stderr_of(&output));
        assert!(
            stderr_of(&output).contains(&broken),
            "{}",
            stderr_of(&output)
        );
    }
    assert_eq!(
        one(&url, "SELECT count(*)::text FROM cairn_tasks", &[]).as_deref(),
        Some("1")
    );

    // A daemon runs it; while it runs, status and show name the node that holds it.
    let mut daemon = start_daemon(&host, &url, "n1");
    let running = wait_for("the task is running on n1", DEADLINE, || {
        let status = ok_json(&url, &["status", "--json"]);
        let task = status_task(&status, "lp")?.clone();
        (task["state"] == "running" && task["node"] == "n1").then_some(status)
    });
    assert!(
        running["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|node| node["name"] == "n1" && node["alive"] == true),
        "{running}"
    );
    let table = ok(&url, &["status"]);
    let header = table.lines().nth(1).expect("a header line");
    assert!(header.contains("NODE"), "{table}");
    let line = status_line(&table, "lp");
    assert!(line.contains("running") && line.contains("n1"), "{table}");
    let shown = ok_json(&url, &["show", "lp", "--json"]);
    assert_eq!(shown["status"]["node"], "n1", "{shown}");
    let shown = ok(&url, &["show", "lp"]);
    assert!(shown.contains("(node n1, lease epoch"), "{shown}");

    let status = daemon.wait_exit(DEADLINE);
    assert!(status.success(), "{status}\n{}", daemon.stderr());
    let record: Value = serde_json::from_str(
        &one(
            &url,
            "SELECT record::text FROM cairn_records WHERE task_id = $1",
            &["lp"],
        )
        .expect("a record"),
    )
    .unwrap();
    assert_eq!(record["status"], "done", "{record}");
    assert_eq!(record["result"], loop_result(ITERATIONS), "{record}");

    // Finished: status and show, human and JSON, give its state and definition.
    let status = ok_json(&url, &["status", "--json"]);
    let task_status = status_task(&status, "lp").expect("lp in status --json");
    assert_eq!(task_status["state"], "done", "{status}");
    assert_eq!(task_status["iteration"], ITERATIONS, "{status}");
    assert!(task_status.get("node").is_some(), "{status}");
    // The submitter is the user who ran `cairn submit --db`.
    let me = nix::unistd::Uid::effective().as_raw();
    assert_eq!(task_status["submitted_by"]["uid"], me, "{status}");
    assert!(status_line(&ok(&url, &["status"]), "lp").contains("done"));
    let shown = ok_json(&url, &["show", "--json", "lp"]);
    assert_eq!(shown["state"], "done", "{shown}");
    assert_eq!(shown["definition"]["id"], "lp", "{shown}");
    assert_eq!(shown["definition"]["phases"], task["phases"], "{shown}");
    assert_eq!(shown["submitted_by"]["uid"], me, "{shown}");
    assert_eq!(
        record["submitted_by"]["uid"], me,
        "the record names it: {record}"
    );
    let shown = ok(&url, &["show", "lp"]);
    assert!(shown.contains("state       done"), "{shown}");
    assert!(shown.contains("logging_loop.py"), "{shown}");
    assert!(shown.contains("node=n1"), "{shown}");

    // history --db: the generations kept, newest first, one per iteration of the one run.
    let history = ok_json(&url, &["history", "--json", "lp"]);
    let generations = history["generations"].as_array().expect("generations");
    assert!(!generations.is_empty(), "{history}");
    assert_eq!(generations[0]["latest"], true, "{history}");
    assert_eq!(generations[0]["iteration"], ITERATIONS, "{history}");
    for (i, generation) in generations.iter().enumerate() {
        assert_eq!(generation["iteration"], ITERATIONS - i as u64, "{history}");
        assert_eq!(
            generation["generation"], generation["iteration"],
            "{history}"
        );
        assert_eq!(generation["phase"], "count", "{history}");
        assert_eq!(generation["error"], Value::Null, "{history}");
        assert_eq!(
            generation["file"],
            format!("cairn_checkpoints/lp/{}", generation["generation"]),
            "{history}"
        );
    }
    let table = ok(&url, &["history", "lp"]);
    let mut lines = table.lines();
    assert!(
        lines.next().unwrap().starts_with("GEN  ITER  PHASE"),
        "{table}"
    );
    let first: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        first[..3],
        [&*ITERATIONS.to_string(), &*ITERATIONS.to_string(), "count"]
    );
    assert_eq!(table.lines().count(), generations.len() + 1, "{table}");

    // checkpoint --db: the decoded state, the latest and an older generation.
    let latest = ok_json(&url, &["checkpoint", "lp"]);
    assert_eq!(latest["task_id"], "lp");
    assert_eq!(latest["iteration_count"], ITERATIONS);
    assert_eq!(latest["partial_results"], loop_result(ITERATIONS));
    assert_eq!(latest["done"], true);
    let older = generations.last().unwrap()["generation"].as_u64().unwrap();
    assert!(older < ITERATIONS, "{history}");
    let at_older = ok_json(&url, &["checkpoint", "lp", "--gen", &older.to_string()]);
    assert_eq!(at_older["generation"], older);
    assert_eq!(at_older["iteration_count"], older);
    assert_eq!(at_older["partial_results"], loop_result(older));
    let output = run(&url, &["checkpoint", "lp", "--gen", "9999"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr_of(&output).contains("no checkpoint generation 9999"),
        "{}",
        stderr_of(&output)
    );
    let output = run(&url, &["history", "ghost"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr_of(&output).contains("has no task \"ghost\""),
        "{}",
        stderr_of(&output)
    );

    // What the file queue prints for the same run: the same documents, but for the time of
    // writing and where the generations are.
    let status = reference_daemon.wait_exit(DEADLINE);
    assert!(status.success(), "reference: {status}");
    let file_cairn = |args: &[&str]| -> Value {
        let output = reference.cairn_output(args, b"");
        assert!(output.status.success(), "{}", stderr_of(&output));
        serde_json::from_str(&stdout_of(&output)).unwrap()
    };
    let from_files = file_cairn(&["checkpoint", "lp"]);
    assert_eq!(keys(&from_files), keys(&latest));
    assert_eq!(timeless(from_files), timeless(latest.clone()));
    let from_files = file_cairn(&["checkpoint", "lp", "--gen", &older.to_string()]);
    assert_eq!(timeless(from_files), timeless(at_older));
    let files_history = file_cairn(&["history", "--json", "lp"]);
    assert_eq!(keys(&files_history), keys(&history));
    let files_generations = files_history["generations"].as_array().unwrap();
    assert_eq!(
        files_generations.len(),
        generations.len(),
        "{files_history}"
    );
    for (file_row, db_row) in files_generations.iter().zip(generations) {
        assert_eq!(keys(file_row), keys(db_row));
        for field in [
            "generation",
            "latest",
            "iteration",
            "phase",
            "phase_index",
            "error",
        ] {
            assert_eq!(
                file_row[field], db_row[field],
                "{field}: {file_row} {db_row}"
            );
        }
    }

    // A generation whose bytes do not decode: history says why, checkpoint falls back to the
    // newest that does, as with files.
    query_texts(
        &url,
        "UPDATE cairn_checkpoints SET bytes = decode('1f8b00', 'hex')
         WHERE task_id = $1 AND generation = $2::text::bigint",
        &["lp", &ITERATIONS.to_string()],
    );
    let history = ok_json(&url, &["history", "--json", "lp"]);
    assert_eq!(
        history["generations"][0]["iteration"],
        Value::Null,
        "{history}"
    );
    assert!(history["generations"][0]["error"].is_string(), "{history}");
    let output = run(&url, &["checkpoint", "lp"]);
    assert!(output.status.success(), "{}", stderr_of(&output));
    let fallback: Value = serde_json::from_str(&stdout_of(&output)).unwrap();
    assert_eq!(fallback["iteration_count"], ITERATIONS - 1);
    assert!(
        stderr_of(&output).contains(&format!(
            "cairn_checkpoints/lp/{ITERATIONS} does not decode"
        )),
        "{}",
        stderr_of(&output)
    );

    // A task read from stdin without an id gets one, printed.
    let mut child = cairn_db(&url, &["submit", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(
        &mut child.stdin.take().unwrap(),
        json!({"phases": [{"name": "p", "run": ["true"]}]})
            .to_string()
            .as_bytes(),
    )
    .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "{}", stderr_of(&output));
    let new_id = stdout_of(&output).trim().to_string();
    assert!(new_id.starts_with("task-"), "{new_id}");
    assert_eq!(state_of(&url, &new_id).as_deref(), Some("queued"));
}

/// Age task `id`'s final record by `days` in the database (as if it had finished then).
fn finished_days_ago(url: &str, id: &str, days: u32) {
    query_texts(
        url,
        "UPDATE cairn_records SET finished_at = now() - $2::text::int * interval '1 day'
         WHERE task_id = $1",
        &[id, &days.to_string()],
    );
}

/// The rows task `id` has in each table.
fn all_rows(url: &str, id: &str) -> Vec<(&'static str, u64)> {
    [
        "cairn_tasks",
        "cairn_checkpoints",
        "cairn_events",
        "cairn_records",
        "cairn_record_history",
        "cairn_outputs",
    ]
    .into_iter()
    .map(|table| (table, rows_of(url, table, id)))
    .collect()
}

fn lines_naming(text: &str, id: &str) -> Vec<String> {
    let task = format!(" task {id} (");
    text.lines()
        .filter(|line| line.contains(&task))
        .map(str::to_string)
        .collect()
}

#[test]
fn prune_with_db_removes_finished_tasks_past_retention_with_all_their_rows() {
    let test = "prune_with_db_removes_finished_tasks_past_retention_with_all_their_rows";
    let Some(cluster) = PgCluster::start(test) else {
        return;
    };
    let url = cluster.url();
    let host = TestQueue::new();
    ok(&url, &["db", "migrate"]);
    let side = host.aux("loops.side");
    let mut failing = once_task("retried", &json!({}));
    failing["phases"][0]["run"] = json!(["false"]);
    failing["retry"] = json!({"max_attempts": 1});
    for task in [
        loop_task("old", &side, 3, 0.05),
        loop_task("recent", &side, 3, 0.05),
        failing,
    ] {
        let id = task["id"].as_str().unwrap().to_string();
        let file = task_file(&host, &format!("{id}.json"), &task);
        assert_eq!(ok(&url, &["submit", &file]).trim(), id);
    }
    let mut daemon = start_daemon(&host, &url, "n1");
    let status = daemon.wait_exit(DEADLINE);
    assert!(status.success(), "{status}\n{}", daemon.stderr());
    for (id, state) in [("old", "done"), ("recent", "done"), ("retried", "failed")] {
        assert_eq!(state_of(&url, id).as_deref(), Some(state), "{id}");
    }
    // Queued, and submitted long ago: its age does not make it finished.
    let waiting = task_file(&host, "waiting.json", &once_task("waiting", &json!({})));
    ok(&url, &["submit", &waiting]);
    query_texts(
        &url,
        "UPDATE cairn_tasks SET submitted_at = now() - interval '30 days' WHERE id = $1",
        &["waiting"],
    );
    // Finished long ago: `old`, and `retried`, which a pending retry request brings back.
    finished_days_ago(&url, "old", 30);
    finished_days_ago(&url, "retried", 30);
    let output = run(&url, &["retry", "--no-wait", "retried"]);
    assert!(output.status.success(), "{}", stderr_of(&output));

    let before: Vec<_> = ["old", "recent", "retried", "waiting"]
        .iter()
        .map(|id| all_rows(&url, id))
        .collect();
    let old_rows = &before[0];
    for table in [
        "cairn_tasks",
        "cairn_checkpoints",
        "cairn_events",
        "cairn_records",
    ] {
        let n = old_rows.iter().find(|(t, _)| *t == table).unwrap().1;
        assert!(
            n > 0,
            "old has rows in {table} before the prune: {old_rows:?}"
        );
    }

    // A dry run says what would go and removes nothing.
    let said = ok(&url, &["prune", "--dry-run"]);
    assert_eq!(lines_naming(&said, "old").len(), 1, "{said}");
    assert!(
        lines_naming(&said, "old")[0].starts_with("would remove task old (done, finished "),
        "{said}"
    );
    for kept in ["recent", "retried", "waiting"] {
        assert!(lines_naming(&said, kept).is_empty(), "{said}");
    }
    assert!(
        said.contains("prune --dry-run: 1 finished task(s)"),
        "{said}"
    );
    let after_dry: Vec<_> = ["old", "recent", "retried", "waiting"]
        .iter()
        .map(|id| all_rows(&url, id))
        .collect();
    assert_eq!(after_dry, before);

    // The prune: `old` and every row of it go; the others stay, row for row.
    let said = ok(&url, &["prune", "--db", &url, "--older-than", "7d"]);
    let line = lines_naming(&said, "old");
    assert_eq!(line.len(), 1, "{said}");
    let checkpoints = old_rows
        .iter()
        .find(|(t, _)| *t == "cairn_checkpoints")
        .unwrap()
        .1;
    assert!(
        line[0].starts_with("removed task old (done, finished ")
            && line[0].contains(&format!(": {checkpoints} checkpoint(s)")),
        "{said}"
    );
    assert!(said.contains("prune: 1 finished task(s)"), "{said}");
    for (table, n) in all_rows(&url, "old") {
        assert_eq!(n, 0, "old still has {n} row(s) in {table}");
    }
    for (i, id) in ["recent", "retried", "waiting"].iter().enumerate() {
        assert_eq!(all_rows(&url, id), before[i + 1], "{id}");
    }
    let status = ok_json(&url, &["status", "--json"]);
    assert!(status_task(&status, "old").is_none(), "{status}");
    assert!(status_task(&status, "recent").is_some(), "{status}");

    // A shorter retention reaches the recent task; never the queued one, nor the one a
    // pending request names.
    let said = ok(&url, &["prune", "--older-than", "0s"]);
    assert_eq!(lines_naming(&said, "recent").len(), 1, "{said}");
    assert!(said.contains("prune: 1 finished task(s)"), "{said}");
    assert_eq!(state_of(&url, "recent"), None);
    assert_eq!(state_of(&url, "waiting").as_deref(), Some("queued"));
    assert_eq!(state_of(&url, "retried").as_deref(), Some("failed"));
}

/// Put a task in state `state` straight into the tables, with a final record `days` old when
/// `record_days` is given, and an earlier record (a retry's) when `history`.
fn put_task(url: &str, id: &str, state: &str, record_days: Option<u32>, history: bool) {
    query_texts(
        url,
        "INSERT INTO cairn_tasks (id, crash_limit, definition, state)
         VALUES ($1, 5, '{\"phases\": [{\"name\": \"p\", \"run\": [\"true\"]}]}', $2)",
        &[id, state],
    );
    if let Some(days) = record_days {
        query_texts(
            url,
            "INSERT INTO cairn_records (task_id, status, record, lease_epoch, finished_at)
             VALUES ($1, 'done', '{}', 1, now() - $2::text::int * interval '1 day')",
            &[id, &days.to_string()],
        );
    }
    if history {
        query_texts(
            url,
            "INSERT INTO cairn_record_history (task_id, status, record, finished_at)
             VALUES ($1, 'failed', '{}', now() - interval '40 days')",
            &[id],
        );
    }
}

#[test]
fn prune_on_the_database_goes_batch_by_batch_and_keeps_what_is_not_finished_or_is_held() {
    let test =
        "prune_on_the_database_goes_batch_by_batch_and_keeps_what_is_not_finished_or_is_held";
    let Some(cluster) = PgCluster::start(test) else {
        return;
    };
    let url = cluster.url();
    ok(&url, &["db", "migrate"]);
    // Five old finished tasks (one with an earlier record), past a batch of two.
    let old = ["f1", "f2", "f3", "f4", "f5"];
    for id in old {
        put_task(&url, id, "done", Some(30), id == "f3");
    }
    // Old records, but not removable: held by a daemon, paused (a record in its history
    // only), running.
    put_task(&url, "held", "done", Some(30), false);
    query_texts(
        &url,
        "UPDATE cairn_tasks SET lease_node = 'n1', lease_expires_at = now() + interval '1 hour'
         WHERE id = $1",
        &["held"],
    );
    put_task(&url, "paused", "paused", None, true);
    put_task(&url, "running", "running", Some(30), false);

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let queue = cairn::queue::postgres::PgQueue::connect(&url).unwrap();
    let prune = |dry_run: bool| {
        let rules = cairn::queue::postgres::PruneRules {
            dry_run,
            batch: 2,
            ..cairn::queue::postgres::PruneRules::older_than(std::time::Duration::from_secs(
                7 * 86_400,
            ))
        };
        runtime.block_on(queue.prune(&rules)).unwrap()
    };
    let ids = |pruned: &cairn::queue::postgres::DbPrune| -> Vec<String> {
        pruned.tasks.iter().map(|t| t.id.clone()).collect()
    };
    let count = || one(&url, "SELECT count(*)::text FROM cairn_tasks", &[]).unwrap();

    // The dry run goes through every batch once, and each is rolled back.
    let dry = prune(true);
    assert_eq!(ids(&dry), old);
    assert_eq!(count(), "8");
    let f3 = dry.tasks.iter().find(|t| t.id == "f3").unwrap();
    assert_eq!((f3.old_records, f3.rows()), (1, 3));

    let pruned = prune(false);
    assert_eq!(ids(&pruned), old);
    assert_eq!(pruned.rows(), dry.rows());
    assert_eq!(count(), "3");
    for id in old {
        assert_eq!(rows_of(&url, "cairn_records", id), 0, "{id}");
    }
    assert_eq!(rows_of(&url, "cairn_record_history", "f3"), 0);
    assert_eq!(rows_of(&url, "cairn_record_history", "paused"), 1);
    for id in ["held", "paused", "running"] {
        assert_eq!(rows_of(&url, "cairn_tasks", id), 1, "{id}");
    }
    assert!(ids(&prune(false)).is_empty());
}

/// `retry --state failed --yes --db` selects from every node's tasks and brings back exactly the
/// failed ones, as on a queue directory (`bulk::retry_by_state_brings_back_exactly_the_failed_tasks`).
#[test]
fn bulk_retry_by_state_on_the_database_brings_back_exactly_the_failed_tasks() {
    let test = "bulk_retry_by_state_on_the_database_brings_back_exactly_the_failed_tasks";
    let Some(cluster) = PgCluster::start(test) else {
        return;
    };
    let url = cluster.url();
    let host = TestQueue::new();
    ok(&url, &["db", "migrate"]);
    let flag = host.aux("fixed");
    let mut failing = Vec::new();
    for n in 0..6 {
        let id = format!("t{n}");
        let checked = if n % 2 == 0 {
            failing.push(id.clone());
            flag.clone()
        } else {
            host.aux("")
        };
        let task = json!({"id": id, "retry": {"max_attempts": 1}, "phases": [{"name": "check",
            "run": ["sh", "-c", format!("test -e '{}' && echo 1", checked.display())]}]});
        let file = task_file(&host, &format!("{id}.json"), &task);
        ok(&url, &["submit", &file]);
    }
    let mut daemon = start_daemon(&host, &url, "n1");
    assert!(daemon.wait_exit(DEADLINE).success(), "{}", daemon.stderr());
    let dry = ok_json(&url, &["retry", "--state", "failed", "--dry-run", "--json"]);
    let listed: Vec<&str> = dry["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, failing);

    fs::write(&flag, b"").unwrap();
    let retried = ok_json(
        &url,
        &["retry", "--state", "failed", "--yes", "--no-wait", "--json"],
    );
    assert_eq!(
        retried["tasks"].as_array().unwrap().len(),
        failing.len(),
        "{retried:#}"
    );
    let mut daemon = start_daemon(&host, &url, "n1");
    assert!(daemon.wait_exit(DEADLINE).success(), "{}", daemon.stderr());
    for n in 0..6 {
        let id = format!("t{n}");
        assert_eq!(state_of(&url, &id).as_deref(), Some("done"), "{id}");
    }
}
