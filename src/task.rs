//! The task file: its types, parsing and validation, with errors that name the field at fault.
//!
//! A task file is JSON. Unknown fields are errors (free-form data goes under `meta`), and every
//! error says which field is wrong and why, so that a rejected file can be fixed without guessing.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::submitter::Submitter;
use crate::task_id::{check_name, TaskId};

/// Largest task file cairn accepts; larger files are rejected unread.
pub const MAX_TASK_FILE_BYTES: u64 = 1024 * 1024;

/// A task as written by a user (and, with its id filled in, as kept in `tasks/<id>.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Task {
    /// Names the task's files; generated at intake when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<TaskId>,
    /// Higher runs first among pending tasks.
    #[serde(default)]
    pub priority: i32,
    /// Working directory of the task's commands; relative paths are taken from the queue directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<PathBuf>,
    /// Extra environment for the task's commands.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub retry: RetryPolicy,
    /// Cost limits; cost is what loop replies and worker messages report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
    pub phases: Vec<Phase>,
    /// Free-form user data, kept and never interpreted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<Value>,
    /// Who submitted the task: filled in by the daemon at intake from the owner of the file
    /// it took (see [`crate::submitter`]). A task file that sets it is rejected
    /// ([`Task::parse`]); only the definitions cairn stores carry it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitted_by: Option<Submitter>,
}

/// Limits on what a task may spend.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// The task stops before its next iteration once its summed cost reaches this.
    pub max_cost: f64,
    /// What a task whose spend reached `max_cost` becomes: failed, or paused until an operator
    /// raises the limit (`cairn budget`) and resumes it.
    #[serde(default, skip_serializing_if = "OnExceed::is_fail")]
    pub on_exceed: OnExceed,
}

/// What becomes of a task whose spend reached its budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnExceed {
    /// Recorded in `failed/` with status `budget_exceeded`.
    #[default]
    Fail,
    /// Held paused with its checkpoints, the reason shown, until `cairn resume`.
    Pause,
}

impl OnExceed {
    fn is_fail(&self) -> bool {
        *self == OnExceed::Fail
    }
}

/// What becomes of a task whose failed attempts reached `retry.max_attempts`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnExhausted {
    /// Recorded in `failed/`.
    #[default]
    Fail,
    /// Held paused with its last error, until an operator fixes the cause and resumes it
    /// (with a fresh allowance of attempts).
    Pause,
}

impl OnExhausted {
    fn is_fail(&self) -> bool {
        *self == OnExhausted::Fail
    }
}

/// Read `"fail"` or `"pause"`, the words of both policies, with an error that says so (serde's
/// own for a value of the wrong type reads as a JSON syntax error).
fn fail_or_pause<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    let value = Value::deserialize(d)?;
    match value.as_str() {
        Some("fail") => Ok(false),
        Some("pause") => Ok(true),
        _ => Err(serde::de::Error::custom(format!(
            "{value} is not one of \"fail\", \"pause\""
        ))),
    }
}

impl<'de> Deserialize<'de> for OnExceed {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match fail_or_pause(d)? {
            true => OnExceed::Pause,
            false => OnExceed::Fail,
        })
    }
}

impl<'de> Deserialize<'de> for OnExhausted {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match fail_or_pause(d)? {
            true => OnExhausted::Pause,
            false => OnExhausted::Fail,
        })
    }
}

/// How often and how patiently a failing task is tried again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryPolicy {
    /// Failed attempts after which the task goes to `failed/`.
    #[serde(default = "default_max_attempts")]
    pub max_attempts: u32,
    /// Wait before the second attempt; doubled for each later one, up to `max_backoff`.
    #[serde(default = "default_backoff", with = "humantime_serde_compat")]
    pub backoff: Duration,
    #[serde(default = "default_max_backoff", with = "humantime_serde_compat")]
    pub max_backoff: Duration,
    /// What a task becomes once its attempts are used up.
    #[serde(default, skip_serializing_if = "OnExhausted::is_fail")]
    pub on_exhausted: OnExhausted,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: default_max_attempts(),
            backoff: default_backoff(),
            max_backoff: default_max_backoff(),
            on_exhausted: OnExhausted::Fail,
        }
    }
}

