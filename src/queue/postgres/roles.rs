//! The roles of a shared queue, and who the database vouches for (docs/security.md,
//! "PostgreSQL roles").
//!
//! The owner of cairn's tables (the role that ran `cairn db migrate`) registers the other
//! roles in `cairn_roles` with `cairn db grant`: *daemon* roles get the rights a daemon needs
//! and no more (no `CREATE`, no write of `cairn_roles`), *submitter* roles get to insert tasks,
//! control requests and their own tasks' events, and to read their own rows, each mapped to the
//! local user its tasks run as. The database stamps every task and request with the role of the
//! session that inserted it (`submitted_role`, `requested_role`: triggers of schema version 5),
//! and row-level security keeps a submitter to its own rows.
//!
//! A daemon that runs tasks as their submitters ([`PgQueue::check_vouching`] passed) trusts a
//! task's recorded `submitted_by` only when a trusted role inserted it (a daemon role, whose
//! intake took it from the owner of an inbox file, the tables' owner or a superuser); a task a
//! submitter role inserted runs as that role's local user, whatever its definition says; any
//! other task runs as nobody.

use std::collections::HashMap;

use super::connect::PgQueue;
use super::error::{During, PgError};
use super::grants::{identifier, privileges, revoke_rights};
use crate::submitter::Submitter;

/// The tables whose rows belong to one task or request: row-level security on them.
const GUARDED: [&str; 7] = [
    "cairn_tasks",
    "cairn_control",
    "cairn_events",
    "cairn_checkpoints",
    "cairn_outputs",
    "cairn_records",
    "cairn_record_history",
];

/// Whether the role in column `role` is trusted for who it says submitted or asked: a
/// registered daemon, the owner of cairn's tables, or a superuser. Needs `cairn_roles r` and
/// `pg_roles s` joined on it.
macro_rules! trusted_role {
    ($role:literal) => {
        concat!(
            "(COALESCE(r.kind = 'daemon', false) OR COALESCE(s.rolsuper, false) OR ",
            $role,
            " = pg_get_userbyid((SELECT relowner FROM pg_class WHERE oid = 'cairn_tasks'::regclass))::text)"
        )
    };
}
pub(super) use trusted_role;

/// Who submitted each task, as the database vouches for it.
const VOUCHED: &str = concat!(
    "SELECT t.id, t.submitted_role, ",
    trusted_role!("t.submitted_role"),
    ", CASE WHEN r.kind = 'submitter' THEN r.local_user END
FROM cairn_tasks t
LEFT JOIN cairn_roles r ON r.role = t.submitted_role
LEFT JOIN pg_roles s ON s.rolname = t.submitted_role
WHERE t.id = ANY($1)"
);

/// A registered role's part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoleKind {
    /// A daemon's role: reads and writes every row, creates nothing.
    Daemon,
    /// A submitter's role, whose tasks run as `local_user` (a user name of the daemons' hosts).
    Submitter { local_user: String },
}

impl RoleKind {
    fn as_str(&self) -> &'static str {
        match self {
            RoleKind::Daemon => "daemon",
            RoleKind::Submitter { .. } => "submitter",
        }
    }
}

/// Who the database says inserted a row (a task or a control request).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Vouched {
    /// A trusted role: what the row records of its submitter stands.
    Trusted,
    /// A submitter role mapped to this local user.
    LocalUser { role: String, user: String },
    /// A role cairn does not know, or a row from before roles were recorded (`None`).
    Nobody { role: Option<String> },
}

impl Vouched {
    /// From a row's role, whether it is trusted, and its mapped user.
    pub(super) fn of(role: Option<String>, trusted: bool, user: Option<String>) -> Vouched {
        match (role, trusted, user) {
            (Some(_), true, _) => Vouched::Trusted,
            (Some(role), false, Some(user)) => Vouched::LocalUser { role, user },
            (role, _, _) => Vouched::Nobody { role },
        }
    }

    /// The submitter a row recording `recorded` stands for on this host: `None` runs nothing.
    pub fn submitter(&self, recorded: Option<&Submitter>) -> Option<Submitter> {
        match self {
            Vouched::Trusted => recorded.cloned(),
            Vouched::LocalUser { role, user } => {
                let found = Submitter::of_name(user);
                if found.is_none() {
                    tracing::warn!(
                        role = role.as_str(),
                        "database role {role:?} is mapped to the local user {user:?}, which this \
                         host does not have: its tasks cannot run here"
                    );
                }
                found
            }
            Vouched::Nobody { .. } => None,
        }
    }
}

