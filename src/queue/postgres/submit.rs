//! Submitting tasks: one row per task id, whoever submits it and however often.

use super::connect::PgQueue;
use super::error::{json_text, During, PgError};
use crate::store::events::Event;
use crate::submitter::Submitter;

/// A task to submit.
#[derive(Debug, Clone, Copy)]
pub struct NewTask<'a> {
    /// A valid task id (see `task_id::TaskId`).
    pub id: &'a str,
    pub priority: i32,
    /// Expired leases in a row after which the task is quarantined (the file queue's rule:
    /// `retry.max_attempts + 2`).
    pub crash_limit: u32,
    /// The task file, JSON text, stored verbatim.
    pub definition: &'a str,
    /// Who submitted it (the owner of the file an inbox took), for its `accepted` event.
    pub submitted_by: Option<&'a Submitter>,
}

impl<'a> NewTask<'a> {
    /// `task` (its id set) with `definition` as its stored text; the crash limit is the file
    /// queue's rule, `retry.max_attempts + 2`.
    pub fn of(task: &'a crate::task::Task, definition: &'a str) -> NewTask<'a> {
        NewTask {
            id: task.id().as_str(),
            priority: task.priority,
            crash_limit: task.retry.max_attempts.saturating_add(2),
            definition,
            submitted_by: task.submitted_by.as_ref(),
        }
    }
}

/// What [`PgQueue::submit`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Submitted {
    /// The task is new and queued; listeners were notified.
    Queued,
    /// A task with this id exists already; nothing changed. (A file dropped into two hosts'
    /// inboxes, or taken twice after a crash, is one task.)
    AlreadyThere,
}

const INSERT_TASK: &str = "
INSERT INTO cairn_tasks (id, priority, crash_limit, definition)
VALUES ($1, $2, $3, $4::text::json)
ON CONFLICT (id) DO NOTHING
RETURNING id";

impl PgQueue {
    /// Queue a task, exactly once per id.
    pub async fn submit(&self, task: &NewTask<'_>) -> Result<Submitted, PgError> {
        crate::task_id::TaskId::parse(task.id).map_err(|reason| PgError::InvalidTaskId {
            task_id: task.id.to_owned(),
            reason,
        })?;
        let crash_limit = i32::try_from(task.crash_limit).unwrap_or(i32::MAX);
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .during("starting the submission")?;
        let inserted = tx
            .query_opt(
                INSERT_TASK,
                &[&task.id, &task.priority, &crash_limit, &task.definition],
            )
            .await
            .during("submitting a task")?;
        if inserted.is_none() {
            return Ok(Submitted::AlreadyThere);
        }
        journal_accepted(&tx, task).await?;
        super::listen::notify_work(&tx, task.id).await?;
        tx.commit().await.during("committing the submission")?;
        Ok(Submitted::Queued)
    }

    /// Queue a paused task again (an operator's resume); wakes the listeners. False when the
    /// task is not paused.
    pub async fn resume_paused(&self, task_id: &str) -> Result<bool, PgError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.during("starting the resume")?;
        let resumed = tx
            .execute(
                "UPDATE cairn_tasks SET state = 'queued', updated_at = now()
                 WHERE id = $1 AND state = 'paused'",
                &[&task_id],
            )
            .await
            .during("resuming a task")?;
        if resumed == 0 {
            return Ok(false);
        }
        super::listen::notify_work(&tx, task_id).await?;
        tx.commit().await.during("committing the resume")?;
        Ok(true)
    }

    /// How many tasks the database holds, finished or not.
    pub async fn count_tasks(&self) -> Result<i64, PgError> {
        let client = self.client().await?;
        let row = client
            .query_one("SELECT count(*) FROM cairn_tasks", &[])
            .await
            .during("counting the tasks")?;
        Ok(row.get(0))
    }

    /// Remove the tasks `ids` with everything stored for them (their checkpoints, outputs,
    /// events and records go with them), and forget node `node`. For a benchmark cleaning up
    /// after itself; returns how many tasks were removed.
    pub async fn remove_tasks(&self, ids: &[String], node: &str) -> Result<u64, PgError> {
        let client = self.client().await?;
        let removed = client
            .execute("DELETE FROM cairn_tasks WHERE id = ANY($1)", &[&ids])
            .await
            .during("removing tasks")?;
        client
            .execute("DELETE FROM cairn_nodes WHERE name = $1", &[&node])
            .await
            .during("removing a node")?;
        Ok(removed)
    }
}

/// Journal `task`'s `accepted` event in the transaction that inserts it, as the file queue
/// journals a task it takes in. No node holds the task yet: no node, epoch 0.
pub(super) async fn journal_accepted(
    tx: &tokio_postgres::Transaction<'_>,
    task: &NewTask<'_>,
) -> Result<(), PgError> {
    let accepted = Event::Accepted {
        priority: task.priority,
        submitted_by: task.submitted_by.cloned(),
    };
    let accepted = json_text("the task's acceptance event", &accepted)?;
    tx.execute(
        "INSERT INTO cairn_events (task_id, node, lease_epoch, event)
         VALUES ($1, '', 0, $2::text::json)",
        &[&task.id, &accepted],
    )
    .await
    .during("journaling the task's acceptance")?;
    Ok(())
}