impl RetryPolicy {
    /// The wait after `failures` failed attempts (1 → `backoff`, 2 → twice that, ...), capped.
    pub fn delay_after(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        self.backoff
            .checked_mul(1u32 << doublings)
            .unwrap_or(self.max_backoff)
            .min(self.max_backoff)
    }
}

fn default_max_attempts() -> u32 {
    3
}
fn default_backoff() -> Duration {
    Duration::from_secs(10)
}
fn default_max_backoff() -> Duration {
    Duration::from_secs(600)
}

/// Durations in task files are human-readable strings such as `"30s"` or `"5m"`.
mod humantime_serde_compat {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(&text).map_err(|e| {
            serde::de::Error::custom(format!("{text:?} is not a duration like \"30s\": {e}"))
        })
    }

    pub(super) mod option {
        use serde::{Deserializer, Serializer};
        use std::time::Duration;

        pub(crate) fn serialize<S: Serializer>(
            d: &Option<Duration>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            match d {
                Some(d) => super::serialize(d, s),
                None => s.serialize_none(),
            }
        }
        pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<Duration>, D::Error> {
            super::deserialize(d).map(Some)
        }
    }
}

/// What cairn does with a phase's command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PhaseKind {
    /// Run once; stdout (JSON) is the phase output.
    #[default]
    Once,
    /// cairn drives the loop: one command run per iteration, state checkpointed in between.
    Loop,
    /// One command run per item of a list.
    Items,
    /// One long-running process reporting its own checkpoints.
    Worker,
}

impl PhaseKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PhaseKind::Once => "once",
            PhaseKind::Loop => "loop",
            PhaseKind::Items => "items",
            PhaseKind::Worker => "worker",
        }
    }
}

/// One step of a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Phase {
    pub name: String,
    #[serde(default)]
    pub kind: PhaseKind,
    /// The command and its arguments (no shell).
    pub run: Vec<String>,
    /// Kill one run of the command after this long (the attempt fails).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "humantime_serde_compat::option"
    )]
    pub timeout: Option<Duration>,
    /// `loop`: stop after this many iterations at the latest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_iterations: Option<u64>,
    /// `loop`: the state given to iteration 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_state: Option<Value>,
    /// Iterative kinds: write the iteration checkpoint every N completed iterations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_every: Option<u64>,
    /// `items`: the literal list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items: Option<Vec<Value>>,
    /// `items`: the earlier phase whose output is the list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items_from: Option<String>,
    /// `items`: runs at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    /// `worker`: kill a worker silent for longer than this.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "humantime_serde_compat::option"
    )]
    pub heartbeat_timeout: Option<Duration>,
}

impl Phase {
    /// Iterations per checkpoint write (at least 1).
    pub fn checkpoint_every(&self) -> u64 {
        self.checkpoint_every.unwrap_or(1).max(1)
    }
}

/// Why a task file was refused: the field at fault (a path like `phases[1].run`) and the problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskError {
    /// `None` when the problem is with the file as a whole (not JSON, too large, ...).
    pub field: Option<String>,
    pub problem: String,
    /// Further problems found in the same file, so that its author fixes them all at once
    /// (validation goes on after the first; a file that does not parse has one).
    pub more: Vec<TaskError>,
}

impl TaskError {
    pub fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        TaskError {
            field: Some(field.into()),
            problem: problem.into(),
            more: Vec::new(),
        }
    }

    pub fn whole_file(problem: impl Into<String>) -> Self {
        TaskError {
            field: None,
            problem: problem.into(),
            more: Vec::new(),
        }
    }

    /// The first of `problems` carrying the rest, or `None` when there is none.
    fn from_all(problems: Vec<TaskError>) -> Option<TaskError> {
        let mut problems = problems.into_iter();
        let mut first = problems.next()?;
        first.more.extend(problems);
        Some(first)
    }
}

impl fmt::Display for TaskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.field {
            Some(field) => write!(f, "field `{field}`: {}", self.problem)?,
            None => f.write_str(&self.problem)?,
        }
        for more in &self.more {
            write!(f, "; and {more}")?;
        }
        Ok(())
    }
}

impl std::error::Error for TaskError {}

