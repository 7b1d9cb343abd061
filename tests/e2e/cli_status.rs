//! `cairn status` as an operator runs it against real queues: golden lines for tasks in every
//! state (finished by a real daemon, pending and interrupted written by hand), the `--json`
//! schema, a running loop whose iteration advances and turns `interrupted` when its daemon is
//! killed, and `--watch` off a terminal ending cleanly on a closed pipe and on Ctrl-C.

use std::fs;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use crate::common::*;
use cairn::store::{CheckpointStore, IterationCheckpoint, FORMAT_VERSION};
use serde_json::{json, Value};

/// `cairn status <args>`, which must exit 0; its stdout.
fn status(queue: &TestQueue, args: &[&str]) -> String {
    let mut all = vec!["status"];
    all.extend_from_slice(args);
    let output = queue.cairn_output(&all, b"");
    assert_eq!(
        output.status.code(),
        Some(0),
        "cairn status {args:?} failed: {}",
        stderr_of(&output)
    );
    stdout_of(&output)
}

fn status_json(queue: &TestQueue) -> Value {
    let text = status(queue, &["--json"]);
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("status --json is not JSON ({e}): {text}"))
}

/// The rows of the human table by id: each row's whitespace-separated cells (up to the blank
/// line before the sections that follow the table).
fn table_rows(table: &str) -> Vec<Vec<String>> {
    table
        .lines()
        .skip(1)
        .take_while(|line| !line.is_empty())
        .map(|line| line.split_whitespace().map(str::to_string).collect())
        .collect()
}

/// The task object with this id in a `status --json` document, if listed.
fn find_task(document: &Value, id: &str) -> Option<Value> {
    document["tasks"]
        .as_array()
        .expect("a tasks list")
        .iter()
        .find(|t| t["id"] == id)
        .cloned()
}

/// The task object with this id in a `status --json` document.
fn task(document: &Value, id: &str) -> Value {
    find_task(document, id).unwrap_or_else(|| panic!("no task {id} in {document:#}"))
}

/// The keys of a status task object and the JSON types each may have.
const TASK_SCHEMA: [(&str, &[&str]); 19] = [
    ("id", &["string"]),
    ("state", &["string"]),
    ("phase", &["string", "null"]),
    ("phase_index", &["integer", "null"]),
    ("phase_count", &["integer", "null"]),
    ("iteration", &["integer", "null"]),
    ("total", &["integer", "null"]),
    ("rate_per_min", &["number", "null"]),
    ("eta_seconds", &["integer", "null"]),
    ("cost", &["number", "null"]),
    ("lost_cost_estimate", &["number", "null"]),
    ("max_cost", &["number", "null"]),
    ("paused_for", &["object", "null"]),
    ("last_checkpoint_at", &["string", "null"]),
    ("last_checkpoint_age_seconds", &["integer", "null"]),
    ("attempts", &["integer", "null"]),
    ("failed_attempts", &["integer", "null"]),
    ("error", &["string", "null"]),
    ("submitted_by", &["object", "null"]),
];

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_u64() || n.is_i64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Every documented key is there with an allowed type, and no other key.
fn assert_status_schema(document: &Value) {
    let top = document.as_object().expect("an object");
    let mut keys: Vec<&str> = top.keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "daemon",
            "inbox",
            "limits",
            "queue",
            "rejected",
            "spend_by_submitter",
            "submitters",
            "tasks",
            "version"
        ]
    );
    for spend in document["spend_by_submitter"]
        .as_array()
        .expect("spend_by_submitter is a list")
    {
        let object = spend.as_object().expect("a submitter's spend is an object");
        let mut keys: Vec<&str> = object.keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(
            keys,
            ["cost", "lost_cost_estimate", "submitted_by", "tasks"],
            "{spend}"
        );
        assert_eq!(json_type(&spend["tasks"]), "integer");
    }
    let limits = json_type(&document["limits"]);
    assert!(limits == "null" || limits == "object", "limits is {limits}");
    for count in document["submitters"]
        .as_array()
        .expect("submitters is a list")
    {
        let object = count
            .as_object()
            .expect("a submitter's counts are an object");
        let mut keys: Vec<&str> = object.keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(keys, ["queued", "running", "submitted_by"], "{count}");
        assert_eq!(json_type(&count["queued"]), "integer");
        assert_eq!(json_type(&count["running"]), "integer");
    }
    assert_eq!(json_type(&document["rejected"]), "integer");
    assert_eq!(document["version"], 1);
    assert_eq!(json_type(&document["queue"]), "string");
    assert_eq!(json_type(&document["inbox"]), "integer");
    let daemon = document["daemon"].as_object().expect("daemon is an object");
    assert_eq!(daemon.len(), 2, "{daemon:?}");
    assert_eq!(json_type(&document["daemon"]["running"]), "bool");
    let pid_type = json_type(&document["daemon"]["pid"]);
    if document["daemon"]["running"] == true {
        assert_eq!(pid_type, "integer");
    } else {
        assert_eq!(pid_type, "null");
    }
    for task in document["tasks"].as_array().expect("tasks is a list") {
        let object = task.as_object().expect("a task is an object");
        assert_eq!(object.len(), TASK_SCHEMA.len(), "unexpected keys in {task}");
        for (key, types) in TASK_SCHEMA {
            let found = json_type(
                object
                    .get(key)
                    .unwrap_or_else(|| panic!("{key} missing: {task}")),
            );
            // A whole number may print as an integer where a number is documented.
            let ok = types.contains(&found) || (found == "integer" && types.contains(&"number"));
            assert!(ok, "{key} is {found}, expected one of {types:?}: {task}");
        }
    }
}

