//! [`PgBackend`]: the queue owner's [`QueueBackend`] on PostgreSQL, built on the lease
//! statements of [`PgQueue`]. Every write for a task goes through the task's PostgreSQL lease
//! and is checked in the same statement; a write refused there is [`QueueError::LeaseLost`].
//!
//! The trait is blocking, and the daemon calls it only from its blocking pool (a phase that
//! ends early hands its checkpointer's last write there too). The backend owns a small runtime
//! of its own (one worker thread) that drives the database's connections; a blocking caller
//! waits there for its statement's answer. The daemon's async thread never waits on it.
//!
//! Faults of the database are errors, not panics, and most are waited out: a write for a task
//! (checkpoint, output, record, hand-back) that fails for a reason that may pass (a restart,
//! a dropped connection) is tried again while the lease surely holds, each try bounded by the
//! time left. The backend keeps, for each lease, until when it surely holds (the sending of
//! its claim or of its last answered renewal, plus the lease: [`QueueBackend::lease_deadlines`]),
//! measures the database's round trip, and refuses claims while the lease is too short for it.
//! A lease the daemon lets go of ([`QueueBackend::let_go`], or a hand-back that could not be
//! written) is renewed no more: it is handed back once the database answers, or expires.
//!
//! Each host's inbox is taken into the database by [`super::intake`] (given with
//! [`PgBackend::with_inbox`]); control requests are handled by [`super::control`] (those for
//! tasks nobody holds applied in SQL, those for this node's tasks handed to its daemon).
//!
//! Checkpoints are saved through [`QueueBackend::save_checkpoint`] and group-committed
//! ([`super::committer`]): the saves of all tasks that arrive while a commit is in flight go
//! in the next one, one transaction for all, each row fenced by its own lease.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio::runtime::Runtime;

use super::committer::CheckpointCommitter;
use super::connect::PgQueue;
use super::error::{During, PgError};
use super::fenced::{CheckpointWrite, Outcome};
use super::intake::LocalInbox;
use super::journal::EventJournal;
use super::lease::Lease as PgLease;
use crate::queue::backend::{
    lease_stop_margin, ClaimedWork, ControlClaim, HandBack, LoadError, QueueBackend, QueueError,
    TaskRecord,
};
use crate::queue::control::{ControlJudge, ControlRequest};
use crate::queue::lease::{Lease, LeaseLost, OwnerLease};
use crate::queue::{IntakeReport, QueueDir, QueueHint};
use crate::store::current_work::{ActiveTask, CurrentWork, StartPoint};
use crate::store::events::Event;
use crate::store::records::{to_record_bytes, FailedRecord};
use crate::store::{
    decode_checkpoint, CheckpointStore, IterationCheckpoint, LoadedCheckpoint, SavedCheckpoint,
    StoreError, WriteFence,
};
use crate::task::Task;
use crate::task_id::TaskId;

/// Checkpoint generations kept besides the newest, as the file store keeps them (so
/// `cairn history` lists the same generations on both).
const KEEP_GENERATIONS: u32 = crate::store::DEFAULT_KEEP_GENERATIONS as u32;

/// The owner epoch of a database owner: its tasks' leases carry their own epochs.
const OWNER_EPOCH: u64 = 0;

/// Claim one named task for node `$2` for `$3` seconds: a queued one, one this node holds, or
/// one whose lease expired (by the database's clock), once judged (`lease::JUDGE_EXPIRED`)
/// and is not waiting for a trial. The epoch is raised.
const CLAIM_ONE: &str = "
UPDATE cairn_tasks t
SET state = 'running',
    lease_node = $2,
    lease_epoch = t.lease_epoch + 1,
    lease_expires_at = now() + $3::float8 * interval '1 second',
    not_before = NULL,
    updated_at = now()
WHERE t.id = $1
  AND (t.state = 'queued'
       OR (t.state = 'running'
           AND (t.lease_node = $2
                OR (t.lease_expires_at <= now() AND NOT t.suspect
                    AND t.judged_epoch = t.lease_epoch))))
RETURNING t.lease_epoch, t.lease_expires_at";

/// The queue's owner on one PostgreSQL database, as node `node`.
pub struct PgBackend {
    db: PgQueue,
    node: String,
    /// How long a claim or renewal holds.
    lease_for: Duration,
    owner: OwnerLease,
    /// The PostgreSQL lease of each task this owner holds.
    leases: Mutex<HashMap<String, PgLease>>,
    /// The leases of tasks this owner finished, until their closing event is journaled.
    finished: Mutex<HashMap<String, PgLease>>,
    /// Until when each lease this owner holds surely holds (local time: the sending of its
    /// claim or of its last answered renewal, plus the lease), with the epoch it is for.
    valid_until: Mutex<HashMap<String, (i64, Instant)>>,
    /// Tasks whose final record or hand-back is on its way: a renewal that crosses it does
    /// not judge their lease lost (the write ended it).
    ending: Mutex<HashSet<String>>,
    /// Leases let go of whose hand-back has not reached the database: tried again with each
    /// renewal while the lease holds, so that the task is queued again without waiting for
    /// its expiry (and without a crash counted).
    letting_go: Mutex<Vec<(PgLease, HandBack)>>,
    /// The database's round trips as measured by claims and renewals.
    latency: Mutex<Latency>,
    /// Fires after a claim: its leases want their first renewal now.
    renew_soon: Arc<tokio::sync::Notify>,
    /// Appends events in order, off the callers' threads.
    journal: EventJournal,
    /// Stores the checkpoints that arrive together in one commit.
    checkpoints: CheckpointCommitter,
    /// Drives the database client; `None` only while dropping.
    runtime: Option<Runtime>,
    /// This host's inbox, when given ([`PgBackend::with_inbox`]).
    inbox: Option<LocalInbox>,
    /// Tasks' submitters are the ones the database vouches for
    /// ([`PgBackend::vouching_for_submitters`]).
    vouching: bool,
    /// Judges requests for tasks no daemon holds, when vouching.
    control_judge: std::sync::OnceLock<ControlJudge>,
    /// The bounds on journaling the refusals of requests applied in the database.
    refusals: Mutex<crate::queue::refusals::RefusalLimiter>,
}

impl std::fmt::Debug for PgBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgBackend")
            .field("db", &self.db)
            .field("node", &self.node)
            .field("lease_for", &self.lease_for)
            .finish_non_exhaustive()
    }
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Which leases a renewal that was sent for `held` (task id and epoch) found lost, taking them
/// out of `leases` and updating the expiry of the renewed ones. Only the leases in `held` that
/// `leases` still holds under the same epoch are judged: a task claimed while the renewal was
/// on its way is not in its answer and is not lost (its claim's own expiry stands until the
/// next renewal).
fn judge_renewal(
    held: &[(String, i64)],
    renewed: &[super::lease::RenewedLease],
    leases: &mut HashMap<String, PgLease>,
    ending: &HashSet<String>,
) -> Vec<String> {
    let renewed: HashMap<(&str, i64), &super::lease::RenewedLease> = renewed
        .iter()
        .map(|r| ((r.task_id.as_str(), r.epoch), r))
        .collect();
    let mut lost = Vec::new();
    for (task_id, epoch) in held {
        let Some(mine) = leases.get_mut(task_id).filter(|mine| mine.epoch == *epoch) else {
            // Handed back, finished or claimed anew while the renewal was on its way.
            continue;
        };
        match renewed.get(&(task_id.as_str(), *epoch)) {
            Some(renewal) => mine.expires_at = renewal.expires_at,
            // Its final record or hand-back ended the lease while the renewal was on its way.
            None if ending.contains(task_id) => {}
            None => {
                leases.remove(task_id);
                lost.push(task_id.clone());
            }
        }
    }
    lost
}

