//! The service's own embedded migrations, applied at start under an
//! advisory lock so that several roles starting at once apply each exactly
//! once. (The outbox tables have their own migrations and history:
//! `outbox::postgres::migrate`.)

use diesel::sql_types::BigInt;
use diesel::{ExpressionMethods, QueryDsl};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};

use super::schema::ecommerce_schema_version as versions;
use crate::db::DbError;

/// One migration: a version, a name and its SQL.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Applied in increasing order; never reused.
    pub version: i32,
    /// What it does.
    pub name: &'static str,
    /// The statements.
    pub sql: &'static str,
}

/// Every migration, oldest first. Add new ones at the end; never edit one
/// that was released.
pub const MIGRATIONS: &[Migration] = &[Migration {
    version: 1,
    name: "initial",
    sql: include_str!("../../../migrations/postgres/001_initial.sql"),
}];

/// The key of the transaction-scoped advisory lock held while migrating
/// (an arbitrary constant, unique to this service: "ecommerc" in ASCII).
pub const LOCK_KEY: i64 = 0x6563_6f6d_6d65_7263;

/// Applies the pending [`MIGRATIONS`] and returns the versions applied.
///
/// Everything runs in one transaction that first takes
/// `pg_advisory_xact_lock(LOCK_KEY)`: a second instance starting at the same
/// time waits for the first to commit, then finds nothing to do. A failing
/// migration rolls back whole. The lock is transaction-scoped, so this also
/// works through PgBouncer in transaction pooling mode.
///
/// # Errors
/// [`DbError::Query`] if a statement fails.
pub async fn run(conn: &mut AsyncPgConnection) -> Result<Vec<i32>, DbError> {
    conn.transaction::<_, DbError, _>(async |conn| {
        diesel::sql_query("SELECT pg_advisory_xact_lock($1)")
            .bind::<BigInt, _>(LOCK_KEY)
            .execute(conn)
            .await?;
        conn.batch_execute(
            "CREATE TABLE IF NOT EXISTS ecommerce_schema_version (
                 version    int         PRIMARY KEY,
                 name       text        NOT NULL,
                 applied_at timestamptz NOT NULL DEFAULT now()
             )",
        )
        .await?;
        let done: Vec<i32> = versions::table.select(versions::version).load(conn).await?;
        let mut applied = Vec::new();
        for migration in MIGRATIONS {
            if done.contains(&migration.version) {
                continue;
            }
            conn.batch_execute(migration.sql).await?;
            diesel::insert_into(versions::table)
                .values((
                    versions::version.eq(migration.version),
                    versions::name.eq(migration.name),
                ))
                .execute(conn)
                .await?;
            tracing::info!(
                version = migration.version,
                name = migration.name,
                "applied migration"
            );
            applied.push(migration.version);
        }
        Ok(applied)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_increase() {
        assert!(
            MIGRATIONS
                .windows(2)
                .all(|pair| pair[0].version < pair[1].version)
        );
        assert!(MIGRATIONS.iter().all(|m| !m.sql.trim().is_empty()));
    }
}
