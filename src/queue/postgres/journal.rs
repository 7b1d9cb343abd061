//! The event journal of the database backend: events are appended in the order they were
//! given, by one task on the backend's runtime, so a caller never waits for the database (a
//! journal is a log, not state) and `cairn history` reads them in order.

use tokio::runtime::Runtime;
use tokio::sync::{mpsc, oneshot};

use super::connect::PgQueue;
use super::lease::Lease;

/// What the journal's task is asked to do.
enum Job {
    /// Append `json` under `lease`; `after_record`: the task was finished under it.
    Append {
        lease: Lease,
        json: String,
        after_record: bool,
    },
    /// Say when every append asked for before is done.
    Flush(oneshot::Sender<()>),
}

/// The sending side of the journal's task.
#[derive(Debug)]
pub(super) struct EventJournal {
    jobs: mpsc::UnboundedSender<Job>,
}

impl EventJournal {
    /// Start the journal's task on `runtime`; it ends when the journal is dropped.
    pub(super) fn start(runtime: &Runtime, db: PgQueue) -> EventJournal {
        let (jobs, mut queued) = mpsc::unbounded_channel();
        runtime.spawn(async move {
            while let Some(job) = queued.recv().await {
                match job {
                    Job::Append {
                        lease,
                        json,
                        after_record,
                    } => {
                        let appended = if after_record {
                            db.append_event_after_record(&lease, &json).await
                        } else {
                            db.append_event(&lease, &json).await
                        };
                        if let Err(error) = appended {
                            tracing::warn!(task_id = %lease.task_id, %error, "an event was not journaled");
                        }
                    }
                    Job::Flush(done) => {
                        let _ = done.send(());
                    }
                }
            }
        });
        EventJournal { jobs }
    }

    /// Queue an append (see [`Job::Append`]).
    pub(super) fn append(&self, lease: Lease, json: String, after_record: bool) {
        let _ = self.jobs.send(Job::Append {
            lease,
            json,
            after_record,
        });
    }

    /// Resolves once every append queued before is done.
    pub(super) async fn flushed(&self) {
        let (done, flushed) = oneshot::channel();
        if self.jobs.send(Job::Flush(done)).is_ok() {
            let _ = flushed.await;
        }
    }
}
