//! `cairn submit` and `cairn validate` as a user runs them: ids on stdout, atomic arrival in the
//! inbox, exit codes that mean something (0 ok, 3 invalid task), errors that name the file and
//! the field, and `-` for stdin.

use std::fs;
use std::path::Path;
use std::sync::mpsc;

use crate::common::*;
use notify::event::{ModifyKind, RenameMode};
use notify::{EventKind, RecursiveMode, Watcher};
use serde_json::{json, Value};

fn write_task_file(queue: &TestQueue, name: &str, task: &Value) -> String {
    let path = queue.aux(name);
    fs::write(&path, serde_json::to_vec_pretty(task).unwrap()).unwrap();
    path.display().to_string()
}

#[test]
fn submit_prints_the_id_the_file_arrives_atomically_and_the_task_completes() {
    let queue = TestQueue::new();
    let mut task = once_task("ignored", &json!({"submitted": true}));
    task.as_object_mut().unwrap().remove("id");
    let file = write_task_file(&queue, "report.json", &task);

    // Watch the inbox while submitting: the file must appear by a rename, never be written
    // in place under its final name.
    let (tx, rx) = mpsc::channel();
    let mut watcher = notify::recommended_watcher(move |event| {
        let _ = tx.send(event);
    })
    .unwrap();
    watcher
        .watch(&queue.path("inbox"), RecursiveMode::NonRecursive)
        .unwrap();

    let output = queue.cairn_output(&["submit", &file], b"");
    assert_eq!(output.status.code(), Some(0), "{}", stderr_of(&output));
    let id = stdout_of(&output).trim_end_matches('\n').to_string();
    assert!(!id.contains('\n'), "more than the id on stdout: {id:?}");
    let suffix = id
        .strip_prefix("report-")
        .unwrap_or_else(|| panic!("the id {id:?} is not derived from the file name"));
    assert_eq!(suffix.len(), 6, "{id}");
    assert!(suffix.chars().all(|c| c.is_ascii_hexdigit()), "{id}");

    let final_name = format!("{id}.json");
    let mut events = Vec::new();
    wait_until("the inbox watch sees the rename", DEADLINE, || {
        while let Ok(event) = rx.try_recv() {
            events.push(event.expect("inbox watch"));
        }
        events.iter().any(|e| {
            matches!(e.kind, EventKind::Modify(ModifyKind::Name(RenameMode::To)))
                && e.paths.iter().any(|p| p.ends_with(&final_name))
        })
    });
    drop(watcher);
    // (Closing the renamed file afterwards is fine: its content was whole before the rename.)
    for event in &events {
        let names_final = event.paths.iter().any(|p| p.ends_with(&final_name));
        let writes = matches!(
            event.kind,
            EventKind::Create(_) | EventKind::Modify(ModifyKind::Data(_))
        );
        assert!(
            !(names_final && writes),
            "{final_name} was written in place: {event:?} (all events: {events:#?})"
        );
    }
    let temp_names: Vec<String> = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::Create(_)))
        .flat_map(|e| e.paths.iter())
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert!(
        !temp_names.is_empty() && temp_names.iter().all(|n| n.starts_with('.')),
        "the file was not written as a dot-file first: {temp_names:?}"
    );

    assert_eq!(queue.list("inbox"), vec![final_name.clone()]);
    let queued = read_json(&queue.path(&format!("inbox/{final_name}")));
    assert_eq!(
        queued["id"],
        json!(id),
        "the id is written into the queued file"
    );
    assert_eq!(queued["phases"][0]["run"], task["phases"][0]["run"]);

    queue.run_until_idle(&[]);
    let done = queue.done(&id).expect("the submitted task is done");
    assert_eq!(done["result"], json!({"submitted": true}));
    assert!(queue.list("inbox").is_empty());

    // The same id again is refused, and nothing new lands in the inbox.
    let mut again = task.clone();
    again["id"] = json!(id);
    let again_file = write_task_file(&queue, "again.json", &again);
    let output = queue.cairn_output(&["submit", &again_file], b"");
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    assert!(stderr_of(&output).contains("already exists"), "{output:?}");
    assert!(queue.list("inbox").is_empty());
}

