//! The MariaDB migrations: the library's own version table, steps that can
//! be re-run, and `GET_LOCK` so that instances starting together migrate
//! once.

use diesel::sql_types::{Integer, Nullable, Text};
use diesel_async::{AsyncMysqlConnection, RunQueryDsl, SimpleAsyncConnection};

use super::sql::MysqlSql;
use crate::Connection as _;
use crate::schema::{Migration, Phase};
use crate::{Error, Result};

/// The migrations of the MariaDB back end, in order. Their own numbering:
/// the MariaDB schema starts where PostgreSQL's migration 5 ends.
pub const MYSQL_MIGRATIONS: &[Migration] = &[Migration {
    version: 1,
    name: "outbox, inbox and admin tables",
    phase: Phase::Expand,
    sql: include_str!("../../sql/mysql/001_outbox.sql"),
}];

/// How often a waiting instance polls for the migration lock.
const LOCK_POLL: std::time::Duration = std::time::Duration::from_millis(200);

#[derive(diesel::QueryableByName)]
struct Name {
    #[diesel(sql_type = Nullable<Text>)]
    name: Option<String>,
}

#[derive(diesel::QueryableByName)]
struct Locked {
    #[diesel(sql_type = Nullable<Integer>)]
    locked: Option<i32>,
}

#[derive(diesel::QueryableByName)]
struct Version {
    #[diesel(sql_type = Integer)]
    version: i32,
}

/// Creates or upgrades the outbox's tables in the connection's database
/// (the one its URL names) and returns the versions it applied (empty when
/// there was nothing to do). Safe to run from every instance at start-up:
/// one migrates while the others wait for its `GET_LOCK`, then find nothing
/// to do.
///
/// MariaDB's DDL is not transactional (each statement commits), so every
/// step is written to be re-run: a migration killed half-way is finished
/// by the next run. The version row is written after the last step.
///
/// # Errors
/// [`Error::Config`] if the connection has no database or a transaction is
/// open on it (DDL would commit it); [`Error::Database`] if a step fails.
pub async fn migrate(conn: &mut AsyncMysqlConnection) -> Result<Vec<i32>> {
    run(conn, &MysqlSql::default_database()).await
}

/// [`migrate`] on a connection of its own to `url`.
///
/// # Errors
/// As [`migrate`], and [`Error::Connect`].
pub async fn migrate_url(url: &str) -> Result<Vec<i32>> {
    let mut conn = super::connect(url).await?;
    migrate(&mut conn).await
}

pub(crate) async fn run(conn: &mut AsyncMysqlConnection, sql: &MysqlSql) -> Result<Vec<i32>> {
    if conn.transaction_status().transaction_depth()?.is_some() {
        return Err(Error::Config(
            "migrate on a connection outside any transaction: MariaDB's DDL commits the \
             open transaction"
                .into(),
        ));
    }
    let database = match &sql.database {
        Some(name) => name.clone(),
        None => current_database(conn).await?,
    };
    let lock = lock_name(&database);
    let started = std::time::Instant::now();
    let mut warned = std::time::Duration::ZERO;
    loop {
        let locked: Locked = diesel::sql_query("SELECT GET_LOCK(?, 0) AS locked")
            .bind::<Text, _>(&lock)
            .get_result(conn)
            .await?;
        if locked.locked == Some(1) {
            break;
        }
        // Another instance migrates; say so every 10 s (a holder that never
        // lets go is a session to find with IS_USED_LOCK(lock) and kill).
        if started.elapsed() >= warned + std::time::Duration::from_secs(10) {
            warned = started.elapsed();
            tracing::warn!(
                lock,
                waited_secs = warned.as_secs(),
                "outbox migration waits for another instance's migration lock \
                 (SELECT IS_USED_LOCK(lock) names its session)"
            );
        }
        tokio::time::sleep(LOCK_POLL).await;
    }
    let result = apply(conn, sql, &database).await;
    let released = diesel::sql_query("DO RELEASE_LOCK(?)")
        .bind::<Text, _>(&lock)
        .execute(conn)
        .await;
    let applied = result?;
    released?;
    Ok(applied)
}

