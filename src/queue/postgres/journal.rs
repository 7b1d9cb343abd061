//! The event journal of the database backend: events are appended in the order they were
//! given, by one task on the backend's runtime, so a caller never waits for the database (a
//! journal is a log, not state) and `cairn history` reads them in order.

use std::time::{Duration, Instant};

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
    /// Start the journal's task on `runtime`; it ends when the journal is dropped. An append
    /// that fails for a reason that may pass (the database restarting) is tried again for up
    /// to `retry_for`, the events after it waiting in order.
    pub(super) fn start(runtime: &Runtime, db: PgQueue, retry_for: Duration) -> EventJournal {
        let (jobs, mut queued) = mpsc::unbounded_channel();
        runtime.spawn(async move {
            let mut failing_since: Option<Instant> = None;
            while let Some(job) = queued.recv().await {
                match job {
                    Job::Append {
                        lease,
                        json,
                        after_record,
                    } => {
                        // One outage is waited out once: the events behind the first that
                        // gave up are tried once each until an append goes through again.
                        let mut pause = Duration::from_millis(100);
                        let appended = loop {
                            let appended = if after_record {
                                db.append_event_after_record(&lease, &json).await
                            } else {
                                db.append_event(&lease, &json).await
                            };
                            let failing = match &appended {
                                Err(error) if error.is_transient() => {
                                    Some(*failing_since.get_or_insert_with(Instant::now))
                                }
                                _ => {
                                    failing_since = None;
                                    None
                                }
                            };
                            let again = failing
                                .is_some_and(|since| Instant::now() + pause < since + retry_for);
                            match appended {
                                Err(_) if again => {
                                    tokio::time::sleep(pause).await;
                                    pause = (pause * 2).min(Duration::from_secs(1));
                                }
                                other => break other,
                            }
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
