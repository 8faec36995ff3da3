//! Persistence, on the back end `DATABASE_URL` names: PostgreSQL
//! (`postgres://…`), MariaDB (`mysql://…`) or SQLite (`sqlite://path`).
//!
//! # One module per back end, behind traits
//! The routes and consumers are written once, generic over a [`Database`]:
//! a connection type of the outbox (`outbox::postgres::Connection`) that
//! also runs the shop's queries ([`Orders`], [`Inventory`], [`Loyalty`]).
//! Each back end implements those in its own module ([`postgres`],
//! [`mysql`], [`sqlite`]) because its SQL really differs:
//!
//! | | PostgreSQL | MariaDB | SQLite |
//! |---|---|---|---|
//! | ids | `uuid` | `CHAR(36)` ASCII, binary collation | `TEXT` |
//! | locking a row | `SELECT … FOR UPDATE` | `SELECT … FOR UPDATE`, at `READ COMMITTED` (see [`mysql`]) | none needed: a transaction holds the database's one write lock from its `BEGIN IMMEDIATE` |
//! | upsert | `ON CONFLICT … DO UPDATE … RETURNING` | `ON DUPLICATE KEY UPDATE`, then a `SELECT` (no `RETURNING` there) | `ON CONFLICT … DO UPDATE … RETURNING` |
//! | migrations | one transaction under `pg_advisory_xact_lock` | each statement idempotent (DDL commits itself) under `GET_LOCK` | one `BEGIN IMMEDIATE` transaction |
//!
//! PostgreSQL's module uses Diesel's typed query builder; MariaDB's and
//! SQLite's use plain SQL with bound parameters: Diesel's builder written
//! once for all three would need trait bounds longer than the queries, and
//! would still differ where the SQL does (locking, upsert). The HTTP and
//! wire contract is the same on every back end; the end-to-end tests run on
//! each.
//!
//! Every function that changes an aggregate's rows locks them first (see
//! the table above), so two transactions changing the same order (or SKU,
//! or loyalty award) run one after the other. The outbox relies on that:
//! events of one aggregate are published in the order they were recorded,
//! which is commit order only when writers are serialized.

pub mod mysql;
pub mod postgres;
pub mod sqlite;
pub(crate) mod text;

use std::future::Future;

use deadpool::managed::Pool;
use diesel::result::QueryResult;
use outbox::admin::{DeadLetterStore, OutboxAdmin};
use outbox::axum::OutboxLayer;
use outbox::postgres::{Connection, Transaction};
use outbox::{InboxDatabase, OutboxStore};
use uuid::Uuid;

use crate::config::redact_url;
use crate::domain::inventory::{ReservationStatus, Stock};
use crate::domain::loyalty::{Award, AwardStatus};
use crate::domain::{Order, OrderStatus};

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

/// The back end a `DATABASE_URL` names, by its scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `postgres://` or `postgresql://`.
    Postgres,
    /// `mysql://` (MariaDB 10.6+; the SQL is MariaDB's).
    Mysql,
    /// `sqlite://path` (a file, created if missing).
    Sqlite,
}

impl Backend {
    /// The back end of `url`, or `None` for a scheme the service does not
    /// know.
    pub fn of(url: &str) -> Option<Backend> {
        // Lower case only: the drivers' URL parsers expect it.
        match url.split_once("://")?.0 {
            "postgres" | "postgresql" => Some(Backend::Postgres),
            "mysql" => Some(Backend::Mysql),
            "sqlite" => Some(Backend::Sqlite),
            _ => None,
        }
    }

    /// Its name in logs.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Postgres => "PostgreSQL",
            Backend::Mysql => "MariaDB",
            Backend::Sqlite => "SQLite",
        }
    }
}

/// The connection pool of back end `C`: the outbox's own pool type
/// (`outbox::postgres::pool`, `outbox::mysql::pool`, `outbox::sqlite::pool`),
/// spelled through `Connection::Manager` so that code generic over `C`
/// can use it.
pub type DbPool<C> = Pool<<C as Connection>::Manager>;

