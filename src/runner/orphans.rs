//! Leftovers of a daemon that died: commands still running from its attempts. The kernel kills
//! a command with the daemon (`PR_SET_PDEATHSIG`), but not the processes that command started
//! (`sh -c "python3 step.py"` leaves python behind). A restarted daemon must never race such an
//! orphan doing the same work, so before anything resumes it finds them by the environment
//! cairn gives every command — `CAIRN_RUN_DIR=<queue>/runs/<id>` names this queue — and kills
//! them. The queue lock guarantees that no live daemon owns them.

use std::path::Path;

use super::task_processes::{self, CgroupRoot};

/// Kill every process left from an earlier daemon of the queue whose run directories are under
/// `runs_dir` (`Queue::runs_dir`): those in the queue's task cgroups, and those whose
/// environment names a run directory of the queue. Returns how many were killed.
pub fn kill_orphans(runs_dir: &Path, cgroups: Option<&CgroupRoot>) -> usize {
    let marker = format!("CAIRN_RUN_DIR={}/", runs_dir.display());
    let in_cgroups = cgroups.map_or(0, CgroupRoot::kill_leftovers);
    in_cgroups + task_processes::kill_matching(|var| var.starts_with(marker.as_bytes()))
}
