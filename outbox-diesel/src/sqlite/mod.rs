//! SQLite through diesel's `SqliteConnection` in diesel-async's
//! `SyncConnectionWrapper` ([`AsyncSqliteConnection`]: each statement runs
//! on one of tokio's blocking threads). Feature `sqlite`; SQLite is
//! compiled in (libsqlite3-sys `bundled`, SQLite 3.53), no system library
//! is used. **Needs tokio's multi-thread runtime** (`#[tokio::main]`, or
//! `#[tokio::test(flavor = "multi_thread")]`): the wrapper waits for a
//! cancelled statement with `block_in_place`.
//!
//! The same parts as on PostgreSQL: the recorder ([`SqliteOutbox`]), the
//! inbox ([`SqliteInbox`], [`SqliteInboxDatabase`]) and the migrations
//! ([`migrate`]), on [`SqliteTransaction`]s checked at commit (see
//! [`Connection`]); the relay's store ([`SqliteOutboxStore`]), whose
//! claims are leases rather than row locks (below), with the admin API
//! ([`OutboxAdmin`](outbox_core::admin::OutboxAdmin), for
//! [`Admin`](outbox_core::admin::Admin) and the
//! [`Janitor`](outbox_core::admin::Janitor)); and the consumers' dead
//! letters ([`SqliteDeadLetters`]).
//!
//! # Where the outbox lives
//! One database file is one outbox: its tables are unqualified (an
//! attached database is out of scope), so [`SqliteSettings`] names
//! nothing. [`connect`] takes `sqlite://path` (`sqlite:///var/lib/app.db`
//! for an absolute path; read as the SQLite URI `file:path`, so `?mode=…`
//! and `%xx` escapes work), a plain path, or a `file:` URI, creates a
//! missing database file readable by its owner only (mode 0600: it holds
//! every payload), and sets on each connection `PRAGMA busy_timeout`
//! ([`BUSY_TIMEOUT`]), `foreign_keys = ON` and `synchronous = FULL`;
//! [`migrate`] puts the file in WAL mode. [`pool`] refuses a database in
//! memory unless its cache is shared (each connection would get its own).
//!
//! # The relay store: a lease claim
//! SQLite has one writer at a time and no row locks, so a claim cannot
//! keep its rows locked in a transaction open while the batch is published
//! (as on PostgreSQL and MariaDB): that would hold the file's write lock
//! for the whole publish, and requests recording events would wait behind
//! it, then fail after `busy_timeout` during a broker stall. A
//! [`SqliteClaim`] is two short `BEGIN IMMEDIATE` transactions instead, with
//! the publish between them and no transaction open during it:
//! 1. the claim reads the window of due events, keeps each aggregate's run
//!    up to the batch size (a row another claim has leased counts as
//!    locked), *leases* the kept rows (`lease_token` := a new uuid,
//!    `lease_until` := now + the claim timeout), holds the blocked ones and
//!    commits;
//! 2. the marks are checked when called (a seq not in the claim, or named
//!    twice, is refused at once), kept in call order, and applied by
//!    [`finish`](outbox_core::Claim::finish) in one transaction, each
//!    statement fenced by the claim's `lease_token`; the claim's leases are
//!    then cleared.
//!
//! A lease lasts the claim timeout ([`SqliteOutboxStore::claim_timeout`],
//! 60 s; it must exceed the publisher's confirm timeout) and the relay stops
//! publishing a batch at 0.8 of it. If a publish stalls past it, another
//! claim may take the rows again; the first claim's `finish` then commits
//! its other marks and returns [`Error::LeaseLost`] naming the events taken
//! over: they were published and will be published again (at-least-once,
//! nothing lost). A claim dropped without `finish` clears its leases in the
//! background. The cost is two write transactions per batch (a millisecond
//! or so of write lock each). **One relay per database file is enough**:
//! SQLite serializes writers, so more relays only add contention (they are
//! safe: leases never overlap). Held events are released by the schema's
//! trigger, as on PostgreSQL.
//!
//! # What differs from PostgreSQL
//! - **One writer at a time.** Every transaction this crate begins is
//!   `BEGIN IMMEDIATE`: it takes the file's write lock at once, waiting up
//!   to `busy_timeout` for another writer to finish. Begin your own
//!   writing transactions the same way (`begin_top_level`,
//!   [`SqliteTransaction`], or diesel-async's `immediate_transaction`): a
//!   deferred `BEGIN` that reads and then writes fails at its first write
//!   with "database is locked" at once, whatever the timeout. Keep write
//!   transactions short; readers are never blocked (WAL).
//! - **A failed statement rolls back only itself**, and some errors roll
//!   back the whole transaction, after which statements autocommit: see
//!   [`Connection`]. The recorder and the inbox refuse to insert then
//!   ([`Error::NotCommitted`]), so no event is committed on its own.
//! - **No `NOTIFY`**: relays learn of new events from in-process wakeups
//!   and polling.
//! - **Durability**: `synchronous = FULL` in WAL mode, so that a commit
//!   the library reports (and a relay publishes, or a consumer acks after)
//!   survives a power loss or an operating-system crash, as PostgreSQL's
//!   does by default. `NORMAL` would be about 35 times cheaper per commit
//!   here (measured: 9 µs against 331 µs on this VM) but may roll back the
//!   last commits after a power loss: a published event whose business
//!   row is gone, or an acked delivery whose handling is gone.
//! - **Payloads** are stored as `TEXT`, byte for byte, and checked by the
//!   schema with `json_valid`, which accepts what PostgreSQL's `json`
//!   accepts except nesting deeper than 1,000 levels (PostgreSQL takes
//!   about 13,000): such a payload is refused with [`Error::Event`].
//! - **Times** are INTEGER microseconds since the Unix epoch, UTC.
//! - **Aggregate keys** use the `BINARY` collation: `"A"`, `"a"` and
//!   `"a "` are three aggregates, as on PostgreSQL.
//! - **The admin API**: each chunk of a replay, skip, retry-now or purge
//!   is a few statements in one short `BEGIN IMMEDIATE` (the write lock
//!   for a few milliseconds per 1,000 rows). A replay, skip or retry-now
//!   chunk that selects an event a relay is publishing (under a live
//!   lease) waits for it without the write lock, up to 5 s, and then fails
//!   with "run it again", as PostgreSQL's waits for the row lock.
//!   `error_contains` folds ASCII letters only (SQLite's `lower`), and
//!   the status report counts the whole table where PostgreSQL estimates.

