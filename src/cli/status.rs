//! `cairn status [--json] [--watch] [--all]`: one line per task — state, phase, iteration,
//! rate, ETA, cost, checkpoint age — read from the queue's files, with or without a daemon.
//!
//! `--watch` redraws every second: progress bars on a terminal, plain status blocks when stdout
//! is a pipe or a file. It ends on Ctrl-C or when the reader goes away (exit 0 either way).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::{json, Value};

use super::error::{print, CliError, CliResult};
use super::format;
use super::source::DbArg;
use crate::client::QueueClient as Source;
use crate::limits::{PublishedLimits, SubmitterKey};
use crate::queue::{LoadOptions, QueueView, TaskView};
use crate::store::current_work::{ActiveStatus, PauseReason};
use crate::store::task_state::TaskState;
use crate::submitter::Submitter;

/// The columns of the human output, in their fixed order.
pub(super) const COLUMNS: [&str; 9] = [
    "ID",
    "STATE",
    "PHASE",
    "ITER",
    "RATE",
    "ETA",
    "COST",
    "CHECKPOINT",
    "SUBMITTER",
];

/// The columns a queue shared through a database adds: the daemon holding a task's lease, and
/// how long the lease has left.
pub(super) const LEASE_COLUMNS: [&str; 2] = ["NODE", "LEASE"];

