//! Shared helpers for the end-to-end tests (the `e2e` binary): a temp queue, the real `cairn`
//! binary (also under a wrapper such as strace), a daemon handle that sends real signals,
//! polling with deadlines, the prerequisites a test may skip without, and readers for what
//! cairn leaves on disk (records, checkpoints, temp files) and for the fixtures' side files.
//!
//! Each test reads as its scenario; the plumbing lives here. Nothing waits a fixed time for a
//! state: [`wait_until`] polls with a generous deadline and says what it waited for.

#[cfg(feature = "postgres")]
pub(crate) mod delay_proxy;
pub(crate) mod http;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
mod side_file;
mod system_users;
mod temp_files;

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use cairn::store::{decode_checkpoint, IterationCheckpoint};
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};
use tempfile::TempDir;

pub(crate) use nix::sys::signal::Signal::{SIGINT, SIGKILL, SIGTERM};
pub(crate) use side_file::*;
pub(crate) use system_users::{SystemUser, SystemUsers};
pub(crate) use temp_files::temp_files;

/// How long a test waits for a state before it fails. Generous: tests run in parallel on a
/// small, busy machine (a Python iteration can take a second there), and a deadline only costs
/// time when something is wrong. A test that checks something does *not* happen within it
/// makes that thing take far longer (an hour-long sleep), never a few seconds.
pub(crate) const DEADLINE: Duration = Duration::from_secs(120);

/// How long `cairn pause|resume|cancel|retry|budget` wait for a running daemon to take a
/// request in the tests (`CAIRN_WAIT`): as long as any other wait.
pub(crate) const DAEMON_WAIT: &str = "120s";

/// How often [`wait_until`] looks again.
const POLL: Duration = Duration::from_millis(25);

/// True when the tests run in CI (`CI=true`), where every prerequisite must be present.
pub(crate) fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Whether a test may go on without `prerequisite`: outside CI it prints a loud message and
/// returns false, so that the test returns early and passes as skipped; in CI, where
/// everything is installed and the tests run as root, it fails the test.
pub(crate) fn prerequisite_missing(test: &str, prerequisite: &str) -> bool {
    assert!(
        !in_ci(),
        "{test}: {prerequisite}, which CI must provide (CI=true; .ci/run installs the tools and runs as root)"
    );
    // Straight to stderr: the test harness keeps what `eprintln!` prints from passing tests.
    let _ = writeln!(
        std::io::stderr(),
        "\n*** SKIPPED {test}: {prerequisite} ***\n"
    );
    false
}

/// True if the tests run as root; otherwise (outside CI) a loud skip message and false.
/// Use: `if !require_root("my_test", "it mounts a tmpfs") { return; }`.
pub(crate) fn require_root(test: &str, why: &str) -> bool {
    nix::unistd::geteuid().is_root()
        || prerequisite_missing(test, &format!("needs root ({why}); run it as root"))
}

/// The path of the program `name` on `PATH` (or in the usual system directories); outside CI,
/// if it is missing, a loud skip message and `None`.
pub(crate) fn require_tool(test: &str, name: &str, package: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .chain([
            "/usr/bin".into(),
            "/usr/sbin".into(),
            "/bin".into(),
            "/sbin".into(),
        ])
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file());
    if found.is_none() {
        prerequisite_missing(
            test,
            &format!("needs {name}, which is not installed (apt-get install {package})"),
        );
    }
    found
}

