//! Every process of a task, found and ended when its attempt ends.
//!
//! A command leads its own process group, and stopping it signals that group; but a helper
//! started with `setsid` (or a double-forking daemon) leaves the group and would outlive the
//! task. Two ways to find such helpers:
//!
//! - **A cgroup per task**, where the daemon may create one: under its own cgroup v2 (as
//!   `systemd` delegates it with `Delegate=yes`, or any cgroup the daemon's user may write, as
//!   root's), `cairn-<queue>/task-<id>/`. Each command joins it before its `exec`, so nothing it
//!   starts can leave; at the attempt's end `cgroup.kill` ends everything in it, however it was
//!   started and whoever it runs as. The queue's part of the name is a hash of its `runs/`
//!   directory, so a restarted daemon finds the cgroups of its predecessor.
//! - Otherwise, **the environment marker**: every command gets `CAIRN_RUN_DIR=<queue>/runs/<id>`
//!   and a helper inherits it. Processes whose environment holds exactly that variable are
//!   killed, scanning `/proc` again until a scan finds none. Only processes whose environment
//!   the daemon may read are seen: its own user's (root sees all). A helper that clears its
//!   environment escapes this scan, not a cgroup.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// How many times the `/proc` scan, or a cgroup's listing, is repeated at most: a process may
/// start another between a scan and the kill.
const MAX_ROUNDS: usize = 50;

/// The bounds each task's cgroup gets (`memory.max`, `pids.max`), where the daemon's cgroup
/// offers the controllers; `None`: unbounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskLimits {
    pub memory_max: Option<u64>,
    pub pids_max: Option<u64>,
}

/// Processes and threads a task may have at once unless the daemon is told otherwise: far
/// more than a task needs, far fewer than a fork bomb takes to stop a host.
pub const DEFAULT_PIDS_MAX: u64 = 4096;

impl TaskLimits {
    /// The defaults: half of the host's memory, [`DEFAULT_PIDS_MAX`] processes.
    pub fn host_default() -> TaskLimits {
        TaskLimits {
            memory_max: host_memory().map(|bytes| bytes / 2),
            pids_max: Some(DEFAULT_PIDS_MAX),
        }
    }

    /// The controllers these limits need, as `cgroup.subtree_control` names them.
    fn controllers(&self) -> Vec<&'static str> {
        let mut wanted = Vec::new();
        if self.memory_max.is_some() {
            wanted.push("memory");
        }
        if self.pids_max.is_some() {
            wanted.push("pids");
        }
        wanted
    }
}

/// The host's memory in bytes (`MemTotal` of `/proc/meminfo`).
fn host_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The cgroup directory under which this daemon puts its queue's task cgroups.
#[derive(Debug, Clone)]
pub struct CgroupRoot {
    dir: PathBuf,
    /// The limits written into each task's cgroup, and the controllers they need (enabled in
    /// the daemon's cgroup by [`CgroupRoot::with_limits`]).
    limits: TaskLimits,
    controllers: Arc<Vec<&'static str>>,
    /// Task cgroups made by [`CgroupRoot::task`] and not yet ended: the queue's cgroup is
    /// removed only when the last one ends. Trying it at every task's end would take the
    /// kernel's global cgroup lock once more per task, only to fail while others run.
    live: Arc<AtomicUsize>,
}

/// One task's cgroup; ended once, by value.
#[derive(Debug)]
pub struct TaskCgroup {
    dir: PathBuf,
    /// The count of its queue's live task cgroups; `None` for a predecessor's leftover.
    live: Option<Arc<AtomicUsize>>,
}