#[derive(Debug, Args)]
#[command(after_help = "\
States: submitted (in inbox/, not taken by a daemon yet), pending, running, paused \
(paused(budget), paused(retries_exhausted): by a policy of the task's own, the reason after the \
table), waiting_retry, interrupted (stopped, or its daemon died; \
resumes at the next start), done, failed, budget_exceeded, cancelled, rejected (a file refused \
at intake: the 3 most recent are listed, --all lists every one; `cairn show NAME` says why).

Columns: PHASE is name(k/n); ITER is iterations done/total (items for items phases, the \
worker's own count for workers); RATE is iterations per minute of the phase's current run; \
ETA is the time left at that rate; CHECKPOINT is the age of the last iteration checkpoint; \
SUBMITTER is the user who submitted the task (the owner of the file the daemon took in).
After the table, when the daemon runs with limits per submitter (cairn run \
--max-queued-per-submitter, ...) or several submitters have unfinished tasks: the limits in \
effect and each submitter's tasks QUEUED (pending or in flight) and RUNNING, as n/limit. \
When a listed task reported a cost: the COST of the tasks listed, per submitter.
With --db, a first line names the daemons sharing the queue (alive or gone), and NODE and LEASE \
say which daemon holds a running task and how long its lease has left.

The --json document is described in docs/cli.md (\"version\": 1).")]
pub(super) struct StatusArgs {
    /// Print a JSON document instead of the table (with --watch: one compact document per line
    /// every second).
    #[arg(long)]
    json: bool,

    /// Redraw every second until Ctrl-C (progress bars on a terminal, plain blocks otherwise).
    #[arg(long, short)]
    watch: bool,

    /// List every file rejected at intake (failed/rejected-*.json), not only the 3 most recent.
    #[arg(long, short)]
    all: bool,

    #[command(flatten)]
    pub(super) db: DbArg,
}

/// Rejected intake files listed without `--all`: enough to notice them, not a flood.
const RECENT_REJECTED: usize = 3;

pub(super) fn run(queue: &Path, args: StatusArgs) -> CliResult {
    let source = Source::open(queue, args.db.url())?;
    if source
        .root()
        .is_some_and(|root| !crate::queue::QueueReader::open(root).exists())
    {
        return Err(CliError::failure(format_args!(
            "queue {} does not exist (use --queue DIR or CAIRN_QUEUE)",
            queue.display()
        )));
    }
    let options = LoadOptions {
        rejected: if args.all {
            usize::MAX
        } else {
            RECENT_REJECTED
        },
    };
    if args.watch {
        return watch(&source, options, args.json);
    }
    let view = source.status(options)?;
    let text = if args.json {
        let mut text = serde_json::to_string_pretty(&to_json(&view)).unwrap_or_default();
        text.push('\n');
        text
    } else if view.cluster.is_some() {
        format!(
            "{}\n{}{}{}{}",
            header(&view),
            table(&view),
            paused_section(&view),
            submitters_section(&view),
            spend_section(&view)
        )
    } else {
        format!(
            "{}{}{}{}",
            table(&view),
            paused_section(&view),
            submitters_section(&view),
            spend_section(&view)
        )
    };
    print(&text)?;
    let unreadable = view.current_work_problem.as_ref();
    for warning in &view.warnings {
        if Some(warning) != unreadable {
            eprintln!("warning: {warning}");
        }
    }
    if !args.json {
        notes(&source, &view);
    }
    match unreadable {
        Some(problem) => Err(CliError::failure(problem)),
        None => Ok(()),
    }
}

/// The first line of a shared queue's table: the database and its daemons.
fn header(view: &QueueView) -> String {
    format!(
        "queue {}  {}",
        view.root.display(),
        format::describe_daemons(view)
    )
}

/// Hints on stderr, for people: rejected files not listed, tasks that wait for a daemon.
fn notes(source: &Source, view: &QueueView) {
    let listed = view.tasks.iter().filter(|t| t.state.is_rejected()).count();
    if view.rejected > listed {
        eprintln!(
            "note: {} file(s) were rejected at intake, the {listed} most recent listed; \
             `cairn status --all` lists every one, `cairn show NAME` says why",
            view.rejected
        );
    }
    if view.daemon.running {
        return;
    }
    // Paused tasks stay paused across runs (docs/decisions.md), so they are not promised to
    // continue.
    let paused = view
        .tasks
        .iter()
        .filter(|t| t.state == TaskState::InFlight(ActiveStatus::Paused))
        .count();
    let waiting = view
        .tasks
        .iter()
        .filter(|t| t.state.is_in_flight() || t.state == TaskState::Pending)
        .count()
        - paused;
    if waiting > 0 && view.cluster.is_some() {
        eprintln!(
            "note: no daemon is alive on {}; {waiting} unfinished task(s) continue when one \
             runs (`cairn run --db URL`)",
            view.root.display()
        );
    } else if waiting > 0 {
        eprintln!(
            "note: no daemon is running on {}; {waiting} unfinished task(s) continue at the next `cairn run`",
            view.root.display()
        );
    }
    if paused > 0 {
        eprintln!(
            "note: {paused} paused task(s) stay paused, also across `cairn run`, until `cairn resume ID`"
        );
    }
    if let (true, Some(root)) = (view.inbox > 0, source.root()) {
        let reader = crate::queue::QueueReader::open(root);
        eprintln!(
            "note: {} file(s) in {} wait for a daemon to take them",
            view.inbox,
            reader.dir().inbox().display()
        );
    }
}

/// The `--json` document (see docs/cli.md).
/// With `--db`, the daemons (`nodes`) and each task's lease (`node`, `lease_epoch`,
/// `lease_expires_at`, `lease_live`) are added.
pub(super) fn to_json(view: &QueueView) -> Value {
    let tasks = view
        .tasks
        .iter()
        .map(|task| task_json(view, task))
        .collect();
    document(view, tasks)
}

/// One task's object in the `--json` document.
pub(super) fn task_json(view: &QueueView, task: &TaskView) -> Value {
    let mut object = format::task_json(task, view.now);
    if view.cluster.is_some() {
        format::add_lease_json(&mut object, task);
    }
    object
}

/// The `--json` document of `view` with the objects of its tasks made already, in order.
pub(super) fn document(view: &QueueView, tasks: Vec<Value>) -> Value {
    let mut document = json!({
        "version": format::JSON_VERSION,
        "queue": view.root.display().to_string(),
        "daemon": format::daemon_json(view.daemon),
        "inbox": view.inbox,
        "rejected": view.rejected,
        "tasks": tasks,
        "limits": view.limits.as_ref().map(limits_json),
        "submitters": submitters_json(view),
        "spend_by_submitter": spend_json(view),
    });
    if let Some(cluster) = &view.cluster {
        document["nodes"] = format::nodes_json(cluster);
    }
    document
}

/// Each submitter's unfinished tasks: queued (pending or in flight) and running, by uid with
/// "unknown" (tasks with no submitter recorded) last. Tasks still in `inbox/` are not counted:
/// the limits hold them only when they are taken in.
pub(super) fn submitter_counts(view: &QueueView) -> Vec<SubmitterCount> {
    let mut counts: BTreeMap<SubmitterKey, SubmitterCount> = BTreeMap::new();
    for task in &view.tasks {
        let queued = task.state.is_in_flight() || task.state == TaskState::Pending;
        if !queued {
            continue;
        }
        let submitter = task.submitted_by();
        let count = counts
            .entry(SubmitterKey::of(submitter.as_ref()))
            .or_insert_with(|| SubmitterCount {
                submitter,
                queued: 0,
                running: 0,
            });
        count.queued += 1;
        if task.state == TaskState::InFlight(ActiveStatus::Running) {
            count.running += 1;
        }
    }
    counts.into_values().collect()
}

/// What one submitter's tasks listed have spent: the committed cost and, apart, the estimate
/// for iterations lost to crashes (each `None` while none of them reported one).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct SubmitterSpend {
    pub submitter: Option<Submitter>,
    pub tasks: usize,
    pub cost: Option<f64>,
    pub lost_cost_estimate: Option<f64>,
}

