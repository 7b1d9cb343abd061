//! A submitter cannot freeze the daemon by stopping its own commands as they start
//! (`--run-as-submitter`). A command run as its submitter starts through cairn's trampoline:
//! the daemon's part of the start ends with the `exec` of the trampoline, while the new process
//! is still the daemon's; the switch of user, the `PATH` search and the `exec` of the command
//! follow in the trampoline, where a stop only stops the submitter's own task.

use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::json;

use crate::common::*;
use crate::run_as_submitter::{cairn_as, own, share_with_group};

/// Run as a submitter: stop (SIGSTOP) every process of this user whose `/proc/<pid>/exe` it may
/// not read, which is a process between its change of user and the `exec` of the command (a
/// changed user leaves a process undumpable until its next `exec`), and write each pid it
/// stopped into the file named by its first argument. It scans without pause.
const STOPPER: &str = r#"
import os, signal, sys
me, out, stopped = os.getuid(), sys.argv[1], set()
while True:
    for name in os.listdir('/proc'):
        if not name.isdigit() or int(name) == os.getpid() or int(name) in stopped:
            continue
        pid = int(name)
        try:
            with open(f'/proc/{pid}/status') as status:
                uid = next(l for l in status if l.startswith('Uid:')).split()[1]
            if int(uid) != me:
                continue
            try:
                os.readlink(f'/proc/{pid}/exe')
                continue
            except PermissionError:
                pass
            os.kill(pid, signal.SIGSTOP)
            stopped.add(pid)
            with open(out, 'a') as f:
                f.write(f'{pid}\n')
        except (OSError, StopIteration, ValueError):
            continue
"#;

/// A `PATH` of `count` directories that do not exist before the real ones: each start of a
/// command searches them all, which makes the time between the change of user and the `exec`
/// long enough for the stopper to see.
fn long_path(count: usize) -> String {
    let mut path: Vec<String> = (0..count)
        .map(|i| format!("/nonexistent-cairn/{i}"))
        .collect();
    path.push("/usr/bin:/bin".into());
    path.join(":")
}

