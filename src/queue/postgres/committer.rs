//! Group commit of checkpoints: the saves of every task that arrived while the previous commit
//! was in flight are stored together, in one statement ([`PgQueue::save_checkpoints`]): one
//! transaction and one WAL flush for all of them, as the file queue's commit log makes one
//! fdatasync for every save waiting. Each row is still fenced by its own lease: a lease lost
//! by one task refuses that task's checkpoint only, and the others commit.
//!
//! One task on the backend's runtime gathers the saves and starts their commits, at most
//! [`IN_FLIGHT`] at once; each save waits for its own answer. A waiter that gave up (its try
//! timed out) is left out of the next batch, and one statement never names a task twice (a
//! task's later try waits for the next batch). A try again while an earlier one is still in
//! flight stores the same generation under the same epoch: the second waits for the first's
//! row lock and then overwrites it with the same bytes.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Runtime;
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::connect::PgQueue;
use super::error::PgError;
use super::fenced::CheckpointWrite;

/// The most checkpoints one commit stores, and (once it holds one) the most bytes: a bound on
/// one statement's size and on what a failed commit makes every waiter try again.
const MOST_ROWS: usize = 512;
const MOST_BYTES: usize = 32 << 20;

/// Commits in flight at once. Two keep the server busy while the answers of one go back and
/// the next saves arrive (a third gained nothing measurable), and leave the rest of the pool
/// (4 connections) to renewals, claims and the journal.
const IN_FLIGHT: usize = 2;

/// A save waiting for its commit.
struct Pending {
    write: Arc<CheckpointWrite>,
    answer: oneshot::Sender<Result<(), PgError>>,
}

/// The sending side of the committer's task.
#[derive(Debug)]
pub(super) struct CheckpointCommitter {
    saves: mpsc::UnboundedSender<Pending>,
}

impl CheckpointCommitter {
    /// Start the committer's task on `runtime` for node `node`'s saves, keeping
    /// `keep_generations` older generations of each task; it ends when the committer is
    /// dropped. A commit gets at most `answer_within` for its answer (a silent link must not
    /// hold every later save).
    pub(super) fn start(
        runtime: &Runtime,
        db: PgQueue,
        node: String,
        keep_generations: u32,
        answer_within: Duration,
    ) -> CheckpointCommitter {
        let (saves, mut arrived) = mpsc::unbounded_channel::<Pending>();
        let in_flight = Arc::new(Semaphore::new(IN_FLIGHT));
        let node: Arc<str> = node.into();
        runtime.spawn(async move {
            let mut waiting: VecDeque<Pending> = VecDeque::new();
            loop {
                let Ok(permit) = Arc::clone(&in_flight).acquire_owned().await else {
                    break;
                };
                if waiting.is_empty() {
                    match arrived.recv().await {
                        Some(pending) => waiting.push_back(pending),
                        None => break,
                    }
                }
                // Everything that arrived while the commits before were in flight goes in
                // this one.
                while let Ok(pending) = arrived.try_recv() {
                    waiting.push_back(pending);
                }
                let batch = next_batch(&mut waiting);
                if batch.is_empty() {
                    continue;
                }
                let (db, node) = (db.clone(), Arc::clone(&node));
                tokio::spawn(async move {
                    commit(&db, &node, keep_generations, answer_within, batch).await;
                    drop(permit);
                });
            }
        });
        CheckpointCommitter { saves }
    }

    /// Store `write` with the next commit: `Ok` once it is durable, [`PgError::LeaseLost`]
    /// when its lease no longer holds (nothing of it written), another error when its commit
    /// failed as a whole.
    pub(super) async fn save(&self, write: Arc<CheckpointWrite>) -> Result<(), PgError> {
        let (answer, answered) = oneshot::channel();
        let gone = || PgError::TimedOut {
            action: "saving a checkpoint (the backend is closing)",
            waited: Duration::ZERO,
        };
        self.saves
            .send(Pending {
                write: Arc::clone(&write),
                answer,
            })
            .map_err(|_| gone())?;
        answered.await.unwrap_or_else(|_| Err(gone()))
    }
}

