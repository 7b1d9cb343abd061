//! Leftovers of a daemon that died: commands still running from its attempts. The kernel kills
//! a command with the daemon (`PR_SET_PDEATHSIG`), but not the processes that command started
//! (`sh -c "python3 step.py"` leaves python behind). A restarted daemon must never race such an
//! orphan doing the same work, so before anything resumes it finds them by the environment
//! cairn gives every command — `CAIRN_RUN_DIR=<queue>/runs/<id>` names this queue — and kills
//! them. The queue lock guarantees that no live daemon owns them.

use std::path::Path;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// Kill every process left from an earlier daemon of the queue whose run directories are under
/// `runs_dir` (`Queue::runs_dir`); returns how many were killed.
pub fn kill_orphans(runs_dir: &Path) -> usize {
    let marker = format!("CAIRN_RUN_DIR={}/", runs_dir.display());
    let me = std::process::id();
    let mut killed = 0;
    // An orphan may start another process between the scan and the kill: scan again until a
    // scan finds none (a few rounds at most).
    for _ in 0..5 {
        let found: Vec<u32> = orphan_pids(&marker)
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

fn orphan_pids(marker: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            // Unreadable (another user's, or gone): not ours to judge.
            std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|environ| {
                environ
                    .split(|b| *b == 0)
                    .any(|var| var.starts_with(marker.as_bytes()))
            })
        })
        .collect()
}
