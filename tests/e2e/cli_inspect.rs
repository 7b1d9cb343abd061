//! `cairn show`, `history`, `checkpoint`, `prune` and `completions` against real queues: a
//! finished loop's definition, phases and journal timeline; its checkpoint generations, with a
//! damaged latest file; checkpoints written by the Python pattern cairn's format follows; and a
//! prune that empties finished tasks while a running one carries on untouched.

use std::fs;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, SystemTime};

use crate::common::*;
use serde_json::{json, Value};

/// Run `cairn <args>` on the queue and expect exit `code`.
fn cairn(queue: &TestQueue, args: &[&str], code: i32) -> Output {
    let output = queue.cairn_output(args, b"");
    assert_eq!(
        output.status.code(),
        Some(code),
        "cairn {args:?}: stdout {} stderr {}",
        stdout_of(&output),
        stderr_of(&output)
    );
    output
}

fn json_of(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", stdout_of(output)))
}

/// A queue where `fin` (a 5-iteration loop after a `once` phase) finished and `bad` failed.
fn finished_queue() -> TestQueue {
    let queue = TestQueue::new();
    queue.seed_task(
        "fin.json",
        &json!({
            "id": "fin",
            "phases": [
                {"name": "hello", "run": ["sh", "-c", "printf '{\"greeting\": \"hi\"}'"]},
                {
                    "name": "count",
                    "kind": "loop",
                    "run": ["python3", fixture("logging_loop.py"), queue.aux("fin.side"), "--sleep", "0"],
                    "max_iterations": 5,
                },
            ],
        }),
    );
    queue.seed_task(
        "bad.json",
        &json!({
            "id": "bad",
            "retry": {"max_attempts": 1},
            "phases": [{"name": "fail", "run": ["sh", "-c", "exit 3"]}],
        }),
    );
    queue.run_until_idle(&[]);
    queue.wait_done("fin");
    queue
}

/// `name` line of `show`'s header block.
fn field<'a>(show: &'a str, name: &str) -> &'a str {
    show.lines()
        .find_map(|line| {
            let (key, value) = line.split_once(' ')?;
            (key == name).then(|| value.trim_start())
        })
        .unwrap_or_else(|| panic!("no {name} line in\n{show}"))
}