/// The spend of each submitter over the tasks listed (files refused at intake aside), by
/// uid with "unknown" last; decimals summed exactly.
pub(super) fn spend_by_submitter(view: &QueueView) -> Vec<SubmitterSpend> {
    let sum = |total: Option<f64>, more: Option<f64>| match (total, more) {
        (Some(total), Some(more)) => Some(crate::cost::add(total, more)),
        (total, more) => total.or(more),
    };
    let mut spend: BTreeMap<SubmitterKey, SubmitterSpend> = BTreeMap::new();
    for task in view.tasks.iter().filter(|t| !t.state.is_rejected()) {
        let submitter = task.submitted_by();
        let line = spend
            .entry(SubmitterKey::of(submitter.as_ref()))
            .or_insert_with(|| SubmitterSpend {
                submitter,
                tasks: 0,
                cost: None,
                lost_cost_estimate: None,
            });
        line.tasks += 1;
        line.cost = sum(line.cost, task.cost);
        line.lost_cost_estimate = sum(line.lost_cost_estimate, task.lost_cost_estimate);
    }
    spend.into_values().collect()
}

fn spend_json(view: &QueueView) -> Value {
    spend_by_submitter(view)
        .into_iter()
        .map(|line| {
            json!({
                "submitted_by": line.submitter,
                "tasks": line.tasks,
                "cost": line.cost,
                "lost_cost_estimate": line.lost_cost_estimate,
            })
        })
        .collect()
}

/// After the table, when a listed task reported a cost: what each submitter's tasks spent
/// (`0.05+~0.01`: committed, and the estimate for iterations lost to crashes).
pub(super) fn spend_section(view: &QueueView) -> String {
    let lines = spend_by_submitter(view);
    if lines
        .iter()
        .all(|l| l.cost.is_none() && l.lost_cost_estimate.is_none())
    {
        return String::new();
    }
    let rows: Vec<Vec<String>> = lines
        .iter()
        .map(|line| {
            let cost = match (line.cost, line.lost_cost_estimate) {
                (None, None) => "-".to_string(),
                (cost, None) => format::format_cost(cost.unwrap_or(0.0)),
                (cost, Some(lost)) => format!(
                    "{}+~{}",
                    format::format_cost(cost.unwrap_or(0.0)),
                    format::format_cost(lost)
                ),
            };
            vec![
                line.submitter
                    .as_ref()
                    .map_or_else(|| "unknown".to_string(), Submitter::short),
                line.tasks.to_string(),
                cost,
            ]
        })
        .collect();
    format!(
        "\ncost by submitter (tasks listed)\n{}",
        format::render_table(&["SUBMITTER", "TASKS", "COST"], &rows)
    )
}

/// After the table, for each task a policy of its own paused (its budget, its used-up
/// attempts): why, and what lets it go on.
pub(super) fn paused_section(view: &QueueView) -> String {
    let rows: Vec<Vec<String>> = view
        .tasks
        .iter()
        .filter_map(|task| {
            let pause = task.paused_for.as_ref()?;
            let limit = task
                .max_cost
                .filter(|_| pause.reason == PauseReason::Budget)
                .map(|limit| format!(" (limit now {})", format::format_cost(limit)))
                .unwrap_or_default();
            Some(vec![
                task.id.clone(),
                format!("{}{limit}", pause.describe()),
            ])
        })
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    format!(
        "\npaused by their own policy (`cairn budget ID --max-cost X` raises a limit, \
         `cairn resume ID` continues)\n{}",
        format::render_table(&["ID", "WHY"], &rows)
    )
}

