//! MariaDB (and the MySQL protocol) through diesel-async's
//! `AsyncMysqlConnection` (mysql_async: pure Rust, no libmysqlclient).
//! Feature `mysql`. Tested on MariaDB 10.6+ (CI: 10.11); MySQL 8 is not
//! tested, so not claimed.
//!
//! The same parts as on PostgreSQL, from one [`MysqlSettings`]: the
//! recorder ([`MysqlOutbox`]), the inbox ([`MysqlInbox`],
//! [`MysqlInboxDatabase`]) and the migrations ([`migrate`]), on
//! [`MysqlTransaction`]s checked the same way at
//! commit (see [`Connection`]).
//!
//! # Where the outbox lives
//! MySQL has no schemas inside a database: the outbox's tables live in a
//! database. [`MysqlSettings::default`] uses the connection's own database
//! (the one its URL names) and qualifies no table; [`MysqlSettings::new`]
//! names another database on the same server.
//!
//! # What differs from PostgreSQL
//! - **Recording is refused outside a live transaction, also after a
//!   deadlock.** An InnoDB deadlock rolls the whole transaction back and
//!   the statements after it run in autocommit. The recorder's and the
//!   inbox's `INSERT`s insert only while the server has a transaction open
//!   (`WHERE @@in_transaction = 1`), so an event is never committed on its
//!   own; they then fail with [`Error::NotCommitted`].
//! - **A failed statement rolls back only itself** (but a deadlock): see
//!   [`Connection`].
//! - **No `NOTIFY`**: relays learn of new events from in-process wakeups
//!   and polling.
//! - **Exact payload bytes**: MySQL's `JSON` type rewrites the text
//!   (MariaDB's is an alias of `LONGTEXT`); the payload is a binary-collated
//!   `LONGTEXT`, stored and returned byte for byte.
//! - **Aggregate keys** are compared byte for byte (`utf8mb4_nopad_bin`):
//!   the default collations would merge `"A"`, `"a"` and `"a "` into one
//!   aggregate. Indexes use a SHA-256 of the key: a 2,048-byte aggregate id
//!   exceeds InnoDB's index key limit.

mod inbox;
mod migrate;
mod record;
mod settings;
mod sql;

pub use inbox::{MysqlInbox, MysqlInboxDatabase};
pub use migrate::{MYSQL_MIGRATIONS, migrate, migrate_url};
pub use record::MysqlOutbox;
pub use settings::MysqlSettings;

// What a MariaDB user needs from the crate root, here too (the facade's
// `outbox::mysql` is this module).
pub use crate::{
    Connection, Error, MysqlTransaction, POOL_CONNECT_TIMEOUT, POOL_WAIT_TIMEOUT, Result,
    Transaction, begin_top_level, commit_top_level, in_top_level_transaction,
};

use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::{AsyncConnection, AsyncMysqlConnection};
use futures_util::FutureExt as _;
use outbox_core::DomainEvent;
use uuid::Uuid;

/// Records `event` in the transaction open on `conn`, in the outbox of the
/// connection's database. Shorthand for
/// [`MysqlOutbox::default().record(conn, event)`](MysqlOutbox::record).
///
/// # Errors
/// As [`MysqlOutbox::record`].
pub async fn record<E: DomainEvent + Sync>(
    conn: &mut AsyncMysqlConnection,
    event: &E,
) -> Result<Uuid> {
    MysqlOutbox::default().record(conn, event).await
}

/// Records `events` with one `INSERT`. Shorthand for
/// [`MysqlOutbox::record_all`].
///
/// # Errors
/// As [`MysqlOutbox::record`].
pub async fn record_all<E: DomainEvent + Sync>(
    conn: &mut AsyncMysqlConnection,
    events: &[E],
) -> Result<Vec<Uuid>> {
    MysqlOutbox::default().record_all(conn, events).await
}

/// Opens a direct connection to `url` (`mysql://user:password@host:port/db`).
///
/// # Errors
/// [`Error::Connect`], naming the (redacted) URL, if the server cannot be
/// reached or refuses the login.
pub async fn connect(url: &str) -> Result<AsyncMysqlConnection> {
    AsyncMysqlConnection::establish(url)
        .await
        .map_err(|source| Error::Connect {
            url: crate::error::redact_url(url),
            source,
        })
}

/// A deadpool pool of at most `max_size` connections to `url`, with the
/// same timeouts and recycling as PostgreSQL's [`pool`](crate#functions)
/// ([`POOL_WAIT_TIMEOUT`],
/// [`POOL_CONNECT_TIMEOUT`], no ping on
/// checkout). Connections are opened lazily, on first use.
///
/// # Errors
/// [`Error::Config`] if the pool cannot be built.
pub fn pool(url: &str, max_size: usize) -> Result<Pool<AsyncMysqlConnection>> {
    let url = url.to_owned();
    crate::pool_of(&url.clone(), max_size, move || {
        let url = url.clone();
        async move { AsyncMysqlConnection::establish(&url).await }.boxed()
    })
}
