//! The Diesel adapter of the `outbox` transactional outbox, on diesel and
//! diesel-async, one back end per feature: PostgreSQL (`postgres`, the
//! default, described here), MariaDB (module `mysql`, feature `mysql`) and
//! SQLite (module `sqlite`, feature `sqlite`).
//! On PostgreSQL: record events in your transaction, relay them with
//! [`PgOutboxStore`], and deduplicate deliveries with [`PgInbox`]. An
//! outbox in another schema, or behind a pooler, is configured once with
//! [`PgSettings`], which hands out all three.
//!
//! ```no_run
//! use diesel_async::{AsyncConnection, AsyncPgConnection};
//! use outbox_core::DomainEvent;
//! # #[derive(serde::Serialize)] struct OrderPlaced { order_id: u64, total_cents: i64 }
//! # impl DomainEvent for OrderPlaced {
//! #     fn aggregate_type(&self) -> &'static str { "order" }
//! #     fn event_type(&self) -> &'static str { "order.placed" }
//! #     fn aggregate_id(&self) -> String { self.order_id.to_string() }
//! # }
//!
//! # async fn run() -> Result<(), outbox_diesel::Error> {
//! let url = "postgres://postgres@127.0.0.1:5432/app";
//! outbox_diesel::migrate_url(url, "public").await?; // once at start, under a lock
//!
//! let mut conn = outbox_diesel::connect(url).await?;
//! conn.transaction::<_, outbox_diesel::Error, _>(async |conn| {
//!     // ... insert the order with diesel-async on `conn` ...
//!     outbox_diesel::record(conn, &OrderPlaced { order_id: 1, total_cents: 990 }).await?;
//!     Ok(())
//! })
//! .await?; // the event is stored if and only if this commits
//! # Ok(()) }
//! ```
//!
//! With sync diesel (feature `sync`, default), the same in a
//! `PgConnection::transaction`:
//!
//! ```no_run
//! use diesel::{Connection, PgConnection};
//! use outbox_diesel::Outbox;
//! # use outbox_core::DomainEvent;
//! # #[derive(serde::Serialize)] struct OrderPaid { order_id: u64 }
//! # impl DomainEvent for OrderPaid {
//! #     fn aggregate_type(&self) -> &'static str { "order" }
//! #     fn event_type(&self) -> &'static str { "order.paid" }
//! #     fn aggregate_id(&self) -> String { self.order_id.to_string() }
//! # }
//!
//! # fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let mut conn = PgConnection::establish("postgres://postgres@127.0.0.1:5432/app")?;
//! let outbox = Outbox::default();
//! conn.transaction::<_, outbox_diesel::Error, _>(|conn| {
//!     outbox.record_sync(conn, &OrderPaid { order_id: 1 })?;
//!     Ok(())
//! })?;
//! # Ok(()) }
//! ```
//!
//! # Guarantees
//! - **Atomic**: `record` inserts into the caller's open transaction; the
//!   event exists if and only if that transaction commits. Without an open
//!   (diesel-managed) transaction it returns [`Error::NoTransaction`] and
//!   writes nothing: never a silent autocommit.
//! - **Ordered per aggregate**: `seq` is assigned at insert. Insert order
//!   equals commit order only when writers to one aggregate are serialized
//!   (lock the aggregate's row, or use a unique aggregate version), which a
//!   correct application does anyway; two concurrent transactions writing
//!   events of the same aggregate without that may commit in the other order.
//! - **No loss on relay crashes**: a claim is a transaction; a dead relay's
//!   rows are released when its session ends, a hung one's after the claim
//!   timeout.
//! - **Byte-exact payloads**: stored as `json` (not `jsonb`), read back as the
//!   exact text that was serialized; ids and headers byte-exact too. See
//!   [Limits](#limits) for what cannot be recorded.
//!
//! # Limits
//! What the outbox takes, and what happens beyond it. Found with the
//! workspace's `tests/tests/hostile.rs` (PostgreSQL 15 with default
//! settings, RabbitMQ 3.10), which records each case in a real transaction,
//! relays it and compares what arrives byte for byte.
//!
//! | input | limit | beyond it |
//! |---|---|---|
//! | payload size | 1 GB, PostgreSQL's limit for one value. The real limit is the broker's `max_message_size` (RabbitMQ: 128 MiB by default in 3.x, 16 MiB in 4.x); about 1 MiB is tested. The relay holds its claimed batches in memory: up to `max_batch_size` (default 4 × `batch_size`) × `concurrency` × your largest payload | recorded; the broker refuses the message (RabbitMQ closes the channel, 406), which the relay counts as a failed attempt of that event: it ends `Dead` |
//! | payload nesting | PostgreSQL parses `json` recursively: with the default `max_stack_depth` (2 MB), about 13,000 levels of objects or 14,500 of arrays (10,000 of each tested). Consumers that deserialize payloads with serde_json stop at its recursion limit, 128 levels | [`Error::Database`] "stack depth limit exceeded": the transaction is aborted, roll it back |
//! | payload text | any JSON PostgreSQL accepts, kept as is: whitespace, key order, duplicate keys, number spelling, escapes, lone surrogate escapes, top-level scalars. Typed events always serialize to valid JSON; text given to `record_envelopes` is not checked by this crate | [`Error::Database`] "invalid input syntax for type json": the transaction is aborted, roll it back |
//! | `\u0000` in a payload | accepted: a NUL in a Rust string serializes as the escape `\u0000`, which `json` stores (`jsonb` would refuse it). Your own queries must not cast such payloads to `jsonb` or extract them as text (`->>`): PostgreSQL refuses `\u0000` there | – |
//! | aggregate type, aggregate id, event type | not empty, no NUL character (PostgreSQL text cannot hold one). Otherwise any text: quotes, backslashes, `%`, `_`, SQL, newlines, any script are stored and compared as plain values (always bound, matched with `=` only) | [`Error::Event`] (`InvalidEvent`, naming the field) before any SQL runs; the transaction stays usable |
//! | aggregate id length | at most 2,048 bytes (`EventEnvelope::MAX_AGGREGATE_ID_BYTES`; 1,000-character ids and a 2,048-byte incompressible one are tested). With the 255-byte aggregate type this keeps every entry of the `outbox_events_blocking` index (which holds the rows of failed publishes) under PostgreSQL's 2,704-byte limit, so a failed publish of any accepted id is marked like any other | [`Error::Event`] (`InvalidEvent`, "aggregate_id is N bytes long") before any SQL runs; the transaction stays usable |
//! | headers | names not empty; no NUL in names or values | [`Error::Event`] (`InvalidEvent`) before any SQL runs |
//! | aggregate type, event type, header names, correlation id | at most 255 bytes (`EventEnvelope::MAX_SHORT_BYTES`): they become AMQP short strings on the wire (`type`, header names, `correlation_id`, the default routing key). Other header values are AMQP long strings; all headers together at most 64 KiB encoded (`EventEnvelope::MAX_HEADERS_BYTES`, counting each entry's name, value and `HEADER_ENTRY_OVERHEAD` bytes of framing: AMQP carries the properties in one frame, 128 KiB by default, and a larger one makes RabbitMQ close the connection; the publisher also checks each event's exact header frame against the negotiated `frame_max`) | [`Error::Event`] (`InvalidEvent`) before any SQL runs. The publisher never sends (nor panics on) an event that breaks these limits anyway (stored by another writer) or whose exchange name or routing key is longer than 255 bytes: it reports it `Unpublishable` and the relay marks it dead at once; the inbox consumer does not carry over an incoming correlation id longer than 255 bytes |
//!
//! # Choices, and the measurements behind them
//! Measured on this project's 2-core CI machine (PostgreSQL 15,
//! `synchronous_commit = on`, fdatasync), with
//! `outbox-diesel/benches/claim-design/run.sh` (pgbench, 100-event batches,
//! 200,000-row backlog). These machines are noisy: figures are ranges over runs.
//!
//! | claim design | 1 claimer | 2 claimers |
//! |---|---|---|
//! | (a) claim, mark, commit in one transaction | 73–180 batches/s | 560–805 batches/s |
//! | (b) committed lease, then a second commit to mark | 15–58 batches/s | 31–92 batches/s |
//!
//! **(a) is used**: one write and one commit per batch instead of two, no
//! lease columns to index or fence, and a crashed relay's rows come back the
//! moment its session ends. Its cost, a connection held while a batch's
//! confirms arrive (milliseconds), is bounded by `claim_timeout`.
//!
//! | recording, one event per transaction | 1 writer | 8 writers |
//! |---|---|---|
//! | `INSERT` only | 1,367 commits/s | 3,912 commits/s |
//! | `INSERT` + `pg_notify` | 1,320 commits/s | 1,220 commits/s |
//!
//! **`NOTIFY` serializes commits**: PostgreSQL takes a global lock while a
//! notifying transaction commits, so with many concurrent writers it costs
//! about two thirds of the commit rate here. It stays on by default (relays in
//! other processes wake within milliseconds); services with many concurrent
//! writers should turn it off with [`Outbox::notify(false)`](Outbox::notify)
//! and rely on in-process wakeups ([`outbox_core::RelayHandle::notify`],
//! which the Axum layer calls after each commit) plus polling.
//!
//! **Prepared statements.** `diesel::sql_query` is prepared anew on every
//! run (one round trip to parse, one to execute). The library's statements
//! are fixed per schema, so they stay prepared on each connection after
//! their first run, keyed by their text. The ordered claim is one statement
//! (window, blocked flags and `FOR UPDATE SKIP LOCKED` together) instead of
//! two, and [`pool`] does not ping a connection on checkout. Time from a
//! relay's wakeup to its claim's rows, one event per commit (W3 of
//! `outbox-bench`, p50, instrumented run on the 2-core machine):
//!
//! | claim path | wakeup → `BEGIN` done | claim statement(s) |
//! |---|---|---|
//! | before: `sql_query`, two statements, pool ping | 0.30 ms | 1.12 ms |
//! | prepared, two statements | 0.31 ms | 0.55 ms |
//! | prepared, one statement, no ping | 0.20 ms | 0.37 ms |
//! | same, after a large backlog was analyzed | 0.20 ms | ~0.9 ms (re-planned every time) |
//! | same, generic plan forced (`SET LOCAL` in the `BEGIN` batch) | 0.21 ms | 0.34 ms |
//!
//! The relay's p50 commit-to-receipt latency went from 3.4 ms to about
//! 1.8–1.9 ms, 0.6 ms above the inline-publish floor (W3, where the floor
//! now writes an order row and stamps just before `COMMIT`: 1.2–1.4 ms).
//!
//! **Checked commits.** Every commit this workspace makes (the Axum
//! layer's, the inbox consumer's and the relay's, through
//! [`PgTransaction::commit`]) goes through [`commit_top_level`]: diesel's
//! transaction depth must be exactly 1 (a cancelled nested
//! `transaction(..)` leaves it higher, and a "commit" would only release a
//! savepoint), and a `SELECT 1` sent in the same message as the `COMMIT`
//! must succeed (in a transaction PostgreSQL aborted after a failed
//! statement, it fails, where `COMMIT` alone would roll back without an
//! error). pgbench, one client, loopback, 4 runs:
//!
//! | transaction | `COMMIT` | `SELECT 1; COMMIT` in one message | `SELECT 1` then `COMMIT` |
//! |---|---|---|---|
//! | `BEGIN`, `COMMIT` | 0.06–0.09 ms | 0.08–0.10 ms | 0.10–0.25 ms |
//! | `BEGIN`, one `INSERT`, `COMMIT` (fsync) | 2.4–4.6 ms | within that noise | within that noise |
//!
//! The probe costs no round trip, about 10 µs of server time; a separate
//! probe statement would cost a round trip (more over a network than on
//! loopback). Only when the commit is refused does a second probe run, to
//! tell an aborted transaction from a failed `COMMIT`.
//!
//! # Connections and PgBouncer
//! PostgreSQL 12 or later (a claim sets `plan_cache_mode`). Recording,
//! claims and the inbox keep their statements prepared on each connection,
//! as Diesel's query builder does (see "Prepared statements" above): about
//! ten per outbox schema, kept for the connection's life, so a service that
//! serves many outbox schemas from one pool should turn them off (below) or
//! recycle connections. They work through any pool, including PgBouncer in transaction
//! pooling mode from 1.21 with `max_prepared_statements` set; behind an
//! older PgBouncer in transaction mode, turn prepared statements off once,
//! on the [`PgSettings`] you take the recorder, the store and the inbox from
//! (`PgSettings::new(schema)?.prepared_statements(false)`; each part also
//! has its own `prepared_statements` setter). `LISTEN` does not work through transaction pooling: give
//! [`PgOutboxStoreBuilder::listen`] a **direct** URL. Migrations use a
//! transaction-scoped advisory lock and work through PgBouncer.
//!
//! # TLS
//! Every connection this crate opens, [`pool`], [`connect`], the relay's
//! `LISTEN` connection ([`PgOutboxStoreBuilder::listen`]) and migrations
//! ([`migrate_url`]), reads `sslmode` and `sslrootcert` from the URL (query
//! parameters of a `postgres://` URL, or keys of a libpq `key=value`
//! string) with libpq's meanings. TLS itself needs the `postgres-tls`
//! feature (rustls with ring; no OpenSSL):
//!
//! | `sslmode` | with `postgres-tls` | without it |
//! |---|---|---|
//! | `disable` | plaintext | plaintext |
//! | `allow` | plaintext; TLS if the server refuses plaintext | plaintext only |
//! | `prefer`, **the default** when the URL has no `sslmode` | TLS if the server offers it (certificate checked only against a given `sslrootcert`), else plaintext | **plaintext, always, even when the server offers TLS**; a `WARN` is logged once if the URL names `prefer` or `allow` |
//! | `require` | TLS or no connection; the certificate is not checked unless `sslrootcert` is given (then its chain is, as libpq does) | refused with [`Error::Tls`], which names the feature: never a silent plaintext connection |
//! | `verify-ca` | TLS; the server's certificate must chain to a CA in `sslrootcert` (its name is not checked) | refused, as above |
//! | `verify-full` | as `verify-ca`, and the certificate must be for the host name (`host`, also when `hostaddr` says where to connect) | refused, as above |
//!
//! ```no_run
//! # async fn run() -> Result<(), outbox_diesel::Error> {
//! let url = "postgres://app@db.internal/shop?sslmode=verify-full&sslrootcert=/etc/ssl/db-ca.pem";
//! let pool = outbox_diesel::pool(url, 16)?; // every connection verified
//! outbox_diesel::migrate_url(url, "public").await?;
//! # Ok(()) }
//! ```
//!
//! `sslrootcert=<path>` is a PEM file with the certificate(s) of the CA that
//! signed the server's certificate; `verify-ca` and `verify-full` need it
//! ([`Error::Tls`] otherwise, before connecting). It is read when [`pool`] is
//! built (a new root needs a new pool) or [`connect`] is called. Unlike
//! libpq, `~/.postgresql/root.crt` is never read implicitly,
//! `sslrootcert=system` and the `PGSSLMODE`/`PGSSLROOTCERT` variables are
//! not supported, and client certificates (`sslcert`, `sslkey`) are not:
//! the driver refuses those keys. A certificate that fails its check ends in
//! [`Error::Connect`] (from [`pool`], when a connection is opened) with the
//! reason, e.g. `invalid peer certificate: UnknownIssuer` (not signed by a
//! CA in `sslrootcert`) or `certificate not valid for name "db.internal"`.
//!
//! With the feature, a URL without `sslmode` is `prefer`: encrypted to a
//! server that offers TLS, but unauthenticated. Production URLs should say
//! `verify-full` (or at least `require`). Over a Unix socket PostgreSQL
//! never offers TLS; libpq ignores `sslmode` there, this crate does not:
//! use `disable` or `prefer` with a socket `host`.
//!
//! # Failover
//! Every connection this crate opens asks for a server that takes writes
//! (`target_session_attrs=read-write`, unless the URL sets it): name the
//! primary and its standbys in the URL
//! (`postgres://app@pg1:5432,pg2:5432/shop`, or `host=pg1,pg2` in a
//! `key=value` string) and connections skip a standby and, after a
//! failover, go to the promoted one. The hosts are tried one at a time,
//! each for at most the URL's `connect_timeout` (else 5 s; 10 s for a
//! single host), so a host that
//! is gone or frozen is given up for the next. A read-only server or role
//! is refused even alone in the URL: `target_session_attrs=any` connects
//! to it anyway. Unless the URL sets them, connections get TCP keepalives
//! (`keepalives_idle=30`, `keepalives_interval=10`,
//! `keepalives_retries=3`) and `tcp_user_timeout=30`, so a connection to a
//! machine that vanished fails within about a minute, not after the
//! kernel's ~15 minutes. Until a standby is promoted, connecting
//! fails with "the database is read-only (a standby?)"; the relay and the
//! inbox consumer retry. A query that a server answers with "read-only"
//! (SQLSTATE 25006, [`Error::is_read_only`]) says so too, and the relay
//! store, the inbox transaction and the dead-letter insert close that
//! connection rather than pooling it; a claim that fails
//! so spends no attempt. The relay's `LISTEN` connection is checked after
//! 15 s of silence ([`PgOutboxStoreBuilder::listen_check`]), so a half-open
//! socket to a vanished primary, or a primary fenced read-only, is replaced (with a warning that the relay
//! polls until then) and the backlog rescanned. What a failover can lose
//! (with asynchronous replication, the last committed transactions, events
//! with their business rows) and how synchronous replication closes it:
//! `docs/clusters.md`, "PostgreSQL failover".
//!
//! # Schema
//! See [`schema`] for the tables, the indexes and why each
//! exists; [`ddl`] returns the DDL for teams that run their own migrations.
//!
//! # Upgrading with data in place
//! Migrations are expand/contract, safe on a table of millions of rows
//! while producers and relays run (measured: migrating 1,000,000 rows to
//! migration 2 with a producer recording meanwhile, see
//! `outbox-diesel/tests/upgrade.rs`):
//! 1. Deploy the new version; [`migrate`] applies the *expand* migrations:
//!    no table rewrite, a constraint swapped `NOT VALID` and validated
//!    without blocking writes, indexes built `CONCURRENTLY`. Producers of
//!    the old and the new version record side by side.
//! 2. **Relays:** stop the old ones before starting new ones on the same
//!    outbox (relays only delay delivery while none runs). A new relay
//!    refuses an outbox not yet migrated, or migrated past what it knows
//!    ([`Error::SchemaVersion`]), so a rolled-back deploy cannot run an old
//!    relay on a newer table. A relay before 0.2 knows nothing of `held`
//!    events: beside new relays it could publish an event before the held
//!    ones of its aggregate.
//! 3. Once no relay of an earlier version runs, [`migrate_contract`] drops
//!    what only those used (for 0.2: the index `outbox_events_unsent`, one
//!    more index entry per recorded event until then).
//!
//! A new outbox gets every migration, contract ones included, from
//! [`migrate`].
//!
//! # Where things live
//! - `record.rs`: [`Outbox`], recording in the caller's transaction;
//!   `transaction.rs`: [`PgTransaction`], the transaction check recording
//!   needs (`in_transaction`) and the checked commit ([`commit_top_level`]);
//! - `store/`: [`PgOutboxStore`], the relay's store (claims, marks, stats,
//!   `LISTEN` wakeups) and its admin (`store/admin/`);
//! - `inbox.rs`: [`PgInbox`] and [`PgInboxDatabase`]; `dead_letters.rs`:
//!   [`PgDeadLetters`]; `audit.rs`: the audit trail they and the admin write;
//! - `settings.rs`: [`PgSettings`], which renders the schema's SQL once and
//!   hands out every part above with it;
//! - `sql/`: all of the SQL text, one file per part (store, record, inbox,
//!   dead letters, admin, relays, audit, `LISTEN`, commit), rendered once per
//!   schema into plain structs of strings: the one place another dialect
//!   would render its own text (see the module's docs);
//! - [`schema`], `migrate.rs`: the tables, their DDL and the migrations;
//!   `connect/`: connections, [`pool`] and TLS.
//!
//! # Feature flags
//! | feature | default | enables |
//! |---|---|---|
//! | `postgres` | yes | the PostgreSQL back end (the crate root's types), on diesel-async (tokio-postgres, no libpq) |
//! | `sync` | yes | recording on sync `diesel::PgConnection` (links libpq); implies `postgres` |
//! | `mysql` | no | the MariaDB back end, module `mysql` (mysql_async, pure Rust); tested on MariaDB 10.6+ |
//! | `sqlite` | no | the SQLite back end, module `sqlite` (diesel's `SqliteConnection` in diesel-async's `SyncConnectionWrapper`, SQLite compiled in); needs tokio's multi-thread runtime |
//! | `postgres-tls` | no | TLS to PostgreSQL (rustls with ring, no OpenSSL) for every connection the crate opens, honouring `sslmode` and `sslrootcert`; see [TLS](#tls). Without it, connections are plaintext and a URL asking for `require` or `verify-*` is refused |
//! | `mysql-tls` | no | TLS to MariaDB (mysql_async's rustls with ring, no OpenSSL) for every connection of the `mysql` module, honouring `require_ssl`, `verify_ca`, `verify_identity`, `built_in_roots` and `ssl_ca`; see `mysql`'s "TLS". Without it, a URL asking for TLS is refused; implies `mysql` |