/// One submitter's line of [`submitter_counts`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SubmitterCount {
    /// `None`: tasks with no submitter recorded, counted as one submitter.
    pub submitter: Option<Submitter>,
    pub queued: usize,
    pub running: usize,
}

fn limits_json(limits: &PublishedLimits) -> Value {
    let per = limits.per_submitter;
    json!({
        "max_tasks": limits.max_tasks,
        "max_queued_per_submitter": per.max_queued,
        "max_running_per_submitter": per.max_running,
        "max_priority_per_submitter": per.max_priority,
    })
}

fn submitters_json(view: &QueueView) -> Value {
    submitter_counts(view)
        .into_iter()
        .map(|count| {
            json!({
                "submitted_by": count.submitter,
                "queued": count.queued,
                "running": count.running,
            })
        })
        .collect()
}

/// After the table, when limits are in effect or several submitters have unfinished tasks:
/// the limits, and each submitter's counts against them (`3/5`: 3 of at most 5).
pub(super) fn submitters_section(view: &QueueView) -> String {
    let counts = submitter_counts(view);
    let per = view
        .limits
        .as_ref()
        .map(|l| l.per_submitter)
        .unwrap_or_default();
    if !per.any() && counts.len() < 2 {
        return String::new();
    }
    let show = |n: usize, max: Option<usize>| match max {
        Some(max) => format!("{n}/{max}"),
        None => n.to_string(),
    };
    let unlimited = || "unlimited".to_string();
    let limits = match &view.limits {
        Some(limits) => format!(
            "limits per submitter: queued {}, running {}, priority {}; max tasks {}",
            per.max_queued.map_or_else(unlimited, |n| n.to_string()),
            per.max_running.map_or_else(unlimited, |n| n.to_string()),
            per.max_priority.map_or_else(unlimited, |n| n.to_string()),
            limits.max_tasks
        ),
        None if view.cluster.is_some() => {
            "limits per submitter: set on each daemon (cairn run), not known here".to_string()
        }
        None if view.daemon.running => {
            "limits per submitter: not published by the running daemon".to_string()
        }
        None => "limits per submitter: none in effect (no daemon runs on this queue)".to_string(),
    };
    let rows: Vec<Vec<String>> = counts
        .iter()
        .map(|count| {
            vec![
                count
                    .submitter
                    .as_ref()
                    .map_or_else(|| "unknown".to_string(), Submitter::short),
                show(count.queued, per.max_queued),
                show(count.running, per.max_running),
            ]
        })
        .collect();
    format!(
        "\n{limits}\n{}",
        format::render_table(&["SUBMITTER", "QUEUED", "RUNNING"], &rows)
    )
}

/// The human table: a header and one line per task.
pub(super) fn table(view: &QueueView) -> String {
    let shared = view.cluster.is_some();
    let rows: Vec<Vec<String>> = view
        .tasks
        .iter()
        .map(|task| {
            let mut cells = row(task, view);
            if shared {
                cells.extend(format::lease_cells(task, view.now));
            }
            cells
        })
        .collect();
    let mut columns = COLUMNS.to_vec();
    if shared {
        columns.extend(LEASE_COLUMNS);
    }
    format::render_table(&columns, &rows)
}

fn row(task: &TaskView, view: &QueueView) -> Vec<String> {
    let dash = || "-".to_string();
    vec![
        task.id.clone(),
        format::state_cell(task),
        phase_cell(task),
        iter_cell(task),
        task.rate_per_min
            .map(format::format_rate)
            .unwrap_or_else(dash),
        task.eta_seconds
            .map(format::short_duration)
            .unwrap_or_else(dash),
        format::cost_cell(task).unwrap_or_else(dash),
        task.checkpoint_age(view.now)
            .map(|age| format!("{} ago", format::short_duration(age)))
            .unwrap_or_else(dash),
        task.submitted_by()
            .map(|submitter| submitter.short())
            .unwrap_or_else(dash),
    ]
}

/// `name(k/n)`, 1-based.
pub(super) fn phase_cell(task: &TaskView) -> String {
    match (&task.phase, task.phase_index, task.phase_count) {
        (Some(name), Some(index), Some(count)) => format!("{name}({}/{count})", index + 1),
        (Some(name), _, _) => name.clone(),
        _ => "-".into(),
    }
}

