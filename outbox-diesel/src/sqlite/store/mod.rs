//! [`SqliteOutboxStore`]: the relay's store on SQLite, with a lease claim.
//!
//! The same contract as PostgreSQL's store (the conformance checks of
//! `outbox_core::testing::conformance` run on both): per-aggregate order by
//! `seq`, a failing or dead event holds back only its own aggregate (the
//! events behind it are `held`), claims of several relays never overlap.
//!
//! # How a claim works here: a lease, not row locks
//! SQLite has one writer at a time and no row locks. A claim that kept its
//! transaction open while the batch is published (as on PostgreSQL and
//! MariaDB) would hold the file's write lock for the whole publish, and
//! every request that records an event would wait behind it, up to
//! `busy_timeout`, and then fail during a broker stall. So a claim is two
//! short `BEGIN IMMEDIATE` transactions with the publish between them, run
//! with no transaction open:
//! 1. **claim**: read the window (the first due events in `seq` order, each
//!    with whether an earlier event of its aggregate holds it back and
//!    whether another claim's lease on it is live), keep each aggregate's
//!    run (the same `keep_runs` as the other back ends, a live lease
//!    counting as locked), lease the kept rows (`lease_token` := a new
//!    random uuid, `lease_until` := now + the claim timeout), hold the
//!    blocked rows, `COMMIT`;
//! 2. **finish**: the marks, checked at once (a seq not in the claim, or
//!    named twice, is refused when the mark is called) and buffered in call
//!    order, are applied in one transaction, each statement fenced by
//!    `lease_token = ?`; then the claim's leases are cleared, `COMMIT`.
//!
//! A lease that expires (a publish longer than the claim timeout, a relay
//! that died) lets another claim take the rows again. The first claim's
//! marks of them then match nothing: its `finish` commits what did match
//! and reports [`Error::LeaseLost`]. Those events were published and will
//! be published again: at-least-once, nothing is lost. The relay stops
//! publishing a batch at [`valid_until`](outbox_core::Claim::valid_until),
//! 0.8 of the lease, so that happens only when a publish stalls. A claim
//! dropped without `finish` clears its leases in the background (best
//! effort; otherwise they lapse at `lease_until`).
//!
//! **Cost**: two write transactions per batch (PostgreSQL needs one); each
//! takes the write lock for about a millisecond. **One relay per database
//! file is enough**: SQLite serializes writers anyway, so more relays only
//! add contention (several are safe: leases never overlap).
//!
//! # Held events
//! The schema's triggers release the events held behind a head when it
//! leaves `retry`/`dead` (sent, deleted, replayed, skipped), in the same
//! statement (a SQLite trigger may update its own table);
//! [`maintain`](OutboxStore::maintain) releases held events nothing holds
//! back (after rows were edited by hand).
//!
//! # No `NOTIFY`
//! Relays learn of new events by polling and from in-process wakeups
//! ([`wakeups`](OutboxStore::wakeups) never yields).

mod admin;
mod claim;
mod row;
mod sql;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use diesel::sql_types::{BigInt, Integer, Text};
use diesel_async::RunQueryDsl;
use diesel_async::pooled_connection::deadpool::Pool;
use outbox_core::{
    Claimed, DeadSelector, DeliveryOrder, OutboxStats, OutboxStore, RelayControl, RelayRegistration,
};
use uuid::Uuid;

pub use claim::SqliteClaim;
pub(crate) use sql::COLUMNS;

use super::AsyncSqliteConnection;
use super::sql::{SqliteAdminSql, micros};
use crate::{Error, Result, SqliteTransaction};
use row::{OrderRow, PausedRow, StatsRow, VersionRow};
use sql::SqliteStoreSql;

/// How long the delivery order is cached (a change reaches every relay
/// within it).
const ORDER_CACHE_TTL: Duration = Duration::from_secs(1);

/// What the schema is called in errors (one file is one outbox).
const SCHEMA: &str = "main";

