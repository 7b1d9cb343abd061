//! What a user and an operator see around a run, with the real binary: errors that name what
//! is missing, the daemon's start and closing lines and exit codes, paused tasks across runs,
//! log levels of an operator's own actions, how runs and failed attempts are counted, worker
//! helpers found with no setup, and the README's walkthrough followed literally.

use crate::common::*;
use serde_json::json;

/// A directory that exists nowhere.
const MISSING_DIR: &str = "/nonexistent-cairn-test-dir/work";

fn missing_cwd_task(id: &str) -> serde_json::Value {
    json!({
        "id": id,
        "cwd": MISSING_DIR,
        "retry": {"max_attempts": 1},
        "phases": [{"name": "say", "run": ["python3", "-c", "print(1)"]}],
    })
}

#[test]
fn a_missing_cwd_is_named_in_the_error_and_warned_about_at_validate_and_submit() {
    let queue = TestQueue::new();
    let file = queue.aux("lost.json");
    std::fs::write(&file, missing_cwd_task("lost").to_string()).unwrap();

    for command in ["validate", "submit"] {
        let out = queue.cairn_output(&[command, file.to_str().unwrap()], b"");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{command} must accept the task: {stderr}"
        );
        assert!(
            stderr.contains("warning:") && stderr.contains(MISSING_DIR),
            "{command} must warn about the missing cwd: {stderr:?}"
        );
    }

    queue.run_until_idle(&[]);
    let record = queue.wait_failed("lost");
    let error = record["error"].as_str().expect("the record has an error");
    assert!(
        error.contains(MISSING_DIR) && error.contains("working directory"),
        "the error must name the missing directory: {error:?}"
    );
}

#[test]
fn an_existing_cwd_draws_no_warning() {
    let queue = TestQueue::new();
    let file = queue.aux("fine.json");
    let mut task = missing_cwd_task("fine");
    task["cwd"] = json!(queue.aux(""));
    std::fs::write(&file, task.to_string()).unwrap();
    let out = queue.cairn_output(&["validate", file.to_str().unwrap()], b"");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        !stderr.contains("warning"),
        "no warning expected: {stderr:?}"
    );
}

