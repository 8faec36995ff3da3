//! Running the embedded migrations safely from several instances at once.

use diesel::sql_types::{BigInt, Integer, Text};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};

use crate::schema::{MIGRATIONS, Schema, version_table_sql};
use crate::{Error, Result};

#[derive(diesel::QueryableByName)]
struct Version {
    #[diesel(sql_type = Integer)]
    version: i32,
}

/// Applies the pending embedded migrations to `schema` (created if missing)
/// and returns the versions it applied (empty when up to date).
///
/// Safe when several service instances start at once: everything runs in one
/// transaction holding a transaction-scoped advisory lock per schema
/// (`pg_advisory_xact_lock`), so a second caller waits, then finds nothing to
/// do. Because the lock is transaction-scoped it also works through PgBouncer
/// in transaction pooling mode. History is kept in
/// `<schema>.outbox_schema_version`, never in diesel's
/// `__diesel_schema_migrations`.
///
/// ```no_run
/// use diesel_async::{AsyncConnection, AsyncPgConnection};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = AsyncPgConnection::establish("postgres://postgres@127.0.0.1/app").await?;
/// let applied = outbox_diesel::migrate(&mut conn, "public").await?;
/// println!("applied outbox migrations {applied:?}");
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`Error::Config`] for an invalid schema name, [`Error::Database`] if a
/// statement fails (nothing is applied then: the transaction rolls back).
pub async fn migrate(conn: &mut AsyncPgConnection, schema: &str) -> Result<Vec<i32>> {
    let schema = Schema::new(schema)?;
    conn.transaction::<_, Error, _>(async |conn| {
        diesel::sql_query("SELECT pg_advisory_xact_lock($1)")
            .bind::<BigInt, _>(schema.lock_key())
            .execute(conn)
            .await?;
        let versions = schema.table("outbox_schema_version");
        conn.batch_execute(&format!(
            "CREATE SCHEMA IF NOT EXISTS {};\n{}",
            schema.quoted(),
            version_table_sql(&schema),
        ))
        .await?;
        let done: Vec<Version> = diesel::sql_query(format!("SELECT version FROM {versions}"))
            .load(conn)
            .await?;
        let mut applied = Vec::new();
        for migration in MIGRATIONS {
            if done.iter().any(|v| v.version == migration.version) {
                continue;
            }
            conn.batch_execute(&schema.render(migration)).await?;
            diesel::sql_query(format!(
                "INSERT INTO {versions} (version, name) VALUES ($1, $2)"
            ))
            .bind::<Integer, _>(migration.version)
            .bind::<Text, _>(migration.name)
            .execute(conn)
            .await?;
            tracing::info!(
                schema = schema.name(),
                version = migration.version,
                name = migration.name,
                "applied outbox migration"
            );
            applied.push(migration.version);
        }
        Ok(applied)
    })
    .await
}

/// Opens a direct connection to `url` and runs [`migrate`] on it.
///
/// # Errors
/// [`Error::Connect`] if PostgreSQL cannot be reached, else as [`migrate`].
pub async fn migrate_url(url: &str, schema: &str) -> Result<Vec<i32>> {
    let mut conn = crate::connect(url).await?;
    migrate(&mut conn, schema).await
}
