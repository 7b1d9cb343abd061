//! Runs the worker helpers' own test suites: `clients/python` (unittest) and `clients/sh`
//! (a POSIX sh script). Both use a real FIFO as the channel and a real SIGTERM.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// How long a suite may take before it is taken for hung: far beyond what it needs on a busy
/// machine (each of its own waits is bounded by 120 s), so that a hang fails the test instead of
/// holding up the whole run.
const SUITE_DEADLINE: Duration = Duration::from_secs(900);

/// Run `program args` in `dir` (relative to the crate root), in a process group of its own; fail
/// with its output unless it exits 0 within [`SUITE_DEADLINE`] (past it, the group is killed).
fn run_suite(dir: &str, program: &str, args: &[&str]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // Files, not pipes: a process the suite left behind cannot hold up reading them.
    let stdout = tempfile::tempfile().expect("a temp file for stdout");
    let stderr = tempfile::tempfile().expect("a temp file for stderr");
    let mut child = Command::new(program)
        .args(args)
        .current_dir(root.join(dir))
        .env("PYTHONDONTWRITEBYTECODE", "1") // no __pycache__ in the source tree
        .env_remove("CAIRN_CHANNEL")
        .env_remove("CAIRN_ACK")
        .env_remove("CAIRN_RESUME")
        .env_remove("CAIRN_DEBUG")
        .stdin(Stdio::null())
        .stdout(stdout.try_clone().expect("cloning a file handle"))
        .stderr(stderr.try_clone().expect("cloning a file handle"))
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {program} (needed by this test): {e}"));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for the suite") {
            break Some(status);
        }
        if started.elapsed() > SUITE_DEADLINE {
            let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (stdout, stderr) = (contents(stdout), contents(stderr));
    let outcome = match status {
        Some(status) if status.success() => return,
        Some(status) => format!("failed with {status}"),
        None => format!("hung: killed after {SUITE_DEADLINE:?}"),
    };
    panic!(
        "`{program} {}` in {dir} {outcome}\n--- stdout:\n{stdout}\n--- stderr:\n{stderr}",
        args.join(" "),
    );
}

/// What the suite wrote into `file`.
fn contents(mut file: std::fs::File) -> String {
    use std::io::{Read, Seek};
    let mut bytes = Vec::new();
    let _ = file.rewind().and_then(|()| file.read_to_end(&mut bytes));
    String::from_utf8_lossy(&bytes).into_owned()
}

#[test]
fn python_helper() {
    run_suite("clients/python", "python3", &["-m", "unittest"]);
}

#[test]
fn shell_helper() {
    run_suite(".", "sh", &["clients/sh/test_cairn.sh"]);
}
