//! The SQL rights of a registered role on cairn's tables: what `cairn db grant` gives,
//! `cairn db revoke` takes away, and a migration gives again to every registered role once it
//! has added tables. Below both `roles` (which registers roles) and `schema` (which migrates).

use tokio_postgres::Transaction;

use super::error::{During, PgError};

/// What a submitter may insert (besides reading its own rows of every table).
const SUBMITTER_INSERTS: [&str; 4] = [
    "cairn_tasks",
    "cairn_control",
    "cairn_events",
    "cairn_checkpoints",
];

/// cairn's tables (`'r'`) or sequences (`'S'`) in the current schema.
const CAIRN_RELATIONS: &str = "
SELECT c.relname::text FROM pg_class c
WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = $1::text::\"char\"
  AND c.relname LIKE 'cairn\\_%'
ORDER BY c.relname";

/// Quote `name` as an SQL identifier.
pub(super) fn identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

async fn relations(tx: &Transaction<'_>, kind: &str) -> Result<Vec<String>, PgError> {
    let rows = tx
        .query(CAIRN_RELATIONS, &[&kind])
        .await
        .during("listing cairn's tables")?;
    Ok(rows.iter().map(|row| row.get(0)).collect())
}

/// Give `role` the rights of `kind` on every cairn table there is now.
pub(super) async fn privileges(
    tx: &Transaction<'_>,
    role: &str,
    kind: &str,
) -> Result<(), PgError> {
    let who = identifier(role);
    let mut statements = vec![format!(
        "GRANT USAGE ON SCHEMA {} TO {who}",
        identifier(&current_schema(tx).await?)
    )];
    for table in relations(tx, "r").await? {
        let rights = match (kind, table.as_str()) {
            ("submitter", "cairn_roles") => continue,
            ("daemon", "cairn_roles" | "cairn_schema") => "SELECT",
            ("daemon", _) => "SELECT, INSERT, UPDATE, DELETE",
            (_, table) if SUBMITTER_INSERTS.contains(&table) => "SELECT, INSERT",
            _ => "SELECT",
        };
        statements.push(format!("GRANT {rights} ON {} TO {who}", identifier(&table)));
    }
    for sequence in relations(tx, "S").await? {
        statements.push(format!(
            "GRANT USAGE ON SEQUENCE {} TO {who}",
            identifier(&sequence)
        ));
    }
    for statement in statements {
        tx.batch_execute(&statement)
            .await
            .during("granting a role its rights")?;
    }
    Ok(())
}

async fn current_schema(tx: &Transaction<'_>) -> Result<String, PgError> {
    Ok(tx
        .query_one("SELECT current_schema()::text", &[])
        .await
        .during("reading the current schema")?
        .get(0))
}

/// Grant every registered role its rights again (after a migration added tables).
pub(super) async fn grant_registered(tx: &Transaction<'_>) -> Result<(), PgError> {
    let rows = tx
        .query(
            "SELECT r.role, r.kind FROM cairn_roles r JOIN pg_roles p ON p.rolname = r.role",
            &[],
        )
        .await
        .during("reading cairn_roles")?;
    for row in rows {
        privileges(tx, row.get(0), row.get(1)).await?;
    }
    Ok(())
}

/// Take every right on cairn's tables and sequences from `role`.
pub(super) async fn revoke_rights(tx: &Transaction<'_>, role: &str) -> Result<(), PgError> {
    let who = identifier(role);
    for table in relations(tx, "r").await? {
        tx.batch_execute(&format!("REVOKE ALL ON {} FROM {who}", identifier(&table)))
            .await
            .during("revoking a role's rights")?;
    }
    for sequence in relations(tx, "S").await? {
        tx.batch_execute(&format!(
            "REVOKE ALL ON SEQUENCE {} FROM {who}",
            identifier(&sequence)
        ))
        .await
        .during("revoking a role's rights")?;
    }
    Ok(())
}
