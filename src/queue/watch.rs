//! Inbox notifications. inotify events (through `notify`) are only hints that something changed;
//! the directory listing stays the truth, and the daemon re-scans on every hint and on a timer.

use std::path::Path;

use notify::event::{AccessKind, AccessMode, ModifyKind, RenameMode};
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;

/// A hint from the inbox watcher.
#[derive(Debug)]
pub enum InboxHint {
    /// Something changed; scan again.
    Changed,
    /// The named file is completely written (closed after writing, or renamed into the inbox).
    Complete(String),
}

/// Keeps the inbox watch alive; hints arrive on the receiver returned by [`InboxWatcher::start`].
pub struct InboxWatcher {
    _watcher: RecommendedWatcher,
}

impl std::fmt::Debug for InboxWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InboxWatcher")
    }
}

impl InboxWatcher {
    /// Watch `inbox`. Errors and overflows from the watcher become `Changed` hints, so a lost
    /// event costs at most a re-scan.
    pub fn start(
        inbox: &Path,
    ) -> notify::Result<(InboxWatcher, mpsc::UnboundedReceiver<InboxHint>)> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                let hint = match event {
                    Ok(event) => {
                        let complete = matches!(
                            event.kind,
                            EventKind::Access(AccessKind::Close(AccessMode::Write))
                                | EventKind::Modify(ModifyKind::Name(RenameMode::To))
                                | EventKind::Modify(ModifyKind::Name(RenameMode::Both))
                        );
                        let name = event
                            .paths
                            .last()
                            .and_then(|p| p.file_name())
                            .and_then(|n| n.to_str())
                            .map(str::to_string);
                        match (complete, name) {
                            (true, Some(name)) => InboxHint::Complete(name),
                            _ => InboxHint::Changed,
                        }
                    }
                    Err(e) => {
                        tracing::warn!("inbox watcher: {e}; re-scanning");
                        InboxHint::Changed
                    }
                };
                let _ = tx.send(hint);
            })?;
        watcher.watch(inbox, RecursiveMode::NonRecursive)?;
        Ok((InboxWatcher { _watcher: watcher }, rx))
    }
}
