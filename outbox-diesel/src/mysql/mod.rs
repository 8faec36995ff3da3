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
//! `OutboxAdmin`). Not yet on MariaDB: the `outbox` CLI (it opens a
//! PostgreSQL URL), TLS.
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

/// Opens a direct connection to `url` (`mysql://user:password@host:port/db`),
/// in strict SQL mode (see below).
///
/// The session's `sql_mode` gets `STRICT_ALL_TABLES` added: without it
/// MariaDB truncates a value too long for its column (a consumer name, an
/// aggregate id) with a warning instead of an error, which could make two
/// consumers one or store a date as `0000-00-00`.
///
/// Connections are plaintext: TLS to MariaDB is not built in yet, and a
/// URL that asks for it (`require_ssl`, `verify_ca`, `verify_identity`,
/// `built_in_roots`, `ssl…`) is refused rather than silently unencrypted.
///
/// # Errors
/// [`Error::Tls`] if `url` asks for TLS; [`Error::Connect`], naming the
/// (redacted) URL, if the server cannot be reached, refuses the login or
/// the session setup.
pub async fn connect(url: &str) -> Result<AsyncMysqlConnection> {
    refuse_tls(url)?;
    open(url.to_owned()).await.map_err(|source| Error::Connect {
        url: crate::error::redact_url(url),
        source,
    })
}

/// A deadpool pool of at most `max_size` connections to `url`, each set up
/// as [`connect`] sets it up, with the same timeouts as PostgreSQL's pool
/// ([`POOL_WAIT_TIMEOUT`], [`POOL_CONNECT_TIMEOUT`]). Connections are
/// opened lazily, on first use.
///
/// Unlike PostgreSQL's pool, each checkout pings the connection (diesel's
/// `RecyclingMethod::Verified`, one `SELECT 1` round trip): mysql_async does
/// not tell diesel-async that a connection's socket closed (the server's
/// `wait_timeout`, a restart, a `KILL`, a proxy's idle timeout), so without
/// the ping a dead connection would be handed out, fail, and go back to the
/// pool, for ever.
///
/// # Errors
/// [`Error::Tls`] as [`connect`]; [`Error::Config`] if the pool cannot be
/// built.
pub fn pool(url: &str, max_size: usize) -> Result<Pool<AsyncMysqlConnection>> {
    refuse_tls(url)?;
    let owned = url.to_owned();
    let verified = diesel_async::pooled_connection::RecyclingMethod::Verified;
    crate::pool_of(url, max_size, verified, move || open(owned.clone()).boxed())
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
    refuse_tls(url)?;
    let owned = url.to_owned();
    let session = session.to_owned();
    let verified = diesel_async::pooled_connection::RecyclingMethod::Verified;
    crate::pool_of(url, max_size, verified, move || {
        let (url, session) = (owned.clone(), session.clone());
        async move {
            use diesel_async::SimpleAsyncConnection as _;
            let mut conn = open(url).await?;
            conn.batch_execute(&session)
                .await
                .map_err(diesel::ConnectionError::CouldntSetupConfiguration)?;
            Ok(conn)
        }
        .boxed()
    })
}

/// Establishes and sets up a connection.
async fn open(url: String) -> diesel::ConnectionResult<AsyncMysqlConnection> {
    use diesel_async::SimpleAsyncConnection as _;
    let mut conn = AsyncMysqlConnection::establish(&url).await?;
    conn.batch_execute(STRICT)
        .await
        .map_err(diesel::ConnectionError::CouldntSetupConfiguration)?;
    Ok(conn)
}

/// Adds `STRICT_ALL_TABLES` to the session's SQL mode.
const STRICT: &str =
    "SET SESSION sql_mode = CONCAT_WS(',', NULLIF(@@sql_mode, ''), 'STRICT_ALL_TABLES')";

/// `Err` if `url` asks for TLS (see [`connect`]).
fn refuse_tls(url: &str) -> Result<()> {
    let query = url.split_once('?').map_or("", |(_, q)| q);
    let asks = query.split('&').any(|pair| {
        let key = pair
            .split('=')
            .next()
            .unwrap_or_default()
            .to_ascii_lowercase();
        key.starts_with("ssl")
            || matches!(
                key.as_str(),
                "require_ssl" | "verify_ca" | "verify_identity" | "built_in_roots"
            )
    });
    if asks {
        return Err(Error::Tls {
            url: crate::error::redact_url(url),
            reason: "TLS to MariaDB is not supported by this version (connections are \
                     plaintext); remove the TLS parameters, or reach the server over a \
                     trusted network or a TLS tunnel"
                .into(),
        });
    }
    Ok(())
}
