//! Who may steer a task (`cairn pause|resume|cancel|retry`) when tasks run as their submitters
//! (`cairn run --run-as-submitter`): its submitter, the daemon's user, root, or a member of the
//! operators' group (`--operators-group`). Who asks is the owner of the request file, as
//! `fstat` says of the descriptor the daemon read it through, never what the file says (as
//! intake judges a task file). Without `--run-as-submitter` everyone who may write `control/`
//! may steer every task: they share one trust domain.

use nix::unistd::{Gid, Group, Uid};

pub(super) use crate::queue::control::SteeringRefusal;
use crate::queue::control::{ControlJudge, ControlRequest, DatabaseAsker, RequestFile};
use crate::runner::identity::RunAs;
use crate::submitter::Submitter;

/// `--operators-group` names no group of this host.
#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    #[error("there is no group {0:?}")]
    Missing(String),
    #[error("looking up the group {name:?}: {source}")]
    Lookup { name: String, source: nix::Error },
}

/// The group whose members may steer every task (`cairn run --operators-group`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorsGroup {
    pub gid: u32,
    pub name: String,
}

impl OperatorsGroup {
    /// The group named `name` (or given by number), as the group database has it.
    pub fn named(name: &str) -> Result<OperatorsGroup, GroupError> {
        let found = match name.parse::<u32>() {
            Ok(gid) => Group::from_gid(Gid::from_raw(gid)),
            Err(_) => Group::from_name(name),
        };
        match found {
            Ok(Some(group)) => Ok(OperatorsGroup {
                gid: group.gid.as_raw(),
                name: group.name,
            }),
            Ok(None) => Err(GroupError::Missing(name.to_string())),
            Err(source) => Err(GroupError::Lookup {
                name: name.to_string(),
                source,
            }),
        }
    }
}

/// The daemon's rule for steering requests.
#[derive(Debug, Clone)]
pub(super) struct SteeringRights {
    /// Requests are judged (`--run-as-submitter`); otherwise every one is honoured.
    enforced: bool,
    daemon_uid: u32,
    operators: Option<OperatorsGroup>,
}

impl SteeringRights {
    pub(super) fn new(enforced: bool, operators: Option<OperatorsGroup>) -> SteeringRights {
        SteeringRights {
            enforced,
            daemon_uid: Uid::effective().as_raw(),
            operators,
        }
    }

    /// Whether requests are judged at all (the caller need not look the submitter up if not).
    pub(super) fn enforced(&self) -> bool {
        self.enforced
    }

    /// May who asked for `request` (the writer of its file, or the role a database vouches
    /// for) steer a task submitted by `submitter`? The error is the reason, for the log, the
    /// journal and the requester. Looks group membership up in the user database (blocking).
    pub(super) fn check(
        &self,
        request: &ControlRequest,
        submitter: Option<&Submitter>,
    ) -> Result<(), SteeringRefusal> {
        if !self.enforced {
            return Ok(());
        }
        let (daemon, operators) = (self.daemon_uid, self.operators.as_ref());
        match (&request.origin, &request.asker) {
            (Some(origin), _) => decide(Some(origin), submitter, daemon, operators, member_of),
            (None, Some(asker)) => decide_asker(asker, submitter, daemon, operators, member_of),
            (None, None) => decide(None, submitter, daemon, operators, member_of),
        }
    }

    /// This rule as the judge a database applies requests with (see `ControlJudge`).
    pub(super) fn judge(&self) -> ControlJudge {
        let rights = self.clone();
        std::sync::Arc::new(
            move |request: &ControlRequest, submitter: Option<&Submitter>| {
                rights.check(request, submitter)
            },
        )
    }
}

/// The rule for a request through a database, asked by the role `asker` stands for. Pure.
fn decide_asker(
    asker: &DatabaseAsker,
    submitter: Option<&Submitter>,
    daemon_uid: u32,
    operators: Option<&OperatorsGroup>,
    is_member: impl Fn(u32, u32) -> bool,
) -> Result<(), SteeringRefusal> {
    match asker {
        DatabaseAsker::Trusted { .. } => Ok(()),
        DatabaseAsker::Unknown { role } => Err(SteeringRefusal::UnmappedRole(
            role.as_deref().unwrap_or("(unrecorded)").to_string(),
        )),
        DatabaseAsker::User { role, uid } => judge_uid(
            &format!("database role {role} ({})", Submitter::of_uid(*uid)),
            *uid,
            submitter,
            daemon_uid,
            operators,
            is_member,
        ),
    }
}

/// Whether user `uid` belongs to group `gid` (primary or supplementary, as `initgroups(3)`
/// would set them).
fn member_of(uid: u32, gid: u32) -> bool {
    RunAs::of_uid(uid).is_ok_and(|run_as| run_as.switch.groups.contains(&Gid::from_raw(gid)))
}

/// The rule, with the group lookup given. Pure.
fn decide(
    origin: Option<&RequestFile>,
    submitter: Option<&Submitter>,
    daemon_uid: u32,
    operators: Option<&OperatorsGroup>,
    is_member: impl Fn(u32, u32) -> bool,
) -> Result<(), SteeringRefusal> {
    // A request from a database: whoever may write its requests table may steer.
    let Some(origin) = origin else {
        return Ok(());
    };
    let asker = Submitter::of_uid(origin.uid);
    if origin.mode & 0o022 != 0 {
        return Err(SteeringRefusal::WritableFile {
            mode: origin.mode,
            asker: asker.to_string(),
        });
    }
    if origin.links > 1 {
        return Err(SteeringRefusal::Linked(origin.links));
    }
    judge_uid(
        &asker.to_string(),
        origin.uid,
        submitter,
        daemon_uid,
        operators,
        is_member,
    )
}