/// A pid that belonged to a process that has exited (a dead daemon's `.lock`).
fn dead_pid() -> u32 {
    let mut child = Command::new("true").spawn().expect("running true");
    let pid = child.id();
    child.wait().unwrap();
    pid
}

/// A loop task `id` as it sits in `tasks/` (the daemon's copy).
fn write_task_copy(queue: &TestQueue, id: &str, iterations: u64) {
    let task = loop_task(id, &queue.aux(&format!("{id}.side")), iterations, 0.0);
    fs::create_dir_all(queue.path("tasks")).unwrap();
    fs::write(
        queue.path(&format!("tasks/{id}.json")),
        serde_json::to_vec_pretty(&task).unwrap(),
    )
    .unwrap();
}

/// A queue with one task in each state: `fin` done and `bad` failed by a real daemon, a
/// rejected file, `pend` accepted and never run, and `ghost` whose daemon died mid-loop
/// (`current_work.json` says running, a checkpoint is ahead of its counter).
fn queue_in_every_state() -> TestQueue {
    let queue = TestQueue::new();
    let fin = loop_task("fin", &queue.aux("fin.side"), 3, 0.0);
    queue.seed_task("fin.json", &fin);
    queue.seed_task(
        "bad.json",
        &json!({
            "id": "bad",
            "retry": {"max_attempts": 1},
            "phases": [{"name": "fail", "run": ["sh", "-c", "echo broken on purpose >&2; exit 3"]}],
        }),
    );
    queue.drop_bytes("broken.json", b"{\"phases\": [", true);
    queue.run_until_idle(&[]);

    write_task_copy(&queue, "pend", 5);
    write_task_copy(&queue, "ghost", 10);
    let work = json!({
        "version": 1,
        "updated_at": "2026-01-01T00:00:00Z",
        "active_tasks": [{
            "task_id": "ghost",
            "phase": "count",
            "phase_index": 0,
            "phase_outputs": {},
            "started_at": "2026-01-01T00:00:00Z",
            "last_checkpoint_at": null,
            "attempt": 2,
            "failed_attempts": 1,
            "status": "running",
            "iterations": 4,
            "attempt_started_phase": 0,
            "last_error": "the first attempt failed"
        }]
    });
    fs::write(queue.path("current_work.json"), work.to_string()).unwrap();
    let store = CheckpointStore::open(queue.root()).unwrap();
    let mut checkpoint = IterationCheckpoint {
        format_version: FORMAT_VERSION,
        task_id: "ghost".into(),
        phase: "count".into(),
        phase_index: 0,
        scope: "loop".into(),
        iteration_count: 6,
        checkpoint_interval: 1,
        partial_results: json!({"sum": 55, "seen": [0, 1, 2, 3, 4, 5]}),
        last_checkpoint_at: chrono::Utc::now(),
        attempt: 2,
        generation: 0,
        done: false,
        output: None,
        cost: Some(0.25),
        files: Default::default(),
    };
    store.save(&mut checkpoint).unwrap();
    // The daemon that held the lock is gone; its pid stays in the file.
    fs::write(queue.path(".lock"), format!("{}\n", dead_pid())).unwrap();
    queue
}

