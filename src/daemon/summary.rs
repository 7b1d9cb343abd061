//! What one run of the daemon did, for the closing summary of `cairn run` and its exit code.

use std::fmt::Write;
use std::path::PathBuf;

/// Ids listed by name in the summary; beyond this, only the count.
const LISTED_IDS: usize = 10;

/// Tasks that ended, and files rejected, while this daemon ran; and what it left for later.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunSummary {
    /// The queue directory, absolute.
    pub queue: PathBuf,
    /// Tasks that finished (`done/<id>.json`).
    pub done: Vec<String>,
    /// Tasks that ended in `failed/<id>.json`, with their status (`failed`, `cancelled`,
    /// `budget_exceeded`).
    pub failed: Vec<(String, String)>,
    /// Inbox files refused at intake (`failed/<record>.json`).
    pub rejected: Vec<String>,
    /// Tasks held by `cairn pause` when the daemon returned: they wait for `cairn resume`.
    pub paused: Vec<String>,
    /// Other unfinished tasks when the daemon returned (after a stop): the next run resumes
    /// them.
    pub unfinished: usize,
}

impl RunSummary {
    /// Did a task of this run end other than done, or was a file rejected?
    pub fn any_failed(&self) -> bool {
        !self.failed.is_empty() || !self.rejected.is_empty()
    }

    /// The closing lines `cairn run` prints, for people.
    pub fn render(&self) -> String {
        let mut out = format!(
            "this run: {} done, {} failed, {} rejected",
            self.done.len(),
            self.failed.len(),
            self.rejected.len()
        );
        if !self.paused.is_empty() {
            let _ = write!(out, ", {} paused", self.paused.len());
        }
        if self.unfinished > 0 {
            let _ = write!(out, ", {} unfinished", self.unfinished);
        }
        out.push('\n');
        let queue = self.queue.display();
        if !self.done.is_empty() {
            let _ = writeln!(out, "  results:  {queue}/done/<id>.json");
        }
        if !self.failed.is_empty() {
            let ids: Vec<String> = self
                .failed
                .iter()
                .map(|(id, status)| {
                    if status == "failed" {
                        id.clone()
                    } else {
                        format!("{id} ({status})")
                    }
                })
                .collect();
            let _ = writeln!(
                out,
                "  failed:   {} in {queue}/failed/; `cairn show ID` tells why",
                listed(&ids)
            );
        }
        if !self.rejected.is_empty() {
            let _ = writeln!(
                out,
                "  rejected: {} in {queue}/failed/",
                listed(&self.rejected)
            );
        }
        if !self.paused.is_empty() {
            let _ = writeln!(
                out,
                "  paused:   {}; they stay paused until `cairn resume ID`",
                listed(&self.paused)
            );
        }
        if self.unfinished > 0 {
            let _ = writeln!(
                out,
                "  unfinished tasks continue from their checkpoints at the next `cairn run`"
            );
        }
        out
    }
}

/// The first few ids, and how many more.
fn listed(ids: &[String]) -> String {
    let mut shown = ids[..ids.len().min(LISTED_IDS)].join(", ");
    if ids.len() > LISTED_IDS {
        let _ = write!(shown, " and {} more", ids.len() - LISTED_IDS);
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::RunSummary;

    #[test]
    fn names_each_outcome_and_where_it_is() {
        let summary = RunSummary {
            queue: "/q".into(),
            done: vec!["a".into(), "b".into()],
            failed: vec![
                ("c".into(), "failed".into()),
                ("d".into(), "cancelled".into()),
            ],
            rejected: vec!["rejected-x-1a2b3c".into()],
            paused: vec!["e".into()],
            unfinished: 0,
        };
        assert!(summary.any_failed());
        assert_eq!(
            summary.render(),
            "this run: 2 done, 2 failed, 1 rejected, 1 paused\n\
             \x20 results:  /q/done/<id>.json\n\
             \x20 failed:   c, d (cancelled) in /q/failed/; `cairn show ID` tells why\n\
             \x20 rejected: rejected-x-1a2b3c in /q/failed/\n\
             \x20 paused:   e; they stay paused until `cairn resume ID`\n"
        );
    }

    #[test]
    fn a_clean_run_fails_nothing_and_lists_long_runs_by_count() {
        let summary = RunSummary {
            queue: "/q".into(),
            done: (0..12).map(|i| i.to_string()).collect(),
            ..RunSummary::default()
        };
        assert!(!summary.any_failed());
        assert_eq!(
            summary.render(),
            "this run: 12 done, 0 failed, 0 rejected\n  results:  /q/done/<id>.json\n"
        );
        let many = RunSummary {
            paused: (0..12).map(|i| i.to_string()).collect(),
            ..RunSummary::default()
        };
        assert!(many
            .render()
            .contains("0, 1, 2, 3, 4, 5, 6, 7, 8, 9 and 2 more"));
    }
}