/// The daemon's log lines that carry `level` (`ERROR`, `WARN`, `INFO`).
fn lines_at(stderr: &str, level: &str) -> Vec<String> {
    stderr
        .lines()
        .filter(|line| line.split_whitespace().nth(1) == Some(level))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_cancel_is_logged_as_information_and_attempts_are_not_counted_as_failures() {
    let queue = TestQueue::new();
    let side = queue.aux("loop.side");
    queue.seed_task("steer.json", &loop_task("steer", &side, 200, 0.2));
    let mut daemon = queue.start(&[]);
    wait_until("two iterations", DEADLINE, || {
        ended_iterations(&side).len() >= 2
    });

    // Pause and resume: two runs, no failure.
    for action in ["pause", "resume"] {
        let out = queue.cairn_output(&[action, "steer"], b"");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        if action == "pause" {
            wait_until("the task is paused", DEADLINE, || {
                queue.active_entry("steer").map(|e| e["status"] == "paused") == Some(true)
            });
        }
    }
    wait_until("the second run", DEADLINE, || {
        queue
            .active_entry("steer")
            .map(|e| e["attempt"] == 2 && e["status"] == "running")
            == Some(true)
    });
    let out = queue.cairn_output(&["cancel", "steer"], b"");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let record = queue.wait_failed("steer");
    assert_eq!(record["status"], "cancelled");
    assert_eq!(record["attempts"], 2, "{record:#}");
    assert_eq!(record["failed_attempts"], 0, "{record:#}");

    daemon.signal(SIGTERM);
    assert_eq!(daemon.wait_exit(DEADLINE).code(), Some(0));
    let stderr = daemon.stderr();
    assert!(
        lines_at(&stderr, "INFO")
            .iter()
            .any(|l| l.contains("task cancelled") && l.contains("steer")),
        "the cancel must be logged at INFO:\n{stderr}"
    );
    assert_eq!(
        lines_at(&stderr, "ERROR"),
        Vec::<String>::new(),
        "an operator's cancel is no error:\n{stderr}"
    );

    // show gives attempts and failed attempts apart.
    let out = queue.cairn_output(&["show", "steer"], b"");
    let show = String::from_utf8_lossy(&out.stdout);
    let attempts = show
        .lines()
        .find(|l| l.starts_with("attempts "))
        .unwrap_or_else(|| panic!("no attempts line in\n{show}"));
    assert_eq!(
        attempts.split_whitespace().collect::<Vec<_>>().join(" "),
        "attempts 2 (0 failed of 3 allowed)"
    );
}

fn failing_task(id: &str) -> serde_json::Value {
    json!({
        "id": id,
        "retry": {"max_attempts": 1},
        "phases": [{"name": "fail", "run": ["sh", "-c", "exit 3"]}],
    })
}

/// `cairn run --exit-when-idle <args>` to its end: exit code and stderr.
fn run_idle(queue: &TestQueue, args: &[&str]) -> (Option<i32>, String) {
    let mut all = vec!["--exit-when-idle"];
    all.extend_from_slice(args);
    let mut daemon = queue.start(&all);
    let status = daemon.wait_exit(DEADLINE);
    (status.code(), daemon.stderr())
}

#[test]
fn an_idle_exit_sums_up_the_run_and_fails_on_request_when_tasks_failed() {
    let queue = TestQueue::new();
    queue.seed_task("fine.json", &once_task("fine", &json!({"ok": true})));
    queue.seed_task("bad.json", &failing_task("bad"));
    queue.drop_bytes("broken.json", b"{\"phases\": ", true);

    let (code, stderr) = run_idle(&queue, &[]);
    assert_eq!(code, Some(0), "{stderr}");
    let root = queue.root().display().to_string();
    assert!(
        stderr.contains("this run: 1 done, 1 failed, 1 rejected"),
        "{stderr}"
    );
    assert!(stderr.contains(&format!("{root}/done/")), "{stderr}");
    assert!(
        stderr.contains(&format!("bad in {root}/failed/")),
        "{stderr}"
    );
    assert!(stderr.contains("rejected: rejected-broken-"), "{stderr}");

    // With the flag, a failure of this run exits 6; a later run without failures exits 0.
    queue.seed_task("worse.json", &failing_task("worse"));
    let (code, stderr) = run_idle(&queue, &["--fail-on-task-failure"]);
    assert_eq!(code, Some(6), "{stderr}");
    assert!(
        stderr.contains("this run: 0 done, 1 failed, 0 rejected"),
        "{stderr}"
    );
    let (code, stderr) = run_idle(&queue, &["--fail-on-task-failure"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("this run: 0 done, 0 failed, 0 rejected"),
        "{stderr}"
    );
}

#[test]
fn a_paused_task_stays_paused_through_an_idle_run_and_every_message_says_so() {
    let queue = TestQueue::new();
    let side = queue.aux("loop.side");
    queue.seed_task("held.json", &loop_task("held", &side, 200, 0.2));
    let mut daemon = queue.start(&[]);
    wait_until("an iteration", DEADLINE, || {
        !ended_iterations(&side).is_empty()
    });
    let out = queue.cairn_output(&["pause", "held"], b"");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_until("the task is paused", DEADLINE, || {
        queue.active_entry("held").map(|e| e["status"] == "paused") == Some(true)
    });
    daemon.signal(SIGTERM);
    assert_eq!(daemon.wait_exit(DEADLINE).code(), Some(0));
    let iterations = ended_iterations(&side).len();

    // status does not promise that the next run continues it.
    let out = queue.cairn_output(&["status"], b"");
    let notes = String::from_utf8_lossy(&out.stderr);
    assert!(
        notes.contains("1 paused task(s) stay paused") && !notes.contains("continue at the next"),
        "{notes}"
    );

    // An idle run counts it at start, leaves it alone and says how to resume it.
    let (code, stderr) = run_idle(&queue, &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("recovered the queue") && l.contains("paused=1")),
        "{stderr}"
    );
    assert!(
        stderr.contains("1 paused")
            && stderr.contains("held; they stay paused until `cairn resume ID`"),
        "{stderr}"
    );
    assert_eq!(
        ended_iterations(&side).len(),
        iterations,
        "a paused task ran"
    );
    assert_eq!(queue.active_entry("held").unwrap()["status"], "paused");
}

/// The exit codes `cairn --help` lists (`  N    meaning` lines under "Exit codes:").
fn listed_exit_codes(help: &str) -> Vec<u8> {
    help.lines()
        .skip_while(|l| *l != "Exit codes:")
        .skip(1)
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect()
}

#[test]
fn every_exit_code_is_in_the_help_of_each_command_the_readme_and_docs_cli() {
    use cairn::cli::exit;
    let queue = TestQueue::new();
    let expected = vec![
        exit::OK,
        exit::FAILURE,
        exit::USAGE,
        exit::INVALID_TASK,
        exit::QUEUE_LOCKED,
        exit::UNSAFE_QUEUE,
        exit::TASKS_FAILED,
        exit::STOPPED_AT_ONCE,
    ];
    for args in [
        &["--help"][..],
        &["help", "run"],
        &["help", "submit"],
        &["status", "--help"],
    ] {
        let out = queue.cairn_output(args, b"");
        let help = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            listed_exit_codes(&help),
            expected,
            "cairn {args:?}:\n{help}"
        );
    }
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(manifest.join("README.md")).unwrap();
    let paragraph = readme
        .split("\n\n")
        .find(|p| p.starts_with("Exit codes:"))
        .expect("README has an exit codes paragraph")
        .replace('\n', " ");
    let cli_md = std::fs::read_to_string(manifest.join("docs/cli.md")).unwrap();
    for code in expected {
        assert!(
            paragraph.contains(&format!(" {code} ")),
            "README's exit codes lack {code}: {paragraph}"
        );
        assert!(
            cli_md.contains(&format!("\n| {code} | ")),
            "docs/cli.md's exit code table lacks {code}"
        );
    }
}