/// Take the next commit's saves out of `waiting`, in their order of arrival: those whose
/// waiter is still there, one per task (a task's later save stays for the commit after), up to
/// [`MOST_ROWS`] and [`MOST_BYTES`] (the first always goes, however large).
fn next_batch(waiting: &mut VecDeque<Pending>) -> Vec<Pending> {
    let mut batch = Vec::new();
    let mut tasks = HashSet::new();
    let mut bytes = 0;
    let mut later = VecDeque::new();
    while let Some(pending) = waiting.pop_front() {
        if pending.answer.is_closed() {
            continue;
        }
        let full = batch.len() == MOST_ROWS
            || (!batch.is_empty() && bytes + pending.write.bytes.len() > MOST_BYTES);
        if full || tasks.contains(&pending.write.task_id) {
            later.push_back(pending);
            continue;
        }
        tasks.insert(pending.write.task_id.clone());
        bytes += pending.write.bytes.len();
        batch.push(pending);
    }
    *waiting = later;
    batch
}

/// Commit `batch` in one statement and answer each save.
async fn commit(
    db: &PgQueue,
    node: &str,
    keep_generations: u32,
    answer_within: Duration,
    mut batch: Vec<Pending>,
) {
    // In the order of the task ids, as a renewal names them: statements that lock several
    // task rows take the locks in one order, so they do not deadlock each other.
    batch.sort_by(|a, b| a.write.task_id.cmp(&b.write.task_id));
    let writes: Vec<&CheckpointWrite> = batch.iter().map(|p| p.write.as_ref()).collect();
    let started = std::time::Instant::now();
    let stored = match tokio::time::timeout(
        answer_within,
        db.save_checkpoints(node, &writes, keep_generations),
    )
    .await
    {
        Ok(result) => result,
        Err(_) => Err(PgError::TimedOut {
            action: "saving checkpoints",
            waited: answer_within,
        }),
    };
    tracing::debug!(
        checkpoints = writes.len(),
        bytes = writes.iter().map(|w| w.bytes.len()).sum::<usize>(),
        elapsed_us = started.elapsed().as_micros() as u64,
        "committed a batch of checkpoints"
    );
    match stored {
        Ok(stored) => {
            for (pending, stored) in batch.into_iter().zip(stored) {
                let answer = if stored {
                    Ok(())
                } else {
                    Err(pending.write.lease_lost(node))
                };
                let _ = pending.answer.send(answer);
            }
        }
        Err(error) => {
            let error = Arc::new(error);
            for pending in batch {
                let _ = pending.answer.send(Err(PgError::Batch(Arc::clone(&error))));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(task_id: &str, bytes: usize) -> (Pending, oneshot::Receiver<Result<(), PgError>>) {
        let (answer, answered) = oneshot::channel();
        let write = CheckpointWrite {
            task_id: task_id.to_owned(),
            epoch: 1,
            generation: 1,
            bytes: vec![0; bytes],
            iterations: 1,
        };
        (
            Pending {
                write: Arc::new(write),
                answer,
            },
            answered,
        )
    }

    fn ids(batch: &[Pending]) -> Vec<&str> {
        batch.iter().map(|p| p.write.task_id.as_str()).collect()
    }

    #[test]
    fn a_batch_names_each_task_once_and_leaves_out_waiters_that_gave_up() {
        let (a1, _a1) = pending("a", 10);
        let (b, b_gone) = pending("b", 10);
        let (a2, _a2) = pending("a", 10);
        let (c, _c) = pending("c", 10);
        drop(b_gone);
        let mut waiting: VecDeque<Pending> = [a1, b, a2, c].into_iter().collect();
        let first = next_batch(&mut waiting);
        assert_eq!(ids(&first), ["a", "c"]);
        assert_eq!(
            waiting.len(),
            1,
            "a's second save waits for the next commit"
        );
        assert_eq!(ids(&next_batch(&mut waiting)), ["a"]);
        assert!(waiting.is_empty());
    }

    #[test]
    fn a_batch_stops_at_its_byte_bound_but_always_takes_one() {
        let (big, _big) = pending("big", MOST_BYTES + 1);
        let (small, _small) = pending("small", 1);
        let mut waiting: VecDeque<Pending> = [big, small].into_iter().collect();
        assert_eq!(ids(&next_batch(&mut waiting)), ["big"]);
        assert_eq!(ids(&next_batch(&mut waiting)), ["small"]);
        let (many, _answered): (Vec<_>, Vec<_>) = (0..=MOST_ROWS)
            .map(|i| pending(&format!("t{i}"), 1))
            .unzip();
        let mut waiting: VecDeque<Pending> = many.into_iter().collect();
        assert_eq!(next_batch(&mut waiting).len(), MOST_ROWS);
        assert_eq!(
            waiting.len(),
            1,
            "the one over the bound waits for the next commit"
        );
    }
}