#[test]
fn a_submitter_stopping_its_starting_commands_leaves_the_daemon_working() {
    const TEST: &str = "a_submitter_stopping_its_starting_commands_leaves_the_daemon_working";
    if !require_root(TEST, "it creates users and runs tasks as them")
        || require_tool(TEST, "setpriv", "util-linux").is_none()
        || require_tool(TEST, "useradd", "passwd").is_none()
    {
        return;
    }
    let users = SystemUsers::create(&["a", "b"]);
    let (alice, bob) = (&users.users[0], &users.users[1]);
    let gid = users.gid;
    let queue = TestQueue::new();
    share_with_group(&queue, 0, gid);
    let mut daemon = queue.start_wrapped(
        &["setpriv", &format!("--regid={gid}"), "--clear-groups"],
        &["--run-as-submitter", "--max-tasks", "6"],
    );

    // Alice's loop, checkpointed every iteration.
    let fixture = fixture("logging_loop.py");
    let alice_task = json!({
        "id": "alice-job",
        "phases": [{"name": "count", "kind": "loop", "max_iterations": 100000, "run": [
            "sh", "-c", "exec python3 \"$0\" \"$CAIRN_SCRATCH/side\" --sleep 0.2", fixture,
        ]}],
    });
    let submitted = cairn_as(
        &queue,
        &users,
        alice,
        &["submit", "-"],
        alice_task.to_string().as_bytes(),
    );
    assert!(submitted.status.success(), "{}", stderr_of(&submitted));
    wait_until("alice's task to have a checkpoint", DEADLINE, || {
        queue.path("incremental/alice-job.json.gz").exists()
    });

    // Bob's loops start command after command. They are submitted before his stopper runs,
    // which would otherwise stop his own `cairn submit` in the moment between its change of
    // user and its exec, and the test with it.
    for n in 0..2 {
        let bob_task = json!({
            "id": format!("bob-spins-{n}"),
            "env": {"PATH": long_path(5000)},
            "phases": [{"name": "spin", "kind": "loop", "max_iterations": 100000, "run": [
                "sh", "-c", "echo '{\"state\": 1}'",
            ]}],
        });
        let submitted = cairn_as(
            &queue,
            &users,
            bob,
            &["submit", "-"],
            bob_task.to_string().as_bytes(),
        );
        assert!(submitted.status.success(), "{}", stderr_of(&submitted));
    }
    // Bob stops his own processes in their start.
    let stopped_file = queue.aux("stopped");
    std::fs::write(&stopped_file, "").unwrap();
    own(&stopped_file, bob.uid, gid, 0o644);
    let mut stopper = std::process::Command::new("setpriv")
        .arg(format!("--reuid={}", bob.uid))
        .arg(format!("--regid={gid}"))
        .arg("--init-groups")
        .arg(python_for(bob.uid, gid))
        .args(["-c", STOPPER])
        .arg(&stopped_file)
        .stdin(std::process::Stdio::null())
        .spawn()
        .expect("starting bob's stopper");
    let stopper_pid = stopper.id() as i32;
    let kill_stopper = KillOnDrop(stopper_pid);
    let caught: Vec<i32> = wait_for("bob's stopper to stop a starting command", DEADLINE, || {
        let pids: Vec<i32> = std::fs::read_to_string(&stopped_file)
            .ok()?
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        (!pids.is_empty()).then_some(pids)
    });
    let kill_caught: Vec<KillOnDrop> = caught.iter().map(|pid| KillOnDrop(*pid)).collect();
    eprintln!("{TEST}: bob's stopper stopped {caught:?} in their start");

    // The daemon goes on: alice's loop checkpoints,
    let before = queue.checkpoint("alice-job").iteration_count;
    wait_until("alice's loop to checkpoint again", DEADLINE, || {
        queue.checkpoint("alice-job").iteration_count > before + 2
    });
    // a new file is taken and run,
    queue.drop_task("later.json", &once_task("later", &json!({"ok": true})));
    assert_eq!(queue.wait_done("later")["result"], json!({"ok": true}));
    // and a request steers a task.
    let paused = queue.cairn_output(&["pause", "alice-job"], b"");
    assert!(paused.status.success(), "{}", stderr_of(&paused));
    wait_until("alice's task to be paused", DEADLINE, || {
        queue
            .active_entry("alice-job")
            .is_some_and(|e| e["status"] == "paused")
    });

    // A step of the trampoline that fails is a failed start naming the step, as before.
    drop(kill_stopper);
    let _ = stopper.wait();
    let private = queue.aux("private");
    std::fs::create_dir(&private).unwrap();
    own(&private, 0, 0, 0o700);
    let locked_out = json!({
        "id": "bob-locked-out",
        "cwd": private,
        "retry": {"max_attempts": 1},
        "phases": [{"name": "say", "run": ["true"]}],
    });
    let submitted = cairn_as(
        &queue,
        &users,
        bob,
        &["submit", "-"],
        locked_out.to_string().as_bytes(),
    );
    assert!(submitted.status.success(), "{}", stderr_of(&submitted));
    let failed = queue.wait_failed("bob-locked-out").to_string();
    assert!(
        failed.contains("cannot enter its working directory")
            && failed.contains("Permission denied"),
        "{failed}"
    );
    drop(kill_caught);
    daemon.signal(Signal::SIGTERM);
    let status = daemon.wait_exit(DEADLINE + Duration::from_secs(30));
    assert!(status.code().is_some(), "{}", daemon.stderr());
}

/// A `python3` on this process's `PATH` that user `uid` may run (a version manager's shims in
/// root's home are not).
fn python_for(uid: u32, gid: u32) -> std::path::PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("python3"))
        .find(|python| {
            std::process::Command::new("setpriv")
                .arg(format!("--reuid={uid}"))
                .arg(format!("--regid={gid}"))
                .arg("--clear-groups")
                .arg(python)
                .args(["-c", "pass"])
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|status| status.success())
        })
        .unwrap_or_else(|| panic!("no python3 on PATH that user {uid} may run"))
}

/// SIGKILL a process this test started (or had started for it) when dropped.
struct KillOnDrop(i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.0), Signal::SIGKILL);
    }
}
