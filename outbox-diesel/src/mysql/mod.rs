//! MariaDB (and the MySQL protocol) through diesel-async's
//! `AsyncMysqlConnection` (mysql_async: pure Rust, no libmysqlclient).
//! Feature `mysql`. MariaDB 10.6+ (CI: 10.11): the SQL uses MariaDB's
//! `@@in_transaction`, `utf8mb4_nopad_bin` and `idle_transaction_timeout`,
//! which MySQL 8 does not have, so MySQL is not supported.
//!
//! The same parts as on PostgreSQL, from one [`MysqlSettings`]: the
//! recorder ([`MysqlOutbox`]), the relay's store ([`MysqlOutboxStore`],
//! run by `outbox_core::Relay` like PostgreSQL's), the inbox
//! ([`MysqlInbox`], [`MysqlInboxDatabase`]) and the migrations
//! ([`migrate`]), on [`MysqlTransaction`]s checked at commit (see
//! [`Connection`]). The admin API (`outbox_core::admin::Admin`, the
//! `Janitor`) runs over [`MysqlOutboxStore`], which implements
//! `OutboxAdmin`, and consumers' dead letters are read and settled through
//! [`MysqlDeadLetters`] (`outbox-axum`'s admin router takes any
//! `OutboxAdmin`). TLS needs the `mysql-tls` feature (see [TLS](#tls)).
//!
//! ```no_run
//! # async fn f() -> outbox_diesel::Result<()> {
//! use outbox_diesel::mysql::{self, MysqlSettings, MysqlTransaction};
//! # #[derive(serde::Serialize)] struct OrderPlaced { order_id: u64 }
//! # impl outbox_core::DomainEvent for OrderPlaced {
//! #     fn aggregate_type(&self) -> &'static str { "order" }
//! #     fn event_type(&self) -> &'static str { "order.placed" }
//! #     fn aggregate_id(&self) -> String { self.order_id.to_string() }
//! # }
//! let url = "mysql://shop:secret@127.0.0.1:3306/shop";
//! mysql::migrate_url(url).await?; // once at start, under GET_LOCK
//! let pool = mysql::pool(url, 8)?;
//!
//! let mut tx = MysqlTransaction::begin(&pool).await?;
//! // ... the business change on `&mut *tx` ...
//! mysql::record(&mut tx, &OrderPlaced { order_id: 1 }).await?;
//! tx.commit().await?; // the event is stored if and only if this commits
//!
//! // The relay's store, for outbox_core::Relay::builder(store, publisher):
//! let store = MysqlSettings::default().store(pool.clone());
//! # Ok(()) }
//! ```
//!
//! # TLS
//! Every connection this module opens ([`connect`], [`pool`],
//! [`migrate_url`]) reads the URL's TLS parameters: mysql_async's own and
//! `ssl_ca`, this crate's. TLS itself needs the `mysql-tls` feature
//! (mysql_async's rustls on ring; no OpenSSL):
//!
//! | URL parameter | with `mysql-tls` | without it |
//! |---|---|---|
//! | none, or `require_ssl=false` | plaintext | plaintext |
//! | `require_ssl=true` | TLS or no connection; the certificate must chain to the built-in (webpki, public) roots and name the host | refused with [`Error::Tls`], which names the feature: never a silent plaintext connection |
//! | `ssl_ca=<path>` | the PEM file's CA certificate(s) are the roots instead of the built-in ones (both with `built_in_roots=true`); implies `require_ssl=true` | refused, as above |
//! | `verify_identity=false` | refused with [`Error::Tls`]: mysql_async 0.36 (the driver under diesel-async 0.9) checks the host name anyway (its issue #404); connect by a name the certificate holds | refused, as above |
//! | `verify_ca=false` | the certificate is not checked at all: encrypted, unauthenticated | refused, as above |
//! | `built_in_roots=false` | only `ssl_ca`'s roots | refused, as above |
//!
//! ```no_run
//! # async fn run() -> outbox_diesel::Result<()> {
//! use outbox_diesel::mysql;
//! let url = "mysql://app:secret@db.internal/shop?require_ssl=true&ssl_ca=/etc/ssl/db-ca.pem";
//! mysql::migrate_url(url).await?;
//! let pool = mysql::pool(url, 16)?; // every connection verified
//! # Ok(()) }
//! ```
//!
//! `ssl_ca` is read when [`pool`] is built (a new CA needs a new pool) or
//! [`connect`] is called (not with `require_ssl=false`, which wins: plaintext);
//! a file that cannot be read or holds no certificate, and any other `ssl…`
//! parameter (`sslmode`, client certificates: not supported) are refused
//! with [`Error::Tls`] before connecting. A certificate that fails its
//! check ends in [`Error::Connect`] (from [`pool`], when a connection is
//! opened) with rustls's reason, e.g. `invalid peer certificate:
//! UnknownIssuer` (not signed by a trusted CA) or `certificate not valid
//! for name "…"` (not for the URL's host). A server
//! without TLS fails `require_ssl=true` the same way. MariaDB answers a
//! plaintext login it refuses because it requires TLS
//! (`require_secure_transport`, a user's `REQUIRE SSL`) with "Access
//! denied"; with the feature, that error adds that the server may require
//! TLS.
//!
//! mysql_async moves a connection to a server on the same host onto the
//! server's Unix socket after logging in (its `prefer_socket`); a TLS
//! connection stays on TCP and TLS. mysql_async builds its rustls
//! configuration with the process's default `CryptoProvider`: when the
//! process has none, ring's is installed as the default.
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
//! - **Sessions run in strict SQL mode** (`STRICT_ALL_TABLES` is added to
//!   each connection's `sql_mode`) **with autocommit on**: a value too long
//!   for its column is an error, not a silent truncation, and recording is
//!   refused in a session with autocommit off.
//! - **Statements that commit implicitly** (DDL, `LOCK TABLES`, a `BEGIN`
//!   inside the transaction) end the transaction on MariaDB: never run them
//!   inside one of the outbox's transactions.
//! - **No `NOTIFY`**: relays learn of new events from in-process wakeups
//!   and polling.
//! - **The pool pings each connection on checkout** (see [`pool`]).
//! - **Claims take three statements** where PostgreSQL takes one (see
//!   [`MysqlOutboxStore`]); held events are released by the store, not by a
//!   trigger.
//! - **The admin API** differs in a few points: see below.
//! - **Exact payload bytes**: MySQL's `JSON` type rewrites the text
//!   (MariaDB's is an alias of `LONGTEXT`); the payload is a binary-collated
//!   `LONGTEXT`, stored and returned byte for byte.
//! - **Aggregate keys** are compared byte for byte (`utf8mb4_nopad_bin`):
//!   the default collations would merge `"A"`, `"a"` and `"a "` into one
//!   aggregate. Indexes use a SHA-256 of the key: a 2,048-byte aggregate id
//!   exceeds InnoDB's index key limit.
//!
//! # The admin API
//! [`MysqlOutboxStore`] implements `outbox_core::admin::OutboxAdmin` with
//! PostgreSQL's contract (chunks in `seq` order bounded by `seq_at_most`,
//! audit counts in each chunk's transaction, dead events never purged,
//! paused relays never purged as stale), so `Admin` and the `Janitor` run
//! over it unchanged; [`MysqlDeadLetters`] is `PgDeadLetters`' counterpart.
//! What differs:
//! - **A chunk is several statements in one transaction** where
//!   PostgreSQL needs one (no data-modifying CTEs): at `READ COMMITTED`,
//!   the chunk's rows are locked with `FOR UPDATE` under a 5 s
//!   `innodb_lock_wait_timeout` (PostgreSQL: `lock_timeout`), changed,
//!   and counted in the audit row. A row a relay's claim holds is waited
//!   for; held longer, the chunk changes nothing and the run fails with
//!   "run it again", as on PostgreSQL.
//! - **Replays and skips release the events they held back** in the same
//!   transaction (PostgreSQL's trigger does it there).
//! - **The purges of inbox entries, of settled dead-letter records and of
//!   orphaned attempt rows wait** for rows another transaction locks
//!   instead of skipping them (a single-table `DELETE … LIMIT` cannot
//!   `SKIP LOCKED`); the purge of sent events skips them, as on
//!   PostgreSQL.
//! - **`error_contains`** lower-cases the column with MariaDB's case
//!   mapping and the text with Rust's: they differ on a few letters (`İ`).
//! - **The status report's estimate** of sent events past 100,000 is
//!   InnoDB's `TABLE_ROWS`, rougher than PostgreSQL's `reltuples`.
//! - **A dead letter's payload keeps NUL characters** (PostgreSQL's text
//!   turns them into U+FFFD), and its own id is matched through a stored
//!   column of its header cut to 255 characters.

