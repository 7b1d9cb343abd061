//! Disk full (issue 6): the queue lives on a small tmpfs that the test fills while a loop task
//! runs, so that the task's next checkpoint write fails with ENOSPC.
//!
//! 1. Full: the filler takes every free page (and keeps topping up, so a page the daemon frees
//!    cannot let a write through). The checkpoint write fails; `current_work.json`, the journal
//!    and the phase log cannot be written either. The daemon must keep running, keep the previous
//!    checkpoint intact, leave no temp file behind, and retry the task without counting a
//!    failure (seen on its stderr, which lives outside the tmpfs).
//! 2. Nearly full: the filler gives back a little room — enough for `current_work.json`, not for
//!    the task's checkpoint (its state carries a 64 KiB pad) — so the waiting task shows on
//!    disk: `waiting_retry`, the ENOSPC error, no failed attempt.
//! 3. Space freed: the task resumes from the intact checkpoint and finishes with the result of
//!    an uninterrupted run.
//!
//! Mounting needs root (CAP_SYS_ADMIN) and `mount`: without them the test is skipped with a
//! message, except in CI (which runs the tests as root), where it fails.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::common::*;
use cairn::store::decode_checkpoint;
use serde_json::{json, Value};
use tempfile::TempDir;

const TASK: &str = "disk-full";
const ITERATIONS: u64 = 30;
/// The tmpfs's size.
const TMPFS_SIZE: &str = "2m";
/// How much room the filler gives back for the nearly-full stage: room for `current_work.json`
/// and a few journal lines, far less than one checkpoint of the padded state.
const SLACK: u64 = 16 * 1024;
/// Hex characters of incompressible-ish padding in the loop's state: its gzipped checkpoint is
/// about half of this, well over `SLACK`.
const PAD_CHARS: usize = 64 * 1024;

/// A tmpfs mounted on a fresh temp dir; unmounted (lazily if busy) when dropped.
struct Tmpfs {
    dir: Option<TempDir>,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::Builder::new()
            .prefix("cairn-disk-full-")
            .tempdir()
            .expect("creating the mount point");
        let output = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .expect("running mount");
        assert!(
            output.status.success(),
            "mounting a tmpfs on {} failed ({}): {}",
            dir.path().display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        Tmpfs { dir: Some(dir) }
    }

    fn path(&self) -> &Path {
        self.dir.as_ref().expect("the mount point").path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let path = self.path().to_path_buf();
        let unmounted = Command::new("umount")
            .arg(&path)
            .status()
            .is_ok_and(|s| s.success())
            || Command::new("umount")
                .arg("-l")
                .arg(&path)
                .status()
                .is_ok_and(|s| s.success());
        if unmounted {
            // The empty mount point is the temp dir's to remove.
            drop(self.dir.take());
        } else {
            eprintln!("could not unmount the tmpfs at {}", path.display());
            // Leave the directory alone rather than empty a still-mounted file system.
            if let Some(dir) = self.dir.take() {
                let _ = dir.keep();
            }
        }
    }
}

/// A file on the tmpfs that takes its free space: [`Filler::fill`] writes until ENOSPC, and a
/// background thread keeps topping it up so that space the daemon frees goes to the filler.
struct Filler {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    topper: Option<JoinHandle<()>>,
}

impl Filler {
    fn fill(path: PathBuf) -> Filler {
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .expect("creating the filler file");
        let error = write_until_full(&mut file);
        assert_eq!(
            error.raw_os_error(),
            Some(nix::libc::ENOSPC),
            "filling the tmpfs ended with {error} instead of ENOSPC"
        );
        let stop = Arc::new(AtomicBool::new(false));
        let topper = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let _ = write_until_full(&mut file);
                    std::thread::sleep(Duration::from_millis(2));
                }
            })
        };
        Filler {
            path,
            stop,
            topper: Some(topper),
        }
    }

    /// Stop topping up (the file stays as it is).
    fn stop_topping_up(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(topper) = self.topper.take() {
            topper.join().expect("the filler's top-up thread");
        }
    }

    /// Give back `bytes` of the filler's space.
    fn give_back(&mut self, bytes: u64) {
        self.stop_topping_up();
        let file = OpenOptions::new()
            .write(true)
            .open(&self.path)
            .expect("opening the filler");
        let len = file.metadata().expect("the filler's size").len();
        file.set_len(len.saturating_sub(bytes))
            .expect("shrinking the filler");
    }

    /// Free all of it.
    fn remove(&mut self) {
        self.stop_topping_up();
        fs::remove_file(&self.path).expect("removing the filler");
    }
}