impl Task {
    /// Parse and validate a task file's bytes, as a user wrote them: `submitted_by` is the
    /// daemon's to fill in, so a file that sets it is refused.
    pub fn parse(bytes: &[u8]) -> Result<Task, TaskError> {
        if bytes.len() as u64 > MAX_TASK_FILE_BYTES {
            return Err(TaskError::whole_file(format!(
                "file is {} bytes, larger than the limit of {MAX_TASK_FILE_BYTES} bytes",
                bytes.len()
            )));
        }
        let task = Self::parse_unlimited(bytes)?;
        if task.submitted_by.is_some() {
            return Err(TaskError::new(
                "submitted_by",
                "is recorded by cairn (the owner of the file taken from the inbox) and cannot \
                 be set in a task file; remove it",
            ));
        }
        Ok(task)
    }

    fn parse_unlimited(bytes: &[u8]) -> Result<Task, TaskError> {
        check_shape(bytes)?;
        let mut de = serde_json::Deserializer::from_slice(bytes);
        let mut task: Task = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            let problem = if inner.is_syntax() || inner.is_eof() {
                format!("not valid JSON: {inner}")
            } else {
                inner.to_string()
            };
            if path == "." || path.is_empty() {
                TaskError::whole_file(problem)
            } else {
                TaskError::new(path, problem)
            }
        })?;
        de.end()
            .map_err(|e| TaskError::whole_file(format!("not valid JSON: {e}")))?;
        task.validate()?;
        task.shrink_to_fit();
        Ok(task)
    }

    /// Give back the room the parser's growing lists left: a daemon holds every task in
    /// flight, and a one-phase task's list had room for four phases (about 750 bytes unused,
    /// 7.5 MB at 10,000 tasks).
    fn shrink_to_fit(&mut self) {
        self.phases.shrink_to_fit();
        for phase in &mut self.phases {
            phase.run.shrink_to_fit();
        }
    }

    /// Parse a task cairn stored itself (`tasks/<id>.json`): validated like any task, but
    /// without the size limit, which applies to what users submit — the stored, pretty-printed
    /// form of a task near the limit is larger than the file that was accepted.
    pub fn parse_stored(bytes: &[u8]) -> Result<Task, TaskError> {
        Self::parse_unlimited(bytes)
    }

    /// The task as cairn keeps it in `tasks/<id>.json`.
    pub fn to_json_bytes(&self) -> Vec<u8> {
        // Serializing plain data with string keys cannot fail.
        let mut bytes = serde_json::to_vec_pretty(self).unwrap_or_default();
        bytes.push(b'\n');
        bytes
    }

    /// The id. Intake (and `cairn submit`, `cairn fork`) fill it in before a task is accepted,
    /// so every task the daemon holds has one; a task read from a file that has none, not
    /// named yet, answers [`TaskId::unnamed`].
    pub fn id(&self) -> &TaskId {
        self.id.as_ref().unwrap_or_else(|| TaskId::unnamed())
    }

    /// Who submitted the task (the daemon records it at intake); `None` for a task accepted
    /// before cairn recorded submitters, or one not taken in by a daemon yet. The scheduler's
    /// way to tell whose a pending task is.
    pub fn submitted_by(&self) -> Option<&Submitter> {
        self.submitted_by.as_ref()
    }

    /// Problems that do not make the task invalid but will likely make it fail, for `validate`
    /// and `submit` to warn about. Only an absolute `cwd` is checked: a relative one is taken
    /// from the queue directory, which the submitting shell may not be in.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        if let Some(cwd) = self.cwd.as_deref().filter(|cwd| cwd.is_absolute()) {
            match std::fs::metadata(cwd) {
                Ok(meta) if meta.is_dir() => {}
                Ok(_) => warnings.push(format!("cwd {} is not a directory", cwd.display())),
                Err(e) => warnings.push(format!("cwd {}: {e}", cwd.display())),
            }
        }
        warnings
    }

    /// Check everything the types alone do not; every problem found, not only the first.
    pub fn validate(&self) -> Result<(), TaskError> {
        let mut problems = Vec::new();
        if let Some(budget) = &self.budget {
            if !(budget.max_cost.is_finite() && budget.max_cost >= 0.0) {
                problems.push(TaskError::new(
                    "budget.max_cost",
                    "must be a number of at least 0",
                ));
            }
        }
        if let Some(cwd) = &self.cwd {
            if cwd.as_os_str().is_empty() {
                problems.push(TaskError::new("cwd", "must not be empty"));
            }
        }
        for key in self.env.keys() {
            if key.is_empty() || key.contains('=') || key.contains('\0') {
                problems.push(TaskError::new(
                    format!("env.{key}"),
                    "environment names must be non-empty and contain no '=' or NUL",
                ));
            }
        }
        if self.retry.max_attempts == 0 {
            problems.push(TaskError::new("retry.max_attempts", "must be at least 1"));
        }
        if self.phases.is_empty() {
            problems.push(TaskError::new("phases", "a task needs at least one phase"));
        }
        let mut seen = HashSet::new();
        for (index, phase) in self.phases.iter().enumerate() {
            phase.validate(index, &seen, &mut problems);
            seen.insert(phase.name.as_str());
        }
        match TaskError::from_all(problems) {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }
}

