//! Who submitted a task: the owner of the file the daemon took from `inbox/` (`cairn submit`
//! writes it as the user who runs it), as `fstat` says of the descriptor intake read. Never
//! what a task file says: a task file that names its own `submitted_by` is rejected.
//!
//! Kept in the task's definition as the daemon writes it (`tasks/<id>.json`, which only the
//! daemon's user may write), and copied into the journal's `accepted` event and the final
//! records; `cairn run --run-as-submitter` runs the task's commands as this user and lets only
//! them (or an operator) steer it. On disk and in `--json`: `{"uid": 1001, "user": "alice"}`,
//! `user` left out when the user database has no name for the uid.

use std::fmt;

use nix::unistd::{Uid, User};
use serde::{Deserialize, Serialize};

/// A task's submitter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Submitter {
    /// The numeric user id: what every decision uses.
    pub uid: u32,
    /// The user's name when the task was accepted, for people (absent when the uid had none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

impl Submitter {
    /// User `uid`, with its name as the user database has it now.
    pub fn of_uid(uid: u32) -> Submitter {
        let user = User::from_uid(Uid::from_raw(uid))
            .ok()
            .flatten()
            .map(|user| user.name);
        Submitter { uid, user }
    }

    /// The user named `name` on this host, if there is one.
    pub fn of_name(name: &str) -> Option<Submitter> {
        let user = User::from_name(name).ok().flatten()?;
        Some(Submitter {
            uid: user.uid.as_raw(),
            user: Some(user.name),
        })
    }

    /// The user this process runs as (its effective uid).
    pub fn current() -> Submitter {
        Submitter::of_uid(Uid::effective().as_raw())
    }

    /// The name for a table cell: the user name, else the uid.
    pub fn short(&self) -> String {
        match &self.user {
            Some(user) => user.clone(),
            None => self.uid.to_string(),
        }
    }
}

impl fmt::Display for Submitter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.user {
            Some(user) => write!(f, "{user} (uid {})", self.uid),
            None => write!(f, "uid {}", self.uid),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Submitter;

    #[test]
    fn a_submitter_reads_back_and_its_name_is_optional() {
        let root = Submitter::of_uid(0);
        assert_eq!(root.user.as_deref(), Some("root"));
        let text = serde_json::to_string(&root).unwrap();
        assert_eq!(text, r#"{"uid":0,"user":"root"}"#);
        assert_eq!(serde_json::from_str::<Submitter>(&text).unwrap(), root);
        let nameless = Submitter::of_uid(u32::MAX - 7);
        assert_eq!(
            serde_json::to_string(&nameless).unwrap(),
            r#"{"uid":4294967288}"#
        );
        assert_eq!(nameless.to_string(), "uid 4294967288");
        assert_eq!(root.to_string(), "root (uid 0)");
        assert!(serde_json::from_str::<Submitter>(r#"{"uid":1,"admin":true}"#).is_err());
    }
}