/// The first pause before a write that failed for a reason that may pass is tried again; it
/// doubles up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_millis(500);

/// Round trips kept to judge the link by.
const ROUND_TRIPS_KEPT: usize = 8;

/// The database's round trips (claims and renewals, from sending to the answer), and what
/// was said about them.
#[derive(Debug, Default)]
struct Latency {
    recent: VecDeque<Duration>,
    /// The warning that the round trip eats a large share of the lease was logged.
    warned: bool,
    /// Claims are refused: the lease is too short for the round trip.
    refusing: bool,
}

impl Latency {
    /// The typical round trip: the median of the recent ones (one slow answer is no trend).
    fn typical(&self) -> Option<Duration> {
        let mut sorted: Vec<Duration> = self.recent.iter().copied().collect();
        sorted.sort_unstable();
        sorted.get(sorted.len() / 2).copied()
    }

    /// Note a round trip and judge the link against `lease` (logging once on each change).
    fn note(&mut self, round_trip: Duration, lease: Duration) {
        if self.recent.len() == ROUND_TRIPS_KEPT {
            self.recent.pop_front();
        }
        self.recent.push_back(round_trip);
        let Some(typical) = self.typical() else {
            return;
        };
        let shortest = shortest_lease_for(typical);
        let slow = typical * 4 >= lease;
        if slow && !self.warned {
            tracing::warn!(
                round_trip_ms = typical.as_millis() as u64,
                lease_ms = lease.as_millis() as u64,
                "the database's round trip takes {}% of the lease: a renewal may come back too late to hold it; give this daemon a longer lease (--lease {}s or more)",
                typical.as_millis() * 100 / lease.as_millis().max(1),
                (typical * 8).as_secs().max(1)
            );
        }
        self.warned = slow;
        // A claim's lease holds from its sending until its first renewal's answer, two round
        // trips later; with the margin kept at the end, a lease shorter than that is lost
        // before its commands can run. Claims start again with some room to spare.
        let refuse = shortest >= lease;
        let room = shortest + shortest / 10 < lease;
        if refuse && !self.refusing {
            tracing::error!(
                round_trip_ms = typical.as_millis() as u64,
                lease_ms = lease.as_millis() as u64,
                "the lease is too short for the database's round trip: this daemon claims no work until the round trip is shorter; give it a lease of at least {:.1}s (--lease)",
                (typical * 8).as_secs_f64()
            );
            self.refusing = true;
        } else if self.refusing && room {
            tracing::info!(
                round_trip_ms = typical.as_millis() as u64,
                "the database's round trip leaves room in the lease again: claiming work"
            );
            self.refusing = false;
        }
    }

    /// What to show about the link, while it eats a large share of the lease.
    fn warning(&self, lease: Duration) -> Option<String> {
        let typical = self.typical()?;
        if self.refusing {
            return Some(format!(
                "claiming nothing: the database's round trip ({} ms) is too long for a lease of {:.1}s",
                typical.as_millis(),
                lease.as_secs_f64()
            ));
        }
        (typical * 4 >= lease).then(|| {
            format!(
                "the database's round trip ({} ms) takes {}% of the lease ({:.1}s)",
                typical.as_millis(),
                typical.as_millis() * 100 / lease.as_millis().max(1),
                lease.as_secs_f64()
            )
        })
    }
}

/// The shortest lease a daemon can hold through a link of `round_trip`: a claim's lease holds
/// from its sending, its first renewal's answer comes two round trips later, and the stop
/// margin (a sixth of the lease) must be left: `2 rt + lease / 6 < lease`.
fn shortest_lease_for(round_trip: Duration) -> Duration {
    round_trip * 12 / 5
}

impl PgBackend {
    /// The time the lease of `task_id` under `epoch` surely has left before its stop margin
    /// (zero when unknown or gone).
    fn time_left(&self, task_id: &str, epoch: i64) -> Duration {
        let until = locked(&self.valid_until)
            .get(task_id)
            .filter(|(held, _)| *held == epoch)
            .map(|(_, until)| *until);
        until
            .map(|until| {
                until
                    .saturating_duration_since(Instant::now())
                    .saturating_sub(lease_stop_margin(self.lease_for))
            })
            .unwrap_or_default()
    }

    /// How long a try of a write for `held` may wait for its answer: the first always gets
    /// at least a lease (the database, not this host's count, says whether the lease holds);
    /// a try again (after `pause` grew) only what the lease surely has left.
    fn try_limit(&self, held: &PgLease, pause: Duration) -> Duration {
        let left = self.time_left(&held.task_id, held.epoch);
        if pause == RETRY_FIRST {
            left.max(self.lease_for)
        } else {
            left
        }
    }

    /// The lease of `task_id` under `epoch` holds at least until `until` (kept if later).
    fn holds_until(&self, task_id: &str, epoch: i64, until: Instant) {
        let mut valid = locked(&self.valid_until);
        let entry = valid.entry(task_id.to_string()).or_insert((epoch, until));
        // Epochs only grow: a late answer for an older lease of the task says nothing.
        if entry.0 < epoch || (entry.0 == epoch && entry.1 < until) {
            *entry = (epoch, until);
        }
    }

    /// One try of `statement` for a held lease, given at most `left` for its answer: a
    /// database that does not answer within the lease is as good as down.
    fn try_within<T>(
        &self,
        left: Duration,
        action: &'static str,
        statement: impl Future<Output = Result<T, PgError>>,
    ) -> Result<T, PgError> {
        if left.is_zero() {
            return Err(PgError::TimedOut {
                action,
                waited: left,
            });
        }
        self.run(async {
            match tokio::time::timeout(left, statement).await {
                Ok(result) => result,
                Err(_) => Err(PgError::TimedOut {
                    action,
                    waited: left,
                }),
            }
        })
    }

    /// Whether to try a write for `task_id`'s lease (`epoch`) again after `error`: a
    /// failure that may pass (the database restarting, a dropped connection) while the lease
    /// surely holds for longer than the pause, which is then slept.
    fn try_again(&self, error: &PgError, task_id: &str, epoch: i64, pause: &mut Duration) -> bool {
        if !error.is_transient() || self.time_left(task_id, epoch) <= *pause {
            return false;
        }
        tracing::warn!(task_id, %error, "a write failed; trying it again while the lease holds");
        std::thread::sleep(*pause);
        *pause = (*pause * 2).min(RETRY_MAX);
        true
    }

    /// Drop the deadlines of leases neither held nor being let go of.
    fn forget_old_deadlines(&self) {
        let leases = locked(&self.leases);
        let letting_go: HashSet<String> = locked(&self.letting_go)
            .iter()
            .map(|(held, _)| held.task_id.clone())
            .collect();
        locked(&self.valid_until)
            .retain(|task_id, _| leases.contains_key(task_id) || letting_go.contains(task_id));
    }

    /// Note a measured round trip of the database.
    fn note_round_trip(&self, round_trip: Duration) {
        locked(&self.latency).note(round_trip, self.lease_for);
    }

