//! The shop on SQLite (`DATABASE_URL=sqlite://shop.db`, a file created
//! if missing: no database server at all). Ids are text; nothing is locked
//! row by row: every request and consumer transaction begins with
//! `BEGIN IMMEDIATE` (the outbox's SQLite transactions do), which takes the
//! database's one write lock at once, so writers run one after the other
//! anyway. Reads in the same transaction see the latest commit.
//!
//! Every role of the service may run in its own process on the same file
//! (on one host): SQLite serializes them through its write lock, waiting up
//! to its `busy_timeout` (`outbox::sqlite::BUSY_TIMEOUT`). One relay
//! process is enough, since SQLite has one writer anyway.

use diesel_async::{RunQueryDsl, SimpleAsyncConnection};
use outbox::sqlite::{
    AsyncSqliteConnection, SqliteDeadLetters, SqliteInbox, SqliteInboxDatabase, SqliteOutboxStore,
    SqliteSettings,
};

use super::text::{Dialect, text_queries};
use outbox::axum::OutboxLayer;

use super::{Backend, Database, DbError, DbPool};

text_queries!(
    AsyncSqliteConnection,
    Dialect {
        lock: "",
        now: "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
        upsert_stock: "INSERT INTO inventory (sku, available, reserved) VALUES (?, ?, 0) \
                       ON CONFLICT (sku) DO UPDATE SET available = excluded.available",
        upsert_points: "INSERT INTO loyalty_accounts (customer_id, points) VALUES (?, ?) \
                        ON CONFLICT (customer_id) DO UPDATE SET points = points + excluded.points",
    }
);

/// The service's own migrations on SQLite, oldest first: `(version, name,
/// statements)`. Each is applied in one transaction with its version row.
pub const MIGRATIONS: &[(i32, &str, &str)] = &[(
    1,
    "initial",
    include_str!("../../migrations/sqlite/001_initial.sql"),
)];

impl Database for AsyncSqliteConnection {
    type Store = SqliteOutboxStore;
    type DeadLetters = SqliteDeadLetters;
    type Inbox = SqliteInboxDatabase;

    const KIND: Backend = Backend::Sqlite;

    /// Opens the file (creating it), then applies the outbox's migrations
    /// and the service's ([`migrate`]), each under the write lock.
    async fn prepare(url: &str) -> Result<(), DbError> {
        let mut conn = outbox::sqlite::connect(url).await?;
        let outbox_applied = outbox::sqlite::migrate(&mut conn).await?;
        let applied = migrate(&mut conn).await?;
        super::log_ready(Backend::Sqlite, url, &outbox_applied, &applied);
        Ok(())
    }

    fn pool(url: &str, size: usize) -> Result<DbPool<Self>, DbError> {
        Ok(outbox::sqlite::pool(url, size)?)
    }

    /// SQLite has no `NOTIFY`: the relay polls, and is woken in-process in
    /// the `all` role; `url` is not used. Sent events are kept (for the
    /// admin API, until `SENT_RETENTION`), as on PostgreSQL.
    fn store(pool: DbPool<Self>, _url: Option<&str>) -> Result<SqliteOutboxStore, DbError> {
        Ok(SqliteSettings::default().store(pool).keep_sent(true))
    }

    fn dead_letters(pool: DbPool<Self>) -> SqliteDeadLetters {
        SqliteDeadLetters::new(pool)
    }

    fn inbox(pool: DbPool<Self>) -> SqliteInboxDatabase {
        SqliteInboxDatabase::new(pool, SqliteInbox::default())
    }

    fn layer(pool: DbPool<Self>) -> OutboxLayer {
        OutboxLayer::new(pool)
    }
}

/// Applies the pending [`MIGRATIONS`], each in one `BEGIN IMMEDIATE`
/// transaction with its version row: a second instance starting at the
/// same time waits for the write lock, then finds nothing to do. Returns
/// the versions applied.
///
/// # Errors
/// [`DbError`] if a statement fails or the write lock stays taken past the
/// `busy_timeout`.
pub async fn migrate(conn: &mut AsyncSqliteConnection) -> Result<Vec<i32>, DbError> {
    #[derive(diesel::QueryableByName)]
    struct Count {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    conn.batch_execute(
        "CREATE TABLE IF NOT EXISTS ecommerce_schema_version (
             version    INTEGER PRIMARY KEY NOT NULL,
             name       TEXT NOT NULL,
             applied_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
         ) STRICT",
    )
    .await?;
    let mut applied = Vec::new();
    for &(version, name, sql) in MIGRATIONS {
        outbox::sqlite::begin_top_level(conn).await?;
        let done: Count = diesel::sql_query(
            "SELECT count(*) AS n FROM ecommerce_schema_version WHERE version = ?",
        )
        .bind::<diesel::sql_types::Integer, _>(version)
        .get_result(conn)
        .await?;
        if done.n == 0 {
            conn.batch_execute(sql).await?;
            diesel::sql_query("INSERT INTO ecommerce_schema_version (version, name) VALUES (?, ?)")
                .bind::<diesel::sql_types::Integer, _>(version)
                .bind::<diesel::sql_types::Text, _>(name)
                .execute(conn)
                .await?;
            tracing::info!(version, name, "applied migration");
            applied.push(version);
        }
        // An error above leaves the transaction open: the caller drops the
        // connection, which rolls it back.
        outbox::sqlite::commit_top_level(conn).await?;
    }
    Ok(applied)
}