mod audit;
mod dead_letters;
mod inbox;
mod migrate;
mod record;
mod settings;
mod sql;
mod store;

pub use dead_letters::SqliteDeadLetters;
pub use inbox::{SqliteInbox, SqliteInboxDatabase};
pub use migrate::{SQLITE_MIGRATIONS, migrate, migrate_url};
pub use record::SqliteOutbox;
pub use settings::SqliteSettings;
pub use store::{SqliteClaim, SqliteOutboxStore};

// What a SQLite user needs from the crate root, here too (the facade's
// `outbox::sqlite` is this module).
pub use crate::{
    Connection, Error, POOL_CONNECT_TIMEOUT, POOL_WAIT_TIMEOUT, Result, SqliteTransaction,
    Transaction, begin_top_level, commit_top_level, in_top_level_transaction,
};

use diesel::ConnectionResult;
use diesel_async::AsyncConnection;
use diesel_async::SimpleAsyncConnection;
use diesel_async::pooled_connection::deadpool::Pool;
use futures_util::FutureExt as _;
use outbox_core::DomainEvent;
use uuid::Uuid;

/// diesel's `SqliteConnection` made async: the connection every function
/// of this module takes.
pub type AsyncSqliteConnection =
    diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>;

/// How long a statement waits for another connection's write lock (or a
/// writer for readers to let it checkpoint) before it fails with
/// "database is locked": `PRAGMA busy_timeout` on every connection
/// [`connect`] and [`pool`] open.
pub const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Records `event` in the transaction open on `conn`. Shorthand for
/// [`SqliteOutbox::default().record(conn, event)`](SqliteOutbox::record).
///
/// # Errors
/// As [`SqliteOutbox::record`].
pub async fn record<E: DomainEvent + Sync>(
    conn: &mut AsyncSqliteConnection,
    event: &E,
) -> Result<Uuid> {
    SqliteOutbox::default().record(conn, event).await
}