/// `done/total`, `done`, or `-`.
pub(super) fn iter_cell(task: &TaskView) -> String {
    match (task.iteration, task.total) {
        (Some(done), Some(total)) => format!("{done}/{total}"),
        (Some(done), None) => done.to_string(),
        (None, Some(total)) if task.state.not_started() => format!("0/{total}"),
        _ => "-".into(),
    }
}

/// Redraw every second until Ctrl-C/SIGTERM or a closed pipe.
fn watch(source: &Source, options: LoadOptions, as_json: bool) -> CliResult {
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&stop))
            .map_err(|e| CliError::failure(format_args!("cannot watch for Ctrl-C: {e}")))?;
    }
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stdout());
    if terminal && !as_json {
        bars::watch(source, options, &stop)
    } else {
        plain_watch(source, options, as_json, &stop)
    }
}

/// Sleep up to a second, waking early when asked to stop; false once stopped.
fn tick(started: Instant, stop: &AtomicBool) -> bool {
    let next = started + Duration::from_secs(1);
    while Instant::now() < next {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    !stop.load(Ordering::Relaxed)
}

/// Not a terminal: a block (time, daemon, table) or a JSON line every second.
/// A reader that goes away (`| head`) ends it through the broken-pipe error, which
/// `cli::main` takes as the normal end of a pipe.
fn plain_watch(
    source: &Source,
    options: LoadOptions,
    as_json: bool,
    stop: &AtomicBool,
) -> CliResult {
    loop {
        let started = Instant::now();
        let view = source.status(options)?;
        let text = if as_json {
            let mut line = serde_json::to_string(&to_json(&view)).unwrap_or_default();
            line.push('\n');
            line
        } else {
            format!(
                "{}  {}\n{}\n",
                format::rfc3339(view.now),
                format::describe_daemons(&view),
                table(&view)
            )
        };
        print(&text)?;
        if !tick(started, stop) {
            return Ok(());
        }
    }
}

/// The terminal view: a header line and one progress bar per task.
mod bars {
    use std::collections::HashMap;
    use std::sync::atomic::AtomicBool;
    use std::time::Instant;

    use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

    use super::{iter_cell, phase_cell, tick};
    use crate::cli::error::CliResult;
    use crate::cli::format;
    use crate::client::QueueClient as Source;
    use crate::queue::{LoadOptions, QueueView, TaskView};

    pub(super) fn watch(source: &Source, options: LoadOptions, stop: &AtomicBool) -> CliResult {
        let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stdout());
        let header = multi.add(ProgressBar::new_spinner());
        header.set_style(ProgressStyle::with_template("{msg}").expect("a valid template"));
        let mut task_bars: HashMap<String, (ProgressBar, bool)> = HashMap::new();
        loop {
            let started = Instant::now();
            let view = source.status(options)?;
            header.set_message(format!(
                "queue {}  {}  {} task(s)  {}   (Ctrl-C to quit)",
                view.root.display(),
                format::describe_daemons(&view),
                view.tasks.len(),
                view.now.format("%H:%M:%S"),
            ));
            let widths = widths(&view);
            task_bars.retain(|id, (bar, _)| {
                let keep = view.tasks.iter().any(|t| &t.id == id);
                if !keep {
                    multi.remove(bar);
                }
                keep
            });
            for task in &view.tasks {
                let has_total = task.total.is_some_and(|t| t > 0);
                let entry = task_bars.entry(task.id.clone()).or_insert_with(|| {
                    let bar = multi.add(ProgressBar::new(0));
                    bar.set_style(style(has_total));
                    (bar, has_total)
                });
                if entry.1 != has_total {
                    entry.0.set_style(style(has_total));
                    entry.1 = has_total;
                }
                update(&entry.0, task, &view, widths);
            }
            if !tick(started, stop) {
                break;
            }
        }
        for (bar, _) in task_bars.values() {
            bar.abandon();
        }
        header.abandon();
        Ok(())
    }

    fn style(with_bar: bool) -> ProgressStyle {
        let template = if with_bar {
            "{prefix} [{bar:30.cyan/blue}] {msg}"
        } else {
            "{prefix} {msg}"
        };
        ProgressStyle::with_template(template)
            .expect("a valid template")
            .progress_chars("=> ")
    }

    /// Widths of the id, state and phase columns.
    fn widths(view: &QueueView) -> (usize, usize, usize) {
        view.tasks.iter().fold((2, 5, 5), |(a, b, c), t| {
            (
                a.max(t.id.len()),
                b.max(t.state.as_str().len()),
                c.max(phase_cell(t).len()),
            )
        })
    }

    fn update(bar: &ProgressBar, task: &TaskView, view: &QueueView, w: (usize, usize, usize)) {
        bar.set_prefix(format!(
            "{:<a$}  {:<b$}  {:<c$}",
            task.id,
            task.state.as_str(),
            phase_cell(task),
            a = w.0,
            b = w.1,
            c = w.2
        ));
        if let Some(total) = task.total {
            bar.set_length(total);
        }
        bar.set_position(task.iteration.unwrap_or(0));
        let mut parts = vec![iter_cell(task)];
        if let Some(rate) = task.rate_per_min {
            parts.push(format::format_rate(rate));
        }
        if let Some(eta) = task.eta_seconds {
            parts.push(format!("ETA {}", format::short_duration(eta)));
        }
        if let Some(cost) = format::cost_cell(task) {
            parts.push(format!("cost {cost}"));
        }
        if let Some(age) = task.checkpoint_age(view.now) {
            parts.push(format!("checkpoint {} ago", format::short_duration(age)));
        }
        if let Some(error) = &task.error {
            if !task.state.is_done() {
                let first: String = error
                    .lines()
                    .next()
                    .unwrap_or("")
                    .chars()
                    .take(60)
                    .collect();
                parts.push(format!("error: {first}"));
            }
        }
        bar.set_message(parts.join("  "));
    }
}

