//! The system calls of a real daemon run, seen through strace: on the commit log path (the
//! default), every iteration checkpoint is written as temp file → write → log record →
//! fdatasync of the log → rename; on the replace path (`CAIRN_COMMIT_PATH=replace`), as temp
//! file → write → fsync → rename → directory fsync, and no checkpoint file is ever opened for
//! writing in place.
//!
//! Needs `strace` (`.ci/run` installs it): without it the test is skipped with a message,
//! except in CI, where it fails.

use std::collections::HashMap;
use std::fs;
use std::path::Path;

use crate::common::*;

/// One system call of one thread, as strace printed it.
#[derive(Debug)]
struct Call {
    name: String,
    args: String,
    result: String,
}

fn parse_line(line: &str) -> Option<Call> {
    let open = line.find('(')?;
    let name = line[..open].trim().to_string();
    let equals = line.rfind(" = ")?;
    let close = line[..equals].rfind(')')?;
    Some(Call {
        name,
        args: line[open + 1..close].to_string(),
        result: line[equals + 3..]
            .split_whitespace()
            .next()
            .unwrap_or("")
            .to_string(),
    })
}

/// The quoted strings among a call's arguments.
fn quoted(args: &str) -> Vec<String> {
    args.split('"')
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(_, s)| s.to_string())
        .collect()
}

fn first_fd(args: &str) -> Option<i64> {
    args.split(',').next()?.trim().parse().ok()
}

/// The loop task the traced daemons run: `iterations` checkpointed iterations.
fn traced_task(queue: &TestQueue, iterations: u64) {
    let task = serde_json::json!({
        "id": "traced",
        "phases": [{
            "name": "count",
            "kind": "loop",
            "run": ["sh", "-c", "read -r request; i=${CAIRN_ITERATION}; printf '{\"state\": %s}' \"$((i + 1))\""],
            "max_iterations": iterations,
        }]
    });
    queue.seed_task("traced.json", &task);
}

/// Run the daemon under strace with `CAIRN_COMMIT_PATH=<commit_path>` until the traced task is
/// done; every thread's trace of the file calls.
fn traced_run(queue: &TestQueue, commit_path: &str) -> Vec<String> {
    traced_until_done(
        queue,
        commit_path,
        "trace=open,openat,creat,write,pwrite64,fsync,fdatasync,rename,renameat,renameat2,link,linkat,close",
    )
}

/// [`strace_until_idle`], then check that the traced task is done.
fn traced_until_done(queue: &TestQueue, commit_path: &str, calls: &str) -> Vec<String> {
    let traces = strace_until_idle(queue, commit_path, calls);
    let done = queue.wait_done("traced");
    assert_eq!(done["status"], "done", "{done}");
    traces
}

/// Run the daemon with `CAIRN_COMMIT_PATH=<commit_path>` under strace, tracing `calls` (an
/// strace `-e` expression), until it is idle; every thread's trace, one per thread.
fn strace_until_idle(queue: &TestQueue, commit_path: &str, calls: &str) -> Vec<String> {
    let trace_dir = queue.aux("trace");
    fs::create_dir_all(&trace_dir).unwrap();
    let trace_prefix = trace_dir.join("t");
    let env = format!("CAIRN_COMMIT_PATH={commit_path}");
    let mut daemon = queue.start_wrapped(
        &[
            "env",
            &env,
            "strace",
            "-f",
            "-ff",
            "-qq",
            "-o",
            trace_prefix.to_str().unwrap(),
            "-e",
            calls,
            "--",
        ],
        &["--exit-when-idle"],
    );
    let status = daemon.wait_exit(DEADLINE);
    assert!(status.success(), "cairn under strace failed: {status}");
    fs::read_dir(&trace_dir)
        .unwrap()
        .map(|trace| fs::read_to_string(trace.unwrap().path()).unwrap())
        .collect()
}