#[test]
fn show_history_and_checkpoint_of_a_finished_task() {
    let queue = finished_queue();
    let root = std::fs::canonicalize(queue.root()).unwrap();

    // show: header, definition, phases with outputs, timeline with checkpoint details.
    let show = stdout_of(&cairn(&queue, &["show", "fin"], 0));
    assert_eq!(field(&show, "task"), "fin");
    assert_eq!(field(&show, "state"), "done");
    assert_eq!(field(&show, "phase"), "count(2/2), loop");
    assert_eq!(field(&show, "iteration"), "5/5");
    assert_eq!(field(&show, "attempts"), "1 (0 failed of 3 allowed)");
    assert_eq!(field(&show, "error"), "-");
    assert!(show.contains("\"max_iterations\": 5"), "{show}");
    let phase_rows: Vec<Vec<&str>> = show
        .lines()
        .skip_while(|l| *l != "phases")
        .skip(2)
        .take(2)
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        phase_rows[0],
        ["1/2", "hello", "once", "done", "-", r#"{"greeting":"hi"}"#],
        "{show}"
    );
    assert_eq!(
        phase_rows[1],
        [
            "2/2",
            "count",
            "loop",
            "done",
            "5/5",
            r#"{"sum":30,"seen":[0,1,2,3,4]}"#
        ],
        "{show}"
    );
    let timeline: Vec<Vec<&str>> = show
        .lines()
        .skip_while(|l| !l.starts_with("timeline"))
        .skip(1)
        .map(|l| l.split_whitespace().collect())
        .collect();
    let events: Vec<&str> = timeline.iter().map(|l| l[1]).collect();
    assert_eq!(events.first(), Some(&"accepted"), "{show}");
    assert_eq!(events.last(), Some(&"done"), "{show}");
    let checkpoints: Vec<&Vec<&str>> = timeline.iter().filter(|l| l[1] == "checkpoint").collect();
    assert_eq!(checkpoints.len(), 5, "{show}");
    for (i, line) in checkpoints.iter().enumerate() {
        assert_eq!(
            line[2..4],
            ["phase=count", &format!("iteration={}", i + 1)],
            "{show}"
        );
        assert!(
            line[5].starts_with("bytes=") && line[6].starts_with("ms="),
            "{show}"
        );
    }

    // The logs of the task's commands, by full path, with their sizes.
    let logs: Vec<Vec<&str>> = show
        .lines()
        .skip_while(|l| !l.starts_with("logs"))
        .skip(1)
        .take_while(|l| !l.is_empty())
        .map(|l| l.split_whitespace().collect())
        .collect();
    let run_dir = root.join("runs/fin");
    let expected: Vec<String> = ["0-hello.log", "1-count.log"]
        .iter()
        .map(|name| run_dir.join(name).display().to_string())
        .collect();
    assert_eq!(
        logs.iter().map(|l| l[0]).collect::<Vec<_>>(),
        expected,
        "{show}"
    );
    for line in &logs {
        assert!(std::path::Path::new(line[0]).is_file(), "{show}");
        assert!(line[2].ends_with('B'), "no size: {show}");
    }

    let document = json_of(&cairn(&queue, &["show", "fin", "--json"], 0));
    let json_logs: Vec<&str> = document["logs"]
        .as_array()
        .expect("show --json lists the logs")
        .iter()
        .map(|l| l["path"].as_str().unwrap())
        .collect();
    assert_eq!(json_logs, expected, "{document:#}");
    assert!(
        document["logs"][1]["bytes"].as_u64().unwrap() > 0,
        "{document:#}"
    );
    for key in [
        "version",
        "queue",
        "daemon",
        "id",
        "state",
        "status",
        "definition",
        "phases",
        "attempts",
        "failed_attempts",
        "error",
        "record",
        "earlier_failures",
        "timeline",
    ] {
        assert!(
            document.get(key).is_some(),
            "show --json lacks {key}: {document:#}"
        );
    }
    assert_eq!(document["version"], 1);
    assert_eq!(document["state"], "done");
    assert_eq!(document["definition"]["phases"][1]["max_iterations"], 5);
    assert_eq!(document["phases"][0]["output"], json!({"greeting": "hi"}));
    assert_eq!(document["phases"][1]["iteration"], 5);
    assert_eq!(document["record"]["status"], "done");
    // Whoever dropped the file (this test's user) is its submitter, in the document, the
    // record and the journal's `accepted` event.
    let me = nix::unistd::Uid::effective().as_raw();
    assert_eq!(document["submitted_by"]["uid"], me, "{document:#}");
    assert_eq!(
        document["record"]["submitted_by"]["uid"], me,
        "{document:#}"
    );
    assert_eq!(document["timeline"][0]["event"], "accepted", "{document:#}");
    assert_eq!(
        document["timeline"][0]["submitted_by"]["uid"], me,
        "{document:#}"
    );
    let user = document["submitted_by"]["user"].as_str().unwrap_or("-");
    assert!(field(&show, "submitter").starts_with(user), "{show}");
    let timeline = document["timeline"].as_array().unwrap();
    assert!(timeline
        .iter()
        .all(|e| e["at"].is_string() && e["event"].is_string()));
    let checkpoint = timeline
        .iter()
        .find(|e| e["event"] == "checkpoint")
        .unwrap();
    assert!(
        checkpoint["bytes"].is_u64() && checkpoint["ms"].is_number(),
        "{checkpoint}"
    );

    let bad = stdout_of(&cairn(&queue, &["show", "bad"], 0));
    assert_eq!(field(&bad, "state"), "failed");
    assert!(field(&bad, "error").contains("exit status: 3"), "{bad}");
    assert!(bad.contains("attempt_failed"), "{bad}");

    let missing = cairn(&queue, &["show", "nosuch"], 1);
    let message = stderr_of(&missing);
    assert!(
        message.contains("\"nosuch\"") && message.contains(&root.display().to_string()),
        "{message}"
    );
    assert!(missing.stdout.is_empty());
    cairn(&queue, &["show", "../etc"], 2);

    // history: the latest and three older generations, newest first.
    let history = stdout_of(&cairn(&queue, &["history", "fin"], 0));
    let rows: Vec<Vec<&str>> = history
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows[0],
        ["GEN", "ITER", "PHASE", "WRITTEN", "AGE", "SIZE", "FILES", "ERROR"]
    );
    let columns: Vec<[&str; 3]> = rows[1..].iter().map(|r| [r[0], r[1], r[2]]).collect();
    assert_eq!(
        columns,
        [
            ["5", "5", "count"],
            ["4", "4", "count"],
            ["3", "3", "count"],
            ["2", "2", "count"]
        ],
        "{history}"
    );
    assert!(
        rows[1..].iter().all(|r| r[6] == "-" && r[7] == "-"),
        "{history}"
    );
    let document = json_of(&cairn(&queue, &["history", "fin", "--json"], 0));
    assert_eq!(document["version"], 1);
    assert_eq!(document["task_id"], "fin");
    let generations = document["generations"].as_array().unwrap();
    assert_eq!(generations.len(), 4);
    for (i, generation) in generations.iter().enumerate() {
        assert_eq!(generation["latest"], i == 0);
        assert!(generation["bytes"].as_u64().unwrap() > 0);
        assert!(generation["file"].as_str().unwrap().ends_with(".json.gz"));
        assert!(generation["written_at"].is_string() && generation["error"].is_null());
        assert_eq!(generation["phase_index"], 1);
    }

    // checkpoint: the latest, a generation, then a damaged latest file.
    let latest = json_of(&cairn(&queue, &["checkpoint", "fin"], 0));
    assert_eq!(latest["iteration_count"], 5);
    assert_eq!(latest["done"], true);
    assert_eq!(
        latest["partial_results"],
        json!({"sum": 30, "seen": [0, 1, 2, 3, 4]})
    );
    let third = json_of(&cairn(&queue, &["checkpoint", "fin", "--gen", "3"], 0));
    assert_eq!(
        (
            third["generation"].clone(),
            third["iteration_count"].clone()
        ),
        (json!(3), json!(3))
    );
    let gone = cairn(&queue, &["checkpoint", "fin", "--gen", "1"], 1);
    assert!(
        stderr_of(&gone).contains("generation 1"),
        "{}",
        stderr_of(&gone)
    );
    cairn(&queue, &["checkpoint", "bad"], 1);

    let latest_file = queue.path("incremental/fin.json.gz");
    let mut bytes = fs::read(&latest_file).unwrap();
    bytes.truncate(bytes.len() - 3);
    fs::write(&latest_file, &bytes).unwrap();
    let history = stdout_of(&cairn(&queue, &["history", "fin"], 0));
    let first: Vec<&str> = history.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(first[..3], ["5", "-", "-"], "{history}");
    assert!(
        history
            .lines()
            .nth(1)
            .unwrap()
            .contains("corrupt or truncated"),
        "{history}"
    );
    let fallback = cairn(&queue, &["checkpoint", "fin"], 0);
    assert_eq!(json_of(&fallback)["iteration_count"], 4);
    assert!(
        stderr_of(&fallback).contains("fin.json.gz does not decode"),
        "{}",
        stderr_of(&fallback)
    );
    // The same file by path: the reason, exit 1.
    let path = latest_file.display().to_string();
    let corrupt = cairn(&queue, &["checkpoint", &path], 1);
    assert!(
        stderr_of(&corrupt).contains(&path),
        "{}",
        stderr_of(&corrupt)
    );
    assert!(
        stderr_of(&corrupt).contains("corrupt or truncated"),
        "{}",
        stderr_of(&corrupt)
    );
}