/// A back end the shop runs on: its outbox connection type, the outbox's
/// store, inbox and dead-letter records on it, how to prepare a database,
/// and the shop's queries ([`Orders`], [`Inventory`], [`Loyalty`]).
pub trait Database: Connection + Orders + Inventory + Loyalty + Sized {
    /// The relay store, with the admin API on it.
    type Store: OutboxStore<Error = outbox::postgres::Error>
        + OutboxAdmin<Error = outbox::postgres::Error>
        + Clone;
    /// The consumers' dead-letter records (for the admin API).
    type DeadLetters: DeadLetterStore;
    /// The inbox consumers' database.
    type Inbox: InboxDatabase<Tx = Transaction<Self>>;

    /// Which one this is.
    const KIND: Backend;

    /// Makes the database at `url` ready: creates it if missing, applies
    /// the outbox's migrations and the service's own, each under the
    /// back end's lock. Safe when several roles start at once.
    ///
    /// # Errors
    /// [`DbError`] saying what failed; an unreachable server names the URL
    /// and `scripts/dev-services`.
    fn prepare(url: &str) -> impl Future<Output = Result<(), DbError>> + Send;

    /// The pool of connections to `url`, at most `size` (opened lazily).
    ///
    /// # Errors
    /// [`DbError::Outbox`] if the pool cannot be built.
    fn pool(url: &str, size: usize) -> Result<DbPool<Self>, DbError>;

    /// The relay store on `pool`; `url` is for a wakeup connection where
    /// the back end has one (PostgreSQL's `LISTEN`), `None` for a store
    /// that only reads.
    ///
    /// # Errors
    /// [`DbError::Outbox`] for invalid settings.
    fn store(pool: DbPool<Self>, url: Option<&str>) -> Result<Self::Store, DbError>;

    /// The consumers' dead-letter records on `pool`.
    fn dead_letters(pool: DbPool<Self>) -> Self::DeadLetters;

    /// The inbox consumers' database on `pool`.
    fn inbox(pool: DbPool<Self>) -> Self::Inbox;

    /// The Axum layer taking request transactions from `pool`
    /// (`OutboxLayer::new(pool)`: its bounds hold for each concrete pool).
    fn layer(pool: DbPool<Self>) -> OutboxLayer;
}

/// Orders and their lines.
pub trait Orders {
    /// Inserts a new order and its lines.
    fn insert_order(&mut self, order: &Order) -> impl Future<Output = QueryResult<()>> + Send;

    /// The order `id`, or `None`.
    fn find_order(&mut self, id: Uuid) -> impl Future<Output = QueryResult<Option<Order>>> + Send;

    /// The order `id`, locked until the transaction ends: every change to
    /// an order goes through here, so changes to one order (and the events
    /// they record) are serialized.
    fn lock_order(&mut self, id: Uuid) -> impl Future<Output = QueryResult<Option<Order>>> + Send;

    /// Stores the order's status (after a transition on a locked order),
    /// and `reason` when it was rejected.
    fn update_order_status(
        &mut self,
        order: &Order,
        reason: Option<&str>,
    ) -> impl Future<Output = QueryResult<()>> + Send;
}

/// Stock per SKU, and what the inventory reserved for each order.
pub trait Inventory {
    /// Creates `sku` with `available` units, or sets the available units
    /// of an existing one (its reserved units are kept).
    fn set_available(
        &mut self,
        sku: &str,
        available: i64,
    ) -> impl Future<Output = QueryResult<Stock>> + Send;

    /// The stock of `sku`, or `None` for an unknown SKU.
    fn find_stock(&mut self, sku: &str) -> impl Future<Output = QueryResult<Option<Stock>>> + Send;

    /// The stock of the known SKUs among `skus`, each row locked in SKU
    /// order, so that two reservations touching the same SKUs wait for
    /// each other instead of deadlocking.
    fn lock_stock(&mut self, skus: &[&str])
    -> impl Future<Output = QueryResult<Vec<Stock>>> + Send;

