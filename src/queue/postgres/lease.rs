//! Leases: claiming tasks, renewing, releasing, and registering the node that holds them.
//!
//! A claim raises the task's `lease_epoch`; every later write for the task names the epoch it
//! holds and is refused once another claim raised it (see [`super::fenced`]). Expiry is
//! judged by the database's `now()` alone. A lease that expired is lost for good: renewing
//! skips it, and another node (or this one) may claim the task again once the expiry was
//! judged ([`JUDGE_EXPIRED`]: cleared, a suspect to try alone, or a crash counted).

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::connect::PgQueue;
use super::error::{During, PgError};

/// The right to write for one task, until `expires_at` (by the database's clock) or until
/// another claim raises the epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub task_id: String,
    pub node: String,
    /// The fencing token: every write for the task checks it in the same statement.
    pub epoch: i64,
    /// When the lease ends unless renewed (the database's clock).
    pub expires_at: DateTime<Utc>,
    /// The newest checkpoint generation stored for the task, so a save numbers the next one
    /// without asking (only the lease holder writes checkpoints).
    pub(super) last_generation: i64,
}

impl Lease {
    /// The newest checkpoint generation stored for the task (0: none).
    pub fn last_generation(&self) -> u64 {
        u64::try_from(self.last_generation).unwrap_or(0)
    }
}

/// A task this node now holds.
#[derive(Debug, Clone)]
pub struct ClaimedTask {
    pub lease: Lease,
    /// The task file as submitted.
    pub definition: String,
    /// True when the task was taken over from a lease that expired (its holder died, froze or
    /// lost the database).
    pub taken_over: bool,
    /// The node and epoch of the lease it was taken over from (an expired one), if any.
    pub previous: Option<(String, i64)>,
    /// A crash suspect claimed to be tried alone: the claiming node runs nothing beside it
    /// until it makes progress or its attempt ends.
    pub on_trial: bool,
    /// Expired leases in a row while the task was in flight alone on its node, with no
    /// progress or clean release in between.
    pub crash_count: i32,
    /// At this many the task is taken for the cause of the crashes.
    pub crash_limit: i32,
    /// The phase state the last holder left (JSON text), if any.
    pub phase_state: Option<String>,
    /// When the claim's statement was sent: the lease holds at least until then plus its
    /// length, whatever the clocks say.
    pub sent_at: std::time::Instant,
}

impl ClaimedTask {
    /// Whether the task is to be quarantined (recorded failed under this lease with the
    /// reason) instead of run: its holders died `crash_limit` times in a row while it ran
    /// alone on them.
    pub fn must_quarantine(&self) -> bool {
        self.crash_count >= self.crash_limit
    }
}

/// A lease [`PgQueue::renew_held`] extended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenewedLease {
    pub task_id: String,
    pub epoch: i64,
    pub expires_at: DateTime<Utc>,
}

/// Judge, once per lease, every lease that expired: the task's holder died, froze or lost the
/// database while the task ran. The file queue's rule (`daemon::crash_blame`), with a node for
/// the daemon:
/// - a task that made progress under the lease (a checkpoint, a finished phase) is cleared;
/// - one in flight with other tasks of its node, without progress, becomes a *suspect*, its
///   count kept: it is tried alone before anything else is claimed ([`CLAIM_SUSPECT`]);
/// - one in flight alone on its node, without progress, has a crash counted against it.
///
/// "In flight on its node" counts the node's running tasks that are not suspects waiting for
/// their trial. Every claim judges first, in its own transaction, so a task is judged before
/// any claim can take it or a sibling of its crash away.
pub(super) const JUDGE_EXPIRED: &str = "
UPDATE cairn_tasks t
SET judged_epoch = t.lease_epoch,
    suspect = t.progressed_epoch IS DISTINCT FROM t.lease_epoch AND node.in_flight > 1,
    crash_count = CASE
        WHEN t.progressed_epoch IS NOT DISTINCT FROM t.lease_epoch THEN 0
        WHEN node.in_flight > 1 THEN t.crash_count
        ELSE t.crash_count + 1
    END
FROM (
    SELECT lease_node, count(*) AS in_flight FROM cairn_tasks
    WHERE state = 'running' AND NOT suspect GROUP BY lease_node
) node
WHERE t.state = 'running' AND t.lease_expires_at <= now() AND NOT t.suspect
  AND t.judged_epoch IS DISTINCT FROM t.lease_epoch
  AND node.lease_node = t.lease_node";

/// Whether a suspect waits for its trial.
const SUSPECT_WAITING: &str = "SELECT EXISTS (SELECT 1 FROM cairn_tasks WHERE suspect)";