/// True if strace can trace here (installed, and ptrace allowed); otherwise (outside CI) a
/// loud skip message and false.
pub(crate) fn require_strace(test: &str) -> bool {
    Command::new("strace")
        .args(["-f", "-qq", "-o", "/dev/null", "-e", "trace=fsync", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
        || prerequisite_missing(
            test,
            "needs a working strace (apt-get install strace; ptrace must be allowed)",
        )
}

/// What a finished command printed on stdout, as text.
pub(crate) fn stdout_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// What a finished command printed on stderr, as text.
pub(crate) fn stderr_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The binary of the example `name` (`examples/<name>.rs`), built first: `cargo test --test
/// e2e` alone does not build the examples. It goes into `target/<profile>/examples/`, beside
/// the `deps/` directory this test binary runs from.
pub(crate) fn example_binary(name: &str) -> PathBuf {
    let mut build = Command::new(env!("CARGO"));
    build.args(["build", "--quiet", "--example", name]);
    if !cfg!(debug_assertions) {
        build.arg("--release"); // the same profile as this test, so the same target directory
    }
    let status = build
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("running cargo build --example");
    assert!(status.success(), "cargo build --example {name}: {status}");
    let exe = std::env::current_exe().expect("the test binary's path");
    let examples = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test binary lives in target/<profile>/deps")
        .join("examples");
    let plain = examples.join(name);
    if plain.is_file() {
        return plain;
    }
    // Only the hashed name (`<name>-<hash>`): take the newest.
    let prefix = format!("{name}-");
    fs::read_dir(&examples)
        .expect("target/<profile>/examples exists")
        .filter_map(|entry| entry.ok())
        .filter(|entry| {
            let file = entry.file_name().to_string_lossy().into_owned();
            file.starts_with(&prefix) && !file.contains('.')
        })
        .max_by_key(|entry| entry.metadata().and_then(|m| m.modified()).ok())
        .map(|entry| entry.path())
        .unwrap_or_else(|| panic!("the example {name} was not built"))
}

/// A test fixture's path (`tests/fixtures/<name>`).
pub(crate) fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// Poll `condition` until it holds; panic with `what` once `timeout` has passed.
pub(crate) fn wait_until(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    wait_for(what, timeout, || condition().then_some(()))
}

/// Poll `probe` until it returns a value; panic with `what` once `timeout` has passed.
pub(crate) fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut probe: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = probe() {
            return value;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting until {what}");
        }
        std::thread::sleep(POLL);
    }
}

/// A queue directory in a fresh temp dir, plus room beside it (outside the queue) for side
/// files and daemon logs. On a failing test its daemons' stderr is printed.
pub(crate) struct TestQueue {
    tmp: TempDir,
    root: PathBuf,
    daemons_started: AtomicUsize,
}

impl TestQueue {
    pub(crate) fn new() -> TestQueue {
        let tmp = tempfile::Builder::new()
            .prefix("cairn-e2e-")
            .tempdir()
            .expect("creating a temp dir");
        let root = tmp.path().join("queue");
        fs::create_dir_all(root.join("inbox")).expect("creating the queue's inbox");
        // Closed to other users, as cairn creates a queue: a queue every user may enter is
        // refused once it holds a task with `env`.
        fs::set_permissions(&root, fs::Permissions::from_mode(0o750))
            .expect("closing the queue to other users");
        TestQueue {
            tmp,
            root,
            daemons_started: AtomicUsize::new(0),
        }
    }

    /// The queue directory.
    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    /// A path inside the queue, such as `done/t1.json`.
    pub(crate) fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// A path beside the queue (side files, helper files), never touched by cairn.
    pub(crate) fn aux(&self, name: &str) -> PathBuf {
        self.tmp.path().join(name)
    }