impl CgroupRoot {
    /// The queue's cgroup under this process's own cgroup v2, created if missing; `None` when
    /// there is no cgroup v2 or this process may not create cgroups there.
    pub fn for_queue(runs_dir: &Path) -> Option<CgroupRoot> {
        let own = own_cgroup_dir()?;
        let name = format!(
            "cairn-{:08x}",
            crc32fast::hash(runs_dir.as_os_str().as_encoded_bytes())
        );
        let dir = own.join(name);
        // Created to learn whether this process may; removed again when no task runs.
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                tracing::debug!(dir = %dir.display(), error = %e, "no cgroup per task: the scan of /proc by CAIRN_RUN_DIR is used");
                return None;
            }
        }
        Some(CgroupRoot {
            dir,
            limits: TaskLimits {
                memory_max: None,
                pids_max: None,
            },
            controllers: Arc::default(),
            live: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// Bound each task's cgroup by `limits`: the controllers they need are handed down from
    /// the daemon's cgroup (the daemon moves into a leaf of its own first when it is alone in
    /// a cgroup that holds it, as under systemd's `Delegate=yes`: a cgroup with processes may
    /// not hand controllers down). Says in the log what is bounded, or why nothing is.
    pub fn with_limits(mut self, limits: TaskLimits) -> CgroupRoot {
        self.limits = limits;
        let wanted = limits.controllers();
        if wanted.is_empty() {
            return self;
        }
        let Some(own) = self.dir.parent().map(Path::to_path_buf) else {
            return self;
        };
        match enable_controllers(&own, &wanted) {
            Ok(()) => {
                tracing::info!(
                    memory_max = limits.memory_max,
                    pids_max = limits.pids_max,
                    "each task's cgroup is bounded: memory.max and pids.max (--task-memory-max, --task-pids-max)"
                );
                self.controllers = Arc::new(wanted);
            }
            Err(why) => tracing::warn!(
                "tasks' memory and process counts are not bounded: {why}; their cgroups hold \
                 them only to end them (with systemd, run the daemon with Delegate=yes on a \
                 host with cgroup v2's memory and pids controllers)"
            ),
        }
        self
    }

    /// The cgroup of task `id`, created if missing.
    pub fn task(&self, id: &str) -> io::Result<TaskCgroup> {
        let dir = self.dir.join(format!("task-{id}"));
        // Counted before it exists, so the queue's cgroup is not removed under it.
        self.live.fetch_add(1, Ordering::SeqCst);
        let made = TaskCgroup {
            dir,
            live: Some(Arc::clone(&self.live)),
        };
        // The queue's directory may have been removed when another task's cgroup, then the
        // last one, ended in between: create it again, once.
        self.hand_controllers_down();
        for _ in 0..2 {
            match std::fs::create_dir(&made.dir) {
                Ok(()) => return Ok(self.bounded(made)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(made),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    let _ = std::fs::create_dir(&self.dir);
                    self.hand_controllers_down();
                }
                Err(e) => {
                    self.live.fetch_sub(1, Ordering::SeqCst);
                    return Err(e);
                }
            }
        }
        match std::fs::create_dir(&made.dir) {
            Ok(()) => Ok(self.bounded(made)),
            Err(e) => {
                self.live.fetch_sub(1, Ordering::SeqCst);
                Err(e)
            }
        }
    }

    /// Enable the controllers in the queue's cgroup, which is made again after it was removed.
    fn hand_controllers_down(&self) {
        if self.controllers.is_empty() {
            return;
        }
        let line = controller_line(&self.controllers);
        if let Err(e) = std::fs::write(self.dir.join("cgroup.subtree_control"), line) {
            tracing::warn!(cgroup = %self.dir.display(), error = %e, "cannot enable the memory and pids controllers for task cgroups");
        }
    }

    /// Write the limits into a task's new cgroup.
    fn bounded(&self, cgroup: TaskCgroup) -> TaskCgroup {
        let writes = [
            ("memory", "memory.max", self.limits.memory_max),
            ("pids", "pids.max", self.limits.pids_max),
        ];
        for (controller, file, value) in writes {
            let Some(value) = value.filter(|_| self.controllers.contains(&controller)) else {
                continue;
            };
            if let Err(e) = std::fs::write(cgroup.dir.join(file), value.to_string()) {
                tracing::warn!(cgroup = %cgroup.dir.display(), error = %e, "cannot write {file}");
            }
        }
        cgroup
    }

    /// End every process left in the queue's task cgroups (a previous daemon's) and remove
    /// those cgroups; returns how many processes were killed.
    pub fn kill_leftovers(&self) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return 0;
        };
        entries
            .filter_map(|entry| entry.ok())
            .filter(|entry| entry.file_name().to_string_lossy().starts_with("task-"))
            .map(|entry| {
                TaskCgroup {
                    dir: entry.path(),
                    live: None,
                }
                .end_all()
            })
            .sum()
    }

    /// Remove the queue's cgroup when no task cgroup is left in it (at the daemon's exit);
    /// true when it is gone.
    pub fn remove_if_empty(&self) -> bool {
        match std::fs::remove_dir(&self.dir) {
            Ok(()) => true,
            Err(e) => e.kind() == io::ErrorKind::NotFound,
        }
    }
}

