//! The shop on PostgreSQL: Diesel's typed queries ([`schema`]), rows
//! locked with `SELECT … FOR UPDATE`, migrations in one transaction under
//! an advisory lock ([`migrations`]).

pub mod inventory;
pub mod loyalty;
pub mod migrations;
pub mod orders;
pub mod schema;

use diesel::sql_types::{BigInt, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use outbox::postgres::{PgDeadLetters, PgInbox, PgInboxDatabase, PgOutboxStore};

use outbox::axum::OutboxLayer;

use super::{Backend, Database, DbError, DbPool};
use crate::config::redact_url;

impl Database for AsyncPgConnection {
    type Store = PgOutboxStore;
    type DeadLetters = PgDeadLetters;
    type Inbox = PgInboxDatabase;

    const KIND: Backend = Backend::Postgres;

    /// Creates the database if missing ([`ensure_database`]), then the
    /// outbox's migrations (in `public`) and the service's
    /// ([`migrations::run`]).
    async fn prepare(url: &str) -> Result<(), DbError> {
        ensure_database(url).await?;
        let mut conn = outbox::postgres::connect(url).await?;
        let outbox_applied = outbox::postgres::migrate(&mut conn, "public").await?;
        let applied = migrations::run(&mut conn).await?;
        super::log_ready(Backend::Postgres, url, &outbox_applied, &applied);
        Ok(())
    }

    fn pool(url: &str, size: usize) -> Result<DbPool<Self>, DbError> {
        Ok(outbox::postgres::pool(url, size)?)
    }

    /// Woken by `NOTIFY` on a `LISTEN` connection to `url`.
    fn store(pool: DbPool<Self>, url: Option<&str>) -> Result<PgOutboxStore, DbError> {
        let mut builder = PgOutboxStore::builder(pool);
        if let Some(url) = url {
            builder = builder.listen(url);
        }
        Ok(builder.build()?)
    }

    fn dead_letters(pool: DbPool<Self>) -> PgDeadLetters {
        PgDeadLetters::new(pool)
    }

    fn inbox(pool: DbPool<Self>) -> PgInboxDatabase {
        PgInboxDatabase::new(pool, PgInbox::default())
    }

    fn layer(pool: DbPool<Self>) -> OutboxLayer {
        OutboxLayer::new(pool)
    }
}

/// Creates the database named in `url` when it does not exist yet.
///
/// Tries `url` first; when that fails, connects to the `postgres` database
/// of the same server and runs `CREATE DATABASE` if the database is absent.
/// Another instance creating it at the same moment makes our
/// `CREATE DATABASE` fail; the database then exists, which is all we need.
/// When the server itself is unreachable, the first error is returned.
///
/// # Errors
/// [`DbError`]: the server is unreachable, or creating the database failed.
pub async fn ensure_database(url: &str) -> Result<(), DbError> {
    let first = match outbox::postgres::connect(url).await {
        Ok(_) => return Ok(()),
        Err(err) => err,
    };
    let Some((maintenance_url, name)) = maintenance_url(url) else {
        return Err(first.into());
    };
    let Ok(mut conn) = outbox::postgres::connect(&maintenance_url).await else {
        return Err(first.into());
    };
    if database_exists(&mut conn, &name).await? {
        // It exists, so `url` failed for another reason (e.g. permissions).
        return Err(first.into());
    }
    let created = conn
        .batch_execute(&format!("CREATE DATABASE {}", quote_ident(&name)))
        .await;
    match created {
        Ok(()) => {
            tracing::info!(database = %name, "created database");
            Ok(())
        }
        // Lost a race with another instance creating it: fine.
        Err(_) if database_exists(&mut conn, &name).await? => Ok(()),
        Err(source) => Err(DbError::Create {
            name,
            maintenance_url: redact_url(&maintenance_url),
            source,
        }),
    }
}

async fn database_exists(conn: &mut AsyncPgConnection, name: &str) -> Result<bool, DbError> {
    #[derive(diesel::QueryableByName)]
    struct Found {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let found: Found =
        diesel::sql_query("SELECT count(*) AS n FROM pg_database WHERE datname = $1")
            .bind::<Text, _>(name)
            .get_result(conn)
            .await?;
    Ok(found.n > 0)
}

/// The URL of the `postgres` database on the same server as `url`, and the
/// database name `url` names (`None` when it names none, or names `postgres`).
fn maintenance_url(url: &str) -> Option<(String, String)> {
    let (scheme, rest) = url.split_once("://")?;
    let slash = rest.find('/')?;
    let (authority, path) = rest.split_at(slash);
    let (name, query) = match path[1..].split_once('?') {
        Some((name, query)) => (name, Some(query)),
        None => (&path[1..], None),
    };
    if name.is_empty() || name == "postgres" || name.contains('%') {
        return None;
    }
    let query = query.map(|q| format!("?{q}")).unwrap_or_default();
    Some((
        format!("{scheme}://{authority}/postgres{query}"),
        name.to_owned(),
    ))
}

/// `name` as a quoted SQL identifier.
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_maintenance_database_is_on_the_same_server() {
        assert_eq!(
            maintenance_url("postgres://postgres@127.0.0.1:5432/ecommerce"),
            Some((
                "postgres://postgres@127.0.0.1:5432/postgres".into(),
                "ecommerce".into()
            ))
        );
        assert_eq!(
            maintenance_url("postgresql://u:p@db/shop?sslmode=disable"),
            Some((
                "postgresql://u:p@db/postgres?sslmode=disable".into(),
                "shop".into()
            ))
        );
        assert_eq!(maintenance_url("postgres://db:5432"), None);
        assert_eq!(maintenance_url("postgres://db/"), None);
        assert_eq!(maintenance_url("postgres://db/postgres"), None);
    }

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(quote_ident("shop"), "\"shop\"");
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
    }
}