impl Drop for Filler {
    fn drop(&mut self) {
        self.stop_topping_up();
    }
}

/// Append until a write fails; returns that error (ENOSPC when the file system is full).
fn write_until_full(file: &mut fs::File) -> io::Error {
    let chunk = vec![0x5au8; 64 * 1024];
    loop {
        if file.write_all(&chunk).is_err() {
            // What a big write left over, page by page: tmpfs hands out whole pages, so a
            // page-sized write that fails means no page is left.
            let page = [0x5au8; 4096];
            loop {
                if let Err(e) = file.write_all(&page) {
                    return e;
                }
            }
        }
    }
}

/// Prints the daemon's stderr and the side file when the test fails.
struct ShowOnPanic(Vec<PathBuf>);

impl Drop for ShowOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for path in &self.0 {
                let text = fs::read_to_string(path).unwrap_or_default();
                eprintln!("----- {} -----\n{text}----- end -----", path.display());
            }
        }
    }
}

/// Deterministic hex padding (a small LCG): gzip cannot shrink it much below half.
fn pad() -> String {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    (0..PAD_CHARS)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            char::from_digit(((x >> 60) & 0xf) as u32, 16).unwrap()
        })
        .collect()
}

/// The latest checkpoint's iteration count, if it exists and decodes.
fn committed(queue: &Path) -> Option<u64> {
    let bytes = fs::read(queue.join(format!("incremental/{TASK}.json.gz"))).ok()?;
    Some(decode_checkpoint(&bytes).ok()?.iteration_count)
}

/// The task's entry in the work state, if it has one. (A torn read is impossible: the
/// snapshot is replaced by rename, and a log line cut short is ignored.)
fn active_entry(queue: &Path) -> Option<Value> {
    work_entry(queue, TASK)
}