impl TaskCgroup {
    /// The file a process writes `0` to in order to join this cgroup.
    pub fn procs_file(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// Kill every process in the cgroup, wait until it is empty, and remove it. Returns how
    /// many processes were found in it.
    pub fn end_all(self) -> usize {
        let found = self.pids().len();
        if found > 0 {
            // cgroup.kill (Linux 5.14) kills all, even those started meanwhile; else one by one.
            let killed_at_once = std::fs::OpenOptions::new()
                .write(true)
                .open(self.dir.join("cgroup.kill"))
                .and_then(|mut f| f.write_all(b"1"))
                .is_ok();
            for _ in 0..MAX_ROUNDS {
                let pids = self.pids();
                if pids.is_empty() {
                    break;
                }
                if !killed_at_once {
                    for pid in pids {
                        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        if let Err(e) = std::fs::remove_dir(&self.dir) {
            if e.kind() != io::ErrorKind::NotFound {
                tracing::warn!(cgroup = %self.dir.display(), error = %e, "cannot remove a task's cgroup");
            }
        }
        // The queue's cgroup too, when this was its last task: a daemon killed while idle then
        // leaves no empty cgroup behind ([`CgroupRoot::task`] creates it again). A leftover of
        // a predecessor tries it at once (the daemon is just starting).
        let last = self
            .live
            .as_ref()
            .is_none_or(|live| live.fetch_sub(1, Ordering::SeqCst) == 1);
        if last {
            if let Some(queue_dir) = self.dir.parent() {
                let _ = std::fs::remove_dir(queue_dir);
            }
        }
        found
    }

    fn pids(&self) -> Vec<i32> {
        std::fs::read_to_string(self.procs_file())
            .map(|text| text.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }
}

/// Kill every process whose environment holds `CAIRN_RUN_DIR=<run_dir>` exactly (a task's
/// helpers that left its process group), until a scan finds none; returns how many.
pub(super) fn kill_by_marker(run_dir: &Path) -> usize {
    let marker = format!("CAIRN_RUN_DIR={}", run_dir.display());
    kill_matching(|var| var == marker.as_bytes())
}

/// Kill every process (not this one) having an environment variable for which `matches` holds,
/// scanning again until a scan finds none; returns how many were killed.
pub(super) fn kill_matching(matches: impl Fn(&[u8]) -> bool) -> usize {
    let me = std::process::id();
    let mut killed = 0;
    for _ in 0..MAX_ROUNDS {
        let found: Vec<u32> = pids_with_env(&matches)
            .into_iter()
            .filter(|pid| *pid != me)
            .collect();
        if found.is_empty() {
            break;
        }
        for pid in found {
            if kill(Pid::from_raw(pid as i32), Signal::SIGKILL).is_ok() {
                killed += 1;
            }
        }
    }
    killed
}

fn pids_with_env(matches: &impl Fn(&[u8]) -> bool) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            // Unreadable (another user's, or gone): not ours to judge.
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|environ| environ.split(|b| *b == 0).any(matches))
        })
        .collect()
}

/// `+memory +pids` for `cgroup.subtree_control`.
fn controller_line(controllers: &[&str]) -> String {
    controllers
        .iter()
        .map(|c| format!("+{c}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Enable `wanted` in `own`'s `cgroup.subtree_control` (the daemon's cgroup), moving this
/// process into the leaf `own/cairn-daemon` first if it is alone in `own`; the error says why
/// it cannot be done.
fn enable_controllers(own: &Path, wanted: &[&str]) -> Result<(), ControllersUnavailable> {
    use ControllersUnavailable as Why;
    let available = std::fs::read_to_string(own.join("cgroup.controllers")).map_err(|source| {
        Why::ReadControllers {
            own: own.to_owned(),
            source,
        }
    })?;
    let missing: Vec<&str> = wanted
        .iter()
        .copied()
        .filter(|c| !available.split_whitespace().any(|a| a == *c))
        .collect();
    if !missing.is_empty() {
        return Err(Why::Missing {
            own: own.to_owned(),
            missing: missing.join(" or "),
        });
    }
    let control = own.join("cgroup.subtree_control");
    let line = controller_line(wanted);
    let enable_error = |source| Why::Enable {
        control: control.clone(),
        source,
    };
    match std::fs::write(&control, &line) {
        Ok(()) => return Ok(()),
        Err(e) if e.raw_os_error() == Some(nix::libc::EBUSY) => {}
        Err(e) => return Err(enable_error(e)),
    }
    // A cgroup that holds processes may not hand controllers down: leave it, if this daemon
    // is all it holds.
    let procs = std::fs::read_to_string(own.join("cgroup.procs")).unwrap_or_default();
    let me = std::process::id().to_string();
    if procs.lines().any(|pid| pid.trim() != me) {
        return Err(Why::OtherProcesses {
            own: own.to_owned(),
        });
    }
    let leaf = own.join("cairn-daemon");
    match std::fs::create_dir(&leaf) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(source) => return Err(Why::CreateLeaf { leaf, source }),
    }
    std::fs::write(leaf.join("cgroup.procs"), "0")
        .map_err(|source| Why::MoveDaemon { leaf, source })?;
    std::fs::write(&control, &line).map_err(enable_error)
}

/// Why tasks' cgroups cannot be bounded: the controllers they need cannot be handed down from
/// the daemon's cgroup `own`.
#[derive(Debug, thiserror::Error)]
enum ControllersUnavailable {
    #[error("reading {}/cgroup.controllers: {source}", own.display())]
    ReadControllers { own: PathBuf, source: io::Error },
    #[error("the daemon's cgroup {} offers no {missing} controller", own.display())]
    Missing { own: PathBuf, missing: String },
    #[error("enabling them in {}: {source}", control.display())]
    Enable { control: PathBuf, source: io::Error },
    #[error(
        "the daemon's cgroup {} holds other processes, so it cannot hand controllers down",
        own.display()
    )]
    OtherProcesses { own: PathBuf },
    #[error("creating {}: {source}", leaf.display())]
    CreateLeaf { leaf: PathBuf, source: io::Error },
    #[error("moving the daemon into {}: {source}", leaf.display())]
    MoveDaemon { leaf: PathBuf, source: io::Error },
}

/// This process's cgroup v2 directory, if it has one and the unified hierarchy is mounted.
fn own_cgroup_dir() -> Option<PathBuf> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let own = cgroups.lines().find_map(|l| l.strip_prefix("0::"))?;
    let mount = cgroup2_mount()?;
    let dir = mount.join(own.trim_start_matches('/'));
    dir.join("cgroup.procs").exists().then_some(dir)
}

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on
/// a hybrid system), from `/proc/self/mountinfo`.
fn cgroup2_mount() -> Option<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let fs_type = right.split_whitespace().next()?;
        let mount_point = left.split_whitespace().nth(4)?;
        (fs_type == "cgroup2").then(|| PathBuf::from(mount_point))
    })
}