#[cfg(feature = "postgres")]
mod audit;
#[cfg(feature = "postgres")]
mod connect;
mod connection;
#[cfg(feature = "postgres")]
mod dead_letters;
mod error;
#[cfg(feature = "postgres")]
mod inbox;
#[cfg(feature = "postgres")]
mod migrate;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod plan;
#[cfg(feature = "postgres")]
mod postgres;
mod prepared;
#[cfg(feature = "postgres")]
mod record;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod rows;
pub mod schema;
#[cfg(feature = "postgres")]
mod settings;
#[cfg(feature = "postgres")]
mod sql;
#[cfg(feature = "sqlite")]
pub mod sqlite;
#[cfg(feature = "postgres")]
mod store;
mod transaction;

pub use connection::{AsConnection, Connection};
#[cfg(feature = "postgres")]
pub use dead_letters::PgDeadLetters;
pub use error::{Error, Result};
#[cfg(feature = "postgres")]
pub use inbox::{PgInbox, PgInboxDatabase};
#[cfg(feature = "postgres")]
pub use migrate::{migrate, migrate_contract, migrate_url};
#[cfg(feature = "postgres")]
pub use postgres::{connect, pool, record, record_all};
#[cfg(feature = "postgres")]
pub use record::Outbox;
#[cfg(feature = "postgres")]
pub use schema::{MIGRATIONS, ddl, inbox_events, outbox_events};
pub use schema::{Migration, Phase, Schema, Step, StepKind};
#[cfg(feature = "postgres")]
pub use settings::PgSettings;
#[cfg(feature = "postgres")]
pub use store::{PgClaim, PgOutboxStore, PgOutboxStoreBuilder};
#[cfg(feature = "mysql")]
pub use transaction::MysqlTransaction;
#[cfg(feature = "postgres")]
pub use transaction::PgTransaction;
#[cfg(feature = "sqlite")]
pub use transaction::SqliteTransaction;
pub use transaction::{Transaction, begin_top_level, commit_top_level, in_top_level_transaction};