impl Phase {
    fn validate(&self, index: usize, earlier: &HashSet<&str>, problems: &mut Vec<TaskError>) {
        let at = |field: &str| format!("phases[{index}].{field}");
        self.validate_name_and_run(&at, earlier, problems);
        self.validate_fields_fit_kind(&at, problems);
        if self.kind == PhaseKind::Items {
            problems.extend(self.validate_item_source(&at, earlier).err());
        }
        self.validate_ranges(&at, problems);
    }

    /// A unique name and a program to run.
    fn validate_name_and_run(
        &self,
        at: &dyn Fn(&str) -> String,
        earlier: &HashSet<&str>,
        problems: &mut Vec<TaskError>,
    ) {
        if let Err(problem) = check_name(&self.name, 64) {
            problems.push(TaskError::new(at("name"), problem.to_string()));
        } else if earlier.contains(self.name.as_str()) {
            problems.push(TaskError::new(
                at("name"),
                format!("another phase is already named {:?}", self.name),
            ));
        }
        if self.run.first().is_none_or(|program| program.is_empty()) {
            problems.push(TaskError::new(
                at("run"),
                "must name a program, e.g. [\"python3\", \"step.py\"]",
            ));
        } else if self.run.iter().any(|arg| arg.contains('\0')) {
            problems.push(TaskError::new(at("run"), "arguments must not contain NUL"));
        }
    }

    /// Fields that only some kinds of phase use appear only in those: a `max_iterations` on a
    /// `once` phase is a mistake the author should hear about, not a silent no-op.
    fn validate_fields_fit_kind(&self, at: &dyn Fn(&str) -> String, problems: &mut Vec<TaskError>) {
        let mut only_for = |field: &str, present: bool, kinds: &[PhaseKind]| {
            if present && !kinds.contains(&self.kind) {
                let names: Vec<&str> = kinds.iter().map(|k| k.as_str()).collect();
                problems.push(TaskError::new(
                    at(field),
                    format!(
                        "applies to {} phases only, and this phase is {:?}",
                        names.join("/"),
                        self.kind.as_str()
                    ),
                ));
            }
        };
        use PhaseKind::*;
        only_for("max_iterations", self.max_iterations.is_some(), &[Loop]);
        only_for("initial_state", self.initial_state.is_some(), &[Loop]);
        only_for(
            "checkpoint_every",
            self.checkpoint_every.is_some(),
            &[Loop, Items, Worker],
        );
        only_for("items", self.items.is_some(), &[Items]);
        only_for("items_from", self.items_from.is_some(), &[Items]);
        only_for("concurrency", self.concurrency.is_some(), &[Items]);
        only_for(
            "heartbeat_timeout",
            self.heartbeat_timeout.is_some(),
            &[Worker],
        );
    }

    /// An items phase takes its list from exactly one place: `items`, or an earlier phase.
    fn validate_item_source(
        &self,
        at: &dyn Fn(&str) -> String,
        earlier: &HashSet<&str>,
    ) -> Result<(), TaskError> {
        match (&self.items, &self.items_from) {
            (Some(_), None) => Ok(()),
            (None, Some(from)) if !earlier.contains(from.as_str()) => Err(TaskError::new(
                at("items_from"),
                format!("{from:?} is not the name of an earlier phase"),
            )),
            (None, Some(_)) => Ok(()),
            _ => Err(TaskError::new(
                at("items"),
                "an items phase needs exactly one of `items` (a list) and `items_from` (an earlier phase)",
            )),
        }
    }