    /// `cairn --queue <queue>`, ready for a subcommand.
    pub(crate) fn cairn(&self) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_cairn"));
        command.arg("--queue").arg(&self.root);
        command.env_remove("CAIRN_QUEUE").env_remove("RUST_LOG");
        // A loaded machine can take longer than the default few seconds to take a request.
        command.env("CAIRN_WAIT", DAEMON_WAIT);
        command
    }

    /// Run `cairn --queue <queue> <args>` to its end, with `stdin` as its input.
    pub(crate) fn cairn_output(&self, args: &[&str], stdin: &[u8]) -> Output {
        let mut child = self
            .cairn()
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting cairn");
        child
            .stdin
            .take()
            .expect("cairn's stdin")
            .write_all(stdin)
            .expect("writing cairn's stdin");
        child.wait_with_output().expect("waiting for cairn")
    }

    /// Start `cairn run <args>` on this queue; its stderr goes to a file beside the queue.
    pub(crate) fn start(&self, args: &[&str]) -> Daemon {
        self.start_wrapped(&[], args)
    }

    /// Start `<wrapper...> cairn --queue <queue> run <args>`: the daemon under a program that
    /// changes how it runs (`setpriv` dropping capabilities, say). No wrapper: plain `cairn`.
    pub(crate) fn start_wrapped(&self, wrapper: &[&str], args: &[&str]) -> Daemon {
        let n = self.daemons_started.fetch_add(1, Ordering::SeqCst) + 1;
        let stderr_path = self.aux(&format!("daemon-{n}.stderr"));
        Daemon::start(
            &self.root,
            wrapper,
            args,
            stderr_path,
            format!("daemon #{n}"),
        )
    }

    /// Start `cairn run <args>` on this queue under `strace <strace_args>` (which name strace's
    /// output, `-o`), to see the daemon's system calls or inject faults into them. The
    /// [`Daemon`] is strace; signal the daemon itself through [`TestQueue::daemon_pid`].
    pub(crate) fn start_under_strace(&self, strace_args: &[&str], args: &[&str]) -> Daemon {
        let mut wrapper = vec!["strace"];
        wrapper.extend_from_slice(strace_args);
        wrapper.push("--");
        self.start_wrapped(&wrapper, args)
    }

    /// The pid of the daemon that holds the queue's lock, once one does: under a wrapper such
    /// as strace, the process the test started is the wrapper, not the daemon.
    pub(crate) fn daemon_pid(&self) -> i32 {
        wait_for("a daemon has locked the queue", DEADLINE, || {
            let pid: i32 = fs::read_to_string(self.path(".lock"))
                .ok()?
                .trim()
                .parse()
                .ok()?;
            let comm = fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
            (comm.trim() == "cairn").then_some(pid)
        })
    }

    /// Wait until nothing holds the queue's `.lock` any more (taking it for a moment to see):
    /// a SIGKILLed daemon's lock can outlive it for a moment.
    pub(crate) fn wait_lock_released(&self) {
        wait_flock_free(&self.path(".lock"), "the queue's lock");
    }

    /// Run `cairn run --exit-when-idle <args>` and expect it to drain the queue and exit 0.
    pub(crate) fn run_until_idle(&self, args: &[&str]) {
        let mut all = vec!["--exit-when-idle"];
        all.extend_from_slice(args);
        let mut daemon = self.start(&all);
        let status = daemon.wait_exit(DEADLINE);
        assert_eq!(
            status.code(),
            Some(0),
            "{} exited with {status}",
            daemon.name
        );
    }

    /// Drop a task file into the inbox the way users are told to: write a dot-file, rename it.
    pub(crate) fn drop_task(&self, name: &str, task: &Value) {
        self.drop_bytes(name, &serde_json::to_vec_pretty(task).unwrap(), false);
    }

    /// Put a task file into the inbox of a queue whose daemon is not running, dated ten minutes
    /// back, as a file copied in long ago: the daemon's first scan takes it at once instead of
    /// waiting for a fresh file to settle.
    pub(crate) fn seed_task(&self, name: &str, task: &Value) {
        self.drop_bytes(name, &serde_json::to_vec_pretty(task).unwrap(), true);
    }

    /// Put `bytes` into `inbox/<name>` atomically (temp dot-file, then rename); `backdate`
    /// dates the file ten minutes back, as if it had been there for a while.
    pub(crate) fn drop_bytes(&self, name: &str, bytes: &[u8], backdate: bool) {
        self.drop_bytes_owned_by(name, bytes, backdate, None);
    }

    /// [`TestQueue::drop_bytes`], the file given to user `owner` (`None`: this process's user)
    /// before it is renamed in, as a submitter's own file would be.
    pub(crate) fn drop_bytes_owned_by(
        &self,
        name: &str,
        bytes: &[u8],
        backdate: bool,
        owner: Option<u32>,
    ) {
        let temp = self.path(&format!("inbox/.{:016x}.writing", fastrand::u64(..)));
        // 0644 whatever the umask: intake refuses files others may write.
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&temp)
            .expect("creating a temp file in the inbox");
        file.write_all(bytes).expect("writing a task file");
        if backdate {
            file.set_modified(SystemTime::now() - Duration::from_secs(600))
                .expect("backdating a task file");
        }
        drop(file);
        if let Some(uid) = owner {
            std::os::unix::fs::chown(&temp, Some(uid), None)
                .expect("giving the file to its submitter");
        }
        fs::rename(&temp, self.path(&format!("inbox/{name}"))).expect("renaming into the inbox");
    }

    /// `done/<id>.json`, if it exists.
    pub(crate) fn done(&self, id: &str) -> Option<Value> {
        read_json_if_exists(&self.path(&format!("done/{id}.json")))
    }

    /// `failed/<id>.json`, if it exists.
    pub(crate) fn failed(&self, id: &str) -> Option<Value> {
        read_json_if_exists(&self.path(&format!("failed/{id}.json")))
    }

    /// Wait for `done/<id>.json`; fail at once if the task lands in `failed/` instead.
    pub(crate) fn wait_done(&self, id: &str) -> Value {
        wait_for(&format!("task {id} is in done/"), DEADLINE, || {
            if let Some(failed) = self.failed(id) {
                panic!("task {id} failed instead of finishing: {failed:#}");
            }
            self.done(id)
        })
    }

    /// Wait for `failed/<id>.json`; fail at once if the task lands in `done/` instead.
    pub(crate) fn wait_failed(&self, id: &str) -> Value {
        wait_for(&format!("task {id} is in failed/"), DEADLINE, || {
            if let Some(done) = self.done(id) {
                panic!("task {id} finished but was expected to fail: {done:#}");
            }
            self.failed(id)
        })
    }

    /// The task's latest iteration checkpoint, `incremental/<id>.json.gz`, decoded.
    pub(crate) fn checkpoint(&self, id: &str) -> IterationCheckpoint {
        let path = self.path(&format!("incremental/{id}.json.gz"));
        let bytes = fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        decode_checkpoint(&bytes).unwrap_or_else(|e| panic!("decoding {}: {e}", path.display()))
    }

    /// The task's entry in the work state (`current_work.json` and the log of writes since),
    /// if it has one.
    pub(crate) fn active_entry(&self, id: &str) -> Option<Value> {
        work_entry(self.root(), id)
    }

    /// The rejection records in `failed/`, by the inbox file they were made for
    /// (`inbox/<name>`).
    pub(crate) fn rejections(&self) -> BTreeMap<String, Value> {
        let mut found = BTreeMap::new();
        let Ok(entries) = fs::read_dir(self.path("failed")) else {
            return found;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "json") {
                let record = read_json(&path);
                if record["status"] == "rejected" {
                    let file = record["file"].as_str().expect("a rejection names its file");
                    found.insert(file.to_string(), record);
                }
            }
        }
        found
    }

    /// The names in a directory of the queue (empty if it does not exist), sorted.
    pub(crate) fn list(&self, rel: &str) -> Vec<String> {
        list_dir(&self.path(rel))
    }
}

