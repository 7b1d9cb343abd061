//! Control requests: `control/<time>-<random>.json` files that the CLI writes (atomically) and
//! the daemon takes, applies and removes — pause, resume, cancel and retry of one task. A
//! request written while no daemon runs is applied when the next one starts.
//!
//! `control/` may be shared with a group, so the daemon first claims a request by renaming it
//! into `tasks/` (its own), then reads it through a descriptor that follows no link and waits
//! for no FIFO writer, checked as a regular file of bounded size. A bad entry is removed with
//! one log line and never holds up the others.

use std::collections::HashSet;
use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::QueueDir;
use crate::store::Storage;
use crate::task_id::TaskId;

/// What an operator asks of a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ControlAction {
    Pause,
    Resume,
    Cancel,
    Retry,
    /// Set the task's spending limit (`cairn budget ID --max-cost X`): the request's
    /// `max_cost`.
    Budget,
}

impl ControlAction {
    pub fn as_str(self) -> &'static str {
        match self {
            ControlAction::Pause => "pause",
            ControlAction::Resume => "resume",
            ControlAction::Cancel => "cancel",
            ControlAction::Retry => "retry",
            ControlAction::Budget => "budget",
        }
    }
}

/// One request file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlRequest {
    pub action: ControlAction,
    pub task_id: TaskId,
    pub requested_at: DateTime<Utc>,
    /// The new spending limit of a `budget` request (only that request has one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost: Option<f64>,
    /// Where the request came from, as the daemon saw the file it read: never read from the
    /// file itself (a request that names it is refused as unknown). `None` for a request that
    /// came through a database.
    #[serde(skip)]
    pub origin: Option<RequestFile>,
    /// Who asked for a request that came through a database, as the database vouches for it
    /// (only when the daemon runs tasks as their submitters); never read from the request.
    #[serde(skip)]
    pub asker: Option<DatabaseAsker>,
}

/// The role that asked for a request through a database (its `requested_role`, which the
/// database sets), and what cairn makes of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatabaseAsker {
    /// A daemon's role, the owner of cairn's tables or a superuser: may steer every task.
    Trusted { role: String },
    /// A submitter's role, mapped to this local user.
    User { role: String, uid: u32 },
    /// A role mapped to no user of this host, or a request from before roles were recorded.
    Unknown { role: Option<String> },
}

/// Why a steering request is refused: for the log, the journal and the requester.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SteeringRefusal {
    #[error(
        "database role {0} is mapped to no user of this host in cairn_roles, so it may steer no \
         task"
    )]
    UnmappedRole(String),
    #[error(
        "the request file is writable by others (mode {mode:04o}), so it may not be {asker}'s \
         request"
    )]
    WritableFile { mode: u32, asker: String },
    #[error("the request file has {0} hard links, so it may be someone else's file linked in")]
    Linked(u64),
    #[error("{asker} may not steer it: only {whose}, the daemon's user, root{operators} may")]
    NotAllowed {
        asker: String,
        whose: String,
        operators: String,
    },
    /// A daemon that vouches for submitters but was given no rule judges with the strictest:
    /// only trusted roles.
    #[error("no rule for steering was given to this daemon")]
    NoRule,
}

/// Judges a request that came through a database before it is applied where no daemon holds
/// its task: `Err` is why it is refused. Given the request and the task's submitter.
pub type ControlJudge = std::sync::Arc<
    dyn Fn(&ControlRequest, Option<&crate::submitter::Submitter>) -> Result<(), SteeringRefusal>
        + Send
        + Sync,
>;

/// The file a request was read from, as `fstat` describes the descriptor it was read through:
/// who wrote it is who asks (see `daemon::steering`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestFile {
    /// Its name in `control/`, which the `cairn` command that wrote it knows it by.
    pub name: String,
    /// Its owner: the user who asks.
    pub uid: u32,
    /// Its permission bits (a file others may write could have been changed by them).
    pub mode: u32,
    /// Its hard links (a second name could be someone else's file linked in).
    pub links: u64,
}