/// Claim up to `$2` tasks for node `$1` for `$3` seconds: queued ones whose backoff is over,
/// and running ones whose lease expired and was judged (see [`JUDGE_EXPIRED`]). Expired leases
/// go first (work in flight resumes before new work), then by priority and age. `SKIP LOCKED`
/// lets daemons claiming at once take different tasks instead of queueing behind each other's
/// locks.
const CLAIM: &str = "
WITH candidate AS (
    SELECT id, state = 'running' AS expired,
           CASE WHEN state = 'running' THEN lease_node END AS prev_node, lease_epoch AS prev_epoch
    FROM cairn_tasks
    WHERE (state = 'queued' AND (not_before IS NULL OR not_before <= now()))
       OR (state = 'running' AND lease_expires_at <= now() AND NOT suspect
           AND judged_epoch = lease_epoch)
    ORDER BY state = 'running' DESC, priority DESC, submitted_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE cairn_tasks t
SET state = 'running',
    lease_node = $1,
    lease_epoch = t.lease_epoch + 1,
    lease_expires_at = now() + $3::float8 * interval '1 second',
    not_before = NULL,
    updated_at = now()
FROM candidate c
WHERE t.id = c.id
RETURNING t.id, t.lease_epoch, t.lease_expires_at, t.definition::text, c.expired,
          t.crash_count, t.crash_limit, false, t.phase_state::text, c.prev_node, c.prev_epoch";

/// Claim one suspect for node `$1` for `$3` seconds, to try it alone (`$2` is 1).
const CLAIM_SUSPECT: &str = "
WITH candidate AS (
    SELECT id, lease_node AS prev_node, lease_epoch AS prev_epoch FROM cairn_tasks
    WHERE suspect
    ORDER BY priority DESC, submitted_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE cairn_tasks t
SET state = 'running',
    suspect = false,
    lease_node = $1,
    lease_epoch = t.lease_epoch + 1,
    lease_expires_at = now() + $3::float8 * interval '1 second',
    not_before = NULL,
    updated_at = now()
FROM candidate c
WHERE t.id = c.id
RETURNING t.id, t.lease_epoch, t.lease_expires_at, t.definition::text, true,
          t.crash_count, t.crash_limit, true, t.phase_state::text, c.prev_node, c.prev_epoch";

/// Extend the unexpired leases of node `$1` named by `$3` (task ids) and `$4` (their epochs,
/// in the same order) by `$2` seconds, and note the node alive. Only the leases the caller
/// holds: one it has let go of in memory (judged lost) must expire, not live on unrun.
const RENEW_HELD: &str = "
WITH seen AS (
    UPDATE cairn_nodes SET last_seen_at = now() WHERE name = $1
)
UPDATE cairn_tasks t
SET lease_expires_at = now() + $2::float8 * interval '1 second'
FROM unnest($3::text[], $4::int8[]) AS held(id, epoch)
WHERE t.id = held.id AND t.lease_epoch = held.epoch
  AND t.lease_node = $1 AND t.state = 'running' AND t.lease_expires_at > now()
RETURNING t.id, t.lease_epoch, t.lease_expires_at";

/// Hand back every task of node `$1`: queued again at once, crash count cleared (a clean stop
/// is not a crash). The epoch stays; the next claim raises it.
const RELEASE_ALL: &str = "
UPDATE cairn_tasks
SET state = 'queued', lease_node = NULL, lease_expires_at = NULL, crash_count = 0,
    updated_at = now()
WHERE lease_node = $1 AND state = 'running'
RETURNING id";

/// Register node `$1` (instance `$2`, leases of `$3` seconds), unless another instance
/// renewed under that name less than `$3` seconds ago.
const REGISTER_NODE: &str = "
INSERT INTO cairn_nodes (name, instance, lease_seconds) VALUES ($1, $2, $3)
ON CONFLICT (name) DO UPDATE
SET instance = $2, started_at = now(), last_seen_at = now(), lease_seconds = $3
WHERE cairn_nodes.instance = $2
   OR cairn_nodes.last_seen_at <= now() - $3::float8 * interval '1 second'
RETURNING name";

/// The newest checkpoint generation of each task node `$1` holds.
const NODE_GENERATIONS: &str = "
SELECT k.task_id, max(k.generation) FROM cairn_checkpoints k
JOIN cairn_tasks t ON t.id = k.task_id
WHERE t.lease_node = $1 AND t.state = 'running'
GROUP BY k.task_id";

impl PgQueue {
    /// Register `node` as this process's name. Refused with [`PgError::NodeNameInUse`] when
    /// another process under that name was seen within the last `lease`.
    pub async fn register_node(&self, node: &str, lease: Duration) -> Result<(), PgError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                REGISTER_NODE,
                &[&node, &self.instance, &lease.as_secs_f64()],
            )
            .await
            .during("registering the node")?;
        match row {
            Some(_) => Ok(()),
            None => Err(PgError::NodeNameInUse {
                node: node.to_owned(),
            }),
        }
    }

    /// Claim up to `max` tasks for `node`, each leased for `lease`, after judging the leases
    /// that expired. While crash suspects wait for their trial nothing else is claimed: a node
    /// that holds nothing (`idle`) claims one suspect to try alone, the others claim nothing
    /// and drain, as the file queue tries its suspects before anything else starts.
    pub async fn claim(
        &self,
        node: &str,
        max: u32,
        lease: Duration,
        idle: bool,
    ) -> Result<Vec<ClaimedTask>, PgError> {
        let client = self.client().await?;
        let suspects_wait = judge_expired_then_look_for_suspects(&client).await?;
        let (statement, max) = match (suspects_wait, idle) {
            (false, _) => (CLAIM, i64::from(max)),
            (true, true) => (CLAIM_SUSPECT, 1),
            (true, false) => return Ok(Vec::new()),
        };
        let statement = client
            .prepare_cached(statement)
            .await
            .during("claiming tasks")?;
        let generations = client
            .prepare_cached(NODE_GENERATIONS)
            .await
            .during("reading the claimed tasks' checkpoint generations")?;
        // The claim returns each task's phase state (the row it locked, as its last holder
        // left it). The newest checkpoint generations are read by a second statement sent at
        // once behind the claim on the same connection: it runs after the claim committed, so
        // no write of an earlier holder can land after it, and costs no round trip of its own.
        let sent_at = std::time::Instant::now();
        let (rows, generations) = futures::try_join!(
            async {
                client
                    .query(&statement, &[&node, &max, &lease.as_secs_f64()])
                    .await
                    .during("claiming tasks")
            },
            async {
                client
                    .query(&generations, &[&node])
                    .await
                    .during("reading the claimed tasks' checkpoint generations")
            },
        )?;
        let generations: HashMap<String, i64> = generations
            .iter()
            .map(|row| (row.get(0), row.get(1)))
            .collect();
        Ok(rows
            .iter()
            .map(|row| claimed_task(row, node, &generations, sent_at))
            .collect())
    }

    /// Extend, in one statement, the leases of `node` in `held` (task id and epoch) that have
    /// not expired yet, to `lease` from now. Returns the leases renewed: one of `held` missing
    /// here is lost, and its commands must be stopped. A lease of the node that is not in
    /// `held` is left to expire.
    pub async fn renew_held(
        &self,
        node: &str,
        lease: Duration,
        held: &[(String, i64)],
    ) -> Result<Vec<RenewedLease>, PgError> {
        let ids: Vec<&str> = held.iter().map(|(id, _)| id.as_str()).collect();
        let epochs: Vec<i64> = held.iter().map(|&(_, epoch)| epoch).collect();
        let client = self.client().await?;
        let statement = client
            .prepare_cached(RENEW_HELD)
            .await
            .during("renewing leases")?;
        let rows = client
            .query(&statement, &[&node, &lease.as_secs_f64(), &ids, &epochs])
            .await
            .during("renewing leases")?;
        Ok(rows
            .iter()
            .map(|row| RenewedLease {
                task_id: row.get(0),
                epoch: row.get(1),
                expires_at: row.get(2),
            })
            .collect())
    }

    /// Hand back every task `node` holds (a clean stop, after flushing), so that other nodes
    /// take them at once instead of after expiry; wakes the listeners. Returns their ids.
    pub async fn release_all(&self, node: &str) -> Result<Vec<String>, PgError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.during("starting the release")?;
        let released: Vec<String> = tx
            .query(RELEASE_ALL, &[&node])
            .await
            .during("releasing leases")?
            .iter()
            .map(|row| row.get(0))
            .collect();
        if !released.is_empty() {
            super::listen::notify_work(&tx, "").await?;
        }
        tx.commit().await.during("committing the release")?;
        Ok(released)
    }
}

