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

/// Why a task id (or a phase name, which follows the same rules but for the generation
/// suffix) is refused; the text reads after the field it is about
/// (`task id "a/b" contains '/'; ...`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidName {
    #[error("must not be empty")]
    Empty,
    #[error("is {len} characters, longer than {max}")]
    TooLong { len: usize, max: usize },
    #[error("{name:?} contains {bad:?}; only letters, digits, '.', '_' and '-' are allowed")]
    Character { name: String, bad: char },
    #[error("{name:?} must not start with '.'")]
    LeadingDot { name: String },
    #[error("{id:?} ends in '.{tail}', which cairn reserves for checkpoint generations")]
    GenerationSuffix { id: String, tail: String },
}

impl TaskId {
    /// Check `id` and take it as a task id.
    pub fn parse(id: impl Into<String>) -> Result<TaskId, InvalidName> {
        let id = id.into();
        check_name(&id, MAX_ID_LEN)?;
        if let Some((_, tail)) = id.rsplit_once('.') {
            if !tail.is_empty() && tail.bytes().all(|b| b.is_ascii_digit()) {
                let tail = tail.to_string();
                return Err(InvalidName::GenerationSuffix { id, tail });
            }
        }
        Ok(TaskId(id))
    }

    /// A fresh id for a task that came without one: the file's stem (cleaned up) and a
    /// suffix of letters and digits (a random one, at intake and `cairn submit`).
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

    /// What `Task::id` answers for a task file that names no id and has not
    /// been given one yet: `task`, the stem [`TaskId::generate`] uses for a nameless file.
    pub fn unnamed() -> &'static TaskId {
        static UNNAMED: std::sync::OnceLock<TaskId> = std::sync::OnceLock::new();
        UNNAMED.get_or_init(|| TaskId("task".to_string()))
    }
}

/// A name that can name a file: `[A-Za-z0-9._-]{1,max_len}`, not starting with `.` (hidden and
/// temp files).
pub(crate) fn check_name(name: &str, max_len: usize) -> Result<(), InvalidName> {
    if name.is_empty() {
        return Err(InvalidName::Empty);
    }
    if name.len() > max_len {
        return Err(InvalidName::TooLong {
            len: name.len(),
            max: max_len,
        });
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(InvalidName::Character {
            name: name.to_string(),
            bad,
        });
    }
    if name.starts_with('.') {
        return Err(InvalidName::LeadingDot {
            name: name.to_string(),
        });
    }
    Ok(())
}

impl TryFrom<String> for TaskId {
    type Error = InvalidName;

    fn try_from(id: String) -> Result<TaskId, InvalidName> {
        TaskId::parse(id)
    }
}

impl From<TaskId> for String {
    fn from(id: TaskId) -> String {
        id.0
    }
}

impl FromStr for TaskId {
    type Err = InvalidName;

    fn from_str(id: &str) -> Result<TaskId, InvalidName> {
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
            assert!(TaskId::parse(bad).is_err(), "{bad:?} was accepted");
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
