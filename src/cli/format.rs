//! How the operator commands present what the queue's read model gives them: durations,
//! costs, rates, sizes, tables, the `--json` fields shared by `status` and `show`, and stdout.

use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use crate::queue::{ClusterView, DaemonInfo, QueueView, TaskView};

/// The version of the `--json` documents of `status`, `show` and `history`.
pub(super) const JSON_VERSION: u32 = 1;

/// The daemon as the `--json` documents give it.
pub(super) fn daemon_json(daemon: DaemonInfo) -> Value {
    json!({"running": daemon.running, "pid": daemon.pid})
}

/// "running (pid 12)" or "not running".
pub(super) fn describe_daemon(daemon: DaemonInfo) -> String {
    match (daemon.running, daemon.pid) {
        (true, Some(pid)) => format!("running (pid {pid})"),
        (true, None) => "running".into(),
        _ => "not running".into(),
    }
}

/// The daemons of a queue: the one daemon of a queue directory, or those sharing a database.
pub(super) fn describe_daemons(view: &QueueView) -> String {
    match &view.cluster {
        Some(cluster) => describe_nodes(cluster, view.now),
        None => format!("daemon {}", describe_daemon(view.daemon)),
    }
}

/// `daemons a (alive, 2 leases), b (gone, last seen 5m ago)`, or `no daemon registered`.
pub(super) fn describe_nodes(cluster: &ClusterView, now: DateTime<Utc>) -> String {
    if cluster.nodes.is_empty() {
        return "no daemon registered".into();
    }
    let nodes: Vec<String> = cluster
        .nodes
        .iter()
        .map(|node| {
            let ago = short_duration((now - node.last_seen_at).num_seconds().max(0) as u64);
            if node.alive {
                format!("{} (alive, {} lease(s))", node.name, node.leases)
            } else {
                format!("{} (gone, last seen {ago} ago)", node.name)
            }
        })
        .collect();
    format!("daemons {}", nodes.join(", "))
}

/// The daemons of a shared queue as the `--json` documents give them.
pub(super) fn nodes_json(cluster: &ClusterView) -> Value {
    cluster
        .nodes
        .iter()
        .map(|node| {
            json!({
                "name": node.name,
                "alive": node.alive,
                "leases": node.leases,
                "started_at": rfc3339(node.started_at),
                "last_seen_at": rfc3339(node.last_seen_at),
            })
        })
        .collect()
}

/// Add the lease of a task of a shared queue to its `--json` object: the node holding it
/// (`null` when none does), its epoch and when it ends.
pub(super) fn add_lease_json(object: &mut Value, task: &TaskView) {
    let lease = task.lease.as_ref();
    object["node"] = json!(lease.map(|l| &l.node));
    object["lease_epoch"] = json!(lease.map(|l| l.epoch));
    object["lease_expires_at"] = json!(lease.map(|l| rfc3339(l.expires_at)));
    object["lease_live"] = json!(lease.map(|l| l.live));
}

/// The NODE and LEASE cells of a task of a shared queue: `node-a`, `25s left` (`<1s left`),
/// or `expired 3s ago, awaiting takeover` (its holder died, froze or lost the database: the
/// next claim takes it), `-` when no daemon holds it.
pub(super) fn lease_cells(task: &TaskView, now: DateTime<Utc>) -> [String; 2] {
    let Some(lease) = &task.lease else {
        return ["-".into(), "-".into()];
    };
    let left = (lease.expires_at - now).num_seconds();
    let when = if !lease.live {
        format!(
            "expired {} ago, awaiting takeover",
            short_duration(left.unsigned_abs())
        )
    } else if left < 1 {
        "<1s left".to_string()
    } else {
        format!("{} left", short_duration(left as u64))
    };
    [lease.node.clone(), when]
}

/// The task as `status --json` lists it (documented in docs/cli.md).
pub(super) fn task_json(task: &TaskView, now: DateTime<Utc>) -> Value {
    json!({
        "id": task.id,
        "state": task.state.as_str(),
        "phase": task.phase,
        "phase_index": task.phase_index,
        "phase_count": task.phase_count,
        "iteration": task.iteration,
        "total": task.total,
        "rate_per_min": task.rate_per_min.map(round2),
        "eta_seconds": task.eta_seconds,
        "cost": task.cost,
        "lost_cost_estimate": task.lost_cost_estimate,
        "max_cost": task.max_cost,
        "paused_for": task.paused_for,
        "last_checkpoint_at": task.last_checkpoint_at.map(rfc3339),
        "last_checkpoint_age_seconds": task.checkpoint_age(now),
        "attempts": task.attempts,
        "failed_attempts": task.failed_attempts,
        "error": task.error,
        "submitted_by": task.submitted_by(),
    })
}

/// The STATE cell: the state, and for a task a policy of its own paused, which one
/// (`paused(budget)`, `paused(retries_exhausted)`), without spaces as table cells are.
pub(super) fn state_cell(task: &TaskView) -> String {
    match &task.paused_for {
        Some(pause) => format!("{}({})", task.state.as_str(), pause.reason.as_str()),
        None => task.state.as_str().to_string(),
    }
}

