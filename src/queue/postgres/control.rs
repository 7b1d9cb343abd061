//! Control requests on PostgreSQL: `cairn pause|resume|cancel|retry --db` insert a row into
//! `cairn_control` and wake the daemons; the daemons handle it.
//!
//! - A request for a task this node holds (state `running`, its lease) is handed to the
//!   daemon ([`PgQueue::take_control`] returns it on every call until it is marked handled),
//!   which applies it to the running attempt as it does for files.
//! - A request for a task no daemon holds (queued, paused, finished) is applied here, in SQL,
//!   by whichever daemon sees it first: the request's row is claimed `FOR UPDATE SKIP LOCKED`,
//!   so one daemon applies it, in one transaction with the task's row, its record and its
//!   journal event ([`super::steer`]).
//! - A request for a task leased by another node, or whose lease expired (its next holder
//!   gets it), waits; so do the requests after it for the same task, to keep their order.
//! - A request for a task the database does not have is marked handled with a log line; one
//!   that makes no sense for the task's state (pausing a finished task) is marked handled with
//!   a `control_refused` event, as the file daemon does.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Instant;

use chrono::{DateTime, Utc};

use super::connect::PgQueue;
use super::error::{During, PgError};
use super::roles::Vouched;
use super::row_state::RowState;
use super::steer::{Refusals, Unheld};
use crate::queue::control::{ControlAction, ControlJudge, ControlRequest, DatabaseAsker};
use crate::queue::refusals::RefusalLimiter;
use crate::task_id::TaskId;

/// The requests not handled yet, oldest first, with where their task stands and who asked
/// (the role, whether it is trusted, the local user it is mapped to: see `roles`).
const PENDING: &str = concat!(
    "
SELECT c.id, c.task_id, c.action, c.requested_at, t.state, t.lease_node,
       COALESCE(t.lease_expires_at > now(), false), c.requested_role, ",
    super::roles::trusted_role!("c.requested_role"),
    ", CASE WHEN r.kind = 'submitter' THEN r.local_user END, c.max_cost
FROM cairn_control c LEFT JOIN cairn_tasks t ON t.id = c.task_id
LEFT JOIN cairn_roles r ON r.role = c.requested_role
LEFT JOIN pg_roles s ON s.rolname = c.requested_role
WHERE c.handled_at IS NULL
ORDER BY c.id
LIMIT 1000"
);

/// Mark request `$1` handled by node `$2`, with outcome `$3`.
const MARK_HANDLED: &str = "
UPDATE cairn_control SET handled_at = now(), handled_by = $2, outcome = $3
WHERE id = $1 AND handled_at IS NULL";

/// The task of a request applied in SQL, locked for the transaction.
const TASK_FOR_CONTROL: &str = "
SELECT state, lease_epoch, phase_state::text, definition::text, start_point::text
FROM cairn_tasks WHERE id = $1 FOR UPDATE";

/// Where the task of a pending request stands, for this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holder {
    /// This node holds its lease: the daemon applies the request.
    ThisNode,
    /// Another node holds it, or its lease expired and its next holder will.
    Elsewhere,
    /// Nobody holds it: applied here, in SQL.
    Nobody,
    /// The database has no such task.
    Unknown,
}

fn action_of(name: &str) -> Option<ControlAction> {
    match name {
        "pause" => Some(ControlAction::Pause),
        "resume" => Some(ControlAction::Resume),
        "cancel" => Some(ControlAction::Cancel),
        "retry" => Some(ControlAction::Retry),
        "budget" => Some(ControlAction::Budget),
        _ => None,
    }
}

/// A request that has been handled, as [`PgQueue::control_outcome`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandledRequest {
    /// The node that handled it.
    pub node: String,
    /// `applied`, `taken by the daemon running the task` (which applies it as with files),
    /// `nothing to do: ...`, `refused: ...`, `no such task`.
    pub outcome: String,
}

