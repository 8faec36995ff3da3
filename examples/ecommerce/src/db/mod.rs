//! Persistence: creating the database, migrating it, the connection pool,
//! and the queries of each part of the service.
//!
//! Every function that changes an aggregate's rows takes them with
//! `SELECT … FOR UPDATE` first, so two transactions changing the same order
//! (or SKU, or loyalty award) run one after the other. The outbox relies on
//! that: events of one aggregate are published in the order they were
//! recorded, which is commit order only when writers are serialized.

pub mod inventory;
pub mod loyalty;
pub mod migrations;
pub mod orders;
pub mod schema;

use diesel::sql_types::{BigInt, Text};
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};

use crate::config::redact_url;

/// The connection pool every role uses (the outbox's own pool type).
pub type PgPool = Pool<AsyncPgConnection>;

/// Errors while preparing or using the database.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DbError {
    /// From the outbox adapter: connecting, its migrations, the pool.
    #[error(transparent)]
    Outbox(#[from] outbox::postgres::Error),
    /// A query failed.
    #[error("database query failed: {0}")]
    Query(#[from] diesel::result::Error),
    /// The database named in the URL could not be created.
    #[error("cannot create database {name:?} (connected to {maintenance_url}): {source}")]
    Create {
        /// The database.
        name: String,
        /// Where `CREATE DATABASE` was run.
        maintenance_url: String,
        /// Why it failed.
        #[source]
        source: diesel::result::Error,
    },
}

/// Makes the database at `url` ready: creates it if missing, then applies
/// the outbox's migrations and the service's own, each under an advisory
/// lock. Safe when several roles start at once.
///
/// # Errors
/// [`DbError`] saying what failed; an unreachable server names the URL and
/// `scripts/dev-services`.
pub async fn prepare(url: &str) -> Result<(), DbError> {
    ensure_database(url).await?;
    let mut conn = outbox::postgres::connect(url).await?;
    let outbox_applied = outbox::postgres::migrate(&mut conn, "public").await?;
    let applied = migrations::run(&mut conn).await?;
    tracing::info!(
        database = %redact_url(url),
        ?outbox_applied,
        ?applied,
        "database ready"
    );
    Ok(())
}

/// The pool of connections to `url`, at most `size` (opened lazily).
///
/// # Errors
/// [`DbError::Outbox`] if the pool cannot be built.
pub fn pool(url: &str, size: usize) -> Result<PgPool, DbError> {
    Ok(outbox::postgres::pool(url, size)?)
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