#[test]
fn a_full_disk_fails_no_checkpoint_and_the_task_completes_once_space_is_freed() {
    const TEST: &str = "a_full_disk_fails_no_checkpoint_and_the_task_completes_once_space_is_freed";
    if !require_root(TEST, "it mounts a tmpfs to fill it")
        || require_tool(TEST, "mount", "mount").is_none()
    {
        return;
    }
    let outside = tempfile::Builder::new()
        .prefix("cairn-disk-full-aux-")
        .tempdir()
        .expect("creating a temp dir");
    let side = outside.path().join("loop.side");
    let stderr_path = outside.path().join("daemon.stderr");
    let _show = ShowOnPanic(vec![stderr_path.clone(), side.clone()]);

    let tmpfs = Tmpfs::mount(TMPFS_SIZE);
    let queue = tmpfs.path().join("queue");
    fs::create_dir_all(queue.join("inbox")).expect("creating the queue's inbox");

    let pad = pad();
    let mut task = loop_task(TASK, &side, ITERATIONS, 0.1);
    task["phases"][0]["initial_state"] = json!({"sum": 0, "seen": [], "pad": pad});
    task["retry"] = json!({"backoff": "200ms", "max_backoff": "500ms"});
    let mut expected = loop_result(ITERATIONS);
    expected["pad"] = json!(pad);
    // Backdated, so the daemon's first scan takes it at once.
    let inbox_file = queue.join(format!("inbox/{TASK}.json"));
    fs::write(&inbox_file, serde_json::to_vec(&task).unwrap()).expect("writing the task");
    let old = std::time::SystemTime::now() - Duration::from_secs(600);
    fs::File::options()
        .write(true)
        .open(&inbox_file)
        .and_then(|f| f.set_modified(old))
        .expect("backdating the task file");

    // Dropped before the tmpfs (declared after it): the daemon never holds the mount busy.
    let started = Instant::now();
    let mut daemon = Daemon::start(&queue, &[], &[], stderr_path, "the daemon".into());

    // The first iteration committed. The disk is filled long before the task has four
    // generations: from then on a save overwrites the retired generation's file in place and
    // needs no new room, so a full disk would no longer stop it. (A save that finds no room for
    // the commit log's record checkpoints the log, which frees room for one more save.)
    let before_fill = wait_for("the task has checkpointed an iteration", DEADLINE, || {
        committed(&queue).filter(|&n| n >= 1)
    });
    // What an iteration costs on this machine now (start-up included, so an overestimate): the
    // deadline for the rest of the run follows from it, for a busy machine is slow.
    let per_iteration = started.elapsed() / before_fill as u32;

    // Stage 1: full.
    let mut filler = Filler::fill(tmpfs.path().join("filler"));
    let enospc = "No space left on device";
    wait_until(
        "the daemon reports a checkpoint write failing with ENOSPC",
        DEADLINE,
        || {
            daemon.stderr().lines().any(|line| {
                line.contains("attempt failed")
                    && line.contains("checkpoint storage")
                    && line.contains(enospc)
            })
        },
    );
    // The retries go on while the disk stays full: several attempts fail (each one's
    // current_work.json write already) and are rescheduled.
    let retries_at_failure = daemon.stderr().matches("retrying in").count();
    wait_until(
        "the daemon has retried the task twice more on the full disk",
        DEADLINE,
        || daemon.stderr().matches("retrying in").count() >= retries_at_failure + 2,
    );
    assert!(daemon.is_running(), "the daemon died on a full disk");
    let stderr = daemon.stderr();
    assert!(!stderr.contains("panicked"), "the daemon panicked");
    let full_cp = committed(&queue).expect("the previous checkpoint is intact and decodes");
    assert!(
        full_cp >= before_fill,
        "the checkpoint went back from {before_fill} to {full_cp} iterations"
    );
    assert!(
        list_dir(&queue.join("failed")).is_empty(),
        "the task was failed on a full disk: {:?}",
        list_dir(&queue.join("failed"))
    );
    assert_eq!(
        temp_files(&queue.join("incremental")),
        Vec::<PathBuf>::new()
    );

    // Stage 2: nearly full — room for current_work.json, not for the checkpoint.
    filler.give_back(SLACK);
    let waiting = wait_for(
        "current_work.json shows the task waiting to retry after ENOSPC",
        DEADLINE,
        || {
            active_entry(&queue).filter(|entry| {
                entry["status"] == "waiting_retry"
                    && entry["last_error"]
                        .as_str()
                        .is_some_and(|error| error.contains(enospc))
            })
        },
    );
    assert_eq!(
        waiting["failed_attempts"],
        json!(0),
        "a full disk used up an attempt: {waiting:#}"
    );
    assert!(daemon.is_running(), "the daemon died on a nearly full disk");
    assert_eq!(
        committed(&queue),
        Some(full_cp),
        "the checkpoint changed although no checkpoint fits"
    );
    assert!(list_dir(&queue.join("failed")).is_empty());
    assert_eq!(
        temp_files(&queue.join("incremental")),
        Vec::<PathBuf>::new()
    );

    // Stage 3: space freed; the task resumes from the intact checkpoint and completes.
    filler.remove();
    let rest = DEADLINE + per_iteration * 3 * ITERATIONS as u32;
    let done = wait_for("the task is in done/", rest, || {
        if let Some(failed) = read_json_if_exists(&queue.join(format!("failed/{TASK}.json"))) {
            panic!("the task failed instead of finishing: {failed:#}");
        }
        read_json_if_exists(&queue.join(format!("done/{TASK}.json")))
    });
    assert!(
        done["result"] == expected,
        "the result differs from an uninterrupted run's (sum {} seen {})",
        done["result"]["sum"],
        done["result"]["seen"]
    );
    assert_eq!(done["failed_attempts"], json!(0), "{done:#}");
    assert!(daemon.is_running(), "the daemon exited");
    assert_eq!(
        temp_files(&queue.join("incremental")),
        Vec::<PathBuf>::new()
    );

    // Only work after the last committed checkpoint ran again: iterations before it once,
    // iteration `full_cp` (whose checkpoint failed) once per attempt that reached it, the rest
    // once; and every later attempt resumed at `full_cp`, not earlier.
    let starts = start_counts(&side);
    let mut first_of_attempt = std::collections::BTreeMap::new();
    for event in side_events(&side) {
        if event.event == "start" {
            first_of_attempt
                .entry(event.attempt)
                .or_insert(event.iteration);
        }
    }
    let attempts: Vec<u32> = first_of_attempt.keys().copied().collect();
    for (&attempt, &first) in first_of_attempt.iter().skip(1) {
        assert_eq!(
            first, full_cp,
            "attempt {attempt} started at iteration {first}, not at the checkpoint {full_cp}"
        );
    }
    for i in 0..ITERATIONS {
        let n = starts.get(&i).copied().unwrap_or(0);
        if i == full_cp {
            assert_eq!(
                n,
                attempts.len(),
                "iteration {i} ran {n} times in {} attempts",
                attempts.len()
            );
        } else {
            assert_eq!(n, 1, "iteration {i} ran {n} times; starts: {starts:?}");
        }
    }
    eprintln!(
        "disk full: checkpoint {before_fill} before the fill, {full_cp} kept; iteration {full_cp} ran {} times (attempts {attempts:?})",
        attempts.len()
    );

    // A clean stop.
    daemon.signal(SIGTERM);
    let status = daemon.wait_exit(DEADLINE);
    assert_eq!(status.code(), Some(0), "the daemon exited with {status}");
    drop(daemon);
}

