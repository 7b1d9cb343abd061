//! The events of a task's journal (`runs/<id>/events.jsonl`), as one enum: writers append a
//! variant, readers match on variants.
//!
//! On disk each event is a JSON object tagged by its `"event"` name, its fields in declaration
//! order after the tag (the order the lines had when they were built by hand, so that journals
//! written before and after this type are alike byte for byte). A line whose name this cairn
//! does not know, or whose fields do not fit its variant (a journal written by another
//! version), is read as [`Event::Unknown`] with everything it holds, so `cairn show` still
//! lists it.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use super::records::RecordStatus;
use crate::submitter::Submitter;
use crate::task::PhaseKind;
use crate::task_id::TaskId;

/// One thing that happened to a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The daemon took the task from the inbox; `submitted_by` is the owner of the file it
    /// took (absent in journals written before cairn recorded it).
    Accepted {
        priority: i32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        submitted_by: Option<Submitter>,
    },
    /// A run of the task began (the first, or a resume).
    AttemptStarted {
        attempt: u32,
        phase: String,
    },
    PhaseStarted {
        phase: String,
        phase_index: usize,
        kind: PhaseKind,
        attempt: u32,
    },
    PhaseFinished {
        phase: String,
        phase_index: usize,
    },
    /// A durable iteration checkpoint: its generation, size and how long the write took.
    Checkpoint {
        phase: String,
        iteration: u64,
        generation: u64,
        bytes: u64,
        #[serde(deserialize_with = "exact")]
        ms: f64,
    },
    /// `counts`: whether the failure uses up one of `retry.max_attempts`.
    AttemptFailed {
        attempt: u32,
        error: String,
        counts: bool,
    },
    /// A daemon shutdown asked the running task to stop.
    StopRequested {
        by: String,
        stops: String,
    },
    /// Stopped cleanly by a shutdown; resumes at the next start.
    Interrupted {
        phase: String,
        iterations: u64,
    },
    /// Held by an operator: at an iteration boundary of a running task (with where it
    /// stopped), or before it started again (without).
    Paused {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        phase: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        iterations: Option<u64>,
        /// Why, when a policy of the task's own paused it (`budget.on_exceed`,
        /// `retry.on_exhausted`) rather than an operator.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    Resumed {},
    /// Found in flight at a start after the daemon died, with the crash-blame verdict.
    ResumedAfterCrash {
        attempt: u32,
        phase: String,
        progressed: bool,
        tasks_in_flight: usize,
        verdict: String,
        crashes_alone: u32,
        limit: u32,
    },
    /// Iterations in flight when the daemon died, counted as spent (`counted` this time).
    IterationsLost {
        phase: String,
        counted: u64,
        lost_iterations: u64,
        #[serde(deserialize_with = "exact")]
        lost_cost_estimate: Option<f64>,
    },
    /// A shared queue's daemon took the task over from another node's expired lease (that
    /// node died, froze or lost the database), with how the expiry was judged: `cleared`
    /// (progress under it), `suspect` (in flight with others: tried alone) or `crash`
    /// (alone, without progress: counted, `crashes` of `limit` in a row).
    TakenOver {
        from_node: String,
        from_epoch: i64,
        verdict: String,
        crashes: u32,
        limit: u32,
    },
    /// The task's holders died `crashes` times in a row while it ran alone on them (its
    /// limit is `limit`): it is recorded failed instead of run again.
    Quarantined {
        crashes: u32,
        limit: u32,
    },
    /// Started alone or in a narrowed group after a crash, to find a task that kills the
    /// daemon.
    CrashTrialStarted {
        width: usize,
    },
    PauseRequested {},
    /// `cairn budget` set the task's spending limit: the old one (`null`: none) and the new
    /// one, and who asked (a user, or a database role).
    BudgetSet {
        #[serde(deserialize_with = "exact")]
        from: Option<f64>,
        #[serde(deserialize_with = "exact")]
        to: f64,
        by: String,
    },
    CancelRequested {},
    /// An operator's request that could not be applied, and why. `action` is the request's
    /// (`pause`, `resume`, `cancel`, `retry`: the queue's `ControlAction`, which this layer
    /// does not import).
    ControlRefused {
        action: String,
        reason: String,
        /// The request's file name in `control/`, so that the `cairn` command that wrote it can
        /// tell its requester it was refused (absent for requests from a database).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        request: Option<String>,
    },
    /// `cairn retry` brought back a finished record.
    Retried {
        previous_status: RecordStatus,
        phase: String,
    },
    /// `cairn fork` made a new task from one of this task's checkpoints.
    Forked {
        #[serde(rename = "as")]
        new_id: TaskId,
        generation: u64,
        patched: bool,
    },
    Done {
        attempts: u32,
        #[serde(deserialize_with = "exact")]
        cost: Option<f64>,
    },
    Failed {
        error: String,
        attempts: u32,
    },
    Cancelled {
        error: String,
        attempts: u32,
    },
    BudgetStopped {
        error: String,
        attempts: u32,
    },
    /// An event this cairn does not know, or one whose fields do not fit it: read, never
    /// written by this version.
    #[serde(untagged)]
    Unknown {
        event: String,
        #[serde(flatten)]
        details: Map<String, Value>,
    },
}