    /// Counts and durations that would make the phase never run or never end.
    fn validate_ranges(&self, at: &dyn Fn(&str) -> String, problems: &mut Vec<TaskError>) {
        let mut check = |bad: bool, field: &str, problem: &str| {
            if bad {
                problems.push(TaskError::new(at(field), problem));
            }
        };
        check(
            self.concurrency == Some(0),
            "concurrency",
            "must be at least 1",
        );
        check(
            self.heartbeat_timeout == Some(Duration::ZERO),
            "heartbeat_timeout",
            "must be longer than zero",
        );
        check(
            self.checkpoint_every == Some(0),
            "checkpoint_every",
            "must be at least 1",
        );
        check(
            self.max_iterations == Some(0),
            "max_iterations",
            "must be at least 1",
        );
        check(
            self.timeout == Some(Duration::ZERO),
            "timeout",
            "must be longer than zero",
        );
    }
}

/// `"run": "python3 step.py"` is a common first try: the command is not run by a shell, so it
/// must be the program and its arguments as an array. The message shows that form.
fn run_as_string_hint(line: &str) -> String {
    let words: Vec<&str> = line.split_whitespace().collect();
    let as_array = serde_json::to_string(&words).unwrap_or_default();
    let through_shell = serde_json::to_string(&["sh", "-c", line]).unwrap_or_default();
    format!(
        "must be an array of strings, the program and its arguments (no shell runs it): \
         {as_array}; for shell syntax use {through_shell}"
    )
}

/// serde would read a struct from a JSON array by position; a task, its phases, `retry` and
/// `budget` must be objects with named fields.
fn check_shape(bytes: &[u8]) -> Result<(), TaskError> {
    let Ok(value) = serde_json::from_slice::<Value>(bytes) else {
        // Not JSON at all: the typed parse reports where.
        return Ok(());
    };
    let object = |value: &Value, field: String| {
        if value.is_object() {
            Ok(())
        } else {
            Err(TaskError::new(
                field,
                "must be a JSON object with named fields",
            ))
        }
    };
    if !value.is_object() {
        return Err(TaskError::whole_file(
            "a task must be a JSON object, such as {\"phases\": [...]}",
        ));
    }
    for field in ["retry", "budget"] {
        if let Some(inner) = value.get(field) {
            object(inner, field.to_string())?;
        }
    }
    if let Some(Value::Array(phases)) = value.get("phases") {
        for (i, phase) in phases.iter().enumerate() {
            object(phase, format!("phases[{i}]"))?;
            if let Some(Value::String(line)) = phase.get("run") {
                return Err(TaskError::new(
                    format!("phases[{i}].run"),
                    run_as_string_hint(line),
                ));
            }
        }
    }
    Ok(())
}