/// A role registered in `cairn_roles`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisteredRole {
    pub role: String,
    pub kind: RoleKind,
}

impl PgQueue {
    /// Register `role` (which must exist) as `kind` and grant it the rights of its part; turn
    /// row-level security on. Run as the owner of cairn's tables; idempotent.
    pub async fn grant_role(&self, role: &str, kind: &RoleKind) -> Result<(), PgError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.during("starting the grant")?;
        let exists = tx
            .query_opt("SELECT 1 FROM pg_roles WHERE rolname = $1", &[&role])
            .await
            .during("looking the role up")?
            .is_some();
        if !exists {
            return Err(PgError::NoSuchRole(role.to_owned()));
        }
        let local_user = match kind {
            RoleKind::Daemon => None,
            RoleKind::Submitter { local_user } => Some(local_user.as_str()),
        };
        tx.execute(
            "INSERT INTO cairn_roles (role, kind, local_user) VALUES ($1, $2, $3)
             ON CONFLICT (role) DO UPDATE SET kind = $2, local_user = $3",
            &[&role, &kind.as_str(), &local_user],
        )
        .await
        .during("registering the role")?;
        // A role that changes part loses the rights of its old one.
        revoke_rights(&tx, role).await?;
        privileges(&tx, role, kind.as_str()).await?;
        for table in GUARDED {
            tx.batch_execute(&format!(
                "ALTER TABLE {} ENABLE ROW LEVEL SECURITY",
                identifier(table)
            ))
            .await
            .during("turning row-level security on")?;
        }
        tx.commit().await.during("committing the grant")?;
        Ok(())
    }

    /// Take `role`'s rights on cairn's tables away and forget it; false when it was not
    /// registered.
    pub async fn revoke_role(&self, role: &str) -> Result<bool, PgError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.during("starting the revoke")?;
        let removed = tx
            .execute("DELETE FROM cairn_roles WHERE role = $1", &[&role])
            .await
            .during("forgetting the role")?;
        let exists = tx
            .query_opt("SELECT 1 FROM pg_roles WHERE rolname = $1", &[&role])
            .await
            .during("looking the role up")?
            .is_some();
        if exists {
            revoke_rights(&tx, role).await?;
        }
        tx.commit().await.during("committing the revoke")?;
        Ok(removed > 0)
    }

    /// The registered roles, by name.
    pub async fn roles(&self) -> Result<Vec<RegisteredRole>, PgError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT role, kind, local_user FROM cairn_roles ORDER BY role",
                &[],
            )
            .await
            .during("reading cairn_roles")?;
        Ok(rows
            .iter()
            .map(|row| RegisteredRole {
                role: row.get(0),
                kind: match row.get::<_, Option<String>>(2) {
                    Some(local_user) if row.get::<_, &str>(1) == "submitter" => {
                        RoleKind::Submitter { local_user }
                    }
                    _ => RoleKind::Daemon,
                },
            })
            .collect())
    }

    /// Whether this database vouches for who submits tasks, as running them as their
    /// submitters needs; the error says what is missing and what to run.
    pub async fn check_vouching(&self) -> Result<(), NoVouching> {
        let client = self.client().await?;
        let me: String = client
            .query_one("SELECT session_user::text", &[])
            .await?
            .get(0);
        let registered = client
            .query_opt(
                "SELECT 1 FROM cairn_roles WHERE role = $1 AND kind = 'daemon'",
                &[&me],
            )
            .await?
            .is_some();
        if !registered {
            return Err(NoVouching::UnregisteredDaemon { role: me });
        }
        let unguarded = unguarded_tables(&client).await?;
        if !unguarded.is_empty() {
            return Err(NoVouching::Unguarded(unguarded.join(", ")));
        }
        let writers = untrusted_writers(&client).await?;
        if !writers.is_empty() {
            return Err(NoVouching::UntrustedWriters(writers.join(", ")));
        }
        Ok(())
    }

    /// Who the database vouches submitted each of the tasks `ids`.
    pub async fn vouched(&self, ids: &[&str]) -> Result<HashMap<String, Vouched>, PgError> {
        let client = self.client().await?;
        let rows = client
            .query(VOUCHED, &[&ids])
            .await
            .during("reading who submitted tasks")?;
        Ok(rows
            .iter()
            .map(|row| (row.get(0), Vouched::of(row.get(1), row.get(2), row.get(3))))
            .collect())
    }
}