#[cfg(test)]
mod tests {
    use super::{spend_by_submitter, spend_section};
    use crate::queue::{DaemonInfo, QueueView, TaskView};
    use crate::store::records::RecordStatus;
    use crate::store::task_state::TaskState;
    use crate::submitter::Submitter;
    use crate::task::Task;

    /// A listed task of the submitter with `uid` (none: unrecorded) with these costs.
    fn listed(id: &str, uid: Option<u32>, cost: Option<f64>, lost: Option<f64>) -> TaskView {
        let mut view = TaskView::new(id, TaskState::Pending);
        let mut task = Task::parse(br#"{"phases":[{"name":"a","run":["x"]}]}"#).unwrap();
        task.submitted_by = uid.map(|uid| Submitter {
            uid,
            user: Some(format!("user{uid}")),
        });
        view.task = Some(task);
        view.cost = cost;
        view.lost_cost_estimate = lost;
        view
    }

    fn view_of(tasks: Vec<TaskView>) -> QueueView {
        QueueView {
            root: "/q".into(),
            now: chrono::Utc::now(),
            daemon: DaemonInfo {
                running: false,
                pid: None,
            },
            tasks,
            inbox: 0,
            rejected: 0,
            warnings: Vec::new(),
            current_work_problem: None,
            cluster: None,
            limits: None,
        }
    }

    #[test]
    fn spend_is_summed_exactly_per_submitter_over_the_tasks_listed() {
        let mut rejected = listed("rejected-x", Some(1001), Some(9.0), None);
        rejected.state = RecordStatus::Rejected.into();
        let view = view_of(vec![
            listed("a1", Some(1001), Some(0.1), None),
            listed("a2", Some(1001), Some(0.2), Some(0.05)),
            listed("b1", Some(1002), None, None),
            listed("n1", None, Some(0.5), None),
            rejected,
        ]);
        let spend = spend_by_submitter(&view);
        let lines: Vec<_> = spend
            .iter()
            .map(|l| {
                let who = l.submitter.as_ref().map(|s| s.uid);
                (
                    who,
                    l.tasks,
                    l.cost.map(|c| c.to_string()),
                    l.lost_cost_estimate,
                )
            })
            .collect();
        assert_eq!(
            lines,
            [
                (Some(1001), 2, Some("0.3".to_string()), Some(0.05)),
                (Some(1002), 1, None, None),
                (None, 1, Some("0.5".to_string()), None),
            ]
        );
        let section = spend_section(&view);
        assert!(section.contains("user1001   2      0.3+~0.05"), "{section}");
        assert!(section.contains("unknown    1      0.5"), "{section}");
        // Nothing reported a cost: no section.
        let quiet = view_of(vec![listed("b1", Some(1002), None, None)]);
        assert_eq!(spend_section(&quiet), "");
    }
}
