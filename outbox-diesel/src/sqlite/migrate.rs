//! The SQLite migrations: the library's own version table, applied under
//! the write lock (`BEGIN IMMEDIATE`) so that instances starting together
//! migrate once.

use diesel::SqliteConnection;
use diesel::connection::SimpleConnection as _;
use diesel::sql_types::{Integer, Text};

use super::AsyncSqliteConnection;
use super::sql::micros;
use crate::Connection as _;
use crate::schema::{Migration, Phase};
use crate::{Error, Result};

/// The migrations of the SQLite back end, in order. Their own numbering:
/// the SQLite schema starts where PostgreSQL's migration 5 ends, with the
/// lease columns of the SQLite claim.
pub const SQLITE_MIGRATIONS: &[Migration] = &[Migration {
    version: 1,
    name: "outbox, inbox and admin tables",
    phase: Phase::Expand,
    sql: include_str!("../../sql/sqlite/001_outbox.sql"),
}];

/// The library's own version table (not diesel's `__diesel_schema_migrations`).
const VERSION_TABLE: &str = "CREATE TABLE IF NOT EXISTS outbox_schema_version ( \
       version    INTEGER PRIMARY KEY, \
       name       TEXT    NOT NULL, \
       applied_at INTEGER NOT NULL \
     ) STRICT";

#[derive(diesel::QueryableByName)]
struct Version {
    #[diesel(sql_type = Integer)]
    version: i32,
}

/// Creates or upgrades the outbox's tables in the connection's database
/// file and returns the versions it applied (empty when there was nothing
/// to do). Safe to run from every instance at start-up: each takes the
/// write lock (`BEGIN IMMEDIATE`, waiting up to the connection's
/// `busy_timeout`), and the first to get it migrates; the others then find
/// nothing to do.
///
/// Sets the file's journal mode to WAL first (it persists in the file;
/// readers then never block the writer nor it them). SQLite's DDL is
/// transactional: a migration is applied whole, with its version row, or
/// not at all.
///
/// # Errors
/// [`Error::Config`] if a transaction is open on the connection;
/// [`Error::Database`] if a step fails, or the write lock is not free
/// within `busy_timeout`.
pub async fn migrate(conn: &mut AsyncSqliteConnection) -> Result<Vec<i32>> {
    if conn.transaction_status().transaction_depth()?.is_some() {
        return Err(Error::Config(
            "migrate on a connection outside any transaction: SQLite sets the journal mode \
             and migrates in a transaction of its own"
                .into(),
        ));
    }
    conn.spawn_blocking(|conn| Ok(run(conn))).await?
}

/// [`migrate`] on a connection of its own to `url`.
///
/// # Errors
/// As [`migrate`], and [`Error::Connect`].
pub async fn migrate_url(url: &str) -> Result<Vec<i32>> {
    let mut conn = super::connect(url).await?;
    migrate(&mut conn).await
}

fn run(conn: &mut SqliteConnection) -> Result<Vec<i32>> {
    wal(conn)?;
    conn.immediate_transaction(apply)
}

/// How often `migrate` tries again to put the file in WAL mode while
/// another connection holds a lock.
const WAL_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// Puts the file in WAL mode: cannot run inside a transaction; a no-op
/// once the file is in WAL mode (an in-memory database stays `memory`).
/// The switch needs the file to itself and SQLite does not wait for it
/// (`busy_timeout` does not apply: instances migrating together got
/// "database is locked" at once), so it is tried again for up to
/// [`BUSY_TIMEOUT`](super::BUSY_TIMEOUT).
fn wal(conn: &mut SqliteConnection) -> Result<()> {
    let deadline = std::time::Instant::now() + super::BUSY_TIMEOUT;
    loop {
        match conn.batch_execute("PRAGMA journal_mode = WAL") {
            Err(diesel::result::Error::DatabaseError(_, info))
                if info.message().contains("locked") && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(WAL_POLL);
            }
            result => return Ok(result?),
        }
    }
}

fn apply(conn: &mut SqliteConnection) -> Result<Vec<i32>> {
    use diesel::RunQueryDsl as _;
    conn.batch_execute(VERSION_TABLE)?;
    let done: Vec<Version> =
        diesel::sql_query("SELECT version FROM outbox_schema_version").load(conn)?;
    let done: Vec<i32> = done.into_iter().map(|v| v.version).collect();
    let mut applied = Vec::new();
    for migration in SQLITE_MIGRATIONS {
        if done.contains(&migration.version) {
            continue;
        }
        // The whole file, statement after statement (`sqlite3_exec`); its
        // `-- step:` lines are comments here: one transaction holds it all.
        conn.batch_execute(migration.sql)?;
        diesel::sql_query(
            "INSERT INTO outbox_schema_version (version, name, applied_at) VALUES (?1, ?2, ?3)",
        )
        .bind::<Integer, _>(migration.version)
        .bind::<Text, _>(migration.name)
        .bind::<diesel::sql_types::BigInt, _>(micros(chrono::Utc::now()))
        .execute(conn)?;
        tracing::info!(
            version = migration.version,
            name = migration.name,
            "applied outbox migration (SQLite)"
        );
        applied.push(migration.version);
    }
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_names_no_schema() {
        // One file is one outbox: nothing renders a `{schema}` prefix.
        for migration in SQLITE_MIGRATIONS {
            let statements = migration
                .sql
                .lines()
                .filter(|l| !l.trim_start().starts_with("--"));
            for line in statements {
                assert!(!line.contains("{schema}"), "{line}");
            }
        }
    }
}
