//! Wake-ups for new work: LISTEN/NOTIFY on [`WORK_CHANNEL`], sent when a task is submitted or
//! leases are handed back. Notifications are a shortcut, not the mechanism: the caller polls
//! at its own pace as well, so one lost with a dropped connection delays pickup by at most a
//! poll interval. Checkpoints send none.

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
