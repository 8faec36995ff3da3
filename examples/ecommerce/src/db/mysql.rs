//! The shop on MariaDB (10.6+; `DATABASE_URL=mysql://…`): ids as
//! 36-character ASCII text, rows locked with `SELECT … FOR UPDATE`, upserts
//! with `ON DUPLICATE KEY UPDATE`, migrations under `GET_LOCK` (DDL commits
//! itself on MariaDB, so each statement is idempotent instead of the whole
//! migration being one transaction).
//!
//! Every transaction of the service runs at `READ COMMITTED` (set on each
//! pooled connection: [`SESSION`]), and every read that a change depends on
//! is a locking read (`FOR UPDATE`), which reads the latest committed row.
//! Not MariaDB's default `REPEATABLE READ`: there a locking read of a
//! missing row (a reservation or award not recorded yet) takes a gap lock,
//! gap locks do not conflict with each other, and two transactions then
//! insert into the same gap (order ids are UUIDv7: every new one lands at
//! the end of the index) and deadlock, for *different* orders. At `READ
//! COMMITTED` the second insert of the *same* order waits for the first
//! and fails on the primary key, as the `Inventory` docs describe.
//!
//! The SQL is MariaDB's (`VALUE(col)` in `ON DUPLICATE KEY UPDATE`); MySQL
//! 8 would need its own dialect, and is not tested.

use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Integer, Nullable, Text};
use diesel_async::{AsyncMysqlConnection, RunQueryDsl, SimpleAsyncConnection};
use outbox::mysql::{
    MysqlDeadLetters, MysqlInbox, MysqlInboxDatabase, MysqlOutboxStore, MysqlSettings,
};

use super::text::{Dialect, text_queries};
use outbox::axum::OutboxLayer;

use super::{Backend, Database, DbError, DbPool};
use crate::config::redact_url;

text_queries!(
    AsyncMysqlConnection,
    Dialect {
        lock: " FOR UPDATE",
        now: "CURRENT_TIMESTAMP(6)",
        upsert_stock: "INSERT INTO inventory (sku, available, reserved) VALUES (?, ?, 0) \
                       ON DUPLICATE KEY UPDATE available = VALUE(available)",
        upsert_points: "INSERT INTO loyalty_accounts (customer_id, points) VALUES (?, ?) \
                        ON DUPLICATE KEY UPDATE points = points + VALUE(points)",
    }
);

/// The service's own migrations on MariaDB, oldest first: `(version, name,
/// statements)`. Every statement is idempotent (`IF NOT EXISTS`): DDL is not
/// transactional here, so a migration cut short is applied again whole.
pub const MIGRATIONS: &[(i32, &str, &str)] = &[(
    1,
    "initial",
    include_str!("../../migrations/mysql/001_initial.sql"),
)];

/// What every pooled connection runs first (see the module docs).
pub const SESSION: &str = "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED";

/// The name of the `GET_LOCK` lock held while migrating, followed by the
/// database's name (the lock is server-wide: databases of other services
/// on the same server do not wait for each other).
pub const LOCK_NAME: &str = "ecommerce_migrations";

/// How long a second instance waits for the first one's migrations.
const LOCK_WAIT_SECONDS: i32 = 60;

impl Database for AsyncMysqlConnection {
    type Store = MysqlOutboxStore;
    type DeadLetters = MysqlDeadLetters;
    type Inbox = MysqlInboxDatabase;

    const KIND: Backend = Backend::Mysql;

    /// Creates the database if missing (`CREATE DATABASE IF NOT EXISTS`,
    /// connected without one), then the outbox's migrations and the
    /// service's ([`migrate`]).
    async fn prepare(url: &str) -> Result<(), DbError> {
        ensure_database(url).await?;
        let mut conn = outbox::mysql::connect(url).await?;
        let outbox_applied = outbox::mysql::migrate(&mut conn).await?;
        let applied = migrate(&mut conn).await?;
        super::log_ready(Backend::Mysql, url, &outbox_applied, &applied);
        Ok(())
    }

    fn pool(url: &str, size: usize) -> Result<DbPool<Self>, DbError> {
        Ok(outbox::mysql::pool_with_session(url, size, SESSION)?)
    }

    /// MariaDB has no `NOTIFY`: the relay polls, and is woken in-process
    /// in the `all` role; `url` is not used. Sent events are kept (for the
    /// admin API, until `SENT_RETENTION`), as on PostgreSQL.
    fn store(pool: DbPool<Self>, _url: Option<&str>) -> Result<MysqlOutboxStore, DbError> {
        Ok(MysqlSettings::default().store(pool).keep_sent(true))
    }

    fn dead_letters(pool: DbPool<Self>) -> MysqlDeadLetters {
        MysqlDeadLetters::new(pool)
    }

    fn inbox(pool: DbPool<Self>) -> MysqlInboxDatabase {
        MysqlInboxDatabase::new(pool, MysqlInbox::default())
    }

    fn layer(pool: DbPool<Self>) -> OutboxLayer {
        OutboxLayer::new(pool)
    }
}

/// Creates the database `url` names when it does not exist yet, on a
/// connection to the same server without a database. When the server is
/// unreachable, or the URL names no database, the first error is returned.
///
/// # Errors
/// [`DbError`]: the server is unreachable, or creating the database failed.
pub async fn ensure_database(url: &str) -> Result<(), DbError> {
    let first = match outbox::mysql::connect(url).await {
        Ok(_) => return Ok(()),
        Err(err) => err,
    };
    let Some((server_url, name)) = server_url(url) else {
        return Err(first.into());
    };
    let Ok(mut conn) = outbox::mysql::connect(&server_url).await else {
        return Err(first.into());
    };
    let created = conn
        .batch_execute(&format!(
            "CREATE DATABASE IF NOT EXISTS {} CHARACTER SET utf8mb4",
            quote_ident(&name)
        ))
        .await;
    match created {
        Ok(()) => {
            tracing::info!(database = %name, "created database (if it was missing)");
            Ok(())
        }
        Err(source) => Err(DbError::Create {
            name,
            maintenance_url: redact_url(&server_url),
            source,
        }),
    }
}

