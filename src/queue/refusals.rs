//! Refused control requests, journaled and logged within bounds: by the daemon for requests
//! it applies, and by a database for the requests it applies to tasks nobody holds.
//!
//! Anyone who may write `control/` can drop thousands of requests for a task they may not
//! steer; each used to add a `control_refused` event to that task's journal (another user's)
//! and a warning to the log. Now, per task and requester (the uid that owns the request file),
//! the first [`IN_FULL`] refusals of a [`WINDOW`] are journaled and logged one by one, as
//! before (the `cairn` that wrote each finds its own); the next one journals a single notice
//! that says so (`SUPPRESSED_MARKER`: `cairn` reports its refusal from it), and the rest of
//! the window is only counted, then journaled as one event with the count when the window ends.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long one window of counting lasts.
pub const WINDOW: Duration = Duration::from_secs(60);

/// Refusals per task and requester journaled one by one in a window.
pub const IN_FULL: u32 = 5;

use crate::queue::control::SUPPRESSED_MARKER;

/// Whose refusals are counted together: the task, and the requester's uid (`None`: a request
/// that names no file owner).
type Key = (String, Option<u32>);

#[derive(Debug)]
struct Window {
    started: Instant,
    refused: u32,
}

/// What to do with one refusal.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Journal and log it as usual.
    InFull,
    /// Journal this notice instead (once per window), and log it.
    Notice(String),
    /// Only count it.
    Counted,
}

/// A window's end: journal `reason` (with the count) for `task`.
#[derive(Debug, PartialEq, Eq)]
pub struct Summary {
    pub task: String,
    pub reason: String,
}

/// The windows open now.
#[derive(Debug, Default)]
pub struct RefusalLimiter {
    windows: HashMap<Key, Window>,
}

impl RefusalLimiter {
    /// Note one refusal of a request by `uid` for `task` at `now`.
    pub fn refuse(&mut self, task: &str, uid: Option<u32>, now: Instant) -> Refusal {
        let window = self
            .windows
            .entry((task.to_string(), uid))
            .or_insert(Window {
                started: now,
                refused: 0,
            });
        window.refused += 1;
        match window.refused {
            n if n <= IN_FULL => Refusal::InFull,
            n if n == IN_FULL + 1 => Refusal::Notice(format!(
                "{SUPPRESSED_MARKER}{} for this task: {IN_FULL} were journaled one by one in \
                 {} s; the others until the window ends are refused and counted, then \
                 journaled as one event",
                uid.map_or_else(|| "-".to_string(), |uid| uid.to_string()),
                WINDOW.as_secs()
            )),
            _ => Refusal::Counted,
        }
    }

    /// End the windows that are over at `now`: a summary for each that only counted some.
    pub fn close_expired(&mut self, now: Instant) -> Vec<Summary> {
        let mut summaries = Vec::new();
        self.windows.retain(|(task, uid), window| {
            if now.duration_since(window.started) < WINDOW {
                return true;
            }
            let counted = window.refused.saturating_sub(IN_FULL + 1);
            if counted > 0 {
                summaries.push(Summary {
                    task: task.clone(),
                    reason: format!(
                        "{counted} more request(s) from uid {} refused in {} s without an \
                         entry each",
                        uid.map_or_else(|| "-".to_string(), |uid| uid.to_string()),
                        WINDOW.as_secs()
                    ),
                });
            }
            false
        });
        summaries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_is_journaled_in_full_then_once_then_as_a_count() {
        let mut limiter = RefusalLimiter::default();
        let t0 = Instant::now();
        for _ in 0..IN_FULL {
            assert_eq!(limiter.refuse("t", Some(1002), t0), Refusal::InFull);
        }
        // Another requester, or another task, has windows of its own.
        assert_eq!(limiter.refuse("t", Some(1003), t0), Refusal::InFull);
        assert_eq!(limiter.refuse("u", Some(1002), t0), Refusal::InFull);
        let Refusal::Notice(notice) = limiter.refuse("t", Some(1002), t0) else {
            panic!("no notice");
        };
        assert!(
            notice.starts_with(&format!("{SUPPRESSED_MARKER}1002 ")),
            "{notice}"
        );
        for _ in 0..2994 {
            assert_eq!(limiter.refuse("t", Some(1002), t0), Refusal::Counted);
        }
        assert!(limiter.close_expired(t0 + WINDOW / 2).is_empty());
        let summaries = limiter.close_expired(t0 + WINDOW);
        assert_eq!(summaries.len(), 1, "{summaries:?}");
        assert_eq!(summaries[0].task, "t");
        assert!(
            summaries[0]
                .reason
                .starts_with("2994 more request(s) from uid 1002"),
            "{summaries:?}"
        );
        // A new window starts afresh.
        assert_eq!(
            limiter.refuse("t", Some(1002), t0 + WINDOW),
            Refusal::InFull
        );
    }
}