#[test]
fn status_shows_each_state_in_stable_columns_and_a_documented_json() {
    let queue = queue_in_every_state();

    let table = status(&queue, &[]);
    let header = table.lines().next().unwrap();
    assert_eq!(
        header.split_whitespace().collect::<Vec<_>>(),
        [
            "ID",
            "STATE",
            "PHASE",
            "ITER",
            "RATE",
            "ETA",
            "COST",
            "CHECKPOINT",
            "SUBMITTER"
        ],
        "{table}"
    );
    let rows = table_rows(&table);
    let first_four: Vec<Vec<&str>> = rows
        .iter()
        .take(4)
        .map(|r| r[..4].iter().map(String::as_str).collect())
        .collect();
    // In flight first, then pending, then finished; by id within each; the rejected file last.
    assert_eq!(
        first_four,
        [
            ["ghost", "interrupted", "count(1/1)", "6/10"],
            ["pend", "pending", "count(1/1)", "0/5"],
            ["bad", "failed", "fail(1/1)", "-"],
            ["fin", "done", "count(1/1)", "3/3"],
        ],
        "{table}"
    );
    assert_eq!(rows.len(), 5, "{table}");
    assert!(rows[4][0].starts_with("rejected-broken-"), "{table}");
    assert_eq!(
        rows[4][1..],
        ["rejected", "-", "-", "-", "-", "-", "-", "-"],
        "{table}"
    );
    // ghost: no rate or ETA without a daemon, its checkpoint's cost, an age.
    assert_eq!(rows[0][4..7], ["-", "-", "0.25"], "{table}");
    assert!(rows[0][7].ends_with('s') && rows[0][8] == "ago", "{table}");
    for row in &rows[1..] {
        assert_eq!(row[4..8], ["-", "-", "-", "-"], "{table}");
    }
    // The tasks a daemon took in name whoever dropped their files (this test's user); those
    // written into tasks/ by hand, and the rejected file, name nobody.
    let me = nix::unistd::User::from_uid(nix::unistd::Uid::effective())
        .unwrap()
        .map(|u| u.name)
        .unwrap_or_else(|| nix::unistd::Uid::effective().to_string());
    let submitters: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| (r[0].as_str(), r.last().unwrap().as_str()))
        .collect();
    assert_eq!(
        submitters[..4],
        [
            ("ghost", "-"),
            ("pend", "-"),
            ("bad", me.as_str()),
            ("fin", me.as_str())
        ],
        "{table}"
    );

    // Every column lines up under its header.
    let starts: Vec<usize> = [
        "STATE",
        "PHASE",
        "ITER",
        "RATE",
        "ETA",
        "COST",
        "CHECKPOINT",
        "SUBMITTER",
    ]
    .iter()
    .map(|h| header.find(h).unwrap())
    .collect();
    for line in table.lines().skip(1).take_while(|line| !line.is_empty()) {
        for start in &starts {
            let before = line.as_bytes()[start - 1];
            let at = line.as_bytes()[*start];
            assert!(
                before == b' ' && at != b' ',
                "misaligned {line:?} in\n{table}"
            );
        }
    }

    let all = status(&queue, &["--all"]);
    let rejected: Vec<Vec<String>> = table_rows(&all)
        .into_iter()
        .filter(|r| r[1] == "rejected")
        .collect();
    assert_eq!(rejected.len(), 1, "{all}");
    assert!(rejected[0][0].starts_with("rejected-broken-"), "{all}");
    assert_eq!(
        rejected[0][2..],
        ["-", "-", "-", "-", "-", "-", "-"],
        "{all}"
    );

    let document = status_json(&queue);
    assert_status_schema(&document);
    assert_eq!(document["daemon"], json!({"running": false, "pid": null}));
    let ghost = task(&document, "ghost");
    assert_eq!(ghost["state"], "interrupted");
    assert_eq!(ghost["phase"], "count");
    assert_eq!(ghost["phase_index"], 0);
    assert_eq!(ghost["phase_count"], 1);
    assert_eq!(
        ghost["iteration"], 6,
        "the checkpoint is fresher than current_work"
    );
    assert_eq!(ghost["total"], 10);
    assert_eq!(ghost["cost"], 0.25);
    assert_eq!(ghost["attempts"], 2);
    assert_eq!(ghost["error"], "the first attempt failed");
    assert_eq!(ghost["rate_per_min"], Value::Null);
    assert!(ghost["last_checkpoint_age_seconds"].as_u64().unwrap() < 60);
    let bad = task(&document, "bad");
    assert_eq!(bad["state"], "failed");
    assert_eq!(bad["attempts"], 1);
    assert!(
        bad["error"].as_str().unwrap().contains("exit status: 3"),
        "{bad}"
    );
    let fin = task(&document, "fin");
    assert_eq!(
        (fin["state"].clone(), fin["iteration"].clone()),
        (json!("done"), json!(3))
    );
    assert_eq!(task(&document, "pend")["attempts"], 0);
    let uid = nix::unistd::Uid::effective().as_raw();
    assert_eq!(fin["submitted_by"]["uid"], uid, "{fin}");
    assert_eq!(fin["submitted_by"]["user"], me.as_str(), "{fin}");
    assert_eq!(ghost["submitted_by"], Value::Null, "{ghost}");
    assert_eq!(document["tasks"].as_array().unwrap().len(), 5);
    assert_eq!(document["rejected"], 1);

    // show agrees: the phase in flight with its progress, the entry's attempts and error.
    let show = stdout_of(&queue.cairn_output(&["show", "ghost"], b""));
    let line = |name: &str| {
        show.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no {name} line in\n{show}"))
            .split_whitespace()
            .skip(1)
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(line("state"), "interrupted (daemon not running)");
    assert_eq!(line("iteration"), "6/10");
    assert_eq!(line("attempts"), "2 (1 failed of 3 allowed)");
    assert_eq!(line("error"), "the first attempt failed");
    assert!(line("checkpoint").ends_with("generation 1"), "{show}");
    assert_eq!(line("1/1"), "count loop interrupted 6/10 -", "{show}");

    // A live process that holds no lock on the queue (a reused pid) is no daemon either.
    fs::write(queue.path(".lock"), format!("{}\n", std::process::id())).unwrap();
    let document = status_json(&queue);
    assert_eq!(document["daemon"]["running"], false);
    assert_eq!(task(&document, "ghost")["state"], "interrupted");
}