impl Event {
    /// The event as its journal line holds it, without the time: `{"event": name, ...}`.
    pub fn to_fields(&self) -> Map<String, Value> {
        match serde_json::to_value(self) {
            Ok(Value::Object(map)) => map,
            // Every variant is a struct with string keys, which serializes to an object.
            _ => Map::new(),
        }
    }

    /// The event's name (`checkpoint`, `done`, ...).
    pub fn name(&self) -> String {
        match self {
            Event::Unknown { event, .. } => event.clone(),
            known => match known.to_fields().remove("event") {
                Some(Value::String(name)) => name,
                _ => String::new(),
            },
        }
    }

    /// The event's fields besides its name.
    pub fn details(&self) -> Map<String, Value> {
        let mut fields = self.to_fields();
        fields.shift_remove("event");
        fields
    }
}

/// Numbers with a fraction, read through a [`Value`]: an internally tagged enum buffers its
/// fields, and with serde_json's `arbitrary_precision` a buffered float no longer reads as one.
fn exact<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    let value = Value::deserialize(deserializer)?;
    serde_json::from_value(value).map_err(serde::de::Error::custom)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{Event, RecordStatus};
    use crate::task::PhaseKind;
    use crate::task_id::TaskId;

    /// One of every variant, with the fields a writer fills in.
    fn every_event() -> Vec<Event> {
        let mut events = attempt_events();
        events.extend(steering_and_final_events());
        events
    }

    /// The events of an attempt as it runs, is stopped or crashes.
    fn attempt_events() -> Vec<Event> {
        let mut events = running_events();
        events.extend(stopped_and_crashed_events());
        events
    }

    /// The events of an attempt that runs its phases and fails.
    fn running_events() -> Vec<Event> {
        let phase = || "p".to_string();
        let error = || "boom".to_string();
        vec![
            Event::Accepted {
                priority: -2,
                submitted_by: Some(crate::submitter::Submitter {
                    uid: 1001,
                    user: Some("alice".into()),
                }),
            },
            Event::AttemptStarted {
                attempt: 1,
                phase: phase(),
            },
            Event::PhaseStarted {
                phase: phase(),
                phase_index: 0,
                kind: PhaseKind::Loop,
                attempt: 1,
            },
            Event::PhaseFinished {
                phase: phase(),
                phase_index: 0,
            },
            Event::Checkpoint {
                phase: phase(),
                iteration: 3,
                generation: 2,
                bytes: 120,
                ms: 0.25,
            },
            Event::AttemptFailed {
                attempt: 2,
                error: error(),
                counts: true,
            },
        ]
    }

    /// The events of an attempt that is stopped, paused, resumed or crashes.
    fn stopped_and_crashed_events() -> Vec<Event> {
        let phase = || "p".to_string();
        vec![
            Event::StopRequested {
                by: "daemon shutdown".into(),
                stops: "at once".into(),
            },
            Event::Interrupted {
                phase: phase(),
                iterations: 4,
            },
            Event::Paused {
                phase: Some(phase()),
                iterations: Some(4),
                reason: None,
            },
            Event::Paused {
                phase: None,
                iterations: None,
                reason: None,
            },
            Event::Resumed {},
            Event::ResumedAfterCrash {
                attempt: 2,
                phase: phase(),
                progressed: false,
                tasks_in_flight: 3,
                verdict: "Suspect { crashes_alone: 0 }".into(),
                crashes_alone: 0,
                limit: 5,
            },
            Event::IterationsLost {
                phase: phase(),
                counted: 1,
                lost_iterations: 2,
                lost_cost_estimate: Some(0.5),
            },
            Event::IterationsLost {
                phase: phase(),
                counted: 1,
                lost_iterations: 1,
                lost_cost_estimate: None,
            },
            Event::CrashTrialStarted { width: 2 },
            Event::TakenOver {
                from_node: "n1".into(),
                from_epoch: 3,
                verdict: "crash".into(),
                crashes: 1,
                limit: 5,
            },
            Event::Quarantined {
                crashes: 5,
                limit: 5,
            },
        ]
    }

    /// The events of operators' requests, forks and a task's end.
    fn steering_and_final_events() -> Vec<Event> {
        let phase = || "p".to_string();
        let error = || "boom".to_string();
        vec![
            Event::PauseRequested {},
            Event::BudgetSet {
                from: None,
                to: 2.5,
                by: "database role ops".into(),
            },
            Event::Paused {
                phase: Some("p".into()),
                iterations: Some(5),
                reason: Some("budget: spent 0.05 of 0.05".into()),
            },
            Event::CancelRequested {},
            Event::ControlRefused {
                action: "retry".into(),
                reason: "it is not paused".into(),
                request: Some("00000000000000000001-0a1b2c-retry.json".into()),
            },
            Event::Retried {
                previous_status: RecordStatus::BudgetExceeded,
                phase: phase(),
            },
            Event::Forked {
                new_id: TaskId::parse("t2").unwrap(),
                generation: 1,
                patched: true,
            },
            Event::Done {
                attempts: 1,
                cost: Some(0.06),
            },
            Event::Done {
                attempts: 1,
                cost: None,
            },
            Event::Failed {
                error: error(),
                attempts: 3,
            },
            Event::Cancelled {
                error: error(),
                attempts: 1,
            },
            Event::BudgetStopped {
                error: error(),
                attempts: 1,
            },
        ]
    }

    #[test]
    fn every_event_round_trips_without_becoming_unknown() {
        for event in every_event() {
            let text = serde_json::to_string(&event).unwrap();
            let back: Event = serde_json::from_str(&text).unwrap();
            assert_eq!(back, event, "{text}");
            assert!(!matches!(back, Event::Unknown { .. }), "{text}");
        }
    }

    /// The lines as cairn wrote them before events had a type: same keys, same order.
    #[test]
    fn events_are_written_as_before() {
        let cases = [
            (
                Event::Checkpoint {
                    phase: "p".into(),
                    iteration: 3,
                    generation: 2,
                    bytes: 120,
                    ms: 1.5,
                },
                json!({"phase": "p", "iteration": 3, "generation": 2, "bytes": 120, "ms": 1.5}),
                "checkpoint",
            ),
            (
                Event::Done {
                    attempts: 1,
                    cost: None,
                },
                json!({"attempts": 1, "cost": null}),
                "done",
            ),
            (
                Event::Paused {
                    phase: None,
                    iterations: None,
                    reason: None,
                },
                json!({}),
                "paused",
            ),
            (
                Event::BudgetSet {
                    from: Some(0.05),
                    to: 0.1,
                    by: "alice (uid 1001)".into(),
                },
                json!({"from": 0.05, "to": 0.1, "by": "alice (uid 1001)"}),
                "budget_set",
            ),
            (
                Event::Forked {
                    new_id: TaskId::parse("t2").unwrap(),
                    generation: 1,
                    patched: false,
                },
                json!({"as": "t2", "generation": 1, "patched": false}),
                "forked",
            ),
            (
                Event::ControlRefused {
                    action: "pause".into(),
                    reason: "why".into(),
                    request: None,
                },
                json!({"action": "pause", "reason": "why"}),
                "control_refused",
            ),
            (
                Event::BudgetStopped {
                    error: "over".into(),
                    attempts: 2,
                },
                json!({"error": "over", "attempts": 2}),
                "budget_stopped",
            ),
        ];
        for (event, details, name) in cases {
            let mut before = serde_json::Map::new();
            before.insert("event".into(), json!(name));
            before.extend(details.as_object().unwrap().clone());
            assert_eq!(
                serde_json::to_string(&event).unwrap(),
                serde_json::to_string(&before).unwrap()
            );
            assert_eq!(event.name(), name);
            assert_eq!(event.details(), *details.as_object().unwrap());
        }
    }

    #[test]
    fn unknown_and_unfitting_events_are_kept_whole() {
        let line = r#"{"event":"teleported","to":"mars","ms":0.5}"#;
        let event: Event = serde_json::from_str(line).unwrap();
        assert_eq!(event.name(), "teleported");
        assert_eq!(
            event.details(),
            *json!({"to": "mars", "ms": 0.5}).as_object().unwrap()
        );
        assert_eq!(serde_json::to_string(&event).unwrap(), line);
        // A known name with fields of another shape is not dropped either.
        let odd: Event = serde_json::from_str(r#"{"event":"done","attempts":"many"}"#).unwrap();
        assert!(matches!(&odd, Event::Unknown { event, .. } if event == "done"));
    }
}