/// Write a checkpoint with the Python pattern's code (gzip level 9, indent 2).
/// After a power cut a checkpoint file may be older than the save the commit log holds. Until a
/// daemon replays the log, `cairn checkpoint` reads what that replay will restore.
#[test]
fn without_a_daemon_checkpoint_shows_what_the_commit_log_will_restore() {
    let queue = TestQueue::new();
    let side = queue.aux("cut.side");
    queue.seed_task("cut.json", &loop_task("cut", &side, 6, 0.5));
    let mut daemon = queue.start(&[]);
    let latest = queue.path("incremental/cut.json.gz");
    wait_until("three iterations are checkpointed", DEADLINE, || {
        latest.exists() && queue.checkpoint("cut").iteration_count >= 3
    });
    daemon.kill_hard();
    let committed = queue.checkpoint("cut").iteration_count;
    let log_len = fs::metadata(queue.path("incremental/.commit-log")).map_or(0, |m| m.len());
    assert!(log_len > 0, "the killed daemon left no commit log");
    // What a power cut may leave: the last rename lost, the kept older copy in its place.
    let kept = queue
        .list("incremental")
        .into_iter()
        .filter_map(|name| {
            let generation = name.strip_prefix("cut.")?.strip_suffix(".json.gz")?;
            generation.parse::<u64>().ok().map(|g| (g, name))
        })
        .max()
        .map(|(_, name)| queue.path(&format!("incremental/{name}")))
        .expect("a kept generation");
    fs::copy(&kept, &latest).unwrap();
    assert!(queue.checkpoint("cut").iteration_count < committed);

    let shown = json_of(&cairn(&queue, &["checkpoint", "cut"], 0));
    assert_eq!(shown["iteration_count"], committed);
    // The daemon replays the log before anything resumes; the task ends as an uninterrupted run.
    queue.run_until_idle(&[]);
    assert_eq!(queue.wait_done("cut")["result"], loop_result(6));
}