#[test]
fn status_json_follows_a_running_loop_and_sees_its_daemon_die() {
    let queue = TestQueue::new();
    queue.seed_task(
        "runner.json",
        &loop_task("runner", &queue.aux("runner.side"), 400, 0.1),
    );
    let mut daemon = queue.start(&[]);

    let first = wait_for("runner has two checkpoints", DEADLINE, || {
        let document = status_json(&queue);
        let runner = find_task(&document, "runner")?;
        (runner["state"] == "running" && runner["iteration"].as_u64()? >= 2).then_some(document)
    });
    assert_status_schema(&first);
    assert_eq!(first["daemon"]["running"], true);
    assert_eq!(first["daemon"]["pid"], daemon.pid());
    let runner = task(&first, "runner");
    assert_eq!(runner["phase"], "count");
    assert_eq!(
        (runner["phase_index"].clone(), runner["phase_count"].clone()),
        (json!(0), json!(1))
    );
    assert_eq!(runner["total"], 400);
    assert_eq!(runner["attempts"], 1);
    let rate = runner["rate_per_min"]
        .as_f64()
        .expect("a rate once checkpoints are written");
    assert!(rate > 0.0, "{runner}");
    let eta = runner["eta_seconds"]
        .as_u64()
        .expect("an ETA with a rate and a total");
    assert!(eta > 0, "{runner}");
    assert!(runner["last_checkpoint_at"].is_string(), "{runner}");
    let at = runner["iteration"].as_u64().unwrap();

    wait_until("runner's iteration advances", DEADLINE, || {
        let document = status_json(&queue);
        task(&document, "runner")["iteration"].as_u64().unwrap() > at
    });
    let table = status(&queue, &[]);
    let row = &table_rows(&table)[0];
    assert_eq!(row[..3], ["runner", "running", "count(1/1)"], "{table}");
    assert!(
        row[3].ends_with("/400") && row[4].ends_with("/min"),
        "{table}"
    );

    daemon.kill_hard();
    let document = status_json(&queue);
    assert_eq!(document["daemon"], json!({"running": false, "pid": null}));
    let runner = task(&document, "runner");
    assert_eq!(
        runner["state"], "interrupted",
        "a running entry without its daemon"
    );
    assert_eq!(runner["rate_per_min"], Value::Null);
    assert_eq!(runner["eta_seconds"], Value::Null);
}