/// The relay's store on SQLite: lease claims, marks, stats, replays, the
/// relay registry, and the admin API
/// ([`OutboxAdmin`](outbox_core::admin::OutboxAdmin)). Get one from
/// [`SqliteSettings::store`](super::SqliteSettings::store). How its claim
/// works: [the module docs](super#the-relay-store-a-lease-claim).
#[derive(Clone)]
pub struct SqliteOutboxStore {
    pool: Pool<AsyncSqliteConnection>,
    sql: Arc<SqliteStoreSql>,
    admin: Arc<SqliteAdminSql>,
    prepare: bool,
    keep_sent: bool,
    claim_timeout: Duration,
    claim_window: usize,
    order_cache: Arc<Mutex<Option<(DeliveryOrder, Instant)>>>,
    version_ok: Arc<AtomicBool>,
    relay: Arc<Mutex<Option<RelayRegistration>>>,
}

impl std::fmt::Debug for SqliteOutboxStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteOutboxStore")
            .field("keep_sent", &self.keep_sent)
            .field("claim_timeout", &self.claim_timeout)
            .field("claim_window", &self.claim_window)
            .finish_non_exhaustive()
    }
}

/// The store's text, rendered once per process.
fn shared_sql() -> Arc<SqliteStoreSql> {
    static SQL: OnceLock<Arc<SqliteStoreSql>> = OnceLock::new();
    Arc::clone(SQL.get_or_init(|| Arc::new(SqliteStoreSql::new())))
}

/// Now, as stored: µs since the epoch.
fn now() -> i64 {
    micros(Utc::now())
}

impl SqliteOutboxStore {
    pub(crate) fn new(pool: Pool<AsyncSqliteConnection>, prepare: bool) -> Self {
        SqliteOutboxStore {
            pool,
            sql: shared_sql(),
            admin: SqliteAdminSql::shared(),
            prepare,
            keep_sent: false,
            claim_timeout: Duration::from_secs(60),
            claim_window: 4,
            order_cache: Arc::new(Mutex::new(None)),
            version_ok: Arc::new(AtomicBool::new(false)),
            relay: Arc::new(Mutex::new(None)),
        }
    }

    /// Keep sent events (status `sent`, for audit; purge them with
    /// [`purge_sent`](OutboxStore::purge_sent)) instead of deleting them
    /// when they are confirmed. Default off.
    #[must_use]
    pub fn keep_sent(mut self, keep: bool) -> Self {
        self.keep_sent = keep;
        self
    }

    /// How long a claim's lease lasts (default 60 s): past it another
    /// claim may take the rows again, and the relay stops publishing a
    /// batch at 0.8 of it. Must exceed the publisher's confirm timeout.
    #[must_use]
    pub fn claim_timeout(mut self, timeout: Duration) -> Self {
        self.claim_timeout = timeout;
        self
    }

    /// How many batches of due events an ordered claim reads to find a
    /// batch of events it may take (default 4).
    #[must_use]
    pub fn claim_window(mut self, batches: usize) -> Self {
        self.claim_window = batches.max(1);
        self
    }

    /// The delivery order every relay on this outbox obeys.
    ///
    /// # Errors
    /// [`Error::Database`], [`Error::Pool`], [`Error::UnknownDeliveryOrder`].
    pub async fn delivery_order(&self) -> Result<DeliveryOrder> {
        let mut conn = self.pool.get().await.map_err(Error::Pool)?;
        let row: OrderRow = diesel::sql_query(&self.sql.get_order)
            .get_result(&mut *conn)
            .await?;
        order_from_db(&row.delivery_order)
    }