fn python_checkpoint(path: &Path, task_id: &str, iterations: u64) {
    python_checkpoint_with(path, task_id, iterations, &[]);
}

/// The same, with the fixture's options (`--non-finite`).
fn python_checkpoint_with(path: &Path, task_id: &str, iterations: u64, options: &[&str]) {
    let status = Command::new("python3")
        .arg(fixture("cli_pattern_checkpoint.py"))
        .arg(path)
        .arg(task_id)
        .arg(iterations.to_string())
        .args(options)
        .status()
        .expect("running python3");
    assert!(status.success());
}

#[test]
fn checkpoint_reads_files_written_by_the_python_pattern() {
    let queue = TestQueue::new();
    let path = queue.aux("review.json.gz");
    python_checkpoint(&path, "lit-review-42", 3);
    // Really level 9 and indented: the header's XFL byte says "best compression".
    let raw = fs::read(&path).unwrap();
    assert_eq!(raw[8], 2, "gzip XFL must say level 9");

    let output = cairn(&queue, &["checkpoint", &path.display().to_string()], 0);
    assert_eq!(
        json_of(&output),
        json!({
            "task_id": "lit-review-42",
            "phase": "supervise",
            "iteration_count": 3,
            "checkpoint_interval": 1,
            "partial_results": {"reviewed": [0, 1, 2], "notes": "käse, 🧀"},
            "last_checkpoint_at": "2025-03-01T12:30:00",
        })
    );
    assert!(
        stdout_of(&output).contains("\n  \"iteration_count\": 3"),
        "pretty-printed"
    );

    // A bare file name in the current directory works too (no task of that id).
    let output = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args([
            "--queue",
            &queue.root().display().to_string(),
            "checkpoint",
            "review.json.gz",
        ])
        .current_dir(queue.aux(""))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr_of(&output));

    // A file cut short, a gzip that is not a checkpoint, and a missing file: exit 1, why.
    let truncated = queue.aux("truncated.json.gz");
    fs::write(&truncated, &raw[..raw.len() / 2]).unwrap();
    let output = cairn(&queue, &["checkpoint", &truncated.display().to_string()], 1);
    assert!(
        stderr_of(&output).contains("truncated.json.gz"),
        "{}",
        stderr_of(&output)
    );
    let not_checkpoint = queue.aux("other.json.gz");
    let status = Command::new("python3")
        .args([
            "-c",
            "import gzip,sys; gzip.open(sys.argv[1],'wt').write('{\"task_id\": \"x\"}')",
        ])
        .arg(&not_checkpoint)
        .status()
        .unwrap();
    assert!(status.success());
    let output = cairn(
        &queue,
        &["checkpoint", &not_checkpoint.display().to_string()],
        1,
    );
    assert!(
        stderr_of(&output).contains("missing phase, iteration_count"),
        "{}",
        stderr_of(&output)
    );
    let output = cairn(
        &queue,
        &[
            "checkpoint",
            &queue.aux("none.json.gz").display().to_string(),
        ],
        1,
    );
    assert!(
        stderr_of(&output).contains("none.json.gz"),
        "{}",
        stderr_of(&output)
    );
    cairn(
        &queue,
        &["checkpoint", &path.display().to_string(), "--gen", "2"],
        2,
    );
}