#[test]
fn watch_off_a_terminal_prints_blocks_and_ends_cleanly() {
    let queue = queue_in_every_state();

    // Plain blocks every second; the reader going away ends it with exit 0.
    let mut child = queue
        .cairn()
        .args(["status", "--watch"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut headers = 0;
    let mut block = Vec::new();
    while headers < 2 {
        let line = lines.next().expect("more output").unwrap();
        if line.starts_with("ID ") {
            headers += 1;
        }
        if headers == 1 {
            block.push(line);
        }
    }
    assert!(block.iter().any(|l| l.starts_with("ghost ")), "{block:#?}");
    drop(lines);
    let status = wait_for("status --watch exits on a closed pipe", DEADLINE, || {
        child.try_wait().unwrap()
    });
    assert_eq!(status.code(), Some(0));

    // --json --watch: one document per line; Ctrl-C ends it with exit 0.
    let mut child = queue
        .cairn()
        .args(["status", "--watch", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    for _ in 0..2 {
        let line = lines.next().expect("a JSON line").unwrap();
        let document: Value = serde_json::from_str(&line).unwrap();
        assert_status_schema(&document);
    }
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), SIGINT).unwrap();
    let status = wait_for("status --watch exits on SIGINT", DEADLINE, || {
        child.try_wait().unwrap()
    });
    assert_eq!(status.code(), Some(0));
}

#[test]
fn status_of_a_queue_that_does_not_exist_fails_naming_it() {
    let queue = TestQueue::new();
    let missing = queue.aux("nowhere");
    let output = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .arg("--queue")
        .arg(&missing)
        .arg("status")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr_of(&output).contains(&missing.display().to_string()),
        "{}",
        stderr_of(&output)
    );
    assert!(output.stdout.is_empty());
}

#[test]
fn rejected_files_show_by_default_without_flooding_and_show_finds_them_by_file_name() {
    let queue = TestQueue::new();
    for n in 0..5 {
        queue.drop_bytes(&format!("broken-{n}.json"), b"{\"phases\": [", true);
    }
    queue.drop_bytes(
        "typo.json",
        br#"{"phases": [{"name": "a", "run": ["true"], "colour": 1}]}"#,
        true,
    );
    queue.run_until_idle(&[]);
    assert_eq!(queue.rejections().len(), 6);
    let typo = queue
        .list("failed")
        .into_iter()
        .find_map(|name| {
            name.strip_suffix(".json")
                .filter(|stem| stem.starts_with("rejected-typo-"))
                .map(str::to_string)
        })
        .expect("typo.json's record");

    let output = queue.cairn_output(&["status"], b"");
    assert_eq!(output.status.code(), Some(0), "{}", stderr_of(&output));
    let table = stdout_of(&output);
    let listed: Vec<String> = table_rows(&table)
        .into_iter()
        .filter(|r| r[1] == "rejected")
        .map(|r| r[0].clone())
        .collect();
    // The 3 with the latest rejected_at (RFC 3339 in UTC sorts as text).
    let mut by_time: Vec<(String, String)> = queue
        .rejections()
        .into_values()
        .map(|record| {
            let input = record["input"].as_str().unwrap();
            let name = input
                .strip_prefix("failed/")
                .unwrap()
                .strip_suffix(".input")
                .unwrap();
            (
                record["rejected_at"].as_str().unwrap().to_string(),
                name.to_string(),
            )
        })
        .collect();
    by_time.sort();
    let mut recent: Vec<String> = by_time[3..].iter().map(|(_, name)| name.clone()).collect();
    recent.sort();
    let mut listed_sorted = listed.clone();
    listed_sorted.sort();
    assert_eq!(listed_sorted, recent, "not the 3 most recent: {table}");
    let stderr = stderr_of(&output);
    assert!(
        stderr.contains("6 file(s) were rejected at intake") && stderr.contains("--all"),
        "no note about the rejections not listed: {stderr}"
    );
    let all = status(&queue, &["--all"]);
    let rejected_rows = table_rows(&all)
        .into_iter()
        .filter(|r| r[1] == "rejected")
        .count();
    assert_eq!(rejected_rows, 6, "{all}");
    let document = status_json(&queue);
    assert_eq!(document["rejected"], 6);

    // `show` finds a rejection by the name the file had in the inbox, with or without .json.
    for name in ["typo", "typo.json"] {
        let output = queue.cairn_output(&["show", name], b"");
        let show = stdout_of(&output);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{name}: {}",
            stderr_of(&output)
        );
        assert!(show.contains(&typo), "{name}: {show}");
        assert!(show.contains("rejected"), "{name}: {show}");
        assert!(
            show.contains("phases[0].colour"),
            "{name}: the reason is missing: {show}"
        );
    }
    let output = queue.cairn_output(&["show", "no-such-file"], b"");
    assert_eq!(output.status.code(), Some(1), "{output:?}");
}

