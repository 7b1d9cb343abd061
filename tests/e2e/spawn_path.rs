//! How commands are started: through the cairn binary's exec trampoline (`posix_spawn`, no copy
//! of the daemon), which must hand the command everything the `fork` path gave it: the
//! parent-death signal armed, the daemon as its parent, its own process group, its argv[0] as
//! written and SIGPIPE at its default. `crash::a_command_dies_with_the_daemon` shows the signal
//! firing; this shows what the command itself sees.

use crate::common::*;
use serde_json::{json, Value};

/// A command that reports, as its reply, what it sees of how it was started: the shell reads
/// its own signal dispositions and argv (python, which it then becomes, ignores SIGPIPE itself),
/// python its parent-death signal (kept across `exec`), parent, group and directory.
const INSPECT: &str = r#"
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
signal = ctypes.c_int(-1)
libc.prctl(2, ctypes.byref(signal), 0, 0, 0)  # PR_GET_PDEATHSIG
ignored = int(sys.argv[1].split(":")[1].strip(), 16)
print(json.dumps({
    "pdeathsig": signal.value,
    "sigpipe_ignored": bool(ignored & (1 << (13 - 1))),
    "argv": sys.argv[2],
    "parent": os.getppid(),
    "group_leader": os.getpgid(0) == os.getpid(),
    "cwd": os.getcwd(),
}))
"#;

/// Run the inspecting command on a fresh queue, its daemon started under `wrapper`; returns
/// what it saw, with the daemon's pid in place of its parent's.
fn inspect_through(wrapper: &[&str]) -> Value {
    let queue = TestQueue::new();
    let cwd = queue.aux("work");
    std::fs::create_dir_all(&cwd).unwrap();
    let shell = "exec python3 -c \"$0\" \"$(grep SigIgn /proc/$$/status)\" \
                 \"$(tr '\\0' ' ' < /proc/$$/cmdline)\"";
    queue.seed_task(
        "inspect.json",
        &json!({
            "id": "inspect",
            "cwd": cwd,
            "phases": [{"name": "look", "run": ["sh", "-c", shell, INSPECT]}],
        }),
    );
    let mut daemon = queue.start_wrapped(wrapper, &[]);
    let mut seen = queue.wait_done("inspect")["result"].clone();
    let daemon_pid = queue.daemon_pid();
    assert_eq!(seen["parent"], json!(daemon_pid), "{seen:#}");
    seen["parent"] = json!("the daemon");
    let cwd = cwd.canonicalize().unwrap();
    assert_eq!(seen["cwd"], json!(cwd.display().to_string()), "{seen:#}");
    daemon.signal(nix::sys::signal::Signal::SIGTERM);
    daemon.wait_exit(DEADLINE);
    seen
}

#[test]
fn a_command_started_through_the_trampoline_sees_what_a_forked_one_saw() {
    let trampoline = inspect_through(&[]);
    assert_eq!(trampoline["pdeathsig"], json!(9), "{trampoline:#}");
    assert_eq!(
        trampoline["sigpipe_ignored"],
        json!(false),
        "{trampoline:#}"
    );
    assert_eq!(trampoline["group_leader"], json!(true), "{trampoline:#}");
    assert!(
        trampoline["argv"]
            .as_str()
            .unwrap_or_default()
            .starts_with("sh -c "),
        "{trampoline:#}"
    );
    let mut forked = inspect_through(&["env", "CAIRN_SPAWN_VIA_FORK=1"]);
    forked["cwd"] = trampoline["cwd"].clone(); // each queue has its own directory
    assert_eq!(trampoline, forked);
}

#[test]
fn a_missing_program_is_still_a_failed_start_naming_it() {
    let queue = TestQueue::new();
    let mut task = once_task("lost", &json!(1));
    task["phases"][0]["run"] = json!(["cairn-test-no-such-program", "x"]);
    task["retry"] = json!({"max_attempts": 1});
    queue.seed_task("lost.json", &task);
    queue.run_until_idle(&[]);
    let failed = queue.failed("lost").expect("the task failed");
    let error = failed["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("cannot start \"cairn-test-no-such-program\"")
            && error.contains("No such file or directory"),
        "{failed:#}"
    );
}

/// The trampoline runs with the daemon's privileges until it becomes the task's submitter, so
/// the dynamic loader must not read a task's `env` as the trampoline's own: `LD_PRELOAD` (or
/// `GLIBC_TUNABLES`...) from a task would otherwise run the submitter's code with the daemon's
/// capabilities. The loader complains once per process that tries a missing preload: once for
/// the command, never for the trampoline; and the command still gets the variable.
#[test]
fn a_tasks_loader_variables_reach_its_command_but_not_the_trampoline() {
    let queue = TestQueue::new();
    let preload = "/nonexistent/cairn-test-preload.so";
    queue.seed_task(
        "preload.json",
        &json!({
            "id": "preload",
            "env": {"LD_PRELOAD": preload},
            "phases": [{"name": "p", "run": ["sh", "-c", "printf '{\"seen\": \"%s\"}' \"$LD_PRELOAD\""]}],
        }),
    );
    let mut daemon = queue.start(&[]);
    let record = queue.wait_done("preload");
    assert_eq!(record["result"]["seen"], json!(preload), "{record:#}");
    daemon.signal(nix::sys::signal::Signal::SIGTERM);
    daemon.wait_exit(DEADLINE);
    let log = std::fs::read_to_string(queue.path("runs/preload/0-p.log")).unwrap();
    let complaints = log.matches("cannot be preloaded").count();
    assert_eq!(
        complaints, 1,
        "the loader read LD_PRELOAD in the command only, not in the trampoline:\n{log}"
    );
}
