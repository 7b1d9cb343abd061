//! Tasks' rows → the views the file queue's reader gives, built by the same builders.
//!
//! - `cairn_tasks.state` decides the state: `running` under an unexpired lease is running,
//!   under an expired one interrupted (its daemon died or froze; another takes it over);
//!   `paused` is paused; `queued` is waiting_retry before its `not_before`, interrupted when
//!   it has a phase state (it ran and was handed back), else pending; a final state with its
//!   record is the record's status.
//! - The phase state (the work-state entry a daemon wrote) and the latest checkpoint give the
//!   progress; the recent events give a running task's rate.

use std::path::Path;

use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio_postgres::{Client, Row};

use super::facts::{journal_event, DbFacts};
use crate::queue::postgres::error::{During, PgError};
use crate::queue::postgres::fenced::StoredCheckpoint;
use crate::queue::postgres::row_state::RowState;
use crate::queue::read::{finished, in_flight, pending, rank, Record};
use crate::queue::{TaskLease, TaskView};
use crate::store::current_work::{ActiveStatus, ActiveTask};
use crate::store::task_state::TaskState;
use crate::task::Task;
use crate::task_id::TaskId;

/// Events of a running task read for its rate: the rate looks at the current phase's
/// recent checkpoints only.
const RATE_EVENTS: i64 = 200;

/// The tasks (`$1`: one id, or NULL for all) with their records and the database's time.
const TASKS: &str = "
SELECT t.id, t.definition::text, t.state, t.not_before > now(), t.lease_node, t.lease_epoch,
       t.lease_expires_at, t.lease_expires_at > now(), t.phase_state::text,
       r.record::text, r.finished_at, now()
FROM cairn_tasks t LEFT JOIN cairn_records r ON r.task_id = t.id
WHERE $1::text IS NULL OR t.id = $1
ORDER BY t.id";

/// The checkpoint generations of the tasks not done (a done task's progress is its record).
const CHECKPOINTS: &str = "
SELECT c.task_id, c.generation, c.bytes, c.iteration_count, c.lease_epoch, c.written_at
FROM cairn_checkpoints c JOIN cairn_tasks t ON t.id = c.task_id
WHERE t.state <> 'done' AND ($1::text IS NULL OR t.id = $1)
ORDER BY c.task_id, c.generation DESC";

/// The stored outputs of the tasks in flight (a finished task's are in its record).
const OUTPUTS: &str = "
SELECT o.task_id, o.phase_index, o.output::text
FROM cairn_outputs o JOIN cairn_tasks t ON t.id = o.task_id
WHERE t.state IN ('queued', 'running', 'paused') AND ($1::text IS NULL OR t.id = $1)";

/// The recent events of the running tasks, oldest first.
const RECENT_EVENTS: &str = "
SELECT task_id, at, event::text FROM (
    SELECT e.id, e.task_id, e.at, e.event,
           row_number() OVER (PARTITION BY e.task_id ORDER BY e.id DESC) AS newest
    FROM cairn_events e JOIN cairn_tasks t ON t.id = e.task_id
    WHERE t.state = 'running' AND ($1::text IS NULL OR t.id = $1)
) recent
WHERE newest <= $2
ORDER BY task_id, id";

/// Read the views of the tasks (`only`: one of them) and the database's time.
pub(super) async fn read_tasks(
    client: &Client,
    only: Option<&str>,
) -> Result<(Vec<TaskView>, DateTime<Utc>), PgError> {
    let rows = client
        .query(TASKS, &[&only])
        .await
        .during("reading the tasks")?;
    let facts = read_facts(client, only).await?;
    let now = rows
        .first()
        .map(|row| row.get::<_, DateTime<Utc>>(11))
        .unwrap_or_else(Utc::now);
    let mut tasks: Vec<TaskView> = rows.iter().map(|row| task_view(row, &facts)).collect();
    tasks.sort_by(|a, b| rank(&a.state).cmp(&rank(&b.state)).then(a.id.cmp(&b.id)));
    Ok((tasks, now))
}