impl ControlRequest {
    pub fn new(action: ControlAction, task_id: &TaskId) -> Self {
        ControlRequest {
            action,
            task_id: task_id.clone(),
            requested_at: Utc::now(),
            max_cost: None,
            origin: None,
            asker: None,
        }
    }

    /// A request to set the spending limit of `task_id` to `max_cost`.
    pub fn budget(task_id: &TaskId, max_cost: f64) -> Self {
        ControlRequest {
            max_cost: Some(max_cost),
            ..ControlRequest::new(ControlAction::Budget, task_id)
        }
    }

    /// Whether the request carries what its action needs: a `budget` request a limit of at
    /// least 0, every other action none.
    pub fn is_well_formed(&self) -> bool {
        match (self.action, self.max_cost) {
            (ControlAction::Budget, Some(limit)) => valid_limit(limit),
            (ControlAction::Budget, None) => false,
            (_, limit) => limit.is_none(),
        }
    }

    /// Who asked, for the journal: the user who wrote the request's file, or the database
    /// role the database vouches asked it.
    pub fn requester(&self) -> String {
        use crate::submitter::Submitter;
        let role = |role: &Option<String>| role.clone().unwrap_or_else(|| "(unrecorded)".into());
        match (&self.origin, &self.asker) {
            (Some(origin), _) => Submitter::of_uid(origin.uid).to_string(),
            (None, Some(DatabaseAsker::User { role, uid })) => {
                format!("database role {role} ({})", Submitter::of_uid(*uid))
            }
            (None, Some(DatabaseAsker::Trusted { role })) => format!("database role {role}"),
            (None, Some(DatabaseAsker::Unknown { role: r })) => {
                format!("database role {}", role(r))
            }
            (None, None) => "an unrecorded requester".to_string(),
        }
    }

    /// Parse a request file's bytes; the error says what is wrong.
    pub fn parse(bytes: &[u8]) -> Result<ControlRequest, BadRequest> {
        let value: serde_json::Value = serde_json::from_slice(bytes).map_err(BadRequest::Json)?;
        // serde would read the struct from an array by position.
        if !value.is_object() {
            return Err(BadRequest::NotAnObject);
        }
        // Parsed again from the bytes, so that a field given twice is refused (and the id
        // is checked as it is read).
        let request: ControlRequest = serde_json::from_slice(bytes).map_err(BadRequest::Json)?;
        if !request.is_well_formed() {
            return Err(BadRequest::Limit);
        }
        Ok(request)
    }
}

/// Whether `limit` may be a task's spending limit: a finite number of at least 0, as
/// `budget.max_cost` must be.
pub fn valid_limit(limit: f64) -> bool {
    limit.is_finite() && limit >= 0.0
}