impl Default for TestQueue {
    fn default() -> Self {
        TestQueue::new()
    }
}

impl Drop for TestQueue {
    fn drop(&mut self) {
        // A daemon the test killed leaves its queue's cgroups behind (empty: its commands died
        // with it). A restarted daemon would remove them; nothing restarts on a temp queue.
        // A command SIGKILLed on a loaded machine may outlive the library's one-second wait,
        // and its cgroup cannot be removed until it has gone: try again, generously.
        if let Some(cgroups) = cairn::runner::CgroupRoot::for_queue(&self.root.join("runs")) {
            for _ in 0..20 {
                cgroups.kill_leftovers();
                if cgroups.remove_if_empty() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        }
        if !std::thread::panicking() {
            return;
        }
        // The daemons' logs and the commands' side files tell what happened.
        for name in list_dir(self.tmp.path()) {
            if name.ends_with(".stderr") || name.ends_with(".side") {
                let text = fs::read_to_string(self.tmp.path().join(&name)).unwrap_or_default();
                eprintln!("----- {name} -----\n{text}----- end of {name} -----");
            }
        }
    }
}

/// A running `cairn run`. Dropping it kills it (SIGKILL) if it is still running.
pub(crate) struct Daemon {
    child: Child,
    status: Option<ExitStatus>,
    stderr_path: PathBuf,
    name: String,
}

impl Daemon {
    /// Start `<wrapper...> cairn --queue <queue> run <args>` (no wrapper: plain `cairn`), its
    /// stderr to `stderr_path`. [`TestQueue::start`] is the usual way; this is for a queue
    /// somewhere else (on a small tmpfs, say).
    pub(crate) fn start(
        queue: &Path,
        wrapper: &[&str],
        args: &[&str],
        stderr_path: PathBuf,
        name: String,
    ) -> Daemon {
        let stderr = fs::File::create(&stderr_path).expect("creating the daemon's stderr file");
        let mut command = match wrapper.split_first() {
            None => Command::new(env!("CARGO_BIN_EXE_cairn")),
            Some((program, wrapper_args)) => {
                let mut command = Command::new(program);
                command.args(wrapper_args).arg(env!("CARGO_BIN_EXE_cairn"));
                command
            }
        };
        let child = command
            .arg("--queue")
            .arg(queue)
            .env_remove("CAIRN_QUEUE")
            .env_remove("RUST_LOG")
            .arg("run")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("starting cairn run");
        Daemon {
            child,
            status: None,
            stderr_path,
            name,
        }
    }