    /// Hand back the leases let go of whose hand-back did not reach the database yet, while
    /// they hold; those that cannot be any more are left to expire.
    fn retry_letting_go(&self) {
        let waiting = std::mem::take(&mut *locked(&self.letting_go));
        for (held, how) in waiting {
            if self.time_left(&held.task_id, held.epoch).is_zero() {
                tracing::info!(task_id = %held.task_id, "a lease let go of expires instead of being handed back: another daemon takes the task over");
                continue;
            }
            match self.write_hand_back(&held, how) {
                Ok(()) | Err(PgError::LeaseLost { .. }) => {
                    tracing::info!(task_id = %held.task_id, "a lease let go of was handed back");
                }
                Err(error) => {
                    tracing::debug!(task_id = %held.task_id, %error, "a lease let go of is not handed back yet");
                    locked(&self.letting_go).push((held, how));
                }
            }
        }
    }

    /// The hand-back's statement, tried again while it may pass and the lease holds. A try
    /// whose answer was lost may have landed: a refusal after it means the task is not ours.
    fn write_hand_back(&self, held: &PgLease, how: HandBack) -> Result<(), PgError> {
        let mut pause = RETRY_FIRST;
        loop {
            let left = self.try_limit(held, pause);
            let result = match how {
                HandBack::Paused => self.try_within(left, "pausing the task", self.db.pause(held)),
                // The attempt ended without killing its daemon: no crash to count.
                HandBack::RetryAfter(after) => self.try_within(
                    left,
                    "queueing the task again",
                    self.db.requeue(held, after, true),
                ),
            };
            match result {
                Err(error) if self.try_again(&error, &held.task_id, held.epoch, &mut pause) => {}
                other => return other,
            }
        }
    }