/// Why a request in `control/` is refused (and removed, with one log line saying this).
#[derive(Debug, thiserror::Error)]
pub enum BadRequest {
    #[error("not a control request: {0}")]
    Json(#[source] serde_json::Error),
    #[error("not a control request: it must be a JSON object")]
    NotAnObject,
    #[error("not a control request: a budget request needs a max_cost of at least 0, and only it has one")]
    Limit,
    #[error("it is a symbolic link; a request must be a regular file")]
    Symlink,
    #[error("it is {0}; a request must be a regular file")]
    NotAFile(&'static str),
    #[error("it is {0} bytes, more than the limit of {MAX_REQUEST_BYTES}")]
    TooLarge(u64),
    #[error("it grew past the limit of {MAX_REQUEST_BYTES} bytes")]
    Grew,
    #[error("cannot {action}: {source}")]
    Io {
        action: &'static str,
        #[source]
        source: io::Error,
    },
}

/// Write a request durably into `control/`; returns its storage key. Names sort by time, so
/// requests are applied in the order they were made.
pub fn submit(storage: &dyn Storage, request: &ControlRequest) -> io::Result<String> {
    let nanos = request
        .requested_at
        .timestamp_nanos_opt()
        .unwrap_or_default();
    let key = format!(
        "control/{nanos:020}-{}-{}.json",
        crate::task::random_suffix(),
        request.action.as_str()
    );
    let bytes = serde_json::to_vec(request).map_err(io::Error::other)?;
    storage.put(&key, &bytes, None)?;
    Ok(key)
}

/// The largest control request read; a real one is about 100 bytes.
pub const MAX_REQUEST_BYTES: u64 = 4096;

/// Prefix of a request claimed into `tasks/` (which only the daemon writes): the name that
/// follows is the request's own, so claims sort as the requests were made.
const CLAIM_PREFIX: &str = ".control.";

/// Claim every request waiting in `control/` by renaming it into `tasks/.control.<name>`, then
/// read each claim (those left by earlier rounds too), oldest first. A claim that is not a
/// regular file of at most [`MAX_REQUEST_BYTES`] or not a valid request is removed with one
/// log line; an entry that cannot be claimed is logged once (`reported` remembers it) and left.
/// Nothing here follows a link or blocks on a FIFO, so no entry can stop the others.
/// Returns each good request with its claim's storage key, for removal once it is handled.
pub fn take(
    queue: &QueueDir,
    reported: &mut HashSet<String>,
) -> io::Result<Vec<(String, ControlRequest)>> {
    claim_waiting(queue, reported)?;
    let mut claims: Vec<String> = read_names(&queue.tasks())?
        .into_iter()
        .filter_map(|n| n.strip_prefix(CLAIM_PREFIX).map(str::to_string))
        .collect();
    claims.sort();
    let mut requests = Vec::new();
    for name in claims {
        let claim = queue.tasks().join(format!("{CLAIM_PREFIX}{name}"));
        let problem = match read_claim(&claim) {
            Ok(Some((bytes, meta))) => match ControlRequest::parse(&bytes) {
                Ok(mut request) => {
                    request.origin = Some(RequestFile {
                        name: name.clone(),
                        uid: meta.uid(),
                        mode: meta.mode() & 0o7777,
                        links: meta.nlink(),
                    });
                    requests.push((format!("tasks/{CLAIM_PREFIX}{name}"), request));
                    continue;
                }
                Err(problem) => problem,
            },
            Ok(None) => continue,
            Err(problem) => problem,
        };
        discard(&claim, &name, &problem, reported);
    }
    Ok(requests)
}

/// Whether the daemon has handled the request `cairn` wrote under `key` (`control/<name>`): it
/// is neither waiting in `control/` nor claimed and still to be applied.
pub fn handled(queue: &QueueDir, key: &str) -> bool {
    let name = key.strip_prefix("control/").unwrap_or(key);
    // A user who may not look into `tasks/` learns only that the request left `control/`.
    let gone = |path: std::path::PathBuf| match fs::symlink_metadata(path) {
        Ok(_) => false,
        Err(e) => matches!(
            e.kind(),
            io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied
        ),
    };
    gone(queue.control().join(name)) && gone(queue.tasks().join(format!("{CLAIM_PREFIX}{name}")))
}

/// How the daemon's notice begins that a requester's further refused requests for a task are
/// only counted for a while (`queue::refusals`); the uid and a space follow.
pub const SUPPRESSED_MARKER: &str = "too many refused requests from uid ";

/// Why the daemon refused the request `cairn` wrote under `key` (`control/<name>`) for task
/// `task_id`, if it did: the `control_refused` event naming it in the task's journal, else a
/// notice, journaled since `since`, that requests of this user (`uid`) for the task are refused
/// without an entry each for a while. The daemon writes the event before it removes the
/// request, so once [`handled`] is true the answer is final.
pub fn refusal(
    queue: &QueueDir,
    task_id: &str,
    key: &str,
    uid: u32,
    since: chrono::DateTime<chrono::Utc>,
) -> Option<String> {
    use crate::store::events::Event;
    let name = key.strip_prefix("control/").unwrap_or(key);
    let journal = crate::store::journal::journal_path(queue.root(), task_id);
    let events = super::read::files::read_journal_tail(&journal, 256 * 1024).ok()?;
    let own = events.iter().rev().find_map(|line| match &line.event {
        Event::ControlRefused {
            reason,
            request: Some(request),
            ..
        } if request == name => Some(reason.clone()),
        _ => None,
    });
    let notice = format!("{SUPPRESSED_MARKER}{uid} ");
    own.or_else(|| {
        events.iter().rev().find_map(|line| match &line.event {
            Event::ControlRefused {
                reason,
                request: None,
                ..
            } if line.at >= since && reason.starts_with(&notice) => Some(reason.clone()),
            _ => None,
        })
    })
}

/// Rename each `control/*.json` into `tasks/`. A name that will not move (a directory the
/// daemon may not write, say) is reported once and skipped.
fn claim_waiting(queue: &QueueDir, reported: &mut HashSet<String>) -> io::Result<()> {
    let names = read_names(&queue.control())?;
    let waiting: HashSet<&String> = names.iter().collect();
    reported.retain(|n| waiting.contains(n) || n.starts_with(CLAIM_PREFIX));
    for name in &names {
        if name.starts_with('.') || !name.ends_with(".json") {
            continue;
        }
        let from = queue.control().join(name);
        let to = queue.tasks().join(format!("{CLAIM_PREFIX}{name}"));
        match fs::rename(&from, &to) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                if reported.insert(name.clone()) {
                    tracing::warn!(
                        request = %escape(name),
                        "cannot take the control request out of control/ ({e}); it is skipped"
                    );
                }
            }
        }
    }
    Ok(())
}