#[test]
fn checkpoint_shows_pythons_nan_and_infinity_as_written_and_history_gives_no_generation() {
    let queue = TestQueue::new();
    let path = queue.aux("thala.json.gz");
    python_checkpoint_with(&path, "thala-7", 2, &["--non-finite"]);
    let shown = path.display().to_string();

    let output = cairn(&queue, &["checkpoint", &shown], 0);
    let text = stdout_of(&output);
    for line in [
        "\"loss\": NaN,",
        "\"best\": Infinity,",
        "\"worst\": -Infinity",
        r#""says": "NaN, Infinity and -Infinity, \"NaN\"""#,
        "\"iteration_count\": 2,",
    ] {
        assert!(text.contains(line), "{line} in\n{text}");
    }
    // Keys in the order the file has them (Python's dict order), not sorted.
    let keys = [
        "\"reviewed\"",
        "\"notes\"",
        "\"loss\"",
        "\"best\"",
        "\"worst\"",
    ];
    let at: Vec<usize> = keys.iter().map(|k| text.find(k).unwrap()).collect();
    assert!(
        at.windows(2).all(|w| w[0] < w[1]),
        "{keys:?} in order in\n{text}"
    );
    assert!(
        text.find("\"task_id\"") < text.find("\"checkpoint_interval\""),
        "{text}"
    );
    let note = stderr_of(&output);
    assert!(note.contains(&shown), "{note}");
    assert!(note.contains("not standard JSON"), "{note}");
    assert!(note.contains("NaN, Infinity, -Infinity"), "{note}");
    // Nothing else is touched: with the tokens read as null the rest is the file's JSON.
    let standard: Value = serde_json::from_str(
        &text
            .replace(": NaN", ": null")
            .replace(": -Infinity", ": null")
            .replace(": Infinity", ": null"),
    )
    .unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(
        standard["partial_results"],
        json!({"reviewed": [0, 1], "notes": "käse, 🧀", "loss": null, "best": null,
               "worst": null, "says": "NaN, Infinity and -Infinity, \"NaN\""})
    );
    // A standard file gets no note.
    let plain = queue.aux("plain.json.gz");
    python_checkpoint(&plain, "plain", 1);
    let output = cairn(&queue, &["checkpoint", &plain.display().to_string()], 0);
    assert_eq!(stderr_of(&output), "");

    // Copied into the queue as a task's latest file, it is not one of cairn's generations.
    fs::create_dir_all(queue.path("incremental")).unwrap();
    fs::copy(&path, queue.path("incremental/thala-7.json.gz")).unwrap();
    let output = cairn(&queue, &["history", "thala-7"], 0);
    let table = stdout_of(&output);
    let row = table.lines().nth(1).unwrap_or_else(|| panic!("{table}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[..3], ["none", "2", "supervise"], "{table}");
    assert!(row.contains("not a cairn checkpoint"), "{table}");
    let history = json_of(&cairn(&queue, &["history", "thala-7", "--json"], 0));
    let latest = &history["generations"][0];
    assert_eq!(latest["generation"], Value::Null, "{history}");
    assert_eq!(latest["iteration"], 2, "{history}");
    assert_eq!(latest["phase"], "supervise", "{history}");
}

/// Date a file or directory back by an hour.
fn backdate(path: &Path) {
    let file = fs::File::open(path).unwrap();
    file.set_modified(SystemTime::now() - Duration::from_secs(3600))
        .unwrap();
}

#[test]
fn prune_removes_finished_tasks_and_orphans_and_leaves_tasks_in_flight_alone() {
    let queue = finished_queue();
    queue.drop_bytes("broken.json", b"not json", true);
    queue.run_until_idle(&[]);
    let rejected = queue.rejections();
    assert_eq!(rejected.len(), 1);
    // An orphan: the files of a task that no longer exists, an hour old.
    fs::create_dir_all(queue.path("runs/ghost")).unwrap();
    fs::write(queue.path("runs/ghost/0-x.log"), "old log\n").unwrap();
    backdate(&queue.path("runs/ghost/0-x.log"));
    backdate(&queue.path("runs/ghost"));
    // A fresh orphan (a fork being set up) stays.
    fs::create_dir_all(queue.path("runs/forking")).unwrap();

    // A long loop runs; a second task waits behind it (one task at a time).
    queue.seed_task(
        "long.json",
        &loop_task("long", &queue.aux("long.side"), 2000, 0.05),
    );
    let mut later = loop_task("later", &queue.aux("later.side"), 3, 0.0);
    later["priority"] = json!(-1);
    queue.seed_task("later.json", &later);
    let _daemon = queue.start(&["--max-tasks", "1"]);
    wait_until(
        "long has a checkpoint and later is accepted",
        DEADLINE,
        || {
            queue.path("incremental/long.json.gz").exists()
                && queue.path("tasks/later.json").exists()
        },
    );

    // --keep-generations with the default retention keeps fin but trims its history.
    let output = cairn(
        &queue,
        &["prune", "--keep-generations", "1", "--dry-run"],
        0,
    );
    assert_eq!(
        queue
            .list("incremental")
            .iter()
            .filter(|n| n.starts_with("fin."))
            .count(),
        4
    );
    let text = stdout_of(&output);
    assert!(text.contains("would remove"), "{text}");
    let output = cairn(&queue, &["prune", "--keep-generations", "1"], 0);
    let fin_files: Vec<String> = queue
        .list("incremental")
        .into_iter()
        .filter(|n| n.starts_with("fin."))
        .collect();
    assert_eq!(
        fin_files,
        ["fin.4.json.gz", "fin.json.gz"],
        "{}",
        stdout_of(&output)
    );
    assert!(queue.path("done/fin.json").exists());
    assert!(
        queue.path("runs/ghost").exists(),
        "younger than the 7-day retention"
    );

    let dry = stdout_of(&cairn(
        &queue,
        &["prune", "--older-than", "0s", "--dry-run"],
        0,
    ));
    assert!(
        dry.lines()
            .all(|l| l.starts_with("would remove ") || l.starts_with("prune --dry-run:")),
        "{dry}"
    );
    assert!(queue.path("done/fin.json").exists() && queue.path("runs/ghost").exists());

    let output = cairn(&queue, &["prune", "--older-than", "0s"], 0);
    let text = stdout_of(&output);
    let root = queue.root().display().to_string();
    let removed: Vec<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("removed "))
        .map(|p| p.strip_prefix(&root).unwrap_or(p).to_string())
        .collect();
    let rejected_record = rejected.values().next().unwrap();
    let rejected_input = rejected_record["input"].as_str().unwrap();
    let rejected_name = rejected_input.strip_suffix(".input").unwrap();
    for expected in [
        "/runs/fin/",
        "/incremental/fin.4.json.gz",
        "/incremental/fin.json.gz",
        "/tasks/fin.json",
        "/done/fin.json",
        "/runs/bad/",
        "/tasks/bad.json",
        "/failed/bad.json",
        &format!("/{rejected_input}"),
        &format!("/{rejected_name}.json"),
        "/runs/ghost/",
    ] {
        assert!(
            removed.iter().any(|r| r == expected),
            "{expected} not removed:\n{text}"
        );
    }
    assert_eq!(removed.len(), 11, "{text}");
    // The record goes last, so a prune cut short never leaves a task that looks pending.
    let position = |p: &str| removed.iter().position(|r| r == p).unwrap();
    assert!(
        position("/tasks/fin.json") < position("/done/fin.json"),
        "{text}"
    );
    assert!(
        position("/incremental/fin.json.gz") < position("/done/fin.json"),
        "{text}"
    );
    let summary = text.lines().last().unwrap();
    assert!(
        summary.starts_with(
            "prune: 2 finished task(s), 1 rejected file(s), 0 old generation(s), 1 orphan(s), 0 control request(s); 11 path(s)"
        ),
        "{summary}"
    );
    for gone in ["done", "failed"] {
        assert!(
            queue.list(gone).is_empty(),
            "{gone}/ is not empty: {:?}",
            queue.list(gone)
        );
    }
    assert!(!queue.path("runs/fin").exists() && !queue.path("tasks/fin.json").exists());
    // Untouched: the running task, the pending one, the fresh orphan.
    for kept in [
        "tasks/long.json",
        "runs/long/events.jsonl",
        "incremental/long.json.gz",
        "tasks/later.json",
        "runs/forking",
    ] {
        assert!(queue.path(kept).exists(), "{kept} was removed:\n{text}");
    }
    assert!(queue.active_entry("long").is_some());

    // The running task carries on from where it was.
    let at = queue.checkpoint("long").iteration_count;
    wait_until("long checkpoints again after the prune", DEADLINE, || {
        queue.checkpoint("long").iteration_count > at
    });
    let again = stdout_of(&cairn(&queue, &["prune", "--older-than", "0s"], 0));
    assert_eq!(again.lines().count(), 1, "nothing left to prune: {again}");
}

#[test]
fn completions_are_generated_for_each_shell() {
    let queue = TestQueue::new();
    let bash = stdout_of(&cairn(&queue, &["completions", "bash"], 0));
    assert!(bash.contains("_cairn()"), "{bash}");
    for subcommand in [
        "status",
        "show",
        "history",
        "checkpoint",
        "prune",
        "completions",
        "--watch",
        "--keep-generations",
    ] {
        assert!(
            bash.contains(subcommand),
            "bash completions lack {subcommand}"
        );
    }
    for shell in ["zsh", "fish", "elvish", "powershell"] {
        let script = stdout_of(&cairn(&queue, &["completions", shell], 0));
        assert!(script.contains("checkpoint"), "{shell}: {script}");
    }
    cairn(&queue, &["completions", "tcsh"], 2);
}