#[test]
fn submit_of_an_invalid_file_exits_3_naming_the_file_and_the_field() {
    let queue = TestQueue::new();
    let mut no_program = once_task("bad-run", &json!(1));
    no_program["phases"][0]["run"] = json!([]);
    let mut unknown = once_task("bad-field", &json!(1));
    unknown["phases"][0]["retries"] = json!(2);
    let mut bad_id = once_task("x", &json!(1));
    bad_id["id"] = json!("../x");
    for (name, task, field) in [
        ("no-program.json", no_program, "phases[0].run"),
        ("unknown.json", unknown, "phases[0].retries"),
        ("bad-id.json", bad_id, "`id`"),
    ] {
        let file = write_task_file(&queue, name, &task);
        let output = queue.cairn_output(&["submit", &file], b"");
        let stderr = stderr_of(&output);
        assert_eq!(output.status.code(), Some(3), "{name}: {stderr}");
        assert!(
            stderr.contains(&file),
            "{name}: the file is not named: {stderr}"
        );
        assert!(
            stderr.contains(field),
            "{name}: {field} is not named: {stderr}"
        );
        assert_eq!(stdout_of(&output), "", "{name}");
    }
    let output = queue.cairn_output(&["submit", "/nonexistent/task.json"], b"");
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(stderr_of(&output).contains("/nonexistent/task.json"));
    assert!(queue.list("inbox").is_empty(), "{:?}", queue.list("inbox"));
}

#[test]
fn validate_exits_0_for_a_valid_file_and_3_for_invalid_ones() {
    let queue = TestQueue::new();
    let valid = write_task_file(
        &queue,
        "valid.json",
        &loop_task("v", Path::new("/dev/null"), 3, 0.0),
    );
    let output = queue.cairn_output(&["validate", &valid], b"");
    assert_eq!(output.status.code(), Some(0), "{}", stderr_of(&output));
    assert!(
        stdout_of(&output).contains("valid"),
        "{}",
        stdout_of(&output)
    );
    assert!(
        stdout_of(&output).contains("count (loop)"),
        "{}",
        stdout_of(&output)
    );

    let mut zero = loop_task("z", Path::new("/dev/null"), 3, 0.0);
    zero["phases"][0]["checkpoint_every"] = json!(0);
    let huge_meta =
        json!({"phases": [{"name": "a", "run": ["true"]}], "meta": "x".repeat(1 << 21)});
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("syntax.json", b"{\"phases\": [".to_vec(), "not valid JSON"),
        (
            "types.json",
            br#"{"phases": "all of them"}"#.to_vec(),
            "invalid type",
        ),
        (
            "zero.json",
            serde_json::to_vec(&zero).unwrap(),
            "phases[0].checkpoint_every",
        ),
        (
            "huge.json",
            serde_json::to_vec(&huge_meta).unwrap(),
            "larger than the limit",
        ),
    ];
    for (name, bytes, word) in cases {
        let path = queue.aux(name);
        fs::write(&path, bytes).unwrap();
        let file = path.display().to_string();
        let output = queue.cairn_output(&["validate", &file], b"");
        let stderr = stderr_of(&output);
        assert_eq!(output.status.code(), Some(3), "{name}: {stderr}");
        assert!(stderr.contains(&file), "{name}: {stderr}");
        assert!(stderr.contains(word), "{name}: {word:?} missing: {stderr}");
    }
    let dir = queue.aux("a-dir.json");
    fs::create_dir(&dir).unwrap();
    let output = queue.cairn_output(&["validate", &dir.display().to_string()], b"");
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    assert!(stderr_of(&output).contains("not a regular file"));
    // A command line given as one string: the error shows it as an array.
    let path = queue.aux("string-run.json");
    fs::write(
        &path,
        br#"{"phases": [{"name": "a", "run": "python3 step.py --fast"}]}"#,
    )
    .unwrap();
    let output = queue.cairn_output(&["validate", &path.display().to_string()], b"");
    let stderr = stderr_of(&output);
    assert_eq!(output.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("phases[0].run") && stderr.contains(r#"["python3","step.py","--fast"]"#),
        "no array form in: {stderr}"
    );
    // validate changes nothing.
    assert!(queue.list("inbox").is_empty());
}

#[test]
fn submit_dash_reads_the_task_from_stdin() {
    let queue = TestQueue::new();
    let named = serde_json::to_vec(&once_task("from-stdin", &json!("piped"))).unwrap();
    let output = queue.cairn_output(&["submit", "-"], &named);
    assert_eq!(output.status.code(), Some(0), "{}", stderr_of(&output));
    assert_eq!(stdout_of(&output), "from-stdin\n");

    let mut anonymous = once_task("x", &json!("anonymous"));
    anonymous.as_object_mut().unwrap().remove("id");
    let output = queue.cairn_output(&["submit", "-"], &serde_json::to_vec(&anonymous).unwrap());
    assert_eq!(output.status.code(), Some(0), "{}", stderr_of(&output));
    let generated = stdout_of(&output).trim().to_string();
    assert!(generated.starts_with("task-"), "{generated}");

    let output = queue.cairn_output(&["submit", "-"], b"{\"phases\": 7}");
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    assert!(
        stderr_of(&output).contains("<stdin>"),
        "{}",
        stderr_of(&output)
    );
    assert!(
        stderr_of(&output).contains("phases"),
        "{}",
        stderr_of(&output)
    );

    let mut inbox = queue.list("inbox");
    inbox.sort();
    let mut expected = vec!["from-stdin.json".to_string(), format!("{generated}.json")];
    expected.sort();
    assert_eq!(inbox, expected);

    queue.run_until_idle(&[]);
    assert_eq!(queue.done("from-stdin").unwrap()["result"], json!("piped"));
    assert_eq!(
        queue.done(&generated).unwrap()["result"],
        json!("anonymous")
    );
}