/// Of the tables in [`GUARDED`], those without row-level security.
async fn unguarded_tables(
    client: &tokio_postgres::Client,
) -> Result<Vec<String>, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT c.relname::text FROM pg_class c
             WHERE c.oid = ANY(ARRAY(SELECT to_regclass(t) FROM unnest($1::text[]) t))
               AND NOT c.relrowsecurity ORDER BY 1",
            &[&GUARDED.as_slice()],
        )
        .await?;
    Ok(rows.iter().map(|row| row.get(0)).collect())
}

/// Roles that could rewrite who submitted a task, or the mapping, besides the owner,
/// superusers and daemons (PostgreSQL's own pg_* roles are judged by their members).
async fn untrusted_writers(
    client: &tokio_postgres::Client,
) -> Result<Vec<String>, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT p.rolname::text FROM pg_roles p
             WHERE NOT p.rolsuper AND p.rolname NOT LIKE 'pg\\_%'
               AND p.oid <> (SELECT relowner FROM pg_class WHERE oid = 'cairn_tasks'::regclass)
               AND NOT EXISTS (SELECT 1 FROM cairn_roles r
                               WHERE r.role = p.rolname AND r.kind = 'daemon')
               AND (has_table_privilege(p.oid, 'cairn_tasks', 'UPDATE, DELETE, TRUNCATE, TRIGGER')
                 OR has_table_privilege(p.oid, 'cairn_roles', 'INSERT, UPDATE, DELETE, TRUNCATE')
                 OR has_table_privilege(p.oid, 'cairn_control', 'UPDATE, DELETE, TRUNCATE'))
             ORDER BY 1",
            &[],
        )
        .await?;
    Ok(rows.iter().map(|row| row.get(0)).collect())
}

/// What to set up for the database to vouch for who submits tasks.
const HOW_TO_VOUCH: &str = "register this daemon's role with `cairn db grant daemon ROLE` and \
                            each submitter's with `cairn db grant submitter ROLE --user \
                            LOCAL_USER`, run with the URL of the role that owns cairn's tables \
                            (docs/security.md, \"PostgreSQL roles\")";

/// Why tasks cannot run as their submitters on this database ([`PgQueue::check_vouching`]):
/// it does not vouch for who submitted them, or could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum NoVouching {
    #[error(transparent)]
    Connect(#[from] PgError),
    #[error("checking the database's roles: {0}")]
    Query(#[from] tokio_postgres::Error),
    #[error(
        "--run-as-submitter with --db needs the database to vouch for who submitted each \
         task, and it does not: this daemon's role {role:?} is not registered as a daemon \
         in cairn_roles; {how}",
        how = HOW_TO_VOUCH
    )]
    UnregisteredDaemon { role: String },
    /// The tables without row-level security, comma-separated.
    #[error(
        "--run-as-submitter with --db needs row-level security on cairn's tables, and \
         {0} have none: {how}",
        how = HOW_TO_VOUCH
    )]
    Unguarded(String),
    /// The roles that may rewrite what vouching relies on, comma-separated.
    #[error(
        "--run-as-submitter with --db needs the database to vouch for who submitted each \
         task, and roles that are not daemons may rewrite tasks, requests or the roles' \
         mapping: {0}; take those rights away (`cairn db grant submitter ROLE --user \
         LOCAL_USER` grants a submitter only its own) or register them as daemons"
    )]
    UntrustedWriters(String),
}

#[cfg(test)]
mod tests {
    use super::super::grants::identifier;
    use super::Vouched;
    use crate::submitter::Submitter;

    #[test]
    fn only_a_trusted_role_keeps_what_the_row_says_of_its_submitter() {
        let forged = Submitter { uid: 0, user: None };
        let trusted = Vouched::of(Some("cairn_daemon".into()), true, None);
        assert_eq!(trusted.submitter(Some(&forged)), Some(forged.clone()));
        let mapped = Vouched::of(Some("alice".into()), false, Some("root".into()));
        assert_eq!(mapped.submitter(Some(&forged)), Submitter::of_name("root"));
        let unknown = Vouched::of(Some("mallory".into()), false, None);
        assert_eq!(unknown.submitter(Some(&forged)), None);
        let old_row = Vouched::of(None, true, None);
        assert_eq!(old_row.submitter(Some(&forged)), None);
        let no_user = Vouched::of(Some("bob".into()), false, Some("no-such-user-here".into()));
        assert_eq!(no_user.submitter(Some(&forged)), None);
        assert_eq!(identifier("a\"b"), "\"a\"\"b\"");
    }
}