    pub(crate) fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Send a real signal to the daemon process.
    pub(crate) fn signal(&self, signal: Signal) {
        kill(Pid::from_raw(self.pid()), signal)
            .unwrap_or_else(|e| panic!("sending {signal} to {}: {e}", self.name));
    }

    /// Whether the daemon is still running. The one test of it: the daemon is this process's
    /// child, so waiting for it (without blocking) is exact, and reaps it once it has exited, so
    /// a zombie does not count as running.
    pub(crate) fn is_running(&mut self) -> bool {
        self.try_status().is_none()
    }

    /// The exit status, if it has exited.
    pub(crate) fn try_status(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().expect("checking on the daemon");
        }
        self.status
    }

    /// Wait for the daemon to exit; panic (with its stderr) after `timeout`.
    pub(crate) fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let name = self.name.clone();
        wait_for(&format!("{name} exits"), timeout, || self.try_status())
    }

    /// SIGKILL the daemon and reap it.
    pub(crate) fn kill_hard(&mut self) -> ExitStatus {
        self.signal(SIGKILL);
        self.wait_exit(DEADLINE)
    }

    /// What the daemon has written on stderr so far.
    pub(crate) fn stderr(&self) -> String {
        fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.try_status().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Wait until nothing holds the `flock` of the file at `path` (taking it for a moment to see).
/// A SIGKILLed daemon's locks can outlive it for a moment: a command it was starting holds a
/// copy of its descriptors until that command's `exec` closes them.
pub(crate) fn wait_flock_free(path: &Path, what: &str) {
    wait_until(&format!("{what} is free"), DEADLINE, || {
        let file =
            fs::File::open(path).unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
        Flock::lock(file, FlockArg::LockExclusiveNonblock).is_ok()
    });
}

/// True while a process with this pid exists and is not a zombie.
pub(crate) fn process_alive(pid: i32) -> bool {
    if kill(Pid::from_raw(pid), None).is_err() {
        return false;
    }
    // A zombie still answers kill(pid, 0); it has stopped running, which is what counts here.
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_none_or(|(_, rest)| !rest.starts_with('Z')),
        Err(_) => false,
    }
}

/// The process group of a live (non-zombie) process.
pub(crate) fn process_group_of(pid: i32) -> Option<i32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name: state ppid pgrp ...
    let (_, rest) = stat.rsplit_once(") ")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    if fields.first() == Some(&"Z") {
        return None;
    }
    fields.get(2)?.parse().ok()
}

/// How many live (non-zombie) processes are in the process group `pgid`.
pub(crate) fn group_members(pgid: i32) -> usize {
    if killpg(Pid::from_raw(pgid), None) == Err(Errno::ESRCH) {
        return 0;
    }
    list_dir(Path::new("/proc"))
        .iter()
        .filter_map(|name| name.parse::<i32>().ok())
        .filter(|pid| process_group_of(*pid) == Some(pgid))
        .count()
}