#[test]
fn every_checkpoint_through_the_log_is_temp_write_log_fdatasync_rename() {
    if !require_strace("every_checkpoint_through_the_log_is_temp_write_log_fdatasync_rename") {
        return;
    }
    let queue = TestQueue::new();
    let iterations = 5;
    traced_task(&queue, iterations);
    let traces = traced_run(&queue, "log");
    let incremental = fs::canonicalize(queue.path("incremental")).unwrap();
    let incremental = incremental.to_str().unwrap().to_string();
    let log = format!("{incremental}/.commit-log");
    // The log is opened once, on whichever thread opens the queue, and held open: its
    // descriptor is the same in every thread.
    let log_fds: Vec<i64> = traces
        .iter()
        .flat_map(|text| text.lines())
        .filter_map(parse_line)
        .filter(|call| call.name.starts_with("open") && quoted(&call.args).first() == Some(&log))
        .filter_map(|call| call.result.parse().ok())
        .collect();
    assert!(!log_fds.is_empty(), "the daemon never opened {log}");
    let committed: usize = traces
        .iter()
        .map(|text| check_logged_thread(text, &incremental, &log_fds))
        .sum();
    assert_eq!(
        committed, iterations as usize,
        "expected one committed checkpoint per iteration"
    );
}

/// Check one thread's calls on the log path: each checkpoint rename is of a fully written temp
/// file, after a record was written to the commit log and the log was fdatasynced. Returns how
/// many checkpoint files it committed.
fn check_logged_thread(text: &str, incremental: &str, log_fds: &[i64]) -> usize {
    let log = format!("{incremental}/.commit-log");
    let mut open: HashMap<i64, String> = log_fds.iter().map(|&fd| (fd, log.clone())).collect();
    // temp path → written
    let mut temps: HashMap<String, bool> = HashMap::new();
    // (a record was written to the log, and the log synced since)
    let mut logged = (false, false);
    let mut committed = 0;
    for line in text.lines() {
        let Some(call) = parse_line(line) else {
            continue;
        };
        let fd_path = || first_fd(&call.args).and_then(|fd| open.get(&fd)).cloned();
        match call.name.as_str() {
            "open" | "openat" | "creat" => {
                let Some(path) = quoted(&call.args).into_iter().next() else {
                    continue;
                };
                if let Ok(fd) = call.result.parse::<i64>() {
                    if path.ends_with(".cairn.tmp") {
                        temps.insert(path.clone(), false);
                    }
                    open.insert(fd, path);
                }
            }
            "write" | "pwrite64" => match fd_path() {
                Some(path) if path == log => logged = (true, false),
                Some(path) => {
                    if let Some(written) = temps.get_mut(&path) {
                        *written = true;
                    }
                }
                None => {}
            },
            "fsync" | "fdatasync" if fd_path().as_deref() == Some(log.as_str()) && logged.0 => {
                assert_eq!(call.result, "0", "fdatasync failed: {line}");
                logged.1 = true;
            }
            "close" => {
                if let Some(fd) = first_fd(&call.args) {
                    open.remove(&fd);
                }
            }
            "rename" | "renameat" | "renameat2" => {
                let paths = quoted(&call.args);
                let (Some(from), Some(to)) = (paths.first(), paths.get(1)) else {
                    continue;
                };
                if Path::new(to).parent().and_then(|p| p.to_str()) != Some(incremental)
                    || !to.ends_with(".json.gz")
                {
                    continue;
                }
                assert_eq!(
                    temps.get(from),
                    Some(&true),
                    "renamed over {to} from {from}, which was not a fully written temp file: {line}"
                );
                assert_eq!(
                    logged,
                    (true, true),
                    "renamed over {to} before its record was written to the log and the log synced: {line}"
                );
                assert_eq!(call.result, "0", "rename failed: {line}");
                logged = (false, false);
                committed += 1;
            }
            _ => {}
        }
    }
    committed
}

#[test]
fn every_checkpoint_is_temp_fsync_rename_dirfsync() {
    if !require_strace("every_checkpoint_is_temp_fsync_rename_dirfsync") {
        return;
    }
    let queue = TestQueue::new();
    let iterations = 5;
    traced_task(&queue, iterations);
    let traces = traced_run(&queue, "replace");
    let incremental = fs::canonicalize(queue.path("incremental")).unwrap();
    let incremental = incremental.to_str().unwrap().to_string();
    let committed: usize = traces
        .iter()
        .map(|text| check_thread(text, &incremental))
        .sum();
    // Iterations 1..=4 are checkpointed as they complete, the 5th by the final (done) checkpoint.
    assert_eq!(
        committed, iterations as usize,
        "expected one committed checkpoint per iteration"
    );
}