/// Judge the leases that expired, then say whether crash suspects wait for their trial. Each
/// statement is prepared once per connection: one round trip each, which counts on a slow
/// link (see docs/cluster.md, "Latency").
async fn judge_expired_then_look_for_suspects(
    client: &deadpool_postgres::Object,
) -> Result<bool, PgError> {
    let judge = client
        .prepare_cached(JUDGE_EXPIRED)
        .await
        .during("judging expired leases")?;
    client
        .execute(&judge, &[])
        .await
        .during("judging expired leases")?;
    let waiting = client
        .prepare_cached(SUSPECT_WAITING)
        .await
        .during("looking for crash suspects")?;
    Ok(client
        .query_one(&waiting, &[])
        .await
        .during("looking for crash suspects")?
        .get(0))
}

/// A task claimed for `node`, from its row of the claim and the newest checkpoint
/// `generations` of the node's tasks.
fn claimed_task(
    row: &tokio_postgres::Row,
    node: &str,
    generations: &HashMap<String, i64>,
    sent_at: std::time::Instant,
) -> ClaimedTask {
    ClaimedTask {
        lease: Lease {
            task_id: row.get(0),
            node: node.to_owned(),
            epoch: row.get(1),
            expires_at: row.get(2),
            last_generation: generations
                .get(&row.get::<_, String>(0))
                .copied()
                .unwrap_or(0),
        },
        definition: row.get(3),
        taken_over: row.get(4),
        previous: row
            .get::<_, Option<String>>(9)
            .map(|node| (node, row.get::<_, i64>(10))),
        crash_count: row.get(5),
        crash_limit: row.get(6),
        on_trial: row.get(7),
        phase_state: row.get(8),
        sent_at,
    }
}
