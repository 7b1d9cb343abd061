//! Readers for the side files the fixtures log to: one line per event, beside the queue, so a
//! test sees what its commands did (which iterations started and ended, in which process).

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

/// One complete line of a side file: its first word (the event) and the rest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SideLine {
    pub event: String,
    pub rest: String,
}

impl SideLine {
    pub(crate) fn new(event: &str, rest: &str) -> SideLine {
        SideLine {
            event: event.to_string(),
            rest: rest.to_string(),
        }
    }
}

/// The side file's complete lines (a missing file has none; a line still being written is
/// left out).
pub(crate) fn side_lines(path: &Path) -> Vec<SideLine> {
    let text = fs::read_to_string(path).unwrap_or_default();
    let complete = match text.rfind('\n') {
        Some(end) => &text[..=end],
        None => "",
    };
    complete
        .lines()
        .map(|line| {
            let (event, rest) = line.split_once(' ').unwrap_or((line, ""));
            SideLine::new(event, rest)
        })
        .collect()
}

/// The iterations logged for `event` (`start`, `end`) by the worker fixtures, whose lines are
/// `<event> <iteration> ...`, in order.
pub(crate) fn logged_iterations(lines: &[SideLine], event: &str) -> Vec<u64> {
    lines
        .iter()
        .filter(|line| line.event == event)
        .map(|line| {
            let first = line.rest.split(' ').next().unwrap_or_default();
            first
                .parse()
                .unwrap_or_else(|_| panic!("no iteration in side-file line {line:?}"))
        })
        .collect()
}

/// One line of a `logging_loop.py` side file.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SideEvent {
    /// `start` or `end`.
    pub event: String,
    pub task: String,
    pub iteration: u64,
    pub attempt: u32,
    pub pid: i32,
    /// On a shared queue: the daemon that ran it, its lease epoch, and when (Unix seconds).
    pub lease: Option<SideLease>,
}

/// Who ran a logged iteration of a shared queue's task, and when.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SideLease {
    pub node: String,
    pub epoch: u64,
    pub at: f64,
}

/// The side file's complete lines (a missing file has none; a line still being written is
/// left out).
pub(crate) fn side_events(path: &Path) -> Vec<SideEvent> {
    side_lines(path)
        .into_iter()
        .map(|line| {
            let f: Vec<&str> = line.rest.split(' ').collect();
            assert!(f.len() == 4 || f.len() == 7, "bad side-file line {line:?}");
            SideEvent {
                event: line.event.clone(),
                task: f[0].to_string(),
                iteration: f[1].parse().unwrap(),
                attempt: f[2].parse().unwrap(),
                pid: f[3].parse().unwrap(),
                lease: (f.len() == 7).then(|| SideLease {
                    node: f[4].to_string(),
                    epoch: f[5].parse().unwrap(),
                    at: f[6].parse().unwrap(),
                }),
            }
        })
        .collect()
}

/// The iterations that ran to their end, in order, per the side file.
pub(crate) fn ended_iterations(path: &Path) -> Vec<u64> {
    side_events(path)
        .into_iter()
        .filter(|e| e.event == "end")
        .map(|e| e.iteration)
        .collect()
}

/// How many times each iteration was started, per the side file.
pub(crate) fn start_counts(path: &Path) -> BTreeMap<u64, usize> {
    let mut counts = BTreeMap::new();
    for e in side_events(path) {
        if e.event == "start" {
            *counts.entry(e.iteration).or_default() += 1;
        }
    }
    counts
}