/// Check one thread's calls; returns how many checkpoint files it committed.
fn check_thread(text: &str, incremental: &str) -> usize {
    let is_checkpoint = |path: &str| {
        Path::new(path).parent().and_then(|p| p.to_str()) == Some(incremental)
            && path.ends_with(".json.gz")
            && !Path::new(path)
                .file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with('.')
    };
    // fd → path, for the files and directories this thread has open.
    let mut open: HashMap<i64, String> = HashMap::new();
    // temp path → (written since last fsync, fsynced)
    let mut temps: HashMap<String, (bool, bool)> = HashMap::new();
    // A rename into incremental/ waiting for its directory fsync.
    let mut awaiting_dir_sync: Option<String> = None;
    let mut committed = 0;
    for line in text.lines() {
        let Some(call) = parse_line(line) else {
            continue;
        };
        match call.name.as_str() {
            "open" | "openat" | "creat" => {
                let Some(path) = quoted(&call.args).into_iter().next() else {
                    continue;
                };
                let writing = call.args.contains("O_WRONLY")
                    || call.args.contains("O_RDWR")
                    || call.name == "creat";
                assert!(
                    !(writing && is_checkpoint(&path)),
                    "a checkpoint file was opened for writing in place: {line}"
                );
                if let Ok(fd) = call.result.parse::<i64>() {
                    if writing && path.ends_with(".cairn.tmp") {
                        temps.insert(path.clone(), (false, false));
                    }
                    open.insert(fd, path);
                }
            }
            "write" | "pwrite64" => {
                if let Some(path) = first_fd(&call.args).and_then(|fd| open.get(&fd)) {
                    if let Some(state) = temps.get_mut(path) {
                        *state = (true, false);
                    }
                }
            }
            "fsync" | "fdatasync" => {
                let Some(path) = first_fd(&call.args).and_then(|fd| open.get(&fd)).cloned() else {
                    continue;
                };
                assert_eq!(call.result, "0", "fsync failed: {line}");
                if let Some(state) = temps.get_mut(&path) {
                    *state = (false, true);
                }
                if path == incremental && awaiting_dir_sync.take().is_some() {
                    committed += 1;
                }
            }
            "close" => {
                if let Some(fd) = first_fd(&call.args) {
                    open.remove(&fd);
                }
            }
            "rename" | "renameat" | "renameat2" => {
                let paths = quoted(&call.args);
                let (Some(from), Some(to)) = (paths.first(), paths.get(1)) else {
                    continue;
                };
                if !is_checkpoint(to) {
                    continue;
                }
                assert!(
                    awaiting_dir_sync.is_none(),
                    "a second checkpoint rename came before the directory fsync of the first: {line}"
                );
                let state = temps.get(from).copied();
                assert_eq!(
                    state,
                    Some((false, true)),
                    "renamed over {to} from {from}, which was not a fully written and fsynced temp file: {line}"
                );
                assert_eq!(call.result, "0", "rename failed: {line}");
                awaiting_dir_sync = Some(to.clone());
            }
            _ => {}
        }
    }
    assert!(
        awaiting_dir_sync.is_none(),
        "a checkpoint was renamed into place but its directory was never fsynced: {awaiting_dir_sync:?}"
    );
    committed
}

/// Tasks taken in from the inbox together learn their checkpoint generations from one listing
/// of `incremental/`, not one each at their first save: with thousands of new tasks against a
/// large `incremental/`, a listing per task made first saves quadratic.
#[test]
fn new_tasks_taken_in_together_list_incremental_once_not_once_each() {
    if !require_strace("new_tasks_taken_in_together_list_incremental_once_not_once_each") {
        return;
    }
    let queue = TestQueue::new();
    let tasks = 12;
    for n in 0..tasks {
        let task = serde_json::json!({
            "id": format!("new-{n}"),
            "phases": [{
                "name": "count",
                "kind": "loop",
                "run": ["sh", "-c", "read -r request; printf '{\"state\": 1}'"],
                "max_iterations": 2,
            }]
        });
        queue.seed_task(&format!("new-{n}.json"), &task);
    }
    let traces = strace_until_idle(&queue, "log", "trace=openat");
    for n in 0..tasks {
        let done = queue.wait_done(&format!("new-{n}"));
        assert_eq!(done["status"], "done", "{done}");
    }
    let incremental = fs::canonicalize(queue.path("incremental")).unwrap();
    let incremental = incremental.to_str().unwrap().to_string();
    let listings = traces
        .iter()
        .flat_map(|text| text.lines())
        .filter_map(parse_line)
        // A listing opens the directory as `opendir` does (a directory fsync does not ask
        // for O_NONBLOCK).
        .filter(|call| {
            call.name == "openat"
                && call.args.contains("O_NONBLOCK")
                && call.args.contains("O_DIRECTORY")
                && quoted(&call.args).first() == Some(&incremental)
        })
        .count();
    // At start the daemon looks through its directories once (leftover temp files); each
    // batch taken in from the inbox lists `incremental/` once more. Far fewer than one per task.
    assert!(
        listings < tasks / 2,
        "incremental/ was listed {listings} times for {tasks} new tasks"
    );
}