#[test]
fn validate_dash_names_stdin_the_same_way_on_success_and_on_error() {
    let queue = TestQueue::new();
    let valid = serde_json::to_vec(&once_task("v", &json!(1))).unwrap();
    let output = queue.cairn_output(&["validate", "-"], &valid);
    assert_eq!(output.status.code(), Some(0), "{}", stderr_of(&output));
    assert!(
        stdout_of(&output).starts_with("<stdin>: valid"),
        "{}",
        stdout_of(&output)
    );
    let output = queue.cairn_output(&["validate", "-"], b"{\"phases\": 7}");
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    assert!(
        stderr_of(&output).starts_with("error: <stdin>: "),
        "{}",
        stderr_of(&output)
    );
}

/// A file with several mistakes gets all of them in one go, one a line, each naming its field;
/// a file dropped into the inbox gets them all in its rejection record.
#[test]
fn validate_reports_every_problem_of_a_file_at_once() {
    let queue = TestQueue::new();
    let task = json!({
        "id": "many",
        "retry": {"max_attempts": 0},
        "phases": [
            {"name": "a", "run": [], "max_iterations": 3},
            {"name": "a", "kind": "loop", "run": ["true"], "max_iterations": 0},
        ],
    });
    let bytes = serde_json::to_vec(&task).unwrap();
    let output = queue.cairn_output(&["validate", "-"], &bytes);
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    let stderr = stderr_of(&output);
    assert!(
        stderr.starts_with("error: <stdin>: 5 problems:\n"),
        "{stderr}"
    );
    for field in [
        "retry.max_attempts",
        "phases[0].run",
        "phases[0].max_iterations",
        "phases[1].name",
        "phases[1].max_iterations",
    ] {
        assert!(
            stderr
                .lines()
                .any(|l| l.starts_with(&format!("  field `{field}`: "))),
            "no line for {field}: {stderr}"
        );
    }

    queue.seed_task("many.json", &task);
    queue.run_until_idle(&[]);
    let rejections = queue.rejections();
    assert_eq!(rejections.len(), 1, "{rejections:?}");
    let record = rejections.values().next().unwrap();
    let reason = record["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("phases[0].run") && reason.contains("phases[1].max_iterations"),
        "{reason}"
    );
}

#[test]
fn submit_refuses_a_queue_that_does_not_exist_unless_asked_to_create_it() {
    let queue = TestQueue::new();
    let file = write_task_file(&queue, "t.json", &once_task("t", &json!(1)));
    let missing = queue.aux("elsewhere");
    let missing_text = missing.display().to_string();
    let submit = |extra: &[&str]| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"));
        command.env_remove("CAIRN_QUEUE");
        command.args(["--queue", &missing_text, "submit"]);
        command.args(extra).arg(&file);
        command.output().expect("running cairn submit")
    };
    let output = submit(&[]);
    let stderr = stderr_of(&output);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&missing_text) && stderr.contains("--queue DIR"),
        "the error does not name the directory and the way out: {stderr}"
    );
    assert_eq!(stdout_of(&output), "");
    assert!(!missing.exists(), "a queue was created anyway");

    let output = submit(&["--create-queue"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr_of(&output));
    assert_eq!(stdout_of(&output), "t\n");
    assert!(missing.join("inbox/t.json").is_file());
}

#[test]
fn submit_tells_a_person_on_stderr_what_happened_and_what_to_run_next() {
    let queue = TestQueue::new();
    let file = write_task_file(&queue, "t.json", &once_task("told", &json!(1)));
    let output = queue.cairn_output(&["submit", &file], b"");
    assert_eq!(output.status.code(), Some(0), "{}", stderr_of(&output));
    assert_eq!(stdout_of(&output), "told\n", "stdout must hold only the id");
    let stderr = stderr_of(&output);
    let root = queue.root().display().to_string();
    for expected in [
        "submitted told to ",
        "no daemon runs on this queue",
        &format!("cairn --queue {root} run"),
        &format!("cairn --queue {root} show told"),
        "status",
    ] {
        assert!(stderr.contains(expected), "{expected:?} missing: {stderr}");
    }
}