/// A claim's bytes and what `fstat` says of it (its owner is who asks), read through one
/// descriptor opened without following a link or waiting for a FIFO's writer; `Ok(None)` when
/// it is gone. The error says what is wrong with it.
fn read_claim(path: &Path) -> Result<Option<(Vec<u8>, fs::Metadata)>, BadRequest> {
    let io = |action| move |source| BadRequest::Io { action, source };
    let file = match crate::safe_fs::open_no_follow(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(nix::libc::ELOOP) => return Err(BadRequest::Symlink),
        Err(e) => return Err(io("open it")(e)),
    };
    let meta = file.metadata().map_err(io("read its metadata"))?;
    let kind = meta.file_type();
    if !kind.is_file() {
        let what = if kind.is_dir() {
            "a directory"
        } else if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_socket() {
            "a socket"
        } else {
            "not a regular file"
        };
        return Err(BadRequest::NotAFile(what));
    }
    if meta.len() > MAX_REQUEST_BYTES {
        return Err(BadRequest::TooLarge(meta.len()));
    }
    let mut bytes = Vec::new();
    file.take(MAX_REQUEST_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io("read it"))?;
    if bytes.len() as u64 > MAX_REQUEST_BYTES {
        return Err(BadRequest::Grew);
    }
    Ok(Some((bytes, meta)))
}