/// Whether `text` is the trace of the daemon's async thread: the daemon's first thread, whose
/// trace starts with the exec of cairn. The blocking pool's threads exec nothing; the commands'
/// processes exec their programs.
fn is_async_thread(text: &str) -> bool {
    text.lines()
        .filter_map(parse_line)
        .find(|call| call.name == "execve")
        .is_some_and(|call| {
            quoted(&call.args)
                .first()
                .is_some_and(|p| p.ends_with("/cairn"))
        })
}

#[test]
fn a_phase_log_is_created_off_the_async_thread_and_then_only_opened() {
    if !require_strace("a_phase_log_is_created_off_the_async_thread_and_then_only_opened") {
        return;
    }
    let queue = TestQueue::new();
    let iterations = 3;
    traced_task(&queue, iterations);
    let traces = traced_until_done(&queue, "log", "trace=openat,execve");
    let log = fs::canonicalize(queue.path("runs/traced/0-count.log")).unwrap();
    let log = log.to_str().unwrap().to_string();
    let opens_of_log = |text: &String| -> Vec<Call> {
        text.lines()
            .filter_map(parse_line)
            .filter(|call| call.name == "openat" && quoted(&call.args).first() == Some(&log))
            .collect()
    };
    let async_thread: Vec<&String> = traces.iter().filter(|text| is_async_thread(text)).collect();
    assert_eq!(async_thread.len(), 1, "one trace starts with cairn's exec");
    let on_async = opens_of_log(async_thread[0]);
    assert!(
        on_async.iter().all(|call| !call.args.contains("O_CREAT")),
        "the async thread created the log: {on_async:?}"
    );
    let opened = on_async
        .iter()
        .filter(|call| call.result.parse::<i64>().is_ok_and(|fd| fd >= 0))
        .count();
    assert_eq!(
        opened,
        iterations as usize - 1,
        "every command after the first opens the existing log on the async thread: {on_async:?}"
    );
    let created = traces
        .iter()
        .filter(|text| !is_async_thread(text))
        .flat_map(opens_of_log)
        .filter(|call| {
            call.args.contains("O_CREAT") && call.result.parse::<i64>().is_ok_and(|fd| fd >= 0)
        })
        .count();
    assert_eq!(created, 1, "the log is created once, on the blocking pool");
}

#[test]
fn a_workers_fifos_resume_file_and_log_are_made_off_the_async_thread() {
    if !require_strace("a_workers_fifos_resume_file_and_log_are_made_off_the_async_thread") {
        return;
    }
    let queue = TestQueue::new();
    let task = serde_json::json!({
        "id": "traced",
        "phases": [{"name": "work", "kind": "worker", "run": ["sh", "-c", "exit 0"]}]
    });
    queue.seed_task("traced.json", &task);
    let traces = traced_until_done(&queue, "log", "trace=openat,mknod,mknodat,execve");
    let run_dir = fs::canonicalize(queue.path("runs/traced")).unwrap();
    let run_dir = format!("{}/", run_dir.to_str().unwrap());
    let makes_in_run_dir = |text: &String| -> Vec<String> {
        text.lines()
            .filter_map(parse_line)
            .filter(|call| {
                quoted(&call.args)
                    .first()
                    .is_some_and(|path| path.starts_with(&run_dir))
                    && (call.name.starts_with("mknod") || call.args.contains("O_CREAT"))
            })
            .map(|call| format!("{}({})", call.name, call.args))
            .collect()
    };
    let (on_async, elsewhere): (Vec<&String>, Vec<&String>) =
        traces.iter().partition(|text| is_async_thread(text));
    assert_eq!(on_async.len(), 1, "one trace starts with cairn's exec");
    let made_on_async = makes_in_run_dir(on_async[0]);
    assert!(
        made_on_async.is_empty(),
        "the async thread made files: {made_on_async:?}"
    );
    let fifos = elsewhere
        .into_iter()
        .flat_map(makes_in_run_dir)
        .filter(|call| call.starts_with("mknod"))
        .count();
    assert_eq!(
        fifos, 2,
        "the channel and the ack pipe are made on the blocking pool"
    );
}