#[test]
fn docs_cli_md_covers_every_command_and_exit_code_of_the_help() {
    let queue = TestQueue::new();
    let help = stdout_of(&queue.cairn_output(&["--help"], b""));
    let docs = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/cli.md"))
        .expect("reading docs/cli.md");
    let headings: Vec<&str> = docs.lines().filter(|l| l.starts_with("## ")).collect();
    let commands: Vec<&str> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter(|l| !is_wrapped_help_line(l))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .collect();
    assert!(commands.len() >= 15, "{help}");
    for command in commands {
        let documented = headings.iter().any(|h| {
            h.split(['`', ' ', '|'])
                .skip_while(|w| *w != "cairn")
                .nth(1)
                .is_some_and(|first| first == command || h.contains(&format!("|{command}")))
        });
        assert!(
            documented,
            "docs/cli.md has no section for `cairn {command}`"
        );
    }
    let codes: Vec<&str> = help
        .lines()
        .skip_while(|l| !l.starts_with("Exit codes:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter(|l| !is_wrapped_help_line(l))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(codes.len() >= 7, "{help}");
    for code in codes {
        assert!(
            docs.contains(&format!("\n| {code} |")),
            "exit code {code} is not in docs/cli.md's table"
        );
    }
}

/// A line of `--help` that continues the description above it (clap wraps long ones and
/// indents the rest past the two spaces that start an entry).
fn is_wrapped_help_line(line: &str) -> bool {
    line.starts_with("   ")
}

/// Each failure is printed once, as one `error:` line on stderr naming what is wrong, with
/// nothing on stdout and the exit code `cairn --help` documents for it.
#[test]
fn an_error_is_printed_once_with_its_documented_exit_code() {
    use cairn::cli::exit;
    let queue = TestQueue::new();
    let invalid = queue.aux("typo.json");
    fs::write(&invalid, br#"{"phases": [], "prio": 1}"#).unwrap();
    let invalid = invalid.display().to_string();
    let cases: [(&[&str], u8, &str); 6] = [
        (&["show", "nosuch"], exit::FAILURE, "nosuch"),
        (&["history", "nosuch"], exit::FAILURE, "nosuch"),
        (&["show", "../x"], exit::USAGE, "../x"),
        (&["pause", "../x"], exit::USAGE, "../x"),
        (
            &["checkpoint", "./a.json.gz", "--gen", "1"],
            exit::USAGE,
            "--gen",
        ),
        (&["validate", &invalid], exit::INVALID_TASK, "typo.json"),
    ];
    fs::create_dir_all(queue.root()).unwrap();
    for (args, code, named) in cases {
        let output = queue.cairn_output(args, b"");
        let stderr = stderr_of(&output);
        assert_eq!(
            output.status.code(),
            Some(i32::from(code)),
            "{args:?}: {stderr}"
        );
        assert_eq!(stdout_of(&output), "", "{args:?}");
        let errors: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("error: "))
            .collect();
        assert_eq!(errors.len(), 1, "{args:?}: one error line\n{stderr}");
        assert!(
            errors[0].contains(named),
            "{args:?}: names {named:?}: {stderr}"
        );
    }
}

/// Run `cairn --queue <queue> <args>` with a stdout whose reader has already gone away, as in
/// `cairn ... | head -0`: every write to it fails with a broken pipe.
fn with_closed_stdout(queue: &TestQueue, args: &[&str]) -> std::process::Output {
    let (reader, writer) = nix::unistd::pipe().unwrap();
    drop(reader);
    queue
        .cairn()
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(writer)
        .output()
        .expect("running cairn")
}

/// A closed pipe is how a reader says it has read enough: every command that prints ends with
/// exit 0 and says nothing on stderr about it (no error, no panic).
#[test]
fn a_closed_stdout_ends_a_command_with_exit_0_and_no_error() {
    let queue = TestQueue::new();
    let task = write_task_file(&queue, "job.json", &once_task("piped-job", &json!(1)));
    let output = queue.cairn_output(&["submit", "--create-queue", &task], b"");
    assert_eq!(output.status.code(), Some(0), "{}", stderr_of(&output));
    let other = write_task_file(&queue, "other.json", &once_task("other-job", &json!(2)));
    for args in [
        &["status"][..],
        &["status", "--json"],
        &["show", "piped-job"],
        &["validate", &task],
        &["submit", &other],
        &["completions", "bash"],
        &["pause", "piped-job", "--no-wait"],
        &["prune", "--dry-run"],
    ] {
        let output = with_closed_stdout(&queue, args);
        let stderr = stderr_of(&output);
        assert_eq!(output.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(
            !stderr.contains("error") && !stderr.contains("panicked"),
            "{args:?}: {stderr}"
        );
    }
    // The submit whose id could not be printed still queued its task.
    assert!(queue.path("inbox/other-job.json").is_file());
}
