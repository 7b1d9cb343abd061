//! This host's `inbox/` feeding the shared queue. Each host keeps its local queue directory;
//! a task file dropped into any host's inbox is claimed, checked and validated by the file
//! queue's own intake ([`Intake`](crate::queue::Intake): rename-claim, regular file, size cap,
//! no-follow read, permission checks, rejection records in the local `failed/`), and then
//! inserted into `cairn_tasks` by [`PgSink`] instead of written to `tasks/`.
//!
//! Exactly once: the insert is keyed by the task's id (`ON CONFLICT DO NOTHING`). A task
//! without an id gets one derived from its claim, which is made durable before the insert, so
//! a crash between the insert and removing the claim finds the same id when the claim is
//! taken again, and the same definition: [`Stored::Same`], one task. The same file dropped
//! into two hosts' inboxes is one task too; a different task under a taken id is rejected.

use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::runtime::Handle;

use super::connect::PgQueue;
use super::error::{During, PgError};
use super::submit::{NewTask, Submitted};
use crate::queue::{Intake, IntakeReport, QueueDir, QueueHint, Stored, TaskSink};
use crate::store::{FileStorage, Storage};
use crate::task::Task;

/// Intake's last step on PostgreSQL: submit the task (with its NOTIFY) to the shared queue.
#[derive(Debug)]
pub struct PgSink {
    db: PgQueue,
    /// The backend's runtime, which drives the database's connections.
    runtime: Handle,
}

impl PgSink {
    pub fn new(db: PgQueue, runtime: Handle) -> PgSink {
        PgSink { db, runtime }
    }

    async fn submit(
        &self,
        task: &Task,
        definition: &str,
        recovering: bool,
    ) -> Result<Stored, PgError> {
        let id = task.id().as_str();
        let submitted = self.db.submit(&NewTask::of(task, definition)).await?;
        if submitted == Submitted::Queued {
            return Ok(Stored::Submitted);
        }
        let client = self.db.client().await?;
        let same: Option<bool> = client
            .query_opt(
                "SELECT definition::text = $2 FROM cairn_tasks WHERE id = $1",
                &[&id, &definition],
            )
            .await
            .during("comparing a task with the one under its id")?
            .map(|row| row.get(0));
        Ok(match same {
            Some(true) => {
                if !recovering {
                    tracing::info!(task_id = id, "the shared queue has this task already (the same file taken on another host): not submitting it again");
                }
                Stored::Same
            }
            // Gone since the insert found it (pruned): a later scan finds the id free.
            None => Stored::IdTaken {
                place: "the shared queue (it was removed meanwhile: drop the file again)"
                    .to_string(),
            },
            Some(false) => Stored::IdTaken {
                place: "the shared queue".to_string(),
            },
        })
    }
}

impl TaskSink for PgSink {
    fn store(&self, task: &Task, normalized: &[u8], recovering: bool) -> io::Result<Stored> {
        let definition = std::str::from_utf8(normalized).map_err(io::Error::other)?;
        self.runtime
            .block_on(self.submit(task, definition, recovering))
            .map_err(|e| io::Error::other(format!("submitting task {}: {e}", task.id())))
    }

    fn wants_durable_claims(&self) -> bool {
        true
    }
}

/// This host's inbox, taken into the shared queue.
#[derive(Debug)]
pub(super) struct LocalInbox {
    dir: QueueDir,
    intake: Mutex<Intake>,
}

impl LocalInbox {
    /// The inbox of the local queue directory `dir` (absolute, its directories made), feeding
    /// `db` on `runtime`. Rejection records go to `dir`'s `failed/`.
    pub(super) fn new(dir: QueueDir, db: PgQueue, runtime: Handle) -> LocalInbox {
        let storage: Arc<dyn Storage> = Arc::new(FileStorage::new(dir.root()));
        let sink = Arc::new(PgSink::new(db, runtime));
        LocalInbox {
            intake: Mutex::new(Intake::with_sink(dir.clone(), storage, sink)),
            dir,
        }
    }

    /// Hold new files to the per-submitter limits (see `crate::limits`).
    pub(super) fn set_admission(&self, admission: Arc<crate::limits::Admission>) {
        locked(&self.intake).set_admission(admission);
    }

    /// Finish the claims a crash left (see [`Intake::recover_claims`]).
    pub(super) fn recover(&self) -> IntakeReport {
        locked(&self.intake).recover_claims()
    }

    /// Take up to `limit` files: submitted ones are in the report's `submitted`, never in
    /// `accepted` (every daemon claims them from the database).
    pub(super) fn scan(&self, hints: Vec<QueueHint>, limit: usize) -> IntakeReport {
        let mut intake = locked(&self.intake);
        for hint in hints {
            match hint {
                QueueHint::InboxComplete(name) => intake.hint_complete(name),
                QueueHint::InboxWriting(name) => intake.hint_writing(name),
                QueueHint::InboxChanged | QueueHint::Control => {}
            }
        }
        let report = intake.scan_batch(limit);
        debug_assert!(report.accepted.is_empty());
        report
    }

    /// Whether `inbox/<task_id>.json` waits in this host's inbox.
    pub(super) fn holds(&self, task_id: &str) -> bool {
        self.dir
            .inbox()
            .join(format!("{task_id}.json"))
            .symlink_metadata()
            .is_ok()
    }
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