/// RFC 3339 with milliseconds, UTC.
pub(super) fn rfc3339(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// A duration for people: `45s`, `3m05s`, `2h05m`, `3d04h`.
pub(super) fn short_duration(seconds: u64) -> String {
    let (d, h, m, s) = (
        seconds / 86_400,
        seconds / 3600 % 24,
        seconds / 60 % 60,
        seconds % 60,
    );
    if d > 0 {
        format!("{d}d{h:02}h")
    } else if h > 0 {
        format!("{h}h{m:02}m")
    } else if m > 0 {
        format!("{m}m{s:02}s")
    } else {
        format!("{s}s")
    }
}

/// The committed cost, and apart from it the estimate for iterations lost to crashes:
/// `0.03+~0.02`, without spaces, as table cells are (`None` when neither is known).
pub(super) fn cost_cell(task: &TaskView) -> Option<String> {
    match (task.cost, task.lost_cost_estimate) {
        (None, None) => None,
        (cost, None) => cost.map(format_cost),
        (cost, Some(estimate)) => Some(format!(
            "{}+~{}",
            format_cost(cost.unwrap_or(0.0)),
            format_cost(estimate)
        )),
    }
}

/// A cost for people: up to 4 decimals, trailing zeros dropped.
pub(super) fn format_cost(cost: f64) -> String {
    let text = format!("{cost:.4}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text.is_empty() || text == "-" {
        "0".into()
    } else {
        text.to_string()
    }
}

/// A rate for people: `2.5/min`, `40/min`.
pub(super) fn format_rate(per_min: f64) -> String {
    if per_min >= 10.0 {
        format!("{per_min:.0}/min")
    } else if per_min >= 0.1 {
        format!("{per_min:.1}/min")
    } else {
        format!("{:.1}/h", per_min * 60.0)
    }
}

/// A size for people: `512 B`, `1.2 KiB`, `3.4 MiB`.
pub(super) fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// `text` safe to print on a terminal: control characters (a newline would forge a line, an
/// escape sequence would reach the terminal) and the bidirectional overrides that reorder what
/// is shown are written as Rust escapes (`\n`, `\u{1b}`, `\u{202e}`), and so is a backslash
/// (`\\`), so that a name cannot fake an escape. Names and texts from submitters (file names, control
/// requests, reasons quoting them) pass through it wherever `status`, `show` and `history`
/// print them for people; `--json` output is escaped by JSON itself.
pub(super) fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| {
        c.is_control()
            || c == '\\'
            || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !text.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unsafe_char(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Left-aligned columns separated by two spaces; the last column is not padded. Every cell is
/// made [`printable`].
pub(super) fn render_table(header: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            row.iter()
                .map(|cell| printable(cell).into_owned())
                .collect()
        })
        .collect();
    let rows = rows.as_slice();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        let last = cells.len().saturating_sub(1);
        for (i, cell) in cells.iter().enumerate() {
            out.push_str(cell);
            if i < last {
                let pad = widths[i] - cell.chars().count() + 2;
                out.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push('\n');
        out
    };
    let mut out = line(header.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// A task id as given on the command line, checked before it names any file.
pub(super) fn task_id_arg(id: &str) -> anyhow::Result<crate::task_id::TaskId> {
    use anyhow::Context;
    crate::task_id::TaskId::parse(id).with_context(|| format!("{id:?} is not a task id"))
}

#[cfg(test)]
mod printable_tests {
    use super::printable;

    #[test]
    fn control_characters_and_bidi_overrides_are_escaped_and_plain_text_is_kept() {
        assert_eq!(
            printable("plain name-1.json ünïcode"),
            "plain name-1.json ünïcode"
        );
        assert_eq!(
            printable("bad\nFORGED LINE\u{1b}[31mred\u{202e}txt.json"),
            "bad\\nFORGED LINE\\u{1b}[31mred\\u{202e}txt.json"
        );
        // A backslash typed by a user is told apart from an escape.
        assert_eq!(printable("a\\nb"), "a\\\\nb");
        assert_eq!(printable("a\\nb\tc"), "a\\\\nb\\tc");
    }
}

#[cfg(test)]
mod tests {
    use super::{format_bytes, format_cost, format_rate, render_table, short_duration};

    #[test]
    fn people_formats() {
        assert_eq!(short_duration(5), "5s");
        assert_eq!(short_duration(65), "1m05s");
        assert_eq!(short_duration(7_500), "2h05m");
        assert_eq!(short_duration(90_000), "1d01h");
        assert_eq!(format_cost(0.125), "0.125");
        assert_eq!(format_cost(2.0), "2");
        assert_eq!(format_rate(2.54), "2.5/min");
        assert_eq!(format_rate(40.4), "40/min");
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(1536), "1.5 KiB");
        assert_eq!(
            render_table(&["A", "BB"], &[vec!["xyz".into(), "1".into()]]),
            "A    BB\nxyz  1\n"
        );
    }
}
