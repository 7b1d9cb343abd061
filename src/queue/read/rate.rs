//! The rate of the phase in flight, from the `checkpoint` events of the task's journal.

use chrono::{DateTime, Utc};

use crate::store::journal::{Event, JournalEvent};

/// Iterations per minute of the phase in flight, from the `checkpoint` events of its current
/// run (since its last `phase_started`): first to last checkpoint; with a single checkpoint,
/// from the phase's start (at the iteration it resumed from).
pub fn rate_from_events(events: &[JournalEvent], phase: &str) -> Option<f64> {
    let checkpoint_iteration = |e: &JournalEvent| match &e.event {
        Event::Checkpoint {
            phase: of,
            iteration,
            ..
        } if of == phase => Some(*iteration),
        _ => None,
    };
    let started = events
        .iter()
        .rposition(|e| matches!(&e.event, Event::PhaseStarted { phase: of, .. } if of == phase));
    let run = &events[started.map_or(0, |i| i + 1)..];
    let points: Vec<(DateTime<Utc>, u64)> = run
        .iter()
        .filter_map(|e| Some((e.at, checkpoint_iteration(e)?)))
        .collect();
    let (first, last) = match (points.first(), points.last()) {
        (Some(first), Some(last)) if points.len() >= 2 => (*first, *last),
        (Some(last), _) => {
            // One checkpoint in this run: measure from the phase's start, at the iteration
            // the run resumed from (the last checkpoint before it; 0 when there is none).
            let start = &events[started?];
            let before = &events[..started?];
            let resumed_from = before.iter().rev().find_map(checkpoint_iteration);
            let resumed_from = match resumed_from {
                Some(n) => n,
                // Nothing earlier: 0 only if the journal is whole (it starts with `accepted`)
                // and holds every checkpoint the task wrote — a forked task starts from a
                // checkpoint its journal does not list (its generation numbers tell).
                None if events
                    .first()
                    .is_some_and(|e| matches!(e.event, Event::Accepted { .. })) =>
                {
                    let written_before = before
                        .iter()
                        .filter(|e| matches!(e.event, Event::Checkpoint { .. }))
                        .count();
                    let generation = run.iter().find_map(|e| match e.event {
                        Event::Checkpoint { generation, .. }
                            if checkpoint_iteration(e).is_some() =>
                        {
                            Some(generation)
                        }
                        _ => None,
                    });
                    if generation.is_some_and(|g| g != written_before as u64 + 1) {
                        return None;
                    }
                    0
                }
                None => return None,
            };
            ((start.at, resumed_from), *last)
        }
        _ => return None,
    };
    let minutes = (last.0 - first.0).num_milliseconds() as f64 / 60_000.0;
    if minutes <= 0.0 || last.1 <= first.1 {
        return None;
    }
    Some((last.1 - first.1) as f64 / minutes)
}

#[cfg(test)]
mod tests {
    use chrono::DateTime;

    use super::rate_from_events;
    use crate::store::journal::{Event, JournalEvent};
    use crate::task::PhaseKind;

    fn event(at_ms: i64, event: Event) -> JournalEvent {
        JournalEvent {
            at: DateTime::from_timestamp_millis(1_700_000_000_000 + at_ms).unwrap(),
            event,
        }
    }

    fn checkpoint(at_ms: i64, iteration: u64, generation: u64) -> JournalEvent {
        event(
            at_ms,
            Event::Checkpoint {
                phase: "p".into(),
                iteration,
                generation,
                bytes: 100,
                ms: 1.0,
            },
        )
    }

    fn accepted() -> JournalEvent {
        event(
            0,
            Event::Accepted {
                priority: 0,
                submitted_by: None,
            },
        )
    }

    #[test]
    fn rate_is_measured_over_the_current_run_of_the_phase() {
        // Generations as the task wrote them: one per checkpoint.
        let cp = |ms, i| checkpoint(ms, i, i);
        let started = |ms| {
            event(
                ms,
                Event::PhaseStarted {
                    phase: "p".into(),
                    phase_index: 0,
                    kind: PhaseKind::Loop,
                    attempt: 1,
                },
            )
        };
        // An earlier run, a day ago, must not dilute the rate of this one.
        let events = vec![
            accepted(),
            started(0),
            cp(1_000, 1),
            cp(2_000, 2),
            started(86_400_000),
            cp(86_401_000, 3),
            cp(86_403_000, 5),
            cp(86_405_000, 7),
        ];
        // 4 iterations in 4 s.
        assert_eq!(rate_from_events(&events, "p"), Some(60.0));
        // One checkpoint in this run: from the phase's start, resumed at 2.
        assert_eq!(rate_from_events(&events[..6], "p"), Some(60.0));
        // Another phase's checkpoints do not count.
        assert_eq!(rate_from_events(&events, "q"), None);
        // A single checkpoint after a start with nothing before it: from 0 only when the
        // journal is whole.
        let fresh = vec![accepted(), started(0), cp(30_000, 1)];
        assert_eq!(rate_from_events(&fresh, "p"), Some(2.0));
        assert_eq!(rate_from_events(&fresh[1..], "p"), None);
        // A fork starts from a checkpoint (generation 1) its own journal does not list.
        let forked = vec![accepted(), started(0), checkpoint(30_000, 6, 2)];
        assert_eq!(rate_from_events(&forked, "p"), None);
    }
}
