//! Wake-ups for new work: LISTEN/NOTIFY on [`WORK_CHANNEL`], sent when a task is submitted or
//! leases are handed back. Notifications are a shortcut, not the mechanism: the caller polls
//! at its own pace as well, so one lost with a dropped connection delays pickup by at most a
//! poll interval. Checkpoints send none.

use std::time::Duration;

use futures::StreamExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_postgres::AsyncMessage;

use super::connect::PgQueue;
use super::error::{During, PgError};

/// The channel cairn notifies on; the payload is the task id (empty after a release).
pub const WORK_CHANNEL: &str = "cairn_work";

/// Send a notification on [`WORK_CHANNEL`] when `tx` commits.
pub(super) async fn notify_work(
    tx: &tokio_postgres::Transaction<'_>,
    payload: &str,
) -> Result<(), PgError> {
    tx.execute("SELECT pg_notify($1, $2)", &[&WORK_CHANNEL, &payload])
        .await
        .during("notifying listeners")?;
    Ok(())
}

/// What [`SubmitListener::wait`] saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wakeup {
    /// Notifications arrived: their payloads (task ids; empty after a release).
    Notified(Vec<String>),
    /// The poll interval passed without one: look for work anyway.
    PollDue,
    /// The listening connection is gone: poll from now on, or connect a new listener.
    Disconnected,
}

/// A dedicated connection LISTENing on [`WORK_CHANNEL`] (a pooled one cannot be: its
/// notifications would reach whoever borrows it next).
pub struct SubmitListener {
    notifications: mpsc::UnboundedReceiver<String>,
    /// Drives the connection and forwards its notifications; aborted on drop.
    driver: JoinHandle<()>,
    /// Kept so the connection stays open.
    _client: tokio_postgres::Client,
}

impl SubmitListener {
    /// Open the connection and LISTEN. Needs a Tokio runtime.
    pub async fn connect(queue: &PgQueue) -> Result<Self, PgError> {
        let (client, mut connection) = queue
            .config
            .connect(queue.tls.clone())
            .await
            .during("connecting the listener")?;
        let (sender, notifications) = mpsc::unbounded_channel();
        let driver = tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(message) = messages.next().await {
                match message {
                    Ok(AsyncMessage::Notification(note)) => {
                        if sender.send(note.payload().to_owned()).is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(error) => {
                        tracing::warn!(%error, "the database listener's connection failed; polling for work instead");
                        return;
                    }
                }
            }
        });
        client
            .batch_execute(&format!("LISTEN {WORK_CHANNEL}"))
            .await
            .during("listening for new work")?;
        Ok(SubmitListener {
            notifications,
            driver,
            _client: client,
        })
    }

    /// Wait for a notification, at most `poll`; then take every other one already there.
    pub async fn wait(&mut self, poll: Duration) -> Wakeup {
        match tokio::time::timeout(poll, self.notifications.recv()).await {
            Err(_) => Wakeup::PollDue,
            Ok(None) => Wakeup::Disconnected,
            Ok(Some(first)) => {
                let mut payloads = vec![first];
                while let Ok(more) = self.notifications.try_recv() {
                    payloads.push(more);
                }
                Wakeup::Notified(payloads)
            }
        }
    }
}

impl Drop for SubmitListener {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// Send `()` on `notices` for every wake-up of the work channel, reconnecting when the
/// listening connection is lost, until the receiver is dropped. Lost notifications only delay
/// work until the receiver's own poll.
pub(super) async fn forward_work_notices(queue: PgQueue, notices: mpsc::UnboundedSender<()>) {
    /// How long to wait before connecting again after the connection failed.
    const RECONNECT_AFTER: Duration = Duration::from_secs(2);
    /// How often to look whether the receiver is still there while nothing arrives.
    const CHECK_RECEIVER: Duration = Duration::from_secs(30);
    while !notices.is_closed() {
        let mut listener = match SubmitListener::connect(&queue).await {
            Ok(listener) => listener,
            Err(error) => {
                tracing::warn!(%error, "cannot listen for new work; polling for it instead");
                tokio::time::sleep(RECONNECT_AFTER).await;
                continue;
            }
        };
        loop {
            match listener.wait(CHECK_RECEIVER).await {
                Wakeup::Notified(_) => {
                    if notices.send(()).is_err() {
                        return;
                    }
                }
                Wakeup::PollDue if notices.is_closed() => return,
                Wakeup::PollDue => {}
                Wakeup::Disconnected => break,
            }
        }
        tokio::time::sleep(RECONNECT_AFTER).await;
    }
}