/// The tmpfs of [`a_checkpoint_that_fits_only_by_the_atomic_replace_is_still_committed`].
const SMALL_TMPFS: &str = "3m";
const SMALL_TMPFS_BYTES: u64 = 3 << 20;
/// Random bytes in each iteration's state, base64 in the JSON, which gzip leaves at about
/// 4/3 of this: a checkpoint of about 640 KiB. The latest and three kept generations fit in
/// the tmpfs (what the atomic replace needs, reusing the retired generation's file), five do
/// not (what the commit log needed: the files and the record of the save, and the pre-image
/// of the latest after each of the log's checkpoints).
const BIG_STATE_BYTES: usize = 470 * 1024;
const BIG_STATE_ITERATIONS: u64 = 12;

/// A loop of `BIG_STATE_ITERATIONS` iterations whose state carries `BIG_STATE_BYTES` random
/// bytes (new ones each iteration, so no two checkpoints share blocks); the last iteration
/// drops them, so the result is small.
fn big_state_task(id: &str) -> Value {
    let script = format!(
        "import base64, json, os, sys\n\
         request = json.load(sys.stdin)\n\
         i = request['iteration']\n\
         state = {{'sum': (request['state'] or {{'sum': 0}})['sum'] + i}}\n\
         if i + 1 < {BIG_STATE_ITERATIONS}:\n\
         \x20   state['pad'] = base64.b64encode(os.urandom({BIG_STATE_BYTES})).decode()\n\
         json.dump({{'state': state}}, sys.stdout)\n"
    );
    json!({
        "id": id,
        "phases": [{
            "name": "grow",
            "kind": "loop",
            "run": ["python3", "-c", script],
            "max_iterations": BIG_STATE_ITERATIONS,
        }],
        "retry": {"backoff": "200ms", "max_backoff": "500ms"},
    })
}