mod audit;
mod connect;
mod dead_letters;
mod inbox;
mod migrate;
mod record;
mod settings;
mod sql;
mod store;

pub use dead_letters::MysqlDeadLetters;
pub use inbox::{MysqlInbox, MysqlInboxDatabase};
pub use migrate::{MYSQL_MIGRATIONS, migrate, migrate_url};
pub use record::MysqlOutbox;
pub use settings::MysqlSettings;
pub use store::{MysqlClaim, MysqlOutboxStore};

// What a MariaDB user needs from the crate root, here too (the facade's
// `outbox::mysql` is this module).
pub use crate::{
    Connection, Error, MysqlTransaction, POOL_CONNECT_TIMEOUT, POOL_WAIT_TIMEOUT, Result,
    Transaction, begin_top_level, commit_top_level, in_top_level_transaction,
};

use diesel_async::AsyncMysqlConnection;
use diesel_async::pooled_connection::deadpool::Pool;
use futures_util::FutureExt as _;
use outbox_core::DomainEvent;
use uuid::Uuid;

use connect::Connector;

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

/// Opens a direct connection to `url` (`mysql://user:password@host:port/db`),
/// in strict SQL mode (see below), over TLS if `url` asks for it (see
/// [TLS](self#tls)).
///
/// The session's `sql_mode` gets `STRICT_ALL_TABLES` added: without it
/// MariaDB truncates a value too long for its column (a consumer name, an
/// aggregate id) with a warning instead of an error, which could make two
/// consumers one or store a date as `0000-00-00`.
///
/// # Errors
/// [`Error::Tls`] if `url`'s TLS parameters cannot be honoured (without
/// the `mysql-tls` feature: any that asks for TLS); [`Error::Config`] if
/// mysql_async cannot read `url` (with the feature); [`Error::Connect`],
/// naming the (redacted) URL, if the server cannot be reached, fails the
/// TLS handshake or the certificate check, refuses the login or the
/// session setup.
pub async fn connect(url: &str) -> Result<AsyncMysqlConnection> {
    let connector = Connector::new(url)?;
    open(&connector).await.map_err(|source| Error::Connect {
        url: crate::error::redact_url(url),
        source,
    })
}