/// Copy the repository's `queue/examples/` (task files and scripts) into `queue`.
fn copy_examples(queue: &TestQueue) {
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("queue/examples");
    let target = queue.path("examples");
    std::fs::create_dir_all(target.join("scripts")).unwrap();
    for dir in ["", "scripts"] {
        for entry in std::fs::read_dir(source.join(dir)).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_file() {
                std::fs::copy(entry.path(), target.join(dir).join(entry.file_name())).unwrap();
            }
        }
    }
}

#[test]
fn the_worker_examples_find_their_helpers_with_no_setup_outside_the_repository() {
    let queue = TestQueue::new();
    copy_examples(&queue);
    for name in ["train-worker", "crawl-worker"] {
        let file = queue.path(&format!("examples/{name}.json"));
        let out = queue.cairn_output(&["submit", file.to_str().unwrap()], b"");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Neither the daemon nor the shell it was started from knows where the helpers are.
    let out = queue
        .cairn()
        .args(["run", "--exit-when-idle"])
        .env_remove("CAIRN_CLIENTS")
        .env_remove("PYTHONPATH")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("this run: 2 done, 0 failed"), "{stderr}");
    let done = queue.list("done");
    assert_eq!(done.len(), 2, "{done:?}\n{stderr}");
    for record in &done {
        let record = read_json(&queue.path(&format!("done/{record}")));
        let result = &record["result"];
        assert!(
            result["epochs"] == 30 || result["pages"] == 20,
            "unexpected result {result}"
        );
    }
}

#[test]
fn clients_path_prints_the_helpers_built_from_the_repository_files() {
    let queue = TestQueue::new();
    let out = queue.cairn_output(&["clients-path"], b"");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = std::path::PathBuf::from(String::from_utf8(out.stdout).unwrap().trim_end());
    assert_eq!(dir, queue.path("clients"));
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("clients");
    for helper in ["python/cairn_worker.py", "sh/cairn.sh"] {
        assert_eq!(
            std::fs::read(dir.join(helper)).unwrap(),
            std::fs::read(repo.join(helper)).unwrap(),
            "{helper} differs from the repository's"
        );
    }

    // A queue that does not exist is not created.
    let missing = queue.aux("no-such-queue");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .env_remove("CAIRN_QUEUE")
        .arg("--queue")
        .arg(&missing)
        .arg("clients-path")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no queue directory"));
    assert!(!missing.exists());
}

/// `cairn <args>` run from the directory that holds `queue/`, as the README's commands are
/// (no `--queue`: the default `./queue`).
fn readme_cairn(queue: &TestQueue, args: &[&str]) -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"));
    command
        .args(args)
        .current_dir(queue.root().parent().unwrap())
        .env_remove("CAIRN_QUEUE")
        .env_remove("RUST_LOG")
        .env("CAIRN_WAIT", crate::common::DAEMON_WAIT);
    command
}

fn readme_output(queue: &TestQueue, args: &[&str]) -> (String, String) {
    let out = readme_cairn(queue, args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "cairn {args:?}: {}\n{stderr}",
        out.status
    );
    (String::from_utf8(out.stdout).unwrap(), stderr)
}

#[test]
fn the_readme_stop_and_resume_walkthrough_works_as_written() {
    let queue = TestQueue::new();
    copy_examples(&queue);
    // The README's commands run from the directory that holds queue/.
    let (stdout, _) = readme_output(&queue, &["submit", "queue/examples/slow-sum.json"]);
    let id = stdout.trim().to_string();
    assert!(
        id.starts_with("slow-sum-") && id.len() == "slow-sum-".len() + 6,
        "submit printed {stdout:?}"
    );

    // Ctrl-C after a few iterations.
    let mut daemon = readme_cairn(&queue, &["run", "--exit-when-idle"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let checkpoint = queue.path(&format!("incremental/{id}.json.gz"));
    wait_until("three iterations are checkpointed", DEADLINE, || {
        checkpoint.exists() && queue.checkpoint(&id).iteration_count >= 3
    });
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(daemon.id() as i32), SIGINT).unwrap();
    assert_eq!(daemon.wait().unwrap().code(), Some(0));
    let (status, _) = readme_output(&queue, &["status"]);
    assert!(
        status
            .lines()
            .any(|l| l.starts_with(&id) && l.contains("interrupted")),
        "{status}"
    );

    // Run again: it continues, and every iteration ran once.
    readme_output(&queue, &["run", "--exit-when-idle"]);
    let log = std::fs::read_to_string(queue.path(&format!("runs/{id}/0-sum.log"))).unwrap();
    let iterations: Vec<u64> = log
        .lines()
        .filter(|l| l.contains("total is now"))
        .map(|l| l["iteration ".len()..l.find(':').unwrap()].parse().unwrap())
        .collect();
    assert_eq!(iterations, (0..20).collect::<Vec<_>>(), "{log}");
    let done = queue.done(&id).expect("the task is done");
    assert_eq!(done["result"]["total"], 2470);
    let (show, _) = readme_output(&queue, &["show", &id]);
    assert!(
        show.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")
                == "attempts 2 (0 failed of 3 allowed)"),
        "{show}"
    );
}