#[cfg(test)]
mod tests {
    use super::{controller_line, kill_by_marker, CgroupRoot, TaskLimits};

    #[test]
    fn only_the_controllers_a_limit_needs_are_asked_for() {
        let both = TaskLimits {
            memory_max: Some(1 << 30),
            pids_max: Some(100),
        };
        assert_eq!(controller_line(&both.controllers()), "+memory +pids");
        let pids = TaskLimits {
            memory_max: None,
            pids_max: Some(100),
        };
        assert_eq!(controller_line(&pids.controllers()), "+pids");
        let none = TaskLimits {
            memory_max: None,
            pids_max: None,
        };
        assert!(none.controllers().is_empty());
        let default = TaskLimits::host_default();
        assert_eq!(default.pids_max, Some(super::DEFAULT_PIDS_MAX));
        assert!(default.memory_max.is_some_and(|bytes| bytes > 0));
    }
    use std::os::unix::process::CommandExt;
    use std::process::Command;
    use std::time::{Duration, Instant};

    #[test]
    fn helpers_that_left_the_process_group_are_found_by_their_marker() {
        let run_dir = tempfile::tempdir().unwrap();
        let marker_dir = run_dir.path().join("t1");
        let mut child = Command::new("sleep")
            .arg("1000")
            .env("CAIRN_RUN_DIR", &marker_dir)
            .process_group(0)
            .spawn()
            .unwrap();
        // Another task's run directory, a prefix of this one: never matched.
        let mut other = Command::new("sleep")
            .arg("1000")
            .env("CAIRN_RUN_DIR", run_dir.path().join("t"))
            .spawn()
            .unwrap();
        let killed = kill_by_marker(&marker_dir);
        assert!(killed >= 1, "the marked process is killed");
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "the marked process was not killed"
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(!status.success());
        assert!(
            other.try_wait().unwrap().is_none(),
            "a prefix is not a match"
        );
        other.kill().unwrap();
        other.wait().unwrap();
    }

    #[test]
    fn the_queue_cgroup_is_removed_with_its_last_task_cgroup_and_made_again_for_the_next() {
        let runs = tempfile::tempdir().unwrap();
        let Some(root) = CgroupRoot::for_queue(runs.path()) else {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI runs as root on cgroup v2, where this process may create cgroups"
            );
            eprintln!("SKIPPED: this process may not create a cgroup v2 under its own");
            return;
        };
        let first = root.task("a").unwrap();
        let second = root.task("b").unwrap();
        assert_eq!(first.end_all(), 0);
        assert!(root.dir.is_dir(), "the other task's cgroup is still in it");
        assert_eq!(second.end_all(), 0);
        assert!(
            !root.dir.exists(),
            "the last task's end removes the queue's cgroup"
        );
        let third = root.task("c").unwrap();
        assert!(third.dir.is_dir(), "the queue's cgroup is made again");
        third.end_all();
        assert!(!root.dir.exists());
    }
}
