//! Task ids, checked in one place. An id names a task's files (`tasks/<id>.json`,
//! `incremental/<id>.json.gz`, `runs/<id>/`, ...), so it is parsed where it comes in — a task
//! file, a command-line argument, a directory listing, a control request, a record — and a
//! [`TaskId`] is known to be safe as a file name everywhere past that point.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Longest task id.
pub const MAX_ID_LEN: usize = 128;

/// A valid task id: `[A-Za-z0-9._-]{1,128}`, not starting with `.` (hidden and temp files) and
/// not ending in `.<digits>` (checkpoint generations are named `<id>.<generation>.json.gz`,
/// which would make such ids ambiguous).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TaskId(String);

/// Why a string is not a task id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{problem}")]
pub struct InvalidTaskId {
    /// The string as given.
    pub id: String,
    /// What is wrong with it, in words that follow the field or argument's name.
    pub problem: String,
}

impl TaskId {
    /// Check `id` and take it as a task id.
    pub fn parse(id: impl Into<String>) -> Result<TaskId, InvalidTaskId> {
        let id = id.into();
        match problem_with(&id) {
            None => Ok(TaskId(id)),
            Some(problem) => Err(InvalidTaskId { id, problem }),
        }
    }

    /// A fresh id for a task that came without one: the file's stem (cleaned up) and a
    /// suffix of letters and digits (such as [`crate::task::random_suffix`]).
    pub fn generate(stem: &str, suffix: &str) -> TaskId {
        let clean = |c: char| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-') {
                c
            } else {
                '-'
            }
        };
        let base: String = stem.chars().map(clean).collect();
        let base = match base.trim_matches('-') {
            "" => "task".to_string(),
            trimmed => trimmed.chars().take(100).collect(),
        };
        let suffix: String = suffix.chars().map(clean).take(20).collect();
        // Letters, digits, '_' and '-' only, not empty, at most 121 characters: valid.
        TaskId(format!("{base}-{suffix}"))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// What [`crate::task::Task::id`] answers for a task file that names no id and has not
    /// been given one yet: `task`, the stem [`TaskId::generate`] uses for a nameless file.
    pub fn unnamed() -> &'static TaskId {
        static UNNAMED: std::sync::OnceLock<TaskId> = std::sync::OnceLock::new();
        UNNAMED.get_or_init(|| TaskId("task".to_string()))
    }
}

/// What makes `id` no task id, if anything.
fn problem_with(id: &str) -> Option<String> {
    if id.is_empty() {
        return Some("must not be empty".into());
    }
    if id.len() > MAX_ID_LEN {
        return Some(format!(
            "is {} characters, longer than {MAX_ID_LEN}",
            id.len()
        ));
    }
    if let Some(bad) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Some(format!(
            "{id:?} contains {bad:?}; only letters, digits, '.', '_' and '-' are allowed"
        ));
    }
    if id.starts_with('.') {
        return Some(format!("{id:?} must not start with '.'"));
    }
    if let Some((_, tail)) = id.rsplit_once('.') {
        if !tail.is_empty() && tail.bytes().all(|b| b.is_ascii_digit()) {
            return Some(format!(
                "{id:?} ends in '.{tail}', which cairn reserves for checkpoint generations"
            ));
        }
    }
    None
}

impl TryFrom<String> for TaskId {
    type Error = InvalidTaskId;

    fn try_from(id: String) -> Result<TaskId, InvalidTaskId> {
        TaskId::parse(id)
    }
}

impl From<TaskId> for String {
    fn from(id: TaskId) -> String {
        id.0
    }
}

impl FromStr for TaskId {
    type Err = InvalidTaskId;

    fn from_str(id: &str) -> Result<TaskId, InvalidTaskId> {
        TaskId::parse(id)
    }
}

impl Deref for TaskId {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for TaskId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl AsRef<std::path::Path> for TaskId {
    fn as_ref(&self) -> &std::path::Path {
        self.0.as_ref()
    }
}

impl Borrow<str> for TaskId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

/// As a string is: `{:?}` quotes the id, as messages did when ids were strings.
impl fmt::Debug for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl PartialEq<str> for TaskId {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for TaskId {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

#[cfg(test)]
mod tests {
    use super::TaskId;

    #[test]
    fn ids_that_could_escape_or_collide_are_refused() {
        for bad in [
            "",
            ".",
            "..",
            "../x",
            "a/b",
            ".hidden",
            "x.3",
            "a b",
            "tab\there",
            "é",
            &"x".repeat(129),
        ] {
            let refused = TaskId::parse(bad).unwrap_err();
            assert_eq!(refused.id, bad);
            assert!(!refused.problem.is_empty());
        }
        for good in [
            "lit-review-42",
            "a.b",
            "run_2",
            "v1.2a",
            "X",
            "x.",
            &"x".repeat(128),
        ] {
            assert_eq!(TaskId::parse(good).unwrap().as_str(), good, "{good:?}");
        }
    }

    #[test]
    fn problems_read_after_the_name_of_what_was_wrong() {
        let problem = |id: &str| TaskId::parse(id).unwrap_err().to_string();
        assert_eq!(problem(""), "must not be empty");
        assert_eq!(
            problem("x.3"),
            "\"x.3\" ends in '.3', which cairn reserves for checkpoint generations"
        );
        assert!(problem("a/b").contains("only letters, digits"));
    }

    #[test]
    fn serde_checks_the_id_and_writes_a_plain_string() {
        let id: TaskId = serde_json::from_str("\"t-1\"").unwrap();
        assert_eq!(serde_json::to_string(&id).unwrap(), "\"t-1\"");
        let refused = serde_json::from_str::<TaskId>("\"../etc\"").unwrap_err();
        assert!(refused.to_string().contains("only letters"), "{refused}");
    }

    #[test]
    fn generated_ids_are_valid() {
        for (stem, suffix) in [
            ("report", "abc123"),
            ("my report.v2", "abc123"),
            ("...", "abc123"),
            ("x.3", "0"),
            (&"long".repeat(50), "ffffff"),
            ("", "../x"),
        ] {
            let id = TaskId::generate(stem, suffix);
            assert_eq!(TaskId::parse(id.as_str()), Ok(id.clone()), "{stem:?}");
        }
        assert_eq!(TaskId::generate("my report", "1a2b3c"), "my-report-1a2b3c");
    }
}
