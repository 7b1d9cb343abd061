//! What one run of the daemon did, for the closing summary of `cairn run` and its exit code.

use std::fmt::Write;

use crate::queue::RecordLocations;
use crate::store::records::RecordStatus;

/// Names kept per kind of outcome; beyond this, only the count (a service may run for months).
const LISTED_NAMES: usize = 10;

/// How many tasks (or files) had one outcome, and the first few of their names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    pub count: u64,
    /// The first [`LISTED_NAMES`] names, in the order they came.
    pub first: Vec<String>,
}

impl Tally {
    pub fn add(&mut self, name: impl Into<String>) {
        self.count += 1;
        if self.first.len() < LISTED_NAMES {
            self.first.push(name.into());
        }
    }

    /// The names kept, and how many more there were.
    fn listed(&self) -> String {
        let mut shown = self.first.join(", ");
        let more = self.count - self.first.len() as u64;
        if more > 0 {
            let _ = write!(shown, " and {more} more");
        }
        shown
    }
}

/// Tasks that ended, and files rejected, while this daemon ran; and what it left for later.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunSummary {
    /// Where the records of the queue are.
    pub records: RecordLocations,
    /// Tasks that finished (with a done record).
    pub done: Tally,
    /// Tasks that ended with a failed record: `failed`, or `cancelled` and `budget_exceeded`
    /// (named as `id (status)`).
    pub failed: Tally,
    /// Inbox files refused at intake, by their record's name (`rejected-<stem>-<suffix>`).
    pub rejected: Tally,
    /// Tasks held by `cairn pause` when the daemon returned: they wait for `cairn resume`.
    pub paused: Tally,
    /// Other unfinished tasks when the daemon returned (after a stop): the next run resumes
    /// them, or on a shared queue any daemon that shares it.
    pub unfinished: u64,
    /// The queue is shared with other daemons (PostgreSQL): what this one leaves is handed
    /// back to all of them.
    pub shared_queue: bool,
}

impl RunSummary {
    /// Note a task that ended with a failed record of `status`.
    pub fn add_failed(&mut self, id: &str, status: &RecordStatus) {
        if *status == RecordStatus::Failed {
            self.failed.add(id);
        } else {
            self.failed.add(format!("{id} ({})", status.as_str()));
        }
    }

    /// Did a task of this run end other than done, or was a file rejected?
    pub fn any_failed(&self) -> bool {
        self.failed.count > 0 || self.rejected.count > 0
    }

    /// The closing lines `cairn run` prints, for people.
    pub fn render(&self) -> String {
        let mut out = format!(
            "this run: {} done, {} failed, {} rejected",
            self.done.count, self.failed.count, self.rejected.count
        );
        if self.paused.count > 0 {
            let _ = write!(out, ", {} paused", self.paused.count);
        }
        if self.unfinished > 0 {
            let _ = write!(out, ", {} unfinished", self.unfinished);
        }
        out.push('\n');
        let records = &self.records;
        if self.done.count > 0 {
            let _ = writeln!(out, "  results:  {}", records.done);
        }
        if self.failed.count > 0 {
            let _ = writeln!(
                out,
                "  failed:   {} in {}; `cairn show ID` tells why",
                self.failed.listed(),
                records.failed
            );
        }
        if self.rejected.count > 0 {
            let _ = writeln!(
                out,
                "  rejected: {} in {}",
                self.rejected.listed(),
                records.failed
            );
        }
        if self.paused.count > 0 {
            let _ = writeln!(
                out,
                "  paused:   {}; they stay paused until `cairn resume ID`",
                self.paused.listed()
            );
        }
        if self.unfinished > 0 {
            let when = if self.shared_queue {
                "on another daemon sharing the queue (handed back now), or here at the next \
                 `cairn run`"
            } else {
                "at the next `cairn run`"
            };
            let _ = writeln!(
                out,
                "  unfinished tasks continue from their checkpoints {when}"
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::RunSummary;
    use crate::queue::RecordLocations;
    use crate::store::records::RecordStatus;

    fn summary() -> RunSummary {
        RunSummary {
            records: RecordLocations {
                done: "/q/d/<id>.json".into(),
                failed: "/q/f/".into(),
            },
            ..RunSummary::default()
        }
    }

    #[test]
    fn names_each_outcome_and_where_it_is() {
        let mut summary = summary();
        summary.done.add("a");
        summary.done.add("b");
        summary.add_failed("c", &RecordStatus::Failed);
        summary.add_failed("d", &RecordStatus::Cancelled);
        summary.rejected.add("rejected-x-1a2b3c");
        summary.paused.add("e");
        assert!(summary.any_failed());
        assert_eq!(
            summary.render(),
            "this run: 2 done, 2 failed, 1 rejected, 1 paused\n\
             \x20 results:  /q/d/<id>.json\n\
             \x20 failed:   c, d (cancelled) in /q/f/; `cairn show ID` tells why\n\
             \x20 rejected: rejected-x-1a2b3c in /q/f/\n\
             \x20 paused:   e; they stay paused until `cairn resume ID`\n"
        );
    }

    #[test]
    fn unfinished_tasks_continue_where_the_queue_says() {
        let mut summary = summary();
        summary.unfinished = 2;
        assert!(summary.render().ends_with(
            "  unfinished tasks continue from their checkpoints at the next `cairn run`\n"
        ));
        summary.shared_queue = true;
        let rendered = summary.render();
        assert!(
            rendered.ends_with(
                "  unfinished tasks continue from their checkpoints on another daemon sharing \
                 the queue (handed back now), or here at the next `cairn run`\n"
            ),
            "{rendered}"
        );
    }

    #[test]
    fn a_clean_run_fails_nothing_and_long_lists_keep_only_their_first_names() {
        let mut summary = summary();
        for i in 0..12 {
            summary.done.add(i.to_string());
            summary.paused.add(i.to_string());
        }
        assert!(!summary.any_failed());
        assert_eq!(
            summary.done.first.len(),
            10,
            "names beyond ten are not kept"
        );
        let rendered = summary.render();
        assert!(
            rendered.starts_with("this run: 12 done, 0 failed, 0 rejected, 12 paused\n"),
            "{rendered}"
        );
        assert!(
            rendered.contains("  paused:   0, 1, 2, 3, 4, 5, 6, 7, 8, 9 and 2 more;"),
            "{rendered}"
        );
    }
}