/// May user `uid` (`asker` for people) steer a task submitted by `submitter`? Pure.
fn judge_uid(
    asker: &str,
    uid: u32,
    submitter: Option<&Submitter>,
    daemon_uid: u32,
    operators: Option<&OperatorsGroup>,
    is_member: impl Fn(u32, u32) -> bool,
) -> Result<(), SteeringRefusal> {
    if uid == 0 || uid == daemon_uid {
        return Ok(());
    }
    if submitter.is_some_and(|s| s.uid == uid) {
        return Ok(());
    }
    if let Some(group) = operators.filter(|g| is_member(uid, g.gid)) {
        tracing::debug!(uid, group = %group.name, "steering as an operator");
        return Ok(());
    }
    let whose = match submitter {
        Some(submitter) => format!("its submitter {submitter}"),
        None => "its submitter (it records none)".to_string(),
    };
    let operators = match operators {
        Some(group) => format!(", or a member of the operators' group {}", group.name),
        None => String::new(),
    };
    Err(SteeringRefusal::NotAllowed {
        asker: asker.to_string(),
        whose,
        operators,
    })
}

#[cfg(test)]
mod tests {
    use super::{decide, OperatorsGroup, RequestFile, Submitter};

    fn file(uid: u32, mode: u32, links: u64) -> RequestFile {
        RequestFile {
            name: "1-pause.json".into(),
            uid,
            mode,
            links,
        }
    }

    /// The submitter of the tasks steered in these tests.
    fn alice() -> Submitter {
        Submitter {
            uid: 1001,
            user: Some("alice".into()),
        }
    }

    /// The operators' group (gid 50) of these tests; uid 1003 is its one member.
    fn ops() -> OperatorsGroup {
        OperatorsGroup {
            gid: 50,
            name: "ops".into(),
        }
    }

    #[test]
    fn only_the_submitter_the_daemon_root_and_operators_may_steer() {
        const DAEMON: u32 = 900;
        let (alice, ops) = (alice(), ops());
        // uid 1003 is in the operators' group, 1002 is not.
        let member = |uid: u32, gid: u32| uid == 1003 && gid == 50;
        let judge = |origin: Option<&RequestFile>, submitter, operators| {
            decide(origin, submitter, DAEMON, operators, member)
        };
        for asker in [1001, DAEMON, 0] {
            assert_eq!(
                judge(Some(&file(asker, 0o640, 1)), Some(&alice), None),
                Ok(()),
                "{asker}"
            );
        }
        let refused = judge(Some(&file(1002, 0o640, 1)), Some(&alice), Some(&ops)).unwrap_err();
        assert!(
            refused.to_string().contains("may not steer it"),
            "{refused}"
        );
        assert!(
            refused.to_string().contains("alice (uid 1001)"),
            "{refused}"
        );
        assert!(refused.to_string().contains("ops"), "{refused}");
        assert_eq!(
            judge(Some(&file(1003, 0o640, 1)), Some(&alice), Some(&ops)),
            Ok(())
        );
        assert!(judge(Some(&file(1003, 0o640, 1)), Some(&alice), None).is_err());
        // A task that records no submitter: only the privileged.
        assert!(judge(Some(&file(1001, 0o640, 1)), None, None).is_err());
        assert_eq!(judge(Some(&file(0, 0o640, 1)), None, None), Ok(()));
        // A file others may write, or with a second name, is nobody's word.
        assert!(judge(Some(&file(1001, 0o660, 1)), Some(&alice), None).is_err());
        assert!(judge(Some(&file(1001, 0o640, 2)), Some(&alice), None).is_err());
        // A request through a database.
        assert_eq!(judge(None, Some(&alice), None), Ok(()));
    }

    #[test]
    fn through_a_database_the_asking_role_is_judged_as_its_mapped_user() {
        use super::{decide_asker, DatabaseAsker};
        const DAEMON: u32 = 900;
        let (alice, ops) = (alice(), ops());
        let member = |uid: u32, gid: u32| uid == 1003 && gid == 50;
        let judge =
            |asker: DatabaseAsker| decide_asker(&asker, Some(&alice), DAEMON, Some(&ops), member);
        let user = |role: &str, uid| DatabaseAsker::User {
            role: role.into(),
            uid,
        };
        assert_eq!(judge(DatabaseAsker::Trusted { role: "d".into() }), Ok(()));
        assert_eq!(judge(user("alice_r", 1001)), Ok(()));
        assert_eq!(judge(user("carol_r", 1003)), Ok(()), "an operator");
        assert_eq!(judge(user("root_r", 0)), Ok(()));
        let refused = judge(user("bob_r", 1002)).unwrap_err();
        assert!(
            refused.to_string().contains("database role bob_r")
                && refused.to_string().contains("may not steer it"),
            "{refused}"
        );
        let unknown = judge(DatabaseAsker::Unknown {
            role: Some("mallory".into()),
        })
        .unwrap_err();
        assert!(unknown.to_string().contains("mallory"), "{unknown}");
    }
}
