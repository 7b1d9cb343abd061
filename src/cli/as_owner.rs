//! Root's commands on a queue that belongs to another user run as that user.
//!
//! A queue's user (and so, without `--run-as-submitter`, every task) can replace any directory
//! or file of the queue with a link, a FIFO or a device. Run as root, `show`, `status`, `fork`,
//! `submit`, `history`, `checkpoint` and the steering commands would then read and write
//! wherever the link points. So when root runs one of them on a queue whose directory belongs
//! to someone else, cairn first becomes that user (its groups, group and uid, capabilities
//! dropped), as `sudo -u cairn cairn ...` would: a link then leads only where the queue's user
//! could go anyway. The reads themselves also refuse links, FIFOs and devices and are capped
//! (`queue::read`), so a planted `/dev/zero` or FIFO neither fills memory nor hangs the command.
//! `prune`, which removes, works through opened directories instead (`queue::safe_remove`).

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use nix::unistd::{Gid, Uid};

use super::error::CliError;
use crate::runner::identity::{RunAs, SwitchTo};

/// When running as root on a queue owned by another user, become that user. Nothing when not
/// root, when the queue belongs to root, or when it does not exist (the command reports that).
pub(super) fn become_queue_owner(queue: &Path) -> Result<(), CliError> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(());
    }
    let Ok(meta) = std::fs::metadata(queue) else {
        return Ok(());
    };
    if meta.uid() == 0 {
        return Ok(());
    }
    // A uid with no name (a queue restored from another host) keeps the directory's group.
    let switch = match RunAs::of_uid(meta.uid()) {
        Ok(run_as) => run_as.switch,
        Err(_) => SwitchTo {
            uid: Uid::from_raw(meta.uid()),
            gid: Gid::from_raw(meta.gid()),
            groups: vec![Gid::from_raw(meta.gid())],
        },
    };
    switch.assume().map_err(|(step, e)| {
        CliError::failure(format_args!(
            "{} belongs to user {}; cannot run as that user ({step}: {e}), and root does not \
             work on a queue its user can write",
            queue.display(),
            meta.uid()
        ))
    })?;
    tracing::debug!(uid = meta.uid(), "running as the queue's owner");
    Ok(())
}