impl PgQueue {
    /// Ask for `action` on `task_id`: insert the request and wake the daemons. Returns the
    /// request's number, for [`PgQueue::control_outcome`].
    pub async fn request_control(
        &self,
        task_id: &TaskId,
        action: ControlAction,
    ) -> Result<i64, PgError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.during("starting the request")?;
        let id: i64 = tx
            .query_one(
                "INSERT INTO cairn_control (task_id, action) VALUES ($1, $2) RETURNING id",
                &[&task_id.as_str(), &action.as_str()],
            )
            .await
            .during("writing a control request")?
            .get(0);
        super::listen::notify_work(&tx, "").await?;
        tx.commit().await.during("committing the request")?;
        Ok(id)
    }

    /// Ask for the spending limit of `task_id` to be set to `max_cost` (`cairn budget --db`):
    /// insert the request and wake the daemons. Returns the request's number.
    pub async fn request_budget(&self, task_id: &TaskId, max_cost: f64) -> Result<i64, PgError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.during("starting the request")?;
        let id: i64 = tx
            .query_one(
                "INSERT INTO cairn_control (task_id, action, max_cost) VALUES ($1, 'budget', $2)
                 RETURNING id",
                &[&task_id.as_str(), &max_cost],
            )
            .await
            .during("writing a budget request")?
            .get(0);
        super::listen::notify_work(&tx, "").await?;
        tx.commit().await.during("committing the request")?;
        Ok(id)
    }

    /// The state of task `task_id` (`queued`, `running`, ...), or `None` when there is none.
    pub async fn task_state(&self, task_id: &str) -> Result<Option<String>, PgError> {
        let client = self.client().await?;
        let row = client
            .query_opt("SELECT state FROM cairn_tasks WHERE id = $1", &[&task_id])
            .await
            .during("reading a task's state")?;
        Ok(row.map(|row| row.get(0)))
    }

    /// How request `id` was handled, once it was.
    pub async fn control_outcome(&self, id: i64) -> Result<Option<HandledRequest>, PgError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT handled_by, outcome FROM cairn_control
                 WHERE id = $1 AND handled_at IS NOT NULL",
                &[&id],
            )
            .await
            .during("reading a control request")?;
        Ok(row.map(|row| HandledRequest {
            node: row.get::<_, Option<String>>(0).unwrap_or_default(),
            outcome: row.get::<_, Option<String>>(1).unwrap_or_default(),
        }))
    }

    /// Handle the pending requests as node `node` (see the module docs): apply those for
    /// tasks nobody holds, and return those for tasks `node` holds, oldest first, for its
    /// daemon to apply and then [`mark_control_handled`](PgQueue::mark_control_handled).
    /// With `judge` (tasks run as their submitters), each request carries who the database
    /// says asked, and one for a task nobody holds is applied only if `judge` lets it.
    pub async fn take_control(
        &self,
        node: &str,
        judge: Option<&ControlJudge>,
        refusals: &Mutex<RefusalLimiter>,
    ) -> Result<Vec<(i64, ControlRequest)>, PgError> {
        self.journal_refusal_counts(node, refusals).await?;
        let rows = {
            let client = self.client().await?;
            client
                .query(PENDING, &[])
                .await
                .during("reading control requests")?
        };
        let mut held_here = Vec::new();
        // Tasks with an earlier request still waiting: their later ones wait behind it.
        let mut waiting: HashSet<String> = HashSet::new();
        for row in &rows {
            let id: i64 = row.get(0);
            let task_id: String = row.get(1);
            let state = row
                .try_get::<_, Option<RowState>>(4)
                .during("reading control requests")?;
            let holder = match (state, row.get::<_, Option<&str>>(5)) {
                (None, _) => Holder::Unknown,
                (Some(RowState::Running), Some(lease))
                    if lease == node && row.get::<_, bool>(6) =>
                {
                    Holder::ThisNode
                }
                (Some(RowState::Running), _) => Holder::Elsewhere,
                (Some(_), _) => Holder::Nobody,
            };
            if waiting.contains(&task_id) {
                continue;
            }
            // Who asked is known whether or not it is judged: a budget request journals it.
            // A request without a recorded role has no verdict on it (NULL): not trusted.
            let trusted = row.get::<_, Option<bool>>(8).unwrap_or(false);
            let vouched = Vouched::of(row.get(7), trusted, row.get(9));
            let asker = asker_of(vouched, row.get(7));
            let request = parse_request(&task_id, row.get(2), row.get(3), row.get(10));
            let request = request.map(|mut request| {
                request.asker = Some(asker);
                request
            });
            match (holder, request) {
                (_, None) => {
                    tracing::warn!(request = id, task_id = ?task_id, "dropping a control request that is not one");
                    self.mark_control_handled(id, node, "refused: not a valid request")
                        .await?;
                }
                (Holder::Unknown, Some(_)) => {
                    tracing::warn!(request = id, task_id = ?task_id, "dropping a control request for a task the database does not have");
                    self.mark_control_handled(id, node, "no such task").await?;
                }
                (Holder::ThisNode, Some(request)) => held_here.push((id, request)),
                (Holder::Elsewhere, Some(_)) => {
                    waiting.insert(task_id);
                }
                (Holder::Nobody, Some(request)) => {
                    if !self
                        .apply_unheld(id, &request, node, judge, refusals)
                        .await?
                    {
                        waiting.insert(task_id);
                    }
                }
            }
        }
        Ok(held_here)
    }

    /// Journal the count of each window of refusals that is over, in its task's journal.
    async fn journal_refusal_counts(
        &self,
        node: &str,
        refusals: &Mutex<RefusalLimiter>,
    ) -> Result<(), PgError> {
        let summaries = refusals
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .close_expired(Instant::now());
        if summaries.is_empty() {
            return Ok(());
        }
        let client = self.client().await?;
        for summary in summaries {
            tracing::warn!(task_id = summary.task, "{}", summary.reason);
            let event = crate::store::events::Event::ControlRefused {
                action: "requests".to_string(),
                reason: summary.reason,
                request: None,
            };
            let event = super::error::json_text("a count of refused requests", &event)?;
            client
                .execute(
                    "INSERT INTO cairn_events (task_id, node, lease_epoch, event)
                     SELECT id, $2, lease_epoch, $3::text::json FROM cairn_tasks WHERE id = $1",
                    &[&summary.task, &node, &event],
                )
                .await
                .during("journaling a count of refused requests")?;
        }
        Ok(())
    }

    /// Mark request `id` handled by `node` with `outcome` (a missing or handled one: nothing).
    pub async fn mark_control_handled(
        &self,
        id: i64,
        node: &str,
        outcome: &str,
    ) -> Result<(), PgError> {
        let client = self.client().await?;
        client
            .execute(MARK_HANDLED, &[&id, &node, &outcome])
            .await
            .during("marking a control request handled")?;
        Ok(())
    }

    /// Apply request `id` to its task, which no daemon held when it was listed, in one
    /// transaction. False when it is left for later: another daemon is applying it, or a
    /// daemon has claimed the task since.
    async fn apply_unheld(
        &self,
        id: i64,
        request: &ControlRequest,
        node: &str,
        judge: Option<&ControlJudge>,
        refusals: &Mutex<RefusalLimiter>,
    ) -> Result<bool, PgError> {
        let task_id = request.task_id.as_str();
        // Who submitted the task cannot change: read before the request is claimed.
        let vouched = match judge {
            Some(_) => self.vouched(&[task_id]).await?.remove(task_id),
            None => None,
        };
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .during("starting a control request")?;
        let mine = tx
            .query_opt(
                "SELECT id FROM cairn_control
                 WHERE id = $1 AND handled_at IS NULL FOR UPDATE SKIP LOCKED",
                &[&id],
            )
            .await
            .during("claiming a control request")?;
        if mine.is_none() {
            return Ok(false);
        }
        let Some(task) = tx
            .query_opt(TASK_FOR_CONTROL, &[&task_id])
            .await
            .during("reading the task of a control request")?
        else {
            tx.execute(MARK_HANDLED, &[&id, &node, &"no such task"])
                .await
                .during("marking a control request handled")?;
            tx.commit().await.during("committing a control request")?;
            return Ok(true);
        };
        let state: RowState = task
            .try_get(0)
            .during("reading the task of a control request")?;
        let unheld = Unheld {
            tx: &tx,
            node,
            task_id: &request.task_id,
            epoch: task.get(1),
            phase_state: task.get(2),
            definition: task.get(3),
            start_point: task.get(4),
        };
        let refusals = Refusals {
            limiter: refusals,
            asker: match &request.asker {
                Some(DatabaseAsker::User { uid, .. }) => Some(*uid),
                _ => None,
            },
        };
        let judged = match judge {
            Some(judge) => judge_unheld(judge, request, vouched, &unheld.definition),
            None => Ok(()),
        };
        let outcome = match judged {
            Ok(()) => match unheld.apply(request, state, &refusals).await? {
                Some(outcome) => outcome,
                // It runs: its daemon applies the request.
                None => return Ok(false),
            },
            Err(why) => {
                unheld
                    .refuse(request.action, why.to_string(), &refusals)
                    .await?
            }
        };
        tx.execute(MARK_HANDLED, &[&id, &node, &outcome])
            .await
            .during("marking a control request handled")?;
        tx.commit().await.during("committing a control request")?;
        tracing::info!(task_id = %request.task_id, action = request.action.as_str(), outcome, "control request applied in the database");
        Ok(true)
    }
}