/// On a disk with room for what the atomic replace needs and not for what a save through the
/// commit log needs (its record, and the pre-image of the latest, besides the files), the
/// default path still commits every checkpoint: a save that finds no room for the log commits
/// by the atomic replace after checkpointing the log (which frees its space).
#[test]
fn a_checkpoint_that_fits_only_by_the_atomic_replace_is_still_committed() {
    const TEST: &str = "a_checkpoint_that_fits_only_by_the_atomic_replace_is_still_committed";
    if !require_root(TEST, "it mounts a tmpfs to fill it")
        || require_tool(TEST, "mount", "mount").is_none()
        || require_tool(TEST, "python3", "python3").is_none()
    {
        return;
    }
    let outside = tempfile::Builder::new()
        .prefix("cairn-disk-full-aux-")
        .tempdir()
        .expect("creating a temp dir");
    let stderr_path = outside.path().join("daemon.stderr");
    let _show = ShowOnPanic(vec![stderr_path.clone()]);

    let tmpfs = Tmpfs::mount(SMALL_TMPFS);
    let queue = tmpfs.path().join("queue");
    fs::create_dir_all(queue.join("inbox")).expect("creating the queue's inbox");
    let id = "big-state";
    let inbox_file = queue.join(format!("inbox/{id}.json"));
    fs::write(
        &inbox_file,
        serde_json::to_vec(&big_state_task(id)).unwrap(),
    )
    .expect("writing the task");
    let old = std::time::SystemTime::now() - Duration::from_secs(600);
    fs::File::options()
        .write(true)
        .open(&inbox_file)
        .and_then(|f| f.set_modified(old))
        .expect("backdating the task file");

    let mut daemon = Daemon::start(
        &queue,
        &[],
        &["--exit-when-idle"],
        stderr_path,
        "the daemon".into(),
    );
    let latest = queue.join(format!("incremental/{id}.json.gz"));
    let mut largest_checkpoint = 0;
    let done = wait_for("the task is in done/", DEADLINE, || {
        if let Ok(meta) = fs::metadata(&latest) {
            largest_checkpoint = largest_checkpoint.max(meta.len());
        }
        let stderr = daemon.stderr();
        let failed_attempts = stderr.matches("retrying in").count();
        assert!(
            failed_attempts < 4,
            "the task keeps failing ({failed_attempts} attempts so far)"
        );
        assert!(!stderr.contains("panicked"), "the daemon panicked");
        read_json_if_exists(&queue.join(format!("done/{id}.json")))
    });
    let status = daemon.wait_exit(DEADLINE);
    assert_eq!(status.code(), Some(0), "the daemon exited with {status}");
    let sum: u64 = (0..BIG_STATE_ITERATIONS).sum();
    assert_eq!(done["result"], json!({"sum": sum}), "{done:#}");
    assert_eq!(done["failed_attempts"], json!(0), "{done:#}");
    // The case is the one meant: a save through the log needed more than the tmpfs holds.
    assert!(
        largest_checkpoint * 5 > SMALL_TMPFS_BYTES,
        "the checkpoints ({largest_checkpoint} bytes) are too small to need the fallback"
    );
    assert!(list_dir(&queue.join("failed")).is_empty());
    assert_eq!(
        temp_files(&queue.join("incremental")),
        Vec::<PathBuf>::new()
    );
    drop(daemon);
}

/// The task of [`a_replay_that_fails_on_a_full_disk_keeps_the_commit_log`].
const REPLAYED: &str = "replayed";