    /// Sets the delivery order; switching to unordered releases every held
    /// event.
    ///
    /// # Errors
    /// [`Error::Database`], [`Error::Pool`].
    pub async fn set_delivery_order(&self, order: DeliveryOrder) -> Result<()> {
        let mut tx = SqliteTransaction::begin(&self.pool).await?;
        diesel::sql_query(&self.sql.set_order)
            .bind::<Text, _>(order.as_str())
            .execute(&mut *tx)
            .await?;
        if order == DeliveryOrder::Unordered {
            diesel::sql_query(&self.sql.release_unordered)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        *self
            .order_cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
        Ok(())
    }

    async fn cached_order(&self, conn: &mut AsyncSqliteConnection) -> Result<DeliveryOrder> {
        let cached = *self
            .order_cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((order, read_at)) = cached
            && read_at.elapsed() < ORDER_CACHE_TTL
        {
            return Ok(order);
        }
        let row: OrderRow = diesel::sql_query(&self.sql.get_order)
            .get_result(conn)
            .await?;
        let order = order_from_db(&row.delivery_order)?;
        *self
            .order_cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some((order, Instant::now()));
        Ok(order)
    }

    async fn check_version(&self, conn: &mut AsyncSqliteConnection) -> Result<()> {
        if AtomicBool::load(&self.version_ok, Ordering::Relaxed) {
            return Ok(());
        }
        let found = diesel::sql_query(&self.sql.schema_version)
            .get_result::<VersionRow>(conn)
            .await?
            .version;
        let known = super::SQLITE_MIGRATIONS.last().map_or(0, |m| m.version);
        if found != known {
            return Err(Error::SchemaVersion {
                schema: SCHEMA.to_owned(),
                found,
                min: known,
                max: known,
            });
        }
        self.version_ok.store(true, Ordering::Relaxed);
        Ok(())
    }

    fn relay_name(&self) -> Option<String> {
        self.relay
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|r| r.name.clone())
    }
}

fn order_from_db(value: &str) -> Result<DeliveryOrder> {
    value
        .parse::<DeliveryOrder>()
        .map_err(|_| Error::UnknownDeliveryOrder {
            schema: SCHEMA.to_owned(),
            value: value.to_owned(),
        })
}

impl OutboxStore for SqliteOutboxStore {
    type Error = Error;
    type Claim = SqliteClaim;

    async fn claim(&self, limit: usize) -> Result<Option<SqliteClaim>> {
        Ok(match self.claim_as(None, limit).await? {
            Claimed::Batch(claim) => Some(claim),
            _ => None,
        })
    }

    async fn claim_for(&self, relay: &str, limit: usize) -> Result<Claimed<SqliteClaim>> {
        self.claim_as(Some(relay), limit).await
    }

    async fn stats(&self) -> Result<OutboxStats> {
        let mut conn = self.pool.get().await.map_err(Error::Pool)?;
        let row: StatsRow = diesel::sql_query(&self.sql.stats)
            .bind::<BigInt, _>(now())
            .get_result(&mut *conn)
            .await?;
        let ordered = order_from_db(&row.delivery_order)? == DeliveryOrder::PerAggregate;
        Ok(OutboxStats {
            backlog: u64::try_from(row.backlog).unwrap_or(0),
            oldest_unsent_age: row
                .oldest_age
                .map(|secs| Duration::from_secs_f64(secs.max(0.0))),
            dead: u64::try_from(row.dead).unwrap_or(0),
            unroutable: u64::try_from(row.unroutable).unwrap_or(0),
            relays_live: u64::try_from(row.relays_live).unwrap_or(0),
            blocked_aggregates: if ordered {
                u64::try_from(row.blocked).unwrap_or(0)
            } else {
                0
            },
        })
    }

    async fn purge_sent(&self, before: DateTime<Utc>, limit: usize) -> Result<u64> {
        // One chunk per call, in its own short write transaction
        // (autocommit), so requests' writes wait at most for one chunk.
        let mut conn = self.pool.get().await.map_err(Error::Pool)?;
        let deleted = diesel::sql_query(&self.sql.purge)
            .bind::<BigInt, _>(micros(before))
            .bind::<BigInt, _>(i64::try_from(limit).unwrap_or(i64::MAX))
            .execute(&mut *conn)
            .await?;
        Ok(deleted as u64)
    }

