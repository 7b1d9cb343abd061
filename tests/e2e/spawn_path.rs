//! How commands are started: by a `vfork`-style clone that shares the daemon's memory (no copy
//! of the daemon, no helper process), which must hand the command what a `fork` gave it: the
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
fn a_command_sees_the_death_signal_its_group_its_argv_and_sigpipe_at_its_default() {
    let seen = inspect_through(&[]);
    assert_eq!(seen["pdeathsig"], json!(9), "{seen:#}");
    assert_eq!(seen["sigpipe_ignored"], json!(false), "{seen:#}");
    assert_eq!(seen["group_leader"], json!(true), "{seen:#}");
    assert!(
        seen["argv"]
            .as_str()
            .unwrap_or_default()
            .starts_with("sh -c "),
        "{seen:#}"
    );
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

/// Nothing but the command may be `exec`ed with a task's `env`: a helper program started with
/// the daemon's privileges before the switch to the submitter would have its dynamic loader
/// read the task's `LD_PRELOAD` (or `GLIBC_TUNABLES`...), running the submitter's code with the
/// daemon's capabilities (cairn once started commands through such a helper). The loader
/// complains once per process that tries a missing preload: once, for the command; and the
/// command still gets the variable.
#[test]
fn a_tasks_loader_variables_reach_its_command_and_no_other_program() {
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
        "the loader read LD_PRELOAD in the command only:\n{log}"
    );
}