/// Judge `request` on a task no daemon holds, whose definition is `definition` and whose
/// submitter the database vouches for as `vouched`.
fn judge_unheld(
    judge: &ControlJudge,
    request: &ControlRequest,
    vouched: Option<Vouched>,
    definition: &str,
) -> Result<(), crate::queue::control::SteeringRefusal> {
    let recorded = crate::task::Task::parse_stored(definition.as_bytes())
        .ok()
        .and_then(|task| task.submitted_by);
    let vouched = vouched.unwrap_or(Vouched::Nobody { role: None });
    judge(request, vouched.submitter(recorded.as_ref()).as_ref())
}

fn parse_request(
    task_id: &str,
    action: &str,
    requested_at: DateTime<Utc>,
    max_cost: Option<f64>,
) -> Option<ControlRequest> {
    let request = ControlRequest {
        action: action_of(action)?,
        task_id: TaskId::parse(task_id).ok()?,
        requested_at,
        max_cost,
        // A database's requests have no file: who asked is the database's to say (`asker`).
        origin: None,
        asker: None,
    };
    request.is_well_formed().then_some(request)
}

/// Who asked, as this host sees the role (`role`) the database vouches for.
fn asker_of(vouched: Vouched, role: Option<String>) -> DatabaseAsker {
    match vouched {
        Vouched::Trusted => DatabaseAsker::Trusted {
            role: role.unwrap_or_default(),
        },
        Vouched::LocalUser { role, user } => match crate::submitter::Submitter::of_name(&user) {
            Some(found) => DatabaseAsker::User {
                role,
                uid: found.uid,
            },
            None => DatabaseAsker::Unknown { role: Some(role) },
        },
        Vouched::Nobody { role } => DatabaseAsker::Unknown { role },
    }
}