    async fn replay_dead(&self, selector: DeadSelector) -> Result<u64> {
        // The schema's trigger releases the events held behind the
        // replayed ones, in the same statement.
        let mut conn = self.pool.get().await.map_err(Error::Pool)?;
        let replayed = match selector {
            DeadSelector::Id(id) => {
                diesel::sql_query(&self.sql.replay_id)
                    .bind::<Text, _>(id.to_string())
                    .execute(&mut *conn)
                    .await?
            }
            DeadSelector::Aggregate {
                aggregate_type,
                aggregate_id,
            } => {
                diesel::sql_query(&self.sql.replay_aggregate)
                    .bind::<Text, _>(aggregate_type)
                    .bind::<Text, _>(aggregate_id)
                    .execute(&mut *conn)
                    .await?
            }
            _ => {
                diesel::sql_query(&self.sql.replay_all)
                    .execute(&mut *conn)
                    .await?
            }
        };
        Ok(replayed as u64)
    }

    async fn skip_dead(&self, id: Uuid) -> Result<bool> {
        let mut conn = self.pool.get().await.map_err(Error::Pool)?;
        let skipped = diesel::sql_query(&self.sql.skip)
            .bind::<Text, _>(id.to_string())
            .bind::<BigInt, _>(now())
            .execute(&mut *conn)
            .await?;
        Ok(skipped == 1)
    }

    async fn maintain(&self) -> Result<()> {
        let mut conn = self.pool.get().await.map_err(Error::Pool)?;
        let released = if self.cached_order(&mut conn).await? == DeliveryOrder::Unordered {
            diesel::sql_query(&self.sql.release_unordered)
                .execute(&mut *conn)
                .await?
        } else {
            diesel::sql_query(&self.sql.release_orphans)
                .execute(&mut *conn)
                .await?
        };
        if released > 0 {
            tracing::warn!(
                released,
                "outbox: released held events that nothing held back any more"
            );
        }
        Ok(())
    }

    async fn register_relay(&self, relay: &RelayRegistration) -> Result<()> {
        // A relay that registers again under its name keeps its pause.
        let mut conn = self.pool.get().await.map_err(Error::Pool)?;
        diesel::sql_query(&self.sql.register)
            .bind::<Text, _>(&relay.name)
            .bind::<Text, _>(&relay.host)
            .bind::<Integer, _>(i32::try_from(relay.pid).unwrap_or(i32::MAX))
            .bind::<Text, _>(&relay.version)
            .bind::<BigInt, _>(micros(relay.started_at))
            .bind::<BigInt, _>(
                i64::try_from(relay.heartbeat_interval.as_millis()).unwrap_or(i64::MAX),
            )
            .bind::<BigInt, _>(now())
            .execute(&mut *conn)
            .await?;
        *self.relay.lock().unwrap_or_else(PoisonError::into_inner) = Some(relay.clone());
        Ok(())
    }

    async fn heartbeat(&self, name: &str, in_flight: u32) -> Result<RelayControl> {
        let mut conn = self.pool.get().await.map_err(Error::Pool)?;
        let rows: Vec<PausedRow> = diesel::sql_query(&self.sql.heartbeat)
            .bind::<Text, _>(name)
            .bind::<Integer, _>(i32::try_from(in_flight).unwrap_or(i32::MAX))
            .bind::<BigInt, _>(now())
            .load(&mut *conn)
            .await?;
        let Some(row) = rows.into_iter().next() else {
            // Removed meanwhile (as stale, or by hand): register again.
            drop(conn);
            let registration = self
                .relay
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            if let Some(registration) = registration.filter(|r| r.name == name) {
                self.register_relay(&registration).await?;
            }
            return Ok(RelayControl::default());
        };
        Ok(RelayControl::new(row.paused))
    }

    async fn deregister_relay(&self, name: &str) -> Result<()> {
        let mut conn = self.pool.get().await.map_err(Error::Pool)?;
        diesel::sql_query(&self.sql.deregister)
            .bind::<Text, _>(name)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }
}
