//! The schema and its migrations.
//!
//! Versions are recorded in `cairn_schema`, one row per migration applied. [`migrate`] runs in
//! one transaction under a transaction-scoped advisory lock, so daemons starting at once
//! migrate one after another: the first applies what is missing, the others find nothing left
//! to do. A database migrated by a newer cairn is refused rather than written in an older
//! layout.

use tokio_postgres::Client;

use super::error::{During, PgError};

/// The schema version this cairn reads and writes.
pub const SCHEMA_VERSION: i32 = 6;

/// The migrations, in order: each brings the schema from the version before it to its own.
const MIGRATIONS: &[(i32, &str)] = &[
    (1, include_str!("schema.sql")),
    (2, include_str!("schema_v2.sql")),
    (3, include_str!("schema_v3.sql")),
    (4, include_str!("schema_v4.sql")),
    (5, include_str!("schema_v5.sql")),
    (6, include_str!("schema_v6.sql")),
];

/// The advisory lock key all cairn migrations take (`cairn` in ASCII, then the lock's use).
const MIGRATION_LOCK: i64 = 0x6361_6972_6e00_0001;

/// What a migration did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migrated {
    /// The version found (0 for an empty database).
    pub from: i32,
    /// The version now ([`SCHEMA_VERSION`]).
    pub to: i32,
}

impl Migrated {
    /// Whether anything was applied.
    pub fn applied_any(&self) -> bool {
        self.from != self.to
    }
}

/// Bring the schema up to [`SCHEMA_VERSION`]; idempotent, and safe to run from several
/// connections at once. A database already at [`SCHEMA_VERSION`] is left alone without
/// asking for any right to create (a daemon's role need not have one: docs/security.md).
pub async fn migrate(client: &mut Client) -> Result<Migrated, PgError> {
    let found = current_version(client).await?;
    if found == SCHEMA_VERSION {
        return Ok(Migrated {
            from: found,
            to: SCHEMA_VERSION,
        });
    }
    let tx = client
        .transaction()
        .await
        .during("starting the migration")?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .during("taking the migration lock")?;
    // `CREATE TABLE IF NOT EXISTS` of a table that exists makes the server send a NOTICE,
    // which every start would log; nothing the migration says below a warning is news.
    // (Looking for the table first is no help: daemons migrating at once may not see the
    // table another one has just created until they try to create it.)
    tx.batch_execute("SET LOCAL client_min_messages = warning")
        .await
        .during("quieting the migration")?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS cairn_schema (
             version integer PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT now()
         )",
    )
    .await
    .during("creating cairn_schema")?;
    let from: i32 = tx
        .query_one("SELECT COALESCE(max(version), 0) FROM cairn_schema", &[])
        .await
        .during("reading the schema version")?
        .get(0);
    if from > SCHEMA_VERSION {
        return Err(PgError::SchemaTooNew {
            found: from,
            supported: SCHEMA_VERSION,
        });
    }
    for (version, sql) in MIGRATIONS.iter().filter(|(version, _)| *version > from) {
        tx.batch_execute(sql)
            .await
            .during("applying a schema migration")?;
        tx.execute("INSERT INTO cairn_schema (version) VALUES ($1)", &[version])
            .await
            .during("recording the schema version")?;
        tracing::info!(version, "applied a schema migration");
    }
    // Tables a migration added are granted to the roles registered already.
    super::grants::grant_registered(&tx).await?;
    tx.commit().await.during("committing the migration")?;
    Ok(Migrated {
        from,
        to: SCHEMA_VERSION,
    })
}

/// The schema version of the database (0 when cairn never migrated it).
pub async fn current_version(client: &Client) -> Result<i32, PgError> {
    let exists: bool = client
        .query_one("SELECT to_regclass('cairn_schema') IS NOT NULL", &[])
        .await
        .during("looking for cairn_schema")?
        .get(0);
    if !exists {
        return Ok(0);
    }
    Ok(client
        .query_one("SELECT COALESCE(max(version), 0) FROM cairn_schema", &[])
        .await
        .during("reading the schema version")?
        .get(0))
}