/// Records `events` with one `INSERT`. Shorthand for
/// [`SqliteOutbox::record_all`].
///
/// # Errors
/// As [`SqliteOutbox::record`].
pub async fn record_all<E: DomainEvent + Sync>(
    conn: &mut AsyncSqliteConnection,
    events: &[E],
) -> Result<Vec<Uuid>> {
    SqliteOutbox::default().record_all(conn, events).await
}

/// Opens a connection to the database file `url` names (`sqlite://path`,
/// a plain path, or a `file:` URI; the file is created if missing) with
/// this crate's settings: `busy_timeout` ([`BUSY_TIMEOUT`]),
/// `foreign_keys = ON`, `synchronous = FULL`. Call it inside a tokio
/// multi-thread runtime.
///
/// # Errors
/// [`Error::Config`] outside tokio's multi-thread runtime;
/// [`Error::Connect`], naming the URL, if the file cannot be opened or a
/// setting cannot be applied.
pub async fn connect(url: &str) -> Result<AsyncSqliteConnection> {
    multi_thread_runtime()?;
    open(url).await.map_err(|source| Error::Connect {
        url: crate::error::redact_url(url),
        source,
    })
}

/// A deadpool pool of at most `max_size` connections to `url` (as
/// [`connect`] opens them), with the same timeouts and recycling as
/// PostgreSQL's [`pool`](crate#functions) ([`POOL_WAIT_TIMEOUT`],
/// [`POOL_CONNECT_TIMEOUT`]). Connections are opened lazily, on first use.
/// More connections than writers buy nothing for writing (one writer at a
/// time) but let reads run beside a write.
///
/// # Errors
/// [`Error::Config`] outside tokio's multi-thread runtime, for a database
/// in memory without a shared cache, or if the pool cannot be built.
pub fn pool(url: &str, max_size: usize) -> Result<Pool<AsyncSqliteConnection>> {
    multi_thread_runtime()?;
    let target = target_of(url);
    if in_memory(&target)
        && !split_uri(&target)
            .1
            .split('&')
            .any(|kv| kv == "cache=shared")
    {
        return Err(Error::Config(format!(
            "{url:?} is a database in memory: each pooled connection would get its own, \
             empty one (and closing a connection loses it); use a file, or a shared cache \
             (`file:NAME?mode=memory&cache=shared`)"
        )));
    }
    let url = url.to_owned();
    // No ping on checkout: SQLite is in-process, a connection cannot lose
    // its server; a broken transaction manager is still caught.
    let fast = diesel_async::pooled_connection::RecyclingMethod::Fast;
    crate::pool_of(
        &url.clone(),
        max_size,
        fast,
        POOL_CONNECT_TIMEOUT,
        move || {
            let url = url.clone();
            async move { open(&url).await }.boxed()
        },
    )
}

/// `Err` unless called on tokio's multi-thread runtime: diesel-async's
/// wrapper waits for a cancelled statement with `block_in_place`, which
/// panics on the current-thread runtime (a panic during unwinding aborts
/// the process).
fn multi_thread_runtime() -> Result<()> {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            Ok(())
        }
        _ => Err(Error::Config(
            "the SQLite back end needs tokio's multi-thread runtime (`#[tokio::main]`, \
             `#[tokio::test(flavor = \"multi_thread\")]`): a cancelled statement is waited for \
             with block_in_place, which panics on the current-thread runtime"
                .into(),
        )),
    }
}

/// What diesel opens for `url`: `sqlite://x` and `sqlite:x` as the URI
/// `file:x` (so that `?mode=…`, `?cache=shared` and `%xx` escapes mean what
/// they mean in SQLite's URIs, as diesel itself does for `sqlite://`), a
/// `file:` URI as it is, anything else as a plain path.
fn target_of(url: &str) -> String {
    match url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
    {
        Some(rest) => format!("file:{rest}"),
        None => url.to_owned(),
    }
}