/// A short random suffix for generated names.
pub fn random_suffix() -> String {
    format!("{:06x}", fastrand::u32(..0x100_0000))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{OnExceed, OnExhausted, PhaseKind, RetryPolicy, Task, TaskError};

    fn parse(text: &str) -> Result<Task, TaskError> {
        Task::parse(text.as_bytes())
    }

    #[test]
    fn a_minimal_task_parses_with_defaults() {
        let task = parse(r#"{"phases":[{"name":"a","run":["true"]}]}"#).unwrap();
        assert_eq!(task.retry.max_attempts, 3);
        assert_eq!(task.phases[0].kind, PhaseKind::Once);
        assert_eq!(task.phases[0].checkpoint_every(), 1);
    }

    #[test]
    fn errors_name_the_field() {
        let err = parse(r#"{"phases":[{"name":"a","run":["true"],"colour":1}]}"#).unwrap_err();
        assert_eq!(err.field.as_deref(), Some("phases[0].colour"));
        assert!(err.problem.contains("colour"), "{err}");

        let err =
            parse(r#"{"phases":[{"name":"a","kind":"loop","run":["x"],"max_iterations":"5"}]}"#)
                .unwrap_err();
        assert_eq!(err.field.as_deref(), Some("phases[0].max_iterations"));

        let err = parse(r#"{"id":"../x","phases":[{"name":"a","run":["x"]}]}"#).unwrap_err();
        assert_eq!(err.field.as_deref(), Some("id"));

        let err = parse(r#"{"phases":[{"name":"a","run":"python3 step.py --fast"}]}"#).unwrap_err();
        assert_eq!(err.field.as_deref(), Some("phases[0].run"));
        assert!(
            err.problem.contains(r#"["python3","step.py","--fast"]"#),
            "{err}"
        );
        let err = parse(r#"{"phases":[{"name":"a","run":[]}]}"#).unwrap_err();
        assert_eq!(err.field.as_deref(), Some("phases[0].run"));

        let err = parse(r#"{"phases":[{"name":"a","run":["x"],"max_iterations":3}]}"#).unwrap_err();
        assert!(err.problem.contains("loop"), "{err}");

        let err = parse(r#"{"retry":{"backoff":"soon"},"phases":[{"name":"a","run":["x"]}]}"#)
            .unwrap_err();
        assert_eq!(err.field.as_deref(), Some("retry.backoff"));
    }

    #[test]
    fn arrays_are_not_read_as_objects() {
        let err =
            parse(r#"[null, 0, null, {}, {}, null, [{"name":"p","run":["true"]}]]"#).unwrap_err();
        assert_eq!(err.field, None);
        assert!(err.problem.contains("JSON object"), "{err}");
        let err = parse(r#"{"phases":[["p","once",["true"]]]}"#).unwrap_err();
        assert_eq!(err.field.as_deref(), Some("phases[0]"));
        let err =
            parse(r#"{"retry":[3,"1s","1m"],"phases":[{"name":"p","run":["true"]}]}"#).unwrap_err();
        assert_eq!(err.field.as_deref(), Some("retry"));
    }

    #[test]
    fn malformed_json_is_a_whole_file_error() {
        let err = parse(r#"{"phases": ["#).unwrap_err();
        assert!(err.problem.starts_with("not valid JSON"), "{err}");
        let err = parse(r#"{"phases":[{"name":"a","run":["x"]}]} trailing"#).unwrap_err();
        assert!(err.problem.starts_with("not valid JSON"), "{err}");
    }

    #[test]
    fn a_task_file_with_a_bad_id_is_refused_at_its_id() {
        for bad in ["../x", "x.3", ""] {
            let text = format!(r#"{{"id":{bad:?},"phases":[{{"name":"p","run":["x"]}}]}}"#);
            let err = parse(&text).unwrap_err();
            assert_eq!(err.field.as_deref(), Some("id"), "{bad:?}: {err}");
        }
        let ok = parse(r#"{"id":"a.b","phases":[{"name":"p","run":["x"]}]}"#).unwrap();
        assert_eq!(ok.id(), "a.b");
    }

    #[test]
    fn items_and_worker_phases_are_checked() {
        let ok = parse(
            r#"{"budget":{"max_cost":2.5},"phases":[{"name":"list","run":["x"]},
               {"name":"each","kind":"items","items_from":"list","run":["y"],"concurrency":3},
               {"name":"w","kind":"worker","run":["z"],"heartbeat_timeout":"30s","checkpoint_every":2}]}"#,
        )
        .unwrap();
        assert_eq!(ok.budget.unwrap().max_cost, 2.5);

        let err = parse(r#"{"phases":[{"name":"each","kind":"items","items_from":"later","run":["y"]},{"name":"later","run":["x"]}]}"#)
            .unwrap_err();
        assert_eq!(err.field.as_deref(), Some("phases[0].items_from"));
        let err = parse(r#"{"phases":[{"name":"each","kind":"items","run":["y"]}]}"#).unwrap_err();
        assert_eq!(err.field.as_deref(), Some("phases[0].items"));
        let err = parse(r#"{"phases":[{"name":"each","kind":"items","items":[1],"items_from":"x","run":["y"]}]}"#)
            .unwrap_err();
        assert_eq!(err.field.as_deref(), Some("phases[0].items"));
        let err = parse(r#"{"phases":[{"name":"each","kind":"items","items":[1],"concurrency":0,"run":["y"]}]}"#)
            .unwrap_err();
        assert_eq!(err.field.as_deref(), Some("phases[0].concurrency"));
        let err =
            parse(r#"{"phases":[{"name":"w","run":["y"],"heartbeat_timeout":"1s"}]}"#).unwrap_err();
        assert_eq!(err.field.as_deref(), Some("phases[0].heartbeat_timeout"));
        let err =
            parse(r#"{"budget":{"max_cost":-1},"phases":[{"name":"w","run":["y"]}]}"#).unwrap_err();
        assert_eq!(err.field.as_deref(), Some("budget.max_cost"));
        let err = parse(r#"{"budget":{"max":1},"phases":[{"name":"w","run":["y"]}]}"#).unwrap_err();
        assert_eq!(err.field.as_deref(), Some("budget.max"));
    }

    #[test]
    fn what_a_spent_budget_or_used_up_attempts_do_is_read_and_checked() {
        let task =
            parse(r#"{"phases":[{"name":"a","run":["x"]}],"budget":{"max_cost":1}}"#).unwrap();
        assert_eq!(task.budget.as_ref().unwrap().on_exceed, OnExceed::Fail);
        assert_eq!(task.retry.on_exhausted, OnExhausted::Fail);
        // The defaults are not written into the stored form, which stays as it was.
        let stored = String::from_utf8(task.to_json_bytes()).unwrap();
        assert!(
            !stored.contains("on_exceed") && !stored.contains("on_exhausted"),
            "{stored}"
        );

        let task = parse(
            r#"{"budget":{"max_cost":0.05,"on_exceed":"pause"},"retry":{"on_exhausted":"pause"},
               "phases":[{"name":"a","run":["x"]}]}"#,
        )
        .unwrap();
        assert_eq!(task.budget.as_ref().unwrap().on_exceed, OnExceed::Pause);
        assert_eq!(task.retry.on_exhausted, OnExhausted::Pause);
        assert_eq!(task.retry.max_attempts, 3);
        assert_eq!(Task::parse(&task.to_json_bytes()).unwrap(), task);

        for (text, field) in [
            (
                r#"{"budget":{"max_cost":1,"on_exceed":"stop"},"phases":[{"name":"a","run":["x"]}]}"#,
                "budget.on_exceed",
            ),
            (
                r#"{"budget":{"max_cost":1,"on_exceed":true},"phases":[{"name":"a","run":["x"]}]}"#,
                "budget.on_exceed",
            ),
            (
                r#"{"retry":{"on_exhausted":"Pause"},"phases":[{"name":"a","run":["x"]}]}"#,
                "retry.on_exhausted",
            ),
        ] {
            let err = parse(text).unwrap_err();
            assert_eq!(err.field.as_deref(), Some(field), "{text}: {err}");
            assert!(
                err.problem.contains(r#"is not one of "fail", "pause""#),
                "{err}"
            );
        }
        let err = parse(r#"{"budget":{"on_exceed":"pause"},"phases":[{"name":"a","run":["x"]}]}"#)
            .unwrap_err();
        assert!(err.to_string().contains("max_cost"), "{err}");
    }

    #[test]
    fn backoff_doubles_and_is_capped() {
        let policy = RetryPolicy {
            max_attempts: 9,
            backoff: Duration::from_secs(10),
            max_backoff: Duration::from_secs(60),
            ..RetryPolicy::default()
        };
        assert_eq!(policy.delay_after(1), Duration::from_secs(10));
        assert_eq!(policy.delay_after(2), Duration::from_secs(20));
        assert_eq!(policy.delay_after(4), Duration::from_secs(60));
        assert_eq!(policy.delay_after(100), Duration::from_secs(60));
    }

    #[test]
    fn a_task_round_trips_through_its_stored_form() {
        let task = parse(
            r#"{"id":"t","retry":{"backoff":"1m 30s"},"phases":[{"name":"a","kind":"loop","run":["x"],"max_iterations":4,"timeout":"5s"}]}"#,
        )
        .unwrap();
        let again = Task::parse(&task.to_json_bytes()).unwrap();
        assert_eq!(task, again);
    }

    #[test]
    fn a_task_file_cannot_name_its_submitter_but_a_stored_definition_keeps_it() {
        let forged =
            r#"{"submitted_by":{"uid":0,"user":"root"},"phases":[{"name":"a","run":["x"]}]}"#;
        let error = parse(forged).unwrap_err();
        assert_eq!(error.field.as_deref(), Some("submitted_by"), "{error}");
        let mut task = parse(r#"{"id":"t","phases":[{"name":"a","run":["x"]}]}"#).unwrap();
        assert_eq!(task.submitted_by(), None);
        task.submitted_by = Some(crate::submitter::Submitter::of_uid(0));
        let stored = Task::parse_stored(&task.to_json_bytes()).unwrap();
        assert_eq!(stored.submitted_by().map(|s| s.uid), Some(0));
        assert!(Task::parse(&task.to_json_bytes()).is_err());
    }
}