/// Remove a bad claim (a directory with everything in it: std removes it without following
/// links), logging why; a claim that cannot be removed is logged once.
fn discard(claim: &Path, name: &str, problem: &BadRequest, reported: &mut HashSet<String>) {
    let is_dir = fs::symlink_metadata(claim).is_ok_and(|m| m.is_dir());
    let removed = if is_dir {
        fs::remove_dir_all(claim)
    } else {
        fs::remove_file(claim)
    };
    match removed {
        Ok(()) => {
            reported.remove(&format!("{CLAIM_PREFIX}{name}"));
            tracing::warn!(
                request = %escape(&format!("control/{name}")),
                "removed a bad control request: {problem}"
            );
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => {
            if reported.insert(format!("{CLAIM_PREFIX}{name}")) {
                tracing::warn!(
                    request = %escape(&format!("control/{name}")),
                    claim = %claim.display(),
                    "a bad control request ({problem}) cannot be removed: {e}; it is skipped"
                );
            }
        }
    }
}

/// A file name fit for one log line (no control characters).
fn escape(name: &str) -> String {
    name.escape_debug().to_string()
}

/// The UTF-8 names in a directory (a missing one is empty).
fn read_names(dir: &Path) -> io::Result<Vec<String>> {
    Ok(crate::safe_fs::read_names(dir)?
        .into_iter()
        .filter_map(|name| name.into_string().ok())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::{take, ControlAction, ControlRequest, QueueDir, MAX_REQUEST_BYTES};
    use crate::task_id::TaskId;
    use std::collections::HashSet;
    use std::fs;

    #[test]
    fn bad_entries_are_removed_and_good_requests_are_taken_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let queue = QueueDir::new(dir.path());
        queue.create_all().unwrap();
        let control = queue.control();
        let good = |action| {
            serde_json::to_vec(&ControlRequest::new(action, &TaskId::parse("t-1").unwrap()))
                .unwrap()
        };
        fs::write(control.join("1-pause.json"), good(ControlAction::Pause)).unwrap();
        fs::write(control.join("3-cancel.json"), good(ControlAction::Cancel)).unwrap();
        let mut big = good(ControlAction::Resume);
        big.resize(MAX_REQUEST_BYTES as usize + 1, b' ');
        fs::write(control.join("0-big.json"), big).unwrap();
        fs::write(control.join("2-garbage.json"), b"[1, 2]").unwrap();
        nix::unistd::mkfifo(
            &control.join("2-fifo.json"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        fs::create_dir(control.join("2-dir.json")).unwrap();
        std::os::unix::fs::symlink("/nonexistent", control.join("2-link.json")).unwrap();
        fs::write(control.join("notes.txt"), b"not a request").unwrap();

        let mut reported = HashSet::new();
        let taken = take(&queue, &mut reported).unwrap();
        let actions: Vec<_> = taken.iter().map(|(_, r)| r.action).collect();
        assert_eq!(actions, [ControlAction::Pause, ControlAction::Cancel]);
        assert_eq!(taken[0].0, "tasks/.control.1-pause.json");
        let mut left: Vec<_> = fs::read_dir(&control)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["notes.txt"]);
        let claims = fs::read_dir(queue.tasks()).unwrap().count();
        assert_eq!(claims, 2, "only the good requests stay claimed");
        // Claims not yet handled are read again, still in order.
        let again = take(&queue, &mut reported).unwrap();
        assert_eq!(again.len(), 2);
    }

    #[test]
    fn requests_round_trip_and_bad_ones_are_refused() {
        let request = ControlRequest::new(ControlAction::Pause, &TaskId::parse("t-1").unwrap());
        let bytes = serde_json::to_vec(&request).unwrap();
        assert_eq!(ControlRequest::parse(&bytes).unwrap(), request);
        assert!(ControlRequest::parse(b"{}").is_err());
        // Who asks is the file's owner; a request cannot say it.
        assert!(ControlRequest::parse(
            br#"{"action":"pause","task_id":"a","requested_at":"2026-01-01T00:00:00Z","origin":{"uid":0}}"#
        )
        .is_err());
        assert!(ControlRequest::parse(
            br#"{"action":"explode","task_id":"a","requested_at":"2026-01-01T00:00:00Z"}"#
        )
        .is_err());
        // A budget request carries its limit, and only it does.
        let raise = ControlRequest::budget(&TaskId::parse("t-1").unwrap(), 0.1);
        let bytes = serde_json::to_vec(&raise).unwrap();
        assert_eq!(ControlRequest::parse(&bytes).unwrap().max_cost, Some(0.1));
        for bad in [
            br#"{"action":"budget","task_id":"a","requested_at":"2026-01-01T00:00:00Z"}"#.as_slice(),
            br#"{"action":"budget","task_id":"a","requested_at":"2026-01-01T00:00:00Z","max_cost":-1}"#,
            br#"{"action":"pause","task_id":"a","requested_at":"2026-01-01T00:00:00Z","max_cost":1}"#,
        ] {
            assert!(ControlRequest::parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        assert!(ControlRequest::parse(
            br#"{"action":"pause","task_id":"../a","requested_at":"2026-01-01T00:00:00Z"}"#
        )
        .is_err());
    }
}