/// Applies the pending [`MIGRATIONS`] under `GET_LOCK(LOCK_NAME)`: a
/// second instance starting at the same time waits for the first, then
/// finds nothing to do. Returns the versions applied.
///
/// # Errors
/// [`DbError::Query`] if a statement fails, or the lock is not granted
/// within a minute.
pub async fn migrate(conn: &mut AsyncMysqlConnection) -> Result<Vec<i32>, DbError> {
    #[derive(QueryableByName)]
    struct Granted {
        #[diesel(sql_type = Nullable<BigInt>)]
        granted: Option<i64>,
    }
    let granted: Granted =
        diesel::sql_query("SELECT GET_LOCK(CONCAT(?, ':', DATABASE()), ?) AS granted")
            .bind::<Text, _>(LOCK_NAME)
            .bind::<Integer, _>(LOCK_WAIT_SECONDS)
            .get_result(conn)
            .await?;
    if granted.granted != Some(1) {
        return Err(DbError::Query(diesel::result::Error::QueryBuilderError(
            format!(
                "another instance held the migration lock {LOCK_NAME:?} for more than \
                 {LOCK_WAIT_SECONDS} s"
            )
            .into(),
        )));
    }
    let applied = migrate_locked(conn).await;
    // Released also when a migration failed (and with the connection).
    let released = conn
        .batch_execute(&format!(
            "DO RELEASE_LOCK(CONCAT('{LOCK_NAME}', ':', DATABASE()))"
        ))
        .await;
    let applied = applied?;
    released?;
    Ok(applied)
}

async fn migrate_locked(conn: &mut AsyncMysqlConnection) -> Result<Vec<i32>, DbError> {
    #[derive(QueryableByName)]
    struct Version {
        #[diesel(sql_type = Integer)]
        version: i32,
    }
    conn.batch_execute(
        "CREATE TABLE IF NOT EXISTS ecommerce_schema_version (
             version    INT          NOT NULL PRIMARY KEY,
             name       VARCHAR(200) NOT NULL,
             applied_at DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
         ) ENGINE = InnoDB",
    )
    .await?;
    let done: Vec<Version> = diesel::sql_query("SELECT version FROM ecommerce_schema_version")
        .load(conn)
        .await?;
    let mut applied = Vec::new();
    for &(version, name, sql) in MIGRATIONS {
        if done.iter().any(|row| row.version == version) {
            continue;
        }
        for statement in statements(sql) {
            conn.batch_execute(statement).await?;
        }
        diesel::sql_query("INSERT INTO ecommerce_schema_version (version, name) VALUES (?, ?)")
            .bind::<Integer, _>(version)
            .bind::<Text, _>(name)
            .execute(conn)
            .await?;
        tracing::info!(version, name, "applied migration");
        applied.push(version);
    }
    Ok(applied)
}

/// The statements of a migration file: split at each `;` that ends a line,
/// comment-only pieces dropped.
fn statements(sql: &str) -> impl Iterator<Item = &str> {
    sql.split(";\n").map(str::trim).filter(|statement| {
        statement
            .lines()
            .any(|line| !line.trim().is_empty() && !line.trim_start().starts_with("--"))
    })
}

/// The URL of the same server without a database, and the database name
/// `url` names (`None` when it names none).
fn server_url(url: &str) -> Option<(String, String)> {
    let (scheme, rest) = url.split_once("://")?;
    let slash = rest.find('/')?;
    let (authority, path) = rest.split_at(slash);
    let (name, query) = match path[1..].split_once('?') {
        Some((name, query)) => (name, Some(query)),
        None => (&path[1..], None),
    };
    if name.is_empty() || name.contains('%') {
        return None;
    }
    let query = query.map(|q| format!("?{q}")).unwrap_or_default();
    Some((format!("{scheme}://{authority}/{query}"), name.to_owned()))
}

/// `name` as a quoted MariaDB identifier.
fn quote_ident(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_url_names_no_database() {
        assert_eq!(
            server_url("mysql://outbox:pw@127.0.0.1:3306/shop"),
            Some(("mysql://outbox:pw@127.0.0.1:3306/".into(), "shop".into()))
        );
        assert_eq!(
            server_url("mysql://u@db/shop?prefer_socket=false"),
            Some(("mysql://u@db/?prefer_socket=false".into(), "shop".into()))
        );
        assert_eq!(server_url("mysql://db:3306"), None);
        assert_eq!(server_url("mysql://db/"), None);
    }

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(quote_ident("shop"), "`shop`");
        assert_eq!(quote_ident("a`b"), "`a``b`");
    }

    #[test]
    fn migrations_split_into_statements_without_comments() {
        let sql = "-- a comment\n\nCREATE TABLE a (x INT);\n-- only a comment;\nCREATE TABLE b (\n  y INT -- note\n);\n";
        assert_eq!(
            statements(sql).collect::<Vec<_>>(),
            [
                "-- a comment\n\nCREATE TABLE a (x INT)",
                "CREATE TABLE b (\n  y INT -- note\n)"
            ]
        );
        for (version, _, sql) in MIGRATIONS {
            assert!(statements(sql).count() >= 7, "migration {version}");
        }
    }
}
