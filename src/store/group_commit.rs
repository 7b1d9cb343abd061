//! Group commit of directory fsyncs: one `fsync` of a directory makes every rename into it
//! that happened before the fsync started durable, so concurrent writers share one.
//!
//! Each writer renames its file, then joins the directory's open round. The first writer to
//! find no sync running becomes the round's leader: it closes the round (later arrivals open
//! the next one), syncs, and publishes the outcome to every member. A writer returns only once
//! a sync that started after its rename has finished, and it gets that sync's error if it
//! failed. Nobody waits on a timer: a lone writer syncs at once, and under load the rounds
//! grow by themselves while the previous sync runs.

use std::io;
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};

/// The outcome of one round's sync, shared by its members (an `io::Error` cannot be cloned).
type RoundOutcome = Result<(), (io::ErrorKind, String)>;

/// The rounds of one directory.
#[derive(Debug, Default)]
pub(crate) struct GroupCommit {
    state: Mutex<State>,
    /// Signalled whenever a round ends.
    round_ended: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// The round that new members join; its sync has not started.
    open: Arc<Round>,
    /// Whether a leader is syncing (a closed round) right now.
    syncing: bool,
}

#[derive(Debug, Default)]
struct Round {
    outcome: OnceLock<RoundOutcome>,
}

impl GroupCommit {
    /// Return once a `sync` that started after this call began has succeeded (or with its
    /// error). `sync` is run by whichever member leads the round.
    pub(super) fn barrier(&self, sync: impl FnOnce() -> io::Result<()>) -> io::Result<()> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let round = Arc::clone(&state.open);
        loop {
            if let Some(outcome) = round.outcome.get() {
                return outcome
                    .clone()
                    .map_err(|(kind, message)| io::Error::new(kind, message));
            }
            if !state.syncing {
                // Every closed round has its outcome once `syncing` is false, so a round
                // without one is still the open round: this member leads it.
                state.syncing = true;
                state.open = Arc::default();
                drop(state);
                let result = sync();
                let shared = match &result {
                    Ok(()) => Ok(()),
                    Err(err) => Err((err.kind(), err.to_string())),
                };
                let _ = round.outcome.set(shared);
                let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                state.syncing = false;
                drop(state);
                self.round_ended.notify_all();
                return result;
            }
            state = self
                .round_ended
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::GroupCommit;

    #[test]
    fn a_lone_writer_syncs_itself() {
        let group = GroupCommit::default();
        let syncs = AtomicUsize::new(0);
        for _ in 0..3 {
            group
                .barrier(|| {
                    syncs.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                })
                .unwrap();
        }
        assert_eq!(syncs.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn concurrent_writers_share_syncs_and_each_waits_for_one_that_started_after_it() {
        let group = GroupCommit::default();
        // Each "write" bumps `written`; a sync records how many writes it covers.
        let written = AtomicUsize::new(0);
        let durable = AtomicUsize::new(0);
        let syncs = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..16 {
                s.spawn(|| {
                    for _ in 0..50 {
                        let mine = written.fetch_add(1, Ordering::SeqCst) + 1;
                        group
                            .barrier(|| {
                                let covered = written.load(Ordering::SeqCst);
                                std::thread::sleep(Duration::from_millis(1));
                                syncs.fetch_add(1, Ordering::SeqCst);
                                durable.fetch_max(covered, Ordering::SeqCst);
                                Ok(())
                            })
                            .unwrap();
                        // The write is covered by a sync that saw it.
                        assert!(durable.load(Ordering::SeqCst) >= mine);
                    }
                });
            }
        });
        let syncs = syncs.load(Ordering::SeqCst);
        assert!(
            syncs < 800,
            "{syncs} syncs for 800 writes: nothing was shared"
        );
    }

    #[test]
    fn every_member_of_a_failed_round_gets_the_error() {
        let group = Arc::new(GroupCommit::default());
        let failures = AtomicUsize::new(0);
        let entered = std::sync::Barrier::new(8);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    entered.wait();
                    let result = group.barrier(|| {
                        std::thread::sleep(Duration::from_millis(20));
                        Err(io::Error::new(io::ErrorKind::StorageFull, "disk full"))
                    });
                    let err = result.unwrap_err();
                    assert_eq!(err.kind(), io::ErrorKind::StorageFull);
                    failures.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        assert_eq!(failures.load(Ordering::SeqCst), 8);
    }
}