/// How long a pool's `get` (`pool`, `mysql::pool`) waits for a free connection before it fails.
pub const POOL_WAIT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// How long a pool waits for a new connection to open before it fails.
/// A PostgreSQL connection gives up on its own: each host of its URL gets
/// the URL's `connect_timeout`, else this long with one host and 5 s each
/// with several, one after the other; its pool waits for that whole walk
/// and a second more (so that the connection's error, naming each host's
/// failure, is the one reported), and so never less than this.
pub const POOL_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A deadpool pool of at most `max_size` connections to `url`, each opened
/// by `open` (lazily, on first use) within `create_timeout`, with this
/// crate's wait timeout.
/// Connections are checked on checkout as `recycling` says.
fn pool_of<C: Connection>(
    url: &str,
    max_size: usize,
    recycling: diesel_async::pooled_connection::RecyclingMethod<C>,
    create_timeout: std::time::Duration,
    open: impl Fn() -> futures_util::future::BoxFuture<'static, diesel::ConnectionResult<C>>
    + Send
    + Sync
    + 'static,
) -> Result<deadpool::managed::Pool<C::Manager>> {
    use diesel_async::pooled_connection::ManagerConfig;
    let mut config = ManagerConfig::default();
    config.recycling_method = recycling;
    config.custom_setup = Box::new(move |_url| open());
    deadpool::managed::Pool::builder(C::manager(url, config))
        .max_size(max_size)
        .runtime(deadpool::Runtime::Tokio1)
        .wait_timeout(Some(POOL_WAIT_TIMEOUT))
        .create_timeout(Some(create_timeout))
        .build()
        .map_err(|e| Error::Config(format!("cannot build the connection pool: {e}")))
}