    /// The final record's statement, tried again while it may pass and the lease holds. A try
    /// whose answer was lost may have landed: a refusal after it is success when the record
    /// is there under this lease.
    fn write_record(&self, held: &PgLease, outcome: Outcome, json: &str) -> Result<(), PgError> {
        let mut pause = RETRY_FIRST;
        let mut unanswered = false;
        loop {
            let left = self.try_limit(held, pause);
            match self.try_within(
                left,
                "finishing the task",
                self.db.finish(held, outcome, json),
            ) {
                Ok(()) => return Ok(()),
                Err(error @ PgError::LeaseLost { .. }) => {
                    let landed =
                        unanswered && self.run(self.db.has_record_of(held)).unwrap_or(false);
                    return if landed { Ok(()) } else { Err(error) };
                }
                Err(error) if self.try_again(&error, &held.task_id, held.epoch, &mut pause) => {
                    unanswered = true;
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Measure the round trip while nothing is held (claims are refused): the node's
    /// registration is renewed, nothing else.
    fn probe_round_trip(&self) {
        let sent = Instant::now();
        let probe = self.try_within(
            self.lease_for,
            "measuring the round trip",
            self.db.renew_held(&self.node, self.lease_for, &[]),
        );
        if probe.is_ok() {
            self.note_round_trip(sent.elapsed());
        }
    }

    /// The leases this owner holds now, as task id and epoch, for a renewal; in the order of
    /// the task ids, as a commit of checkpoints names them: statements that lock several task
    /// rows take the locks in one order, so they do not deadlock each other.
    fn held_now(&self) -> Vec<(String, i64)> {
        let mut held: Vec<(String, i64)> = locked(&self.leases)
            .iter()
            .map(|(task_id, lease)| (task_id.clone(), lease.epoch))
            .collect();
        held.sort_unstable();
        held
    }

    /// Own the queue in the database at `url` as node `node`, each lease held for
    /// `lease_for`: migrates the schema and registers the node (refused while another live
    /// daemon uses the name). Blocking; never call it from an async task.
    pub fn open(url: &str, node: &str, lease_for: Duration) -> Result<PgBackend, PgError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("cairn-postgres")
            .enable_all()
            .build()
            .map_err(PgError::Runtime)?;
        let db = PgQueue::connect(url)?;
        if let Some(warning) = db.plain_text_warning() {
            tracing::warn!("{warning}");
        }
        runtime.block_on(async {
            db.migrate().await?;
            db.register_node(node, lease_for).await
        })?;
        let journal = EventJournal::start(&runtime, db.clone(), lease_for);
        let checkpoints = CheckpointCommitter::start(
            &runtime,
            db.clone(),
            node.to_owned(),
            KEEP_GENERATIONS,
            lease_for,
        );
        Ok(PgBackend {
            db,
            node: node.to_owned(),
            lease_for,
            owner: OwnerLease::new(OWNER_EPOCH),
            leases: Mutex::default(),
            finished: Mutex::default(),
            valid_until: Mutex::default(),
            ending: Mutex::default(),
            letting_go: Mutex::default(),
            latency: Mutex::default(),
            renew_soon: Arc::default(),
            journal,
            checkpoints,
            runtime: Some(runtime),
            inbox: None,
            vouching: false,
            control_judge: std::sync::OnceLock::new(),
            refusals: Mutex::default(),
        })
    }

    /// Take each task's submitter from who the database vouches inserted it (see the `roles`
    /// module), as running tasks as their submitters needs; refused, with what to set up, when
    /// the database's roles do not vouch for them.
    pub fn vouching_for_submitters(mut self) -> Result<PgBackend, super::NoVouching> {
        self.run(self.db.check_vouching())?;
        self.vouching = true;
        Ok(self)
    }

    /// The judge of requests, when tasks run as the submitters the database vouches for. A
    /// daemon that vouches but has no judge yet judges with the strictest rule: only trusted
    /// roles.
    fn judge(&self) -> Option<&ControlJudge> {
        if !self.vouching {
            return None;
        }
        Some(self.control_judge.get_or_init(|| {
            std::sync::Arc::new(
                |request: &ControlRequest, _: Option<&crate::submitter::Submitter>| match &request
                    .asker
                {
                    Some(crate::queue::control::DatabaseAsker::Trusted { .. }) => Ok(()),
                    _ => Err(crate::queue::control::SteeringRefusal::NoRule),
                },
            )
        }))
    }

    /// Set each task's submitter to the one the database vouches for (when vouching).
    fn vouch(&self, tasks: &mut [&mut Task]) -> Result<(), PgError> {
        if !self.vouching || tasks.is_empty() {
            return Ok(());
        }
        let ids: Vec<&str> = tasks.iter().map(|task| task.id().as_str()).collect();
        let vouched = self.run(self.db.vouched(&ids))?;
        for task in tasks.iter_mut() {
            let found = vouched.get(task.id().as_str());
            let vouched = found
                .cloned()
                .unwrap_or(super::Vouched::Nobody { role: None });
            let submitter = vouched.submitter(task.submitted_by.as_ref());
            if submitter.is_none() {
                tracing::warn!(task_id = %task.id(), ?vouched, "the database vouches for no local user as this task's submitter: it runs nothing");
            }
            task.submitted_by = submitter;
        }
        Ok(())
    }

    /// Take task files dropped into the `inbox/` of `local` (this host's queue directory,
    /// absolute, its directories made) into the shared queue: see the `intake` module.
    pub fn with_inbox(mut self, local: QueueDir) -> PgBackend {
        let runtime = self
            .runtime
            .as_ref()
            .expect("the runtime lives until the backend is dropped")
            .handle()
            .clone();
        self.inbox = Some(LocalInbox::new(local, self.db.clone(), runtime));
        self
    }

    /// The statements' pool, for what the trait does not cover (submitting tasks).
    pub fn database(&self) -> &PgQueue {
        &self.db
    }

    /// Run `future` to its end on the backend's runtime (blocking this thread).
    fn run<F: Future>(&self, future: F) -> F::Output {
        self.runtime
            .as_ref()
            .expect("the runtime lives until the backend is dropped")
            .block_on(future)
    }

    /// The PostgreSQL lease behind `lease`, if this owner still holds it with that epoch.
    fn held(&self, lease: &Lease) -> Result<PgLease, QueueError> {
        if !self.owner.holds(&self.owner) {
            return Err(lost(lease, "the queue was released by this owner"));
        }
        match locked(&self.leases).get(lease.task_id()) {
            Some(held) if u64::try_from(held.epoch).ok() == Some(lease.epoch()) => Ok(held.clone()),
            _ => Err(lost(lease, "a newer claim of the task superseded it")),
        }
    }

    /// The trait's error for a statement's: a lost lease also forgets it here.
    fn refused(&self, lease: &Lease, error: PgError) -> QueueError {
        match error {
            PgError::LeaseLost { .. } => {
                let mut leases = locked(&self.leases);
                if leases
                    .get(lease.task_id())
                    .is_some_and(|held| u64::try_from(held.epoch).ok() == Some(lease.epoch()))
                {
                    leases.remove(lease.task_id());
                }
                lost(
                    lease,
                    "it expired or another daemon took the task over (checked by the database)",
                )
            }
            other => backend_error(format!("task {}", lease.task_id()), other),
        }
    }

    /// Read one text column of the row `statement` returns for `task_id`, if any.
    fn text_of(&self, statement: &str, task_id: &str) -> Result<Option<String>, QueueError> {
        self.run(async {
            let client = self.db.client().await?;
            let row = client
                .query_opt(statement, &[&task_id])
                .await
                .during("reading a task")?;
            Ok::<_, PgError>(row.map(|row| row.get::<_, String>(0)))
        })
        .map_err(|e| backend_error(format!("reading task {task_id}"), e))
    }

    /// Ids from a one-column query.
    fn ids(&self, statement: &str, action: &'static str) -> Result<Vec<String>, QueueError> {
        self.run(async {
            let client = self.db.client().await?;
            let rows = client.query(statement, &[]).await.during(action)?;
            Ok::<_, PgError>(rows.iter().map(|row| row.get::<_, String>(0)).collect())
        })
        .map_err(|e| backend_error(action.to_string(), e))
    }

    /// Write the phase state of each entry whose task this owner holds; an entry whose lease
    /// is gone is skipped (logged): the task's new holder writes it.
    fn write_entries(&self, entries: &[ActiveTask]) -> Result<(), QueueError> {
        for entry in entries {
            let held = locked(&self.leases).get(entry.task_id.as_str()).cloned();
            let Some(held) = held else {
                // Finished here a moment ago (its entry leaves next), or lost.
                tracing::debug!(task_id = %entry.task_id, "not writing the work state of a task this daemon does not hold");
                continue;
            };
            let json = serde_json::to_string(entry)
                .map_err(|e| backend_error(format!("encoding task {}", entry.task_id), e))?;
            match self.run(self.db.save_phase_state(&held, &json)) {
                Ok(()) => {}
                Err(PgError::LeaseLost { .. }) => {
                    let lease = self.owner.lease(&entry.task_id, epoch_of(&held));
                    let error = self.refused(
                        &lease,
                        PgError::LeaseLost {
                            task_id: held.task_id.clone(),
                            node: held.node.clone(),
                            epoch: held.epoch,
                        },
                    );
                    tracing::warn!(task_id = %entry.task_id, %error, "the work state of a task was not written");
                }
                Err(e) => {
                    return Err(backend_error(
                        format!("writing the work state of task {}", entry.task_id),
                        e,
                    ))
                }
            }
        }
        Ok(())
    }
}

impl Drop for PgBackend {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which tokio refuses on an async thread; the last owner of
        // the backend may well be one.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

fn lost(lease: &Lease, reason: &'static str) -> QueueError {
    QueueError::LeaseLost(LeaseLost {
        task_id: lease.task_id().to_string(),
        epoch: lease.epoch(),
        reason,
    })
}

fn backend_error(
    what: String,
    source: impl std::error::Error + Send + Sync + 'static,
) -> QueueError {
    QueueError::Backend {
        what,
        source: Box::new(source),
    }
}

fn epoch_of(lease: &PgLease) -> u64 {
    u64::try_from(lease.epoch).unwrap_or(0)
}

/// What a failed record's status makes of the task in `cairn_tasks`.
fn outcome_of(record: &FailedRecord) -> Outcome {
    match record.status.as_str() {
        "budget_exceeded" => Outcome::BudgetExceeded,
        "cancelled" => Outcome::Cancelled,
        _ => Outcome::Failed,
    }
}

/// The claim of control request `id` (its row in `cairn_control`).
fn control_claim(id: i64) -> ControlClaim {
    ControlClaim(format!("cairn_control/{id}"))
}

fn parse_control_claim(claim: &ControlClaim) -> Option<i64> {
    claim.0.strip_prefix("cairn_control/")?.parse().ok()
}

/// The reference [`QueueBackend::put_output`] gives: `cairn_outputs/<task>/<index>`.
fn output_reference(task_id: &str, phase_index: usize) -> String {
    format!("cairn_outputs/{task_id}/{phase_index}")
}

pub(super) fn parse_output_reference(reference: &str) -> Option<(&str, i32)> {
    let rest = reference.strip_prefix("cairn_outputs/")?;
    let (task_id, index) = rest.rsplit_once('/')?;
    Some((task_id, index.parse().ok()?))
}

impl QueueBackend for PgBackend {
    fn owner(&self) -> &OwnerLease {
        &self.owner
    }

    fn shares_queue(&self) -> bool {
        true
    }

    fn node(&self) -> Option<&str> {
        Some(&self.node)
    }

    fn lease_length(&self) -> Option<Duration> {
        Some(self.lease_for)
    }

    fn claim_work(&self, limit: usize, idle: bool) -> Result<Vec<ClaimedWork>, QueueError> {
        if limit == 0 || !self.owner.holds(&self.owner) {
            return Ok(Vec::new());
        }
        if locked(&self.latency).refusing {
            // Said once in the log (and shown by `latency_warning`); a probe keeps measuring.
            self.probe_round_trip();
            return Ok(Vec::new());
        }
        let max = u32::try_from(limit).unwrap_or(u32::MAX);
        // Bounded like a write: a claim that hangs on a silent link would hold off every
        // later claim of this daemon.
        let claimed = self
            .try_within(
                self.lease_for,
                "claiming tasks",
                self.db.claim(&self.node, max, self.lease_for, idle),
            )
            .map_err(|e| backend_error("claiming tasks".to_string(), e))?;
        if let Some(first) = claimed.first() {
            self.note_round_trip(first.sent_at.elapsed());
            // The new leases hold only from their claim's sending: renew them now rather than
            // at the next period, so that their first renewal is not on their critical path.
            self.renew_soon.notify_one();
        }
        let mut work = Vec::with_capacity(claimed.len());
        for claimed in &claimed {
            let held = claimed.lease.clone();
            let task_id = held.task_id.clone();
            let lease = self.owner.lease(&task_id, epoch_of(&held));
            self.holds_until(&task_id, held.epoch, claimed.sent_at + self.lease_for);
            locked(&self.leases).insert(task_id.clone(), held);
            match self.claimed_work(claimed, lease, claimed.phase_state.as_ref()) {
                Ok(claimed) => work.push(claimed),
                Err(error) => {
                    // Validated when it was submitted, so this is damage: hold it for a person
                    // rather than let every daemon claim it again and again.
                    tracing::error!(%task_id, %error, "pausing a claimed task that cannot be read");
                    if let Err(error) = self.hand_back(&task_id, HandBack::Paused) {
                        tracing::warn!(%task_id, %error, "could not pause it");
                    }
                }
            }
        }
        let mut tasks: Vec<&mut Task> = work.iter_mut().map(|w| &mut w.task).collect();
        if let Err(error) = self.vouch(&mut tasks) {
            // Not run without knowing as whom: handed back for a later claim.
            for claimed in &claimed {
                self.let_go(&claimed.lease.task_id);
            }
            return Err(backend_error(
                "reading who submitted the claimed tasks".to_string(),
                error,
            ));
        }
        Ok(work)
    }

    fn work_notices(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<()>> {
        let runtime = self.runtime.as_ref()?;
        let (notices, received) = tokio::sync::mpsc::unbounded_channel();
        runtime.spawn(super::listen::forward_work_notices(
            self.db.clone(),
            notices,
        ));
        Some(received)
    }

    fn drained(&self) -> Result<bool, QueueError> {
        let left = self.ids(
            "SELECT id FROM cairn_tasks WHERE state IN ('queued', 'running') LIMIT 1",
            "looking for unfinished tasks",
        )?;
        Ok(left.is_empty())
    }

    fn renew_leases(&self) -> Result<Vec<String>, QueueError> {
        // Sent also when nothing is held: the node is seen alive (`status --db`, and its name
        // stays taken), and the round trip is measured.
        let held = self.held_now();
        let sent = Instant::now();
        let renewed = self
            .run(async {
                // No answer within the lease says nothing more than a refused connection.
                match tokio::time::timeout(
                    self.lease_for,
                    self.db.renew_held(&self.node, self.lease_for, &held),
                )
                .await
                {
                    Ok(result) => result,
                    Err(_) => Err(PgError::TimedOut {
                        action: "renewing leases",
                        waited: self.lease_for,
                    }),
                }
            })
            .map_err(|e| backend_error("renewing leases".to_string(), e))?;
        self.note_round_trip(sent.elapsed());
        for renewal in &renewed {
            self.holds_until(&renewal.task_id, renewal.epoch, sent + self.lease_for);
        }
        // After the renewal, so that a hand-back waiting for the database never delays it.
        self.retry_letting_go();
        self.forget_old_deadlines();
        let ending = locked(&self.ending).clone();
        Ok(judge_renewal(
            &held,
            &renewed,
            &mut locked(&self.leases),
            &ending,
        ))
    }

    fn lease_deadlines(&self) -> Vec<(String, Instant)> {
        let leases = locked(&self.leases);
        let valid = locked(&self.valid_until);
        leases
            .iter()
            .map(|(task_id, held)| {
                let until = valid
                    .get(task_id)
                    .filter(|(epoch, _)| *epoch == held.epoch)
                    .map(|(_, until)| *until)
                    // Unknown: judge it as due now rather than trust it.
                    .unwrap_or_else(Instant::now);
                (task_id.clone(), until)
            })
            .collect()
    }

    fn renewal_wanted(&self) -> Option<Arc<tokio::sync::Notify>> {
        Some(Arc::clone(&self.renew_soon))
    }

    fn renewed_tasks(&self) -> Vec<String> {
        locked(&self.leases).keys().cloned().collect()
    }

    fn let_go(&self, task_id: &str) {
        let Some(held) = locked(&self.leases).remove(task_id) else {
            return;
        };
        tracing::info!(
            task_id,
            epoch = held.epoch,
            "letting the task's lease go: this daemon does not run it"
        );
        locked(&self.letting_go).push((held, HandBack::RetryAfter(Duration::ZERO)));
    }

    fn latency_warning(&self) -> Option<String> {
        locked(&self.latency).warning(self.lease_for)
    }

    fn holds(&self, task_id: &str) -> bool {
        self.owner.holds(&self.owner) && locked(&self.leases).contains_key(task_id)
    }

    fn hand_back(&self, task_id: &str, how: HandBack) -> Result<(), QueueError> {
        let Some(held) = locked(&self.leases).get(task_id).cloned() else {
            return Err(QueueError::LeaseLost(LeaseLost {
                task_id: task_id.to_string(),
                epoch: 0,
                reason: "this daemon no longer holds the task",
            }));
        };
        let lease = self.owner.lease(task_id, epoch_of(&held));
        self.flush_events();
        locked(&self.ending).insert(task_id.to_string());
        let result = self.write_hand_back(&held, how);
        locked(&self.ending).remove(task_id);
        match result {
            Ok(()) => {
                locked(&self.leases).remove(task_id);
                Ok(())
            }
            Err(error @ PgError::LeaseLost { .. }) => Err(self.refused(&lease, error)),
            Err(error) => {
                // Never hold a lease for a task nobody here runs: stop renewing it, and hand
                // it back later while it holds (or let it expire).
                if let Some(held) = locked(&self.leases).remove(task_id) {
                    locked(&self.letting_go).push((held, how));
                }
                Err(backend_error(format!("handing task {task_id} back"), error))
            }
        }
    }

    fn claim(&self, task_id: &str) -> Result<Lease, QueueError> {
        if !self.owner.holds(&self.owner) {
            return Err(QueueError::NotOwner {
                what: format!("the claim of task {task_id}"),
            });
        }
        let sent = Instant::now();
        let claimed = self
            .run(self.claim_one(task_id))
            .map_err(|e| backend_error(format!("claiming task {task_id}"), e))?;
        let Some(held) = claimed else {
            return Err(QueueError::LeaseLost(LeaseLost {
                task_id: task_id.to_string(),
                epoch: 0,
                reason: "another daemon holds the task's lease, or the task is not claimable",
            }));
        };
        let lease = self.owner.lease(task_id, epoch_of(&held));
        self.holds_until(task_id, held.epoch, sent + self.lease_for);
        locked(&self.leases).insert(task_id.to_string(), held);
        self.renew_soon.notify_one();
        Ok(lease)
    }

    fn renew(&self, lease: &Lease) -> Result<(), QueueError> {
        let held = self.held(lease)?;
        let sent = Instant::now();
        let renewed = self
            .run(
                self.db
                    .renew_held(&self.node, self.lease_for, &self.held_now()),
            )
            .map_err(|e| backend_error("renewing leases".to_string(), e))?;
        for renewal in &renewed {
            self.holds_until(&renewal.task_id, renewal.epoch, sent + self.lease_for);
        }
        let mut leases = locked(&self.leases);
        for renewal in &renewed {
            if let Some(mine) = leases.get_mut(&renewal.task_id) {
                if mine.epoch == renewal.epoch {
                    mine.expires_at = renewal.expires_at;
                }
            }
        }
        drop(leases);
        if renewed
            .iter()
            .any(|r| r.task_id == held.task_id && r.epoch == held.epoch)
        {
            Ok(())
        } else {
            Err(self.refused(
                lease,
                PgError::LeaseLost {
                    task_id: held.task_id,
                    node: held.node,
                    epoch: held.epoch,
                },
            ))
        }
    }

    fn release(&self) {
        self.flush_events();
        self.owner.release();
        locked(&self.leases).clear();
        locked(&self.letting_go).clear();
        if let Err(error) = self.run(self.db.release_all(&self.node)) {
            tracing::warn!(%error, "could not hand the leases back; they expire instead");
        }
    }

    fn clean_after_crash(&self) -> io::Result<Vec<String>> {
        // A statement cut short by a crash is rolled back by the database: nothing is left.
        Ok(Vec::new())
    }

    fn load_work(&self) -> Result<CurrentWork, LoadError> {
        // Nothing is this daemon's at start: what an earlier process under this name held is
        // claimed again once its lease expired (a crash, counted), like any other daemon's,
        // with the state it left ([`claim_work`](QueueBackend::claim_work)).
        Ok(CurrentWork::default())
    }

    fn recover_intake(&self) -> IntakeReport {
        self.inbox
            .as_ref()
            .map(LocalInbox::recover)
            .unwrap_or_default()
    }

    fn set_admission(&self, admission: std::sync::Arc<crate::limits::Admission>) {
        if let Some(inbox) = &self.inbox {
            inbox.set_admission(admission);
        }
    }

    fn scan_intake(&self, hints: Vec<QueueHint>, limit: usize) -> IntakeReport {
        self.inbox
            .as_ref()
            .map(|inbox| inbox.scan(hints, limit))
            .unwrap_or_default()
    }

    fn set_control_judge(&self, judge: ControlJudge) {
        let _ = self.control_judge.set(judge);
    }

    fn waiting_in_intake(&self, task_id: &str) -> bool {
        self.inbox
            .as_ref()
            .is_some_and(|inbox| inbox.holds(task_id))
    }

    fn task(&self, task_id: &str) -> Result<Task, QueueError> {
        let what = format!("the definition of task {task_id} in cairn_tasks");
        let text = self
            .text_of(
                "SELECT definition::text FROM cairn_tasks WHERE id = $1",
                task_id,
            )?
            .ok_or_else(|| QueueError::MissingDefinition { what: what.clone() })?;
        let mut task = Task::parse_stored(text.as_bytes()).map_err(|e| QueueError::Unreadable {
            what,
            problem: e.to_string(),
        })?;
        // The id names the row just read, so it is one; a name that is not is refused.
        task.id = Some(TaskId::parse(task_id).map_err(|e| QueueError::Unreadable {
            what: format!("task {task_id} in cairn_tasks"),
            problem: format!("task id {e}"),
        })?);
        self.vouch(&mut [&mut task])
            .map_err(|e| backend_error(format!("reading who submitted task {task_id}"), e))?;
        Ok(task)
    }

    fn accepted_ids(&self) -> Result<Vec<String>, QueueError> {
        self.ids(
            "SELECT id FROM cairn_tasks ORDER BY id",
            "listing the tasks",
        )
    }

    fn accepted_at(&self, task_id: &str) -> Option<SystemTime> {
        let at: Option<DateTime<Utc>> = self
            .run(async {
                let client = self.db.client().await?;
                let row = client
                    .query_opt(
                        "SELECT submitted_at FROM cairn_tasks WHERE id = $1",
                        &[&task_id],
                    )
                    .await
                    .during("reading when a task was submitted")?;
                Ok::<_, PgError>(row.map(|row| row.get(0)))
            })
            .ok()
            .flatten();
        at.map(SystemTime::from)
    }

    fn finished_ids(&self) -> Result<HashSet<String>, QueueError> {
        Ok(self
            .ids("SELECT task_id FROM cairn_records", "listing the records")?
            .into_iter()
            .collect())
    }

    fn has_record(&self, task_id: &str) -> Result<bool, QueueError> {
        Ok(self
            .text_of(
                "SELECT task_id FROM cairn_records WHERE task_id = $1",
                task_id,
            )?
            .is_some())
    }

    fn failed_record(&self, task_id: &str) -> Result<Option<FailedRecord>, QueueError> {
        let Some(text) = self.text_of(
            "SELECT record::text FROM cairn_records WHERE task_id = $1 AND status <> 'done'",
            task_id,
        )?
        else {
            return Ok(None);
        };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| QueueError::Unreadable {
                what: format!("the record of task {task_id} in cairn_records"),
                problem: format!("not a task record: {e}"),
            })
    }

    fn start_point(&self, task_id: &str) -> Result<Option<StartPoint>, QueueError> {
        let what = || format!("the start point of task {task_id} in cairn_tasks");
        let Some(text) = self
            .run(self.db.start_point(task_id))
            .map_err(|e| backend_error(what(), e))?
        else {
            return Ok(None);
        };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| QueueError::Unreadable {
                what: what(),
                problem: e.to_string(),
            })
    }

    fn read_output(&self, reference: &str) -> Result<Option<Value>, QueueError> {
        let Some((task_id, index)) = parse_output_reference(reference) else {
            return Err(QueueError::Unreadable {
                what: reference.to_string(),
                problem: "not a reference to a stored output".to_string(),
            });
        };
        let text: Option<String> = self
            .run(async {
                let client = self.db.client().await?;
                let row = client
                    .query_opt(
                        "SELECT output::text FROM cairn_outputs
                         WHERE task_id = $1 AND phase_index = $2",
                        &[&task_id, &index],
                    )
                    .await
                    .during("reading a phase output")?;
                Ok::<_, PgError>(row.map(|row| row.get(0)))
            })
            .map_err(|e| backend_error(format!("reading {reference}"), e))?;
        text.map(|text| serde_json::from_str(&text))
            .transpose()
            .map_err(|e| QueueError::Unreadable {
                what: format!("reading {reference}"),
                problem: e.to_string(),
            })
    }

    fn checkpoint_files(&self) -> Option<&CheckpointStore> {
        None
    }

    fn latest_checkpoint(&self, task_id: &str) -> Result<Option<LoadedCheckpoint>, QueueError> {
        let reading = || format!("reading the checkpoints of task {task_id}");
        // The newest alone first: a resume moves one generation's bytes, not every kept one's.
        let Some(newest) = self
            .run(self.db.latest_checkpoint(task_id))
            .map_err(|e| backend_error(reading(), e))?
        else {
            return Ok(None);
        };
        if let Ok(checkpoint) = decode_checkpoint(&newest.bytes) {
            return Ok(Some(LoadedCheckpoint {
                checkpoint,
                key: format!("cairn_checkpoints/{task_id}/{}", newest.generation),
                skipped: Vec::new(),
            }));
        }
        // It does not decode: go through every generation, reporting each that does not.
        let stored = self
            .run(self.db.checkpoints(task_id))
            .map_err(|e| backend_error(reading(), e))?;
        let mut skipped = Vec::new();
        let mut first_error = None;
        for generation in stored {
            let key = format!("cairn_checkpoints/{task_id}/{}", generation.generation);
            match decode_checkpoint(&generation.bytes) {
                Ok(checkpoint) => {
                    return Ok(Some(LoadedCheckpoint {
                        checkpoint,
                        key,
                        skipped,
                    }))
                }
                Err(error) => {
                    tracing::warn!(task_id, key = %key, %error, "skipping an unusable checkpoint");
                    skipped.push((key.clone(), error.to_string()));
                    first_error.get_or_insert((key, error));
                }
            }
        }
        match first_error {
            Some((key, source)) => Err(StoreError::Corrupt { key, source }.into()),
            None => Ok(None),
        }
    }

    fn write_work_entries(
        &self,
        owner: &OwnerLease,
        changed: &[ActiveTask],
        _removed: &[TaskId],
    ) -> Result<(), QueueError> {
        if !self.owner.holds(owner) {
            return Err(QueueError::NotOwner {
                what: "the work state".to_string(),
            });
        }
        // A task leaves the work state with its final record (`finish` ends its row's phase
        // state in the same transaction), so there is nothing to remove here.
        self.write_entries(changed)
    }

    fn put_output(
        &self,
        lease: &Lease,
        phase_index: usize,
        bytes: &[u8],
    ) -> Result<String, QueueError> {
        let held = self.held(lease)?;
        let json = std::str::from_utf8(bytes)
            .map_err(|e| backend_error(format!("the output of task {}", lease.task_id()), e))?;
        let index = u32::try_from(phase_index).map_err(|_| QueueError::Unreadable {
            what: format!("the output of task {}", lease.task_id()),
            problem: format!("phase index {phase_index} does not fit its column"),
        })?;
        // The phase's name is read from the task's definition by the statement.
        let mut pause = RETRY_FIRST;
        loop {
            let left = self.try_limit(&held, pause);
            match self.try_within(
                left,
                "saving a phase output",
                self.db.save_output(&held, index, "", json),
            ) {
                Ok(()) => break,
                Err(e) if self.try_again(&e, &held.task_id, held.epoch, &mut pause) => {}
                Err(e) => return Err(self.refused(lease, e)),
            }
        }
        Ok(output_reference(lease.task_id(), phase_index))
    }

    fn finish(&self, lease: &Lease, record: &TaskRecord) -> Result<(), QueueError> {
        let held = self.held(lease)?;
        let (outcome, bytes) = match record {
            TaskRecord::Done(done) => (Outcome::Done, to_record_bytes(done)),
            TaskRecord::Failed(failed) => (outcome_of(failed), to_record_bytes(failed)),
        };
        let json = String::from_utf8_lossy(&bytes);
        // The task's events so far land before the record ends the lease they are fenced by.
        self.flush_events();
        locked(&self.ending).insert(held.task_id.clone());
        let result = self.write_record(&held, outcome, &json);
        locked(&self.ending).remove(&held.task_id);
        result.map_err(|e| self.refused(lease, e))?;
        // The record ended the lease: its closing event is fenced by the record's epoch. (A
        // renewal that crossed the record does not judge it lost, see `ending`.)
        let ended = locked(&self.leases)
            .remove(lease.task_id())
            .filter(|ended| ended.epoch == held.epoch)
            .unwrap_or(held);
        locked(&self.finished).insert(lease.task_id().to_string(), ended);
        Ok(())
    }

    fn archive_failed(&self, lease: &Lease, _record: &FailedRecord) -> Result<(), QueueError> {
        // The record is the task's one row in cairn_records: it moves to its history whole.
        let held = self.held(lease)?;
        self.run(self.db.archive_record(&held))
            .map_err(|e| self.refused(lease, e))
    }

    fn save_checkpoint(
        &self,
        lease: &Lease,
        checkpoint: &mut IterationCheckpoint<&serde_json::value::RawValue>,
    ) -> Result<SavedCheckpoint, QueueError> {
        let started = Instant::now();
        let held = self.held(lease)?;
        // Encoded once: every try sends the same bytes under the same generation.
        let write = Arc::new(
            CheckpointWrite::encode(&held, checkpoint).map_err(|e| self.refused(lease, e))?,
        );
        // A save that fails while the lease holds is tried again (the iteration is not lost);
        // only a lost lease or a database gone for the rest of it ends the attempt.
        let mut pause = RETRY_FIRST;
        loop {
            let left = self.try_limit(&held, pause);
            match self.try_within(
                left,
                "saving a checkpoint",
                self.checkpoints.save(Arc::clone(&write)),
            ) {
                Ok(()) => break,
                Err(e) if self.try_again(&e, lease.task_id(), held.epoch, &mut pause) => {}
                Err(e) => return Err(self.refused(lease, e)),
            }
        }
        if let Some(mine) = locked(&self.leases).get_mut(lease.task_id()) {
            if mine.epoch == held.epoch {
                mine.last_generation = write.generation;
            }
        }
        Ok(write.saved(started.elapsed()))
    }

    fn checkpoint_fence(&self, lease: &Lease) -> Result<Arc<dyn WriteFence>, QueueError> {
        self.held(lease)?;
        Ok(Arc::new(OwnerFence {
            owner: self.owner.clone(),
            task_id: lease.task_id().to_string(),
        }))
    }

    fn take_control(&self) -> Result<Vec<(ControlClaim, ControlRequest)>, QueueError> {
        if !self.owner.holds(&self.owner) {
            return Ok(Vec::new());
        }
        let requests = self
            .run(
                self.db
                    .take_control(&self.node, self.judge(), &self.refusals),
            )
            .map_err(|e| backend_error("handling control requests".to_string(), e))?;
        Ok(requests
            .into_iter()
            .map(|(id, request)| (control_claim(id), request))
            .collect())
    }

    fn remove_control(&self, owner: &OwnerLease, claim: &ControlClaim) -> Result<(), QueueError> {
        if !self.owner.holds(owner) {
            return Err(QueueError::NotOwner {
                what: claim.to_string(),
            });
        }
        let Some(id) = parse_control_claim(claim) else {
            return Err(QueueError::Unreadable {
                what: claim.to_string(),
                problem: "not a control request of this backend".to_string(),
            });
        };
        let outcome = "taken by the daemon running the task";
        self.run(self.db.mark_control_handled(id, &self.node, outcome))
            .map_err(|e| backend_error(format!("marking {claim} handled"), e))
    }

    fn append_event(&self, task_id: &str, event: Event) {
        let held = locked(&self.leases).get(task_id).cloned();
        let (held, after_record) = match held {
            Some(held) => (held, false),
            None => match locked(&self.finished).remove(task_id) {
                Some(ended) => (ended, true),
                None => {
                    tracing::debug!(
                        task_id,
                        "an event of a task this daemon does not hold is not journaled"
                    );
                    return;
                }
            },
        };
        match serde_json::to_string(&event) {
            Ok(json) => self.journal.append(held, json, after_record),
            Err(error) => tracing::warn!(task_id, %error, "an event could not be encoded"),
        }
    }

    fn flush_events(&self) {
        self.run(self.journal.flushed());
    }
}

impl PgBackend {
    /// What the owner needs of one claimed task: its definition and where it stood.
    fn claimed_work(
        &self,
        claimed: &super::lease::ClaimedTask,
        lease: Lease,
        state: Option<&String>,
    ) -> Result<ClaimedWork, QueueError> {
        let task_id = &claimed.lease.task_id;
        let what = format!("the definition of task {task_id} in cairn_tasks");
        let mut task = Task::parse_stored(claimed.definition.as_bytes()).map_err(|e| {
            QueueError::Unreadable {
                what: what.clone(),
                problem: e.to_string(),
            }
        })?;
        task.id = Some(TaskId::parse(task_id).map_err(|e| QueueError::Unreadable {
            what,
            problem: format!("task id {e}"),
        })?);
        let entry = state
            .map(|text| serde_json::from_str::<ActiveTask>(text))
            .transpose()
            .map_err(|e| QueueError::Unreadable {
                what: format!("the phase state of task {task_id} in cairn_tasks"),
                problem: e.to_string(),
            })?;
        let quarantine = claimed
            .must_quarantine()
            .then(|| u32::try_from(claimed.crash_count).unwrap_or(0));
        let taken_over = claimed
            .previous
            .as_ref()
            .filter(|_| claimed.taken_over)
            .map(|(node, epoch)| crate::queue::backend::TakeOver {
                from_node: node.clone(),
                from_epoch: *epoch,
                verdict: if claimed.on_trial {
                    "suspect"
                } else if claimed.crash_count == 0 {
                    "cleared"
                } else {
                    "crash"
                },
                crashes: u32::try_from(claimed.crash_count).unwrap_or(0),
                limit: u32::try_from(claimed.crash_limit).unwrap_or(0),
            });
        Ok(ClaimedWork {
            task,
            lease,
            entry,
            quarantine,
            on_trial: claimed.on_trial,
            taken_over,
        })
    }

    /// Claim `task_id` for this node: its new lease, or `None` when it is not claimable.
    async fn claim_one(&self, task_id: &str) -> Result<Option<PgLease>, PgError> {
        let client = self.db.client().await?;
        client
            .execute(super::lease::JUDGE_EXPIRED, &[])
            .await
            .during("judging expired leases")?;
        let row = client
            .query_opt(
                CLAIM_ONE,
                &[&task_id, &self.node, &self.lease_for.as_secs_f64()],
            )
            .await
            .during("claiming a task")?;
        let Some(row) = row else {
            return Ok(None);
        };
        // Read after the claim committed: no write of an earlier holder can land after it.
        let last: Option<i64> = client
            .query_one(
                "SELECT max(generation) FROM cairn_checkpoints WHERE task_id = $1",
                &[&task_id],
            )
            .await
            .during("reading the claimed task's checkpoint generation")?
            .get(0);
        Ok(Some(PgLease {
            task_id: task_id.to_string(),
            node: self.node.clone(),
            epoch: row.get(0),
            expires_at: row.get(1),
            last_generation: last.unwrap_or(0),
        }))
    }
}

/// The checkpoint fence of a database task: the owner still holds. The lease itself is
/// checked by the database in each save's statement.
#[derive(Debug)]
struct OwnerFence {
    owner: OwnerLease,
    task_id: String,
}

impl WriteFence for OwnerFence {
    fn check(&self) -> Result<(), StoreError> {
        if self.owner.holds(&self.owner) {
            Ok(())
        } else {
            Err(StoreError::Fenced {
                task_id: self.task_id.clone(),
                reason: "the queue was released by this owner".to_string(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::postgres::lease::RenewedLease;

    fn lease(task_id: &str, epoch: i64) -> PgLease {
        PgLease {
            task_id: task_id.to_owned(),
            node: "a".to_owned(),
            epoch,
            expires_at: DateTime::<Utc>::UNIX_EPOCH,
            last_generation: 0,
        }
    }

    fn renewal(task_id: &str, epoch: i64) -> RenewedLease {
        RenewedLease {
            task_id: task_id.to_owned(),
            epoch,
            expires_at: DateTime::<Utc>::UNIX_EPOCH + chrono::Duration::seconds(30),
        }
    }

    #[test]
    fn a_round_trip_is_warned_of_at_a_quarter_of_the_lease_and_claims_refused_past_what_holds() {
        let lease = Duration::from_secs(3);
        let ms = Duration::from_millis;
        let mut latency = Latency::default();
        for _ in 0..ROUND_TRIPS_KEPT {
            latency.note(ms(20), lease);
        }
        assert_eq!(latency.warning(lease), None);
        assert!(!latency.refusing);
        // 600 ms: a fifth of the lease, no warning; 800 ms: over a quarter, warned, still
        // claiming (2 x 800 ms + 500 ms < 3 s).
        for _ in 0..ROUND_TRIPS_KEPT {
            latency.note(ms(600), lease);
        }
        assert_eq!(latency.warning(lease), None);
        for _ in 0..ROUND_TRIPS_KEPT {
            latency.note(ms(800), lease);
        }
        assert!(latency.warning(lease).unwrap().contains("800 ms"));
        assert!(!latency.refusing);
        // 1.3 s: a claim's lease would run out before its first renewal came back.
        for _ in 0..ROUND_TRIPS_KEPT {
            latency.note(ms(1300), lease);
        }
        assert!(latency.refusing);
        assert!(latency
            .warning(lease)
            .unwrap()
            .starts_with("claiming nothing"));
        // One fast answer is no trend; a run of them is.
        latency.note(ms(20), lease);
        assert!(latency.refusing);
        for _ in 0..ROUND_TRIPS_KEPT {
            latency.note(ms(20), lease);
        }
        assert!(!latency.refusing);
        assert_eq!(latency.warning(lease), None);
    }

    #[test]
    fn a_renewal_crossing_a_final_record_does_not_judge_its_lease_lost() {
        // The record ended the lease in the database before the renewal ran there, but its
        // answer came back before `finish` took the lease out of the map.
        let mut leases: HashMap<String, PgLease> = [("finishing", 2), ("lost", 1)]
            .into_iter()
            .map(|(id, epoch)| (id.to_owned(), lease(id, epoch)))
            .collect();
        let held = vec![("finishing".to_owned(), 2), ("lost".to_owned(), 1)];
        let ending: HashSet<String> = ["finishing".to_owned()].into_iter().collect();
        let lost = judge_renewal(&held, &[], &mut leases, &ending);
        assert_eq!(lost, ["lost"]);
        assert!(leases.contains_key("finishing"), "left for finish to end");
    }

    #[test]
    fn a_renewal_judges_only_the_leases_it_was_sent_for() {
        let mut leases: HashMap<String, PgLease> = [
            ("renewed", 1),
            ("expired", 1),
            ("claimed-meanwhile", 1),
            ("claimed-anew", 4),
        ]
        .into_iter()
        .map(|(id, epoch)| (id.to_owned(), lease(id, epoch)))
        .collect();
        // Sent before "claimed-meanwhile" was claimed and before "claimed-anew" was claimed
        // again (epoch 3 then), and for "handed-back", let go of since.
        let held: Vec<(String, i64)> = [("renewed", 1), ("expired", 1), ("claimed-anew", 3)]
            .into_iter()
            .chain([("handed-back", 2)])
            .map(|(id, epoch)| (id.to_owned(), epoch))
            .collect();
        let lost = judge_renewal(
            &held,
            &[renewal("renewed", 1)],
            &mut leases,
            &HashSet::new(),
        );
        assert_eq!(lost, ["expired"]);
        let mut left: Vec<&str> = leases.keys().map(String::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["claimed-anew", "claimed-meanwhile", "renewed"]);
        assert_eq!(
            leases["renewed"].expires_at,
            renewal("renewed", 1).expires_at
        );
        assert_eq!(
            leases["claimed-meanwhile"].expires_at,
            DateTime::<Utc>::UNIX_EPOCH
        );
    }
}