/// The database file `url` names (`sqlite://path`, `sqlite:path`, a `file:`
/// URI or a plain path), or `None` for a database in memory and for a path
/// with `%` escapes (SQLite decodes those itself). For tools that must not
/// create a database by opening a mistyped path, as [`connect`] and
/// [`pool`] do.
pub fn database_file(url: &str) -> Option<std::path::PathBuf> {
    let target = target_of(url);
    let (path, _) = split_uri(&target);
    (!in_memory(&target) && !path.contains('%')).then(|| path.into())
}

/// Whether `target` is a database in memory rather than a file.
fn in_memory(target: &str) -> bool {
    let (path, query) = split_uri(target);
    path.is_empty() || path == ":memory:" || query.split('&').any(|kv| kv == "mode=memory")
}

/// Path and query of a `file:` URI (the authority of `file://host/path`
/// dropped), or the plain path and no query.
fn split_uri(target: &str) -> (&str, &str) {
    let Some(uri) = target.strip_prefix("file:") else {
        return (target, "");
    };
    let (path, query) = uri.split_once('?').unwrap_or((uri, ""));
    let path = match path.strip_prefix("//") {
        Some(authority_and_path) => authority_and_path
            .find('/')
            .map_or("", |at| &authority_and_path[at..]),
        None => path,
    };
    (path, query)
}

/// Creates the database file of `target`, readable by its owner only, if it
/// does not exist yet: SQLite would create it (and its `-wal`/`-shm` files,
/// which copy its mode) with the umask's mode, often world-readable, and
/// the outbox holds every event's payload.
fn create_private(target: &str) -> std::io::Result<()> {
    let (path, _) = split_uri(target);
    if in_memory(target) || path.contains('%') {
        return Ok(());
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    match options.open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

async fn open(url: &str) -> ConnectionResult<AsyncSqliteConnection> {
    let target = target_of(url);
    create_private(&target).map_err(|e| {
        diesel::ConnectionError::BadConnection(format!("cannot create the database file: {e}"))
    })?;
    let mut conn = AsyncSqliteConnection::establish(&target).await?;
    conn.batch_execute(&format!(
        "PRAGMA busy_timeout = {}; PRAGMA foreign_keys = ON; PRAGMA synchronous = FULL",
        BUSY_TIMEOUT.as_millis()
    ))
    .await
    .map_err(diesel::ConnectionError::CouldntSetupConfiguration)?;
    Ok(conn)
}

#[cfg(test)]
mod tests {
    use super::{database_file, in_memory, split_uri, target_of};

    #[test]
    fn urls_name_files_as_sqlite_uris() {
        assert_eq!(
            target_of("sqlite:///var/lib/app.db"),
            "file:/var/lib/app.db"
        );
        assert_eq!(
            target_of("sqlite://app.db?mode=rwc"),
            "file:app.db?mode=rwc"
        );
        assert_eq!(target_of("sqlite:app.db"), "file:app.db");
        assert_eq!(target_of("/tmp/app.db"), "/tmp/app.db");
        assert_eq!(target_of("file:app.db?mode=rwc"), "file:app.db?mode=rwc");
        assert_eq!(split_uri("file:app.db?mode=rwc"), ("app.db", "mode=rwc"));
        assert_eq!(split_uri("file:///var/app.db"), ("/var/app.db", ""));
        assert_eq!(
            split_uri("file://localhost/var/app.db"),
            ("/var/app.db", "")
        );
        assert_eq!(split_uri("/tmp/app.db"), ("/tmp/app.db", ""));
    }

    #[test]
    fn memory_databases_are_told_apart() {
        assert!(in_memory(":memory:"));
        assert!(in_memory(&target_of("sqlite::memory:")));
        assert!(in_memory("file:shared?mode=memory&cache=shared"));
        assert!(!in_memory(&target_of("sqlite://app.db")));
    }

    #[test]
    fn the_database_file_of_a_url() {
        assert_eq!(
            database_file("sqlite:///var/lib/shop.db?mode=rwc"),
            Some("/var/lib/shop.db".into())
        );
        assert_eq!(database_file("sqlite://shop.db"), Some("shop.db".into()));
        assert_eq!(database_file("shop.db"), Some("shop.db".into()));
        assert_eq!(database_file("sqlite://:memory:"), None);
        assert_eq!(database_file("file:x?mode=memory&cache=shared"), None);
        assert_eq!(database_file("sqlite://a%20b.db"), None);
    }
}
