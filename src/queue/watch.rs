//! Notifications for `inbox/` and `control/`. inotify events (through `notify`) are only hints
//! that something changed; the directory listings stay the truth, and the daemon re-scans on
//! every hint and on a timer.

use std::path::{Path, PathBuf};

use notify::event::{AccessKind, AccessMode, ModifyKind, RenameMode};
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;

/// A hint from the queue watcher.
#[derive(Debug, PartialEq, Eq)]
pub enum QueueHint {
    /// Something changed in the inbox; scan it again.
    InboxChanged,
    /// The named inbox file is completely written (closed after writing, or renamed in).
    InboxComplete(String),
    /// Data was written to the named inbox file, and it is not known to be closed yet.
    InboxWriting(String),
    /// A control request may have arrived.
    Control,
}

/// Keeps the watch alive; hints arrive on the receiver returned by [`QueueWatcher::start`].
pub struct QueueWatcher {
    _watcher: RecommendedWatcher,
}

impl std::fmt::Debug for QueueWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("QueueWatcher")
    }
}

impl QueueWatcher {
    /// Watch `inbox` and `control`. Errors and overflows become `InboxChanged` and `Control`
    /// hints, so a lost event costs at most a re-scan.
    pub fn start(
        inbox: &Path,
        control: &Path,
    ) -> notify::Result<(QueueWatcher, mpsc::UnboundedReceiver<QueueHint>)> {
        let (tx, rx) = mpsc::unbounded_channel();
        let control_dir: PathBuf = control.to_path_buf();
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                let event = match event {
                    Ok(event) => event,
                    Err(e) => {
                        tracing::warn!("queue watcher: {e}; re-scanning");
                        let _ = tx.send(QueueHint::InboxChanged);
                        let _ = tx.send(QueueHint::Control);
                        return;
                    }
                };
                // Opening, reading and closing unwritten are what readers do, the daemon's own
                // scans first of all: they change nothing, and reacting to them would wake the
                // daemon with every read it makes.
                if matches!(
                    event.kind,
                    EventKind::Access(
                        AccessKind::Open(_)
                            | AccessKind::Read
                            | AccessKind::Close(AccessMode::Read)
                    )
                ) {
                    return;
                }
                let path = event.paths.last();
                let in_control = path.and_then(|p| p.parent()) == Some(control_dir.as_path());
                if in_control || path == Some(&control_dir) {
                    // Only what a writer does wakes the daemon: its own reads of `control/` and
                    // its renames out of it (claims) would otherwise wake it again at once.
                    if in_control && is_arrival(&event.kind) {
                        let _ = tx.send(QueueHint::Control);
                    }
                    return;
                }
                let complete = matches!(
                    event.kind,
                    EventKind::Access(AccessKind::Close(AccessMode::Write))
                        | EventKind::Modify(ModifyKind::Name(RenameMode::To))
                        | EventKind::Modify(ModifyKind::Name(RenameMode::Both))
                );
                let name = path
                    .and_then(|p| p.file_name())
                    .and_then(|n| n.to_str())
                    .map(str::to_string);
                // Data written (not a bare create: a hard link or an empty file has nothing
                // to wait for, and no close may follow).
                let writing = matches!(
                    event.kind,
                    EventKind::Modify(ModifyKind::Data(_)) | EventKind::Modify(ModifyKind::Any)
                );
                let hint = match (complete, writing, name) {
                    (true, _, Some(name)) => QueueHint::InboxComplete(name),
                    (false, true, Some(name)) => QueueHint::InboxWriting(name),
                    _ => QueueHint::InboxChanged,
                };
                let _ = tx.send(hint);
            })?;
        watcher.watch(inbox, RecursiveMode::NonRecursive)?;
        watcher.watch(control, RecursiveMode::NonRecursive)?;
        Ok((QueueWatcher { _watcher: watcher }, rx))
    }
}

/// An event that a request arriving in `control/` causes: a file closed after writing, a name
/// renamed or linked in, an entry created. Opens, reads and names renamed away are the daemon's
/// own doing and are not.
fn is_arrival(kind: &EventKind) -> bool {
    matches!(
        kind,
        EventKind::Access(AccessKind::Close(AccessMode::Write))
            | EventKind::Modify(ModifyKind::Name(
                RenameMode::To | RenameMode::Both | RenameMode::Any
            ))
            | EventKind::Create(_)
    )
}