/// Checkpoints, outputs and recent events of the tasks (`only`: one of them).
async fn read_facts(client: &Client, only: Option<&str>) -> Result<DbFacts, PgError> {
    let mut facts = DbFacts::default();
    for row in client
        .query(CHECKPOINTS, &[&only])
        .await
        .during("reading the checkpoints")?
    {
        facts
            .checkpoints
            .entry(row.get(0))
            .or_default()
            .push(StoredCheckpoint {
                generation: u64::try_from(row.get::<_, i64>(1)).unwrap_or(0),
                bytes: row.get(2),
                iteration_count: u64::try_from(row.get::<_, i64>(3)).unwrap_or(0),
                lease_epoch: row.get(4),
                written_at: row.get(5),
            });
    }
    for row in client
        .query(OUTPUTS, &[&only])
        .await
        .during("reading the outputs")?
    {
        let text: String = row.get(2);
        if let (Ok(index), Ok(value)) = (
            usize::try_from(row.get::<_, i32>(1)),
            serde_json::from_str::<Value>(&text),
        ) {
            facts.outputs.insert((row.get(0), index), value);
        }
    }
    for row in client
        .query(RECENT_EVENTS, &[&only, &RATE_EVENTS])
        .await
        .during("reading the recent events")?
    {
        if let Some(event) = journal_event(row.get(1), row.get(2)) {
            facts.events.entry(row.get(0)).or_default().push(event);
        }
    }
    Ok(facts)
}

/// One task's view from its row.
fn task_view(row: &Row, facts: &DbFacts) -> TaskView {
    let id: String = row.get(0);
    let mut view = TaskView::new(&id, TaskState::Pending);
    view.definition_key = format!("cairn_tasks/{id}");
    read_definition(&mut view, row.get(1));
    view.phase_count = view.task.as_ref().map(|t| t.phases.len());
    let state = match row.try_get::<_, RowState>(2) {
        Ok(state) => state,
        Err(e) => {
            view.warnings.push(format!("task {id} does not read: {e}"));
            return view;
        }
    };
    let waiting: Option<bool> = row.get(3);
    let lease_live: Option<bool> = row.get(7);
    if let Some(record) = record_of(&mut view, row).filter(|_| state.is_final()) {
        finished(facts, &mut view, record);
        return view;
    }
    let entry = row.get::<_, Option<String>>(8).and_then(|text| {
        match serde_json::from_str::<ActiveTask>(&text) {
            Ok(entry) => Some(entry),
            Err(e) => {
                view.warnings
                    .push(format!("the phase state of task {id} does not read: {e}"));
                None
            }
        }
    });
    let has_entry = entry.is_some();
    match entry {
        Some(entry) => in_flight(facts, true, &mut view, entry),
        None => pending(facts, &mut view),
    }
    let status = match state {
        RowState::Running if lease_live == Some(true) => Some(ActiveStatus::Running),
        RowState::Running => Some(ActiveStatus::Interrupted),
        RowState::Paused => Some(ActiveStatus::Paused),
        RowState::Queued if waiting == Some(true) => Some(ActiveStatus::WaitingRetry),
        RowState::Queued if has_entry => Some(ActiveStatus::Interrupted),
        _ => None,
    };
    view.state = status.map_or(TaskState::Pending, TaskState::InFlight);
    if state == RowState::Running {
        view.lease = lease_of(row);
    }
    view
}

/// The stored definition, with the row's id.
fn read_definition(view: &mut TaskView, text: String) {
    match Task::parse_stored(text.as_bytes()) {
        Ok(mut task) => {
            task.id = TaskId::parse(view.id.as_str()).ok();
            view.task = Some(task);
        }
        Err(e) => view.warnings.push(format!("{}: {e}", view.definition_key)),
    }
}

/// The task's final record, if it has one that reads (else a warning).
fn record_of(view: &mut TaskView, row: &Row) -> Option<Record> {
    let text: Option<String> = row.get(9);
    let finished_at: Option<DateTime<Utc>> = row.get(10);
    let name = format!("cairn_records/{}", view.id);
    let value: Value = match serde_json::from_str(&text?) {
        Ok(value) => value,
        Err(e) => {
            view.warnings.push(format!("{name}: {e}"));
            return None;
        }
    };
    match Record::from_value(Path::new(&name), value, finished_at) {
        Ok(record) => Some(record),
        Err(e) => {
            view.warnings.push(e.to_string());
            None
        }
    }
}

fn lease_of(row: &Row) -> Option<TaskLease> {
    Some(TaskLease {
        node: row.get::<_, Option<String>>(4)?,
        epoch: row.get(5),
        expires_at: row.get::<_, Option<DateTime<Utc>>>(6)?,
        live: row.get::<_, Option<bool>>(7).unwrap_or(false),
    })
}