/// A deadpool pool of at most `max_size` connections to `url`, each set up
/// as [`connect`] sets it up (TLS included), with the same timeouts as
/// PostgreSQL's pool ([`POOL_WAIT_TIMEOUT`], [`POOL_CONNECT_TIMEOUT`]).
/// Connections are opened lazily, on first use; `url`'s TLS parameters are
/// read (and an `ssl_ca` file loaded) now.
///
/// Unlike PostgreSQL's pool, each checkout pings the connection (diesel's
/// `RecyclingMethod::Verified`, one `SELECT 1` round trip): mysql_async does
/// not tell diesel-async that a connection's socket closed (the server's
/// `wait_timeout`, a restart, a `KILL`, a proxy's idle timeout), so without
/// the ping a dead connection would be handed out, fail, and go back to the
/// pool, for ever.
///
/// # Errors
/// [`Error::Tls`] and [`Error::Config`] as [`connect`]; [`Error::Config`]
/// if the pool cannot be built.
pub fn pool(url: &str, max_size: usize) -> Result<Pool<AsyncMysqlConnection>> {
    pool_setting_up(url, max_size, None)
}

/// [`pool`], where each new connection also runs `session` (one or more
/// statements) after its own setup: session settings the application's
/// transactions rely on, e.g. `SET SESSION TRANSACTION ISOLATION LEVEL
/// READ COMMITTED` (MariaDB's default, `REPEATABLE READ`, makes a locking
/// read of a missing row take a gap lock, so two transactions inserting
/// rows into the same gap deadlock; the example service runs its
/// transactions at `READ COMMITTED` for that reason). The relay's claims
/// set their own isolation level, whatever the session's.
///
/// # Errors
/// As [`pool`]. A `session` the server refuses fails every checkout
/// ([`Error::Pool`], with the server's error), never silently.
pub fn pool_with_session(
    url: &str,
    max_size: usize,
    session: &str,
) -> Result<Pool<AsyncMysqlConnection>> {
    pool_setting_up(url, max_size, Some(session.to_owned()))
}

/// The pool of [`pool`] and [`pool_with_session`].
fn pool_setting_up(
    url: &str,
    max_size: usize,
    session: Option<String>,
) -> Result<Pool<AsyncMysqlConnection>> {
    let connector = std::sync::Arc::new(Connector::new(url)?);
    let session = std::sync::Arc::new(session);
    let verified = diesel_async::pooled_connection::RecyclingMethod::Verified;
    crate::pool_of(url, max_size, verified, POOL_CONNECT_TIMEOUT, move || {
        let connector = std::sync::Arc::clone(&connector);
        let session = std::sync::Arc::clone(&session);
        async move {
            use diesel_async::SimpleAsyncConnection as _;
            let mut conn = open(&connector).await?;
            if let Some(session) = session.as_deref() {
                conn.batch_execute(session)
                    .await
                    .map_err(diesel::ConnectionError::CouldntSetupConfiguration)?;
            }
            Ok(conn)
        }
        .boxed()
    })
}

/// Establishes and sets up a connection.
async fn open(connector: &Connector) -> diesel::ConnectionResult<AsyncMysqlConnection> {
    use diesel_async::SimpleAsyncConnection as _;
    let mut conn = connector.connect().await?;
    conn.batch_execute(STRICT)
        .await
        .map_err(diesel::ConnectionError::CouldntSetupConfiguration)?;
    Ok(conn)
}

/// Adds `STRICT_ALL_TABLES` to the session's SQL mode.
const STRICT: &str =
    "SET SESSION sql_mode = CONCAT_WS(',', NULLIF(@@sql_mode, ''), 'STRICT_ALL_TABLES')";