async fn current_database(conn: &mut AsyncMysqlConnection) -> Result<String> {
    let row: Name = diesel::sql_query("SELECT DATABASE() AS name")
        .get_result(conn)
        .await?;
    row.name.ok_or_else(|| {
        Error::Config(
            "the MariaDB connection has no database: name one in the URL \
             (mysql://user:password@host/database) or with MysqlSettings::new"
                .into(),
        )
    })
}

/// `GET_LOCK`'s name for `database`'s migrations (at most 64 characters,
/// MySQL's limit).
fn lock_name(database: &str) -> String {
    let name = format!("outbox:migrate:{database}");
    if name.chars().count() <= 64 {
        return name;
    }
    // FNV-1a: stable across builds and platforms.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in database.as_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("outbox:migrate:~{hash:016x}")
}

async fn apply(
    conn: &mut AsyncMysqlConnection,
    sql: &MysqlSql,
    database: &str,
) -> Result<Vec<i32>> {
    let versions = sql.table("outbox_schema_version");
    conn.batch_execute(&format!(
        "CREATE TABLE IF NOT EXISTS {versions} ( \
           version INT NOT NULL PRIMARY KEY, \
           name VARCHAR(255) NOT NULL, \
           applied_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)) \
         ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_nopad_bin"
    ))
    .await?;
    let done: Vec<Version> = diesel::sql_query(format!("SELECT version FROM {versions}"))
        .load(conn)
        .await?;
    let done: Vec<i32> = done.into_iter().map(|v| v.version).collect();
    let mut applied = Vec::new();
    for migration in MYSQL_MIGRATIONS {
        if done.contains(&migration.version) {
            continue;
        }
        for step in steps(migration, sql) {
            conn.batch_execute(&step).await?;
        }
        diesel::sql_query(format!(
            "INSERT INTO {versions} (version, name) VALUES (?, ?)"
        ))
        .bind::<Integer, _>(migration.version)
        .bind::<Text, _>(migration.name)
        .execute(conn)
        .await?;
        tracing::info!(
            database,
            version = migration.version,
            name = migration.name,
            "applied outbox migration"
        );
        applied.push(migration.version);
    }
    Ok(applied)
}

/// `migration`'s steps (split at `-- step:` lines), each one batch, with
/// `{schema}` rendered as the settings' database qualifier ("`db`." or
/// nothing).
fn steps(migration: &Migration, sql: &MysqlSql) -> Vec<String> {
    let prefix = sql.table("");
    let mut steps = Vec::new();
    let mut step = String::new();
    let mut flush = |step: &mut String| {
        if step
            .lines()
            .any(|l| !l.trim().is_empty() && !l.trim().starts_with("--"))
        {
            steps.push(step.trim().replace("{schema}", &prefix));
        }
        step.clear();
    };
    for line in migration.sql.lines() {
        if line.trim().starts_with("-- step:") {
            flush(&mut step);
        } else {
            step.push_str(line);
            step.push('\n');
        }
    }
    flush(&mut step);
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_name_the_database_and_no_placeholder_is_left() -> Result<()> {
        let sql = MysqlSql::new(Some("shop"))?;
        for migration in MYSQL_MIGRATIONS {
            let steps = steps(migration, &sql);
            assert!(!steps.is_empty());
            for step in &steps {
                assert!(!step.contains("{schema}"), "{step}");
            }
            assert!(steps.iter().any(|s| s.contains("`shop`.outbox_events")));
        }
        Ok(())
    }

    #[test]
    fn lock_names_fit_mysql_limit() {
        assert_eq!(lock_name("shop"), "outbox:migrate:shop");
        let long = lock_name(&"d".repeat(64));
        assert!(long.len() <= 64, "{long}");
        assert_ne!(lock_name(&"d".repeat(64)), lock_name(&"e".repeat(64)));
    }
}