    /// Moves `delta` units of `sku` from available to reserved (a negative
    /// `delta` gives them back). Call it on rows locked with
    /// [`lock_stock`](Inventory::lock_stock).
    ///
    /// A check violation when fewer units are there.
    fn shift_to_reserved(
        &mut self,
        sku: &str,
        delta: i64,
    ) -> impl Future<Output = QueryResult<()>> + Send;

    /// What the inventory did for `order_id` so far, its row locked;
    /// `None` when the order was never seen. (Without a row there is
    /// nothing to lock: two transactions then both insert one, and the
    /// primary key makes the second fail, roll back and be retried, when it
    /// finds the first one's row.)
    fn lock_reservation(
        &mut self,
        order_id: Uuid,
    ) -> impl Future<Output = QueryResult<Option<ReservationStatus>>> + Send;

    /// Records what the inventory did for `order_id`, with the stock it
    /// holds (a unique violation if a row exists already).
    fn insert_reservation(
        &mut self,
        order_id: Uuid,
        status: ReservationStatus,
        reason: Option<&str>,
        items: &[(&str, i64)],
    ) -> impl Future<Output = QueryResult<()>> + Send;

    /// The stock a reservation holds: `(sku, quantity)` in SKU order.
    fn reservation_items(
        &mut self,
        order_id: Uuid,
    ) -> impl Future<Output = QueryResult<Vec<(String, i64)>>> + Send;

    /// Changes the status of a (locked) reservation.
    fn set_reservation_status(
        &mut self,
        order_id: Uuid,
        status: ReservationStatus,
    ) -> impl Future<Output = QueryResult<()>> + Send;
}

/// Loyalty points per customer, and the award of each paid order.
pub trait Loyalty {
    /// The points of `customer_id` (0 for a customer never seen).
    fn points(&mut self, customer_id: Uuid) -> impl Future<Output = QueryResult<i64>> + Send;

    /// Adds `delta` (negative to take back) to the points of
    /// `customer_id`, creating the account if needed; locks the account
    /// until the transaction ends.
    fn add_points(
        &mut self,
        customer_id: Uuid,
        delta: i64,
    ) -> impl Future<Output = QueryResult<()>> + Send;

    /// The award of `order_id`, its row locked, or `None` when there is
    /// none yet (see [`Inventory::lock_reservation`] for why the primary
    /// key then serializes concurrent writers).
    fn lock_award(
        &mut self,
        order_id: Uuid,
    ) -> impl Future<Output = QueryResult<Option<Award>>> + Send;

    /// Records the award of `order_id` (a unique violation if one exists).
    fn insert_award(
        &mut self,
        order_id: Uuid,
        award: &Award,
    ) -> impl Future<Output = QueryResult<()>> + Send;

    /// Changes the status of a (locked) award.
    fn set_award_status(
        &mut self,
        order_id: Uuid,
        status: AwardStatus,
    ) -> impl Future<Output = QueryResult<()>> + Send;
}

/// A stored status (or other text) parsed, a corrupt one as diesel's
/// deserialization error.
pub(crate) fn parse<T>(text: &str) -> QueryResult<T>
where
    T: std::str::FromStr,
    T::Err: std::error::Error + Send + Sync + 'static,
{
    text.parse()
        .map_err(|e| diesel::result::Error::DeserializationError(Box::new(e)))
}

/// An order's status, parsed.
pub(crate) fn order_status(text: &str) -> QueryResult<OrderStatus> {
    parse(text)
}

/// Logs that the database at `url` is ready.
pub(crate) fn log_ready(backend: Backend, url: &str, outbox: &[i32], shop: &[i32]) {
    tracing::info!(
        backend = backend.name(),
        database = %redact_url(url),
        outbox_applied = ?outbox,
        applied = ?shop,
        "database ready"
    );
}
