//! Is a daemon alive on a queue, and which: the one answer every command gives.
//!
//! The pid in `.lock` names the daemon that owns the queue. It counts only if that process is
//! alive, not a zombie, and holds a `flock` (after a reboot the pid may belong to an unrelated
//! process). The lock itself is never taken here, so a starting daemon cannot fail because of
//! a query.

use std::fs;
use std::path::Path;

use crate::queue::QueueDir;

/// Is a daemon running on the queue, and which.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DaemonInfo {
    pub running: bool,
    /// The daemon's pid while it runs.
    pub pid: Option<i32>,
}

/// Whether a daemon is alive on this queue: the pid in `.lock` names a live process that holds
/// a lock. Reads only; the lock is never taken.
pub fn daemon_info(queue: &QueueDir) -> DaemonInfo {
    let lock = queue.lock_file();
    let pid = fs::read_to_string(&lock)
        .ok()
        .and_then(|text| text.trim().parse::<i32>().ok())
        .filter(|pid| *pid > 0);
    let running = pid.is_some_and(|pid| process_alive(pid) && holds_a_lock(&lock, pid));
    DaemonInfo {
        running,
        pid: pid.filter(|_| running),
    }
}

/// The process exists and is not a zombie.
fn process_alive(pid: i32) -> bool {
    use nix::errno::Errno;
    use nix::sys::signal::kill;
    match kill(nix::unistd::Pid::from_raw(pid), None) {
        Ok(()) | Err(Errno::EPERM) => {}
        Err(_) => return false,
    }
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_none_or(|(_, rest)| !rest.starts_with('Z')),
        // No /proc: the kernel's answer above is all there is.
        Err(_) => true,
    }
}

/// After a reboot the pid in `.lock` may belong to an unrelated process. `/proc/locks` lists
/// every `flock` with its owner's pid and the file's inode: a daemon holds one on `.lock`.
/// Where `/proc/locks` cannot be read, the pid is trusted.
fn holds_a_lock(lock: &Path, pid: i32) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(locks) = fs::read_to_string("/proc/locks") else {
        return true;
    };
    let inode = fs::metadata(lock).map(|m| m.ino()).ok();
    locks
        .lines()
        .filter_map(parse_flock_line)
        .any(|(owner, file_inode)| owner == pid || (inode.is_some() && Some(file_inode) == inode))
}

/// The owner pid and inode of a `FLOCK` line of `/proc/locks`:
/// `1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF` (blocked waiters have `->` after `1:`).
fn parse_flock_line(line: &str) -> Option<(i32, u64)> {
    let fields: Vec<&str> = line.split_whitespace().filter(|f| *f != "->").collect();
    if fields.get(1) != Some(&"FLOCK") {
        return None;
    }
    let owner = fields.get(4)?.parse::<i32>().ok()?;
    let inode = fields.get(5)?.rsplit(':').next()?.parse::<u64>().ok()?;
    Some((owner, inode))
}

#[cfg(test)]
mod tests {
    use super::{daemon_info, parse_flock_line};
    use crate::queue::{QueueDir, QueueLock};

    #[test]
    fn flock_lines_give_owner_and_inode() {
        assert_eq!(
            parse_flock_line("1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"),
            Some((1234, 5678))
        );
        assert_eq!(
            parse_flock_line("1: -> FLOCK  ADVISORY  WRITE 99 fd:00:42 0 EOF"),
            Some((99, 42))
        );
        assert_eq!(
            parse_flock_line("2: POSIX  ADVISORY  WRITE 1234 08:01:5678 0 EOF"),
            None
        );
    }

    #[test]
    fn a_held_lock_is_a_running_daemon_and_a_stale_pid_is_not() {
        let tmp = tempfile::tempdir().unwrap();
        let queue = QueueDir::new(tmp.path());
        assert!(!daemon_info(&queue).running, "no .lock at all");
        let lock = QueueLock::acquire(&queue).unwrap();
        let info = daemon_info(&queue);
        assert!(info.running);
        assert_eq!(info.pid, Some(std::process::id() as i32));
        drop(lock);
        assert!(
            !daemon_info(&queue).running,
            "the lock is released and its pid cleared"
        );
        // The pid of a process that has exited (reaped, so not even a zombie).
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = child.id();
        child.wait().unwrap();
        std::fs::write(queue.lock_file(), format!("{gone}\n")).unwrap();
        assert_eq!(daemon_info(&queue).pid, None, "pid {gone} has exited");
        std::fs::write(queue.lock_file(), "").unwrap();
        assert!(!daemon_info(&queue).running, "an empty .lock");
    }
}