/// True while any process of the process group `pgid` is alive (zombies excepted).
pub(crate) fn group_alive(pgid: i32) -> bool {
    group_members(pgid) > 0
}

/// SIGKILLs a process group when dropped, so a test that fails does not leave its commands
/// running behind it.
pub(crate) struct KillGroupOnDrop(pub i32);

impl Drop for KillGroupOnDrop {
    fn drop(&mut self) {
        let _ = killpg(Pid::from_raw(self.0), Signal::SIGKILL);
    }
}

pub(crate) fn read_json(path: &Path) -> Value {
    let bytes = fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

/// Task `id`'s entry in the work state of the queue at `root`, as the CLI reads it
/// (`current_work.json` and the log of writes since), if it has one.
pub(crate) fn work_entry(root: &Path, id: &str) -> Option<Value> {
    let work = cairn::queue::QueueReader::open(root)
        .current_work()
        .unwrap_or_else(|e| panic!("reading the work state: {e}"));
    let entry = work
        .active_tasks
        .into_iter()
        .find(|entry| entry.task_id == id)?;
    Some(serde_json::to_value(entry).unwrap())
}

pub(crate) fn read_json_if_exists(path: &Path) -> Option<Value> {
    path.exists().then(|| read_json(path))
}

pub(crate) fn list_dir(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = match fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .collect(),
        Err(_) => Vec::new(),
    };
    names.sort();
    names
}

/// A loop task whose command is `tests/fixtures/logging_loop.py`: `iterations` iterations of
/// `sleep` seconds each, logging to `side_file`. Change the returned JSON for variants.
pub(crate) fn loop_task(id: &str, side_file: &Path, iterations: u64, sleep: f64) -> Value {
    json!({
        "id": id,
        "phases": [{
            "name": "count",
            "kind": "loop",
            "run": [
                "python3",
                fixture("logging_loop.py"),
                side_file,
                "--sleep",
                sleep.to_string(),
            ],
            "max_iterations": iterations,
        }],
    })
}

/// Append arguments to the command of the task's first phase.
pub(crate) fn add_args(task: &mut Value, args: &[&str]) {
    let run = task["phases"][0]["run"].as_array_mut().expect("a run list");
    run.extend(args.iter().map(|a| json!(a)));
}

/// What `logging_loop.py` returns after an uninterrupted run of `iterations` iterations.
pub(crate) fn loop_result(iterations: u64) -> Value {
    json!({
        "sum": (0..iterations).map(|i| i * i).sum::<u64>(),
        "seen": (0..iterations).collect::<Vec<_>>(),
    })
}

/// Start an uninterrupted run of a task in a fresh queue, as the reference to compare an
/// interrupted run with. `make_task` builds the task given a side file of the reference's own.
/// Wait for it with [`Daemon::wait_exit`], then read its result with [`TestQueue::wait_done`].
pub(crate) fn start_reference(make_task: impl FnOnce(&Path) -> Value) -> (TestQueue, Daemon) {
    let queue = TestQueue::new();
    let task = make_task(&queue.aux("reference.side"));
    let id = task["id"].as_str().expect("the task has an id").to_string();
    queue.seed_task(&format!("{id}.json"), &task);
    let daemon = queue.start(&["--exit-when-idle"]);
    (queue, daemon)
}

/// Wait for a reference run started by [`start_reference`] and return the task's result.
pub(crate) fn reference_result(reference: &mut (TestQueue, Daemon), id: &str) -> Value {
    let status = reference.1.wait_exit(DEADLINE);
    assert_eq!(
        status.code(),
        Some(0),
        "the reference daemon exited with {status}"
    );
    reference.0.wait_done(id)["result"].clone()
}

/// A one-phase task whose `once` command replies `reply` (JSON without single quotes).
pub(crate) fn once_task(id: &str, reply: &Value) -> Value {
    json!({
        "id": id,
        "phases": [{"name": "say", "run": ["sh", "-c", format!("printf '%s' '{reply}'")]}],
    })
}