/// After a crash that left the latest checkpoint only in the commit log (here: the daemon
/// SIGKILLed, then its latest checkpoint file emptied, as a power cut can leave it), a replay
/// that fails for want of room (by `cairn fork`, which replays a log no daemon holds before it
/// writes, and by a daemon's start) fails with the reason and keeps the log; once there is
/// room, the daemon replays it and the task resumes from that checkpoint. The log used to be
/// removed by the failed replay, and the checkpoint with it.
#[test]
fn a_replay_that_fails_on_a_full_disk_keeps_the_commit_log() {
    const TEST: &str = "a_replay_that_fails_on_a_full_disk_keeps_the_commit_log";
    if !require_root(TEST, "it mounts a tmpfs to fill it")
        || require_tool(TEST, "mount", "mount").is_none()
    {
        return;
    }
    let outside = tempfile::Builder::new()
        .prefix("cairn-disk-full-aux-")
        .tempdir()
        .expect("creating a temp dir");
    let side = outside.path().join("loop.side");
    let stderr_path = outside.path().join("daemon.stderr");
    let _show = ShowOnPanic(vec![stderr_path.clone(), side.clone()]);
    let tmpfs = Tmpfs::mount("4m");
    let queue = tmpfs.path().join("queue");
    fs::create_dir_all(queue.join("inbox")).expect("creating the queue's inbox");
    let pad = pad();
    let mut task = loop_task(REPLAYED, &side, 12, 0.2);
    task["phases"][0]["initial_state"] = json!({"sum": 0, "seen": [], "pad": pad});
    let mut expected = loop_result(12);
    expected["pad"] = json!(pad);
    let inbox_file = queue.join(format!("inbox/{REPLAYED}.json"));
    fs::write(&inbox_file, serde_json::to_vec(&task).unwrap()).expect("writing the task");
    let old = std::time::SystemTime::now() - Duration::from_secs(600);
    fs::File::options()
        .write(true)
        .open(&inbox_file)
        .and_then(|f| f.set_modified(old))
        .expect("backdating the task file");

    let latest = queue.join(format!("incremental/{REPLAYED}.json.gz"));
    let log = queue.join("incremental/.commit-log");
    let mut daemon = Daemon::start(&queue, &[], &[], stderr_path.clone(), "the daemon".into());
    let before_kill = wait_for("three iterations committed", DEADLINE, || {
        let bytes = fs::read(&latest).ok()?;
        let n = decode_checkpoint(&bytes).ok()?.iteration_count;
        (n >= 3).then_some(n)
    });
    daemon.kill_hard();
    drop(daemon);
    // A command the daemon was starting may hold the log (and its lock) a moment longer: a
    // reader would then leave the log to it and not replay.
    wait_flock_free(&log, "the killed daemon's commit log");
    let in_log = fs::read(&latest).expect("the latest checkpoint");
    let committed_at_kill = decode_checkpoint(&in_log).unwrap().iteration_count;
    assert!(committed_at_kill >= before_kill);
    let log_len = fs::metadata(&log)
        .expect("the killed daemon's commit log")
        .len();
    assert!(log_len > 0, "the commit log is empty");
    // What a power cut may leave of a file renamed into place but not yet synced.
    fs::write(&latest, b"").unwrap();

    let mut filler = Filler::fill(tmpfs.path().join("filler"));
    filler.stop_topping_up();

    // `cairn fork` replays the log before it writes: it fails, saying why, and keeps the log.
    let fork = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .arg("--queue")
        .arg(&queue)
        .args(["fork", REPLAYED])
        .env_remove("CAIRN_QUEUE")
        .output()
        .expect("running cairn fork");
    let fork_stderr = String::from_utf8_lossy(&fork.stderr);
    assert!(
        !fork.status.success(),
        "cairn fork succeeded on a full disk"
    );
    assert!(
        fork_stderr.contains("commit log") && fork_stderr.contains("No space left on device"),
        "{fork_stderr}"
    );
    assert_eq!(
        fs::metadata(&log).map(|m| m.len()).ok(),
        Some(log_len),
        "the failed replay of cairn fork did not keep the commit log"
    );

    // A daemon's start fails the same way.
    let stderr_path_2 = outside.path().join("daemon-2.stderr");
    let mut daemon = Daemon::start(
        &queue,
        &[],
        &["--exit-when-idle"],
        stderr_path_2,
        "the daemon on the full disk".into(),
    );
    let status = daemon.wait_exit(DEADLINE);
    assert!(!status.success(), "the daemon started on a full disk");
    let stderr = daemon.stderr();
    assert!(
        stderr.contains("commit log") && stderr.contains("No space left on device"),
        "{stderr}"
    );
    assert_eq!(
        fs::metadata(&log).map(|m| m.len()).ok(),
        Some(log_len),
        "the daemon's failed replay did not keep the commit log"
    );
    drop(daemon);

    // Room again: the replay restores the checkpoint and the task resumes from it.
    filler.remove();
    let stderr_path_3 = outside.path().join("daemon-3.stderr");
    let mut daemon = Daemon::start(
        &queue,
        &[],
        &["--exit-when-idle"],
        stderr_path_3,
        "the daemon with room".into(),
    );
    let status = daemon.wait_exit(DEADLINE + Duration::from_secs(60));
    assert_eq!(status.code(), Some(0), "{}", daemon.stderr());
    let done = read_json_if_exists(&queue.join(format!("done/{REPLAYED}.json")))
        .unwrap_or_else(|| panic!("no done record: {}", daemon.stderr()));
    assert!(done["result"] == expected, "the result differs");
    let resumed_at = side_events(&side)
        .iter()
        .filter(|e| e.event == "start" && e.attempt > 1)
        .map(|e| e.iteration)
        .min();
    assert_eq!(
        resumed_at,
        Some(committed_at_kill),
        "the restart did not resume from the checkpoint only the log held"
    );
    drop(daemon);
}