#[test]
fn a_finished_worker_keeps_the_total_it_reported() {
    let queue = TestQueue::new();
    queue.seed_task(
        "w.json",
        &json!({
            "id": "w",
            "phases": [{
                "name": "work",
                "kind": "worker",
                "run": ["python3", fixture("worker_by_hand.py"), queue.aux("w.side"),
                        "--iterations", "4", "--sleep", "0"],
            }],
        }),
    );
    queue.run_until_idle(&[]);
    queue.wait_done("w");
    assert_done_at_four_of_four(&queue, "w", "worker");
}

/// `id`, done after 4 iterations of its one phase `work` of `kind`, shows `4/4` in the table,
/// in `--json` and in `show`'s phase row.
fn assert_done_at_four_of_four(queue: &TestQueue, id: &str, kind: &str) {
    let table = status(queue, &[]);
    let row = table_rows(&table)
        .into_iter()
        .find(|r| r[0] == id)
        .unwrap_or_else(|| panic!("no {id} in {table}"));
    assert_eq!(row[1..4], ["done", "work(1/1)", "4/4"], "{table}");
    let shown = task(&status_json(queue), id);
    assert_eq!(
        (shown["iteration"].clone(), shown["total"].clone()),
        (json!(4), json!(4))
    );
    let show = stdout_of(&queue.cairn_output(&["show", id], b""));
    let phase_row: Vec<&str> = show
        .lines()
        .find(|l| l.trim_start().starts_with("1/1"))
        .unwrap_or_else(|| panic!("no phase row in {show}"))
        .split_whitespace()
        .collect();
    assert_eq!(
        phase_row[..5],
        ["1/1", "work", kind, "done", "4/4"],
        "{show}"
    );
}

/// A user who may not list the queue's `tasks/` is told so, naming the directory, rather than
/// shown a queue that looks empty; `inbox/`, which readers who may not submit cannot list,
/// does not stop them.
#[test]
fn status_by_a_user_who_cannot_list_the_queues_state_names_the_directory() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let test = "status_by_a_user_who_cannot_list_the_queues_state_names_the_directory";
    if !require_root(test, "it runs cairn status as another user") {
        return;
    }
    let queue = TestQueue::new();
    queue.seed_task("t.json", &once_task("t", &json!({"ok": true})));
    queue.run_until_idle(&[]);
    queue.wait_done("t");
    let open = |path: &std::path::Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    // Everything readable by others (as by the queue's group), but inbox/.
    fn open_all(path: &std::path::Path, open: &dyn Fn(&std::path::Path, u32)) {
        if std::fs::symlink_metadata(path).unwrap().is_dir() {
            open(path, 0o755);
            for entry in std::fs::read_dir(path).unwrap() {
                open_all(&entry.unwrap().path(), open);
            }
        } else {
            open(path, 0o644);
        }
    }
    open(queue.root().parent().unwrap(), 0o755);
    open_all(queue.root(), &open);
    open(&queue.path("inbox"), 0o700);
    let status_as_nobody = || {
        let mut command = queue.cairn();
        command.args(["status"]).uid(65534).gid(65534);
        command.output().unwrap()
    };
    let readable = status_as_nobody();
    assert_eq!(
        readable.status.code(),
        Some(0),
        "an unlistable inbox/ does not stop a reader: {}",
        String::from_utf8_lossy(&readable.stderr)
    );
    open(&queue.path("tasks"), 0o700);
    let refused = status_as_nobody();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot list {}", queue.path("tasks").display())),
        "{stderr}"
    );
}

/// A loop that ended on `"done": true` before `max_iterations` is shown complete (`4/4`), not as
/// a bar stopped at 40%.
#[test]
fn a_loop_that_finished_early_shows_as_complete() {
    let queue = TestQueue::new();
    let script = "import json, sys; m = json.load(sys.stdin); \
                  print(json.dumps({'state': m['iteration'], 'done': m['iteration'] == 3}))";
    queue.seed_task(
        "early.json",
        &json!({
            "id": "early",
            "phases": [{"name": "work", "kind": "loop", "run": ["python3", "-c", script],
                        "max_iterations": 10, "initial_state": 0}],
        }),
    );
    queue.run_until_idle(&[]);
    queue.wait_done("early");
    assert_done_at_four_of_four(&queue, "early", "loop");
}
